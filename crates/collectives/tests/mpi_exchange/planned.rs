//! Plans from relaycc's planner run across processes: through `MpiCommunicator::execute` on
//! host slices and through the backend path (`prepare`/`DevicePlan::run`, staged and direct),
//! each output compared with the request's layout and MPI's own collective; and a
//! `DevicePlan` run on regions its backend did not allocate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use relaycc_collectives::Collectives;
use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{MpiCommunicator, MpiError, TransferMode};
use relaycc_collectives::{Backend, ByteRegion, HostBackend};
use relaycc_route::Location;
use rsmpi::collective::SystemOperation;
use rsmpi::datatype::{Partition, PartitionMut};
use rsmpi::traits::*;

use crate::mpi_common::Report;
use crate::{displs, value};

/// Collectives the backend path is tested with.
pub(crate) const BACKEND_COLLECTIVES: [relaycc_route::Collective; 5] = [
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
pub(crate) fn planner_plans(
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
pub(crate) fn foreign_handles(world: &rsmpi::topology::SimpleCommunicator, rep: &mut Report) {
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

/// True when `output` (little-endian u32) holds what `req` asks of rank `me`, sums wrapping as
/// the u32 reduction does.
pub(crate) fn matches_request(req: &relaycc_route::Request, me: u32, output: &[u8]) -> bool {
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
pub(crate) fn backend_plans(
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
    let me = comm.rank() as u32;
    let n = comm.ranks();
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
pub(crate) fn run_on_backend(
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
