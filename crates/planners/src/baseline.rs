//! The in-model NCCL-like baseline: what NCCL would do on the same masked machine, so every
//! relaycc figure has a peer computed under the same model.
//!
//! Rules ([NCCL-src], as `docs/REFERENCES.md` sums them up): only member GPUs take part; a pair
//! connects by direct NVLink, else NVLink through one *member* GPU (NVB), else PCIe peer-to-peer
//! inside a socket, else host memory of the sender's socket ([`LinkMode::Nccl`]); never more than
//! one route (no multi-path). all_reduce, all_gather and reduce_scatter run on packed rings over
//! the members (NCCL's channels: each ring searched to maximise its slowest link over what the
//! rings before it left, [`super::ring_pack`]); broadcast and reduce are pipelined chains along
//! the best ring (within a node NCCL's "tree" is a chain); chunks of 512 KiB (the Simple
//! protocol's step) or larger. What NCCL lacks is done
//! as its users do it: all_to_all(_v), gather, scatter and send/recv as grouped send/recv (all
//! pairs at once), all_gather_v as a series of broadcasts and reduce_scatter_v as a series of
//! reduces, one after another.
//!
//! The tuner: like NCCL's (`src/graph/tuning.cc`), the baseline predicts each algorithm with
//! each protocol it may use (LL, LL128 where every link is NVLink, Simple; NVLS for all_reduce
//! where the members' NVSwitch reduces, [`super::nvls`]) and keeps the fastest, named in the
//! plan (`nccl-like ring x2 ... LL128`) and recorded in [`Plan::protocol`]. The simulator
//! charges each protocol's bandwidth share, launch and per-step latency
//! ([`relaycc_topo::rates::CostModel`]).

use std::time::{Duration, Instant};

use relaycc_topo::Topology;
use relaycc_topo::rates::Protocol;

use relaycc_plan::Result;
use relaycc_plan::path::RelayPolicy;
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::builder::PlanBuilder;
use super::ring;
use super::ring_order::ring_order;
use super::{ConnCache, LinkMode, PlannerContext, chunks, direct};

/// NCCL's chunk: the Simple protocol's step size, bytes (the floor of
/// [`super::pipeline_chunk_elems`], which the baseline pipelines with) (`NCCL_STEPS` slices of a 4
/// MiB buffer, 512 KiB each, in NCCL 2.x `src/include/collectives.h`).
pub const NCCL_CHUNK_BYTES: u64 = 512 << 10;

/// The NCCL-like plan of a request: [`BaselineOptions::plan`] with the default options.
///
/// # Arguments
/// - `topo`: the masked topology;
/// - `req`: any collective of [`Collective::ALL`] (send_recv as NCCL's p2p).
///
/// # Returns
/// One plan named `nccl-like ...`, or an error when the request is malformed, a member is
/// masked, or a pair of members has no route even through host memory.
///
/// # Complexity
/// n^2 connections (no max-flow), a ring search bounded by
/// [`super::ring_order::RING_SEARCH_BUDGET`], and O(steps x chunks) ops.
///
/// Source: [NCCL-src], its ring search and p2p path types (`src/graph/search.cc`,
/// `src/graph/paths.cc`); [Rolinger-2017] for the series
/// of broadcasts that replaces all_gather_v (and its mirror, the reduces of
/// reduce_scatter_v).
pub fn baseline_plan(topo: &Topology, req: &Request) -> Result<Plan> {
    BaselineOptions::default().plan(topo, req)
}

