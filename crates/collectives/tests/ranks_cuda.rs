//! Per-rank calls on the caller's CUDA stream ([`RankComm::on`]), one thread per rank, with
//! cudarc buffers, and the constructors of GPU ranks ([`RankComm::cuda`] and its stated
//! topology variants). The GPU tests are ignored by default; on a GPU machine:
//! `cargo test -p relaycc-collectives --test ranks_cuda -- --ignored`. The constructors'
//! errors without a driver, for a host topology and for a device listed twice run everywhere.
//!
//! Several logical ranks share one GPU (every rank on device 0) unless `RELAYCC_TEST_GPUS`
//! lists devices to spread them over.
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::thread;

use relaycc_collectives::cuda::CudaError;
use relaycc_collectives::cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use relaycc_collectives::{
    Collectives, CollectivesError, Communicator, CudaBackend, RankComm, ReduceOp, host_topology,
    nvswitch_topology,
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
/// The kernel sees the sum.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_after_the_call_on_the_callers_stream_sees_the_result() {
    kernel_after_the_call_sees_the_result(nvswitch_topology(4).expect("topology"));
}

/// The host's topology (`host-N`, arenas of host memory) with the CUDA backend is refused
/// when the communicator is made, naming the topology to use instead.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_host_topology_with_the_cuda_backend_is_refused() {
    let backend = Arc::new(CudaBackend::new(device_map(2)).unwrap_or_else(|e| panic!("{e}")));
    let e = Communicator::new(host_topology(2).expect("topology"), &[0, 1], &[], backend)
        .expect_err("host-2 on the CUDA backend");
    let m = e.to_string();
    assert!(
        m.contains("host-2") && m.contains("nvswitch_topology(2)"),
        "{m}"
    );
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

/// True where this machine has a CUDA driver (then the tests below that need its absence
/// check nothing more than that no constructor panics).
fn has_driver() -> bool {
    relaycc_collectives::cuda::driver().is_ok()
}

/// Without a driver every constructor of GPU ranks is the CUDA layer's NoDriver error (no
/// fallback makes GPUs appear); nothing panics.
#[test]
fn without_a_driver_gpu_ranks_are_a_clear_error() {
    let made = [
        ("cuda", RankComm::cuda(&[0, 1])),
        (
            "cuda_or",
            RankComm::cuda_or(&[0, 1], nvswitch_topology(2).expect("topology")),
        ),
        (
            "cuda_with_topology",
            RankComm::cuda_with_topology(nvswitch_topology(2).expect("topology"), &[0, 1]),
        ),
    ];
    for (name, r) in made {
        if has_driver() {
            continue;
        }
        let e = r.expect_err(name);
        assert!(
            matches!(e, CollectivesError::Cuda(CudaError::NoDriver { .. })),
            "{name}: {e:?}"
        );
        assert!(e.to_string().starts_with("no CUDA driver"), "{name}: {e}");
    }
}

/// A host topology for GPU ranks is an error that names the topology to use, before the
/// driver is asked (so here too).
#[test]
fn gpu_ranks_on_a_host_topology_are_refused_naming_the_topology_to_use() {
    for r in [
        RankComm::cuda_with_topology(host_topology(4).expect("topology"), &[0, 1, 2, 3]),
        RankComm::cuda_or(&[0, 1, 2, 3], host_topology(4).expect("topology")),
    ] {
        let e = r.expect_err("host-4 for GPU ranks");
        let m = e.to_string();
        assert!(matches!(e, CollectivesError::Setup(_)), "{e:?}");
        assert!(
            m.contains("host-4")
                && m.contains("nvswitch_topology(4)")
                && m.contains("RankComm::cuda"),
            "{m}"
        );
    }
}

/// One rank per GPU, as NCCL: a device listed twice, or none, is an error before the driver
/// is asked, and the message says how to make ranks that share a GPU.
#[test]
fn gpu_ranks_need_distinct_devices() {
    let e = RankComm::cuda(&[0, 1, 0]).expect_err("device 0 twice");
    let m = e.to_string();
    assert!(
        m.contains("CUDA device 0 is listed twice") && m.contains("CudaBackend::new"),
        "{m}"
    );
    let e = RankComm::cuda_with_topology(nvswitch_topology(2).expect("topology"), &[1, 1])
        .expect_err("device 1 twice");
    assert!(
        e.to_string().contains("CUDA device 1 is listed twice"),
        "{e}"
    );
    let e = RankComm::cuda(&[]).expect_err("no device");
    assert!(e.to_string().contains("no CUDA devices given"), "{e}");
}

