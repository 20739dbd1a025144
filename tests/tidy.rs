//! House rules as tests: every source file opens with a `//!` doc line, no test uses
//! the should-panic attribute, every rate in the rates table has a unit in its name and a
//! bibliography key beside it, and library code carries no `todo!`/`unimplemented!` stubs.
//!
//! The repository stands alone: no file points at a path outside it, every citation key is
//! defined in `docs/REFERENCES.md`, docs speak in the present tense about what the code does,
//! and no property test writes its failures into the source tree.

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
        // A share of a rate (a protocol's data fraction, NVLS's share of a port) has unit 1.
        assert!(
            name.ends_with("_GBPS") || name.ends_with("_US") || name.ends_with("_FRACTION"),
            "rates.rs:{}: {name} has no unit suffix (_GBPS, _US, _FRACTION)",
            i + 1
        );
        let mut doc = String::new();
        for prev in lines[..i].iter().rev() {
            match prev.trim_start().strip_prefix("///") {
                Some(d) => doc.insert_str(0, d),
                None => break,
            }
        }
        // A key of the bibliography, or a value derived from the table's own constants.
        let derived = ["the smallest", "counted in the hop latencies"];
        let keys = citation_keys(&doc);
        assert!(
            !keys.is_empty() || derived.iter().any(|c| doc.contains(c)),
            "rates.rs:{}: {name} cites no bibliography key: {doc:?}",
            i + 1
        );
        let defined = defined_keys();
        for k in keys {
            assert!(
                defined.contains(&k),
                "rates.rs:{}: {name} cites [{k}], which docs/REFERENCES.md does not define",
                i + 1
            );
        }
    }
    assert!(count > 20, "only {count} rates found");
}

/// Every text file of the repository (sources, docs, scripts, CI, manifests, test data
/// descriptions), skipping build output and hidden folders other than `.ci`.
fn text_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name == "target" || (name.starts_with('.') && name != ".ci") {
                    continue;
                }
                walk(&p, out);
            } else {
                let ext = p.extension().map(|x| x.to_string_lossy().into_owned());
                let text_ext = ["rs", "md", "toml", "sh", "cu", "cuh", "yml", "yaml"];
                let is_script = p
                    .parent()
                    .and_then(|d| d.file_name())
                    .is_some_and(|d| d == ".ci" || d == "scripts");
                if ext.as_deref().is_some_and(|x| text_ext.contains(&x)) || is_script {
                    out.push(p);
                }
            }
        }
    }
    let mut v = Vec::new();
    walk(&root(), &mut v);
    v.sort();
    v
}

fn relative(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

/// True when `rel`, read from the folder `base` (relative to the repository root), names a
/// place outside the repository.
fn leaves_repository(base: &Path, rel: &str) -> bool {
    let mut depth: Vec<String> = base
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if depth.pop().is_none() {
                    return true;
                }
            }
            other => depth.push(other.to_string()),
        }
    }
    false
}

/// The folder of the package that holds `file` (where cargo runs its tests), relative to the
/// repository root.
fn package_dir(file: &Path) -> PathBuf {
    let mut dir = file.parent().unwrap_or(Path::new(""));
    while !dir.join("Cargo.toml").exists() && dir != root() {
        match dir.parent() {
            Some(d) => dir = d,
            None => break,
        }
    }
    dir.strip_prefix(root())
        .unwrap_or(Path::new(""))
        .to_path_buf()
}

#[test]
fn no_file_points_outside_the_repository() {
    // Built from pieces so that this file does not trip its own check.
    let forbidden = [
        ["shared", "/data"].concat(),
        ["shared", "/seeds"].concat(),
        ["../", "shared"].concat(),
        ["/work", "/"].concat(),
    ];
    let mut bad = Vec::new();
    for file in text_files() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let here = file
            .parent()
            .and_then(|d| d.strip_prefix(root()).ok())
            .unwrap_or(Path::new(""))
            .to_path_buf();
        let package = package_dir(&file);
        for (n, line) in text.lines().enumerate() {
            for f in &forbidden {
                if line.contains(f.as_str()) {
                    bad.push(format!("{}:{}: {f}", relative(&file), n + 1));
                }
            }
            // Each run of `../` with the path it starts: outside the repository from both the
            // file's folder and its package's folder (cargo's working directory) is an error.
            let mut rest = line;
            while let Some(pos) = rest.find("../") {
                let tail = &rest[pos..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || "._-/".contains(c)))
                    .unwrap_or(tail.len());
                let path = &tail[..end];
                if leaves_repository(&here, path) && leaves_repository(&package, path) {
                    bad.push(format!("{}:{}: {path}", relative(&file), n + 1));
                }
                rest = &tail[end.max(3)..];
            }
        }
    }
    assert!(
        bad.is_empty(),
        "paths outside the repository (copy what is needed into it):\n{}",
        bad.join("\n")
    );
}

/// The citation keys in `text`: in square brackets, a name (a capital, then letters), a hyphen
/// and a tag (letters and digits), then the closing bracket, or a comma, a space or a semicolon
/// before a locator (`, Table 2`, ` §2.3`).
fn citation_keys(text: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut rest = text;
    while let Some(pos) = rest.find('[') {
        rest = &rest[pos + 1..];
        let b = rest.as_bytes();
        let name = b.iter().take_while(|c| c.is_ascii_alphabetic()).count();
        if name < 2 || !b[0].is_ascii_uppercase() || b.get(name) != Some(&b'-') {
            continue;
        }
        let tag = b[name + 1..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric())
            .count();
        let end = name + 1 + tag;
        if tag > 0 && matches!(b.get(end), Some(b']' | b',' | b' ' | b';')) {
            keys.push(rest[..end].to_string());
        }
    }
    keys
}

