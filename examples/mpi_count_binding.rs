//! all_to_all_v over MPI with a new count matrix every call against the same with one
//! repeated matrix, and against `MPI_Alltoallv` on the same matrices, in one run (feature
//! `mpi`):
//!
//! ```text
//! cargo build --release --features mpi --example mpi_count_binding
//! mpirun -n 8 target/release/examples/mpi_count_binding [calls] [gpu-rank]
//! ```
//!
//! With `gpu-rank`, relaycc's calls go through the GPU ranks' protocol on the host backend
//! (`MpiGpu::host`, `on_host()`): the same count binding, with the GPU ranks' lent buffers,
//! mirrors and staging.
//!
//! Every rank draws the same matrices from one seed: f32 counts 0 to 1,024 per pair with one
//! pair at 513 or more, so every matrix runs the one capacity plan (1,024 per pair) with its
//! counts bound per call. The workloads alternate in blocks of 20 calls until each has run
//! `calls` times (default 2,000): 20 calls with fresh matrices, 20 calls with one matrix
//! repeated (a new one per block, drawn alike, so both workloads move the same distribution
//! of counts), then `MPI_Alltoallv` on the repeated matrix 20 times and on the fresh block's
//! 20 matrices (the control: what the same two workloads cost the MPI library). Every call is
//! timed on each rank; the figures are the largest total over the ranks.
//! Prints host microseconds per call of each, the ratios fresh / repeated (relaycc's and
//! MPI's) and relaycc / MPI, and the plans cached before and after. Every relaycc result is compared with
//! MPI's; a wrong one makes the exit status 1.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

mod mpi_start;
use mpi_start::{displs, max_all};

use relaycc::collectives::Collectives;
use relaycc::collectives::mpi::rsmpi;
use relaycc::collectives::mpi::{MpiCommunicator, MpiGpu};
use rsmpi::datatype::{Partition, PartitionMut};
use rsmpi::traits::*;

/// Calls per block: the fresh and repeated workloads alternate in blocks, so each runs as an
/// engine would run it (a repeated matrix call after call) and both see the same load.
const BLOCK: usize = 20;

/// A xorshift generator: every rank draws the same numbers from the same seed.
struct Draw(u64);

impl Draw {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below.max(1)
    }
}

/// A matrix (row: sender) of counts up to 1,024 with one at 513 or more.
fn matrix(draw: &mut Draw, n: usize) -> Vec<Vec<usize>> {
    let mut m: Vec<Vec<usize>> = (0..n)
        .map(|_| (0..n).map(|_| draw.next(1025) as usize).collect())
        .collect();
    let (s, d) = (draw.next(n as u64) as usize, draw.next(n as u64) as usize);
    m[s][d] = 513 + draw.next(512) as usize;
    m
}

/// Rank `me`'s send and receive counts of `m`, in elements and as MPI's `i32`.
struct Counts {
    sends: Vec<usize>,
    recvs: Vec<usize>,
    send_i: Vec<i32>,
    recv_i: Vec<i32>,
    send_at: Vec<i32>,
    recv_at: Vec<i32>,
}

impl Counts {
    fn of(m: &[Vec<usize>], me: usize) -> Counts {
        let sends = m[me].clone();
        let recvs: Vec<usize> = m.iter().map(|row| row[me]).collect();
        let send_i: Vec<i32> = sends.iter().map(|c| *c as i32).collect();
        let recv_i: Vec<i32> = recvs.iter().map(|c| *c as i32).collect();
        let (send_at, recv_at) = (displs(&send_i), displs(&recv_i));
        Counts {
            sends,
            recvs,
            send_i,
            recv_i,
            send_at,
            recv_at,
        }
    }
}

/// Totals in seconds of one rank, and whether every result matched MPI's.
#[derive(Default)]
struct Totals {
    fresh: f64,
    repeated: f64,
    mpi: f64,
    mpi_repeated: f64,
    elements_fresh: u64,
    elements_repeated: u64,
    exact: bool,
}

/// relaycc's all_to_all_v: (input, send counts, output, receive counts).
type AllToAllV<'a> =
    dyn FnMut(&[f32], &[usize], &mut [f32], &[usize]) -> Result<(), Box<dyn Error>> + 'a;

