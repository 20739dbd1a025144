//! GPU ranks across processes (features `mpi` and `cuda`): each process's rank calls the typed
//! collectives on its own cudarc buffers (`CudaSlice<T>`, `CudaView`, `CudaViewMut`) on the
//! caller's `CudaStream`, as `ncclAllReduce(..., comm, stream)` is called.
//!
//! A call takes the steps of the host typed collectives (`typed.rs`): the same local checks,
//! the same agreement on every rank's descriptor before any data moves (so mismatches are the
//! same errors on every rank), the same rank-space plans proved by the checker and cached per
//! shape. It then runs this rank's part of the plan with the executor's one lowering and
//! runner (`exec::run::run`) on the process's GPU: local copies and reductions are
//! `CudaBackend` launches forked from and joined back into the caller's stream
//! (`CudaBackend::submit_on`), and messages go over one of two transports
//! ([`GpuTransport`]):
//!
//! - [`GpuTransport::Mpi`]: the MPI transport, direct device pointers when the communicator's
//!   transfer mode is [`TransferMode::Direct`] (a CUDA-aware MPI), else staged through pinned
//!   host memory. MPI is driven by the host, so the call waits for the caller's stream before
//!   its first message and returns once the messages are done; the copies after them are
//!   still enqueued on the caller's stream.
//! - [`GpuTransport::Nccl`]: `ncclSend`/`ncclRecv` on the caller's stream
//!   ([`crate::exec::nccl_transport`]), bootstrapped over MPI (`ncclGetUniqueId` on rank 0, its id
//!   broadcast, `ncclCommInitRank`). Nothing waits on the host: the call returns once every
//!   stage is enqueued.
//!
//! Either way a kernel enqueued on the caller's stream after the call sees the result without
//! a host synchronization, and the buffers' cudarc events are recorded on the stream after
//! the call, so their later users and their free come after it. `send`/`recv` agree pairwise
//! as the host ones do, and on a pair's first use agree again on the outcome of preparing it
//! (allocations), so a failure on either side is an error on both before data moves.
//! [`MpiGpu::host`] runs the same path on a host backend with host
//! slices, which is how machines without a GPU exercise it.

use std::sync::Arc;
use std::time::Instant;

use ::mpi::traits::AsRaw;
#[cfg(feature = "nccl")]
use ::mpi::traits::Communicator as _;
#[cfg(feature = "nccl")]
use ::mpi::traits::Root;
#[cfg(all(test, feature = "nccl"))]
use cudarc::driver::CudaContext;
use cudarc::driver::{CudaEvent, CudaStream};
use relaycc_route::{DType, Location, Plan, ReduceOp};

use super::device::{HostBuf, PlanMemory, TransferMode, slot_address, slot_region};
use super::requests::Requests;
use super::roll_call::WaitPoint;
use super::schedule::RankSchedule;
use super::transport::MpiTransport;
use super::typed_call::{CheckedCall, InputAt};
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::backend::host::HostBackend;
use crate::backend::sealed::{Loan, Private};
use crate::backend::{Backend, ByteRegion, Command, DeviceMem, Launch, Program, RawRegion, Slot};
#[cfg(feature = "nccl")]
use crate::cuda;
use crate::cuda::{CudaBackend, CudaError};
use crate::error::CollectivesError;
use crate::exec::lower::Lanes;
#[cfg(feature = "nccl")]
use crate::exec::nccl_transport::{NcclComm, NcclId};
use crate::plan_cache::lru::{Held, Lru};

/// Without feature `nccl` no NCCL communicator exists: the NCCL transport is refused when a
/// rank is made, so the fields that would hold one are always `None`.
#[cfg(not(feature = "nccl"))]
#[derive(Debug)]
enum NcclComm {}
use crate::exec::run::{self, RankMemory};
use crate::rank::{Lender, View};

/// The logical GPU of this process on its backend (the backend maps it to the process's CUDA
/// device).
const GPU: Location = Location::Gpu(0);

/// Which transport carries a GPU rank's messages between processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GpuTransport {
    /// MPI messages: device pointers with a CUDA-aware MPI ([`TransferMode::Direct`]), else
    /// staged through pinned host memory ([`TransferMode::Staged`]); the communicator's
    /// transfer mode decides. Works with any MPI and any number of ranks per GPU.
    #[default]
    Mpi,
    /// `ncclSend`/`ncclRecv` on the caller's stream: asynchronous to the host, device to
    /// device over NCCL's channels. Needs libnccl and one rank per GPU (NCCL's rule).
    Nccl,
}

impl GpuTransport {
    /// The transport's name as the CLI spells it (`mpi`, `nccl`).
    pub fn name(self) -> &'static str {
        match self {
            GpuTransport::Mpi => "mpi",
            GpuTransport::Nccl => "nccl",
        }
    }
}

impl std::str::FromStr for GpuTransport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mpi" => Ok(GpuTransport::Mpi),
            "nccl" => Ok(GpuTransport::Nccl),
            other => Err(format!("unknown transport {other:?} (mpi or nccl)")),
        }
    }
}

/// One cached shape on the GPU: this rank's schedule, its plan memory (scratch, mirrors,
/// staging) on the backend, and its MPI requests.
#[derive(Debug)]
struct GpuPrepared {
    schedule: RankSchedule,
    mem: PlanMemory,
    reqs: Requests,
    algorithm: String,
    dtype: DType,
    op: ReduceOp,
    divisor: u32,
    /// Bindings of the current run and the transport's addresses of them (kept to avoid
    /// allocating per call).
    bindings: Vec<ByteRegion>,
    direct: Vec<Option<RawRegion>>,
    /// What the shape counts against the plan cache's byte limit: for a collective, the
    /// largest run memory (input, output, scratch) of any rank's part, agreed; for a
    /// send/recv pair, this rank's own.
    weight: u64,
}

