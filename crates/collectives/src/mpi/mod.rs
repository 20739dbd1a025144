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
//! - `RELAYCC_MPI_TIMEOUT_MS` (default 60000): how long creating a communicator, a run, or
//!   any collective step may wait for its peers before it fails (see [`MpiError::Timeout`],
//!   and [`MpiError::Absent`], which names the ranks that did not come and, for a typed
//!   call, the call: a roll call within the timeout finds them, `roll_call.rs`);
//! - `RELAYCC_MPI_ZERO_COPY=1`: the typed collectives hand the caller's buffers to MPI
//!   ([`MpiCommunicator::set_zero_copy`]).

mod agree;
mod call_agreement;
mod count_binding;
mod device;
mod exchange;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod gpu_run;
mod indexed;
mod p2p_group;
mod point_to_point;
mod requests;
mod roll_call;
mod run_memory;
mod runner;
mod schedule;
mod setup;
mod shared_buffer;
mod shm_board;
mod shm_transport;
mod shm_window;
mod transport;
mod typed;
mod typed_call;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
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
#[cfg(feature = "cuda")]
pub use gpu::{GpuTransport, MpiGpu, MpiOnStream};
pub use requests::error_name;
use requests::{Health, Requests};
use schedule::RunBuffers;
pub use shared_buffer::SharedHostBuffer;

use crate::backend::{Backend, ByteRegion};
use crate::error::CollectivesError;
use crate::plan_cache::PlanCacheLimits;
use crate::plan_cache::lru::Lru;

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
    /// Peers did not complete their messages in time (a rank exited, hangs or stopped), or
    /// every rank came to a collective step and it still did not complete (a step whose
    /// ranks did not all come is [`MpiError::Absent`], naming them); pending messages were
    /// cancelled, and requests MPI kept (a collective one cannot be cancelled) hold their
    /// buffers until they complete. The communicator is failed from then on
    /// ([`MpiError::Failed`]).
    #[error(
        "rank {rank}: {step}: the {pending} requests of level {level} not all complete after \
         {after:?}"
    )]
    Timeout {
        /// This rank.
        rank: u32,
        /// What waited: `run` (a run's messages), or the collective step before a run or a
        /// build (`execute a plan`, `prepare a plan`, `build an exchange`).
        step: &'static str,
        /// The stage of the run that did not complete: the rank's n-th dependency level with
        /// messages, from 0 (0 for a step before a run).
        level: usize,
        /// Requests still pending.
        pending: usize,
        /// The timeout.
        after: Duration,
    },
    /// An MPI call returned an error code.
    #[error("rank {rank}: {call} failed: {name} (MPI error {code})")]
    Mpi {
        /// This rank.
        rank: u32,
        /// The call.
        call: &'static str,
        /// The MPI error code.
        code: i32,
        /// MPI's text for the code (`MPI_Error_string`), with its class's.
        name: String,
    },
    /// Ranks disagree on the element size or type of an exchange or plan.
    #[error("mismatched elements: {0}")]
    ElementMismatch(String),
    /// Ranks run different plans in one collective call.
    #[error("mismatched plans: {0}")]
    PlanMismatch(String),
    /// Ranks make different collective calls at one point: another collective, reduce op
    /// or root, or calls in another order.
    #[error("mismatched calls: {0}")]
    CallMismatch(String),
    /// An earlier run on this communicator (or an exchange built from it) failed, so peers
    /// may be gone and MPI's state is unknown; collective calls stop at once instead of
    /// waiting for them. Abort the job ([`MpiCommunicator::abort`]) or finalize.
    #[error("an earlier run failed ({0}); abort the job or finalize")]
    Failed(String),
    /// The shared-memory transport could not move a message: a single-copy read of a peer's
    /// memory failed, or the peer gave the message up (it failed) while it was read.
    #[error("rank {rank}: shared-memory transport: {why}")]
    Transport {
        /// This rank.
        rank: u32,
        /// What failed.
        why: String,
    },
    /// A [`SharedHostBuffer`] could not be allocated (memfd, mapping, size).
    #[error("shared host memory: {0}")]
    SharedMemory(String),
    /// Planning failed.
    #[error("plan: {0}")]
    Plan(#[from] RouteError),
    /// The plan or request is not supported by this backend.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The node's backend failed (allocation, download, upload, a launch).
    #[error("backend: {0}")]
    Backend(#[from] CollectivesError),
    /// Ranks did not come to a collective step within the timeout: they never called it,
    /// left, wait at another step, or were slower than the timeout. Creating a communicator
    /// names them from its arrival words; every later collective step (a typed call's
    /// agreement, a barrier, a build) from a roll call after its deadline, in which the ranks
    /// at the step say so and the others where they wait instead (`roll_call.rs`). The
    /// communicator is failed from then on, as after [`MpiError::Timeout`].
    #[error(
        "rank {rank}: {step}{}: rank(s) {} did not arrive within {after:?}{}",
        call.map(|s| format!(", call #{s} of this communicator")).unwrap_or_default(),
        ranks_text(.missing),
        if elsewhere.is_empty() { String::new() } else { format!(" ({})", elsewhere.join("; ")) }
    )]
    Absent {
        /// This rank.
        rank: u32,
        /// The step: the collective of a typed call (`all_reduce`), or the step itself
        /// (`create the communicator`, `meet at a barrier`).
        step: &'static str,
        /// A typed call's sequence number on this communicator (from 0, as the call
        /// mismatch errors count), `None` for other steps.
        call: Option<u64>,
        /// The ranks that did not come, in rank order.
        missing: Vec<u32>,
        /// Where those of them that answered the roll call wait instead (`rank 3 is at:
        /// broadcast, call #4`).
        elsewhere: Vec<String>,
        /// The timeout.
        after: Duration,
    },
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

