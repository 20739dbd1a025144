//! The clock of one planning call: when its builds and simulations stop ([`Deadline`]), and
//! when a simulation's progress shows it cannot end in time ([`Projection`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use relaycc_topo::Topology;

use relaycc_plan::Plan;
use relaycc_plan::Result;
use relaycc_planners::limits::{LEAST_BUILD_TIME, LEAST_SIMULATION_GRACE};
use relaycc_sim::{PreparedSim, SimCut};

/// What the baseline's builds are called in a limit's error ([`relaycc_planners::limits`]).
pub(super) const BASELINE: &str = "the NCCL-like baseline";
/// Share of the budget the baseline's build may take: past the deadline, since every call
/// reports it, and a quarter of the budget before 1.5 times it, for its capped simulation and
/// its proof. A baseline still building then is refused ([`relaycc_plan::RouteError::OverLimit`]).
const BASELINE_BUILD_SHARE: f64 = 1.25;
/// Share of the budget kept for what a call does after its builds and simulations stop (the
/// baseline's simulation where it was cut, the bound, the choice, the winner's proof and the
/// answer): its deadline comes this much before the budget ends, at most [`WRAP_UP_MAX`]
/// before. On 1,024 DGX H100 nodes (the step-sampled baseline, relaycc's candidate stopped at
/// the deadline) that work takes 60 ms and the process's exit 40 ms more: a call that spends
/// its budget so still returns within it.
const WRAP_UP_SHARE: f64 = 0.05;
/// Most of the budget kept for the wrap-up ([`WRAP_UP_SHARE`]).
const WRAP_UP_MAX: Duration = Duration::from_secs(1);
/// Share of the budget (less its wrap-up) after which no simulation goes on, whatever grace
/// it was given (or [`LEAST_SIMULATION_GRACE`] after the start, where that is later): the
/// baseline's and relaycc's graces past the deadline end there, so a call with its wrap-up
/// returns within 1.5 times its budget (on 64 rail-optimized DGX H100 nodes relaycc's
/// candidate, simulated in its grace, ended at 1.35 to 1.6 times the budget).
const LAST_SIMULATION_SHARE: f64 = 1.35;
/// What relaycc's candidates' builds are called in a limit's error.
pub(super) const CANDIDATES: &str = "a candidate of relaycc's";

/// Plans with fewer ops simulate in tens of milliseconds (a 100k-op ring in about 20 ms,
/// `benches/simulator.rs`): the candidate that must yield a plan of relaycc's is then simulated
/// to the end, whatever the budget.
pub(super) const GRACE_ABOVE_OPS: usize = 200_000;

/// When planning must stop, and whether it had to.
pub(super) struct Deadline {
    started: Instant,
    /// The ops the call's builds hold ([`relaycc_planners::limits::MAX_CALL_OPS`]).
    call_ops: Arc<relaycc_planners::limits::CallOps>,
    /// The ops relaycc's candidates hold among them ([`relaycc_planners::limits::CANDIDATE_OPS`]).
    candidate_ops: Arc<relaycc_planners::limits::CallOps>,
    /// When the baseline was built (as a template or in full).
    baseline_done: std::sync::OnceLock<Instant>,
    at: Option<Instant>,
    /// When every simulation stops ([`LAST_SIMULATION_SHARE`]).
    last: Option<Instant>,
    budget: Duration,
    hit: AtomicBool,
    /// Set when the baseline could not be built ([`Deadline::abandoned`]).
    abandoned: AtomicBool,
}

