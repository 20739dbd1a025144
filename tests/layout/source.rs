//! Reading Rust sources without a parser: code with comments and literals blanked, the
//! functions of a file with their lengths, the paths a `use` tree or a line of code names
//! and the names a `use` binds, and the loops of an import graph.

use std::collections::{BTreeMap, BTreeSet};

/// The code of a line with comments, string and char literals blanked, so braces and words
/// inside them do not count. `in_block` carries an open `/* */` comment across lines.
pub fn code_of(line: &str, in_block: &mut bool) -> String {
    let b = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < b.len() {
        if *in_block {
            if b[i..].starts_with(b"*/") {
                *in_block = false;
                i += 2;
            } else {
                i += 1;
            }
            continue;
        }
        match b[i] {
            b'/' if b[i..].starts_with(b"//") => break,
            b'/' if b[i..].starts_with(b"/*") => {
                *in_block = true;
                i += 2;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' if i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') => {
                // A char literal ('x', '\n', '\''); lifetimes ('a) are left alone.
                i += 1;
                while i < b.len() && b[i] != b'\'' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("' '");
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

/// Every function of `text` with a body: (name, first line, lines), test modules
/// (`#[cfg(test)] mod ... {`) skipped.
pub fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    let mut in_block = false;
    let lines: Vec<String> = text.lines().map(|l| code_of(l, &mut in_block)).collect();
    let mut i = 0;
    let mut test_attr = false;
    while i < lines.len() {
        let t = lines[i].trim_start();
        if t.starts_with("#[cfg(test)]") {
            test_attr = true;
            i += 1;
            continue;
        }
        let is_mod = t.starts_with("mod ") || t.starts_with("pub mod ");
        if test_attr && is_mod && t.contains('{') {
            i = block_end(&lines, i) + 1;
            test_attr = false;
            continue;
        }
        if !t.starts_with("#[") {
            test_attr = false;
        }
        if let Some(name) = fn_name(t) {
            // The body opens on this line or a later one (long signatures); a `;` first means
            // a declaration without a body (a trait method).
            let mut j = i;
            while j < lines.len() && !lines[j].contains('{') && !lines[j].contains(';') {
                j += 1;
            }
            if j < lines.len() && lines[j].contains('{') {
                let end = block_end(&lines, j);
                found.push((name, i + 1, end + 1 - i));
                i = end + 1;
                continue;
            }
        }
        i += 1;
    }
    found
}

/// The name of the function a line declares, if it does.
pub fn fn_name(t: &str) -> Option<String> {
    let mut rest = t;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
        "extern \"\" ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    for prefix in ["const ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The line where the brace block opened on line `start` closes.
pub fn block_end(lines: &[String], start: usize) -> usize {
    let mut depth = 0i64;
    let mut opened = false;
    for (k, l) in lines.iter().enumerate().skip(start) {
        for c in l.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
            if opened && depth == 0 {
                return k;
            }
        }
    }
    lines.len().saturating_sub(1)
}

/// The paths of a `use` tree (`a::{b, c::{d}}` -> `a::b`, `a::c::d`), aliases left off.
pub fn expand_use(tree: &str) -> Vec<String> {
    use_leaves(tree).into_iter().map(|(path, _)| path).collect()
}

/// The leaves of a `use` tree with the name each binds: `a::{b, c as d, e::{self}, f::*}`
/// -> (`a::b`, `b`), (`a::c`, `d`), (`a::e`, `e`), (`a::f::*`, none); `as _` binds none.
pub fn use_leaves(tree: &str) -> Vec<(String, Option<String>)> {
    let words: Vec<&str> = tree.split_whitespace().collect();
    // `as` between two words marks an alias; `@` keeps it once the spaces are gone.
    let tree = words.join(" ").replace(" as ", "@").replace(' ', "");
    let mut out = Vec::new();
    leaves(&tree, &mut out);
    out
}

fn leaves(tree: &str, out: &mut Vec<(String, Option<String>)>) {
    let Some(open) = tree.find('{') else {
        let (path, alias) = match tree.split_once('@') {
            Some((p, a)) => (p, Some(a)),
            None => (tree, None),
        };
        let path = path.strip_suffix("::self").unwrap_or(path);
        let last = path.rsplit("::").next().unwrap_or(path);
        let name = match alias {
            Some("_") => None,
            Some(a) => Some(a.to_string()),
            None => (last != "*" && last != "self").then(|| last.to_string()),
        };
        out.push((path.to_string(), name));
        return;
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    let mut parts = Vec::new();
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    for p in parts.into_iter().filter(|p| !p.is_empty()) {
        leaves(&format!("{prefix}{p}"), out);
    }
}

/// The paths (two or more segments joined by `::`) written in a line of code, in order:
/// `crate::a::f`, `super::x`, `self::c::T`, `child::f`, `Vec::new`, ...; which of them name
/// the crate's own files is the import graph's question.
pub fn inline_paths(code: &str) -> Vec<String> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("::") {
        // Back to the start of the path the `::` sits in.
        let head = rest[..i]
            .char_indices()
            .rev()
            .find(|&(_, c)| !(is_word(c) || c == ':'))
            .map_or(0, |(k, c)| k + c.len_utf8());
        let tail = &rest[head..];
        let len = tail
            .find(|c: char| !(is_word(c) || c == ':'))
            .unwrap_or(tail.len());
        let path = tail[..len].trim_end_matches(':');
        if path.contains("::") && !path.starts_with(':') {
            out.push(path.to_string());
        }
        rest = &tail[len.max(i - head + 2)..];
    }
    out
}

/// The strongly connected groups of more than one file (Tarjan's algorithm).
pub fn loops(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low[v];
                    self.low.insert(v, lv.min(lw));
                } else if self.on.contains(w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low[v];
                    self.low.insert(v, lv.min(iw));
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    group.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.out.push(group);
                }
            }
        }
    }
    let mut w = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !w.index.contains_key(v.as_str()) {
            w.visit(v);
        }
    }
    w.out
}

