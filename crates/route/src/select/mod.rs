//! The orchestrator: generate candidates, time each with the simulator, keep the fastest, and
//! report it beside the NCCL-like baseline and the bound. [`Planner`] caches results per
//! request shape for one topology.
//!
//! [`plan`] runs in named phases ([`Selection`]): the baseline phase builds the NCCL-like
//! baseline (and, where the hosts repeat, relaycc's templates beside it,
//! `baseline_choice.rs`); the candidates phase simulates the baseline and builds and times
//! relaycc's candidates (`candidates.rs`); then the winner is chosen and proved
//! (`proof.rs`) and checked against the bound. `deadline.rs` holds the call's clock,
//! `options.rs` what a caller may set.

mod baseline_choice;
mod candidates;
mod deadline;
mod options;
mod proof;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use relaycc_topo::{HostSymmetry, Topology};
use serde::{Deserialize, Serialize};

use relaycc_plan::Plan;
use relaycc_plan::path::RelayPolicy;
use relaycc_plan::rounds::{Split, assemble, rounds_us};
use relaycc_plan::{Collective, Request};
use relaycc_plan::{Result, RouteError};
use relaycc_planners::baseline::{TunedPlan, TunedTime};
use relaycc_planners::p2p::{P2pStrategy, RouteShare, p2p_bound_gbps, p2p_candidates_until};
use relaycc_sim::{Perf, SimConfig, SimCut, simulate};

use baseline_choice::{baseline_template, simulate_baseline};
use candidates::{Fastest, fastest_collectives, fastest_templates};
use deadline::{BASELINE, Deadline, GRACE_ABOVE_OPS};
pub use options::PlanOptions;
use proof::prove;
pub use proof::{EXPAND_MAX_RANKS, SAMPLED_PROOF_ABOVE_CLOCK_BYTES, proved_by_checker};

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
    /// ops or more is simulated until the deadline, or for [`relaycc_planners::LEAST_SIMULATION_GRACE`] where
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
/// than the NCCL-like planner. A step-sampled baseline ([`relaycc_plan::step_samples`]: NCCL's rings
/// too large to build, timed from samples of their steps) competes by its extrapolated time;
/// where it wins, the answer is that NCCL's rings are the fastest known, and its plan, like a
/// template, is for prediction only (the checker refuses it, no executor runs it). Ties go to
/// the earlier candidate, which keeps planning deterministic. When every rank is an arena of one memory
/// ([`Topology::shares_memory`]: one host's, the `host-N` preset, or one GPU's, the
/// `shared-gpu-N` preset), or there is one rank, the plan is the shared-memory
/// planner's ([`relaycc_planners::shared_memory`]). No plan is returned unproved: the checker
/// ([`relaycc_plan::check()`] and [`relaycc_plan::check_routes`]) passes the winner and the baseline before
/// they are returned. A candidate that fails is dropped, and the next fastest is proved in its
/// place (for collectives the pruned selection runs again without it).
///
/// # Errors
/// - those of [`relaycc_planners::require_reachable`]: a malformed request, an unknown relay GPU, a
///   masked member, a member pair no path joins;
/// - [`RouteError::NoRoute`] when no candidate finds routes;
/// - [`RouteError::PlanCheck`] when no candidate passes the checker (a planner bug);
/// - [`RouteError::AboveBound`] when the winner is predicted faster than the bound allows;
/// - [`RouteError::StagingBudget`] when no candidate fits `opts.staging_budget` (candidates
///   that do not fit are skipped; the NCCL-like baseline is then still reported, built without
///   the budget, but never chosen).
pub fn plan(topo: &Topology, req: &Request, opts: &PlanOptions) -> Result<Planned> {
    if let Some(split) = relaycc_plan::rounds::split(req, opts.round_bytes)? {
        return plan_rounds(topo, req, opts, split);
    }
    let deadline = Deadline::new(opts.budget);
    relaycc_planners::require_reachable(topo, req, &opts.relay)?;
    let shift = fold_shift(topo, req).filter(|_| !opts.expand);
    refuse_past_the_call_ops(req, shift.as_ref())?;
    let selection = Selection {
        topo,
        req,
        opts,
        deadline: &deadline,
        shift: shift.as_ref(),
    };
    let mut skipped: Vec<String> = Vec::new();
    // The first reason a candidate (or the baseline) could not be chosen, for when none is.
    let mut first_failure = None;
    let BaselinePhase {
        baseline,
        early_proof,
        templates,
    } = selection.baseline_phase(&mut skipped, &mut first_failure)?;
    // The baseline is proved while it is simulated (a large one for a budget's time of its
    // own, `simulate_baseline`; one cut there is known from below) and, after that, while
    // relaycc's candidates are built and simulated: they need its time, not its proof, which
    // is awaited at the end.
    let (baseline_proof, found) = rayon::join(
        || match early_proof {
            Some(proof) => proof,
            None => prove(topo, req, &baseline.plan),
        },
        || selection.candidates_phase(&baseline, templates, &mut skipped, &mut first_failure),
    );
    baseline_proof?;
    let mut found = found?;
    if found.baseline_cut.is_some() {
        found.baseline_time_us = cut_baseline_us(found.baseline_time_us, req, found.bound_gbps);
    }
    let (winner, candidates) = selection.choose_winner(&baseline, &mut found, &mut first_failure);
    let Some((time, plan, routes)) = winner else {
        return Err(first_failure.unwrap_or_else(|| RouteError::NoRoute {
            what: req.collective.to_string(),
            why: "no candidate plan".into(),
        }));
    };
    let (predicted, bound) = selection.check_bound(&plan, time, found.bound_gbps)?;
    Ok(Planned {
        plan,
        predicted,
        baseline_plan: baseline.plan,
        baseline: Perf::from_time(req, found.baseline_time_us),
        baseline_cut: found.baseline_cut,
        bound,
        candidates,
        routes,
        budget_exhausted: deadline.was_hit(),
        elapsed: deadline.elapsed(),
        skipped,
    })
}

