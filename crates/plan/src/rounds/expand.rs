//! The expansion of a plan of rounds into the ordinary plan an executor runs: every round's
//! copy of the body and then the tail, their regions on the full buffers, their staging in one
//! arena per device that every segment reuses, and each segment after the one before.

use std::collections::BTreeMap;

use super::{RegionMap, RoundSegment};
use crate::error::{Result, RouteError};
use crate::plan::{BufferRef, Location, NvlsShare, Op, OpKind, Plan, Region};

/// Most ops [`expand()`] writes: an executor expands a plan of rounds on buffers it holds, so
/// its rounds are few (a 2 GiB round per piece; 4M ops are a few hundred rounds of a plan of
/// tens of thousands of ops); past it the expansion is refused rather than allocated.
pub const MAX_EXPANDED_OPS: u64 = 1 << 22;

/// Where each staging buffer of a segment lies in the expanded plan: (arena buffer, first
/// element).
type ArenaSlots = Vec<(u32, u64)>;

/// Lay the staging buffers of `parts` out in one arena per device: each part's buffers one
/// after another from the arena's start (the parts run one after another, so they share it),
/// the arena as long as the longest part there. Returns the arenas (device, elements) in
/// device order and each part's slots.
fn arenas(parts: &[&Plan]) -> (Vec<(Location, u64)>, Vec<ArenaSlots>) {
    let mut len: BTreeMap<Location, u64> = BTreeMap::new();
    let mut at: Vec<Vec<(Location, u64)>> = Vec::with_capacity(parts.len());
    for p in parts {
        let mut used: BTreeMap<Location, u64> = BTreeMap::new();
        let mut slots = Vec::with_capacity(p.scratch.len());
        for s in &p.scratch {
            let u = used.entry(s.location).or_default();
            slots.push((s.location, *u));
            *u = u.saturating_add(s.len);
        }
        for (loc, u) in used {
            let l = len.entry(loc).or_default();
            *l = (*l).max(u);
        }
        at.push(slots);
    }
    let index: BTreeMap<Location, u32> = len
        .keys()
        .enumerate()
        .map(|(i, l)| (*l, i as u32))
        .collect();
    let slots = at
        .into_iter()
        .map(|v| v.into_iter().map(|(l, off)| (index[&l], off)).collect())
        .collect();
    (len.into_iter().collect(), slots)
}

/// The expanded plan's writer: appends one segment after another.
struct Writer<'a> {
    out: Plan,
    /// The last op of each lane of `out` so far.
    last_on_lane: Vec<Option<u32>>,
    arena: &'a [ArenaSlots],
}

impl Writer<'_> {
    /// Append `part` (the body as round `k`, or the tail) with its lanes starting at
    /// `lane_base`, NVLS groups moved by `group_base`, regions mapped by `map`.
    fn segment(
        &mut self,
        part: &Plan,
        slots: usize,
        map: &mut RegionMap<'_>,
        seg: RoundSegment,
        lane_base: u32,
        group_base: u32,
    ) -> Result<()> {
        let base = self.out.ops.len() as u32;
        // Every op of this segment follows every op written so far: the first op of each of
        // its lanes waits for the last op of every lane.
        let barrier: Vec<u32> = self.last_on_lane.iter().flatten().copied().collect();
        let mut first_of_lane = vec![true; part.lanes.len()];
        for (id, op) in part.ops.iter().enumerate() {
            let mut region = |r: &Region| -> Result<Region> {
                match r.buffer {
                    BufferRef::Scratch(i) => {
                        let &(arena, off) = self.arena[slots].get(i as usize).ok_or_else(|| {
                            RouteError::PlanCheck {
                                op: id,
                                message: format!("names missing staging buffer {i}"),
                            }
                        })?;
                        Ok(Region::new(
                            BufferRef::Scratch(arena),
                            off.saturating_add(r.offset),
                            r.len,
                        ))
                    }
                    _ => map.region_in_full(*r, seg).map_err(|e| match e {
                        RouteError::PlanCheck { message, .. } => {
                            RouteError::PlanCheck { op: id, message }
                        }
                        other => other,
                    }),
                }
            };
            let kind = match &op.kind {
                OpKind::Copy { src, dst } => OpKind::Copy {
                    src: region(src)?,
                    dst: region(dst)?,
                },
                OpKind::Reduce {
                    srcs,
                    dst,
                    finalize,
                } => OpKind::Reduce {
                    srcs: srcs.iter().map(&mut region).collect::<Result<_>>()?,
                    dst: region(dst)?,
                    finalize: *finalize,
                },
            };
            let lane = op.lane as usize;
            let mut deps: Vec<u32> = op.deps.iter().map(|d| base + d).collect();
            if first_of_lane.get(lane).copied().unwrap_or(false) {
                first_of_lane[lane] = false;
                deps.extend_from_slice(&barrier);
            }
            let lane = lane_base + op.lane;
            let new_id = self.out.ops.len() as u32;
            if let Some(l) = self.last_on_lane.get_mut(lane as usize) {
                *l = Some(new_id);
            }
            self.out.ops.push(Op {
                kind,
                lane,
                deps,
                edges: op.edges.clone(),
                nvls: op.nvls.map(|n| NvlsShare {
                    group: n.group.saturating_add(group_base),
                    shared_edge: n.shared_edge,
                }),
            });
        }
        Ok(())
    }
}

