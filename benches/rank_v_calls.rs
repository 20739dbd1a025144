//! Per-rank all_gather_v on 8 host ranks, driven by two threads with `RankGroup::launch_all`
//! (four ranks each), after the capacity plan is cached: with the same counts every call
//! (`repeated_counts`) and with other counts every call (`fresh_counts`: 64 count lists in
//! turn, up to 16,384 f32 per rank, every list under one capacity). The time is one call of
//! every rank, the slower thread's.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use relaycc::{Collectives, RankComm, RankGroup};

const RANKS: usize = 8;
const THREADS: usize = 2;
const LISTS: usize = 64;
const MOST: usize = 16 << 10;

/// Count list `k`: rank `r` sends between half of [`MOST`] and all of it.
fn counts(k: usize) -> Vec<usize> {
    (0..RANKS)
        .map(|r| MOST / 2 + (k * 7919 + r * 104_729) % (MOST / 2 + 1))
        .collect()
}

/// `iters` calls of every rank of `mine`, with count list `k(i)` at call `i`, after `start`
/// lets every thread go; the time they took on this thread.
fn drive(
    mine: &mut [RankComm],
    lists: &[Vec<usize>],
    fresh: bool,
    iters: u64,
    start: &Barrier,
) -> Duration {
    let send = vec![1.0f32; MOST];
    let mut recv: Vec<Vec<f32>> = vec![vec![0.0; RANKS * MOST]; mine.len()];
    start.wait();
    let t = Instant::now();
    for i in 0..iters {
        let c = &lists[if fresh { i as usize % LISTS } else { 0 }];
        let groups = mine.iter_mut().zip(recv.iter_mut()).map(|(rank, out)| {
            let total: usize = c.iter().sum();
            let mine = c[rank.rank()];
            let mut g = rank.group();
            g.all_gather_v(&send[..mine], &mut out[..total], c);
            g
        });
        if let Err(e) = RankGroup::launch_all(groups) {
            eprintln!("all_gather_v failed: {e}");
        }
    }
    t.elapsed()
}

fn rank_v_calls(c: &mut Criterion) {
    let Ok(ranks) = RankComm::host(RANKS as u32) else {
        eprintln!("cannot build {RANKS} host ranks");
        return;
    };
    let mut shares: Vec<Vec<RankComm>> = (0..THREADS).map(|_| Vec::new()).collect();
    for (i, r) in ranks.into_iter().enumerate() {
        shares[i % THREADS].push(r);
    }
    let lists: Vec<Vec<usize>> = (0..LISTS).map(counts).collect();
    let mut g = c.benchmark_group("rank_v_calls_8_ranks_all_gather_v");
    for (name, fresh) in [("repeated_counts", false), ("fresh_counts", true)] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Barrier::new(THREADS);
                std::thread::scope(|s| {
                    let hs: Vec<_> = shares
                        .iter_mut()
                        .map(|mine| {
                            let (start, lists) = (&start, &lists);
                            s.spawn(move || drive(mine, lists, fresh, iters, start))
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().unwrap_or_default())
                        .max()
                        .unwrap_or_default()
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, rank_v_calls);
criterion_main!(benches);
