//! Per-rank collective calls over the flag transport ([`crate::exec::flag_transport`]): each
//! rank runs only its own part of the cached plan, lowered for it once per call shape, with
//! its messages through the rings of its flag channels, and waits for another rank only for
//! a chunk it takes or a slot it fills. No rank meets the others and none runs another's part.
//!
//! A call: this rank's part of the shape's plan (kept, or cut from the communicator's cached
//! plan: the plan lowered for this rank with its scratch), then the call's descriptor posted
//! in the group's book of calls (`begin_call`: the rank that begins a call second finds a
//! mismatch, without waiting), then this rank's own checks of its slices, then the part run
//! on its memory and scratch over its end of the transport: on host slices, by this thread
//! over a host lane before the call returns; on cudarc buffers, enqueued on the caller's
//! stream over a CUDA lane (`flag_streams.rs`), the call returning once it is enqueued. Any
//! failure aborts the group, so a peer's later waits stop with the same words and every
//! later call fails; a rank that stops calling is named with its last call within the
//! timeout.
//!
//! What takes this path: collectives with fixed counts. The v-collectives (whose plans bind
//! each call's counts, and all_to_all_v's need every rank's counts first), sends and
//! receives, splits and groups that mix them meet as on every communicator (`meeting.rs`).
//! A plan that needs a GPU no rank holds (a relay through an idle GPU) cannot run per rank:
//! its calls fail with the lowering's words. In-place calls run on the out-of-place plan
//! with the input copied aside first, so the part's memory is two disjoint buffers, as the
//! runner's memory promises.
//!
//! The group's rings are staging: at most the communicator's staging budget of them in any
//! one rank's memory, a call needing more failing on every rank, naming the budget.
//!
//! A part's scratch is the cached plan's, which the part holds; a CUDA rank waits for its
//! lane's stream before it lets go of a part (a call of a ninth shape), so the scratch is
//! never freed under steps still to run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use relaycc_route::{BufferRef, Collective, InPlace, Location, Plan};

use super::board::lock;
use super::op::{Desc, RankCallOp, Span, View};
use super::{Departure, Left, Lender, RankComm, Shared};
use crate::backend::sealed::{Lending, Private};
use crate::backend::{AddressSpace, ByteRegion, DeviceMem};
use crate::call_checks;
use crate::communicator::Communicator;
#[cfg(feature = "cuda")]
use crate::cuda::flags::{CudaFlagChannels, CudaFlagLane};
use crate::error::{CollectivesError, Result};
use crate::exec::flag_host::{HostFlagChannels, HostFlagLane};
use crate::exec::flag_transport::{FlagLane, FlagShape, FlagTransport};
use crate::exec::lower::{Lanes, RankLayout, RankProgram, lower};
use crate::exec::run::{HostMemory, run};
use crate::plan_cache::Cached;

/// Call shapes a rank keeps its part of; a call of another shape cuts its part again.
const KEPT_PARTS: usize = 8;

/// The flag transport of a communicator's ranks: one end per rank, each used by its own
/// rank's handle only (the lock is never contended).
#[derive(Debug)]
pub(crate) struct FlagRanks {
    shape: FlagShape,
    ranks: Box<[Mutex<FlagRank>]>,
    /// The group's channels, to abort it without a rank's lock (which its rank holds for
    /// the whole of a call).
    channels: Channels,
}

/// A group's channels: host threads' or CUDA streams'.
#[derive(Debug)]
enum Channels {
    Host(Arc<HostFlagChannels>),
    #[cfg(feature = "cuda")]
    Cuda(Arc<CudaFlagChannels>),
}

/// A rank's end of its group's transport.
#[derive(Debug)]
pub(super) enum FlagEnd {
    /// A host thread's: the call runs its steps before it returns.
    Host(FlagTransport<HostFlagLane>),
    /// A CUDA stream's: the call enqueues its steps on the caller's stream.
    #[cfg(feature = "cuda")]
    Cuda(FlagTransport<CudaFlagLane>),
}

