//! Per-rank handles: one [`RankComm`] per rank, each moved to its own thread, each calling
//! collectives on its own borrowed slices, as engines call `ncclAllReduce` from one thread
//! per GPU.
//!
//! How a call runs: every call of a handle has a sequence number. Where the ranks share one
//! host memory (`RankComm::host`, `host-N` on the host backend), a collective runs without a
//! rendezvous (`direct.rs`; the v-collectives on their capacity plan with the call's counts
//! bound by each rank, all_to_all_v once every rank has read the count matrix off the
//! others' posts), and a group of them runs as that many such calls, one after the other,
//! each with its own number: each rank plans from the communicator's cache, runs the part of
//! the plan on its own lanes on its own thread, reading and writing the other ranks' posted
//! slices in place, and waits for another rank only where it needs
//! that rank's memory or that rank needs its own. A failure there (a mismatch, a missing
//! rank, a failed check) aborts the communicator: the call fails on every rank that is in it
//! and every later call fails with [`CollectivesError::Aborted`]. A send, a receive, and a
//! group of sends and receives to and from other ranks involve only their peers: each pair
//! of ranks has a meeting of its own (`pair_group.rs` for groups), where a group arrives at
//! each of its peers' pairs before it waits for any, and an empty group is done at once.
//! Anything else (split, groups that mix sends or receives with collectives, and collectives
//! on other communicators) meets (`meeting.rs`): the ranks' descriptors (collective, element
//! type, count or counts, op, root, order) are compared (`op.rs`), and the last rank to
//! arrive runs the operation for all (`group_run.rs`): it lends every rank's slices to the
//! communicator's backend for the call, builds one checked group on the all-ranks
//! [`Communicator`] (the same checks, plan cache, checker and executor), launches it, waits,
//! and gives the slices back. A mismatch or a failure is an error on every rank; a rank that
//! does not come within the timeout makes the others fail with
//! [`CollectivesError::RankTimeout`]. Calls block until this rank's part is done and no
//! other rank uses its memory, so the borrows end when the call returns: an input is a
//! `&[T]`, an output a `&mut [T]`, and an in-place call takes one `&mut [T]`, so the borrow
//! checker rules out aliasing.
//!
//! Ranks made by [`Communicator::into_flag_ranks`] run their collectives of fixed counts
//! over the flag transport instead (`flag_calls.rs`): each rank runs only its own part of
//! the plan, its messages through rings of slots ordered by counters, each call's descriptor
//! posted in the group's book of calls, so no rank meets the others or runs their parts.
//!
//! On the CUDA backend the calls take cudarc buffers on the caller's stream instead
//! (`RankComm::on`): the run lends their device pointers and enqueues the group ordered
//! within every rank's stream (the sealed `Trusted::submit_on_streams`, the CUDA backend's
//! `submit_on`), without host synchronization.
//!
//! Layout: `mod.rs` (the handle, creation, arrival tickets and [`RankGroup::launch_all`],
//! one thread driving several ranks), `collectives.rs` (the [`Collectives`] trait, the one set
//! of per-rank calls, and its runner for ranks on threads and, with feature `cuda`,
//! `OnStream`), `rank_group.rs` ([`RankGroup`], what each collective describes and lends),
//! `buffers.rs` (the buffer traits [`SendBuf`] and [`RecvBuf`]), `op.rs` (descriptors, lent
//! memory, outcomes), `direct.rs` (calls without a rendezvous on one host memory, on the
//! `board.rs` of posts, with each rank's part cut in `direct_part.rs` and its steps in
//! `direct_drive.rs`, where one thread advances several ranks' calls together),
//! `meeting.rs` (the rendezvous), `pair_group.rs` (groups of sends and receives at their
//! pairs' meetings), `group_run.rs` (the run), `flag_calls.rs` (calls over the flag
//! transport), `split.rs`
//! (`split`), `cuda_ranks.rs` (feature `cuda`: `RankComm::cuda` and the constructors of ranks
//! on GPUs).

