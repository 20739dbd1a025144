//! Folding a windowed build into a template: keep the domain's ops, map every dependency on an
//! op outside the domain to the op's image inside it, every edge to its representative, every
//! staging buffer outside the domain to its image; or say which devices and ranges the window
//! lacks, or why the plan is not the same on every period of hosts.

use std::collections::{BTreeMap, HashMap};

use relaycc_topo::Topology;

use crate::error::{Result, RouteError};
use crate::lower::LaneKey;
use crate::plan::{
    BufferRef, EdgeScale, Location, OffsetAt, Op, OpKind, PeriodOffset, Plan, Region, RegionShift,
    Template,
};
use crate::planner::builder::mem_of;

use super::HostShift;
use super::window::{UserMem, Window};

/// What a fold found.
pub(super) enum Folded {
    /// The template.
    Template(Box<Plan>),
    /// The window lacks devices whose lanes the domain's ops wait on, or user-buffer ranges
    /// they touch: build again with these added.
    Grow {
        devs: Vec<Location>,
        ranges: Vec<(UserMem, u64, u64)>,
    },
}

fn asym(why: String) -> RouteError {
    RouteError::NotSymmetric(why)
}

/// How many regions an op has: a copy's source and destination, a reduction's sources and
/// destination. The fold walks them by index ([`region`]), since it visits millions of ops.
fn region_count(o: &Op) -> usize {
    match &o.kind {
        OpKind::Copy { .. } => 2,
        OpKind::Reduce { srcs, .. } => srcs.len() + 1,
    }
}

/// Region `j` of an op: a copy's source then destination, a reduction's sources then
/// destination.
fn region(o: &Op, j: usize) -> Option<&Region> {
    match &o.kind {
        OpKind::Copy { src, dst } => [src, dst].get(j).copied(),
        OpKind::Reduce { srcs, dst, .. } => srcs.get(j).or((j == srcs.len()).then_some(dst)),
    }
}

