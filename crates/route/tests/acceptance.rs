//! Acceptance figures, as simulated predictions on the presets (ratios in one run), beside the
//! figures the papers measured (`docs/REFERENCES.md`, "Figures the acceptance tests reproduce").

use relaycc_route::p2p::P2pStrategy;
use relaycc_route::path::RelayPolicy;
use relaycc_route::{Collective, DType, PlanOptions, Request, plan};

const MIB: u64 = 1 << 20;

fn opts(relay: RelayPolicy, strategy: P2pStrategy) -> PlanOptions {
    PlanOptions {
        relay,
        strategy,
        ..PlanOptions::default()
    }
}

#[test]
fn dgx1_gpu0_to_gpu7_beats_baseline_twice_and_nears_the_bound() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let p = plan(
        &topo,
        &Request::point_to_point(0, 7, 256 * MIB),
        &opts(RelayPolicy::Any, P2pStrategy::Auto),
    )
    .unwrap();
    let vs_base = p.predicted.algbw_gbps / p.baseline.algbw_gbps;
    let vs_bound = p.predicted.algbw_gbps / p.bound.algbw_gbps;
    println!(
        "0->7 256MiB: relaycc {:.1} GB/s ({}), baseline {:.1} GB/s ({}), bound {:.1} GB/s: {vs_base:.2}x baseline, {:.1}% of bound",
        p.predicted.algbw_gbps,
        p.plan.algorithm,
        p.baseline.algbw_gbps,
        p.baseline_plan.algorithm,
        p.bound.algbw_gbps,
        100.0 * vs_bound
    );
    assert!(vs_base >= 2.0, "{vs_base}");
    // Each chunk of each hop pays a copy-engine launch (`rates::COPY_ENGINE_LAUNCH_US`), which
    // the bound does not: 85% of it.
    assert!(vs_bound >= 0.85, "{vs_bound}");
}

/// The relay through GPU 3 and the host-staged copy of [Ranganath-2019]: both cross two hops,
/// which the plan pipelines in chunks, so each runs at nearly its slowest hop's rate (a plan
/// that let one hop wait for the other would run at half). A direct copy is one op over one
/// link, so its prediction is the link's table rate and is not a finding; it is not asserted
/// here.
#[test]
fn seed_relay_through_gpu3_and_host_staging_pipeline_their_hops() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let nv1 = relaycc_topo::rates::NVLINK2_LANE_GBPS;
    let relay = plan(
        &topo,
        &Request::point_to_point(0, 7, 256 * MIB),
        &opts(RelayPolicy::List(vec![3]), P2pStrategy::Relay),
    )
    .unwrap();
    let r = relay.predicted.algbw_gbps;
    assert!(relay.plan.algorithm.contains("GPU3"));
    assert_eq!(relay.routes.len(), 1, "{}", relay.plan.algorithm);
    assert_eq!(relay.routes[0].route.hops.len(), 2);
    let slowest = relay.routes[0].route.gbps();
    assert!((slowest - nv1).abs() < 1e-9, "{slowest}");
    assert!(
        (0.9 * slowest..=slowest).contains(&r),
        "relay {r} vs {slowest}"
    );
    let pcie = plan(
        &topo,
        &Request::point_to_point(0, 7, 256 * MIB),
        &opts(RelayPolicy::None, P2pStrategy::Host),
    )
    .unwrap();
    let h = pcie.predicted.algbw_gbps;
    assert_eq!(pcie.routes.len(), 1, "{}", pcie.plan.algorithm);
    assert_eq!(pcie.routes[0].route.hops.len(), 2);
    let slowest = pcie.routes[0].route.gbps();
    assert!(
        (0.9 * slowest..=slowest).contains(&h),
        "host-staged {h} vs {slowest}"
    );
}

#[test]
fn ac922_multipath_beats_direct_nvlink() {
    let topo = relaycc_topo::preset("ac922").unwrap();
    let req = Request::point_to_point(0, 1, 256 * MIB);
    let multi = plan(&topo, &req, &opts(RelayPolicy::Any, P2pStrategy::Auto)).unwrap();
    let direct = plan(&topo, &req, &opts(RelayPolicy::Any, P2pStrategy::Direct)).unwrap();
    let x = multi.predicted.algbw_gbps / direct.predicted.algbw_gbps;
    println!(
        "AC922 0->1: {} {:.1} GB/s vs direct {:.1} GB/s = {x:.2}x (Temucin-2021 measured 1.84x)",
        multi.plan.algorithm, multi.predicted.algbw_gbps, direct.predicted.algbw_gbps
    );
    assert!(x >= 1.6, "{x}");
}

#[test]
fn small_transfers_never_lose_to_the_baseline() {
    for preset in ["dgx1-v100", "ac922", "pcie-8gpu", "dgx-a100"] {
        let topo = relaycc_topo::preset(preset).unwrap();
        let n = topo.gpu_count();
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                let p = plan(
                    &topo,
                    &Request::point_to_point(a, b, 4096),
                    &PlanOptions::default(),
                )
                .unwrap();
                assert!(
                    p.predicted.time_us <= p.baseline.time_us * (1.0 + 1e-9),
                    "{preset} {a}->{b}: {} > {}",
                    p.predicted.time_us,
                    p.baseline.time_us
                );
            }
        }
    }
}

#[test]
fn dgx1_all_reduce_subsets_beat_the_baseline() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    for gpus in [vec![0, 7], vec![0, 2, 5, 7], vec![1, 2, 4, 7]] {
        let req = Request::new(Collective::AllReduce, gpus.clone(), 64 * MIB, DType::F32);
        let p = plan(&topo, &req, &PlanOptions::default()).unwrap();
        let x = p.predicted.busbw_gbps / p.baseline.busbw_gbps;
        println!(
            "all_reduce 256MiB {gpus:?}: relaycc {:.1} ({}) vs baseline {:.1} ({}) busbw = {x:.2}x",
            p.predicted.busbw_gbps,
            p.plan.algorithm,
            p.baseline.busbw_gbps,
            p.baseline_plan.algorithm
        );
        assert!(x >= 1.3, "{gpus:?}: {x}");
    }
}

/// A whole DGX-1 V100: NCCL runs several rings at once (its channels), so the in-model
/// baseline must too, or every full-machine comparison flatters relaycc. Six NVLink lanes per
/// GPU each way carry two NV2 and two NV1 rings: busbw near the 6 x 24.2 = 145 GB/s the links
/// allow (nccl-tests reports about 130 GB/s on this machine), not one ring's 48.
#[test]
fn full_dgx1_all_reduce_runs_packed_rings_on_both_sides() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let req = Request::new(
        Collective::AllReduce,
        (0..8).collect(),
        64 * MIB,
        DType::F32,
    );
    let p = plan(&topo, &req, &opts(RelayPolicy::Any, P2pStrategy::Auto)).unwrap();
    println!(
        "8 GPUs: relaycc {:.1} ({}), baseline {:.1} ({}), bound {:.1} GB/s busbw",
        p.predicted.busbw_gbps,
        p.plan.algorithm,
        p.baseline.busbw_gbps,
        p.baseline_plan.algorithm,
        p.bound.busbw_gbps
    );
    assert!(
        p.baseline_plan.algorithm.contains("x4 packed"),
        "{}",
        p.baseline_plan.algorithm
    );
    assert!(p.baseline.busbw_gbps > 0.8 * p.bound.busbw_gbps);
    assert!(p.predicted.busbw_gbps >= p.baseline.busbw_gbps);
}
