//! The calls a flag transport's ranks have begun, so that ranks that call different
//! collectives are told so, and a rank that stops calling is named with its last call,
//! without any rank waiting for another to compare.
//!
//! Each rank has a row of the book: the records of its recent calls (call number, collective,
//! element type, op, root, count, a hash of its counts, tag), fixed-size, in a ring of
//! [`CALL_WINDOW`] entries allocated once. A rank posts its record when it begins a call,
//! before its first step, then compares it with the record of the same call of every peer
//! that has posted that call already. Of any two ranks, the one that posts a call second
//! sees the other's record (a post and its comparisons are one step under the book's lock),
//! so every pair of records of a call is compared once both are
//! posted, and a mismatch is found by the later rank at the moment it begins the call.
//!
//! A record stays in its row until every peer has posted that call, so the later rank always
//! finds it. A rank that begins a call more than [`CALL_WINDOW`] calls ahead of a peer (GPU
//! ranks enqueue without waiting for the device, so one can run far ahead on the host) waits
//! for that peer to post, within the timeout, and then names it as missing.
//!
//! all_to_all_v's send counts differ from rank to rank by design, so its records leave the
//! counts out: whether they pair up is the count matrix's question, which a plan needs
//! before any rank can run.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use relaycc_route::{Collective, DType, ReduceOp};

use crate::call::CallDesc;
use crate::rank::board::lock;

/// Calls a row keeps: how far a rank may run ahead of the slowest peer's posts before its
/// next post waits.
pub const CALL_WINDOW: usize = 128;

/// What a rank posts of one call: its number on the group and what every rank must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRecord {
    /// The call's number on the group, from 0.
    pub seq: u64,
    call: &'static str,
    collective: Collective,
    dtype: DType,
    op: ReduceOp,
    root: usize,
    count: u64,
    /// [`CallDesc::counts_hash`], 0 for all_to_all_v (module docs).
    counts_hash: i64,
    tag: u64,
}

impl CallRecord {
    /// Call `seq`, as `desc` describes it.
    pub fn new(seq: u64, desc: &CallDesc) -> CallRecord {
        CallRecord {
            seq,
            call: desc.call,
            collective: desc.collective,
            dtype: desc.dtype,
            op: desc.op,
            root: desc.root,
            count: desc.count,
            counts_hash: if desc.collective == Collective::AllToAllV {
                0
            } else {
                desc.counts_hash()
            },
            tag: desc.tag,
        }
    }

    /// The call's name (`all_reduce`).
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// The descriptor without its counts (the record keeps their hash only).
    fn desc(&self) -> CallDesc {
        let mut d = CallDesc::new(self.collective, self.dtype, self.count, self.op, self.root);
        d.call = self.call;
        d.tag = self.tag;
        d
    }

    /// The call in messages: `call #3 (all_reduce of f32, op sum, count 96)`.
    pub fn show(&self) -> String {
        format!("call #{} ({})", self.seq, self.desc().show())
    }

    /// Why `other` (rank `b`'s record of the same call) does not match this one (rank
    /// `a`'s), if it does not.
    fn differs(&self, a: u32, other: &CallRecord, b: u32) -> Option<String> {
        let (mine, theirs) = (self.desc(), other.desc());
        let why = match mine.differs(a as usize, &theirs, b as usize) {
            Some(why) => why,
            None if self.counts_hash != other.counts_hash => format!(
                "the counts differ: rank {a} and rank {b} pass different counts to {}",
                mine.show()
            ),
            None => return None,
        };
        Some(format!("call #{}: {why}", self.seq))
    }
}

/// Why a post was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostRefused {
    /// A peer's record of the same call differs: the words say how.
    Mismatch(String),
    /// A peer has not posted a call this rank needs it to have posted (the window is full)
    /// within the timeout: the words name it and its last call.
    Missing(String),
    /// The group was aborted while this rank waited.
    Aborted,
}

/// One rank's row: its calls posted so far, and the records of its recent calls at
/// `seq % CALL_WINDOW`.
#[derive(Debug)]
struct Row {
    /// Calls posted so far (the next call's number).
    posted: u64,
    ring: Box<[Option<CallRecord>]>,
}

impl Row {
    /// The record of call `seq`, while the row keeps it.
    fn record(&self, seq: u64) -> Option<CallRecord> {
        self.ring[seq as usize % CALL_WINDOW].filter(|r| r.seq == seq && seq < self.posted)
    }
}

/// The book of one group's calls (module docs). One lock guards every row, so a post and its
/// comparisons are one step that no other post interleaves: a post is a few record
/// comparisons, far shorter than the call it begins.
#[derive(Debug)]
pub struct CallBook {
    rows: Mutex<Box<[Row]>>,
    /// Per rank: its handle is gone, so it begins no further call.
    gone: Box<[AtomicBool]>,
}

