//! Groups of sends and receives on MPI host ranks (`groups` mode): rings and all-to-alls in
//! one group each, whatever the order of its operations; groups that name only some ranks;
//! a group meeting lone sends and receives; sends to the rank itself; a mismatched operation
//! failing on both of its ranks while the group's other operations still deliver; groups
//! mixing sends and receives with collectives (as on threads); a group of collectives failing
//! on every rank before any of its sends; random groups; a group whose peer never comes.

use std::time::{Duration, Instant};

use relaycc_collectives::mpi::{MpiCommunicator, MpiError};
use relaycc_collectives::{Collectives, ReduceOp};
use rsmpi::traits::*;

use crate::mpi_common::{Report, fill, mpi_err};
use crate::{bytes, rsmpi, zeros};

/// A ring in one group per rank, at a small count and one past the rendezvous limit (the
/// group's sends cannot all complete before its receives are posted): the receive posted
/// before the send on odd ranks, after it on even ones.
fn ring(mut comm: &MpiCommunicator, rep: &mut Report, c: usize) {
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mut ok = true;
    for round in 0..3u32 {
        let input = fill::<f32>(me + 10 * round, c);
        let mut got = zeros::<f32>(c);
        let mut g = comm.group();
        if me % 2 == 0 {
            g.send(&input, next as usize).recv(&mut got, prev as usize);
        } else {
            g.recv(&mut got, prev as usize).send(&input, next as usize);
        }
        let r = g.launch();
        if let Err(e) = &r {
            println!("rank {me}: ring of {c}, round {round}: {e}");
        }
        ok &= r.is_ok() && bytes(&got) == bytes(&fill::<f32>(prev + 10 * round, c));
    }
    rep.check(
        &format!("group: a ring of {c} f32 in one group, 3 rounds"),
        ok,
    );
}

/// Every rank sends a block of its own to every rank, itself included, and receives one from
/// each, in one group whose operations it posts in an order of its own: the result equals
/// MPI's all-to-all.
fn all_to_all(mut comm: &MpiCommunicator, rep: &mut Report, c: usize) {
    let (me, n) = (comm.rank() as u32, comm.ranks());
    let src = fill::<i64>(me, c * n);
    let mut want = zeros::<i64>(c * n);
    comm.comm().all_to_all_into(&src[..], &mut want[..]);
    let mut got = zeros::<i64>(c * n);
    let mut g = comm.group();
    let mut blocks: Vec<(usize, &mut [i64])> = got.chunks_mut(c).enumerate().collect();
    // Rank r posts its receives from peer r+1 on, then its sends from peer r-1 down.
    blocks.rotate_left((me as usize + 1) % n);
    for (peer, block) in blocks {
        g.recv(block, peer);
    }
    for k in 0..n {
        let peer = (me as usize + n - k) % n;
        g.send(&src[peer * c..(peer + 1) * c], peer);
    }
    let r = g.launch();
    if let Err(e) = &r {
        println!("rank {me}: all-to-all group of {c}: {e}");
    }
    rep.check(
        &format!("group: all-to-all of {c} i64 per pair equals MPI's"),
        r.is_ok() && bytes(&got) == bytes(&want),
    );
}

/// Ranks 0 and 1 swap in groups while the other ranks call nothing; rank 2 sends two
/// messages to rank 3 in one group, which rank 3 takes with two lone receives; an empty
/// group is done at once.
fn some_peers(mut comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let mine = [me * 10, me * 10 + 1];
    let (mut a, mut b) = ([0u32; 2], [0u32; 1]);
    let mut r = comm.group().launch();
    r = r.and_then(|()| match me {
        0 | 1 => {
            let mut g = comm.group();
            g.send(&mine[..], 1 - me as usize)
                .recv(&mut a[..], 1 - me as usize);
            g.launch()
        }
        2 if n > 3 => {
            let mut g = comm.group();
            g.send(&mine[..1], 3).send(&mine[1..], 3);
            g.launch()
        }
        3 => comm
            .recv(&mut a[..1], 2)
            .and_then(|()| comm.recv(&mut b[..], 2)),
        _ => Ok(()),
    });
    let ok = match me {
        0 | 1 => a == [(1 - me) * 10, (1 - me) * 10 + 1],
        3 => a[0] == 20 && b[0] == 21,
        _ => true,
    };
    if let Err(e) = &r {
        println!("rank {me}: groups of some peers: {e}");
    }
    rep.check(
        "group: only the ranks a group names take part; a group meets lone receives",
        r.is_ok() && ok,
    );
}

