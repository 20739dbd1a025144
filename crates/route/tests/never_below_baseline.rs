//! relaycc never predicts a plan slower than the NCCL-like baseline: the baseline's own plan is
//! among the candidates, so where nothing beats it, it is what relaycc returns. Checked on every
//! machine preset, from latency-bound to bandwidth-bound sizes, for collectives and copies, and
//! on random GPU subsets.

use proptest::prelude::*;
use relaycc_route::{Collective, DType, PlanOptions, Request, plan};

/// Every single-machine preset (not `host-<N>` or clusters).
fn presets() -> Vec<String> {
    relaycc_topo::list_presets()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| !n.contains('<') && !n.contains(':'))
        .collect()
}

/// The GPUs a whole-machine request takes: every GPU, at most 16 (on the 72-GPU rack its first
/// four compute trays, which keeps the test quick; the rack's 72-rank baseline is in the
/// fidelity table).
fn machine(topo: &relaycc_topo::Topology) -> Vec<u32> {
    (0..topo.gpu_count().min(16)).collect()
}

fn assert_not_slower(name: &str, req: &Request) {
    let topo = relaycc_topo::preset(name).unwrap();
    let p = plan(&topo, req, &PlanOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        p.predicted.time_us <= p.baseline.time_us * (1.0 + 1e-9),
        "{name} {} of {} B on {:?}: relaycc {} ({} us) slower than the baseline {} ({} us)",
        req.collective,
        req.size_bytes(),
        req.gpus,
        p.plan.algorithm,
        p.predicted.time_us,
        p.baseline_plan.algorithm,
        p.baseline.time_us
    );
}

#[test]
fn every_preset_at_every_size_is_at_least_the_baseline() {
    for name in presets() {
        let topo = relaycc_topo::preset(&name).unwrap();
        let gpus = machine(&topo);
        let last = *gpus.last().unwrap();
        for bytes in [4u64 << 10, 1 << 20, 256 << 20] {
            let elems = bytes / 4;
            for c in [Collective::AllReduce, Collective::AllGather] {
                let n = gpus.len() as u64;
                let count = if c == Collective::AllGather {
                    (elems / n).max(1)
                } else {
                    elems
                };
                assert_not_slower(&name, &Request::new(c, gpus.clone(), count, DType::F32));
            }
            assert_not_slower(&name, &Request::point_to_point(0, last, bytes));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random subsets of the 8-GPU machines, random collectives, sizes from 4 B to 1 GiB.
    #[test]
    fn random_jobs_are_at_least_the_baseline(
        preset in prop::sample::select(vec![
            "dgx1-v100", "dgx1-p100", "dgx-a100", "dgx-h100", "pcie-8gpu", "l40s-8gpu",
            "rtx4090-8gpu", "ac922", "gh200-quad",
        ]),
        mask in 1u32..256,
        c in prop::sample::select(vec![
            Collective::AllReduce, Collective::AllGather, Collective::Broadcast,
            Collective::ReduceScatter, Collective::Reduce,
        ]),
        log2 in 2u32..=30,
    ) {
        let topo = relaycc_topo::preset(preset).unwrap();
        let gpus: Vec<u32> = (0..topo.gpu_count()).filter(|g| mask >> g & 1 == 1).collect();
        prop_assume!(gpus.len() >= 2);
        let count = ((1u64 << log2) / 4 / gpus.len() as u64).max(1);
        assert_not_slower(preset, &Request::new(c, gpus, count, DType::F32));
    }
}
