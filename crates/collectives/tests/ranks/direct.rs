//! Ranks in one host memory run their collectives without a rendezvous: a rank waits only
//! for the ranks whose memory its part touches or that touch its own, one thread drives
//! several ranks with `launch_all`, a group of collectives runs as one call after another,
//! and the v-collectives bind each call's counts, all_to_all_v after agreeing on its matrix.

use std::sync::{Condvar, Mutex};

use relaycc_collectives::RankGroup;

use super::*;

/// A flag one thread raises and others wait for, with a deadline.
#[derive(Default)]
struct Flag {
    up: Mutex<bool>,
    cv: Condvar,
}

impl Flag {
    fn raise(&self) {
        *self.up.lock().expect("flag") = true;
        self.cv.notify_all();
    }

    fn wait(&self, limit: Duration) -> bool {
        let g = self.up.lock().expect("flag");
        let (g, _) = self
            .cv
            .wait_timeout_while(g, limit, |up| !*up)
            .expect("flag");
        *g
    }
}

/// Broadcast from rank 0 on four ranks: rank 3 starts its call only once rank 1 has
/// returned from its own. Rank 1 reads only the root's buffer, so it returns without rank 3;
/// a rendezvous of every rank would hold rank 1 until rank 3 came, and rank 3 would never
/// come.
#[test]
fn a_rank_waits_only_for_the_ranks_its_part_touches() {
    let ranks = RankComm::host(4).expect("host ranks");
    let one_returned = Flag::default();
    let got = on_ranks(ranks, |mut rank| {
        rank.set_timeout(Duration::from_secs(20));
        let r = rank.rank();
        if r == 3 && !one_returned.wait(Duration::from_secs(10)) {
            return Err("rank 1 did not return before rank 3 called".to_string());
        }
        let src: Vec<u32> = (0..1000).map(|i| i * 7 + 1).collect();
        let mut out = vec![0u32; 1000];
        let send = (r == 0).then_some(&src[..]);
        let res = rank.broadcast(send, &mut out[..], 0);
        if r == 1 {
            one_returned.raise();
        }
        res.map_err(|e| format!("rank {r}: {e}"))?;
        if out != src {
            return Err(format!("rank {r}: wrong broadcast"));
        }
        Ok(())
    });
    for (r, g) in got.into_iter().enumerate() {
        g.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

/// One thread drives all four ranks of a communicator through `launch_all`, call after
/// call, in place and not, all_to_all_v with a new matrix every call among them: every
/// rank's part runs, all on that thread.
#[test]
fn one_thread_drives_every_rank_with_launch_all() {
    let mut ranks = RankComm::host(4).expect("host ranks");
    let mut bufs: Vec<Vec<f64>> = (0..4).map(|r| vec![r as f64 + 1.0; 5000]).collect();
    for round in 0..3 {
        let groups = ranks.iter_mut().zip(bufs.iter_mut()).map(|(rank, b)| {
            let mut g = rank.group();
            g.all_reduce_in_place(&mut b[..], ReduceOp::Sum);
            g
        });
        RankGroup::launch_all(groups).expect("all_reduce");
        let want = 10.0 * 4f64.powi(round);
        for (r, b) in bufs.iter().enumerate() {
            assert!(
                b.iter().all(|&x| x == want),
                "round {round}, rank {r}: {}",
                b[0]
            );
        }
    }
    let mut outs: Vec<Vec<f64>> = vec![vec![0.0; 4 * 5000]; 4];
    let groups = ranks
        .iter_mut()
        .zip(bufs.iter())
        .zip(outs.iter_mut())
        .map(|((rank, b), o)| {
            let mut g = rank.group();
            g.all_gather(&b[..], &mut o[..]);
            g
        });
    RankGroup::launch_all(groups).expect("all_gather");
    assert!(outs.iter().all(|o| o.iter().all(|&x| x == 160.0)));
    // all_to_all_v, a new matrix each round: rank s sends rank d (s + 2 d + round) % 5
    // elements of value 10 s + d.
    for round in 0..3 {
        let m: Vec<Vec<usize>> = (0..4)
            .map(|s| (0..4).map(|d| (s + 2 * d + round) % 5).collect())
            .collect();
        let sends: Vec<Vec<f64>> = (0..4)
            .map(|s| {
                (0..4)
                    .flat_map(|d| std::iter::repeat_n((10 * s + d) as f64, m[s][d]))
                    .collect()
            })
            .collect();
        let columns: Vec<Vec<usize>> = (0..4).map(|d| (0..4).map(|s| m[s][d]).collect()).collect();
        let mut recvs: Vec<Vec<f64>> = columns.iter().map(|c| vec![-1.0; c.iter().sum()]).collect();
        let groups = ranks.iter_mut().zip(recvs.iter_mut()).map(|(rank, out)| {
            let r = rank.rank();
            let mut g = rank.group();
            g.all_to_all_v(&sends[r][..], &m[r], &mut out[..], &columns[r]);
            g
        });
        RankGroup::launch_all(groups).expect("all_to_all_v");
        for (d, out) in recvs.iter().enumerate() {
            let want: Vec<f64> = (0..4)
                .flat_map(|s| std::iter::repeat_n((10 * s + d) as f64, m[s][d]))
                .collect();
            assert_eq!(out, &want, "round {round}, rank {d}");
        }
    }
}

/// Two threads each drive one rank of two communicators in one `launch_all`, in opposite
/// orders: a call of one communicator waits for a rank whose thread also drives a call of
/// the other, so neither thread may finish one communicator's calls before it advances the
/// other's.
#[test]
fn one_launch_may_drive_ranks_of_several_communicators() {
    let mut x = RankComm::host(2).expect("host ranks");
    let mut y = RankComm::host(2).expect("host ranks");
    let (x1, y1) = (x.pop().expect("x1"), y.pop().expect("y1"));
    let (x0, y0) = (x.pop().expect("x0"), y.pop().expect("y0"));
    // Each thread adds its x call and its y call to one launch, in the order given.
    let drive = |mut xr: RankComm, mut yr: RankComm, x_first: bool| {
        thread::spawn(move || {
            xr.set_timeout(Duration::from_secs(20));
            yr.set_timeout(Duration::from_secs(20));
            let mut a = vec![xr.rank() as u64 + 1; 100_000];
            let mut b = vec![yr.rank() as u64 + 10; 100_000];
            for _ in 0..5 {
                let mut gx = xr.group();
                gx.all_reduce_in_place(&mut a[..], ReduceOp::Sum);
                let mut gy = yr.group();
                gy.all_reduce_in_place(&mut b[..], ReduceOp::Sum);
                let groups = if x_first { [gx, gy] } else { [gy, gx] };
                RankGroup::launch_all(groups)?;
            }
            Ok::<_, CollectivesError>((a[0], b[0]))
        })
    };
    let started = Instant::now();
    let (t0, t1) = (drive(x0, y0, true), drive(x1, y1, false));
    let r0 = t0.join().expect("thread 0").expect("thread 0's calls");
    let r1 = t1.join().expect("thread 1").expect("thread 1's calls");
    // x: 1 + 2 = 3, doubled four more times; y: 10 + 11 = 21, likewise.
    assert_eq!(r0, (3 << 4, 21 << 4));
    assert_eq!(r1, (3 << 4, 21 << 4));
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// An abort fails the call it comes from and every later one, not earlier calls still under
/// way: rank 1 receives a broadcast (needing only the root), fails its next call with a
/// wrong buffer, and only then rank 2 makes the broadcast. The root and rank 2 finish the
/// broadcast with the right data and fail the next call with rank 1's error.
#[test]
fn an_abort_leaves_earlier_calls_to_finish() {
    let ranks = RankComm::host(3).expect("host ranks");
    let failed = Flag::default();
    let src: Vec<u32> = (0..4096).collect();
    let got = on_ranks(ranks, |mut rank| {
        rank.set_timeout(Duration::from_secs(20));
        let r = rank.rank();
        if r == 2 && !failed.wait(Duration::from_secs(10)) {
            return Err("rank 1 did not fail its second call first".to_string());
        }
        let mut out = vec![0u32; 4096];
        let send = (r == 0).then_some(&src[..]);
        rank.broadcast(send, &mut out[..], 0)
            .map_err(|e| format!("rank {r}: broadcast: {e}"))?;
        if out != src {
            return Err(format!("rank {r}: wrong broadcast"));
        }
        let n = if r == 1 { 7 } else { 8 };
        let next = rank.all_reduce(&[1u32; 8][..], &mut vec![0u32; n][..], ReduceOp::Sum);
        if r == 1 {
            failed.raise();
        }
        match next {
            Err(CollectivesError::RankFailed { source, .. })
                if matches!(*source, CollectivesError::CountMismatch { rank: 1, .. }) =>
            {
                Ok(())
            }
            other => Err(format!("rank {r}: second call: {other:?}")),
        }
    });
    for (r, g) in got.into_iter().enumerate() {
        g.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

/// all_gather_v and reduce_scatter_v run directly: on one communicator, counts that change
/// from call to call, come back, and hold a zero give exact results, in place and not (each
/// rank binds the call's counts to the capacity plan and cuts its part of it); then a rank
/// with other counts fails the call on every rank and aborts the communicator (a meeting
/// would have left it usable).
#[test]
fn v_collectives_run_directly_with_new_counts_every_call() {
    let ranks = RankComm::host(3).expect("host ranks");
    let lists: [[usize; 3]; 5] = [[1, 2, 3], [4, 0, 2], [1, 2, 3], [300, 7, 129], [4, 0, 2]];
    let got = on_ranks(ranks, |mut rank| {
        rank.set_timeout(Duration::from_secs(20));
        let r = rank.rank();
        for (k, counts) in lists.iter().enumerate() {
            let total: usize = counts.iter().sum();
            let at: usize = counts[..r].iter().sum();
            // all_gather_v: rank s sends counts[s] copies of 100 s + k.
            let mine = vec![(100 * r + k) as u64; counts[r]];
            let mut all = vec![0u64; total];
            rank.all_gather_v(&mine[..], &mut all[..], counts)
                .map_err(|e| format!("rank {r}, call {k}: all_gather_v: {e}"))?;
            let want: Vec<u64> = (0..3)
                .flat_map(|s| std::iter::repeat_n((100 * s + k) as u64, counts[s]))
                .collect();
            if all != want {
                return Err(format!("rank {r}, call {k}: wrong all_gather_v"));
            }
            // reduce_scatter_v in place: every rank holds r + 1 everywhere; block b sums 6.
            let mut buf = vec![r as i32 + 1; total];
            rank.reduce_scatter_v_in_place(&mut buf[..], counts, ReduceOp::Sum)
                .map_err(|e| format!("rank {r}, call {k}: reduce_scatter_v: {e}"))?;
            if buf[at..at + counts[r]].iter().any(|&x| x != 6) {
                return Err(format!("rank {r}, call {k}: wrong reduce_scatter_v"));
            }
        }
        let counts = if r == 2 { [1, 1, 2] } else { [1, 1, 1] };
        let total: usize = counts.iter().sum();
        let wrong = rank.all_gather_v(
            &vec![1u8; counts[r]][..],
            &mut vec![0u8; total][..],
            &counts,
        );
        let next = rank.all_reduce_in_place(&mut [1u8; 4][..], ReduceOp::Sum);
        Ok((wrong, next))
    });
    let calls = 2 * lists.len() as u64;
    for (r, g) in got.into_iter().enumerate() {
        let (wrong, next) = g.unwrap_or_else(|e| panic!("{e}"));
        match wrong {
            Err(CollectivesError::RankMismatch { message, .. }) => {
                assert!(message.contains("counts differ"), "rank {r}: {message}")
            }
            Err(CollectivesError::Aborted { cause, .. }) => {
                assert!(
                    cause.to_string().contains("counts differ"),
                    "rank {r}: {cause}"
                )
            }
            other => panic!("rank {r}: the mismatched call gave {other:?}"),
        }
        match next {
            Err(CollectivesError::Aborted { seq, .. }) if seq == calls => {}
            other => panic!("rank {r}: the call after it gave {other:?}"),
        }
    }
}

/// all_to_all_v runs directly: every rank posts its counts, agrees on the matrix from
/// every rank's post, binds it to the capacity plan and runs its part. Matrices that change
/// from call to call, come back and hold zeros give exact results; then counts that do not
/// pair up fail the call on every rank and abort the communicator (a meeting would have
/// left it usable).
#[test]
fn all_to_all_v_runs_directly_with_a_new_matrix_every_call() {
    let ranks = RankComm::host(3).expect("host ranks");
    let matrices: [[[usize; 3]; 3]; 4] = [
        [[1, 2, 3], [4, 0, 2], [0, 0, 5]],
        [[300, 7, 0], [1, 129, 2], [64, 64, 64]],
        [[1, 2, 3], [4, 0, 2], [0, 0, 5]],
        [[0; 3]; 3],
    ];
    let got = on_ranks(ranks, |mut rank| {
        rank.set_timeout(Duration::from_secs(20));
        let r = rank.rank();
        for (k, m) in matrices.iter().enumerate() {
            // Block r -> d holds m[r][d] copies of 100 r + 10 d + k.
            let send: Vec<u32> = (0..3)
                .flat_map(|d| std::iter::repeat_n((100 * r + 10 * d + k) as u32, m[r][d]))
                .collect();
            let recv_counts: Vec<usize> = (0..3).map(|s| m[s][r]).collect();
            let mut out = vec![u32::MAX; recv_counts.iter().sum()];
            rank.all_to_all_v(&send[..], &m[r], &mut out[..], &recv_counts)
                .map_err(|e| format!("rank {r}, call {k}: {e}"))?;
            let want: Vec<u32> = (0..3)
                .flat_map(|s| std::iter::repeat_n((100 * s + 10 * r + k) as u32, m[s][r]))
                .collect();
            if out != want {
                return Err(format!("rank {r}, call {k}: wrong all_to_all_v"));
            }
        }
        // Rank 2 expects two elements from rank 0, which sends it one.
        let recv_counts = if r == 2 { [2, 1, 1] } else { [1, 1, 1] };
        let mut out = vec![0u8; recv_counts.iter().sum()];
        let wrong = rank.all_to_all_v(&[1u8; 3][..], &[1, 1, 1], &mut out[..], &recv_counts);
        let next = rank.all_reduce_in_place(&mut [1u8; 4][..], ReduceOp::Sum);
        Ok((wrong, next))
    });
    let calls = matrices.len() as u64;
    for (r, g) in got.into_iter().enumerate() {
        let (wrong, next) = g.unwrap_or_else(|e| panic!("{e}"));
        match wrong {
            Err(CollectivesError::RankMismatch { message, .. }) => {
                assert!(message.contains("counts differ"), "rank {r}: {message}")
            }
            other => panic!("rank {r}: the mismatched call gave {other:?}"),
        }
        match next {
            Err(CollectivesError::Aborted { seq, .. }) if seq == calls => {}
            other => panic!("rank {r}: the call after it gave {other:?}"),
        }
    }
}

/// An all_to_all_v rank that comes past the others' timeout: they wait for its post to agree
/// on the matrix, time out naming it and the call, and abort the communicator, so its own
/// call fails too and the next call of every rank is `Aborted`.
#[test]
fn an_all_to_all_v_waits_for_every_post_and_times_out_naming_the_missing_rank() {
    let mut ranks = RankComm::host(3).expect("host ranks");
    for r in &mut ranks {
        r.set_timeout(Duration::from_millis(300));
    }
    let started = std::time::Instant::now();
    let res = on_ranks(ranks, |mut rank| {
        if rank.rank() == 2 {
            thread::sleep(Duration::from_millis(900));
        }
        let mut out = [0u32; 3];
        let first = rank.all_to_all_v(&[7u32; 3][..], &[1, 1, 1], &mut out[..], &[1, 1, 1]);
        rank.set_timeout(Duration::from_secs(30));
        let second = rank.all_to_all_v(&[7u32; 3][..], &[1, 1, 1], &mut out[..], &[1, 1, 1]);
        (first, second)
    });
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_rank_2_timed_out(&res, "all_to_all_v");
}

/// A rank whose own arguments fail (a buffer of the wrong length) fails the call on every
/// rank, and the communicator stays aborted: the next call of every rank names the cause.
/// The wrong call comes first on a fresh communicator (its shape checked with the plan), or
/// after a right call of the same shape (its shape's checks kept, the slices checked again).
#[test]
fn a_rank_whose_arguments_fail_aborts_the_communicator() {
    for warm in [false, true] {
        let ranks = RankComm::host(3).expect("host ranks");
        let got = on_ranks(ranks, |mut rank| {
            rank.set_timeout(Duration::from_secs(20));
            let mut calls = 0u64;
            if warm {
                let mut out = [0i32; 8];
                rank.all_reduce(&[1i32; 8][..], &mut out[..], ReduceOp::Sum)
                    .expect("a right call");
                assert_eq!(out, [3; 8]);
                calls += 1;
            }
            let n = if rank.rank() == 1 { 9 } else { 8 };
            let wrong = rank.all_reduce(&[1i32; 8][..], &mut vec![0i32; n][..], ReduceOp::Sum);
            let next = rank.all_reduce_in_place(&mut [1i32; 8][..], ReduceOp::Sum);
            (calls, wrong, next)
        });
        for (r, (calls, wrong, next)) in got.into_iter().enumerate() {
            let e = wrong.expect_err("the wrong call fails");
            assert!(
                e.to_string().contains("rank 1 output"),
                "warm {warm}, rank {r}: {e}"
            );
            match next {
                Err(CollectivesError::Aborted { seq, .. }) if seq == calls => {}
                other => panic!("warm {warm}, rank {r}: {other:?}"),
            }
        }
    }
}

/// One thread's ranks, each with its buffers, through three calls: all_reduce in place,
/// all_gather, broadcast from `root`, launched together one collective at a time, or
/// (`grouped`) as one group of all three per rank. The first wrong element, if any.
fn drive_share(
    mine: &mut [RankComm],
    n: usize,
    count: usize,
    root: usize,
    grouped: bool,
) -> Result<(), String> {
    let mut bufs: Vec<Vec<i64>> = mine
        .iter()
        .map(|r| vec![r.rank() as i64 + 1; count])
        .collect();
    let sends: Vec<Vec<i64>> = mine.iter().map(|r| vec![r.rank() as i64; count]).collect();
    let mut outs: Vec<Vec<i64>> = vec![vec![-1; n * count]; mine.len()];
    let src: Vec<i64> = (0..count as i64).map(|i| 3 * i + 1).collect();
    let mut got: Vec<Vec<i64>> = vec![vec![0; count]; mine.len()];
    type Row<'a> = (
        &'a mut RankComm,
        &'a mut Vec<i64>,
        &'a Vec<i64>,
        &'a mut Vec<i64>,
        &'a mut Vec<i64>,
    );
    let mut rows: Vec<Row<'_>> = mine
        .iter_mut()
        .zip(bufs.iter_mut())
        .zip(sends.iter().zip(outs.iter_mut()))
        .zip(got.iter_mut())
        .map(|(((r, b), (s, o)), g)| (r, b, s, o, g))
        .collect();
    if grouped {
        let groups = rows.iter_mut().map(|(r, b, s, o, g_out)| {
            let send = (r.rank() == root).then_some(&src[..]);
            let mut g = r.group();
            g.all_reduce_in_place(&mut b[..], ReduceOp::Sum)
                .all_gather(&s[..], &mut o[..])
                .broadcast(send, &mut g_out[..], root);
            g
        });
        RankGroup::launch_all(groups).map_err(|e| format!("group: {e}"))?;
    } else {
        let groups = rows.iter_mut().map(|(r, b, ..)| {
            let mut g = r.group();
            g.all_reduce_in_place(&mut b[..], ReduceOp::Sum);
            g
        });
        RankGroup::launch_all(groups).map_err(|e| format!("all_reduce: {e}"))?;
        let groups = rows.iter_mut().map(|(r, _, s, o, _)| {
            let mut g = r.group();
            g.all_gather(&s[..], &mut o[..]);
            g
        });
        RankGroup::launch_all(groups).map_err(|e| format!("all_gather: {e}"))?;
        let groups = rows.iter_mut().map(|(r, .., o)| {
            let send = (r.rank() == root).then_some(&src[..]);
            let mut g = r.group();
            g.broadcast(send, &mut o[..], root);
            g
        });
        RankGroup::launch_all(groups).map_err(|e| format!("broadcast: {e}"))?;
    }
    drop(rows);
    let sum = (n * (n + 1) / 2) as i64;
    if bufs.iter().flatten().any(|&x| x != sum) {
        return Err("all_reduce: wrong sum".into());
    }
    for o in &outs {
        if o.iter().enumerate().any(|(i, &x)| x != (i / count) as i64) {
            return Err("all_gather: a wrong block".into());
        }
    }
    if got.iter().any(|o| *o != src) {
        return Err("broadcast: a wrong copy".into());
    }
    Ok(())
}

/// A group of collectives on ranks of one host memory runs as that many direct calls, one
/// after the other, each with its own number: a count mismatch in a group's second
/// collective fails the group on every rank after its first collective delivered, and
/// aborts the communicator from that second call's number on (a group that met would have
/// one number and leave the communicator usable).
#[test]
fn a_group_of_collectives_runs_as_calls_one_after_another() {
    let ranks = RankComm::host(4).expect("host ranks");
    let got = on_ranks(ranks, |mut rank| {
        rank.set_timeout(Duration::from_secs(20));
        let r = rank.rank();
        let mut a = vec![r as u32 + 1; 1000];
        let mut all = vec![0u32; 4 * 3];
        let mut b = vec![if r == 2 { 7.5f64 } else { 0.0 }; 300];
        let mine = [r as u32; 3];
        let mut g = rank.group();
        g.all_reduce_in_place(&mut a[..], ReduceOp::Sum)
            .all_gather(&mine[..], &mut all[..])
            .broadcast_in_place(&mut b[..], 2);
        g.launch()
            .map_err(|e| format!("rank {r}: first group: {e}"))?;
        let gathered: Vec<u32> = (0..12).map(|i| i / 3).collect();
        if a.iter().any(|&x| x != 10) || all != gathered || b.iter().any(|&x| x != 7.5) {
            return Err(format!("rank {r}: a wrong result in the first group"));
        }
        let mut c = vec![1i64; 64];
        let mut d = vec![1i64; if r == 1 { 63 } else { 64 }];
        let mut g = rank.group();
        g.all_reduce_in_place(&mut c[..], ReduceOp::Sum)
            .all_reduce_in_place(&mut d[..], ReduceOp::Sum);
        let wrong = g.launch();
        let next = rank.all_reduce_in_place(&mut [1u8; 4][..], ReduceOp::Sum);
        Ok((c, wrong, next))
    });
    for (r, g) in got.into_iter().enumerate() {
        let (c, wrong, next) = g.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            c.iter().all(|&x| x == 4),
            "rank {r}: the group's first call"
        );
        match wrong {
            Err(CollectivesError::RankMismatch { message, .. }) => {
                assert!(message.contains("count differs"), "rank {r}: {message}")
            }
            other => panic!("rank {r}: the mismatched group gave {other:?}"),
        }
        match next {
            Err(CollectivesError::Aborted { seq: 4, .. }) => {}
            other => panic!("rank {r}: the call after it gave {other:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Ranks given to threads at random (one thread may drive every rank, or each its own),
    /// each thread launching its ranks' calls together, one collective at a time or as one
    /// group of three per rank: every result is exact.
    #[test]
    fn ranks_driven_by_any_number_of_threads_get_exact_results(
        (n, owner, count, root, grouped) in (2usize..=6).prop_flat_map(|n| {
            (Just(n), proptest::collection::vec(0..n, n), 1usize..3000, 0..n, any::<bool>())
        })
    ) {
        let mut shares: Vec<Vec<RankComm>> = (0..n).map(|_| Vec::new()).collect();
        for rank in RankComm::host(n as u32).expect("host ranks") {
            let t = owner[rank.rank()];
            shares[t].push(rank);
        }
        let errors: Vec<String> = thread::scope(|s| {
            let hs: Vec<_> = shares
                .into_iter()
                .filter(|m| !m.is_empty())
                .map(|mut mine| s.spawn(move || drive_share(&mut mine, n, count, root, grouped)))
                .collect();
            hs.into_iter()
                .filter_map(|h| h.join().expect("driving thread").err())
                .collect()
        });
        prop_assert!(errors.is_empty(), "{errors:?}");
    }
}
