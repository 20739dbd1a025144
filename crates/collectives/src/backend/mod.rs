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
pub(crate) mod host_here;
mod host_lanes;
mod host_peephole;
pub(crate) mod host_reduce;
pub(crate) mod validate;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use relaycc_route::{DType, Location, ReduceOp};

use crate::error::Result;

/// An allocation made by a backend: the handle `free`, `upload`, `download` and launches name
/// it by.
///
/// Safe code gets a handle only from the backend that made the allocation (or from whoever it
/// was handed to), never by writing one, and a handle names one allocation of one backend:
/// ids are drawn from one counter for the whole process and never reused, so a handle made by
/// one backend names nothing on another (every backend refuses it as unknown), and a handle of
/// freed memory names nothing ever again. Memory that this crate lends to a library by address
/// (MPI's requests in `mpi::DevicePlan`) or borrows from a caller for one call (the per-rank
/// API's slices, which may be lent read-only) is reachable through no handle safe code holds,
/// so nothing safe can free or write it meanwhile. Writing a handle does not compile:
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

/// The next allocation id of any backend of this process (0 is never given).
static NEXT_MEM_ID: AtomicU64 = AtomicU64::new(1);

impl DeviceMem {
    /// The handle of a new allocation of `bytes` bytes at `location`, under an id no other
    /// handle of this process has or will have: for a backend about to enter the allocation
    /// in its table under [`DeviceMem::id`].
    pub(crate) fn fresh(location: Location, bytes: u64) -> DeviceMem {
        DeviceMem {
            // Relaxed: only uniqueness matters, which the atomic increment gives. At one id a
            // nanosecond the counter would take 584 years to wrap.
            id: NEXT_MEM_ID.fetch_add(1, Ordering::Relaxed),
            location,
            bytes,
        }
    }