pub(crate) mod board;
mod buffers;
pub(crate) mod collectives;
#[cfg(feature = "cuda")]
mod cuda_ranks;
mod direct;
mod direct_drive;
mod direct_part;
mod flag_calls;
#[cfg(feature = "cuda")]
mod flag_streams;
mod group_run;
mod meeting;
mod op;
mod pair_group;
mod rank_group;
mod split;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::communicator::Communicator;
use crate::error::{CollectivesError, Result};
use board::Board;
use direct::DirectCall;
use direct_part::KeptParts;

pub(crate) use buffers::{HeldView, Lender};
pub use buffers::{RecvBuf, SendBuf};
pub use collectives::Collectives;
#[cfg(feature = "cuda")]
pub use collectives::OnStream;
#[cfg(all(test, feature = "cuda"))]
pub(crate) use flag_calls::lower_part;
use meeting::Meeting;
#[cfg(feature = "mpi")]
pub(crate) use op::View;
use op::{Failure, Payload, RankArrival};
pub(crate) use op::{P2pOp, RankCallOp};
pub use rank_group::{RankCalls, RankGroup};

/// How long a rank waits for the others to join a call before it fails with
/// [`CollectivesError::RankTimeout`], unless [`Collectives::set_timeout`] says otherwise.
pub const DEFAULT_RANK_TIMEOUT: Duration = Duration::from_secs(60);

/// What the ranks of one communicator share: the all-ranks communicator that runs their
/// calls, and where the calls meet.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Collectives over the flag transport (`flag_calls.rs`), where the ranks were made so.
    /// Dropped first: its CUDA lanes wait for their streams before the communicator frees
    /// the scratch their steps use.
    flags: Option<flag_calls::FlagRanks>,
    comm: Communicator,
    /// Per rank: its handle was dropped.
    gone: Arc<[AtomicBool]>,
    meeting: Meeting,
    /// Point-to-point meetings, per (lower rank, higher rank).
    pairs: Mutex<HashMap<(usize, usize), Arc<Meeting>>>,
    /// The ranks share one host memory: collectives run without a rendezvous (`direct.rs`),
    /// on `board`, each rank's parts kept in `kept[rank]`.
    direct: bool,
    board: Arc<Board>,
    kept: Vec<Mutex<KeptParts>>,
}

impl Shared {
    pub(crate) fn new(comm: Communicator) -> Self {
        let n = comm.ranks();
        let gone: Arc<[AtomicBool]> = (0..n).map(|_| AtomicBool::new(false)).collect();
        let board = Arc::new(Board::new(n));
        Shared {
            meeting: Meeting::new((0..n).collect(), gone.clone(), board.clone()),
            gone,
            direct: direct::eligible(&comm),
            comm,
            pairs: Mutex::new(HashMap::new()),
            board,
            kept: (0..n).map(|_| Mutex::default()).collect(),
            flags: None,
        }
    }

    fn pair(&self, a: usize, b: usize) -> Arc<Meeting> {
        let key = (a.min(b), a.max(b));
        self.pairs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Meeting::new(
                    vec![key.0, key.1],
                    self.gone.clone(),
                    self.board.clone(),
                ))
            })
            .clone()
    }

    /// Drop the pair meetings that no call holds and whose rounds are all taken (a pair
    /// meeting keeps no state between rounds: sequence numbers live in the handles), so the
    /// map holds only pairs with a call under way or an outcome waiting to be taken.
    fn prune_pairs(&self) {
        self.pairs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            // `pair` clones under this lock, so a count of one means no call holds it.
            .retain(|_, m| Arc::strong_count(m) > 1 || !m.is_idle());
    }

    /// Pair meetings kept.
    #[cfg(test)]
    pub(crate) fn pair_meetings(&self) -> usize {
        self.pairs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn leave(&self, rank: usize) {
        if let Some(g) = self.gone.get(rank) {
            g.store(true, Ordering::Release);
        }
        if let Some(flags) = &self.flags {
            flags.leave(rank);
        }
        self.board.poke();
        self.poke_meetings();
    }

    /// Wake the meetings' waiters, so they notice a rank that left or an abort.
    fn poke_meetings(&self) {
        self.meeting.poke();
        let pairs: Vec<Arc<Meeting>> = self
            .pairs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for p in pairs {
            p.poke();
        }
        self.prune_pairs();
    }
}

