//! Steps 2 and 3 of a direct call (`direct.rs`) as a state machine over the board, so that
//! one thread drives any number of its ranks' calls at once, as one thread drives several
//! GPUs between `ncclGroupStart` and `ncclGroupEnd`: every call posts first, then the calls
//! advance together under the board's lock, their parts run outside it, and where none can
//! advance the thread sleeps until a post one of them waits for changes. No step blocks on
//! another rank while holding the thread, so ranks driven by one thread never wait for each
//! other's thread.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Shared;
use super::board::{Board, BoardState, SPIN_FOR, lock};
use super::direct::DirectCall;
use super::direct_part::KeptPart;
use super::op::{Desc, Failure};
use crate::backend::validate::Bound;
use crate::error::{CollectivesError, Result};

/// Where a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// all_to_all_v: waiting for every rank's post of the call, to agree on the count
    /// matrix from their counts (no rank holds it alone).
    Agree,
    /// all_to_all_v: the matrix agreed, its part is to be planned and cut, outside the
    /// board's lock.
    Plan,
    /// Waiting for the posts of the ranks whose memory its part touches (step 2).
    Take,
    /// Its part is to run, outside the board's lock.
    Run,
    /// Its part ran (or could not): mark it done and leave its users (step 3).
    Release,
    /// Waiting until no rank uses its memory and the ranks touching it are done.
    Finish,
    /// Over: its result is final.
    Done,
}

/// What a call needs before it can go on.
enum Step {
    /// Its part is to plan or run outside the board's lock.
    Run,
    /// A change of one of these ranks' posts, at the latest by the instant.
    Wait(Vec<usize>, Instant),
    /// Nothing: it is over.
    Finished,
}

/// A direct call under way (module docs).
#[derive(Debug)]
pub(crate) struct Running {
    call: DirectCall,
    /// Its part: `None` while an all_to_all_v agrees on its matrix and plans.
    k: Option<KeptPart>,
    /// all_to_all_v's agreed count matrix, until its part is planned.
    matrix: Vec<Vec<u64>>,
    stage: Stage,
    start: Instant,
    /// The part's bindings: this rank's, its scratch, and those it took.
    bound: Vec<Bound>,
    /// This rank counts among the users of its reads.
    took: bool,
    /// The outcome so far (the run's; the call's once `Done`).
    result: Result<()>,
}

/// Of the ranks `touched_by` (whose parts touch a rank's memory), those that have not
/// finished call `seq` (none once an abort fails the call: then only users are waited for).
fn unfinished<'a>(
    touched_by: &'a [usize],
    st: &'a BoardState,
    seq: u64,
) -> impl Iterator<Item = usize> + 'a {
    let waits = st.abort_at(seq).is_none();
    touched_by
        .iter()
        .copied()
        .filter(move |&q| waits && !st.posts[q].finished(seq))
}

/// Rank `p`'s posted call `seq` (descriptor, in place or not, and whether its post is still
/// open), `Ok(None)` where it has not posted it yet, or the mismatch where it is past it.
fn posted_call<'a>(
    st: &'a BoardState,
    p: usize,
    c: &DirectCall,
) -> std::result::Result<Option<(&'a Desc, bool, bool)>, String> {
    let seq = c.seq;
    let post = &st.posts[p];
    Ok(match (post.seq, &post.call, &post.before) {
        (Some(s), Some(x), _) if s == seq => Some((&x.desc, x.in_place, post.open)),
        (Some(s), _, Some((b, d, i))) if s > seq && *b == seq => Some((d, *i, false)),
        (Some(s), _, _) if s > seq => {
            return Err(format!(
                "rank {p} is at call {s} while rank {} makes call {seq} ({})",
                c.me,
                c.desc.show()
            ));
        }
        _ => None,
    })
}

impl Running {
    /// A posted call, with its part (to take next) or without (an all_to_all_v, to agree
    /// on its matrix first).
    pub(super) fn new(call: DirectCall, mut k: Option<KeptPart>) -> Self {
        let bound = k.as_mut().map_or_else(Vec::new, |k| call.bindings(k));
        Running {
            stage: if k.is_some() {
                Stage::Take
            } else {
                Stage::Agree
            },
            call,
            k,
            matrix: Vec::new(),
            start: Instant::now(),
            bound,
            took: false,
            result: Ok(()),
        }
    }