impl FlagEnd {
    fn begin_call(&mut self, desc: &Desc) -> Result<u64> {
        match self {
            FlagEnd::Host(t) => t.begin_call(desc),
            #[cfg(feature = "cuda")]
            FlagEnd::Cuda(t) => t.begin_call(desc),
        }
    }

    fn set_timeout(&mut self, timeout: Duration) {
        match self {
            FlagEnd::Host(t) => t.lane_mut().set_timeout(timeout),
            #[cfg(feature = "cuda")]
            FlagEnd::Cuda(t) => t.lane_mut().set_timeout(timeout),
        }
    }

    /// The group's channels.
    fn channels(&self) -> Channels {
        match self {
            FlagEnd::Host(t) => Channels::Host(Arc::clone(t.lane().channels())),
            #[cfg(feature = "cuda")]
            FlagEnd::Cuda(t) => Channels::Cuda(Arc::clone(t.lane().channels())),
        }
    }

    /// Wait until every step this end enqueued is done (host lanes run them before a call
    /// returns).
    fn drain(&self) -> Result<()> {
        match self {
            FlagEnd::Host(_) => Ok(()),
            #[cfg(feature = "cuda")]
            FlagEnd::Cuda(t) => t.lane().synchronize(),
        }
    }

    fn abort(&self, why: String) {
        match self {
            FlagEnd::Host(t) => t.lane().abort(why),
            #[cfg(feature = "cuda")]
            FlagEnd::Cuda(t) => t.lane().abort(why),
        }
    }
}

/// One rank's end of the transport, its kept parts and what its host runs reuse.
#[derive(Debug)]
struct FlagRank {
    end: FlagEnd,
    /// Least recently used first.
    parts: Vec<FlagPart>,
    host: HostRunMemory,
}

/// What a host run reuses from call to call, so that it allocates nothing once warm: the
/// staging memory and the list of its bindings' addresses.
#[derive(Debug, Default)]
struct HostRunMemory {
    staging: Vec<u128>,
    /// Empty between calls: filled, used and cleared within one run.
    bufs: Vec<(*mut u8, usize)>,
}

// SAFETY: `bufs` holds addresses only during a run on the thread that holds the rank's lock
// (`run_on_host` clears it before it returns); between calls it is empty, so moving the
// value to another thread moves no address.
unsafe impl Send for HostRunMemory {}

/// A rank's part of one call shape's plan: the plan lowered for the rank (input binding 0,
/// output 1, then the scratch it holds), the scratch, and the input's copy for in-place
/// calls.
#[derive(Debug)]
pub(super) struct FlagPart {
    pub(super) desc: Desc,
    in_place: bool,
    /// Elements of this rank's input and output.
    needs: (u64, u64),
    /// Where an in-place call's input and output lie in their one buffer.
    layout: Option<InPlace>,
    pub(super) program: RankProgram,
    /// The scratch buffers the rank holds, in binding order (held by `cached`).
    pub(super) scratch: Vec<DeviceMem>,
    /// Their host addresses and bytes, on a host backend.
    scratch_at: Vec<(usize, usize)>,
    _cached: Arc<Cached>,
    /// The input of an in-place call, copied here before the run (host slices).
    aside: Vec<u128>,
    /// What a run on a CUDA stream keeps (made on the first).
    #[cfg(feature = "cuda")]
    pub(super) device: Option<Box<super::flag_streams::PartOnStream>>,
}

/// A call's input and output as the rank lends them (addresses of host slices or device
/// buffers, and bytes), checked against its part, and whether the input must be copied
/// aside first (an in-place call whose input lies in its output).
#[derive(Debug, Clone, Copy)]
pub(super) struct CallSpans {
    pub(super) input: (usize, usize),
    pub(super) output: (usize, usize),
    pub(super) aside: bool,
}

