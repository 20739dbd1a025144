//! Multi-process execution over MPI (feature `mpi`): one process per rank, node-local groups
//! from the shared-memory split, plans executed with nonblocking MPI messages, and the
//! persistent node-aware [`NeighborExchange`]. Protocol and deadlock argument: `README.md`
//! beside this file.
//!
//! Environment:
//! - `RELAYCC_RANKS_PER_NODE=k`: group the ranks of one host into virtual nodes of `k`
//!   consecutive local ranks, so that node-aware strategies run real inter- and intra-node
//!   phases on one machine;
//! - `RELAYCC_MPI_CUDA_AWARE=1`: device buffers go to MPI directly
//!   ([`TransferMode::Direct`] for [`MpiCommunicator::execute_on`], and the models also
//!   consider device-aware staging); otherwise they are staged through the backend's host
//!   memory ([`TransferMode::Staged`]). [`MpiCommunicator::set_transfer`] overrides it;
//! - `RELAYCC_MPI_TIMEOUT_MS` (default 60000): how long a run may wait for its peers before
//!   it fails (see [`MpiError::Timeout`]).

mod device;
mod exchange;
mod indexed;
mod requests;
mod schedule;

use std::time::Duration;

use ::mpi::collective::SystemOperation;
use ::mpi::ffi;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use relaycc_route::{Location, Plan, RouteError};
use relaycc_topo::Topology;

pub use ::mpi as rsmpi;
pub use device::{DevicePlan, TransferMode};
pub use exchange::{Choice, NeighborExchange};

use crate::backend::{Backend, ByteRegion};
use crate::error::CollectivesError;

/// What can go wrong in the MPI backend.
#[derive(Debug, thiserror::Error)]
pub enum MpiError {
    /// The communicator cannot be set up (a bad environment variable).
    #[error("mpi setup: {0}")]
    Setup(String),
    /// Ranks disagree on an exchange's counts (what one sends is not what the other expects).
    #[error("mismatched counts: {0}")]
    CountMismatch(String),
    /// A caller's buffer has the wrong size.
    #[error("{side} buffer holds {got} bytes, the exchange needs {needs}")]
    Buffer {
        /// `input` or `output`.
        side: &'static str,
        /// Bytes given.
        got: usize,
        /// Bytes needed.
        needs: usize,
    },
    /// Peers did not complete their messages in time (a rank exited or hangs); the pending
    /// requests were cancelled. MPI's state is then unknown: the caller should abort.
    #[error(
        "rank {rank}: the {pending} requests of level {level} not all complete after {after:?}"
    )]
    Timeout {
        /// This rank.
        rank: u32,
        /// The dependency level that did not complete.
        level: usize,
        /// Requests still pending.
        pending: usize,
        /// The timeout.
        after: Duration,
    },
    /// An MPI call returned an error code.
    #[error("rank {rank}: {call} failed with MPI error {code}")]
    Mpi {
        /// This rank.
        rank: u32,
        /// The call.
        call: &'static str,
        /// The MPI error code.
        code: i32,
    },
    /// Planning failed.
    #[error("plan: {0}")]
    Plan(#[from] RouteError),
    /// The plan or request is not supported by this backend.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The node's backend failed (allocation, download, upload, a launch).
    #[error("backend: {0}")]
    Backend(#[from] CollectivesError),
    /// Another rank failed a collective step, so this rank stopped too.
    #[error("rank {rank} failed to {step}")]
    Peer {
        /// The lowest failing rank.
        rank: u32,
        /// The step (`prepare a plan`).
        step: &'static str,
    },
}

/// Result of the MPI backend.
pub type MpiResult<T> = std::result::Result<T, MpiError>;

/// One process's view of an MPI job: its rank, the (virtual) node of every rank, its device,
/// and a private duplicate of the world communicator whose errors are returned, not fatal.
pub struct MpiCommunicator {
    comm: SimpleCommunicator,
    rank: u32,
    size: u32,
    node_of: Vec<u32>,
    device: u32,
    cuda_aware: bool,
    transfer: TransferMode,
    timeout: Duration,
    topology: Option<Topology>,
}

impl std::fmt::Debug for MpiCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCommunicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("node_of", &self.node_of)
            .field("device", &self.device)
            .finish()
    }
}