/// Which NCCL-like baseline to build: every way the planner, the tests and the CLI ask for
/// one is a value of this description, built by [`BaselineOptions::plan`].
#[derive(Clone, Copy, Default)]
pub struct BaselineOptions<'a> {
    /// The multi-node all_reduce algorithm forced (NCCL's `NCCL_ALGO`); `None` is the tuner's
    /// choice. Members on one node ignore it.
    pub algo: Option<super::baseline_net::tuner::Algo>,
    /// Pipelining chunk, elements; `None` is [`super::pipeline_chunk_elems`] (at least
    /// [`NCCL_CHUNK_BYTES`]).
    pub chunk_elems: Option<u64>,
    /// Staging budget, bytes per device: the chunk shrinks until every device's staging fits
    /// ([`crate::staging::fit`]), else [`relaycc_plan::RouteError::StagingBudget`]. `None` sets no
    /// budget.
    pub staging_budget: Option<u64>,
    /// Build a template of one domain of hosts folded by this shift ([`crate::template`]),
    /// its protocol chosen by the tuner on the template; [`relaycc_plan::RouteError::NotSymmetric`]
    /// where NCCL's plan is not the same on every period of hosts (the double binary tree,
    /// uneven blocks). A template has no NVLS option: NVLS reduces within one switch.
    pub template: Option<&'a dyn crate::template::HostShift>,
    /// A planning call's deadline: the tuner's capped simulations stop there too
    /// (`tune_timed`).
    pub until: Option<Instant>,
    /// The ops and deadline the build runs under ([`crate::Limit`]); `None` builds without
    /// a limit.
    pub limit: Option<&'a crate::limits::Limit>,
    /// Build only this many of the steps that repeat (ring steps per phase, tree chunks per
    /// channel, all_to_all rounds; [`super::PlannerContext::sample_steps`]): a sample for a step-sampled
    /// baseline ([`relaycc_plan::step_samples`]), which delivers nothing. `None` builds every step.
    pub sample_steps: Option<u64>,
}

impl std::fmt::Debug for BaselineOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaselineOptions")
            .field("algo", &self.algo)
            .field("chunk_elems", &self.chunk_elems)
            .field("staging_budget", &self.staging_budget)
            .field(
                "template",
                &self.template.map(|s| (s.period(), s.periods())),
            )
            .field("until", &self.until)
            .field("limit", &self.limit)
            .field("sample_steps", &self.sample_steps)
            .finish()
    }
}

impl BaselineOptions<'_> {
    /// The baseline these options describe (see [`baseline_plan`]).
    pub fn plan(&self, topo: &Topology, req: &Request) -> Result<Plan> {
        self.build(topo, req).map(|t| t.plan)
    }
    /// [`BaselineOptions::plan`] with the tuner's simulation of the plan ([`TunedTime`]): the
    /// planner takes it instead of simulating again.
    pub fn build(&self, topo: &Topology, req: &Request) -> Result<TunedPlan> {
        crate::reach::require_reachable(topo, req, &RelayPolicy::Members)?;
        // One cache for every build of a staging fit and every pass of a windowed build:
        // connections do not depend on the chunk.
        let cache = ConnCache::new(topo, &req.gpus, &RelayPolicy::Members);
        let chunk = self
            .chunk_elems
            .unwrap_or_else(|| super::pipeline_chunk_elems(req))
            .max(1);
        let build = |c| self.build_chunked(topo, req, &cache, c);
        match self.staging_budget {
            Some(budget) => crate::staging::fit(
                chunk,
                crate::staging::min_chunk_elems(req),
                budget,
                self.limit,
                build,
            ),
            None => build(chunk),
        }
    }
    /// The baseline pipelined in chunks of `chunk_elems`, its protocol (and NVLS where the
    /// switch has it and no template is asked for) chosen by the tuner.
    fn build_chunked(
        &self,
        topo: &Topology,
        req: &Request,
        cache: &ConnCache,
        chunk_elems: u64,
    ) -> Result<TunedPlan> {
        if let Some(shift) = self.template {
            let base = crate::template::build_template(topo, shift, self.limit, |w| {
                let ctx = nccl_ctx(cache, chunk_elems, Some(w), self);
                algorithm_plan(topo, req, self.algo, &ctx)
            })?;
            return tune_timed(topo, vec![base], self.until);
        }
        let ctx = nccl_ctx(cache, chunk_elems, None, self);
        let mut options = vec![algorithm_plan(topo, req, self.algo, &ctx)?];
        if relaycc_plan::nvls_support::nvls_switch_for(topo, req).is_some() {
            // Within a staging budget the fitted chunk may be smaller than NVLS's own.
            let chunk = super::nvls::nvls_chunk_elems(req).min(chunk_elems);
            let mut p = super::nvls::all_reduce(topo, req, chunk)?;
            p.algorithm = "nccl-like nvls".into();
            options.push(p);
        }
        tune_timed(topo, options, self.until)
    }
}