impl Held for GpuPrepared {
    fn held_bytes(&self) -> u64 {
        self.weight
    }
}

/// The backend a rank's memory is on.
#[derive(Debug, Clone)]
enum Dev {
    /// The process's GPU (calls on the caller's stream).
    Cuda(Arc<CudaBackend>),
    /// The host backend: the same protocol on host slices ([`MpiGpu::host`]).
    Host(Arc<HostBackend>),
}

/// This process's GPU rank of an [`MpiCommunicator`]: a `CudaBackend` on its CUDA device, the
/// transport, and the shapes planned so far. Calls go through [`MpiGpu::on`] with the
/// caller's stream. Host typed calls on the same communicator stay usable; both share its
/// sequence of calls, so every rank must make them in the same order.
pub struct MpiGpu<'c> {
    comm: &'c MpiCommunicator,
    dev: Dev,
    ordinal: usize,
    transport: GpuTransport,
    mode: TransferMode,
    nccl: Option<NcclComm>,
    /// Per agreed call shape, this rank's part: the same shapes on every rank (agreed keys,
    /// weights and limits, a deterministic eviction rule), within the communicator's
    /// [`MpiCommunicator::plan_cache_limits`].
    shapes: Lru<Vec<i64>, GpuPrepared>,
    /// Per (source, destination, count, element type), the send/recv shapes; a pair agrees
    /// whether either side must prepare, so their caches need not hold the same shapes.
    p2p_shapes: Lru<(u32, u32, u64, DType), GpuPrepared>,
    /// Evicted shapes whose memory enqueued work may still use (the wait for `done` failed):
    /// dropped with the rank, after its wait.
    retired: Vec<GpuPrepared>,
    /// Recorded on the caller's stream after each call's last enqueued work: dropping the
    /// rank waits for it before the shapes' memory (scratch, mirrors) is freed, since that
    /// work (a copy out of a mirror, NCCL's transfers) may still read it.
    done: Option<CudaEvent>,
    /// The tag of this rank's next call ([`crate::Collectives::tag_next`]).
    pub(super) next_tag: u64,
}

impl Drop for MpiGpu<'_> {
    fn drop(&mut self) {
        if let Some(e) = &self.done {
            // Best effort: a destructor has nowhere to report a failed wait.
            let _ = e.synchronize();
        }
        self.retired.clear();
    }
}

impl std::fmt::Debug for MpiGpu<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiGpu")
            .field("rank", &self.comm.rank())
            .field("ordinal", &self.ordinal)
            .field("transport", &self.transport)
            .field("mode", &self.mode)
            .field("shapes", &self.shapes.len())
            .finish()
    }
}

fn cuda_err(e: CudaError) -> MpiError {
    MpiError::Backend(CollectivesError::Cuda(e))
}

impl<'c> MpiGpu<'c> {
    /// This process's GPU rank on CUDA device `ordinal` (an ordinal after
    /// `CUDA_VISIBLE_DEVICES`; several processes may share one device with the MPI
    /// transport), with `transport` for its messages. Collective over `comm`: every rank
    /// creates its GPU rank, and a failure on any rank is an error on every rank
    /// ([`MpiError::Peer`] on the others).
    ///
    /// With [`GpuTransport::Nccl`], rank 0 makes an NCCL id (`ncclGetUniqueId`), it is
    /// broadcast over `comm` (`MPI_Bcast`), and every rank joins with `ncclCommInitRank`.
    /// NCCL runs one rank per GPU: two ranks on one device of a host (same PCI address) are
    /// [`CudaError::NcclUnsupported`] on every rank before NCCL is asked.
    ///
    /// Errors: no CUDA driver ([`CudaError::NoDriver`] inside [`MpiError::Backend`], never a
    /// panic), a device that does not exist, no NCCL ([`CudaError::NoNccl`]) with the NCCL
    /// transport, an NCCL status, [`MpiError::Timeout`] when a peer does not take part.
    pub fn new(
        comm: &'c MpiCommunicator,
        ordinal: usize,
        transport: GpuTransport,
    ) -> MpiResult<Self> {
        comm.check_health()?;
        let made = CudaBackend::new(vec![ordinal]).map_err(MpiError::Backend);
        let cuda = super::agree(comm, made, "create a GPU rank", None)?;
        #[cfg_attr(not(feature = "nccl"), allow(unused_mut))]
        let mut gpu = MpiGpu {
            comm,
            dev: Dev::Cuda(Arc::new(cuda)),
            ordinal,
            transport,
            mode: comm.transfer(),
            nccl: None,
            shapes: Lru::default(),
            p2p_shapes: Lru::default(),
            retired: Vec::new(),
            done: None,
            next_tag: 0,
        };
        #[cfg(not(feature = "nccl"))]
        if transport == GpuTransport::Nccl {
            return Err(cuda_err(CudaError::NcclUnsupported(
                "relaycc-collectives is built without its `nccl` feature".into(),
            )));
        }
        #[cfg(feature = "nccl")]
        if transport == GpuTransport::Nccl {
            one_rank_per_gpu(comm, ordinal)?;
            let id = if comm.rank() == 0 {
                NcclId::new().map_err(cuda_err)
            } else {
                cuda::nccl::nccl()
                    .map(|_| NcclId([0; 128]))
                    .map_err(cuda_err)
            };
            let mut id = super::agree(comm, id, "start NCCL", None)?;
            // Every rank is here and healthy (just agreed): a blocking broadcast cannot hang.
            comm.comm().process_at_rank(0).broadcast_into(&mut id.0[..]);
            let joined =
                NcclComm::init_rank(&id, comm.size(), comm.rank(), ordinal).map_err(cuda_err);
            gpu.nccl = Some(super::agree(comm, joined, "join NCCL", None)?);
        }
        Ok(gpu)
    }

