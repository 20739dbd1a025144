//! How the MPI examples (`spmv_halo`, `mpi_exchange_bench`, `mpi_count_binding`,
//! `mpi_reduce_scatter_v`) start: MPI, this process's
//! communicator over the world, and the iteration count from the command line; and what they
//! share to compare with MPI's own calls and report (`displs`, `max_all`).

use std::process::ExitCode;

use relaycc::collectives::mpi::MpiCommunicator;
use relaycc::collectives::mpi::rsmpi;
use rsmpi::collective::SystemOperation;
use rsmpi::environment::Universe;
use rsmpi::traits::*;

/// What an MPI example runs with. Drop `comm` before `universe`: MPI finalizes when the
/// universe drops.
pub struct Started {
    pub universe: Universe,
    pub comm: MpiCommunicator,
    /// The first argument, or the example's default without one.
    pub iters: usize,
}

/// Initialise MPI and make this process's communicator (its rank the world rank); on failure,
/// print why and give exit status 2.
pub fn start(default_iters: usize) -> Result<Started, ExitCode> {
    let Some(universe) = rsmpi::initialize() else {
        eprintln!("MPI could not be initialised");
        return Err(ExitCode::from(2));
    };
    let world = universe.world();
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default_iters);
    let comm = match MpiCommunicator::from_mpi(&world, world.rank() as u32, None) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("setup: {e}");
            return Err(ExitCode::from(2));
        }
    };
    Ok(Started {
        universe,
        comm,
        iters,
    })
}

/// Displacements of packed blocks of `counts` (MPI's `displs` for a v-collective).
// Not every example compares with MPI's own v-collectives (`mpi_reduce_scatter_v` has no MPI
// call to compare with: rsmpi wraps no `MPI_Reduce_scatter`).
#[allow(dead_code)]
pub fn displs(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |at, c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}

/// The largest `x` over the ranks of `comm` (blocking `MPI_Allreduce`).
pub fn max_all(comm: &MpiCommunicator, x: f64) -> f64 {
    let mut m = 0.0f64;
    comm.comm()
        .all_reduce_into(&x, &mut m, SystemOperation::max());
    m
}
