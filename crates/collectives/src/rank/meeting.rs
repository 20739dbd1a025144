//! The meeting point of per-rank calls: each call of a communicator has a sequence number,
//! the ranks' arrivals for one number meet here, the last to arrive runs the operation for
//! all, and the others wait for its outcome or, while someone is missing, for their timeout.
//!
//! A rank never leaves while the operation that may touch its memory runs: once every rank
//! has arrived the round is `Running` and waits have no deadline (the run itself is bounded:
//! the backend finishes every launch it accepts). Before that, a rank whose deadline passes
//! closes the round with a timeout, so a late rank finds it closed and nobody runs it.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::board::{Board, SPIN_FOR, lock};
use super::op::{Failure, Outcome, RankArrival};

enum Phase {
    Gathering,
    Running,
    Done(Arc<Outcome>),
}

struct Round {
    arrivals: Vec<Option<RankArrival>>,
    arrived: usize,
    phase: Phase,
    /// Per participant: it has taken the outcome. A finished round is dropped once every
    /// participant has taken it or is gone (a gone rank never comes for it), so rounds closed
    /// by a dropped rank do not pile up.
    collected: Vec<bool>,
}

/// Where the calls of `members.len()` ranks meet (a communicator, or one pair of its ranks
/// for point-to-point calls).
pub(crate) struct Meeting {
    /// The communicator rank of each participant.
    members: Vec<usize>,
    /// Per communicator rank: its handle was dropped (it never arrives again).
    gone: Arc<[AtomicBool]>,
    rounds: Mutex<HashMap<u64, Round>>,
    cv: Condvar,
    /// The communicator's board of direct calls: once it is aborted, a round still
    /// gathering closes with its failure (a rank that ran a call directly never comes here).
    board: Arc<Board>,
}