    /// The ranks its part touches, none without a part.
    fn reads(&self) -> &[usize] {
        self.k.as_ref().map_or(&[], |k| &k.part.reads)
    }

    fn deadline(&self) -> Instant {
        self.start + self.call.timeout
    }

    /// Advance under the board's lock as far as the posts allow.
    fn advance(&mut self, board: &Board, st: &mut BoardState) -> Step {
        loop {
            match self.stage {
                Stage::Agree => match self.try_agree(board, st) {
                    Ok(None) => self.stage = Stage::Plan,
                    Ok(Some(missing)) => return Step::Wait(missing, self.deadline()),
                    Err(e) => {
                        self.result = Err(e);
                        self.stage = Stage::Release;
                    }
                },
                Stage::Take => match self.try_take(board, st) {
                    Ok(None) => {
                        self.took = true;
                        self.stage = Stage::Run;
                    }
                    Ok(Some(missing)) => return Step::Wait(missing, self.deadline()),
                    Err(e) => {
                        self.result = Err(e);
                        self.stage = Stage::Release;
                    }
                },
                Stage::Plan | Stage::Run => return Step::Run,
                Stage::Release => {
                    self.release(board, st);
                    self.stage = Stage::Finish;
                }
                Stage::Finish => match self.try_finish(board, st) {
                    Some(watch) => {
                        // Past the deadline a rank that has come is still waited for: its
                        // part touches this rank's memory and ends (or stops at the abort).
                        let until = self
                            .deadline()
                            .max(Instant::now() + Duration::from_millis(10));
                        return Step::Wait(watch, until);
                    }
                    None => {
                        let (me, seq) = (self.call.me, self.call.seq);
                        st.posts[me].open = false;
                        board.changed(st, me);
                        self.result = match st.abort_at(seq) {
                            Some(a) => Err(Board::error_of(a, self.call.desc.call, seq)),
                            None => Ok(()),
                        };
                        self.stage = Stage::Done;
                    }
                },
                Stage::Done => return Step::Finished,
            }
        }
    }

    /// Outside the board's lock: plan an all_to_all_v's part, or run the part.
    fn run(&mut self) {
        match self.stage {
            Stage::Plan => self.plan(),
            Stage::Run => self.run_part(),
            _ => {}
        }
    }

    /// An all_to_all_v's part of the plan of its agreed matrix, bound to its counts, then
    /// taken as any other call's (a failure aborts at the release).
    fn plan(&mut self) {
        match self.call.part(std::mem::take(&mut self.matrix)) {
            Ok(mut k) => {
                self.bound = self.call.bindings(&mut k);
                self.k = Some(k);
                self.stage = Stage::Take;
            }
            Err(e) => {
                self.result = Err(e);
                self.stage = Stage::Release;
            }
        }
    }