impl Deadline {
    pub(super) fn new(budget: Duration) -> Self {
        let started = Instant::now();
        let budget = budget.saturating_sub(budget.mul_f64(WRAP_UP_SHARE).min(WRAP_UP_MAX));
        Deadline {
            started,
            call_ops: relaycc_planners::limits::CallOps::new(
                relaycc_planners::limits::MAX_CALL_OPS,
            ),
            candidate_ops: relaycc_planners::limits::CallOps::new(
                relaycc_planners::limits::CANDIDATE_OPS,
            ),
            baseline_done: std::sync::OnceLock::new(),
            at: started.checked_add(budget),
            last: started.checked_add(
                budget
                    .mul_f64(LAST_SIMULATION_SHARE)
                    .max(LEAST_SIMULATION_GRACE),
            ),
            budget,
            hit: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
        }
    }
    /// Whether a simulation that must yield a plan of relaycc's (the most promising candidate,
    /// or a template built beside the baseline), started at `projection.start` and as far as
    /// `progress`, goes on: until the deadline, and beyond it for a budget's time (at least
    /// [`LEAST_SIMULATION_GRACE`]) of its own and a budget's time after the baseline was
    /// built ([`Deadline::grace_end`]), unless even an optimistic projection of its progress
    /// cannot end by then ([`Projection::hopeless`]): it does not hold a core for nothing. A
    /// baseline that takes longer than the budget so leaves relaycc's plan as long again, not
    /// nothing; the baseline itself gets no more than it needs for a figure
    /// ([`Deadline::baseline_goes_on`]).
    fn grace_goes_on(&self, projection: &Projection, progress: &SimCut) -> bool {
        !self.abandoned()
            && self
                .grace_end(projection.start)
                .is_none_or(|end| Instant::now() < end && !projection.hopeless(progress, end))
    }
    /// True once the call will fail whatever its candidates give (the baseline could not be
    /// built): what still runs beside it stops at its next look at the clock.
    pub(super) fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }
    /// When [`Deadline::grace_goes_on`] stops a simulation started at `own_start`: the latest
    /// of the deadline and a grace after the start and after the baseline was built, but no
    /// later than the last instant any simulation runs ([`LAST_SIMULATION_SHARE`]); `None`
    /// while that is not known (no deadline, the baseline not built yet, or an instant past
    /// what the clock can hold).
    fn grace_end(&self, own_start: Instant) -> Option<Instant> {
        let grace = self.budget.max(LEAST_SIMULATION_GRACE);
        let built = *self.baseline_done.get()?;
        let at = self.at?;
        Some(
            at.max(own_start.checked_add(grace)?)
                .max(built.checked_add(grace)?)
                .min(self.last?),
        )
    }
    /// Whether the baseline's simulation, started at `own_start`, goes on: until the
    /// deadline, and for [`LEAST_SIMULATION_GRACE`] of its own where it passed (never past
    /// [`LAST_SIMULATION_SHARE`] of the budget). Cut, it still
    /// gives a lower bound, which relaycc's plan must beat to be chosen.
    pub(super) fn baseline_goes_on(&self, own_start: Instant) -> bool {
        let now = Instant::now();
        self.at.is_none_or(|at| now < at)
            || (now.duration_since(own_start) < LEAST_SIMULATION_GRACE
                && self.last.is_none_or(|last| now < last))
    }
    /// Whether a simulation run beside the baseline's build goes on: until the deadline, and
    /// beyond it while the baseline is still being built.
    pub(super) fn beside_goes_on(&self) -> bool {
        !self.abandoned()
            && (self.at.is_none_or(|at| Instant::now() < at) || self.baseline_done.get().is_none())
    }
    /// Time left until the deadline ([`Duration::MAX`] without one).
    pub(super) fn left(&self) -> Duration {
        self.at.map_or(Duration::MAX, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }
    /// Simulate `prepared` (of `plan`) under [`Deadline::grace_goes_on`] when the plan has
    /// [`GRACE_ABOVE_OPS`] ops or more; a smaller one simulates in milliseconds and runs to
    /// the end, so small requests plan the same on any machine. `None` when it gave up.
    pub(super) fn simulate_with_grace(
        &self,
        topo: &Topology,
        plan: &Plan,
        prepared: &PreparedSim,
    ) -> Result<Option<relaycc_sim::SimResult>> {
        if plan.ops.len() < GRACE_ABOVE_OPS {
            return prepared.simulate(topo).map(Some);
        }
        let projection = Projection::new(Instant::now(), prepared.lower_bound_us());
        Ok(prepared
            .simulate_watched(topo, &|progress| self.grace_goes_on(&projection, progress))?
            .ok())
    }
    /// The limit a build of this call runs under ([`relaycc_planners::limits`]): the call's ops, and a
    /// deadline: `share` of the budget after the start, or [`LEAST_BUILD_TIME`] where that is
    /// later (a budget of zero still builds the small plans every request of a few GPUs
    /// needs); none without a deadline.
    fn build_limit(&self, what: &'static str, share: f64) -> relaycc_planners::limits::Limit {
        let until = self.at.and_then(|_| {
            let t = self.budget.mul_f64(share).max(LEAST_BUILD_TIME);
            self.started.checked_add(t)
        });
        // The baseline's large builds stop at the budget: one finished after it is refused
        // (`Selection::build_baseline`), too late to prove and simulate.
        let large = (what == BASELINE)
            .then(|| {
                let at = self.at?.max(self.started.checked_add(LEAST_BUILD_TIME)?);
                Some(relaycc_planners::limits::LargeBuild {
                    ops: GRACE_ABOVE_OPS as u64,
                    at,
                    written: Arc::default(),
                })
            })
            .flatten();
        relaycc_planners::limits::Limit {
            ops: Arc::clone(&self.call_ops),
            share: (what != BASELINE).then(|| Arc::clone(&self.candidate_ops)),
            until,
            what,
            large,
        }
    }
    /// Run `f` (builds of `what`) with the limit they run under ([`Deadline::build_limit`]):
    /// the baseline's until [`BASELINE_BUILD_SHARE`] of the budget, relaycc's candidates'
    /// until the deadline.
    pub(super) fn limited<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&relaycc_planners::limits::Limit) -> T,
    ) -> T {
        let share = if what == BASELINE {
            BASELINE_BUILD_SHARE
        } else {
            1.0
        };
        f(&self.build_limit(what, share))
    }
    /// Run `f`, the build of the candidate that must give a plan of relaycc's (the first),
    /// with a limit of the call's ops and a deadline of its own: the budget's, or half a budget (at
    /// least [`LEAST_BUILD_TIME`]) after the build starts where that is later, so a budget
    /// the baseline spent still leaves relaycc a plan, as its simulation's grace does; never
    /// past the baseline's (1.25 times the budget), unless that leaves it less than
    /// [`LEAST_BUILD_TIME`].
    pub(super) fn limited_first<T>(
        &self,
        f: impl FnOnce(&relaycc_planners::limits::Limit) -> T,
    ) -> T {
        let mut limit = self.build_limit(CANDIDATES, 1.0);
        let now = Instant::now();
        let own = now.checked_add((self.budget / 2).max(LEAST_BUILD_TIME));
        let last = self
            .started
            .checked_add(self.budget.mul_f64(BASELINE_BUILD_SHARE))
            .max(now.checked_add(LEAST_BUILD_TIME));
        limit.until = match (limit.until, own, last) {
            (Some(u), Some(o), Some(l)) => Some(u.max(o.min(l))),
            (u, _, _) => u,
        };
        f(&limit)
    }
    /// When the budget is spent, if it ever is.
    pub(super) fn at(&self) -> Option<Instant> {
        self.at
    }
    /// The instant `share` of the budget (less its wrap-up) after the start; `None` without
    /// a deadline.
    pub(super) fn at_share(&self, share: f64) -> Option<Instant> {
        self.at?;
        self.started.checked_add(self.budget.mul_f64(share))
    }
    /// Wall time since the call started.
    pub(super) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
    /// Whether a large baseline finished too late to be proved and simulated within the
    /// budget: past the budget itself (its build may run to [`BASELINE_BUILD_SHARE`] of it,
    /// which leaves no time for a plan of millions of ops after), and past
    /// [`LEAST_BUILD_TIME`].
    pub(super) fn baseline_late(&self) -> bool {
        let now = Instant::now();
        self.at.is_some_and(|at| now >= at) && now.duration_since(self.started) >= LEAST_BUILD_TIME
    }
    /// Record that the baseline's build ended now, and that the call is abandoned where the
    /// build went over the call's limits (`over_limit`): the call fails whatever the
    /// candidates give ([`Deadline::abandoned`]).
    pub(super) fn baseline_built(&self, over_limit: bool) {
        let _ = self.baseline_done.set(Instant::now());
        if over_limit {
            self.abandoned.store(true, Ordering::Relaxed);
        }
    }
    /// Record that a simulation gave up at the deadline.
    pub(super) fn mark_hit(&self) {
        self.hit.store(true, Ordering::Relaxed);
    }
    /// True (and remembered) once the budget is spent.
    pub(super) fn passed(&self) -> bool {
        let over = self.at.is_some_and(|at| Instant::now() >= at);
        if over {
            self.hit.store(true, Ordering::Relaxed);
        }
        over
    }
    pub(super) fn was_hit(&self) -> bool {
        self.hit.load(Ordering::Relaxed)
    }
}