/// Share of the budget a point-to-point request may spend searching relays
/// ([`relaycc_planners::p2p::p2p_candidates`]).
const RELAY_SEARCH_SHARE: f64 = 0.5;

/// One planning call as its phases see it: the request, its options, its clock and the shift
/// of hosts its plans fold by (none where they are built in full).
struct Selection<'a> {
    topo: &'a Topology,
    req: &'a Request,
    opts: &'a PlanOptions,
    deadline: &'a Deadline,
    shift: Option<&'a HostSymmetry>,
}

/// The NCCL-like baseline as the baseline phase leaves it.
struct Baseline {
    plan: Plan,
    /// Whether it fits the staging budget: one that does not is reported, never chosen.
    fits: bool,
    /// The tuner's simulation of it, where it stands for the one made here.
    tuned: Option<TunedTime>,
}

/// What the baseline phase leaves.
struct BaselinePhase {
    baseline: Baseline,
    /// The baseline's proof, where it was proved beside the templates.
    early_proof: Option<Result<()>>,
    /// Relaycc's templates built beside the baseline, where the hosts repeat.
    templates: Option<Result<Fastest>>,
}

/// A plan of relaycc's found in the candidates phase: the plan, its routes (point to point),
/// its simulated time (us) and whether the checker proved it already.
type Found = (Plan, Vec<RouteShare>, f64, bool);

/// What the candidates phase found.
struct CandidatesFound {
    /// The baseline's simulated time (us): where `baseline_cut` is set, a lower bound.
    baseline_time_us: f64,
    /// How far the baseline's simulation got where the budget cut it.
    baseline_cut: Option<SimCut>,
    /// Relaycc's plans, in the order they were considered.
    plans: Vec<Found>,
    /// Whether the ranks are arenas of one host's memory (the shared-memory planner's plan).
    shared_memory: bool,
    /// The request's bound, GB/s of algorithm bandwidth.
    bound_gbps: f64,
}

/// The chosen plan: its simulated time (us), the plan and its routes.
type Winner = (f64, Plan, Vec<RouteShare>);

