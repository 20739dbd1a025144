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

use ::mpi::traits::AsRaw;
#[cfg(feature = "nccl")]
use ::mpi::traits::Communicator as _;
#[cfg(feature = "nccl")]
use ::mpi::traits::Root;
use cudarc::driver::{CudaEvent, CudaStream};
use relaycc_route::{DType, Location, Plan};

use super::count_binding::{CountBinding, VShape};
use super::device::TransferMode;
#[cfg(not(feature = "nccl"))]
use super::gpu_run::NcclAbsent as NcclComm;
use super::gpu_run::{
    Dev, GPU, GpuPrepared, GpuRunContext, cuda_err, place_of, run_prepared, settle,
};
use super::requests::Requests;
use super::roll_call::WaitPoint;
use super::run_memory::{MirrorCopies, PlanMemory, RunBindings};
use super::schedule::RankSchedule;
use super::typed_call::{CheckedCall, InputAt};
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::backend::Backend;
use crate::backend::host::HostBackend;
use crate::call::CallDesc;
#[cfg(feature = "nccl")]
use crate::cuda;
use crate::cuda::{CudaBackend, CudaError};
use crate::exec::lower::Lanes;
#[cfg(feature = "nccl")]
use crate::exec::nccl_transport::{NcclComm, NcclId};
use crate::plan_cache::lru::Lru;
use crate::rank::{Lender, View};

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
/// This process's GPU rank of an [`MpiCommunicator`]: a `CudaBackend` on its CUDA device, the
/// transport, and the shapes planned so far. Calls go through [`MpiGpu::on`] with the
/// caller's stream. The communicator's own host calls stay usable through a shared reference
/// (`Collectives` on `&MpiCommunicator`); both share its sequence of calls, so every rank
/// must make them in the same order.
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
            .field("rank", &self.comm.rank)
            .field("ordinal", &self.ordinal)
            .field("transport", &self.transport)
            .field("mode", &self.mode)
            .field("shapes", &self.shapes.len())
            .finish()
    }
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
            let id = if comm.rank == 0 {
                NcclId::new().map_err(cuda_err)
            } else {
                cuda::nccl::nccl()
                    .map(|_| NcclId([0; 128]))
                    .map_err(cuda_err)
            };
            let mut id = super::agree(comm, id, "start NCCL", None)?;
            // Every rank is here and healthy (just agreed): a blocking broadcast cannot hang.
            comm.comm().process_at_rank(0).broadcast_into(&mut id.0[..]);
            let joined = NcclComm::init_rank(&id, comm.size, comm.rank, ordinal).map_err(cuda_err);
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
        // A share of the backend, so the place does not borrow `self` while shapes are made.
        let dev = self.dev.clone();
        let place = place_of(&dev, self.ordinal, comm.rank, stream, lender, &mut local);
        let (seq, local) = comm.next_call(&call, local);
        let (exact_key, all) = comm.agreed(&mut call, local, seq)?;
        // The v-collectives run their capacity plan with the call's counts bound
        // (`count_binding.rs`), as the host typed calls do.
        let v = comm.agreed_shape(&call, &all);
        let mut key = v.map_or_else(|| exact_key.clone(), |v| v.key(&call));
        self.prepare_missing(&key, &call, &all, v, seq)?;
        if v.is_some()
            && self
                .shapes
                .peek_mut(&key)
                .is_some_and(|p| p.binding.is_none())
        {
            // A capacity plan that cannot be bound (the same verdict on every rank): the plan
            // of the call's exact counts.
            key = exact_key.clone();
            self.prepare_missing(&key, &call, &all, None, seq)?;
        }
        let (Some(p), Some(place)) = (self.shapes.peek_mut(&key), place) else {
            return Err(MpiError::Unsupported("a prepared shape vanished".into()));
        };
        comm.set_last_algorithm(&p.algorithm);
        if let (Some(b), Some(v)) = (p.binding.as_deref_mut(), v)
            && !b.serves(&exact_key)
        {
            comm.call_counts(&call, &all, v, b.counts_mut())?;
            let bound = b.bind(&p.schedule, &exact_key)?;
            p.copies.set_lens(bound.input_len, bound.output_len);
        }
        let esize = call.dtype.size();
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

    /// Prepare the shape of `key` unless it is cached (every rank misses together: their
    /// caches hold the same shapes). The request and the plan are the same on every rank (so
    /// are their errors); the allocations are this rank's, so their outcome is agreed, with
    /// the weight. Room for one more shape before allocating, and for its agreed weight after.
    /// `v`: a v-collective's capacity shape, whose plan is cut for count binding.
    fn prepare_missing(
        &mut self,
        key: &[i64],
        call: &CallDesc,
        all: &[i64],
        v: Option<VShape>,
        seq: u64,
    ) -> MpiResult<()> {
        if self.shapes.touch(key) {
            return Ok(());
        }
        let comm = self.comm;
        let limits = comm.plan_cache_limits();
        let evicted = self.shapes.evict_to_fit(limits, 1, 0);
        retire(&self.done, &mut self.retired, evicted)?;
        let made = match v {
            Some(v) => self.prepare_capacity(call, v),
            None => comm
                .request(call, all)
                .and_then(|req| comm.plan_request(&req))
                .and_then(|plan| self.prepare(&plan, comm.comm().as_raw())),
        }
        .map(|p| {
            let bytes = p.weight;
            (p, bytes)
        });
        let at = WaitPoint::call("prepare a GPU call", call.collective, seq);
        let (mut p, weight) = super::agree_weighed(comm, made, at)?;
        p.weight = weight;
        let evicted = self.shapes.evict_to_fit(limits, 1, weight);
        retire(&self.done, &mut self.retired, evicted)?;
        self.shapes.insert(key.to_vec(), p);
        Ok(())
    }

    /// The capacity plan of an agreed v-collective (`v`), prepared for this rank and cut for
    /// count binding; where it cannot be bound (the same verdict on every rank) it keeps no
    /// memory and weighs nothing: it only remembers the verdict, and the calls run plans of
    /// their exact counts.
    fn prepare_capacity(&self, call: &CallDesc, v: VShape) -> MpiResult<GpuPrepared> {
        let comm = self.comm;
        let plan = comm.capacity_plan(call, v)?;
        let mut p = self.prepare(&plan, comm.comm().as_raw())?;
        p.binding = CountBinding::new(plan, v.layout, call.dtype.size(), &p.schedule).map(Box::new);
        if p.binding.is_none() {
            p.mem = PlanMemory::new(self.backend());
            p.weight = 0;
        }
        Ok(p)
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
            comm.rank,
            stream,
            lender,
            &mut local,
        );
        let agreed_count = if local.is_ok() {
            count
        } else {
            i64::MAX as u64
        };
        let me = comm.rank;
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
        let schedule = RankSchedule::with_lanes(plan, comm.rank, &|l| comm.owner(plan, l), lanes)?;
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
        let weight = schedule.run_bytes();
        Ok(GpuPrepared {
            weight,
            reqs: Requests::new(mpi, comm.rank),
            algorithm: plan.algorithm.clone(),
            copies: MirrorCopies::new(GPU, plan, &schedule),
            binding: None,
            run: RunBindings::with_capacity(2 + schedule.scratch.len()),
            schedule,
            mem,
        })
    }
}