/// Plans with this many ops or more are simulated per protocol for at most
/// [`TUNE_SIMULATION_CAP`] each: at that size one simulation can take tens of seconds (NCCL's
/// double binary tree built in full on a 64-node fat-tree, 3M ops). A protocol whose
/// simulation is cut counts at its lower bound (the simulated time reached, the busiest
/// resource's load, the longest op).
pub const TUNE_CAPPED_ABOVE_OPS: usize = 200_000;

/// Wall time one protocol's simulation may take in the tuner, for plans of
/// [`TUNE_CAPPED_ABOVE_OPS`] ops or more: the default planning budget. Within a planning call
/// (`relaycc_route::plan()`) it also stops at the call's deadline, once the tuner had
/// [`crate::limits::LEAST_SIMULATION_GRACE`] (none where it started past the deadline).
pub const TUNE_SIMULATION_CAP: Duration = crate::limits::DEFAULT_BUDGET;

/// The tuner's simulation of the plan it chose, with the default simulator settings: the
/// planner takes it instead of simulating the same plan again (a second of a 146k-op
/// grouped send/recv over 73,728 ranks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunedTime {
    /// Its makespan, or where cut, its lower bound (simulated time reached, busiest resource,
    /// longest op), microseconds.
    pub time_us: f64,
    /// How far the simulation got where [`TUNE_SIMULATION_CAP`] or the deadline cut it.
    pub cut: Option<relaycc_sim::SimCut>,
    /// Wall time the simulation ran.
    pub spent: Duration,
}

/// A baseline plan with the tuner's simulation of it ([`TunedTime`]); it borrows as its plan,
/// so a staging fit ([`crate::staging::fit`]) builds it as one.
#[derive(Debug)]
pub struct TunedPlan {
    /// The plan.
    pub plan: Plan,
    /// The tuner's simulation of it, where the tuner made one.
    pub tuned: Option<TunedTime>,
}

impl std::borrow::Borrow<Plan> for TunedPlan {
    fn borrow(&self) -> &Plan {
        &self.plan
    }
}

/// NCCL's tuner over `options` (plans without a protocol yet): each with every protocol it may
/// use, the fastest kept, with the chosen plan's simulation. NVLS
/// plans use Simple only; LL128 needs NVLink on every link.
///
/// Plans of [`TUNE_CAPPED_ABOVE_OPS`] ops or more are simulated for at most
/// [`TUNE_SIMULATION_CAP`] each and, past `until` (a planning call's deadline), until
/// [`crate::limits::LEAST_SIMULATION_GRACE`] after the tuner started, for all of them together,
/// where it started before `until` (after it, they stop at once): a cut one counts at its
/// lower bound.
fn tune_timed(
    topo: &Topology,
    mut options: Vec<Plan>,
    until: Option<Instant>,
) -> Result<TunedPlan> {
    let cfg = relaycc_sim::SimConfig::default();
    // (time, option, protocol, simulation): the plans are given their protocol in place and
    // never cloned, since a baseline may hold millions of ops.
    let mut best: Option<(f64, usize, Protocol, Option<TunedTime>)> = None;
    // Past `until`, the simulations share one grace, counted from the tuner's start: each
    // protocol taking a grace of its own would pass the deadline once per protocol.
    let tuner_start = Instant::now();
    for (i, base) in options.iter_mut().enumerate() {
        let nvls = base.ops.iter().any(|o| o.nvls.is_some());
        let all_nvlink = base.ops.iter().flat_map(|o| &o.edges).all(|&e| {
            topo.graph()
                .edge_weight(relaycc_topo::LinkId::new(e as usize))
                .is_some_and(|l| l.kind.is_nvlink())
        });
        // Simple first: at large sizes its time rules out the others by their lower bounds,
        // taken from its lowering where that already shows a protocol cannot win.
        let mut simple: Option<relaycc_sim::PreparedSim> = None;
        for p in [Protocol::Simple, Protocol::Ll128, Protocol::Ll] {
            if (nvls && p != Protocol::Simple) || (p == Protocol::Ll128 && !all_nvlink) {
                continue;
            }
            if let (Some(first), Some((t, ..))) = (&simple, &best)
                && first.protocol_load_bound_us(topo.costs(), Protocol::Simple, p) >= *t
            {
                continue;
            }
            base.protocol = Some(p);
            let prepared = relaycc_sim::PreparedSim::new(topo, base, &cfg)?;
            let bound = prepared.lower_bound_us();
            if best.as_ref().is_some_and(|(t, ..)| bound >= *t) {
                continue;
            }
            let (t, timed) = if base.ops.len() >= TUNE_CAPPED_ABOVE_OPS {
                let start = Instant::now();
                let go_on = || {
                    let spent = start.elapsed();
                    spent < TUNE_SIMULATION_CAP
                        && (until.is_none_or(|u| Instant::now() < u)
                            || (until.is_some_and(|u| tuner_start < u)
                                && tuner_start.elapsed() < crate::limits::LEAST_SIMULATION_GRACE))
                };
                let timed = match prepared.simulate_or_cut(topo, &go_on)? {
                    Ok(sim) => TunedTime {
                        time_us: sim.time_us,
                        cut: None,
                        spent: start.elapsed(),
                    },
                    Err(cut) => TunedTime {
                        time_us: cut.reached_us.max(bound),
                        cut: Some(cut),
                        spent: start.elapsed(),
                    },
                };
                (timed.time_us, Some(timed))
            } else {
                let start = Instant::now();
                let time_us = prepared.simulate(topo)?.time_us;
                let timed = TunedTime {
                    time_us,
                    cut: None,
                    spent: start.elapsed(),
                };
                (time_us, Some(timed))
            };
            if best.as_ref().is_none_or(|(bt, ..)| t < *bt) {
                best = Some((t, i, p, timed));
            }
            if p == Protocol::Simple {
                simple = Some(prepared);
            }
        }
    }
    let (_, i, p, timed) =
        best.ok_or_else(|| relaycc_plan::RouteError::BadRequest("no baseline plan".into()))?;
    let mut plan = options.swap_remove(i);
    plan.protocol = Some(p);
    plan.algorithm = format!("{} {}", plan.algorithm, p.name());
    Ok(TunedPlan { plan, tuned: timed })
}

