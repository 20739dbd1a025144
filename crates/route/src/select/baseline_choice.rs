//! How a planning call builds and times the NCCL-like baseline: step-sampled where its rings,
//! its tree or its all_to_all's rounds are too large to build ([`relaycc_plan::step_samples`]), as a
//! template where its window is smaller than the plan (NCCL's rings where its tree does not
//! fold), or in full
//! ([`baseline_template`]); simulated to the end, within the budget, or taken from the tuner's
//! simulation where that stands for it ([`simulate_baseline`]).

use std::time::{Duration, Instant};

use relaycc_topo::Topology;

use relaycc_plan::Plan;
use relaycc_plan::step_samples::{
    LONG_STEPS, SAMPLE_FROM_STEPS, SHORT_STEPS, TREE_LONG_CHUNKS, TREE_SHORT_CHUNKS,
};
use relaycc_plan::{Collective, Request};
use relaycc_plan::{Result, RouteError};
use relaycc_planners::limits::LEAST_SIMULATION_GRACE;
use relaycc_sim::{PreparedSim, SimConfig, SimCut, simulate};

use super::deadline::{Deadline, GRACE_ABOVE_OPS};
use super::options::PlanOptions;

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
pub(super) fn simulate_baseline(
    topo: &Topology,
    plan: &Plan,
    opts: &PlanOptions,
    tuned: Option<relaycc_planners::baseline::TunedTime>,
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
    if let Some(samples) = &plan.step_samples {
        return simulate_sampled_baseline(topo, samples, opts, deadline);
    }
    if plan.ops.len() < GRACE_ABOVE_OPS {
        return Ok((simulate(topo, plan, &opts.sim)?.time_us, None));
    }
    let prepared = PreparedSim::new(topo, plan, &opts.sim)?;
    let start = Instant::now();
    Ok(
        match prepared.simulate_or_cut(topo, &|| deadline.baseline_goes_on(start))? {
            Ok(sim) => (sim.time_us, None),
            Err(cut) => (cut.reached_us.max(prepared.lower_bound_us()), Some(cut)),
        },
    )
}

/// [`simulate_baseline`] of a step-sampled baseline: its samples simulated as the baseline
/// is, under one grace counted from the first, the long one first. The extrapolation is never
/// below the long sample's makespan, so a cut long sample still bounds the baseline from
/// below (the time it reached), and a cut short one after it leaves the long one's makespan
/// as that bound.
fn simulate_sampled_baseline(
    topo: &Topology,
    samples: &relaycc_plan::StepSamples,
    opts: &PlanOptions,
    deadline: &Deadline,
) -> Result<(f64, Option<SimCut>)> {
    let start = Instant::now();
    let mut time_us = [0.0f64; 2];
    for (k, sample) in [&samples.long, &samples.short].into_iter().enumerate() {
        let prepared = PreparedSim::new(topo, sample, &opts.sim)?;
        match prepared.simulate_or_cut(topo, &|| deadline.baseline_goes_on(start))? {
            Ok(sim) => time_us[k] = sim.time_us,
            Err(cut) => {
                let below = match k {
                    0 => cut.reached_us.max(prepared.lower_bound_us()),
                    _ => time_us[0],
                };
                return Ok((below, Some(cut)));
            }
        }
    }
    let (time_us, _) = relaycc_plan::step_samples::extrapolate_us(samples, time_us[1], time_us[0]);
    Ok((time_us, None))
}

/// Whether the tuner's simulation `t` of a baseline of `ops` ops stands for the planner's, which
/// could run for `could_run`: it ran to the end, or, for a plan large enough to be cut at all
/// ([`GRACE_ABOVE_OPS`]), it ran at least as long.
fn tuned_stands(
    t: &relaycc_planners::baseline::TunedTime,
    ops: usize,
    could_run: Duration,
) -> bool {
    t.cut.is_none() || (ops >= GRACE_ABOVE_OPS && t.spent >= could_run)
}

/// Most ops of NCCL's double binary tree all_reduce built in full beside templates above
/// [`crate::EXPAND_MAX_RANKS`] ranks: it simulates in well under a second and its sampled proof
/// follows cones of a few hundred ops.
pub const TREE_IN_FULL_MAX_OPS: u64 = 300_000;