/// [`region`], mutable.
fn region_mut(o: &mut Op, j: usize) -> Option<&mut Region> {
    match &mut o.kind {
        OpKind::Copy { src, dst } => match j {
            0 => Some(src),
            1 => Some(dst),
            _ => None,
        },
        OpKind::Reduce { srcs, dst, .. } => {
            let n = srcs.len();
            if j < n {
                srcs.get_mut(j)
            } else {
                (j == n).then_some(dst)
            }
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Offset `offset` rotated `k` times by `shift` within its aligned block of `block` elements
/// ([`RegionShift`]).
pub(crate) fn rotate(offset: u64, shift: u64, block: u64, k: u32) -> u64 {
    let base = offset - offset % block;
    let step = (u128::from(shift) * u128::from(k) % u128::from(block)) as u64;
    base + (offset - base + step) % block
}

/// `key` moved `k` periods back.
fn shift_key(shift: &dyn HostShift, key: LaneKey, k: u32) -> Option<LaneKey> {
    Some(match key {
        LaneKey::Hop {
            from,
            to,
            channel,
            queue,
        } => LaneKey::Hop {
            from: shift.shift_back(from, k)?,
            to: shift.shift_back(to, k)?,
            channel,
            queue,
        },
        LaneKey::Local { at, channel } => LaneKey::Local {
            at: shift.shift_back(at, k)?,
            channel,
        },
    })
}

/// Fold the windowed build `plan` (made under `window`) into a template of period 0's hosts.
pub(super) fn fold(
    topo: &Topology,
    mut plan: Plan,
    shift: &dyn HostShift,
    window: &Window,
) -> Result<Folded> {
    let keys = plan
        .template
        .take()
        .map(|t| t.window_lanes)
        .ok_or_else(|| asym(format!("{} was not built in a window", plan.algorithm)))?;
    let nl = plan.lanes.len();
    let period_of: Vec<Option<u32>> = plan
        .lanes
        .iter()
        .map(|l| shift.period_of(l.location))
        .collect();
    let domain_lane: Vec<bool> = period_of.iter().map(|p| *p == Some(0)).collect();
    // Domain lanes, renumbered in order; each with its ops (new ids) in lane order.
    let mut lane_new = vec![u32::MAX; nl];
    let mut lanes = Vec::new();
    let mut key_to_lane: HashMap<LaneKey, u32> = HashMap::new();
    for l in 0..nl {
        if domain_lane[l] {
            lane_new[l] = lanes.len() as u32;
            lanes.push(plan.lanes[l].clone());
        }
        if let Some(Some(k)) = keys.get(l) {
            key_to_lane.insert(*k, l as u32);
        }
    }
    let mut pos = vec![0u32; plan.ops.len()];
    let mut count = vec![0u32; nl];
    let mut new_id = vec![u32::MAX; plan.ops.len()];
    let mut lane_ops: Vec<Vec<u32>> = vec![Vec::new(); nl];
    let mut next = 0u32;
    for (i, op) in plan.ops.iter().enumerate() {
        let l = op.lane as usize;
        let Some(c) = count.get_mut(l) else {
            return Err(asym(format!("op {i} names lane {l} of {nl}")));
        };
        pos[i] = *c;
        *c += 1;
        lane_ops[l].push(i as u32);
        if domain_lane[l] {
            new_id[i] = next;
            next += 1;
        }
    }
    // Staging buffers: those of the domain renumbered; one elsewhere maps to its image, the
    // buffer of the same rank among those of the shifted device.
    let mut per_loc: BTreeMap<Location, Vec<u32>> = BTreeMap::new();
    let mut rank_in_loc = vec![0usize; plan.scratch.len()];
    for (i, s) in plan.scratch.iter().enumerate() {
        let v = per_loc.entry(s.location).or_default();
        rank_in_loc[i] = v.len();
        v.push(i as u32);
    }
    let mut scratch_new = vec![u32::MAX; plan.scratch.len()];
    let mut scratch = Vec::new();
    for (i, s) in plan.scratch.iter().enumerate() {
        if shift.period_of(s.location) == Some(0) {
            scratch_new[i] = scratch.len() as u32;
            scratch.push(*s);
        }
    }
    // A staging buffer's image in the domain and the period it lies in.
    let scratch_image = |i: u32| -> Result<(u32, u32)> {
        let s = plan.scratch[i as usize];
        if scratch_new[i as usize] != u32::MAX {
            return Ok((scratch_new[i as usize], 0));
        }
        let rank = rank_in_loc[i as usize];
        let k = shift
            .period_of(s.location)
            .ok_or_else(|| asym(format!("staging on {} lies in no period", s.location)))?;
        let img = shift
            .shift_back(s.location, k)
            .ok_or_else(|| asym(format!("staging on {} has no image", s.location)))?;
        let j = per_loc
            .get(&img)
            .and_then(|v| v.get(rank))
            .copied()
            .ok_or_else(|| {
                asym(format!(
                    "staging buffer {rank} of {} has no image on {img}",
                    s.location
                ))
            })?;
        let t = plan.scratch[j as usize];
        if t.len != s.len || scratch_new[j as usize] == u32::MAX {
            return Err(asym(format!(
                "staging buffer {rank} of {} ({} elements) differs from its image on {img} ({})",
                s.location, s.len, t.len
            )));
        }
        Ok((scratch_new[j as usize], k))
    };
    // The image in the domain of op `d`, on a window device's lane: the op at the same position
    // of the shifted lane. `image` also verifies that it matches `d` (kind, length, hops);
    // `image_of` only finds it, for ops `image` verified already.
    let image_of = |d: usize| -> Result<u32> {
        let dl = plan.ops[d].lane as usize;
        let lane = &plan.lanes[dl];
        let k = period_of[dl]
            .ok_or_else(|| asym(format!("{} lies in no period of hosts", lane.location)))?;
        let key = keys
            .get(dl)
            .copied()
            .flatten()
            .and_then(|key| shift_key(shift, key, k))
            .ok_or_else(|| asym(format!("lane {} has no image", lane.label)))?;
        key_to_lane
            .get(&key)
            .filter(|&&l| domain_lane[l as usize])
            .and_then(|&l| lane_ops[l as usize].get(pos[d] as usize))
            .copied()
            .ok_or_else(|| {
                asym(format!(
                    "op {d} (lane {}, position {}) has no image in the domain",
                    lane.label, pos[d]
                ))
            })
    };
    let image = |d: usize| -> Result<u32> {
        let img = image_of(d)?;
        let dl = plan.ops[d].lane as usize;
        let k = period_of[dl].unwrap_or(0);
        let (a, b) = (&plan.ops[d], &plan.ops[img as usize]);
        // Where a region lies, `back` periods back.
        let end = |r: Option<&Region>, back: u32| -> Option<Location> {
            r.and_then(|r| plan.location(r.buffer))
                .and_then(|l| shift.shift_back(l, back))
        };
        let n = region_count(a);
        let same = a.len() == b.len()
            && std::mem::discriminant(&a.kind) == std::mem::discriminant(&b.kind)
            && a.edges.len() == b.edges.len()
            && a.edges
                .iter()
                .zip(&b.edges)
                .all(|(&x, &y)| shift.rep_edge(x) == shift.rep_edge(y))
            && n == region_count(b)
            && (0..n).all(|j| end(region(a, j), k) == end(region(b, j), 0));
        if !same {
            return Err(asym(format!(
                "op {d} (lane {}, {} elements) differs from its image in the domain ({} \
                 elements): the plan is not the same on every period of hosts",
                plan.lanes[dl].label,
                a.len(),
                b.len()
            )));
        }
        Ok(img)
    };
    // Every domain lane's image on period 1 (whose devices the window always holds) has as
    // many ops: an op of the domain without an image there (a root's extra work) makes the
    // plan differ between periods as surely as an op without an image in the domain.
    let mut imaged = vec![false; nl];
    for l in 0..nl {
        if period_of[l] != Some(1) || !window.has(plan.lanes[l].location) {
            continue;
        }
        let Some(il) = keys
            .get(l)
            .copied()
            .flatten()
            .and_then(|k| shift_key(shift, k, 1))
            .and_then(|k| key_to_lane.get(&k).copied())
            .map(|il| il as usize)
            .filter(|&il| domain_lane[il])
        else {
            continue;
        };
        imaged[il] = true;
        if lane_ops[l].len() != lane_ops[il].len() {
            return Err(asym(format!(
                "lane {} runs {} ops, its image in the domain {}: the plan is not the same on \
                 every period of hosts",
                plan.lanes[l].label,
                lane_ops[l].len(),
                lane_ops[il].len()
            )));
        }
    }
    if shift.periods() > 1
        && let Some(l) = (0..nl).find(|&l| domain_lane[l] && !imaged[l] && !lane_ops[l].is_empty())
    {
        return Err(asym(format!(
            "lane {} of the domain has no image on the next period of hosts: the plan is not \
             the same on every period of hosts",
            plan.lanes[l].label
        )));
    }
    // Exact expansion: each region of an op in period `kd` must be its image's region with the
    // rank of a user buffer `kd x m` on, a staging buffer the image's `kd` periods on, and an
    // offset `kd` times one shift per period on (modulo the buffer's length). The shift is
    // read from period 1; other periods verify it. A plan that is the same on every period
    // up to a layout these cannot express still folds (the simulator needs no offsets), but
    // its template is not exact.
    let nranks = plan.request.gpus.len() as u64;
    let per_period = nranks / u64::from(shift.periods().max(1));
    let buf_len = |b: BufferRef| -> u64 {
        let r = match b {
            BufferRef::Input(r) => plan.request.input_len(r).ok(),
            BufferRef::Output(r) => plan.request.output_len(r).ok(),
            BufferRef::Scratch(s) => plan.scratch.get(s as usize).map(|x| x.len),
        };
        r.unwrap_or(0).max(1)
    };
    // Offsets of regions of images on other periods that differ from the domain op's:
    // (domain op, region, period, offset), grouped by (domain op, region) once all are seen.
    let mut moved: Vec<(u32, u32, u32, u64)> = Vec::new();
    let mut inexact: Option<String> = None;
    let image_regions = |d: usize,
                         img: usize,
                         kd: u32,
                         moved: &mut Vec<(u32, u32, u32, u64)>|
     -> std::result::Result<(), String> {
        let (a, b) = (&plan.ops[d], &plan.ops[img]);
        let n = region_count(a);
        if n != region_count(b) {
            return Err(format!(
                "op {d} has {n} regions, its image {}",
                region_count(b)
            ));
        }
        for j in 0..n {
            let (Some(ra), Some(rb)) = (region(a, j), region(b, j)) else {
                continue;
            };
            let same_buffer = match (ra.buffer, rb.buffer) {
                (BufferRef::Input(x), BufferRef::Input(y))
                | (BufferRef::Output(x), BufferRef::Output(y)) => {
                    u64::from(x) == (u64::from(y) + u64::from(kd) * per_period) % nranks.max(1)
                }
                (BufferRef::Scratch(x), BufferRef::Scratch(y)) => {
                    match (scratch_image(x), scratch_image(y)) {
                        (Ok((ix, px)), Ok((iy, py))) => {
                            ix == iy && px == (py + kd) % shift.periods().max(1)
                        }
                        _ => false,
                    }
                }
                _ => false,
            };
            if !same_buffer {
                return Err(format!(
                    "op {d} names {:?} where its image names {:?}",
                    ra.buffer, rb.buffer
                ));
            }
            if ra.offset != rb.offset {
                moved.push((img as u32, j as u32, kd, ra.offset));
            }
        }
        Ok(())
    };
    // Every op of a window device outside the domain must be an image of a domain op, and
    // wait for the images of what its image waits for: each of its dependencies on a window
    // device's lane has its image among the image's (its other dependencies come from
    // memories outside the window, whose tracks are partial).
    for (d, op) in plan.ops.iter().enumerate() {
        crate::limits::check_deadline(d)?;
        let l = op.lane as usize;
        if domain_lane[l] || !window.has(plan.lanes[l].location) {
            continue;
        }
        let img = image(d)? as usize;
        let Some(kd) = period_of[l] else { continue };
        if inexact.is_none()
            && let Err(why) = image_regions(d, img, kd, &mut moved)
        {
            inexact = Some(why);
        }
        for &e in &op.deps {
            let e = e as usize;
            let Some(el) = plan.ops.get(e).map(|x| x.lane as usize) else {
                continue;
            };
            if !window.has(plan.lanes[el].location) {
                continue;
            }
            // The op that `e`'s image under `d`'s shift is: same position, shifted lane.
            let Some(il) = keys
                .get(el)
                .copied()
                .flatten()
                .and_then(|k| shift_key(shift, k, kd))
                .and_then(|k| key_to_lane.get(&k).copied())
                .map(|il| il as usize)
                .filter(|&il| window.has(plan.lanes[il].location))
            else {
                continue;
            };
            let ie = lane_ops[il].get(pos[e] as usize).copied().ok_or_else(|| {
                asym(format!(
                    "op {e} (lane {}) has no image on lane {}",
                    plan.lanes[el].label, plan.lanes[il].label
                ))
            })?;
            if !plan.ops[img].deps.contains(&ie) {
                return Err(asym(format!(
                    "op {d} (lane {}) waits for op {e} (lane {}), but its image in the domain \
                     does not wait for that op's image: the plan's order differs between \
                     periods of hosts",
                    plan.lanes[l].label, plan.lanes[el].label
                )));
            }
        }
    }
    // Each moved region rotates within a block of its buffer: the shift per period is read
    // from period 1, the block is a ring of `periods` blocks (one per period) or the buffer,
    // whichever every observed period agrees with.
    // ((domain op, region), (shift, block)), sorted by the pair.
    let mut region_shift: Vec<((u32, u32), (u64, u64))> = Vec::new();
    if inexact.is_none() {
        let p = u64::from(shift.periods().max(1));
        moved.sort_unstable();
        for group in moved.chunk_by(|x, y| (x.0, x.1) == (y.0, y.1)) {
            let (img, j) = (group[0].0, group[0].1);
            let seen = || group.iter().map(|&(_, _, k, o)| (k, o));
            let Some(r) = region(&plan.ops[img as usize], j as usize) else {
                continue;
            };
            let m = buf_len(r.buffer);
            let one = seen().find(|(k, _)| *k == 1).map(|(_, o)| o);
            let fits = |block: u64| {
                let shift = (one.unwrap_or(r.offset) % block + block - r.offset % block) % block;
                let ok = block > 0
                    && m.is_multiple_of(block)
                    && r.offset % block + r.len <= block
                    && seen().all(|(k, o)| rotate(r.offset, shift, block, k) == o);
                ok.then_some((shift, block))
            };
            // A ring of `periods` blocks: its block is the gcd of the moves observed.
            let g = seen().fold(0, |g, (_, o)| gcd(g, o.abs_diff(r.offset)));
            let found = [g.saturating_mul(p), m].into_iter().find_map(fits);
            match found {
                Some(sb) => region_shift.push(((img, j), sb)),
                None => {
                    inexact = Some(format!(
                        "region {j} of op {img} is at {:?} on periods {:?}, no rotation of its \
                         offset {}",
                        seen().map(|x| x.1).collect::<Vec<_>>(),
                        seen().map(|x| x.0).collect::<Vec<_>>(),
                        r.offset
                    ));
                    break;
                }
            }
        }
    }
    let mut grow_devs: Vec<Location> = Vec::new();
    let mut grow_ranges: Vec<(UserMem, u64, u64)> = Vec::new();
    let mut ops = Vec::with_capacity(next as usize);
    // Per representative edge, its capacity scale (NaN where no op uses it).
    let mut scale: Vec<f64> = Vec::new();
    let periods = shift.periods().max(1);
    let mut offsets: Vec<PeriodOffset> = Vec::new();
    let mut shifts: Vec<RegionShift> = Vec::new();
    let mut dep_pairs: Vec<(u32, u32)> = Vec::new();
    for (i, op) in plan.ops.iter().enumerate() {
        crate::limits::check_deadline(i)?;
        if new_id[i] == u32::MAX {
            continue;
        }
        let me = new_id[i];
        let mut note = |at: OffsetAt, p: u32| {
            if p != 0 {
                offsets.push(PeriodOffset {
                    op: me,
                    at,
                    periods: p,
                });
            }
        };
        let mut o = op.clone();
        o.lane = lane_new[op.lane as usize];
        // Regions: window devices, or user ranges the window covers; staging mapped.
        for ri in 0..region_count(&o) {
            let Some(r) = region_mut(&mut o, ri) else {
                continue;
            };
            let loc = plan
                .location(r.buffer)
                .ok_or_else(|| asym(format!("op {i} names a missing buffer {:?}", r.buffer)))?;
            if !window.has(loc) {
                let (m, base) = mem_of(&plan.request, r.buffer);
                match m.user() {
                    Some(u) if window.covers(u, base + r.offset, base + r.end()) => {}
                    Some(u) => grow_ranges.push((u, base + r.offset, base + r.end())),
                    None => grow_devs.push(loc),
                }
            }
            if let BufferRef::Scratch(s) = r.buffer {
                let (img, p) = scratch_image(s)?;
                r.buffer = BufferRef::Scratch(img);
                note(OffsetAt::Region(ri as u32), p);
            }
            if let Ok(k) = region_shift.binary_search_by_key(&(i as u32, ri as u32), |x| x.0)
                && let (_, (elems, block)) = region_shift[k]
                && elems != 0
            {
                shifts.push(RegionShift {
                    op: me,
                    region: ri as u32,
                    elems,
                    block,
                });
            }
        }
        // (image, period) pairs: two deps on images of one op in different periods both stay.
        dep_pairs.clear();
        for &d in &op.deps {
            let d = d as usize;
            if new_id.get(d).is_some_and(|&n| n != u32::MAX) {
                dep_pairs.push((new_id[d], 0));
                continue;
            }
            let dl = plan
                .ops
                .get(d)
                .map(|x| x.lane as usize)
                .ok_or_else(|| asym(format!("op {i} waits for a missing op {d}")))?;
            let owner = plan.lanes[dl].location;
            if !window.has(owner) {
                grow_devs.push(owner);
                continue;
            }
            let p = period_of[dl].unwrap_or(0);
            // `d` lies on a window device outside the domain: the loop above verified it.
            dep_pairs.push((new_id[image_of(d)? as usize], p));
        }
        dep_pairs.sort_unstable();
        dep_pairs.dedup();
        o.deps.clear();
        for (j, &(d, p)) in dep_pairs.iter().enumerate() {
            o.deps.push(d);
            note(OffsetAt::Dep(j as u32), p);
        }
        for (j, e) in o.edges.iter_mut().enumerate() {
            let rep = shift
                .rep_edge(*e)
                .ok_or_else(|| asym(format!("edge {e} has no representative")))?;
            let s = f64::from(shift.edge_orbit(*e)) / f64::from(periods);
            let at = rep as usize;
            if at >= scale.len() {
                scale.resize(at + 1, f64::NAN);
            }
            scale[at] = s;
            note(OffsetAt::Edge(j as u32), shift.edge_period(*e));
            *e = rep;
        }
        if let Some(n) = &mut o.nvls {
            note(OffsetAt::Nvls, shift.edge_period(n.shared_edge));
            n.shared_edge = shift.rep_edge(n.shared_edge).unwrap_or(n.shared_edge);
        }
        ops.push(o);
    }
    if !grow_devs.is_empty() || !grow_ranges.is_empty() {
        grow_devs.sort_unstable();
        grow_devs.dedup();
        return Ok(Folded::Grow {
            devs: grow_devs,
            ranges: grow_ranges,
        });
    }
    let _ = topo;
    let n_ops = ops.len() as u64;
    let n_lanes = lanes.len() as u64;
    plan.ops = ops;
    plan.lanes = lanes;
    plan.scratch = scratch;
    plan.template = Some(Template {
        hosts: shift.hosts(),
        period: shift.period(),
        periods,
        full_ops: n_ops * u64::from(periods),
        full_lanes: n_lanes * u64::from(periods),
        capacity_scale: scale
            .into_iter()
            .enumerate()
            .filter(|&(_, s)| !s.is_nan() && s != 1.0)
            .map(|(edge, scale)| EdgeScale {
                edge: edge as u32,
                scale,
            })
            .collect(),
        exact: inexact.is_none(),
        inexact,
        offsets,
        shifts,
        window_lanes: Vec::new(),
    });
    Ok(Folded::Template(Box::new(plan)))
}