/// The context of NCCL's builds: NCCL's link rule, connections from `cache` (a cache of the
/// request's members under [`RelayPolicy::Members`]), one channel, in `window` where this is a
/// pass of a windowed build, charged to `options`' limit, its ring steps sampled where it
/// asks.
fn nccl_ctx<'c>(
    cache: &'c ConnCache<'c>,
    chunk_elems: u64,
    window: Option<&'c crate::template::Window>,
    options: &BaselineOptions<'c>,
) -> PlannerContext<'c> {
    PlannerContext {
        cache,
        mode: LinkMode::Nccl,
        chunk_elems: chunk_elems.max(1),
        channels: 1,
        window,
        limit: options.limit,
        sample_steps: options.sample_steps,
    }
}

/// The algorithm NCCL runs for `req`, before a protocol is chosen, in `ctx` ([`nccl_ctx`]).
fn algorithm_plan(
    topo: &Topology,
    req: &Request,
    algo: Option<super::baseline_net::tuner::Algo>,
    ctx: &PlannerContext,
) -> Result<Plan> {
    let ctx = *ctx;
    // NCCL runs its rings as channels, each found over what the others left of the links.
    let packed = PlannerContext {
        channels: super::PACKED_RINGS,
        ..ctx
    };
    // Members on several nodes: NCCL's rail-aligned rings, trees and PXN.
    if let Some(plan) = super::baseline_net::plan(topo, req, &ctx, algo)? {
        return Ok(plan);
    }
    let mut plan = match req.collective {
        _ if req.nranks() < 2 => direct::plan(topo, req, &ctx),
        Collective::AllReduce => ring::all_reduce(topo, req, &packed),
        Collective::AllGather => ring::all_gather(topo, req, &packed),
        Collective::ReduceScatter => ring::reduce_scatter(topo, req, &packed),
        Collective::Broadcast => ring::broadcast(topo, req, &ctx),
        Collective::Reduce => ring::reduce(topo, req, &ctx),
        Collective::AllGatherV => broadcasts(req, &ctx),
        Collective::ReduceScatterV => reduces(req, &ctx),
        Collective::AllToAll
        | Collective::AllToAllV
        | Collective::Gather
        | Collective::Scatter
        | Collective::SendRecv => direct::plan(topo, req, &ctx),
    }?;
    let algo = match req.collective {
        Collective::AllGatherV => "broadcast series".to_string(),
        Collective::ReduceScatterV => "reduce series".to_string(),
        Collective::AllToAll
        | Collective::AllToAllV
        | Collective::Gather
        | Collective::Scatter
        | Collective::SendRecv => "grouped send/recv".to_string(),
        _ => plan.algorithm.clone(),
    };
    plan.algorithm = format!("nccl-like {algo}");
    Ok(plan)
}