/// One rank of a communicator, for one thread (NCCL's `ncclComm_t` as `ncclCommInitAll` makes
/// it, one per device).
///
/// Made for every local rank at once by [`RankComm::host`] (threads on host memory),
/// `RankComm::cuda` (feature `cuda`: one rank per GPU, on the machine's topology) or
/// [`Communicator::into_ranks`] (any communicator), or from another handle by
/// [`RankComm::split`]. Each handle is `Send`: move it to the
/// thread that drives its rank. Every rank calls the same collectives in the same order, each
/// on its own slices; the call returns when the operation is done on every rank.
///
/// Errors are the same on every rank: a call whose ranks disagree (collective, element type,
/// count, op, root, order) is [`CollectivesError::RankMismatch`]; a buffer of the wrong length
/// on any rank, a plan or backend failure is [`CollectivesError::RankFailed`] with the error as
/// its source; a rank missing for longer than the timeout (or whose handle was dropped) is
/// [`CollectivesError::RankTimeout`], naming the missing ranks and the call's number. Calls
/// that meet run nothing after a mismatch or a timeout; after a `RankFailed` from the
/// backend during the run, output slices may be partly written (shared input slices never
/// are). Collectives on ranks of one host memory run without meeting, a
/// group of them one call after another (module docs):
/// a rank's part may have written its outputs before another rank's mismatch is found, a
/// rank whose part needed nothing from the failing rank may return `Ok` with a valid result,
/// and the failure aborts the communicator, so every later call of every rank returns
/// [`CollectivesError::Aborted`] naming it.
///
/// Calls are in place when they take one `&mut [T]` (the `_in_place` calls). In place or not
/// is a per-call choice every rank makes alike.
///
/// ```
/// use relaycc_collectives::{Collectives, RankComm, ReduceOp};
///
/// let ranks = RankComm::host(4)?;
/// let handles: Vec<_> = ranks
///     .into_iter()
///     .map(|mut rank| {
///         std::thread::spawn(move || {
///             let mut grads = vec![rank.rank() as f32; 1000];
///             rank.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
///             Ok::<_, relaycc_collectives::CollectivesError>(grads[0])
///         })
///     })
///     .collect();
/// for h in handles {
///     assert_eq!(h.join().expect("rank thread")?, 1.5);
/// }
/// # Ok::<(), relaycc_collectives::CollectivesError>(())
/// ```
#[derive(Debug)]
pub struct RankComm {
    shared: Arc<Shared>,
    rank: usize,
    /// Sequence number of this rank's next collective call.
    seq: u64,
    /// Sequence number of this rank's next point-to-point call, per peer.
    pair_seq: HashMap<usize, u64>,
    timeout: Duration,
    /// The tag of this rank's next collective call ([`RankComm::tag_next`]), 0 for none.
    next_tag: u64,
}

impl Communicator {
    /// One handle per rank of this communicator, in rank order (`ncclCommInitAll`), for
    /// per-rank calls from one thread per rank. On the host backend ([`crate::HostBackend`])
    /// the calls take host slices; on the CUDA backend, cudarc buffers on the caller's
    /// stream (`RankComm::on`, feature `cuda`). Other backends refuse every call.
    pub fn into_ranks(self) -> Vec<RankComm> {
        RankComm::handles(Arc::new(Shared::new(self)))
    }
}

