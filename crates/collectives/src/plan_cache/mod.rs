//! The one place that asks for a plan, and the cache of checked, lowered plans: bounded by a
//! count of plans and by the scratch bytes they hold ([`PlanCacheLimits`]), least recently
//! used first out ([`lru::Lru`], the eviction rule every plan cache of the crate uses, the
//! MPI ranks' included), with its scratch freed on the backend.

pub(crate) mod lru;

use std::sync::{Arc, Mutex, OnceLock};

use relaycc_route::path::RelayPolicy;
use relaycc_route::{Plan, PlanOptions, Request};
use relaycc_topo::Topology;

use crate::backend::{Backend, DeviceMem, Program};
use crate::error::{CollectivesError, Result};
use crate::exec::counts::{CountLayout, CountPieces};
use crate::exec::{self, Executable};
use lru::Lru;

/// Plan `request` over `topo`, allowed to relay through `relays` (besides the members).
///
/// The single seam to the planner: relaycc-route generates candidates, times each with its
/// flow simulator and returns the fastest. On ranks that share one memory (the
/// `host-N` and `shared-gpu-N` presets) the plan is relaycc-route's shared-memory planner's, asked directly (what
/// `relaycc_route::plan` would return there, without the NCCL-like baseline and the
/// simulations it reports beside it, which cost more than the plan at hundreds of ranks), in
/// the in-place layout for in-place calls (its out-of-place broadcast copies the root's input
/// onto its output, which races the other ranks' reads when the two are one buffer), within
/// the staging budget. The executor checks the plan under the call's in-place aliasing before
/// a byte moves.
pub(crate) fn make_plan(
    topo: &Topology,
    request: &Request,
    relays: &[u32],
    in_place: bool,
    staging_budget: u64,
    issue_us: f64,
) -> relaycc_route::Result<Plan> {
    if topo.shares_memory(&request.gpus) {
        let plan = relaycc_route::planner::shared_memory::plan(topo, request, in_place)?;
        if let Some((at, needed)) = relaycc_route::staging::over_budget(&plan, staging_budget) {
            return Err(relaycc_route::staging::budget_error(
                &plan,
                at,
                needed,
                staging_budget,
            ));
        }
        return Ok(plan);
    }
    let options = PlanOptions {
        relay: RelayPolicy::List(relays.to_vec()),
        staging_budget,
        // The executor runs only proved plans: never a template.
        expand: true,
        // Candidates are timed with the backend's cost of enqueuing each op, so a GPU backend
        // is not handed a plan of thousands of small ops whose launches outlast their bytes.
        sim: relaycc_route::SimConfig {
            issue_us,
            ..relaycc_route::SimConfig::default()
        },
        ..PlanOptions::default()
    };
    Ok(relaycc_route::plan(topo, request, &options)?.plan)
}

/// A cached plan: checked and lowered once, with its scratch memory kept for reuse.
///
/// Scratch belongs to one running program at a time. Launches on a backend run one after
/// another, so successive launches (from any thread) reuse the same memory without a race;
/// within one launch, the `k`-th use of the plan (a group with two operations of one shape)
/// binds scratch set `k`, so concurrent programs never share scratch.
#[derive(Debug)]
pub(crate) struct Cached {
    pub exec: Executable,
    sets: Mutex<Vec<Vec<DeviceMem>>>,
    /// A v-collective's capacity plan cut for count binding, on first need; the error says
    /// why the plan cannot be bound (its calls are then planned for their exact counts).
    pieces: OnceLock<std::result::Result<CountPieces, String>>,
    /// Programs bound to a call's counts, kept for the next calls.
    bound: Mutex<Vec<Program>>,
}

impl Cached {
    fn new(exec: Executable, first: Vec<DeviceMem>) -> Self {
        Cached {
            exec,
            sets: Mutex::new(vec![first]),
            pieces: OnceLock::new(),
            bound: Mutex::new(Vec::new()),
        }
    }

    /// This capacity plan of `layout` cut for count binding (once), or `None` when it cannot
    /// be bound ([`CountPieces::new`]).
    pub fn count_pieces(&self, layout: CountLayout) -> Option<&CountPieces> {
        self.pieces
            .get_or_init(|| CountPieces::new(self.exec.plan(), layout).map_err(|e| e.to_string()))
            .as_ref()
            .ok()
    }

    /// A program to bind a call into (a kept one, or a new one).
    pub fn take_bound(&self) -> Program {
        self.bound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_else(|| self.exec.program().clone())
    }

    /// Keep `program` for the next call's binding.
    pub fn give_bound(&self, program: Program) {
        self.bound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(program);
    }

