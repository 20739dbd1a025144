//! MPI tests of the node-aware exchange; run under mpirun by `scripts/test-mpi`:
//!
//! ```text
//! mpirun -n 8 -x RELAYCC_RANKS_PER_NODE=2 mpi_exchange [correctness|fault-counts|fault-exit]
//! ```
//!
//! - `correctness`: every strategy (and the model's choice) gives exactly `MPI_Alltoallv`'s
//!   result on random sparse patterns (fixed seeds, empty messages, a rank with no
//!   neighbours), run twice per build (persistence); all_gather_v equals `MPI_Allgatherv`.
//! - `correctness` also runs plans from relaycc's planner (`relaycc_route::plan`, members
//!   and host memory only) for nine collectives, reductions included, on a cluster preset through
//!   `MpiCommunicator::execute`, and compares every output with the request's layout.
//! - `fault-counts`: rank 0 expects one element too many from rank 1; every rank must get an
//!   error from the build.
//! - `fault-exit`: the last rank leaves before the exchange runs; every other rank must get a
//!   timeout error within the bound.
//!
//! Rank 0 prints `PASS <name>` / `FAIL <name>` per check and `<N> passed, <F> failed`.

use std::time::{Duration, Instant};

use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{Choice, MpiCommunicator, MpiError, NeighborExchange};
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

struct Report<'a> {
    comm: &'a MpiCommunicator,
    passed: u32,
    failed: u32,
}

impl Report<'_> {
    /// Agree on `ok` over all ranks and count it once (on rank 0).
    fn check(&mut self, name: &str, ok: bool) {
        let mut all = 0i32;
        self.comm
            .comm()
            .all_reduce_into(&i32::from(ok), &mut all, SystemOperation::min());
        if all == 1 {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        if self.comm.rank() == 0 {
            println!("{} {name}", if all == 1 { "PASS" } else { "FAIL" });
        }
    }
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
                if me == n - 1 || next() % 3 != 0 {
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

/// Planner plans of every collective (sums for the reducing ones), run across processes by
/// `execute`.
fn planner_plans(world: &rsmpi::topology::SimpleCommunicator, rep: &mut Report) {
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
    let comm = match MpiCommunicator::from_mpi(world, me, Some(topo.clone())) {
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
    for coll in [
        Collective::AllGather,
        Collective::AllToAll,
        Collective::Broadcast,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllGatherV,
        Collective::AllReduce,
        Collective::Reduce,
        Collective::ReduceScatter,
    ] {
        let mut req = Request::new(coll, gpus.clone(), 1000, DType::U32).with_root(n - 1);
        req.counts = (0..n as u64).map(|r| (r * 37) % 11).collect();
        let planned = match relaycc_route::plan(&topo, &req, &opts) {
            Ok(p) => p,
            Err(e) => {
                rep.check(&format!("planner plan {coll}: {e}"), false);
                continue;
            }
        };
        let value = |rank: u32, i: u64| (rank << 24) | (i as u32 & 0x00ff_ffff);
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
        for piece in req.expected().unwrap_or_default() {
            if piece.rank != me || !ok {
                continue;
            }
            for i in 0..piece.len {
                let at = ((piece.out_offset + i) * 4) as usize;
                let got = u32::from_le_bytes([
                    output[at],
                    output[at + 1],
                    output[at + 2],
                    output[at + 3],
                ]);
                // Sums wrap, as the u32 reduction does.
                let want = piece.terms.iter().fold(0u32, |acc, (src, off)| {
                    acc.wrapping_add(value(*src, off + i))
                });
                if got != want {
                    println!(
                        "rank {me}: {coll} element {}: {got:#x} != {want:#x}",
                        piece.out_offset + i
                    );
                    ok = false;
                    break;
                }
            }
        }
        rep.check(
            &format!("planner plan {coll} ({})", planned.plan.algorithm),
            ok,
        );
    }
}

fn main() {
    let Some(universe) = rsmpi::initialize() else {
        eprintln!("MPI could not be initialised");
        std::process::exit(2);
    };
    let world = universe.world();
    let mode = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "correctness".into());
    let mut comm = match MpiCommunicator::from_mpi(&world, world.rank() as u32, None) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("setup: {e}");
            std::process::exit(2);
        }
    };
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
    let mut rep = Report {
        comm: &comm,
        passed: 0,
        failed: 0,
    };
    match mode.as_str() {
        "correctness" => {
            correctness(&comm, &mut rep);
            planner_plans(&world, &mut rep);
        }
        "fault-counts" => fault_counts(&comm, &mut rep),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
    let (p, f) = (rep.passed, rep.failed);
    if comm.rank() == 0 {
        println!("{p} passed, {f} failed");
    }
    drop(comm);
    drop(universe);
    if f > 0 {
        std::process::exit(1);
    }
}