/// all_gather_v as NCCL users write it: for each rank in turn, a ring broadcast (a pipelined
/// chain from that rank) of its block, each broadcast starting when the previous one ended.
fn broadcasts(req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let order = ring_order(ctx, req, false)?;
    let n = order.len();
    let mut b = PlanBuilder::new(req, ctx, "broadcast series");
    let mut displ = 0u64;
    for k in 0..n as u32 {
        let len = req.counts.get(k as usize).copied().unwrap_or(0);
        let at = order.iter().position(|r| *r == k).unwrap_or(0);
        let chain: Vec<u32> = (0..n).map(|i| order[(at + i) % n]).collect();
        b.send(
            Region::new(BufferRef::Input(k), 0, len),
            Region::new(BufferRef::Output(k), displ, len),
            0,
        )?;
        for (rel, l) in chunks(len, ctx.chunk_elems) {
            for i in 1..n {
                let src = if i == 1 {
                    Region::new(BufferRef::Input(k), rel, l)
                } else {
                    Region::new(BufferRef::Output(chain[i - 1]), displ + rel, l)
                };
                b.send(
                    src,
                    Region::new(BufferRef::Output(chain[i]), displ + rel, l),
                    0,
                )?;
            }
        }
        b.fence();
        displ += len;
    }
    Ok(b.finish())
}

