//! # relaycc-planners: every way relaycc builds a plan
//!
//! Point-to-point routes, the collective planners, the NCCL-like baseline, node-aware
//! strategies, templates and staging budgets: each produces a [`Plan`] of relaycc-plan's IR,
//! and the simulator (relaycc-sim) times it. Choosing among them is relaycc-route's job.
//!
//! | what | where |
//! |---|---|
//! | whether a masked machine can carry a request at all | [`require_reachable`] |
//! | chunked, pipelined lowering of routes | [`route_pipeline`] |
//! | point-to-point candidates | [`p2p`] |
//! | collective candidates and the NCCL-like baseline | below, and [`baseline`] |
//! | node-aware inter-node strategies and models | [`nodeaware`] |
//! | staging budgets per device and fitting a plan to one | [`staging`] |
//! | templates: one domain of a plan on hosts that repeat, folded by their symmetry | [`template`] |
//! | planning budgets: op counts and deadlines | [`Limit`], [`CallOps`] |
//!
//! Invariant: this crate imports nothing from relaycc-route; Cargo enforces it.
//!
//! ## Collective planners
//!
//! Collective planners: one algorithm per file, each a `fn(&Topology, &Request, &PlannerContext) ->
//! Result<Plan>` producing a complete [`Plan`], plus the NCCL-like baseline.
//!
//! | collective | candidates |
//! |---|---|
//! | all_reduce | [`ring::all_reduce`] (1 or 2 channels, or packed rings: [`ring_pack`]), [`pipelined_tree::all_reduce`], [`hierarchical::all_reduce`], [`direct::plan`] (small requests) |
//! | all_gather, all_gather_v | [`ring::all_gather`] (1 or 2 channels, or packed rings), [`direct::plan`] (small requests) |
//! | reduce_scatter, reduce_scatter_v | [`ring::reduce_scatter`] (1 or 2 channels, or packed rings), [`direct::plan`] (small requests) |
//! | broadcast, reduce | [`ring::broadcast`], [`ring::reduce`] (pipelined chains), [`pipelined_tree::broadcast`], [`pipelined_tree::reduce`], [`direct::plan`] (small requests) |
//! | all_to_all(_v), gather, scatter, send_recv | [`direct::plan`] |
//!
//! On several nodes with the same number of ranks each, all_reduce, all_gather and
//! reduce_scatter also get the rail-hierarchical plans of [`cluster`], and all_to_all its
//! node-aware 2-step plan; above [`FLAT_MAX_CLUSTER_RANKS`] ranks of several nodes they replace
//! the flat families.
//!
//! Every candidate is built in each [`LinkMode`] relaycc may use ([`LinkMode::Single`],
//! [`LinkMode::Multipath`]) and each chunk size asked for; the orchestrator simulates them and
//! keeps the fastest (direct only up to [`DIRECT_SMALL_BYTES`] where other candidates
//! exist). Every op enters its plan through one writer (`plan_writer.rs`) that derives all
//! data dependencies, so every plan is race-free for the out-of-place call;
//! [`supports_in_place`] says whether it also serves the in-place call.

#![deny(missing_docs)]

use rayon::prelude::*;
use relaycc_topo::Topology;

use relaycc_plan::Plan;
use relaycc_plan::path::RelayPolicy;
use relaycc_plan::{CheckOptions, check_with};
use relaycc_plan::{Collective, Request};
use relaycc_plan::{Result, RouteError};

mod access;
pub mod baseline;
pub mod baseline_net;
pub(crate) mod builder;
pub(crate) mod channels;
pub mod cluster;
pub mod connect;
mod context;
pub mod direct;
pub mod hierarchical;
pub mod nvls;
pub mod pipelined_tree;
mod plan_writer;
pub mod ranks;
pub mod ring;
pub mod ring_order;
pub mod ring_pack;
pub mod shared_memory;

pub mod limits;
pub mod nodeaware;
pub mod p2p;
mod reach;
pub mod route_pipeline;
pub mod staging;
pub mod template;

pub use limits::{
    CANDIDATE_OPS, CallOps, DEFAULT_BUDGET, LEAST_BUILD_TIME, LEAST_SIMULATION_GRACE, LargeBuild,
    Limit, MAX_CALL_OPS,
};
pub use reach::{require_reachable, require_relays_exist};