impl FlagRanks {
    /// Host lanes for the ranks of `comm`, whose channels have `shape`.
    pub(crate) fn host(
        comm: &Communicator,
        shape: FlagShape,
        timeout: Duration,
    ) -> Result<FlagRanks> {
        let budget = comm.staging_budget();
        let ends = HostFlagChannels::group(comm.ranks() as u32, shape, timeout, budget);
        FlagRanks::of(shape, ends.into_iter().map(FlagEnd::Host).collect())
    }

    /// CUDA lanes for the ranks of `comm` on `cuda`, each starting on a stream of its own
    /// GPU (each call then enqueues on the caller's stream).
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(
        comm: &Communicator,
        cuda: &crate::cuda::CudaBackend,
        shape: FlagShape,
        timeout: Duration,
    ) -> Result<FlagRanks> {
        let mut streams = Vec::with_capacity(comm.ranks());
        for &gpu in comm.devices() {
            let ordinal = cuda.physical_device(gpu).ok_or_else(|| {
                CollectivesError::Setup(format!("GPU {gpu} has no CUDA device on this backend"))
            })?;
            let stream = cudarc::driver::CudaContext::new(ordinal)
                .and_then(|ctx| ctx.new_stream())
                .map_err(|e| {
                    CollectivesError::Cuda(crate::cuda::CudaError::Driver {
                        call: "cuStreamCreate",
                        status: format!("{e:?}"),
                    })
                })?;
            streams.push(stream);
        }
        let ends = CudaFlagChannels::group(streams, shape, timeout, comm.staging_budget())?;
        FlagRanks::of(shape, ends.into_iter().map(FlagEnd::Cuda).collect())
    }

    /// The ranks of `ends`, one group's, in rank order.
    fn of(shape: FlagShape, ends: Vec<FlagEnd>) -> Result<FlagRanks> {
        let channels = ends
            .first()
            .map(FlagEnd::channels)
            .ok_or_else(|| CollectivesError::Setup("a flag group of no ranks".into()))?;
        Ok(FlagRanks {
            shape,
            channels,
            ranks: ends
                .into_iter()
                .map(|end| {
                    Mutex::new(FlagRank {
                        end,
                        parts: Vec::new(),
                        host: HostRunMemory::default(),
                    })
                })
                .collect(),
        })
    }

    /// The channels' shape.
    pub(crate) fn shape(&self) -> FlagShape {
        self.shape
    }

    /// Why the group was aborted, once it was.
    fn failure(&self) -> Option<String> {
        match &self.channels {
            Channels::Host(c) => c.failure().map(str::to_owned),
            #[cfg(feature = "cuda")]
            Channels::Cuda(c) => c.failure().map(str::to_owned),
        }
    }

    /// Abort the group with `why`: every rank's later waits and calls fail with it.
    pub(crate) fn abort(&self, why: String) {
        match &self.channels {
            Channels::Host(c) => c.abort(why),
            #[cfg(feature = "cuda")]
            Channels::Cuda(c) => c.abort(why),
        }
    }

    /// Rank `rank`'s handle is gone: a peer that begins a call it never began fails at
    /// once, naming it, and on host lanes so does a peer that waits for it.
    pub(crate) fn leave(&self, rank: usize) {
        match &self.channels {
            Channels::Host(c) => c.leave(rank as u32),
            #[cfg(feature = "cuda")]
            Channels::Cuda(c) => c.leave(rank as u32),
        }
    }
}

impl Shared {
    /// What the ranks of `comm` share, their collectives over flag lanes of `shape`: host
    /// threads for a backend of host slices, the ranks' CUDA streams for the CUDA backend.
    pub(crate) fn with_flags(comm: Communicator, shape: FlagShape) -> Result<Shared> {
        let timeout = super::DEFAULT_RANK_TIMEOUT;
        let flags = match comm.backend().lending(Private) {
            Lending::HostSlices => FlagRanks::host(&comm, shape, timeout)?,
            #[cfg(feature = "cuda")]
            Lending::DeviceBuffers => {
                let cuda = comm.backend().as_cuda(Private).ok_or_else(|| {
                    CollectivesError::Setup(format!(
                        "flag lanes on device buffers need the CUDA backend, not the {} backend",
                        comm.backend().name()
                    ))
                })?;
                FlagRanks::cuda(&comm, cuda, shape, timeout)?
            }
        };
        let mut shared = Shared::new(comm);
        shared.flags = Some(flags);
        Ok(shared)
    }
}

