//! Each node-aware strategy against plain `MPI_Alltoallv` on the same random sparse pattern,
//! in one run (feature `mpi`):
//!
//! ```text
//! cargo build --release --features mpi --example mpi_exchange_bench
//! mpirun -n 8 -x RELAYCC_RANKS_PER_NODE=4 target/release/examples/mpi_exchange_bench [iters]
//! ```
//!
//! Patterns: every rank sends to `degree` random peers (fixed seed) messages of `bytes`
//! (64 B, 4 KiB, 64 KiB). Prints per strategy the time (max over ranks of the mean of
//! `iters` runs), its ratio to `MPI_Alltoallv`, the model's prediction (Lassen parameters),
//! and whether the model's choice was the measured best.
//!
//! Then planner plans (all_reduce, all_to_all on a `cluster:Nxpcie-4gpu:ib-edr` preset) run
//! three ways: `MpiCommunicator::execute` on host slices, and `DevicePlan::run` on the host
//! backend staged (download, send; receive, upload) and direct (MPI on the backend's
//! addresses); prints the times and the staged/direct ratio, i.e. what staging costs when
//! the "device" is host memory (a lower bound of its cost on a GPU).
//!
//! Any error (a failed build or run, a timeout) is printed and ends the job at once through
//! `MpiCommunicator::abort`: after a failed run the peers may be gone, so nothing waits in
//! another collective. A wrong result makes the exit status 1.

use std::error::Error;
use std::process::ExitCode;

mod mpi_start;
use mpi_start::{displs, max_all};
use std::sync::Arc;
use std::time::Instant;

use relaycc::collectives::Collectives;
use relaycc::collectives::mpi::rsmpi;
use relaycc::collectives::mpi::{
    Choice, MpiCommunicator, MpiError, NeighborExchange, TransferMode,
};
use relaycc::collectives::{Backend, ByteRegion, HostBackend};
use relaycc::route::nodeaware::Strategy;
use rsmpi::collective::SystemOperation;
use rsmpi::datatype::{Partition, PartitionMut};
use rsmpi::traits::*;

/// The bench's result: `Ok(false)` when some run gave a wrong result.
type BenchResult = Result<bool, Box<dyn Error>>;

