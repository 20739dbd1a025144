//! MPI tests of the node-aware exchange; run under mpirun by `scripts/test-mpi`:
//!
//! ```text
//! mpirun -n 8 -x RELAYCC_RANKS_PER_NODE=2 mpi_exchange \
//!     [correctness|fault-counts|fault-elem|fault-exit|fault-exit-3step|fault-stop|fault-stop-early|
//!      fault-backend]
//! ```
//!
//! - `correctness`: every strategy (and the model's choice) gives exactly `MPI_Alltoallv`'s
//!   result on random sparse patterns (fixed seeds, empty messages, a rank with no
//!   neighbours), run twice per build (persistence); all_gather_v equals `MPI_Allgatherv`.
//! - `correctness` also checks index-list exchanges (`NeighborExchange::from_indices`: random
//!   sparse lists with empty lists, repeated indices and a rank with no neighbours, packed and
//!   with a random placement) against `MPI_Alltoallv` of the hand-packed buffers, for every
//!   strategy.
//! - `correctness` also runs plans from relaycc's planner (`relaycc_route::plan`, members
//!   and host memory only) for ten collectives, reductions included, on a cluster preset
//!   through `MpiCommunicator::execute`, and compares every output with the request's layout;
//!   then all_reduce, all_gather, all_to_all_v, broadcast and reduce_scatter at 1000 elements
//!   (direct plans) and 100000 (rings) through the backend path (`prepare`/`DevicePlan::run`
//!   on the host backend), staged and direct, against the `execute` output and MPI's own
//!   collective; staged runs must make one download per send and one upload per receive
//!   (`HostBackend::transfers`), direct runs none.
//! - `fault-counts`: rank 0 expects one element too many from rank 1 (and, for index lists,
//!   places one too many); every rank must get an error from the build.
//! - `fault-elem`: rank 0 builds with 4-byte elements, the others with 8 (all_to_all_v,
//!   all_gather_v, index lists), and runs a plan of another element type or another count
//!   through `execute`; every rank must get `ElementMismatch` / `PlanMismatch`, and a correct
//!   exchange must still run afterwards (a disagreement fails nothing); MPI error codes are
//!   named by MPI (`error_name`).
//! - `fault-stop`: the last rank stops (sleeps past the others' timeouts) before a Standard
//!   exchange of 64 KiB messages and a direct `DevicePlan` of 16 KiB messages (rendezvous
//!   sends, which Open MPI cannot cancel); every other rank must get `Timeout` from each
//!   within the timeout plus the grace second, then `Failed` at once from a second run and
//!   from a new build, and the job must not abort.
//! - `fault-stop-early`: the last rank stops before an exchange build, an `execute` and a
//!   `prepare` (each on its own communicator); every other rank must get `Absent` naming it
//!   and the collective step of each within the timeout and slack, and the job must not
//!   abort.
//! - `fault-backend`: rank 1's backend fails its downloads during a staged run; rank 1 must
//!   return the backend error, every other rank an error within the bound.
//! - `fault-exit`: the last rank leaves before the exchange runs; every other rank must get a
//!   timeout error within the bound.
//!
//! Rank 0 prints `PASS <name>` / `FAIL <name>` per check and `<N> passed, <F> failed`.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod mpi_common;

use mpi_common::Report;

use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{Choice, MpiCommunicator, MpiError, NeighborExchange, TransferMode};
use relaycc_collectives::{Backend, ByteRegion, HostBackend};
use relaycc_route::Location;
use relaycc_route::nodeaware::Strategy;
use rsmpi::collective::SystemOperation;
use rsmpi::datatype::{Partition, PartitionMut};
use rsmpi::traits::*;

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

