//! The house's layout as tests: no library function over 150 lines and no source file over
//! 800 (each exception listed below with why), no file of route's crates or the CLI in an
//! import loop, ARCHITECTURE.md naming every source file, and docs free of dates, commit
//! hashes and one machine's timings (those live in `docs/MEASUREMENTS.md`, with the command
//! and machine behind each), and no two visible types of route, collectives and topo with
//! one name.
//!
//! - `source`: reading Rust sources (functions and their lengths, import paths, loops);
//! - `imports`: the file-level import graph of a crate.

mod imports;
mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use source::{dated_or_hashed, functions, loops};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn relative(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                walk(&p, ext, out);
            }
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// Library sources: `crates/*/src/**.rs` and the facade's `src/`, test modules excluded
/// (`tests.rs`, `*_tests.rs`, and files under a `tests/` folder).
fn library_sources() -> Vec<PathBuf> {
    let mut v = Vec::new();
    walk(&root().join("crates"), "rs", &mut v);
    walk(&root().join("src"), "rs", &mut v);
    v.retain(|p| {
        let rel = relative(p);
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        (rel.contains("/src/") || rel.starts_with("src/"))
            && !rel.contains("/tests/")
            && !name.is_some_and(|n| n == "tests.rs" || n.ends_with("_tests.rs"))
    });
    v.sort();
    v
}

/// Library functions over 150 lines that stay, each with why. Anything else over the limit,
/// or a listed one that has shrunk below it, fails the test.
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

/// Source files over 800 lines that stay, each with why.
const LONG_FILES: &[(&str, &str)] = &[];

#[test]
fn library_functions_stay_under_150_lines() {
    let mut over = BTreeSet::new();
    for file in library_sources() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (name, line, len) in functions(&text) {
            if len > 150 {
                over.insert((relative(&file), name, line, len));
            }
        }
    }
    let allowed: BTreeSet<(&str, &str)> = LONG_FUNCTIONS.iter().map(|(f, n, _)| (*f, *n)).collect();
    let bad: Vec<String> = over
        .iter()
        .filter(|(f, n, _, _)| !allowed.contains(&(f.as_str(), n.as_str())))
        .map(|(f, n, l, len)| format!("{f}:{l}: fn {n} has {len} lines"))
        .collect();
    assert!(
        bad.is_empty(),
        "library functions over 150 lines (split them into named passes):\n{}",
        bad.join("\n")
    );
    let stale: Vec<_> = allowed
        .iter()
        .filter(|(f, n)| !over.iter().any(|(of, on, _, _)| of == f && on == n))
        .collect();
    assert!(
        stale.is_empty(),
        "allowlisted functions under the limit (take them off the list): {stale:?}"
    );
}