/// NCCL runs one rank per GPU: ranks that share a device of one host (same shared-memory
/// group, same PCI address, so `CUDA_VISIBLE_DEVICES` that differ per process compare
/// correctly) are refused on every rank, naming the pair, before NCCL is asked. Collective;
/// every rank is there and has a driver (agreed just before).
#[cfg(feature = "nccl")]
fn one_rank_per_gpu(comm: &MpiCommunicator, ordinal: usize) -> MpiResult<()> {
    use ::mpi::collective::{CommunicatorCollectives, SystemOperation};
    let me = comm.rank as i32;
    let shared = comm.comm().split_shared(me);
    let mut host = 0i32;
    shared.all_reduce_into(&me, &mut host, SystemOperation::min());
    let pci = cuda::devices()
        .ok()
        .and_then(|d| d.get(ordinal).map(|i| i.pci_bus_id.clone()))
        .unwrap_or_default();
    let hash = super::agree::fnv62(pci.bytes());
    let all = super::agree::collective(
        comm,
        "check one rank per GPU",
        super::agree::AgreementCollective::AllGather,
        vec![i64::from(host), hash],
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
    use super::*;

    #[test]
    fn transports_parse_by_name() {
        assert_eq!("nccl".parse::<GpuTransport>(), Ok(GpuTransport::Nccl));
        assert_eq!(" MPI ".parse::<GpuTransport>(), Ok(GpuTransport::Mpi));
        assert!("ucx".parse::<GpuTransport>().is_err());
        for t in [GpuTransport::Mpi, GpuTransport::Nccl] {
            assert_eq!(t.name().parse::<GpuTransport>(), Ok(t));
        }
    }
}
