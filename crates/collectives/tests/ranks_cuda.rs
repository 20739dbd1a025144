//! Per-rank calls on the caller's CUDA stream ([`RankComm::on`]), one thread per rank, with
//! cudarc buffers. Ignored by default; on a GPU machine:
//! `cargo test -p relaycc-collectives --test ranks_cuda -- --ignored`.
//!
//! Several logical ranks share one GPU (every rank on device 0) unless `RELAYCC_TEST_GPUS`
//! lists devices to spread them over.
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::thread;

use relaycc_collectives::cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use relaycc_collectives::{
    Collectives, Communicator, CudaBackend, RankComm, ReduceOp, host_topology, nvswitch_topology,
};
use relaycc_topo::Topology;

/// The device of each logical rank: `RELAYCC_TEST_GPUS` (comma separated), else device 0.
fn device_map(n: usize) -> Vec<usize> {
    match std::env::var("RELAYCC_TEST_GPUS") {
        Ok(list) if !list.is_empty() => {
            let gpus: Vec<usize> = list
                .split(',')
                .map(|g| g.trim().parse().expect("RELAYCC_TEST_GPUS: numbers"))
                .collect();
            (0..n).map(|i| gpus[i % gpus.len()]).collect()
        }
        _ => vec![0; n],
    }
}

/// `n` ranks on a communicator planning on `topo` (`host-N` or `nvswitch-N`).
fn cuda_ranks(n: usize, topo: Topology) -> (Vec<RankComm>, Vec<usize>) {
    let map = device_map(n);
    let backend = Arc::new(CudaBackend::new(map.clone()).unwrap_or_else(|e| panic!("{e}")));
    let devices: Vec<u32> = (0..n as u32).collect();
    let comm = Communicator::new(topo, &devices, &[], backend).expect("communicator");
    (comm.into_ranks(), map)
}

const TWICE: &str = r#"
extern "C" __global__ void twice(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
"#;

/// Four ranks (on one GPU by default), each on a stream of its own: an in-place all_reduce,
/// then at once (no host synchronization) a kernel on the same stream doubling the result.
/// The kernel sees the sum, with the shared-memory planner's plans (`host-4`) and with GPU
/// algorithms (`nvswitch-4`).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_after_the_call_on_the_callers_stream_sees_the_result() {
    for topo in [host_topology(4), nvswitch_topology(4)] {
        kernel_after_the_call_sees_the_result(topo.expect("topology"));
    }
}

fn kernel_after_the_call_sees_the_result(topo: Topology) {
    const N: usize = 1 << 20;
    let name = topo.name().to_owned();
    let (ranks, map) = cuda_ranks(4, topo);
    let ptx = relaycc_collectives::cudarc::nvrtc::compile_ptx(TWICE).expect("nvrtc");
    let got: Vec<Vec<f32>> = thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|mut rank| {
                let ordinal = map[rank.rank()];
                let ptx = ptx.clone();
                s.spawn(move || {
                    let ctx = CudaContext::new(ordinal).expect("context");
                    let stream = ctx.new_stream().expect("stream");
                    let f = ctx
                        .load_module(ptx)
                        .expect("module")
                        .load_function("twice")
                        .expect("function");
                    let host = vec![rank.rank() as f32 + 1.0; N];
                    let mut x = stream.clone_htod(&host).expect("upload");
                    rank.on(&stream)
                        .all_reduce_in_place(&mut x, ReduceOp::Sum)
                        .expect("all_reduce");
                    let n = N as i32;
                    let mut b = stream.launch_builder(&f);
                    b.arg(&mut x).arg(&n);
                    // SAFETY: `twice` takes a float pointer of `n` elements and an int.
                    unsafe { b.launch(LaunchConfig::for_num_elems(N as u32)) }.expect("launch");
                    stream.clone_dtoh(&x).expect("download")
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    for (r, v) in got.iter().enumerate() {
        assert!(
            v.iter().all(|&e| e == 20.0),
            "{name} rank {r}: {:?}",
            &v[..4]
        );
    }
}

/// Several logical ranks on one GPU, out of place with cudarc views: an all_gather from a
/// view of a larger buffer into a view of the output, then a broadcast, both enqueued back to
/// back on each rank's stream before a single download.
#[test]
#[ignore = "needs a CUDA GPU"]
fn views_and_calls_back_to_back_on_one_gpu() {
    const C: usize = 1000;
    let (ranks, map) = cuda_ranks(3, nvswitch_topology(3).expect("topology"));
    let got: Vec<(Vec<u32>, Vec<u32>)> = thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|mut rank| {
                let ordinal = map[rank.rank()];
                s.spawn(move || {
                    let r = rank.rank() as u32;
                    let ctx = CudaContext::new(ordinal).expect("context");
                    let stream = ctx.new_stream().expect("stream");
                    let src = stream.clone_htod(&vec![r; C + 10]).expect("upload");
                    let mut out = stream.alloc_zeros::<u32>(3 * C + 5).expect("alloc");
                    let mut b = stream.clone_htod(&vec![r * 7; C]).expect("upload");
                    {
                        let send = src.slice(5..5 + C);
                        let mut recv = out.slice_mut(5..);
                        rank.on(&stream)
                            .all_gather(&send, &mut recv)
                            .expect("all_gather");
                    }
                    rank.on(&stream)
                        .broadcast_in_place(&mut b, 2)
                        .expect("broadcast");
                    let out = stream.clone_dtoh(&out).expect("download");
                    let b = stream.clone_dtoh(&b).expect("download");
                    (out, b)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    for (r, (out, b)) in got.iter().enumerate() {
        assert!(
            out[..5].iter().all(|&e| e == 0),
            "rank {r}: the view's prefix changed"
        );
        for s in 0..3 {
            let block = &out[5 + s * C..5 + (s + 1) * C];
            assert!(block.iter().all(|&e| e == s as u32), "rank {r} block {s}");
        }
        assert!(b.iter().all(|&e| e == 14), "rank {r}: broadcast");
    }
}