fn displs(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

fn choices() -> Vec<(String, Choice)> {
    let mut v: Vec<(String, Choice)> = [
        Strategy::Standard,
        Strategy::ThreeStep,
        Strategy::TwoStep,
        Strategy::SplitMd,
    ]
    .iter()
    .map(|s| (s.name().to_string(), Choice::Forced(*s)))
    .collect();
    v.push(("model".into(), Choice::Model));
    v
}

fn correctness(comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let world = comm.comm();
    let k = comm.node_ranks().len();
    for seed in 0..3u64 {
        // Sparse send counts: about a third of the pairs, some explicitly empty, and the last
        // rank sends nothing at all.
        let mut next = rng(seed * 1000 + me as u64 + 1);
        let send: Vec<u64> = (0..n)
            .map(|_| {
                if me == n - 1 || !next().is_multiple_of(3) {
                    0
                } else {
                    next() % 60
                }
            })
            .collect();
        let mut recv = vec![0u64; n];
        world.all_to_all_into(&send[..], &mut recv[..]);
        let input: Vec<u64> = (0..send.iter().sum::<u64>())
            .map(|i| ((me as u64) << 40) | (seed << 32) | i)
            .collect();
        let sc: Vec<i32> = send.iter().map(|c| *c as i32).collect();
        let rc: Vec<i32> = recv.iter().map(|c| *c as i32).collect();
        let total: u64 = recv.iter().sum();
        let mut expect = vec![0u64; total as usize];
        {
            let sd = displs(&sc);
            let rd = displs(&rc);
            let sp = Partition::new(&input[..], &sc[..], &sd[..]);
            let mut rp = PartitionMut::new(&mut expect[..], &rc[..], &rd[..]);
            world.all_to_all_varcount_into(&sp, &mut rp);
        }
        for (name, choice) in choices() {
            let label = format!("alltoallv n={n} k={k} seed={seed} {name}");
            let ok = match NeighborExchange::all_to_all_v(comm, &send, &recv, 8, choice) {
                Ok(mut ex) => (0..2).all(|_| {
                    let mut out = vec![u64::MAX; total as usize];
                    ex.run(&input, &mut out).is_ok() && out == expect
                }),
                Err(e) => {
                    eprintln!("rank {me}: {label}: {e}");
                    false
                }
            };
            rep.check(&label, ok);
        }
        // all_gather_v against MPI_Allgatherv.
        let mine = if me == n - 1 { 0 } else { next() % 25 };
        let data: Vec<u64> = (0..mine).map(|i| ((me as u64) << 40) | i).collect();
        let mut counts = vec![0i32; n];
        world.all_gather_into(&(mine as i32), &mut counts[..]);
        let total: i32 = counts.iter().sum();
        let mut expect = vec![0u64; total as usize];
        {
            let d = displs(&counts);
            let mut rp = PartitionMut::new(&mut expect[..], &counts[..], &d[..]);
            world.all_gather_varcount_into(&data[..], &mut rp);
        }
        for (name, choice) in choices() {
            let label = format!("allgatherv n={n} k={k} seed={seed} {name}");
            let ok = match NeighborExchange::all_gather_v(comm, mine, 8, choice) {
                Ok(mut ex) => {
                    let mut out = vec![u64::MAX; total as usize];
                    ex.run(&data, &mut out).is_ok() && out == expect
                }
                Err(e) => {
                    eprintln!("rank {me}: {label}: {e}");
                    false
                }
            };
            rep.check(&label, ok);
        }
    }
}

/// Index-list exchanges (`NeighborExchange::from_indices`) against `MPI_Alltoallv` of the
/// hand-packed buffers, for every strategy: random sparse patterns with empty lists and
/// repeated indices, and a last rank with no neighbours at all (it sends and receives
/// nothing); packed and with a random placement; two runs per build.
fn index_lists(comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let world = comm.comm();
    let k = comm.node_ranks().len();
    for seed in 0..3u64 {
        let mut next = rng(seed * 7919 + me as u64 + 11);
        let len = 40 + (me * 13) % 17;
        let x: Vec<u64> = (0..len as u64)
            .map(|i| ((me as u64) << 40) | (seed << 32) | i)
            .collect();
        let lists: Vec<Vec<usize>> = (0..n)
            .map(|d| {
                if me == n - 1 || d == n - 1 || !next().is_multiple_of(3) {
                    return Vec::new();
                }
                // Drawn with replacement (repeats), sometimes empty; plus one sure repeat.
                let mut l: Vec<usize> = (0..next() % 20).map(|_| (next() as usize) % len).collect();
                if let Some(&first) = l.first() {
                    l.push(first);
                }
                l
            })
            .collect();
        let packed: Vec<u64> = lists.iter().flatten().map(|i| x[*i]).collect();
        let sc: Vec<i32> = lists.iter().map(|l| l.len() as i32).collect();
        let mut rc = vec![0i32; n];
        world.all_to_all_into(&sc[..], &mut rc[..]);
        let total = rc.iter().sum::<i32>() as usize;
        let mut expect = vec![0u64; total];
        {
            let (sd, rd) = (displs(&sc), displs(&rc));
            let sp = Partition::new(&packed[..], &sc[..], &sd[..]);
            let mut rp = PartitionMut::new(&mut expect[..], &rc[..], &rd[..]);
            world.all_to_all_varcount_into(&sp, &mut rp);
        }
        // A placement: a random permutation of 0..total + 3, cut per source.
        let mut perm: Vec<usize> = (0..total + 3).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, (next() as usize) % (i + 1));
        }
        let mut places: Vec<Vec<usize>> = Vec::with_capacity(n);
        let mut at = 0;
        for c in &rc {
            places.push(perm[at..at + *c as usize].to_vec());
            at += *c as usize;
        }
        let mut placed = vec![u64::MAX; total + 3];
        for (p, v) in places.iter().flatten().zip(&expect) {
            placed[*p] = *v;
        }
        for (name, choice) in choices() {
            let label = format!("indexed n={n} k={k} seed={seed} {name}");
            let ok = match NeighborExchange::from_indices(comm, &lists, None, 8, choice) {
                Ok(mut ex) => (0..2).all(|_| {
                    let mut out = vec![u64::MAX; ex.received()];
                    ex.run(&x, &mut out).is_ok() && out == expect
                }),
                Err(e) => {
                    eprintln!("rank {me}: {label}: {e}");
                    false
                }
            };
            rep.check(&label, ok);
            let label = format!("indexed+placed n={n} k={k} seed={seed} {name}");
            let ok = match NeighborExchange::from_indices(comm, &lists, Some(&places), 8, choice) {
                Ok(mut ex) => (0..2).all(|_| {
                    let mut out = vec![u64::MAX; total + 3];
                    ex.run(&x, &mut out).is_ok() && out == placed
                }),
                Err(e) => {
                    eprintln!("rank {me}: {label}: {e}");
                    false
                }
            };
            rep.check(&label, ok);
        }
    }
}