/// Every visible GPU's rank on the machine's NVML topology: rank `r` runs on device `r`, the
/// ranks' GPUs are members, every other GPU of the machine is masked busy, and an all_reduce
/// on each rank's stream gives the sum.
#[test]
#[ignore = "needs a CUDA GPU and NVML"]
fn ranks_from_nvml_run_on_their_devices() {
    let visible = relaycc_collectives::cuda::devices().expect("devices").len();
    for gpus in [vec![0], (0..visible).collect::<Vec<_>>()] {
        let ranks = RankComm::cuda(&gpus).unwrap_or_else(|e| panic!("{e}"));
        let topo = ranks[0].communicator().topology().clone();
        assert!(topo.gpu_count() as usize >= visible, "{}", topo.name());
        let members = ranks[0].communicator().devices().to_vec();
        for g in 0..topo.gpu_count() {
            assert_eq!(topo.gpu_free(g), members.contains(&g), "GPU {g}");
        }
        let sums = all_reduce_on_streams(ranks);
        let n = gpus.len() as f32;
        for (r, (ordinal, v)) in sums.iter().enumerate() {
            assert_eq!(*ordinal, gpus[r], "rank {r}'s device");
            assert!(
                v.iter().all(|&e| e == n * (n + 1.0) / 2.0),
                "rank {r}: {:?}",
                &v[..4]
            );
        }
    }
}

/// A stated topology (the fallback where NVML cannot describe the machine): its GPU `i` is
/// CUDA device `i`; the ranks' all_reduce gives the sum; a device the topology lacks is an
/// error naming both.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ranks_on_a_stated_topology_run_on_their_devices() {
    let visible = relaycc_collectives::cuda::devices().expect("devices").len();
    let topo = nvswitch_topology(visible as u32).expect("topology");
    let gpus: Vec<usize> = (0..visible).collect();
    let ranks = RankComm::cuda_with_topology(topo.clone(), &gpus).unwrap_or_else(|e| panic!("{e}"));
    let n = visible as f32;
    for (r, (ordinal, v)) in all_reduce_on_streams(ranks).iter().enumerate() {
        assert_eq!(*ordinal, r);
        assert!(v.iter().all(|&e| e == n * (n + 1.0) / 2.0), "rank {r}");
    }
    let short = nvswitch_topology(1).expect("topology");
    if visible > 1 {
        let e = RankComm::cuda_with_topology(short, &[1]).expect_err("GPU 1 of nvswitch-1");
        assert!(e.to_string().contains("has no GPU 1"), "{e}");
    }
    // The fallback is used only where NVML fails; either way the ranks run.
    let ranks = RankComm::cuda_or(&[0], topo).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(all_reduce_on_streams(ranks)[0].1[0], 1.0);
}