/// An upper estimate of the ops of NCCL's double binary tree all_reduce of `req`: per rank,
/// channel and chunk a reduction going up and a copy going down each way of a chain or tree
/// edge (at most 4), over every chunk of the pipelining size plus one partial chunk for each of
/// up to 32 channels.
fn tree_ops_estimate(req: &Request) -> u64 {
    let chunk = relaycc_planners::pipeline_chunk_elems(req).max(1);
    req.nranks() as u64 * 4 * (req.count.div_ceil(chunk) + 32)
}

/// An estimate of the ops the build of NCCL's rail-aligned ring all_reduce of `req` makes on
/// hosts that repeat in `periods` periods: per rank, channel and chunk of its block, 2 (n - 1)
/// copies and n - 1 reductions, over the two periods of hosts a template's window holds (the
/// whole plan where there are at most two: a 64-node rail-optimized cluster's two scalable
/// units, or hosts that do not fold). Zero where the members sit on one node, so that the
/// rings are always tried there.
fn ring_ops_estimate(topo: &Topology, req: &Request, periods: u32) -> u64 {
    let Ok(Some(channels)) = relaycc_planners::baseline_net::ring_channels(topo, req) else {
        return 0;
    };
    let n = req.nranks() as u64;
    let channels = channels.max(1) as u64;
    let chunk = relaycc_planners::pipeline_chunk_elems(req).max(1);
    let per_block = req.count.div_ceil(n * channels).div_ceil(chunk).max(1);
    let full = 3 * n * n.saturating_sub(1) * channels * per_block;
    let periods = u64::from(periods).max(1);
    full.saturating_mul(2.min(periods)) / periods
}

/// Most ops of NCCL's rings the baseline builds, in full or as a template's window: above,
/// with at least [`SAMPLE_FROM_STEPS`] steps per phase, they are step-sampled (a 1,024-node
/// DGX H100 cluster's rings fold to 1.6M ops from a window of 3.3M, far past the default
/// budget to build and fold; sampled, two windows of a few tens of thousands; the timings are
/// in `docs/MEASUREMENTS.md`).
pub const RING_IN_FULL_MAX_OPS: u64 = 300_000;

/// Where NCCL's ring collective `req` would hold more than [`RING_IN_FULL_MAX_OPS`] ops (as a
/// template folded by `shift` where it has more than two periods, else in full) over at least
/// [`SAMPLE_FROM_STEPS`] steps per phase: its steps per phase and that estimate of its ops;
/// `None` where its rings are built as they are.
fn rings_to_sample(
    topo: &Topology,
    req: &Request,
    shift: Option<&relaycc_topo::HostSymmetry>,
) -> Option<(u64, u64)> {
    let rings = matches!(
        req.collective,
        Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter
    );
    let steps = (req.nranks() as u64).saturating_sub(1);
    if !rings || steps < SAMPLE_FROM_STEPS {
        // The estimate lays out NCCL's ring channels: on 73,728 GB200 GPUs that took 7% of
        // a gather's planning call, which has no rings.
        return None;
    }
    let periods = shift.map_or(1, |s| s.periods());
    let ops = ring_ops_estimate(topo, req, periods);
    (ops > RING_IN_FULL_MAX_OPS).then_some((steps, ops))
}

