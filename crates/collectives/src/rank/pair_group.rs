//! Groups of sends and receives only (`ncclGroupStart`, sends and receives, `ncclGroupEnd`):
//! they involve only the peers they name. A rank's group arrives at each of its peers' pair
//! meetings (the meetings of standalone `send` and `recv`) with the operations it has with
//! that peer, and waits for all of them afterwards, so a ring of sends and receives cannot
//! deadlock (every rank arrives everywhere before it waits anywhere), one thread can leave
//! several ranks' groups before it waits ([`RankGroup::launch_all`](super::RankGroup)), and
//! ranks the group does not name neither call nor wait.
//!
//! Each pair matches the group's operations with that peer against the peer's, in one round
//! of the pair's sequence (shared with standalone `send` and `recv`): a group and a single
//! call each take one round with each peer they name. The group's sends to this rank itself
//! and its receives from itself pair up among themselves and run at once, on this rank
//! alone, as NCCL runs them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::buffers::Lender;
use super::meeting::Meeting;
use super::op::{Outcome, P2pOp, RankArrival, RankCallOp, Span, View};
use super::{Departure, Left, RankComm, Shared};
use crate::error::{CollectivesError, Result};

/// This rank's arrival at one pair meeting of a group, whose outcome it has still to take.
pub(super) struct PairTicket {
    shared: Arc<Shared>,
    meeting: Arc<Meeting>,
    /// This rank's place in the pair (0: the lower rank).
    me: usize,
    seq: u64,
    start: Instant,
    timeout: Duration,
    /// The outcome, where it was known on arrival.
    done: Option<Arc<Outcome>>,
}

impl PairTicket {
    /// The pair's outcome, once both came and it ran, or once the timeout passed.
    pub(super) fn wait(mut self) -> Arc<Outcome> {
        self.take()
    }

    fn take(&mut self) -> Arc<Outcome> {
        let o = match self.done.take() {
            Some(o) => o,
            None => self
                .meeting
                .wait(self.me, self.seq, self.start, self.timeout),
        };
        // Taken: a second `take` (from `drop`) returns at once.
        self.done = Some(o.clone());
        o
    }
}

impl Drop for PairTicket {
    /// A ticket dropped untaken (a caller unwinding) still waits for its outcome: until then
    /// the pair may run on the memory it lent.
    fn drop(&mut self) {
        if self.done.is_none() {
            self.take();
        }
    }
}

/// A group's operations with one peer: the peer, the operations, the spans their views name.
type PairPart = (usize, Vec<RankCallOp>, Vec<Span>);

/// `ops` (sends and receives only) split by peer (this rank itself included), in the order
/// peers first appear, each with the spans its views name (renumbered from 0), and the first
/// peer that is not a rank of `ranks` (its operations are left out).
fn by_peer(ops: Vec<RankCallOp>, blocks: &[Span], ranks: usize) -> (Vec<PairPart>, Option<usize>) {
    let mut parts: Vec<PairPart> = Vec::new();
    let mut bad = None;
    // Per pair, where each of this rank's blocks went (block index -> the pair's index).
    let mut renumbered: Vec<Vec<Option<usize>>> = Vec::new();
    for op in ops {
        let RankCallOp::P2p(p2p @ P2pOp { peer, view, .. }) = op else {
            continue;
        };
        if peer >= ranks {
            bad.get_or_insert(peer);
            continue;
        }
        let at = match parts.iter().position(|p| p.0 == peer) {
            Some(at) => at,
            None => {
                parts.push((peer, Vec::new(), Vec::new()));
                renumbered.push(vec![None; blocks.len()]);
                parts.len() - 1
            }
        };
        let (_, pair_ops, spans) = &mut parts[at];
        let block = match renumbered[at].get(view.block).copied().flatten() {
            Some(b) => b,
            None => {
                // A view of a block the lender does not hold fails when the pair runs, as
                // it would at the communicator's meeting.
                let Some(span) = blocks.get(view.block) else {
                    pair_ops.push(op);
                    continue;
                };
                spans.push(*span);
                renumbered[at][view.block] = Some(spans.len() - 1);
                spans.len() - 1
            }
        };
        pair_ops.push(RankCallOp::P2p(P2pOp {
            view: View { block, ..view },
            ..p2p
        }));
    }
    (parts, bad)
}

