//! The multi-node baseline on cluster presets: proved by both checkers, every NIC used, the
//! rail structure followed.

use relaycc_topo::{LinkId, NodeKind, Topology};

use crate::baseline_plan;
use relaycc_plan::DType;
use relaycc_plan::{Collective, Request};
use relaycc_plan::{OpKind, Plan};
use relaycc_plan::{check, check_routes};
use relaycc_sim::{SimConfig, simulate};

fn cluster(spec: &str) -> Topology {
    relaycc_topo::preset(spec).unwrap()
}

fn proved(topo: &Topology, c: Collective, gpus: Vec<u32>, count: u64) -> Plan {
    let req = Request::new(c, gpus, count, DType::F32);
    let p = baseline_plan(topo, &req).unwrap();
    check(&p).unwrap_or_else(|e| panic!("{}: {e}", p.algorithm));
    check_routes(&p, topo).unwrap_or_else(|e| panic!("{}: {e}", p.algorithm));
    p
}

/// Names of the NICs the plan's copies leave through.
fn nics_used(topo: &Topology, p: &Plan) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for op in &p.ops {
        if let OpKind::Copy { .. } = op.kind {
            for e in &op.edges {
                let (a, b) = topo.link_ends(LinkId::new(*e as usize));
                if topo.node(a).nic().is_some() && matches!(topo.node(b).kind, NodeKind::NetSwitch)
                {
                    out.insert(topo.node(a).name.clone());
                }
            }
        }
    }
    out
}

fn busbw(topo: &Topology, p: &Plan) -> f64 {
    let sim = simulate(topo, p, &SimConfig::default()).unwrap();
    sim.perf(&p.request).busbw_gbps
}

#[test]
fn all_reduce_on_two_dgx_h100_uses_every_nic() {
    let topo = cluster("cluster:2xdgx-h100:ib-ndr");
    let gpus: Vec<u32> = (0..16).collect();
    let p = proved(&topo, Collective::AllReduce, gpus, (1 << 30) / 4);
    assert!(
        p.algorithm.contains("ring x8 rail-aligned"),
        "{}",
        p.algorithm
    );
    assert_eq!(nics_used(&topo, &p).len(), 16);
    // Every NIC's rail is the same at both ends: NIC i of node 0 sends to NIC i of node 1.
    let bw = busbw(&topo, &p);
    assert!(bw >= 0.8 * 8.0 * 50.0, "busbw {bw}");
}

#[test]
fn small_all_reduce_takes_the_double_binary_tree() {
    let topo = cluster("cluster:4xdgx-h100:ib-ndr:rail");
    let gpus: Vec<u32> = (0..32).collect();
    let p = proved(&topo, Collective::AllReduce, gpus, 16 << 10);
    assert!(
        p.algorithm.contains("double binary tree"),
        "{}",
        p.algorithm
    );
}

#[test]
fn gather_scatter_and_all_to_all_are_rail_aligned() {
    let topo = cluster("cluster:2xdgx-h100:ib-ndr:rail");
    let gpus: Vec<u32> = (0..16).collect();
    for c in [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
    ] {
        let p = proved(&topo, c, gpus.clone(), 1 << 20);
        assert_eq!(nics_used(&topo, &p).len(), 16, "{}", p.algorithm);
        // Rail-aligned: no copy climbs from a leaf to a spine.
        let spine = p.ops.iter().any(|op| {
            op.edges.iter().any(|e| {
                let (_, b) = topo.link_ends(LinkId::new(*e as usize));
                topo.node(b).name.starts_with("Spine")
            })
        });
        assert!(!spine, "{} crosses the spine", p.algorithm);
    }
}

