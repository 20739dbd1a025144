//! Templates against the plans they stand for: on clusters small enough to expand (16 to 64
//! GPUs of DGX H100 nodes), the NCCL-like baseline and relaycc's candidates built through the
//! builder and folded by the cluster's host symmetry simulate within 1% of the expanded plans;
//! a template is refused by the data-proof checker and accepted by the template checker; a
//! masked cluster still plans.

use relaycc_route::path::RelayPolicy;
use relaycc_route::planner::{BaselineOptions, Candidates, pipeline_chunk_elems};
use relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES;
use relaycc_route::{
    Collective, DType, PlanOptions, Request, SimConfig, check, check_template, plan, simulate,
};
use relaycc_topo::Topology;

/// The request the CLI makes for `bytes` of `c` over every GPU of `topo`.
fn request(topo: &Topology, c: Collective, bytes: u64) -> Request {
    let n = topo.gpu_count();
    let elems = bytes / 4;
    let count = match c {
        Collective::AllGather | Collective::AllToAll | Collective::ReduceScatter => {
            elems / u64::from(n)
        }
        _ => elems,
    };
    Request::new(c, (0..n).collect(), count, DType::F32)
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// Every foldable plan of `c` on `nodes` nodes: (name, expanded time, template time).
fn compare(nodes: u32, c: Collective, bytes: u64) -> Vec<(String, f64, f64)> {
    let topo = relaycc_topo::preset(&format!("cluster:{nodes}xdgx-h100:ib-ndr")).unwrap();
    let sym = topo.host_symmetry();
    assert!(!sym.is_trivial(), "{nodes} nodes: no host symmetry");
    let req = request(&topo, c, bytes);
    let cfg = SimConfig::default();
    let chunk = pipeline_chunk_elems(&req).max(1);
    let mut out = Vec::new();
    let chunked = BaselineOptions {
        chunk_elems: Some(chunk),
        ..Default::default()
    };
    let full = chunked.plan(&topo, &req).unwrap();
    let template = BaselineOptions {
        template: Some(&sym),
        ..chunked
    };
    match template.plan(&topo, &req) {
        Ok(t) => {
            check_template(&t).unwrap();
            assert!(check(&t).is_err(), "check proved a template");
            assert!(t.ops.len() < full.ops.len());
            let (a, b) = (
                simulate(&topo, &full, &cfg).unwrap().time_us,
                simulate(&topo, &t, &cfg).unwrap().time_us,
            );
            out.push((full.algorithm.clone(), a, b));
        }
        // NCCL's rings and PXN fold; its double binary tree differs between hosts.
        Err(e) => assert!(full.algorithm.contains("tree"), "{}: {e}", full.algorithm),
    }
    let set = Candidates::new(&topo, &req, &RelayPolicy::default()).unwrap();
    for i in 0..set.len() {
        let Ok(full) = set.build(i, chunk, None) else {
            continue;
        };
        let t = match set.build_template(i, chunk, &sym, None) {
            Ok(t) => t,
            // A plan that differs between hosts (flat trees; the rail-hierarchical
            // reduce_scatter and all_gather, whose rail steps wait on intra-node ops that
            // depend on the node) must be refused, never folded into a wrong template; those
            // that fold must time like the expanded plan. The rail-hierarchical all_reduce
            // (`... x4 loops`) is the same on every node and must fold.
            Err(e @ relaycc_route::RouteError::NotSymmetric(_)) => {
                let hier_all_reduce =
                    full.algorithm.starts_with("rail-hier") && full.algorithm.ends_with("loops");
                assert!(!hier_all_reduce, "{}: {e}", full.algorithm);
                eprintln!("{} does not fold: {e}", full.algorithm);
                continue;
            }
            Err(e) => panic!("{}: {e}", full.algorithm),
        };
        check_template(&t).unwrap();
        let (a, b) = (
            simulate(&topo, &full, &cfg).unwrap().time_us,
            simulate(&topo, &t, &cfg).unwrap().time_us,
        );
        out.push((full.algorithm.clone(), a, b));
    }
    out
}

#[test]
fn templates_time_like_expanded_plans() {
    let mut worst = 0.0f64;
    for nodes in [2u32, 4, 8] {
        for c in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
        ] {
            for bytes in [64u64 << 20, 1 << 30] {
                if nodes == 8 && c == Collective::AllToAll && bytes > 64 << 20 {
                    // 4,032 pieces of 4 MiB expanded: the 64 MiB case covers the same plan.
                    continue;
                }
                // The baseline's rings must fold (compare asserts it); others may be refused.
                let got = compare(nodes, c, bytes);
                for (name, full, tmpl) in got {
                    let d = rel(tmpl, full);
                    eprintln!(
                        "{nodes} nodes {c} {bytes} B {name}: {full:.1} us expanded, {tmpl:.1} us template ({:.4}%)",
                        d * 100.0
                    );
                    worst = worst.max(d);
                    assert!(
                        d < 0.01,
                        "{nodes} nodes {c} {name}: {full} us expanded, {tmpl} us template"
                    );
                }
            }
        }
    }
    eprintln!("largest difference: {:.4}%", worst * 100.0);
}

