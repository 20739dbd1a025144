//! One call of a GPU rank's prepared shape ([`super::gpu`]): where it runs ([`Place`]: the
//! process's GPU on the caller's stream, or the host backend), the caller's buffers lent for
//! the call, the mirrors' copies in and out, and the executor's one runner over the rank's
//! memory ([`RunMemory`], launching through [`CallLauncher`]) and the MPI or NCCL transport.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaStream;
use relaycc_route::Location;

use super::count_binding::CountBinding;
use super::device::TransferMode;
use super::requests::Requests;
use super::run_memory::{Launcher, MirrorCopies, PlanMemory, RunBindings, RunMemory};
use super::schedule::RankSchedule;
use super::transport::MpiTransport;
use super::typed_call::InputAt;
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::backend::host::HostBackend;
use crate::backend::sealed::{Loan, Private};
use crate::backend::{Backend, ByteRegion, DeviceMem, Launch, Program};
use crate::cuda::{CudaBackend, CudaError};
use crate::error::CollectivesError;
#[cfg(feature = "nccl")]
use crate::exec::nccl_transport::NcclComm;
use crate::exec::run;
use crate::plan_cache::lru::Held;
use crate::rank::{Lender, View};

/// Without feature `nccl` no NCCL communicator exists: the NCCL transport is refused when a
/// rank is made, so the fields that would hold one are always `None`.
#[cfg(not(feature = "nccl"))]
#[derive(Debug)]
pub(super) enum NcclAbsent {}
#[cfg(not(feature = "nccl"))]
use NcclAbsent as NcclComm;

/// The logical GPU of this process on its backend (the backend maps it to the process's CUDA
/// device).
pub(super) const GPU: Location = Location::Gpu(0);

/// One cached shape on the GPU: this rank's schedule, its plan memory (scratch, mirrors,
/// staging) on the backend, the mirrors' copy programs, and its MPI requests.
#[derive(Debug)]
pub(super) struct GpuPrepared {
    pub(super) schedule: RankSchedule,
    pub(super) mem: PlanMemory,
    pub(super) copies: MirrorCopies,
    pub(super) reqs: Requests,
    pub(super) algorithm: String,
    /// A v-collective's capacity plan, cut for count binding; `None` for every other shape.
    /// Where it is set, every call runs its bound schedule, not `schedule`.
    pub(super) binding: Option<Box<CountBinding>>,
    /// Bindings of the current run and the transport's addresses of them (kept to avoid
    /// allocating per call).
    pub(super) run: RunBindings,
    /// What the shape counts against the plan cache's byte limit: for a collective, the
    /// largest run memory (input, output, scratch) of any rank's part, agreed; for a
    /// send/recv pair, this rank's own.
    pub(super) weight: u64,
}

impl Held for GpuPrepared {
    fn held_bytes(&self) -> u64 {
        self.weight
    }
}

/// The backend a rank's memory is on.
#[derive(Debug, Clone)]
pub(super) enum Dev {
    /// The process's GPU (calls on the caller's stream).
    Cuda(Arc<CudaBackend>),
    /// The host backend: the same protocol on host slices ([`MpiGpu::host`]).
    Host(Arc<HostBackend>),
}

pub(super) fn cuda_err(e: CudaError) -> MpiError {
    MpiError::Backend(CollectivesError::Cuda(e))
}

/// Where a call's memory is and how its work is ordered.
#[derive(Clone, Copy)]
pub(super) enum Place<'r> {
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

/// Where a call on `dev` runs, given the caller's `stream` (`None` for a host-backed rank);
/// a stream of another device, host memory on a GPU rank, or a call through the wrong entry
/// point makes `local` an error (a local error, agreed like the others).
pub(super) fn place_of<'r>(
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