/// Each rank (one thread each) all_reduces `rank + 1` in place on a stream of its own
/// device; per rank, its device and the result.
fn all_reduce_on_streams(ranks: Vec<RankComm>) -> Vec<(usize, Vec<f32>)> {
    thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|mut rank| {
                s.spawn(move || {
                    let ordinal = rank.cuda_device().expect("a CUDA rank");
                    let stream = CudaContext::new(ordinal)
                        .expect("context")
                        .new_stream()
                        .expect("stream");
                    let mut x = stream
                        .clone_htod(&vec![rank.rank() as f32 + 1.0; 4096])
                        .expect("upload");
                    rank.on(&stream)
                        .all_reduce_in_place(&mut x, ReduceOp::Sum)
                        .expect("all_reduce");
                    (ordinal, stream.clone_dtoh(&x).expect("download"))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// Four ranks over CUDA flag lanes (`Communicator::into_flag_ranks`), on one GPU by
/// default, each on a stream of its own: an in-place all_reduce, an all_gather and a
/// broadcast enqueued back to back with no host synchronization, then a kernel doubling the
/// all_reduce's result, then 100 all_reduces of 64 KiB timed on the host (each call's
/// enqueue) on a second stream of each rank's, which the lane joins. Every result is exact.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ranks_over_flag_lanes_enqueue_their_own_parts_on_their_streams() {
    use relaycc_collectives::exec::flag_transport::FlagShape;
    const N: usize = (1 << 18) + 3;
    const SMALL: usize = 16 << 10;
    const CALLS: usize = 100;
    let map = device_map(4);
    let backend = Arc::new(CudaBackend::new(map.clone()).unwrap_or_else(|e| panic!("{e}")));
    let topo = nvswitch_topology(4).expect("topology");
    let comm = Communicator::new(topo, &[0, 1, 2, 3], &[], backend).expect("communicator");
    let shape = FlagShape::new(2, 256 << 10).expect("shape");
    let ranks = comm
        .into_flag_ranks(shape)
        .unwrap_or_else(|e| panic!("{e}"));
    let ptx = relaycc_collectives::cudarc::nvrtc::compile_ptx(TWICE).expect("nvrtc");
    // Per rank: the all_reduce doubled, the all_gather, the broadcast, the last small
    // all_reduce, and the host time per small call.
    type Got = (Vec<f32>, Vec<u32>, Vec<u32>, Vec<f32>, f64);
    let got: Vec<Got> = thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|mut rank| {
                let ordinal = map[rank.rank()];
                let ptx = ptx.clone();
                s.spawn(move || {
                    let r = rank.rank();
                    let ctx = CudaContext::new(ordinal).expect("context");
                    let stream = ctx.new_stream().expect("stream");
                    let f = ctx
                        .load_module(ptx)
                        .expect("module")
                        .load_function("twice")
                        .expect("function");
                    let mut x = stream.clone_htod(&vec![r as f32 + 1.0; N]).expect("upload");
                    let mine = stream
                        .clone_htod(&vec![r as u32 * 10; 1000])
                        .expect("upload");
                    let mut all = stream.alloc_zeros::<u32>(4000).expect("alloc");
                    let mut b = stream.clone_htod(&vec![r as u32; 777]).expect("upload");
                    let mut on = rank.on(&stream);
                    on.all_reduce_in_place(&mut x, ReduceOp::Sum)
                        .expect("all_reduce");
                    on.all_gather(&mine, &mut all).expect("all_gather");
                    on.broadcast_in_place(&mut b, 2).expect("broadcast");
                    let n = N as i32;
                    let mut launch = stream.launch_builder(&f);
                    launch.arg(&mut x).arg(&n);
                    // SAFETY: `twice` takes a float pointer of `n` elements and an int.
                    unsafe { launch.launch(LaunchConfig::for_num_elems(N as u32)) }
                        .expect("launch");
                    let second = ctx.new_stream().expect("stream");
                    let mut small = second.clone_htod(&vec![1.0f32; SMALL]).expect("upload");
                    second.synchronize().expect("upload done");
                    let start = std::time::Instant::now();
                    for _ in 0..CALLS {
                        rank.on(&second)
                            .all_reduce_in_place(&mut small, ReduceOp::Max)
                            .expect("small all_reduce");
                    }
                    let per_call_us = start.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
                    (
                        stream.clone_dtoh(&x).expect("download"),
                        stream.clone_dtoh(&all).expect("download"),
                        stream.clone_dtoh(&b).expect("download"),
                        second.clone_dtoh(&small).expect("download"),
                        per_call_us,
                    )
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    let mut worst_us = 0f64;
    for (r, (x, all, b, small, us)) in got.iter().enumerate() {
        assert!(x.iter().all(|&e| e == 20.0), "rank {r}: {:?}", &x[..4]);
        let want: Vec<u32> = (0..4000).map(|i| (i / 1000) as u32 * 10).collect();
        assert!(all == &want, "rank {r}: all_gather");
        assert!(b.iter().all(|&e| e == 2), "rank {r}: broadcast");
        assert!(small.iter().all(|&e| e == 1.0), "rank {r}: max");
        worst_us = worst_us.max(*us);
    }
    println!(
        "gpu-check: flag_rank_call_host_us {worst_us:.1} (4 ranks, {CALLS} all_reduces of 64 KiB back to back)"
    );
}