pub use baseline::{BaselineOptions, baseline_plan};
pub use builder::CH_STRIDE;
pub use connect::{ConnCache, Connection, LinkMode, connect};
pub use context::{
    CHUNKS_PER_BLOCK, DEFAULT_CHUNK_BYTES, PACKED_RINGS, PlannerContext, PlannerFn, RECV_SLOTS,
    pipeline_chunk_elems,
};
pub(crate) use context::{chunks, links_and_chunk, name, split_even};
pub use relaycc_sim::collective_bound_gbps as bound_gbps;

/// Largest request (nccl-tests size, bytes) for which the one-step direct plan is tried for
/// collectives that other candidates serve bandwidth-optimally (all_reduce, all_gather(_v),
/// reduce_scatter, broadcast, reduce): beyond it direct moves (n-1) x S into each rank and only
/// costs planning and simulation time. Two ranks always try it (there it is a ring).
pub const DIRECT_SMALL_BYTES: u64 = 4 << 20;

/// The candidates tried for a request: [`planners_for`] its collective and rank count, less
/// the direct plan above [`DIRECT_SMALL_BYTES`] on more than two ranks.
fn specs(req: &Request) -> Vec<(PlannerFn, u32)> {
    let n = req.nranks();
    let mut v = planners_for(req.collective, n);
    if n > 2 && req.size_bytes() > DIRECT_SMALL_BYTES && v.len() > 1 {
        v.pop();
    }
    v
}

/// Every collective planner the orchestrator may try for collective `c` on `n` ranks, with its
/// channel count: (planner, channels), the direct plan last.
pub fn planners_for(c: Collective, n: usize) -> Vec<(PlannerFn, u32)> {
    let d: (PlannerFn, u32) = (direct::plan, 1);
    if n <= 1 {
        return vec![d];
    }
    match c {
        Collective::AllReduce => vec![
            (ring::all_reduce, 1),
            (ring::all_reduce, 2),
            (ring::all_reduce, PACKED_RINGS),
            (pipelined_tree::all_reduce, 1),
            (hierarchical::all_reduce, 1),
            d,
        ],
        Collective::AllGather | Collective::AllGatherV => {
            vec![
                (ring::all_gather, 1),
                (ring::all_gather, 2),
                (ring::all_gather, PACKED_RINGS),
                d,
            ]
        }
        Collective::ReduceScatter | Collective::ReduceScatterV => vec![
            (ring::reduce_scatter, 1),
            (ring::reduce_scatter, 2),
            (ring::reduce_scatter, PACKED_RINGS),
            d,
        ],
        Collective::Broadcast => vec![
            (ring::broadcast, 1),
            (ring::broadcast, 2),
            (pipelined_tree::broadcast, 1),
            d,
        ],
        Collective::Reduce => vec![
            (ring::reduce, 1),
            (ring::reduce, 2),
            (pipelined_tree::reduce, 1),
            d,
        ],
        _ => vec![d],
    }
}

/// Multi-path candidates are built only when some member pair's max-flow split beats its best
/// single route by this factor (a saturated NVSwitch port gains only the PCIe path, ~7%).
pub const MULTIPATH_MIN_GAIN: f64 = 1.1;

/// The candidate algorithms of one collective request (planner, link mode, channels), sharing
/// one connection cache, each buildable at any chunk size. [`collective_candidates`] builds
/// them all; the orchestrator builds them first with [`whole_block_chunk_elems`] to bound each
/// one's time cheaply, and at full detail only those that can still win.
pub struct Candidates<'t> {
    req: Request,
    cache: ConnCache<'t>,
    jobs: Vec<(LinkMode, PlannerFn, u32)>,
    skipped: Vec<String>,
    budget: u64,
}

/// Largest request (ranks) spanning several nodes for which the flat candidates (rings, packed
/// rings, trees, per-socket hierarchical over every rank) and multi-path connections are
/// built. Above it their cost grows as n^2 connections (each a widest-path search, a max-flow
/// for multi-path) and O(n^2) ops per ring plan, and on like nodes the rail-hierarchical plans
/// ([`cluster`]) serve the request in O(n (g + N)) ops.
pub const FLAT_MAX_CLUSTER_RANKS: usize = 16;

/// The hierarchical cluster planner of collective `c`, if it has one.
fn cluster_planner(c: Collective) -> Option<PlannerFn> {
    match c {
        Collective::AllReduce => Some(cluster::all_reduce),
        Collective::AllGather => Some(cluster::all_gather),
        Collective::ReduceScatter => Some(cluster::reduce_scatter),
        Collective::AllToAll => Some(cluster::all_to_all),
        _ => None,
    }
}

