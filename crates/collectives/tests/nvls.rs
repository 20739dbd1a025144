//! The NVLS all_reduce plan (reduction in the NVSwitch, then multicast) runs byte for byte on
//! the host backend: the plan the checker proves is the plan the executor runs, whatever the
//! switch would do on the real machine.

use std::sync::Arc;

use relaycc_collectives::{Communicator, HostBackend, ReduceOp};
use relaycc_route::planner::nvls;
use relaycc_route::{Collective, DType, Request};

const RANKS: usize = 8;
/// Elements per rank: 8 shards of several chunks each at the chunk given below.
const COUNT: usize = 8 * 3 * 257 + 5;

fn input(r: usize, op: ReduceOp) -> Vec<i64> {
    (0..COUNT)
        .map(|i| match op {
            ReduceOp::Prod => 1 + ((r + i) % 3) as i64,
            _ => (r * 1000 + i) as i64 - 3000,
        })
        .collect()
}

#[test]
fn nvls_all_reduce_runs_exactly_on_the_host_backend() {
    let topo = relaycc_topo::preset("dgx-h100").expect("preset");
    let devices: Vec<u32> = (0..RANKS as u32).collect();
    let req = Request::new(
        Collective::AllReduce,
        devices.clone(),
        COUNT as u64,
        DType::I64,
    );
    let plan = nvls::all_reduce(&topo, &req, 257).expect("nvls plan");
    relaycc_route::check_routes(&plan, &topo).expect("routes");
    assert!(plan.ops.iter().any(|o| o.nvls.is_some()));
    let comm =
        Communicator::new(topo, &devices, &[], Arc::new(HostBackend::new())).expect("communicator");
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod, ReduceOp::Avg] {
        let mut r = req.clone();
        r.op = op;
        let mut p = plan.clone();
        p.request = r.clone();
        let ins: Vec<_> = (0..RANKS)
            .map(|k| comm.from_slice(k, &input(k, op)).expect("upload"))
            .collect();
        let outs: Vec<_> = (0..RANKS)
            .map(|k| comm.alloc::<i64>(k, COUNT).expect("alloc"))
            .collect();
        comm.run_plan(p, &ins, &outs)
            .expect("launch")
            .wait()
            .expect("run");
        let inputs: Vec<Vec<i64>> = (0..RANKS).map(|k| input(k, op)).collect();
        let want: Vec<i64> = (0..COUNT)
            .map(|i| {
                let col = inputs.iter().map(|v| v[i]);
                match op {
                    ReduceOp::Sum => col.sum(),
                    ReduceOp::Max => col.max().unwrap_or(0),
                    ReduceOp::Prod => col.product(),
                    ReduceOp::Avg => col.sum::<i64>() / RANKS as i64,
                    ReduceOp::Min => col.min().unwrap_or(0),
                }
            })
            .collect();
        for (k, out) in outs.iter().enumerate() {
            assert_eq!(out.to_vec().expect("download"), want, "{op:?} rank {k}");
        }
    }
}
