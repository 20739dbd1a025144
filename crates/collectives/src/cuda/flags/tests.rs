//! The flag transport on CUDA streams (ignored: they need a GPU; `scripts/gpu-check` runs
//! them): ranks on streams of one GPU, more of them than the GPU has hardware queues,
//! exchange a ring of messages in chunks with every rank enqueueing on its own thread in
//! reverse order; a chunk's cost; a rank that never enqueues is named and the others' streams
//! are released.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use relaycc_route::{Collective, DType, ReduceOp};

use super::{CudaFlagChannels, CudaFlagLane};
use crate::call::CallDesc;
use crate::exec::flag_transport::{FlagShape, FlagTransport};
use crate::exec::run::Transport;

fn streams(n: usize) -> Vec<Arc<CudaStream>> {
    let ctx = CudaContext::new(0).unwrap_or_else(|e| panic!("{e:?}"));
    (0..n)
        .map(|_| ctx.new_stream().unwrap_or_else(|e| panic!("{e:?}")))
        .collect()
}

fn pattern(rank: usize, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| (i * 31 + rank * 7 + i / 251) as u8)
        .collect()
}

/// Rank `me` of `n` sends `src` to the next rank and receives the previous one's into `dst`,
/// `stages` times, on its own stream.
fn ring_exchange(
    t: &mut FlagTransport<CudaFlagLane>,
    stream: &Arc<CudaStream>,
    (me, n): (u32, u32),
    src: &CudaSlice<u8>,
    dst: &CudaSlice<u8>,
    stages: usize,
) {
    let bytes = src.len();
    let (s, _g1) = src.device_ptr(stream);
    let (d, _g2) = dst.device_ptr(stream);
    for stage in 0..stages {
        t.begin(stage);
        // SAFETY: both are live device buffers of `bytes` bytes, used by nothing else until
        // the caller synchronizes the stream.
        unsafe {
            t.recv((me + n - 1) % n, 0, d as *mut u8, bytes).unwrap();
            t.send((me + 1) % n, 0, s as *const u8, bytes).unwrap();
        }
        t.wait(stage).unwrap_or_else(|e| panic!("rank {me}: {e}"));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flag_lanes_carry_a_ring_exchange_between_streams_of_one_gpu() {
    let bytes = (1 << 20) + 7;
    for n in [2usize, 4, 12, 32] {
        let streams = streams(n);
        let shape = FlagShape::new(2, 256 << 10).unwrap();
        let ends =
            CudaFlagChannels::group(streams.clone(), shape, Duration::from_secs(20), u64::MAX)
                .unwrap_or_else(|e| panic!("{e}"));
        let start = Instant::now();
        std::thread::scope(|s| {
            for (r, mut t) in ends.into_iter().enumerate() {
                let stream = Arc::clone(&streams[r]);
                s.spawn(move || {
                    // Later ranks enqueue first.
                    std::thread::sleep(Duration::from_millis(2 * (n - r) as u64));
                    let src = stream.clone_htod(&pattern(r, bytes)).unwrap();
                    let dst = stream.alloc_zeros::<u8>(bytes).unwrap();
                    ring_exchange(&mut t, &stream, (r as u32, n as u32), &src, &dst, 3);
                    stream
                        .synchronize()
                        .unwrap_or_else(|e| panic!("rank {r}: {e:?}"));
                    let got = stream.clone_dtoh(&dst).unwrap();
                    assert!(got == pattern((r + n - 1) % n, bytes), "rank {r} of {n}");
                    drop(t);
                });
            }
        });
        println!(
            "gpu-check: flag_ring ranks={n} bytes={bytes} stages=3 ms={:.3}",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flag_lanes_cost_per_chunk() {
    let streams = streams(2);
    let chunks = 4096usize;
    let shape = FlagShape::new(2, 64).unwrap();
    let ends = CudaFlagChannels::group(streams.clone(), shape, Duration::from_secs(20), u64::MAX)
        .unwrap_or_else(|e| panic!("{e}"));
    // One warm-up stage of one chunk, then `chunks` chunks each way in one stage.
    let elapsed: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .into_iter()
            .enumerate()
            .map(|(r, mut t)| {
                let stream = Arc::clone(&streams[r]);
                s.spawn(move || {
                    let src = stream.clone_htod(&pattern(r, chunks * 64)).unwrap();
                    let dst = stream.alloc_zeros::<u8>(chunks * 64).unwrap();
                    let one = stream.clone_htod(&[r as u8; 64]).unwrap();
                    let sink = stream.alloc_zeros::<u8>(64).unwrap();
                    ring_exchange(&mut t, &stream, (r as u32, 2), &one, &sink, 1);
                    stream.synchronize().unwrap();
                    let start = Instant::now();
                    ring_exchange(&mut t, &stream, (r as u32, 2), &src, &dst, 1);
                    stream.synchronize().unwrap();
                    let us = start.elapsed().as_secs_f64() * 1e6;
                    assert!(stream.clone_dtoh(&dst).unwrap() == pattern(1 - r, chunks * 64));
                    drop(t);
                    us
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let us = elapsed.iter().copied().fold(0.0, f64::max);
    println!(
        "gpu-check: flag_chunk_us {:.3} (2 ranks, {chunks} chunks of 64 B each way)",
        us / chunks as f64
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_rank_that_never_enqueues_is_named_and_the_streams_released() {
    let streams = streams(3);
    let shape = FlagShape::new(2, 4096).unwrap();
    let timeout = Duration::from_millis(500);
    let mut ends = CudaFlagChannels::group(streams.clone(), shape, timeout, u64::MAX)
        .unwrap_or_else(|e| panic!("{e}"));
    let absent = ends.pop().unwrap();
    let channels = Arc::clone(absent.lane().channels());
    let bytes = 64 << 10;
    let start = Instant::now();
    let bufs: Vec<(CudaSlice<u8>, CudaSlice<u8>)> = (0..2)
        .map(|r| {
            (
                streams[r].clone_htod(&pattern(r, bytes)).unwrap(),
                streams[r].alloc_zeros::<u8>(bytes).unwrap(),
            )
        })
        .collect();
    let desc = CallDesc::new(Collective::AllGather, DType::U8, 1, ReduceOp::Sum, 0);
    for (r, t) in ends.iter_mut().enumerate() {
        assert_eq!(t.begin_call(&desc).unwrap_or_else(|e| panic!("{e}")), 0);
        ring_exchange(t, &streams[r], (r as u32, 3), &bufs[r].0, &bufs[r].1, 1);
    }
    while channels.failure().is_none() && start.elapsed() < 10 * timeout {
        std::thread::sleep(Duration::from_millis(5));
    }
    let why = channels
        .failure()
        .expect("the watchdog aborts the group")
        .to_string();
    assert!(why.contains("rank 2 is the one missing"), "{why}");
    assert!(why.contains("rank 2 has begun no call"), "{why}");
    assert!(
        why.contains("is in call #0 (all_gather of u8, count 1)"),
        "{why}"
    );
    for s in &streams[..2] {
        s.synchronize().expect("the abort releases every wait");
    }
    assert!(start.elapsed() < 10 * timeout, "{:?}", start.elapsed());
    // Every later stage of the group fails at once.
    let (src, dst) = &bufs[0];
    let (s, _g1) = src.device_ptr(&streams[0]);
    let (d, _g2) = dst.device_ptr(&streams[0]);
    let t = &mut ends[0];
    t.begin(9);
    // SAFETY: live buffers; nothing is enqueued.
    unsafe {
        t.recv(2, 0, d as *mut u8, bytes).unwrap();
        t.send(1, 0, s as *const u8, bytes).unwrap();
    }
    assert!(t.wait(9).unwrap_err().to_string().contains("aborted"));
    drop(absent);
    println!(
        "gpu-check: flag_abort_ms {:.1} (timeout {} ms)",
        start.elapsed().as_secs_f64() * 1e3,
        timeout.as_millis()
    );
}