/// Sends to the rank itself pair with its receives from itself, in group order; a send to
/// itself with no receive fails on its rank, and the group's other operations still move.
fn to_itself(mut comm: &MpiCommunicator, rep: &mut Report) {
    let me = comm.rank();
    let (x, y) = ([1i32, 2, 3], [4i32, 5]);
    let (mut gx, mut gy) = ([0i32; 3], [0i32; 2]);
    let mut g = comm.group();
    g.send(&x[..], me)
        .recv(&mut gx[..], me)
        .send(&y[..], me)
        .recv(&mut gy[..], me);
    let r = g.launch();
    rep.check(
        "group: sends to the rank itself pair with its receives in order",
        r.is_ok() && gx == x && gy == y,
    );
    let mut got = [0i32; 3];
    let mut g = comm.group();
    g.send(&x[..], me).recv(&mut got[..], me).send(&y[..], me);
    let r = mpi_err(g.launch());
    rep.check(
        "group: a send to the rank itself with no receive fails, the others move",
        matches!(r, Err(MpiError::CallMismatch(_))) && got == x,
    );
}

/// Rank 0 sends 3 then 4 elements to rank 1 in one group; rank 1 receives 3 then 5: the
/// first pair delivers, the second fails with a count mismatch on both ranks, well within
/// the timeout.
fn mismatched(comm: &mut MpiCommunicator, rep: &mut Report) {
    let me = comm.rank() as u32;
    let timeout = Duration::from_secs(10);
    comm.set_timeout(timeout);
    let t = Instant::now();
    let data = [7u32, 8, 9, 10];
    let mut first = [0u32; 3];
    let mut second = [0u32; 5];
    let r = match me {
        0 => {
            let mut g = comm.group();
            g.send(&data[..3], 1).send(&data[..], 1);
            mpi_err(g.launch())
        }
        1 => {
            let mut g = comm.group();
            g.recv(&mut first[..], 0).recv(&mut second[..], 0);
            mpi_err(g.launch())
        }
        _ => Err(MpiError::CountMismatch("not in the pair".into())),
    };
    let ok = matches!(r, Err(MpiError::CountMismatch(_)))
        && (me != 1 || first == [7, 8, 9])
        && t.elapsed() < timeout / 2;
    if !ok {
        println!("rank {me}: mismatched group: {r:?} after {:?}", t.elapsed());
    }
    rep.check(
        "group: a mismatched pair fails on both ranks, the other delivers",
        ok,
    );
}

/// Groups mixing collectives with a ring of sends and receives, as the threads' test
/// `groups_mix_collectives_and_point_to_point` makes them: an all_reduce, the ring's two
/// operations (in an order of the rank's own) and an all_gather in one group, 3 rounds, each
/// result equal to MPI's. Then a group whose all_reduce fails on every rank (rank 0 passes a
/// different count): every rank gets the mismatch within the timeout, and its send and
/// receive never post (the next round's ring pairs afresh).
fn mixed(mut comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mut ok = true;
    for round in 0..3u32 {
        let c = [7usize, 70_001, 1][round as usize];
        let input = fill::<f32>(me + 10 * round, c);
        let mut want_sum = zeros::<f32>(c);
        comm.comm().all_reduce_into(
            &input[..],
            &mut want_sum[..],
            rsmpi::collective::SystemOperation::sum(),
        );
        let mut want_all = zeros::<f32>(c * n as usize);
        comm.comm().all_gather_into(&input[..], &mut want_all[..]);
        let (mut sum, mut all, mut got) = (
            zeros::<f32>(c),
            zeros::<f32>(c * n as usize),
            zeros::<f32>(c),
        );
        let mut g = comm.group();
        g.all_reduce(&input[..], &mut sum[..], ReduceOp::Sum);
        if me % 2 == 0 {
            g.send(&input, next as usize).recv(&mut got, prev as usize);
        } else {
            g.recv(&mut got, prev as usize).send(&input, next as usize);
        }
        g.all_gather(&input[..], &mut all[..]);
        let r = g.launch();
        if let Err(e) = &r {
            println!("rank {me}: mixed group of {c}, round {round}: {e}");
        }
        ok &= r.is_ok()
            && bytes(&sum) == bytes(&want_sum)
            && bytes(&all) == bytes(&want_all)
            && bytes(&got) == bytes(&fill::<f32>(prev + 10 * round, c));
    }
    rep.check(
        "group: an all_reduce, a ring's send and receive and an all_gather in one group, 3 rounds, equal MPI's",
        ok,
    );
    let timeout = comm.timeout();
    let t = Instant::now();
    let v = [me as f32; 5];
    let mut sum = [0f32; 5];
    let mut got = [0f32; 4];
    let c = if me == 0 { 5 } else { 4 };
    let mut g = comm.group();
    g.all_reduce(&v[..c], &mut sum[..c], ReduceOp::Sum)
        .send(&v[..4], next as usize)
        .recv(&mut got[..], prev as usize);
    let r = mpi_err(g.launch());
    let failed = matches!(r, Err(MpiError::CountMismatch(_))) && t.elapsed() < timeout / 2;
    if !failed {
        println!(
            "rank {me}: mixed group with a mismatched all_reduce: {r:?} after {:?}",
            t.elapsed()
        );
    }
    rep.check(
        "group: a mismatched collective fails a mixed group on every rank, before its sends",
        failed && got == [0.0; 4],
    );
}

/// A step of a 64-bit linear congruential generator (Knuth's MMIX constants): the same
/// sequence on every rank from the same seed.
fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *x >> 33
}