/// After a failed run: the communicator is failed (peers went ahead, or wait for this rank),
/// and MPI requests that could not be cancelled are buried with the shape's plan memory
/// (staging, scratch, mirrors; never the caller's buffers) and a share of the backend.
pub(super) fn settle(comm: &MpiCommunicator, p: &mut GpuPrepared, ran: &MpiResult<()>) {
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
pub(super) struct GpuRunContext<'r> {
    pub(super) comm: &'r MpiCommunicator,
    pub(super) place: Place<'r>,
    pub(super) nccl: Option<&'r mut NcclComm>,
    pub(super) mode: TransferMode,
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
pub(super) fn run_prepared(
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
    let schedule = p
        .binding
        .as_deref()
        .map_or(&p.schedule, CountBinding::bound);
    let (in_len, out_len) = (schedule.input_len as u64, schedule.output_len as u64);
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
    let mirror_in = matches!(input, InputAt::InOutput(_)) || schedule.writes_input() || direct_mpi;
    let in_at = match (caller_in, p.mem.mirrors[0]) {
        (Some(c), Some(m)) if mirror_in => {
            let at = whole(m, in_len);
            copy_on(place, &p.copies.copy_in, c, at)?;
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
    // With MPI staged, no binding's address goes to the transport; direct MPI may use device
    // addresses (CUDA-aware), and NCCL reaches device memory only.
    let addresses = !(host_sync && ctx.mode == TransferMode::Staged);
    p.run
        .bind(place.backend(), [in_at, out_at], &p.mem.scratch, addresses)?;
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
    let launcher = CallLauncher { place, host_sync };
    // SAFETY: the schedule was lowered onto one lane (`gpu.rs`'s `prepare`) and the bindings
    // are its regions at its sizes: the caller's input and output checked above, mirrors and
    // scratch allocated for it. They are disjoint: the caller's input and output are distinct
    // buffers, or one buffer with the input in the mirror; the rest are this shape's own.
    // Addresses are the backend's, given by `bind`: with MPI they are of this shape's mirrors
    // and scratch only (direct MPI stands mirrors in for both of the caller's nonempty
    // buffers), which nothing outside the run touches, kept by the shape or, after a failure,
    // by the graveyard (`settle`) while MPI may use them; with NCCL they may be of the
    // caller's buffers lent for the call, whose transfers are enqueued on the caller's stream
    // and so come before any reuse the caller orders after the call. The staging buffers are
    // the shape's, kept the same way.
    let mut mem = unsafe {
        RunMemory::new(
            launcher,
            &p.run,
            (send_stage, recv_stage),
            Location::Host(0),
        )
    };
    match (ctx.nccl, place) {
        #[cfg(feature = "nccl")]
        (Some(nccl), Place::Cuda { stream, .. }) => {
            let mut t = nccl.transport(stream).map_err(cuda_err)?;
            run::run(&schedule.program, &mut mem, &mut t)?;
        }
        _ => {
            let timeout = ctx.comm.timeout.get();
            let mut t = MpiTransport::new(
                &mut p.reqs,
                Instant::now() + timeout,
                timeout,
                ctx.mode == TransferMode::Direct,
            );
            run::run(&schedule.program, &mut mem, &mut t)?;
        }
    }
    if let (Some(c), Some(m)) = (caller_out, p.mem.mirrors[1]) {
        copy_on(place, &p.copies.copy_out, whole(m, out_len), c)?;
    }
    drop(lent);
    Ok(())
}

/// How a GPU rank's run launches: ordered within the caller's stream (or on the host
/// backend's lanes), waited for on the host only where the host drives the transport (MPI).
struct CallLauncher<'r> {
    place: Place<'r>,
    /// Wait on the host at the runner's synchronization points (MPI); with NCCL the stream
    /// orders everything and nothing waits.
    host_sync: bool,
}

impl Launcher for CallLauncher<'_> {
    fn backend(&self) -> &dyn Backend {
        self.place.backend()
    }

    unsafe fn submit(&self, launches: &[Launch<'_>]) -> crate::error::Result<()> {
        // SAFETY: the caller's contract; the launches are ordered within the caller's stream,
        // after the transfers of earlier stages enqueued there.
        unsafe { self.place.submit(launches) }
    }

    fn wait(&self) -> crate::error::Result<()> {
        if !self.host_sync {
            return Ok(());
        }
        self.place.wait()
    }
}

#[cfg(all(test, feature = "nccl"))]
mod tests {
    use cudarc::driver::CudaContext;
    use relaycc_route::{Collective, DType, Request};

    use super::*;
    use crate::backend::RawRegion;
    use crate::backend::sealed::Trusted;
    use crate::exec::lower::Lanes;
    use crate::mpi::run_memory::HostBuf;

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
                        let run_bindings = RunBindings { bindings, direct };
                        let ctx = CudaContext::new(ordinal).expect("context");
                        let stream = ctx.new_stream().expect("stream");
                        let (mut send_stage, mut recv_stage) = (HostBuf::None, HostBuf::None);
                        let launcher = CallLauncher {
                            place: Place::Cuda {
                                cuda: &cuda,
                                stream: &stream,
                                ordinal,
                            },
                            host_sync: false,
                        };
                        // SAFETY: one lane; the bindings are this test's own allocations at
                        // the schedule's sizes, apart from each other, with the backend's
                        // addresses; NCCL's transfers are on `stream`, synchronized below
                        // before anything is read or freed.
                        let mut mem = unsafe {
                            RunMemory::new(
                                launcher,
                                &run_bindings,
                                (&mut send_stage, &mut recv_stage),
                                Location::Host(0),
                            )
                        };
                        let mut t = nccl.transport(&stream).expect("transport");
                        run::run(&sched.program, &mut mem, &mut t).expect("run");
                        stream.synchronize().expect("stream");
                        let mut out = vec![0f32; N as usize];
                        cuda.download(run_bindings.bindings[1], bytemuck::cast_slice_mut(&mut out))
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
