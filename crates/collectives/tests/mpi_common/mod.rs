//! What the MPI test binaries (`mpi_exchange`, `mpi_typed`, `mpi_gpu`) share: start-up, the
//! per-check report agreed over all ranks, and exact inputs.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use relaycc_collectives::Element;
use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{MpiCommunicator, MpiError};
use rsmpi::collective::SystemOperation;
use rsmpi::environment::Universe;
use rsmpi::topology::SimpleCommunicator;
use rsmpi::traits::*;

/// Initialise MPI, or exit with status 2. A binary that `mpirun` did not start (`cargo test`
/// runs every test binary on its own) says that its checks need `mpirun` and exits 0 without
/// checking anything: its modes and rank counts are chosen by `scripts/test-mpi`, which CI runs.
pub fn universe() -> Universe {
    // A launcher sets one of these in every rank it starts (Open MPI's mpirun, PMIx, MPICH's
    // Hydra); a singleton has none of them.
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if !launched {
        eprintln!(
            "skipped: this MPI test runs under mpirun, with the modes and rank counts of \
             `bash scripts/test-mpi`"
        );
        std::process::exit(0);
    }
    let Some(universe) = rsmpi::initialize() else {
        eprintln!("MPI could not be initialised");
        std::process::exit(2);
    };
    universe
}

/// This process's communicator over `world` (rank = world rank), or exit with status 2.
pub fn communicator(world: &SimpleCommunicator) -> MpiCommunicator {
    match MpiCommunicator::from_mpi(world, world.rank() as u32, None) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("setup: {e}");
            std::process::exit(2);
        }
    }
}

/// Checks passed and failed, agreed over the ranks of `world`.
pub struct Report<'a> {
    world: &'a SimpleCommunicator,
    pub passed: u32,
    pub failed: u32,
}

impl<'a> Report<'a> {
    /// No checks yet; they are agreed over `world`.
    pub fn new(world: &'a SimpleCommunicator) -> Self {
        Report {
            world,
            passed: 0,
            failed: 0,
        }
    }

    /// Agree on `ok` over all ranks and count it once (on rank 0).
    pub fn check(&mut self, name: &str, ok: bool) {
        let mut all = 0i32;
        self.world
            .all_reduce_into(&i32::from(ok), &mut all, SystemOperation::min());
        if all == 1 {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        if self.world.rank() == 0 {
            println!("{} {name}", if all == 1 { "PASS" } else { "FAIL" });
        }
    }

    /// Print `<N> passed, <F> failed` on rank 0.
    pub fn summary(&self) {
        if self.world.rank() == 0 {
            println!("{} passed, {} failed", self.passed, self.failed);
        }
    }
}

/// Element `i` of rank `r`'s input: in -3..=3, so sums and products are exact in every type.
pub fn value(r: u32, i: usize) -> i64 {
    ((u64::from(r) * 3 + i as u64) % 7) as i64 - 3
}

/// Rank `r`'s input of `len` elements ([`value`]).
pub fn fill<T: Element>(r: u32, len: usize) -> Vec<T> {
    (0..len).map(|i| T::from_i64(value(r, i))).collect()
}

/// A front-door call's outcome with MPI's own error unwrapped
/// (`CollectivesError::Mpi(e)` as `e`; any other error as `MpiError::Backend`), for checks
/// that name the MPI error.
pub fn mpi_err(r: Result<(), relaycc_collectives::CollectivesError>) -> Result<(), MpiError> {
    r.map_err(|e| match e {
        relaycc_collectives::CollectivesError::Mpi(m) => *m,
        other => MpiError::Backend(other),
    })
}

/// Displacements of blocks of `counts` laid end to end (`MPI_Alltoallv`'s `sdispls`).
pub fn displs(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}