fn fault_counts(comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let send: Vec<u64> = (0..n).map(|d| u64::from(d != me) * 3).collect();
    let mut recv = send.clone();
    if me == 0 {
        recv[1] += 1; // expects one element more than rank 1 sends
    }
    let t = Instant::now();
    let r = NeighborExchange::all_to_all_v(comm, &send, &recv, 8, Choice::Model);
    let ok = matches!(r, Err(MpiError::CountMismatch(_)));
    if let Err(e) = &r {
        println!("rank {me}: error after {:?}: {e}", t.elapsed());
    }
    rep.check(&format!("fault-counts n={n}"), ok);
    // Index lists: rank 0 places one element more than rank 1 sends it.
    let lists: Vec<Vec<usize>> = (0..n).map(|d| vec![0; usize::from(d != me) * 3]).collect();
    let mut places: Vec<Vec<usize>> = (0..n)
        .map(|s| (0..usize::from(s != me) * 3).map(|i| s * 3 + i).collect())
        .collect();
    if me == 0 {
        places[1].push(n * 3);
    }
    let r = NeighborExchange::from_indices(comm, &lists, Some(&places), 8, Choice::Model);
    if let Err(e) = &r {
        println!("rank {me}: placement error: {e}");
    }
    rep.check(
        &format!("fault-places n={n}"),
        matches!(r, Err(MpiError::CountMismatch(_))),
    );
}

/// Rank 0 disagrees on the element size of three builds and on the element type and count of
/// two plans; every rank must get the mismatch error, and the communicator must stay usable.
fn fault_elem(
    world: &rsmpi::topology::SimpleCommunicator,
    comm: &MpiCommunicator,
    rep: &mut Report,
) {
    use relaycc_route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let elem = if me == 0 { 4 } else { 8 };
    let mismatch = |r: Result<NeighborExchange, MpiError>, what: &str| {
        if let Err(e) = &r {
            println!("rank {me}: {what}: {e}");
        }
        matches!(r, Err(MpiError::ElementMismatch(_)))
    };
    let send: Vec<u64> = (0..n).map(|d| u64::from(d != me) * 3).collect();
    let r = NeighborExchange::all_to_all_v(comm, &send, &send, elem, Choice::Model);
    rep.check(
        &format!("fault-elem all_to_all_v n={n}"),
        mismatch(r, "all_to_all_v"),
    );
    let r = NeighborExchange::all_gather_v(comm, 3, elem, Choice::Model);
    rep.check(
        &format!("fault-elem all_gather_v n={n}"),
        mismatch(r, "all_gather_v"),
    );
    let lists: Vec<Vec<usize>> = (0..n).map(|d| vec![0; usize::from(d != me) * 3]).collect();
    let r = NeighborExchange::from_indices(comm, &lists, None, elem, Choice::Model);
    rep.check(
        &format!("fault-elem from_indices n={n}"),
        mismatch(r, "from_indices"),
    );
    // execute: rank 0's plan has f32 elements (same size as the others' u32), then one more
    // element per rank.
    let nr = n as u32;
    let setup = relaycc_topo::preset(&format!("cluster:{}xpcie-4gpu:ib-edr", nr.div_ceil(4)))
        .map_err(|e| e.to_string())
        .and_then(|topo| {
            let c = MpiCommunicator::from_mpi(world, me as u32, Some(topo.clone()))
                .map_err(|e| e.to_string())?;
            Ok((topo, c))
        });
    let (topo, pcomm) = match setup {
        Ok(x) => x,
        Err(e) => {
            rep.check(&format!("fault-elem setup: {e}"), false);
            return;
        }
    };
    let opts = PlanOptions {
        relay: RelayPolicy::Members,
        ..PlanOptions::default()
    };
    for (label, dtype, count) in [
        (
            "element type",
            if me == 0 { DType::F32 } else { DType::U32 },
            1000,
        ),
        ("count", DType::U32, if me == 0 { 1001 } else { 1000 }),
    ] {
        let req = Request::new(Collective::AllGather, (0..nr).collect(), count, DType::U32);
        let req = Request { dtype, ..req };
        let ok = match relaycc_route::plan(&topo, &req, &opts) {
            Ok(p) => {
                let input = vec![0u8; req.input_len(me as u32).unwrap_or(0) as usize * 4];
                let mut out = vec![0u8; req.output_len(me as u32).unwrap_or(0) as usize * 4];
                let r = pcomm.execute(&p.plan, &input, &mut out);
                if let Err(e) = &r {
                    println!("rank {me}: execute with another {label}: {e}");
                }
                match label {
                    "count" => matches!(r, Err(MpiError::PlanMismatch(_))),
                    _ => matches!(r, Err(MpiError::ElementMismatch(_))),
                }
            }
            Err(e) => {
                println!("rank {me}: plan: {e}");
                false
            }
        };
        rep.check(&format!("fault-elem execute, another {label} n={n}"), ok);
    }
    // MPI errors are reported by MPI's name for them.
    let name = relaycc_collectives::mpi::error_name(rsmpi::ffi::MPI_ERR_TRUNCATE as i32);
    if me == 0 {
        println!("MPI_ERR_TRUNCATE reads {name:?}");
    }
    rep.check("fault-elem error names", name.contains("TRUNCATE"));
    // A disagreement fails nothing: a correct exchange still runs.
    let ok =
        NeighborExchange::all_to_all_v(comm, &send, &send, 8, Choice::Model).is_ok_and(|mut ex| {
            let input: Vec<u64> = (0..3 * (n as u64 - 1)).collect();
            let mut out = vec![0u64; 3 * (n - 1)];
            ex.run(&input, &mut out).is_ok()
        });
    rep.check(&format!("fault-elem then a correct exchange n={n}"), ok);
}

