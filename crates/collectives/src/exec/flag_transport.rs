//! The flag transport: the executor's cross-rank steps as copies through rings of slots and
//! sequence-numbered flags, so each rank enqueues its own part and only the data it needs
//! orders it after its peers. It is the protocol GPU ranks carry on the device (copies and
//! `cuStreamWaitValue32`/`cuStreamWriteValue32` on a rank's stream, `crate::cuda::flags`), and
//! the host runs the very same steps with atomics for flags ([`super::flag_host`]), which is
//! how machines without a GPU exercise it.
//!
//! Per ordered pair of ranks (sender, receiver) there is one *channel*: a ring of
//! [`FlagShape::slots`] slots of [`FlagShape::slot_bytes`] bytes in the receiver's memory, and
//! two 32-bit counters that only grow (modulo 2^32): `posted`, the chunks the sender has put
//! into the ring, written by the sender's lane, and `freed`, the chunks the receiver has taken
//! out, written by the receiver's lane. A message of `b` bytes is `max(1, ceil(b / slot_bytes))`
//! chunks; chunk `c` of a channel (counted over every message the channel ever carried) goes
//! through slot `c mod slots`. Putting chunk `c` waits for `freed >= c + 1 - slots` (its slot
//! is empty); taking it waits for `posted >= c + 1`. Counters compare cyclically, as
//! `CU_STREAM_WAIT_VALUE_GEQ` does: `value` has reached `at` when `(value - at) as i32 >= 0`.
//!
//! A rank's lane runs its steps one after another (a CUDA stream, a thread). In a stage, the
//! messages on one channel, in posting order, make one sequence of chunks, and the channels
//! are interleaved chunk by chunk: in round `k`, first chunk `k` of every channel to a peer,
//! then chunk `k` of every channel from one, so a channel carries at most one chunk each way
//! per round. This cannot deadlock, whatever order the ranks arrive in: order every step by
//! (dependency level of its stage, round, puts before takes). A put of round `k` waits only
//! for the take of its channel's chunk `slots` earlier (round `k - slots`, or an earlier
//! level), a take of round `k` only for its channel's put of round `k`, and everything before
//! a step on its own lane is earlier in that order, so by induction every step runs. (Both
//! ends of a message are at the same dependency level of the plan, so their stages line up;
//! the lowering posts one pair's messages in op-id order on both sides, so a channel's chunks
//! pair up without tags. Putting every message's chunk `k` in round `k` instead would put two
//! chunks of one channel in a round when a stage sends a peer two messages, and with one
//! slot two ranks doing so would each wait for the other to take.)
//!
//! Rings are made on a channel's first use, in the receiver's memory, and a group holds at
//! most a budget of ring bytes per rank ([`RingTable`]; ranks over flags give it the
//! communicator's staging budget): a channel whose ring would pass it fails its first step.
//!
//! The transport does not see sizes its peer meant: two ends that disagree on a message's
//! bytes drift apart and a wait times out, or bytes land garbled, but every copy stays inside
//! the ring's slots and the ranks' own buffers. What keeps disagreeing calls from running is
//! the group's book of calls ([`super::call_book`]): a rank begins each call with
//! [`FlagTransport::begin_call`], which posts its descriptor before the call's first step and
//! compares it with the peers' records of that call, so the rank that begins a call second
//! finds a mismatch and aborts the group before it enqueues anything, and no rank waits for
//! another to compare. A rank's later steps that wait for the one that refused then stop at
//! the abort.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::call_book::{CallBook, CallRecord, PostRefused};
use super::run::Transport;
use crate::backend::AddressSpace;
use crate::call::CallDesc;
use crate::error::CollectivesError;

/// The rings of a flag transport's channels: made by [`FlagShape::new`], which checks them,
/// so every shape holds at least one slot of at least one byte, and a ring's bytes fit an
/// allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagShape {
    slots: u32,
    slot_bytes: usize,
}

impl Default for FlagShape {
    /// NCCL's buffer per connection (`NCCL_BUFFSIZE`, 4 MiB, [NCCL-env]) as 4 slots of 1 MiB:
    /// a sender fills a slot while its receiver empties another, and a chunk's three driver
    /// calls a side (on CUDA lanes) come once per MiB.
    fn default() -> FlagShape {
        FlagShape {
            slots: 4,
            slot_bytes: (relaycc_route::staging::NCCL_BUFFSIZE_BYTES / 4) as usize,
        }
    }
}

