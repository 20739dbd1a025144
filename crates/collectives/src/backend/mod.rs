//! The one seam between the executor and the machines that move bytes.
//!
//! # Protocol
//!
//! A backend owns memory and lanes. Memory is allocated per [`Location`] (a device's memory or
//! pinned memory of a host socket) and named by a [`DeviceMem`] handle; the executor never sees
//! an address. Work arrives as a [`Program`]: a list of [`Command`]s, each on a lane (an
//! in-order queue: a CUDA stream, a host worker thread, an MPI progress queue):
//!
//! - `Copy` and `Reduce` move or combine bytes of [`Slot`]s, which are byte ranges of the
//!   buffers bound to the launch (`bindings[slot.binding]`);
//! - `Record(e)` marks event `e` done when every earlier command of its lane is done (a CUDA
//!   event record);
//! - `Wait(e)` holds every later command of its lane until `e` is done (`cuStreamWaitEvent`).
//!
//! The executor emits commands in an order where every `Wait(e)` follows its `Record(e)`, so a
//! backend may enqueue them one by one in that order (CUDA needs the record enqueued before the
//! wait). [`Backend::submit`] enqueues several programs as one launch (a group call); their
//! lanes are distinct and run concurrently. Launches on one backend run one after another, as
//! operations on one NCCL communicator do; [`Backend::synchronize`] waits for all of them.
//!
//! Host access ([`Backend::upload`], [`Backend::download`]) and [`Backend::free`] wait for the
//! launches in flight first, and no launch starts until they are done, so that no host access
//! ever races a lane and no memory leaves while a launch uses it; this is what keeps the safe
//! API sound although buffers are shared handles used from several threads.
//!
//! A backend checks every launch against the protocol and its allocations before it enqueues
//! a command (`validate.rs`, shared by every backend): a wrong binding, slot, lane or event is
//! an error, never a stray write, and a `Wait` with no earlier `Record` is an error, never a
//! hang. That launches are free of data races is the caller's promise ([`Backend::submit`] is
//! `unsafe`); the executor keeps it for programs compiled from a checked plan.

pub mod host;
mod host_lanes;
mod host_peephole;
pub(crate) mod host_reduce;
pub(crate) mod validate;

use std::fmt;

use relaycc_route::{DType, Location, ReduceOp};

use crate::error::Result;

/// An allocation made by a backend: the handle `free`, `upload`, `download` and launches name
/// it by.
///
/// Safe code gets a handle only from the backend that made the allocation (or from whoever it
/// was handed to), never by writing one: memory that this crate lends to a library by address
/// (MPI's requests in `mpi::DevicePlan`) is reachable through no handle safe code holds, so
/// nothing safe can free or write it while that library may use it. Writing a handle does not
/// compile:
///
/// ```compile_fail,E0451
/// use relaycc_collectives::DeviceMem;
/// use relaycc_route::Location;
/// let forged = DeviceMem { id: 7, location: Location::Gpu(0), bytes: 64 };
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceMem {
    id: u64,
    location: Location,
    bytes: u64,
}

impl DeviceMem {
    /// The handle of allocation `id` of `bytes` bytes at `location`, for a backend that has
    /// just made it.
    ///
    /// # Safety
    ///
    /// Only a backend may call this, for an allocation it made, with the id it gives that
    /// allocation (unique for the backend's lifetime) and its true location and size. A handle
    /// made up for another allocation would let safe code free or write memory that a library
    /// may be using by address.
    pub unsafe fn from_raw_parts(id: u64, location: Location, bytes: u64) -> DeviceMem {
        DeviceMem {
            id,
            location,
            bytes,
        }
    }

    /// The backend's id of the allocation (unique for the backend's lifetime).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where it lives.
    pub fn location(&self) -> Location {
        self.location
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// A byte range of an allocation: what a launch binds to a buffer of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ByteRegion {
    /// The allocation.
    pub mem: DeviceMem,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub bytes: u64,
}

impl ByteRegion {
    /// True when the two ranges share at least one byte of one allocation.
    pub fn overlaps(&self, other: &ByteRegion) -> bool {
        self.mem.id() == other.mem.id()
            && self.bytes > 0
            && other.bytes > 0
            && self.offset < other.offset.saturating_add(other.bytes)
            && other.offset < self.offset.saturating_add(self.bytes)
    }
}

/// Which memory a [`RawRegion`]'s address points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressSpace {
    /// Host memory (the host backend's arenas, CUDA's pinned memory): the CPU and any MPI
    /// library may read and write it.
    Host,
    /// Device memory: only a device-aware library (CUDA-aware MPI) may use the address.
    Device,
}

/// The raw address of a region, for a library that moves bytes outside the backend's launches
/// (MPI); see [`Backend::raw_region`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawRegion {
    /// Address of the region's first byte (a host pointer, or a device pointer).
    pub addr: usize,
    /// Bytes.
    pub bytes: u64,
    /// Host or device memory.
    pub space: AddressSpace,
}

/// A byte range of the buffer bound at `binding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Index into the launch's bindings.
    pub binding: u32,
    /// First byte inside the bound region.
    pub offset: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One command of a [`Program`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Copy `src` to `dst` (same length; they may overlap).
    Copy {
        /// The lane.
        lane: u32,
        /// Source.
        src: Slot,
        /// Destination.
        dst: Slot,
    },
    /// `dst = op(srcs...)` elementwise in the program's type and op; `dst` may be one of the
    /// sources but may not overlap one partially. With `divide` (the `Avg` op), the result
    /// is divided by the program's `divisor`.
    Reduce {
        /// The lane.
        lane: u32,
        /// Sources: `Program::srcs[first..first + count]`.
        first: u32,
        /// Number of sources.
        count: u32,
        /// Destination.
        dst: Slot,
        /// Divide by `divisor` (for `Avg`).
        divide: bool,
    },
    /// Mark event `event` done once every earlier command of `lane` is done.
    Record {
        /// The lane.
        lane: u32,
        /// The event (`0..Program::events`).
        event: u32,
    },
    /// Hold later commands of `lane` until `event` is done.
    Wait {
        /// The lane.
        lane: u32,
        /// The event.
        event: u32,
    },
}

