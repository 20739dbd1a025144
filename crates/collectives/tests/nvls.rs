//! The NVLS all_reduce plan (reduction in the NVSwitch, then multicast) runs byte for byte on
//! the host backend: on a DGX H100 model it is the fastest plan for a 16 MiB all_reduce, so the
//! communicator plans, proves and runs it; the host backend executes what the checker proved,
//! whatever the switch would do on the real machine.

use std::sync::Arc;

use relaycc_collectives::{Communicator, HostBackend, ReduceOp};
use relaycc_route::{Collective, DType, Request};

const RANKS: usize = 8;
/// Elements per rank: 16 MiB of i64 and a remainder, so shards and chunks are uneven.
const COUNT: usize = (2 << 20) + 5;

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
    let comm =
        Communicator::new(topo, &devices, &[], Arc::new(HostBackend::new())).expect("communicator");
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        let mut req = Request::new(
            Collective::AllReduce,
            devices.clone(),
            COUNT as u64,
            DType::I64,
        );
        req.op = op;
        let plan = comm.plan(&req, false).expect("plan");
        assert!(plan.algorithm.contains("nvls"), "{}", plan.algorithm);
        assert!(plan.ops.iter().any(|o| o.nvls.is_some()));
        let ins: Vec<_> = (0..RANKS)
            .map(|k| comm.from_slice(k, &input(k, op)).expect("upload"))
            .collect();
        let outs: Vec<_> = (0..RANKS)
            .map(|k| comm.alloc::<i64>(k, COUNT).expect("alloc"))
            .collect();
        comm.all_reduce(&ins, &outs, op)
            .expect("launch")
            .wait()
            .expect("run");
        let inputs: Vec<Vec<i64>> = (0..RANKS).map(|k| input(k, op)).collect();
        let want: Vec<i64> = (0..COUNT)
            .map(|i| {
                let col = inputs.iter().map(|v| v[i]);
                if op == ReduceOp::Max {
                    col.max().unwrap_or(0)
                } else {
                    col.sum()
                }
            })
            .collect();
        for (k, out) in outs.iter().enumerate() {
            assert!(out.to_vec().expect("download") == want, "{op:?} rank {k}");
        }
    }
}