impl FlagShape {
    /// `slots` slots of `slot_bytes` bytes per channel, or an error where either is zero or
    /// a ring's bytes would pass what one allocation may hold (`isize::MAX`).
    pub fn new(slots: u32, slot_bytes: usize) -> Result<FlagShape, CollectivesError> {
        if slots == 0 || slot_bytes == 0 {
            return Err(CollectivesError::Setup(format!(
                "a flag transport needs at least one slot of at least one byte per channel \
                 (asked {slots} slots of {slot_bytes} bytes)"
            )));
        }
        let ring = (slots as usize).checked_mul(slot_bytes);
        if ring.is_none_or(|r| r > isize::MAX as usize) {
            return Err(CollectivesError::Setup(format!(
                "a ring of {slots} slots of {slot_bytes} bytes is past what one allocation \
                 holds"
            )));
        }
        Ok(FlagShape { slots, slot_bytes })
    }

    /// Slots per channel, at least 1: 2 or more let a sender put a chunk while its receiver
    /// takes the previous one.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes per slot, at least 1: a message's chunk.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes of one channel's ring.
    pub fn ring_bytes(&self) -> usize {
        self.slots as usize * self.slot_bytes
    }

    /// Where a chunk of `bytes` bytes in slot `slot` starts in its ring, or an error when it
    /// would not lie inside the ring (a lane checks every copy with this, whatever the step
    /// says).
    pub fn slot_offset(&self, slot: u32, bytes: usize) -> Result<usize, CollectivesError> {
        if slot >= self.slots || bytes > self.slot_bytes {
            return Err(CollectivesError::Backend {
                backend: "flag transport",
                message: format!(
                    "a chunk of {bytes} bytes in slot {slot} of a ring of {} slots of {} bytes",
                    self.slots, self.slot_bytes
                ),
            });
        }
        Ok(slot as usize * self.slot_bytes)
    }

    /// The chunks of a message of `bytes` bytes (an empty message is one empty chunk, so its
    /// two ends still pair up).
    pub fn chunks(&self, bytes: usize) -> u64 {
        bytes.div_ceil(self.slot_bytes).max(1) as u64
    }
}

/// Which counter of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Chunks the sender has put into the ring.
    Posted,
    /// Chunks the receiver has taken out.
    Freed,
}

/// One counter of the channel from rank `src` to rank `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlagRef {
    /// The sending rank.
    pub src: u32,
    /// The receiving rank.
    pub dst: u32,
    /// Which of the channel's counters.
    pub counter: Counter,
}

/// One step of a rank's lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagStep {
    /// Wait until `flag` has reached `at` (cyclically).
    Wait {
        /// The counter.
        flag: FlagRef,
        /// The value it must reach.
        at: u32,
    },
    /// Copy `bytes` bytes from `src` into slot `slot` of this rank's channel to `to`.
    Put {
        /// The receiving rank.
        to: u32,
        /// The slot.
        slot: u32,
        /// The chunk's bytes, in this rank's memory.
        src: *const u8,
        /// Its length, at most a slot.
        bytes: usize,
    },
    /// Copy `bytes` bytes out of slot `slot` of the channel from `from` into `dst`.
    Take {
        /// The sending rank.
        from: u32,
        /// The slot.
        slot: u32,
        /// Where the chunk goes, in this rank's memory.
        dst: *mut u8,
        /// Its length, at most a slot.
        bytes: usize,
    },
    /// Set `flag` to `value` once every earlier step of the lane is done (and visible).
    Signal {
        /// The counter.
        flag: FlagRef,
        /// Its new value.
        value: u32,
    },
}

/// Whether counter value `value` has reached `at`, comparing cyclically as
/// `CU_STREAM_WAIT_VALUE_GEQ` does (`(int32_t)(value - at) >= 0`).
pub fn reached(value: u32, at: u32) -> bool {
    (value.wrapping_sub(at) as i32) >= 0
}