impl RankComm {
    /// A handle for each rank of `shared`.
    fn handles(shared: Arc<Shared>) -> Vec<RankComm> {
        (0..shared.comm.ranks())
            .map(|rank| RankComm {
                shared: shared.clone(),
                rank,
                seq: 0,
                pair_seq: HashMap::new(),
                timeout: DEFAULT_RANK_TIMEOUT,
                next_tag: 0,
            })
            .collect()
    }

    /// `n` ranks on `n` logical devices of this host's memory ([`Communicator::host`]), one
    /// handle each.
    pub fn host(n: u32) -> Result<Vec<RankComm>> {
        Ok(Communicator::host(n)?.into_ranks())
    }

    /// This handle's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks of the communicator.
    pub fn ranks(&self) -> usize {
        self.shared.comm.ranks()
    }
    /// The communicator the ranks' calls run on (its topology, devices, plans).
    pub fn communicator(&self) -> &Communicator {
        &self.shared.comm
    }
    /// Run this rank's part of a call that is not a group (`split`) on the communicator's
    /// meeting.
    fn meet(&mut self, call: &'static str, ops: Vec<RankCallOp>) -> Result<Payload> {
        let arrival = RankArrival {
            rank: self.rank,
            blocks: Vec::new(),
            ops: Ok(ops),
            #[cfg(feature = "cuda")]
            stream: None,
        };
        Self::result(call, self.arrive(arrival).wait())
    }