    /// Run the part with the tasks kept from the last call where the addresses are the
    /// same.
    fn run_part(&mut self) {
        let n = self.call.shared.comm.ranks();
        let Some(k) = self.k.as_mut() else {
            self.result = Err(CollectivesError::Unmatched(
                "a call run without its part".into(),
            ));
            self.stage = Stage::Release;
            return;
        };
        let fresh = !matches!(&k.tasks, Some((b, _)) if *b == self.bound);
        let ran = if fresh {
            // Inputs and outputs are the callers' memory; scratch is the plan's.
            crate::backend::host_here::HereTasks::resolve(k.program(), &self.bound, |b| b < 2 * n)
                .map(|tasks| k.tasks = Some((self.bound.clone(), tasks)))
        } else {
            Ok(())
        };
        let me = self.call.me;
        self.result = ran.and_then(|()| match k.tasks.as_mut() {
            // A panic must not leave this rank counted among the users of other ranks'
            // memory, or they would wait for this part forever: it fails the call (and
            // aborts) like an error.
            Some((_, tasks)) => catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: every address is a posted binding of this call (this rank's own,
                // or of a rank among whose users this rank counts, whose post stays open
                // until that count is zero) or this rank's scratch of a plan it holds;
                // inputs of calls that are not in place are never written (`exec::check`);
                // every output and scratch buffer is written by one rank's part only where
                // no other part touches it at the same time (the checker's proof of the
                // plan: its lanes are unordered, so they touch disjoint elements wherever
                // one writes; a v-collective's part bound to its counts keeps that proof,
                // `exec::counts`, and every rank binds the same counts, which the take
                // compared, or for all_to_all_v the matrix every rank agreed from the same
                // posts); and each rank's slices stay borrowed by its call until its memory
                // has no user.
                unsafe { tasks.run() }
            }))
            .unwrap_or_else(|_| {
                Err(CollectivesError::Backend {
                    backend: "host",
                    message: format!("rank {me}: its part of the plan panicked"),
                })
            }),
            None => Err(CollectivesError::Unmatched("no resolved tasks".into())),
        });
        // This part's streamed stores are visible before its end is.
        crate::backend::host::store_fence();
        self.stage = Stage::Release;
    }

    /// Step 2, without waiting: `None` once every rank of the part's reads has posted this
    /// call (compared with this rank's, this rank counted among their users, their bindings
    /// filled in); the ranks still missing otherwise. A mismatch, or a missing rank gone or
    /// past the deadline, aborts.
    fn try_take(&mut self, board: &Board, st: &mut BoardState) -> Result<Option<Vec<usize>>> {
        let c = &self.call;
        let (me, seq, call) = (c.me, c.seq, c.desc.call);
        let n = c.shared.comm.ranks();
        if let Some(a) = st.abort_at(seq) {
            return Err(Board::error_of(a, call, seq));
        }
        let mut missing = Vec::new();
        let mut wrong = None;
        for &p in self.reads() {
            let (desc, in_place, open) = match posted_call(st, p, c) {
                Ok(Some(posted)) => posted,
                Ok(None) => {
                    missing.push(p);
                    continue;
                }
                Err(m) => {
                    wrong = wrong.or(Some(m));
                    continue;
                }
            };
            wrong = wrong.or_else(|| differs(c, p, desc, in_place)).or_else(|| {
                (!open).then(|| {
                    format!(
                        "rank {p} has left call {seq} while rank {me} needs its memory in it \
                         ({})",
                        c.desc.show()
                    )
                })
            });
        }
        if let Some(m) = wrong {
            return Err(board.abort(st, seq, call, Failure::Mismatch(m)));
        }
        if missing.is_empty() {
            let Some(k) = &self.k else {
                return Ok(None);
            };
            for &p in &k.part.reads {
                let post = &mut st.posts[p];
                post.users += 1;
                if let Some(x) = &post.call {
                    self.bound[p] = x.input;
                    self.bound[n + p] = x.output;
                }
            }
            return Ok(None);
        }
        self.missing(board, st, missing)
    }

    /// The all_to_all_v agreement, without waiting: `None` once every rank has posted this
    /// call, with matching descriptors and counts that pair up (the matrix kept for the
    /// plan); the ranks still missing otherwise. Every rank judges the same posts, so a
    /// mismatch is the same message on every rank; it aborts, as a missing rank gone or past
    /// the deadline does.
    fn try_agree(&mut self, board: &Board, st: &mut BoardState) -> Result<Option<Vec<usize>>> {
        let c = &self.call;
        let (me, seq, call) = (c.me, c.seq, c.desc.call);
        if let Some(a) = st.abort_at(seq) {
            return Err(Board::error_of(a, call, seq));
        }
        let n = c.shared.comm.ranks();
        let mut missing = Vec::new();
        let mut wrong = None;
        let mut rows: Vec<crate::call::RankDesc<'_>> = Vec::with_capacity(n);
        for p in 0..n {
            if p == me {
                rows.push((p, Some(&c.desc)));
                continue;
            }
            match posted_call(st, p, c) {
                Ok(Some((desc, in_place, _))) => {
                    wrong = wrong.or_else(|| differs(c, p, desc, in_place));
                    rows.push((p, Some(desc)));
                }
                Ok(None) => missing.push(p),
                Err(m) => wrong = wrong.or(Some(m)),
            }
        }
        if wrong.is_none() && missing.is_empty() {
            match crate::call::matrix(&rows) {
                Ok(m) => self.matrix = m,
                Err(m) => wrong = Some(format!("{m} (call {seq})")),
            }
        }
        if let Some(m) = wrong {
            return Err(board.abort(st, seq, call, Failure::Mismatch(m)));
        }
        if missing.is_empty() {
            return Ok(None);
        }
        self.missing(board, st, missing)
    }

    /// Ranks `missing` have not posted this call: the ranks to wait for, or the timeout
    /// (aborting) once one of them is gone or the deadline is past.
    fn missing(
        &self,
        board: &Board,
        st: &mut BoardState,
        missing: Vec<usize>,
    ) -> Result<Option<Vec<usize>>> {
        let c = &self.call;
        let (seq, call) = (c.seq, c.desc.call);
        let gone = missing
            .iter()
            .any(|&p| c.shared.gone[p].load(Ordering::Acquire));
        let now = Instant::now();
        if gone || now >= self.deadline() {
            let failure = Failure::Timeout {
                seq,
                missing,
                waited_ms: now.duration_since(self.start).as_millis() as u64,
                gone,
            };
            return Err(board.abort(st, seq, call, failure));
        }
        Ok(Some(missing))
    }

    /// The start of step 3: a failed run aborts; mark this rank done and leave the users of
    /// the ranks it took.
    fn release(&mut self, board: &Board, st: &mut BoardState) {
        let (me, seq, call) = (self.call.me, self.call.seq, self.call.desc.call);
        if let Err(e) = std::mem::replace(&mut self.result, Ok(()))
            && st.abort_at(seq).is_none()
        {
            board.abort(st, seq, call, Failure::Failed(Arc::new(e)));
        }
        st.posts[me].done = true;
        board.changed(st, me);
        if self.took
            && let Some(k) = &self.k
        {
            for &p in &k.part.reads {
                st.posts[p].users = st.posts[p].users.saturating_sub(1);
                if st.posts[p].users == 0 {
                    board.changed(st, p);
                }
            }
        }
    }

    /// The rest of step 3, without waiting: `None` once no rank uses this rank's memory and
    /// (unless aborted) every rank whose part touches it is done with this call; the posts to
    /// watch otherwise. A rank that touches it and has not come aborts once gone or past the
    /// deadline.
    fn try_finish(&mut self, board: &Board, st: &mut BoardState) -> Option<Vec<usize>> {
        let c = &self.call;
        let (me, seq, call) = (c.me, c.seq, c.desc.call);
        let part = self.k.as_ref().map_or(&[][..], |k| &k.part.touched_by);
        loop {
            let users = st.posts[me].users > 0;
            if !users && unfinished(part, st, seq).next().is_none() {
                return None;
            }
            let now = Instant::now();
            let absent = |q: &usize| st.posts[*q].seq.is_none_or(|s| s < seq);
            let late = now >= self.deadline();
            let gone = unfinished(part, st, seq)
                .filter(absent)
                .find(|&q| late || c.shared.gone[q].load(Ordering::Acquire));
            if gone.is_some() {
                let failure = Failure::Timeout {
                    seq,
                    missing: unfinished(part, st, seq).filter(absent).collect(),
                    waited_ms: now.duration_since(self.start).as_millis() as u64,
                    gone: !late,
                };
                board.abort(st, seq, call, failure);
                continue;
            }
            return Some(
                users
                    .then_some(me)
                    .into_iter()
                    .chain(unfinished(part, st, seq))
                    .collect(),
            );
        }
    }
}