/// What one rank of a flag transport runs its steps on: a thread with host memory, or a CUDA
/// stream. The rings and counters belong to it; the [`FlagTransport`] only decides the steps.
///
/// # Safety
/// An implementation runs a lane's steps in order, each after the previous one is done and
/// visible to every rank's lane (a `Signal` publishes the copies before it), and keeps every
/// `Put`/`Take` inside its channel's ring, which no one else uses; `run` may return before the
/// steps are done only when whoever runs this rank's program orders every later use of the
/// `Put` sources and `Take` destinations after them (the stream they are enqueued on).
pub unsafe trait FlagLane {
    /// Whether the lane's copies can read and write memory of `space` in place.
    fn reaches(&self, space: AddressSpace) -> bool;
    /// Run (or enqueue) `steps` of stage `stage` in order.
    ///
    /// # Safety
    /// Every `Put` source and `Take` destination is a live range of the given bytes that stays
    /// as the [`Transport`] contract says.
    unsafe fn run(&mut self, steps: &[FlagStep], stage: usize) -> Result<(), CollectivesError>;
    /// How long a wait of this lane, or its post in the book of calls, may take before it
    /// aborts the group.
    fn timeout(&self) -> Duration;
    /// Set [`FlagLane::timeout`] for this lane's later calls.
    fn set_timeout(&mut self, timeout: Duration);
    /// The group's book of calls, one for every lane of the group.
    fn calls(&self) -> &CallBook;
    /// Abort the group with `why` (the first abort's words are kept): every lane stops at its
    /// next wait, and no step waits forever.
    fn abort(&self, why: String);
    /// The group's abort, seen by every lane.
    fn group_abort(&self) -> &GroupAbort;
}

/// A group's abort: set once, keeping the first failure's words, and seen by every lane.
#[derive(Debug, Default)]
pub struct GroupAbort {
    aborted: AtomicBool,
    failure: OnceLock<String>,
}

impl GroupAbort {
    /// Abort with `why` (a second abort keeps the first one's words).
    pub fn abort(&self, why: String) {
        let _ = self.failure.set(why);
        self.aborted.store(true, Ordering::SeqCst);
    }

    /// Whether the group was aborted.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Why the group was aborted, once it was.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// What rank `me`'s lane of `backend` returns at stage `stage` once the group is aborted.
    pub fn error(&self, backend: &'static str, me: u32, stage: usize) -> CollectivesError {
        CollectivesError::Backend {
            backend,
            message: format!(
                "rank {me}: stage {stage}: the group was aborted: {}",
                self.failure().unwrap_or("no reason given")
            ),
        }
    }
}

/// A group's rings, each made on its channel's first use and held in its receiver's memory,
/// at most `budget` bytes of them in any one rank's memory: a group whose every rank
/// exchanges data with every other holds `ranks - 1` rings per rank, so the budget (the
/// communicator's staging budget per device) bounds what a group allocates at any size.
#[derive(Debug)]
pub struct RingTable<T> {
    rings: HashMap<(u32, u32), T>,
    /// Rings held in each rank's memory.
    incoming: Vec<u64>,
    ring_bytes: u64,
    budget: u64,
}

impl<T> RingTable<T> {
    /// No ring yet, for `ranks` ranks whose channels have `shape`, within `budget` bytes of
    /// rings per rank.
    pub fn new(ranks: u32, shape: FlagShape, budget: u64) -> RingTable<T> {
        RingTable {
            rings: HashMap::new(),
            incoming: vec![0; ranks as usize],
            ring_bytes: shape.ring_bytes() as u64,
            budget,
        }
    }

    /// The ring of the channel from `src` to `dst`, made by `make` on its first use. Errors:
    /// a rank outside the group, one more ring past the budget of `dst`'s memory (nothing is
    /// made then), and `make`'s.
    pub fn get_or_make(
        &mut self,
        src: u32,
        dst: u32,
        make: impl FnOnce() -> Result<T, CollectivesError>,
    ) -> Result<&T, CollectivesError> {
        let held = match self.incoming.get(dst as usize) {
            Some(&h) if (src as usize) < self.incoming.len() => h,
            _ => {
                return Err(CollectivesError::Backend {
                    backend: "flag transport",
                    message: format!(
                        "a channel from rank {src} to rank {dst} in a group of {} ranks",
                        self.incoming.len()
                    ),
                });
            }
        };
        if !self.rings.contains_key(&(src, dst)) {
            let after = (held + 1).saturating_mul(self.ring_bytes);
            if after > self.budget {
                return Err(CollectivesError::Setup(format!(
                    "rank {dst}'s flag channels would hold {} rings of {} bytes ({after} bytes), \
                     past the budget of {} bytes per rank (the communicator's staging budget): \
                     give the rings fewer or smaller slots, or raise the budget",
                    held + 1,
                    self.ring_bytes,
                    self.budget
                )));
            }
            let ring = make()?;
            self.rings.insert((src, dst), ring);
            self.incoming[dst as usize] = held + 1;
        }
        self.rings
            .get(&(src, dst))
            .ok_or_else(|| CollectivesError::Unmatched("a ring just made".into()))
    }