/// Wall time a simulation runs before its progress is sampled ([`Projection`]): past its
/// first events, which may be cheap (an intra-node phase) or costly (setting up its flows).
const PROJECT_AFTER: Duration = Duration::from_secs(1);

/// Wall time between two samples of a simulation's progress ([`Projection`]).
const PROJECT_WINDOW: Duration = Duration::from_millis(500);

/// How much faster than lately the rest of a simulation is assumed to run when projecting it
/// ([`Projection`]): its later events may be cheaper (fewer flows at once).
const PROJECTION_SPEEDUP: f64 = 2.0;

/// Samples of one simulation's progress, to tell when it cannot end by a given instant
/// ([`Projection::hopeless`]).
struct Projection {
    start: Instant,
    lower_bound_us: f64,
    /// The last sample: when, fraction of ops done, simulated time over the lower bound.
    last: std::cell::Cell<Option<(Instant, f64, f64)>>,
}

impl Projection {
    pub(super) fn new(start: Instant, lower_bound_us: f64) -> Self {
        Projection {
            start,
            lower_bound_us,
            last: std::cell::Cell::new(None),
        }
    }
    /// Whether the simulation, now as far as `progress`, cannot end by `end` even projected
    /// optimistically. Progress is measured two ways: ops done over ops, and simulated time
    /// reached over the lower bound (which overstates it). Each is projected at its rate over
    /// the last [`PROJECT_WINDOW`] (an average since the start would count a cheap first
    /// phase), the rest assumed to run [`PROJECTION_SPEEDUP`] times faster, and the sooner
    /// end taken. A run that showed no progress in a window, or has run less than
    /// [`PROJECT_AFTER`], is never hopeless.
    fn hopeless(&self, progress: &SimCut, end: Instant) -> bool {
        self.hopeless_at(Instant::now(), progress, end)
    }
    /// [`Projection::hopeless`] at the instant `now`.
    fn hopeless_at(&self, now: Instant, progress: &SimCut, end: Instant) -> bool {
        if now.saturating_duration_since(self.start) < PROJECT_AFTER || progress.ops == 0 {
            return false;
        }
        let by_ops = progress.ops_done as f64 / progress.ops as f64;
        let by_time = if self.lower_bound_us > 0.0 {
            (progress.reached_us / self.lower_bound_us).min(1.0)
        } else {
            0.0
        };
        let Some((then, ops_then, time_then)) = self.last.get() else {
            self.last.set(Some((now, by_ops, by_time)));
            return false;
        };
        let dt = now.saturating_duration_since(then).as_secs_f64();
        if dt < PROJECT_WINDOW.as_secs_f64() {
            return false;
        }
        self.last.set(Some((now, by_ops, by_time)));
        let rest = |done: f64, before: f64| {
            let rate = (done - before) / dt;
            if rate > 0.0 {
                (1.0 - done).max(0.0) / rate
            } else {
                f64::INFINITY
            }
        };
        let rest = rest(by_ops, ops_then).min(rest(by_time, time_then)) / PROJECTION_SPEEDUP;
        // No progress in a window: nothing to project from.
        let Ok(rest) = Duration::try_from_secs_f64(rest) else {
            return false;
        };
        now.checked_add(rest).is_none_or(|finish| finish > end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(ops_done: usize, reached_us: f64) -> SimCut {
        SimCut {
            reached_us,
            ops_done,
            ops: 1000,
        }
    }

    #[test]
    fn a_projection_gives_up_only_on_a_run_that_cannot_end_in_time() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Lower bound 100 us; the end allowed 3 s after the start.
        let end = at(3000);
        let p = Projection::new(t0, 100.0);
        // Too early to judge, however slow.
        assert!(!p.hopeless_at(at(900), &progress(1, 0.1), end));
        // The first sample only records.
        assert!(!p.hopeless_at(at(1000), &progress(200, 35.0), end));
        // A cheap first phase, then 1% per 0.5 s: 16 s more even at twice that pace, past
        // the end 1.5 s away.
        assert!(p.hopeless_at(at(1500), &progress(210, 36.0), end));

        // At 20% per 0.5 s the rest (3 windows at that pace, 0.75 s at twice it) ends in time.
        let p = Projection::new(t0, 100.0);
        assert!(!p.hopeless_at(at(1000), &progress(200, 20.0), end));
        assert!(!p.hopeless_at(at(1500), &progress(400, 40.0), end));
        // Either measure may show the progress: ops lag, simulated time runs ahead.
        let p = Projection::new(t0, 100.0);
        assert!(!p.hopeless_at(at(1000), &progress(200, 20.0), end));
        assert!(!p.hopeless_at(at(1500), &progress(201, 60.0), end));

        // No progress in a window: nothing to project from.
        let p = Projection::new(t0, 100.0);
        assert!(!p.hopeless_at(at(1000), &progress(200, 20.0), end));
        assert!(!p.hopeless_at(at(1600), &progress(200, 20.0), end));
        // Samples closer than a window are not projected.
        let p = Projection::new(t0, 100.0);
        assert!(!p.hopeless_at(at(1000), &progress(200, 20.0), end));
        assert!(!p.hopeless_at(at(1100), &progress(201, 20.1), end));
    }
}