    /// The scratch buffers of use `k` of this plan within one launch, allocated on first need.
    pub fn scratch_set(&self, k: usize, backend: &dyn Backend) -> Result<Vec<DeviceMem>> {
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        while sets.len() <= k {
            sets.push(allocate_set(&self.exec, backend)?);
        }
        Ok(sets[k].clone())
    }

    fn free(&self, backend: &dyn Backend) {
        let sets = std::mem::take(&mut *self.sets.lock().unwrap_or_else(|p| p.into_inner()));
        for m in sets.into_iter().flatten() {
            backend.free(m);
        }
    }
}

/// One set of scratch buffers for `exec`; nothing stays allocated on error.
fn allocate_set(exec: &Executable, backend: &dyn Backend) -> Result<Vec<DeviceMem>> {
    let mut set = Vec::with_capacity(exec.scratch().len());
    for &(loc, bytes) in exec.scratch() {
        match backend.allocate(loc, bytes) {
            Ok(m) => set.push(m),
            Err(e) => {
                for m in set {
                    backend.free(m);
                }
                return Err(e);
            }
        }
    }
    Ok(set)
}

impl Cached {
    /// Scratch bytes one set of this plan's buffers holds.
    fn set_bytes(&self) -> u64 {
        self.exec
            .scratch()
            .iter()
            .map(|(_, b)| *b)
            .fold(0, u64::saturating_add)
    }
    /// Scratch bytes this plan holds now (every set allocated so far).
    pub(crate) fn held_bytes(&self) -> u64 {
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner()).len() as u64;
        self.set_bytes().saturating_mul(sets)
    }
}

/// Where a communicator's plans come from: its topology, the GPUs it may relay through, and
/// the staging budget per device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanSource<'a> {
    pub topo: &'a Topology,
    pub relays: &'a [u32],
    pub staging_budget: u64,
}

/// How much a communicator's plan cache keeps: at most `max_plans` request shapes and at most
/// `max_scratch_bytes` of their scratch memory (summed over devices); the least recently used
/// plan leaves first and its scratch is freed. The plan just made always stays, even alone
/// above the limit (a call needs its plan). A communicator starts with
/// [`PlanCacheLimits::for_ranks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanCacheLimits {
    /// Most request shapes kept (at least 1).
    pub max_plans: usize,
    /// Most scratch bytes kept, over all devices.
    pub max_scratch_bytes: u64,
}

impl PlanCacheLimits {
    /// Default count: a training step's distinct collective shapes (bucketed gradients, a
    /// few parameter gathers) fit many times over.
    pub const DEFAULT_MAX_PLANS: usize = 64;
    /// Default scratch bytes: four default staging budgets per device of an 8-GPU node
    /// ([`relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES`] x 8 x 4).
    pub const DEFAULT_MAX_SCRATCH_BYTES: u64 =
        relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES * 8 * 4;
}

impl PlanCacheLimits {
    /// The limits a communicator of `ranks` ranks starts with: the default byte limit, and
    /// room for [`Self::DEFAULT_MAX_PLANS`] collective shapes plus two point-to-point shapes
    /// per rank. Each pair of ranks that exchange in a group is a shape of its own (a ring's
    /// neighbours, a rank's copy to itself), so a fixed count would make every group of
    /// more pairs than it holds plan them all again on every call.
    pub fn for_ranks(ranks: usize) -> Self {
        PlanCacheLimits {
            max_plans: Self::DEFAULT_MAX_PLANS.saturating_add(ranks.saturating_mul(2)),
            ..Self::default()
        }
    }
}

impl Default for PlanCacheLimits {
    fn default() -> Self {
        PlanCacheLimits {
            max_plans: Self::DEFAULT_MAX_PLANS,
            max_scratch_bytes: Self::DEFAULT_MAX_SCRATCH_BYTES,
        }
    }
}

/// The cache's state behind its lock.
#[derive(Debug, Default)]
struct State {
    plans: Lru<(Request, bool), Arc<Cached>>,
    limits: PlanCacheLimits,
    /// Evicted plans a caller still held when they left: freed once nobody does.
    retired: Vec<Arc<Cached>>,
}

/// Plans per request shape (the request plus in-place), bounded by [`PlanCacheLimits`].
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    state: Mutex<State>,
    /// Held while a miss plans, checks and lowers.
    planning: Mutex<()>,
}

