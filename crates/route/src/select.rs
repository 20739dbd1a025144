//! The orchestrator: generate candidates, time each with the simulator, keep the fastest, and
//! report it beside the NCCL-like baseline and the bound. [`Planner`] caches results per
//! request shape for one topology.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use relaycc_topo::Topology;
use serde::{Deserialize, Serialize};

use crate::error::{Result, RouteError};
use crate::p2p::{RouteShare, Strategy, p2p_bound_gbps, p2p_candidates};
use crate::path::RelayPolicy;
use crate::plan::Plan;
use crate::request::{Collective, Request};
use crate::sim::{Perf, Prepared, SimConfig, SimCut, simulate};

/// What the baseline's builds are called in a limit's error ([`crate::limits`]).
const BASELINE: &str = "the NCCL-like baseline";
/// Share of the budget the baseline's build may take: past the deadline, since every call
/// reports it, and a quarter of the budget before 1.5 times it, for its capped simulation and
/// its proof. A baseline still building then is refused ([`crate::RouteError::OverLimit`]).
const BASELINE_BUILD_SHARE: f64 = 1.25;
/// What relaycc's candidates' builds are called in a limit's error.
const CANDIDATES: &str = "a candidate of relaycc's";

/// Largest request (ranks) whose plans are built in full and proved by the checker on a
/// topology whose hosts repeat. Above it, where the topology's host symmetry folds and the
/// ranks are the same on every period of hosts, candidates are built as templates of one
/// domain of hosts ([`crate::template`]), checked by [`crate::check_template`] and
/// [`crate::check_routes`] and timed by the simulator on the template.
pub const EXPAND_MAX_RANKS: usize = 64;

/// Above [`EXPAND_MAX_RANKS`] ranks, a plan built in full (its hosts do not repeat, so it
/// cannot be a template) whose proof's vector clocks would take more than this many bytes is
/// proved by its structure, sampled execution ([`crate::template::check_sampled`]) and
/// [`crate::check_routes`], as templates are, instead of by [`crate::check()`]: 512 MiB keeps
/// planning a 1,024-GPU cluster's peak memory under 1 GiB.
pub const SAMPLED_PROOF_ABOVE_CLOCK_BYTES: u64 = 512 << 20;

/// Whether [`plan`] proves `p` with the checker (every output element, every order) before
/// returning it: a full plan of up to [`EXPAND_MAX_RANKS`] ranks, or a larger one whose vector
/// clocks stay within [`SAMPLED_PROOF_ABOVE_CLOCK_BYTES`]. Templates and the larger full plans
/// are checked on their structure, routes and sampled execution instead.
///
/// A plan of rounds is proved by the checker when its body and tail are.
pub fn proved_by_checker(p: &Plan) -> bool {
    if let Some(r) = &p.rounds {
        return proved_by_checker(&r.body) && r.tail.as_ref().is_none_or(proved_by_checker);
    }
    !p.is_template()
        && (p.request.nranks() <= EXPAND_MAX_RANKS
            || crate::check::clock_bytes(p) <= SAMPLED_PROOF_ABOVE_CLOCK_BYTES)
}

/// Planning time allowed when the caller names none: a few seconds, so an interactive command
/// answers promptly on any machine while every 8-GPU request plans in full well within it.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(5);

/// How to plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Which GPUs may relay. Default: any free GPU.
    pub relay: RelayPolicy,
    /// Which point-to-point route kinds to consider. Default: all.
    pub strategy: Strategy,
    /// Simulator settings used to rank candidates.
    pub sim: SimConfig,
    /// Planning time allowed ([`DEFAULT_BUDGET`] by default). Once it is spent, candidates not
    /// yet built or simulated are left out and the best plan found so far is returned, with
    /// [`Planned::budget_exhausted`] set. The baseline and the most promising candidate are
    /// always simulated, so a budget of zero still plans: those of 200,000 ops or more, the
    /// baseline until the deadline or for [`LEAST_SIMULATION_GRACE`] of its own where it
    /// passed (cut there, it is reported as a lower bound, [`Planned::baseline_cut`]), relaycc's
    /// most promising candidate for a budget's time of its own (at least that grace), unless
    /// its progress shows it cannot end by then. Builds stop at their deadline
    /// ([`LEAST_BUILD_TIME`] at least): relaycc's candidates at the budget's, left out then;
    /// the baseline at 1.25 times the budget, the call then an error saying so
    /// ([`RouteError::OverLimit`]). Every call's builds hold at most [`crate::MAX_CALL_OPS`]
    /// ops at once, and a request no plan could hold within them is refused at once.
    pub budget: Duration,
    /// Staging memory a plan may allocate on each device (GPU or host socket), bytes. Default:
    /// [`crate::staging::DEFAULT_STAGING_BUDGET_BYTES`]; [`crate::staging::UNBOUNDED_STAGING`]
    /// bounds nothing.
    pub staging_budget: u64,
    /// Build every plan in full, never as a template ([`crate::template`]), whatever the
    /// ranks: what an executor asks for, since only a full plan can be proved and run.
    /// Default: false (templates above [`EXPAND_MAX_RANKS`] ranks where the hosts repeat).
    pub expand: bool,
    /// Largest slice of one piece (a block of `count` elements, a `v` count, a transfer) one
    /// round moves, bytes: a request with a longer piece is planned as a plan of rounds
    /// ([`crate::rounds`]), one round's plan repeated over successive slices and a tail's for
    /// the remainder, so neither its op count nor its planning time grows with the message.
    /// Default: [`crate::rounds::DEFAULT_ROUND_BYTES`]; [`u64::MAX`] plans every request as
    /// one plan.
    pub round_bytes: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            relay: RelayPolicy::default(),
            strategy: Strategy::default(),
            sim: SimConfig::default(),
            budget: DEFAULT_BUDGET,
            staging_budget: crate::staging::DEFAULT_STAGING_BUDGET_BYTES,
            expand: false,
            round_bytes: crate::rounds::DEFAULT_ROUND_BYTES,
        }
    }
}

/// When planning must stop, and whether it had to.
struct Deadline {
    started: Instant,
    /// The ops the call's builds hold ([`crate::limits::MAX_CALL_OPS`]).
    call_ops: Arc<crate::limits::CallOps>,
    /// The ops relaycc's candidates hold among them ([`crate::limits::CANDIDATE_OPS`]).
    candidate_ops: Arc<crate::limits::CallOps>,
    /// When the baseline was built (as a template or in full).
    baseline_done: std::sync::OnceLock<Instant>,
    at: Option<Instant>,
    budget: Duration,
    hit: AtomicBool,
    /// Set when the baseline could not be built ([`Deadline::abandoned`]).
    abandoned: AtomicBool,
}