fn main() -> ExitCode {
    let mpi_start::Started {
        universe,
        comm,
        iters,
    } = match mpi_start::start(100) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let world = universe.world();
    let correct = match exchanges(&comm, iters).and_then(|a| Ok(a & backend_paths(&world, iters)?))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rank {}: {e}; aborting the job", comm.rank());
            comm.abort(1)
        }
    };
    drop(comm);
    drop(universe);
    if correct {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Each strategy and the model's choice against `MPI_Alltoallv` on three patterns.
fn exchanges(comm: &MpiCommunicator, iters: usize) -> BenchResult {
    let mut correct = true;
    let (me, n) = (comm.rank(), comm.ranks());
    let w = comm.comm();
    let degree = (n / 2).max(1);
    let mut matched = 0;
    let mut cases = 0;
    for bytes in [64usize, 4096, 65536] {
        let elems = bytes / 8;
        // `degree` random peers per rank (xorshift on the rank and size: fixed seed).
        let mut s = (me as u64 + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut send = vec![0u64; n];
        let mut k = 0;
        while k < degree.min(n - 1) {
            let d = (next() % n as u64) as usize;
            if d != me && send[d] == 0 {
                send[d] = elems as u64;
                k += 1;
            }
        }
        let mut recv = vec![0u64; n];
        w.all_to_all_into(&send[..], &mut recv[..]);
        let input: Vec<u64> = (0..send.iter().sum::<u64>()).collect();
        let mut out = vec![0u64; recv.iter().sum::<u64>() as usize];
        let sc: Vec<i32> = send.iter().map(|c| *c as i32).collect();
        let rc: Vec<i32> = recv.iter().map(|c| *c as i32).collect();
        let (sd, rd) = (displs(&sc), displs(&rc));
        let mut reference = out.clone();
        let alltoallv = |o: &mut [u64]| {
            let p = Partition::new(&input[..], &sc[..], &sd[..]);
            let mut q = PartitionMut::new(o, &rc[..], &rd[..]);
            w.all_to_all_varcount_into(&p, &mut q);
        };
        alltoallv(&mut reference);
        w.barrier();
        let t = Instant::now();
        for _ in 0..iters {
            alltoallv(&mut out);
        }
        let base = max_all(comm, t.elapsed().as_secs_f64() / iters as f64);
        if me == 0 {
            println!(
                "\n{n} ranks, {} per node, {degree} peers per rank, {bytes} B messages: \
                 Alltoallv {:.1} us",
                comm.node_ranks().len(),
                base * 1e6
            );
        }
        let mut best = (f64::INFINITY, Strategy::Standard);
        for choice in [
            Choice::Forced(Strategy::Standard),
            Choice::Forced(Strategy::ThreeStep),
            Choice::Forced(Strategy::TwoStep),
            Choice::Forced(Strategy::SplitMd),
            Choice::Model,
        ] {
            let mut ex = NeighborExchange::all_to_all_v(comm, &send, &recv, 8, choice)?;
            ex.run(&input, &mut out)?;
            let ok = agreed(comm, out == reference);
            correct &= ok;
            w.barrier();
            let t = Instant::now();
            for _ in 0..iters {
                ex.run(&input, &mut out)?;
            }
            let took = max_all(comm, t.elapsed().as_secs_f64() / iters as f64);
            if let Choice::Forced(s) = choice
                && took < best.0
            {
                best = (took, s);
            }
            if me == 0 {
                let label = match choice {
                    Choice::Model => format!("model:{}", ex.strategy()),
                    Choice::Forced(s) => s.name().to_string(),
                };
                println!(
                    "  {label:<16} {:>9.1} us  ratio {:>5.2}  model {:>8.1} us  {}",
                    took * 1e6,
                    took / base,
                    ex.predicted_seconds() * 1e6,
                    if ok { "" } else { "WRONG RESULT" }
                );
                if choice == Choice::Model {
                    cases += 1;
                    if ex.strategy() == best.1 {
                        matched += 1;
                    }
                    println!("  model chose {}, measured best {}", ex.strategy(), best.1);
                }
            }
        }
    }
    if me == 0 {
        println!("\nmodel choice matched the measured best in {matched} of {cases} cases");
    }
    Ok(correct)
}

/// True on every rank when `ok` holds on every rank.
fn agreed(comm: &MpiCommunicator, ok: bool) -> bool {
    let mut all = 0i32;
    comm.comm()
        .all_reduce_into(&i32::from(ok), &mut all, SystemOperation::min());
    all == 1
}

/// Planner plans through `execute` (host slices) and `DevicePlan::run` on the host backend,
/// staged and direct; times are the max over ranks of the mean of `iters` runs.
fn backend_paths(world: &rsmpi::topology::SimpleCommunicator, iters: usize) -> BenchResult {
    use relaycc::route::{Collective, DType, PlanOptions, Request, path::RelayPolicy};
    let (me, n) = (world.rank() as u32, world.size() as u32);
    let topo = relaycc::topo::preset(&format!("cluster:{}xpcie-4gpu:ib-edr", n.div_ceil(4)))?;
    let mut comm = MpiCommunicator::from_mpi(world, me, Some(topo.clone()))?;
    let opts = PlanOptions {
        relay: RelayPolicy::Members,
        ..PlanOptions::default()
    };
    if me == 0 {
        println!("\nbackend path (host backend), {n} ranks:");
    }
    let mut correct = true;
    for (coll, count) in [
        (Collective::AllReduce, 16_384u64),
        (Collective::AllReduce, 1 << 20),
        (Collective::AllToAll, 16_384 / n as u64),
        (Collective::AllToAll, (1 << 20) / n as u64),
    ] {
        let req = Request::new(coll, (0..n).collect(), count, DType::F32);
        let planned = relaycc::route::plan(&topo, &req, &opts)?;
        let plan = &planned.plan;
        let in_len = req.input_len(me)? as usize * 4;
        let out_len = req.output_len(me)? as usize * 4;
        let input: Vec<u8> = (0..in_len / 4)
            .flat_map(|i| ((i % 97) as f32 + me as f32).to_le_bytes())
            .collect();
        let mut host_out = vec![0u8; out_len];
        // Mean time of `iters` calls of `f`, max over ranks; the first error ends the timing.
        let time = |f: &mut dyn FnMut() -> Result<(), MpiError>| -> Result<f64, MpiError> {
            world.barrier();
            let t = Instant::now();
            for _ in 0..iters {
                f()?;
            }
            let mut m = 0.0f64;
            let mine = t.elapsed().as_secs_f64() / iters as f64;
            world.all_reduce_into(&mine, &mut m, SystemOperation::max());
            Ok(m)
        };
        let slices = time(&mut || comm.execute(plan, &input, &mut host_out))?;
        let backend = Arc::new(HostBackend::new());
        let here = relaycc::route::Location::Gpu(me);
        let region = |bytes: usize| {
            backend.allocate(here, bytes as u64).map(|mem| ByteRegion {
                mem,
                offset: 0,
                bytes: bytes as u64,
            })
        };
        let (inp, out) = (region(in_len)?, region(out_len)?);
        backend.upload(inp, &input)?;
        let mut times = Vec::new();
        let mut same = true;
        for mode in [TransferMode::Staged, TransferMode::Direct] {
            comm.set_transfer(mode);
            let mut dp = comm.prepare(backend.clone(), plan)?;
            times.push(time(&mut || dp.run(inp, out))?);
            let mut got = vec![0u8; out_len];
            backend.download(out, &mut got)?;
            same &= got == host_out;
        }
        let mut all_same = 0i32;
        world.all_reduce_into(&i32::from(same), &mut all_same, SystemOperation::min());
        correct &= all_same == 1;
        if me == 0 {
            println!(
                "  {coll} {:>8} B/rank ({}): slices {:>9.1} us  staged {:>9.1} us  direct {:>9.1} \
                 us  staged/direct {:.2}  {}",
                in_len,
                plan.algorithm,
                slices * 1e6,
                times[0] * 1e6,
                times[1] * 1e6,
                times[0] / times[1],
                if all_same == 1 { "" } else { "WRONG RESULT" }
            );
        }
    }
    Ok(correct)
}