    /// A rank whose memory is a host backend of this process: the GPU ranks' protocol
    /// (buffers lent to a backend, mirrors, staging through the backend's host memory, the
    /// runner's synchronization points) on host slices, with the MPI transport in the
    /// communicator's transfer mode; what a machine without a GPU runs to exercise it. Calls
    /// go through [`MpiGpu::on_host`]. Collective only in that it agrees, as
    /// [`MpiGpu::new`] does.
    pub fn host(comm: &'c MpiCommunicator) -> MpiResult<Self> {
        Self::host_on(comm, Arc::new(HostBackend::new()))
    }

    /// [`MpiGpu::host`] on a host backend of the caller's (one with an allocation limit, say,
    /// [`HostBackend::with_allocation_limit`]).
    pub fn host_on(comm: &'c MpiCommunicator, backend: Arc<HostBackend>) -> MpiResult<Self> {
        comm.check_health()?;
        super::agree(comm, Ok(()), "create a host-backed rank", None)?;
        Ok(MpiGpu {
            comm,
            dev: Dev::Host(backend),
            ordinal: 0,
            transport: GpuTransport::Mpi,
            mode: comm.transfer(),
            nccl: None,
            shapes: Lru::default(),
            p2p_shapes: Lru::default(),
            retired: Vec::new(),
            done: None,
            next_tag: 0,
        })
    }