    /// Every ring made.
    pub fn rings(&self) -> impl Iterator<Item = &T> {
        self.rings.values()
    }
}

/// The rings a lane uses, found once per peer: the channel to it and the channel from it.
#[derive(Debug)]
pub struct LaneRings<T> {
    me: u32,
    outgoing: Vec<Option<T>>,
    incoming: Vec<Option<T>>,
}

impl<T> LaneRings<T> {
    /// None yet, for rank `me` of `ranks`.
    pub fn new(me: u32, ranks: u32) -> LaneRings<T> {
        let none = || (0..ranks).map(|_| None).collect();
        LaneRings {
            me,
            outgoing: none(),
            incoming: none(),
        }
    }

    /// The ring of the channel from `src` to `dst`, one of them this lane's rank and the
    /// other a peer, made by `make` on its first use.
    pub fn get(
        &mut self,
        src: u32,
        dst: u32,
        make: impl FnOnce() -> Result<T, CollectivesError>,
    ) -> Result<&T, CollectivesError> {
        let me = self.me;
        let n = self.outgoing.len();
        let (peer, table) = match (src == me, dst == me) {
            (true, false) => (dst, &mut self.outgoing),
            (false, true) => (src, &mut self.incoming),
            _ => {
                return Err(CollectivesError::Backend {
                    backend: "flag transport",
                    message: format!(
                        "rank {me}: a step on the channel from rank {src} to rank {dst}, not one \
                         of its own with a peer"
                    ),
                });
            }
        };
        let Some(entry) = table.get_mut(peer as usize) else {
            return Err(CollectivesError::Backend {
                backend: "flag transport",
                message: format!("rank {me}: no channel with rank {peer} of {n}"),
            });
        };
        let ring = match entry.take() {
            Some(r) => r,
            None => make()?,
        };
        Ok(entry.insert(ring))
    }
}

/// The words that follow "rank `me` waited for rank `peer`": the chain of waits from `peer`
/// (`waits_for` gives the rank a rank's lane waits for, if any) and the rank it ends at, the
/// one to name, with the call `me` is in and the last call that rank began (from `calls`); or
/// the cycle it closes, when ranks disagree on their messages.
pub fn wait_chain_words(
    me: u32,
    peer: u32,
    waits_for: impl Fn(u32) -> Option<u32>,
    calls: &CallBook,
) -> String {
    let mut words = String::new();
    let mut seen = vec![me, peer];
    let mut at = peer;
    while let Some(next) = waits_for(at) {
        words.push_str(&format!(", which waits for rank {next}"));
        if seen.contains(&next) {
            words.push_str(": a cycle of waits (the ranks disagree on their messages)");
            return words;
        }
        seen.push(next);
        at = next;
    }
    let current = calls
        .last_call(me)
        .map_or_else(|| "no call".into(), |c| c.show());
    words.push_str(&format!(
        " (rank {at} is the one missing: rank {me} is in {current}, {})",
        calls.last_call_words(at)
    ));
    words
}

/// A message of the stage: its peer, where it is in this rank's memory, its bytes.
#[derive(Debug, Clone, Copy)]
struct Message {
    peer: u32,
    /// Its place among the stage's posts.
    seq: u32,
    at: *mut u8,
    bytes: usize,
}

/// Where one channel's sequence of chunks stands in a stage: its messages not yet done are
/// `at..end` of the stage's sorted messages, and the next chunk is chunk `chunk` of message
/// `at`.
#[derive(Debug, Clone, Copy)]
struct ChannelCursor {
    at: usize,
    end: usize,
    chunk: u64,
}

impl ChannelCursor {
    /// The channel's next chunk: its message, offset and bytes.
    fn next(&mut self, msgs: &[Message], shape: FlagShape) -> Option<(Message, usize, usize)> {
        let m = *msgs.get(self.at).filter(|_| self.at < self.end)?;
        let (off, bytes) = chunk(shape, m.bytes, self.chunk);
        self.chunk += 1;
        if self.chunk >= shape.chunks(m.bytes) {
            self.at += 1;
            self.chunk = 0;
        }
        Some((m, off, bytes))
    }
}

/// One cursor per peer of `msgs` (sorted by peer), into `out`.
fn open_channels(msgs: &[Message], out: &mut Vec<ChannelCursor>) {
    out.clear();
    let mut i = 0;
    while i < msgs.len() {
        let peer = msgs[i].peer;
        let end = i + msgs[i..].iter().take_while(|m| m.peer == peer).count();
        out.push(ChannelCursor {
            at: i,
            end,
            chunk: 0,
        });
        i = end;
    }
}

