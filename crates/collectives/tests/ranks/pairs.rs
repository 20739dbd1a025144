//! Groups of sends and receives: only the ranks they name take part, a ring driven by one
//! thread does not deadlock, and errors reach the peers at once; groups that mix collectives
//! with sends and receives.

use relaycc_collectives::RankGroup;

use super::*;

/// `n` host ranks whose calls give up after 20 s, so a test that fails does not hang.
fn host_ranks(n: u32) -> Vec<RankComm> {
    let mut ranks = RankComm::host(n).expect("host ranks");
    for r in &mut ranks {
        r.set_timeout(Duration::from_secs(20));
    }
    ranks
}

/// A group mixing a collective and a ring of sends and receives runs as one launch on every
/// rank.
#[test]
fn groups_mix_collectives_and_point_to_point() {
    let ranks = RankComm::host(4).expect("host ranks");
    let res = on_ranks(
        ranks,
        |mut rank| -> Result<(Vec<i32>, Vec<i32>), CollectivesError> {
            let (r, n) = (rank.rank(), rank.ranks());
            let mut sum = vec![r as i32; 10];
            let send = vec![100 + r as i32; 3];
            let mut recv = vec![0i32; 3];
            let mut g = rank.group();
            g.all_reduce_in_place(&mut sum, ReduceOp::Sum)
                .send(&send, (r + 1) % n)
                .recv(&mut recv, (r + n - 1) % n);
            g.launch()?;
            Ok((sum, recv))
        },
    );
    for (r, got) in res.into_iter().enumerate() {
        let (sum, recv) = got.expect("group");
        assert_eq!(sum, vec![6; 10], "rank {r}");
        assert_eq!(recv, vec![100 + ((r + 3) % 4) as i32; 3], "rank {r}");
    }
}

/// Groups of sends and receives take only the ranks they name: ranks 0 and 1 swap, rank 2
/// sends two messages to rank 3 in one group, then 0 and 1 swap again; nobody else calls,
/// and an empty group is done at once.
#[test]
fn a_group_of_sends_and_receives_involves_only_its_peers() {
    let ranks = host_ranks(4);
    let res = on_ranks(ranks, |mut rank| -> Result<Vec<u32>, CollectivesError> {
        let r = rank.rank();
        let mine = [r as u32 * 10, r as u32 * 10 + 1];
        let (mut a, mut b) = ([0u32; 2], [0u32; 2]);
        rank.group().launch()?;
        match r {
            0 | 1 => {
                for (round, seen) in (0u32..).zip(b.iter_mut()) {
                    let peer = 1 - r;
                    let out = mine.map(|v| v + 100 * round);
                    let mut g = rank.group();
                    g.send(&out[..], peer).recv(&mut a[..], peer);
                    g.launch()?;
                    *seen = a[0];
                }
            }
            2 => {
                let mut g = rank.group();
                g.send(&mine[..1], 3).send(&mine[1..], 3);
                g.launch()?;
            }
            _ => {
                let mut g = rank.group();
                g.recv(&mut a[..1], 2).recv(&mut b[..1], 2);
                g.launch()?;
            }
        }
        Ok(vec![a[0], a[1], b[0], b[1]])
    });
    let got: Vec<Vec<u32>> = res.into_iter().map(|r| r.expect("group")).collect();
    assert_eq!(got[0], vec![110, 111, 10, 110]);
    assert_eq!(got[1], vec![100, 101, 0, 100]);
    assert_eq!(got[3][0], 20);
    assert_eq!(got[3][2], 21);
}

/// One thread drives every rank of a ring of sends and receives with `launch_all`: each
/// group arrives at both its pairs before any waits, so the ring completes.
#[test]
fn one_thread_drives_a_ring_of_sends_and_receives() {
    let mut ranks = RankComm::host(5).expect("host ranks");
    let n = ranks.len();
    let sends: Vec<Vec<u64>> = (0..n).map(|r| vec![r as u64 + 1; 7]).collect();
    let mut recvs = vec![vec![0u64; 7]; n];
    for round in 0..3 {
        let groups = ranks
            .iter_mut()
            .zip(&sends)
            .zip(recvs.iter_mut())
            .map(|((rank, s), d)| {
                let r = rank.rank();
                let mut g = rank.group();
                g.send(&s[..], (r + 1) % n)
                    .recv(&mut d[..], (r + n - 1) % n);
                g
            });
        RankGroup::launch_all(groups).expect("ring");
        for (r, d) in recvs.iter().enumerate() {
            assert_eq!(
                d,
                &vec![((r + n - 1) % n) as u64 + 1; 7],
                "round {round}, rank {r}"
            );
        }
    }
}