impl PlanCache {
    /// The cached plan for `request`, planning, checking, lowering and allocating on a miss;
    /// a miss may evict the least recently used plans (their scratch freed) to stay within
    /// the limits.
    pub fn get(
        &self,
        call: &'static str,
        source: PlanSource<'_>,
        backend: &dyn Backend,
        request: &Request,
        in_place: bool,
    ) -> Result<Arc<Cached>> {
        let key = (request.clone(), in_place);
        let hit = |cache: &Self| {
            let mut st = cache.lock();
            if st.plans.touch(&key) {
                st.plans.peek(&key).cloned()
            } else {
                None
            }
        };
        if let Some(p) = hit(self) {
            return Ok(p);
        }
        // One miss plans at a time: ranks that call per rank miss the same shape together,
        // and a thousand of them planning it at once would hold a thousand proofs in memory.
        let _planning = self.planning.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = hit(self) {
            return Ok(p);
        }
        let plan = make_plan(
            source.topo,
            request,
            source.relays,
            in_place,
            source.staging_budget,
            backend.op_issue_us(),
        )
        .map_err(|e| CollectivesError::Plan { call, source: e })?;
        let exec = exec::compile(exec::check(plan, in_place)?)?;
        // Make room before allocating, so the new plan's scratch does not come on top of
        // plans that would leave anyway.
        let incoming = exec
            .scratch()
            .iter()
            .map(|(_, b)| *b)
            .fold(0, u64::saturating_add);
        self.evict(backend, 1, incoming);
        // The first set now, so that a plan whose scratch does not fit fails here.
        let first = allocate_set(&exec, backend)?;
        let cached = Arc::new(Cached::new(exec, first));
        // No other miss planned meanwhile (`planning` is held), so the shape is new here.
        let mut st = self.lock();
        if let Some(old) = st.plans.insert(key, cached.clone()) {
            st.retired.push(old);
        }
        Ok(cached)
    }

    /// Evict least recently used plans until `plans` more plans holding `bytes` more scratch
    /// fit the limits (or nothing is left to evict), freeing the scratch of those no caller
    /// holds, and of earlier evicted ones no caller holds any longer.
    fn evict(&self, backend: &dyn Backend, plans: usize, bytes: u64) {
        let mut freed = Vec::new();
        {
            let mut st = self.lock();
            let limits = st.limits;
            let evicted = st.plans.evict_to_fit(limits, plans, bytes);
            st.retired.extend(evicted);
            // Nobody but the cache holds a retired plan whose count is 1: no launch can be
            // about to use its scratch.
            let retired = std::mem::take(&mut st.retired);
            for c in retired {
                if Arc::strong_count(&c) == 1 {
                    freed.push(c);
                } else {
                    st.retired.push(c);
                }
            }
        }
        for c in freed {
            c.free(backend);
        }
    }

    /// Number of cached plans.
    pub fn len(&self) -> usize {
        self.lock().plans.len()
    }

    /// Scratch bytes the cached plans hold, over all devices.
    pub fn scratch_bytes(&self) -> u64 {
        self.lock().plans.held_bytes()
    }

    /// The limits in force.
    pub fn limits(&self) -> PlanCacheLimits {
        self.lock().limits
    }

    /// New limits; plans beyond them leave at once (least recently used first).
    pub fn set_limits(&self, limits: PlanCacheLimits, backend: &dyn Backend) {
        self.lock().limits = limits;
        self.evict(backend, 0, 0);
    }

    /// Release every cached plan's scratch memory (plans a caller still holds are freed once
    /// it lets them go, at the next eviction or clear, or when the cache is dropped).
    pub fn clear(&self, backend: &dyn Backend) {
        let drained: Vec<Arc<Cached>> = {
            let mut st = self.lock();
            let mut v: Vec<Arc<Cached>> = st.plans.drain().collect();
            v.append(&mut st.retired);
            v
        };
        let mut kept = Vec::new();
        for c in drained {
            if Arc::strong_count(&c) == 1 {
                c.free(backend);
            } else {
                kept.push(c);
            }
        }
        self.lock().retired.extend(kept);
    }

    /// Free everything, held or not (the communicator is going away: no call is in flight
    /// that has not been submitted, and frees wait for submitted launches).
    pub fn clear_all(&self, backend: &dyn Backend) {
        let drained: Vec<Arc<Cached>> = {
            let mut st = self.lock();
            let mut v: Vec<Arc<Cached>> = st.plans.drain().collect();
            v.append(&mut st.retired);
            v
        };
        for c in drained {
            c.free(backend);
        }
    }

    /// An empty cache with `limits`.
    pub fn with_limits(limits: PlanCacheLimits) -> Self {
        PlanCache {
            state: Mutex::new(State {
                limits,
                ..State::default()
            }),
            planning: Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
