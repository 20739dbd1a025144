//! Per-rank calls on 8 host ranks, driven by two threads with `RankGroup::launch_all` (four
//! ranks each), after the plans are cached. Each time is one call of every rank, the slower
//! thread's:
//! - `rank_groups_8_ranks_4x64KiB`: each rank's group is four in-place all_reduces of 64 KiB
//!   of f32, as an engine launches its gradient buckets;
//! - `rank_v_calls_8_ranks_all_gather_v`: one all_gather_v of up to 16,384 f32 per rank,
//!   with the same counts every call (`repeated_counts`) or other counts every call
//!   (`fresh_counts`: 64 count lists in turn, every list under one capacity);
//! - `rank_v_calls_8_ranks_all_to_all_v`: one all_to_all_v of up to 2,048 f32 per pair,
//!   with the same matrix every call (`repeated_matrix`) or another every call
//!   (`fresh_matrix`: 64 matrices in turn, every one under one capacity);
//! - `rank_p2p_ring_8_ranks_64KiB`: each rank's group sends 64 KiB of f32 to the next rank
//!   and receives 64 KiB from the previous one, as a pipeline's stages hand activations on;
//! - `rank_flags_2_ranks_all_reduce`: two ranks on a thread each, one in-place all_reduce of
//!   64 KiB or 4 MiB per call, run directly on each other's memory or over the flag transport
//!   (each rank its own part, its messages through rings of slots).

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use relaycc::{Collectives, RankComm, RankGroup, ReduceOp};

const RANKS: usize = 8;
const THREADS: usize = 2;
const BUCKETS: usize = 4;
const BUCKET_ELEMS: usize = 16 << 10;
const LISTS: usize = 64;
const MOST: usize = 16 << 10;

/// The ranks, dealt to [`THREADS`] threads.
fn shares() -> Option<Vec<Vec<RankComm>>> {
    let ranks = RankComm::host(RANKS as u32).ok()?;
    let mut shares: Vec<Vec<RankComm>> = (0..THREADS).map(|_| Vec::new()).collect();
    for (i, r) in ranks.into_iter().enumerate() {
        shares[i % THREADS].push(r);
    }
    Some(shares)
}

/// `run(mine, state, iters)` on one thread per share, all started together; the slowest
/// thread's time.
fn on_threads<S: Send>(
    shares: &mut [Vec<RankComm>],
    states: &mut [S],
    iters: u64,
    run: impl Fn(&mut [RankComm], &mut S, u64) + Sync,
) -> Duration {
    let start = Barrier::new(shares.len());
    std::thread::scope(|s| {
        let hs: Vec<_> = shares
            .iter_mut()
            .zip(states.iter_mut())
            .map(|(mine, state)| {
                let (start, run) = (&start, &run);
                s.spawn(move || {
                    start.wait();
                    let t = Instant::now();
                    run(mine, state, iters);
                    t.elapsed()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_default())
            .max()
            .unwrap_or_default()
    })
}

fn rank_groups(c: &mut Criterion) {
    let Some(mut shares) = shares() else {
        eprintln!("cannot build {RANKS} host ranks");
        return;
    };
    // Small values keep every sum finite over any number of iterations.
    let mut bufs: Vec<Vec<Vec<Vec<f32>>>> = shares
        .iter()
        .map(|m| vec![vec![vec![0.0; BUCKET_ELEMS]; BUCKETS]; m.len()])
        .collect();
    let mut g = c.benchmark_group("rank_groups_8_ranks_4x64KiB");
    g.throughput(Throughput::Bytes((BUCKETS * BUCKET_ELEMS * 4) as u64));
    g.bench_function("launch_all_2_threads", |b| {
        b.iter_custom(|iters| {
            on_threads(&mut shares, &mut bufs, iters, |mine, bufs, iters| {
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
            })
        })
    });
    g.finish();
}

/// Count list `k`: rank `r` sends between half of [`MOST`] and all of it.
fn counts(k: usize) -> Vec<usize> {
    (0..RANKS)
        .map(|r| MOST / 2 + (k * 7919 + r * 104_729) % (MOST / 2 + 1))
        .collect()
}

fn rank_v_calls(c: &mut Criterion) {
    let Some(mut shares) = shares() else {
        eprintln!("cannot build {RANKS} host ranks");
        return;
    };
    let lists: Vec<Vec<usize>> = (0..LISTS).map(counts).collect();
    let send = vec![1.0f32; MOST];
    let mut recvs: Vec<Vec<Vec<f32>>> = shares
        .iter()
        .map(|m| vec![vec![0.0; RANKS * MOST]; m.len()])
        .collect();
    let mut g = c.benchmark_group("rank_v_calls_8_ranks_all_gather_v");
    for (name, fresh) in [("repeated_counts", false), ("fresh_counts", true)] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                on_threads(&mut shares, &mut recvs, iters, |mine, recv, iters| {
                    for i in 0..iters {
                        let c = &lists[if fresh { i as usize % LISTS } else { 0 }];
                        let total: usize = c.iter().sum();
                        let groups = mine.iter_mut().zip(recv.iter_mut()).map(|(rank, out)| {
                            let own = c[rank.rank()];
                            let mut g = rank.group();
                            g.all_gather_v(&send[..own], &mut out[..total], c);
                            g
                        });
                        if let Err(e) = RankGroup::launch_all(groups) {
                            eprintln!("all_gather_v failed: {e}");
                        }
                    }
                })
            })
        });
    }
    g.finish();
}

