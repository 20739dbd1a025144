//! CUDA backend tests: every collective for every element type run on [`CudaBackend`] and on
//! the host backend (the oracle), results compared. Ignored by default; on a GPU machine:
//! `cargo test -p relaycc-collectives --test cuda -- --ignored`.
//!
//! Several logical ranks share one GPU (device map `[0, 0, 0, 0]`), so a one-GPU machine runs
//! them all; `RELAYCC_TEST_GPUS=0,1,2,3` spreads them over real GPUs instead.

use std::sync::Arc;

use relaycc_collectives::{
    Backend, BufferView, Communicator, CudaBackend, DeviceBuffer, Element, HostBackend, bf16, f16,
    nvswitch_topology,
};
use relaycc_route::{Collective, DType, ReduceOp, Request, Transfer};
use relaycc_topo::Topology;

/// The device map: `RELAYCC_TEST_GPUS` (comma separated), else every logical GPU on device 0.
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

fn cuda(n: usize) -> Arc<dyn Backend> {
    Arc::new(CudaBackend::new(device_map(n)).unwrap_or_else(|e| panic!("{e}")))
}

fn request(c: Collective, gpus: Vec<u32>, count: u64, dtype: DType, op: ReduceOp) -> Request {
    let n = gpus.len();
    let mut r = Request::new(c, gpus, count, dtype)
        .with_op(op)
        .with_root(1 % n as u32);
    if matches!(c, Collective::AllGatherV | Collective::ReduceScatterV) {
        r.counts = (0..n as u64).map(|i| count + i).collect();
    }
    if c == Collective::AllToAllV {
        r.matrix = (0..n as u64)
            .map(|i| (0..n as u64).map(|j| (i + 2 * j) % 5).collect())
            .collect();
    }
    if c == Collective::SendRecv {
        r.transfers = (0..n as u32)
            .map(|s| Transfer {
                src: s,
                dst: (s + 1) % n as u32,
                count,
            })
            .collect();
    }
    r
}

fn views<T: Element>(b: &[DeviceBuffer<T>]) -> Vec<Option<BufferView<'_, T>>> {
    b.iter()
        .map(|b| (!b.is_empty()).then(|| b.view()))
        .collect()
}