/// The last rank stops (sleeps, making no MPI call) for the others' timeouts and more, before
/// a Standard exchange of 64 KiB messages and a direct all_to_all plan of 16 KiB messages on
/// the host backend: rendezvous sends to it stay pending after `MPI_Cancel`. Every other rank
/// must get `Timeout` from each within the timeout plus the grace second, and then `Failed`
/// at once from a second run and from a new build.
fn fault_stop(world: &rsmpi::topology::SimpleCommunicator, comm: &mut MpiCommunicator) {
    use relaycc_route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let timeout = Duration::from_secs(3);
    comm.set_timeout(timeout);
    let elems = 8192u64; // 64 KiB of u64 per peer
    let send: Vec<u64> = (0..n).map(|d| u64::from(d != me) * elems).collect();
    let ex =
        NeighborExchange::all_to_all_v(comm, &send, &send, 8, Choice::Forced(Strategy::Standard));
    // After the failure MPI may still hold requests into the plan's memory; the plan's share
    // of the backend, moved to the graveyard, keeps it allocated (see the MPI README, Faults),
    // even though this function drops its own share and the plan right after the failure.
    let backend = Arc::new(HostBackend::new());
    let nr = n as u32;
    let device = relaycc_topo::preset(&format!("cluster:{}xpcie-4gpu:ib-edr", nr.div_ceil(4)))
        .map_err(|e| e.to_string())
        .and_then(|topo| {
            let req = Request::new(Collective::AllToAll, (0..nr).collect(), 4096, DType::U32);
            let opts = PlanOptions {
                relay: RelayPolicy::Members,
                ..PlanOptions::default()
            };
            let plan = relaycc_route::plan(&topo, &req, &opts).map_err(|e| e.to_string())?;
            let mut c = MpiCommunicator::from_mpi(world, me as u32, Some(topo))
                .map_err(|e| e.to_string())?;
            c.set_timeout(timeout);
            c.set_transfer(TransferMode::Direct);
            Ok((c, plan.plan, req))
        });
    let (mut ex, (dcomm, plan, req)) = match (ex, device) {
        (Ok(ex), Ok(d)) => (ex, d),
        (Err(e), _) => {
            println!("rank {me}: FAULT-UNEXPECTED build failed: {e}");
            return;
        }
        (_, Err(e)) => {
            println!("rank {me}: FAULT-UNEXPECTED plan setup failed: {e}");
            return;
        }
    };
    let mut dp = match dcomm.prepare(backend.clone(), &plan) {
        Ok(dp) => dp,
        Err(e) => {
            println!("rank {me}: FAULT-UNEXPECTED prepare failed: {e}");
            return;
        }
    };
    let total = elems as usize * (n - 1);
    if me == n - 1 {
        println!("rank {me}: stopping");
        std::thread::sleep(2 * (timeout + Duration::from_secs(1)) + Duration::from_secs(3));
        return;
    }
    // The timeout, the grace second for cancellation, and slack for an oversubscribed host.
    let bound = timeout + Duration::from_secs(2);
    let mut why = Vec::new();
    let input = vec![me as u64; total];
    let mut out = vec![0u64; total];
    let t = Instant::now();
    let r = ex.run(&input, &mut out);
    let took = t.elapsed();
    if !matches!(r, Err(MpiError::Timeout { .. })) || took > bound {
        why.push(format!("exchange: {r:?} after {took:?} (bound {bound:?})"));
    }
    let t = Instant::now();
    let again = ex.run(&input, &mut out);
    let rebuild = NeighborExchange::all_to_all_v(comm, &send, &send, 8, Choice::Model);
    if !matches!(again, Err(MpiError::Failed(_)))
        || !matches!(rebuild, Err(MpiError::Failed(_)))
        || t.elapsed() > Duration::from_millis(500)
    {
        why.push(format!(
            "after the timeout: run {again:?}, build {:?}, in {:?}",
            rebuild.err(),
            t.elapsed()
        ));
    }
    // The device plan (direct: MPI works in the plan's mirrors and scratch).
    let region = |bytes: u64| {
        backend
            .allocate(Location::Gpu(me as u32), bytes)
            .map(|mem| ByteRegion {
                mem,
                offset: 0,
                bytes,
            })
    };
    let bytes = |len: Result<u64, _>| len.unwrap_or(0) * 4;
    let me32 = me as u32;
    match (
        region(bytes(req.input_len(me32))),
        region(bytes(req.output_len(me32))),
    ) {
        (Ok(inp), Ok(outp)) => {
            let t = Instant::now();
            let r = dp.run(inp, outp);
            let took_dp = t.elapsed();
            println!("rank {me}: device plan returned after {took_dp:?}");
            if !matches!(r, Err(MpiError::Timeout { .. })) || took_dp > bound {
                why.push(format!(
                    "device plan: {r:?} after {took_dp:?} (bound {bound:?})"
                ));
            }
            let again = dp.run(inp, outp);
            if !matches!(again, Err(MpiError::Failed(_))) {
                why.push(format!("device plan after the timeout: {again:?}"));
            }
            backend.free(inp.mem);
            backend.free(outp.mem);
        }
        (a, b) => why.push(format!("allocation: {:?} {:?}", a.err(), b.err())),
    }
    // Safe code may drop the plan and the backend while MPI holds requests into the plan's
    // memory; the graveyard's share of the backend keeps that memory allocated.
    drop(dp);
    drop(backend);
    if why.is_empty() {
        println!("rank {me}: FAULT-DETECTED: exchange timed out in {took:?}, then the device plan");
    } else {
        println!("rank {me}: FAULT-MISSED: {}", why.join("; "));
    }
}