impl Deadline {
    fn new(budget: Duration) -> Self {
        let started = Instant::now();
        Deadline {
            started,
            call_ops: crate::limits::CallOps::new(crate::limits::MAX_CALL_OPS),
            candidate_ops: crate::limits::CallOps::new(crate::limits::CANDIDATE_OPS),
            baseline_done: std::sync::OnceLock::new(),
            at: started.checked_add(budget),
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
    fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }
    /// When [`Deadline::grace_goes_on`] stops a simulation started at `own_start`: the latest
    /// of the deadline and a grace after the start and after the baseline was built; `None`
    /// while that is not known (no deadline, the baseline not built yet, or an instant past
    /// what the clock can hold).
    fn grace_end(&self, own_start: Instant) -> Option<Instant> {
        let grace = self.budget.max(LEAST_SIMULATION_GRACE);
        let built = *self.baseline_done.get()?;
        let at = self.at?;
        Some(
            at.max(own_start.checked_add(grace)?)
                .max(built.checked_add(grace)?),
        )
    }
    /// Whether the baseline's simulation, started at `own_start`, goes on: until the
    /// deadline, and for [`LEAST_SIMULATION_GRACE`] of its own where it passed. Cut, it still
    /// gives a lower bound, which relaycc's plan must beat to be chosen.
    fn baseline_goes_on(&self, own_start: Instant) -> bool {
        let now = Instant::now();
        self.at.is_none_or(|at| now < at) || now.duration_since(own_start) < LEAST_SIMULATION_GRACE
    }
    /// Whether a simulation run beside the baseline's build goes on: until the deadline, and
    /// beyond it while the baseline is still being built.
    fn beside_goes_on(&self) -> bool {
        !self.abandoned()
            && (self.at.is_none_or(|at| Instant::now() < at) || self.baseline_done.get().is_none())
    }
    /// Time left until the deadline ([`Duration::MAX`] without one).
    fn left(&self) -> Duration {
        self.at.map_or(Duration::MAX, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }
    /// Simulate `prepared` (of `plan`) under [`Deadline::grace_goes_on`] when the plan has
    /// [`GRACE_ABOVE_OPS`] ops or more; a smaller one simulates in milliseconds and runs to
    /// the end, so small requests plan the same on any machine. `None` when it gave up.
    fn simulate_with_grace(
        &self,
        topo: &Topology,
        plan: &Plan,
        prepared: &Prepared,
    ) -> Result<Option<crate::sim::SimResult>> {
        if plan.ops.len() < GRACE_ABOVE_OPS {
            return prepared.simulate(topo).map(Some);
        }
        let projection = Projection::new(Instant::now(), prepared.lower_bound_us());
        Ok(prepared
            .simulate_watched(topo, &|progress| self.grace_goes_on(&projection, progress))?
            .ok())
    }
    /// The limit a build of this call runs under ([`crate::limits`]): the call's ops, and a
    /// deadline: `share` of the budget after the start, or [`LEAST_BUILD_TIME`] where that is
    /// later (a budget of zero still builds the small plans every request of a few GPUs
    /// needs); none without a deadline.
    fn build_limit(&self, what: &'static str, share: f64) -> crate::limits::Limit {
        let until = self.at.and_then(|_| {
            let t = self.budget.mul_f64(share).max(LEAST_BUILD_TIME);
            self.started.checked_add(t)
        });
        crate::limits::Limit {
            ops: Arc::clone(&self.call_ops),
            share: (what != BASELINE).then(|| Arc::clone(&self.candidate_ops)),
            until,
            what,
        }
    }
    /// Run `f` (builds of `what`) under [`Deadline::build_limit`]: the baseline's until
    /// [`BASELINE_BUILD_SHARE`] of the budget, relaycc's candidates' until the deadline.
    fn limited<T>(&self, what: &'static str, f: impl FnOnce() -> T) -> T {
        let share = if what == BASELINE {
            BASELINE_BUILD_SHARE
        } else {
            1.0
        };
        crate::limits::scoped(Some(self.build_limit(what, share)), f)
    }
    /// Run `f`, the build of the candidate that must give a plan of relaycc's (the first),
    /// under the call's ops and a deadline of its own: the budget's, or half a budget (at
    /// least [`LEAST_BUILD_TIME`]) after the build starts where that is later, so a budget
    /// the baseline spent still leaves relaycc a plan, as its simulation's grace does; never
    /// past the baseline's (1.25 times the budget), unless that leaves it less than
    /// [`LEAST_BUILD_TIME`].
    fn limited_first<T>(&self, f: impl FnOnce() -> T) -> T {
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
        crate::limits::scoped(Some(limit), f)
    }
    /// Record that a simulation gave up at the deadline.
    fn mark_hit(&self) {
        self.hit.store(true, Ordering::Relaxed);
    }
    /// True (and remembered) once the budget is spent.
    fn passed(&self) -> bool {
        let over = self.at.is_some_and(|at| Instant::now() >= at);
        if over {
            self.hit.store(true, Ordering::Relaxed);
        }
        over
    }
    fn was_hit(&self) -> bool {
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
    fn new(start: Instant, lower_bound_us: f64) -> Self {
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

/// Least time a planning call's builds get, whatever the budget (`limits.rs`): a plan
/// for a few GPUs builds in milliseconds, so a budget of zero still plans them.
pub const LEAST_BUILD_TIME: Duration = Duration::from_secs(1);

/// Least time the simulations that must give a figure (the baseline's, relaycc's most
/// promising candidate's, the tuner's of large baselines) are given once the budget is spent,
/// so that a small budget still returns a plan of relaycc's where one simulates that fast.
pub const LEAST_SIMULATION_GRACE: Duration = Duration::from_secs(1);

/// Plans with fewer ops simulate in tens of milliseconds (a 100k-op ring in about 20 ms,
/// `benches/simulator.rs`): the candidate that must yield a plan of relaycc's is then simulated
/// to the end, whatever the budget.
const GRACE_ABOVE_OPS: usize = 200_000;

/// One candidate's simulated time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateTime {
    /// The candidate's algorithm name.
    pub algorithm: String,
    /// Its simulated time, microseconds.
    pub time_us: f64,
}

/// The chosen plan and the figures to judge it by.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The fastest plan found.
    pub plan: Plan,
    /// Its simulated performance.
    pub predicted: Perf,
    /// The NCCL-like baseline's plan.
    pub baseline_plan: Plan,
    /// The baseline's simulated performance; where its simulation was cut by the budget
    /// ([`Planned::baseline_cut`]), a bound: its time at least this, its bandwidth at most.
    pub baseline: Perf,
    /// Set when the baseline's simulation was given up at the budget (a baseline of 200,000
    /// ops or more is simulated until the deadline, or for [`LEAST_SIMULATION_GRACE`] where
    /// it passed): how far it got. Its time is then known only from below
    /// (the simulated time reached, the busiest resource's load and the bound), so a plan of
    /// relaycc's wins only if it is no slower than that; otherwise the baseline is the plan,
    /// with that lower bound as its prediction.
    pub baseline_cut: Option<SimCut>,
    /// The bound (max-flow for point-to-point and broadcast, ingress/egress otherwise).
    pub bound: Perf,
    /// Every candidate tried, fastest first.
    pub candidates: Vec<CandidateTime>,
    /// Point-to-point requests: the chosen routes and their shares.
    pub routes: Vec<RouteShare>,
    /// True when the planning budget ran out before every candidate was built and simulated:
    /// the plan is the best of those that were.
    pub budget_exhausted: bool,
    /// Wall time the call took. It passes the budget by the builds under way at the deadline,
    /// the grace the baseline's simulation and the most promising candidate's get
    /// ([`PlanOptions::budget`]), and by the final proof.
    pub elapsed: Duration,
    /// Candidate families left out for this request's size, each with the reason.
    pub skipped: Vec<String>,
}

fn is_p2p(req: &Request) -> bool {
    req.collective == Collective::SendRecv
        && req.transfers.len() == 1
        && req.transfers[0].src != req.transfers[0].dst
}

/// Plan `req` on `topo`: the fastest candidate by simulation, the baseline and the bound.
///
/// The baseline plan is itself among the candidates, so relaycc is never predicted slower
/// than the NCCL-like planner. Ties go to the earlier candidate, which keeps planning
/// deterministic. When every rank is an arena of one host memory
/// ([`Topology::shares_host_memory`], the `host-N` preset), the plan is the shared-memory
/// planner's ([`crate::planner::shared_memory`]). No plan is returned unproved: the checker
/// ([`crate::check()`] and [`crate::check_routes`]) passes the winner and the baseline before
/// they are returned. A candidate that fails is dropped, and the next fastest is proved in its
/// place (for collectives the pruned selection runs again without it).
///
/// # Errors
/// - those of [`crate::require_reachable`]: a malformed request, an unknown relay GPU, a
///   masked member, a member pair no path joins;
/// - [`RouteError::NoRoute`] when no candidate finds routes;
/// - [`RouteError::PlanCheck`] when no candidate passes the checker (a planner bug);
/// - [`RouteError::AboveBound`] when the winner is predicted faster than the bound allows;
/// - [`RouteError::StagingBudget`] when no candidate fits `opts.staging_budget` (candidates
///   that do not fit are skipped; the NCCL-like baseline is then still reported, built without
///   the budget, but never chosen).
pub fn plan(topo: &Topology, req: &Request, opts: &PlanOptions) -> Result<Planned> {
    if let Some(split) = crate::rounds::split(req, opts.round_bytes)? {
        return crate::rounds::plan_rounds(topo, req, opts, split);
    }
    let deadline = Deadline::new(opts.budget);
    let mut skipped: Vec<String> = Vec::new();
    crate::reach::require_reachable(topo, req, &opts.relay)?;
    let budget = opts.staging_budget;
    let until = deadline.at;
    let shift = fold_shift(topo, req).filter(|_| !opts.expand);
    refuse_past_the_call_ops(req, shift.as_ref())?;
    // A baseline that cannot fit the budget is still reported, but is no candidate.
    let mut first_failure = None;
    // Templates of relaycc's candidates need nothing of the baseline: they are built while
    // the baseline's template is, and their result (or error) is taken where it was asked.
    let templated = shift
        .as_ref()
        .filter(|_| !topo.shares_host_memory(&req.gpus) && !is_p2p(req));
    // Templates of relaycc's candidates need nothing of the baseline: they are built and
    // simulated while the baseline is built, and go on while it is and a budget after
    // (`Deadline::grace_goes_on`); their result (or error) is taken where it was asked.
    let ((folded, why, early_proof), mut early) = rayon::join(
        || {
            let (folded, why) = deadline.limited(BASELINE, || {
                baseline_template(topo, req, budget, shift.as_ref(), until)
            });
            // A baseline that does not fold is built in full here, beside the templates.
            let built = match folded {
                Some(built) => built,
                None => deadline.limited(BASELINE, || {
                    crate::planner::baseline_within_timed(topo, req, budget, until)
                }),
            };
            let _ = deadline.baseline_done.set(Instant::now());
            if matches!(built, Err(RouteError::OverLimit { .. })) {
                deadline.abandoned.store(true, Ordering::Relaxed);
            }
            // Proved here, while the templates beside it may still be simulated.
            let proof = match &built {
                Ok(t) if templated.is_some() => Some(prove(topo, req, &t.plan)),
                _ => None,
            };
            (built, why, proof)
        },
        || templated.map(|sym| fastest_templates(topo, req, opts, sym, &deadline)),
    );
    skipped.extend(why);
    let (built, tuned) = match folded {
        Ok(t) => (Ok(t.plan), t.tuned),
        Err(e) => (Err(e), None),
    };
    let (baseline_plan, baseline_fits) = match built {
        Ok(p) => (p, true),
        Err(e @ RouteError::StagingBudget { .. }) => {
            first_failure = Some(e);
            let unfitted = deadline.limited(BASELINE, || crate::planner::baseline_plan(topo, req));
            (unfitted?, false)
        }
        Err(e) => return Err(e),
    };
    // The tuner's simulation of the plan, where it stands for the one made here.
    let tuned = tuned.filter(|_| baseline_fits);
    // The baseline is proved while it is simulated (a large one for a budget's time of its
    // own, `simulate_baseline`; one cut there is known from below) and, after that, while
    // relaycc's candidates are built and simulated: they need its time, not its proof, which
    // is awaited at the end.
    let (baseline_proof, rest) = rayon::join(
        || match early_proof {
            Some(proof) => proof,
            None => prove(topo, req, &baseline_plan),
        },
        || -> Result<_> {
            let sim = simulate_baseline(topo, &baseline_plan, opts, tuned, &deadline);
            let (baseline_time_us, baseline_cut) = sim?;
            if baseline_cut.is_some() {
                deadline.mark_hit();
            }
            // (plan, routes, simulated time, proved already), in the order they were considered.
            let mut found: Vec<(Plan, Vec<RouteShare>, f64, bool)> = Vec::new();
            // Ranks that are arenas of one host's memory (the `host-N` preset): the simulator
            // models links, not one shared memory and its caches, so it cannot rank algorithms
            // there; the shared-memory planner is used directly, and still reported beside
            // baseline and bound.
            let shared_memory = topo.shares_host_memory(&req.gpus);
            let bound_gbps;
            if shared_memory {
                bound_gbps = if is_p2p(req) {
                    p2p_bound_gbps(topo, req, &opts.relay)?
                } else {
                    crate::planner::bound_gbps(topo, req, &opts.relay)?
                };
                let p = crate::planner::shared_memory::plan(topo, req, false)?;
                if let Some((at, needed)) = crate::staging::over_budget(&p, budget) {
                    return Err(crate::staging::budget_error(&p, at, needed, budget));
                }
                let t = simulate(topo, &p, &opts.sim)?.time_us;
                found.push((p, Vec::new(), t, false));
            } else if is_p2p(req) {
                bound_gbps = p2p_bound_gbps(topo, req, &opts.relay)?;
                match p2p_candidates(topo, req, &opts.relay, opts.strategy) {
                    Ok(cands) => {
                        for c in cands {
                            if let Some((at, needed)) = crate::staging::over_budget(&c.plan, budget)
                            {
                                first_failure.get_or_insert(crate::staging::budget_error(
                                    &c.plan, at, needed, budget,
                                ));
                                continue;
                            }
                            let t = simulate(topo, &c.plan, &opts.sim)?.time_us;
                            found.push((c.plan, c.routes, t, false));
                        }
                    }
                    // A forced strategy with no route falls through to the baseline only when Auto.
                    Err(e) if opts.strategy != Strategy::Auto => return Err(e),
                    Err(_) => {}
                }
            } else {
                bound_gbps = crate::planner::bound_gbps(topo, req, &opts.relay)?;
                // A baseline known only from below is beaten only by a plan no slower than that
                // bound (raised to the request's bound below), so a candidate whose own bound
                // is above it cannot win; ties can, hence the rounding slack.
                let to_beat = match (baseline_fits, baseline_cut) {
                    (true, None) => baseline_time_us,
                    (true, Some(_)) => {
                        cut_baseline_us(baseline_time_us, req, bound_gbps) * (1.0 + 1e-9)
                    }
                    (false, _) => f64::INFINITY,
                };
                let (fast, left_out, unfit) = match &shift {
                    Some(sym) => match early.take() {
                        Some(r) => r?,
                        None => fastest_templates(topo, req, opts, sym, &deadline)?,
                    },
                    None => fastest_collectives(topo, req, opts, to_beat, &deadline)?,
                };
                skipped.extend(left_out);
                if let Some(e) = unfit {
                    first_failure.get_or_insert(e);
                }
                for (plan, time_us, proved) in fast {
                    found.push((plan, Vec::new(), time_us, proved));
                }
            }
            Ok((
                baseline_time_us,
                baseline_cut,
                found,
                shared_memory,
                bound_gbps,
            ))
        },
    );
    baseline_proof?;
    let (mut baseline_time_us, baseline_cut, mut found, shared_memory, bound_gbps) = rest?;
    if baseline_cut.is_some() {
        baseline_time_us = cut_baseline_us(baseline_time_us, req, bound_gbps);
    }
    let baseline = Perf::from_time(req, baseline_time_us);
    if baseline_fits
        && baseline_cut.is_none()
        && !shared_memory
        && (opts.strategy == Strategy::Auto || !is_p2p(req))
    {
        found.push((baseline_plan.clone(), Vec::new(), baseline_time_us, true));
    }
    // Fastest first; the stable sort keeps ties in the order they were considered.
    found.sort_by(|a, b| a.2.total_cmp(&b.2));
    let mut winner = None;
    let mut candidates = Vec::with_capacity(found.len());
    for (plan, routes, time_us, proved) in found {
        // Against a baseline known only from below, a plan is shown no slower only within
        // that bound; the others are reported, not chosen.
        let beats_cut = baseline_cut.is_none() || time_us <= baseline_time_us;
        let proof = if proved || winner.is_some() || !beats_cut {
            Ok(())
        } else {
            prove(topo, req, &plan)
        };
        if let Err(e) = proof {
            first_failure.get_or_insert(e);
            continue;
        }
        candidates.push(CandidateTime {
            algorithm: plan.algorithm.clone(),
            time_us,
        });
        if winner.is_none() && beats_cut {
            winner = Some((time_us, plan, routes));
        }
    }
    if winner.is_none() && baseline_cut.is_some() && baseline_fits {
        // Nothing shown faster within the budget: the baseline (proved above) is the plan,
        // predicted by its lower bound.
        candidates.push(CandidateTime {
            algorithm: baseline_plan.algorithm.clone(),
            time_us: baseline_time_us,
        });
        candidates.sort_by(|a, b| a.time_us.total_cmp(&b.time_us));
        winner = Some((baseline_time_us, baseline_plan.clone(), Vec::new()));
    }
    let Some((time, plan, routes)) = winner else {
        return Err(first_failure.unwrap_or_else(|| RouteError::NoRoute {
            what: req.collective.to_string(),
            why: "no candidate plan".into(),
        }));
    };
    let predicted = Perf::from_time(req, time);
    let bound = Perf::from_time(
        req,
        if bound_gbps > 0.0 {
            req.size_bytes() as f64 / (bound_gbps * 1e3)
        } else {
            f64::INFINITY
        },
    );
    // Relative slack for rounding in the simulator's sums; anything beyond is a wrong figure.
    // (`bound_gbps` is infinite when nothing has to move, which `bound` shows as 0.)
    if predicted.algbw_gbps > bound_gbps * (1.0 + 1e-9) {
        return Err(RouteError::AboveBound {
            algorithm: plan.algorithm,
            request: format!(
                "{} of {} bytes on {} GPUs",
                req.collective,
                req.size_bytes(),
                req.nranks()
            ),
            predicted_gbps: predicted.algbw_gbps,
            bound_gbps,
        });
    }
    Ok(Planned {
        plan,
        predicted,
        baseline_plan,
        baseline,
        baseline_cut,
        bound,
        candidates,
        routes,
        budget_exhausted: deadline.was_hit(),
        elapsed: deadline.started.elapsed(),
        skipped,
    })
}

/// Refuse at once a request that no plan could hold within the ops of one planning call
/// ([`crate::limits::MAX_CALL_OPS`]), before anything is built: an all_to_all's n(n - 1)
/// pieces (per period of hosts, for a template) each start in their own place and move at
/// least once, so every plan of it, the baseline's too, holds at least that many copies.
fn refuse_past_the_call_ops(
    req: &Request,
    shift: Option<&relaycc_topo::HostSymmetry>,
) -> Result<()> {
    if !matches!(req.collective, Collective::AllToAll | Collective::AllToAllV) {
        return Ok(());
    }
    let n = req.nranks() as u64;
    let pieces = n.saturating_mul(n.saturating_sub(1));
    let periods = shift.map_or(1, |s| u64::from(s.periods()).max(1));
    let ops = pieces / periods;
    let max = crate::limits::MAX_CALL_OPS;
    if ops <= max {
        return Ok(());
    }
    Err(RouteError::OverLimit {
        what: format!(
            "{} over {n} ranks moves n(n - 1) = {pieces} pieces, {ops} per period of hosts \
             ({periods} periods), each at least one copy",
            req.collective
        ),
        limit: format!(
            "the {max} ops one planning call holds (about 2 GiB); fewer ranks or a smaller \
             message plan within it"
        ),
    })
}

/// The time a cut baseline is known to take at least: what its simulation showed
/// (`simulated_us`, the time reached or its busiest resource's load), or the request's bound's
/// time (`bound_gbps`), whichever is larger.
fn cut_baseline_us(simulated_us: f64, req: &Request, bound_gbps: f64) -> f64 {
    if bound_gbps > 0.0 && bound_gbps.is_finite() {
        simulated_us.max(req.size_bytes() as f64 / (bound_gbps * 1e3))
    } else {
        simulated_us
    }
}

/// Simulate the baseline: to the end below [`GRACE_ABOVE_OPS`] ops, else until the deadline,
/// or for [`LEAST_SIMULATION_GRACE`] of its own where it passed, as relaycc's most promising
/// candidate is given. Its makespan and `None` when it ran to the end; when it gave up, a
/// lower bound on the makespan (the simulated time reached, or the busiest resource's load and
/// the longest op) and how far it got.
///
/// `tuned` is the tuner's simulation of this plan, if it made one: taken as it is where it
/// used the same settings and ran to the end, or ran at least as long as this simulation
/// could, so the same plan is not simulated twice (5 s each for NCCL's tree of 3M ops on a
/// 64-node fat-tree).
fn simulate_baseline(
    topo: &Topology,
    plan: &Plan,
    opts: &PlanOptions,
    tuned: Option<crate::planner::baseline::TunedTime>,
    deadline: &Deadline,
) -> Result<(f64, Option<SimCut>)> {
    if let Some(t) = tuned
        && opts.sim == SimConfig::default()
        && tuned_stands(
            &t,
            plan.ops.len(),
            deadline.left().max(LEAST_SIMULATION_GRACE),
        )
    {
        return Ok((t.time_us, t.cut));
    }
    if plan.ops.len() < GRACE_ABOVE_OPS {
        return Ok((simulate(topo, plan, &opts.sim)?.time_us, None));
    }
    let prepared = Prepared::new(topo, plan, &opts.sim)?;
    let start = Instant::now();
    Ok(
        match prepared.simulate_or_cut(topo, &|| deadline.baseline_goes_on(start))? {
            Ok(sim) => (sim.time_us, None),
            Err(cut) => (cut.reached_us.max(prepared.lower_bound_us()), Some(cut)),
        },
    )
}

/// Whether the tuner's simulation `t` of a baseline of `ops` ops stands for the planner's, which
/// could run for `could_run`: it ran to the end, or, for a plan large enough to be cut at all
/// ([`GRACE_ABOVE_OPS`]), it ran at least as long.
fn tuned_stands(t: &crate::planner::baseline::TunedTime, ops: usize, could_run: Duration) -> bool {
    t.cut.is_none() || (ops >= GRACE_ABOVE_OPS && t.spent >= could_run)
}

/// Most ops of NCCL's double binary tree all_reduce built in full beside templates above
/// [`EXPAND_MAX_RANKS`] ranks: it simulates in well under a second and its sampled proof
/// follows cones of a few hundred ops.
pub const TREE_IN_FULL_MAX_OPS: u64 = 300_000;

/// An upper estimate of the ops of NCCL's double binary tree all_reduce of `req`: per rank,
/// channel and chunk a reduction going up and a copy going down each way of a chain or tree
/// edge (at most 4), over every chunk of the pipelining size plus one partial chunk for each of
/// up to 32 channels.
fn tree_ops_estimate(req: &Request) -> u64 {
    let chunk = crate::planner::pipeline_chunk_elems(req).max(1);
    req.nranks() as u64 * 4 * (req.count.div_ceil(chunk) + 32)
}

/// An estimate of the ops the windowed build of NCCL's rail-aligned ring all_reduce of `req`
/// makes when folded by `sym`: per rank, channel and chunk of its block, 2 (n - 1) copies
/// and n - 1 reductions, over the two periods of hosts a window holds (the whole plan where
/// there are only two periods: a 64-node rail-optimized cluster's two scalable units). Zero
/// where the members sit on one node, so that the rings are always tried there.
fn ring_window_ops_estimate(
    topo: &Topology,
    req: &Request,
    sym: &relaycc_topo::HostSymmetry,
) -> u64 {
    let Ok(Some(channels)) = crate::planner::baseline_net::ring_channels(topo, req) else {
        return 0;
    };
    let n = req.nranks() as u64;
    let channels = channels.max(1) as u64;
    let chunk = crate::planner::pipeline_chunk_elems(req).max(1);
    let per_block = req.count.div_ceil(n * channels).div_ceil(chunk).max(1);
    let full = 3 * n * n.saturating_sub(1) * channels * per_block;
    let periods = u64::from(sym.periods()).max(1);
    full.saturating_mul(2.min(periods)) / periods
}

/// The baseline as a template folded by `shift` (NCCL's rings where the tuner's all_reduce
/// tree does not fold), with the reasons for what it left out; `None` where it is built in
/// full (no shift, or a baseline that does not fold).
fn baseline_template(
    topo: &Topology,
    req: &Request,
    budget: u64,
    shift: Option<&relaycc_topo::HostSymmetry>,
    until: Option<Instant>,
) -> (
    Option<Result<crate::planner::baseline::TunedPlan>>,
    Vec<String>,
) {
    let mut skipped = Vec::new();
    let folded = match shift {
        // A window holds two periods of hosts: with only two it is the whole plan, built one
        // channel after another (a window is one thread's) and then folded, for a template
        // half its size. Built in full, its channels are built at once and nothing is folded.
        Some(sym) if sym.periods() <= 2 => {
            skipped.push(format!(
                "the baseline's template: its hosts repeat in {} periods, so its window would be \
                 the whole plan; the baseline is built in full",
                sym.periods()
            ));
            None
        }
        Some(sym) => {
            let within =
                |algo| crate::planner::baseline_template_until(topo, req, budget, algo, sym, until);
            match within(None) {
                Ok(p) => Some(Ok(p)),
                // NCCL's double binary tree differs between hosts, so it never folds. Its ops
                // grow as ranks x chunks, not ranks^2 as a ring's: where they are few (the
                // small sizes where the tuner prefers it) it is built in full; otherwise its
                // rings stand for it.
                Err(RouteError::NotSymmetric(why)) if req.collective == Collective::AllReduce => {
                    let tree_ops = tree_ops_estimate(req);
                    let ring_window = ring_window_ops_estimate(topo, req, sym);
                    if tree_ops <= TREE_IN_FULL_MAX_OPS || tree_ops <= ring_window {
                        skipped.push(format!(
                            "the tuner's baseline as a template: {why}; the baseline is NCCL's \
                             tree, built in full (about {tree_ops} ops, against about \
                             {ring_window} for its rings' window)"
                        ));
                        return (None, skipped);
                    }
                    match within(Some(crate::planner::baseline_net::tuner::Algo::Ring)) {
                        Ok(mut t) => {
                            skipped.push(format!(
                                "the tuner's baseline as a template: {why}; its tree would take \
                                 about {tree_ops} ops in full (above {TREE_IN_FULL_MAX_OPS}), so \
                                 the baseline is NCCL's rings (NCCL_ALGO=Ring)"
                            ));
                            t.plan.algorithm = format!("{} (NCCL_ALGO=Ring)", t.plan.algorithm);
                            Some(Ok(t))
                        }
                        Err(RouteError::NotSymmetric(why)) => {
                            skipped.push(format!(
                                "the baseline's template: {why}; the baseline is built in full"
                            ));
                            None
                        }
                        Err(e) => Some(Err(e)),
                    }
                }
                Err(RouteError::NotSymmetric(why)) => {
                    skipped.push(format!(
                        "the baseline's template: {why}; the baseline is built in full"
                    ));
                    None
                }
                Err(e) => Some(Err(e)),
            }
        }
        None => None,
    };
    (folded, skipped)
}

/// Prove that `plan` delivers `req` on `topo`: it is a plan of this request, every output
/// element holds exactly its inputs without a race ([`crate::check()`]), and every copy follows
/// usable links through GPUs the job may use ([`crate::check_routes`]). A template
/// ([`crate::template`]) passes [`crate::check_template`] instead (its routes were checked on
/// the windowed build it was folded from).
fn prove(topo: &Topology, req: &Request, plan: &Plan) -> Result<()> {
    if plan.request != *req {
        return Err(RouteError::PlanCheck {
            op: usize::MAX,
            message: format!(
                "{} plans another request than the one asked",
                plan.algorithm
            ),
        });
    }
    let named = |e: RouteError| match e {
        RouteError::PlanCheck { op, message } => RouteError::PlanCheck {
            op,
            message: format!("{}: {message}", plan.algorithm),
        },
        other => other,
    };
    if plan.is_template() {
        return crate::check::check_template(plan).map_err(named);
    }
    if plan.request.nranks() > EXPAND_MAX_RANKS
        && crate::check::clock_bytes(plan) > SAMPLED_PROOF_ABOVE_CLOCK_BYTES
    {
        // A full plan of a cluster whose hosts do not repeat: vector clocks would take
        // gigabytes, so it is proved as a template is, on its structure and by sampled
        // execution of its data cones, and its routes are checked as usual. The three read
        // the plan only, so they run at once (about a second each for NCCL's 3M-op tree on
        // 64 nodes); errors are reported in that order.
        let (structure, (sampled, routes)) = rayon::join(
            || crate::check::check_structure_only(plan),
            || {
                rayon::join(
                    || {
                        crate::template::check_sampled(
                            plan,
                            topo,
                            &crate::template::SampleOptions::default(),
                        )
                    },
                    || crate::check::check_routes(plan, topo),
                )
            },
        );
        structure.map_err(named)?;
        sampled.map_err(named)?;
        return routes.map_err(named);
    }
    crate::check::check(plan).map_err(named)?;
    crate::check::check_routes(plan, topo).map_err(named)
}

/// The host symmetry to fold `req`'s plans by: above [`EXPAND_MAX_RANKS`] ranks, on a
/// topology whose hosts repeat, with ranks that are the same on every period of hosts.
fn fold_shift(topo: &Topology, req: &Request) -> Option<relaycc_topo::HostSymmetry> {
    if req.nranks() <= EXPAND_MAX_RANKS {
        return None;
    }
    let sym = topo.host_symmetry();
    (!sym.is_trivial() && crate::template::ranks_invariant(&sym, &req.gpus)).then_some(sym)
}

/// The collective candidates as templates folded by `shift`, each simulated (plan, time, not
/// yet proved); a candidate that is not the same on every period of hosts is skipped with its
/// reason, one over the staging budget too.
fn fastest_templates(
    topo: &Topology,
    req: &Request,
    opts: &PlanOptions,
    shift: &relaycc_topo::HostSymmetry,
    deadline: &Deadline,
) -> Result<Fastest> {
    let set =
        crate::planner::Candidates::new(topo, req, &opts.relay)?.with_budget(opts.staging_budget);
    let mut skipped = set.skipped().to_vec();
    let fine = crate::planner::pipeline_chunk_elems(req).max(1);
    let prepared: Vec<Result<(Plan, Prepared)>> = (0..set.len())
        .into_par_iter()
        .map(|i| {
            let build = || set.build_template(i, fine, shift);
            let plan = if i == 0 {
                deadline.limited_first(build)?
            } else {
                deadline.limited(CANDIDATES, build)?
            };
            let prepared = Prepared::new(topo, &plan, &opts.sim)?;
            Ok((plan, prepared))
        })
        .collect();
    // Built beside the baseline, the most promising template (least lower bound) has a
    // budget's time of its own to simulate; the others go on while planning waits for the
    // baseline anyway, or until the deadline, so that the CPUs go to the one that must give a
    // plan of relaycc's.
    let first = prepared
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.as_ref().ok().map(|(_, pr)| (pr.lower_bound_us(), i)))
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, i)| i);
    let built: Vec<Result<(Plan, Option<f64>)>> = prepared
        .into_par_iter()
        .enumerate()
        .map(|(i, b)| {
            let (plan, prepared) = b?;
            let sim = if Some(i) == first || plan.ops.len() < GRACE_ABOVE_OPS {
                deadline.simulate_with_grace(topo, &plan, &prepared)?
            } else {
                prepared.simulate_while(topo, &|| deadline.beside_goes_on())?
            };
            Ok((plan, sim.map(|sim| sim.time_us)))
        })
        .collect();
    let mut found = Vec::new();
    let mut unfit = None;
    let mut no_route = None;
    for b in built {
        match b {
            Ok((plan, Some(t))) => found.push((plan, t, false)),
            Ok((plan, None)) => {
                deadline.mark_hit();
                skipped.push(format!(
                    "{}: the planning budget ran out while it was simulated",
                    plan.algorithm
                ));
            }
            Err(RouteError::NotSymmetric(why)) => {
                skipped.push(format!("a candidate that does not fold: {why}"));
            }
            Err(e @ RouteError::OverLimit { .. }) => {
                deadline.mark_hit();
                skipped.push(format!("a candidate left out: {e}"));
            }
            Err(e @ RouteError::StagingBudget { .. }) => {
                skipped.push(format!("over the staging budget: {e}"));
                unfit.get_or_insert(e);
            }
            Err(e @ RouteError::NoRoute { .. }) => {
                no_route.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if found.is_empty()
        && unfit.is_none()
        && let Some(e) = no_route
    {
        return Err(e);
    }
    Ok((found, skipped, unfit))
}

/// A simulated candidate: its plan, time (us) and whether the checker proved it.
type Simulated = (Plan, f64, bool);

/// A candidate built and lowered for the simulator.
type Built = (Plan, Prepared);

/// The collective candidates simulated (plan, time, proved), and the first reason a candidate
/// was skipped for the staging budget.
type Fastest = (Vec<Simulated>, Vec<String>, Option<RouteError>);

/// The collective candidates worth simulating, each with its simulated time and whether the
/// checker proved it, in the order they were simulated; `to_beat_us` is the time they must
/// beat (the baseline's). The fastest is proved (and flagged); one that fails the checker is
/// left out and the selection run again without it.
///
/// Two stages keep planning cheap without changing the winner. First every candidate is built
/// with whole blocks as chunks ([`crate::planner::whole_block_chunk_elems`]): the same bytes
/// cross the same resources as in the finely chunked plan, so its busiest resource bounds the
/// fine plan's time, at a quarter of the ops or less. Candidates whose bound cannot beat
/// `to_beat_us` are dropped; the rest are built at the pipelining chunk
/// ([`crate::planner::pipeline_chunk_elems`]), most promising first, and simulated unless
/// their full lower bound (busiest resource, longest op) already loses to the best so far. A
/// candidate is skipped only when it cannot be faster than one that was simulated and proved,
/// so the fastest correct candidate is always found. Both builds run in parallel.
///
/// Within the budget: once `deadline` passes, candidates not yet built are left out and only
/// the most promising one is still simulated. Also returns the families left out for size.
fn fastest_collectives(
    topo: &Topology,
    req: &Request,
    opts: &PlanOptions,
    to_beat_us: f64,
    deadline: &Deadline,
) -> Result<Fastest> {
    let set =
        crate::planner::Candidates::new(topo, req, &opts.relay)?.with_budget(opts.staging_budget);
    let skipped = set.skipped().to_vec();
    let fine = crate::planner::pipeline_chunk_elems(req).max(1);
    let coarse = crate::planner::whole_block_chunk_elems(req).max(fine);
    // Coarse builds only bound times, so they ignore the budget, unless they are final.
    // The first candidate's builds must give a plan of relaycc's: they get a deadline of
    // their own.
    let prepare = |i: usize, chunk: u64, first: bool| -> Result<(usize, Plan, Prepared)> {
        let build = || {
            if chunk == fine {
                set.build(i, chunk)
            } else {
                set.build_unfitted(i, chunk)
            }
        };
        let plan = if first {
            deadline.limited_first(build)?
        } else {
            deadline.limited(CANDIDATES, build)?
        };
        let prepared = Prepared::new(topo, &plan, &opts.sim)?;
        Ok((i, plan, prepared))
    };
    // The first candidate is always built: a spent budget still returns a plan of relaycc's.
    let coarse_built: Vec<Result<(usize, Plan, Prepared)>> = (0..set.len())
        .into_par_iter()
        .filter(|&i| i == 0 || !deadline.passed())
        .map(|i| prepare(i, coarse, i == 0))
        .collect();
    // A candidate that cannot fit the staging budget is skipped, with its reason listed; the
    // first such error is kept for when nothing (not even the baseline) fits.
    let mut skipped = skipped;
    let mut unfit = None;
    let mut routable = Vec::with_capacity(coarse_built.len());
    let mut no_route = None;
    let mut skip_unfit = |e: RouteError, unfit: &mut Option<RouteError>| {
        skipped.push(format!("over the staging budget: {e}"));
        unfit.get_or_insert(e);
    };
    let mut left_out = Vec::new();
    for b in coarse_built {
        match b {
            Ok(x) => routable.push(x),
            Err(e @ RouteError::StagingBudget { .. }) => skip_unfit(e, &mut unfit),
            Err(e @ RouteError::OverLimit { .. }) => {
                deadline.mark_hit();
                left_out.push(format!("a candidate left out: {e}"));
            }
            Err(e @ RouteError::NoRoute { .. }) => {
                no_route.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if routable.is_empty()
        && unfit.is_none()
        && let Some(e) = no_route
    {
        return Err(e);
    }
    // Where the executor pays for every op it issues, whole blocks may beat the pipelining
    // chunk (a quarter of the ops or fewer): each candidate then also competes at whole
    // blocks, its first build taken as it is where it fits the staging budget.
    let also_coarse = opts.sim.issue_us > 0.0 && coarse != fine;
    let mut first: Vec<(f64, usize, Option<Built>)> = routable
        .into_iter()
        .map(|(i, plan, prepared)| {
            let load = prepared.load_bound_us();
            // Where whole blocks are the pipelining chunk, the first build is the final one.
            (
                load,
                i,
                (coarse == fine || also_coarse).then_some((plan, prepared)),
            )
        })
        .filter(|(load, _, _)| *load < to_beat_us)
        .collect();
    first.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let jobs: Vec<(usize, u64, Option<Built>)> = first
        .into_iter()
        .flat_map(|(_, i, built)| {
            if !also_coarse {
                return vec![(i, fine, built)];
            }
            let fits = built.filter(|(plan, _)| {
                crate::staging::over_budget(plan, opts.staging_budget).is_none()
            });
            vec![(i, fine, None), (i, coarse, fits)]
        })
        .collect();
    let mut fine_plans: Vec<Option<Built>> = Vec::with_capacity(jobs.len());
    let built: Vec<Result<Option<Built>>> = jobs
        .into_par_iter()
        .enumerate()
        .map(|(k, (i, chunk, built))| match built {
            Some(pp) => Ok(Some(pp)),
            None if k > 0 && deadline.passed() => Ok(None),
            None if chunk == fine => prepare(i, fine, k == 0).map(|(_, p, pr)| Some((p, pr))),
            None => {
                let build = || set.build(i, chunk);
                let plan = if k == 0 {
                    deadline.limited_first(build)?
                } else {
                    deadline.limited(CANDIDATES, build)?
                };
                let prepared = Prepared::new(topo, &plan, &opts.sim)?;
                Ok(Some((plan, prepared)))
            }
        })
        .collect();
    for b in built {
        match b {
            Ok(pp) => fine_plans.push(pp),
            Err(e @ RouteError::StagingBudget { .. }) => {
                skip_unfit(e, &mut unfit);
                fine_plans.push(None);
            }
            Err(e @ RouteError::OverLimit { .. }) => {
                deadline.mark_hit();
                left_out.push(format!("a candidate left out: {e}"));
                fine_plans.push(None);
            }
            Err(e) => return Err(e),
        }
    }
    // The most promising first, so the best time found early prunes the rest.
    let mut ranked: Vec<(f64, usize)> = fine_plans
        .iter()
        .enumerate()
        .filter_map(|(k, pp)| pp.as_ref().map(|(_, pr)| (pr.lower_bound_us(), k)))
        .collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut simulated = 0usize;
    let mut cut: Vec<String> = Vec::new();
    let (order, proved) = prune_and_prove(
        &ranked,
        to_beat_us,
        |k| match fine_plans[k].as_ref() {
            Some(_) if simulated > 0 && deadline.passed() => Ok(None),
            Some((plan, prepared)) => {
                let sim = if simulated == 0 {
                    deadline.simulate_with_grace(topo, plan, prepared)?
                } else {
                    prepared.simulate_until(topo, deadline.at)?
                };
                simulated += 1;
                match sim {
                    Some(sim) => Ok(Some(sim.time_us)),
                    None => {
                        deadline.mark_hit();
                        cut.push(format!(
                            "{}: the planning budget ran out while it was simulated",
                            plan.algorithm
                        ));
                        Ok(None)
                    }
                }
            }
            None => Ok(None),
        },
        |k| {
            fine_plans[k]
                .as_ref()
                .is_some_and(|(plan, _)| prove(topo, req, plan).is_ok())
        },
    )?;
    let found = order
        .into_iter()
        .filter_map(|(k, t)| {
            let (plan, _) = fine_plans[k].take()?;
            Some((plan, t, proved == Some(k)))
        })
        .collect();
    skipped.extend(left_out);
    skipped.extend(cut);
    Ok((found, skipped, unfit))
}

/// Simulated `(candidate index, time)` in the order simulated, and the proved winner's index.
type Pruned = (Vec<(usize, f64)>, Option<usize>);

/// The pruned simulation of [`fastest_collectives`] over candidates `ranked` (lower bound,
/// index), most promising first: each is simulated (`simulate`, `None` for a missing one)
/// unless its lower bound already loses to the best time so far (starting at `to_beat_us`).
/// The fastest, when it is not slower than `to_beat_us`, must pass `prove`; one that fails is
/// left out and the pruning run again without it, since its time may have pruned a correct
/// candidate (times already simulated are reused).
///
/// Returns the simulated `(index, time)` in the order simulated and the proved winner's index
/// (the first of the least time), if any.
fn prune_and_prove(
    ranked: &[(f64, usize)],
    to_beat_us: f64,
    mut simulate: impl FnMut(usize) -> Result<Option<f64>>,
    mut prove: impl FnMut(usize) -> bool,
) -> Result<Pruned> {
    let mut times: std::collections::BTreeMap<usize, Option<f64>> = Default::default();
    let mut rejected = std::collections::BTreeSet::new();
    loop {
        let mut best_t = to_beat_us;
        let mut order: Vec<(usize, f64)> = Vec::new();
        for &(lb, k) in ranked {
            if rejected.contains(&k) || lb >= best_t {
                continue;
            }
            let t = match times.get(&k) {
                Some(t) => *t,
                None => {
                    let t = simulate(k)?;
                    times.insert(k, t);
                    t
                }
            };
            let Some(t) = t else { continue };
            best_t = best_t.min(t);
            order.push((k, t));
        }
        let winner = order
            .iter()
            .fold(None, |w: Option<(usize, f64)>, &(k, t)| match w {
                Some((_, wt)) if wt <= t => w,
                _ => Some((k, t)),
            })
            // The baseline, considered after these, wins only when strictly faster.
            .filter(|&(_, t)| t <= to_beat_us)
            .map(|(k, _)| k);
        match winner {
            Some(k) if !prove(k) => {
                rejected.insert(k);
            }
            _ => return Ok((order, winner)),
        }
    }
}

/// What a cached plan is keyed by: the request and the options that change the plan.
type CacheKey = (Request, RelayPolicy, Strategy, u64, bool, u64);

/// A planner bound to one topology, caching results per request and options.
#[derive(Debug)]
pub struct Planner {
    topo: Topology,
    cache: Mutex<HashMap<CacheKey, Arc<Planned>>>,
}

impl Planner {
    /// A planner for `topo` (the mask in force is part of it).
    pub fn new(topo: Topology) -> Self {
        Planner {
            topo,
            cache: Mutex::new(HashMap::new()),
        }
    }
    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }
    /// Plan `req`, from the cache when the same request and options were planned before.
    pub fn plan(&self, req: &Request, opts: &PlanOptions) -> Result<Arc<Planned>> {
        let key = (
            req.clone(),
            opts.relay.clone(),
            opts.strategy,
            opts.staging_budget,
            opts.expand,
            opts.round_bytes,
        );
        if opts.sim == SimConfig::default()
            && let Some(hit) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned())
        {
            return Ok(hit);
        }
        let planned = Arc::new(plan(&self.topo, req, opts)?);
        // A plan cut short by the budget is not kept: a later call may have time for more.
        if opts.sim == SimConfig::default()
            && !planned.budget_exhausted
            && let Ok(mut c) = self.cache.lock()
        {
            c.insert(key, planned.clone());
        }
        Ok(planned)
    }
    /// Number of cached plans.
    pub fn cached(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
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

    fn all_reduce(gpus: u32, bytes: u64) -> Request {
        Request::new(
            Collective::AllReduce,
            (0..gpus).collect(),
            bytes / 4,
            crate::DType::F32,
        )
    }

    #[test]
    fn the_ring_window_estimate_counts_the_rings_ops() {
        // Two periods of hosts: the window is the whole plan.
        let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
        let sym = topo.host_symmetry();
        assert_eq!(sym.periods(), 2);
        for bytes in [1 << 20, 1 << 26, 1 << 30] {
            let req = all_reduce(16, bytes);
            let ring = crate::planner::baseline_plan_algo(
                &topo,
                &req,
                Some(crate::planner::baseline_net::tuner::Algo::Ring),
            )
            .unwrap();
            let est = ring_window_ops_estimate(&topo, &req, &sym) as f64;
            let ops = ring.ops.len() as f64;
            assert!(
                (est - ops).abs() <= 0.1 * ops,
                "{bytes} B: estimated {est}, built {ops}"
            );
        }
    }

    #[test]
    fn the_baseline_folds_only_where_its_window_is_smaller_than_the_plan() {
        // A rail-optimized fabric of two scalable units: two periods, so a window would be the
        // whole plan (NCCL's rings over 512 ranks, 6.3M ops, twice its tree): built in full,
        // whatever the collective, and refused before anything is built.
        let topo = relaycc_topo::preset("cluster:64xdgx-h100:ib-ndr:rail").unwrap();
        let sym = topo.host_symmetry();
        assert_eq!(sym.periods(), 2);
        let req = all_reduce(512, 1 << 30);
        assert!(tree_ops_estimate(&req) < ring_window_ops_estimate(&topo, &req, &sym));
        let mut rs = all_reduce(512, 1 << 30);
        rs.collective = Collective::ReduceScatter;
        rs.count /= 512;
        for r in [&req, &rs] {
            let (folded, why) = baseline_template(
                &topo,
                r,
                crate::staging::DEFAULT_STAGING_BUDGET_BYTES,
                Some(&sym),
                None,
            );
            assert!(folded.is_none());
            assert!(why.iter().any(|w| w.contains("2 periods")), "{why:?}");
        }
        // Three units: the rings' window holds two thirds of their 14M ops, still more than
        // the tree in full.
        let topo = relaycc_topo::preset("cluster:96xdgx-h100:ib-ndr:rail").unwrap();
        let sym = topo.host_symmetry();
        assert_eq!(sym.periods(), 3);
        let req = all_reduce(768, 1 << 30);
        assert!(tree_ops_estimate(&req) < ring_window_ops_estimate(&topo, &req, &sym));
        // One switch: every host a period, and the rings' window holds two of them.
        let topo = relaycc_topo::preset("cluster:16xdgx-h100:ib-ndr").unwrap();
        let sym = topo.host_symmetry();
        let req = all_reduce(128, 1 << 30);
        assert!(ring_window_ops_estimate(&topo, &req, &sym) < tree_ops_estimate(&req) / 4);
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

    /// Candidates 0..4 with lower bounds 1..4 and times 2, 5, 3, 4 (us); 10 us to beat.
    fn run(reject: &[usize]) -> (Vec<(usize, f64)>, Option<usize>, Vec<usize>) {
        let ranked = [(1.0, 0), (2.0, 1), (3.0, 2), (4.0, 3)];
        let times = [2.0, 5.0, 3.0, 4.0];
        let mut simulated = Vec::new();
        let (order, winner) = prune_and_prove(
            &ranked,
            10.0,
            |k| {
                simulated.push(k);
                Ok(Some(times[k]))
            },
            |k| !reject.contains(&k),
        )
        .unwrap();
        (order, winner, simulated)
    }

    #[test]
    fn the_fastest_is_proved_and_prunes_the_rest() {
        let (order, winner, simulated) = run(&[]);
        assert_eq!(winner, Some(0));
        // Candidate 0's 2 us prunes every lower bound from 2 us on.
        assert_eq!(order, vec![(0, 2.0)]);
        assert_eq!(simulated, vec![0]);
    }

    #[test]
    fn a_fastest_that_fails_the_proof_is_dropped_and_the_pruned_are_simulated() {
        let (order, winner, simulated) = run(&[0]);
        // Without candidate 0, candidate 1 (5 us) does not prune 2 (3 us), which wins.
        assert_eq!(winner, Some(2));
        assert_eq!(order, vec![(1, 5.0), (2, 3.0)]);
        // Each candidate is simulated once.
        assert_eq!(simulated, vec![0, 1, 2]);
        let (order, winner, _) = run(&[0, 2]);
        assert_eq!(winner, Some(3));
        assert_eq!(order, vec![(1, 5.0), (3, 4.0)]);
    }

    #[test]
    fn nothing_wins_when_every_candidate_fails_or_loses_to_the_baseline() {
        let (_, winner, _) = run(&[0, 1, 2, 3]);
        assert_eq!(winner, None);
        let (order, winner) =
            prune_and_prove(&[(1.0, 0)], 1.5, |_| Ok(Some(2.0)), |_| true).unwrap();
        assert_eq!((order, winner), (vec![(0, 2.0)], None));
    }

    /// The tuner's simulation of the baseline is taken where it stands for the one the
    /// planner would make, and the plan is simulated again where it does not.
    #[test]
    fn the_tuners_simulation_of_the_baseline_is_reused_where_it_stands_for_the_planners() {
        use crate::planner::baseline::{TUNE_SIMULATION_CAP, TunedTime};
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::new(
            Collective::AllReduce,
            (0..8).collect(),
            1 << 20,
            crate::DType::F32,
        );
        let plan = crate::planner::baseline_plan(&topo, &req).unwrap();
        let real = simulate(&topo, &plan, &SimConfig::default())
            .unwrap()
            .time_us;
        let opts = PlanOptions::default();
        let deadline = Deadline::new(opts.budget);
        let whole = TunedTime {
            time_us: 1234.5,
            cut: None,
            spent: Duration::from_millis(1),
        };
        // A simulation that ran to the end with the same settings is taken as it is.
        assert_eq!(
            simulate_baseline(&topo, &plan, &opts, Some(whole), &deadline).unwrap(),
            (1234.5, None)
        );
        assert_eq!(
            simulate_baseline(&topo, &plan, &opts, None, &deadline).unwrap(),
            (real, None)
        );
        // Other settings: simulated again with them.
        let costly = PlanOptions {
            sim: SimConfig {
                issue_us: 1.0,
                ..SimConfig::default()
            },
            ..PlanOptions::default()
        };
        let (t, cut) = simulate_baseline(&topo, &plan, &costly, Some(whole), &deadline).unwrap();
        assert!(t > real && cut.is_none(), "{t} vs {real}");
        // A cut simulation stands only for a large plan that ran at least as long as the
        // planner's could; this small plan is simulated to the end instead.
        let cut = TunedTime {
            time_us: 1.0,
            cut: Some(SimCut {
                reached_us: 1.0,
                ops_done: 1,
                ops: plan.ops.len(),
            }),
            spent: TUNE_SIMULATION_CAP,
        };
        assert!(plan.ops.len() < GRACE_ABOVE_OPS);
        assert_eq!(
            simulate_baseline(&topo, &plan, &opts, Some(cut), &deadline).unwrap(),
            (real, None)
        );
        // A large plan's cut simulation stands where it ran as long as the planner's could,
        // not where the planner has more time left.
        let second = Duration::from_secs(1);
        assert!(tuned_stands(&cut, GRACE_ABOVE_OPS, second));
        assert!(!tuned_stands(
            &cut,
            GRACE_ABOVE_OPS,
            TUNE_SIMULATION_CAP + second
        ));
        assert!(!tuned_stands(&cut, GRACE_ABOVE_OPS - 1, second));
        assert!(tuned_stands(&whole, 1, Duration::MAX));
    }
}