impl CallBook {
    /// A book for ranks `0..ranks`.
    pub fn new(ranks: u32) -> CallBook {
        CallBook {
            rows: Mutex::new(
                (0..ranks)
                    .map(|_| Row {
                        posted: 0,
                        ring: vec![None; CALL_WINDOW].into_boxed_slice(),
                    })
                    .collect(),
            ),
            gone: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Rank `rank` begins no further call (its handle is gone): a peer that begins a call
    /// it never began, or waits for it, fails at once.
    pub fn leave(&self, rank: u32) {
        if let Some(g) = self.gone.get(rank as usize) {
            g.store(true, Ordering::SeqCst);
        }
    }

    /// Whether `rank` left ([`CallBook::leave`]).
    pub fn is_gone(&self, rank: u32) -> bool {
        self.gone
            .get(rank as usize)
            .is_some_and(|g| g.load(Ordering::SeqCst))
    }

    /// Post rank `me`'s record of its next call, `rec` (whose `seq` must be that call's
    /// number), and compare it with every peer's record of the same call already posted.
    /// Waits, within `timeout` and while `aborted` says no, only where a peer is
    /// [`CALL_WINDOW`] calls behind. Allocates nothing unless it refuses.
    pub fn post(
        &self,
        me: u32,
        rec: CallRecord,
        timeout: Duration,
        aborted: &dyn Fn() -> bool,
    ) -> Result<(), PostRefused> {
        let deadline = Instant::now() + timeout;
        let mut nap = Duration::from_micros(20);
        loop {
            let mut rows = lock(&self.rows);
            let n = rows.len();
            let Some(mine) = rows.get(me as usize) else {
                return Err(PostRefused::Mismatch(format!(
                    "rank {me} posts a call to a book of {n} ranks"
                )));
            };
            if rec.seq != mine.posted {
                return Err(PostRefused::Mismatch(format!(
                    "rank {me} posts call #{} where its next call is #{}",
                    rec.seq, mine.posted
                )));
            }
            // The entry this post overwrites, call `seq - CALL_WINDOW`, must have been posted
            // (and so compared) by every peer, or a later peer would not find it.
            let left = (0..n)
                .find(|&p| p != me as usize && rows[p].posted <= rec.seq && self.is_gone(p as u32));
            if let Some(p) = left {
                return Err(PostRefused::Missing(format!(
                    "rank {me} began call #{}, which rank {p} never will: its handle was \
                     dropped ({}; rank {p} is the one missing)",
                    rec.seq,
                    last_call_words(p as u32, &rows[p])
                )));
            }
            let behind = rec.seq.checked_sub(CALL_WINDOW as u64).and_then(|evicted| {
                (0..n).find(|&p| p != me as usize && rows[p].posted <= evicted)
            });
            let Some(p) = behind else {
                rows[me as usize].ring[rec.seq as usize % CALL_WINDOW] = Some(rec);
                rows[me as usize].posted = rec.seq + 1;
                for (q, row) in rows.iter().enumerate() {
                    let theirs = row.record(rec.seq).filter(|_| q != me as usize);
                    if let Some(why) = theirs.and_then(|t| t.differs(q as u32, &rec, me)) {
                        return Err(PostRefused::Mismatch(why));
                    }
                }
                return Ok(());
            };
            let last = last_call_words(p as u32, &rows[p]);
            drop(rows);
            if aborted() {
                return Err(PostRefused::Aborted);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(PostRefused::Missing(format!(
                    "rank {me} waited {:?} to begin call #{}, {CALL_WINDOW} calls ahead of rank \
                     {p} ({last}; rank {p} is the one missing)",
                    timeout, rec.seq
                )));
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    /// The last call `rank` posted, if any.
    pub fn last_call(&self, rank: u32) -> Option<CallRecord> {
        let rows = lock(&self.rows);
        let row = rows.get(rank as usize)?;
        row.record(row.posted.checked_sub(1)?)
    }

    /// `rank`'s last call in words: `rank 2's last call is call #3 (all_reduce of f32, ...)`,
    /// or `rank 2 has begun no call`.
    pub fn last_call_words(&self, rank: u32) -> String {
        match lock(&self.rows).get(rank as usize) {
            Some(row) => last_call_words(rank, row),
            None => format!("rank {rank} is not a rank of this group"),
        }
    }
}

/// Rank `rank`'s last call in words, from its row ([`CallBook::last_call_words`]).
fn last_call_words(rank: u32, row: &Row) -> String {
    match row.posted.checked_sub(1).and_then(|s| row.record(s)) {
        Some(rec) => format!("rank {rank}'s last call is {}", rec.show()),
        None => format!("rank {rank} has begun no call"),
    }
}

#[cfg(test)]
#[path = "call_book/tests.rs"]
mod tests;
