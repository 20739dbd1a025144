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

use std::time::Instant;

use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{Choice, MpiCommunicator, NeighborExchange};
use relaycc_route::nodeaware::Strategy;
use rsmpi::collective::SystemOperation;
use rsmpi::datatype::{Partition, PartitionMut};
use rsmpi::traits::*;

fn displs(c: &[i32]) -> Vec<i32> {
    c.iter()
        .scan(0, |a, x| {
            let d = *a;
            *a += x;
            Some(d)
        })
        .collect()
}

fn max_all(comm: &MpiCommunicator, t: f64) -> f64 {
    let mut m = 0.0f64;
    comm.comm()
        .all_reduce_into(&t, &mut m, SystemOperation::max());
    m
}

fn main() {
    let Some(universe) = rsmpi::initialize() else {
        eprintln!("MPI could not be initialised");
        std::process::exit(2);
    };
    let world = universe.world();
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    let comm = match MpiCommunicator::from_mpi(&world, world.rank() as u32, None) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("setup: {e}");
            std::process::exit(2);
        }
    };
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
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
        let base = max_all(&comm, t.elapsed().as_secs_f64() / iters as f64);
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
            let Ok(mut ex) = NeighborExchange::all_to_all_v(&comm, &send, &recv, 8, choice) else {
                eprintln!("rank {me}: build failed");
                std::process::exit(1);
            };
            let _ = ex.run(&input, &mut out);
            let ok = out == reference;
            w.barrier();
            let t = Instant::now();
            for _ in 0..iters {
                let _ = ex.run(&input, &mut out);
            }
            let took = max_all(&comm, t.elapsed().as_secs_f64() / iters as f64);
            if let Choice::Forced(s) = choice {
                if took < best.0 {
                    best = (took, s);
                }
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
    drop(comm);
    drop(universe);
}