/// reduce_scatter_v as NCCL users write it: for each rank in turn, a ring reduce (a pipelined
/// chain into that rank) of its block, each reduce starting when the previous one ended. A
/// position's partial sums of one chunk are received into, and built in, two staging slots of
/// a chunk, reused chunk after chunk (the builder orders each reuse after its reads).
fn reduces(req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let order = ring_order(ctx, req, false)?;
    let n = order.len();
    let chunk = ctx.chunk_elems.max(1);
    let most = req.counts.iter().copied().max().unwrap_or(0).min(chunk);
    let mut b = PlanBuilder::new(req, ctx, "reduce series");
    if most == 0 {
        return Ok(b.finish());
    }
    let slots: Vec<(BufferRef, BufferRef)> = (0..n as u32)
        .map(|r| (b.scratch(r, most), b.scratch(r, most)))
        .collect();
    let mut displ = 0u64;
    for k in 0..n as u32 {
        let len = req.counts.get(k as usize).copied().unwrap_or(0);
        let at = order.iter().position(|r| *r == k).unwrap_or(0);
        // The chain ends at `k`: it starts one past it on the ring.
        let chain: Vec<u32> = (1..=n).map(|i| order[(at + i) % n]).collect();
        for (rel, l) in chunks(len, chunk) {
            let input = |r: u32| Region::new(BufferRef::Input(r), displ + rel, l);
            for i in 1..n {
                let (from, to) = (chain[i - 1] as usize, chain[i] as usize);
                let src = if i == 1 {
                    input(chain[0])
                } else {
                    Region::new(slots[from].1, 0, l)
                };
                let recv = Region::new(slots[to].0, 0, l);
                b.send(src, recv, 0)?;
                let last = i == n - 1;
                let dst = if last {
                    Region::new(BufferRef::Output(k), rel, l)
                } else {
                    Region::new(slots[to].1, 0, l)
                };
                b.reduce(vec![input(chain[i]), recv], dst, last, 0)?;
            }
        }
        b.fence();
        displ += len;
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::DType;
    use relaycc_plan::{check, check_routes};

    #[test]
    fn dgx1_0_7_goes_through_host_memory() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::new(Collective::AllReduce, vec![0, 7], 1 << 20, DType::F32);
        let p = baseline_plan(&topo, &req).unwrap();
        check(&p).unwrap();
        check_routes(&p, &topo).unwrap();
        assert!(
            p.scratch
                .iter()
                .any(|s| matches!(s.location, relaycc_plan::Location::Host(_)))
        );
        assert!(p.scratch.iter().all(|s| match s.location {
            relaycc_plan::Location::Gpu(g) => g == 0 || g == 7,
            relaycc_plan::Location::Host(_) => true,
        }));
    }

    #[test]
    fn a_protocols_bound_from_simples_lowering_never_exceeds_its_own() {
        let cfg = relaycc_sim::SimConfig::default();
        for (preset, gpus, size) in [
            // No NVLS before sm90: the tuner's plan is the rings, as the bound requires.
            ("dgx-a100", (0..8).collect::<Vec<u32>>(), 1u64 << 28),
            ("dgx-a100", (0..8).collect(), 1 << 16),
            ("dgx1-v100", vec![0, 3, 5, 6], 1 << 26),
        ] {
            let topo = relaycc_topo::preset(preset).unwrap();
            let req = Request::new(Collective::AllReduce, gpus, size, DType::F32);
            let mut plan = baseline_plan(&topo, &req).unwrap();
            assert!(plan.ops.iter().all(|o| o.nvls.is_none()));
            plan.protocol = Some(Protocol::Simple);
            let simple = relaycc_sim::PreparedSim::new(&topo, &plan, &cfg).unwrap();
            for p in [Protocol::Ll128, Protocol::Ll] {
                let quick = simple.protocol_load_bound_us(topo.costs(), Protocol::Simple, p);
                plan.protocol = Some(p);
                let own = relaycc_sim::PreparedSim::new(&topo, &plan, &cfg).unwrap();
                let full = own.lower_bound_us();
                assert!(quick <= full, "{preset} {size} {p:?}: {quick} > {full}");
                // Where the busiest resource rules, they agree: the quick bound loses nothing.
                if own.load_bound_us() >= full * (1.0 - 1e-9) {
                    assert!(
                        quick >= full * (1.0 - 1e-6),
                        "{preset} {p:?}: {quick} << {full}"
                    );
                }
            }
        }
    }

    #[test]
    fn all_gather_v_broadcasts_run_in_series() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let mut req = Request::new(Collective::AllGatherV, vec![0, 1, 2], 0, DType::U8);
        req.counts = vec![5, 0, 3];
        let p = baseline_plan(&topo, &req).unwrap();
        check(&p).unwrap();
        // Rank 2's first copy waits for the end of rank 0's broadcast.
        let late = p.ops.iter().position(|o| {
            matches!(&o.kind,
            relaycc_plan::OpKind::Copy { src, .. } if src.buffer == BufferRef::Input(2))
        });
        assert!(late.is_some_and(|i| !p.ops[i].deps.is_empty()));
    }

    #[test]
    fn reduce_scatter_v_reduces_run_in_series() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        for op in [relaycc_plan::ReduceOp::Sum, relaycc_plan::ReduceOp::Avg] {
            let mut req = Request::new(Collective::ReduceScatterV, vec![0, 1, 2, 5], 0, DType::F32)
                .with_op(op);
            req.counts = vec![5, 0, 300_000, 7];
            let p = baseline_plan(&topo, &req).unwrap();
            assert_eq!(
                p.algorithm.split(' ').take(3).collect::<Vec<_>>(),
                ["nccl-like", "reduce", "series"]
            );
            check(&p).unwrap();
            check_routes(&p, &topo).unwrap();
            // Rank 2's block is reduced only after rank 0's.
            let first_of = |k: u64| {
                p.ops.iter().position(|o| {
                    matches!(&o.kind, relaycc_plan::OpKind::Copy { src, .. }
                        if matches!(src.buffer, BufferRef::Input(_)) && src.offset == k)
                })
            };
            assert!(first_of(5).is_some_and(|i| !p.ops[i].deps.is_empty()));
        }
        let mut zeros = Request::new(Collective::ReduceScatterV, vec![0, 1], 0, DType::F32);
        zeros.counts = vec![0, 0];
        assert!(baseline_plan(&topo, &zeros).unwrap().ops.is_empty());
    }
}
