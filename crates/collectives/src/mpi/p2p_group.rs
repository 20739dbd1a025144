//! Sends and receives of an MPI host rank as one group (`ncclGroupStart`, `ncclSend` and
//! `ncclRecv`, `ncclGroupEnd`; a lone `send` or `recv` is a group of one). Every operation's
//! pairwise agreement is posted at once, and each operation then moves on by itself: a
//! group completes whatever order its peers post theirs in, so a ring of sends and receives
//! in one group cannot deadlock, and a rank waits only for the peers its group names.
//!
//! - The agreement is `point_to_point.rs`'s, message for message (the sender's descriptor,
//!   the receiver's verdict). A receive answers as soon as its sender's descriptor arrives,
//!   and an operation posts its data as soon as its verdict is known, so no operation waits
//!   for another's peer (which may be waiting, in a lone call, for an earlier one's data).
//! - The k-th operation of a pair and direction meets the peer's k-th: MPI keeps the order
//!   of messages between two ranks on one tag, so an operation posts its data only after
//!   the earlier ones of its pair and direction did, and each pair and direction has its own
//!   sequence number, which the agreement compares.
//! - Sends and receives to this rank itself pair up in group order and copy locally.
//! - A send of at most `EARLY_LIMIT` bytes posts its data with its descriptor (on a tag of
//!   its own), so its pair pays no round trip before the data; a receive whose verdict fails
//!   takes that data into memory it drops.
//! - The data moves through staging memory the communicator keeps, so a request MPI cannot
//!   cancel after a timeout is buried with it ([`super::requests::Health::bury`]); in
//!   zero-copy mode ([`MpiCommunicator::set_zero_copy`]) through the caller's memory, and
//!   such a failure aborts the job. Each operation is one message, or `CHUNK`-byte messages
//!   beyond MPI's `int` count.

use std::collections::HashSet;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use super::point_to_point::{HANDSHAKE, TAG_ACK, TAG_DESC, at_step, pair_verdict, verdict_error};
use super::requests::{Requests, SPINS_BEFORE_YIELD};
use super::typed::host_bytes;
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::rank::{Lender, P2pOp};
use ::mpi::traits::AsRaw;

/// The tags of a group's data messages on the pair communicator: those that wait for their
/// verdict, and small sends' that go with their descriptor ([`early_bytes`]). Each keeps the
/// order of its pair's legs on both sides.
const TAG_DATA: c_int = 3;
const TAG_EARLY: c_int = 4;

/// The largest send that goes with its descriptor.
const EARLY_LIMIT: usize = 64 << 10;

/// The bytes of an agreement's descriptor and of its answer.
const DESC_BYTES: usize = 8 * 5;
const ACK_BYTES: usize = 8 * 2;

/// The largest data message: an operation past it moves as several, in order.
const CHUNK: usize = 1 << 30;

/// The step name of a group's data, in errors.
const DATA: &str = "move a send/recv group's data";

/// One operation as the group runs it.
#[derive(Clone, Copy, Debug)]
struct Leg {
    op: P2pOp,
    /// The caller's bytes (address, length), or `None` when this rank's checks failed (the
    /// peer is then told an impossible count, so it fails too).
    at: Option<(usize, usize)>,
    /// The agreed outcome: 0 when the data moves (the verdicts of `pair_verdict`).
    verdict: i64,
    /// Where its bytes lie in the staging memory.
    staged: usize,
    /// Its pair and direction's sequence number (from 1).
    seq: u64,
    /// Where it is.
    state: LegState,
    /// The index of the agreement's message it waits for (`Agreeing`) among the round's
    /// requests.
    req: usize,
    /// Its data messages' requests, `data..data_end`.
    data: usize,
    data_end: usize,
    /// Its data is a small send's, posted with the descriptor ([`early_bytes`]).
    early: bool,
}

