//! The simulator's model of this backend's launches (`relaycc_sim::executor_launches`)
//! against the launches the backend's schedules make.

use relaycc_route::{Collective, DType, ReduceOp, Request};

use super::calls;

/// The simulator charges the launches this backend makes (`relaycc_sim::executor_launches`
/// against the schedule's driver calls, default SM-copy threshold): copy-engine copies, and
/// kernels (forward, fan-out and reduce launches), on the plans the communicator picks for
/// ranks sharing one GPU (`shared-gpu-4`, `nvswitch-4`) and on `dgx-h100`, small and large.
/// Not `nvswitch-4` at 64 MiB: its multipath ring sends part of each chunk over PCIe through
/// the CPU, which the model runs on a copy engine (no peer access through a CPU), while on
/// one GPU the backend reaches every rank's memory and runs it on SMs.
#[test]
fn the_simulator_charges_the_launches_this_backend_makes() {
    let one = [0usize; 4];
    let eight: Vec<usize> = (0..8).collect();
    for (topo, map, coll, bytes, in_place) in [
        (
            "shared-gpu-4",
            &one[..],
            Collective::AllToAll,
            1u64 << 20,
            false,
        ),
        (
            "shared-gpu-4",
            &one[..],
            Collective::AllGather,
            1 << 20,
            false,
        ),
        (
            "shared-gpu-4",
            &one[..],
            Collective::AllGather,
            64 << 20,
            false,
        ),
        (
            "shared-gpu-4",
            &one[..],
            Collective::Broadcast,
            1 << 20,
            false,
        ),
        (
            "shared-gpu-4",
            &one[..],
            Collective::AllReduce,
            1 << 20,
            false,
        ),
        (
            "shared-gpu-4",
            &one[..],
            Collective::AllReduce,
            64 << 20,
            true,
        ),
        (
            "shared-gpu-4",
            &one[..],
            Collective::ReduceScatter,
            1 << 20,
            false,
        ),
        ("nvswitch-4", &one[..], Collective::AllReduce, 1 << 20, true),
        (
            "dgx-h100",
            &eight[..],
            Collective::AllReduce,
            64 << 20,
            true,
        ),
        (
            "dgx-h100",
            &eight[..],
            Collective::AllGather,
            1 << 20,
            false,
        ),
    ] {
        let t = relaycc_topo::load(topo).unwrap_or_else(|e| panic!("{e}"));
        let req = Request::new(coll, (0..t.gpu_count()).collect(), bytes / 4, DType::F32)
            .with_op(ReduceOp::Sum);
        let budget = relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES;
        let plan = crate::plan_cache::make_plan(
            &t,
            &req,
            &[],
            in_place,
            budget,
            super::super::CUDA_OP_ISSUE_US,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let model = relaycc_route::sim::executor_launches(&t, &plan);
        let made = calls(topo, map, coll, bytes, in_place);
        let what = format!("{topo} {coll:?} {bytes} B: {model:?} against {made:?}");
        assert_eq!(model.copy_engine, made.copies, "{what}");
        assert_eq!(
            model.kernels,
            made.sm_copies + made.reduce_kernels,
            "{what}"
        );
    }
}
