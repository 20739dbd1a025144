//! Planner modules (relaycc-planners) tested through the plans `plan()` chooses: the planners'
//! crate sits below the selection and cannot call it in its own unit tests.

use relaycc_route::template::cone::extract_cone;
use relaycc_route::{Collective, DType, PlanOptions, Request, plan};

#[test]
fn the_cone_of_every_rank_is_the_whole_plan() {
    let topo = relaycc_topo::preset("dgx-h100").unwrap();
    let req = Request::new(Collective::AllReduce, (0..8).collect(), 1 << 12, DType::I32);
    let planned = plan(&topo, &req, &PlanOptions::default()).unwrap();
    let p = &planned.plan;
    let cone = extract_cone(p, &topo, &(0..8).collect::<Vec<_>>(), usize::MAX)
        .unwrap()
        .unwrap();
    // Every op of an all_reduce feeds some output, and the renumbered cone is a plan
    // the checker proves.
    assert_eq!(cone.plan.ops.len(), p.ops.len());
    relaycc_route::check(&cone.plan).unwrap();
    let one = extract_cone(p, &topo, &[3], usize::MAX).unwrap().unwrap();
    assert!(one.plan.ops.len() <= p.ops.len());
    assert!(extract_cone(p, &topo, &[8], usize::MAX).is_err());
    assert!(extract_cone(p, &topo, &[3], 2).unwrap().is_none());
}

#[test]
fn the_planner_picks_shared_memory_plans_from_the_topology() {
    let req = Request::new(Collective::AllReduce, vec![0, 1, 2, 3], 1 << 16, DType::F32);
    let host = relaycc_topo::preset("host-4").unwrap();
    let chosen = plan(&host, &req, &PlanOptions::default()).unwrap();
    assert_eq!(
        chosen.plan,
        relaycc_route::planner::shared_memory::plan(&host, &req, false).unwrap()
    );
    assert_eq!(chosen.candidates.len(), 1);
    // GPUs that only share a socket are not arenas of its memory.
    let pcie = relaycc_topo::preset("pcie-4gpu").unwrap();
    let chosen = plan(&pcie, &req, &PlanOptions::default()).unwrap();
    assert!(chosen.candidates.len() > 1);
}

/// One rank on any machine takes the shared-memory planner's plan: a collective of one GPU
/// is one copy of its input into its output (NCCL's single `cudaMemcpyAsync`), whatever
/// the size, and the checker proves it.
#[test]
fn one_rank_is_one_copy_on_every_machine() {
    for preset in ["dgx-h100", "nvswitch-1", "dgx1-v100", "host-1"] {
        let topo = relaycc_topo::preset(preset).unwrap();
        let gpu = topo.gpu_count() - 1;
        for coll in [
            Collective::AllReduce,
            Collective::Broadcast,
            Collective::AllGather,
            Collective::ReduceScatter,
        ] {
            let req = Request::new(coll, vec![gpu], 1 << 24, DType::F32);
            let chosen = plan(&topo, &req, &PlanOptions::default()).unwrap();
            let what = format!("{preset} {coll}");
            assert_eq!(
                chosen.plan.ops.len(),
                1,
                "{what}: {}",
                chosen.plan.algorithm
            );
            assert!(
                matches!(chosen.plan.ops[0].kind, relaycc_route::OpKind::Copy { .. }),
                "{what}"
            );
            relaycc_route::check(&chosen.plan).unwrap();
        }
    }
}