    /// This rank's arrival with `ops` over the memory `lender` lends (or the error the
    /// call's arguments gave instead of ops), and the guards that keep the caller's buffers
    /// until the arrival is enqueued: what a group's departure and a send or receive both
    /// leave at their meeting.
    fn arrival_of<'b>(
        &self,
        lender: Lender<'b>,
        ops: Vec<RankCallOp>,
    ) -> (RankArrival, LentGuards<'b>) {
        let Lender {
            blocks,
            error,
            #[cfg(feature = "cuda")]
            stream,
            #[cfg(feature = "cuda")]
            guards,
            ..
        } = lender;
        let arrival = RankArrival {
            rank: self.rank,
            blocks,
            ops: match error {
                Some(e) => Err(e),
                None => Ok(ops),
            },
            #[cfg(feature = "cuda")]
            stream: stream.cloned(),
        };
        #[cfg(feature = "cuda")]
        let kept = guards;
        #[cfg(not(feature = "cuda"))]
        let kept = std::marker::PhantomData;
        (arrival, kept)
    }

    /// Leave a group's operations (or the error its arguments gave) with the other ranks'
    /// ([`Runner::depart`]): an empty group is done at once; sends and receives alone go to
    /// their peers' pair meetings, or run at once with this rank itself (`pair_group.rs`); collectives
    /// on ranks that share one host memory run directly (`direct.rs`), one after the other;
    /// anything else meets at the communicator's meeting.
    fn depart_rank<'b>(
        &mut self,
        mut lender: Lender<'b>,
        mut ops: Vec<RankCallOp>,
    ) -> Departure<'b> {
        if ops.is_empty() && lender.error.is_none() {
            // An empty group names no rank, as NCCL's: nothing to meet for. (A group whose
            // one call failed its own checks has no ops either, and meets to fail the call
            // on every rank.)
            return Departure::of(Left::Ran(Ok(())), lender);
        }
        if !ops.is_empty() && ops.iter().all(|o| matches!(o, RankCallOp::P2p(_))) {
            return self.depart_pairs(lender, ops);
        }
        if let Some(left) = self.depart_flags(&mut lender, &mut ops) {
            return Departure::of(left, lender);
        }
        if self.shared.direct {
            let collectives = ops.iter().all(|o| matches!(o, RankCallOp::Coll { .. }));
            if collectives && let Some(e) = lender.error.take() {
                // The others may be waiting for this rank's post: fail the call for all.
                let e = Arc::new(e);
                self.shared.board.fail(self.seq, "group", e.clone());
                self.shared.poke_meetings();
                // The numbers the group's calls would have taken, as on the other ranks.
                self.seq += ops.len().max(1) as u64;
                return Departure::of(Left::Failed(e), lender);
            }
            if let Some(calls) = self.direct_calls(&lender, &ops) {
                return Departure::of(Left::Direct(calls), lender);
            }
        }
        if let Some(e) = self.shared.board.aborted("group", self.seq) {
            self.seq += 1;
            return Departure::of(Left::Ran(Err(e)), lender);
        }
        self.depart_meeting(lender, ops)
    }

    /// The direct calls of `ops`, one per operation and call number, when every one is a
    /// collective on host slices.
    fn direct_calls(&mut self, lender: &Lender<'_>, ops: &[RankCallOp]) -> Option<Vec<DirectCall>> {
        if ops.is_empty() {
            return None;
        }
        let mut calls = Vec::with_capacity(ops.len());
        for (k, op) in ops.iter().enumerate() {
            let RankCallOp::Coll {
                desc,
                input,
                output,
                in_place,
            } = op
            else {
                return None;
            };
            let esize = desc.dtype.size();
            let span = |v: &Option<op::View>| -> Option<Option<(usize, u64)>> {
                let Some(v) = v else { return Some(None) };
                lender.blocks.get(v.block).filter(|b| b.device.is_none())?;
                v.address_in(&lender.blocks, esize).map(Some)
            };
            let (input, output) = (span(input)?, span(output)?);
            calls.push(DirectCall {
                shared: self.shared.clone(),
                me: self.rank,
                seq: self.seq + k as u64,
                timeout: self.timeout,
                desc: desc.clone(),
                in_place: *in_place,
                input,
                output,
            });
        }
        self.seq += calls.len() as u64;
        Some(calls)
    }

    /// Leave a group's operations (or the error its arguments gave) at the communicator's
    /// meeting.
    fn depart_meeting<'b>(&mut self, lender: Lender<'b>, ops: Vec<RankCallOp>) -> Departure<'b> {
        let (arrival, guards) = self.arrival_of(lender, ops);
        Departure {
            outcome: Left::Meeting(self.arrive(arrival)),
            _guards: guards,
        }
    }

    /// Leave this rank's part of its next collective call at the communicator's meeting
    /// without waiting for the others ([`Meeting::arrive`]); the ticket waits. The memory
    /// `blocks` name stays lent until the ticket's outcome is taken.
    fn arrive(&mut self, arrival: RankArrival) -> Ticket {
        let seq = self.seq;
        self.seq += 1;
        let start = Instant::now();
        let shared = self.shared.clone();
        let done = self
            .shared
            .meeting
            .arrive(self.rank, seq, arrival, |a| group_run::run(&shared, a));
        Ticket {
            shared,
            rank: self.rank,
            seq,
            start,
            timeout: self.timeout,
            done,
        }
    }

    /// Run this rank's send or receive `op` (a `RankCallOp::P2p`) on its pair's meeting with the
    /// peer.
    fn meet_point_to_point(
        &mut self,
        call: &'static str,
        lender: Lender<'_>,
        op: RankCallOp,
    ) -> Result<()> {
        let RankCallOp::P2p(P2pOp { peer, .. }) = op else {
            return Err(
                Failure::Internal("a point-to-point call of another kind".into()).to_error(call),
            );
        };
        if peer >= self.ranks() || peer == self.rank {
            return Err(CollectivesError::BadRank {
                call,
                rank: peer,
                ranks: self.ranks(),
            });
        }
        let (arrival, guards) = self.arrival_of(lender, vec![op]);
        let seq = self.pair_seq.entry(peer).or_insert(0);
        let s = *seq;
        *seq += 1;
        let meeting = self.shared.pair(self.rank, peer);
        let me = usize::from(self.rank > peer);
        let shared = self.shared.clone();
        let outcome = meeting.meet(me, s, arrival, self.timeout, |a| group_run::run(&shared, a));
        drop(meeting);
        self.shared.prune_pairs();
        // The buffers' cudarc events are recorded on the caller's stream now, after the
        // operation was enqueued there.
        #[cfg(feature = "cuda")]
        drop(guards);
        #[cfg(not(feature = "cuda"))]
        let _ = guards;
        Self::result(call, outcome).map(|_| ())
    }

    fn result(call: &'static str, outcome: Arc<op::Outcome>) -> Result<Payload> {
        match &*outcome {
            Ok(Payload::Done) => Ok(Payload::Done),
            Ok(Payload::Split(v)) => Ok(Payload::Split(v.clone())),
            Err(f) => Err(f.to_error(call)),
        }
    }

    /// Split the communicator (`ncclCommSplit`, `MPI_Comm_split`): a call every rank makes;
    /// the ranks that give the same `color` form a new communicator, ranked by `key` and then
    /// by their rank here. A rank that gives `None` opts out and gets `None`. The new
    /// handles inherit this handle's timeout, and their communicators this communicator's
    /// relays (idle relays included), staging budget and plan-cache limits. Each new
    /// communicator runs on a backend of its own (on CUDA a sibling of this one's:
    /// `CudaBackend::sibling`), so sub-communicators run concurrently with each other
    /// and with this one, ordered only by their callers (threads; streams on CUDA).
    pub fn split(&mut self, color: Option<u32>, key: i64) -> Result<Option<RankComm>> {
        let payload = self.meet("split", vec![RankCallOp::Split { color, key }])?;
        let Payload::Split(v) = payload else {
            return Err(Failure::Internal("split ran as another call".into()).to_error("split"));
        };
        Ok(v.get(self.rank)
            .cloned()
            .flatten()
            .map(|(shared, rank)| RankComm {
                shared,
                rank,
                seq: 0,
                pair_seq: HashMap::new(),
                timeout: self.timeout,
                next_tag: 0,
            }))
    }
}

