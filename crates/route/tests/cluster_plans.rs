//! relaycc's own rail-hierarchical all_reduce across DGX H100 nodes: where its overlapped
//! phases beat the NCCL-like baseline's flat rail rings, the orchestrator picks it, proved, and
//! within the default staging budget.

use relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES;
use relaycc_route::{Collective, DType, PlanOptions, Request, plan};

#[test]
fn four_dgx_h100_nodes_pick_the_rail_hierarchical_all_reduce_at_1_gib() {
    let topo = relaycc_topo::preset("cluster:4xdgx-h100:ib-ndr").unwrap();
    let req = Request::new(
        Collective::AllReduce,
        (0..32).collect(),
        (1u64 << 30) / 4,
        DType::F32,
    );
    // Debug builds simulate slowly: give the orchestrator time to try every candidate.
    let opts = PlanOptions {
        budget: std::time::Duration::from_secs(600),
        ..PlanOptions::default()
    };
    let p = plan(&topo, &req, &opts).unwrap();
    assert!(!p.budget_exhausted);
    assert!(
        p.plan.algorithm.starts_with("rail-hier"),
        "chose {} ({} us; baseline {} us)",
        p.plan.algorithm,
        p.predicted.time_us,
        p.baseline.time_us
    );
    assert!(
        p.predicted.time_us < p.baseline.time_us,
        "{} us against the baseline's {} us",
        p.predicted.time_us,
        p.baseline.time_us
    );
    // Never faster than the network allows: each rail's NIC sends 2 (N-1)/N of a rank's
    // eighth of the vector.
    let nic_us = 2.0 * 3.0 / 4.0 * (1u64 << 30) as f64 / 8.0 / (50.0 * 1e3);
    assert!(p.predicted.time_us > nic_us, "{} us", p.predicted.time_us);
    let most = p.plan.staging_per_location().values().copied().max();
    assert!(
        most.unwrap_or(0) <= DEFAULT_STAGING_BUDGET_BYTES,
        "{most:?}"
    );
    relaycc_route::check(&p.plan).unwrap();
}

#[test]
fn four_dgx_h100_nodes_pick_the_node_aware_all_to_all_at_1_gib() {
    // One network send per node pair and GPU, g pieces each, against PXN's one per piece: the
    // node-aware plan is picked, proved, within the staging budget, and within the NIC bound.
    let topo = relaycc_topo::preset("cluster:4xdgx-h100:ib-ndr").unwrap();
    let req = Request::new(
        Collective::AllToAll,
        (0..32).collect(),
        (1u64 << 30) / 4 / 32,
        DType::F32,
    );
    let opts = PlanOptions {
        budget: std::time::Duration::from_secs(600),
        ..PlanOptions::default()
    };
    let p = plan(&topo, &req, &opts).unwrap();
    assert!(
        p.plan.algorithm.starts_with("node-aware 2-step"),
        "chose {} ({} us; baseline {} us)",
        p.plan.algorithm,
        p.predicted.time_us,
        p.baseline.time_us
    );
    assert!(p.predicted.time_us < p.baseline.time_us);
    assert!(p.predicted.time_us >= p.bound.time_us * 0.999);
    let most = p.plan.staging_per_location().values().copied().max();
    assert!(
        most.unwrap_or(0) <= DEFAULT_STAGING_BUDGET_BYTES,
        "{most:?}"
    );
    relaycc_route::check(&p.plan).unwrap();
}