    /// The id of the allocation (unique in the process, never reused).
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
/// (MPI), as this crate's backends give it (crate-private: `sealed::Trusted::raw_region`), and
/// as a [`crate::exec::run::RankMemory`] gives its slots' addresses to a transport.
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

impl Command {
    /// The lane the command runs on.
    pub fn lane(&self) -> u32 {
        match self {
            Command::Copy { lane, .. }
            | Command::Reduce { lane, .. }
            | Command::Record { lane, .. }
            | Command::Wait { lane, .. } => *lane,
        }
    }
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
///
/// # Sealed
///
/// Only this crate implements `Backend`: [`HostBackend`](crate::HostBackend) and, with
/// feature `cuda`, `CudaBackend`. Memory safety rests on facts a backend states about itself:
/// which memory of a caller it may run a launch on in place (the per-rank calls lend their
/// slices, some of them read-only, for one call), the raw address of an allocation (which the
/// MPI layer hands MPI to write through), and how long lent memory must live. A safe method
/// of a public trait cannot vouch for any of that: an implementation outside the crate could
/// say it is the host backend and then write, through a trusted backend's safe `upload`,
/// into memory a rank lent read-only, or give MPI an address of freed memory. So those facts
/// live in a crate-private supertrait (`sealed::Trusted`: what a backend lends and how,
/// addresses, stream-ordered launches), which no other crate can name or implement, and
/// whose methods no other crate can call (each takes a token only this crate can make); the
/// library reaches a backend through these traits only, never by downcasting. A new backend
/// lives inside this crate (`ARCHITECTURE.md`, "a new backend"). Allocation handles are
/// unforgeable too ([`DeviceMem`]).
///
/// A backend implemented outside the crate does not compile. The issue's two forgeries, safe
/// implementations that showed the library another backend than the one running its
/// launches, are these; the first wrote into an immutable `Arc<Vec<f32>>` two ranks passed to
/// `all_reduce` as input (and segfaulted on a `static` one):
///
/// ```compile_fail,E0277
/// use std::sync::Arc;
/// use relaycc_collectives::{
///     Backend, ByteRegion, Communicator, DeviceMem, HostBackend, Launch, ReduceOp, Result,
///     host_topology,
/// };
/// use relaycc_route::Location;
///
/// /// Shows the library a host backend, whose lent memory it trusts, and runs launches itself.
/// #[derive(Debug, Default)]
/// struct Forged {
///     trusted: HostBackend,
/// }
///
/// impl Backend for Forged {
///     fn name(&self) -> &'static str {
///         "forged"
///     }
///     fn allocate(&self, at: Location, bytes: u64) -> Result<DeviceMem> {
///         self.trusted.allocate(at, bytes)
///     }
///     fn free(&self, mem: DeviceMem) {
///         self.trusted.free(mem)
///     }
///     fn upload(&self, dst: ByteRegion, src: &[u8]) -> Result<()> {
///         self.trusted.upload(dst, src)
///     }
///     fn download(&self, src: ByteRegion, dst: &mut [u8]) -> Result<()> {
///         self.trusted.download(src, dst)
///     }
///     unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()> {
///         // No `unsafe` block: a safe upload writes every region bound to the launch, the
///         // input a rank lent read-only included.
///         for b in launches.iter().flat_map(|l| l.bindings) {
///             self.trusted.upload(*b, &vec![0xAB; b.bytes as usize])?;
///         }
///         Ok(())
///     }
///     fn synchronize(&self) -> Result<()> {
///         self.trusted.synchronize()
///     }
///     fn as_any(&self) -> Option<&dyn std::any::Any> {
///         Some(&self.trusted)
///     }
/// }
///
/// let comm = Communicator::new(host_topology(2)?, &[0, 1], &[], Arc::new(Forged::default()))?;
/// let shared = Arc::new(vec![1.0f32; 1024]);
/// std::thread::scope(|s| {
///     for mut rank in comm.into_ranks() {
///         let shared = shared.clone();
///         s.spawn(move || {
///             let mut out = vec![0f32; 1024];
///             rank.all_reduce(&shared[..], &mut out[..], ReduceOp::Sum)
///         });
///     }
/// });
/// assert_eq!(shared[0], 1.0);
/// # Ok::<(), relaycc_collectives::CollectivesError>(())
/// ```
///
/// The second, through `MpiCommunicator::prepare` (feature `mpi`), allocated in one host
/// backend and showed the MPI layer another, whose addresses for the same allocations were
/// memory it had freed, so a peer's message overwrote reused heap:
///
/// ```compile_fail,E0277
/// use std::sync::Arc;
/// use relaycc_collectives::{
///     Backend, ByteRegion, DeviceMem, HostBackend, Launch, RawRegion, Result,
/// };
/// use relaycc_route::Location;
///
/// #[derive(Debug, Default)]
/// struct Decoy {
///     real: HostBackend,
///     shown: HostBackend,
/// }
///
/// impl Backend for Decoy {
///     fn name(&self) -> &'static str {
///         "decoy"
///     }
///     fn allocate(&self, at: Location, bytes: u64) -> Result<DeviceMem> {
///         // The shown backend's block of the same size is freed at once: its address is
///         // what MPI gets.
///         let shown = self.shown.allocate(at, bytes)?;
///         self.shown.free(shown);
///         self.real.allocate(at, bytes)
///     }
///     fn free(&self, mem: DeviceMem) {
///         self.real.free(mem)
///     }
///     fn upload(&self, dst: ByteRegion, src: &[u8]) -> Result<()> {
///         self.real.upload(dst, src)
///     }
///     fn download(&self, src: ByteRegion, dst: &mut [u8]) -> Result<()> {
///         self.real.download(src, dst)
///     }
///     unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()> {
///         Ok(())
///     }
///     fn synchronize(&self) -> Result<()> {
///         self.real.synchronize()
///     }
///     fn raw_region(&self, region: ByteRegion) -> Result<Option<RawRegion>> {
///         self.shown.raw_region(region)
///     }
///     fn as_any(&self) -> Option<&dyn std::any::Any> {
///         Some(&self.shown)
///     }
/// }
///
/// #[cfg(feature = "mpi")]
/// fn run(comm: &relaycc_collectives::mpi::MpiCommunicator, plan: &relaycc_route::Plan) {
///     let _ = comm.prepare(Arc::new(Decoy::default()), plan);
/// }
/// ```
///
/// Nor can code outside the crate call the trusted methods on a backend it holds (here the
/// raw address of an allocation):
///
/// ```compile_fail,E0061
/// use relaycc_collectives::{ByteRegion, Communicator};
/// use relaycc_route::Location;
/// let comm = Communicator::host(2)?;
/// let mem = comm.backend().allocate(Location::Gpu(0), 8)?;
/// let raw = comm.backend().raw_region(ByteRegion { mem, offset: 0, bytes: 8 });
/// # Ok::<(), relaycc_collectives::CollectivesError>(())
/// ```
pub trait Backend: sealed::Trusted + Send + Sync + fmt::Debug {
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
    /// Host time the backend spends enqueuing one op of a plan (its copy or kernel launch and
    /// the event records and waits around it), microseconds. The communicator's planner times
    /// candidates with it ([`relaycc_route::SimConfig::issue_us`]), so that a backend that
    /// launches ops one by one is not handed a plan of thousands of small ops. 0 by default.
    fn op_issue_us(&self) -> f64 {
        0.0
    }
}

/// The sealed supertrait of [`Backend`]: what a backend states about itself that memory
/// safety rests on, so only this crate's backends may state it. The module is private to the
/// crate, so no other crate can name [`sealed::Trusted`], implement it, or implement
/// `Backend`.
pub(crate) mod sealed {
    use relaycc_route::Location;