    /// The CUDA device of this rank.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// The transport of this rank's messages.
    pub fn transport(&self) -> GpuTransport {
        self.transport
    }
    /// How MPI messages reach device memory (the communicator's mode when this rank was
    /// made; unused with NCCL).
    pub fn mode(&self) -> TransferMode {
        self.mode
    }
    /// The backend of this rank's memory (one logical GPU, `Location::Gpu(0)`, on
    /// [`Self::ordinal`]; the host backend for [`Self::host`]).
    pub fn backend(&self) -> Arc<dyn Backend> {
        match &self.dev {
            Dev::Cuda(c) => c.clone(),
            Dev::Host(h) => h.clone(),
        }
    }
    /// Collective shapes kept planned (at most the communicator's
    /// [`MpiCommunicator::plan_cache_limits`]' `max_plans`).
    pub fn cached_calls(&self) -> usize {
        self.shapes.len()
    }
    /// Send/recv shapes kept planned (at most the same limit).
    pub fn cached_pairs(&self) -> usize {
        self.p2p_shapes.len()
    }
    /// The communicator.
    pub fn comm(&self) -> &'c MpiCommunicator {
        self.comm
    }

    /// This rank's calls on the caller's CUDA stream `stream` (a stream of
    /// [`Self::ordinal`]): see [`MpiOnStream`].
    pub fn on<'s>(&'s mut self, stream: &'s Arc<CudaStream>) -> MpiOnStream<'s, 'c> {
        MpiOnStream {
            gpu: self,
            stream: Some(stream),
        }
    }

    /// The calls of a rank made by [`Self::host`], on host slices (`&[T]`, `&mut [T]`).
    pub fn on_host(&mut self) -> MpiOnStream<'_, 'c> {
        MpiOnStream {
            gpu: self,
            stream: None,
        }
    }

    /// One call: the local checks' verdict `shape` with what `lender` lent (`vin`: a
    /// separate input; `vout`: the output, holding the input when in place).
    pub(super) fn call(
        &mut self,
        shape: CheckedCall,
        lender: &mut Lender<'_>,
        vin: Option<View>,
        vout: Option<View>,
        stream: Option<&CudaStream>,
    ) -> MpiResult<()> {
        let comm = self.comm;
        comm.check_health()?;
        let CheckedCall {
            mut call,
            mut local,
            input,
            ..
        } = shape;
        if local.is_ok()
            && let Some(e) = lender.take_error()
        {
            local = Err(MpiError::Backend(e));
        }
        let place = place_of(
            &self.dev,
            self.ordinal,
            comm.rank(),
            stream,
            lender,
            &mut local,
        );
        let (seq, local) = comm.next_call(&call, local);
        let (key, all) = comm.agreed(&mut call, local, seq)?;
        if !self.shapes.touch(&key) {
            // Every rank misses here (their caches hold the same shapes). The request and the
            // plan are the same on every rank (so are their errors); the allocations are this
            // rank's, so their outcome is agreed, with the weight. Room for one more shape
            // before allocating, and for its agreed weight after.
            let limits = comm.plan_cache_limits();
            let evicted = self.shapes.evict_to_fit(limits, 1, 0);
            retire(&self.done, &mut self.retired, evicted)?;
            let req = comm.request(&call, &all)?;
            let plan = comm.plan_request(&req)?;
            let made = self.prepare(&plan, comm.comm().as_raw()).map(|p| {
                let bytes = p.weight;
                (p, bytes)
            });
            let at = WaitPoint::call("prepare a GPU call", call.collective(), seq);
            let (mut p, weight) = super::agree_weighed(comm, made, at)?;
            p.weight = weight;
            let evicted = self.shapes.evict_to_fit(limits, 1, weight);
            retire(&self.done, &mut self.retired, evicted)?;
            self.shapes.insert(key.clone(), p);
        }
        let (Some(p), Some(place)) = (self.shapes.peek_mut(&key), place) else {
            return Err(MpiError::Unsupported("a prepared shape vanished".into()));
        };
        comm.set_last_algorithm(&p.algorithm);
        let esize = call.esize();
        let ran = run_prepared(
            p,
            GpuRunContext {
                comm,
                place,
                nccl: self.nccl.as_mut(),
                mode: self.mode,
            },
            lender,
            (input, vin, vout, esize),
        );
        settle(comm, p, &ran);
        let marked = self.mark(stream);
        ran.and(marked)
    }

    /// Record `done` on the caller's stream (GPU ranks), after what a call enqueued there.
    fn mark(&mut self, stream: Option<&CudaStream>) -> MpiResult<()> {
        let Some(stream) = stream else {
            return Ok(());
        };
        let recorded = match &self.done {
            Some(e) => e.record(stream),
            None => stream.record_event(None).map(|e| {
                self.done = Some(e);
            }),
        };
        recorded.map_err(|e| {
            cuda_err(CudaError::Driver {
                call: "cuEventRecord",
                status: format!("{e:?}"),
            })
        })
    }

    /// One send (`sending`) or receive of `count` elements of `dtype` with `peer`, on what
    /// `lender` lent (`view`). The pair agrees first, as the host `send`/`recv` do; a local
    /// error is agreed as an impossible count, so the peer fails with
    /// [`MpiError::CountMismatch`] instead of waiting.
    pub(super) fn p2p(
        &mut self,
        lender: &mut Lender<'_>,
        view: View,
        sending: bool,
        peer: u32,
        (count, dtype): (u64, DType),
        stream: Option<&CudaStream>,
    ) -> MpiResult<()> {
        let comm = self.comm;
        comm.check_health()?;
        let mut local = match lender.take_error() {
            Some(e) => Err(MpiError::Backend(e)),
            None => Ok(()),
        };
        let place = place_of(
            &self.dev,
            self.ordinal,
            comm.rank(),
            stream,
            lender,
            &mut local,
        );
        let agreed_count = if local.is_ok() {
            count
        } else {
            i64::MAX as u64
        };
        let me = comm.rank();
        let key = if sending {
            (me, peer, count, dtype)
        } else {
            (peer, me, count, dtype)
        };
        let cached = self.p2p_shapes.touch(&key);
        let agreed = comm.p2p_agree(peer, sending, agreed_count, dtype, !cached);
        // This rank's own error comes first (the pair saw a count mismatch).
        local?;
        let (_, _, prepare) = agreed?;
        if prepare {
            // One side has no shape for the pair (a first use, or its cache evicted it): both
            // agree on the preparation's outcome too, so an allocation that fails on one side
            // fails both before any data moves, and neither keeps a new shape.
            let made = if cached {
                Ok(None)
            } else {
                let req = comm.p2p_request(key.0, key.1, count, dtype);
                comm.plan_request(&req)
                    .and_then(|plan| self.prepare(&plan, comm.p2p_raw()))
                    .map(Some)
            };
            let prepared_count = if made.is_ok() { count } else { i64::MAX as u64 };
            let both = comm.p2p_agree(peer, sending, prepared_count, dtype, false);
            let made = made?;
            // Both sides agreed the same count before preparing, so a mismatch now is the
            // peer's failed preparation.
            both.map_err(|e| match e {
                MpiError::CountMismatch(_) => MpiError::Peer {
                    rank: peer,
                    step: "prepare its side of the send/recv (its plan or memory)",
                },
                other => other,
            })?;
            if let Some(p) = made {
                let evicted = self
                    .p2p_shapes
                    .evict_to_fit(comm.plan_cache_limits(), 1, p.weight);
                retire(&self.done, &mut self.retired, evicted)?;
                self.p2p_shapes.insert(key, p);
            }
        }
        let (Some(p), Some(place)) = (self.p2p_shapes.peek_mut(&key), place) else {
            return Err(MpiError::Unsupported(
                "a prepared send/recv vanished".into(),
            ));
        };
        let (vin, vout) = if sending {
            (Some(view), None)
        } else {
            (None, Some(view))
        };
        let ran = run_prepared(
            p,
            GpuRunContext {
                comm,
                place,
                nccl: self.nccl.as_mut(),
                mode: self.mode,
            },
            lender,
            (InputAt::Separate, vin, vout, dtype.size()),
        );
        settle(comm, p, &ran);
        let marked = self.mark(stream);
        ran.and(marked)
    }

    /// This rank's schedule of `plan` (local ops on one lane at the GPU) and its memory:
    /// scratch, an input mirror (in-place calls, plans that write their input, and direct
    /// MPI), an output mirror (direct MPI: MPI is never handed the caller's buffers).
    fn prepare(&self, plan: &Plan, mpi: ::mpi::ffi::MPI_Comm) -> MpiResult<GpuPrepared> {
        let comm = self.comm;
        let lanes = Lanes::Fold { count: 1, at: GPU };
        let schedule =
            RankSchedule::with_lanes(plan, comm.rank(), &|l| comm.owner(plan, l), lanes)?;
        let mut mem = PlanMemory::new(self.backend());
        for (bytes, at) in schedule.scratch.iter().zip(&schedule.scratch_at) {
            let at = match at {
                Location::Gpu(_) => GPU,
                host => *host,
            };
            let m = mem.backend.allocate(at, *bytes as u64)?;
            mem.scratch.push(m);
        }
        let direct = self.transport == GpuTransport::Mpi && self.mode == TransferMode::Direct;
        if schedule.input_len > 0 {
            mem.mirrors[0] = Some(mem.backend.allocate(GPU, schedule.input_len as u64)?);
        }
        if direct && schedule.output_len > 0 {
            mem.mirrors[1] = Some(mem.backend.allocate(GPU, schedule.output_len as u64)?);
        }
        let n = 2 + schedule.scratch.len();
        let weight = schedule.run_bytes();
        Ok(GpuPrepared {
            weight,
            reqs: Requests::new(mpi, comm.rank()),
            algorithm: plan.algorithm.clone(),
            dtype: plan.dtype,
            op: plan.request.op,
            divisor: plan.request.nranks() as u32,
            bindings: Vec::with_capacity(n),
            direct: Vec::with_capacity(n),
            schedule,
            mem,
        })
    }
}