/// How rank `p`'s posted call (`desc`, in place or not) differs from `c`'s, if it does.
fn differs(c: &DirectCall, p: usize, desc: &Desc, in_place: bool) -> Option<String> {
    let mine = &c.desc;
    if let Some(why) = mine.differs(c.me, desc, p) {
        return Some(format!("{why} (call {})", c.seq));
    }
    (in_place != c.in_place).then(|| {
        let how = |x: bool| if x { "in place" } else { "on separate buffers" };
        format!(
            "call {}: rank {} calls {} {}, rank {p} {}",
            c.seq,
            c.me,
            mine.show(),
            how(c.in_place),
            how(in_place)
        )
    })
}

/// How long a thread driving calls of several communicators sleeps on one of them before it
/// looks at the others again: it cannot sleep on several boards at once, and a call of one
/// communicator may wait for a rank whose thread waits for this thread's call of another.
const OTHER_BOARDS_POLL: Duration = Duration::from_millis(1);

/// Most calls of one board a thread drives and still looks again before it sleeps: a pass
/// over more holds the board's lock long enough to slow the other threads' passes (1,024
/// ranks on two threads, 256 KiB: 5 to 16% slower with every thread looking again).
const SPIN_CALLS: usize = 16;

/// Run chains of direct calls of distinct ranks from this thread to their ends, and return
/// each chain's result in order: `Ok` when every call of it succeeded, else its first error
/// (a failure aborts the communicator, so the chain's later calls are not begun: they would
/// only return [`CollectivesError::Aborted`]). A chain is one rank's group of collectives, its
/// calls one after the other. Every chain's first call begins (checks, plan, post) before
/// any waits; then the calls advance together, as their posts allow, and a chain's next call
/// begins as soon as the one before it is over.
pub(crate) fn drive(chains: Vec<Vec<DirectCall>>) -> Vec<Result<()>> {
    let mut results: Vec<Result<()>> = (0..chains.len()).map(|_| Ok(())).collect();
    let mut rest: Vec<std::vec::IntoIter<DirectCall>> =
        chains.into_iter().map(Vec::into_iter).collect();
    // The calls by communicator, in order of first appearance.
    let mut driven: Vec<Driven> = Vec::new();
    for i in 0..rest.len() {
        begin_next(i, &mut rest, &mut driven, &mut results);
    }
    let single = driven.len() == 1;
    while driven.iter().any(|b| !b.calls.is_empty()) {
        let mut moved = false;
        for b in driven.iter_mut().filter(|b| !b.calls.is_empty()) {
            match b.pass(single.then_some(Duration::MAX)) {
                Pass::Done | Pass::Moved => moved = true,
                Pass::Waiting => {}
            }
        }
        moved |= settle(&mut driven, &mut rest, &mut results);
        if !single
            && !moved
            && let Some(b) = driven.iter_mut().find(|b| !b.calls.is_empty())
        {
            b.pass(Some(OTHER_BOARDS_POLL));
            settle(&mut driven, &mut rest, &mut results);
        }
    }
    results
}