/// The last rank stops (sleeps, making no MPI call) before an exchange build, an `execute`
/// and a `prepare`, each on a communicator of its own: every other rank must get `Absent`
/// naming it from each collective step within the timeout and slack, then `Failed` at once
/// from a second build. The stopper then joins the three steps late, so that the collectives
/// the others left pending complete, and every rank meets in a barrier before finalizing.
fn fault_stop_early(world: &rsmpi::topology::SimpleCommunicator) {
    use relaycc_route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let (me, n) = (world.rank() as u32, world.size() as u32);
    let timeout = Duration::from_secs(2);
    let setup = relaycc_topo::preset(&format!("cluster:{}xpcie-4gpu:ib-edr", n.div_ceil(4)))
        .map_err(|e| e.to_string())
        .and_then(|topo| {
            let req = Request::new(Collective::AllReduce, (0..n).collect(), 256, DType::U32);
            let opts = PlanOptions {
                relay: RelayPolicy::Members,
                ..PlanOptions::default()
            };
            let plan = relaycc_route::plan(&topo, &req, &opts).map_err(|e| e.to_string())?;
            let mut comms = Vec::new();
            for _ in 0..3 {
                let mut c = MpiCommunicator::from_mpi(world, me, Some(topo.clone()))
                    .map_err(|e| e.to_string())?;
                c.set_timeout(timeout);
                comms.push(c);
            }
            Ok((comms, plan.plan))
        });
    let (comms, plan) = match setup {
        Ok(x) => x,
        Err(e) => {
            println!("rank {me}: FAULT-UNEXPECTED setup failed: {e}");
            return;
        }
    };
    let [ex_comm, exec_comm, prep_comm] = &comms[..] else {
        println!("rank {me}: FAULT-UNEXPECTED {} communicators", comms.len());
        return;
    };
    let counts: Vec<u64> = (0..n).map(|d| u64::from(d != me) * 4).collect();
    let input: Vec<u8> = (0..256u32)
        .flat_map(|i| value(me, u64::from(i)).to_le_bytes())
        .collect();
    let mut output = vec![0u8; input.len()];
    let backend = Arc::new(HostBackend::new());
    let build = || NeighborExchange::all_to_all_v(ex_comm, &counts, &counts, 8, Choice::Model);
    if me == n - 1 {
        println!("rank {me}: stopping");
        std::thread::sleep(3 * timeout + Duration::from_secs(2));
        // Late: completes the collectives the others left pending; the results do not matter.
        let _ = build();
        let _ = exec_comm.execute(&plan, &input, &mut output);
        let _ = prep_comm.prepare(backend.clone(), &plan);
        world.barrier();
        return;
    }
    let bound = timeout + Duration::from_millis(1500);
    let mut why = Vec::new();
    let mut timed = |what: &str, r: Result<(), MpiError>, step: &str, took: Duration| {
        let ok = matches!(
            &r,
            Err(MpiError::Absent { step: s, missing, .. }) if *s == step && missing == &[n - 1]
        );
        if !ok || took > bound {
            why.push(format!("{what}: {r:?} after {took:?} (bound {bound:?})"));
        }
    };
    let t = Instant::now();
    let r = build().map(drop);
    timed("exchange build", r, "build an exchange", t.elapsed());
    let t = Instant::now();
    let r = exec_comm.execute(&plan, &input, &mut output);
    timed("execute", r, "execute a plan", t.elapsed());
    let t = Instant::now();
    let r = prep_comm.prepare(backend.clone(), &plan).map(drop);
    timed("prepare", r, "prepare a plan", t.elapsed());
    let t = Instant::now();
    let again = build();
    if !matches!(again, Err(MpiError::Failed(_))) || t.elapsed() > Duration::from_millis(500) {
        why.push(format!(
            "build after the timeout: {:?} in {:?}",
            again.err(),
            t.elapsed()
        ));
    }
    if why.is_empty() {
        println!("rank {me}: FAULT-DETECTED: build, execute and prepare timed out");
    } else {
        println!("rank {me}: FAULT-MISSED: {}", why.join("; "));
    }
    world.barrier();
}

/// Returns true when this rank left early (and must not take part in anything else).
fn fault_exit(comm: &mut MpiCommunicator, strategy: Strategy) -> bool {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    comm.set_timeout(Duration::from_secs(3));
    let send: Vec<u64> = (0..n).map(|d| u64::from(d != me) * 4).collect();
    let ex = NeighborExchange::all_to_all_v(comm, &send, &send, 8, Choice::Forced(strategy));
    let mut ex = match ex {
        Ok(ex) => ex,
        Err(e) => {
            println!("rank {me}: FAULT-UNEXPECTED build failed: {e}");
            return false;
        }
    };
    if me == n - 1 {
        println!("rank {me}: leaving early");
        return true;
    }
    let input = vec![me as u64; 4 * (n - 1)];
    let mut out = vec![0u64; 4 * (n - 1)];
    let t = Instant::now();
    match ex.run(&input, &mut out) {
        Err(e @ MpiError::Timeout { .. }) => {
            println!("rank {me}: FAULT-DETECTED after {:?}: {e}", t.elapsed());
        }
        Err(e) => println!(
            "rank {me}: FAULT-DETECTED (other error) after {:?}: {e}",
            t.elapsed()
        ),
        Ok(()) => println!(
            "rank {me}: FAULT-MISSED: run succeeded without rank {}",
            n - 1
        ),
    }
    false
}

/// Collectives the backend path is tested with.
const BACKEND_COLLECTIVES: [relaycc_route::Collective; 5] = [
    relaycc_route::Collective::AllReduce,
    relaycc_route::Collective::AllGather,
    relaycc_route::Collective::AllToAllV,
    relaycc_route::Collective::Broadcast,
    relaycc_route::Collective::ReduceScatter,
];

