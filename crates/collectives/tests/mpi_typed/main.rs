//! MPI tests of the per-rank collectives of `MpiCommunicator` (its `Collectives` on host
//! slices); run under mpirun by `scripts/test-mpi`:
//!
//! ```text
//! mpirun -n 8 -x RELAYCC_RANKS_PER_NODE=2 mpi_typed [typed|typed-faults|split|groups|typed-stop]
//! ```
//!
//! - `typed`: every collective (all_reduce, reduce, broadcast, all_gather, all_gather_v,
//!   reduce_scatter, all_to_all, all_to_all_v, gather, scatter, send/recv) for every element
//!   type MPI has (f32, f64, i8, u8, i32, u32, i64, u64), out of place and, where there is an
//!   in-place form, in place, with every reduce op (avg on floating types), at a small count,
//!   and for f32 and u8 at counts past the rendezvous limit that do not split evenly; each output must equal, byte for byte, what the MPI library's own
//!   collective gives for the same inputs (avg: MPI's sum divided by the rank count); the
//!   same in zero-copy mode for two types, and from `SharedHostBuffer`s (70 rounds of
//!   all_to_all from fresh buffers, then all_reduce, all_gather_v and send/recv of a slice at
//!   past 64 KiB per message). A second call of each shape reuses its plan
//!   (the plan cache, given room for every shape of the test, must not grow).
//! - `typed-faults`: one rank passes another count, element type, op, root, or calls the
//!   collectives in another order, or expects another all_to_all_v count: every rank must get
//!   the matching error within the timeout, and a correct call must then still run; a
//!   send/recv pair with different counts fails on both ranks.
//! - `split`: two overlapping sub-communicators (even/odd ranks, and the lower/upper half
//!   numbered in reverse) used in alternation give the right results, and each keeps its
//!   members' virtual nodes; a rank passing no color gets none.
//! - `groups`: groups of sends and receives (`p2p_groups.rs`).
//! - `typed-stop`: the last rank never makes an all_reduce the others make: every other rank
//!   must get `Absent` naming it and the call within the timeout and slack, then `Failed` at
//!   once.
//! - `typed-skip`: after two calls every rank makes, the last rank skips the third (a
//!   broadcast) and waits elsewhere: every other rank must get, within the timeout and the
//!   roll call's grace, the error `rank R: broadcast, call #2 of this communicator: rank(s)
//!   N-1 did not arrive within 2s`, naming the call once; the same through the one front door
//!   (`Collectives` on `MpiGpu::host`, the error as `CollectivesError::Mpi`).
//!
//! Rank 0 prints `PASS <name>` / `FAIL <name>` per check and `<N> passed, <F> failed`.

use std::time::{Duration, Instant};

#[path = "../mpi_common/mod.rs"]
mod mpi_common;
mod p2p_groups;
mod shared_buffers;

use mpi_common::{Report, displs, fill, mpi_err};

use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{MpiCommunicator, MpiError, MpiGpu};
use relaycc_collectives::{Collectives, CollectivesError, Element, PlanCacheLimits, ReduceOp};
use rsmpi::collective::SystemOperation;
use rsmpi::datatype::{Equivalence, Partition, PartitionMut};
use rsmpi::topology::SimpleCommunicator;
use rsmpi::traits::*;

fn zeros<T: Element>(len: usize) -> Vec<T> {
    vec![T::from_i64(0); len]
}

