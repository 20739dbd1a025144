//! The bound never falls below a plan relaycc can run: on random small clusters, for every
//! collective, no simulated candidate (the winner, the NCCL-like baseline, the rest) is
//! faster than the bound, whose cuts of hosts, sockets and PCIe switches bind there.

mod common;

use proptest::prelude::*;
use relaycc_route::{Collective, DType, PlanOptions, ReduceOp, plan};

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_candidate_beats_the_bound_on_small_clusters(
        spec in prop::sample::select(vec![
            "cluster:2xpcie-4gpu:eth-25g",
            "cluster:3xpcie-4gpu:ib-edr:fat-tree",
            "cluster:2xdgx1-v100:ib-edr",
            "cluster:2xl40s-8gpu:roce-100g",
            "cluster:3xgh200-quad:ib-ndr:rail",
        ]),
        mask in 1u32..u32::MAX,
        c in prop::sample::select(vec![
            Collective::AllReduce, Collective::AllGather, Collective::AllGatherV,
            Collective::ReduceScatter, Collective::Broadcast, Collective::Reduce,
            Collective::Gather, Collective::Scatter, Collective::AllToAll,
            Collective::AllToAllV, Collective::SendRecv,
        ]),
        log2 in 2u32..=26,
        root in 0u32..4,
    ) {
        let topo = relaycc_topo::preset(spec).unwrap();
        let gpus: Vec<u32> = (0..topo.gpu_count().min(32)).filter(|g| mask >> g & 1 == 1).collect();
        prop_assume!(gpus.len() >= 2);
        let hosts: std::collections::BTreeSet<u32> =
            gpus.iter().map(|&g| topo.node(topo.gpu(g).unwrap()).host).collect();
        prop_assume!(hosts.len() >= 2);
        let n = gpus.len() as u64;
        let count = ((1u64 << log2) / 4 / n).max(1);
        let root = root % n as u32;
        let req = common::request(c, gpus, count, DType::F32, ReduceOp::Sum, root);
        let p = plan(&topo, &req, &PlanOptions::default())
            .unwrap_or_else(|e| panic!("{spec} {c} of {count} on {:?}: {e}", req.gpus));
        let floor = p.bound.time_us * (1.0 - 1e-9);
        for cand in &p.candidates {
            prop_assert!(
                cand.time_us >= floor,
                "{spec} {c} of {count} on {:?}: {} at {} us beats the bound's {} us",
                req.gpus, cand.algorithm, cand.time_us, p.bound.time_us
            );
        }
        prop_assert!(p.baseline.time_us >= floor && p.predicted.time_us >= floor);
    }
}