impl Communicator {
    /// One handle per rank, as [`Communicator::into_ranks`] makes them, whose collectives
    /// run over the flag transport ([`crate::exec::flag_transport`]) with channels of
    /// `shape` (`FlagShape::default()`: NCCL's 4 MiB per connection, as 4 slots): each rank runs only its own part of the plan, its messages through rings of
    /// slots ordered by counters, and waits for another rank only for the data it needs. On
    /// host slices a rank's part runs on its own thread before the call returns; on the CUDA
    /// backend (calls through `RankComm::on(&stream)`) the call enqueues the part on the
    /// caller's stream and returns, the counters waited for and written by stream memory
    /// operations, the rings in the receiving GPU's memory (`cuda::flags`). Which calls take
    /// this path is in the module docs of `rank/flag_calls.rs`; the others meet as on any
    /// communicator. Each call's descriptor is posted in the group's book of calls, so ranks
    /// whose calls differ fail without any rank waiting to compare, and a rank that stops
    /// calling is named with its last call within the timeout. Every failure aborts the
    /// group: later calls fail with its words. A split's communicators run over flags of
    /// their own.
    ///
    /// The calls' errors: the rank that finds its call differing from a peer's gets
    /// [`CollectivesError::RankMismatch`] naming the call number and the field; every other
    /// failure of a call over flags, on that rank and on the ranks its abort reaches (a
    /// mismatch found elsewhere, a rank missing past the timeout or gone, a buffer of the
    /// wrong length, rings past the staging budget), is [`CollectivesError::RankFailed`]
    /// whose source says what and where, and a missing rank is named with its last call.
    /// On a GPU a call returns once enqueued, so a failure found later on the stream comes
    /// with the next call, as NCCL's asynchronous errors do.
    ///
    /// Errors: no CUDA driver or stream for a communicator on the CUDA backend.
    ///
    /// ```
    /// use relaycc_collectives::exec::flag_transport::FlagShape;
    /// use relaycc_collectives::{Collectives, Communicator, ReduceOp};
    ///
    /// let ranks = Communicator::host(4)?.into_flag_ranks(FlagShape::default())?;
    /// let threads: Vec<_> = ranks
    ///     .into_iter()
    ///     .map(|mut rank| {
    ///         std::thread::spawn(move || {
    ///             let mut grads = vec![rank.rank() as f32; 1000];
    ///             rank.all_reduce_in_place(&mut grads[..], ReduceOp::Sum).map(|()| grads[999])
    ///         })
    ///     })
    ///     .collect();
    /// for t in threads {
    ///     assert_eq!(t.join().expect("rank")?, 6.0);
    /// }
    /// # Ok::<(), relaycc_collectives::CollectivesError>(())
    /// ```
    pub fn into_flag_ranks(self, shape: FlagShape) -> Result<Vec<RankComm>> {
        Ok(RankComm::handles(Arc::new(Shared::with_flags(
            self, shape,
        )?)))
    }
}

