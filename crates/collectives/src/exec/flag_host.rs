//! The flag transport's lanes on host threads: each channel's ring is host memory and its
//! counters are atomics (a `Signal` is a release store, a `Wait` an acquire load looked at
//! until it reaches its value), so ranks on threads run exactly the steps GPU ranks enqueue
//! on their streams ([`super::flag_transport`]).
//!
//! A wait that does not reach its value within the timeout aborts every lane of the group and
//! names the rank it waited for, the stage and the chunk; a lane that finds the group aborted
//! stops at its next wait with the first failure's words. Rings are made on a channel's first
//! use, so memory grows with the pairs that exchange data, a ring each.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::call_book::CallBook;
use super::flag_transport::{
    Counter, FlagLane, FlagRef, FlagShape, FlagStep, FlagTransport, GroupAbort, LaneRings,
    RingTable, wait_chain_words,
};
use crate::backend::AddressSpace;
use crate::error::CollectivesError;
use crate::rank::board::{SPIN_FOR, lock};

/// What [`HostFlagChannels`]' `waiting_for` holds for a lane that waits for no one.
const NOT_WAITING: u32 = u32::MAX;

/// One channel: its ring and its two counters.
#[derive(Debug)]
struct HostRing {
    ring: NonNull<u8>,
    bytes: usize,
    posted: AtomicU32,
    freed: AtomicU32,
}

// SAFETY: the ring is written only by `Put`s of its sender's lane into a slot the protocol
// says is empty, and read by `Take`s of its receiver's lane of a slot it says is full; the
// counters' release stores and acquire loads order the two.
unsafe impl Send for HostRing {}
// SAFETY: as above.
unsafe impl Sync for HostRing {}

impl HostRing {
    /// A ring of `bytes` zeroed bytes (pages the allocator gives zeroed, not written here);
    /// an error, not an abort, where the host has no room.
    fn new(bytes: usize) -> Result<HostRing, CollectivesError> {
        let ring = match std::alloc::Layout::array::<u8>(bytes) {
            Ok(_) if bytes == 0 => NonNull::dangling(),
            // SAFETY: a layout of `bytes > 0` bytes, the layout of a `Box<[u8]>` of that
            // length, as which `Drop` gives it back.
            Ok(layout) => NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
                .ok_or_else(|| no_room(bytes))?,
            Err(_) => return Err(no_room(bytes)),
        };
        Ok(HostRing {
            ring,
            bytes,
            posted: AtomicU32::new(0),
            freed: AtomicU32::new(0),
        })
    }

    fn counter(&self, c: Counter) -> &AtomicU32 {
        match c {
            Counter::Posted => &self.posted,
            Counter::Freed => &self.freed,
        }
    }
}

impl Drop for HostRing {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ring.as_ptr(), self.bytes);
        // SAFETY: `ring` is `bytes` bytes allocated with the layout a `Box<[u8]>` of that
        // length has (or dangling for none, which a box of no bytes never frees), and nothing
        // uses it once the last lane holding this channel is gone.
        drop(unsafe { Box::from_raw(slice) });
    }
}

fn no_room(bytes: usize) -> CollectivesError {
    CollectivesError::Backend {
        backend: "flag transport",
        message: format!("no room for a ring of {bytes} bytes of host memory"),
    }
}

/// The channels of one group of ranks on host threads, and its abort.
#[derive(Debug)]
pub struct HostFlagChannels {
    shape: FlagShape,
    rings: Mutex<RingTable<Arc<HostRing>>>,
    /// The rank each rank's lane is waiting for ([`NOT_WAITING`] when none), to name the rank
    /// a chain of waits ends at.
    waiting_for: Vec<AtomicU32>,
    /// The thread each rank's lane last slept on, which a signal it waits for unparks.
    sleepers: Vec<Mutex<Option<Thread>>>,
    abort: GroupAbort,
    calls: CallBook,
}

impl HostFlagChannels {
    /// Ends for ranks `0..ranks` whose channels have `shape`, at most `ring_budget` bytes of
    /// rings in any one rank's memory (a channel whose ring would pass it fails its first
    /// step); a wait fails (and aborts the group) after `timeout`.
    pub fn group(
        ranks: u32,
        shape: FlagShape,
        timeout: Duration,
        ring_budget: u64,
    ) -> Vec<FlagTransport<HostFlagLane>> {
        let shared = Arc::new(HostFlagChannels {
            shape,
            rings: Mutex::new(RingTable::new(ranks, shape, ring_budget)),
            waiting_for: (0..ranks).map(|_| AtomicU32::new(NOT_WAITING)).collect(),
            sleepers: (0..ranks).map(|_| Mutex::new(None)).collect(),
            abort: GroupAbort::default(),
            calls: CallBook::new(ranks),
        });
        FlagTransport::group(ranks, shape, |me| HostFlagLane {
            me,
            timeout,
            shared: Arc::clone(&shared),
            rings: LaneRings::new(me, ranks),
        })
    }