impl RankComm {
    /// Leave a group of sends and receives (`ops`, none of another kind) at each of its
    /// peers' pair meetings, without waiting, after running its operations with this rank
    /// itself (module docs), whose error, if any, the group returns. A group whose own checks failed,
    /// or that names a peer that is not another rank, still arrives at every pair it can
    /// name, with an error, so those peers fail at once instead of at their timeout; this
    /// rank returns its own error ([`CollectivesError::RankFailed`] with it, as the pair's run
    /// would, or [`CollectivesError::BadRank`]).
    pub(super) fn depart_pairs<'b>(
        &mut self,
        mut lender: Lender<'b>,
        ops: Vec<RankCallOp>,
    ) -> Departure<'b> {
        let n = self.ranks();
        let (parts, bad) = by_peer(ops, &lender.blocks, n);
        let own = match (lender.error.take(), bad) {
            (Some(e), _) => Some(CollectivesError::RankFailed {
                call: "group",
                source: Arc::new(e),
            }),
            (None, Some(peer)) => Some(CollectivesError::BadRank {
                call: "group",
                rank: peer,
                ranks: n,
            }),
            (None, None) => None,
        };
        let mut tickets = Vec::with_capacity(parts.len());
        // Its error fails this rank's group, not its pairs with other ranks.
        let mut with_itself = None;
        for (peer, pair_ops, spans) in parts {
            if peer == self.rank {
                if own.is_none() {
                    with_itself = self.run_with_itself(pair_ops, spans, &lender).err();
                }
                continue;
            }
            let ops = match &own {
                Some(e) => Err(CollectivesError::Unmatched(format!(
                    "rank {}'s group with rank {peer} failed its own checks: {e}",
                    self.rank
                ))),
                None => Ok(pair_ops),
            };
            let arrival = RankArrival {
                rank: self.rank,
                blocks: spans,
                ops,
                #[cfg(feature = "cuda")]
                stream: lender.stream.cloned(),
            };
            let seq = self.pair_seq.entry(peer).or_insert(0);
            let s = *seq;
            *seq += 1;
            let meeting = self.shared.pair(self.rank, peer);
            let me = usize::from(self.rank > peer);
            let shared = self.shared.clone();
            let start = Instant::now();
            let done = meeting.arrive(me, s, arrival, |a| super::group_run::run(&shared, a));
            tickets.push(PairTicket {
                shared: self.shared.clone(),
                meeting,
                me,
                seq: s,
                start,
                timeout: self.timeout,
                done,
            });
        }
        Departure::of(Left::Pairs(tickets, own.or(with_itself)), lender)
    }

    /// Run a group's sends to this rank itself and receives from itself (`ops`, on `spans`)
    /// now, on this rank alone: they pair up in group order as any pair's do.
    fn run_with_itself(
        &self,
        ops: Vec<RankCallOp>,
        spans: Vec<Span>,
        lender: &Lender<'_>,
    ) -> Result<()> {
        let arrival = RankArrival {
            rank: self.rank,
            blocks: spans,
            ops: Ok(ops),
            #[cfg(feature = "cuda")]
            stream: lender.stream.cloned(),
        };
        #[cfg(not(feature = "cuda"))]
        let _ = lender;
        let outcome = super::group_run::run(&self.shared, vec![arrival]);
        RankComm::result("group", Arc::new(outcome)).map(|_| ())
    }
}

/// The outcome of a group left at pair meetings, as call `call`, once every pair is done:
/// this rank's own error (`own`) if it had one, else the first pair's error in the order the
/// group named its peers. The pair meetings no call holds any more then go, as after a
/// standalone send or receive.
pub(super) fn wait_pairs(
    call: &'static str,
    tickets: Vec<PairTicket>,
    own: Option<CollectivesError>,
) -> Result<()> {
    let shared = tickets.first().map(|t| t.shared.clone());
    let mut first = own.map_or(Ok(()), Err);
    for t in tickets {
        let r = RankComm::result(call, t.wait()).map(|_| ());
        if first.is_ok() {
            first = r;
        }
    }
    if let Some(shared) = shared {
        shared.prune_pairs();
    }
    first
}
