//! The flag transport's lanes on CUDA streams ([`crate::exec::flag_transport`]): a rank's
//! steps are enqueued on its own stream and the call returns, whatever the other ranks are
//! doing. A `Wait` is `cuStreamWaitValue32` (`CU_STREAM_WAIT_VALUE_GEQ`, the cyclic comparison
//! the protocol assumes), a `Signal` is `cuStreamWriteValue32` (with its default memory
//! barrier, so the copies before it are visible first), a `Put` or `Take` is
//! `cuMemcpyAsync` (`cuMemcpyPeerAsync` into a ring on another GPU).
//!
//! Counters live in one allocation of pinned host memory mapped into every device, so the
//! host sees them without a device call: a watchdog thread per group drops the waits that
//! were reached and, when a rank's oldest waiting one was enqueued longer ago than the
//! timeout (counted from the enqueue, as a host rank's timeout counts from its call), aborts
//! the group, naming the rank the chain of waits ends at. An abort keeps setting every
//! awaited counter to the value its last enqueued wait needs until the rank's stream is
//! idle, so no stream waits forever; every later step of the group fails, and bytes the released streams
//! copied are garbage: nothing reports them as a result. Rings (slots in the receiving
//! rank's device memory) are allocated on a channel's first use and freed with the group,
//! after every lane's stream has drained.
//!
//! CUDA does not see the order these operations make between streams, and warns that it
//! may then serialize work in an order that waits forever (several streams on one hardware
//! queue). The watchdog bounds that too; `scripts/gpu-check` runs more ranks on one GPU than
//! it has queues to find out whether it happens.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use super::backend::lock;
use super::driver::driver;
use super::error::CudaError;
use crate::backend::AddressSpace;
use crate::error::CollectivesError;
use crate::exec::call_book::CallBook;
use crate::exec::flag_transport::{
    Counter, FlagLane, FlagRef, FlagShape, FlagStep, FlagTransport, GroupAbort, LaneRings,
    RingTable, reached, wait_chain_words,
};

/// The most ranks one group holds: its counters are two words per ordered pair.
pub const MAX_FLAG_RANKS: u32 = 1024;

/// How often the watchdog looks at the counters.
const WATCH_EVERY: Duration = Duration::from_millis(1);

fn driver_err(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        status: format!("{e:?}"),
    }
}

/// The counters: pinned host memory mapped into every device (`cuMemHostAlloc` with
/// `DEVICEMAP | PORTABLE`), two words per ordered pair.
#[derive(Debug)]
struct Counters {
    host: *mut u32,
    dev: u64,
    words: usize,
}

impl Counters {
    fn word(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i < self.words);
        // SAFETY: `host` holds `words` aligned, zeroed u32s for the group's life; the devices
        // write them only with 32-bit stream memory operations.
        unsafe { AtomicU32::from_ptr(self.host.add(i.min(self.words - 1))) }
    }
}

/// A channel's ring in its receiver's device memory.
#[derive(Debug)]
struct Ring {
    ptr: u64,
    ctx: Arc<CudaContext>,
}

/// A wait a lane enqueued and the watchdog has not yet seen reached.
#[derive(Debug, Clone)]
struct PendingWait {
    /// The stream it was enqueued on.
    stream: Arc<CudaStream>,
    word: usize,
    at: u32,
    peer: u32,
    stage: usize,
    since: Instant,
    /// Its lane's timeout when it was enqueued.
    timeout: Duration,
}

/// The channels of one group of ranks on CUDA streams, its watchdog's view and its abort.
#[derive(Debug)]
pub struct CudaFlagChannels {
    ranks: u32,
    shape: FlagShape,
    /// Each rank's stream (its device is the stream's).
    streams: Vec<Arc<CudaStream>>,
    counters: Counters,
    /// Per counter word, the value its waiter's last enqueued wait needs.
    last_wait: Vec<AtomicU32>,
    rings: Mutex<RingTable<Ring>>,
    pending: Vec<Mutex<VecDeque<PendingWait>>>,
    abort: GroupAbort,
    calls: CallBook,
    /// A lane's stream did not drain: its rings and counters are leaked, not freed.
    leak: AtomicBool,
}