/// Planner plans of `collectives` with `count` elements per rank (sums for the reducing
/// ones), run across processes by `execute` (host slices); then those of
/// `BACKEND_COLLECTIVES` through the backend path (`backend_plans`). Small counts give
/// direct plans, large ones rings (several levels, reductions between messages).
fn planner_plans(
    world: &rsmpi::topology::SimpleCommunicator,
    rep: &mut Report,
    count: u64,
    collectives: &[relaycc_route::Collective],
) {
    use relaycc_route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let n = world.size() as u32;
    let me = world.rank() as u32;
    let hosts = n.div_ceil(4).max(1);
    let topo = match relaycc_topo::preset(&format!("cluster:{hosts}xpcie-4gpu:ib-edr")) {
        Ok(t) => t,
        Err(e) => {
            rep.check(&format!("planner plans: topology: {e}"), false);
            return;
        }
    };
    let mut comm = match MpiCommunicator::from_mpi(world, me, Some(topo.clone())) {
        Ok(c) => c,
        Err(e) => {
            rep.check(&format!("planner plans: setup: {e}"), false);
            return;
        }
    };
    let gpus: Vec<u32> = (0..n).collect();
    let opts = PlanOptions {
        relay: RelayPolicy::Members,
        ..PlanOptions::default()
    };
    let mut for_backend = Vec::new();
    for &coll in collectives {
        let mut req = Request::new(coll, gpus.clone(), count, DType::U32).with_root(n - 1);
        req.counts = (0..n as u64).map(|r| (r * 37) % 11).collect();
        if coll == Collective::AllToAllV {
            // Some pairs exchange nothing.
            req.matrix = (0..n as u64)
                .map(|s| {
                    (0..n as u64)
                        .map(|d| (s * 7 + d * 3) % 5 * count / 25)
                        .collect()
                })
                .collect();
        }
        let planned = match relaycc_route::plan(&topo, &req, &opts) {
            Ok(p) => p,
            Err(e) => {
                rep.check(&format!("planner plan {coll}: {e}"), false);
                continue;
            }
        };
        let input: Vec<u8> = (0..req.input_len(me).unwrap_or(0))
            .flat_map(|i| value(me, i).to_le_bytes())
            .collect();
        let out_len = req.output_len(me).unwrap_or(0) as usize;
        let mut output = vec![0u8; out_len * 4];
        let ran = comm.execute(&planned.plan, &input, &mut output);
        let mut ok = ran.is_ok();
        if let Err(e) = &ran {
            println!("rank {me}: {coll} ({}): {e}", planned.plan.algorithm);
        }
        ok = ok && matches_request(&req, me, &output);
        rep.check(
            &format!("planner plan {coll} x{count} ({})", planned.plan.algorithm),
            ok,
        );
        if BACKEND_COLLECTIVES.contains(&coll) {
            for_backend.push((req, planned.plan, input, output));
        }
    }
    backend_plans(&mut comm, rep, &for_backend);
}

/// A `DevicePlan` run on regions its backend did not allocate: handles of another host
/// backend (made in the same order, so ids per backend would name this backend's own
/// blocks) and freed handles. Each case, staged and direct, on a communicator of its own
/// (a failed run fails its communicator): every rank must get the backend's error at once,
/// before any message (well inside the timeout), and the other backend's memory must be
/// unchanged. (A forged backend, which could hand MPI any address, does not compile:
/// `Backend` is sealed.)
fn foreign_handles(world: &rsmpi::topology::SimpleCommunicator, rep: &mut Report) {
    use relaycc_route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let (me, n) = (world.rank() as u32, world.size() as u32);
    let topo = relaycc_topo::preset(&format!("cluster:{}xpcie-4gpu:ib-edr", n.div_ceil(4)))
        .map_err(|e| e.to_string());
    let req = Request::new(Collective::AllReduce, (0..n).collect(), 1000, DType::U32);
    let opts = PlanOptions {
        relay: RelayPolicy::Members,
        ..PlanOptions::default()
    };
    let plan = topo
        .clone()
        .and_then(|t| relaycc_route::plan(&t, &req, &opts).map_err(|e| e.to_string()));
    let (topo, plan) = match (topo, plan) {
        (Ok(t), Ok(p)) => (t, p.plan),
        (Err(e), _) | (_, Err(e)) => {
            rep.check(&format!("foreign handles: setup: {e}"), false);
            return;
        }
    };
    let here = Location::Gpu(me);
    for (label, mode, freed) in [
        (
            "staged, another backend's handles",
            TransferMode::Staged,
            false,
        ),
        (
            "direct, another backend's handles",
            TransferMode::Direct,
            false,
        ),
        ("staged, freed handles", TransferMode::Staged, true),
    ] {
        let ok = (|| -> Result<bool, String> {
            let mut comm = MpiCommunicator::from_mpi(world, me, Some(topo.clone()))
                .map_err(|e| e.to_string())?;
            comm.set_timeout(Duration::from_secs(10));
            comm.set_transfer(mode);
            let backend = Arc::new(HostBackend::new());
            let other = HostBackend::new();
            let mut dp = comm
                .prepare(backend.clone(), &plan)
                .map_err(|e| e.to_string())?;
            let (inb, outb) = (dp.input_bytes(), dp.output_bytes());
            let source: &dyn Backend = if freed { &*backend } else { &other };
            let region = |bytes: u64| -> Result<ByteRegion, String> {
                let mem = source.allocate(here, bytes).map_err(|e| e.to_string())?;
                Ok(ByteRegion {
                    mem,
                    offset: 0,
                    bytes,
                })
            };
            let (inp, out) = (region(inb)?, region(outb)?);
            source
                .upload(inp, &vec![0x5A; inb as usize])
                .map_err(|e| e.to_string())?;
            if freed {
                backend.free(inp.mem);
                backend.free(out.mem);
            }
            let t = Instant::now();
            let r = dp.run(inp, out);
            let quick = t.elapsed() < Duration::from_secs(2);
            if !freed {
                let mut back = vec![0u8; outb as usize];
                other.download(out, &mut back).map_err(|e| e.to_string())?;
                let mut orig = vec![0u8; inb as usize];
                other.download(inp, &mut orig).map_err(|e| e.to_string())?;
                if back.iter().any(|&b| b != 0) || orig.iter().any(|&b| b != 0x5A) {
                    return Err("the other backend's memory changed".into());
                }
            }
            match r {
                Err(MpiError::Backend(e)) if quick => Ok(e.to_string().contains("unknown")),
                other => Err(format!("run gave {other:?} after {:?}", t.elapsed())),
            }
        })();
        match &ok {
            Ok(true) => {}
            Ok(false) => println!("rank {me}: {label}: the error names no unknown allocation"),
            Err(e) => println!("rank {me}: {label}: {e}"),
        }
        rep.check(
            &format!("device plan refuses regions of no allocation of its backend ({label})"),
            matches!(ok, Ok(true)),
        );
    }
}