/// Ranks as an error lists them: `3`, `3, 5`, or the first 8 and how many more.
fn ranks_text(ranks: &[u32]) -> String {
    let shown: Vec<String> = ranks.iter().take(8).map(u32::to_string).collect();
    match ranks.len() {
        0..=8 => shown.join(", "),
        n => format!("{} and {} more", shown.join(", "), n - 8),
    }
}

/// An MPI error as the one error type of the collectives ([`crate::Collectives`]): a
/// backend's error as itself, every other as [`CollectivesError::Mpi`].
impl From<MpiError> for CollectivesError {
    fn from(e: MpiError) -> Self {
        match e {
            MpiError::Backend(inner) => inner,
            other => CollectivesError::Mpi(Box::new(other)),
        }
    }
}

/// One process's view of an MPI job: its rank, the (virtual) node of every rank, its device,
/// and a private duplicate of the world communicator whose errors are returned, not fatal.
///
/// The communicator is this process's rank of the one front door: it implements
/// [`crate::Collectives`] on host slices (`&[T]`, `&mut [T]`, `Vec<T>`, [`SharedHostBuffer`]),
/// the calls threads' ranks ([`crate::RankComm`]) and GPU ranks make, with the same
/// signatures, so an engine's step generic over the trait runs here unchanged. `rank()`,
/// `ranks()`, the timeout and tags come from the trait too. It also implements the trait for
/// `&MpiCommunicator` (as `std` writes to a `&File`), for a communicator a GPU rank
/// ([`MpiGpu`]) borrows. MPI's own errors come as [`CollectivesError::Mpi`].
pub struct MpiCommunicator {
    comm: SimpleCommunicator,
    rank: u32,
    size: u32,
    node_of: Vec<u32>,
    device: u32,
    cuda_aware: bool,
    transfer: TransferMode,
    /// How long a call waits for its peers; a `Cell` so GPU ranks holding the communicator
    /// shared can set it ([`crate::Collectives::set_timeout`]).
    timeout: Cell<Duration>,
    /// The tag of this rank's next host call ([`crate::Collectives::tag_next`]); a `Cell`
    /// so that calls through a shared reference can set it.
    next_tag: Cell<u64>,
    topology: Option<Topology>,
    /// Failure record and graveyard, shared with the exchanges built from this communicator.
    health: Rc<Health>,
    /// A second private duplicate for send/recv pairs, so point-to-point messages never
    /// match a collective's.
    p2p: SimpleCommunicator,
    /// A third, for the roll call of a step that times out (`roll_call.rs`).
    roll: SimpleCommunicator,
    /// Typed collective calls made so far (the sequence number agreed with every call).
    seq: Cell<u64>,
    /// Per agreed call shape, this rank's schedule and run buffers ([`typed`]), the same
    /// shapes on every rank: keys, weights and limits are agreed, and the eviction rule is
    /// deterministic ([`Lru`]).
    calls: RefCell<Lru<Vec<i64>, typed::PreparedShape>>,
    /// What groups of sends and receives keep between calls (`p2p_group.rs`).
    pair_scratch: RefCell<p2p_group::PairScratch>,
    /// The limits of every plan cache of this communicator and of its GPU ranks, the same on
    /// every rank ([`MpiCommunicator::set_plan_cache_limits`]).
    plan_limits: Cell<PlanCacheLimits>,
    /// Per (peer, sending), send/recv calls made so far with that peer.
    p2p_seq: RefCell<HashMap<(u32, bool), u64>>,
    /// The layout of this rank's next call, for its local checks (`typed_call.rs`): kept so
    /// that a call allocates nothing once it has grown to the call's shape.
    layout_request: RefCell<relaycc_route::Request>,
    /// The algorithm of the last typed collective's plan.
    last_algorithm: RefCell<String>,
    /// Typed collectives run in the caller's buffers ([`MpiCommunicator::set_zero_copy`]).
    zero_copy: bool,
    /// The shared window the typed collectives move their messages through when every rank
    /// shares this host's memory (`shm_transport.rs`); `None`: MPI messages.
    shm: Option<shm_transport::ShmSegment>,
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

/// The timeout `RELAYCC_MPI_TIMEOUT_MS` gives (milliseconds), else 60 s.
fn env_timeout() -> Duration {
    std::env::var("RELAYCC_MPI_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(60), Duration::from_millis)
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
    /// Every rank first waits, at most the timeout (`RELAYCC_MPI_TIMEOUT_MS`), for every
    /// other rank to call it too, then makes its private duplicate of `world` within the
    /// timeout (`setup.rs`), so a rank that never calls it, or whose own setup fails, makes
    /// the others fail instead of hang. The arrival sends one small message to every other
    /// rank on `world` (tag 32417): a receive of any tag posted on `world` meanwhile could
    /// take it.
    ///
    /// # Arguments
    /// - `world`: the processes of the job (one per GPU or host device).
    /// - `device`: this process's device index (informational for host memory).
    /// - `topology`: the cluster topology, needed only to run plans that name
    ///   `Location::Host` memories ([`MpiCommunicator::execute`]).
    ///
    /// Errors: a `RELAYCC_RANKS_PER_NODE` that is not a positive integer (on that rank; the
    /// others return [`MpiError::Peer`] naming it); [`MpiError::Absent`] naming the ranks
    /// that did not call it within the timeout; [`MpiError::Timeout`] when the duplicate is
    /// not made in time (a rank that came after the others gave up); an MPI error.
    pub fn from_mpi(
        world: &impl Communicator,
        device: u32,
        topology: Option<Topology>,
    ) -> MpiResult<Self> {
        let k = match std::env::var("RELAYCC_RANKS_PER_NODE") {
            Ok(v) => match v.trim().parse::<i32>() {
                Ok(k) if k > 0 => Ok(Some(k)),
                _ => Err(MpiError::Setup(format!(
                    "RELAYCC_RANKS_PER_NODE={v:?} is not a positive integer"
                ))),
            },
            Err(_) => Ok(None),
        };
        let timeout = env_timeout();
        let arrived = setup::arrive(world, timeout, k.is_err());
        let k = k?;
        arrived?;
        let comm = setup::duplicate(world, timeout)?;
        let rank = comm.rank();
        let shared = comm.split_shared(rank);
        let mut leader = 0i32;
        shared.all_reduce_into(&rank, &mut leader, SystemOperation::min());
        let local = shared.rank();
        let vnode = k.map_or(0, |k| local / k);
        let key = [leader, vnode];
        let node_of = node_ids(&comm, &key);
        Ok(Self::assemble(comm, node_of, device, topology))
    }

    /// A communicator over `comm` (already private, errors returned) with the given nodes.
    fn assemble(
        comm: SimpleCommunicator,
        node_of: Vec<u32>,
        device: u32,
        topology: Option<Topology>,
    ) -> Self {
        let (rank, size) = (comm.rank(), comm.size());
        let timeout = env_timeout();
        let cuda_aware = std::env::var("RELAYCC_MPI_CUDA_AWARE").is_ok_and(|v| v.trim() == "1");
        let p2p = private_dup(&comm);
        let roll = private_dup(&comm);
        let shm = shm_transport::ShmSegment::new(&comm);
        MpiCommunicator {
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
            timeout: Cell::new(timeout),
            next_tag: Cell::new(0),
            topology,
            health: Rc::default(),
            p2p,
            roll,
            seq: Cell::new(0),
            calls: RefCell::default(),
            pair_scratch: RefCell::default(),
            plan_limits: Cell::new(PlanCacheLimits::default()),
            p2p_seq: RefCell::default(),
            layout_request: RefCell::new(relaycc_route::Request::new(
                relaycc_route::Collective::AllReduce,
                (0..size as u32).collect(),
                0,
                relaycc_route::DType::U8,
            )),
            last_algorithm: RefCell::default(),
            zero_copy: std::env::var("RELAYCC_MPI_ZERO_COPY").is_ok_and(|v| v.trim() == "1"),
            shm,
        }
    }

    /// Split into sub-communicators (`MPI_Comm_split`, rsmpi's `split_by_color_with_key`):
    /// ranks passing the same `color` form one, numbered by `key` (ties by rank here); a
    /// rank passing `None` joins none and gets `None`. Each sub-communicator keeps its
    /// members' (virtual) nodes, renumbered by lowest new rank, this process's device, the
    /// topology, transfer mode and timeout; its calls, plans and failure record are its own.
    ///
    /// Collective over this communicator: the ranks first agree (one nonblocking
    /// `MPI_Iallreduce` within the timeout) that everyone is there and healthy, then split
    /// (blocking, as `MPI_Comm_split` is).
    ///
    /// Errors: [`MpiError::Failed`], [`MpiError::Timeout`], or an MPI error.
    pub fn split(&self, color: Option<u32>, key: i32) -> MpiResult<Option<MpiCommunicator>> {
        use ::mpi::topology::Color;
        self.health.check()?;
        let local = match color {
            Some(c) if c > i32::MAX as u32 => Err(MpiError::Unsupported(format!(
                "rank {}: color {c} is over MPI's int range",
                self.rank
            ))),
            _ => Ok(()),
        };
        agree(self, local, "split a communicator", None)?;
        let c = color.map_or_else(Color::undefined, |c| Color::with_value(c as i32));
        let Some(sub) = self.comm.split_by_color_with_key(c, key) else {
            return Ok(None);
        };
        // SAFETY: `sub` is a valid communicator and the error handler a predefined constant.
        unsafe { ffi::MPI_Comm_set_errhandler(sub.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
        // Each member's node in this communicator, so the sub-communicator groups its
        // members as the parent does.
        let mine = self.node_of[self.rank as usize] as i32;
        let node_of = node_ids(&sub, &[mine, 0]);
        let mut out = Self::assemble(sub, node_of, self.device, self.topology.clone());
        out.timeout.set(self.timeout.get());
        out.plan_limits.set(self.plan_limits.get());
        out.transfer = self.transfer;
        out.zero_copy = self.zero_copy;
        Ok(Some(out))
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
    /// The processes as route's rank-space planner sees them: their (virtual) nodes, whether
    /// device memory goes to MPI directly, Split+MD's cap and the default staging budget.
    pub(crate) fn rank_space(&self) -> relaycc_route::planner::ranks::RankSpace<'_> {
        relaycc_route::planner::ranks::RankSpace {
            node_of: &self.node_of,
            device_aware: self.cuda_aware,
            split_cap_bytes: exchange::default_split_cap(),
            staging_budget: relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES,
        }
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
    /// How the typed collectives move host messages between this communicator's processes:
    /// `"shared memory, single copy from 64 KiB (in user space from shared buffers)"` where
    /// every rank shares this host's memory, may read the others' with `process_vm_readv`
    /// and may map their [`SharedHostBuffer`]s; `"shared memory, single copy from 64 KiB"`
    /// without the mapping; `"shared memory"` where they share memory only
    /// (`RELAYCC_MPI_SINGLE_COPY=0` turns single copies off, `RELAYCC_MPI_SHM=0` shared
    /// memory); `"MPI messages"` otherwise.
    pub fn host_transport(&self) -> String {
        self.shm
            .as_ref()
            .map_or_else(|| "MPI messages".to_string(), |s| s.describe())
    }
    /// True when the typed collectives run in the caller's buffers
    /// ([`Self::set_zero_copy`]).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }
    /// Let the typed collectives hand the caller's buffers to MPI (`true`), or run them in
    /// buffers the communicator owns, with the input copied in and the output copied out
    /// (`false`, the default unless `RELAYCC_MPI_ZERO_COPY=1`). Zero copy saves two copies of
    /// the data per call; its price is in the failure path: when a run fails and MPI keeps
    /// requests it cannot cancel (a peer stopped in the middle of a message), those requests
    /// may still read or write the caller's buffers, which the call cannot keep alive, so
    /// the process aborts the job (`MPI_Abort`) instead of returning. With owned buffers the
    /// call returns [`MpiError::Timeout`] and buries its buffers instead. In-place calls
    /// copy their input either way.
    pub fn set_zero_copy(&mut self, on: bool) {
        self.zero_copy = on;
    }
    /// The limits of this communicator's plan caches (the typed collectives', send/recv's
    /// and its GPU ranks' shapes, each cache on its own): [`PlanCacheLimits::default`] at
    /// creation, a parent's after [`Self::split`].
    pub fn plan_cache_limits(&self) -> PlanCacheLimits {
        self.plan_limits.get()
    }

    /// Collective: new limits for this communicator's plan caches, agreed by every rank
    /// first (as [`Self::agree_settings`]), since every rank's cache must keep the same
    /// shapes. Shapes of the typed collectives beyond them leave at once, least recently used
    /// first; send/recv's and GPU ranks' at their next new shape. A cache keeps at most
    /// `max_plans` shapes (at least one) and, counting each shape at the largest memory any
    /// rank's part of it works in (input, output and scratch), at most `max_scratch_bytes`;
    /// the shape a call needs always stays.
    ///
    /// Errors: [`MpiError::CallMismatch`] on every rank when ranks pass different limits
    /// (nothing changes); [`MpiError::Failed`], [`MpiError::Timeout`] or an MPI error.
    pub fn set_plan_cache_limits(&self, limits: PlanCacheLimits) -> MpiResult<()> {
        self.health.check()?;
        let bytes = i64::try_from(limits.max_scratch_bytes).unwrap_or(i64::MAX);
        let plans = i64::try_from(limits.max_plans).unwrap_or(i64::MAX);
        agree::same_settings(
            self,
            "set the plan cache limits",
            &[("max_plans", plans), ("max_scratch_bytes", bytes)],
        )?;
        self.plan_limits.set(limits);
        drop(self.calls.borrow_mut().evict_to_fit(limits, 0, 0));
        Ok(())
    }

    /// Wait until every rank of the communicator has called `barrier` (`MPI_Barrier`), at
    /// most the timeout: a nonblocking `MPI_Ibarrier` polled against it.
    ///
    /// Errors: [`MpiError::Failed`] after an earlier failure; [`MpiError::Absent`] naming
    /// the ranks that do not come in time (the communicator is failed from then on); an MPI
    /// error.
    pub fn barrier(&self) -> MpiResult<()> {
        self.health.check()?;
        agree::barrier(self, "meet at a barrier")
    }

    /// Collective: check that every rank passes the same `settings` (name and value each,
    /// e.g. a benchmark's arguments, or sizes a job's ranks must share) before anything
    /// depends on them, within the timeout. Every rank gets the same verdict.
    ///
    /// Errors: [`MpiError::CallMismatch`] on every rank, naming each setting whose values
    /// differ, the ranks whose value is not the most common one, their values and the
    /// common one (or saying that the ranks compare different settings);
    /// [`MpiError::Failed`] after an earlier failure; [`MpiError::Absent`] naming the ranks
    /// that do not take part in time; an MPI error.
    pub fn agree_settings(&self, settings: &[(&str, i64)]) -> MpiResult<()> {
        self.health.check()?;
        agree::same_settings(self, "agree on settings", settings)
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
    /// same plan). `input` and `output` are this rank's buffers in bytes. The plan is checked
    /// (`relaycc_route::check`) and its element type and contents agreed across ranks (one
    /// nonblocking `MPI_Iallreduce`, bounded by the timeout) before any message; messages use buffers this call allocates, copied
    /// from `input` before and into `output` after the run, so that no request MPI keeps
    /// after a failure points into the caller's memory. Reductions run on the rank holding
    /// their destination, through the host backend's kernels.
    ///
    /// Errors: a plan that fails the check or cannot be scheduled here (on this rank; the
    /// others return [`MpiError::Peer`]), [`MpiError::ElementMismatch`] or
    /// [`MpiError::PlanMismatch`] on every rank when ranks pass different plans, buffer sizes,
    /// an MPI error or [`MpiError::Timeout`] (after which the communicator is failed).
    ///
    /// Complexity: O(ops) to check and schedule plus the messages.
    pub fn execute(&self, plan: &Plan, input: &[u8], output: &mut [u8]) -> MpiResult<()> {
        self.health.check()?;
        let local = relaycc_route::check(plan)
            .map_err(MpiError::from)
            .and_then(|()| schedule::RankSchedule::new(plan, self.rank, &|l| self.owner(plan, l)));
        let sched = agree(self, local, "execute a plan", Some(plan))?;
        // Messages go over MPI here, which gains nothing from shared memory.
        let mut bufs = RunBuffers::new(&sched, false);
        let mut reqs = Requests::new(self.comm.as_raw(), self.rank);
        let ran = sched.run(&mut reqs, input, output, &mut bufs, self.timeout.get());
        self.health.settle(ran, &mut reqs, move || Box::new(bufs))
    }

    /// The failure record and graveyard shared with exchanges built from this communicator.
    pub(crate) fn health(&self) -> &Rc<Health> {
        &self.health
    }

    /// The communicator of roll calls (`roll_call.rs`).
    pub(crate) fn roll(&self) -> &SimpleCommunicator {
        &self.roll
    }

    /// Typed collective calls this rank has made on this communicator.
    pub(crate) fn calls_made(&self) -> u64 {
        self.seq.get()
    }

    /// `Err(MpiError::Failed)` when a run on this communicator, or on an exchange built from
    /// it, failed before; collective calls check this first.
    pub fn check_health(&self) -> MpiResult<()> {
        self.health.check()
    }

    /// Bind this rank's part of `plan` to `backend` for repeated runs: check the plan
    /// (`relaycc_route::check`), schedule it, allocate its scratch on the backend at the
    /// plan's locations (`Location::Gpu(_)` of this rank becomes this process's device
    /// `Location::Gpu(device)`, `Location::Host(h)` stays), and lower it for this rank with the
    /// executor's one lowering (one backend program of local copies and reductions per
    /// segment, on one lane). Staging buffers are allocated on the first run that
    /// needs them and reused. The transfer mode is the communicator's.
    ///
    /// The plan keeps a share of `backend` (an `Arc<HostBackend>` or `Arc<CudaBackend>`
    /// converts at the call): MPI may hold requests into its memory after a failed run, so
    /// the backend must outlive them, which the plan, and then the communicator's
    /// graveyard, guarantee.
    ///
    /// Collective: a failure on any rank is an error on every rank ([`MpiError::Peer`] on
    /// the others), before any message moves.
    pub fn prepare(&self, backend: Arc<dyn Backend>, plan: &Plan) -> MpiResult<DevicePlan<'_>> {
        self.health.check()?;
        let local = DevicePlan::new(self, backend, plan);
        agree(self, local, "prepare a plan", Some(plan))
    }

    /// Run this rank's part of `plan` on `backend`'s memory: [`Self::prepare`], then
    /// [`DevicePlan::run`] once. `input` and `output` are regions of this backend's memory
    /// (zero-byte regions where the rank has none). Collective.
    pub fn execute_on(
        &self,
        backend: Arc<dyn Backend>,
        plan: &Plan,
        input: ByteRegion,
        output: ByteRegion,
    ) -> MpiResult<()> {
        self.prepare(backend, plan)?.run(input, output)
    }

    /// Abort the whole job (`MPI_Abort`): what a caller does after a [`MpiError::Timeout`]
    /// or [`MpiError::Failed`] when the job cannot go on. Nothing else here aborts.
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}

/// Collective agreement on a local result and, with `plan`, on the plan every rank passed
/// (its element type, and a hash of the whole plan): one nonblocking `MPI_Iallreduce`
/// ([`agree::agree`]). A rank that failed returns its own error; the others return
/// [`MpiError::Peer`] naming the lowest failing rank. When all succeeded but the plans differ,
/// every rank returns [`MpiError::ElementMismatch`] (element types differ) or
/// [`MpiError::PlanMismatch`]. Peers that do not take part in time: [`MpiError::Absent`]
/// naming them.
fn agree<T>(
    comm: &MpiCommunicator,
    local: MpiResult<T>,
    step: &'static str,
    plan: Option<&Plan>,
) -> MpiResult<T> {
    let me = comm.rank;
    let values = plan.map_or(Vec::new(), |p| vec![p.dtype as i64, plan_hash(p)]);
    let got = agree::agree(comm, step, local.is_err(), &values)?;
    let v = match (local, got.failed) {
        (Err(e), _) => return Err(e),
        (Ok(v), None) => v,
        (Ok(_), Some(rank)) => return Err(MpiError::Peer { rank, step }),
    };
    if let (Some(p), [dtypes, hashes]) = (plan, got.ranges.as_slice()) {
        if dtypes.0 != dtypes.1 {
            return Err(MpiError::ElementMismatch(format!(
                "rank {me} runs a plan of {:?} elements ({} bytes); another rank's plan has \
                 another element type",
                p.dtype,
                p.dtype.size()
            )));
        }
        if hashes.0 != hashes.1 {
            return Err(MpiError::PlanMismatch(format!(
                "rank {me} runs plan {:?} of {} ops; another rank passed a different plan",
                p.algorithm,
                p.ops.len()
            )));
        }
    }
    Ok(v)
}

/// Collective agreement on a shape this rank prepared for a call and the bytes it holds:
/// every rank gets its shape, or an error (its own, or [`MpiError::Peer`] naming the lowest
/// failing rank), with the largest of the ranks' bytes, which is the shape's weight against
/// the plan cache's byte limit: the same on every rank, so every rank's cache evicts alike.
/// One nonblocking `MPI_Iallreduce` ([`agree::agree`]).
fn agree_weighed<T>(
    comm: &MpiCommunicator,
    local: MpiResult<(T, u64)>,
    at: roll_call::WaitPoint,
) -> MpiResult<(T, u64)> {
    let step = at.step;
    let bytes = local.as_ref().map_or(0, |(_, b)| *b);
    let words = [i64::try_from(bytes).unwrap_or(i64::MAX)];
    let got = agree::agree(comm, at, local.is_err(), &words)?;
    let (v, _) = match (local, got.failed) {
        (Err(e), _) => return Err(e),
        (Ok(v), None) => v,
        (Ok(_), Some(rank)) => return Err(MpiError::Peer { rank, step }),
    };
    let most = got.ranges.first().map_or(bytes, |r| r.1.max(0) as u64);
    Ok((v, most))
}

/// Number the nodes of `comm`'s ranks by each rank's `key` (equal keys, one node), in the
/// order of their lowest rank (blocking `MPI_Allgather`, as at setup).
fn node_ids(comm: &SimpleCommunicator, key: &[i32; 2]) -> Vec<u32> {
    let size = comm.size() as usize;
    let mut all = vec![0i32; 2 * size];
    comm.all_gather_into(&key[..], &mut all[..]);
    let mut ids: Vec<(i32, i32)> = Vec::new();
    all.chunks(2)
        .map(|c| {
            let key = (c[0], c[1]);
            let id = ids.iter().position(|x| *x == key).unwrap_or_else(|| {
                ids.push(key);
                ids.len() - 1
            });
            id as u32
        })
        .collect()
}

/// [`agree::fnv62`] of the plan's debug text: equal plans hash equally on every rank (the
/// text has no addresses or unordered maps).
fn plan_hash(plan: &Plan) -> i64 {
    agree::fnv62(format!("{plan:?}").bytes())
}