/// Begin chain `i`'s next call, if it has one, among the calls driven here; a call that
/// fails to begin ends its chain with its error.
fn begin_next(
    i: usize,
    rest: &mut [std::vec::IntoIter<DirectCall>],
    driven: &mut Vec<Driven>,
    results: &mut [Result<()>],
) {
    let Some(c) = rest.get_mut(i).and_then(Iterator::next) else {
        return;
    };
    match c.begin() {
        Ok(r) => match driven
            .iter_mut()
            .find(|b| Arc::ptr_eq(&b.shared, &r.call.shared))
        {
            Some(b) => b.calls.push((i, r)),
            None => driven.push(Driven {
                shared: r.call.shared.clone(),
                calls: vec![(i, r)],
                idle_since: None,
                to_run: Vec::new(),
                watch: Vec::new(),
            }),
        },
        Err(e) => end_chain(i, e, rest, results),
    }
}

/// End chain `i` with error `e`: its later calls are not begun.
fn end_chain(
    i: usize,
    e: CollectivesError,
    rest: &mut [std::vec::IntoIter<DirectCall>],
    results: &mut [Result<()>],
) {
    results[i] = Err(e);
    rest[i] = Vec::new().into_iter();
}

/// Take the calls that are over out of `driven`: give each rank's part back to its kept
/// parts, record the result, and begin the chain's next call (or, after a failure, end the
/// chain). True when any call was over.
fn settle(
    driven: &mut Vec<Driven>,
    rest: &mut [std::vec::IntoIter<DirectCall>],
    results: &mut [Result<()>],
) -> bool {
    let mut any = false;
    for b in 0..driven.len() {
        let mut j = 0;
        // A chain's next call joins the same list (one communicator) behind the others, not
        // over yet, so the walk passes it by.
        while j < driven[b].calls.len() {
            if driven[b].calls[j].1.stage != Stage::Done {
                j += 1;
                continue;
            }
            any = true;
            let (i, r) = driven[b].calls.swap_remove(j);
            let Running {
                call,
                k,
                result,
                bound,
                ..
            } = r;
            if let Some(mut k) = k {
                k.bindings = bound;
                lock(&call.shared.kept[call.me]).put(k);
            }
            match result {
                Ok(()) => begin_next(i, rest, driven, results),
                Err(e) => {
                    // Ranks of this call that did not come directly wait at a meeting.
                    call.shared.poke_meetings();
                    end_chain(i, e, rest, results);
                }
            }
        }
    }
    any
}

