//! Property tests: topology files with mutations never make an importer or the planner
//! panic, nor size anything by a number the file gives. The files are relaycc JSON with
//! mutated values (a number, string or flag replaced by an extreme or a wrong one, an entry
//! removed or repeated), and the real nvidia-smi and NCCL XML samples of
//! `crates/topo/tests/data` with tokens inserted, replaced or deleted. An importer returns
//! `Ok` or `Err`; an `Ok` topology exports JSON that imports again, and DOT and the
//! nvidia-smi matrix; a collective over its GPUs plans within the budget to a plan the checker
//! proves, with a finite prediction, or gives an error. (The importers' own fuzzers in
//! `crates/topo/tests` mutate the samples more ways and check the import alone.)

use std::time::Duration;

use proptest::prelude::*;
use relaycc_route::{Collective, DType, PlanOptions, ReduceOp, Request, check, plan};
use relaycc_topo::Topology;
use relaycc_topo::export::{to_dot, to_json, to_smi};
use relaycc_topo::import::{json, nccl_xml, smi};
use serde_json::{Value, json};

/// Small machines of every kind the JSON carries: NVLink, PCIe switches, host memory arenas,
/// ranks sharing a GPU, two hosts over a network.
const PRESETS: [&str; 5] = [
    "dgx1-v100",
    "pcie-4gpu",
    "host-4",
    "shared-gpu-4",
    "cluster:2xpcie-4gpu:ib-edr",
];

/// Numbers a mutated number takes: zeros, negatives, extremes, and small counts.
const NUMBERS: [f64; 16] = [
    0.0,
    -1.0,
    1e308,
    1e-308,
    4_294_967_295.0,
    1.8e19,
    99.0,
    2.5,
    7.0,
    1.0,
    65_536.0,
    3.0,
    0.5,
    1e-9,
    1e9,
    16.0,
];

/// Strings a mutated string takes: other nodes' names, kinds, nothing.
const STRINGS: [&str; 12] = [
    "GPU0",
    "GPU1",
    "CPU0",
    "CPU1",
    "PCIe0",
    "NIC0",
    "",
    "gpu",
    "nvlink",
    "cpu",
    "pcie_switch",
    "x",
];

/// Values of another type, for a mutation that changes a field's type.
fn other(k: u64) -> Value {
    let values = [
        json!(0),
        json!(-1),
        json!(true),
        Value::Null,
        json!("GPU0"),
        json!([]),
        json!({}),
        json!(4_294_967_295u64),
    ];
    values[k as usize % values.len()].clone()
}

/// The number of values in `v`, itself included.
fn values(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(values).sum(),
        Value::Object(o) => o.values().map(values).sum(),
        _ => 0,
    }
}

/// Mutate value `at` of `v` (preorder) by `op`: one in five times it takes another type;
/// otherwise a number takes one of [`NUMBERS`] (a whole one stays whole), a string one of
/// [`STRINGS`], a flag flips; a value in an array or object is removed or, in an array,
/// repeated, where `op` says so. True once done.
fn mutate(v: &mut Value, at: &mut usize, op: u64) -> bool {
    if *at == 0 {
        let pick = (op / 5) as usize;
        *v = match v {
            _ if op.is_multiple_of(5) => other(op / 5),
            Value::Number(n) => {
                let x = NUMBERS[pick % NUMBERS.len()];
                if n.is_f64() || x.fract() != 0.0 || x < 0.0 {
                    json!(x)
                } else {
                    json!(x as u64)
                }
            }
            Value::String(_) => json!(STRINGS[pick % STRINGS.len()]),
            Value::Bool(b) => Value::Bool(!*b),
            _ => other(op / 5),
        };
        return true;
    }
    *at -= 1;
    match v {
        Value::Array(a) => {
            for i in 0..a.len() {
                if *at == 0 && op % 7 < 2 {
                    if op.is_multiple_of(7) {
                        a.remove(i);
                    } else {
                        let x = a[i].clone();
                        a.push(x);
                    }
                    return true;
                }
                if mutate(&mut a[i], at, op) {
                    return true;
                }
            }
        }
        Value::Object(o) => {
            let keys: Vec<String> = o.keys().cloned().collect();
            for k in keys {
                if *at == 0 && op.is_multiple_of(7) {
                    o.remove(&k);
                    return true;
                }
                if let Some(x) = o.get_mut(&k)
                    && mutate(x, at, op)
                {
                    return true;
                }
            }
        }
        _ => {}
    }
    false
}