// SAFETY: `counters.host` is only read and written as atomics; rings are raw device
// addresses used through the driver; everything else is `Sync`.
unsafe impl Send for CudaFlagChannels {}
// SAFETY: as above.
unsafe impl Sync for CudaFlagChannels {}

impl CudaFlagChannels {
    /// Ends for ranks `0..streams.len()`, rank `r` enqueueing on `streams[r]` (ranks may
    /// share a device); channels have `shape`, at most `ring_budget` bytes of rings in any
    /// one rank's memory (a channel whose ring would pass it fails its first step); a wait
    /// unreached after `timeout` aborts the group. Errors: no driver (probed first), more
    /// than [`MAX_FLAG_RANKS`] ranks, a driver status.
    pub fn group(
        streams: Vec<Arc<CudaStream>>,
        shape: FlagShape,
        timeout: Duration,
        ring_budget: u64,
    ) -> Result<Vec<FlagTransport<CudaFlagLane>>, CollectivesError> {
        driver()?;
        let n = u32::try_from(streams.len())
            .ok()
            .filter(|n| (1..=MAX_FLAG_RANKS).contains(n))
            .ok_or_else(|| {
                CollectivesError::Setup(format!(
                    "a flag transport of {} ranks: a group holds 1 to {MAX_FLAG_RANKS}",
                    streams.len()
                ))
            })?;
        let words = 2 * (n as usize) * (n as usize);
        streams[0]
            .context()
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a plain allocation into `host`.
        unsafe { sys::cuMemHostAlloc(&mut host, words * 4, flags) }
            .result()
            .map_err(driver_err("cuMemHostAlloc"))?;
        // SAFETY: `host` holds `words * 4` bytes just allocated.
        unsafe { std::ptr::write_bytes(host.cast::<u32>(), 0, words) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a mapped allocation of this context.
        if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }.result() {
            // SAFETY: allocated above, used by nothing yet.
            let _ = unsafe { sys::cuMemFreeHost(host) };
            return Err(driver_err("cuMemHostGetDevicePointer")(e).into());
        }
        let shared = Arc::new(CudaFlagChannels {
            ranks: n,
            shape,
            counters: Counters {
                host: host.cast(),
                dev,
                words,
            },
            last_wait: (0..words).map(|_| AtomicU32::new(0)).collect(),
            rings: Mutex::new(RingTable::new(n, shape, ring_budget)),
            pending: (0..n).map(|_| Mutex::new(VecDeque::new())).collect(),
            abort: GroupAbort::default(),
            calls: CallBook::new(n),
            leak: AtomicBool::new(false),
            streams,
        });
        let watched = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("relaycc-flag-watchdog".into())
            .spawn(move || watchdog(watched))
            .map_err(|e| {
                CollectivesError::Setup(format!(
                    "a flag transport could not start its watchdog thread: {e}"
                ))
            })?;
        Ok(FlagTransport::group(n, shape, |me| CudaFlagLane {
            me,
            timeout,
            stream: Arc::clone(&shared.streams[me as usize]),
            shared: Arc::clone(&shared),
            rings: LaneRings::new(me, n),
        }))
    }

    /// Rank `rank` begins no further call (its handle is gone): a lane that begins a call it
    /// never began fails at once. (Its stream's steps still run, so waits for it stand.)
    pub fn leave(&self, rank: u32) {
        self.calls.leave(rank);
    }

    /// Whether the group was aborted, and why.
    pub fn failure(&self) -> Option<&str> {
        self.abort.failure()
    }

    /// Abort the group with `why` (the first abort's words are kept): no lane enqueues
    /// another step, and the watchdog releases every enqueued wait.
    pub fn abort(&self, why: String) {
        self.abort.abort(why);
    }