/// Where a call's memory is and how its work is ordered.
#[derive(Clone, Copy)]
enum Place<'r> {
    /// The process's GPU; launches and transfers ordered within the caller's stream.
    Cuda {
        cuda: &'r CudaBackend,
        stream: &'r CudaStream,
        ordinal: usize,
    },
    /// The host backend; launches run on its lanes, waited for at the same points.
    Host(&'r HostBackend),
}

impl Place<'_> {
    fn backend(&self) -> &dyn Backend {
        match self {
            Place::Cuda { cuda, .. } => *cuda,
            Place::Host(h) => *h,
        }
    }

    /// Lend the caller's `bytes` bytes at `addr` to the backend for one call.
    ///
    /// # Safety
    /// The memory is the caller's, borrowed for the call (device memory of the rank's device
    /// taken on the caller's stream, or host memory), and stays allocated until every launch
    /// and transfer of the call is done (on the caller's stream for the GPU).
    unsafe fn lend(&self, addr: usize, bytes: u64) -> crate::error::Result<DeviceMem> {
        let loan = match *self {
            Place::Cuda { ordinal, .. } => Loan::Device {
                ordinal,
                ptr: addr as u64,
                bytes,
            },
            Place::Host(_) => Loan::Host { addr, bytes },
        };
        // SAFETY: the caller's contract.
        unsafe { self.backend().lend(GPU, loan, Private) }
    }

    /// Take a lent handle back: without waiting on the GPU (the caller's stream orders the
    /// memory's reuse); after the launches in flight on the host backend.
    fn unlend(&self, m: DeviceMem) {
        self.backend().unlend(m, Private)
    }

    /// Submit launches: ordered within the caller's stream on the GPU.
    ///
    /// # Safety
    /// As [`Backend::submit`].
    unsafe fn submit(&self, launches: &[Launch<'_>]) -> crate::error::Result<()> {
        match self {
            // SAFETY: the caller's contract.
            Place::Cuda { cuda, stream, .. } => unsafe { cuda.submit_on(launches, &[*stream]) },
            // SAFETY: the caller's contract.
            Place::Host(h) => unsafe { h.submit(launches) },
        }
    }

    /// Wait on the host for everything submitted (and, on the GPU, for the caller's stream).
    fn wait(&self) -> crate::error::Result<()> {
        if let Place::Cuda { stream, .. } = self {
            stream.synchronize().map_err(|e| {
                CollectivesError::Cuda(CudaError::Driver {
                    call: "cuStreamSynchronize",
                    status: format!("{e:?}"),
                })
            })?;
        }
        self.backend().synchronize()
    }
}

/// NCCL runs one rank per GPU: ranks that share a device of one host (same shared-memory
/// group, same PCI address, so `CUDA_VISIBLE_DEVICES` that differ per process compare
/// correctly) are refused on every rank, naming the pair, before NCCL is asked. Collective;
/// every rank is there and has a driver (agreed just before).
#[cfg(feature = "nccl")]
fn one_rank_per_gpu(comm: &MpiCommunicator, ordinal: usize) -> MpiResult<()> {
    use ::mpi::collective::{CommunicatorCollectives, SystemOperation};
    let me = comm.rank() as i32;
    let shared = comm.comm().split_shared(me);
    let mut host = 0i32;
    shared.all_reduce_into(&me, &mut host, SystemOperation::min());
    let pci = cuda::devices()
        .ok()
        .and_then(|d| d.get(ordinal).map(|i| i.pci_bus_id.clone()))
        .unwrap_or_default();
    let hash = pci.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    }) >> 2;
    let all = super::agree::collective(
        comm,
        "check one rank per GPU",
        super::agree::AgreementCollective::AllGather,
        vec![i64::from(host), hash as i64],
    )?;
    let rows: Vec<&[i64]> = all.chunks(2).collect();
    for (b, rb) in rows.iter().enumerate() {
        if let Some(a) = rows[..b].iter().position(|ra| ra == rb) {
            return Err(cuda_err(CudaError::NcclUnsupported(format!(
                "ranks {a} and {b} share one GPU; NCCL runs one rank per GPU (use the MPI \
                 transport, GpuTransport::Mpi, to share GPUs)"
            ))));
        }
    }
    Ok(())
}

/// Where a call on `dev` runs, given the caller's `stream` (`None` for a host-backed rank);
/// a stream of another device, host memory on a GPU rank, or a call through the wrong entry
/// point makes `local` an error (a local error, agreed like the others).
fn place_of<'r>(
    dev: &'r Dev,
    ordinal: usize,
    me: u32,
    stream: Option<&'r CudaStream>,
    lender: &Lender<'_>,
    local: &mut MpiResult<()>,
) -> Option<Place<'r>> {
    let mut fail = |message: String| {
        if local.is_ok() {
            *local = Err(MpiError::Unsupported(message));
        }
    };
    match (dev, stream) {
        (Dev::Cuda(cuda), Some(stream)) => {
            let on = stream.context().ordinal();
            if on != ordinal {
                fail(format!(
                    "rank {me}: the stream belongs to CUDA device {on}, this GPU rank runs on \
                     device {ordinal}"
                ));
            }
            if lender.spans().iter().any(|s| s.device.is_none()) {
                fail(format!(
                    "rank {me}: host memory passed to a GPU rank: pass cudarc buffers, or call \
                     the communicator's host collectives"
                ));
            }
            Some(Place::Cuda {
                cuda,
                stream,
                ordinal,
            })
        }
        (Dev::Host(host), None) => Some(Place::Host(host)),
        (Dev::Cuda(_), None) => {
            fail(format!(
                "rank {me}: a GPU rank's calls take the caller's stream: MpiGpu::on"
            ));
            None
        }
        (Dev::Host(_), Some(_)) => {
            fail(format!(
                "rank {me}: a host-backed rank takes host slices: MpiGpu::on_host"
            ));
            None
        }
    }
}

