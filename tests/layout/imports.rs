//! The file-level import graph of a crate, read from its sources without a parser: which
//! files' items each file names, by a `use` (a re-export included) or by a path written in
//! its code, and the loops it has.
//!
//! A path is followed to the file that defines what it names: `crate::`, `super::` and
//! `self::` paths, a bare path through a child module (`child::f` in the parent, which Rust
//! allows without `self::`) or through a name a `use` binds (`use super::tree;` then
//! `tree::f`). A name a file only imports or re-exports leads on to the file that defines it,
//! so a child's `use super::X` of a type its parent re-exports from a sibling is an import of
//! the sibling. Declaring a child (`mod child;`) is no import; code under `#[cfg(test)]` is
//! left out.

use std::collections::{BTreeMap, BTreeSet};

use crate::source::{code_of, expand_use, inline_paths, use_leaves};

/// One source of a crate: its module path (`lib.rs`: empty, `a/mod.rs`: `a`, `a/b.rs`:
/// `a::b`) to its file name (as the graph names it) and text.
pub type Sources = BTreeMap<Vec<String>, (String, String)>;

/// What one file's code names.
#[derive(Default)]
struct Reading {
    /// Every path its `use`s and code name, as written, each with the inline modules
    /// (`mod name { ... }`) it sits in.
    paths: Vec<(Vec<String>, String)>,
    /// The names its module-level `use`s bind, to the path each binds.
    bindings: BTreeMap<String, String>,
}

/// The rest of a line that opens with an attribute keeping what follows to tests
/// (`#[cfg(test)]`, `#[cfg(all(test, ...))]`), or `None`.
fn test_only(t: &str) -> Option<&str> {
    ["#[cfg(test)]", "#[cfg(all(test,"]
        .iter()
        .any(|a| t.starts_with(a))
        .then(|| t.split_once(']').map_or("", |(_, rest)| rest.trim()))
}

/// The name of the inline module a line opens (`mod name {`, `pub(crate) mod name {`).
fn inline_module(t: &str) -> Option<String> {
    let t = ["pub(crate) ", "pub(super) ", "pub "]
        .iter()
        .find_map(|p| t.strip_prefix(p))
        .unwrap_or(t);
    let (name, after) = t.strip_prefix("mod ")?.split_once('{')?;
    let name = name.trim();
    let word = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
    (word && after.trim().is_empty()).then(|| name.to_string())
}

/// Code with the paths of restricted visibility (`pub(in crate::a)`) left out: they say who
/// may see an item, not what it needs.
fn without_visibility_paths(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    let mut rest = t;
    while let Some(i) = rest.find("pub(in ") {
        out.push_str(&rest[..i + 3]);
        rest = rest[i..].split_once(')').map_or("", |(_, r)| r);
    }
    out.push_str(rest);
    out
}

/// The paths a file names and the names it binds, code under `#[cfg(test)]` skipped.
fn read(text: &str) -> Reading {
    let mut out = Reading::default();
    let mut in_block = false;
    let mut depth = 0i64;
    // While skipping a test-only item: the depth it sits at and whether its body opened.
    let mut skip: Option<(i64, bool)> = None;
    // The inline modules open at this line, each with the depth it opened at.
    let mut inline: Vec<(String, i64)> = Vec::new();
    let mut stmt = String::new();
    let mut stmt_depth = 0;
    for line in text.lines() {
        let code = without_visibility_paths(&code_of(line, &mut in_block));
        let mut t = code.trim();
        if let Some(rest) = test_only(t) {
            skip = Some((depth, false));
            t = rest;
        }
        let opens = t.matches('{').count() as i64;
        let closes = t.matches('}').count() as i64;
        if let Some((at, opened)) = skip {
            depth += opens - closes;
            let opened = opened || opens > 0;
            let over = if opened {
                depth <= at
            } else {
                t.ends_with(';') || t.ends_with(',')
            };
            skip = (!over).then_some((at, opened));
            continue;
        }
        let within: Vec<String> = inline.iter().map(|(m, _)| m.clone()).collect();
        if let Some(name) = inline_module(t) {
            inline.push((name, depth));
        }
        let is_use = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .any(|p| t.starts_with(p));
        if stmt.is_empty() && !is_use {
            out.paths
                .extend(inline_paths(t).into_iter().map(|p| (within.clone(), p)));
            depth += opens - closes;
            inline.retain(|(_, at)| depth > *at);
            continue;
        }
        if stmt.is_empty() {
            stmt_depth = depth;
        }
        stmt.push(' ');
        stmt.push_str(t);
        depth += opens - closes;
        if !t.ends_with(';') {
            continue;
        }
        let body = stmt.split_once("use ").map_or("", |(_, b)| b);
        let tree = body.trim().trim_end_matches(';');
        out.paths
            .extend(expand_use(tree).into_iter().map(|p| (within.clone(), p)));
        if stmt_depth == 0 {
            for (path, name) in use_leaves(tree) {
                if let Some(name) = name {
                    out.bindings.insert(name, path);
                }
            }
        }
        stmt.clear();
    }
    out
}

