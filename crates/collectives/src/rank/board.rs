//! The board of a communicator's direct calls (`direct.rs`): each rank's post (its call,
//! its slices' addresses, whether it is done, who uses its memory), the abort, and the
//! wake-ups: a rank waiting for several posts to change sleeps until the last of them has,
//! woken by that change alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::op::{Desc, Failure};
use crate::backend::validate::Bound;
use crate::error::CollectivesError;

/// Lock ignoring poisoning: every critical section of the board and the meetings is a single
/// consistent update.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a thread that finds nothing it can do yields its core (`yield_now`) and looks
/// again before it sleeps on a condition variable (a direct call's board, a meeting). A small
/// call's wait is often shorter than a sleep and its wake-up (futex calls and a context
/// switch, the waker's too): 8 host ranks on two threads took 40 to 56 us per 4 KiB
/// all_reduce sleeping at once, 15 to 26 us looking again first (`docs/MEASUREMENTS.md`).
/// Bounded in time, not in looks.
pub(crate) const SPIN_FOR: Duration = Duration::from_micros(25);

/// What a rank posts for a call: the call, and where its input and output are.
#[derive(Debug)]
pub(super) struct Posted {
    pub desc: Desc,
    pub in_place: bool,
    pub input: Bound,
    pub output: Bound,
}

/// A rank's post on the board.
#[derive(Debug, Default)]
pub(super) struct Post {
    /// The call the rank is in or finished last.
    pub seq: Option<u64>,
    /// Its posted call.
    pub call: Option<Posted>,
    /// The posted addresses may be used: the rank has not left call `seq`.
    pub open: bool,
    /// The call before `seq` and how it was made, to name a mismatch found late.
    pub before: Option<(u64, Desc, bool)>,
    /// The rank is done with its part of `seq`.
    pub done: bool,
    /// Ranks using this rank's memory in call `seq`.
    pub users: u32,
    /// Ranks waiting for a change of this post, woken (and forgotten) at the next one.
    pub watchers: Vec<usize>,
}

impl Post {
    /// The rank has finished its part of call `k`.
    pub fn finished(&self, k: u64) -> bool {
        self.seq.is_some_and(|s| s > k || (s == k && self.done))
    }
}

/// Why the communicator was aborted: the failure, and the call it came from.
#[derive(Debug)]
pub(super) struct Abort {
    seq: u64,
    call: &'static str,
    failure: Arc<Failure>,
}

#[derive(Debug)]
pub(super) struct BoardState {
    pub posts: Vec<Post>,
    /// Per rank: changes of watched posts it still waits for before it is woken.
    countdown: Vec<usize>,
    /// The earliest failed call, if any: it and every later call fail.
    abort: Option<Abort>,
}

impl BoardState {
    /// The abort that fails call `seq`: one at that call or an earlier one. A rank still in
    /// an earlier call goes on: the ranks it works with are in that call too, or past it.
    pub fn abort_at(&self, seq: u64) -> Option<&Abort> {
        self.abort.as_ref().filter(|a| a.seq <= seq)
    }
}

/// Where the ranks of a communicator post their direct calls (module docs).
#[derive(Debug)]
pub(crate) struct Board {
    pub(super) state: Mutex<BoardState>,
    /// Per rank, what it waits on: only the ranks watching a post that changes are woken.
    cvs: Vec<Condvar>,
    /// Set with `BoardState::abort`, read without the lock.
    aborted: AtomicBool,
}

impl Board {
    /// A board for `n` ranks.
    pub(crate) fn new(n: usize) -> Self {
        Board {
            state: Mutex::new(BoardState {
                posts: (0..n).map(|_| Post::default()).collect(),
                countdown: vec![0; n],
                abort: None,
            }),
            cvs: (0..n).map(|_| Condvar::new()).collect(),
            aborted: AtomicBool::new(false),
        }
    }

    /// Wake every waiter, so they notice a rank that left.
    pub(crate) fn poke(&self) {
        let _st = lock(&self.state);
        self.wake_all();
    }

    fn wake_all(&self) {
        for cv in &self.cvs {
            cv.notify_one();
        }
    }

    /// Rank `r`'s post just changed: count it off for the ranks watching it, and wake those
    /// with nothing left to wait for.
    pub(super) fn changed(&self, st: &mut BoardState, r: usize) {
        let BoardState {
            posts, countdown, ..
        } = st;
        for &w in &posts[r].watchers {
            if let Some(c) = countdown.get_mut(w) {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    self.cvs[w].notify_one();
                }
            }
        }
        posts[r].watchers.clear();
    }

    /// Wait on rank `me`'s condition until every post of `ranks` has changed (`all`: one
    /// wake-up, however many ranks it waits for) or one of them has, or the communicator is
    /// aborted, a rank leaves, or `limit` passes.
    pub(super) fn watch<'a>(
        &self,
        mut st: MutexGuard<'a, BoardState>,
        me: usize,
        ranks: impl Iterator<Item = usize>,
        all: bool,
        limit: Duration,
    ) -> MutexGuard<'a, BoardState> {
        let mut count = 0;
        for r in ranks {
            let w = &mut st.posts[r].watchers;
            if !w.contains(&me) {
                w.push(me);
            }
            count += 1;
        }
        st.countdown[me] = if all { count } else { count.min(1) };
        self.cvs[me]
            .wait_timeout(st, limit)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// The error of call `call` (number `seq`) once the communicator is aborted: the failure
    /// itself within the call that failed, `Aborted` after it.
    pub(super) fn error_of(a: &Abort, call: &'static str, seq: u64) -> CollectivesError {
        if a.seq == seq {
            a.failure.to_error(call)
        } else {
            CollectivesError::Aborted {
                call,
                seq: a.seq,
                cause: Arc::new(a.failure.to_error(a.call)),
            }
        }
    }

    /// The error of call `call` (number `seq`) when an abort fails it.
    pub(crate) fn aborted(&self, call: &'static str, seq: u64) -> Option<CollectivesError> {
        let st = lock(&self.state);
        st.abort_at(seq).map(|a| Self::error_of(a, call, seq))
    }

    /// Abort at call `seq` (`call`), failed by a rank's arguments or checks (`error`).
    pub(crate) fn fail(&self, seq: u64, call: &'static str, error: Arc<CollectivesError>) {
        let mut st = lock(&self.state);
        self.abort(&mut st, seq, call, Failure::Failed(error));
    }

    /// Abort with `failure` at call `seq` (the earliest failed call's abort stays), waking
    /// every waiter; returns the error of call `call` (number `seq`) under the abort that
    /// stands.
    pub(super) fn abort(
        &self,
        st: &mut BoardState,
        seq: u64,
        call: &'static str,
        failure: Failure,
    ) -> CollectivesError {
        let a = st
            .abort
            .take()
            .filter(|a| a.seq <= seq)
            .unwrap_or_else(|| Abort {
                seq,
                call,
                failure: Arc::new(failure),
            });
        let e = Self::error_of(&a, call, seq);
        st.abort = Some(a);
        self.aborted.store(true, Ordering::Release);
        self.wake_all();
        e
    }

    /// The abort's cause as the failure of meeting round `seq`, once an abort fails it.
    pub(crate) fn failure(&self, seq: u64) -> Option<Failure> {
        if !self.aborted.load(Ordering::Acquire) {
            return None;
        }
        let st = lock(&self.state);
        let a = st.abort_at(seq)?;
        Some(Failure::Failed(Arc::new(a.failure.to_error(a.call))))
    }
}