/// One communicator's calls driven by this thread.
struct Driven {
    shared: Arc<Shared>,
    /// The calls under way, each with the index of its chain.
    calls: Vec<(usize, Running)>,
    /// Since when the passes in a row found every call waiting (and yielded instead of
    /// sleeping).
    idle_since: Option<Instant>,
    /// A pass's calls to run and ranks to watch, kept from pass to pass.
    to_run: Vec<usize>,
    watch: Vec<usize>,
}

/// What a pass over one communicator's calls did.
enum Pass {
    /// Every call is over.
    Done,
    /// Some call moved or ran its part.
    Moved,
    /// Every call left waits for other ranks.
    Waiting,
}

impl Driven {
    /// Advance every call as far as the posts allow, run the parts that may run (outside the
    /// lock); where none moved and `sleep` is given, yield the core (for [`SPIN_FOR`] of
    /// passes in a row), then sleep until a watched post changes, at most `sleep`.
    fn pass(&mut self, sleep: Option<Duration>) -> Pass {
        let board = &self.shared.board;
        // The thread sleeps on the condition of the lowest rank it drives here.
        let waiter = self.calls.iter().map(|(_, r)| r.call.me).min().unwrap_or(0);
        let mut st = lock(&board.state);
        let (to_run, watch) = (&mut self.to_run, &mut self.watch);
        to_run.clear();
        watch.clear();
        let mut until: Option<Instant> = None;
        let mut waiting = 0;
        // A call's step may free another's on this thread: sleep only after a pass in which
        // no call moved (nobody else would wake this thread for what it did itself).
        let mut moved = false;
        for (j, (_, r)) in self.calls.iter_mut().enumerate() {
            let was = r.stage;
            let step = r.advance(board, &mut st);
            moved |= r.stage != was;
            match step {
                Step::Run => to_run.push(j),
                Step::Wait(ranks, by) => {
                    watch.extend(ranks);
                    until = Some(until.map_or(by, |u| u.min(by)));
                    waiting += 1;
                }
                Step::Finished => {}
            }
        }
        if !to_run.is_empty() || (moved && waiting > 0) {
            drop(st);
            for &j in &self.to_run {
                self.calls[j].1.run();
            }
            self.idle_since = None;
            return Pass::Moved;
        }
        let Some(until) = until else {
            return Pass::Done;
        };
        if let Some(cap) = sleep {
            let now = Instant::now();
            if self.calls.len() <= SPIN_CALLS
                && now.duration_since(*self.idle_since.get_or_insert(now)) < SPIN_FOR
            {
                drop(st);
                std::thread::yield_now();
                return Pass::Waiting;
            }
            self.idle_since = None;
            let limit = until.saturating_duration_since(now).min(cap);
            // One waiting call sleeps until every post it watches has changed; several wake
            // at the first change, since any of them may be able to go on.
            drop(board.watch(st, waiter, self.watch.iter().copied(), waiting == 1, limit));
        }
        Pass::Waiting
    }
}