    fn word(&self, f: FlagRef) -> usize {
        let n = self.ranks as usize;
        (f.src as usize * n + f.dst as usize) * 2 + usize::from(f.counter == Counter::Freed)
    }

    /// One look: drop reached waits; abort on one older than the timeout; after an abort,
    /// set every awaited counter to what its last enqueued wait needs, again at every look
    /// until the rank's stream is idle (a released stream's later signal may set a counter
    /// back below a wait it has not reached yet).
    fn watch(&self) {
        if self.abort.is_aborted() {
            self.release();
            return;
        }
        let mut late: Option<(u32, usize, u32, Duration)> = None;
        for (r, pending) in self.pending.iter().enumerate() {
            let mut q = lock(pending);
            while let Some(w) = q.front() {
                // Without an abort a counter only grows, so a wait reached now stays reached.
                if reached(self.counters.word(w.word).load(Ordering::SeqCst), w.at) {
                    q.pop_front();
                } else {
                    if w.since.elapsed() > w.timeout && late.is_none() {
                        late = Some((r as u32, w.stage, w.peer, w.timeout));
                    }
                    break;
                }
            }
        }
        if let Some((r, stage, peer, timeout)) = late {
            let chain = wait_chain_words(
                r,
                peer,
                |at| lock(&self.pending[at as usize]).front().map(|w| w.peer),
                &self.calls,
            );
            self.abort(format!(
                "rank {r}: stage {}: its stream waited {:?} for rank {}{chain}",
                stage, timeout, peer
            ));
        }
    }

    /// After an abort: every awaited counter of a wait whose stream is not idle set to what
    /// its last enqueued wait needs; a wait on an idle stream forgotten.
    fn release(&self) {
        for pending in &self.pending {
            lock(pending).retain(|w| {
                if !busy(&w.stream) {
                    return false;
                }
                let need = self.last_wait[w.word].load(Ordering::SeqCst);
                self.counters.word(w.word).store(need, Ordering::SeqCst);
                true
            });
        }
    }

    /// The ring of the channel from `src` to `dst`, allocated in `dst`'s device memory on
    /// first use.
    fn ring(&self, src: u32, dst: u32) -> Result<u64, CollectivesError> {
        let mut rings = lock(&self.rings);
        let (bytes, streams) = (self.shape.ring_bytes(), &self.streams);
        let ring = rings.get_or_make(src, dst, || {
            let ctx = Arc::clone(streams[dst as usize].context());
            ctx.bind_to_thread()
                .map_err(driver_err("cuCtxSetCurrent"))?;
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: a plain allocation into `ptr` on `dst`'s context.
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }
                .result()
                .map_err(driver_err("cuMemAlloc"))?;
            Ok(Ring { ptr, ctx })
        })?;
        Ok(ring.ptr)
    }
}

impl Drop for CudaFlagChannels {
    fn drop(&mut self) {
        // Every lane is gone, and each drained its stream (or set `leak`).
        if self.leak.load(Ordering::SeqCst) {
            return;
        }
        for ring in lock(&self.rings).rings() {
            if ring.ctx.bind_to_thread().is_ok() {
                // SAFETY: allocated by `ring`, used by no stream any more.
                let _ = unsafe { sys::cuMemFree_v2(ring.ptr) };
            }
        }
        // SAFETY: allocated by `group`, used by no stream any more.
        let _ = unsafe { sys::cuMemFreeHost(self.counters.host.cast()) };
    }
}

/// Whether `stream` still has work (a failed query counts as idle: nothing more will run).
fn busy(stream: &CudaStream) -> bool {
    stream.context().bind_to_thread().is_ok()
        // SAFETY: a query of a live stream.
        && unsafe { sys::cuStreamQuery(stream.cu_stream()) } == sys::CUresult::CUDA_ERROR_NOT_READY
}

/// The watchdog of a group: it looks every [`WATCH_EVERY`] until the group is gone.
fn watchdog(group: Weak<CudaFlagChannels>) {
    while let Some(g) = group.upgrade() {
        g.watch();
        drop(g);
        std::thread::sleep(WATCH_EVERY);
    }
}