impl RankComm {
    /// Where this rank's communicator runs `ops` over the flag transport (module docs),
    /// where they went: on CUDA lanes enqueued now, on host lanes left to run when the
    /// departure is waited for (the slices' spans taken out of `lender`). `None` where they
    /// do not go there.
    pub(super) fn depart_flags(
        &mut self,
        lender: &mut Lender<'_>,
        ops: &mut Vec<RankCallOp>,
    ) -> Option<Left> {
        let flags = self.shared.flags.as_ref()?;
        let collectives = ops.iter().all(|o| matches!(o, RankCallOp::Coll { .. }));
        if collectives && let Some(e) = lender.error.take() {
            // The others may be waiting for this rank's part: fail the group for all.
            flags.abort(format!("rank {}: {e}", self.rank));
            return Some(Left::Ran(Err(e)));
        }
        if !eligible(flags, lender, ops) {
            return None;
        }
        let deferred = Deferred {
            shared: Arc::clone(&self.shared),
            me: self.rank,
            timeout: self.timeout,
            blocks: Vec::new(),
            ops: std::mem::take(ops),
        };
        if matches!(flags.channels, Channels::Host(_)) {
            let blocks = std::mem::take(&mut lender.blocks);
            return Some(Left::Flags(Deferred { blocks, ..deferred }));
        }
        Some(Left::Ran(deferred.run_with(lender)))
    }
}

impl RankComm {
    /// Why this rank's communicator was aborted after its calls returned, if it was
    /// (`ncclCommGetAsyncError`): over flags on a GPU a call returns once enqueued, and one
    /// whose peer's call differed, or whose peer never came, has a result nobody should
    /// read; on host slices a rank whose part needed nothing from a failing peer may have
    /// returned before the failure. `None` while nothing failed; the next call fails with
    /// the same cause.
    pub fn async_error(&self) -> Option<CollectivesError> {
        if let Some(why) = self.shared.flags.as_ref().and_then(FlagRanks::failure) {
            return Some(CollectivesError::Backend {
                backend: "flag transport",
                message: format!("the group was aborted: {why}"),
            });
        }
        self.shared.board.aborted("async_error", self.seq)
    }
}

impl Departure<'_> {
    /// The host flag calls this departure holds, taken out to run elsewhere (the departure
    /// then waits for nothing).
    pub(super) fn take_flags(&mut self) -> Option<Deferred> {
        match std::mem::replace(&mut self.outcome, Left::Ran(Ok(()))) {
            Left::Flags(f) => Some(f),
            other => {
                self.outcome = other;
                None
            }
        }
    }
}

/// A rank's collectives on host lanes, left to run when its departure is waited for: a host
/// lane runs its rank's steps on the calling thread, so one thread cannot run two ranks'
/// calls one after another ([`run_apart`] runs several ranks' at once). The spans are of
/// slices the departure keeps borrowed until then.
#[derive(Debug)]
pub(crate) struct Deferred {
    shared: Arc<Shared>,
    me: usize,
    timeout: Duration,
    ops: Vec<RankCallOp>,
    blocks: Vec<Span>,
}

impl Deferred {
    /// Run the calls on this thread, one after the other.
    pub(super) fn run(mut self) -> Result<()> {
        let lender = Lender {
            blocks: std::mem::take(&mut self.blocks),
            ..Lender::default()
        };
        self.run_with(&lender)
    }

    fn run_with(&self, lender: &Lender<'_>) -> Result<()> {
        let Some(flags) = &self.shared.flags else {
            return Err(CollectivesError::Unmatched(
                "flag calls on a communicator without flags".into(),
            ));
        };
        let (comm, me, timeout) = (&self.shared.comm, self.me, self.timeout);
        self.ops
            .iter()
            .try_for_each(|op| call(comm, flags, me, timeout, lender, op))
    }
}

/// Run several ranks' deferred calls at once, each on a thread of its own (the first on
/// this one); their results in order.
pub(super) fn run_apart(groups: Vec<Deferred>) -> Vec<Result<()>> {
    let mut groups = groups.into_iter();
    let Some(first) = groups.next() else {
        return Vec::new();
    };
    std::thread::scope(|s| {
        let others: Vec<_> = groups.map(|g| s.spawn(move || g.run())).collect();
        let mut out = vec![first.run()];
        out.extend(others.into_iter().map(|h| {
            h.join().unwrap_or_else(|_| {
                Err(CollectivesError::Unmatched(
                    "a rank's thread of a group panicked".into(),
                ))
            })
        }));
        out
    })
}