/// Drop a GPU rank's evicted shapes once no work enqueued on the caller's stream can use
/// their memory (a copy out of a mirror, NCCL's transfers): after `done`, recorded after every
/// call's last work, completes. Where that wait fails they go to `retired`, dropped with the
/// rank.
fn retire(
    done: &Option<CudaEvent>,
    retired: &mut Vec<GpuPrepared>,
    evicted: Vec<GpuPrepared>,
) -> MpiResult<()> {
    if evicted.is_empty() {
        return Ok(());
    }
    let waited = match done {
        Some(e) => e.synchronize(),
        None => Ok(()),
    };
    waited.map_err(|e| {
        retired.extend(evicted);
        cuda_err(CudaError::Driver {
            call: "cuEventSynchronize",
            status: format!("{e:?}"),
        })
    })
}

/// After a failed run: the communicator is failed (peers went ahead, or wait for this rank),
/// and MPI requests that could not be cancelled are buried with the shape's plan memory
/// (staging, scratch, mirrors; never the caller's buffers) and a share of the backend.
fn settle(comm: &MpiCommunicator, p: &mut GpuPrepared, ran: &MpiResult<()>) {
    if let Err(e) = ran {
        let health = comm.health();
        health.fail(e);
        if let Some(stuck) = p.reqs.take_stuck() {
            let backend = Arc::clone(&p.mem.backend);
            let kept = std::mem::replace(&mut p.mem, PlanMemory::new(backend));
            health.bury(stuck, Box::new(kept));
        }
    }
}

/// What one run needs besides its prepared shape.
struct GpuRunContext<'r> {
    comm: &'r MpiCommunicator,
    place: Place<'r>,
    nccl: Option<&'r mut NcclComm>,
    mode: TransferMode,
}

/// Handles of the caller's buffers lent to the backend for one call, taken back when dropped,
/// also while unwinding.
struct Lent<'a> {
    place: Place<'a>,
    mems: Vec<DeviceMem>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        for m in self.mems.drain(..) {
            self.place.unlend(m);
        }
    }
}

/// A one-copy program from binding 0 to binding 1 on the GPU's lane.
fn copy_program(p: &GpuPrepared, bytes: u64) -> Program {
    let slot = |binding| Slot {
        binding,
        offset: 0,
        bytes,
    };
    Program {
        lanes: vec![GPU],
        events: 0,
        dtype: p.dtype,
        op: p.op,
        divisor: p.divisor,
        bindings: 2,
        commands: vec![Command::Copy {
            lane: 0,
            src: slot(0),
            dst: slot(1),
        }],
        srcs: Vec::new(),
    }
}

/// Submit a copy from `src` to `dst` (ordered within the caller's stream on the GPU).
fn copy_on(place: Place<'_>, program: &Program, src: ByteRegion, dst: ByteRegion) -> MpiResult<()> {
    let bindings = [src, dst];
    // SAFETY: one copy between two distinct allocations (the caller's buffer and this
    // shape's mirror), ordered within the caller's stream, when no message of the call is
    // pending (before the first stage or after the last).
    unsafe {
        place.submit(&[Launch {
            program,
            bindings: &bindings,
        }])?;
    }
    Ok(())
}

