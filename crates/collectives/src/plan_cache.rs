//! The one place that asks for a plan, and the cache of checked, lowered plans.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use relaycc_route::path::RelayPolicy;
use relaycc_route::{Plan, PlanOptions, Request};
use relaycc_topo::Topology;

use crate::backend::{Backend, DeviceMem};
use crate::error::{CollectivesError, Result};
use crate::exec::{self, Executable};

/// Plan `request` over `topo`, allowed to relay through `relays` (besides the members).
///
/// The single seam to the planner: relaycc-route generates candidates, times each with its
/// flow simulator and returns the fastest (or, on ranks that share one host memory, the
/// `host-N` preset, its shared-memory plan, in the in-place layout for in-place calls: its
/// out-of-place broadcast copies the root's input onto its output, which races the other
/// ranks' reads when the two are one buffer). The executor checks the plan under the call's
/// in-place aliasing before a byte moves.
pub(crate) fn make_plan(
    topo: &Topology,
    request: &Request,
    relays: &[u32],
    in_place: bool,
) -> relaycc_route::Result<Plan> {
    if in_place && topo.shares_host_memory(&request.gpus) {
        return relaycc_route::planner::shared_memory::plan(topo, request, true);
    }
    let options = PlanOptions {
        relay: RelayPolicy::List(relays.to_vec()),
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
}

impl Cached {
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

/// Where a communicator's plans come from: its topology and the GPUs it may relay through.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanSource<'a> {
    pub topo: &'a Topology,
    pub relays: &'a [u32],
}

/// Plans per request shape (the request plus in-place).
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    map: Mutex<HashMap<(Request, bool), Arc<Cached>>>,
}

impl PlanCache {
    /// The cached plan for `request`, planning, checking, lowering and allocating on a miss.
    pub fn get(
        &self,
        call: &'static str,
        source: PlanSource<'_>,
        backend: &dyn Backend,
        request: &Request,
        in_place: bool,
    ) -> Result<Arc<Cached>> {
        let key = (request.clone(), in_place);
        if let Some(c) = self.lock().get(&key) {
            return Ok(c.clone());
        }
        let plan = make_plan(source.topo, request, source.relays, in_place)
            .map_err(|e| CollectivesError::Plan { call, source: e })?;
        let exec = exec::compile(exec::check(plan, in_place)?)?;
        // The first set now, so that a plan whose scratch does not fit fails here.
        let first = allocate_set(&exec, backend)?;
        let cached = Arc::new(Cached {
            exec,
            sets: Mutex::new(vec![first]),
        });
        // Another thread may have planned the same shape meanwhile: keep one, free the other.
        let kept = self
            .lock()
            .entry(key)
            .or_insert_with(|| cached.clone())
            .clone();
        if !Arc::ptr_eq(&kept, &cached) {
            cached.free(backend);
        }
        Ok(kept)
    }

    /// Number of cached plans.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Release every cached plan's scratch memory.
    pub fn clear(&self, backend: &dyn Backend) {
        let drained: Vec<Arc<Cached>> = self.lock().drain().map(|(_, v)| v).collect();
        for c in drained {
            c.free(backend);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Request, bool), Arc<Cached>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}
