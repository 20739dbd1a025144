//! Distributed SpMV with a node-aware halo exchange (feature `mpi`):
//!
//! ```text
//! cargo build --release --features mpi --example spmv_halo
//! mpirun -n 8 -x RELAYCC_RANKS_PER_NODE=4 target/release/examples/spmv_halo [iters]
//! ```
//!
//! Matrices: a 2D 5-point Poisson matrix, a 3D 7-point Poisson matrix and a random power-law
//! matrix (hub columns make the halo irregular), rows in contiguous blocks per rank. The halo
//! (the x entries of other ranks that a rank's rows touch) is an index list: each owner
//! learns once which of its entries each neighbour needs. Then, for each strategy, a
//! `NeighborExchange` is built from those lists (`NeighborExchange::from_indices`: it gathers
//! the entries into its run buffers, so a run takes the local x as it is) and y = A x
//! computed with it and checked against a serial product of the same rows; the exchange
//! (packing included) is timed (max over ranks of the mean of `iters` runs) beside the
//! model's prediction and plain `MPI_Alltoallv` on the same pattern (packed by hand).
//!
//! Any error (a failed build or run, a timeout) is printed and ends the job at once through
//! `MpiCommunicator::abort`: after a failed run the peers may be gone, so nothing waits in
//! another collective. A wrong product makes the exit status 1.

use std::process::ExitCode;

mod mpi_start;
use mpi_start::{displs, max_all};
use std::time::Instant;

use relaycc::collectives::Collectives;
use relaycc::collectives::mpi::rsmpi;
use relaycc::collectives::mpi::{Choice, MpiCommunicator, MpiError, NeighborExchange};
use relaycc::route::nodeaware::Strategy;
use rsmpi::collective::SystemOperation;
use rsmpi::datatype::{Partition, PartitionMut};
use rsmpi::traits::*;

/// A matrix given row by row: `row(i)` lists (column, value).
#[derive(Clone, Copy)]
enum Matrix {
    Poisson2d(usize),
    Poisson3d(usize),
    PowerLaw(usize),
}

impl Matrix {
    fn rows(self) -> usize {
        match self {
            Matrix::Poisson2d(m) => m * m,
            Matrix::Poisson3d(m) => m * m * m,
            Matrix::PowerLaw(n) => n,
        }
    }
    fn name(self) -> String {
        match self {
            Matrix::Poisson2d(m) => format!("poisson2d {m}x{m}"),
            Matrix::Poisson3d(m) => format!("poisson3d {m}^3"),
            Matrix::PowerLaw(n) => format!("powerlaw n={n}"),
        }
    }
    fn row(self, i: usize) -> Vec<(usize, f64)> {
        match self {
            Matrix::Poisson2d(m) => {
                let (x, y) = (i % m, i / m);
                let mut v = vec![(i, 4.0)];
                if x > 0 {
                    v.push((i - 1, -1.0));
                }
                if x + 1 < m {
                    v.push((i + 1, -1.0));
                }
                if y > 0 {
                    v.push((i - m, -1.0));
                }
                if y + 1 < m {
                    v.push((i + m, -1.0));
                }
                v
            }
            Matrix::Poisson3d(m) => {
                let (x, y, z) = (i % m, (i / m) % m, i / (m * m));
                let mut v = vec![(i, 6.0)];
                for (ok, j) in [
                    (x > 0, i.wrapping_sub(1)),
                    (x + 1 < m, i + 1),
                    (y > 0, i.wrapping_sub(m)),
                    (y + 1 < m, i + m),
                    (z > 0, i.wrapping_sub(m * m)),
                    (z + 1 < m, i + m * m),
                ] {
                    if ok {
                        v.push((j, -1.0));
                    }
                }
                v
            }
            Matrix::PowerLaw(n) => {
                let mut s = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s
                };
                let u = (next() % 10_000) as f64 / 10_000.0;
                let deg = (2.0 / (1.0 - u).max(1e-3).powf(0.6)).min(200.0) as usize + 1;
                let mut v = vec![(i, deg as f64 + 1.0)];
                for _ in 0..deg {
                    // Columns concentrate on low indices: hubs every rank needs.
                    let r = (next() % 1_000_000) as f64 / 1_000_000.0;
                    let c = ((n as f64) * r.powi(3)) as usize % n;
                    if c != i {
                        v.push((c, -0.5));
                    }
                }
                v
            }
        }
    }
}