/// The ordinary plan a plan of rounds stands for: the body once per round, its regions on
/// that round's slices of the full buffers, then the tail on the remainders; staging in one
/// arena per device that every segment reuses; every lane's first op of a segment waiting for
/// every lane's last op before it, so segments run one after another (the order the checker's
/// proof of the plan of rounds assumes, and the simulator times). The body's lanes serve every
/// round, the tail's follow them; NVLS groups are numbered apart per segment. A plan without
/// rounds is returned as it is.
///
/// Errors: [`RouteError::OverLimit`] when the expansion would hold more than `max_ops` ops;
/// a body or tail that is a template (only full plans run); a region that crosses a piece.
///
/// Complexity: O(ops of the expansion + lanes squared per segment).
pub fn expand(plan: &Plan, max_ops: u64) -> Result<Plan> {
    let Some(r) = &plan.rounds else {
        return Ok(plan.clone());
    };
    let tail_ops = r.tail.as_ref().map_or(0, |t| t.ops.len() as u64);
    let ops = (r.body.ops.len() as u64)
        .saturating_mul(r.count)
        .saturating_add(tail_ops);
    if ops > max_ops {
        return Err(RouteError::OverLimit {
            what: format!(
                "{} expands to {ops} ops ({} rounds of {} ops)",
                plan.algorithm,
                r.count,
                r.body.ops.len()
            ),
            limit: format!("{max_ops} ops an executor expands"),
        });
    }
    let parts: Vec<&Plan> = std::iter::once(&r.body).chain(&r.tail).collect();
    if let Some(p) = parts.iter().find(|p| p.is_template() || p.is_rounds()) {
        return Err(RouteError::PlanCheck {
            op: usize::MAX,
            message: format!(
                "{} is a template or a plan of rounds: only full plans expand",
                p.algorithm
            ),
        });
    }
    let (arena_len, slots) = arenas(&parts);
    let mut out = Plan::new(plan.request.clone(), plan.algorithm.clone());
    out.protocol = r
        .body
        .protocol
        .filter(|p| r.tail.as_ref().is_none_or(|t| t.protocol == Some(*p)));
    for (loc, len) in arena_len {
        out.add_scratch(loc, len);
    }
    for l in &r.body.lanes {
        out.add_lane(l.location, l.label.clone());
    }
    if let Some(t) = &r.tail {
        for l in &t.lanes {
            out.add_lane(l.location, format!("tail: {}", l.label));
        }
    }
    out.ops.reserve(ops as usize);
    let groups = r
        .body
        .ops
        .iter()
        .filter_map(|o| o.nvls.map(|n| n.group))
        .max()
        .map_or(0, |g| g + 1);
    let lanes = out.lanes.len();
    let mut w = Writer {
        out,
        last_on_lane: vec![None; lanes],
        arena: &slots,
    };
    let mut body_map = RegionMap::new(&plan.request, r.count, false);
    for k in 0..r.count {
        let group_base = u32::try_from(k.saturating_mul(u64::from(groups))).unwrap_or(u32::MAX);
        w.segment(
            &r.body,
            0,
            &mut body_map,
            RoundSegment::Round(k),
            0,
            group_base,
        )?;
    }
    if let Some(t) = &r.tail {
        let mut tail_map = RegionMap::new(&plan.request, r.count, true);
        let lane_base = r.body.lanes.len() as u32;
        let group_base =
            u32::try_from(r.count.saturating_mul(u64::from(groups))).unwrap_or(u32::MAX);
        w.segment(
            t,
            1,
            &mut tail_map,
            RoundSegment::Tail,
            lane_base,
            group_base,
        )?;
    }
    Ok(w.out)
}