/// Work for a backend: lanes, events and commands (see the module docs for the protocol).
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// The device that drives each lane.
    pub lanes: Vec<Location>,
    /// Number of events.
    pub events: u32,
    /// Element type of every reduction.
    pub dtype: DType,
    /// Reduce op of every reduction.
    pub op: ReduceOp,
    /// Divisor of `Avg` (the number of ranks).
    pub divisor: u32,
    /// Number of bindings a launch must give.
    pub bindings: u32,
    /// Commands, every `Wait` after a `Record` of its event (checked at submission).
    pub commands: Vec<Command>,
    /// Sources of the reductions.
    pub srcs: Vec<Slot>,
}

/// One program and the buffers bound to it.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// The program.
    pub program: &'a Program,
    /// `bindings[i]` is the region of binding `i`.
    pub bindings: &'a [ByteRegion],
}

/// A machine that allocates memory and runs [`Program`]s (host threads, CUDA, MPI).
pub trait Backend: Send + Sync + fmt::Debug {
    /// A short name for messages (`host`, `cuda`).
    fn name(&self) -> &'static str;
    /// Allocate `bytes` bytes (zeroed) at `location`.
    fn allocate(&self, location: Location, bytes: u64) -> Result<DeviceMem>;
    /// Release an allocation once the launches in flight are done. Never fails: an error is
    /// kept and returned by the next [`Backend::synchronize`].
    fn free(&self, mem: DeviceMem);
    /// Copy host bytes into `dst` (after the launches in flight).
    fn upload(&self, dst: ByteRegion, src: &[u8]) -> Result<()>;
    /// Copy `src` into host bytes (after the launches in flight).
    fn download(&self, src: ByteRegion, dst: &mut [u8]) -> Result<()>;
    /// Enqueue programs as one launch; returns once enqueued, after the previous launch in the
    /// backend's order. Errors found before any command runs leave every buffer unchanged:
    /// an unknown allocation, a region outside it, and every protocol rule the shared
    /// validation checks (bindings, lanes, events, slot bounds and alignment, copy and
    /// reduction sizes, each `Wait` after a `Record` of its event).
    ///
    /// Implementations run launches one after another (a launch touches memory only after the
    /// previous one is done with it) and finish every launch they accept.
    ///
    /// # Safety
    ///
    /// The launch must be free of data races, which the backend cannot check in one pass:
    /// when two commands of the launch run on different lanes (of one program or of two) and
    /// touch a common byte of the bound memory, one of them writing it, they belong to one
    /// program and a chain of `Record`/`Wait` orders one before the other. Bindings that
    /// alias count: the rule is about bytes, not binding indices. And no byte a command of
    /// the launch touches, where either side writes it, is touched through a [`RawRegion`]
    /// address (by MPI, say) while the launch runs; bytes no command touches may be.
    ///
    /// [`crate::exec::launch`] keeps this for programs compiled from a
    /// [`relaycc_route::CheckedPlan`]. Calling without `unsafe` does not compile:
    ///
    /// ```compile_fail,E0133
    /// use relaycc_collectives::{Backend, HostBackend, Launch};
    /// fn go(backend: &HostBackend, launches: &[Launch<'_>]) {
    ///     let _ = backend.submit(launches);
    /// }
    /// ```
    unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()>;
    /// Wait for every launch; returns the first error any of them met since the last call.
    fn synchronize(&self) -> Result<()>;
    /// The raw address of `region` for a library that moves bytes outside launches (MPI), or
    /// `None` where the backend keeps its addresses to itself (the default). Host memory comes
    /// back as [`AddressSpace::Host`], device memory as [`AddressSpace::Device`].
    ///
    /// The address stays valid until the allocation is freed. It carries no ordering: the
    /// caller must [`Backend::synchronize`] before it reads bytes a launch wrote, and must not
    /// submit a launch that touches bytes the library is still using.
    ///
    /// This is a safe method any backend may implement, so nothing vouches for the address it
    /// returns: code that hands it to a library writing through it must trust the backend.
    /// The MPI layer (feature `mpi`) uses only the addresses of this crate's backends
    /// ([`crate::HostBackend`], `CudaBackend`, recognised through
    /// [`Backend::as_any`]) and stages the messages of any other backend through memory it
    /// owns.
    ///
    /// Errors: an unknown allocation, or a region outside it.
    fn raw_region(&self, region: ByteRegion) -> Result<Option<RawRegion>> {
        let _ = region;
        Ok(None)
    }
    /// Host time the backend spends enqueuing one op of a plan (its copy or kernel launch and
    /// the event records and waits around it), microseconds. The communicator's planner times
    /// candidates with it ([`relaycc_route::SimConfig::issue_us`]), so that a backend that
    /// launches ops one by one is not handed a plan of thousands of small ops. 0 by default.
    fn op_issue_us(&self) -> f64 {
        0.0
    }
    /// The backend as `Any`, for backend-specific features reached through a `dyn Backend`
    /// (the CUDA backend's zero-copy `CudaSlice` interop). `None` by default.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}
