//! Relaycc's collective candidates in a planning call: built (as templates where the hosts
//! repeat), pruned by their bounds, simulated most promising first, and the fastest proved.

use rayon::prelude::*;
use relaycc_topo::Topology;

use relaycc_plan::Plan;
use relaycc_plan::Request;
use relaycc_plan::{Result, RouteError};
use relaycc_sim::PreparedSim;

use super::deadline::{CANDIDATES, Deadline, GRACE_ABOVE_OPS};
use super::options::PlanOptions;
use super::proof::prove;

/// A template built and lowered for the simulator, and its simulated time where it was
/// simulated as soon as it was built (`Some(None)`: it gave up).
type Prepared = (Plan, PreparedSim, Option<Option<f64>>);

/// The collective candidates as templates folded by `shift`, each simulated (plan, time, not
/// yet proved); a candidate that is not the same on every period of hosts is skipped with its
/// reason, one over the staging budget too.
pub(super) fn fastest_templates(
    topo: &Topology,
    req: &Request,
    opts: &PlanOptions,
    shift: &relaycc_topo::HostSymmetry,
    deadline: &Deadline,
) -> Result<Fastest> {
    let set =
        relaycc_planners::Candidates::new(topo, req, &opts.relay)?.with_budget(opts.staging_budget);
    let mut skipped = set.skipped().to_vec();
    let fine = relaycc_planners::pipeline_chunk_elems(req).max(1);
    // The first candidate (built under `limited_first`: the one that must give a plan of
    // relaycc's) is simulated, with its grace, as soon as it is built: waiting for the others'
    // builds took that time from it (on 64 rail-optimized nodes a second template built for
    // 1.1 s before it passed the op limit, and the first's simulation then missed the budget).
    let prepared: Vec<Result<Prepared>> = (0..set.len())
        .into_par_iter()
        .map(|i| {
            let build = |limit: &relaycc_planners::limits::Limit| {
                set.build_template(i, fine, shift, Some(limit))
            };
            let plan = if i == 0 {
                deadline.limited_first(build)?
            } else {
                deadline.limited(CANDIDATES, build)?
            };
            let prepared = PreparedSim::new(topo, &plan, &opts.sim)?;
            let sim = match i {
                0 => Some(
                    deadline
                        .simulate_with_grace(topo, &plan, &prepared)?
                        .map(|sim| sim.time_us),
                ),
                _ => None,
            };
            Ok((plan, prepared, sim))
        })
        .collect();
    // Where the first could not be built, the most promising of the others (least lower
    // bound) has a budget's time of its own to simulate; the others go on while planning
    // waits for the baseline anyway, or until the deadline, so that the CPUs go to the one
    // that must give a plan of relaycc's.
    let first = match prepared.first() {
        Some(Ok(_)) => None,
        _ => prepared
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().ok().map(|(_, pr, _)| (pr.lower_bound_us(), i)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, i)| i),
    };
    let built: Vec<Result<(Plan, Option<f64>)>> = prepared
        .into_par_iter()
        .enumerate()
        .map(|(i, b)| {
            let (plan, prepared, simulated) = b?;
            let sim = match simulated {
                Some(t) => t,
                None if Some(i) == first || plan.ops.len() < GRACE_ABOVE_OPS => deadline
                    .simulate_with_grace(topo, &plan, &prepared)?
                    .map(|sim| sim.time_us),
                None => prepared
                    .simulate_while(topo, &|| deadline.beside_goes_on())?
                    .map(|sim| sim.time_us),
            };
            Ok((plan, sim))
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
pub(super) type Simulated = (Plan, f64, bool);

/// A candidate built and lowered for the simulator.
type Built = (Plan, PreparedSim);

/// The collective candidates simulated (plan, time, proved), and the first reason a candidate
/// was skipped for the staging budget.
pub(super) type Fastest = (Vec<Simulated>, Vec<String>, Option<RouteError>);

/// The collective candidates worth simulating, each with its simulated time and whether the
/// checker proved it, in the order they were simulated; `to_beat_us` is the time they must
/// beat (the baseline's). The fastest is proved (and flagged); one that fails the checker is
/// left out and the selection run again without it.
///
/// Two stages keep planning cheap without changing the winner. First every candidate is built
/// with whole blocks as chunks ([`relaycc_planners::whole_block_chunk_elems`]): the same bytes
/// cross the same resources as in the finely chunked plan, so its busiest resource bounds the
/// fine plan's time, at a quarter of the ops or less. Candidates whose bound cannot beat
/// `to_beat_us` are dropped; the rest are built at the pipelining chunk
/// ([`relaycc_planners::pipeline_chunk_elems`]), most promising first, and simulated unless
/// their full lower bound (busiest resource, longest op) already loses to the best so far. A
/// candidate is skipped only when it cannot be faster than one that was simulated and proved,
/// so the fastest correct candidate is always found. Both builds run in parallel. The passes:
/// [`CollectiveSearch::coarse_pass`], [`CollectiveSearch::fine_jobs`],
/// [`CollectiveSearch::fine_pass`], [`CollectiveSearch::simulate_and_prove`].
///
/// Within the budget: once `deadline` passes, candidates not yet built are left out and only
/// the most promising one is still simulated. Also returns the families left out for size.
pub(super) fn fastest_collectives(
    topo: &Topology,
    req: &Request,
    opts: &PlanOptions,
    to_beat_us: f64,
    deadline: &Deadline,
) -> Result<Fastest> {
    let set =
        relaycc_planners::Candidates::new(topo, req, &opts.relay)?.with_budget(opts.staging_budget);
    let fine = relaycc_planners::pipeline_chunk_elems(req).max(1);
    let search = CollectiveSearch {
        topo,
        req,
        opts,
        deadline,
        set: &set,
        fine,
        coarse: relaycc_planners::whole_block_chunk_elems(req).max(fine),
    };
    let mut left = LeftOut {
        skipped: set.skipped().to_vec(),
        unfit: None,
        limited: Vec::new(),
        cut: Vec::new(),
    };
    let routable = search.coarse_pass(&mut left)?;
    let jobs = search.fine_jobs(routable, to_beat_us);
    let mut fine_plans = search.fine_pass(jobs, &mut left)?;
    let found = search.simulate_and_prove(&mut fine_plans, to_beat_us, &mut left)?;
    let LeftOut {
        mut skipped,
        unfit,
        limited,
        cut,
    } = left;
    skipped.extend(limited);
    skipped.extend(cut);
    Ok((found, skipped, unfit))
}

/// One search of [`fastest_collectives`]: the candidate set and the two chunk sizes it builds
/// at (the pipelining chunk, `fine`, and whole blocks, `coarse`).
struct CollectiveSearch<'a> {
    topo: &'a Topology,
    req: &'a Request,
    opts: &'a PlanOptions,
    deadline: &'a Deadline,
    set: &'a relaycc_planners::Candidates<'a>,
    fine: u64,
    coarse: u64,
}

/// A build of the fine pass: the candidate, its chunk, and its build already made, where
/// the coarse pass's stands for it.
type Job = (usize, u64, Option<Built>);

/// What a search left out, and why, in the order [`fastest_collectives`] reports it.
struct LeftOut {
    /// The families left out for size, then the candidates over the staging budget.
    skipped: Vec<String>,
    /// The first candidate's staging-budget error, for when nothing (not even the baseline)
    /// fits.
    unfit: Option<RouteError>,
    /// Candidates left out at the call's limits.
    limited: Vec<String>,
    /// Candidates whose simulation the budget cut.
    cut: Vec<String>,
}

impl LeftOut {
    /// A candidate that cannot fit the staging budget: skipped, with its reason listed.
    fn unfit(&mut self, e: RouteError) {
        self.skipped.push(format!("over the staging budget: {e}"));
        self.unfit.get_or_insert(e);
    }
    /// A candidate whose build went over the call's limits: left out, the budget marked hit.
    fn over_limit(&mut self, deadline: &Deadline, e: RouteError) {
        deadline.mark_hit();
        self.limited.push(format!("a candidate left out: {e}"));
    }
}

impl CollectiveSearch<'_> {
    /// Build candidate `i` at `chunk` elements (within the staging budget where `fitted`) and
    /// lower it for the simulator. The first candidate's builds must give a plan of
    /// relaycc's (`first`): they get a deadline of their own.
    fn prepare(&self, i: usize, chunk: u64, first: bool, fitted: bool) -> Result<Built> {
        let build = |limit: &relaycc_planners::limits::Limit| {
            if fitted {
                self.set.build(i, chunk, Some(limit))
            } else {
                self.set.build_unfitted(i, chunk, Some(limit))
            }
        };
        let plan = if first {
            self.deadline.limited_first(build)?
        } else {
            self.deadline.limited(CANDIDATES, build)?
        };
        let prepared = PreparedSim::new(self.topo, &plan, &self.opts.sim)?;
        Ok((plan, prepared))
    }

    /// The coarse pass: every candidate built with whole blocks as chunks (the first always,
    /// the others until the deadline). Coarse builds only bound times, so they ignore the
    /// staging budget, unless they are final (whole blocks are the pipelining chunk). Returns
    /// the candidates that found routes; where none did and none was over the budget, the
    /// first missing route is the error.
    fn coarse_pass(&self, left: &mut LeftOut) -> Result<Vec<(usize, Plan, PreparedSim)>> {
        let (coarse, deadline) = (self.coarse, self.deadline);
        // The first candidate is always built: a spent budget still returns a plan of
        // relaycc's.
        let coarse_built: Vec<Result<(usize, Plan, PreparedSim)>> = (0..self.set.len())
            .into_par_iter()
            .filter(|&i| i == 0 || !deadline.passed())
            .map(|i| {
                let (plan, prepared) = self.prepare(i, coarse, i == 0, coarse == self.fine)?;
                Ok((i, plan, prepared))
            })
            .collect();
        let mut routable = Vec::with_capacity(coarse_built.len());
        let mut no_route = None;
        for b in coarse_built {
            match b {
                Ok(x) => routable.push(x),
                Err(e @ RouteError::StagingBudget { .. }) => left.unfit(e),
                Err(e @ RouteError::OverLimit { .. }) => left.over_limit(deadline, e),
                Err(e @ RouteError::NoRoute { .. }) => {
                    no_route.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        if routable.is_empty()
            && left.unfit.is_none()
            && let Some(e) = no_route
        {
            return Err(e);
        }
        Ok(routable)
    }

    /// The builds of the fine pass: the candidates whose coarse bound (their busiest
    /// resource's load) beats `to_beat_us`, most promising first, at the pipelining chunk.
    /// Where the executor pays for every op it issues, whole blocks may beat the pipelining
    /// chunk (a quarter of the ops or fewer): each candidate then also competes at whole
    /// blocks, its coarse build taken as it is where it fits the staging budget.
    fn fine_jobs(&self, routable: Vec<(usize, Plan, PreparedSim)>, to_beat_us: f64) -> Vec<Job> {
        let (fine, coarse) = (self.fine, self.coarse);
        let also_coarse = self.opts.sim.issue_us > 0.0 && coarse != fine;
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
        first
            .into_iter()
            .flat_map(|(_, i, built)| {
                if !also_coarse {
                    return vec![(i, fine, built)];
                }
                let fits = built.filter(|(plan, _)| {
                    relaycc_planners::staging::over_budget(plan, self.opts.staging_budget).is_none()
                });
                vec![(i, fine, None), (i, coarse, fits)]
            })
            .collect()
    }

    /// The fine pass: each job built within the staging budget (the first always, the others
    /// until the deadline), in parallel. Returns one build per job, `None` where it was left
    /// out.
    fn fine_pass(&self, jobs: Vec<Job>, left: &mut LeftOut) -> Result<Vec<Option<Built>>> {
        let deadline = self.deadline;
        let built: Vec<Result<Option<Built>>> = jobs
            .into_par_iter()
            .enumerate()
            .map(|(k, (i, chunk, built))| match built {
                Some(pp) => Ok(Some(pp)),
                None if k > 0 && deadline.passed() => Ok(None),
                None => self.prepare(i, chunk, k == 0, true).map(Some),
            })
            .collect();
        let mut fine_plans = Vec::with_capacity(built.len());
        for b in built {
            match b {
                Ok(pp) => fine_plans.push(pp),
                Err(e @ RouteError::StagingBudget { .. }) => {
                    left.unfit(e);
                    fine_plans.push(None);
                }
                Err(e @ RouteError::OverLimit { .. }) => {
                    left.over_limit(deadline, e);
                    fine_plans.push(None);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(fine_plans)
    }

    /// Simulate the fine builds most promising first (least lower bound), so the best time
    /// found early prunes the rest, and prove the fastest ([`prune_and_prove`]): the first
    /// simulation gets its grace, the others stop at the deadline, and past it only the first
    /// runs. Returns the simulated plans in the order simulated, the proved one flagged.
    fn simulate_and_prove(
        &self,
        fine_plans: &mut [Option<Built>],
        to_beat_us: f64,
        left: &mut LeftOut,
    ) -> Result<Vec<Simulated>> {
        let (topo, deadline) = (self.topo, self.deadline);
        let mut ranked: Vec<(f64, usize)> = fine_plans
            .iter()
            .enumerate()
            .filter_map(|(k, pp)| pp.as_ref().map(|(_, pr)| (pr.lower_bound_us(), k)))
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut simulated = 0usize;
        let cut = &mut left.cut;
        let plans: &[Option<Built>] = fine_plans;
        let (order, proved) = prune_and_prove(
            &ranked,
            to_beat_us,
            |k| match plans[k].as_ref() {
                Some(_) if simulated > 0 && deadline.passed() => Ok(None),
                Some((plan, prepared)) => {
                    let sim = if simulated == 0 {
                        deadline.simulate_with_grace(topo, plan, prepared)?
                    } else {
                        prepared.simulate_until(topo, deadline.at())?
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
                plans[k]
                    .as_ref()
                    .is_some_and(|(plan, _)| prove(topo, self.req, plan).is_ok())
            },
        )?;
        Ok(order
            .into_iter()
            .filter_map(|(k, t)| {
                let (plan, _) = fine_plans[k].take()?;
                Some((plan, t, proved == Some(k)))
            })
            .collect())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