/// How far a chain of imports and re-exports is followed before giving up (a `use` that
/// binds a name to a path through that same name would otherwise never end).
const MAX_HOPS: usize = 16;

/// The crate's sources with what each names, to follow paths to the files that define what
/// they name.
struct Resolver<'s> {
    sources: &'s Sources,
    readings: BTreeMap<&'s [String], Reading>,
}

impl Resolver<'_> {
    /// The crate-absolute segments of `path` written in `module`, or `None` outside the crate.
    fn absolute(&self, module: &[String], path: &str, hops: usize) -> Option<Vec<String>> {
        let parts: Vec<&str> = path.split("::").map(str::trim).collect();
        let first = *parts.first()?;
        let mut at: Vec<String> = match first {
            "crate" => Vec::new(),
            "super" => module[..module.len().checked_sub(1)?].to_vec(),
            "self" => module.to_vec(),
            "" => return None,
            name => {
                let mut child = module.to_vec();
                child.push(name.to_string());
                if self.sources.contains_key(&child) {
                    child
                } else {
                    let bound = self.readings.get(module)?.bindings.get(name)?;
                    if hops >= MAX_HOPS {
                        return None;
                    }
                    self.absolute(module, bound, hops + 1)?
                }
            }
        };
        for p in &parts[1..] {
            match *p {
                "super" => {
                    at.pop()?;
                }
                "self" => {}
                "" => break,
                name => at.push(name.to_string()),
            }
        }
        Some(at)
    }

    /// The file that defines what `path`, written in `module`, names: its deepest module that
    /// is a file, or where that file's `use` of the name leads.
    fn file_of(&self, module: &[String], path: &str, hops: usize) -> Option<String> {
        let abs = self.absolute(module, path, hops)?;
        let mut k = abs.len();
        while k > 0 && !self.sources.contains_key(&abs[..k]) {
            k -= 1;
        }
        let home = &abs[..k];
        if let Some(item) = abs.get(k)
            && let Some(bound) = self.readings.get(home).and_then(|r| r.bindings.get(item))
            && hops < MAX_HOPS
        {
            let mut onward = bound.clone();
            for rest in &abs[k + 1..] {
                onward.push_str("::");
                onward.push_str(rest);
            }
            return self.file_of(home, &onward, hops + 1);
        }
        self.sources.get(home).map(|(file, _)| file.clone())
    }
}

/// The file-level import graph of a crate: each file to the files whose items it names.
pub fn import_graph(sources: &Sources) -> BTreeMap<String, BTreeSet<String>> {
    let resolver = Resolver {
        sources,
        readings: sources
            .iter()
            .map(|(m, (_, text))| (m.as_slice(), read(text)))
            .collect(),
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, (me, _)) in sources {
        let entry = graph.entry(me.clone()).or_default();
        for (within, path) in &resolver.readings[module.as_slice()].paths {
            let at: Vec<String> = module.iter().chain(within).cloned().collect();
            if let Some(f) = resolver.file_of(&at, path, 0)
                && f != *me
            {
                entry.insert(f);
            }
        }
    }
    graph
}