/// A duplicate of `comm` with `MPI_ERRORS_RETURN`, so that a failed call comes back as an
/// error code instead of killing the job.
fn private_dup(comm: &impl Communicator) -> SimpleCommunicator {
    let dup = comm.duplicate();
    // SAFETY: `dup` is a valid communicator and the error handler a predefined constant.
    unsafe { ffi::MPI_Comm_set_errhandler(dup.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
    dup
}

impl MpiCommunicator {
    /// Collective over `world`: split it by shared memory into hosts, cut each host into
    /// virtual nodes of `RELAYCC_RANKS_PER_NODE` local ranks (default: the whole host), and
    /// number the nodes by their lowest rank.
    ///
    /// # Arguments
    /// - `world`: the processes of the job (one per GPU or host device).
    /// - `device`: this process's device index (informational for host memory).
    /// - `topology`: the cluster topology, needed only to run plans that name
    ///   `Location::Host` memories ([`MpiCommunicator::execute`]).
    ///
    /// Errors: a `RELAYCC_RANKS_PER_NODE` that is not a positive integer.
    pub fn from_mpi(
        world: &impl Communicator,
        device: u32,
        topology: Option<Topology>,
    ) -> MpiResult<Self> {
        let k = match std::env::var("RELAYCC_RANKS_PER_NODE") {
            Ok(v) => match v.trim().parse::<i32>() {
                Ok(k) if k > 0 => Some(k),
                _ => {
                    return Err(MpiError::Setup(format!(
                        "RELAYCC_RANKS_PER_NODE={v:?} is not a positive integer"
                    )));
                }
            },
            Err(_) => None,
        };
        let comm = private_dup(world);
        let (rank, size) = (comm.rank(), comm.size());
        let shared = comm.split_shared(rank);
        let mut leader = 0i32;
        shared.all_reduce_into(&rank, &mut leader, SystemOperation::min());
        let local = shared.rank();
        let vnode = k.map_or(0, |k| local / k);
        let key = [leader, vnode];
        let mut all = vec![0i32; 2 * size as usize];
        comm.all_gather_into(&key[..], &mut all[..]);
        let mut ids: Vec<(i32, i32)> = Vec::new();
        let node_of = all
            .chunks(2)
            .map(|c| {
                let key = (c[0], c[1]);
                let id = ids.iter().position(|x| *x == key).unwrap_or_else(|| {
                    ids.push(key);
                    ids.len() - 1
                });
                id as u32
            })
            .collect();
        let timeout = std::env::var("RELAYCC_MPI_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(Duration::from_secs(60), Duration::from_millis);
        let cuda_aware = std::env::var("RELAYCC_MPI_CUDA_AWARE").is_ok_and(|v| v.trim() == "1");
        Ok(MpiCommunicator {
            comm,
            rank: rank as u32,
            size: size as u32,
            node_of,
            device,
            cuda_aware,
            transfer: if cuda_aware {
                TransferMode::Direct
            } else {
                TransferMode::Staged
            },
            timeout,
            topology,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }
    /// Processes in the job.
    pub fn size(&self) -> u32 {
        self.size
    }
    /// The (virtual) node of every rank, numbered by lowest rank.
    pub fn node_of(&self) -> &[u32] {
        &self.node_of
    }
    /// Ranks on this rank's node, in rank order.
    pub fn node_ranks(&self) -> Vec<u32> {
        let me = self.node_of[self.rank as usize];
        (0..self.size)
            .filter(|r| self.node_of[*r as usize] == me)
            .collect()
    }
    /// Number of (virtual) nodes.
    pub fn nodes(&self) -> u32 {
        self.node_of.iter().copied().max().map_or(0, |m| m + 1)
    }
    /// This process's device.
    pub fn device(&self) -> u32 {
        self.device
    }
    /// True when `RELAYCC_MPI_CUDA_AWARE=1`.
    pub fn cuda_aware(&self) -> bool {
        self.cuda_aware
    }
    /// How [`Self::execute_on`] and [`Self::prepare`] move messages of backend memory
    /// (default: [`TransferMode::Direct`] with `RELAYCC_MPI_CUDA_AWARE=1`, else
    /// [`TransferMode::Staged`]).
    pub fn transfer(&self) -> TransferMode {
        self.transfer
    }
    /// Change the transfer mode of later [`Self::prepare`] calls. `Direct` hands device
    /// addresses to MPI: only sound with a CUDA-aware MPI (host memory is fine either way).
    pub fn set_transfer(&mut self, mode: TransferMode) {
        self.transfer = mode;
    }
    /// How long a run waits for its peers.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    /// Change the timeout (tests of faults use short ones).
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }
    /// The communicator (a private duplicate of the world given to [`Self::from_mpi`]).
    pub fn comm(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// The rank that holds a memory of a plan: `Location::Gpu(g)` is the rank whose request
    /// GPU is `g` (rank `i` for plans over GPUs `0..n`); `Location::Host(h)` (a CPU socket of
    /// the topology) is the lowest rank whose GPU sits on the same machine, which therefore
    /// stages host traffic for its node. Host locations need the topology.
    pub fn owner(&self, plan: &Plan, loc: Location) -> Option<u32> {
        match loc {
            Location::Gpu(g) => plan
                .request
                .gpus
                .iter()
                .position(|x| *x == g)
                .map(|r| r as u32),
            Location::Host(h) => {
                let topo = self.topology.as_ref()?;
                let idx = relaycc_topo::NodeId::new(h as usize);
                if h as usize >= topo.graph().node_count() {
                    return None;
                }
                let machine = topo.node(idx).host;
                plan.request
                    .gpus
                    .iter()
                    .position(|g| topo.gpu(*g).is_ok_and(|id| topo.node(id).host == machine))
                    .map(|r| r as u32)
            }
        }
    }

    /// Run this rank's part of `plan` (collective: every rank of the plan calls it with the
    /// same plan). `input` and `output` are this rank's buffers in bytes; scratch is
    /// allocated per call. Reductions run on the rank holding their destination, through the
    /// host backend's kernels.
    ///
    /// Complexity: O(ops) to schedule plus the messages.
    pub fn execute(&self, plan: &Plan, input: &[u8], output: &mut [u8]) -> MpiResult<()> {
        // The schedule's raw copies and messages are race-free only for a checked plan.
        relaycc_route::check(plan)?;
        let sched = schedule::Schedule::new(plan, self.rank, &|l| self.owner(plan, l))?;
        let mut scratch: Vec<Vec<u8>> = sched.scratch.iter().map(|n| vec![0u8; *n]).collect();
        sched.run(
            self.comm.as_raw(),
            input,
            output,
            &mut scratch,
            self.timeout,
        )
    }

    /// Bind this rank's part of `plan` to `backend` for repeated runs: check the plan
    /// (`relaycc_route::check`), schedule it, allocate its scratch on the backend at the
    /// plan's locations (`Location::Gpu(_)` of this rank becomes this process's device
    /// `Location::Gpu(device)`, `Location::Host(h)` stays), and build one program of local
    /// copies and reductions per level. Staging buffers are allocated on the first run that
    /// needs them and reused. The transfer mode is the communicator's now.
    ///
    /// Collective: a failure on any rank is an error on every rank ([`MpiError::Peer`] on
    /// the others), before any message moves.
    pub fn prepare<'a>(
        &'a self,
        backend: &'a dyn Backend,
        plan: &Plan,
    ) -> MpiResult<DevicePlan<'a>> {
        let local = DevicePlan::new(self, backend, plan);
        agree(self.comm(), self.rank, local, "prepare a plan")
    }

    /// Run this rank's part of `plan` on `backend`'s memory: [`Self::prepare`], then
    /// [`DevicePlan::run`] once. `input` and `output` are regions of this backend's memory
    /// (zero-byte regions where the rank has none). Collective.
    pub fn execute_on(
        &self,
        backend: &dyn Backend,
        plan: &Plan,
        input: ByteRegion,
        output: ByteRegion,
    ) -> MpiResult<()> {
        self.prepare(backend, plan)?.run(input, output)
    }

    /// Abort the whole job (after a [`MpiError::Timeout`], MPI's state is unknown).
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}

/// Collective agreement on a local result: every rank learns whether any rank failed, so a
/// local error becomes an error on every rank, not a hang. A rank that failed returns its
/// own error; the others return [`MpiError::Peer`] naming the lowest failing rank.
fn agree<T>(
    comm: &SimpleCommunicator,
    me: u32,
    local: MpiResult<T>,
    step: &'static str,
) -> MpiResult<T> {
    let mine = if local.is_err() { me as i32 } else { i32::MAX };
    let mut first = i32::MAX;
    comm.all_reduce_into(&mine, &mut first, SystemOperation::min());
    match (local, first) {
        (Err(e), _) => Err(e),
        (Ok(v), i32::MAX) => Ok(v),
        (Ok(_), r) => Err(MpiError::Peer {
            rank: r as u32,
            step,
        }),
    }
}
