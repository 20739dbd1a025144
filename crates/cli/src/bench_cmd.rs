//! `relaycc bench`: time collectives on a backend in nccl-tests' format.
//!
//! The arguments pick one driver ([`crate::bench_driver::BenchDriver`]): with `--backend host`
//! the ranks are logical devices of this host's memory
//! ([`relaycc_collectives::host_topology`]), driven through the per-rank API by one thread
//! per core (`bench_ranks.rs`); with `--backend cuda` every rank's part is launched at once on
//! CUDA GPUs (`bench_launch.rs`); with `--backend mpi` each process of `mpirun` is one rank
//! (`bench_mpi/`). Every driver times the same calls, sized by one rule
//! ([`crate::sizing::bench_request`]), and one report prints them (`bench_report.rs`).
//!
//! In one process every size is also timed as a plain copy of `ranks x size` bytes (one
//! `size`-byte copy per rank, on the same executor): an all_reduce must read every input and
//! write every output at least once, the same memory traffic, so
//! `efficiency = algbw x ranks / memcpy_gbps` says how close the collective comes to the
//! machine's limit.

use anyhow::Result;

use crate::args::{BackendKind, BenchArgs, usage};

/// Run `relaycc bench`.
pub fn run(args: &BenchArgs, out: &mut Vec<u8>) -> Result<()> {
    if args.vs_mpi && args.backend != BackendKind::Mpi {
        return Err(usage("--vs-mpi needs --backend mpi"));
    }
    if args.shared_buffers && args.backend != BackendKind::Mpi {
        return Err(usage(
            "--shared-buffers needs --backend mpi (buffers other processes map)",
        ));
    }
    if args.flags.is_some() && args.backend != BackendKind::Host {
        return Err(usage(
            "--flags needs --backend host (the per-rank calls of host ranks)",
        ));
    }
    if args.transport.is_some() && args.backend != BackendKind::Mpi {
        return Err(usage(
            "--transport needs --backend mpi (GPU ranks across processes)",
        ));
    }
    let sizes = crate::sizing::bench_sizes(
        args.min_bytes,
        args.max_bytes,
        args.factor,
        args.element.dtype,
    )?;
    match args.backend {
        BackendKind::Host => {
            let mut driver = crate::bench_ranks::open(args, &sizes)?;
            crate::bench_report::run(&mut driver, args, &sizes, out)
        }
        BackendKind::Cuda => {
            let mut driver = crate::bench_launch::open(args, &sizes)?;
            crate::bench_report::run(&mut driver, args, &sizes, out)
        }
        BackendKind::Mpi => crate::bench_mpi::run(args, &sizes, out),
    }
}