/// Whether `ops` run over the flag transport: every one a collective with fixed counts, on
/// host slices for host lanes, on device buffers on a stream for CUDA lanes.
fn eligible(flags: &FlagRanks, lender: &Lender<'_>, ops: &[RankCallOp]) -> bool {
    let on_device = match flags.channels {
        Channels::Host(_) => false,
        #[cfg(feature = "cuda")]
        Channels::Cuda(_) if lender.stream.is_none() => return false,
        #[cfg(feature = "cuda")]
        Channels::Cuda(_) => true,
    };
    !ops.is_empty()
        && lender
            .blocks
            .iter()
            .all(|b| b.device.is_some() == on_device && b.held.is_none())
        && ops.iter().all(|op| match op {
            RankCallOp::Coll { desc, .. } => {
                !desc.collective.counts_per_rank() && desc.collective != Collective::AllToAllV
            }
            _ => false,
        })
}

/// One call of rank `me`: its collective `op` over `lender`'s slices or buffers (module
/// docs).
pub(crate) fn call(
    comm: &Communicator,
    flags: &FlagRanks,
    me: usize,
    timeout: Duration,
    lender: &Lender<'_>,
    op: &RankCallOp,
) -> Result<()> {
    let RankCallOp::Coll {
        desc,
        input,
        output,
        in_place,
    } = op
    else {
        return Err(CollectivesError::Unmatched(
            "a flag call of an operation that is not a collective".into(),
        ));
    };
    let Some(rank) = flags.ranks.get(me) else {
        return Err(CollectivesError::BadRank {
            call: desc.call,
            rank: me,
            ranks: flags.ranks.len(),
        });
    };
    let mut rank = lock(rank);
    let FlagRank { end, parts, host } = &mut *rank;
    end.set_timeout(timeout);
    let part = take_part(parts, desc, *in_place).map_or_else(|| cut(comm, me, desc, *in_place), Ok);
    // Posted whatever the part gave, so that a call that differs from the peers' is named
    // as a mismatch, not as this rank's own error. A kept part stays kept: earlier calls'
    // steps on a CUDA stream may still use its memory.
    if let Err(e) = end.begin_call(desc) {
        if let Ok(p) = part {
            keep(parts, p, end);
        }
        return Err(e);
    }
    let ran = part.and_then(|mut p| {
        let ran = check_spans(&p, lender, (*input, *output), me).and_then(|spans| match end {
            FlagEnd::Host(t) => run_on_host(&mut p, t, host, spans),
            #[cfg(feature = "cuda")]
            FlagEnd::Cuda(t) => {
                super::flag_streams::run_on_stream(comm, me, &mut p, t, lender, spans)
            }
        });
        keep(parts, p, end);
        ran
    });
    ran.map_err(|e| {
        end.abort(format!("rank {me} failed: {e}"));
        match e {
            e @ CollectivesError::RankMismatch { .. } => e,
            e => CollectivesError::RankFailed {
                call: desc.call,
                source: Arc::new(e),
            },
        }
    })
}

/// Keep `p` as the most recently used part, letting the least recently used go past
/// [`KEPT_PARTS`]. An evicted part's scratch may be freed once it goes, so its steps must be
/// done first: on a CUDA stream, a wait on the host (the one of this path, once per call
/// shape evicted); where that fails the part stays.
fn keep(parts: &mut Vec<FlagPart>, p: FlagPart, end: &FlagEnd) {
    parts.push(p);
    if parts.len() > KEPT_PARTS && end.drain().is_ok() {
        parts.remove(0);
    }
}

/// The kept part of a call of `desc`'s shape, taken out.
fn take_part(parts: &mut Vec<FlagPart>, desc: &Desc, in_place: bool) -> Option<FlagPart> {
    let i = parts
        .iter()
        .position(|p| p.in_place == in_place && p.desc.same_shape(desc))?;
    Some(parts.remove(i))
}