impl<'t> Candidates<'t> {
    /// The candidates for `req` on `topo` with relay policy `relay`: rings, trees,
    /// hierarchical, direct (see the module table), in [`LinkMode::Single`] and, where some
    /// member pair's split beats its best single route by [`MULTIPATH_MIN_GAIN`], also
    /// [`LinkMode::Multipath`]. An error when the request is malformed, names a GPU the
    /// topology lacks or one masked, or moves data between members no path joins
    /// ([`crate::require_reachable`]).
    ///
    /// Complexity: one max-flow per member pair and mode (connections are cached for
    /// [`Candidates::build`]).
    pub fn new(topo: &'t Topology, req: &Request, relay: &RelayPolicy) -> Result<Self> {
        crate::reach::require_reachable(topo, req, relay)?;
        let cache = ConnCache::new(topo, &req.gpus, relay);
        let n = req.gpus.len();
        let mut skipped = Vec::new();
        let shape = cluster::ClusterShape::of(topo, req)?;
        let hosts = {
            let mut h: Vec<u32> = req
                .gpus
                .iter()
                .map(|&g| Ok(topo.node(topo.gpu(g)?).host))
                .collect::<Result<_>>()?;
            h.sort_unstable();
            h.dedup();
            h.len()
        };
        let hier = shape.as_ref().and(cluster_planner(req.collective));
        // Flat candidates over many ranks of several nodes cost n^2 connections; where the
        // rail-hierarchical plan exists they are left out, elsewhere only their multi-path
        // form (a max-flow per pair) is.
        let many = hosts > 1 && n > FLAT_MAX_CLUSTER_RANKS;
        let flat = !(many && hier.is_some());
        // Where relaycc's only candidate is the direct plan, n^2 copies on n^2 lanes, it is the
        // baseline's plan over other link rules; on many ranks of several nodes the baseline's
        // stands for it rather than building, simulating and proving a second one.
        let only_direct = specs(req).len() == 1;
        if many && only_direct {
            skipped.push(format!(
                "direct plan over {n} ranks of {hosts} nodes: n^2 copies on n^2 lanes above \
                 {FLAT_MAX_CLUSTER_RANKS} ranks (the baseline's direct plan serves it)"
            ));
        }
        let flat = flat && !(many && only_direct);
        if !flat && !only_direct {
            skipped.push(format!(
                "flat rings, trees and direct plans over {n} ranks of {hosts} nodes: O(n^2) \
                 connections and ops above {FLAT_MAX_CLUSTER_RANKS} ranks (rail-hierarchical \
                 plans serve it)"
            ));
        }
        let try_multipath = hosts <= 1 || n <= FLAT_MAX_CLUSTER_RANKS;
        if !try_multipath {
            skipped.push(format!(
                "multi-path connections over {n} ranks of {hosts} nodes: a max-flow per rank \
                 pair above {FLAT_MAX_CLUSTER_RANKS} ranks"
            ));
        }
        // Multi-path plans are several times larger; build them only where splitting pays.
        let split_pays = try_multipath
            && (0..n).any(|a| {
                (0..n).any(|b| {
                    let (x, y) = (req.gpus[a], req.gpus[b]);
                    a != b
                        && cache.gbps(LinkMode::Multipath, x, y)
                            > MULTIPATH_MIN_GAIN * cache.gbps(LinkMode::Single, x, y)
                })
            });
        let modes: &[LinkMode] = if split_pays && n > 1 {
            &[LinkMode::Single, LinkMode::Multipath]
        } else {
            &[LinkMode::Single]
        };
        let mut jobs: Vec<(LinkMode, PlannerFn, u32)> = Vec::new();
        if let Some(p) = hier {
            // A cluster all_reduce reads `channels` as its loop count: one candidate each.
            let loops = match &shape {
                Some(sh) if req.collective == Collective::AllReduce => {
                    cluster::all_reduce_loops(req, sh)
                }
                _ => vec![1],
            };
            jobs.extend(loops.iter().map(|&l| (LinkMode::Single, p, l)));
        }
        if flat {
            jobs.extend(modes.iter().flat_map(|&mode| {
                specs(req)
                    .into_iter()
                    .filter(move |(_, ch)| *ch != PACKED_RINGS || ring_pack::packs(mode))
                    .map(move |(p, ch)| (mode, p, ch))
            }));
        }
        Ok(Candidates {
            req: req.clone(),
            cache,
            jobs,
            skipped,
            budget: crate::staging::UNBOUNDED_STAGING,
        })
    }
    /// The candidate families left out for this request, each with the reason.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }
    /// The same candidates, each fitted by [`Candidates::build`] to `budget` bytes of staging
    /// per device ([`crate::staging::fit`]).
    pub fn with_budget(mut self, budget: u64) -> Self {
        self.budget = budget;
        self
    }
    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
    /// Build candidate `i` (< [`Candidates::len`]) with pipelining chunks of `chunk_elems`
    /// elements, charging its ops to `limit` ([`crate::Limit`]; `None`: no limit). A
    /// [`RouteError::NoRoute`] when the candidate finds no routes; [`RouteError::BadRequest`]
    /// for an index out of range; [`RouteError::OverLimit`] once `limit` is passed.
    ///
    /// Within a staging budget ([`Candidates::with_budget`]) the chunk shrinks until every
    /// device's staging fits ([`crate::staging::fit`]); [`RouteError::StagingBudget`] when even
    /// the smallest chunk ([`crate::staging::min_chunk_elems`]) does not.
    pub fn build(&self, i: usize, chunk_elems: u64, limit: Option<&Limit>) -> Result<Plan> {
        crate::staging::fit(
            chunk_elems,
            crate::staging::min_chunk_elems(&self.req),
            self.budget,
            limit,
            |c| self.build_unfitted(i, c, limit),
        )
    }
    /// [`Candidates::build`] as a template of one domain of hosts folded by `shift`
    /// ([`crate::template::build_template`]); [`RouteError::NotSymmetric`] when the candidate
    /// is not the same on every period of hosts.
    pub fn build_template(
        &self,
        i: usize,
        chunk_elems: u64,
        shift: &dyn crate::template::HostShift,
        limit: Option<&Limit>,
    ) -> Result<Plan> {
        crate::staging::fit(
            chunk_elems,
            crate::staging::min_chunk_elems(&self.req),
            self.budget,
            limit,
            |c| {
                crate::template::build_template(self.cache.topo(), shift, limit, |w| {
                    self.build_in(i, c, Some(w), limit)
                })
            },
        )
    }
    /// Build candidate `i` with chunks of `chunk_elems` whatever its staging (for bounds on
    /// its time: the same bytes cross the same resources at any chunk), under `limit`.
    pub fn build_unfitted(
        &self,
        i: usize,
        chunk_elems: u64,
        limit: Option<&Limit>,
    ) -> Result<Plan> {
        self.build_in(i, chunk_elems, None, limit)
    }
    /// [`Candidates::build_unfitted`] in `window` (a pass of a windowed build) or in full.
    pub(crate) fn build_in(
        &self,
        i: usize,
        chunk_elems: u64,
        window: Option<&crate::template::Window>,
        limit: Option<&Limit>,
    ) -> Result<Plan> {
        let &(mode, planner, channels) = self.jobs.get(i).ok_or_else(|| {
            RouteError::BadRequest(format!("candidate {i} of {}", self.jobs.len()))
        })?;
        let ctx = PlannerContext {
            cache: &self.cache,
            mode,
            chunk_elems: chunk_elems.max(1),
            channels,
            window,
            limit,
            sample_steps: None,
        };
        planner(self.cache.topo(), &self.req, &ctx)
    }
}