/// Where a leg is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LegState {
    /// Its agreement is posted; its verdict is not known yet.
    Agreeing,
    /// Its data messages are posted.
    Moving,
    /// Nothing left to wait for (a leg with this rank itself starts here).
    Done,
}

/// Where a run's messages lie: the legs' descriptors and answers (one each per leg) and the
/// staging memory. Raw pointers: MPI writes this memory while requests are pending, so no
/// reference to it is formed during the run.
#[derive(Clone, Copy, Debug)]
struct LegMemory {
    dp: *mut [i64; 5],
    ap: *mut [i64; 2],
    base: *mut u8,
}

/// What a group keeps between calls, so that a call allocates nothing once it has grown to
/// the group's shape: its legs, the agreement's words and the staging memory.
#[derive(Debug, Default)]
pub(super) struct PairScratch {
    legs: Vec<Leg>,
    /// Per leg, the descriptor sent or received.
    descs: Vec<[i64; 5]>,
    /// Per leg, the verdict received or sent.
    acks: Vec<[i64; 2]>,
    staging: Vec<u8>,
    /// The requests of a round (made on the first group).
    reqs: Option<Requests>,
    /// Pairs and directions (peer, sending) with a leg still agreeing earlier in the group,
    /// during one pass of the progress loop.
    blocked: HashSet<(usize, bool)>,
    /// Small sends' data taken by receives that failed, dropped with the next group.
    drains: Vec<Vec<u8>>,
}

impl MpiCommunicator {
    /// Run `ops`, the sends and receives of one group of this host rank, whose buffers
    /// `lender` lent. Every operation whose agreement holds moves its data, even when
    /// another fails; the first error in group order is returned, this rank's own checks
    /// before the pairs' verdicts.
    ///
    /// Errors: a peer that is not a rank ([`MpiError::Unsupported`]); a buffer that is not
    /// host memory; [`MpiError::CountMismatch`], [`MpiError::ElementMismatch`] or
    /// [`MpiError::CallMismatch`] on both ranks of a pair whose calls differ, or for sends
    /// and receives to this rank that do not pair up; [`MpiError::Timeout`] (which fails the
    /// communicator).
    pub(super) fn host_pairs(&self, lender: &mut Lender<'_>, ops: &[P2pOp]) -> MpiResult<()> {
        self.health.check()?;
        let mut scratch = self.pair_scratch.borrow_mut();
        let s = &mut *scratch;
        // An error lending the group's buffers fails every leg; a leg's own, only that one.
        let mut first: Option<MpiError> = lender.take_error().map(MpiError::Backend);
        let lent = first.is_none();
        s.legs.clear();
        for &op in ops {
            let at = match self.leg_bytes(lender, op) {
                Ok(at) if lent => Some(at),
                Ok(_) => None,
                Err(e) => {
                    first.get_or_insert(e);
                    None
                }
            };
            if op.peer >= self.size as usize {
                // No agreement can reach it: the error above names it.
                continue;
            }
            let verdict = if at.is_some() { 0 } else { 1 };
            s.legs.push(Leg {
                op,
                at,
                verdict,
                staged: 0,
                seq: 0,
                state: LegState::Done,
                req: 0,
                data: 0,
                data_end: 0,
                early: false,
            });
        }
        if let Err(e) = self.pair_self(&mut s.legs) {
            first.get_or_insert(e);
        }
        if let Err(e) = self.pair_remote(s) {
            first.get_or_insert(e);
        }
        if first.is_none() {
            let me = self.rank as usize;
            if let Some(leg) = s.legs.iter().find(|l| l.op.peer != me && l.verdict != 0) {
                first = Some(verdict_error(leg.verdict, self.rank, leg.op.peer as u32));
            }
        }
        if s.staging.len() as u64 > self.plan_limits.get().max_scratch_bytes {
            s.staging = Vec::new();
        }
        first.map_or(Ok(()), Err)
    }

