//! The one error type of relaycc-collectives.

use relaycc_route::{DType, RouteError};
use relaycc_topo::TopoError;

/// What can go wrong while building a communicator, checking a call, planning or executing.
///
/// Every variant that comes from a call names the call (`all_reduce`, `group`, ...) so that a
/// message read in a log says which step failed. When a call returns one of the argument
/// errors, no byte of any buffer has changed.
#[derive(Debug, thiserror::Error)]
// Variants depend on features (`Cuda` exists only with `cuda`), so matches need a wildcard.
#[non_exhaustive]
pub enum CollectivesError {
    /// The communicator cannot be built (no devices, a device listed twice, a missing GPU).
    #[error("cannot build communicator: {0}")]
    Setup(String),
    /// A call got a number of per-rank buffers other than the number of ranks.
    #[error("{call}: expected {expected} {side} (one per rank), got {got}")]
    RankCount {
        /// The call.
        call: &'static str,
        /// What was given per rank: `input buffers`, `output buffers`, `counts`, `count
        /// matrix rows`, `counts in a count matrix row`.
        side: &'static str,
        /// The number of ranks.
        expected: usize,
        /// The number given.
        got: usize,
    },
    /// A buffer holds a number of elements other than the call needs.
    #[error("{call}: rank {rank} {side} buffer holds {got} elements, the call needs {needs}")]
    CountMismatch {
        /// The call.
        call: &'static str,
        /// The rank whose buffer is wrong.
        rank: usize,
        /// `input` or `output`.
        side: &'static str,
        /// Elements in the buffer.
        got: u64,
        /// Elements the call needs there.
        needs: u64,
    },
    /// Buffers or matched send/recv pairs of one call disagree on the element type.
    #[error("{call}: element types differ ({a} and {b})")]
    TypeMismatch {
        /// The call.
        call: &'static str,
        /// One type.
        a: DType,
        /// The other type.
        b: DType,
    },
    /// A root or peer rank outside the communicator.
    #[error("{call}: rank {rank} is not a rank of this communicator (0..{ranks})")]
    BadRank {
        /// The call.
        call: &'static str,
        /// The rank given.
        rank: usize,
        /// The number of ranks.
        ranks: usize,
    },
    /// A buffer was allocated by another communicator.
    #[error("{call}: rank {rank} {side} buffer belongs to another communicator")]
    ForeignBuffer {
        /// The call.
        call: &'static str,
        /// The rank position it was passed at.
        rank: usize,
        /// `input` or `output`.
        side: &'static str,
    },
    /// A buffer of one rank was passed at another rank's position.
    #[error("{call}: the {side} buffer at rank {rank} lives on rank {owner}'s device")]
    WrongRank {
        /// The call.
        call: &'static str,
        /// The position it was passed at.
        rank: usize,
        /// `input` or `output`.
        side: &'static str,
        /// The rank whose device holds it.
        owner: usize,
    },
    /// Buffers overlap where the call forbids it (out-of-place input and output, outputs of
    /// two ranks, two operations of one group writing the same memory).
    #[error("{call}: {what}")]
    Overlap {
        /// The call.
        call: &'static str,
        /// Which buffers overlap.
        what: String,
    },
    /// Counts whose sum or product does not fit.
    #[error("{call}: element counts overflow ({what})")]
    Overflow {
        /// The call.
        call: &'static str,
        /// Which count.
        what: String,
    },
    /// A reduce op the element type does not support (avg on integers).
    #[error("{call}: {op} is not defined for {dtype}")]
    UnsupportedOp {
        /// The call.
        call: &'static str,
        /// The op.
        op: relaycc_route::ReduceOp,
        /// The element type.
        dtype: DType,
    },
    /// Sends and receives of a group that do not pair up.
    #[error("group: {0}")]
    Unmatched(String),
    /// The request is malformed or the planner cannot serve it.
    #[error("{call}: {source}")]
    Plan {
        /// The call.
        call: &'static str,
        /// What the planner or the plan checker said.
        #[source]
        source: RouteError,
    },
    /// The executor refused a plan before moving a byte.
    #[error("plan rejected by the executor{}: {message}", at_op(*.op))]
    InvalidPlan {
        /// The op index, `None` for whole-plan problems.
        op: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The backend failed (allocation, an unknown region, a failed lane).
    #[error("backend {backend}: {message}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// What failed.
        message: String,
    },
    /// The ranks of a per-rank call disagree (collective, element type, count, op, root, or
    /// the order of their calls); every rank of the call gets this error and no byte moved.
    #[error("{call}: the ranks' calls do not match: {message}")]
    RankMismatch {
        /// The call on the rank that reports it.
        call: &'static str,
        /// Which ranks differ, and how.
        message: String,
    },
    /// Ranks of a per-rank call did not arrive within the rank's timeout
    /// ([`crate::Collectives::set_timeout`]), or left (their handle was dropped); nothing ran.
    #[error(
        "{call}: rank(s) {missing:?} did not join call {seq} of this communicator within {waited_ms} ms{}",
        if *.gone { " (their handles were dropped)" } else { "" }
    )]
    RankTimeout {
        /// The call on the rank that reports it.
        call: &'static str,
        /// The call's sequence number on this communicator (0 for the first call).
        seq: u64,
        /// The ranks that were missing.
        missing: Vec<usize>,
        /// How long this rank waited, milliseconds.
        waited_ms: u64,
        /// The missing ranks' handles were dropped.
        gone: bool,
    },
    /// A per-rank call failed after the ranks met (a buffer of the wrong length, a plan, the
    /// backend); every rank of the call gets the same error as its source.
    #[error("{call}: {source}")]
    RankFailed {
        /// The call on the rank that reports it.
        call: &'static str,
        /// The error, shared by every rank of the call.
        #[source]
        source: std::sync::Arc<CollectivesError>,
    },
    /// The communicator of a per-rank call was aborted by the failure of an earlier call
    /// (`cause`, from call `seq`): ranks that share one host memory run their calls without
    /// a rendezvous, so after a mismatch, a missing rank or a failed run no later call of
    /// the communicator runs (as after `ncclCommAbort`).
    #[error("{call}: the communicator was aborted at call {seq}: {cause}")]
    Aborted {
        /// The call on the rank that reports it.
        call: &'static str,
        /// The call that failed.
        seq: u64,
        /// Its error.
        #[source]
        cause: std::sync::Arc<CollectivesError>,
    },
    /// A CUDA call failed, or CUDA is absent ([`crate::cuda::CudaError::NoDriver`] on a
    /// machine without an NVIDIA driver).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    /// A topology could not be loaded.
    #[error(transparent)]
    Topo(#[from] TopoError),
    /// An MPI step failed: an agreement, a peer that did not answer in time, an MPI call
    /// (feature `mpi`; [`crate::mpi::MpiError`] says which).
    #[cfg(feature = "mpi")]
    #[error(transparent)]
    Mpi(Box<crate::mpi::MpiError>),
}

/// Where the executor's complaint shows: ` at op N`, or nothing for the whole plan.
fn at_op(op: Option<usize>) -> String {
    op.map(|o| format!(" at op {o}")).unwrap_or_default()
}

/// The result type of relaycc-collectives.
pub type Result<T, E = CollectivesError> = std::result::Result<T, E>;