/// A chunk (elements) no block of `req` exceeds: plans built with it move the same bytes over
/// the same links and memories as with any smaller chunk, in the fewest ops, so their resource
/// loads bound the finely chunked plans' times at a fraction of the building cost.
pub fn whole_block_chunk_elems(req: &Request) -> u64 {
    req.counts
        .iter()
        .copied()
        .fold(req.count, u64::max)
        .saturating_mul(req.nranks().max(1) as u64)
        .max(1)
}

/// Every candidate plan for a collective request.
///
/// # Arguments
/// - `topo`: the masked topology;
/// - `req`: the request (any collective of [`Collective::ALL`]);
/// - `relay`: which GPUs may relay;
/// - `chunk_elems`: pipelining chunk sizes to try, elements (empty: [`DEFAULT_CHUNK_BYTES`]).
///
/// # Returns
/// The candidates (rings, trees, hierarchical, direct, each with [`LinkMode::Single`] and
/// [`LinkMode::Multipath`] connections and each chunk size), in a deterministic order; an
/// error when the request is malformed or no candidate finds routes.
///
/// # Complexity
/// Connections are computed once per rank pair and mode (a max-flow each), shared by the
/// candidates, which are built in parallel (rayon's pool); each plan has
/// O(steps x chunks x routes x hops) ops; the ring order search is bounded by
/// [`ring_order::RING_SEARCH_BUDGET`].
///
/// Source: [Temucin-2021] (hierarchical all_reduce, multi-path copies), [Ranganath-2019]
/// (relays through idle GPUs), NCCL's rings and trees ([NCCL-src]).
pub fn collective_candidates(
    topo: &Topology,
    req: &Request,
    relay: &RelayPolicy,
    chunk_elems: &[u64],
) -> Result<Vec<Plan>> {
    let set = Candidates::new(topo, req, relay)?;
    let mut sizes: Vec<u64> = chunk_elems.iter().map(|c| (*c).max(1)).collect();
    sizes.dedup();
    if sizes.is_empty() {
        sizes.push((DEFAULT_CHUNK_BYTES / req.dtype.size()).max(1));
    }
    let jobs: Vec<(u64, usize)> = sizes
        .iter()
        .flat_map(|&chunk| (0..set.len()).map(move |i| (chunk, i)))
        .collect();
    // Candidates are independent: build them in parallel, keeping the job order.
    let built: Vec<Result<Plan>> = jobs
        .into_par_iter()
        .map(|(chunk, i)| set.build(i, chunk, None))
        .collect();
    keep_routable(built)
}

