//! `relaycc bench <collective> --backend mpi`: run under `mpirun -np N`, one rank per
//! process on host memory, through the typed per-rank collectives of
//! `relaycc_collectives::mpi::MpiCommunicator`. Rank 0 prints the nccl-tests table (or
//! JSON). With `--vs-mpi` every size is also timed with the MPI library's own collective
//! (`MPI_Allreduce`, `MPI_Allgather(v)`, `MPI_Reduce_scatter_block`, `MPI_Bcast`,
//! `MPI_Alltoall(v)`, `MPI_Reduce`, `MPI_Gather`, `MPI_Scatter`) on the same buffers, the two
//! alternating iteration by iteration; `--check` compares relaycc's output with that
//! collective's element for element on every rank.
//!
//! relaycc runs in zero-copy mode (`MpiCommunicator::set_zero_copy`: messages read and write
//! the benchmark's buffers) unless `RELAYCC_MPI_ZERO_COPY=0` asks for the communicator's own
//! buffers (input copied in, output copied out); the header and the JSON say which.
//!
//! Timing: each iteration starts after a barrier; a rank's time is the sum over iterations of
//! barrier exit to call return, and the reported time is the largest over the ranks.
//!
//! Every wait across the processes ends: the communicator's creation, the barriers
//! (`MpiCommunicator::barrier`), relaycc's calls and the tallies at the end of each size
//! (relaycc's own all_reduce) are bounded by `RELAYCC_MPI_TIMEOUT_MS`. Right after creation
//! the ranks agree on the arguments that shape their calls (collective, type, op, root,
//! sizes, iterations, `--check`, `--vs-mpi`, ...; `MpiCommunicator::agree_settings`), so
//! ranks started with different arguments fail together, each naming the ranks and the
//! arguments that differ, before any call; a rank that never gets there (it failed before
//! creation) is named by the others' creation error. The MPI library's own collectives
//! (`--vs-mpi`, `--check`) are blocking calls, each entered after a bounded barrier by
//! ranks that agreed on its arguments.
//!
//! GPUs (`--gpus LIST` or `--transport mpi|nccl`, a binary built with `cuda` and `mpi`):
//! each process takes the CUDA device `--gpus` names for its local rank (round robin over the
//! list), else its local rank modulo the visible GPUs, and calls the GPU rank's collectives
//! (`MpiGpu::on(&stream)`) on `CudaSlice` buffers; a timed call ends when its stream is
//! synchronized. Messages go over MPI (direct device pointers with
//! `RELAYCC_MPI_CUDA_AWARE=1`, else staged through pinned host memory) or NCCL
//! (`--transport nccl`). `--vs-mpi` and `--check` run the MPI library's collective on host
//! copies of the same inputs.

/// Run `relaycc bench --backend mpi`.
#[cfg(not(feature = "mpi"))]
pub fn run(
    _args: &crate::args::BenchArgs,
    _sizes: &[u64],
    _out: &mut Vec<u8>,
) -> anyhow::Result<()> {
    anyhow::bail!(
        "--backend mpi: this relaycc is built without MPI (build relaycc-cli with --features \
         mpi: Open MPI and libclang)"
    )
}

#[cfg(feature = "mpi")]
pub use imp::run;

#[cfg(feature = "mpi")]
mod gpu;
#[cfg(feature = "mpi")]
mod imp;