/// NCCL's rail-aligned rings for `req` step-sampled ([`relaycc_plan::step_samples`]) where they are
/// too large to build: more than [`RING_IN_FULL_MAX_OPS`] ops (as a template folded by
/// `shift` where it has more than two periods, else in full) and at least
/// [`SAMPLE_FROM_STEPS`] steps per phase. Where the tuner chooses the double binary tree for an
/// all_reduce, the rings stand for it (NCCL_ALGO=Ring) only where [`baseline_template`] would
/// put them in its place (hosts that fold, a tree above [`TREE_IN_FULL_MAX_OPS`] and above the
/// rings' window); elsewhere the tree is built. `None` where the baseline is built as it is;
/// the reason for a sample goes to `skipped`.
fn sampled_rings(
    s: &Sampling,
    skipped: &mut Vec<String>,
) -> Option<Result<relaycc_planners::baseline::TunedPlan>> {
    use relaycc_planners::baseline_net::tuner::Algo;
    let (topo, req, budget, until, shift, tuner, limit) =
        (s.topo, s.req, s.budget, s.until, s.shift, s.tuner, s.limit);
    let (steps, ops) = rings_to_sample(topo, req, shift)?;
    let sym = shift.filter(|s| s.periods() > 2);
    let mut forced = "";
    if req.collective == Collective::AllReduce {
        match tuner() {
            Err(e) => return Some(Err(e)),
            // The tree stays the baseline wherever `baseline_template` keeps it (it is small
            // enough, or no larger than the rings' window, or the hosts do not fold, where
            // the tuner's choice is built in full); the rings stand for it only where they
            // did before, now sampled.
            Ok(Some(Algo::Tree)) => {
                let tree_ops = tree_ops_estimate(req);
                if sym.is_none() || tree_ops <= TREE_IN_FULL_MAX_OPS.max(ops) {
                    return None;
                }
                forced = " (NCCL_ALGO=Ring)";
            }
            Ok(_) => {}
        }
    }
    let build = |k| {
        relaycc_planners::BaselineOptions {
            algo: (req.collective == Collective::AllReduce).then_some(Algo::Ring),
            staging_budget: Some(budget),
            template: sym.map(|s| s as &dyn relaycc_planners::template::HostShift),
            until,
            limit,
            sample_steps: Some(k),
            ..Default::default()
        }
        .build(topo, req)
    };
    let sampled = build(SHORT_STEPS).and_then(|short| {
        let what = "ring steps per phase";
        step_sampled(what, steps, (SHORT_STEPS, short), LONG_STEPS, build)
    });
    skipped.push(format!(
        "the baseline's rings{forced}: {steps} steps per phase, about {ops} ops {} (above \
         {RING_IN_FULL_MAX_OPS}), so they are step-sampled: {SHORT_STEPS} and {LONG_STEPS} \
         steps built and the time extrapolated",
        if sym.is_some() {
            "in a template's window"
        } else {
            "in full"
        }
    ));
    Some(sampled.map(|mut t| {
        t.plan.algorithm.push_str(forced);
        t
    }))
}

/// NCCL's tuner's all_reduce algorithm for the request, asked at most once per planning call
/// (it lays out the rail rings): `None` off a multi-node all_reduce.
type TunerChoice<'a> = dyn Fn() -> Result<Option<relaycc_planners::baseline_net::tuner::Algo>> + 'a;

/// What every sampler of the baseline reads ([`baseline_template`]): the request on its
/// topology, the staging budget, the call's deadline, the hosts' symmetry, the tuner's choice
/// and the limit its builds run under.
#[derive(Clone, Copy)]
struct Sampling<'a> {
    topo: &'a Topology,
    req: &'a Request,
    budget: u64,
    until: Option<Instant>,
    shift: Option<&'a relaycc_topo::HostSymmetry>,
    tuner: &'a TunerChoice<'a>,
    limit: Option<&'a relaycc_planners::limits::Limit>,
}

/// One way to sample the baseline: its step-sampled plan, `None` where it does not apply (the
/// reason for a sample goes to the list).
type Sampler =
    fn(&Sampling, &mut Vec<String>) -> Option<Result<relaycc_planners::baseline::TunedPlan>>;

/// The step-sampled plan of `full` repeating steps of `what` ([`relaycc_plan::step_samples`]) from
/// `short`, a build of `short_kept` of them, and `build(long_kept)`, with the long sample's
/// protocol.
fn step_sampled(
    what: &str,
    full: u64,
    (short_kept, short): (u64, relaycc_planners::baseline::TunedPlan),
    long_kept: u64,
    build: impl Fn(u64) -> Result<relaycc_planners::baseline::TunedPlan>,
) -> Result<relaycc_planners::baseline::TunedPlan> {
    let long = build(long_kept)?;
    // The tuner's simulations of both samples, where it ran them to the end with the
    // protocol the long sample took, time the sampled plan as `simulate` would: the planner
    // takes that instead of simulating both samples again (0.7 s on 64 rail-optimized nodes).
    let tuned = match (short.tuned, long.tuned) {
        (Some(s), Some(l))
            if s.cut.is_none() && l.cut.is_none() && short.plan.protocol == long.plan.protocol =>
        {
            Some((s, l))
        }
        _ => None,
    };
    let mut short = short.plan;
    short.protocol = long.plan.protocol;
    let samples = ((short_kept, short), (long_kept, long.plan));
    let plan = relaycc_plan::step_samples::assemble(what, full, samples.0, samples.1)?;
    let tuned = tuned.and_then(|(s, l)| {
        let sampled = plan.step_samples.as_deref()?;
        let (time_us, _) =
            relaycc_plan::step_samples::extrapolate_us(sampled, s.time_us, l.time_us);
        Some(relaycc_planners::baseline::TunedTime {
            time_us,
            cut: None,
            spent: s.spent + l.spent,
        })
    });
    Ok(relaycc_planners::baseline::TunedPlan { plan, tuned })
}