/// The words of `line` that look like a date (`2026-11-26`) or a commit hash (7 to 40 hex
/// digits with at least one letter and one digit, in backticks).
pub fn dated_or_hashed(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let b = line.as_bytes();
    for i in 0..b.len() {
        let at = |k: usize| b.get(i + k).copied().unwrap_or(b' ');
        let digits = |from: usize, n: usize| (from..from + n).all(|k| at(k).is_ascii_digit());
        let before = i.checked_sub(1).map(|k| b[k]).unwrap_or(b' ');
        if digits(0, 4)
            && at(4) == b'-'
            && digits(5, 2)
            && at(7) == b'-'
            && digits(8, 2)
            && !before.is_ascii_alphanumeric()
            && b"12".contains(&at(0))
        {
            found.push(line[i..i + 10].to_string());
        }
    }
    for word in line.split('`').skip(1).step_by(2) {
        let hex = (7..=40).contains(&word.len())
            && word
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
        if hex
            && word.chars().any(|c| c.is_ascii_digit())
            && word.chars().any(|c| c.is_ascii_alphabetic())
        {
            found.push(word.to_string());
        }
    }
    found
}

#[test]
fn the_readers_catch_what_they_look_for() {
    let text = "pub fn a() {\n    let s = \"}\";\n    if x {\n    }\n}\n#[cfg(test)]\nmod tests {\n    fn b() {\n    }\n}\nfn c<T>(\n    x: T,\n) -> u8 {\n    1\n}\n";
    assert_eq!(
        functions(text),
        [("a".to_string(), 1, 5), ("c".to_string(), 11, 5)]
    );
    assert_eq!(
        expand_use("crate::{plan::{Plan, Op}, sim}"),
        ["crate::plan::Plan", "crate::plan::Op", "crate::sim"]
    );
    assert_eq!(
        inline_paths(
            "let x = crate::template::fold::fold(p, super::w) + c::f::<T>(<T as a::B>::g);"
        ),
        ["crate::template::fold::fold", "super::w", "c::f", "a::B"]
    );
    assert_eq!(
        use_leaves("crate::{a as b, c::{self, D}, e::*, f as _}"),
        [
            ("crate::a".to_string(), Some("b".to_string())),
            ("crate::c".into(), Some("c".into())),
            ("crate::c::D".into(), Some("D".into())),
            ("crate::e::*".into(), None),
            ("crate::f".into(), None),
        ]
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(loops(&g), [vec!["a".to_string(), "b".into(), "c".into()]]);
    assert_eq!(
        dated_or_hashed("now (2026-11-26) at `fe394d8`, not `dgx1` or `1024`"),
        ["2026-11-26", "fe394d8"]
    );
}
