//! CUDA backend all_reduce: 64 MiB of f32, in place, over 2, 4 and 8 logical ranks spread
//! round-robin over the visible GPUs (several ranks per GPU on a small machine), planned on
//! `shared-gpu-N` when one GPU is visible (the shared-memory planner's reductions that read
//! every input where it lies) and `nvswitch-N` otherwise (GPU algorithms). Without a CUDA
//! driver or GPU it prints a skip note and returns.

use std::sync::Arc;

mod common;

use common::BYTES;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use relaycc::collectives::cuda;
use relaycc::{Communicator, CudaBackend, flat_topology_for_devices};

fn cuda_allreduce(c: &mut Criterion) {
    let visible = match cuda::devices() {
        Ok(d) if !d.is_empty() => d.len(),
        Ok(_) => {
            eprintln!("cuda_allreduce: skipped, the CUDA driver reports no GPU");
            return;
        }
        Err(e) => {
            eprintln!("cuda_allreduce: skipped, {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("cuda_allreduce_64MiB_f32");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(BYTES as u64));
    for ranks in [2u32, 4, 8] {
        let map: Vec<usize> = (0..ranks as usize).map(|i| i % visible).collect();
        let devices: Vec<u32> = (0..ranks).collect();
        let topo = flat_topology_for_devices(&map);
        let comm = CudaBackend::new(map)
            .and_then(|b| Communicator::new(topo?, &devices, &[], Arc::new(b)));
        let comm = match comm {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cuda_allreduce: {ranks} ranks skipped: {e}");
                continue;
            }
        };
        let id = format!("{ranks}_ranks_on_{visible}_gpus");
        let failed = format!("cuda_allreduce: cannot allocate {ranks} x 64 MiB");
        common::in_place_all_reduce(&mut g, &comm, id, &failed);
    }
    g.finish();
}

criterion_group!(benches, cuda_allreduce);
criterion_main!(benches);
