//! A per-rank group of several collectives on 8 host ranks, driven by two threads with
//! `RankGroup::launch_all` (four ranks each), after the plans are cached: each rank's group
//! is four in-place all_reduces of 64 KiB of f32, as an engine launches its gradient buckets.
//! The time is one launch of every rank's group, the slower thread's.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use relaycc::{Collectives, RankComm, RankGroup, ReduceOp};

const RANKS: u32 = 8;
const THREADS: usize = 2;
const BUCKETS: usize = 4;
const ELEMS: usize = 16 << 10;

/// `iters` launches of every group of `mine`, after `start` lets every thread go; the time
/// they took on this thread.
fn drive(
    mine: &mut [RankComm],
    bufs: &mut [Vec<Vec<f32>>],
    iters: u64,
    start: &Barrier,
) -> Duration {
    start.wait();
    let t = Instant::now();
    for _ in 0..iters {
        let groups = mine.iter_mut().zip(bufs.iter_mut()).map(|(rank, buckets)| {
            let mut g = rank.group();
            for b in buckets.iter_mut() {
                g.all_reduce_in_place(&mut b[..], ReduceOp::Sum);
            }
            g
        });
        if let Err(e) = RankGroup::launch_all(groups) {
            eprintln!("launch failed: {e}");
        }
    }
    t.elapsed()
}

fn rank_groups(c: &mut Criterion) {
    let Ok(ranks) = RankComm::host(RANKS) else {
        eprintln!("cannot build {RANKS} host ranks");
        return;
    };
    let mut shares: Vec<Vec<RankComm>> = (0..THREADS).map(|_| Vec::new()).collect();
    for (i, r) in ranks.into_iter().enumerate() {
        shares[i % THREADS].push(r);
    }
    // Small values keep every sum finite over any number of iterations.
    let mut bufs: Vec<Vec<Vec<Vec<f32>>>> = shares
        .iter()
        .map(|m| vec![vec![vec![0.0; ELEMS]; BUCKETS]; m.len()])
        .collect();
    let mut g = c.benchmark_group("rank_groups_8_ranks_4x64KiB");
    g.throughput(Throughput::Bytes((BUCKETS * ELEMS * 4) as u64));
    g.bench_function("launch_all_2_threads", |b| {
        b.iter_custom(|iters| {
            let start = Barrier::new(THREADS);
            std::thread::scope(|s| {
                let hs: Vec<_> = shares
                    .iter_mut()
                    .zip(bufs.iter_mut())
                    .map(|(mine, bufs)| {
                        let start = &start;
                        s.spawn(move || drive(mine, bufs, iters, start))
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_default())
                    .max()
                    .unwrap_or_default()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, rank_groups);
criterion_main!(benches);