/// The keys `docs/REFERENCES.md` defines: its `- **[Key]**` entries.
fn defined_keys() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("docs/REFERENCES.md"))
        .expect("docs/REFERENCES.md, the bibliography, is missing");
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("- **["))
        .filter_map(|l| l.split_once("]**").map(|(k, _)| k.to_string()))
        .collect()
}

#[test]
fn every_citation_key_is_defined_once() {
    let defined = defined_keys();
    assert!(defined.len() >= 4, "only {} keys defined", defined.len());
    for (i, k) in defined.iter().enumerate() {
        assert_eq!(
            citation_keys(&format!("[{k}]")),
            std::slice::from_ref(k),
            "malformed key {k}"
        );
        assert!(!defined[..i].contains(k), "[{k}] is defined twice");
    }
    let mut bad = Vec::new();
    let mut used = 0;
    for file in text_files() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            for k in citation_keys(line) {
                used += 1;
                if !defined.contains(&k) {
                    bad.push(format!("{}:{}: [{k}]", relative(&file), n + 1));
                }
            }
        }
    }
    assert!(used > 50, "only {used} citations found");
    assert!(
        bad.is_empty(),
        "citation keys that docs/REFERENCES.md does not define:\n{}",
        bad.join("\n")
    );
}

#[test]
fn citations_name_the_bibliography_not_absent_files() {
    let forbidden = [
        ["REFERENCE", ".md"].concat(),
        ["the ", "seed"].concat(),
        ["seed ", "paper"].concat(),
        ["seed'", "s"].concat(),
        ["seed ", "§"].concat(),
        ["seed ", "Table"].concat(),
        ["seed ", "Eq."].concat(),
    ];
    let mut bad = Vec::new();
    for file in text_files() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            for f in &forbidden {
                if lower.contains(&f.to_lowercase()) {
                    bad.push(format!("{}:{}: {f}", relative(&file), n + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "cite a key of docs/REFERENCES.md instead:\n{}",
        bad.join("\n")
    );
}

/// The comment text of a Rust line (after `//`), or the whole line of a Markdown file.
fn prose<'a>(file: &Path, line: &'a str) -> Option<&'a str> {
    if file.extension().is_some_and(|x| x == "md") {
        return Some(line);
    }
    line.find("//").map(|i| &line[i..])
}

#[test]
fn docs_are_in_the_present_tense() {
    // Plans, promises and history: docs say what the code does.
    let phrases = [
        "will add",
        "to come",
        "for now",
        "no longer",
        "anymore",
        " now;",
        "'s now.",
        "earlier design",
        "previous design",
        "used to be",
        "previously",
        "formerly",
        "originally",
        "is now ",
        "are now ",
        ["TO", "DO"].concat().leak(),
        ["FIX", "ME"].concat().leak(),
    ];
    let mut bad = Vec::new();
    for file in text_files() {
        if !file
            .extension()
            .is_some_and(|x| x == "rs" || x == "md" || x == "cu" || x == "cuh")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let Some(p) = prose(&file, line) else {
                continue;
            };
            for ph in phrases {
                if p.contains(ph) {
                    bad.push(format!("{}:{}: {ph:?}", relative(&file), n + 1));
                }
            }
            // The word issue followed by a number: the tracker's history is not the code's.
            for word in ["Issue ", "issue ", "Issue #", "issue #"] {
                let mut rest = p;
                while let Some(i) = rest.find(word) {
                    rest = &rest[i + word.len()..];
                    if rest.starts_with(|c: char| c.is_ascii_digit()) {
                        bad.push(format!("{}:{}: {word}N", relative(&file), n + 1));
                    }
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "docs in the present tense, about what the code does:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_property_test_writes_into_the_source_tree() {
    // proptest's default persistence writes failing cases beside the test file.
    let mut bad = Vec::new();
    for file in all_files() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let blocks = text.matches("proptest! {").count();
        let off = text.matches("failure_persistence: None").count();
        if blocks > off {
            bad.push(format!(
                "{}: {blocks} proptest! blocks, {off} with failure_persistence: None",
                relative(&file)
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "set failure_persistence: None in every ProptestConfig:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_look_for() {
    let up = "..";
    assert!(leaves_repository(
        Path::new(""),
        &format!("{up}/elsewhere/x.md")
    ));
    assert!(leaves_repository(
        Path::new("crates/topo"),
        &format!("{up}/{up}/{up}/elsewhere")
    ));
    assert!(!leaves_repository(
        Path::new("crates/collectives"),
        "../topo/tests/data"
    ));
    assert_eq!(
        citation_keys("see [Lockhart-2023, Table 2] and [NVIDIA-V100]; not [x-1], [GPU0-GPU4]"),
        ["Lockhart-2023", "NVIDIA-V100"]
    );
    assert_eq!(citation_keys("[Ranganath-2019 §3]"), ["Ranganath-2019"]);
}

/// No text file keeps a merge's conflict markers (a conflict resolved by committing both sides
/// with the markers between them reads as documentation otherwise).
#[test]
fn no_merge_conflict_markers() {
    let marker = |l: &str| l.starts_with("<<<<<<< ") || l.starts_with(">>>>>>> ") || l == "=======";
    let mut bad = Vec::new();
    for f in text_files() {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (i, l) in text.lines().enumerate() {
            if marker(l) {
                bad.push(format!("{}:{}", relative(&f), i + 1));
            }
        }
    }
    assert!(bad.is_empty(), "conflict markers at {bad:?}");
}