/// Plan `c` over every GPU of `imported`, if it imported; the checks of the module docs.
fn plan_imported(
    imported: relaycc_topo::Result<Topology>,
    c: Collective,
    count: u64,
) -> Result<(), TestCaseError> {
    let Ok(t) = imported else {
        return Ok(());
    };
    let back = json::parse(&to_json(&t), "exported.json");
    prop_assert!(back.is_ok(), "the export does not import: {:?}", back.err());
    // The other views `topo show` prints, and the host symmetry the planners read.
    let _ = (to_dot(&t), to_smi(&t), t.host_symmetry());
    let g = t.gpu_count();
    if g == 0 || g > 16 {
        return Ok(());
    }
    let gpus: Vec<u32> = (0..g).collect();
    let mut req = Request::new(c, gpus, count, DType::F32);
    if c.reduces() {
        req = req.with_op(ReduceOp::Sum);
    }
    req.counts = vec![count; g as usize];
    req.matrix = vec![vec![count; g as usize]; g as usize];
    let opts = PlanOptions {
        budget: Duration::from_millis(300),
        ..PlanOptions::default()
    };
    if let Ok(p) = plan(&t, &req, &opts) {
        prop_assert!(check(&p.plan).is_ok(), "{c}: {}", p.plan.algorithm);
        prop_assert!(p.predicted.time_us.is_finite(), "{c}: {:?}", p.predicted);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_json_topologies_import_and_plan_or_fail_cleanly(
        preset in 0..PRESETS.len(),
        mutations in proptest::collection::vec((any::<usize>(), any::<u64>()), 1..4),
        coll in 0..Collective::ALL.len(),
        count in 0u64..5000,
    ) {
        thread_local!(static SAMPLES: Vec<Value> = PRESETS
            .iter()
            .map(|p| serde_json::from_str(&to_json(&relaycc_topo::load(p).unwrap())).unwrap())
            .collect());
        let mut v = SAMPLES.with(|s| s[preset].clone());
        for (at, op) in mutations {
            let mut at = at % values(&v);
            mutate(&mut v, &mut at, op);
        }
        plan_imported(json::parse(&v.to_string(), "mutated.json"), Collective::ALL[coll], count)?;
    }

    #[test]
    fn mutated_smi_and_xml_samples_import_and_plan_or_fail_cleanly(
        sample in any::<usize>(),
        edits in proptest::collection::vec((any::<usize>(), 0..EDIT_TOKENS.len(), 0usize..12, 0u8..3), 1..4),
        coll in 0..Collective::ALL.len(),
        count in 0u64..5000,
    ) {
        thread_local!(static FILES: Vec<(String, String)> = samples());
        let (name, text) = FILES.with(|f| f[sample % f.len()].clone());
        let mut bytes = text.into_bytes();
        for (at, token, len, kind) in edits {
            let a = at % (bytes.len() + 1);
            let b = (a + len).min(bytes.len());
            match kind {
                0 => drop(bytes.splice(a..b, EDIT_TOKENS[token].bytes())),
                1 => drop(bytes.splice(a..a, EDIT_TOKENS[token].bytes())),
                _ => drop(bytes.drain(a..b)),
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let imported = if name.ends_with(".xml") {
            nccl_xml::parse(&text, &name)
        } else {
            smi::parse(&text, &name)
        };
        plan_imported(imported, Collective::ALL[coll], count)?;
    }
}

/// The real samples the importers' tests read: (file name, text).
fn samples() -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../topo/tests/data");
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "xml" || x == "txt"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    files.sort();
    assert!(files.len() >= 8, "{dir}: {} samples", files.len());
    files
}

/// Tokens spliced into the samples: matrix cells and labels, XML tags and attributes, and
/// numbers past every range (a GPU index, an SM version, a link count, a rate).
const EDIT_TOKENS: [&str; 28] = [
    "X",
    "NV1",
    "NV18",
    "PIX",
    "PXB",
    "SYS",
    "NODE",
    "GPU0",
    "GPU9",
    "NIC0",
    "N/A",
    " ",
    "\n",
    "<",
    "/>",
    "</pci>",
    "<gpu dev=\"0\" sm=\"80\">",
    "</gpu>",
    "<nvlink target=\"0000:13:00.0\" count=\"2\"/>",
    "\"",
    "=",
    "-1",
    "99999999999",
    "sm=\"1000000000\"",
    "count=\"4000000000\"",
    "numaid=\"99999\"",
    "bw=\"1e300\"",
    "dev=\"7\"",
];

/// The case the fuzzing above found: a node on host 4,294,967,295 of a one-host machine
/// made the bound allocate per host number. Its host is host 1 once imported.
#[test]
fn a_host_numbered_far_past_the_nodes_is_host_one() {
    let mut v: Value =
        serde_json::from_str(&to_json(&relaycc_topo::load("host-4").unwrap())).unwrap();
    v["nodes"][2]["host"] = json!(u32::MAX);
    let t = json::parse(&v.to_string(), "far.json").unwrap();
    assert_eq!(t.host_count(), 2);
    for c in Collective::ALL {
        plan_imported(Ok(t.clone()), c, 1000).unwrap();
    }
}