/// The value of element `i` of rank `rank`'s input.
fn value(rank: u32, i: u64) -> u32 {
    (rank << 24) | (i as u32 & 0x00ff_ffff)
}

/// True when `output` (little-endian u32) holds what `req` asks of rank `me`, sums wrapping as
/// the u32 reduction does.
fn matches_request(req: &relaycc_route::Request, me: u32, output: &[u8]) -> bool {
    for piece in req.expected().unwrap_or_default() {
        if piece.rank != me {
            continue;
        }
        for i in 0..piece.len {
            let at = ((piece.out_offset + i) * 4) as usize;
            let Some(b) = output.get(at..at + 4) else {
                return false;
            };
            let got = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let want = piece.terms.iter().fold(0u32, |acc, (src, off)| {
                acc.wrapping_add(value(*src, off + i))
            });
            if got != want {
                println!(
                    "rank {me}: {} element {}: {got:#x} != {want:#x}",
                    req.collective,
                    piece.out_offset + i
                );
                return false;
            }
        }
    }
    true
}

/// Planner plans through `MpiCommunicator::prepare`/`DevicePlan::run` on the host backend,
/// staged and direct; each output must equal the host-slice `execute` output and, for
/// all_reduce, all_gather and all_to_all_v, MPI's own collective; each run is repeated
/// (staging buffers reused). The backend's transfer counts tell staging apart: staged runs
/// must download every message they send and upload every one they receive, direct runs
/// neither. (A backend from outside the crate, whose addresses the MPI layer must not use,
/// cannot be written: `Backend` is sealed, and its compile-fail doctests test that.)
fn backend_plans(
    comm: &mut MpiCommunicator,
    rep: &mut Report,
    plans: &[(
        relaycc_route::Request,
        relaycc_route::Plan,
        Vec<u8>,
        Vec<u8>,
    )],
) {
    use relaycc_route::Collective;
    let me = comm.rank();
    let n = comm.size() as usize;
    for (req, plan, input, host_out) in plans {
        let coll = req.collective;
        // MPI's own collective on the same input, where MPI has one.
        let words: Vec<u32> = input
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut reference = vec![0u32; host_out.len() / 4];
        let has_reference = match coll {
            Collective::AllReduce => {
                comm.comm()
                    .all_reduce_into(&words[..], &mut reference[..], SystemOperation::sum());
                true
            }
            Collective::AllGather => {
                comm.comm().all_gather_into(&words[..], &mut reference[..]);
                true
            }
            Collective::AllToAllV => {
                let sc: Vec<i32> = req.matrix[me as usize].iter().map(|c| *c as i32).collect();
                let rc: Vec<i32> = (0..n).map(|s| req.matrix[s][me as usize] as i32).collect();
                let (sd, rd) = (displs(&sc), displs(&rc));
                let sp = Partition::new(&words[..], &sc[..], &sd[..]);
                let mut rp = PartitionMut::new(&mut reference[..], &rc[..], &rd[..]);
                comm.comm().all_to_all_varcount_into(&sp, &mut rp);
                true
            }
            _ => false,
        };
        let reference: Vec<u8> = reference.iter().flat_map(|w| w.to_le_bytes()).collect();
        if has_reference {
            rep.check(
                &format!("mpi reference {coll} x{}", req.count),
                reference == *host_out,
            );
        }
        for (label, mode) in [
            ("staged", TransferMode::Staged),
            ("direct", TransferMode::Direct),
        ] {
            comm.set_transfer(mode);
            let backend = Arc::new(HostBackend::new());
            let r = run_on_backend(comm, &backend, plan, input, host_out.len());
            let mine = r.as_ref().map_or(0, |(_, (s, _), _)| *s as u64);
            let (ok, why) = match r {
                Ok((out, (sends, recvs), (down, up))) => {
                    // Two runs each.
                    let staging_ok = match mode {
                        TransferMode::Staged => down == 2 * sends && up == 2 * recvs,
                        TransferMode::Direct => down == 0 && up == 0,
                    };
                    let same = out == *host_out && (!has_reference || out == reference);
                    let why = format!(
                        "sends {sends} recvs {recvs} downloads {down} uploads {up} \
                         same output {same}"
                    );
                    (same && staging_ok, why)
                }
                Err(e) => (false, e.to_string()),
            };
            if !ok {
                println!("rank {me}: backend {coll} {label}: {why}");
            }
            // Not vacuous: some rank sends something.
            let mut msgs = 0u64;
            comm.comm()
                .all_reduce_into(&mine, &mut msgs, SystemOperation::sum());
            rep.check(
                &format!(
                    "backend plan {coll} x{} {label} ({} algorithm, {msgs} messages)",
                    req.count, plan.algorithm
                ),
                ok && msgs > 0,
            );
        }
    }
    comm.set_transfer(TransferMode::Staged);
}