impl Selection<'_> {
    /// The baseline phase: build the baseline (as a template or in full) and, beside it where
    /// the hosts repeat, relaycc's templates. Templates need nothing of the baseline: they are
    /// built and simulated while the baseline is built, and go on while it is and a budget
    /// after (`Deadline::grace_goes_on`); their result (or error) is taken where it is asked.
    /// A baseline over the staging budget is still built, without it, and reported, but is no
    /// candidate.
    fn baseline_phase(
        &self,
        skipped: &mut Vec<String>,
        first_failure: &mut Option<RouteError>,
    ) -> Result<BaselinePhase> {
        let templated = self
            .shift
            .filter(|_| !self.one_memory() && !is_p2p(self.req));
        let ((folded, why, early_proof), templates) = rayon::join(
            || self.build_baseline(templated.is_some()),
            || {
                templated.map(|sym| {
                    fastest_templates(self.topo, self.req, self.opts, sym, self.deadline)
                })
            },
        );
        skipped.extend(why);
        let (built, tuned) = match folded {
            Ok(t) => (Ok(t.plan), t.tuned),
            Err(e) => (Err(e), None),
        };
        let (plan, fits) = match built {
            Ok(p) => (p, true),
            Err(e @ RouteError::StagingBudget { .. }) => {
                *first_failure = Some(e);
                let unfitted = self.deadline.limited(BASELINE, |limit| {
                    relaycc_planners::BaselineOptions {
                        limit: Some(limit),
                        ..Default::default()
                    }
                    .plan(self.topo, self.req)
                });
                (unfitted?, false)
            }
            Err(e) => return Err(e),
        };
        let baseline = Baseline {
            plan,
            fits,
            // The tuner's simulation of the plan, where it stands for the one made here.
            tuned: tuned.filter(|_| fits),
        };
        Ok(BaselinePhase {
            baseline,
            early_proof,
            templates,
        })
    }

    /// Build the baseline within its share of the budget: its template where it folds
    /// ([`baseline_template`]), else in full; proved here where `prove_here` (templates are
    /// simulated beside it meanwhile). Returns it, the reasons for what it left out, and its
    /// proof where it was proved.
    fn build_baseline(
        &self,
        prove_here: bool,
    ) -> (Result<TunedPlan>, Vec<String>, Option<Result<()>>) {
        let (topo, req) = (self.topo, self.req);
        let budget = self.opts.staging_budget;
        let until = self.deadline.at();
        let (folded, why) = self.deadline.limited(BASELINE, |limit| {
            baseline_template(topo, req, budget, self.shift, until, Some(limit))
        });
        // A baseline that does not fold is built in full here, beside the templates.
        let built = match folded {
            Some(built) => built,
            None => self.deadline.limited(BASELINE, |limit| {
                relaycc_planners::BaselineOptions {
                    staging_budget: Some(budget),
                    until,
                    limit: Some(limit),
                    ..Default::default()
                }
                .build(topo, req)
            }),
        };
        let built = match built {
            // Its last steps (the tuner's timed simulations, a staging fit's last try) do not
            // read the clock: a large baseline done past its deadline would be proved and
            // simulated past the budget, so the call stops as if its build had.
            Ok(t) if t.plan.ops.len() >= GRACE_ABOVE_OPS && self.deadline.baseline_late() => {
                let ops = t.plan.ops.len();
                relaycc_planners::limits::drop_off_thread(t);
                Err(RouteError::OverLimit {
                    what: format!(
                        "{BASELINE} was built past its deadline ({ops} ops), too late to prove \
                         and time it within the budget"
                    ),
                    limit: "the planning budget; a larger --budget builds it".into(),
                })
            }
            other => other,
        };
        self.deadline
            .baseline_built(matches!(built, Err(RouteError::OverLimit { .. })));
        // Proved here, while the templates beside it may still be simulated.
        let proof = match &built {
            Ok(t) if prove_here => Some(prove(topo, req, &t.plan)),
            _ => None,
        };
        (built, why, proof)
    }

    /// The candidates phase: simulate the baseline, then find relaycc's plans, by the kind
    /// of request: ranks in one host's memory ([`Selection::shared_memory_plan`]), point to
    /// point ([`Selection::p2p_plans`]) or a collective ([`Selection::collective_plans`],
    /// taking the templates the baseline phase built where it built them).
    fn candidates_phase(
        &self,
        baseline: &Baseline,
        templates: Option<Result<Fastest>>,
        skipped: &mut Vec<String>,
        first_failure: &mut Option<RouteError>,
    ) -> Result<CandidatesFound> {
        let (baseline_time_us, baseline_cut) = simulate_baseline(
            self.topo,
            &baseline.plan,
            self.opts,
            baseline.tuned,
            self.deadline,
        )?;
        if baseline_cut.is_some() {
            self.deadline.mark_hit();
        }
        // Ranks that are arenas of one memory (`host-N`, `shared-gpu-N`): the simulator
        // models links, not one shared memory and its caches, so it cannot rank algorithms
        // there; the shared-memory planner is used directly, and still reported beside
        // baseline and bound.
        let shared_memory = self.one_memory();
        let (bound_gbps, plans) = if shared_memory {
            self.shared_memory_plan()?
        } else if is_p2p(self.req) {
            self.p2p_plans(first_failure)?
        } else {
            // A baseline known only from below is beaten only by a plan no slower than that
            // bound (raised to the request's bound below), so a candidate whose own bound
            // is above it cannot win; ties can, hence the rounding slack.
            let to_beat = |bound_gbps| match (baseline.fits, baseline_cut) {
                (true, None) => baseline_time_us,
                (true, Some(_)) => {
                    cut_baseline_us(baseline_time_us, self.req, bound_gbps) * (1.0 + 1e-9)
                }
                (false, _) => f64::INFINITY,
            };
            self.collective_plans(to_beat, templates, skipped, first_failure)?
        };
        Ok(CandidatesFound {
            baseline_time_us,
            baseline_cut,
            plans,
            shared_memory,
            bound_gbps,
        })
    }

    /// Whether the request's ranks are arenas of one memory, or one rank: the shared-memory
    /// planner's case, whose one-rank plans are a single copy (or nothing) whatever the
    /// machine.
    fn one_memory(&self) -> bool {
        self.req.gpus.len() == 1 || self.topo.shares_memory(&self.req.gpus)
    }

    /// The bound and the shared-memory planner's plan, for ranks in one host's memory; over
    /// the staging budget it is an error.
    fn shared_memory_plan(&self) -> Result<(f64, Vec<Found>)> {
        let (topo, req, opts) = (self.topo, self.req, self.opts);
        let bound_gbps = if is_p2p(req) {
            p2p_bound_gbps(topo, req, &opts.relay)?
        } else {
            relaycc_planners::bound_gbps(topo, req, &opts.relay)?
        };
        let p = relaycc_planners::shared_memory::plan(topo, req, false)?;
        let budget = opts.staging_budget;
        if let Some((at, needed)) = relaycc_planners::staging::over_budget(&p, budget) {
            return Err(relaycc_planners::staging::budget_error(
                &p, at, needed, budget,
            ));
        }
        let t = simulate(topo, &p, &opts.sim)?.time_us;
        Ok((bound_gbps, vec![(p, Vec::new(), t, false)]))
    }

    /// The max-flow bound and the point-to-point candidates within the staging budget, each
    /// simulated; one over it is left out, its error kept in `first_failure`.
    fn p2p_plans(&self, first_failure: &mut Option<RouteError>) -> Result<(f64, Vec<Found>)> {
        let (topo, req, opts) = (self.topo, self.req, self.opts);
        let budget = opts.staging_budget;
        let bound_gbps = p2p_bound_gbps(topo, req, &opts.relay)?;
        let until = self.deadline.at();
        // Relays are searched for half the budget at most: the candidates found must still be
        // simulated, and a relay rarely wins where the search is long (a cluster's fabric,
        // which every relay crosses as the direct route does).
        let relays_until = self.deadline.at_share(RELAY_SEARCH_SHARE);
        let cands = match p2p_candidates_until(topo, req, &opts.relay, opts.strategy, relays_until)
        {
            Ok((cands, cut)) => {
                if cut {
                    self.deadline.mark_hit();
                }
                cands
            }
            // A forced strategy with no route falls through to the baseline only when Auto.
            Err(e) if opts.strategy != P2pStrategy::Auto => return Err(e),
            Err(_) => Vec::new(),
        };
        let mut fits = Vec::with_capacity(cands.len());
        for c in cands {
            match relaycc_planners::staging::over_budget(&c.plan, budget) {
                Some((at, needed)) => {
                    let e = relaycc_planners::staging::budget_error(&c.plan, at, needed, budget);
                    first_failure.get_or_insert(e);
                }
                None => fits.push(c),
            }
        }
        // Simulated in the order of their routes' bound (each route's elements at its
        // bottleneck rate), so that a deadline that stops them keeps the most promising; the
        // first is always simulated, and the plans keep the candidates' order.
        let esize = req.dtype.size() as f64;
        let route_bound_us = |c: &relaycc_planners::p2p::P2pCandidate| {
            c.routes
                .iter()
                .map(|r| r.elements as f64 * esize / (r.route.gbps() * 1e3))
                .fold(0.0f64, f64::max)
        };
        let mut order: Vec<usize> = (0..fits.len()).collect();
        order.sort_by(|&x, &y| route_bound_us(&fits[x]).total_cmp(&route_bound_us(&fits[y])));
        let mut times: Vec<Option<f64>> = vec![None; fits.len()];
        for (k, &i) in order.iter().enumerate() {
            if k > 0 && until.is_some_and(|u| Instant::now() >= u) {
                self.deadline.mark_hit();
                break;
            }
            times[i] = Some(simulate(topo, &fits[i].plan, &opts.sim)?.time_us);
        }
        let plans = fits
            .into_iter()
            .zip(times)
            .filter_map(|(c, t)| Some((c.plan, c.routes, t?, false)))
            .collect();
        Ok((bound_gbps, plans))
    }

    /// The bound and relaycc's collective candidates, simulated: the templates built in the
    /// baseline phase (or built now) where the hosts repeat, else the pruned search of
    /// [`fastest_collectives`] against the time `to_beat` gives for the bound.
    fn collective_plans(
        &self,
        to_beat: impl Fn(f64) -> f64,
        templates: Option<Result<Fastest>>,
        skipped: &mut Vec<String>,
        first_failure: &mut Option<RouteError>,
    ) -> Result<(f64, Vec<Found>)> {
        let (topo, req, opts) = (self.topo, self.req, self.opts);
        let bound_gbps = relaycc_planners::bound_gbps(topo, req, &opts.relay)?;
        let (fast, left_out, unfit) = match self.shift {
            Some(sym) => match templates {
                Some(r) => r?,
                None => fastest_templates(topo, req, opts, sym, self.deadline)?,
            },
            None => fastest_collectives(topo, req, opts, to_beat(bound_gbps), self.deadline)?,
        };
        skipped.extend(left_out);
        if let Some(e) = unfit {
            first_failure.get_or_insert(e);
        }
        let plans = fast
            .into_iter()
            .map(|(plan, time_us, proved)| (plan, Vec::new(), time_us, proved))
            .collect();
        Ok((bound_gbps, plans))
    }

    /// Choose and prove the winner: the fastest plan found (the baseline among them, unless
    /// its simulation was cut, it is over the staging budget, or a forced point-to-point
    /// strategy leaves it out) that passes the proof; one that fails is dropped, its error
    /// kept in `first_failure`, and the next fastest proved in its place. Against a baseline
    /// known only from below, only a plan no slower than that bound may win, and where none
    /// is, the baseline is the plan, predicted by its bound. A step-sampled baseline competes
    /// by its extrapolated time; proved already (its shape and samples), it is never proved
    /// again. Returns the winner, if any, and every candidate's time, fastest first.
    fn choose_winner(
        &self,
        baseline: &Baseline,
        found: &mut CandidatesFound,
        first_failure: &mut Option<RouteError>,
    ) -> (Option<Winner>, Vec<CandidateTime>) {
        let (req, opts) = (self.req, self.opts);
        let baseline_time_us = found.baseline_time_us;
        let cut = found.baseline_cut.is_some();
        let mut plans = std::mem::take(&mut found.plans);
        if baseline.fits
            && !cut
            && !found.shared_memory
            && (opts.strategy == P2pStrategy::Auto || !is_p2p(req))
        {
            plans.push((baseline.plan.clone(), Vec::new(), baseline_time_us, true));
        }
        // Fastest first; the stable sort keeps ties in the order they were considered.
        plans.sort_by(|a, b| a.2.total_cmp(&b.2));
        let mut winner = None;
        let mut candidates = Vec::with_capacity(plans.len());
        for (plan, routes, time_us, proved) in plans {
            // Against a baseline known only from below, a plan is shown no slower only within
            // that bound; the others are reported, not chosen.
            let beats_cut = !cut || time_us <= baseline_time_us;
            let proof = if proved || winner.is_some() || !beats_cut {
                Ok(())
            } else {
                prove(self.topo, req, &plan)
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
        if winner.is_none() && cut && baseline.fits {
            // Nothing shown faster within the budget: the baseline (proved above) is the plan,
            // predicted by its lower bound.
            candidates.push(CandidateTime {
                algorithm: baseline.plan.algorithm.clone(),
                time_us: baseline_time_us,
            });
            candidates.sort_by(|a, b| a.time_us.total_cmp(&b.time_us));
            winner = Some((baseline_time_us, baseline.plan.clone(), Vec::new()));
        }
        (winner, candidates)
    }

    /// The bound check: the winner's prediction (`time_us` for `plan`) and the request's
    /// bound; a prediction faster than the bound allows is a wrong figure, an error.
    fn check_bound(&self, plan: &Plan, time_us: f64, bound_gbps: f64) -> Result<(Perf, Perf)> {
        let req = self.req;
        let predicted = Perf::from_time(req, time_us);
        let bound = Perf::from_time(
            req,
            if bound_gbps > 0.0 {
                req.size_bytes() as f64 / (bound_gbps * 1e3)
            } else {
                f64::INFINITY
            },
        );
        // Relative slack for rounding in the simulator's sums; anything beyond is a wrong
        // figure. (`bound_gbps` is infinite when nothing has to move, which `bound` shows as 0.)
        if predicted.algbw_gbps > bound_gbps * (1.0 + 1e-9) {
            return Err(RouteError::AboveBound {
                algorithm: plan.algorithm.clone(),
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
        Ok((predicted, bound))
    }
}

/// Refuse at once a request that no plan could hold within the ops of one planning call
/// ([`relaycc_planners::limits::MAX_CALL_OPS`]), before anything is built: an all_to_all's n(n - 1)
/// pieces (per period of hosts, for a template) each start in their own place and move at
/// least once, so every plan of it, the baseline's too, holds at least that many copies.
fn refuse_past_the_call_ops(req: &Request, shift: Option<&HostSymmetry>) -> Result<()> {
    if !matches!(req.collective, Collective::AllToAll | Collective::AllToAllV) {
        return Ok(());
    }
    let n = req.nranks() as u64;
    let pieces = n.saturating_mul(n.saturating_sub(1));
    let periods = shift.map_or(1, |s| u64::from(s.periods()).max(1));
    let ops = pieces / periods;
    let max = relaycc_planners::limits::MAX_CALL_OPS;
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

/// The host symmetry to fold `req`'s plans by: above [`EXPAND_MAX_RANKS`] ranks, on a
/// topology whose hosts repeat, with ranks that are the same on every period of hosts.
fn fold_shift(topo: &Topology, req: &Request) -> Option<HostSymmetry> {
    if req.nranks() <= EXPAND_MAX_RANKS {
        return None;
    }
    // Members on one host are the same on no other period of hosts: the symmetry, a pass
    // over the whole topology (0.5 s on 1,024 GB200 racks), is not worked out for them.
    let host = |g: &u32| topo.gpu(*g).ok().map(|id| topo.node(id).host);
    let first = req.gpus.first().and_then(host);
    if req.gpus.iter().all(|g| host(g) == first) {
        return None;
    }
    let sym = topo.host_symmetry();
    (!sym.is_trivial() && relaycc_planners::template::ranks_invariant(&sym, &req.gpus))
        .then_some(sym)
}

/// What a cached plan is keyed by: the request and the options that change the plan.
type CacheKey = (Request, RelayPolicy, P2pStrategy, u64, bool, u64);

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

/// Plan `req` as the rounds of `split`: the body's request and the tail's planned with
/// [`crate::plan()`] under `opts` (side by side, each within the budget), combined:
/// the plan and the baseline are plans of rounds of theirs ([`relaycc_plan::rounds::assemble`]), every figure
/// `count` times the body's plus the tail's, each candidate of the body with the tail's
/// winner. A baseline cut by the budget in either segment is cut here, and reported by the
/// body's cut where the body's was (else the tail's).
fn plan_rounds(
    topo: &Topology,
    req: &Request,
    opts: &PlanOptions,
    split: Split,
) -> Result<Planned> {
    let started = Instant::now();
    let Split { count, body, tail } = split;
    let (body, tail) = rayon::join(
        || plan(topo, &body, opts),
        || tail.as_ref().map(|t| plan(topo, t, opts)),
    );
    let body = body?;
    let tail = tail.transpose()?;
    let t = tail.as_ref();
    let time = |b: &Perf, t: Option<&Perf>| rounds_us(count, b.time_us, t.map(|p| p.time_us));
    let predicted = Perf::from_time(req, time(&body.predicted, t.map(|t| &t.predicted)));
    let baseline = Perf::from_time(req, time(&body.baseline, t.map(|t| &t.baseline)));
    let bound = Perf::from_time(req, time(&body.bound, t.map(|t| &t.bound)));
    let tail_us = t.map(|t| t.predicted.time_us);
    let mut candidates: Vec<CandidateTime> = body
        .candidates
        .iter()
        .map(|c| CandidateTime {
            algorithm: format!("{count} rounds of [{}]", c.algorithm),
            time_us: rounds_us(count, c.time_us, tail_us),
        })
        .collect();
    candidates.sort_by(|a, b| a.time_us.total_cmp(&b.time_us));
    let routes = merged_routes(count, &body.routes, t.map_or(&[], |t| &t.routes));
    let mut skipped = body.skipped.clone();
    for s in t.map_or(&[][..], |t| &t.skipped) {
        if !skipped.contains(s) {
            skipped.push(s.clone());
        }
    }
    let baseline_cut = body.baseline_cut.or(t.and_then(|t| t.baseline_cut));
    let budget_exhausted = body.budget_exhausted || t.is_some_and(|t| t.budget_exhausted);
    let (tail_plan, tail_baseline) = match tail {
        Some(t) => (Some(t.plan), Some(t.baseline_plan)),
        None => (None, None),
    };
    Ok(Planned {
        plan: assemble(req, count, body.plan, tail_plan),
        predicted,
        baseline_plan: assemble(req, count, body.baseline_plan, tail_baseline),
        baseline,
        baseline_cut,
        bound,
        candidates,
        routes,
        budget_exhausted,
        elapsed: started.elapsed(),
        skipped,
    })
}

/// The routes of `count` rounds of `body`'s and `tail`'s: each route once, with the elements
/// every segment moves over it.
fn merged_routes(count: u64, body: &[RouteShare], tail: &[RouteShare]) -> Vec<RouteShare> {
    let mut out: Vec<RouteShare> = body
        .iter()
        .map(|r| RouteShare {
            route: r.route.clone(),
            elements: r.elements.saturating_mul(count),
        })
        .collect();
    for t in tail {
        match out.iter_mut().find(|r| r.route == t.route) {
            Some(r) => r.elements = r.elements.saturating_add(t.elements),
            None => out.push(t.clone()),
        }
    }
    out
}