#[test]
fn source_files_stay_under_800_lines() {
    let mut files = Vec::new();
    for d in ["crates", "src", "tests", "benches", "examples"] {
        walk(&root().join(d), "rs", &mut files);
    }
    let allowed: BTreeSet<&str> = LONG_FILES.iter().map(|(f, _)| *f).collect();
    let mut bad = Vec::new();
    let mut over = BTreeSet::new();
    for file in files {
        let lines = std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .count();
        let rel = relative(&file);
        if lines > 800 {
            over.insert(rel.clone());
            if !allowed.contains(rel.as_str()) {
                bad.push(format!("{rel}: {lines} lines"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "files over 800 lines (split them by what they hold):\n{}",
        bad.join("\n")
    );
    let stale: Vec<_> = allowed.iter().filter(|f| !over.contains(**f)).collect();
    assert!(
        stale.is_empty(),
        "allowlisted files under the limit (take them off the list): {stale:?}"
    );
}

/// Every library source of the crate at `src` by its module path (`lib.rs`: empty,
/// `a/mod.rs`: `a`, `a/b.rs`: `a::b`).
fn modules_of(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut files = Vec::new();
    walk(src, "rs", &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap_or(&f);
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .collect();
        if parts
            .last()
            .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
        {
            parts.pop();
        }
        if parts
            .last()
            .is_some_and(|l| l == "tests" || l.ends_with("_tests"))
        {
            continue;
        }
        out.insert(parts, f);
    }
    out
}

/// The file-level import graph of the crate at `src` (see `imports`), test modules left out.
fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let sources: imports::Sources = modules_of(src)
        .into_iter()
        .map(|(module, file)| {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            (module, (relative(&file), text))
        })
        .collect();
    imports::import_graph(&sources)
}

/// Crates whose files must not import in a loop: route's and the CLI.
fn looped_crates() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            !matches!(name.as_str(), "topo" | "collectives")
        })
        .map(|p| p.join("src"))
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

/// No file imports from a file that imports it back, directly or through others: each
/// strongly connected group of the import graph (`imports`) of route's crates and the CLI is
/// a loop to break by moving what the files share into a file below them.
#[test]
fn no_file_imports_from_a_file_that_imports_it_back() {
    let mut bad = Vec::new();
    for src in looped_crates() {
        for group in loops(&import_graph(&src)) {
            bad.push(group.join(" <-> "));
        }
    }
    assert!(
        bad.is_empty(),
        "files in an import loop (move what they share into a file both import):\n{}",
        bad.join("\n")
    );
}

/// The crates in layers, lowest first: each may depend only on crates before it.
const LAYERS: &[(&str, &str)] = &[
    ("crates/topo", "relaycc-topo"),
    ("crates/plan", "relaycc-plan"),
    ("crates/sim", "relaycc-sim"),
    ("crates/planners", "relaycc-planners"),
    ("crates/route", "relaycc-route"),
    ("crates/collectives", "relaycc-collectives"),
    ("crates/cli", "relaycc-cli"),
];

/// The relaycc crates a manifest's `[dependencies]` name (not dev-dependencies: a test may
/// use a crate above).
fn relaycc_dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_deps = t == "[dependencies]";
            continue;
        }
        if in_deps && t.starts_with("relaycc-") {
            let name: String = t
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// Each crate depends only on crates of lower layers: the routing crates stack as
/// plan <- sim <- planners <- route, so nothing in the IR knows a planner, and nothing
/// below the selection knows it. Cargo refuses cycles; this keeps the order itself.
#[test]
fn every_crate_depends_only_on_the_layers_below_it() {
    let mut bad = Vec::new();
    for (i, (dir, name)) in LAYERS.iter().enumerate() {
        let manifest = std::fs::read_to_string(root().join(dir).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{dir}/Cargo.toml: {e}"));
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{dir} is not {name}"
        );
        for dep in relaycc_dependencies(&manifest) {
            let below = LAYERS[..i].iter().any(|(_, n)| *n == dep);
            if !below && dep != "relaycc-kernels" {
                bad.push(format!("{name} depends on {dep}, which is not below it"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let routing = relaycc_dependencies(
        &std::fs::read_to_string(root().join("crates/planners/Cargo.toml")).unwrap_or_default(),
    );
    assert!(
        routing.contains(&"relaycc-sim".to_string()),
        "the reader of manifests found nothing: {routing:?}"
    );
}

/// Within each routing crate, the top-level modules import one another without a loop, so
/// they stack in layers too. `lib.rs` re-exports, so it is left out.
#[test]
fn no_top_level_module_of_a_routing_crate_imports_one_that_imports_it_back() {
    let mut bad = Vec::new();
    let mut seen = 0;
    for dir in [
        "crates/plan",
        "crates/sim",
        "crates/planners",
        "crates/route",
    ] {
        let src = root().join(dir).join("src");
        let prefix = relative(&src);
        let top = |file: &str| -> String {
            let rel = file
                .strip_prefix(&prefix)
                .unwrap_or(file)
                .trim_start_matches('/');
            let first = rel.split('/').next().unwrap_or(rel);
            first.trim_end_matches(".rs").to_string()
        };
        let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in import_graph(&src) {
            let from = top(&from);
            if from == "lib" {
                continue;
            }
            let entry = modules.entry(from.clone()).or_default();
            entry.extend(
                tos.iter()
                    .map(|t| top(t))
                    .filter(|t| *t != from && t != "lib"),
            );
        }
        seen += modules.len();
        bad.extend(
            loops(&modules)
                .into_iter()
                .map(|g| format!("{dir}: {}", g.join(" <-> "))),
        );
    }
    assert!(
        seen > 30,
        "the routing crates' modules were not found ({seen})"
    );
    assert!(
        bad.is_empty(),
        "top-level modules in an import loop (move what they share into the lower one):\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_source_file_is_on_the_architecture_map() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap_or_default();
    let mut bad = Vec::new();
    for file in library_sources() {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == "lib.rs" || name == "main.rs" {
            continue;
        }
        // A file is named by its name; a folder's mod.rs by the folder (`exec/`).
        let named = if name == "mod.rs" {
            let folder = file
                .parent()
                .and_then(|d| d.file_name())
                .map(|d| format!("{}/", d.to_string_lossy()))
                .unwrap_or_default();
            map.contains(&format!("`{folder}")) || map.contains(&format!("{folder}`"))
        } else {
            map.contains(&name)
        };
        if !named {
            bad.push(relative(&file));
        }
    }
    assert!(
        bad.is_empty(),
        "source files ARCHITECTURE.md does not name:\n{}",
        bad.join("\n")
    );
}

/// Docs that may carry dates, commit hashes and one machine's figures.
const MEASUREMENT_DOCS: &[&str] = &["docs/MEASUREMENTS.md"];

/// Docs whose measurements have not moved to `docs/MEASUREMENTS.md` yet.
const UNMOVED_MEASUREMENTS: &[&str] = &[];

/// Phrases that mark a figure measured on one machine.
const MACHINE_PHRASES: &[&str] = &[
    "on this VM",
    "2-core VM",
    "two-core VM",
    "development machine",
    "on my machine",
    "this laptop",
];

#[test]
fn docs_carry_no_dates_hashes_or_one_machines_timings() {
    let mut files = Vec::new();
    walk(&root(), "md", &mut files);
    walk(&root().join("crates"), "rs", &mut files);
    walk(&root().join("src"), "rs", &mut files);
    let mut bad = Vec::new();
    for file in files {
        let rel = relative(&file);
        if MEASUREMENT_DOCS.contains(&rel.as_str()) || UNMOVED_MEASUREMENTS.contains(&rel.as_str())
        {
            continue;
        }
        let is_md = rel.ends_with(".md");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            // Prose only: a Markdown line, or a Rust doc or comment.
            let prose = if is_md {
                line
            } else if let Some(i) = line.find("//") {
                &line[i..]
            } else {
                continue;
            };
            for w in dated_or_hashed(prose) {
                bad.push(format!("{rel}:{}: {w}", n + 1));
            }
            for p in MACHINE_PHRASES {
                if prose.contains(p) {
                    bad.push(format!("{rel}:{}: {p:?}", n + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "dates, commit hashes and one machine's figures belong in docs/MEASUREMENTS.md:\n{}",
        bad.join("\n")
    );
}

/// Type names that may repeat across route, collectives and topo, each with why: every crate
/// has its own `Result` over its one error type (`crate::Result`, the Rust convention), and
/// its own hidden `ReadmeDoctests`, the item its README's code blocks run as doctests on,
/// which no code names.
const SHARED_TYPE_NAMES: &[&str] = &["Result", "ReadmeDoctests"];

/// The structs, enums, unions, traits and type aliases of `file` visible beyond their own
/// module (`pub`, `pub(crate)`, `pub(super)`, `pub(in ..)`): their names with their lines.
fn visible_type_names(file: &Path) -> Vec<(String, usize)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("pub") else {
            continue;
        };
        // The visibility's restriction, if any: `(crate)`, `(super)`, `(in path)`.
        let rest = match rest.strip_prefix('(') {
            Some(r) => r.split_once(')').map_or("", |(_, after)| after),
            None => rest,
        };
        let mut words = rest.split_whitespace();
        let kind = words.next().unwrap_or_default();
        if !matches!(kind, "struct" | "enum" | "union" | "trait" | "type") {
            continue;
        }
        let name: String = words
            .next()
            .unwrap_or_default()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push((name, i + 1));
        }
    }
    out
}

#[test]
fn no_two_visible_types_of_the_library_crates_share_a_name() {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for krate in ["topo", "plan", "sim", "planners", "route", "collectives"] {
        let mut files = Vec::new();
        walk(
            &root().join("crates").join(krate).join("src"),
            "rs",
            &mut files,
        );
        files.sort();
        for file in files {
            for (name, line) in visible_type_names(&file) {
                seen.entry(name)
                    .or_default()
                    .push(format!("{}:{line}", relative(&file)));
            }
        }
    }
    let clashes: Vec<String> = seen
        .iter()
        .filter(|(name, at)| at.len() > 1 && !SHARED_TYPE_NAMES.contains(&name.as_str()))
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect();
    assert!(
        clashes.is_empty(),
        "type names used twice in route, collectives and topo (name each after what it holds):\n{}",
        clashes.join("\n")
    );
}