fn bytes<T: Element>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn system(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Prod => SystemOperation::product(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

/// MPI's result for `op` made comparable: avg is MPI's sum divided by `n` in the type.
fn finish<T: Element>(mut v: Vec<T>, op: ReduceOp, n: u32) -> Vec<T> {
    if op == ReduceOp::Avg {
        for x in &mut v {
            *x = avg_of(*x, n);
        }
    }
    v
}

/// `x / n` in the element type (floating types only reach here).
fn avg_of<T: Element>(x: T, n: u32) -> T {
    let any: &dyn std::any::Any = &x;
    let out: Box<dyn std::any::Any> = if let Some(v) = any.downcast_ref::<f32>() {
        Box::new(*v / n as f32)
    } else if let Some(v) = any.downcast_ref::<f64>() {
        Box::new(*v / f64::from(n))
    } else {
        Box::new(x)
    };
    out.downcast::<T>().map_or(x, |b| *b)
}

/// Every typed collective for element type `T` at `c` elements per rank.
fn typed<T: Element + Equivalence>(
    mut comm: &MpiCommunicator,
    rep: &mut Report,
    name: &str,
    c: usize,
) {
    let world = comm.comm();
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let nu = n as usize;
    let float = T::DTYPE.is_float();
    let ops: Vec<ReduceOp> = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ]
    .into_iter()
    .filter(|o| float || *o != ReduceOp::Avg)
    .collect();
    let root = n - 1;
    let rootp = world.process_at_rank(root as i32);
    let is_root = me == root;
    let input: Vec<T> = fill(me, c);
    let tag = |what: &str| format!("{what} {name} x{c}");
    for &op in &ops {
        // all_reduce, out of place and in place.
        let mut want = zeros::<T>(c);
        world.all_reduce_into(&input[..], &mut want[..], system(op));
        let want = finish(want, op, n);
        let mut got = zeros::<T>(c);
        let r = comm.all_reduce(&input, &mut got, op);
        let mut inplace = input.clone();
        let r2 = comm.all_reduce_in_place(&mut inplace, op);
        rep.check(
            &tag(&format!("all_reduce {op:?}")),
            r.is_ok()
                && r2.is_ok()
                && bytes(&got) == bytes(&want)
                && bytes(&inplace) == bytes(&want),
        );
        // reduce to the last rank.
        let mut want = zeros::<T>(if is_root { c } else { 0 });
        if is_root {
            rootp.reduce_into_root(&input[..], &mut want[..], system(op));
        } else {
            rootp.reduce_into(&input[..], system(op));
        }
        let want = finish(want, op, n);
        let mut got = zeros::<T>(if is_root { c } else { 0 });
        let r = comm.reduce(&input, Some(&mut got), root as usize, op);
        rep.check(
            &tag(&format!("reduce {op:?}")),
            r.is_ok() && bytes(&got) == bytes(&want),
        );
        // reduce_scatter (block).
        let big: Vec<T> = fill(me, c * nu);
        let mut want = zeros::<T>(c);
        world.reduce_scatter_block_into(&big[..], &mut want[..], system(op));
        let want = finish(want, op, n);
        let mut got = zeros::<T>(c);
        let r = comm.reduce_scatter(&big, &mut got, op);
        rep.check(
            &tag(&format!("reduce_scatter {op:?}")),
            r.is_ok() && bytes(&got) == bytes(&want),
        );
    }
    // broadcast (in place, as MPI_Bcast).
    let mut want = if is_root { input.clone() } else { zeros(c) };
    rootp.broadcast_into(&mut want[..]);
    let mut got = if is_root { input.clone() } else { zeros(c) };
    let r = comm.broadcast_in_place(&mut got, root as usize);
    // Out of place: the root's input is a buffer of its own.
    let mut apart = zeros::<T>(c);
    let r2 = comm.broadcast(Some(&input).filter(|_| is_root), &mut apart, root as usize);
    rep.check(
        &tag("broadcast"),
        r.is_ok() && r2.is_ok() && bytes(&got) == bytes(&want) && bytes(&apart) == bytes(&want),
    );
    // all_gather, out of place and in place.
    let mut want = zeros::<T>(c * nu);
    world.all_gather_into(&input[..], &mut want[..]);
    let mut got = zeros::<T>(c * nu);
    let r = comm.all_gather(&input, &mut got);
    let mut inplace = zeros::<T>(c * nu);
    inplace[me as usize * c..(me as usize + 1) * c].copy_from_slice(&input);
    let r2 = comm.all_gather_in_place(&mut inplace);
    rep.check(
        &tag("all_gather"),
        r.is_ok() && r2.is_ok() && bytes(&got) == bytes(&want) && bytes(&inplace) == bytes(&want),
    );
    // all_gather_v with uneven counts, one of them zero.
    let counts: Vec<usize> = (0..nu)
        .map(|r| (r * 37 + c) % 11 * (c / 4 + 1) % (c + 1))
        .collect();
    let counts_i: Vec<i32> = counts.iter().map(|x| *x as i32).collect();
    let d = displs(&counts_i);
    let total: usize = counts.iter().sum();
    let mine: Vec<T> = fill(me, counts[me as usize]);
    let mut want = zeros::<T>(total);
    {
        let mut part = PartitionMut::new(&mut want[..], &counts_i[..], &d[..]);
        world.all_gather_varcount_into(&mine[..], &mut part);
    }
    let mut got = zeros::<T>(total);
    let r = comm.all_gather_v(&mine, &mut got, &counts);
    let mut inplace = zeros::<T>(total);
    let at = d[me as usize] as usize;
    inplace[at..at + mine.len()].copy_from_slice(&mine);
    let r2 = comm.all_gather_v_in_place(&mut inplace, &counts);
    rep.check(
        &tag("all_gather_v"),
        r.is_ok() && r2.is_ok() && bytes(&got) == bytes(&want) && bytes(&inplace) == bytes(&want),
    );
    // all_to_all.
    let big: Vec<T> = fill(me, c * nu);
    let mut want = zeros::<T>(c * nu);
    world.all_to_all_into(&big[..], &mut want[..]);
    let mut got = zeros::<T>(c * nu);
    let r = comm.all_to_all(&big, &mut got);
    rep.check(&tag("all_to_all"), r.is_ok() && bytes(&got) == bytes(&want));
    // all_to_all_v: some pairs exchange nothing.
    let pair = |s: usize, d: usize| (s * 7 + d * 3) % 5 * c / 4;
    let sends: Vec<usize> = (0..nu).map(|d| pair(me as usize, d)).collect();
    let recvs: Vec<usize> = (0..nu).map(|s| pair(s, me as usize)).collect();
    let si: Vec<i32> = sends.iter().map(|x| *x as i32).collect();
    let ri: Vec<i32> = recvs.iter().map(|x| *x as i32).collect();
    let (sd, rd) = (displs(&si), displs(&ri));
    let src: Vec<T> = fill(me, sends.iter().sum());
    let mut want = zeros::<T>(recvs.iter().sum());
    {
        let sp = Partition::new(&src[..], &si[..], &sd[..]);
        let mut rp = PartitionMut::new(&mut want[..], &ri[..], &rd[..]);
        world.all_to_all_varcount_into(&sp, &mut rp);
    }
    let mut got = zeros::<T>(recvs.iter().sum());
    let r = comm.all_to_all_v(&src, &sends, &mut got, &recvs);
    rep.check(
        &tag("all_to_all_v"),
        r.is_ok() && bytes(&got) == bytes(&want),
    );
    // gather and scatter to / from the last rank.
    let mut want = zeros::<T>(if is_root { c * nu } else { 0 });
    if is_root {
        rootp.gather_into_root(&input[..], &mut want[..]);
    } else {
        rootp.gather_into(&input[..]);
    }
    let mut got = zeros::<T>(if is_root { c * nu } else { 0 });
    let r = comm.gather(&input, Some(&mut got), root as usize);
    rep.check(&tag("gather"), r.is_ok() && bytes(&got) == bytes(&want));
    let whole: Vec<T> = if is_root {
        fill(me, c * nu)
    } else {
        Vec::new()
    };
    let mut want = zeros::<T>(c);
    if is_root {
        rootp.scatter_into_root(&whole[..], &mut want[..]);
    } else {
        rootp.scatter_into(&mut want[..]);
    }
    let mut got = zeros::<T>(c);
    let r = comm.scatter(Some(&whole), &mut got, root as usize);
    rep.check(&tag("scatter"), r.is_ok() && bytes(&got) == bytes(&want));
    // send/recv around the ring: even ranks send first, odd ranks receive first.
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let mut got = zeros::<T>(c);
    let r = if n == 1 {
        Ok(())
    } else if me % 2 == 0 {
        comm.send(&input, next as usize)
            .and_then(|()| comm.recv(&mut got, prev as usize))
    } else {
        comm.recv(&mut got, prev as usize)
            .and_then(|()| comm.send(&input, next as usize))
    };
    let want: Vec<T> = fill(prev, c);
    rep.check(
        &tag("send/recv ring"),
        n == 1 || (r.is_ok() && bytes(&got) == bytes(&want)),
    );
}

/// Run [`typed`] for every element type at two counts; then again at one, which must hit
/// the plan cache.
fn typed_all(comm: &MpiCommunicator, rep: &mut Report) {
    // Room for every shape this test makes (a few hundred; the default keeps 64), so the last
    // check sees its shapes reused, not replanned at the limit (`mpi_cache` tests the bound).
    let roomy = PlanCacheLimits {
        max_plans: 4096,
        max_scratch_bytes: u64::MAX,
    };
    if let Err(e) = comm.set_plan_cache_limits(roomy) {
        println!("rank {}: plan cache limits: {e}", comm.rank() as u32);
        rep.check("plan cache limits", false);
    }
    typed::<f32>(comm, rep, "f32", 37);
    typed::<f64>(comm, rep, "f64", 37);
    typed::<i8>(comm, rep, "i8", 37);
    typed::<u8>(comm, rep, "u8", 37);
    typed::<i32>(comm, rep, "i32", 37);
    typed::<u32>(comm, rep, "u32", 37);
    typed::<i64>(comm, rep, "i64", 37);
    typed::<u64>(comm, rep, "u64", 37);
    // Messages above Open MPI's eager limit (rendezvous), and counts that do not split evenly.
    typed::<f32>(comm, rep, "f32", 3001);
    typed::<u8>(comm, rep, "u8", 5003);
    // Messages of 64 KiB and more: single copies where the ranks may read each other's
    // memory (`host_transport` says which transport ran).
    if (comm.rank() as u32) == 0 {
        println!("transport: {}", comm.host_transport());
    }
    typed::<f32>(comm, rep, "f32 large", 262_147);
    // Zero copy (messages in the caller's buffers) on a communicator split off this one.
    match comm.split(Some(0), comm.rank() as i32) {
        Ok(Some(mut zc)) => {
            zc.set_zero_copy(true);
            typed::<i64>(&zc, rep, "i64 zero copy", 37);
            typed::<f32>(&zc, rep, "f32 zero copy", 3001);
            typed::<f32>(&zc, rep, "f32 zero copy large", 262_147);
            shared_buffers::shared_buffers(&zc, rep);
        }
        other => {
            println!("rank {}: split: {other:?}", comm.rank() as u32);
            rep.check("zero-copy communicator", false);
        }
    }
    let before = comm.cached_calls();
    typed::<f32>(comm, rep, "f32 again", 37);
    rep.check(
        &format!("plan cache reused ({before} shapes)"),
        comm.cached_calls() == before && before > 0,
    );
}

/// True when `r` is the error `want` names, within `bound` of `t`.
fn expect(
    r: Result<(), CollectivesError>,
    want: &str,
    t: Instant,
    bound: Duration,
    me: u32,
) -> bool {
    let r = mpi_err(r);
    let ok = matches!(
        (&r, want),
        (Err(MpiError::CountMismatch(_)), "count")
            | (Err(MpiError::ElementMismatch(_)), "element")
            | (Err(MpiError::CallMismatch(_)), "call")
    );
    let fast = t.elapsed() <= bound;
    if !ok || !fast {
        println!(
            "rank {me}: expected a {want} mismatch, got {r:?} after {:?}",
            t.elapsed()
        );
    }
    ok && fast
}

fn typed_faults(comm: &mut MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let timeout = Duration::from_secs(5);
    comm.set_timeout(timeout);
    let odd = me == n - 1;
    let c = 64usize;
    let input: Vec<f32> = fill(me, c);
    // Another count on one rank.
    let t = Instant::now();
    let len = if odd { c + 1 } else { c };
    let longer: Vec<f32> = fill(me, len);
    let mut out = zeros::<f32>(len);
    let r = comm.all_reduce(&longer, &mut out, ReduceOp::Sum);
    rep.check("mismatched count", expect(r, "count", t, timeout, me));
    // Another element type (f64 on one rank, f32 on the others).
    let t = Instant::now();
    let r = if odd {
        let i: Vec<f64> = fill(me, c);
        let mut o = zeros::<f64>(c);
        comm.all_reduce(&i, &mut o, ReduceOp::Sum)
    } else {
        let mut o = zeros::<f32>(c);
        comm.all_reduce(&input, &mut o, ReduceOp::Sum)
    };
    rep.check(
        "mismatched element type",
        expect(r, "element", t, timeout, me),
    );
    // Another element size of the same count (u8 against f32).
    let t = Instant::now();
    let r = if odd {
        let i: Vec<u8> = fill(me, c);
        let mut o = zeros::<u8>(c);
        comm.all_reduce(&i, &mut o, ReduceOp::Sum)
    } else {
        let mut o = zeros::<f32>(c);
        comm.all_reduce(&input, &mut o, ReduceOp::Sum)
    };
    rep.check(
        "mismatched element size",
        expect(r, "element", t, timeout, me),
    );
    // Another op.
    let t = Instant::now();
    let op = if odd { ReduceOp::Max } else { ReduceOp::Sum };
    let mut o = zeros::<f32>(c);
    let r = comm.all_reduce(&input, &mut o, op);
    rep.check("mismatched op", expect(r, "call", t, timeout, me));
    // Another root.
    let t = Instant::now();
    let mut b = input.clone();
    let r = comm.broadcast_in_place(&mut b, if odd { 1 } else { 0 });
    rep.check("mismatched root", expect(r, "call", t, timeout, me));
    // Another order: all_gather then all_reduce on one rank, the reverse elsewhere.
    let mut g = zeros::<f32>(c * n as usize);
    let mut o = zeros::<f32>(c);
    let t = Instant::now();
    let (r1, r2) = if odd {
        let a = comm.all_gather(&input, &mut g);
        (a, comm.all_reduce(&input, &mut o, ReduceOp::Sum))
    } else {
        let a = comm.all_reduce(&input, &mut o, ReduceOp::Sum);
        (a, comm.all_gather(&input, &mut g))
    };
    let ok = expect(r1, "call", t, timeout, me) && expect(r2, "call", t, 2 * timeout, me);
    rep.check("collectives in another order", ok);
    // all_to_all_v: rank 0 expects one element more from rank 1 than rank 1 sends.
    let sends = vec![2usize; n as usize];
    let mut recvs = vec![2usize; n as usize];
    if me == 0 && n > 1 {
        recvs[1] = 3;
    }
    let src: Vec<f32> = fill(me, sends.iter().sum());
    let mut dst = zeros::<f32>(recvs.iter().sum());
    let t = Instant::now();
    let r = comm.all_to_all_v(&src, &sends, &mut dst, &recvs);
    rep.check(
        "mismatched all_to_all_v counts",
        expect(r, "count", t, timeout, me),
    );
    // A local error on one rank (avg of integers) is an error everywhere.
    let t = Instant::now();
    let iv: Vec<i32> = fill(me, c);
    let mut io = zeros::<i32>(c);
    let r = comm.all_reduce(
        &iv,
        &mut io,
        if odd { ReduceOp::Avg } else { ReduceOp::Sum },
    );
    let ok = r.is_err() && t.elapsed() <= timeout;
    if !ok {
        println!("rank {me}: local error on one rank: {r:?}");
    }
    rep.check("a local error on one rank fails every rank", ok);
    // send/recv with different counts fails on both ranks.
    if n >= 2 {
        let t = Instant::now();
        let r = match me {
            0 => comm.send(&input, 1),
            1 => {
                let mut o = zeros::<f32>(c + 2);
                comm.recv(&mut o, 0)
            }
            _ => Err(MpiError::CountMismatch("not in the pair".into()).into()),
        };
        rep.check(
            "mismatched send/recv counts",
            expect(r, "count", t, timeout, me),
        );
    }
    // After all that, a correct call runs.
    let mut want = zeros::<f32>(c);
    comm.comm()
        .all_reduce_into(&input[..], &mut want[..], SystemOperation::sum());
    let mut o = zeros::<f32>(c);
    let r = comm.all_reduce(&input, &mut o, ReduceOp::Sum);
    rep.check(
        "a correct call after the mismatches",
        r.is_ok() && bytes(&o) == bytes(&want),
    );
}

fn split(comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let half = n.div_ceil(2);
    let parity = comm.split(Some(me % 2), me as i32);
    let halves = comm.split(Some(me / half), -(me as i32));
    let (Ok(Some(mut a)), Ok(Some(mut b))) = (parity, halves) else {
        rep.check("split", false);
        return;
    };
    let members = |mut sub: &MpiCommunicator| -> Vec<u32> {
        let mut all = vec![0u32; sub.ranks()];
        let r = sub.all_gather(&[me], &mut all);
        if r.is_err() { Vec::new() } else { all }
    };
    let (ma, mb) = (members(&a), members(&b));
    let mut ok = ma.iter().all(|r| r % 2 == me % 2)
        && ma.windows(2).all(|w| w[0] < w[1])
        && mb.iter().all(|r| r / half == me / half)
        && mb.windows(2).all(|w| w[0] > w[1])
        && ma.get(a.rank()) == Some(&me)
        && mb.get(b.rank()) == Some(&me);
    // Virtual nodes: members share a node in the sub-communicator iff they do here.
    for (sub, m) in [(&a, &ma), (&b, &mb)] {
        for (i, x) in m.iter().enumerate() {
            for (j, y) in m.iter().enumerate() {
                let here = comm.node_of()[*x as usize] == comm.node_of()[*y as usize];
                let there = sub.node_of().get(i) == sub.node_of().get(j);
                ok &= here == there;
            }
        }
    }
    rep.check("split members, order and nodes", ok);
    let c = 1000usize;
    for round in 0..3 {
        let input: Vec<i64> = (0..c)
            .map(|i| (me as i64 + 1) * (i as i64 + round))
            .collect();
        let mut sum = zeros::<i64>(c);
        let ra = a.all_reduce(&input, &mut sum, ReduceOp::Sum);
        let want_a: Vec<i64> = (0..c)
            .map(|i| {
                ma.iter()
                    .map(|r| (*r as i64 + 1) * (i as i64 + round))
                    .sum()
            })
            .collect();
        let mut g = zeros::<i64>(c * mb.len());
        let rb = b.all_gather(&input, &mut g);
        let want_b: Vec<i64> = mb
            .iter()
            .flat_map(|r| (0..c).map(move |i| (*r as i64 + 1) * (i as i64 + round)))
            .collect();
        rep.check(
            &format!("split round {round}: all_reduce on parity, all_gather on halves"),
            ra.is_ok() && rb.is_ok() && sum == want_a && g == want_b,
        );
    }
    let none = comm.split(if me == 0 { None } else { Some(0) }, 0);
    let ok = match (&none, me) {
        (Ok(None), 0) => true,
        (Ok(Some(s)), _) => s.ranks() == (n - 1) as usize,
        _ => false,
    };
    rep.check("split with no color", ok);
}

fn typed_stop(world: &SimpleCommunicator, comm: &MpiCommunicator) {
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let timeout = Duration::from_secs(2);
    let Some(mut sub) = sub_with(comm, timeout) else {
        return;
    };
    let input: Vec<f32> = fill(me, 256);
    let mut out = zeros::<f32>(256);
    if me == n - 1 {
        println!("rank {me}: stopping");
        std::thread::sleep(timeout + Duration::from_secs(2));
        // Late: completes the agreement the others left pending; the result does not matter.
        let _ = sub.all_reduce(&input, &mut out, ReduceOp::Sum);
        world.barrier();
        return;
    }
    let t = Instant::now();
    let r = mpi_err(sub.all_reduce(&input, &mut out, ReduceOp::Sum));
    let took = t.elapsed();
    let timed_out = matches!(
        &r,
        Err(MpiError::Absent { step: "all_reduce", call: Some(0), missing, .. })
            if missing == &[n - 1]
    );
    let t = Instant::now();
    let again = mpi_err(sub.all_reduce(&input, &mut out, ReduceOp::Sum));
    let failed = matches!(again, Err(MpiError::Failed(_))) && t.elapsed() < timeout;
    if timed_out && failed && took <= timeout + Duration::from_millis(500) {
        println!("rank {me}: FAULT-DETECTED: all_reduce timed out after {took:?}");
    } else {
        println!("rank {me}: FAULT-MISSED: {r:?} after {took:?}, then {again:?}");
    }
    world.barrier();
}

/// The error text a rank that waited `timeout` at `call` of a communicator must see when
/// the last of `n` ranks skipped it.
fn skipped_text(me: u32, n: u32, call: &str, timeout: Duration) -> String {
    format!(
        "rank {me}: {call}: rank(s) {} did not arrive within {timeout:?}",
        n - 1
    )
}

/// `Some(took)` when `text` is `want`, names `name` once, and came within `bound`.
fn named_once(
    me: u32,
    text: &str,
    (want, name): (&str, &str),
    took: Duration,
    bound: Duration,
) -> Option<Duration> {
    let ok = text == want && text.matches(name).count() == 1 && took <= bound;
    if !ok {
        println!("rank {me}: FAULT-MISSED: {text:?} after {took:?}, want {want:?}");
    }
    ok.then_some(took)
}

/// A sub-communicator of every rank with `timeout`, or `None` (reported).
fn sub_with(comm: &MpiCommunicator, timeout: Duration) -> Option<MpiCommunicator> {
    match comm.split(Some(0), 0) {
        Ok(Some(mut s)) => {
            s.set_timeout(timeout);
            Some(s)
        }
        other => {
            println!(
                "rank {}: FAULT-UNEXPECTED split: {other:?}",
                comm.rank() as u32
            );
            None
        }
    }
}

/// The `typed-skip` mode (module docs): a typed call, a front-door call and a barrier that
/// the last rank skips, each on a communicator of its own.
fn typed_skip(world: &SimpleCommunicator, comm: &MpiCommunicator) {
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let skipper = me == n - 1;
    let timeout = Duration::from_secs(2);
    // The roll call fits in the timeout; slack for an oversubscribed machine.
    let bound = timeout + Duration::from_millis(500);
    let c = 64usize;
    let input: Vec<f32> = fill(me, c);
    let mut sum = zeros::<f32>(c);
    let mut all = zeros::<f32>(c * n as usize);
    let mut took = Vec::new();
    let mut ok = true;
    // A typed call: all_reduce #0 and all_gather #1 by all, broadcast #2 skipped.
    if let Some(mut sub) = sub_with(comm, timeout) {
        let first = sub
            .all_reduce(&input, &mut sum, ReduceOp::Sum)
            .and_then(|()| sub.all_gather(&input, &mut all));
        ok &= first.is_ok();
        if skipper {
            std::thread::sleep(bound);
        } else {
            let t = Instant::now();
            let r = sub.broadcast_in_place(&mut sum, 0);
            let text = r.err().map(|e| e.to_string()).unwrap_or_default();
            let want = skipped_text(me, n, "broadcast, call #2 of this communicator", timeout);
            took.push(named_once(
                me,
                &text,
                (&want, "broadcast"),
                t.elapsed(),
                bound,
            ));
        }
    }
    world.barrier();
    // The one front door: all_reduce #0 by all, all_gather #1 skipped.
    if let Some(sub) = sub_with(comm, timeout) {
        let made = MpiGpu::host(&sub);
        ok &= made.is_ok();
        if let Ok(mut gpu) = made {
            let first = gpu
                .on_host()
                .all_reduce(&input[..], &mut sum[..], ReduceOp::Sum);
            ok &= first.is_ok();
            if skipper {
                std::thread::sleep(bound);
            } else {
                let t = Instant::now();
                let r = gpu.on_host().all_gather(&input[..], &mut all[..]);
                let mpi = matches!(&r, Err(CollectivesError::Mpi(e))
                    if matches!(**e, MpiError::Absent { .. }));
                let text = r.err().map(|e| e.to_string()).unwrap_or_default();
                let want = skipped_text(me, n, "all_gather, call #1 of this communicator", timeout);
                let named = named_once(me, &text, (&want, "all_gather"), t.elapsed(), bound);
                took.push(named.filter(|_| mpi));
            }
        }
    }
    world.barrier();
    // A barrier, which is not a typed call: named by its step.
    if let Some(sub) = sub_with(comm, timeout) {
        if skipper {
            std::thread::sleep(bound);
        } else {
            let t = Instant::now();
            let text = sub
                .barrier()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            let want = skipped_text(me, n, "meet at a barrier", timeout);
            took.push(named_once(
                me,
                &text,
                (&want, "barrier"),
                t.elapsed(),
                bound,
            ));
        }
    }
    if !skipper && ok && took.len() == 3 && took.iter().all(Option::is_some) {
        let took: Vec<Duration> = took.into_iter().flatten().collect();
        println!(
            "rank {me}: FAULT-DETECTED: rank {} named missing at each call, after {took:?}",
            n - 1
        );
    } else if !skipper && !ok {
        println!("rank {me}: FAULT-UNEXPECTED: the calls before the skipped ones failed");
    }
    world.barrier();
}

fn main() {
    let universe = mpi_common::universe();
    let world = universe.world();
    let mode = std::env::args().nth(1).unwrap_or_else(|| "typed".into());
    let mut comm = mpi_common::communicator(&world);
    if mode == "typed-stop" {
        typed_stop(&world, &comm);
        return;
    }
    if mode == "typed-skip" {
        typed_skip(&world, &comm);
        return;
    }
    let mut rep = Report::new(&world);
    match mode.as_str() {
        "typed" => typed_all(&comm, &mut rep),
        "typed-faults" => typed_faults(&mut comm, &mut rep),
        "split" => split(&comm, &mut rep),
        "groups" => p2p_groups::p2p_groups(&mut comm, &mut rep),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
    rep.summary();
}