/// NCCL's double binary tree all_reduce for `req`, chunk-sampled ([`relaycc_plan::step_samples`])
/// where it would otherwise be built in full with more than [`TREE_IN_FULL_MAX_OPS`] ops: the
/// tuner chooses the tree (`tuner`), no rings stand for it ([`sampled_rings`],
/// [`baseline_template`]), each channel pipelines at least 4 x [`TREE_LONG_CHUNKS`] chunks of
/// the baseline's chunk, its samples hold at most [`TREE_SAMPLES_MAX_OPS`], and the tree's
/// staging at that chunk (which the chunks built do not change) fits `budget`. Every chunk
/// climbs and descends the same trees, so past the pipeline's fill each adds the same time.
/// `None` where it is built as it is; the reason for a sample goes to `skipped`.
fn sampled_tree(
    s: &Sampling,
    skipped: &mut Vec<String>,
) -> Option<Result<relaycc_planners::baseline::TunedPlan>> {
    use relaycc_planners::baseline_net::tuner::Algo;
    let (topo, req, budget, until, shift, tuner, limit) =
        (s.topo, s.req, s.budget, s.until, s.shift, s.tuner, s.limit);
    let tree_ops = tree_ops_estimate(req);
    if req.collective != Collective::AllReduce || tree_ops <= TREE_IN_FULL_MAX_OPS {
        return None;
    }
    match tuner() {
        Ok(Some(Algo::Tree)) => {}
        Ok(_) => return None,
        Err(e) => return Some(Err(e)),
    }
    // Where the hosts fold in more than two periods and the rings' window is smaller, the
    // rings stand for the tree (NCCL_ALGO=Ring), as `baseline_template` decides.
    if let Some(sym) = shift.filter(|sym| sym.periods() > 2)
        && tree_ops > ring_ops_estimate(topo, req, sym.periods())
    {
        return None;
    }
    let channels = match relaycc_planners::baseline_net::ring_channels(topo, req) {
        Ok(Some(c)) => c.max(1) as u64,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    let chunk = relaycc_planners::pipeline_chunk_elems(req).max(1);
    let full = req.count.div_ceil(channels).div_ceil(chunk);
    // About 3 ops per rank, channel and chunk (a reduction and a send up, a send down).
    let sampled_ops = 3 * req.nranks() as u64 * channels * (TREE_SHORT_CHUNKS + TREE_LONG_CHUNKS);
    if full < 4 * TREE_LONG_CHUNKS || sampled_ops > TREE_SAMPLES_MAX_OPS {
        return None;
    }
    let build = |k| {
        relaycc_planners::BaselineOptions {
            algo: Some(Algo::Tree),
            chunk_elems: Some(chunk),
            until,
            limit,
            sample_steps: Some(k),
            ..Default::default()
        }
        .build(topo, req)
    };
    let short = match build(TREE_SHORT_CHUNKS) {
        Ok(t) => t,
        Err(e) => return Some(Err(e)),
    };
    // Past the budget at this chunk: the tree is built in full, its chunk fitted.
    if relaycc_planners::staging::over_budget(&short.plan, budget).is_some() {
        relaycc_planners::limits::refund(limit, short.plan.ops.len() as u64);
        return None;
    }
    skipped.push(format!(
        "the baseline's double binary tree: {full} chunks per channel, up to about {tree_ops} ops in \
         full (above {TREE_IN_FULL_MAX_OPS}), so it is chunk-sampled: {TREE_SHORT_CHUNKS} and \
         {TREE_LONG_CHUNKS} chunks built and the time extrapolated"
    ));
    let short = (TREE_SHORT_CHUNKS, short);
    let what = "tree chunks per channel";
    Some(step_sampled(what, full, short, TREE_LONG_CHUNKS, build))
}

/// Most ops the two samples of a chunk-sampled tree hold together, by 3 per rank, channel and
/// chunk: they build and simulate within a default budget with time left for relaycc's
/// candidates (885k on 64 DGX H100 nodes, 564k and 282k built); 128 nodes' samples (1.8M)
/// took the call past its budget, so past this the tree is built in full, which the call's
/// op limit refuses (`docs/MEASUREMENTS.md` has the timings).
pub const TREE_SAMPLES_MAX_OPS: u64 = 900_000;

/// Most ops of NCCL's grouped send/recv all_to_all across nodes built in full or as a
/// template's window: above, with at least [`SAMPLE_FROM_STEPS`] rounds, its rounds are
/// step-sampled.
pub const EXCHANGE_IN_FULL_MAX_OPS: u64 = 300_000;

/// An upper estimate of the ops of NCCL's grouped send/recv all_to_all of `req` in a
/// template's window of two periods of hosts (the whole plan where there are at most two):
/// per pair of ranks, each chunk of its block copied to its PXN proxy and on, for the pairs
/// with either end in the window (4 of every `periods` periods' worth: 524,288 ops on 1,024
/// DGX H100 nodes at 1 GiB, where the build holds 511,648).
fn exchange_ops_estimate(req: &Request, periods: u32) -> u64 {
    let n = req.nranks() as u64;
    let chunk = relaycc_planners::pipeline_chunk_elems(req).max(1);
    let full = n
        .saturating_mul(n)
        .saturating_mul(2 * req.count.div_ceil(chunk).max(1));
    let periods = u64::from(periods).max(1);
    full.saturating_mul(4.min(periods)) / periods
}

/// NCCL's grouped send/recv all_to_all across nodes, round-sampled ([`relaycc_plan::step_samples`])
/// where it would hold more than [`EXCHANGE_IN_FULL_MAX_OPS`] ops (in a template's window
/// where its hosts fold in more than two periods, else in full) over at least
/// [`SAMPLE_FROM_STEPS`] rounds: round k sends from every rank `r` to `r + k`, so past the
/// first rounds (inside a node) each round crosses the network alike. `None` where it is
/// built as it is; the reason for a sample goes to `skipped`.
fn sampled_exchange(
    s: &Sampling,
    skipped: &mut Vec<String>,
) -> Option<Result<relaycc_planners::baseline::TunedPlan>> {
    let (topo, req, budget, until, shift, limit) =
        (s.topo, s.req, s.budget, s.until, s.shift, s.limit);
    if req.collective != Collective::AllToAll
        || !relaycc_planners::baseline_net::spans_nodes(topo, req)
    {
        return None;
    }
    let rounds = req.nranks() as u64;
    let ops = exchange_ops_estimate(req, shift.map_or(1, |s| s.periods()));
    if rounds < SAMPLE_FROM_STEPS || ops <= EXCHANGE_IN_FULL_MAX_OPS {
        return None;
    }
    let sym = shift.filter(|s| s.periods() > 2);
    let build = |k| {
        relaycc_planners::BaselineOptions {
            staging_budget: Some(budget),
            template: sym.map(|s| s as &dyn relaycc_planners::template::HostShift),
            until,
            limit,
            sample_steps: Some(k),
            ..Default::default()
        }
        .build(topo, req)
    };
    skipped.push(format!(
        "the baseline's grouped send/recv: {rounds} rounds, about {ops} ops (above \
         {EXCHANGE_IN_FULL_MAX_OPS}), so its rounds are step-sampled: {SHORT_STEPS} and \
         {LONG_STEPS} rounds built and the time extrapolated"
    ));
    Some(build(SHORT_STEPS).and_then(|short| {
        let what = "all_to_all rounds";
        step_sampled(what, rounds, (SHORT_STEPS, short), LONG_STEPS, build)
    }))
}

/// The baseline step-sampled where it is too large to build (its rings, [`sampled_rings`];
/// its double binary tree, [`sampled_tree`]; its grouped send/recv all_to_all,
/// [`sampled_exchange`]), or as a template folded by `shift` (NCCL's rings where the tuner's
/// all_reduce tree does not fold), with the reasons for what it left out; `None` where it is
/// built in full (no shift, or a baseline that does not fold). Its builds run under `limit`.
pub(super) fn baseline_template(
    topo: &Topology,
    req: &Request,
    budget: u64,
    shift: Option<&relaycc_topo::HostSymmetry>,
    until: Option<Instant>,
    limit: Option<&relaycc_planners::limits::Limit>,
) -> (
    Option<Result<relaycc_planners::baseline::TunedPlan>>,
    Vec<String>,
) {
    let mut skipped = Vec::new();
    let asked = std::cell::OnceCell::new();
    let tuner = || match asked.get() {
        Some(algo) => Ok(*algo),
        None => {
            let algo = relaycc_planners::baseline_net::tuner_choice(topo, req, limit)?;
            Ok(*asked.get_or_init(|| algo))
        }
    };
    let sampling = Sampling {
        topo,
        req,
        budget,
        until,
        shift,
        tuner: &tuner,
        limit,
    };
    let samplers: [Sampler; 3] = [sampled_rings, sampled_tree, sampled_exchange];
    for sampler in samplers {
        if let Some(sampled) = sampler(&sampling, &mut skipped) {
            return (Some(sampled), skipped);
        }
    }
    let folded = match shift {
        // A window holds two periods of hosts: with only two it is the whole plan, built one
        // channel after another (a windowed build is one builder's) and then folded, for a template
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
            let within = |algo| {
                relaycc_planners::BaselineOptions {
                    algo,
                    staging_budget: Some(budget),
                    template: Some(sym),
                    until,
                    limit,
                    ..Default::default()
                }
                .build(topo, req)
            };
            match within(None) {
                Ok(p) => Some(Ok(p)),
                // NCCL's double binary tree differs between hosts, so it never folds. Its ops
                // grow as ranks x chunks, not ranks^2 as a ring's: where they are few (the
                // small sizes where the tuner prefers it) it is built in full; otherwise its
                // rings stand for it.
                Err(RouteError::NotSymmetric(why)) if req.collective == Collective::AllReduce => {
                    let tree_ops = tree_ops_estimate(req);
                    let ring_window = ring_ops_estimate(topo, req, sym.periods());
                    if tree_ops <= TREE_IN_FULL_MAX_OPS || tree_ops <= ring_window {
                        skipped.push(format!(
                            "the tuner's baseline as a template: {why}; the baseline is NCCL's \
                             tree, built in full (about {tree_ops} ops, against about \
                             {ring_window} for its rings' window)"
                        ));
                        return (None, skipped);
                    }
                    match within(Some(relaycc_planners::baseline_net::tuner::Algo::Ring)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn all_reduce(gpus: u32, bytes: u64) -> Request {
        Request::new(
            Collective::AllReduce,
            (0..gpus).collect(),
            bytes / 4,
            relaycc_plan::DType::F32,
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
            let ring = relaycc_planners::BaselineOptions {
                algo: Some(relaycc_planners::baseline_net::tuner::Algo::Ring),
                ..Default::default()
            }
            .plan(&topo, &req)
            .unwrap();
            let est = ring_ops_estimate(&topo, &req, sym.periods()) as f64;
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
        // whole plan (NCCL's rings over 512 ranks, 6.3M ops, twice its tree): never folded,
        // and at 1 GiB its rings are step-sampled instead of built in full; 64 ranks' rings
        // (63 steps per phase) are built in full.
        let topo = relaycc_topo::preset("cluster:64xdgx-h100:ib-ndr:rail").unwrap();
        let sym = topo.host_symmetry();
        assert_eq!(sym.periods(), 2);
        let req = all_reduce(512, 1 << 30);
        assert!(tree_ops_estimate(&req) < ring_ops_estimate(&topo, &req, sym.periods()));
        let mut rs = all_reduce(512, 1 << 30);
        rs.collective = Collective::ReduceScatter;
        rs.count /= 512;
        for r in [&req, &rs] {
            let (steps, ops) = rings_to_sample(&topo, r, Some(&sym)).unwrap();
            assert_eq!(steps, 511);
            assert!(ops > RING_IN_FULL_MAX_OPS, "{ops}");
        }
        let mut few = all_reduce(64, 1 << 30);
        few.collective = Collective::ReduceScatter;
        few.count /= 64;
        assert_eq!(rings_to_sample(&topo, &few, Some(&sym)), None);
        // Off the rings' collectives nothing is sampled.
        let mut bc = all_reduce(512, 1 << 30);
        bc.collective = Collective::Broadcast;
        assert_eq!(rings_to_sample(&topo, &bc, Some(&sym)), None);
        // Two periods: never folded (16 ranks' all_reduce here).
        let (folded, why) = baseline_template(
            &topo,
            &all_reduce(16, 1 << 20),
            relaycc_planners::staging::DEFAULT_STAGING_BUDGET_BYTES,
            Some(&sym),
            None,
            None,
        );
        assert!(folded.is_none());
        assert!(why.iter().any(|w| w.contains("2 periods")), "{why:?}");
        // Three units: the rings' window holds two thirds of their 14M ops, still more than
        // the tree in full.
        let topo = relaycc_topo::preset("cluster:96xdgx-h100:ib-ndr:rail").unwrap();
        let sym = topo.host_symmetry();
        assert_eq!(sym.periods(), 3);
        let req = all_reduce(768, 1 << 30);
        assert!(tree_ops_estimate(&req) < ring_ops_estimate(&topo, &req, sym.periods()));
        // One switch: every host a period, and the rings' window holds two of them.
        let topo = relaycc_topo::preset("cluster:16xdgx-h100:ib-ndr").unwrap();
        let sym = topo.host_symmetry();
        let req = all_reduce(128, 1 << 30);
        assert!(ring_ops_estimate(&topo, &req, sym.periods()) < tree_ops_estimate(&req) / 4);
    }

    /// On 64 rail-optimized DGX H100 nodes (two periods of hosts, so nothing folds) at 1 GiB,
    /// NCCL's tree all_reduce (about 3M ops in full) is chunk-sampled and its grouped
    /// send/recv all_to_all (about 1.8M) round-sampled; 256 MiB leaves each tree channel too
    /// few chunks to sample, so that tree is built as it is.
    #[test]
    fn large_trees_and_exchanges_are_step_sampled() {
        let topo = relaycc_topo::preset("cluster:64xdgx-h100:ib-ndr:rail").unwrap();
        let sym = topo.host_symmetry();
        let budget = relaycc_planners::staging::DEFAULT_STAGING_BUDGET_BYTES;
        let sampled = |req: &Request| {
            let (got, why) = baseline_template(&topo, req, budget, Some(&sym), None, None);
            (got.map(|t| t.unwrap().plan), why)
        };
        let (tree, why) = sampled(&all_reduce(512, 1 << 30));
        let s = tree.as_ref().unwrap().step_samples.as_ref().unwrap();
        assert_eq!(
            (s.what.as_str(), s.full, s.short_kept, s.long_kept),
            (
                "tree chunks per channel",
                256,
                TREE_SHORT_CHUNKS,
                TREE_LONG_CHUNKS
            )
        );
        assert!(why.iter().any(|w| w.contains("chunk-sampled")), "{why:?}");
        let mut a2a = all_reduce(512, 1 << 30);
        a2a.collective = Collective::AllToAll;
        a2a.count /= 512;
        let (exchange, why) = sampled(&a2a);
        let s = exchange.as_ref().unwrap().step_samples.as_ref().unwrap();
        assert_eq!((s.what.as_str(), s.full), ("all_to_all rounds", 512));
        assert!(
            why.iter().any(|w| w.contains("rounds are step-sampled")),
            "{why:?}"
        );
        let (small, _) = sampled(&all_reduce(512, 256 << 20));
        assert!(small.is_none());
    }

    /// The tuner's simulation of the baseline is taken where it stands for the one the
    /// planner would make, and the plan is simulated again where it does not.
    #[test]
    fn the_tuners_simulation_of_the_baseline_is_reused_where_it_stands_for_the_planners() {
        use relaycc_planners::baseline::{TUNE_SIMULATION_CAP, TunedTime};
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::new(
            Collective::AllReduce,
            (0..8).collect(),
            1 << 20,
            relaycc_plan::DType::F32,
        );
        let plan = relaycc_planners::baseline_plan(&topo, &req).unwrap();
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
