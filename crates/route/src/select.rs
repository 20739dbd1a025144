//! The orchestrator: generate candidates, time each with the simulator, keep the fastest, and
//! report it beside the NCCL-like baseline and the bound. [`Planner`] caches results per
//! request shape for one topology.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use relaycc_topo::Topology;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::p2p::{RouteShare, Strategy, p2p_bound_gbps, p2p_candidates};
use crate::path::RelayPolicy;
use crate::plan::Plan;
use crate::request::{Collective, Request};
use crate::sim::{Perf, Prepared, SimConfig, simulate};

/// How to plan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlanOptions {
    /// Which GPUs may relay. Default: any free GPU.
    pub relay: RelayPolicy,
    /// Which point-to-point route kinds to consider. Default: all.
    pub strategy: Strategy,
    /// Simulator settings used to rank candidates.
    pub sim: SimConfig,
}

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
    /// The baseline's simulated performance.
    pub baseline: Perf,
    /// The bound (max-flow for point-to-point and broadcast, ingress/egress otherwise).
    pub bound: Perf,
    /// Every candidate tried, fastest first.
    pub candidates: Vec<CandidateTime>,
    /// Point-to-point requests: the chosen routes and their shares.
    pub routes: Vec<RouteShare>,
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
/// planner's ([`crate::planner::shared_memory`]).
pub fn plan(topo: &Topology, req: &Request, opts: &PlanOptions) -> Result<Planned> {
    req.validate()?;
    let baseline_plan = crate::planner::baseline_plan(topo, req)?;
    let baseline_sim = simulate(topo, &baseline_plan, &opts.sim)?;
    let baseline = baseline_sim.perf(req);
    let mut best: Option<(f64, Plan, Vec<RouteShare>)> = None;
    let mut candidates = Vec::new();
    let mut consider = |plan: Plan, routes: Vec<RouteShare>, t: f64| {
        candidates.push(CandidateTime {
            algorithm: plan.algorithm.clone(),
            time_us: t,
        });
        if best.as_ref().is_none_or(|(bt, _, _)| t < *bt) {
            best = Some((t, plan, routes));
        }
    };
    // Ranks that are arenas of one host's memory (the `host-N` preset): the simulator models
    // links, not one shared memory and its caches, so it cannot rank algorithms there; the
    // shared-memory planner is used directly, and still reported beside baseline and bound.
    let shared_memory = topo.shares_host_memory(&req.gpus);
    let bound_gbps;
    if shared_memory {
        bound_gbps = if is_p2p(req) {
            p2p_bound_gbps(topo, req, &opts.relay)?
        } else {
            crate::planner::bound_gbps(topo, req, &opts.relay)?
        };
        let p = crate::planner::shared_memory::plan(topo, req, false)?;
        let t = simulate(topo, &p, &opts.sim)?.time_us;
        consider(p, Vec::new(), t);
    } else if is_p2p(req) {
        bound_gbps = p2p_bound_gbps(topo, req, &opts.relay)?;
        match p2p_candidates(topo, req, &opts.relay, opts.strategy) {
            Ok(cands) => {
                for c in cands {
                    let t = simulate(topo, &c.plan, &opts.sim)?.time_us;
                    consider(c.plan, c.routes, t);
                }
            }
            // A forced strategy with no route falls through to the baseline only when Auto.
            Err(e) if opts.strategy != Strategy::Auto => return Err(e),
            Err(_) => {}
        }
    } else {
        bound_gbps = crate::planner::bound_gbps(topo, req, &opts.relay)?;
        for (plan, time_us) in fastest_collectives(topo, req, opts, baseline_sim.time_us)? {
            consider(plan, Vec::new(), time_us);
        }
    }
    if !shared_memory && (opts.strategy == Strategy::Auto || !is_p2p(req)) {
        consider(baseline_plan.clone(), Vec::new(), baseline_sim.time_us);
    }
    let Some((time, plan, routes)) = best else {
        return Err(crate::RouteError::NoRoute {
            what: req.collective.to_string(),
            why: "no candidate plan".into(),
        });
    };
    candidates.sort_by(|a, b| a.time_us.total_cmp(&b.time_us));
    let predicted = Perf::from_time(req, time);
    let bound = Perf::from_time(
        req,
        if bound_gbps > 0.0 {
            req.size_bytes() as f64 / (bound_gbps * 1e3)
        } else {
            f64::INFINITY
        },
    );
    Ok(Planned {
        plan,
        predicted,
        baseline_plan,
        baseline,
        bound,
        candidates,
        routes,
    })
}