impl std::fmt::Debug for Meeting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meeting")
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl Meeting {
    pub fn new(members: Vec<usize>, gone: Arc<[AtomicBool]>, board: Arc<Board>) -> Self {
        Meeting {
            members,
            gone,
            rounds: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            board,
        }
    }

    /// Wake waiters so they notice a rank that left, and drop the finished rounds only that
    /// rank still had to take.
    pub fn poke(&self) {
        let mut rounds = lock(&self.rounds);
        rounds.retain(|_, r| !self.finished(r));
        self.cv.notify_all();
    }

    /// No round is open or waits to be taken: nothing refers to this meeting's state.
    pub fn is_idle(&self) -> bool {
        lock(&self.rounds).is_empty()
    }

    /// Rounds kept (open, running, or finished and not yet taken by every live participant).
    #[cfg(test)]
    pub fn rounds(&self) -> usize {
        lock(&self.rounds).len()
    }

    /// `r` is done and every participant has taken it or is gone.
    fn finished(&self, r: &Round) -> bool {
        matches!(r.phase, Phase::Done(_))
            && r.collected
                .iter()
                .zip(&self.members)
                .all(|(&c, &m)| c || self.gone.get(m).is_some_and(|g| g.load(Ordering::Acquire)))
    }

    fn collect(&self, rounds: &mut HashMap<u64, Round>, seq: u64, me: usize) {
        if let Some(r) = rounds.get_mut(&seq) {
            if let Some(c) = r.collected.get_mut(me) {
                *c = true;
            }
            if self.finished(r) {
                rounds.remove(&seq);
            }
        }
    }

    /// Arrive at round `seq` as participant `me` with `arrival`; the last to arrive runs
    /// `lead` on every participant's arrival (in participant order). Returns the round's
    /// outcome, or a timeout once `timeout` passed while someone was missing.
    pub fn meet(
        &self,
        me: usize,
        seq: u64,
        arrival: RankArrival,
        timeout: Duration,
        lead: impl FnOnce(Vec<RankArrival>) -> Outcome,
    ) -> Arc<Outcome> {
        let start = Instant::now();
        match self.arrive(me, seq, arrival, lead) {
            Some(o) => o,
            None => self.wait(me, seq, start, timeout),
        }
    }

    /// The first half of [`Meeting::meet`]: leave `arrival` at round `seq` without waiting.
    /// Returns the outcome when it is known at once (this participant was the last and ran
    /// `lead`, or the round was closed before it came); `None` when the others are still to
    /// come: then [`Meeting::wait`] for it. Until the outcome is taken, whatever `arrival`
    /// lends stays in use.
    pub fn arrive(
        &self,
        me: usize,
        seq: u64,
        arrival: RankArrival,
        lead: impl FnOnce(Vec<RankArrival>) -> Outcome,
    ) -> Option<Arc<Outcome>> {
        let n = self.members.len();
        let mut rounds = lock(&self.rounds);
        let round = rounds.entry(seq).or_insert_with(|| Round {
            arrivals: (0..n).map(|_| None).collect(),
            arrived: 0,
            phase: Phase::Gathering,
            collected: vec![false; n],
        });
        if let Phase::Done(o) = &round.phase {
            // Closed before this rank came (a timeout): it runs nothing.
            let o = o.clone();
            self.collect(&mut rounds, seq, me);
            return Some(o);
        }
        let Some(slot) = round.arrivals.get_mut(me).filter(|s| s.is_none()) else {
            return Some(Arc::new(Err(Failure::Internal(format!(
                "participant {me} arrived twice at call {seq}"
            )))));
        };
        *slot = Some(arrival);
        round.arrived += 1;
        if round.arrived == n {
            round.phase = Phase::Running;
            let arrivals: Vec<RankArrival> =
                round.arrivals.iter_mut().filter_map(Option::take).collect();
            drop(rounds);
            // A panic in the run must not leave the others waiting forever; whatever the run
            // lent is given back by its own guards while unwinding.
            let outcome = catch_unwind(AssertUnwindSafe(|| lead(arrivals))).unwrap_or_else(|_| {
                Err(Failure::Internal(format!("the run of call {seq} panicked")))
            });
            let outcome = Arc::new(outcome);
            let mut rounds = lock(&self.rounds);
            if let Some(r) = rounds.get_mut(&seq) {
                r.phase = Phase::Done(outcome.clone());
            }
            self.cv.notify_all();
            self.collect(&mut rounds, seq, me);
            return Some(outcome);
        }
        None
    }

    /// The members (communicator ranks) that have not arrived at a round of `arrivals`.
    fn missing<'a>(
        &'a self,
        arrivals: &'a [Option<RankArrival>],
    ) -> impl Iterator<Item = usize> + 'a {
        arrivals
            .iter()
            .zip(&self.members)
            .filter(|(a, _)| a.is_none())
            .map(|(_, &m)| m)
    }

    /// Let go of the rounds, yield the core, and take them again.
    fn look_again<'a>(
        &'a self,
        rounds: MutexGuard<'a, HashMap<u64, Round>>,
    ) -> MutexGuard<'a, HashMap<u64, Round>> {
        drop(rounds);
        std::thread::yield_now();
        lock(&self.rounds)
    }

    /// The second half of [`Meeting::meet`]: wait for the outcome of round `seq`, at which
    /// participant `me` arrived at `start`; once `timeout` has passed since then, while
    /// someone is still missing, close the round with a timeout (once everyone came, the run
    /// goes on to its end). Before it sleeps, it yields its core and looks again for
    /// [`SPIN_FOR`].
    pub fn wait(&self, me: usize, seq: u64, start: Instant, timeout: Duration) -> Arc<Outcome> {
        let deadline = start + timeout;
        let spin_until = Instant::now() + SPIN_FOR;
        let mut rounds = lock(&self.rounds);
        loop {
            let Some(round) = rounds.get_mut(&seq) else {
                return Arc::new(Err(Failure::Internal(format!(
                    "call {seq} vanished while participant {me} waited"
                ))));
            };
            match &round.phase {
                Phase::Done(o) => {
                    let o = o.clone();
                    self.collect(&mut rounds, seq, me);
                    return o;
                }
                Phase::Running if Instant::now() < spin_until => {
                    rounds = self.look_again(rounds);
                }
                Phase::Running => {
                    rounds = self.cv.wait(rounds).unwrap_or_else(|p| p.into_inner());
                }
                Phase::Gathering => {
                    // The missing members are listed only for the outcome: a waiter looks here
                    // many times.
                    let gone = self
                        .missing(&round.arrivals)
                        .any(|r| self.gone.get(r).is_some_and(|g| g.load(Ordering::Acquire)));
                    let now = Instant::now();
                    let aborted = self.board.failure(seq);
                    if aborted.is_some() || gone || now >= deadline {
                        let o = Arc::new(Err(aborted.unwrap_or(Failure::Timeout {
                            seq,
                            missing: self.missing(&round.arrivals).collect(),
                            waited_ms: now.duration_since(start).as_millis() as u64,
                            gone,
                        })));
                        round.phase = Phase::Done(o.clone());
                        // Nobody runs these arrivals: their memory goes back untouched.
                        round.arrivals.iter_mut().for_each(|a| *a = None);
                        self.cv.notify_all();
                        self.collect(&mut rounds, seq, me);
                        return o;
                    }
                    if now < spin_until {
                        rounds = self.look_again(rounds);
                        continue;
                    }
                    rounds = self
                        .cv
                        .wait_timeout(rounds, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(rank: usize) -> RankArrival {
        RankArrival {
            rank,
            blocks: Vec::new(),
            ops: Ok(Vec::new()),
            #[cfg(feature = "cuda")]
            stream: None,
        }
    }

    fn is_gone_timeout(o: &Outcome) -> bool {
        matches!(o, Err(Failure::Timeout { gone: true, .. }))
    }

    #[test]
    fn rounds_closed_by_a_dropped_rank_do_not_pile_up() {
        let gone: Arc<[AtomicBool]> = (0..3).map(|_| AtomicBool::new(false)).collect();
        let m = Arc::new(Meeting::new(
            vec![0, 1, 2],
            gone.clone(),
            Arc::new(Board::new(3)),
        ));
        gone[2].store(true, Ordering::Release);
        let never = |_: Vec<RankArrival>| -> Outcome { panic!("a round with a dropped rank ran") };
        for seq in 0..20 {
            let other = {
                let m = m.clone();
                std::thread::spawn(move || {
                    let o = m.meet(1, seq, arrival(1), Duration::from_secs(30), never);
                    is_gone_timeout(&o)
                })
            };
            let o = m.meet(0, seq, arrival(0), Duration::from_secs(30), never);
            assert!(is_gone_timeout(&o));
            assert!(other.join().expect("rank 1's thread"));
            assert_eq!(
                m.rounds(),
                0,
                "round {seq} kept after both live ranks took it"
            );
        }
    }

    #[test]
    fn a_timed_out_round_waits_for_live_ranks_and_leaves_when_they_are_gone() {
        let gone: Arc<[AtomicBool]> = (0..3).map(|_| AtomicBool::new(false)).collect();
        let m = Meeting::new(vec![0, 1, 2], gone.clone(), Arc::new(Board::new(3)));
        let never = |_: Vec<RankArrival>| -> Outcome { panic!("a timed-out round ran") };
        let o = m.meet(0, 0, arrival(0), Duration::from_millis(5), never);
        assert!(matches!(&*o, Err(Failure::Timeout { gone: false, .. })));
        // Ranks 1 and 2 may still come for the outcome.
        assert_eq!(m.rounds(), 1);
        let o = m.meet(1, 0, arrival(1), Duration::from_millis(5), never);
        assert!(matches!(&*o, Err(Failure::Timeout { gone: false, .. })));
        assert_eq!(m.rounds(), 1);
        gone[2].store(true, Ordering::Release);
        m.poke();
        assert_eq!(m.rounds(), 0);
        assert!(m.is_idle());
    }
}
