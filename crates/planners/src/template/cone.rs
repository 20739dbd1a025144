//! The op cone of sampled ranks: the ops of the full plan that the outputs of a few ranks
//! depend on, cut out of a template (or of a full plan) as a plan of their own, so that an
//! executor can run the sampled ranks' programs, and their peers' parts that feed them, on
//! real bytes without building the whole plan.
//!
//! The cone starts at every op that writes a sampled rank's output buffer and follows
//! dependencies backwards. The plan builders derive every dependency from the ops' accesses
//! (`builder.rs`), so the last writer of every element a cone op reads is a dependency
//! of it, direct or through other ops, and lies in the cone: the sampled outputs come out of
//! the cone exactly as out of the full plan. Lane order is kept among the cone's ops (they keep
//! their order of global ids, which is their lanes' order), but ops a lane runs in between are
//! left out; a plan that relied on lane order alone for a data hazard would leave a read
//! unwritten in its cone, and the cone's execution, compared with the reference, would report
//! it rather than hide it.

use std::collections::{HashMap, HashSet};

use relaycc_topo::Topology;

use super::expand::Expansion;
use relaycc_plan::{BufferRef, OpKind, Plan};
use relaycc_plan::{Result, RouteError};

fn bad(message: String) -> RouteError {
    RouteError::PlanCheck {
        op: usize::MAX,
        message,
    }
}

/// The ops of a full plan that some ranks' outputs depend on, as a plan: the full request,
/// the cone's ops renumbered in the order of their global ids (dependencies renumbered with
/// them), and only the lanes and staging buffers they use. Ranks outside [`OpCone::ranks`]
/// may have outputs the cone writes only in part.
#[derive(Debug, Clone)]
pub struct OpCone {
    /// The cone as a plan (no template: every op is one of the full plan's).
    pub plan: Plan,
    /// The sampled ranks, whose outputs the cone writes completely.
    pub ranks: Vec<u32>,
    /// The full plan's id of each of the cone's ops.
    pub global_ids: Vec<u64>,
    /// Ops of the full plan.
    pub full_ops: u64,
}

/// The op cone of `ranks`' outputs in template (or full plan) `plan`, planned on `topo`;
/// `None` when it would hold more than `max_ops` ops (sample fewer ranks, or a smaller
/// request).
///
/// # Errors
/// Those of [`Expansion::new`]; [`RouteError::PlanCheck`] when a rank is not one of the
/// request's or a dependency names no op.
///
/// Complexity: O(cone ops x (dependencies + regions)) with hash-map lookups, plus a scan of
/// the template's ops for the writers of the sampled outputs.
pub fn extract_cone(
    plan: &Plan,
    topo: &Topology,
    ranks: &[u32],
    max_ops: usize,
) -> Result<Option<OpCone>> {
    let ex = Expansion::new(plan, topo)?;
    let n = plan.request.gpus.len() as u32;
    let (per, periods) = (ex.ranks_per_period(), ex.periods());
    let ops = ex.ops_per_period();
    let mut ranks: Vec<u32> = ranks.to_vec();
    ranks.sort_unstable();
    ranks.dedup();
    if let Some(r) = ranks.iter().find(|r| **r >= n) {
        return Err(bad(format!(
            "rank {r} is not one of the request's {n} ranks"
        )));
    }
    // The roots: every op writing a sampled rank's output. Template op `i` writing
    // `Output(t)` writes `Output((t + k x per) mod n)` on period `k`.
    let mut stack: Vec<u64> = Vec::new();
    for (i, op) in plan.ops.iter().enumerate() {
        let dst = match &op.kind {
            OpKind::Copy { dst, .. } | OpKind::Reduce { dst, .. } => dst,
        };
        let BufferRef::Output(t) = dst.buffer else {
            continue;
        };
        for &r in &ranks {
            let d = (u64::from(r) + u64::from(n) - u64::from(t) % u64::from(n)) % u64::from(n);
            if d % u64::from(per) == 0 && d / u64::from(per) < u64::from(periods) {
                let k = d / u64::from(per);
                stack.push(k * u64::from(ops) + i as u64);
            }
        }
    }
    let full_ops = ex.full_ops();
    let mut seen: HashSet<u64> = stack.iter().copied().collect();
    if seen.len() > max_ops {
        return Ok(None);
    }
    while let Some(g) = stack.pop() {
        let (k, i) = ((g / u64::from(ops)) as u32, (g % u64::from(ops)) as u32);
        let t = &plan.ops[i as usize];
        for (j, d) in t.deps.iter().enumerate() {
            if *d >= ops {
                return Err(bad(format!("op {i} depends on op {d} of {ops}")));
            }
            let dg = u64::from(ex.dep_period(k, i, j as u32)) * u64::from(ops) + u64::from(*d);
            if seen.insert(dg) {
                if seen.len() > max_ops {
                    return Ok(None);
                }
                stack.push(dg);
            }
        }
    }
    let mut global_ids: Vec<u64> = seen.into_iter().collect();
    global_ids.sort_unstable();
    let index: HashMap<u64, u32> = global_ids
        .iter()
        .enumerate()
        .map(|(x, g)| (*g, x as u32))
        .collect();

    let mut cone = Plan::new(plan.request.clone(), format!("{} (cone)", plan.algorithm));
    cone.dtype = plan.dtype;
    cone.protocol = plan.protocol;
    let lanes_per = plan.lanes.len() as u32;
    let scratch_per = ex.scratch_per_period().max(1);
    let mut lane_of: HashMap<u32, u32> = HashMap::new();
    let mut scratch_of: HashMap<u32, u32> = HashMap::new();
    cone.ops.reserve(global_ids.len());
    for &g in &global_ids {
        let (k, i) = ((g / u64::from(ops)) as u32, (g % u64::from(ops)) as u32);
        let mut op = ex.op(k, i)?;
        let lane = op.lane;
        op.lane = *lane_of.entry(lane).or_insert_with(|| {
            cone.lanes.push(ex.lane(lane / lanes_per, lane % lanes_per));
            cone.lanes.len() as u32 - 1
        });
        for d in &mut op.deps {
            *d = index.get(&u64::from(*d)).copied().ok_or_else(|| {
                bad(format!(
                    "op {g} of the full plan depends on op {d}, outside its cone"
                ))
            })?;
        }
        let regions: Vec<&mut relaycc_plan::Region> = match &mut op.kind {
            OpKind::Copy { src, dst } => vec![src, dst],
            OpKind::Reduce { srcs, dst, .. } => srcs.iter_mut().chain([dst]).collect(),
        };
        for r in regions {
            if let BufferRef::Scratch(s) = r.buffer {
                let x = *scratch_of.entry(s).or_insert_with(|| {
                    cone.scratch
                        .push(ex.scratch(s / scratch_per, s % scratch_per));
                    cone.scratch.len() as u32 - 1
                });
                r.buffer = BufferRef::Scratch(x);
            }
        }
        cone.ops.push(op);
    }
    Ok(Some(OpCone {
        plan: cone,
        ranks,
        global_ids,
        full_ops,
    }))
}