/// A rank's arrival at a collective call whose outcome it has still to take
/// ([`RankComm::arrive`]).
struct Ticket {
    shared: Arc<Shared>,
    rank: usize,
    seq: u64,
    start: Instant,
    timeout: Duration,
    /// The outcome, where it was known on arrival.
    done: Option<Arc<op::Outcome>>,
}

impl Ticket {
    /// The call's outcome, once every rank came and it ran, or once the timeout passed.
    fn wait(mut self) -> Arc<op::Outcome> {
        self.take()
    }

    fn take(&mut self) -> Arc<op::Outcome> {
        match self.done.take() {
            Some(o) => o,
            None => {
                let o = self
                    .shared
                    .meeting
                    .wait(self.rank, self.seq, self.start, self.timeout);
                // Taken: a second `take` (from `drop`) returns at once.
                self.done = Some(o.clone());
                o
            }
        }
    }
}

impl Drop for Ticket {
    /// A ticket dropped untaken (a caller unwinding between arrivals) still waits for its
    /// outcome: until then the call may run on the memory it lent.
    fn drop(&mut self) {
        if self.done.is_none() {
            self.take();
        }
    }
}

/// A group left with its runner: the way to its outcome, then (dropped after it) the cudarc
/// guards of its device buffers.
pub struct Departure<'b> {
    outcome: Left,
    _guards: LentGuards<'b>,
}

/// What keeps a call's cudarc buffers lent until its work is enqueued (their events are
/// recorded on the caller's stream when dropped); nothing without CUDA.
#[cfg(feature = "cuda")]
type LentGuards<'b> = Vec<cudarc::driver::SyncOnDrop<'b>>;
/// What keeps a call's buffers lent: nothing to record without CUDA.
#[cfg(not(feature = "cuda"))]
type LentGuards<'b> = std::marker::PhantomData<&'b ()>;

