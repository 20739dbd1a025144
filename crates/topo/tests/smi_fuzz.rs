//! Property test: the nvidia-smi importer never panics on mutated real samples (tokens deleted,
//! inserted or replaced, lines swapped, the text truncated, random bytes inserted); it returns
//! a graph or a parse error. A graph it returns must survive export and re-import unchanged in
//! GPU and NIC count.

use std::path::PathBuf;

use proptest::prelude::*;
use relaycc_topo::{TopoError, export, import};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

/// Tokens that mutations insert: cells, labels, affinity values, separators, legend lines.
const VOCABULARY: &[&str] = &[
    "X",
    " X ",
    "NV1",
    "NV18",
    "NV0",
    "PIX",
    "PXB",
    "PHB",
    "NODE",
    "SYS",
    "SOC",
    "GPU0",
    "GPU9",
    "GPU99999999999999",
    "NIC0",
    "mlx5_0",
    "CPU Affinity",
    "NUMA Affinity",
    "GPU NUMA ID",
    "N/A",
    "0-7,16-23",
    "",
    "\t",
    " ",
    "\n",
    "\r\n",
    "\u{feff}",
    "Legend:",
    "NIC Legend:",
    "NIC0: mlx5_0",
    "\u{1b}[4m",
    "\u{1b}[0m",
    "[4m",
    "[0m",
    "\u{1b}",
];

fn samples() -> Vec<String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(DATA)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".nvidia-smi-topo"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

#[derive(Debug, Clone)]
enum Mutation {
    DeleteToken(usize),
    InsertToken(usize, usize),
    ReplaceToken(usize, usize),
    SwapLines(usize, usize),
    DeleteLine(usize),
    DuplicateLine(usize),
    Truncate(usize),
    InsertBytes(usize, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = 0usize..100_000;
    prop_oneof![
        at.clone().prop_map(Mutation::DeleteToken),
        (at.clone(), 0..VOCABULARY.len()).prop_map(|(a, t)| Mutation::InsertToken(a, t)),
        (at.clone(), 0..VOCABULARY.len()).prop_map(|(a, t)| Mutation::ReplaceToken(a, t)),
        (at.clone(), at.clone()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        at.clone().prop_map(Mutation::DeleteLine),
        at.clone().prop_map(Mutation::DuplicateLine),
        at.clone().prop_map(Mutation::Truncate),
        (at, proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(a, b)| Mutation::InsertBytes(a, b)),
    ]
}

/// Byte offsets where tokens (runs of non-blank characters) start, plus their ends.
fn tokens(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// The char boundary at or before `at % (len + 1)`.
fn boundary(text: &str, at: usize) -> usize {
    let mut i = at % (text.len() + 1);
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(text: &str, m: &Mutation) -> String {
    let toks = tokens(text);
    let pick = |a: usize| toks.get(a % toks.len().max(1)).copied();
    let mut lines: Vec<&str> = text.split('\n').collect();
    let n = lines.len();
    match m {
        Mutation::DeleteToken(a) => match pick(*a) {
            Some((s, e)) => format!("{}{}", &text[..s], &text[e..]),
            None => text.to_string(),
        },
        Mutation::InsertToken(a, t) => {
            let i = boundary(text, *a);
            format!("{}{}{}", &text[..i], VOCABULARY[*t], &text[i..])
        }
        Mutation::ReplaceToken(a, t) => match pick(*a) {
            Some((s, e)) => format!("{}{}{}", &text[..s], VOCABULARY[*t], &text[e..]),
            None => text.to_string(),
        },
        Mutation::SwapLines(a, b) => {
            lines.swap(a % n, b % n);
            lines.join("\n")
        }
        Mutation::DeleteLine(a) => {
            lines.remove(a % n);
            lines.join("\n")
        }
        Mutation::DuplicateLine(a) => {
            let l = lines[a % n];
            lines.insert(a % n, l);
            lines.join("\n")
        }
        Mutation::Truncate(a) => text[..boundary(text, *a)].to_string(),
        Mutation::InsertBytes(a, bytes) => {
            let i = boundary(text, *a);
            let junk = String::from_utf8_lossy(bytes);
            format!("{}{junk}{}", &text[..i], &text[i..])
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_samples_never_panic(
        sample in 0usize..7,
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let all = samples();
        let mut text = all[sample % all.len()].clone();
        for m in &mutations {
            text = apply(&text, m);
        }
        match import::smi::parse(&text, "fuzz") {
            Ok(topo) => {
                let again = import::smi::parse(&export::to_smi(&topo), "again")
                    .map_err(|e| TestCaseError::fail(format!("re-import failed: {e}")))?;
                prop_assert_eq!(topo.gpu_count(), again.gpu_count());
                prop_assert_eq!(topo.nics().count(), again.nics().count());
            }
            Err(TopoError::Parse { source_name, .. }) => prop_assert_eq!(source_name, "fuzz"),
            Err(e) => return Err(TestCaseError::fail(format!("not a parse error: {e}"))),
        }
    }
}
