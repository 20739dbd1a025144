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

mod faults;
#[path = "../mpi_common/mod.rs"]
mod mpi_common;
mod neighbor;
mod planned;

use faults::{fault_backend, fault_counts, fault_elem, fault_exit, fault_stop, fault_stop_early};
use mpi_common::{Report, displs};
use neighbor::{correctness, index_lists};
use planned::{BACKEND_COLLECTIVES, foreign_handles, planner_plans};
use relaycc_collectives::mpi::Choice;
use relaycc_route::nodeaware::Strategy;

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
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

/// The value of element `i` of rank `rank`'s input.
fn value(rank: u32, i: u64) -> u32 {
    (rank << 24) | (i as u32 & 0x00ff_ffff)
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