/// Where a departed group's outcome is.
enum Left {
    /// At the in-process meeting.
    Meeting(Ticket),
    /// Known already: the runner ran the group before it returned (MPI ranks), or refused
    /// it (an aborted communicator).
    Ran(Result<()>),
    /// Collectives to run directly, one after the other, when waited for (`direct.rs`).
    Direct(Vec<DirectCall>),
    /// Collectives over host flag lanes, to run when waited for (`flag_calls.rs`).
    Flags(flag_calls::Deferred),
    /// A direct call whose arguments failed (which aborted the communicator).
    Failed(Arc<CollectivesError>),
    /// A group of sends and receives at its peers' pair meetings (`pair_group.rs`), and
    /// this rank's own error, returned once the pairs are done.
    Pairs(Vec<pair_group::PairTicket>, Option<CollectivesError>),
}

impl<'b> Departure<'b> {
    /// A group its runner has already run, with the guards of its buffers (dropped after
    /// the outcome is read, so the buffers' events follow what the run enqueued).
    #[cfg(feature = "mpi")]
    pub(crate) fn ran(outcome: Result<()>, lender: Lender<'b>) -> Self {
        Self::of(Left::Ran(outcome), lender)
    }

    /// The direct call this departure holds, taken out to run elsewhere (the departure
    /// then waits for nothing).
    fn take_direct(&mut self) -> Option<Vec<DirectCall>> {
        match std::mem::replace(&mut self.outcome, Left::Ran(Ok(()))) {
            Left::Direct(c) => Some(c),
            other => {
                self.outcome = other;
                None
            }
        }
    }

    /// A departure to `outcome`, keeping `lender`'s guards.
    fn of(outcome: Left, lender: Lender<'b>) -> Self {
        Departure {
            outcome,
            #[cfg(feature = "cuda")]
            _guards: lender.guards,
            #[cfg(not(feature = "cuda"))]
            _guards: lender._b,
        }
    }

    /// The group's outcome as call `call`, once it is done on this rank (its buffers' cudarc
    /// events are recorded on the caller's stream after it, when the guards drop here).
    pub(crate) fn wait(self, call: &'static str) -> Result<()> {
        let Departure { outcome, _guards } = self;
        match outcome {
            Left::Meeting(t) => RankComm::result(call, t.wait()).map(|_| ()),
            Left::Ran(r) => r,
            Left::Direct(d) => direct_drive::drive(vec![d]).pop().unwrap_or(Ok(())),
            Left::Flags(f) => f.run(),
            Left::Failed(source) => Err(CollectivesError::RankFailed { call, source }),
            Left::Pairs(tickets, own) => pair_group::wait_pairs(call, tickets, own),
        }
    }
}