/// A group's sends to its own rank pair with its receives from itself, in group order, and
/// run on that rank alone: no other rank calls, or only the peer the group also names. A
/// send to itself with no receive fails on that rank, and the group's pair with another
/// rank still delivers.
#[test]
fn sends_to_the_rank_itself_need_no_other_rank() {
    let ranks = host_ranks(3);
    let res = on_ranks(ranks, |mut rank| -> Result<Vec<i64>, CollectivesError> {
        let (x, y) = ([1i64, 2, 3], [4i64, 5]);
        let (mut gx, mut gy) = ([0i64; 3], [0i64; 2]);
        match rank.rank() {
            0 => {
                let mut g = rank.group();
                g.send(&x[..], 0)
                    .recv(&mut gx[..], 0)
                    .send(&y[..], 0)
                    .recv(&mut gy[..], 0);
                g.launch()?;
                // Then one left over, beside a pair with rank 1.
                let mut g = rank.group();
                g.send(&x[..], 0).send(&y[..], 1);
                let err = g.launch().expect_err("a send to itself with no receive");
                assert!(
                    matches!(&err, CollectivesError::RankFailed { source, .. }
                        if matches!(**source, CollectivesError::Unmatched(_))),
                    "{err:?}"
                );
            }
            1 => {
                rank.recv(&mut gy[..], 0)?;
            }
            _ => {}
        }
        Ok(gx.iter().chain(&gy).copied().collect())
    });
    let got: Vec<Vec<i64>> = res.into_iter().map(|r| r.expect("ranks")).collect();
    assert_eq!(got[0], vec![1, 2, 3, 4, 5]);
    assert_eq!(got[1], vec![0, 0, 0, 4, 5]);
}