/// A candidate built and lowered for the simulator.
type Built = (Plan, Prepared);

/// The collective candidates worth simulating, each with its simulated time, in the order
/// they were simulated; `to_beat_us` is the time they must beat (the baseline's).
///
/// Two stages keep planning cheap without changing the winner. First every candidate is built
/// with whole blocks as chunks ([`crate::planner::whole_block_chunk_elems`]): the same bytes
/// cross the same resources as in the finely chunked plan, so its busiest resource bounds the
/// fine plan's time, at a quarter of the ops or less. Candidates whose bound cannot beat
/// `to_beat_us` are dropped; the rest are built at the pipelining chunk
/// ([`crate::planner::pipeline_chunk_elems`]), most promising first, and simulated unless
/// their full lower bound (busiest resource, longest op) already loses to the best so far. A
/// candidate is skipped only when it cannot be faster than one that was simulated, so the
/// fastest candidate is always found. Both builds run in parallel.
fn fastest_collectives(
    topo: &Topology,
    req: &Request,
    opts: &PlanOptions,
    to_beat_us: f64,
) -> Result<Vec<(Plan, f64)>> {
    let set = crate::planner::Candidates::new(topo, req, &opts.relay)?;
    let fine = crate::planner::pipeline_chunk_elems(req).max(1);
    let coarse = crate::planner::whole_block_chunk_elems(req).max(fine);
    let prepare = |i: usize, chunk: u64| -> Result<(usize, Plan, Prepared)> {
        let plan = set.build(i, chunk)?;
        let prepared = Prepared::new(topo, &plan, &opts.sim)?;
        Ok((i, plan, prepared))
    };
    let mut first: Vec<(f64, usize, Option<Built>)> = crate::planner::keep_routable(
        (0..set.len())
            .into_par_iter()
            .map(|i| prepare(i, coarse))
            .collect(),
    )?
    .into_iter()
    .map(|(i, plan, prepared)| {
        let load = prepared.load_bound_us();
        // Where whole blocks are the pipelining chunk, the first build is the final one.
        (load, i, (coarse == fine).then_some((plan, prepared)))
    })
    .filter(|(load, _, _)| *load < to_beat_us)
    .collect();
    first.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut fine_plans: Vec<Option<Built>> = first
        .into_par_iter()
        .map(|(_, i, built)| match built {
            Some(pp) => Ok(Some(pp)),
            None => prepare(i, fine).map(|(_, p, pr)| Some((p, pr))),
        })
        .collect::<Result<Vec<_>>>()?;
    // The most promising first, so the best time found early prunes the rest.
    let mut ranked: Vec<(f64, usize)> = fine_plans
        .iter()
        .enumerate()
        .filter_map(|(k, pp)| pp.as_ref().map(|(_, pr)| (pr.lower_bound_us(), k)))
        .collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut best_t = to_beat_us;
    let mut timed = Vec::new();
    for (lb, k) in ranked {
        if lb >= best_t {
            continue;
        }
        let Some((plan, prepared)) = fine_plans[k].take() else {
            continue;
        };
        let t = prepared.simulate(topo)?.time_us;
        best_t = best_t.min(t);
        timed.push((plan, t));
    }
    Ok(timed)
}

/// What a cached plan is keyed by: the request and the options that change the plan.
type CacheKey = (Request, RelayPolicy, Strategy);

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
        let key = (req.clone(), opts.relay.clone(), opts.strategy);
        if opts.sim == SimConfig::default() {
            if let Some(hit) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
                return Ok(hit);
            }
        }
        let planned = Arc::new(plan(&self.topo, req, opts)?);
        if opts.sim == SimConfig::default() {
            if let Ok(mut c) = self.cache.lock() {
                c.insert(key, planned.clone());
            }
        }
        Ok(planned)
    }
    /// Number of cached plans.
    pub fn cached(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }
}
