//! What the CLI test binaries share: running the `relaycc` binary and reading its output.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs the `relaycc` binary Cargo built for these tests.
pub fn relaycc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_relaycc"))
        .args(args)
        .output()
        .expect("the relaycc binary runs")
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `relaycc args`, which must succeed, and parses its standard output as JSON.
pub fn json(args: &[&str]) -> serde_json::Value {
    let o = relaycc(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}
