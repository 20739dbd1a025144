//! Property test: mutated NCCL XML samples never make the importer panic.
//!
//! Each case takes one of the samples and applies a few mutations (delete, insert or
//! replace a token, truncate, swap two lines, splice in random bytes); the importer must return
//! `Ok` or `Err`, and an `Ok` topology must hold together (every GPU index answers).

use proptest::prelude::*;
use relaycc_topo::import::nccl_xml;

const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
const FILES: [&str; 3] = [
    "azure-ndv2-v100.nccl-topo.xml",
    "azure-ndv2-v100.nvlink-self-link.nccl-topo.xml",
    "hgx-a100-80gb-nvswitch-5bondnic.nccl-topo-dump.xml",
];

/// Tokens that matter to the importer, spliced in to reach deeper code than random bytes do.
const TOKENS: &[&str] = &[
    "<",
    ">",
    "/>",
    "</pci>",
    "<pci class=\"0x060400\">",
    "<gpu dev=\"0\" sm=\"80\">",
    "</gpu>",
    "<nvlink target=\"0000:13:00.0\" count=\"2\"/>",
    "<nic><net name=\"x\"/></nic>",
    "\"",
    "=",
    "0x030200",
    "0x068000",
    "0x068001",
    "-1",
    "99999999999",
    "dev=\"7\"",
    "numaid=\"0\"",
    "link_speed=\"",
    "GT/s",
    "<!--",
    "-->",
    "&amp;",
    "&bogus;",
    "<cpu>",
    "</cpu>",
    "</system>",
];

#[derive(Debug, Clone)]
enum Mutation {
    Delete { at: usize, len: usize },
    Insert { at: usize, token: usize },
    Replace { at: usize, len: usize, token: usize },
    Truncate { at: usize },
    SwapLines { a: usize, b: usize },
    Bytes { at: usize, bytes: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = 0usize..1_000_000;
    prop_oneof![
        (pos.clone(), 1usize..40).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (pos.clone(), 0..TOKENS.len()).prop_map(|(at, token)| Mutation::Insert { at, token }),
        (pos.clone(), 1usize..20, 0..TOKENS.len()).prop_map(|(at, len, token)| Mutation::Replace {
            at,
            len,
            token
        }),
        pos.clone().prop_map(|at| Mutation::Truncate { at }),
        (pos.clone(), pos.clone()).prop_map(|(a, b)| Mutation::SwapLines { a, b }),
        (pos, proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Bytes { at, bytes }),
    ]
}

/// Apply a mutation to bytes (positions wrap around the length).
fn apply(text: &mut Vec<u8>, m: &Mutation) {
    let n = text.len().max(1);
    match m {
        Mutation::Delete { at, len } => {
            let a = at % n;
            let b = (a + len).min(text.len());
            text.drain(a.min(b)..b);
        }
        Mutation::Insert { at, token } => {
            let a = (at % n).min(text.len());
            text.splice(a..a, TOKENS[*token].bytes());
        }
        Mutation::Replace { at, len, token } => {
            let a = (at % n).min(text.len());
            let b = (a + len).min(text.len());
            text.splice(a..b, TOKENS[*token].bytes());
        }
        Mutation::Truncate { at } => text.truncate(at % n),
        Mutation::SwapLines { a, b } => {
            let s = String::from_utf8_lossy(text).into_owned();
            let mut lines: Vec<&str> = s.lines().collect();
            if !lines.is_empty() {
                let (x, y) = (a % lines.len(), b % lines.len());
                lines.swap(x, y);
            }
            *text = lines.join("\n").into_bytes();
        }
        Mutation::Bytes { at, bytes } => {
            let a = (at % n).min(text.len());
            text.splice(a..a, bytes.iter().copied());
        }
    }
}

fn samples() -> Vec<Vec<u8>> {
    FILES
        .iter()
        .map(|f| std::fs::read(format!("{SAMPLES}/{f}")).unwrap())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_samples_never_panic(
        which in 0usize..2,
        mutations in proptest::collection::vec(mutation(), 1..5),
    ) {
        thread_local!(static SAMPLES_BYTES: Vec<Vec<u8>> = samples());
        let mut text = SAMPLES_BYTES.with(|s| s[which].clone());
        for m in &mutations {
            apply(&mut text, m);
        }
        // Importers take text; invalid UTF-8 is refused before them (import::from_path).
        let text = String::from_utf8_lossy(&text);
        if let Ok(t) = nccl_xml::parse(&text, "fuzz.xml") {
            for i in 0..t.gpu_count() {
                prop_assert!(t.gpu_info(i).is_ok());
                for j in 0..t.gpu_count() {
                    let _ = t.classify(t.gpu(i).unwrap(), t.gpu(j).unwrap());
                }
            }
        }
    }
}

#[test]
fn every_truncation_of_both_samples_is_handled() {
    for (f, s) in FILES.iter().zip(samples()) {
        let text = String::from_utf8(s).unwrap();
        for cut in (0..text.len())
            .filter(|c| text.is_char_boundary(*c))
            .step_by(7)
        {
            let r = nccl_xml::parse(&text[..cut], f);
            assert!(
                r.is_err() || cut > text.len() - 12,
                "{f} cut at {cut} parsed"
            );
        }
    }
}