/// The plans of `built`, in order, skipping candidates that found no route or do not fit the
/// staging budget; the first such error when none did, and any other error at once.
pub(crate) fn keep_routable<T>(built: Vec<Result<T>>) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(built.len());
    let mut first_err: Option<RouteError> = None;
    for b in built {
        match b {
            Ok(p) => out.push(p),
            Err(e @ (RouteError::NoRoute { .. } | RouteError::StagingBudget { .. })) => {
                first_err.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match (out.is_empty(), first_err) {
        (true, Some(e)) => Err(e),
        _ => Ok(out),
    }
}

/// True when `plan` also serves the in-place call (input and output sharing memory as NCCL
/// defines it): the plan checks under [`CheckOptions::in_place`].
///
/// Complexity: one symbolic check of the plan.
pub fn supports_in_place(plan: &Plan) -> bool {
    check_with(plan, CheckOptions { in_place: true }).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// reduce_scatter_v, counts with a zero and one block of many chunks: every candidate
    /// (rings of 1, 2 and packed channels, direct) at a small chunk loops over its blocks,
    /// stages at most its loops' partials, and is proved in place and out of place; so is the
    /// baseline's series of reduces.
    #[test]
    fn reduce_scatter_v_candidates_loop_and_prove() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let mut req = Request::new(
            Collective::ReduceScatterV,
            vec![0, 2, 5, 7],
            0,
            relaycc_plan::DType::F32,
        )
        .with_op(relaycc_plan::ReduceOp::Avg);
        req.counts = vec![5, 0, 3000, 7];
        let chunk = 64;
        let cands = Candidates::new(&topo, &req, &RelayPolicy::Any).unwrap();
        assert!(cands.len() >= 4);
        for i in 0..cands.len() {
            let p = cands.build(i, chunk, None).unwrap();
            for in_place in [false, true] {
                check_with(&p, CheckOptions { in_place })
                    .unwrap_or_else(|e| panic!("{} in place {in_place}: {e}", p.algorithm));
            }
            if p.algorithm.contains("ring") {
                // Per position: two steps of received and own partials of one loop.
                let most = 4 * ring::LOOP_CHUNKS * chunk;
                assert!(p.scratch.iter().all(|s| s.len <= most), "{}", p.algorithm);
            }
        }
        let base = baseline::BaselineOptions {
            chunk_elems: Some(chunk),
            ..Default::default()
        }
        .plan(&topo, &req)
        .unwrap();
        check_with(&base, CheckOptions { in_place: false }).unwrap();
    }

    #[test]
    fn splitting_helpers() {
        assert_eq!(split_even(7, 3), vec![(0, 3), (3, 2), (5, 2)]);
        assert_eq!(split_even(0, 2), vec![(0, 0), (0, 0)]);
        let c: Vec<_> = chunks(10, 4).collect();
        assert_eq!(c, vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(chunks(0, 4).count(), 0);
    }
}