/// One rank's lane: the stream it enqueues on (the rank's stream of the group until a call
/// gives another, [`CudaFlagLane::use_stream`]), and the rings it uses, found once.
#[derive(Debug)]
pub struct CudaFlagLane {
    me: u32,
    timeout: Duration,
    shared: Arc<CudaFlagChannels>,
    rings: LaneRings<u64>,
    stream: Arc<CudaStream>,
}

impl CudaFlagLane {
    /// The group's channels.
    pub fn channels(&self) -> &Arc<CudaFlagChannels> {
        &self.shared
    }

    /// Enqueue the next steps on `stream` (a caller's stream for its call, as NCCL's calls
    /// take one): they follow the work the caller enqueued there before, and the caller's
    /// later work follows them. A new stream first waits for the lane's previous one (an
    /// event recorded there), so the lane's steps stay in order across streams, as the
    /// protocol needs, and the previous stream's steps are done once this one's are.
    /// Errors: a stream of another device than the rank's, a driver status.
    pub fn use_stream(&mut self, stream: &Arc<CudaStream>) -> Result<(), CollectivesError> {
        let home = self.shared.streams[self.me as usize].context().ordinal();
        if stream.context().ordinal() != home {
            return Err(CollectivesError::Setup(format!(
                "rank {}: a stream of CUDA device {}, for a rank on device {home}",
                self.me,
                stream.context().ordinal()
            )));
        }
        if Arc::ptr_eq(stream, &self.stream) {
            return Ok(());
        }
        stream
            .join(&self.stream)
            .map_err(driver_err("cuStreamWaitEvent"))?;
        self.stream = Arc::clone(stream);
        Ok(())
    }

    /// Wait on the host until every step this lane enqueued is done (its stream waited for
    /// each earlier one).
    pub fn synchronize(&self) -> Result<(), CollectivesError> {
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        Ok(())
    }

    /// Make this lane's stream's device current on the calling thread (a ring's allocation
    /// made its receiver's current).
    fn bind(&self) -> Result<(), CollectivesError> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        Ok(())
    }

    /// The ring of the channel from `src` to `dst` (one of this rank's), allocated on first
    /// use (with this rank's device current again after it).
    fn ring(&mut self, src: u32, dst: u32) -> Result<u64, CollectivesError> {
        let (shared, mut made) = (&self.shared, false);
        let ring = *self.rings.get(src, dst, || {
            made = true;
            shared.ring(src, dst)
        })?;
        if made {
            self.bind()?;
        }
        Ok(ring)
    }

    /// Enqueue one step on the lane's stream.
    fn enqueue(&mut self, step: FlagStep, stage: usize) -> Result<(), CollectivesError> {
        let sh = Arc::clone(&self.shared);
        let stream = self.stream.cu_stream();
        let slot_at = |slot: u32, bytes: usize| sh.shape.slot_offset(slot, bytes).map(|o| o as u64);
        let (r, call) = match step {
            FlagStep::Wait { flag, at } => {
                let word = sh.word(flag);
                sh.last_wait[word].store(at, Ordering::SeqCst);
                let peer = if flag.counter == Counter::Posted {
                    flag.src
                } else {
                    flag.dst
                };
                lock(&sh.pending[self.me as usize]).push_back(PendingWait {
                    stream: Arc::clone(&self.stream),
                    word,
                    at,
                    peer,
                    stage,
                    since: Instant::now(),
                    timeout: self.timeout,
                });
                let addr = sh.counters.dev + 4 * word as u64;
                let geq = sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_GEQ as u32;
                // SAFETY: `addr` is a counter word of the mapped allocation, alive while a
                // lane (this one) is.
                let r = unsafe { sys::cuStreamWaitValue32_v2(stream, addr, at, geq) };
                (r, "cuStreamWaitValue32")
            }
            FlagStep::Signal { flag, value } => {
                let addr = sh.counters.dev + 4 * sh.word(flag) as u64;
                let fenced = sys::CUstreamWriteValue_flags_enum::CU_STREAM_WRITE_VALUE_DEFAULT;
                // SAFETY: as above.
                let r = unsafe { sys::cuStreamWriteValue32_v2(stream, addr, value, fenced as u32) };
                (r, "cuStreamWriteValue32")
            }
            FlagStep::Put {
                to,
                slot,
                src,
                bytes,
            } => {
                let dst = self.ring(self.me, to)? + slot_at(slot, bytes)?;
                let (mine, theirs) = (self.stream.context(), sh.streams[to as usize].context());
                // SAFETY: the slot lies inside the ring (checked) and is empty (the wait
                // before); `src` holds `bytes` device bytes (the caller's contract).
                let r = unsafe {
                    if mine.cu_ctx() == theirs.cu_ctx() {
                        sys::cuMemcpyAsync(dst, src as u64, bytes, stream)
                    } else {
                        sys::cuMemcpyPeerAsync(
                            dst,
                            theirs.cu_ctx(),
                            src as u64,
                            mine.cu_ctx(),
                            bytes,
                            stream,
                        )
                    }
                };
                (r, "cuMemcpyAsync")
            }
            FlagStep::Take {
                from,
                slot,
                dst,
                bytes,
            } => {
                let src = self.ring(from, self.me)? + slot_at(slot, bytes)?;
                // SAFETY: the slot lies inside this rank's ring (checked) and is full (the
                // wait before); `dst` holds `bytes` device bytes nothing else touches.
                let r = unsafe { sys::cuMemcpyAsync(dst as u64, src, bytes, stream) };
                (r, "cuMemcpyAsync")
            }
        };
        r.result().map_err(|e| {
            CollectivesError::Cuda(CudaError::Driver {
                call,
                status: format!("{e:?}"),
            })
        })
    }
}

