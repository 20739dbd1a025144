//! House rules as tests: every source file opens with a `//!` doc line, no test uses
//! the should-panic attribute, every rate in the rates table has a unit in its name and a source beside
//! it, and library code carries no `todo!`/`unimplemented!` stubs.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn all_files() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in ["crates", "src", "tests", "benches", "examples"] {
        rust_files(&root().join(d), &mut v);
    }
    v
}

#[test]
fn every_file_opens_with_a_doc_line() {
    let bad: Vec<_> = all_files()
        .into_iter()
        .filter(|p| {
            !std::fs::read_to_string(p)
                .unwrap_or_default()
                .starts_with("//!")
        })
        .collect();
    assert!(bad.is_empty(), "files without a leading //! line: {bad:?}");
}

#[test]
fn no_should_panic() {
    let needle = ["#[should", "_panic"].concat();
    let bad: Vec<_> = all_files()
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .contains(&needle)
        })
        .collect();
    assert!(
        bad.is_empty(),
        "assert the Err instead of panicking: {bad:?}"
    );
}

#[test]
fn no_stubs_in_library_code() {
    let needles = [["todo", "!("].concat(), ["unimplemented", "!("].concat()];
    let mut v = Vec::new();
    rust_files(&root().join("crates"), &mut v);
    let bad: Vec<_> = v
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "src"))
        .filter(|p| {
            let s = std::fs::read_to_string(p).unwrap_or_default();
            needles.iter().any(|n| s.contains(n.as_str()))
        })
        .collect();
    assert!(bad.is_empty(), "stubs left in: {bad:?}");
}

#[test]
fn every_rate_has_a_unit_and_a_source() {
    let text = std::fs::read_to_string(root().join("crates/topo/src/rates.rs")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut count = 0;
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("pub const ") else {
            continue;
        };
        let name = rest.split(':').next().unwrap_or("").trim();
        if !rest.contains("f64") {
            continue;
        }
        count += 1;
        assert!(
            name.ends_with("_GBPS") || name.ends_with("_US"),
            "rates.rs:{}: {name} has no unit suffix (_GBPS, _US)",
            i + 1
        );
        let mut doc = String::new();
        for prev in lines[..i].iter().rev() {
            match prev.trim_start().strip_prefix("///") {
                Some(d) => doc.insert_str(0, d),
                None => break,
            }
        }
        let cites = [
            "Source",
            "REFERENCE",
            "NCCL",
            "datasheet",
            "the smallest",
            "the NVLink value",
            "counted in",
        ];
        assert!(
            cites.iter().any(|c| doc.contains(c)),
            "rates.rs:{}: {name} cites no source: {doc:?}",
            i + 1
        );
    }
    assert!(count > 20, "only {count} rates found");
}