impl<'r, 'b> RankGroup<'r, 'b> {
    /// Launch the groups of several ranks from this one thread, as one thread drives several
    /// GPUs between `ncclGroupStart` and `ncclGroupEnd`: each group meets the other ranks'
    /// groups exactly as its own [`RankGroup::launch`] would (the same checks, the same
    /// errors on every rank), but the thread leaves every group at its meeting before it
    /// waits for any, so a few threads can drive any number of ranks. The last rank to
    /// arrive runs the operation, on whichever thread that is. Groups of collectives of
    /// ranks in one host memory run directly (module docs): every group's first call
    /// posts first, and they advance together on this thread, each part running once the posts
    /// it needs are there and each group's next call posting once the one before it is over.
    /// Groups over host flag lanes (`Communicator::into_flag_ranks`) run on a thread each.
    /// Returns when every group is
    /// done: `Ok` when all succeeded, else the first failed group's error (in the order
    /// given). The groups' slices stay borrowed until then; a timeout counts from each
    /// group's arrival.
    ///
    /// ```
    /// use relaycc_collectives::{Collectives, RankComm, RankGroup, ReduceOp};
    ///
    /// // Eight ranks driven by two threads, four each.
    /// let mut ranks = RankComm::host(8)?;
    /// let right = ranks.split_off(4);
    /// let drive = |mut mine: Vec<RankComm>| {
    ///     std::thread::spawn(move || {
    ///         let mut bufs: Vec<Vec<f32>> =
    ///             mine.iter().map(|r| vec![r.rank() as f32; 16]).collect();
    ///         let groups = mine.iter_mut().zip(bufs.iter_mut()).map(|(r, b)| {
    ///             let mut g = r.group();
    ///             g.all_reduce_in_place(b, ReduceOp::Sum);
    ///             g
    ///         });
    ///         RankGroup::launch_all(groups).map(|()| bufs[0][0])
    ///     })
    /// };
    /// let (a, b) = (drive(ranks), drive(right));
    /// assert_eq!(a.join().expect("thread")?, 28.0);
    /// assert_eq!(b.join().expect("thread")?, 28.0);
    /// # Ok::<(), relaycc_collectives::CollectivesError>(())
    /// ```
    pub fn launch_all(groups: impl IntoIterator<Item = RankGroup<'r, 'b>>) -> Result<()> {
        // Every departure waits for its outcome when dropped, also while unwinding, so no
        // slice is given back while a run may use it.
        let mut departed: Vec<Departure<'b>> = groups.into_iter().map(RankGroup::depart).collect();
        // Direct calls advance together on this thread (`direct_drive.rs`).
        let (at, calls): (Vec<usize>, Vec<Vec<DirectCall>>) = departed
            .iter_mut()
            .enumerate()
            .filter_map(|(i, d)| d.take_direct().map(|c| (i, c)))
            .unzip();
        let mut results: Vec<Result<()>> = (0..departed.len()).map(|_| Ok(())).collect();
        for (i, r) in at.into_iter().zip(direct_drive::drive(calls)) {
            results[i] = r;
        }
        // Host flag lanes run a rank's steps on its thread: each rank's group on its own.
        let (at, flags): (Vec<usize>, Vec<flag_calls::Deferred>) = departed
            .iter_mut()
            .enumerate()
            .filter_map(|(i, d)| d.take_flags().map(|f| (i, f)))
            .unzip();
        for (i, r) in at.into_iter().zip(flag_calls::run_apart(flags)) {
            results[i] = r;
        }
        let mut first = Ok(());
        for (d, r) in departed.into_iter().zip(results) {
            let r = r.and_then(|()| d.wait("group"));
            if let Err(e) = r
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

impl Drop for RankComm {
    fn drop(&mut self) {
        // The others stop waiting for this rank at once instead of at their timeout.
        self.shared.leave(self.rank);
    }
}

// Handles move to their ranks' threads: this fails to compile if `RankComm` stops being `Send`.
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<RankComm>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_meetings_leave_once_their_calls_are_taken() {
        let mut ranks = RankComm::host(3).expect("host ranks");
        let gone = ranks.pop().expect("rank 2");
        let (mut a, mut b) = {
            let b = ranks.pop().expect("rank 1");
            (ranks.pop().expect("rank 0"), b)
        };
        let shared = a.shared.clone();
        let x = [1.0f32, 2.0];
        let sender = std::thread::spawn(move || {
            a.send(&x[..], 1).expect("send");
            a
        });
        let mut y = [0.0f32; 2];
        b.recv(&mut y[..], 0).expect("recv");
        let mut a = sender.join().expect("sender");
        assert_eq!(y, x);
        assert_eq!(shared.pair_meetings(), 0);
        // A send to a dropped rank times out at once and leaves nothing behind.
        drop(gone);
        for _ in 0..5 {
            assert!(matches!(
                a.send(&x[..], 2),
                Err(CollectivesError::RankTimeout { .. })
            ));
        }
        assert_eq!(shared.pair_meetings(), 0);
    }
}
