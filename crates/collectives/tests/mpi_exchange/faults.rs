//! The fault cases: ranks that disagree on counts or element types, that stop, leave early,
//! or whose backend fails; every other rank must get an error naming the fault, within the
//! bound, and nobody hangs or panics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use relaycc_collectives::Collectives;
use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{Choice, MpiCommunicator, MpiError, NeighborExchange, TransferMode};
use relaycc_collectives::{Backend, ByteRegion, HostBackend};
use relaycc_route::Location;
use relaycc_route::nodeaware::Strategy;
use rsmpi::traits::*;

use crate::mpi_common::Report;
use crate::planned::run_on_backend;
use crate::value;

pub(crate) fn fault_counts(comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank(), comm.ranks());
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
pub(crate) fn fault_elem(
    world: &rsmpi::topology::SimpleCommunicator,
    comm: &MpiCommunicator,
    rep: &mut Report,
) {
    use relaycc_route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let (me, n) = (comm.rank(), comm.ranks());
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
pub(crate) fn fault_stop(world: &rsmpi::topology::SimpleCommunicator, comm: &mut MpiCommunicator) {
    use relaycc_route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let (me, n) = (comm.rank(), comm.ranks());
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
pub(crate) fn fault_stop_early(world: &rsmpi::topology::SimpleCommunicator) {
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
pub(crate) fn fault_exit(comm: &mut MpiCommunicator, strategy: Strategy) -> bool {
    let (me, n) = (comm.rank(), comm.ranks());
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

/// Rank 1's backend fails every download while a staged all_reduce runs: rank 1 must return
/// the backend's error, every other rank an error (a timeout: rank 1's messages never come)
/// within the bound; nobody hangs or panics.
pub(crate) fn fault_backend(world: &rsmpi::topology::SimpleCommunicator) {
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