#[test]
fn a_masked_cluster_still_plans() {
    let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
    let mut mask = relaycc_topo::Mask::default();
    mask.absent_gpus.insert(15);
    let masked = topo.with_mask(mask).unwrap();
    let req = Request::new(
        Collective::AllReduce,
        (0..15).collect(),
        1 << 20,
        DType::F32,
    );
    let p = plan(&masked, &req, &PlanOptions::default()).unwrap();
    assert!(p.plan.template.is_none());
    check(&p.plan).unwrap();
}

#[test]
fn rail_hierarchical_all_reduce_folds_and_times_like_its_expanded_plan() {
    // Every node's intra-node chunks end where the rail channels' halves end, so node h's rail
    // step s waits for the same ops (relative to its ring position) as node 0's: the plan's
    // order is the same on every period of hosts and the template must fold. Under the
    // default staging budget 2 GiB on 4 nodes fits a chunk that cuts the vector into loops that
    // only equal lengths keep aligned with the slot each reuses.
    for (nodes, bytes) in [
        (2u32, 1u64 << 30),
        (4, 1 << 30),
        (8, 1 << 30),
        (4, 2 << 30),
        (8, 2 << 30),
    ] {
        let topo = relaycc_topo::preset(&format!("cluster:{nodes}xdgx-h100:ib-ndr")).unwrap();
        let sym = topo.host_symmetry();
        let req = request(&topo, Collective::AllReduce, bytes);
        let cfg = SimConfig::default();
        let chunk = pipeline_chunk_elems(&req).max(1);
        let set = Candidates::new(&topo, &req, &RelayPolicy::default())
            .unwrap()
            .with_budget(DEFAULT_STAGING_BUDGET_BYTES);
        let mut folded = 0;
        for i in 0..set.len() {
            let Ok(full) = set.build(i, chunk, None) else {
                continue;
            };
            if !full.algorithm.starts_with("rail-hier") {
                continue;
            }
            let t = set
                .build_template(i, chunk, &sym, None)
                .unwrap_or_else(|e| panic!("{nodes} nodes {}: {e}", full.algorithm));
            check_template(&t).unwrap();
            let (a, b) = (
                simulate(&topo, &full, &cfg).unwrap().time_us,
                simulate(&topo, &t, &cfg).unwrap().time_us,
            );
            eprintln!(
                "{nodes} nodes {}: {a:.1} us expanded, {b:.1} us template",
                full.algorithm
            );
            assert!(
                rel(b, a) < 0.01,
                "{nodes} nodes {}: {a} against {b}",
                full.algorithm
            );
            folded += 1;
        }
        assert!(folded > 0, "{nodes} nodes: no rail-hierarchical candidate");
    }
}