fn x_of(i: usize) -> f64 {
    ((i * 7919) % 1013) as f64 / 1013.0 + 0.5
}

/// Every strategy's halo exchange on `a`; `Ok(false)` when some product was wrong.
fn run(comm: &MpiCommunicator, a: Matrix, iters: usize) -> Result<bool, MpiError> {
    let world = comm.comm();
    let (me, n) = (comm.rank(), comm.ranks());
    let rows = a.rows();
    let lo = |r: usize| r * rows / n;
    let owner = |c: usize| (0..n).find(|r| c < lo(r + 1)).unwrap_or(n - 1);
    let (first, last) = (lo(me), lo(me + 1));
    let my_rows: Vec<Vec<(usize, f64)>> = (first..last).map(|i| a.row(i)).collect();
    // Halo: the off-rank columns, grouped by owner, sorted.
    let mut need: Vec<Vec<usize>> = vec![Vec::new(); n];
    for row in &my_rows {
        for &(c, _) in row {
            if !(first..last).contains(&c) {
                need[owner(c)].push(c);
            }
        }
    }
    for v in &mut need {
        v.sort_unstable();
        v.dedup();
    }
    // Setup: tell each owner which indices to send (one MPI_Alltoallv of index lists).
    let rc: Vec<i32> = need.iter().map(|v| v.len() as i32).collect();
    let mut sc = vec![0i32; n];
    world.all_to_all_into(&rc[..], &mut sc[..]);
    let flat_need: Vec<u64> = need.iter().flatten().map(|c| *c as u64).collect();
    let mut send_idx = vec![0u64; sc.iter().sum::<i32>() as usize];
    {
        let (rd, sd) = (displs(&rc), displs(&sc));
        let p = Partition::new(&flat_need[..], &rc[..], &rd[..]);
        let mut q = PartitionMut::new(&mut send_idx[..], &sc[..], &sd[..]);
        world.all_to_all_varcount_into(&p, &mut q);
    }
    let x_local: Vec<f64> = (first..last).map(x_of).collect();
    // What each neighbour needs, as indices into the local x.
    let send_lists: Vec<Vec<usize>> = displs(&sc)
        .iter()
        .zip(&sc)
        .map(|(d, c)| {
            send_idx[*d as usize..(*d + *c) as usize]
                .iter()
                .map(|col| *col as usize - first)
                .collect()
        })
        .collect();
    // Alltoallv needs the entries packed by hand.
    let pack = |buf: &mut Vec<f64>| {
        buf.clear();
        buf.extend(send_lists.iter().flatten().map(|i| x_local[*i]));
    };
    let send_counts: Vec<u64> = sc.iter().map(|c| *c as u64).collect();
    let halo_len = flat_need.len();
    let halo_pos: std::collections::HashMap<usize, usize> = flat_need
        .iter()
        .enumerate()
        .map(|(i, c)| (*c as usize, i))
        .collect();
    let serial: Vec<f64> = my_rows
        .iter()
        .map(|row| row.iter().map(|(c, v)| v * x_of(*c)).sum())
        .collect();
    let msgs = send_counts.iter().filter(|c| **c > 0).count();
    let bytes = send_counts.iter().sum::<u64>() * 8;
    let max_msgs = max_all(comm, msgs as f64);
    let max_bytes = max_all(comm, bytes as f64);
    if me == 0 {
        println!(
            "\n{} on {n} ranks, {} per node: max {max_msgs} halo messages and {max_bytes} bytes \
             sent by a rank",
            a.name(),
            comm.node_ranks().len()
        );
    }
    // Baseline: MPI_Alltoallv of the packed halo.
    let mut sendbuf = Vec::new();
    let mut halo = vec![0.0f64; halo_len];
    let (sd, rd) = (displs(&sc), displs(&rc));
    let mut alltoallv = || {
        pack(&mut sendbuf);
        let p = Partition::new(&sendbuf[..], &sc[..], &sd[..]);
        let mut q = PartitionMut::new(&mut halo[..], &rc[..], &rd[..]);
        world.all_to_all_varcount_into(&p, &mut q);
    };
    alltoallv();
    world.barrier();
    let t = Instant::now();
    for _ in 0..iters {
        alltoallv();
    }
    let base = max_all(comm, t.elapsed().as_secs_f64() / iters as f64);
    if me == 0 {
        println!("  {:<10} {:>10.1} us", "Alltoallv", base * 1e6);
    }
    let mut all_ok = true;
    let strategies = [
        Choice::Forced(Strategy::Standard),
        Choice::Forced(Strategy::ThreeStep),
        Choice::Forced(Strategy::TwoStep),
        Choice::Forced(Strategy::SplitMd),
        Choice::Model,
    ];
    let mut best = (f64::INFINITY, Strategy::Standard);
    for choice in strategies {
        // The halo arrives contiguous per owner, owners in rank order, each owner's entries
        // in the order this rank asked for them: `flat_need`'s order.
        let mut ex = NeighborExchange::from_indices(comm, &send_lists, None, 8, choice)?;
        let mut halo = vec![0.0f64; halo_len];
        ex.run(&x_local, &mut halo)?;
        // y = A x with the exchanged halo, against the serial product.
        let y: Vec<f64> = my_rows
            .iter()
            .map(|row| {
                row.iter()
                    .map(|(c, v)| {
                        let x = if (first..last).contains(c) {
                            x_local[c - first]
                        } else {
                            halo_pos.get(c).map_or(f64::NAN, |p| halo[*p])
                        };
                        v * x
                    })
                    .sum()
            })
            .collect();
        let ok = y.iter().zip(&serial).all(|(a, b)| a == b);
        let mut all = 0i32;
        world.all_reduce_into(&i32::from(ok), &mut all, SystemOperation::min());
        all_ok &= all == 1;
        world.barrier();
        let t = Instant::now();
        for _ in 0..iters {
            ex.run(&x_local, &mut halo)?;
        }
        let took = max_all(comm, t.elapsed().as_secs_f64() / iters as f64);
        if matches!(choice, Choice::Forced(_)) && took < best.0 {
            best = (took, ex.strategy());
        }
        if me == 0 {
            let label = match choice {
                Choice::Model => format!("model:{}", ex.strategy()),
                Choice::Forced(s) => s.name().to_string(),
            };
            let (s, r) = ex.messages();
            println!(
                "  {label:<16} {:>10.1} us  x{:.2} of Alltoallv  model {:>8.1} us  y=Ax {}  \
                 (rank 0: {s} sends, {r} receives, {} levels)",
                took * 1e6,
                took / base,
                ex.predicted_seconds() * 1e6,
                if all == 1 { "ok" } else { "WRONG" },
                ex.levels()
            );
            if choice == Choice::Model {
                println!(
                    "  model chose {}, measured best {}: {}",
                    ex.strategy(),
                    best.1,
                    if ex.strategy() == best.1 {
                        "match"
                    } else {
                        "no match"
                    }
                );
            }
        }
    }
    Ok(all_ok)
}

fn main() -> ExitCode {
    let mpi_start::Started {
        universe,
        comm,
        iters,
    } = match mpi_start::start(50) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut ok = true;
    for a in [
        Matrix::Poisson2d(256),
        Matrix::Poisson3d(32),
        Matrix::PowerLaw(20_000),
    ] {
        match run(&comm, a, iters) {
            Ok(correct) => ok &= correct,
            Err(e) => {
                eprintln!("rank {}: {}: {e}; aborting the job", comm.rank(), a.name());
                comm.abort(1)
            }
        }
    }
    if comm.rank() == 0 {
        println!(
            "\nspmv_halo: {}",
            if ok { "all products correct" } else { "FAILED" }
        );
    }
    drop(comm);
    drop(universe);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