    /// Whether a lane of the group failed, and with what.
    pub fn failure(&self) -> Option<&str> {
        self.abort.failure()
    }

    /// Abort the group with `why` (the first abort's words are kept); every sleeping lane
    /// wakes to see it.
    pub fn abort(&self, why: String) {
        self.abort.abort(why);
        self.wake_all();
    }

    /// Unpark every sleeping lane, so it looks again at what it waits for.
    fn wake_all(&self) {
        for sleeper in &self.sleepers {
            if let Some(t) = lock(sleeper).as_ref() {
                t.unpark();
            }
        }
    }

    /// Unpark `waiter`'s lane if it waits for rank `by`.
    fn wake(&self, waiter: u32, by: u32) {
        let Some(w) = self.waiting_for.get(waiter as usize) else {
            return;
        };
        if w.load(Ordering::SeqCst) == by
            && let Some(t) = lock(&self.sleepers[waiter as usize]).as_ref()
        {
            t.unpark();
        }
    }

    /// Rank `rank` begins no further call (its handle is gone): every lane that waits for
    /// it, or begins a call it never began, fails at once.
    pub fn leave(&self, rank: u32) {
        self.calls.leave(rank);
        self.wake_all();
    }

    /// The rank `rank`'s lane is waiting for, if any.
    fn waits_for(&self, rank: u32) -> Option<u32> {
        let w = self.waiting_for.get(rank as usize)?.load(Ordering::Acquire);
        (w != NOT_WAITING).then_some(w)
    }

    fn ring(&self, src: u32, dst: u32) -> Result<Arc<HostRing>, CollectivesError> {
        let mut rings = lock(&self.rings);
        let bytes = self.shape.ring_bytes();
        let ring = rings.get_or_make(src, dst, || HostRing::new(bytes).map(Arc::new))?;
        Ok(Arc::clone(ring))
    }
}

/// One rank's lane on its own thread: the channels it uses, found once.
#[derive(Debug)]
pub struct HostFlagLane {
    me: u32,
    timeout: Duration,
    shared: Arc<HostFlagChannels>,
    rings: LaneRings<Arc<HostRing>>,
}

impl HostFlagLane {
    /// The group's channels.
    pub fn channels(&self) -> &Arc<HostFlagChannels> {
        &self.shared
    }

    /// The channel from `src` to `dst` (one of this rank's), made on first use.
    fn ring_of(&mut self, src: u32, dst: u32) -> Result<&HostRing, CollectivesError> {
        let shared = &self.shared;
        let ring = self.rings.get(src, dst, || shared.ring(src, dst))?;
        Ok(ring)
    }

    /// Wait until `flag` reaches `at`, or fail at `deadline` (aborting the group) or when
    /// another lane aborted it.
    fn wait(
        &mut self,
        flag: FlagRef,
        at: u32,
        stage: usize,
        deadline: Instant,
    ) -> Result<(), CollectivesError> {
        let me = self.me;
        let shared = Arc::clone(&self.shared);
        let counter = self.ring_of(flag.src, flag.dst)?.counter(flag.counter);
        if super::flag_transport::reached(counter.load(Ordering::Acquire), at) {
            return Ok(());
        }
        let peer = match flag.counter {
            Counter::Posted => flag.src,
            Counter::Freed => flag.dst,
        };
        let waiting_for = &shared.waiting_for[me as usize];
        waiting_for.store(peer, Ordering::SeqCst);
        let waited = wait_for(counter, at, (&shared, peer), me, deadline);
        waiting_for.store(NOT_WAITING, Ordering::Release);
        let what = match flag.counter {
            Counter::Posted => "to put chunk",
            Counter::Freed => "to take out chunk",
        };
        match waited {
            Waited::Reached => Ok(()),
            Waited::Gone => {
                let why = format!(
                    "rank {me}: stage {stage}: rank {peer}'s handle was dropped while rank {me} \
                     waited for it {what} {} of their channel ({})",
                    at.wrapping_sub(1),
                    shared.calls.last_call_words(peer)
                );
                shared.abort(why.clone());
                Err(flag_error(why))
            }
            Waited::Aborted => Err(shared.abort.error("flag transport", me, stage)),
            Waited::TimedOut => {
                let why = format!(
                    "rank {me}: stage {stage}: waited {:?} for rank {peer} {what} {} of their \
                     channel{}",
                    self.timeout,
                    at.wrapping_sub(1),
                    wait_chain_words(me, peer, |r| shared.waits_for(r), &shared.calls)
                );
                shared.abort(why.clone());
                Err(flag_error(why))
            }
        }
    }
}

