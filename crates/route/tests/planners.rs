//! Collective planners: every candidate and the NCCL-like baseline pass the plan checker and
//! the route checker, on fixed cases and on random presets, masks, subsets, policies, sizes.

mod common;

use common::request;
use relaycc_route::path::RelayPolicy;
use relaycc_route::planner::{baseline_plan, collective_candidates, supports_in_place};
use relaycc_route::{
    CheckOptions, Collective, DType, Plan, ReduceOp, Request, check, check_routes, check_with,
};
use relaycc_topo::Topology;

fn verify(p: &Plan, topo: &Topology, what: &str) {
    check(p).unwrap_or_else(|e| panic!("{what} {}: {e}", p.algorithm));
    check_routes(p, topo).unwrap_or_else(|e| panic!("{what} {} routes: {e}", p.algorithm));
}

fn in_place_form(c: Collective) -> bool {
    !matches!(
        c,
        Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv
    )
}

#[test]
fn dgx1_subsets_every_collective() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    for gpus in [
        vec![0, 7],
        vec![0, 2, 5, 7],
        vec![1, 2, 4, 7],
        vec![3],
        (0..8).collect(),
    ] {
        for c in Collective::ALL {
            for count in [0u64, 13, 997] {
                let req = request(
                    c,
                    gpus.clone(),
                    count,
                    DType::F32,
                    ReduceOp::Avg,
                    (gpus.len() as u32) - 1,
                );
                let what = format!("{c} {gpus:?} count {count}");
                let cands =
                    collective_candidates(&topo, &req, &RelayPolicy::Any, &[61, 1024]).unwrap();
                assert!(!cands.is_empty());
                for p in &cands {
                    verify(p, &topo, &what);
                    if in_place_form(c) {
                        assert!(
                            supports_in_place(p),
                            "{what} {} in place: {:?}",
                            p.algorithm,
                            check_with(p, CheckOptions { in_place: true })
                        );
                    }
                }
                let b = baseline_plan(&topo, &req).unwrap();
                verify(&b, &topo, &what);
            }
        }
    }
}

#[test]
fn every_collective_has_a_candidate_and_in_place_forms_hold() {
    let topo = relaycc_topo::preset("ac922").unwrap();
    for c in Collective::ALL {
        let req = request(c, vec![0, 1, 2, 3], 101, DType::F64, ReduceOp::Avg, 1);
        let cands = collective_candidates(&topo, &req, &RelayPolicy::None, &[]).unwrap();
        assert!(!cands.is_empty(), "{c}");
        let b = baseline_plan(&topo, &req).unwrap();
        assert!(b.algorithm.starts_with("nccl-like"), "{}", b.algorithm);
        verify(&b, &topo, c.name());
        if in_place_form(c) {
            assert!(cands.iter().all(supports_in_place), "{c}");
        }
    }
}

#[test]
fn planning_is_deterministic() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let req = request(
        Collective::AllReduce,
        vec![1, 2, 4, 7],
        5000,
        DType::F32,
        ReduceOp::Sum,
        0,
    );
    let a = collective_candidates(&topo, &req, &RelayPolicy::Any, &[512]).unwrap();
    let b = collective_candidates(&topo, &req, &RelayPolicy::Any, &[512]).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        baseline_plan(&topo, &req).unwrap(),
        baseline_plan(&topo, &req).unwrap()
    );
}

#[test]
fn unreachable_or_bad_requests_are_errors() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let req = Request::new(Collective::AllReduce, vec![0, 0], 10, DType::F32);
    assert!(collective_candidates(&topo, &req, &RelayPolicy::Any, &[]).is_err());
    assert!(baseline_plan(&topo, &req).is_err());
    let req = Request::new(Collective::AllReduce, vec![0, 99], 10, DType::F32);
    assert!(collective_candidates(&topo, &req, &RelayPolicy::Any, &[]).is_err());
    assert!(baseline_plan(&topo, &req).is_err());
}

mod random {
    //! Random presets, masks, subsets, relay policies, sizes, ops, dtypes and roots.

    use super::*;
    use proptest::prelude::*;

