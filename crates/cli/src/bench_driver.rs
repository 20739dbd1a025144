//! The seam between `relaycc bench`'s report and the backends it times: a [`BenchDriver`]
//! runs one collective call at one size ([`Call`]: the request, sized by
//! [`crate::sizing::bench_request`], the warm-up and timed iterations, whether to check) and
//! returns a [`Measurement`]; [`crate::bench_report`] turns the measurements into the
//! nccl-tests table or JSON. The drivers: the per-rank API on host memory
//! (`bench_ranks.rs`), the whole-communicator launch on CUDA GPUs (`bench_launch.rs`), and one
//! rank per process under `mpirun` on host memory or GPUs (`bench_mpi/`).

use anyhow::Result;
use relaycc_route::Request;

/// One size's call: what every driver runs, times and checks.
#[derive(Debug, Clone)]
pub struct Call {
    /// The collective, its element type, op, root, ranks and counts.
    pub request: Request,
    /// Untimed calls first.
    pub warmup: u32,
    /// Timed calls (at least 1).
    pub iters: u32,
    /// Whether to count the output elements that differ from the expected result.
    pub check: bool,
}

/// What a driver measured at one size.
#[derive(Debug, Clone, Default)]
pub struct Measurement {
    /// Mean seconds per call (the slowest rank's, or thread's, mean).
    pub secs: f64,
    /// Output elements that differ from the expected result (over all ranks); `None` without
    /// `--check`.
    pub wrong: Option<u64>,
    /// Mean seconds of the plain-copy reference: every rank copying the size's bytes within
    /// its own memory on the same executor (the in-process drivers).
    pub copy_secs: Option<f64>,
    /// Mean seconds of the other library's collective timed beside relaycc's, in the same run
    /// (NCCL with `--vs-nccl`, the MPI library with `--vs-mpi`).
    pub beside_secs: Option<f64>,
    /// The algorithm of relaycc's plan at this size, where the driver knows it.
    pub algorithm: Option<String>,
}

/// What the report says about where a driver ran, besides the request.
#[derive(Debug, Clone)]
pub enum Setting {
    /// Every rank in this process: the backend, and NCCL timed beside relaycc.
    InProcess {
        /// The backend's name (`host`, `cuda`).
        backend: String,
        /// The NCCL timed beside relaycc (`--vs-nccl`): library and version.
        nccl: Option<String>,
        /// Why `--vs-nccl` could not time NCCL.
        nccl_unavailable: Option<String>,
    },
    /// One rank per MPI process.
    #[cfg_attr(
        all(not(feature = "mpi"), not(test)),
        expect(dead_code, reason = "made by bench_mpi, built with feature mpi")
    )]
    Mpi(MpiSetting),
}

/// Where an MPI run ran.
#[derive(Debug, Clone)]
pub struct MpiSetting {
    /// Nodes (real or virtual) the processes span.
    pub nodes: u32,
    /// The MPI library (`MPI_Get_library_version`, first line).
    pub mpi_library: String,
    /// Whether relaycc ran in the caller's buffers or in its own (host buffers only).
    pub zero_copy: bool,
    /// Whether the buffers were `SharedHostBuffer`s (`--shared-buffers`).
    pub shared_buffers: bool,
    /// How host messages move between the processes (`MpiCommunicator::host_transport`).
    pub transport: String,
    /// On GPUs: rank 0's device and the transport; `None` on host memory.
    pub gpu: Option<String>,
}

/// A backend `relaycc bench` times: run this collective at this size, these iterations,
/// check it.
pub trait BenchDriver {
    /// The ranks' devices in rank order: the GPUs of every [`Call`]'s request.
    fn devices(&self) -> Vec<u32>;
    /// Run `call`'s warm-up and timed iterations and, when asked, the check.
    fn measure(&mut self, call: &Call) -> Result<Measurement>;
    /// Whether this process writes the report (under MPI, rank 0 alone).
    fn prints(&self) -> bool {
        true
    }
    /// Where the driver ran, asked once every size has run.
    fn setting(&self) -> Setting;
}