/// How a wait ended.
enum Waited {
    Reached,
    Aborted,
    /// The rank waited for left.
    Gone,
    TimedOut,
}

/// Look at `counter`, which `peer` advances, until it reaches `at` (yielding for
/// [`SPIN_FOR`], then sleeping a little longer each time), the group is aborted, `peer`
/// left, or `deadline` passes.
fn wait_for(
    counter: &AtomicU32,
    at: u32,
    (shared, peer): (&HostFlagChannels, u32),
    me: u32,
    deadline: Instant,
) -> Waited {
    let mut spin_until = Instant::now() + SPIN_FOR;
    let mut nap = Duration::from_micros(20);
    loop {
        if super::flag_transport::reached(counter.load(Ordering::Acquire), at) {
            return Waited::Reached;
        }
        if shared.abort.is_aborted() {
            return Waited::Aborted;
        }
        if shared.calls.is_gone(peer) {
            // A rank leaves between calls: what it put or took before then has landed.
            if super::flag_transport::reached(counter.load(Ordering::SeqCst), at) {
                return Waited::Reached;
            }
            return Waited::Gone;
        }
        let now = Instant::now();
        if now >= deadline {
            return Waited::TimedOut;
        }
        if now < spin_until {
            std::thread::yield_now();
        } else {
            // A signal this lane waits for unparks it (`wake`); the park's token keeps a
            // wake-up that comes before the park, and the nap bounds a missed one.
            *lock(&shared.sleepers[me as usize]) = Some(std::thread::current());
            if super::flag_transport::reached(counter.load(Ordering::SeqCst), at) {
                return Waited::Reached;
            }
            std::thread::park_timeout(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_micros(500));
            spin_until = Instant::now() + SPIN_FOR;
        }
    }
}

fn flag_error(message: String) -> CollectivesError {
    CollectivesError::Backend {
        backend: "flag transport",
        message,
    }
}

// SAFETY: steps run in order on the calling thread; copies stay inside their ring's slot
// (`FlagShape::slot_offset`), the protocol's counters (release stores after copies, acquire loads before)
// keep a slot's put and take apart, and every step is done when `run` returns.
unsafe impl FlagLane for HostFlagLane {
    fn reaches(&self, space: AddressSpace) -> bool {
        space == AddressSpace::Host
    }

    unsafe fn run(&mut self, steps: &[FlagStep], stage: usize) -> Result<(), CollectivesError> {
        let shape = self.shared.shape;
        let deadline = Instant::now() + self.timeout;
        for step in steps {
            match *step {
                FlagStep::Wait { flag, at } => self.wait(flag, at, stage, deadline)?,
                FlagStep::Put {
                    to,
                    slot,
                    src,
                    bytes,
                } => {
                    let off = shape.slot_offset(slot, bytes)?;
                    let ring = self.ring_of(self.me, to)?;
                    // SAFETY: `src` holds `bytes` readable bytes (the caller's contract); the
                    // slot is inside the ring and empty (the wait before this step).
                    unsafe {
                        std::ptr::copy_nonoverlapping(src, ring.ring.as_ptr().add(off), bytes)
                    };
                }
                FlagStep::Take {
                    from,
                    slot,
                    dst,
                    bytes,
                } => {
                    let off = shape.slot_offset(slot, bytes)?;
                    let ring = self.ring_of(from, self.me)?;
                    // SAFETY: `dst` holds `bytes` writable bytes nothing else touches; the slot
                    // is inside the ring and full (the wait before this step).
                    unsafe {
                        std::ptr::copy_nonoverlapping(ring.ring.as_ptr().add(off), dst, bytes)
                    };
                }
                FlagStep::Signal { flag, value } => {
                    let ring = self.ring_of(flag.src, flag.dst)?;
                    // Sequentially consistent with the waiter's `waiting_for` store and its
                    // look before parking, so one of the two sees the other.
                    ring.counter(flag.counter).store(value, Ordering::SeqCst);
                    let waiter = match flag.counter {
                        Counter::Posted => flag.dst,
                        Counter::Freed => flag.src,
                    };
                    self.shared.wake(waiter, self.me);
                }
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