    /// The caller's bytes of `op`, checked: its peer is a rank, its view lies in a host
    /// buffer the call lent.
    fn leg_bytes(&self, lender: &Lender<'_>, op: P2pOp) -> MpiResult<(usize, usize)> {
        if op.peer >= self.size as usize {
            return Err(MpiError::Unsupported(format!(
                "rank {}: peer {} is not a rank (0..{})",
                self.rank, op.peer, self.size
            )));
        }
        host_bytes(lender, op.view, op.dtype.size() as usize, self.rank)
    }

    /// Pair the sends to this rank with its receives from itself, in group order, and copy
    /// each send into its receive. A send or receive left over, or a pair of other counts
    /// or types, fails (its legs' verdicts say why; those legs move nothing).
    fn pair_self(&self, legs: &mut [Leg]) -> MpiResult<()> {
        let me = self.rank as usize;
        let mut result = Ok(());
        let is = |l: &Leg, sending: bool| l.op.peer == me && l.op.send == sending;
        let (mut s, mut r) = (0, 0);
        loop {
            while s < legs.len() && !is(&legs[s], true) {
                s += 1;
            }
            while r < legs.len() && !is(&legs[r], false) {
                r += 1;
            }
            let (Some(&a), Some(&b)) = (legs.get(s), legs.get(r)) else {
                let Some(left) = legs.get_mut(s.min(r)) else {
                    return result;
                };
                left.verdict = 3;
                (s, r) = (s + 1, r + 1);
                result = result.and(Err(MpiError::CallMismatch(format!(
                    "rank {me}: a group's sends to rank {me} and receives from it do not pair \
                     up"
                ))));
                continue;
            };
            let verdict = if a.op.dtype != b.op.dtype {
                2
            } else if a.op.view.len != b.op.view.len {
                1
            } else {
                a.verdict.max(b.verdict)
            };
            (legs[s].verdict, legs[r].verdict) = (verdict, verdict);
            (s, r) = (s + 1, r + 1);
            match (verdict, a.at, b.at) {
                (0, Some((src, n)), Some((dst, _))) => {
                    // SAFETY: both spans were lent to this call and checked by `host_bytes`;
                    // a receive's buffer is borrowed uniquely, so it overlaps no send's (and
                    // `copy` would be right even if it did).
                    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
                }
                (1 | 2, ..) => {
                    result = result.and(Err(verdict_error(verdict, self.rank, self.rank)));
                }
                _ => {}
            }
        }
    }