/// This rank's part of the call's plan: the request's checks, the communicator's cached plan
/// (out of place: module docs), lowered for rank `me` with its scratch.
fn cut(comm: &Communicator, me: usize, desc: &Desc, in_place: bool) -> Result<FlagPart> {
    let n = comm.ranks();
    if desc.root >= n {
        return Err(CollectivesError::BadRank {
            call: desc.call,
            rank: desc.root,
            ranks: n,
        });
    }
    let request = desc.request(comm.devices().to_vec(), Vec::new());
    let lens = call_checks::check_request(desc.call, &request)?;
    let needs = lens.get(me).copied().unwrap_or((0, 0));
    let layout = request.in_place(me as u32).filter(|_| in_place);
    let cached = comm.plan_for(desc.call, &request, false)?;
    let plan = crate::exec::runnable(cached.exec.plan())?;
    let (program, held) = lower_part(&plan, comm.devices(), me)?;
    let backend = comm.backend();
    let set = cached.scratch_set(0, backend)?;
    let mut scratch = Vec::with_capacity(held.len());
    let mut scratch_at = Vec::with_capacity(held.len());
    for i in held {
        let mem = *set.get(i).ok_or_else(|| CollectivesError::InvalidPlan {
            op: None,
            message: format!("scratch buffer {i} of a plan that holds {}", set.len()),
        })?;
        scratch.push(mem);
        let whole = ByteRegion {
            mem,
            offset: 0,
            bytes: mem.bytes(),
        };
        if let Some(r) = backend.raw_region(whole, Private)?
            && r.space == AddressSpace::Host
        {
            scratch_at.push((r.addr, r.bytes as usize));
        }
    }
    Ok(FlagPart {
        desc: desc.clone(),
        in_place,
        needs,
        layout,
        program,
        scratch,
        scratch_at,
        _cached: cached,
        aside: Vec::new(),
        #[cfg(feature = "cuda")]
        device: None,
    })
}

/// `plan` lowered for rank `me` of ranks on `devices` (rank `r` on GPU `devices[r]`) onto
/// one lane: input binding 0, output 1, then the scratch buffers it holds, whose plan indices
/// come back with the program.
pub(crate) fn lower_part(
    plan: &Plan,
    devices: &[u32],
    me: usize,
) -> Result<(RankProgram, Vec<usize>)> {
    let owner = |b: BufferRef| match plan.location(b)? {
        Location::Gpu(g) => devices.iter().position(|d| *d == g).map(|r| r as u32),
        Location::Host(_) => None,
    };
    let esize = plan.dtype.size();
    let me32 = me as u32;
    let mut held = Vec::new();
    let mut binding_of_scratch = vec![None; plan.scratch.len()];
    let mut bytes = vec![
        plan.request.input_len(me32).unwrap_or(0) * esize,
        plan.request.output_len(me32).unwrap_or(0) * esize,
    ];
    for (i, s) in plan.scratch.iter().enumerate() {
        if owner(BufferRef::Scratch(i as u32)) == Some(me32) {
            binding_of_scratch[i] = Some(bytes.len() as u32);
            held.push(i);
            bytes.push(s.len * esize);
        }
    }
    let layout = RankLayout {
        me: me32,
        owner: &owner,
        binding: &|b| match b {
            BufferRef::Input(r) if r == me32 => Some(0),
            BufferRef::Output(r) if r == me32 => Some(1),
            BufferRef::Scratch(i) => binding_of_scratch.get(i as usize).copied().flatten(),
            _ => None,
        },
        binding_bytes: bytes,
        lanes: Lanes::Fold {
            count: 1,
            at: Location::Gpu(devices.get(me).copied().unwrap_or(0)),
        },
    };
    Ok((lower(plan, &layout)?, held))
}

/// The address and bytes of `view` of `lender`'s memory, `None` where there is none.
fn span_of(lender: &Lender<'_>, view: Option<View>, esize: u64) -> Result<Option<(usize, u64)>> {
    view.map(|v| {
        v.address_in(&lender.blocks, esize).ok_or_else(|| {
            CollectivesError::Unmatched("a view outside the memory its call lends".into())
        })
    })
    .transpose()
}