/// One rank's end of a flag transport: the steps of each stage, decided from the channel
/// counters this rank has advanced so far, run on its [`FlagLane`].
#[derive(Debug)]
pub struct FlagTransport<L> {
    me: u32,
    shape: FlagShape,
    /// Chunks put so far into each peer's channel from this rank.
    sent: Vec<u64>,
    /// Chunks taken so far from each peer's channel to this rank.
    taken: Vec<u64>,
    sends: Vec<Message>,
    recvs: Vec<Message>,
    send_cursors: Vec<ChannelCursor>,
    recv_cursors: Vec<ChannelCursor>,
    steps: Vec<FlagStep>,
    /// Calls begun so far ([`FlagTransport::begin_call`]).
    calls: u64,
    lane: L,
}

// SAFETY: the raw addresses held between posting and `wait` are the runner's, used only by
// this value's owner (the `Transport` contract keeps them valid until `wait`).
unsafe impl<L: Send> Send for FlagTransport<L> {}

impl<L: FlagLane> FlagTransport<L> {
    /// Rank `me` of `ranks`, on `lane`, whose channels have `shape`.
    pub fn new(me: u32, ranks: u32, shape: FlagShape, lane: L) -> FlagTransport<L> {
        FlagTransport {
            me,
            shape,
            sent: vec![0; ranks as usize],
            taken: vec![0; ranks as usize],
            sends: Vec::new(),
            recvs: Vec::new(),
            send_cursors: Vec::new(),
            recv_cursors: Vec::new(),
            steps: Vec::new(),
            calls: 0,
            lane,
        }
    }

    /// Ends for ranks `0..ranks`, rank `me`'s on `lane(me)`.
    pub fn group(ranks: u32, shape: FlagShape, lane: impl Fn(u32) -> L) -> Vec<FlagTransport<L>> {
        (0..ranks)
            .map(|me| FlagTransport::new(me, ranks, shape, lane(me)))
            .collect()
    }

    /// Begin this rank's next call, described by `desc`, before its first stage: post it in
    /// the group's book of calls and compare it with the peers' records of the same call
    /// ([`super::call_book`]). Returns the call's number. A mismatch with a peer that began
    /// the call first, or a peer a whole window of calls behind past the timeout, aborts the
    /// group; after an abort every call fails with its words.
    ///
    /// Errors: [`CollectivesError::RankMismatch`] naming the call and the field that differs;
    /// otherwise the abort's words.
    pub fn begin_call(&mut self, desc: &CallDesc) -> Result<u64, CollectivesError> {
        let seq = self.calls;
        let abort = self.lane.group_abort();
        if abort.is_aborted() {
            return Err(self.call_aborted(seq));
        }
        let posted = self.lane.calls().post(
            self.me,
            CallRecord::new(seq, desc),
            self.lane.timeout(),
            &|| abort.is_aborted(),
        );
        match posted {
            Ok(()) => {
                self.calls += 1;
                Ok(seq)
            }
            Err(PostRefused::Mismatch(why)) => {
                self.lane.abort(why.clone());
                Err(CollectivesError::RankMismatch {
                    call: desc.call,
                    message: why,
                })
            }
            Err(PostRefused::Missing(why)) => {
                self.lane.abort(why);
                Err(self.call_aborted(seq))
            }
            Err(PostRefused::Aborted) => Err(self.call_aborted(seq)),
        }
    }

    /// What call `seq` returns once the group is aborted.
    fn call_aborted(&self, seq: u64) -> CollectivesError {
        CollectivesError::Backend {
            backend: "flag transport",
            message: format!(
                "rank {}: call #{seq}: the group was aborted: {}",
                self.me,
                self.lane
                    .group_abort()
                    .failure()
                    .unwrap_or("no reason given")
            ),
        }
    }

    /// The lane, to change.
    pub fn lane_mut(&mut self) -> &mut L {
        &mut self.lane
    }

    /// The lane.
    pub fn lane(&self) -> &L {
        &self.lane
    }

    /// The lane, this end given up (its channel counts go with it, so only a fresh end's lane
    /// may start a new transport).
    pub fn into_lane(self) -> L {
        self.lane
    }

