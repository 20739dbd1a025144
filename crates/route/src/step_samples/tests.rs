//! Step-sampled plans against the full plans they stand for, and their checks.

use super::*;
use crate::planner::BaselineOptions;
use crate::planner::baseline_net::tuner::Algo;
use crate::request::{Collective, Request};
use crate::sim::{SimConfig, simulate};

/// NCCL's rail rings for an all_reduce of `bytes` over every GPU of `preset`, folded by the
/// hosts' symmetry, with `ring_steps` steps per phase (all where `None`).
fn rings(preset: &str, bytes: u64, ring_steps: Option<u64>) -> Plan {
    let topo = relaycc_topo::preset(preset).unwrap();
    let sym = topo.host_symmetry();
    let n = topo.gpu_count() as u32;
    let req = Request::new(
        Collective::AllReduce,
        (0..n).collect(),
        bytes / 4,
        crate::DType::F32,
    );
    BaselineOptions {
        algo: Some(Algo::Ring),
        template: Some(&sym),
        ring_steps,
        ..Default::default()
    }
    .plan(&topo, &req)
    .unwrap()
}

fn sampled(preset: &str, bytes: u64, full: u64) -> Plan {
    let short = rings(preset, bytes, Some(SHORT_STEPS));
    let long = rings(preset, bytes, Some(LONG_STEPS));
    assemble(
        "ring steps per phase",
        full,
        (SHORT_STEPS, short),
        (LONG_STEPS, long),
    )
    .unwrap()
}

/// On 16 DGX H100 nodes (128 ranks, 127 steps per phase), NCCL's rings timed from samples of
/// 16 and 32 steps agree with the simulation of every step to 0.1%, and so do their ops (in
/// the fluid model the rings' steps are in lockstep, so the two agree to rounding).
#[test]
fn the_extrapolation_of_samples_matches_the_full_rings() {
    let preset = "cluster:16xdgx-h100:ib-ndr";
    let topo = relaycc_topo::preset(preset).unwrap();
    let cfg = SimConfig::default();
    for bytes in [16u64 << 20, 256 << 20] {
        let full = rings(preset, bytes, None);
        let plan = sampled(preset, bytes, 127);
        let want = simulate(&topo, &full, &cfg).unwrap().time_us;
        let got = simulate(&topo, &plan, &cfg).unwrap().time_us;
        assert!(
            (got - want).abs() <= 1e-3 * want,
            "{bytes} B: extrapolated {got} us, simulated in full {want} us"
        );
        let (ops, full_ops) = (plan.full_ops() as f64, full.full_ops() as f64);
        assert!(
            (ops - full_ops).abs() <= 1e-3 * full_ops,
            "{bytes} B: {ops} ops extrapolated, {full_ops} in full"
        );
    }
}

/// A step-sampled plan is never proved, its shape is checked, and its time is never below
/// its long sample's.
#[test]
fn a_sampled_plan_is_refused_by_the_checker_and_its_shape_is_checked() {
    let preset = "cluster:4xdgx-h100:ib-ndr";
    let short = rings(preset, 1 << 20, Some(1));
    let long = rings(preset, 1 << 20, Some(2));
    let plan = assemble(
        "ring steps per phase",
        31,
        (1, short.clone()),
        (2, long.clone()),
    )
    .unwrap();
    assert!(plan.is_step_sampled() && plan.ops.is_empty());
    let e = crate::check(&plan).unwrap_err().to_string();
    assert!(e.contains("step-sampled"), "{e}");
    // Samples out of order, or as many steps as the plan.
    for (k1, k2, full) in [(2, 1, 31), (1, 2, 2), (0, 2, 31)] {
        let e = assemble("steps", full, (k1, short.clone()), (k2, long.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 <= short < long < full"), "{e}");
    }
    // A sample of another request.
    let other = rings(preset, 2 << 20, Some(1));
    let e = assemble("steps", 31, (1, other), (2, long.clone()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("another request"), "{e}");
    // Never faster than the long sample, even where the short one is slower.
    let s = plan.step_samples.as_ref().unwrap();
    assert_eq!(extrapolate_us(s, 10.0, 8.0), (8.0, 0.0));
    let (t, more) = extrapolate_us(s, 8.0, 10.0);
    assert_eq!(more, 29.0);
    assert!((t - (10.0 + 29.0 * 2.0)).abs() < 1e-9);
}
