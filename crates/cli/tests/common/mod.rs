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

/// The arguments of a command line written as one string, split at white space (for
/// arguments that hold none).
pub fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Runs `relaycc` with the arguments of `line` ([`words`]).
pub fn relaycc_line(line: &str) -> Output {
    relaycc(&words(line))
}

/// Runs `relaycc` with the arguments of `line` ([`words`]), which must succeed, and parses
/// its standard output as JSON.
pub fn json_line(line: &str) -> serde_json::Value {
    json(&words(line))
}

/// A bench of one 4 KiB all_reduce over two host ranks, one iteration and no warm-up: the
/// cheapest bench run, for tests of what it prints.
pub const BENCH_4K_ONCE: &str = "bench all_reduce --ranks 2 -b 4K -e 4K -n 1 -w 0";
