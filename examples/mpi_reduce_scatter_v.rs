//! reduce_scatter_v over MPI with new counts every call against the same with one repeated
//! count list, in one run (feature `mpi`):
//!
//! ```text
//! cargo build --release --features mpi --example mpi_reduce_scatter_v
//! mpirun -n 8 target/release/examples/mpi_reduce_scatter_v [calls] [gpu-rank]
//! ```
//!
//! With `gpu-rank`, the calls go through the GPU ranks' protocol on the host backend
//! (`MpiGpu::host`, `on_host()`).
//!
//! Every rank draws the same count lists from one seed: f32 blocks of 0 to 1,024 elements
//! with one at 513 or more, so every list runs the one capacity plan (1,024 per block) with
//! its counts bound per call. The workloads alternate in blocks of 20 calls until each has
//! run `calls` times (default 2,000): 20 calls with fresh lists, then 20 with one list
//! repeated (a new one per block, drawn alike). Every call is timed on each rank; the figures
//! are the largest total over the ranks. Inputs are small integers, so every sum is exact in
//! f32 and each result is compared with the sum computed here; a wrong one makes the exit
//! status 1. Prints host microseconds per call of each, their ratio, and the plans cached
//! before and after.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

mod mpi_start;
use mpi_start::max_all;

use relaycc::collectives::Collectives;
use relaycc::collectives::mpi::{MpiCommunicator, MpiGpu};
use relaycc::route::ReduceOp;

/// Calls per block of each workload.
const BLOCK: usize = 20;
/// Largest block, elements: the capacity every list's plan has.
const CAPACITY: usize = 1024;

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

/// A count list of blocks up to [`CAPACITY`] with one at 513 or more.
fn counts(draw: &mut Draw, n: usize) -> Vec<usize> {
    let mut c: Vec<usize> = (0..n)
        .map(|_| draw.next(CAPACITY as u64 + 1) as usize)
        .collect();
    c[draw.next(n as u64) as usize] = 513 + draw.next(512) as usize;
    c
}

/// Element `p` of rank `s`'s input: a small integer, so sums over the ranks are exact.
fn value(s: usize, p: usize) -> f32 {
    ((s * 7 + p) % 13) as f32
}

/// relaycc's reduce_scatter_v: (input, output, counts).
type ReduceScatterV<'a> =
    dyn FnMut(&[f32], &mut [f32], &[usize]) -> Result<(), Box<dyn Error>> + 'a;

/// Seconds with fresh lists, with repeated ones, and whether every result was exact.
fn rounds(
    comm: &MpiCommunicator,
    calls: usize,
    call: &mut ReduceScatterV<'_>,
) -> Result<(f64, f64, bool), Box<dyn Error>> {
    let (me, n) = (comm.rank(), comm.ranks());
    let mut draw = Draw(0x2545_f491_4f6c_dd1d);
    let input: Vec<f32> = (0..n * CAPACITY).map(|p| value(me, p)).collect();
    let mut out = vec![0f32; CAPACITY];
    let exact_for = |c: &[usize], got: &[f32]| {
        let at: usize = c[..me].iter().sum();
        got.iter()
            .enumerate()
            .all(|(i, g)| *g == (0..n).map(|s| value(s, at + i)).sum::<f32>())
    };
    // One call first, so the capacity plan is not planned inside the timed rounds.
    let first = counts(&mut draw, n);
    call(&input[..first.iter().sum()], &mut out[..first[me]], &first)?;
    let (mut fresh, mut repeated, mut exact) = (0.0, 0.0, true);
    for _ in 0..calls / BLOCK {
        for _ in 0..BLOCK {
            let c = counts(&mut draw, n);
            let start = Instant::now();
            call(&input[..c.iter().sum()], &mut out[..c[me]], &c)?;
            fresh += start.elapsed().as_secs_f64();
            exact &= exact_for(&c, &out[..c[me]]);
        }
        let c = counts(&mut draw, n);
        for _ in 0..BLOCK {
            let start = Instant::now();
            call(&input[..c.iter().sum()], &mut out[..c[me]], &c)?;
            repeated += start.elapsed().as_secs_f64();
        }
        exact &= exact_for(&c, &out[..c[me]]);
    }
    Ok((fresh, repeated, exact))
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
    let iters = iters.div_ceil(BLOCK).max(1) * BLOCK;
    let sum = ReduceOp::Sum;
    let (before, ran, after) = if gpu_rank {
        match MpiGpu::host(&comm) {
            Ok(mut gpu) => {
                let before = gpu.cached_calls();
                let ran = rounds(&comm, iters, &mut |i, o, c| {
                    Ok(gpu.on_host().reduce_scatter_v(i, o, c, sum)?)
                });
                (before, ran, gpu.cached_calls())
            }
            Err(e) => (0, Err(e.into()), 0),
        }
    } else {
        let before = comm.cached_calls();
        let mut host = &comm;
        let ran = rounds(&comm, iters, &mut |i, o, c| {
            Ok(host.reduce_scatter_v(i, o, c, sum)?)
        });
        (before, ran, comm.cached_calls())
    };
    let (fresh, repeated, exact) = match ran {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rank {}: {e}; aborting the job", comm.rank());
            comm.abort(1)
        }
    };
    let per_call = |s: f64| max_all(&comm, s) * 1e6 / iters.max(1) as f64;
    let (fresh, repeated) = (per_call(fresh), per_call(repeated));
    let exact = max_all(&comm, if exact { 0.0 } else { 1.0 }) == 0.0;
    if comm.rank() == 0 {
        println!(
            "reduce_scatter_v f32 sum, {} ranks{}, {iters} calls of each",
            comm.ranks() as u32,
            if gpu_rank {
                " (GPU ranks' protocol on the host backend)"
            } else {
                ""
            }
        );
        println!("  fresh counts      {fresh:9.1} us/call");
        println!("  repeated counts   {repeated:9.1} us/call");
        println!("  fresh / repeated  {:9.3}", fresh / repeated);
        println!(
            "  plans cached      {before} -> {after}; results {}",
            if exact { "exact" } else { "WRONG" }
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