/// A group that names no other rank fails on its own rank with `BadRank`, and its valid
/// peer fails at once with the reason, not at its timeout; a receive whose sender's group
/// is empty times out naming the sender; a count mismatch fails both ranks.
#[test]
fn pair_group_errors_reach_the_peers() {
    let ranks = host_ranks(3);
    let start = Instant::now();
    let res = on_ranks(ranks, |mut rank| {
        let mut buf = [0u8; 4];
        let me = rank.rank();
        let mut g = rank.group();
        match me {
            0 => g.send(&[1u8; 4][..], 1).send(&[2u8; 4][..], 7),
            1 => g.recv(&mut buf[..], 0),
            _ => &mut g,
        };
        g.launch()
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "a peer waited for its timeout"
    );
    assert!(
        matches!(&res[0], Err(CollectivesError::BadRank { rank: 7, .. })),
        "{:?}",
        res[0]
    );
    assert!(
        matches!(&res[1], Err(e) if e.to_string().contains("rank 0's group with rank 1 failed")),
        "{:?}",
        res[1]
    );
    assert!(res[2].is_ok());

    let mut ranks = RankComm::host(2).expect("host ranks");
    for r in &mut ranks {
        r.set_timeout(Duration::from_millis(300));
    }
    let res = on_ranks(ranks, |mut rank| {
        let mut buf = [0u8; 4];
        let me = rank.rank();
        let mut g = rank.group();
        if me == 1 {
            g.recv(&mut buf[..], 0);
        }
        g.launch()
    });
    assert!(res[0].is_ok());
    assert!(
        matches!(&res[1], Err(CollectivesError::RankTimeout { missing, .. }) if missing == &[0]),
        "{:?}",
        res[1]
    );

    let res = on_ranks(RankComm::host(2).expect("host ranks"), |mut rank| {
        let (three, mut four) = ([5u32; 3], [0u32; 4]);
        let me = rank.rank();
        let mut g = rank.group();
        if me == 0 {
            g.send(&three[..], 1);
        } else {
            g.recv(&mut four[..], 0);
        }
        g.launch()
    });
    for (r, e) in res.iter().enumerate() {
        assert!(
            e.is_err(),
            "rank {r}: a 3-element send matched a 4-element receive"
        );
    }
}

/// One message of a round: from rank `src` to rank `dst`, `len` elements.
#[derive(Debug, Clone, Copy)]
struct Message {
    src: usize,
    dst: usize,
    len: usize,
}

/// Element `i` of message `m` (its position in the round): distinct across messages.
fn payload(m: usize, i: usize) -> u32 {
    (m as u32) << 16 | i as u32
}

/// `n` ranks and a round of up to eight messages between ranks, some from a rank to itself
/// (zero-length ones included), each rank's group in a random order of its sends and
/// receives, and a delay per rank.
fn round_strategy() -> impl Strategy<Value = (usize, Vec<Message>, Vec<u64>, Vec<u64>)> {
    (2usize..=5).prop_flat_map(|n| {
        let message = (0..n, 0..n, 0usize..40).prop_map(move |(src, hop, len)| Message {
            src,
            dst: (src + hop) % n,
            len,
        });
        (
            Just(n),
            proptest::collection::vec(message, 1..=8),
            proptest::collection::vec(any::<u64>(), n),
            proptest::collection::vec(0u64..1500, n),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any round of messages, each rank's sends and receives in one group in any order and
    /// launched after a delay of its own (ranks that neither send nor receive do not call):
    /// every receive gets its message exactly. A pair's messages in one direction match in
    /// the order both ranks list them.
    #[test]
    fn groups_of_sends_and_receives_deliver_every_message(
        (n, messages, orders, delays) in round_strategy()
    ) {
        let ranks = RankComm::host(n as u32).expect("host ranks");
        let errors: Vec<String> = on_ranks(ranks, |mut rank| {
            let r = rank.rank();
            // This rank's operations, in message order, then shuffled by its own random key.
            let mut mine: Vec<(usize, bool)> = messages
                .iter()
                .enumerate()
                .flat_map(|(k, m)| {
                    let sends = (m.src == r).then_some((k, true));
                    let recvs = (m.dst == r).then_some((k, false));
                    sends.into_iter().chain(recvs)
                })
                .collect();
            if mine.is_empty() {
                return None;
            }
            // A stable shuffle keeps each peer's sends, and each peer's receives, in message
            // order: the random key only interleaves the lists of different peers and kinds.
            let key = |&(k, send): &(usize, bool)| {
                let m = messages[k];
                let peer = if send { m.dst } else { m.src };
                (orders[r].rotate_left((peer * 2 + usize::from(send)) as u32) & 0xff, k)
            };
            mine.sort_by_key(key);
            let outs: Vec<Vec<u32>> = messages
                .iter()
                .enumerate()
                .map(|(k, m)| (0..m.len).map(|i| payload(k, i)).collect())
                .collect();
            let mut ins: Vec<Vec<u32>> = messages.iter().map(|m| vec![0; m.len]).collect();
            thread::sleep(Duration::from_micros(delays[r]));
            let mut g = rank.group();
            let mut slots: Vec<Option<&mut Vec<u32>>> = ins.iter_mut().map(Some).collect();
            for &(k, send) in &mine {
                let m = messages[k];
                if send {
                    g.send(&outs[k][..], m.dst);
                } else if let Some(buf) = slots[k].take() {
                    g.recv(&mut buf[..], m.src);
                }
            }
            if let Err(e) = g.launch() {
                return Some(format!("rank {r}: {e}"));
            }
            let wrong = mine
                .iter()
                .find(|&&(k, send)| !send && ins[k] != outs[k]);
            wrong.map(|&(k, _)| format!("rank {r}: message {k} {:?} got {:?}", messages[k], ins[k]))
        })
        .into_iter()
        .flatten()
        .collect();
        prop_assert!(errors.is_empty(), "{errors:?}");
    }
}