    const PRESETS: [&str; 8] = [
        "dgx1-v100",
        "dgx1-p100",
        "dgx-a100",
        "ac922",
        "summit-node",
        "pcie-4gpu",
        "pcie-8gpu",
        "dgx2",
    ];
    const SIZES: [u64; 10] = [0, 1, 2, 3, 7, 13, 101, 257, 1031, 4099];
    const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::I32, DType::U8];
    const OPS: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 120, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn candidates_and_baseline_check(
            preset in 0..PRESETS.len(),
            seed in any::<u64>(),
            nranks in 1usize..=8,
            size in 0..SIZES.len(),
            coll in 0..Collective::ALL.len(),
            dtype in 0..DTYPES.len(),
            op in 0..OPS.len(),
            policy in 0..4usize,
            chunk in prop::sample::select(vec![16u64, 64, 1000]),
        ) {
            let base = relaycc_topo::preset(PRESETS[preset]).unwrap();
            let g = base.gpu_count();
            // A seeded shuffle of the GPUs: the first ranks join, some of the rest are busy.
            let mut s = seed;
            let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); s >> 33 };
            let mut all: Vec<u32> = (0..g).collect();
            for i in (1..all.len()).rev() {
                let j = (next() % (i as u64 + 1)) as usize;
                all.swap(i, j);
            }
            let k = nranks.min(g as usize);
            let gpus = all[..k].to_vec();
            let busy: Vec<u32> = all[k..].iter().copied().filter(|_| next() % 3 == 0).collect();
            let topo = base.with_mask(relaycc_topo::Mask::busy(busy)).unwrap();
            let relay = match policy {
                0 => RelayPolicy::None,
                1 => RelayPolicy::Members,
                2 => RelayPolicy::Any,
                _ => RelayPolicy::List(all[k..].iter().copied().filter(|_| next() % 2 == 0).collect()),
            };
            let c = Collective::ALL[coll];
            let dt = DTYPES[dtype];
            let op = if OPS[op] == ReduceOp::Avg && !dt.is_float() { ReduceOp::Sum } else { OPS[op] };
            let root = (next() % k as u64) as u32;
            let req = request(c, gpus.clone(), SIZES[size], dt, op, root);
            let what = format!("{} {c} {gpus:?} {relay:?} size {}", PRESETS[preset], SIZES[size]);
            let cands = collective_candidates(&topo, &req, &relay, &[chunk]).unwrap();
            prop_assert!(!cands.is_empty());
            for p in &cands {
                verify(p, &topo, &what);
                if in_place_form(c) {
                    prop_assert!(supports_in_place(p), "{} {} in place", what, p.algorithm);
                }
            }
            verify(&baseline_plan(&topo, &req).unwrap(), &topo, &what);
        }
    }
}

/// The orchestrator prunes candidates with bounds from cheaply built plans; it must still find
/// the fastest candidate that simulating every one (and the baseline) finds.
#[test]
fn pruned_selection_finds_the_fastest_candidate() {
    use relaycc_route::planner::pipeline_chunk_elems;
    use relaycc_route::{PlanOptions, SimConfig, plan, simulate};
    let cases: [(&str, Collective, Vec<u32>, u64); 9] = [
        (
            "dgx1-v100",
            Collective::AllReduce,
            vec![0, 2, 5, 7],
            64 << 20,
        ),
        (
            "dgx1-v100",
            Collective::AllReduce,
            vec![1, 2, 4, 7],
            1 << 20,
        ),
        (
            "dgx1-v100",
            Collective::AllReduce,
            (0..8).collect(),
            64 << 20,
        ),
        ("dgx1-v100", Collective::AllGather, vec![0, 3, 5], 4 << 20),
        ("dgx1-v100", Collective::Broadcast, vec![0, 7, 2], 16 << 20),
        (
            "dgx1-v100",
            Collective::ReduceScatter,
            vec![0, 1, 6, 7],
            8 << 20,
        ),
        ("ac922", Collective::Reduce, vec![0, 1, 2, 3], 32 << 20),
        (
            "dgx-a100",
            Collective::AllReduce,
            (0..8).collect(),
            16 << 20,
        ),
        (
            "pcie-8gpu",
            Collective::AllReduce,
            vec![0, 1, 4, 5],
            8 << 20,
        ),
    ];
    let sim = SimConfig::default();
    for (preset, c, gpus, count) in cases {
        let topo = relaycc_topo::preset(preset).unwrap();
        let req = Request::new(c, gpus.clone(), count, DType::F32);
        // Unbounded: the comparison is with simulating every candidate.
        let unbounded = PlanOptions {
            budget: std::time::Duration::from_secs(3600),
            ..PlanOptions::default()
        };
        let chosen = plan(&topo, &req, &unbounded).unwrap();
        let baseline = simulate(&topo, &baseline_plan(&topo, &req).unwrap(), &sim)
            .unwrap()
            .time_us;
        let fastest = collective_candidates(
            &topo,
            &req,
            &RelayPolicy::Any,
            &[pipeline_chunk_elems(&req)],
        )
        .unwrap()
        .iter()
        .map(|p| simulate(&topo, p, &sim).unwrap().time_us)
        .fold(baseline, f64::min);
        assert!(
            (chosen.predicted.time_us - fastest).abs() <= 1e-9 * fastest,
            "{preset} {c} {gpus:?}: chose {} us ({}), fastest is {fastest} us",
            chosen.predicted.time_us,
            chosen.plan.algorithm
        );
    }
}