impl Drop for CudaFlagLane {
    fn drop(&mut self) {
        // The rings and counters outlive every step this lane enqueued: wait for its stream
        // (which waited for every earlier one, `use_stream`), aborting the group (so the
        // watchdog releases its waits) if it is still busy after the timeout, and leak them
        // if it never drains.
        let sh = &self.shared;
        let start = Instant::now();
        while busy(&self.stream) {
            if start.elapsed() > self.timeout {
                sh.abort(format!(
                    "rank {}: its lane was dropped with steps still waiting after {:?}",
                    self.me, self.timeout
                ));
            }
            if start.elapsed() > 2 * self.timeout + Duration::from_secs(1) {
                sh.leak.store(true, Ordering::SeqCst);
                return;
            }
            std::thread::sleep(WATCH_EVERY);
        }
    }
}

// SAFETY: steps go onto the rank's one stream in order; a `Signal` (with the driver's default
// memory barrier) follows the copies before it; copies stay inside their ring's slot
// (`FlagShape::slot_offset`); the rings and counters outlive the stream's steps (`Drop` waits for it).
unsafe impl FlagLane for CudaFlagLane {
    fn reaches(&self, space: AddressSpace) -> bool {
        space == AddressSpace::Device
    }

    unsafe fn run(&mut self, steps: &[FlagStep], stage: usize) -> Result<(), CollectivesError> {
        if self.shared.abort.is_aborted() {
            return Err(self
                .shared
                .abort
                .error("cuda flag transport", self.me, stage));
        }
        self.bind()?;
        for step in steps {
            if let Err(e) = self.enqueue(*step, stage) {
                // A step left out would leave the peers waiting: abort the group.
                self.shared
                    .abort(format!("rank {}: stage {stage}: {e}", self.me));
                return Err(e);
            }
        }
        Ok(())
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn calls(&self) -> &CallBook {
        &self.shared.calls
    }

    fn abort(&self, why: String) {
        self.shared.abort(why);
    }

    fn group_abort(&self) -> &GroupAbort {
        &self.shared.abort
    }
}

#[cfg(test)]
#[path = "flags/tests.rs"]
mod tests;