/// Count matrix `k`, row by row: rank `s` sends rank `d` between half of [`MOST_PAIR`] and
/// all of it.
fn matrix(k: usize) -> Vec<Vec<usize>> {
    (0..RANKS)
        .map(|s| {
            let at = |d: usize| (k * 7919 + s * 104_729 + d * 1_299_709) % (MOST_PAIR / 2 + 1);
            (0..RANKS).map(|d| MOST_PAIR / 2 + at(d)).collect()
        })
        .collect()
}

/// Elements one rank sends another at most in `rank_v_calls_all_to_all_v`.
const MOST_PAIR: usize = 2 << 10;

fn rank_v_calls_all_to_all_v(c: &mut Criterion) {
    let Some(mut shares) = shares() else {
        eprintln!("cannot build {RANKS} host ranks");
        return;
    };
    let matrices: Vec<Vec<Vec<usize>>> = (0..LISTS).map(matrix).collect();
    let send = vec![1.0f32; RANKS * MOST_PAIR];
    let mut recvs: Vec<Vec<Vec<f32>>> = shares
        .iter()
        .map(|m| vec![vec![0.0; RANKS * MOST_PAIR]; m.len()])
        .collect();
    let mut g = c.benchmark_group("rank_v_calls_8_ranks_all_to_all_v");
    for (name, fresh) in [("repeated_matrix", false), ("fresh_matrix", true)] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                on_threads(&mut shares, &mut recvs, iters, |mine, recv, iters| {
                    let mut column = vec![0; RANKS];
                    for i in 0..iters {
                        let m = &matrices[if fresh { i as usize % LISTS } else { 0 }];
                        let groups = mine.iter_mut().zip(recv.iter_mut()).map(|(rank, out)| {
                            let r = rank.rank();
                            let sent: usize = m[r].iter().sum();
                            for (c, row) in column.iter_mut().zip(m) {
                                *c = row[r];
                            }
                            let got: usize = column.iter().sum();
                            let mut g = rank.group();
                            g.all_to_all_v(&send[..sent], &m[r], &mut out[..got], &column);
                            g
                        });
                        if let Err(e) = RankGroup::launch_all(groups) {
                            eprintln!("all_to_all_v failed: {e}");
                        }
                    }
                })
            })
        });
    }
    g.finish();
}

fn rank_p2p_ring(c: &mut Criterion) {
    let Some(mut shares) = shares() else {
        eprintln!("cannot build {RANKS} host ranks");
        return;
    };
    // Per thread, per rank: what it sends and where it receives.
    let mut bufs: Vec<Vec<(Vec<f32>, Vec<f32>)>> = shares
        .iter()
        .map(|m| vec![(vec![1.0; BUCKET_ELEMS], vec![0.0; BUCKET_ELEMS]); m.len()])
        .collect();
    let mut g = c.benchmark_group("rank_p2p_ring_8_ranks_64KiB");
    g.throughput(Throughput::Bytes((BUCKET_ELEMS * 4) as u64));
    g.bench_function("launch_all_2_threads", |b| {
        b.iter_custom(|iters| {
            on_threads(&mut shares, &mut bufs, iters, |mine, bufs, iters| {
                for _ in 0..iters {
                    let groups = mine.iter_mut().zip(bufs.iter_mut()).map(|(rank, (s, d))| {
                        let r = rank.rank();
                        let mut g = rank.group();
                        g.send(&s[..], (r + 1) % RANKS)
                            .recv(&mut d[..], (r + RANKS - 1) % RANKS);
                        g
                    });
                    if let Err(e) = RankGroup::launch_all(groups) {
                        eprintln!("launch failed: {e}");
                    }
                }
            })
        })
    });
    g.finish();
}

/// Two host ranks, a thread each, one in-place all_reduce of `elems` f32 per call: directly
/// on each other's memory (`RankComm::host`) against over the flag transport
/// (`Communicator::into_flag_ranks`, rings of 2 slots of 256 KiB).
fn rank_flags(c: &mut Criterion) {
    const ELEMS: [usize; 2] = [16 << 10, 1 << 20];
    let shape = match relaycc::collectives::exec::flag_transport::FlagShape::new(2, 256 << 10) {
        Ok(s) => s,
        Err(e) => return eprintln!("{e}"),
    };
    let made = (
        RankComm::host(2),
        relaycc::Communicator::host(2).and_then(|c| c.into_flag_ranks(shape)),
    );
    let (Ok(direct), Ok(flags)) = made else {
        return eprintln!("cannot build 2 host ranks");
    };
    let one_each = |ranks: Vec<RankComm>| ranks.into_iter().map(|r| vec![r]).collect::<Vec<_>>();
    let mut ways = [("direct", one_each(direct)), ("flags", one_each(flags))];
    let mut g = c.benchmark_group("rank_flags_2_ranks_all_reduce");
    for elems in ELEMS {
        g.throughput(Throughput::Bytes((elems * 4) as u64));
        for (name, shares) in &mut ways {
            let mut bufs: Vec<Vec<f32>> = vec![vec![0.0; elems]; 2];
            g.bench_function(format!("{name}_{}KiB", (elems * 4) >> 10), |b| {
                b.iter_custom(|iters| {
                    on_threads(shares, &mut bufs, iters, |mine, buf, iters| {
                        for _ in 0..iters {
                            if let Err(e) = mine[0].all_reduce_in_place(&mut buf[..], ReduceOp::Sum)
                            {
                                eprintln!("all_reduce failed: {e}");
                            }
                        }
                    })
                })
            });
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    rank_groups,
    rank_v_calls,
    rank_v_calls_all_to_all_v,
    rank_p2p_ring,
    rank_flags
);
criterion_main!(benches);
