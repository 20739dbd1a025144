//! End to end: a real topology file -> plan -> host execution -> exact result.

use std::sync::Arc;

use relaycc_collectives::{Communicator, HostBackend, ReduceOp};
use relaycc_route::{Collective, DType, Request};

use crate::common::verify;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../topo/tests/data");

fn all_reduce_on(name: &str, comm: &Communicator) {
    let n = comm.ranks();
    let count = 10_007u64;
    let seed = 9;
    let ins: Vec<_> = (0..n)
        .map(|r| {
            let data: Vec<f32> = (0..count)
                .map(|i| crate::common::input::<f32>(ReduceOp::Sum, seed, r as u32, i) as f32)
                .collect();
            comm.from_slice(r, &data)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        })
        .collect();
    comm.all_reduce(&ins, &ins, ReduceOp::Sum)
        .and_then(|p| p.wait())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let got: Vec<Vec<f32>> = ins.iter().map(|b| b.to_vec().unwrap_or_default()).collect();
    let req = Request::new(
        Collective::AllReduce,
        comm.devices().to_vec(),
        count,
        DType::F32,
    );
    verify(&req, seed, &got).unwrap_or_else(|e| panic!("{name}: {e}"));
    // The plan it ran follows the file's real links.
    let plan = comm
        .plan(&req, true)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    relaycc_route::check_routes(&plan, comm.topology()).unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn topology_files_end_to_end() {
    let entries = std::fs::read_dir(DIR).unwrap_or_else(|e| panic!("cannot read {DIR}: {e}"));
    let mut ran = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "md") {
            continue;
        }
        let name = path.display().to_string();
        let topo = relaycc_topo::load(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let gpus: Vec<u32> = (0..topo.gpu_count().min(8)).collect();
        let comm = Communicator::new(topo, &gpus, &[], Arc::new(HostBackend::new()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        all_reduce_on(&name, &comm);
        ran += 1;
    }
    assert_eq!(ran, 10, "every sample in {DIR} runs end to end");
}

#[test]
fn preset_end_to_end() {
    for preset in ["dgx1-v100", "ac922", "dgx2"] {
        let comm =
            Communicator::from_spec(preset, &[3, 1, 0, 2], &[], Arc::new(HostBackend::new()))
                .unwrap_or_else(|e| panic!("{preset}: {e}"));
        all_reduce_on(preset, &comm);
        assert_eq!(comm.cached_plans(), 1);
    }
}
