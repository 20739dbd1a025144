//! Multi-process execution over MPI (feature `mpi`): one process per rank, node-local groups
//! from the shared-memory split, plans executed with nonblocking MPI messages, and the
//! persistent node-aware [`NeighborExchange`]. Protocol and deadlock argument: `README.md`
//! beside this file.
//!
//! Environment:
//! - `RELAYCC_RANKS_PER_NODE=k`: group the ranks of one host into virtual nodes of `k`
//!   consecutive local ranks, so that node-aware strategies run real inter- and intra-node
//!   phases on one machine;
//! - `RELAYCC_MPI_CUDA_AWARE=1`: device buffers may go to MPI directly (the models then also
//!   consider device-aware staging); otherwise they are staged through host memory. This
//!   backend only runs host memory today, so both paths hand host pointers to MPI;
//! - `RELAYCC_MPI_TIMEOUT_MS` (default 60000): how long a run may wait for its peers before
//!   it fails (see [`MpiError::Timeout`]).

mod exchange;
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
pub use exchange::{Choice, NeighborExchange};

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
        Ok(MpiCommunicator {
            comm,
            rank: rank as u32,
            size: size as u32,
            node_of,
            device,
            cuda_aware: std::env::var("RELAYCC_MPI_CUDA_AWARE").is_ok_and(|v| v.trim() == "1"),
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

    /// Abort the whole job (after a [`MpiError::Timeout`], MPI's state is unknown).
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}
