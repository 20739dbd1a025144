//! What the planning and bench commands print: link kinds, staging per memory, the shared
//! `--dtype`/`--op` options.

mod common;

use common::{BENCH_4K_ONCE, json_line, relaycc, relaycc_line, stderr, stdout};

/// route and plan tables say their figures are predictions, name every hop's link kind, keep
/// the share column aligned however long a path is, and give staging memory per GPU.
#[test]
fn route_and_plan_tables_name_link_kinds_and_staging_per_gpu() {
    let o = relaycc_line("route -t dgx1-v100 --from 0 --to 7 --size 256MiB");
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("predictions"), "{text}");
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("  GPU0 ")).collect();
    assert!(rows.len() >= 2, "{text}");
    // Every hop carries its kind: one `-[...]->` per hop, as many as waypoints minus one.
    for r in &rows {
        let hops = r.matches("-[").count();
        let gpus = r.matches("GPU").count() + r.matches("CPU").count();
        assert_eq!(hops + 1, gpus, "{r}");
        assert!(r.contains("NVLink2") || r.contains("host memory"), "{r}");
    }
    let share_col: Vec<usize> = rows.iter().map(|r| r.find('%').unwrap()).collect();
    assert!(share_col.iter().all(|&c| c == share_col[0]), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("staging: GPU")),
        "{text}"
    );

    let v = json_line("route -t dgx1-v100 --from 0 --to 7 --size 256MiB --format json");
    for p in v["paths"].as_array().unwrap() {
        assert_eq!(
            p["hop_kinds"].as_array().unwrap().len() + 1,
            p["hops"].as_array().unwrap().len(),
            "{p}"
        );
    }
    let pcie =
        json_line("route -t pcie-4gpu --from 0 --to 1 --size 1MiB --format json --strategy direct");
    let kinds = &pcie["paths"][0]["hop_kinds"];
    assert!(
        kinds[0].as_str().is_some_and(|k| k.starts_with("PCIe")),
        "{pcie}"
    );

    let v = json_line("plan all_reduce -t dgx1-v100 --gpus 0,2,5,7 --size 256MiB --format json");
    let per: u64 = v["staging_bytes"]
        .as_object()
        .unwrap()
        .values()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert_eq!(per, v["scratch_bytes"].as_u64().unwrap(), "{v}");
    let table = stdout(&relaycc_line(
        "plan all_reduce -t dgx1-v100 --gpus 0,2,5,7 --size 256MiB",
    ));
    assert!(table.contains("predictions"), "{table}");
    assert!(
        table.contains("staging: ") && table.contains("GPU0 "),
        "{table}"
    );
}

/// `--dtype` and `--op` are spelled and defaulted alike in plan, simulate, advise and bench.
#[test]
fn dtype_and_op_mean_the_same_everywhere() {
    let plan =
        json_line("plan all_reduce --gpus 0,1 --size 1MiB --dtype bf16 --op max --format json");
    assert_eq!(
        (plan["dtype"].as_str(), plan["op"].as_str()),
        (Some("bf16"), Some("max"))
    );
    let sim = json_line("simulate all_reduce -b 1MiB -e 1MiB -d bf16 --op max --format json");
    assert_eq!(sim["results"][0]["type"], "bfloat16");
    let advise = relaycc(&["advise", "--count", "2", "--dtype", "bf16", "--op", "max"]);
    assert!(advise.status.success(), "{}", stderr(&advise));
    let bench = json_line(&format!("{BENCH_4K_ONCE} -d bf16 --op max --format json"));
    assert_eq!(
        (bench["dtype"].as_str(), bench["op"].as_str()),
        (Some("bfloat16"), Some("max"))
    );
    let default = json_line(&format!("{BENCH_4K_ONCE} --format json"));
    assert_eq!(default["dtype"], "float");
    assert_eq!(default["results"][0]["count"], 1024);
}

/// On a machine split in two by a link that is down, advise places the job inside one half
/// instead of failing on the first placement that spans the cut.
#[test]
fn advise_skips_placements_a_split_machine_cannot_connect() {
    let v = json_line(
        "advise --collective all_reduce -t pcie-4gpu --links-down CPU0-PCIe1 --count 2 --size 64MiB --format json",
    );
    let best = v["best"].as_array().expect("best placements");
    assert!(!best.is_empty(), "{v}");
    for b in best {
        let gpus: Vec<u64> = b["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .map(|g| g.as_u64().expect("gpu index"))
            .collect();
        assert!(gpus == [0, 1] || gpus == [2, 3], "{gpus:?} spans the cut");
    }
    let o = relaycc_line(
        "advise --collective all_reduce -t pcie-4gpu --links-down CPU0-PCIe1 --count 3 --size 64MiB",
    );
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("no placement of 3 free GPUs"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