/// Random groups, 24 rounds: up to 10 messages between random ranks (several between one
/// pair, to itself, of 0 to 40,000 elements), drawn alike on every rank from the round's
/// seed; each rank posts its sends and receives in one group in an order of its own (the
/// messages of one pair and direction keeping theirs, as MPI and NCCL pair them), and a rank
/// the round names nowhere does not call. Every message must arrive exactly.
fn random_groups(mut comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank(), comm.ranks());
    let sizes = [0usize, 1, 17, 3000, 40_000];
    let mut ok = true;
    for round in 0..24u64 {
        let mut draw = round.wrapping_mul(0x9E37_79B9) + 1;
        let messages: Vec<(usize, usize, usize)> = (0..1 + lcg(&mut draw) % 10)
            .map(|_| {
                let src = lcg(&mut draw) as usize % n;
                let dst = lcg(&mut draw) as usize % n;
                (src, dst, sizes[lcg(&mut draw) as usize % sizes.len()])
            })
            .collect();
        // This rank's operations, (message, sending), in a shuffled order.
        let mut mine: Vec<(usize, bool)> = messages
            .iter()
            .enumerate()
            .flat_map(|(m, &(src, dst, _))| {
                [
                    (src == me).then_some((m, true)),
                    (dst == me).then_some((m, false)),
                ]
            })
            .flatten()
            .collect();
        let mut shuffle = draw ^ (me as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
        for i in (1..mine.len()).rev() {
            mine.swap(i, lcg(&mut shuffle) as usize % (i + 1));
        }
        // Within one pair and direction, messages keep their order.
        let key = |&(m, sending): &(usize, bool)| {
            let (src, dst, _) = messages[m];
            (if sending { dst } else { src }, sending)
        };
        for i in 0..mine.len() {
            for j in i + 1..mine.len() {
                if key(&mine[i]) == key(&mine[j]) && mine[i].0 > mine[j].0 {
                    let (a, b) = (mine[i].0, mine[j].0);
                    (mine[i].0, mine[j].0) = (b, a);
                }
            }
        }
        if mine.is_empty() {
            continue;
        }
        let sent: Vec<Vec<i32>> = messages
            .iter()
            .enumerate()
            .map(|(m, &(src, _, c))| fill::<i32>((src * 100 + m) as u32, c))
            .collect();
        let mut got: Vec<Vec<i32>> = messages.iter().map(|&(_, _, c)| zeros(c)).collect();
        let mut slots: Vec<Option<&mut Vec<i32>>> = got.iter_mut().map(Some).collect();
        let mut g = comm.group();
        for &(m, sending) in &mine {
            let (src, dst, _) = messages[m];
            if sending {
                g.send(&sent[m][..], dst);
            } else if let Some(slot) = slots[m].take() {
                g.recv(&mut slot[..], src);
            }
        }
        let r = g.launch();
        if let Err(e) = &r {
            println!("rank {me}: random group, round {round}: {e}");
        }
        ok &= r.is_ok()
            && messages
                .iter()
                .enumerate()
                .all(|(m, &(_, dst, _))| dst != me || got[m] == sent[m]);
    }
    rep.check(
        "group: 24 rounds of random groups deliver every message",
        ok,
    );
}

/// Rank 1 never makes the group rank 0 makes with it: rank 0's group times out within the
/// timeout and a second, naming its step, and the communicator is failed from then on.
/// Last in the mode, as it leaves rank 0's communicator failed.
fn peer_missing(comm: &mut MpiCommunicator, rep: &mut Report) {
    let me = comm.rank();
    let timeout = Duration::from_secs(2);
    comm.set_timeout(timeout);
    let t = Instant::now();
    let (out, mut back) = ([1.5f64; 4], [0f64; 4]);
    let ok = if me == 0 {
        let mut g = comm.group();
        g.send(&out[..], 1).recv(&mut back[..], 1);
        let r = mpi_err(g.launch());
        let took = t.elapsed();
        let then = mpi_err(comm.send(&out[..], 2));
        let ok = matches!(&r, Err(MpiError::Timeout { step, .. }) if step.contains("send/recv"))
            && took < timeout + Duration::from_secs(1)
            && matches!(then, Err(MpiError::Failed(_)));
        if !ok {
            println!("rank 0: group with a missing peer: {r:?} after {took:?}, then {then:?}");
        }
        ok
    } else {
        true
    };
    rep.check(
        "group: a peer that never comes fails the group within the timeout, then the communicator",
        ok,
    );
}

/// The `groups` mode.
pub(crate) fn p2p_groups(comm: &mut MpiCommunicator, rep: &mut Report) {
    if comm.ranks() < 4 {
        rep.check("groups need 4 ranks", false);
        return;
    }
    for c in [5, 70_001] {
        ring(comm, rep, c);
        all_to_all(comm, rep, c);
    }
    some_peers(comm, rep);
    random_groups(comm, rep);
    to_itself(comm, rep);
    mismatched(comm, rep);
    mixed(comm, rep);
    // Groups still pair after the failures.
    ring(comm, rep, 3);
    peer_missing(comm, rep);
}
