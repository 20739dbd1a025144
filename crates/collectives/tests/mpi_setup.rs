//! MPI tests of the steps around the collectives (run under `mpirun` by `scripts/test-mpi`,
//! with `RELAYCC_MPI_TIMEOUT_MS` set to a few seconds):
//!
//! ```text
//! mpirun -n 4 target/debug/deps/mpi_setup-<hash> [absent|bad-setup|settings]
//! ```
//!
//! - `absent`: the last rank never calls `MpiCommunicator::from_mpi` (it sleeps past the
//!   others' timeout, then finalizes); every other rank must get `MpiError::Absent` naming it
//!   within the timeout and slack.
//! - `bad-setup`: the last rank's own setup fails (`RELAYCC_RANKS_PER_NODE=0` in its
//!   environment only); it gets the setup error, every other rank at once `MpiError::Peer`
//!   naming it.
//! - `settings`: `agree_settings` with equal settings passes; with one setting that differs
//!   on the last rank it is `CallMismatch` on every rank, naming that rank, the setting and
//!   both values; with different setting names it is `CallMismatch` too; `barrier` passes.
//!
//! The fault modes print `FAULT-DETECTED` on each surviving rank (or `FAULT-MISSED`);
//! `settings` prints `<N> passed, <F> failed` on rank 0.

mod mpi_common;

use std::time::{Duration, Instant};

use relaycc_collectives::Collectives;
use relaycc_collectives::mpi::{MpiCommunicator, MpiError, rsmpi};
use rsmpi::traits::*;

use mpi_common::Report;

/// The timeout `RELAYCC_MPI_TIMEOUT_MS` sets, as `from_mpi` reads it.
fn timeout() -> Duration {
    std::env::var("RELAYCC_MPI_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map_or(Duration::from_secs(60), Duration::from_millis)
}

fn absent(world: &rsmpi::topology::SimpleCommunicator) {
    let (me, n) = (world.rank() as u32, world.size() as u32);
    if me == n - 1 {
        println!("rank {me}: never creating the communicator");
        std::thread::sleep(timeout() + Duration::from_secs(2));
        return;
    }
    let t = Instant::now();
    let r = MpiCommunicator::from_mpi(world, me, None);
    let took = t.elapsed();
    let bound = timeout() + Duration::from_millis(1500);
    let named = matches!(&r, Err(MpiError::Absent { missing, .. }) if missing == &[n - 1]);
    match r {
        Err(e) if named && took <= bound => {
            println!("rank {me}: FAULT-DETECTED after {took:?}: {e}")
        }
        Err(e) => println!("rank {me}: FAULT-MISSED after {took:?} (bound {bound:?}): {e}"),
        Ok(_) => println!("rank {me}: FAULT-MISSED: created without rank {}", n - 1),
    }
}

fn bad_setup(world: &rsmpi::topology::SimpleCommunicator) {
    let (me, n) = (world.rank() as u32, world.size() as u32);
    if me == n - 1 {
        // SAFETY: no other thread of this process runs or reads the environment now.
        unsafe { std::env::set_var("RELAYCC_RANKS_PER_NODE", "0") };
    }
    let t = Instant::now();
    let r = MpiCommunicator::from_mpi(world, me, None);
    let took = t.elapsed();
    let quick = took < timeout() / 2;
    match (me == n - 1, r) {
        (true, Err(MpiError::Setup(e))) => println!("rank {me}: own setup error: {e}"),
        (false, Err(MpiError::Peer { rank, .. })) if rank == n - 1 && quick => {
            println!("rank {me}: FAULT-DETECTED after {took:?}: rank {rank} failed its setup")
        }
        (_, Err(e)) => println!("rank {me}: FAULT-MISSED after {took:?}: {e}"),
        (_, Ok(_)) => println!("rank {me}: FAULT-MISSED: created"),
    }
}

fn settings(world: &rsmpi::topology::SimpleCommunicator) {
    let comm = mpi_common::communicator(world);
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let mut rep = Report::new(world);
    let same = [("-n", 20i64), ("-b", 1024)];
    rep.check("equal settings agree", comm.agree_settings(&same).is_ok());
    let iters = if me == n - 1 { 5 } else { 20 };
    let r = comm.agree_settings(&[("-n", iters), ("-b", 1024)]);
    let named = match &r {
        Err(MpiError::CallMismatch(m)) => {
            m.contains(&format!("rank {} passes 5", n - 1))
                && m.contains("-n")
                && m.contains("pass 20")
                && !m.contains("-b")
        }
        _ => false,
    };
    if !named {
        println!("rank {me}: differing -n: {r:?}");
    }
    rep.check(
        "a differing setting names the rank, the setting and the values",
        named,
    );
    let names = if me == 0 { "-n" } else { "-w" };
    let r = comm.agree_settings(&[(names, 1)]);
    rep.check(
        "different setting names are a mismatch",
        matches!(r, Err(MpiError::CallMismatch(_))),
    );
    rep.check("the communicator still works", comm.barrier().is_ok());
    rep.summary();
}

fn main() {
    let universe = mpi_common::universe();
    let world = universe.world();
    let mode = std::env::args().nth(1).unwrap_or_else(|| "settings".into());
    match mode.as_str() {
        "absent" => absent(&world),
        "bad-setup" => bad_setup(&world),
        "settings" => settings(&world),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
}