/// Run one call of a prepared shape. `io` is where the input is, the lent views of the
/// input and output, and the element size.
fn run_prepared(
    p: &mut GpuPrepared,
    ctx: GpuRunContext<'_>,
    lender: &Lender<'_>,
    io: (InputAt, Option<View>, Option<View>, u64),
) -> MpiResult<()> {
    let (input, vin, vout, esize) = io;
    let place = ctx.place;
    let mut lent = Lent {
        place,
        mems: Vec::with_capacity(lender.spans().len() + 1),
    };
    for s in lender.spans() {
        // SAFETY: each span is a buffer the caller borrowed for the call: a cudarc buffer of
        // this device (checked before agreement) taken on the caller's stream, whose launches
        // and transfers are ordered within that stream while the buffers' cudarc events are
        // recorded on it after the call; or a host slice, which the host backend's `free`
        // (the unlend) waits for.
        let m = unsafe { place.lend(s.addr, s.bytes) }?;
        lent.mems.push(m);
    }
    // SAFETY: zero bytes: nothing is read or written through it.
    let empty_mem = unsafe { place.lend(0, 0) }?;
    lent.mems.push(empty_mem);
    let empty = ByteRegion {
        mem: empty_mem,
        offset: 0,
        bytes: 0,
    };
    let region = |v: View| -> MpiResult<ByteRegion> {
        let mem = lent.mems.get(v.block).copied().ok_or_else(|| {
            MpiError::Unsupported(format!("view of block {} that was not lent", v.block))
        })?;
        Ok(ByteRegion {
            mem,
            offset: v.offset * esize,
            bytes: v.len * esize,
        })
    };
    let caller_out = vout.map(region).transpose()?;
    let caller_in = match input {
        InputAt::Separate => vin.map(region).transpose()?,
        InputAt::InOutput(ref r) => caller_out.map(|o| ByteRegion {
            offset: o.offset + r.start as u64 * esize,
            bytes: r.len() as u64 * esize,
            ..o
        }),
    };
    let (in_len, out_len) = (p.schedule.input_len as u64, p.schedule.output_len as u64);
    let bad = |side: &'static str, got: u64, needs: u64| MpiError::Buffer {
        side,
        got: got as usize,
        needs: needs as usize,
    };
    let got_in = caller_in.map_or(0, |r| r.bytes);
    if got_in != in_len {
        return Err(bad("input", got_in, in_len));
    }
    let got_out = caller_out.map_or(0, |r| r.bytes);
    if got_out != out_len {
        return Err(bad("output", got_out, out_len));
    }
    let whole = |m: DeviceMem, bytes: u64| ByteRegion {
        mem: m,
        offset: 0,
        bytes,
    };
    let host_sync = ctx.nccl.is_none();
    let direct_mpi = host_sync && ctx.mode == TransferMode::Direct;
    // The input mirror stands in for the caller's input in place (the output overwrites
    // it), when the plan writes its input (the caller's is shared), and with direct MPI
    // (MPI never holds the caller's buffers).
    let mirror_in =
        matches!(input, InputAt::InOutput(_)) || p.schedule.writes_input() || direct_mpi;
    let in_at = match (caller_in, p.mem.mirrors[0]) {
        (Some(c), Some(m)) if mirror_in => {
            let at = whole(m, in_len);
            copy_on(place, &copy_program(p, in_len), c, at)?;
            at
        }
        (Some(c), _) => c,
        (None, _) => empty,
    };
    let out_at = match (caller_out, p.mem.mirrors[1]) {
        (Some(_), Some(m)) => whole(m, out_len),
        (Some(c), None) => c,
        (None, _) => empty,
    };
    p.bindings.clear();
    p.bindings.extend([in_at, out_at]);
    p.bindings
        .extend(p.mem.scratch.iter().map(|m| whole(*m, m.bytes())));
    p.direct.clear();
    for b in &p.bindings {
        let raw = if host_sync && ctx.mode == TransferMode::Staged {
            None
        } else {
            place.backend().raw_region(*b, Private)?
        };
        p.direct.push(raw);
    }
    if host_sync {
        // MPI reads device memory from the host's side: the caller's writes before the call
        // (and the input copy) must be done before the first message.
        place.wait()?;
    }
    let PlanMemory {
        send_stage,
        recv_stage,
        ..
    } = &mut p.mem;
    let mut mem = GpuMemory {
        place,
        bindings: &p.bindings,
        direct: &p.direct,
        send_stage,
        recv_stage,
        host_sync,
    };
    match (ctx.nccl, place) {
        #[cfg(feature = "nccl")]
        (Some(nccl), Place::Cuda { stream, .. }) => {
            let mut t = nccl.transport(stream).map_err(cuda_err)?;
            run::run(&p.schedule.program, &mut mem, &mut t)?;
        }
        _ => {
            let timeout = ctx.comm.timeout();
            let mut t = MpiTransport::new(
                &mut p.reqs,
                Instant::now() + timeout,
                timeout,
                ctx.mode == TransferMode::Direct,
            );
            run::run(&p.schedule.program, &mut mem, &mut t)?;
        }
    }
    if let (Some(c), Some(m)) = (caller_out, p.mem.mirrors[1]) {
        copy_on(place, &copy_program(p, out_len), whole(m, out_len), c)?;
    }
    drop(lent);
    Ok(())
}

/// The runner's view of a GPU rank's memory: bindings on the CUDA backend, launches ordered
/// within the caller's stream, host synchronization only where the transport is driven by
/// the host (MPI).
struct GpuMemory<'m> {
    place: Place<'m>,
    bindings: &'m [ByteRegion],
    direct: &'m [Option<RawRegion>],
    send_stage: &'m mut HostBuf,
    recv_stage: &'m mut HostBuf,
    /// Wait on the host at the runner's synchronization points (MPI); with NCCL the stream
    /// orders everything and nothing waits.
    host_sync: bool,
}

impl GpuMemory<'_> {
    fn region(&self, s: &Slot) -> ByteRegion {
        slot_region(self.bindings, s)
    }
}

// SAFETY: as for `device.rs`'s `BackendMemory`: addresses are the trusted backend's (the
// sealed `Trusted::raw_region`), of this shape's own bindings (mirrors and scratch, kept by
// the shape or, after a failure, the graveyard while MPI may use them) or, with NCCL only, of
// the caller's buffers lent for the call, whose transfers are enqueued on the caller's stream
// and so come before any reuse the caller orders after the call; staging is two host
// buffers of at least the asked sizes owned by the shape, apart from every binding.
unsafe impl RankMemory for GpuMemory<'_> {
    fn address(&self, slot: &Slot) -> Option<RawRegion> {
        slot_address(self.direct, slot)
    }

    unsafe fn launch(&mut self, program: &Program) -> crate::error::Result<()> {
        let launch = Launch {
            program,
            bindings: self.bindings,
        };
        // SAFETY: the program has one lane, so its commands never race each other; its
        // bindings are disjoint (the caller's input and output are distinct cudarc buffers or
        // one buffer with the input in the mirror, the rest are this shape's own); pending
        // transfers use ranges the checker proved disjoint from the segment's ops (the
        // runner's contract); the launch is ordered within the caller's stream, after the
        // transfers of earlier stages enqueued there.
        unsafe { self.place.submit(&[launch]) }
    }

    fn synchronize(&mut self) -> crate::error::Result<()> {
        if !self.host_sync {
            return Ok(());
        }
        self.place.wait()
    }

    fn download(&mut self, slot: &Slot, dst: &mut [u8]) -> crate::error::Result<()> {
        self.place.backend().download(self.region(slot), dst)
    }

    fn upload(&mut self, slot: &Slot, src: &[u8]) -> crate::error::Result<()> {
        self.place.backend().upload(self.region(slot), src)
    }

    fn staging(&mut self, send: usize, recv: usize) -> crate::error::Result<(*mut u8, *mut u8)> {
        let at = Location::Host(0);
        let s = self.send_stage.ensure(self.place.backend(), at, send)?;
        let r = self.recv_stage.ensure(self.place.backend(), at, recv)?;
        Ok((s, r))
    }
}