fn rounds(
    comm: &MpiCommunicator,
    calls: usize,
    all_to_all_v: &mut AllToAllV<'_>,
) -> Result<Totals, Box<dyn Error>> {
    let world = comm.comm();
    let (me, n) = (comm.rank(), comm.ranks());
    let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
    let input: Vec<f32> = (0..n * 1024).map(|i| (me * 100_000 + i) as f32).collect();
    let mut out = vec![0f32; n * 1024];
    let mut want = vec![0f32; n * 1024];
    let mut t = Totals {
        exact: true,
        ..Totals::default()
    };
    // One call first, so the capacity plan is not planned inside the timed rounds.
    let first = Counts::of(&matrix(&mut draw, n), me);
    all_to_all_v(
        &input[..first.sends.iter().sum()],
        &first.sends,
        &mut out[..first.recvs.iter().sum()],
        &first.recvs,
    )?;
    let mut outputs: Vec<Vec<f32>> = Vec::with_capacity(BLOCK);
    for _ in 0..calls / BLOCK {
        let fresh: Vec<Counts> = (0..BLOCK)
            .map(|_| Counts::of(&matrix(&mut draw, n), me))
            .collect();
        outputs.clear();
        for c in &fresh {
            let (sent, got) = (c.sends.iter().sum(), c.recvs.iter().sum());
            let mut out = vec![0f32; got];
            let start = Instant::now();
            all_to_all_v(&input[..sent], &c.sends, &mut out, &c.recvs)?;
            t.fresh += start.elapsed().as_secs_f64();
            t.elements_fresh += got as u64;
            outputs.push(out);
        }
        // A matrix of the same distribution, repeated for the block.
        let repeated = Counts::of(&matrix(&mut draw, n), me);
        let (rs, rg) = (repeated.sends.iter().sum(), repeated.recvs.iter().sum());
        for _ in 0..BLOCK {
            let start = Instant::now();
            all_to_all_v(
                &input[..rs],
                &repeated.sends,
                &mut out[..rg],
                &repeated.recvs,
            )?;
            t.repeated += start.elapsed().as_secs_f64();
            t.elements_repeated += rg as u64;
        }
        // MPI on the repeated matrix: the control, what the same two workloads cost MPI.
        for _ in 0..BLOCK {
            let start = Instant::now();
            {
                let r = &repeated;
                let sp = Partition::new(&input[..rs], &r.send_i[..], &r.send_at[..]);
                let mut rp = PartitionMut::new(&mut want[..rg], &r.recv_i[..], &r.recv_at[..]);
                world.all_to_all_varcount_into(&sp, &mut rp);
            }
            t.mpi_repeated += start.elapsed().as_secs_f64();
        }
        // MPI on the fresh block's matrices, its results compared with relaycc's.
        for (c, got_here) in fresh.iter().zip(&outputs) {
            let (sent, got) = (c.sends.iter().sum(), c.recvs.iter().sum());
            let start = Instant::now();
            {
                let sp = Partition::new(&input[..sent], &c.send_i[..], &c.send_at[..]);
                let mut rp = PartitionMut::new(&mut want[..got], &c.recv_i[..], &c.recv_at[..]);
                world.all_to_all_varcount_into(&sp, &mut rp);
            }
            t.mpi += start.elapsed().as_secs_f64();
            t.exact &= got_here[..] == want[..got];
        }
    }
    Ok(t)
}

fn main() -> ExitCode {
    let mpi_start::Started {
        universe,
        comm,
        iters,
    } = match mpi_start::start(2000) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let gpu_rank = std::env::args().nth(2).is_some_and(|a| a == "gpu-rank");
    // Whole blocks.
    let iters = iters.div_ceil(BLOCK).max(1) * BLOCK;
    let (before, ran, after) = if gpu_rank {
        match MpiGpu::host(&comm) {
            Ok(mut gpu) => {
                let before = gpu.cached_calls();
                let ran = rounds(&comm, iters, &mut |i, s, o, r| {
                    Ok(gpu.on_host().all_to_all_v(i, s, o, r)?)
                });
                (before, ran, gpu.cached_calls())
            }
            Err(e) => (0, Err(e.into()), 0),
        }
    } else {
        let before = comm.cached_calls();
        let mut host = &comm;
        let ran = rounds(&comm, iters, &mut |i, s, o, r| {
            Ok(host.all_to_all_v(i, s, o, r)?)
        });
        (before, ran, comm.cached_calls())
    };
    let t = match ran {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rank {}: {e}; aborting the job", comm.rank());
            comm.abort(1)
        }
    };
    let per_call = |s: f64| max_all(&comm, s) * 1e6 / iters.max(1) as f64;
    let (fresh, repeated, mpi) = (per_call(t.fresh), per_call(t.repeated), per_call(t.mpi));
    let mpi_repeated = per_call(t.mpi_repeated);
    let exact = max_all(&comm, if t.exact { 0.0 } else { 1.0 }) == 0.0;
    if comm.rank() == 0 {
        let per = |e: u64| e / iters.max(1) as u64;
        println!(
            "all_to_all_v f32, {} ranks{}, {iters} calls of each; elements received by rank 0 per call \
             on average: {} with fresh matrices, {} with repeated ones",
            comm.ranks() as u32,
            if gpu_rank {
                " (GPU ranks' protocol on the host backend)"
            } else {
                ""
            },
            per(t.elements_fresh),
            per(t.elements_repeated)
        );
        println!("  fresh matrix      {fresh:9.1} us/call");
        println!("  repeated matrix   {repeated:9.1} us/call");
        println!("  MPI_Alltoallv     {mpi:9.1} us/call fresh, {mpi_repeated:.1} repeated");
        println!(
            "  fresh / repeated  {:9.3}   (MPI_Alltoallv {:.3})   relaycc / MPI: fresh {:.3}, \
             repeated {:.3}",
            fresh / repeated,
            mpi / mpi_repeated,
            fresh / mpi,
            repeated / mpi_repeated
        );
        println!(
            "  plans cached      {before} -> {after}; results {}",
            if exact {
                "equal MPI's"
            } else {
                "DIFFER from MPI's"
            }
        );
    }
    drop(comm);
    drop(universe);
    if exact {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