/// Upload `input`, prepare `plan` on `backend`, run it twice, download the output. Returns
/// the output, the messages this rank sends and receives per run, and the backend's
/// downloads and uploads over the two runs.
#[allow(clippy::type_complexity)]
fn run_on_backend(
    comm: &MpiCommunicator,
    backend: &Arc<HostBackend>,
    plan: &relaycc_route::Plan,
    input: &[u8],
    out_bytes: usize,
) -> Result<(Vec<u8>, (usize, usize), (usize, usize)), MpiError> {
    let here = Location::Gpu(comm.device());
    let alloc = |bytes: usize| -> Result<ByteRegion, MpiError> {
        let mem = backend.allocate(here, bytes as u64)?;
        Ok(ByteRegion {
            mem,
            offset: 0,
            bytes: bytes as u64,
        })
    };
    let (inp, out) = (alloc(input.len())?, alloc(out_bytes)?);
    backend.upload(inp, input)?;
    let mut dp = comm.prepare(backend.clone(), plan)?;
    let before = backend.transfers();
    dp.run(inp, out)?;
    dp.run(inp, out)?;
    let after = backend.transfers();
    let counts = (
        (after.downloads - before.downloads) as usize,
        (after.uploads - before.uploads) as usize,
    );
    let messages = dp.messages();
    drop(dp);
    let mut got = vec![0u8; out_bytes];
    backend.download(out, &mut got)?;
    backend.free(inp.mem);
    backend.free(out.mem);
    Ok((got, messages, counts))
}

/// Rank 1's backend fails every download while a staged all_reduce runs: rank 1 must return
/// the backend's error, every other rank an error (a timeout: rank 1's messages never come)
/// within the bound; nobody hangs or panics.
fn fault_backend(world: &rsmpi::topology::SimpleCommunicator) {
    use relaycc_route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let (me, n) = (world.rank() as u32, world.size() as u32);
    let setup = relaycc_topo::preset(&format!("cluster:{}xpcie-4gpu:ib-edr", n.div_ceil(4)))
        .map_err(|e| e.to_string())
        .and_then(|topo| {
            let req = Request::new(Collective::AllReduce, (0..n).collect(), 1000, DType::U32);
            let opts = PlanOptions {
                relay: RelayPolicy::Members,
                ..PlanOptions::default()
            };
            let plan = relaycc_route::plan(&topo, &req, &opts).map_err(|e| e.to_string())?;
            let comm =
                MpiCommunicator::from_mpi(world, me, Some(topo)).map_err(|e| e.to_string())?;
            Ok((comm, plan.plan))
        });
    let (mut comm, plan) = match setup {
        Ok(x) => x,
        Err(e) => {
            println!("rank {me}: FAULT-UNEXPECTED setup failed: {e}");
            return;
        }
    };
    comm.set_timeout(Duration::from_secs(3));
    comm.set_transfer(TransferMode::Staged);
    let backend = Arc::new(if me == 1 {
        HostBackend::with_failing_downloads()
    } else {
        HostBackend::new()
    });
    let input: Vec<u8> = (0..1000u64)
        .flat_map(|i| value(me, i).to_le_bytes())
        .collect();
    let t = Instant::now();
    let r = run_on_backend(&comm, &backend, &plan, &input, 4000);
    match (me, r) {
        (1, Err(e @ MpiError::Backend(_))) => {
            println!("rank {me}: FAULT-SOURCE after {:?}: {e}", t.elapsed())
        }
        (_, Err(e)) if me != 1 => {
            println!("rank {me}: FAULT-DETECTED after {:?}: {e}", t.elapsed())
        }
        (_, Err(e)) => println!("rank {me}: FAULT-MISSED: other error {e}"),
        (_, Ok(_)) => println!("rank {me}: FAULT-MISSED: run succeeded"),
    }
}

fn main() {
    let universe = mpi_common::universe();
    let world = universe.world();
    let mode = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "correctness".into());
    let mut comm = mpi_common::communicator(&world);
    if mode == "fault-stop" {
        fault_stop(&world, &mut comm);
        return;
    }
    if mode == "fault-stop-early" {
        fault_stop_early(&world);
        return;
    }
    if mode == "fault-backend" {
        fault_backend(&world);
        return;
    }
    if mode == "fault-exit" || mode == "fault-exit-3step" {
        let s = if mode == "fault-exit" {
            Strategy::Standard
        } else {
            Strategy::ThreeStep
        };
        // Survivors finalize after their error; the leaver finalizes right away.
        let _ = fault_exit(&mut comm, s);
        return;
    }
    let mut rep = Report::new(comm.comm());
    match mode.as_str() {
        "correctness" => {
            use relaycc_route::Collective;
            correctness(&comm, &mut rep);
            index_lists(&comm, &mut rep);
            let every = [
                Collective::AllGather,
                Collective::AllToAll,
                Collective::Broadcast,
                Collective::Gather,
                Collective::Scatter,
                Collective::AllGatherV,
                Collective::AllToAllV,
                Collective::AllReduce,
                Collective::Reduce,
                Collective::ReduceScatter,
            ];
            planner_plans(&world, &mut rep, 1000, &every);
            planner_plans(&world, &mut rep, 100_000, &BACKEND_COLLECTIVES);
            foreign_handles(&world, &mut rep);
        }
        "fault-counts" => fault_counts(&comm, &mut rep),
        "fault-elem" => fault_elem(&world, &comm, &mut rep),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
    rep.summary();
    let f = rep.failed;
    drop(comm);
    drop(universe);
    if f > 0 {
        std::process::exit(1);
    }
}