/// A GPU rank's calls on the caller's CUDA stream ([`MpiGpu::on`]), or on host slices
/// ([`MpiGpu::on_host`]): the per-rank calls of [`crate::Collectives`], the same as threads'
/// ranks make, on cudarc buffers (`CudaSlice<T>`, `CudaView`, `CudaViewMut`, of the stream's
/// device). Root-only buffers are `Option`s, used on the root only. Errors are those of the
/// host calls (mismatches on every rank before data moves), plus a buffer of another device
/// or host memory (a local error: [`MpiError::Peer`] on the others), as
/// [`crate::CollectivesError`] (`CollectivesError::Mpi` for MPI's own).
#[derive(Debug)]
pub struct MpiOnStream<'s, 'c> {
    gpu: &'s mut MpiGpu<'c>,
    /// The caller's stream (`None`: a host-backed rank, [`MpiGpu::on_host`]).
    stream: Option<&'s Arc<CudaStream>>,
}

impl<'s, 'c> MpiOnStream<'s, 'c> {
    /// The GPU rank.
    pub(super) fn gpu(&self) -> &MpiGpu<'c> {
        self.gpu
    }
    /// The GPU rank, to run a call on.
    pub(super) fn gpu_mut(&mut self) -> &mut MpiGpu<'c> {
        self.gpu
    }
    /// The caller's stream (`None`: a host-backed rank).
    pub(super) fn stream_ref(&self) -> Option<&'s CudaStream> {
        self.stream.map(|s| &**s)
    }
    /// A lender for a group's buffers: cudarc buffers lend their device pointers on the
    /// caller's stream.
    pub(super) fn lender(&self) -> Lender<'s> {
        self.stream.map_or_else(Lender::default, Lender::on_stream)
    }
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "nccl")]
    use relaycc_route::{Collective, Request};

    use super::*;
    #[cfg(feature = "nccl")]
    use crate::backend::sealed::Trusted;

    #[test]
    fn transports_parse_by_name() {
        assert_eq!("nccl".parse::<GpuTransport>(), Ok(GpuTransport::Nccl));
        assert_eq!(" MPI ".parse::<GpuTransport>(), Ok(GpuTransport::Mpi));
        assert!("ucx".parse::<GpuTransport>().is_err());
        for t in [GpuTransport::Mpi, GpuTransport::Nccl] {
            assert_eq!(t.name().parse::<GpuTransport>(), Ok(t));
        }
    }

    /// Ranks on threads of one process over NCCL (`ncclCommInitAll`), each running its part of
    /// a rank-space all_reduce with the one runner on its GPU's backend and stream: the path
    /// `MpiGpu` takes over NCCL, bootstrapped without MPI. Needs two GPUs and libnccl.so.
    #[cfg(feature = "nccl")]
    #[test]
    #[ignore = "needs two CUDA GPUs and NCCL"]
    fn ranks_on_threads_over_nccl_all_reduce() {
        const N: u64 = (1 << 20) + 3;
        let req = Request::new(Collective::AllReduce, vec![0, 1], N, DType::F32);
        let plan = relaycc_route::planner::ranks::direct_plan(&req, 256 << 20).expect("plan");
        relaycc_route::check(&plan).expect("checked");
        let comms = NcclComm::init_all(&[0, 1]).expect("ncclCommInitAll");
        let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|mut nccl| {
                    let plan = &plan;
                    s.spawn(move || {
                        let me = nccl.rank();
                        let ordinal = nccl.ordinal();
                        let cuda = CudaBackend::new(vec![ordinal]).expect("backend");
                        let lanes = Lanes::Fold { count: 1, at: GPU };
                        let owner = |l: Location| match l {
                            Location::Gpu(r) => Some(r),
                            Location::Host(_) => None,
                        };
                        let sched =
                            RankSchedule::with_lanes(plan, me, &owner, lanes).expect("lower");
                        let mut sizes = vec![sched.input_len, sched.output_len];
                        sizes.extend(&sched.scratch);
                        let bindings: Vec<ByteRegion> = sizes
                            .iter()
                            .map(|b| ByteRegion {
                                mem: cuda.allocate(GPU, *b as u64).expect("allocate"),
                                offset: 0,
                                bytes: *b as u64,
                            })
                            .collect();
                        let input: Vec<f32> = (0..N).map(|i| (i % 5) as f32 + me as f32).collect();
                        cuda.upload(bindings[0], bytemuck::cast_slice(&input))
                            .expect("upload");
                        let direct: Vec<Option<RawRegion>> = bindings
                            .iter()
                            .map(|b| cuda.raw_region(*b, Private).expect("address"))
                            .collect();
                        let ctx = CudaContext::new(ordinal).expect("context");
                        let stream = ctx.new_stream().expect("stream");
                        let (mut send_stage, mut recv_stage) = (HostBuf::None, HostBuf::None);
                        let mut mem = GpuMemory {
                            place: Place::Cuda {
                                cuda: &cuda,
                                stream: &stream,
                                ordinal,
                            },
                            bindings: &bindings,
                            direct: &direct,
                            send_stage: &mut send_stage,
                            recv_stage: &mut recv_stage,
                            host_sync: false,
                        };
                        let mut t = nccl.transport(&stream).expect("transport");
                        run::run(&sched.program, &mut mem, &mut t).expect("run");
                        stream.synchronize().expect("stream");
                        let mut out = vec![0f32; N as usize];
                        cuda.download(bindings[1], bytemuck::cast_slice_mut(&mut out))
                            .expect("download");
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        let want: Vec<f32> = (0..N).map(|i| 2.0 * (i % 5) as f32 + 1.0).collect();
        assert_eq!(sums[0], want);
        assert_eq!(sums[1], want);
    }
}