    /// The steps of the stage's posted messages (module docs), into `self.steps`: each
    /// channel's messages in posting order make one sequence of chunks, and round `k` puts
    /// chunk `k` of every channel to a peer, then takes chunk `k` of every channel from one.
    fn stage_steps(&mut self) {
        let (me, shape) = (self.me, self.shape);
        self.steps.clear();
        // Messages by peer, each peer's in posting order (the order both ends agree on).
        self.sends.sort_unstable_by_key(|m| (m.peer, m.seq));
        self.recvs.sort_unstable_by_key(|m| (m.peer, m.seq));
        open_channels(&self.sends, &mut self.send_cursors);
        open_channels(&self.recvs, &mut self.recv_cursors);
        let slots = u64::from(shape.slots);
        loop {
            let mut any = false;
            for cur in self.send_cursors.iter_mut() {
                let Some((m, off, bytes)) = cur.next(&self.sends, shape) else {
                    continue;
                };
                any = true;
                let c = self.sent[m.peer as usize];
                self.sent[m.peer as usize] = c + 1;
                let posted = FlagRef {
                    src: me,
                    dst: m.peer,
                    counter: Counter::Posted,
                };
                if c >= slots {
                    self.steps.push(FlagStep::Wait {
                        flag: FlagRef {
                            counter: Counter::Freed,
                            ..posted
                        },
                        at: (c + 1 - slots) as u32,
                    });
                }
                self.steps.push(FlagStep::Put {
                    to: m.peer,
                    slot: (c % slots) as u32,
                    src: m.at.wrapping_add(off).cast_const(),
                    bytes,
                });
                self.steps.push(FlagStep::Signal {
                    flag: posted,
                    value: (c + 1) as u32,
                });
            }
            for cur in self.recv_cursors.iter_mut() {
                let Some((m, off, bytes)) = cur.next(&self.recvs, shape) else {
                    continue;
                };
                any = true;
                let c = self.taken[m.peer as usize];
                self.taken[m.peer as usize] = c + 1;
                let posted = FlagRef {
                    src: m.peer,
                    dst: me,
                    counter: Counter::Posted,
                };
                self.steps.push(FlagStep::Wait {
                    flag: posted,
                    at: (c + 1) as u32,
                });
                self.steps.push(FlagStep::Take {
                    from: m.peer,
                    slot: (c % slots) as u32,
                    dst: m.at.wrapping_add(off),
                    bytes,
                });
                self.steps.push(FlagStep::Signal {
                    flag: FlagRef {
                        counter: Counter::Freed,
                        ..posted
                    },
                    value: (c + 1) as u32,
                });
            }
            if !any {
                break;
            }
        }
    }

    fn peer_ok(&self, peer: u32, what: &str) -> Result<(), CollectivesError> {
        if peer as usize >= self.sent.len() || peer == self.me {
            return Err(CollectivesError::Backend {
                backend: "flag transport",
                message: format!(
                    "rank {}: a {what} with rank {peer} of {} (a channel joins two ranks)",
                    self.me,
                    self.sent.len()
                ),
            });
        }
        Ok(())
    }
}

/// Offset and length of chunk `k` of a message of `bytes` bytes.
fn chunk(shape: FlagShape, bytes: usize, k: u64) -> (usize, usize) {
    let off = (k as usize).saturating_mul(shape.slot_bytes).min(bytes);
    (off, (bytes - off).min(shape.slot_bytes))
}

impl<L: FlagLane> Transport for FlagTransport<L> {
    type Error = CollectivesError;

    fn reaches(&self, space: AddressSpace) -> bool {
        self.lane.reaches(space)
    }

    fn begin(&mut self, _stage: usize) {
        self.sends.clear();
        self.recvs.clear();
    }

    unsafe fn recv(
        &mut self,
        peer: u32,
        _tag: u32,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), CollectivesError> {
        self.peer_ok(peer, "receive")?;
        self.recvs.push(Message {
            peer,
            seq: self.recvs.len() as u32,
            at: dst,
            bytes,
        });
        Ok(())
    }

    unsafe fn send(
        &mut self,
        peer: u32,
        _tag: u32,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), CollectivesError> {
        self.peer_ok(peer, "send")?;
        self.sends.push(Message {
            peer,
            seq: self.sends.len() as u32,
            at: src.cast_mut(),
            bytes,
        });
        Ok(())
    }

    fn wait(&mut self, stage: usize) -> Result<(), CollectivesError> {
        self.stage_steps();
        self.sends.clear();
        self.recvs.clear();
        // SAFETY: every step's source and destination is a chunk of a message the runner
        // posted in this stage, under the `Transport` contract.
        unsafe { self.lane.run(&self.steps, stage) }
    }
}

#[cfg(test)]
#[path = "flag_transport/tests.rs"]
mod tests;