/// Run `req` on `comm`; the outputs on the host.
fn run<T: Element>(comm: &Communicator, req: &Request) -> Vec<Vec<T>> {
    let n = comm.ranks() as u32;
    let bufs = |input: bool| -> Vec<DeviceBuffer<T>> {
        (0..n)
            .map(|r| {
                let len = if input {
                    req.input_len(r)
                } else {
                    req.output_len(r)
                };
                let len = len.unwrap_or_else(|e| panic!("{e}"));
                let data: Vec<T> = (0..len)
                    .map(|i| {
                        T::from_i64(if input {
                            ((r as u64 * 5 + i) % 7) as i64 - 3
                        } else {
                            0
                        })
                    })
                    .collect();
                comm.from_slice(r as usize, &data)
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    };
    let (ins, outs) = (bufs(true), bufs(false));
    let (iv, ov) = (views(&ins), views(&outs));
    comm.launch_request(req, &iv, &ov)
        .and_then(|p| p.wait())
        .unwrap_or_else(|e| panic!("{} {}: {e}", req.collective.name(), T::DTYPE));
    outs.iter()
        .map(|b| b.to_vec().unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn compare<T: Element>(req: &Request, got: &[Vec<T>], want: &[Vec<T>]) {
    assert_eq!(got.len(), want.len());
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len());
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            // Avg multiplies by 1/n on the GPU and divides by n on the host.
            let ok = if req.op == ReduceOp::Avg {
                (a.to_f64() - b.to_f64()).abs() <= 1e-2 * b.to_f64().abs().max(1.0)
            } else {
                a == b
            };
            assert!(
                ok,
                "{} {} {}: rank {r} element {i}: cuda {a:?}, host {b:?}",
                req.collective.name(),
                T::DTYPE,
                req.op
            );
        }
    }
}

fn every_collective<T: Element>(topo: &Topology, gpus: &[u32], relays: &[u32], count: u64) {
    every_collective_on::<T>(topo, gpus, relays, count, cuda(topo.gpu_count() as usize));
}

fn every_collective_on<T: Element>(
    topo: &Topology,
    gpus: &[u32],
    relays: &[u32],
    count: u64,
    backend: Arc<dyn Backend>,
) {
    let host = Communicator::new(topo.clone(), gpus, relays, Arc::new(HostBackend::new()))
        .unwrap_or_else(|e| panic!("{e}"));
    let gpu =
        Communicator::new(topo.clone(), gpus, relays, backend).unwrap_or_else(|e| panic!("{e}"));
    for c in Collective::ALL {
        let ops: Vec<ReduceOp> = if c.reduces() {
            ReduceOp::ALL
                .into_iter()
                .filter(|op| *op != ReduceOp::Avg || T::DTYPE.is_float())
                .collect()
        } else {
            vec![ReduceOp::Sum]
        };
        for op in ops {
            let req = request(c, gpus.to_vec(), count, T::DTYPE, op);
            let want = run::<T>(&host, &req);
            let got = run::<T>(&gpu, &req);
            compare(&req, &got, &want);
        }
    }
}

fn all_types(topo: &Topology, gpus: &[u32], relays: &[u32], count: u64) {
    every_collective::<f32>(topo, gpus, relays, count);
    every_collective::<f64>(topo, gpus, relays, count);
    every_collective::<f16>(topo, gpus, relays, count);
    every_collective::<bf16>(topo, gpus, relays, count);
    every_collective::<i8>(topo, gpus, relays, count);
    every_collective::<u8>(topo, gpus, relays, count);
    every_collective::<i32>(topo, gpus, relays, count);
    every_collective::<u32>(topo, gpus, relays, count);
    every_collective::<i64>(topo, gpus, relays, count);
    every_collective::<u64>(topo, gpus, relays, count);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_collective_and_type_matches_the_host_backend_on_an_nvswitch_topology() {
    // The flat GPU machine of `bench --backend cuda` without a topology: GPU algorithms (rings,
    // multipath splits, MiB chunks). The host's `host-N` topology is refused on the CUDA
    // backend. An odd count exercises ragged blocks; a larger one several chunks per lane.
    let topo = relaycc_collectives::nvswitch_topology(4).unwrap_or_else(|e| panic!("{e}"));
    for count in [1001, 1 << 20] {
        all_types(&topo, &[0, 1, 2, 3], &[], count);
    }
}

/// Four ranks sharing device 0 (`shared-gpu-4`): reductions read every rank's input where it
/// lies, one kernel per all_reduce with the copies of its result fused in, out of place for
/// every collective, and in place for all_reduce (its copies land on the other ranks' inputs,
/// which the same kernel reads); results equal the host backend's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ranks_sharing_one_gpu_match_the_host_backend_out_of_place_and_in_place() {
    let topo = relaycc_collectives::shared_gpu_topology(4).unwrap_or_else(|e| panic!("{e}"));
    let one_gpu = || -> Arc<dyn Backend> {
        Arc::new(CudaBackend::new(vec![0; 4]).unwrap_or_else(|e| panic!("{e}")))
    };
    let gpus = [0, 1, 2, 3];
    for count in [1001, 1 << 20] {
        every_collective_on::<f32>(&topo, &gpus, &[], count, one_gpu());
        every_collective_on::<bf16>(&topo, &gpus, &[], count, one_gpu());
        every_collective_on::<f16>(&topo, &gpus, &[], count, one_gpu());
        every_collective_on::<i32>(&topo, &gpus, &[], count, one_gpu());
        every_collective_on::<u8>(&topo, &gpus, &[], count, one_gpu());
    }
    let gpu = Communicator::new(topo, &gpus, &[], one_gpu()).unwrap_or_else(|e| panic!("{e}"));
    let n = 4099;
    let data: Vec<Vec<i32>> = (0..4)
        .map(|r| (0..n).map(|i| (r * 7 + i as i32) % 13 - 6).collect())
        .collect();
    let sum: Vec<i32> = (0..n).map(|i| data.iter().map(|d| d[i]).sum()).collect();
    let bufs: Vec<DeviceBuffer<i32>> = data
        .iter()
        .enumerate()
        .map(|(r, d)| gpu.from_slice(r, d).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let refs: Vec<&DeviceBuffer<i32>> = bufs.iter().collect();
    gpu.all_reduce(&refs, &refs, relaycc_collectives::ReduceOp::Sum)
        .and_then(|p| p.wait())
        .unwrap_or_else(|e| panic!("{e}"));
    for b in &bufs {
        assert_eq!(b.to_vec().unwrap_or_else(|e| panic!("{e}")), sum);
    }
}

/// Every copy on copy engines (threshold 0), and every copy between device memories on SMs
/// (the forward kernel, threshold `u64::MAX`), give the host backend's results; the default
/// threshold runs in the tests above.
#[test]
#[ignore = "needs a CUDA GPU"]
fn copies_on_sms_and_on_copy_engines_match_the_host_backend() {
    let topo = relaycc_collectives::nvswitch_topology(4).unwrap_or_else(|e| panic!("{e}"));
    for threshold in [0, u64::MAX] {
        let backend = Arc::new(CudaBackend::new(device_map(4)).unwrap_or_else(|e| panic!("{e}")));
        backend.set_sm_copy_below(threshold);
        assert_eq!(backend.sm_copy_below(), threshold);
        for count in [1001, 1 << 20] {
            every_collective_on::<f32>(&topo, &[0, 1, 2, 3], &[], count, backend.clone());
            every_collective_on::<bf16>(&topo, &[0, 1, 2, 3], &[], count, backend.clone());
            every_collective_on::<i8>(&topo, &[0, 1, 2, 3], &[], count, backend.clone());
        }
    }
}

/// A call of a plan seen before reuses its schedule with the new call's buffers patched in:
/// the same all_reduce on fresh buffers (other addresses) several times, in place and not,
/// each result exact; then a call whose output aliases its input differently.
#[test]
#[ignore = "needs a CUDA GPU"]
fn repeated_calls_patch_their_buffers_into_the_kept_schedule() {
    let topo = relaycc_collectives::nvswitch_topology(4).unwrap_or_else(|e| panic!("{e}"));
    let host = Communicator::new(
        topo.clone(),
        &[0, 1, 2, 3],
        &[],
        Arc::new(HostBackend::new()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let gpu =
        Communicator::new(topo, &[0, 1, 2, 3], &[], cuda(4)).unwrap_or_else(|e| panic!("{e}"));
    for op in [ReduceOp::Sum, ReduceOp::Avg] {
        let req = request(
            Collective::AllReduce,
            vec![0, 1, 2, 3],
            1 << 20,
            DType::F32,
            op,
        );
        let want = run::<f32>(&host, &req);
        for _ in 0..3 {
            compare(&req, &run::<f32>(&gpu, &req), &want);
        }
    }
    let data: Vec<Vec<f32>> = (0..4)
        .map(|r| (0..4099).map(|i| ((r * 7 + i) % 13) as f32).collect())
        .collect();
    let want: Vec<f32> = (0..4099).map(|i| data.iter().map(|d| d[i]).sum()).collect();
    for _ in 0..3 {
        let bufs: Vec<DeviceBuffer<f32>> = data
            .iter()
            .enumerate()
            .map(|(r, d)| gpu.from_slice(r, d).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let refs: Vec<&DeviceBuffer<f32>> = bufs.iter().collect();
        gpu.all_reduce(&refs, &refs, relaycc_collectives::ReduceOp::Sum)
            .and_then(|p| p.wait())
            .unwrap_or_else(|e| panic!("{e}"));
        for b in &bufs {
            assert_eq!(b.to_vec().unwrap_or_else(|e| panic!("{e}")), want);
        }
    }
}

/// A launch on one device runs directly, is captured into a graph when its addresses repeat,
/// and replays the graph only while they stay: two sets of buffers called in the order
/// A A A B B B A B A A, new data each call, every result exact (in place, on `nvswitch-4`,
/// 24 copies and 12 reductions on one GPU, and `shared-gpu-4`, one kernel).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_captured_graph_runs_only_with_the_addresses_it_was_captured_with() {
    let shared = relaycc_collectives::shared_gpu_topology(4).unwrap_or_else(|e| panic!("{e}"));
    let flat = relaycc_collectives::nvswitch_topology(4).unwrap_or_else(|e| panic!("{e}"));
    for topo in [flat, shared] {
        let name = topo.name().to_owned();
        let backend = Arc::new(CudaBackend::new(vec![0; 4]).unwrap_or_else(|e| panic!("{e}")));
        let gpu =
            Communicator::new(topo, &[0, 1, 2, 3], &[], backend).unwrap_or_else(|e| panic!("{e}"));
        const N: usize = (1 << 20) + 3;
        let sets: Vec<Vec<DeviceBuffer<u32>>> = (0..2)
            .map(|_| {
                (0..4)
                    .map(|r| gpu.alloc(r, N).unwrap_or_else(|e| panic!("{e}")))
                    .collect()
            })
            .collect();
        for (call, set) in [0, 0, 0, 1, 1, 1, 0, 1, 0, 0].into_iter().enumerate() {
            let bufs = &sets[set];
            let data: Vec<Vec<u32>> = (0..4)
                .map(|r| {
                    (0..N)
                        .map(|i| (call * 31 + r * 7 + i % 97) as u32)
                        .collect()
                })
                .collect();
            for (b, d) in bufs.iter().zip(&data) {
                b.copy_from(d).unwrap_or_else(|e| panic!("{e}"));
            }
            let refs: Vec<&DeviceBuffer<u32>> = bufs.iter().collect();
            gpu.all_reduce(&refs, &refs, ReduceOp::Sum)
                .and_then(|p| p.wait())
                .unwrap_or_else(|e| panic!("{e}"));
            let want: Vec<u32> = (0..N).map(|i| data.iter().map(|d| d[i]).sum()).collect();
            for (r, b) in bufs.iter().enumerate() {
                let got = b.to_vec().unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    got == want,
                    "{name}: call {call} (set {set}), rank {r}: wrong"
                );
            }
        }
    }
}

/// Host time per call of a cached plan: 100 all_reduces of 4 KiB on 4 ranks back to back,
/// none waited for until the last, on one thread, planned on `shared-gpu-4` (four ranks on
/// device 0: what `relaycc bench` plans on for ranks sharing a GPU) and on `nvswitch-4` (GPU
/// algorithms, on the test's device map). Printed on `gpu-check:` lines for
/// `scripts/gpu-check` (its target is the benchmark's, not this test's); the test checks the
/// outputs after the last call.
#[test]
#[ignore = "needs a CUDA GPU"]
fn host_time_per_call_of_a_cached_plan() {
    let shared = relaycc_collectives::shared_gpu_topology(4).unwrap_or_else(|e| panic!("{e}"));
    let flat = relaycc_collectives::nvswitch_topology(4).unwrap_or_else(|e| panic!("{e}"));
    // Graphs on and off in alternation, so both see the same machine.
    for (topo, map) in [(shared, vec![0; 4]), (flat, device_map(4))] {
        for graphs in [true, false] {
            let backend = Arc::new(CudaBackend::new(map.clone()).unwrap_or_else(|e| panic!("{e}")));
            backend.set_graph_replay(graphs);
            let name = topo.name().to_owned();
            let host_us = host_us_per_call(topo.clone(), backend);
            println!(
                "gpu-check: host_us_per_call={host_us:.1} ranks=4 host_us_per_rank={:.1} \
                 topology={name} graphs={}",
                host_us / 4.0,
                if graphs { "on" } else { "off" }
            );
        }
    }
}

/// Host microseconds per call of 100 back-to-back 4 KiB all_reduces on 4 ranks of `topo`,
/// after five warm-up calls; checks the last call's outputs.
fn host_us_per_call(topo: Topology, backend: Arc<dyn Backend>) -> f64 {
    let gpu =
        Communicator::new(topo, &[0, 1, 2, 3], &[], backend).unwrap_or_else(|e| panic!("{e}"));
    let ins: Vec<DeviceBuffer<u32>> = (0..4u32)
        .map(|r| {
            gpu.from_slice(r as usize, &[r + 1; 1024])
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let outs: Vec<DeviceBuffer<u32>> = (0..4)
        .map(|r| gpu.alloc(r, 1024).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let (i, o): (Vec<&DeviceBuffer<u32>>, Vec<&DeviceBuffer<u32>>) =
        (ins.iter().collect(), outs.iter().collect());
    let call = || {
        let pending = gpu
            .all_reduce(&i, &o, relaycc_collectives::ReduceOp::Sum)
            .unwrap_or_else(|e| panic!("{e}"));
        // Not waited for: the next call orders itself after this one on the GPU.
        drop(pending);
    };
    // The first call plans and compiles, the second builds the kept schedule.
    for _ in 0..5 {
        call();
    }
    gpu.backend()
        .synchronize()
        .unwrap_or_else(|e| panic!("{e}"));
    let calls = 100;
    let t = std::time::Instant::now();
    for _ in 0..calls {
        call();
    }
    let host_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(calls);
    gpu.backend()
        .synchronize()
        .unwrap_or_else(|e| panic!("{e}"));
    for b in &outs {
        assert_eq!(
            b.to_vec().unwrap_or_else(|e| panic!("{e}")),
            vec![10u32; 1024]
        );
    }
    host_us
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn relay_and_multipath_plans_on_a_dgx1_map_match_the_host_backend() {
    // DGX-1: GPUs 0 and 5 share no NVLink, so plans relay through others; large requests
    // split over several paths. All eight logical GPUs run on the mapped device(s).
    let topo = relaycc_topo::load("dgx1-v100").unwrap_or_else(|e| panic!("{e}"));
    let relays = [1, 2, 3, 4, 6, 7];
    for count in [4099, 1 << 20] {
        every_collective::<f32>(&topo, &[0, 5], &relays, count);
        every_collective::<bf16>(&topo, &[0, 5], &relays, count);
        every_collective::<i64>(&topo, &[0, 5], &relays, count);
    }
    let plan = Communicator::new(topo.clone(), &[0, 5], &relays, cuda(8))
        .and_then(|c| {
            c.plan(
                &request(
                    Collective::AllReduce,
                    vec![0, 5],
                    1 << 24,
                    DType::F32,
                    ReduceOp::Sum,
                ),
                false,
            )
        })
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "dgx1 0<->5 all_reduce plan: {} ({} lanes)",
        plan.algorithm,
        plan.lanes.len()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_slices_round_trip_without_copying() {
    let backend = Arc::new(CudaBackend::new(device_map(2)).unwrap_or_else(|e| panic!("{e}")));
    let comm = Communicator::new(nvswitch_topology(2).unwrap(), &[0, 1], &[], backend.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let ordinal = backend.physical_device(0).unwrap();
    let stream = cudarc::driver::CudaContext::new(ordinal)
        .unwrap()
        .default_stream();
    let s = stream.clone_htod(&[1.0f32, 2.0, 3.0]).unwrap();
    let ptr = {
        let (p, _g) = cudarc::driver::DevicePtr::device_ptr(&s, &stream);
        p
    };
    let a = comm
        .wrap_cuda_slice(0, s)
        .unwrap_or_else(|r| panic!("{}", r.error));
    let b = comm.from_slice(1, &[10.0f32, 20.0, 30.0]).unwrap();
    comm.all_reduce(&[&a, &b], &[&a, &b], relaycc_collectives::ReduceOp::Sum)
        .and_then(|p| p.wait())
        .unwrap_or_else(|e| panic!("{e}"));
    let back = a.into_cuda_slice().unwrap_or_else(|e| panic!("{e}"));
    let (p2, _g) = cudarc::driver::DevicePtr::device_ptr(&back, &stream);
    assert_eq!(p2, ptr, "the same memory came back");
    assert_eq!(stream.clone_dtoh(&back).unwrap(), vec![11.0, 22.0, 33.0]);
    let own = b.into_cuda_slice().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(own.len(), 3);
}

/// Runs everywhere: without a driver the backend says so and nothing panics.
#[test]
fn without_a_driver_the_backend_is_a_clear_error() {
    if relaycc_collectives::cuda::driver().is_err() {
        let e = CudaBackend::new(vec![0, 0, 0, 0]).expect_err("no driver");
        assert!(e.to_string().contains("no CUDA driver"), "{e}");
    }
}

/// NCCL through cudarc on the first GPU (one rank: NCCL runs one rank per GPU), timing every
/// collective relaycc benchmarks against it: each call completes and takes a positive time.
#[cfg(feature = "nccl")]
#[test]
#[ignore = "needs a CUDA GPU and libnccl.so"]
fn nccl_times_every_collective_on_one_gpu() {
    use relaycc_collectives::cuda::nccl::{NcclCall, NcclComms};
    let comms = NcclComms::new(&[0], 1 << 22).unwrap_or_else(|e| panic!("{e}"));
    let call = |collective, count| NcclCall {
        collective,
        count,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        root: 0,
    };
    for c in Collective::ALL {
        let us = comms
            .time_us(&call(c, 1 << 16), 1, 3)
            .unwrap_or_else(|e| panic!("{c}: {e}"));
        assert!(us > 0.0 && us.is_finite(), "{c}: {us}");
    }
    assert!(
        comms
            .time_us(&call(Collective::AllReduce, 1 << 30), 0, 1)
            .is_err()
    );
}