#[cfg(test)]
mod cases {
    use super::*;
    use crate::source::loops;

    /// The loops of a crate made of `files` (module path with `::`, text).
    fn loops_of(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        let sources: Sources = files
            .iter()
            .map(|(m, text)| {
                let module: Vec<String> = m
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                let name = if m.is_empty() { "lib" } else { m };
                (module, (name.to_string(), text.to_string()))
            })
            .collect();
        loops(&import_graph(&sources))
    }

    fn group(names: &[&str]) -> Vec<Vec<String>> {
        vec![names.iter().map(|s| s.to_string()).collect()]
    }

    #[test]
    fn two_files_that_use_each_other_are_a_loop() {
        let found = loops_of(&[
            ("", "mod a;\nmod b;\n"),
            ("a", "use crate::b::B;\npub struct A;\n"),
            ("b", "pub struct B;\nfn f(a: &crate::a::A) {}\n"),
        ]);
        assert_eq!(found, group(&["a", "b"]));
        // The same through `super::` and a bound module name (`use super::a;` then `a::A`).
        let found = loops_of(&[
            ("", "mod a;\nmod b;\n"),
            ("a", "use super::b;\npub struct A(b::B);\n"),
            ("b", "pub struct B;\nfn f(x: super::a::A) {}\n"),
        ]);
        assert_eq!(found, group(&["a", "b"]));
    }

    #[test]
    fn a_parent_that_uses_its_child_which_uses_it_back_is_a_loop() {
        // In code, by a bare child path.
        let found = loops_of(&[
            ("", "mod m;\n"),
            (
                "m",
                "mod c;\npub struct Y;\nfn g() {\n    c::helper();\n}\n",
            ),
            ("m::c", "use super::Y;\npub fn helper() {}\n"),
        ]);
        assert_eq!(found, group(&["m", "m::c"]));
        // By a re-export, over several lines.
        let found = loops_of(&[
            ("", "mod m;\n"),
            (
                "m",
                "mod c;\npub use self::c::{\n    helper,\n};\npub struct Y;\n",
            ),
            ("m::c", "pub fn helper(y: super::Y) {}\n"),
        ]);
        assert_eq!(found, group(&["m", "m::c"]));
    }

    #[test]
    fn declaring_a_child_re_exports_and_test_code_make_no_loop() {
        // The parent only declares its child.
        let found = loops_of(&[
            ("", "mod m;\n"),
            ("m", "mod c;\npub struct Y;\n"),
            ("m::c", "use super::Y;\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
        // A name the parent re-exports from a sibling leads to the sibling.
        let found = loops_of(&[
            ("", "mod m;\n"),
            ("m", "mod a;\nmod b;\npub use a::A;\npub use b::B as Bee;\n"),
            ("m::a", "use super::Bee;\npub struct A;\n"),
            ("m::b", "pub struct B;\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
        // Test code names what it likes; what follows it still counts.
        let found = loops_of(&[
            ("", "mod a;\nmod b;\n"),
            (
                "a",
                "#[cfg(test)]\nmod tests;\n#[cfg(test)]\nfn t() {\n    crate::b::f();\n}\npub fn g() {}\n",
            ),
            ("b", "pub fn f() {\n    crate::a::g();\n}\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
        // `super` inside an inline module is the file itself; a visibility path is no import.
        let found = loops_of(&[
            ("", "mod a;\nmod b;\n"),
            ("a", "use crate::b::f;\nmod imp {\n    use super::*;\n}\n"),
            ("b", "pub(in crate::a) fn f() {}\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
        let found = loops_of(&[
            ("", "mod a;\nmod b;\n"),
            (
                "a",
                "#[cfg(test)]\nmod tests;\nuse crate::b::f;\npub fn g() {}\n",
            ),
            ("b", "pub fn f() {\n    crate::a::g();\n}\n"),
        ]);
        assert_eq!(found, group(&["a", "b"]));
    }
}