    /// The legs with other ranks, each on its own: its agreement posted at once, its data
    /// as soon as its verdict is known, so a leg never waits for another's peer (the peer of
    /// a later leg may be waiting, in a lone call, for an earlier leg's data). Sets each
    /// leg's verdict, the same as its peer's.
    fn pair_remote(&self, s: &mut PairScratch) -> MpiResult<()> {
        let me = self.rank as usize;
        let PairScratch {
            legs,
            descs,
            acks,
            staging,
            reqs,
            blocked,
            drains,
        } = s;
        drains.clear();
        descs.clear();
        descs.resize(legs.len(), [0; 5]);
        acks.clear();
        acks.resize(legs.len(), [0; 2]);
        let mut total = 0usize;
        {
            let mut seqs = self.p2p_seq.borrow_mut();
            for (leg, d) in legs.iter_mut().zip(descs.iter_mut()) {
                if leg.op.peer == me {
                    continue;
                }
                let seq = seqs.entry((leg.op.peer as u32, leg.op.send)).or_insert(0);
                *seq += 1;
                leg.seq = *seq;
                *d = leg_desc(leg, leg.seq);
                if !self.zero_copy {
                    leg.staged = total;
                    total += leg.at.map_or(0, |(_, n)| n);
                }
            }
        }
        if staging.len() < total {
            staging.resize(total, 0);
        }
        // Raw pointers, taken once: MPI writes these buffers while requests are pending, so
        // no reference to them is formed until the run ends; an element is read only once
        // the request that writes it completed.
        let base = staging.as_mut_ptr();
        let (dp, ap) = (descs.as_mut_ptr(), acks.as_mut_ptr());
        let reqs = reqs.get_or_insert_with(|| Requests::new(self.p2p.as_raw(), self.rank));
        reqs.clear();
        let timeout = self.timeout.get();
        let deadline = Instant::now() + timeout;
        let at = LegMemory { dp, ap, base };
        // `descs`, `acks` and the staging memory neither grow nor drop until the requests
        // complete: on success the loop saw them all complete, and on failure they are
        // buried with what MPI kept (or the job is aborted, below). A panic with requests
        // pending ends the process: unwinding would end the borrows of the caller's buffers
        // that zero-copy messages use, and of the memory above.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: as above.
            unsafe { self.run_legs(legs, (blocked, drains), reqs, at, (deadline, timeout)) }
        }));
        let ran = match ran {
            Ok(r) => r,
            Err(panic) => {
                if reqs.any_pending() {
                    eprintln!(
                        "relaycc: rank {}: a send/recv group panicked with MPI requests \
                         pending: aborting the job",
                        self.rank
                    );
                    self.abort(70)
                }
                std::panic::resume_unwind(panic)
            }
        };
        ran.or_else(|e| {
            let posted_data = legs.iter().any(|l| l.data_end > l.data);
            if self.zero_copy
                && posted_data
                && let Some(stuck) = reqs.take_stuck()
            {
                eprintln!(
                    "relaycc: rank {}: {e}; MPI keeps {} requests, which may be into this \
                     group's buffers (zero copy) and cannot outlive the call: aborting the job",
                    self.rank,
                    stuck.len()
                );
                self.abort(70)
            }
            self.health.settle(Err(e), reqs, || {
                Box::new((
                    std::mem::take(descs),
                    std::mem::take(acks),
                    std::mem::take(staging),
                    std::mem::take(drains),
                ))
            })
        })
    }

    /// Post every leg's agreement, then poll until every leg is done or the deadline
    /// (`deadline`, `timeout` after the start) passes.
    ///
    /// # Safety
    /// `at` points to one descriptor and one answer per leg and to the staging memory the
    /// legs' offsets lie in, which stay allocated and untouched until `reqs` complete or are
    /// buried with them.
    unsafe fn run_legs(
        &self,
        legs: &mut [Leg],
        (blocked, drains): (&mut HashSet<(usize, bool)>, &mut Vec<Vec<u8>>),
        reqs: &mut Requests,
        at: LegMemory,
        (deadline, timeout): (Instant, Duration),
    ) -> MpiResult<()> {
        let me = self.rank as usize;
        for (i, leg) in legs.iter_mut().enumerate() {
            if leg.op.peer == me {
                continue;
            }
            let p = leg.op.peer as c_int;
            leg.req = reqs.posted();
            // SAFETY: element `i` of the descriptors and answers (one per leg), kept as the
            // caller promises.
            unsafe {
                let (d, a) = (at.dp.add(i).cast::<u8>(), at.ap.add(i).cast::<u8>());
                if leg.op.send {
                    reqs.irecv(a, ACK_BYTES, p, TAG_ACK)?;
                    reqs.isend(d, DESC_BYTES, p, TAG_DESC)?;
                } else {
                    reqs.irecv(d, DESC_BYTES, p, TAG_DESC)?;
                }
            }
            leg.state = LegState::Agreeing;
            if leg.op.send
                && let Some((_, n)) = leg.at
            {
                leg.early = early_bytes(n as i64, 1).is_some();
                if leg.early {
                    // SAFETY: the caller's promise.
                    unsafe { self.post_data(leg, reqs, at.base)? };
                    leg.state = LegState::Agreeing;
                }
            }
        }
        let mut spins = 0u32;
        loop {
            reqs.poll()?;
            // SAFETY: the caller's promise.
            let agreeing = unsafe { self.advance_legs(legs, (blocked, drains), reqs, at)? };
            if legs.iter().all(|l| l.state == LegState::Done) {
                // What is left are the agreements' own sends.
                return reqs
                    .wait(0, deadline, timeout)
                    .map_err(|e| at_step(e, HANDSHAKE));
            }
            if Instant::now() > deadline {
                let (step, level) = if agreeing { (HANDSHAKE, 0) } else { (DATA, 1) };
                return Err(reqs.time_out(step, level, timeout));
            }
            spins += 1;
            if spins > SPINS_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    }

    /// One pass over the legs after a poll: each whose awaited messages completed moves on.
    /// Returns whether a leg is still agreeing.
    ///
    /// # Safety
    /// As for [`MpiCommunicator::run_legs`].
    unsafe fn advance_legs(
        &self,
        legs: &mut [Leg],
        (blocked, drains): (&mut HashSet<(usize, bool)>, &mut Vec<Vec<u8>>),
        reqs: &mut Requests,
        at: LegMemory,
    ) -> MpiResult<bool> {
        let mut agreeing = false;
        blocked.clear();
        for (i, leg) in legs.iter_mut().enumerate() {
            let key = (leg.op.peer, leg.op.send);
            match leg.state {
                // A pair's data messages go in the order of its legs, which MPI matches in
                // order: a leg whose agreement completed waits for the earlier legs of its
                // pair and direction (their messages arrived first, but `poll` may have
                // tested them just before).
                LegState::Agreeing if reqs.done(leg.req) && !blocked.contains(&key) => {
                    // SAFETY: the leg's request completed, so its descriptor or answer holds
                    // the peer's message; the memory is kept as the caller promises.
                    unsafe {
                        let words = (at.dp.add(i).cast_const(), at.ap.add(i));
                        self.leg_agreed(leg, words, reqs, at.base, drains)?;
                    }
                }
                LegState::Agreeing => {
                    agreeing = true;
                    blocked.insert(key);
                }
                LegState::Moving if (leg.data..leg.data_end).all(|i| reqs.done(i)) => {
                    leg.state = LegState::Done;
                    if let (false, false, 0, Some((addr, n))) =
                        (self.zero_copy, leg.op.send, leg.verdict, leg.at)
                    {
                        // SAFETY: the receive's span, lent uniquely to this call, and its
                        // staged bytes, which the completed requests wrote.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                at.base.add(leg.staged),
                                addr as *mut u8,
                                n,
                            )
                        };
                    }
                }
                _ => {}
            }
        }
        Ok(agreeing)
    }

    /// A leg whose agreement's message arrived (the verdict at `ack` for a send, the peer's
    /// descriptor at `desc` for a receive, which answers at `ack`): its verdict, and its data
    /// posted when the verdict holds (a small send's went with its descriptor). A receive
    /// that fails still takes a small send's data, into memory it drops (`drains`).
    ///
    /// # Safety
    /// `desc` and `ack` are the leg's elements, which no pending request writes; they and
    /// the staging memory at `base` (which holds the leg's bytes at its offset) must stay
    /// allocated and untouched until `reqs` complete or are buried with them, as must
    /// `drains`' buffers.
    unsafe fn leg_agreed(
        &self,
        leg: &mut Leg,
        (desc, ack): (*const [i64; 5], *mut [i64; 2]),
        reqs: &mut Requests,
        base: *mut u8,
        drains: &mut Vec<Vec<u8>>,
    ) -> MpiResult<()> {
        let p = leg.op.peer as c_int;
        let mut sent_early = None;
        if !leg.op.send {
            // SAFETY: the caller's contract: the peer's descriptor arrived, `ack` is free.
            unsafe {
                let theirs = desc.read();
                sent_early = early_bytes(theirs[0], theirs[2]);
                leg.early = sent_early.is_some();
                ack.write(pair_verdict(&theirs, &leg_desc(leg, leg.seq)));
                reqs.isend(ack.cast(), ACK_BYTES, p, TAG_ACK)?;
            }
        }
        // SAFETY: the caller's contract (a pending send only reads it).
        leg.verdict = unsafe { ack.read() }[0];
        leg.state = LegState::Done;
        if leg.op.send && leg.early {
            // Its data is on its way since the start.
            leg.state = LegState::Moving;
        } else if leg.verdict == 0 {
            // SAFETY: the caller's contract.
            unsafe { self.post_data(leg, reqs, base)? };
        } else if let Some(n) = sent_early {
            // The send's early data must still be received, and is dropped.
            drains.push(vec![0; n]);
            let at = drains
                .last_mut()
                .map_or(std::ptr::null_mut(), |d| d.as_mut_ptr());
            leg.data = reqs.posted();
            // SAFETY: `n` bytes at `at`, a buffer of `drains`, which the caller keeps.
            unsafe { reqs.irecv(at, n, p, TAG_EARLY)? };
            leg.data_end = reqs.posted();
            leg.state = LegState::Moving;
        }
        Ok(())
    }

    /// Post the data messages of `leg`, whose agreement holds (or, for an early send, is
    /// not known yet): from or into the caller's span (zero copy) or the leg's staging
    /// bytes, a send's copied there first.
    ///
    /// # Safety
    /// The staging memory at `base` must hold the leg's bytes at its offset and stay
    /// allocated and untouched until `reqs` complete or are buried with it.
    unsafe fn post_data(&self, leg: &mut Leg, reqs: &mut Requests, base: *mut u8) -> MpiResult<()> {
        let Some((addr, n)) = leg.at.filter(|&(_, n)| n > 0) else {
            return Ok(());
        };
        let at = if self.zero_copy {
            // Zero copy: the messages read and write the caller's span; should MPI keep one
            // of them after a failure, the job is aborted before the call returns.
            addr as *mut u8
        } else {
            // SAFETY: the leg's `n` bytes at `staged` lie in the staging memory.
            let at = unsafe { base.add(leg.staged) };
            if leg.op.send {
                // SAFETY: the caller's span, lent to this call, and the leg's staging bytes.
                unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, at, n) };
            }
            at
        };
        let (p, tag) = (
            leg.op.peer as c_int,
            if leg.early { TAG_EARLY } else { TAG_DATA },
        );
        leg.data = reqs.posted();
        for off in (0..n).step_by(CHUNK) {
            let len = CHUNK.min(n - off);
            // SAFETY: the caller keeps the staging memory until the requests complete; each
            // leg's range is its own.
            unsafe {
                if leg.op.send {
                    reqs.isend(at.add(off), len, p, tag)?;
                } else {
                    reqs.irecv(at.add(off), len, p, tag)?;
                }
            }
        }
        leg.data_end = reqs.posted();
        leg.state = LegState::Moving;
        Ok(())
    }
}

/// The bytes of a send of `count` elements of `size` bytes that goes with its descriptor,
/// before its verdict (`None`: the send waits for the verdict). Small sends go early, so a
/// pair's agreement costs no round trip before their data; a receive that fails takes such
/// a send's data anyway, into memory it drops, which stays small. Sender and receiver
/// decide alike, from the sender's descriptor.
fn early_bytes(count: i64, size: i64) -> Option<usize> {
    let bytes = usize::try_from(count.checked_mul(size)?).ok()?;
    (1..=EARLY_LIMIT).contains(&bytes).then_some(bytes)
}

/// The descriptor of `leg` in the pairwise agreement (`point_to_point.rs`): count (an
/// impossible one when this rank's checks failed), element type and size, the pair's
/// sequence number `seq`, and 0 (a host rank never needs the pair's shape prepared).
fn leg_desc(leg: &Leg, seq: u64) -> [i64; 5] {
    let count = if leg.at.is_some() {
        leg.op.view.len as i64
    } else {
        i64::MAX
    };
    let d = leg.op.dtype;
    [count, d as i64, d.size() as i64, seq as i64, 0]
}
