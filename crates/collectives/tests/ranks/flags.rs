//! Per-rank calls over the flag transport (`Communicator::into_flag_ranks`): the reference
//! cases of `main.rs` on 1 to 5 ranks arriving in random order, on a host's memory and on a
//! machine's GPUs emulated by the host backend; a rank that returns before its peers call;
//! a mismatched call and a rank that stops calling, named; split communicators at once;
//! more call shapes than a rank keeps; several ranks driven from one thread.

use std::sync::{Arc, Barrier};

use relaycc_collectives::exec::flag_transport::FlagShape;
use relaycc_collectives::{Communicator, HostBackend};

use super::*;

/// `n` ranks over flags of `shape`: on `host-n`, or on the first `n` GPUs of a DGX-1 V100
/// (rings, trees and relays among them, each rank's memory its own) emulated on the host.
fn flag_ranks(n: usize, shape: FlagShape, gpus: bool) -> Vec<RankComm> {
    let comm = if gpus {
        let topo = relaycc_topo::preset("dgx1-v100").expect("preset");
        let devices: Vec<u32> = (0..n as u32).collect();
        Communicator::new(topo, &devices, &[], Arc::new(HostBackend::new())).expect("comm")
    } else {
        Communicator::host(n as u32).expect("host")
    };
    comm.into_flag_ranks(shape).expect("flag ranks")
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Three calls in a row (any collective, type, op, in place or not; the v-collectives
    /// meet), each rank arriving after a delay of its own, on rings of 1 to 3 slots of 64 B
    /// to 64 KiB: every output is exact.
    #[test]
    fn calls_over_flags_match_the_reference(
        (calls, delays) in (1usize..=5).prop_flat_map(|n| {
            (
                proptest::collection::vec(case_on(n), 3),
                proptest::collection::vec(0u64..1500, 3 * n),
            )
        }),
        slots in 1u32..4,
        slot_bytes in prop::sample::select(vec![64usize, 1024, 1 << 16]),
        gpus in any::<bool>(),
    ) {
        let n = calls[0].n;
        let shape = FlagShape::new(slots, slot_bytes).expect("shape");
        let errors: Vec<String> = on_ranks(flag_ranks(n, shape, gpus), |mut rank| {
            let r = rank.rank();
            for (k, c) in calls.iter().enumerate() {
                thread::sleep(Duration::from_micros(delays[k * n + r]));
                if let Err(e) = call_and_compare(c, &mut rank) {
                    return Some(format!("call {k} ({c:?}): {e}"));
                }
            }
            None
        })
        .into_iter()
        .flatten()
        .collect();
        prop_assert!(errors.is_empty(), "{errors:?}");
    }
}

/// A broadcast's root runs its own part, puts its input into its peers' rings, and returns
/// before any peer has called: no rank meets another (over a meeting the root would wait
/// for the others, which here wait for it, until the timeout).
#[test]
fn a_root_returns_before_its_peers_call() {
    let shape = FlagShape::new(4, 4096).expect("shape");
    let root_done = Barrier::new(3);
    let got = on_ranks(flag_ranks(3, shape, true), |mut rank| {
        rank.set_timeout(Duration::from_secs(20));
        let mut buf = vec![rank.rank() as u32 + 7; 1000];
        if rank.rank() == 1 {
            rank.broadcast_in_place(&mut buf[..], 1).expect("root");
            root_done.wait();
        } else {
            root_done.wait();
            rank.broadcast_in_place(&mut buf[..], 1).expect("peer");
        }
        buf
    });
    for (r, b) in got.iter().enumerate() {
        assert!(b.iter().all(|&v| v == 8), "rank {r}");
    }
}

/// A rank whose op differs fails the call on every rank, which names the call and the op;
/// the ranks' later calls fail with the same words.
#[test]
fn a_mismatched_call_over_flags_fails_on_every_rank() {
    let shape = FlagShape::new(2, 1024).expect("shape");
    let errs = on_ranks(flag_ranks(3, shape, false), |mut rank| {
        let mut a = vec![1.0f32; 300];
        rank.all_reduce_in_place(&mut a[..], ReduceOp::Sum)
            .expect("call #0");
        let op = if rank.rank() == 2 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        let first = rank.all_reduce_in_place(&mut a[..], op);
        let later = rank.all_reduce_in_place(&mut a[..], ReduceOp::Sum);
        (
            first.map_err(|e| e.to_string()),
            later.map_err(|e| e.to_string()),
        )
    });
    for (r, (first, later)) in errs.iter().enumerate() {
        for e in [first, later] {
            let e = e.as_ref().expect_err("fails");
            assert!(e.contains("call #1: the op differs"), "rank {r}: {e}");
            assert!(
                e.contains("rank 2 calls all_reduce of f32, op max"),
                "rank {r}: {e}"
            );
        }
    }
}

/// A rank that stops calling is named with its last call by every other rank, within about
/// one timeout.
#[test]
fn a_rank_that_stops_calling_over_flags_is_named() {
    let shape = FlagShape::new(2, 1024).expect("shape");
    let start = Instant::now();
    let errs = on_ranks(flag_ranks(4, shape, true), |mut rank| {
        rank.set_timeout(Duration::from_millis(400));
        let mut a = vec![1u64; 500];
        rank.all_reduce_in_place(&mut a[..], ReduceOp::Sum)
            .expect("call #0");
        if rank.rank() == 3 {
            // Stays away from call #1, then leaves (the others have given up by then).
            thread::sleep(Duration::from_millis(1500));
            return None;
        }
        rank.all_reduce_in_place(&mut a[..], ReduceOp::Sum).err()
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    for (r, e) in errs.iter().take(3).enumerate() {
        let e = e.as_ref().map(|e| e.to_string()).expect("fails");
        assert!(e.contains("rank 3 is the one missing"), "rank {r}: {e}");
        assert!(
            e.contains("rank 3's last call is call #0 (all_reduce of u64, op sum, count 500)"),
            "rank {r}: {e}"
        );
    }
}

/// Two sub-communicators of a split, each over flags of its own, run their calls at once:
/// the even ranks' all_reduce and the odd ranks' all_gather, twenty calls each.
#[test]
fn split_communicators_over_flags_run_at_once() {
    let shape = FlagShape::new(2, 4096).expect("shape");
    let sums = on_ranks(flag_ranks(4, shape, true), |mut rank| {
        let r = rank.rank();
        let mut half = rank
            .split(Some(r as u32 % 2), 0)
            .expect("split")
            .expect("member");
        let mut out = Vec::new();
        for k in 0..20u32 {
            if r % 2 == 0 {
                let mut a = vec![r as u32 + k; 700];
                half.all_reduce_in_place(&mut a[..], ReduceOp::Sum)
                    .expect("even");
                out.push(a[699]);
            } else {
                let mut g = vec![0u32; 2 * 700];
                half.all_gather(&vec![r as u32 + k; 700][..], &mut g[..])
                    .expect("odd");
                out.push(g[0] + g[700]);
            }
        }
        out
    });
    for (r, got) in sums.iter().enumerate() {
        let want: Vec<u32> = (0..20)
            .map(|k| if r % 2 == 0 { 2 + 2 * k } else { 4 + 2 * k })
            .collect();
        assert_eq!(got, &want, "rank {r}");
    }
}

/// Twelve call shapes in turn, twice, more than a rank keeps parts of: evicted parts are cut
/// again and every result stays exact.
#[test]
fn more_shapes_than_a_rank_keeps_parts_of() {
    let shape = FlagShape::new(2, 512).expect("shape");
    let got = on_ranks(flag_ranks(3, shape, true), |mut rank| {
        let mut sums = Vec::new();
        for round in 0..2u64 {
            for count in 1..=12usize {
                let mut a = vec![rank.rank() as u64 + round; count * 37];
                rank.all_reduce_in_place(&mut a[..], ReduceOp::Sum)
                    .expect("all_reduce");
                sums.push((a[0], a.len()));
            }
        }
        sums
    });
    for (r, sums) in got.iter().enumerate() {
        let want: Vec<(u64, usize)> = (0..2u64)
            .flat_map(|round| (1..=12).map(move |c| (3 + 3 * round, c * 37)))
            .collect();
        assert_eq!(sums, &want, "rank {r}");
    }
}

/// Two threads drive four ranks over host flags with `RankGroup::launch_all`, two ranks
/// each, every group two in-place all_reduces: each rank's group runs on a thread of its own
/// within the launch, so no rank waits on a thread busy with another.
#[test]
fn launch_all_drives_several_ranks_over_flags_from_one_thread() {
    use relaycc_collectives::RankGroup;
    let shape = FlagShape::new(2, 1024).expect("shape");
    let mut ranks = flag_ranks(4, shape, true);
    let right = ranks.split_off(2);
    let drive = |mut mine: Vec<RankComm>| {
        thread::spawn(move || {
            let mut bufs: Vec<[Vec<u32>; 2]> = mine
                .iter()
                .map(|r| [vec![r.rank() as u32; 3000], vec![1; 10]])
                .collect();
            for _ in 0..3 {
                let groups = mine.iter_mut().zip(bufs.iter_mut()).map(|(r, [a, b])| {
                    let mut g = r.group();
                    g.all_reduce_in_place(&mut a[..], ReduceOp::Sum);
                    g.all_reduce_in_place(&mut b[..], ReduceOp::Max);
                    g
                });
                RankGroup::launch_all(groups)?;
            }
            Ok::<_, CollectivesError>(
                bufs.iter()
                    .map(|[a, b]| (a[2999], b[9]))
                    .collect::<Vec<_>>(),
            )
        })
    };
    let (a, b) = (drive(ranks), drive(right));
    for got in [a.join().expect("thread"), b.join().expect("thread")] {
        // 0+1+2+3 = 6, then 4 x 6 = 24, then 96.
        assert_eq!(got.expect("launch_all"), vec![(96, 1); 2]);
    }
}

/// A rank whose own buffer is wrong (an all_gather output one element short) fails its call
/// with the reason, and the group's abort fails the peers' call with the same words: no
/// rank waits for its timeout, and every later call fails too.
#[test]
fn a_wrong_buffer_on_one_rank_fails_every_rank_over_flags() {
    let shape = FlagShape::new(2, 1024).expect("shape");
    let start = Instant::now();
    let errs = on_ranks(flag_ranks(3, shape, true), |mut rank| {
        rank.set_timeout(Duration::from_secs(30));
        let short = usize::from(rank.rank() == 1);
        let mut out = vec![0u32; 3 * 500 - short];
        let first = rank.all_gather(&vec![7u32; 500][..], &mut out[..]);
        let later = rank.all_reduce_in_place(&mut [1u32; 4][..], ReduceOp::Sum);
        (
            first.map_err(|e| e.to_string()),
            later.map_err(|e| e.to_string()),
        )
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    for (r, (first, later)) in errs.iter().enumerate() {
        let first = first.as_ref().expect_err("the call fails on every rank");
        assert!(
            first.contains("rank 1") && first.contains("output"),
            "rank {r}: {first}"
        );
        let later = later.as_ref().expect_err("the group is aborted");
        assert!(
            later.contains("aborted") && later.contains("rank 1"),
            "rank {r}: {later}"
        );
    }
}

/// Rings are staging: a group whose ranks would hold more ring memory than the
/// communicator's staging budget fails its call on every rank, naming the budget, instead
/// of allocating past it.
#[test]
fn rings_past_the_staging_budget_fail_every_rank() {
    let shape = FlagShape::new(2, 512 << 10).expect("shape");
    let mut comm = Communicator::host(6).expect("host");
    comm.set_staging_budget(3 << 20);
    let ranks = comm.into_flag_ranks(shape).expect("flag ranks");
    let errs = on_ranks(ranks, |mut rank| {
        rank.set_timeout(Duration::from_secs(30));
        let mut a = vec![1.0f32; 1 << 18];
        rank.all_reduce_in_place(&mut a[..], ReduceOp::Sum)
            .map_err(|e| e.to_string())
    });
    for (r, e) in errs.iter().enumerate() {
        let e = e.as_ref().expect_err("past the budget");
        assert!(
            e.contains("past the budget of 3145728 bytes per rank"),
            "rank {r}: {e}"
        );
    }
}

/// A broadcast's root returns before its peers call; when a peer's call then differs, the
/// root learns of it from `async_error` without calling again, and its next call fails.
#[test]
fn a_rank_that_returned_learns_of_a_later_failure_from_async_error() {
    let shape = FlagShape::new(4, 4096).expect("shape");
    let root_done = Barrier::new(3);
    let failed = Barrier::new(3);
    let got = on_ranks(flag_ranks(3, shape, false), |mut rank| {
        let mut buf = vec![5u32; 100];
        if rank.rank() == 0 {
            rank.broadcast_in_place(&mut buf[..], 0).expect("root");
            assert!(rank.async_error().is_none(), "nothing failed yet");
            root_done.wait();
            failed.wait();
            let seen = rank.async_error().map(|e| e.to_string());
            let next = rank
                .broadcast_in_place(&mut buf[..], 0)
                .err()
                .map(|e| e.to_string());
            (seen, next)
        } else {
            root_done.wait();
            // Rank 2 names another root, and finds it at once: the root's call is posted.
            let root = if rank.rank() == 2 { 1 } else { 0 };
            let e = rank
                .broadcast_in_place(&mut buf[..], root)
                .err()
                .map(|e| e.to_string());
            failed.wait();
            (e, None)
        }
    });
    let (seen, next) = &got[0];
    let seen = seen.as_ref().expect("the root sees the abort");
    assert!(seen.contains("call #0: the root differs"), "{seen}");
    let next = next.as_ref().expect("the root's next call fails");
    assert!(next.contains("the root differs"), "{next}");
    let e = got[2].0.as_ref().expect("rank 2 fails");
    assert!(e.contains("the root differs"), "rank 2: {e}");
    // Rank 1's part needs only the root's input, which may be in its ring before rank 2
    // begins: it returns Ok, or fails with the same words.
    if let Some(e) = &got[1].0 {
        assert!(e.contains("the root differs"), "rank 1: {e}");
    }
}