    use super::{ByteRegion, DeviceMem, RawRegion};
    use crate::error::Result;

    /// How a backend runs a per-rank call on the memory its ranks lend for the call.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Lending {
        /// Host slices (`&[T]`, `&mut [T]`) lent as [`Loan::Host`]: launches run on the
        /// backend's lanes, the call waits for them, and [`Trusted::unlend`] waits for the
        /// launches in flight before the slice goes back (the host backend).
        HostSlices,
        /// CUDA device memory lent as [`Loan::Device`] on the callers' streams: launches are
        /// ordered within those streams ([`Trusted::submit_on_streams`]) without a host wait,
        /// and [`Trusted::unlend`] does not wait, since each caller's stream orders the
        /// memory's reuse after the launch (the CUDA backend).
        #[cfg(feature = "cuda")]
        DeviceBuffers,
    }

    /// Memory a caller lends to a backend for one call.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Loan {
        /// `bytes` bytes of host memory at `addr`.
        Host {
            /// Address of the first byte (any value when `bytes` is 0).
            addr: usize,
            /// Bytes.
            bytes: u64,
        },
        /// `bytes` bytes of device memory at `ptr` on CUDA device `ordinal`.
        Device {
            /// The CUDA device (the caller's stream's).
            ordinal: usize,
            /// Device address of the first byte.
            ptr: u64,
            /// Bytes.
            bytes: u64,
        },
    }

    /// The last argument of every [`Trusted`] method: a token no other crate can name or make,
    /// so that the methods are callable inside this crate only (a supertrait's methods are
    /// otherwise callable on a `dyn Backend` anywhere, even where the trait cannot be named).
    #[derive(Debug, Clone, Copy)]
    pub struct Private;

    /// Implemented by this crate's backends only (see [`super::Backend`], "Sealed"): the
    /// library trusts what these methods say, and reaches the backend-specific features
    /// through them rather than by downcasting. Each takes a [`Private`] token, so only this
    /// crate calls them.
    pub trait Trusted {
        /// How this backend runs per-rank calls on lent memory.
        fn lending(&self, _: Private) -> Lending;

        /// A handle for the memory of `loan`, accounted to `location`, that launches read and
        /// write in place until [`Trusted::unlend`] takes it back. Memory of the other kind
        /// than [`Trusted::lending`] says (device memory on the host backend, host memory on
        /// the CUDA backend), or of a CUDA device other than `location`'s, is an error.
        ///
        /// # Safety
        ///
        /// The memory stays valid until every launch that uses the handle is done (on the
        /// host backend: until `unlend` returns; on a GPU: the lender orders its free after
        /// the launch on its stream). Nothing else writes it meanwhile, and nothing else reads
        /// it while a launch may write it. The handle goes only to launches whose programs
        /// read it where the lender allows only reads (a shared slice is a plan's input,
        /// which no op of a checked plan writes).
        unsafe fn lend(&self, location: Location, loan: Loan, _: Private) -> Result<DeviceMem>;

        /// Take a lent handle out of the backend's table: after the launches in flight on the
        /// host backend; at once on the CUDA backend (see [`Lending`]). Never fails: a handle
        /// that was not lent is an error kept for the next `synchronize`.
        fn unlend(&self, mem: DeviceMem, _: Private);

        /// The raw address of `region` for a library that moves bytes outside launches (MPI):
        /// host memory as [`super::AddressSpace::Host`], device memory as
        /// [`super::AddressSpace::Device`] (sound to hand MPI only when it is CUDA-aware, the
        /// caller's call), or `None` where the backend gives no address.
        ///
        /// The address is the allocation's until it is freed. It carries no ordering: the
        /// caller synchronizes before it reads bytes a launch wrote, and submits no launch
        /// that touches bytes the library is still using.
        ///
        /// Errors: an unknown allocation, or a region outside it.
        fn raw_region(&self, region: ByteRegion, _: Private) -> Result<Option<RawRegion>>;

        /// Enqueue a launch ordered within the callers' CUDA streams, without a host wait:
        /// work each caller enqueues on its stream afterwards sees the result. An error on
        /// a backend whose [`Trusted::lending`] is not [`Lending::DeviceBuffers`].
        ///
        /// # Safety
        ///
        /// As [`super::Backend::submit`].
        #[cfg(feature = "cuda")]
        unsafe fn submit_on_streams(
            &self,
            launches: &[super::Launch<'_>],
            streams: &[&cudarc::driver::CudaStream],
            _: Private,
        ) -> Result<()>;

        /// The CUDA backend itself, for its cudarc interop (`Communicator::wrap_cuda_slice`,
        /// `DeviceBuffer::into_cuda_slice`); `None` on any other backend.
        #[cfg(feature = "cuda")]
        fn as_cuda(&self, _: Private) -> Option<&crate::cuda::CudaBackend>;
    }
}