/// This rank's input and output checked against `p`: their lengths, and apart, or (an
/// in-place call) the input exactly where the in-place layout puts it in the output, to be
/// copied aside, as the out-of-place plan expects.
fn check_spans(
    p: &FlagPart,
    lender: &Lender<'_>,
    (input, output): (Option<View>, Option<View>),
    me: usize,
) -> Result<CallSpans> {
    let (call, esize) = (p.desc.call, p.desc.dtype.size());
    let input = span_of(lender, input, esize)?;
    let output = span_of(lender, output, esize)?;
    call_checks::check_len(call, me, "input", input.map(|s| s.1 / esize), p.needs.0)?;
    call_checks::check_len(call, me, "output", output.map(|s| s.1 / esize), p.needs.1)?;
    let (inp, out) = (
        input.map_or((0, 0), |(a, b)| (a, b as usize)),
        output.map_or((0, 0), |(a, b)| (a, b as usize)),
    );
    let overlaps = inp.1 > 0 && out.1 > 0 && inp.0 < out.0 + out.1 && out.0 < inp.0 + inp.1;
    let laid_out = || {
        p.layout
            .and_then(|at| call_checks::input_start(at, esize, out.0 as u64))
            == Some(inp.0 as u64)
    };
    if overlaps && !laid_out() {
        return Err(CollectivesError::Overlap {
            call,
            what: format!("input and output of rank {me} overlap outside the in-place layout"),
        });
    }
    Ok(CallSpans {
        input: inp,
        output: out,
        aside: overlaps,
    })
}

/// Run `p` on host slices over a host lane.
fn run_on_host(
    p: &mut FlagPart,
    end: &mut FlagTransport<HostFlagLane>,
    host: &mut HostRunMemory,
    spans: CallSpans,
) -> Result<()> {
    // An empty binding's address: any aligned one serves, nothing reads or writes it.
    let empty = std::ptr::NonNull::<u128>::dangling().as_ptr().cast::<u8>();
    let at = |(a, b): (usize, usize)| (if b == 0 { empty } else { a as *mut u8 }, b);
    let (mut inp, out) = (at(spans.input), at(spans.output));
    if spans.aside {
        let words = inp.1.div_ceil(16);
        if p.aside.len() < words {
            p.aside.resize(words, 0);
        }
        let aside = p.aside.as_mut_ptr().cast::<u8>();
        // SAFETY: the input is `inp.1` readable bytes of the caller's slice; `aside` holds at
        // least as many and is this part's own.
        unsafe { std::ptr::copy_nonoverlapping(inp.0.cast_const(), aside, inp.1) };
        inp.0 = aside;
    }
    if p.scratch_at.len() != p.scratch.len() {
        return Err(CollectivesError::InvalidPlan {
            op: None,
            message: "a scratch buffer without a host address, for a rank on host slices".into(),
        });
    }
    let HostRunMemory { staging, bufs } = host;
    bufs.clear();
    bufs.push(inp);
    bufs.push(out);
    bufs.extend(p.scratch_at.iter().map(|&(a, b)| (a as *mut u8, b)));
    // SAFETY: the input is the caller's shared slice (or this part's copy of it) and only
    // read (the cached plan was checked out of place, so no op writes an input); the output
    // is the caller's exclusive slice; the scratch buffers are the cached plan's, held by
    // this part, and of them only this rank's (each scratch buffer has one owner, so no
    // other rank's part touches them); all are disjoint (`check_spans`) and stay borrowed
    // until the run returns, which waits for every step of the flag lane (host lanes run
    // their steps on this thread).
    let ran = match unsafe { HostMemory::new(&p.program, bufs, staging) } {
        Ok(mut mem) => run(&p.program, &mut mem, end),
        Err(e) => Err(e),
    };
    bufs.clear();
    ran
}