/// The rates a node's members are ordered by, read once per node, are those of the
/// connections `local` makes, on NVSwitch machines (the ports' rule) and others (NCCL's link
/// rule), with a switch plane's link down.
#[test]
fn kept_local_rates_are_the_connections_rates() {
    let planes_down = relaycc_topo::Mask {
        down_links: [("GPU1".to_string(), "node0/NVSwitch0".to_string())].into(),
        ..Default::default()
    };
    for (spec, mask) in [
        ("cluster:2xdgx-h100:ib-ndr", None),
        ("cluster:2xdgx-h100:ib-ndr", Some(planes_down)),
        ("cluster:2xdgx1-v100:ib-edr", None),
        ("cluster:2xrtx4090-8gpu:ib-ndr", None),
        ("cluster:1xgb200-nvl72:ib-ndr", None),
    ] {
        let mut topo = cluster(spec);
        if let Some(m) = mask {
            topo = topo.with_mask(m).unwrap();
        }
        let gpus: Vec<u32> = (0..topo.gpu_count()).collect();
        let cache = crate::ConnCache::new(&topo, &gpus, &relaycc_plan::path::RelayPolicy::Members);
        let links = super::links::NetLinks::new(&topo, &gpus, &cache, None).unwrap();
        for (k, node) in links.nodes.iter().enumerate() {
            let m = node.ranks.len();
            let rates = links.local_rates(k);
            for (i, &a) in node.ranks.iter().enumerate() {
                for (j, &b) in node.ranks.iter().enumerate().filter(|&(j, _)| j != i) {
                    let want = links.local(a, b).map_or(f64::NAN, |c| c.gbps());
                    let got = rates[i * m + j];
                    assert!(
                        got == want || (got.is_nan() && want.is_nan()),
                        "{spec} node {k}: {a} -> {b} kept {got}, connection {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn subsets_odd_node_counts_and_other_machines_plan_and_prove() {
    for (spec, gpus) in [
        (
            "cluster:3xdgx-h100:ib-ndr:fat-tree",
            (0..24).collect::<Vec<u32>>(),
        ),
        ("cluster:2xdgx-h100:ib-ndr", vec![0, 3, 9, 14]),
        ("cluster:2xdgx1-v100:ib-edr", (0..16).collect()),
        ("cluster:2xgh200-quad:ib-ndr:rail", (0..8).collect()),
        ("cluster:2xrtx4090-8gpu:ib-ndr", vec![0, 1, 5, 8, 9, 14]),
    ] {
        let topo = cluster(spec);
        for c in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
            Collective::Gather,
            Collective::Scatter,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            for count in [1u64, 1000, 1 << 18] {
                proved(&topo, c, gpus.clone(), count);
            }
        }
        // Broadcast and reduce from a root other than rank 0, on the rail rings.
        for c in [Collective::Broadcast, Collective::Reduce] {
            let mut req = Request::new(c, gpus.clone(), 5000, DType::F32);
            req.root = (gpus.len() - 1) as u32;
            let p = baseline_plan(&topo, &req).unwrap();
            assert!(
                p.algorithm.contains("rail-aligned"),
                "{spec}: {}",
                p.algorithm
            );
            check(&p).unwrap_or_else(|e| panic!("{spec} {c}: {e}"));
            check_routes(&p, &topo).unwrap_or_else(|e| panic!("{spec} {c}: {e}"));
        }
        // The tree on every shape, whatever the tuner picks.
        let req = Request::new(Collective::AllReduce, gpus.clone(), 777, DType::F32);
        let cache =
            crate::ConnCache::new(&topo, &req.gpus, &relaycc_plan::path::RelayPolicy::Members);
        let ctx = crate::PlannerContext::new(&cache, crate::LinkMode::Nccl, 100, 1);
        let links = super::links::NetLinks::new(&topo, &req.gpus, &cache, None).unwrap();
        let rings = super::rings::rail_rings(&links, None).unwrap();
        let p = super::double_tree::all_reduce(&req, &ctx, &links, &rings).unwrap();
        check(&p).unwrap_or_else(|e| panic!("{spec} tree: {e}"));
        check_routes(&p, &topo).unwrap_or_else(|e| panic!("{spec} tree: {e}"));
    }
}

#[test]
fn pxn_staging_is_a_few_slots_per_proxy_at_any_node_count() {
    // Pieces of 4 chunks relay through rings of PXN_SLOTS slots that every sender of the node
    // shares, so each ring wraps many times; the checker proves every reuse.
    let chunk = 1024u64;
    let slots = super::pxn::PXN_SLOTS * chunk * 4;
    for nodes in [2u32, 4, 16] {
        let topo = cluster(&format!("cluster:{nodes}xdgx-h100:ib-ndr"));
        let gpus: Vec<u32> = (0..8 * nodes).collect();
        let req = Request::new(Collective::AllToAll, gpus, 4 * chunk, DType::F32);
        let p = crate::BaselineOptions {
            chunk_elems: Some(chunk),
            ..Default::default()
        }
        .plan(&topo, &req)
        .unwrap();
        assert!(p.algorithm.contains("pxn"), "{}", p.algorithm);
        check(&p).unwrap_or_else(|e| panic!("{nodes} nodes: {e}"));
        check_routes(&p, &topo).unwrap_or_else(|e| panic!("{nodes} nodes: {e}"));
        // Every GPU proxies for one rail (its own NIC): one ring of its slots, whatever the
        // number of ranks that send through it.
        let per = p.staging_per_location();
        assert_eq!(per.len(), req.gpus.len(), "{nodes} nodes: {per:?}");
        assert!(per.values().all(|&b| b == slots), "{nodes} nodes: {per:?}");
    }
}

#[test]
fn pxn_all_to_all_of_1_gib_on_16_nodes_fits_the_default_budget() {
    let topo = cluster("cluster:16xdgx-h100:ib-ndr");
    let gpus: Vec<u32> = (0..128).collect();
    let req = Request::new(Collective::AllToAll, gpus, (1 << 30) / 4 / 128, DType::F32);
    let budget = crate::staging::DEFAULT_STAGING_BUDGET_BYTES;
    let p = crate::BaselineOptions {
        staging_budget: Some(budget),
        ..Default::default()
    }
    .plan(&topo, &req)
    .unwrap();
    assert!(p.algorithm.contains("pxn"), "{}", p.algorithm);
    // A proxy's ring of the baseline's chunk, far below the budget (the per-pair rings took
    // more than all of it).
    let worst = p.staging_per_location().into_values().max().unwrap_or(0);
    let ring = super::pxn::PXN_SLOTS * crate::pipeline_chunk_elems(&req) * 4;
    assert!(
        worst <= ring && ring <= budget / 16,
        "{worst} bytes on one GPU"
    );
}

#[test]
fn pxn_all_to_all_walks_the_order_its_sorted_pieces_give() {
    // all_to_all walks NCCL's rounds directly; all_to_all_v with every count equal sorts the
    // same pieces into that order: the two plans must hold the same ops and staging.
    let topo = cluster("cluster:2xdgx-h100:ib-ndr");
    let gpus: Vec<u32> = (0..16).collect();
    let (count, chunk) = (3000u64, 1024u64);
    let a2a = Request::new(Collective::AllToAll, gpus.clone(), count, DType::F32);
    let mut v = Request::new(Collective::AllToAllV, gpus, 0, DType::F32);
    v.matrix = vec![vec![count; 16]; 16];
    let p = crate::BaselineOptions {
        chunk_elems: Some(chunk),
        ..Default::default()
    }
    .plan(&topo, &a2a)
    .unwrap();
    let q = crate::BaselineOptions {
        chunk_elems: Some(chunk),
        ..Default::default()
    }
    .plan(&topo, &v)
    .unwrap();
    assert!(p.algorithm.contains("pxn"), "{}", p.algorithm);
    assert_eq!(p.ops.len(), q.ops.len());
    assert!(p.ops == q.ops, "the walked and the sorted orders differ");
    assert_eq!(p.scratch, q.scratch);
    assert_eq!(p.lanes, q.lanes);
}
