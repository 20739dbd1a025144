//! What every pass of the fold reads: the build's lanes, ops and staging buffers numbered
//! for the template ([`Numbering`], [`StagingNumbering`]), and [`Folding`], which finds the image in
//! the domain of a lane, an op or a staging buffer; with the helpers that walk an op's regions
//! by index.

use std::collections::{BTreeMap, HashMap};

use crate::template::shift::HostShift;
use crate::template::window::Window;
use relaycc_plan::{Lane, LaneKey, Location, Op, OpKind, Plan, Region, Scratch};
use relaycc_plan::{Result, RouteError};

pub(super) fn asym(why: String) -> RouteError {
    RouteError::NotSymmetric(why)
}

/// How many regions an op has: a copy's source and destination, a reduction's sources and
/// destination. The fold walks them by index ([`region`]), since it visits millions of ops.
pub(super) fn region_count(o: &Op) -> usize {
    match &o.kind {
        OpKind::Copy { .. } => 2,
        OpKind::Reduce { srcs, .. } => srcs.len() + 1,
    }
}

/// Region `j` of an op: a copy's source then destination, a reduction's sources then
/// destination.
pub(super) fn region(o: &Op, j: usize) -> Option<&Region> {
    match &o.kind {
        OpKind::Copy { src, dst } => [src, dst].get(j).copied(),
        OpKind::Reduce { srcs, dst, .. } => srcs.get(j).or((j == srcs.len()).then_some(dst)),
    }
}

/// [`region`], mutable.
pub(super) fn region_mut(o: &mut Op, j: usize) -> Option<&mut Region> {
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

pub(super) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Offset `offset` rotated `k` times by `shift` within its aligned block of `block` elements
/// ([`relaycc_plan::RegionShift`]).
pub(crate) fn rotate(offset: u64, shift: u64, block: u64, k: u32) -> u64 {
    let base = offset - offset % block;
    let step = (u128::from(shift) * u128::from(k) % u128::from(block)) as u64;
    base + (offset - base + step) % block
}

/// `key` moved `k` periods back.
pub(super) fn shift_key(shift: &dyn HostShift, key: LaneKey, k: u32) -> Option<LaneKey> {
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

/// The build's lanes and ops numbered for the template. The domain's lanes (period 0) are
/// renumbered in order and its ops numbered in plan order; every op keeps its position on its
/// lane, so "(lane key, position)" names an op on every period and an op's image is found by
/// a few lookups.
pub(super) struct Numbering {
    /// Per lane of the build, the period of hosts its device lies in.
    pub(super) period_of: Vec<Option<u32>>,
    /// Per lane of the build, whether it lies in the domain.
    pub(super) domain_lane: Vec<bool>,
    /// Per lane of the build, its number in the template (`u32::MAX` outside the domain).
    pub(super) lane_new: Vec<u32>,
    /// The domain's lanes, in the template's order.
    pub(super) lanes: Vec<Lane>,
    /// The build's lane of each window lane key.
    pub(super) key_to_lane: HashMap<LaneKey, u32>,
    /// Per lane of the build, the lane its key names moved back by the lane's own period:
    /// where its ops' images lie, looked up once per lane rather than hashed once per op.
    own_image: Vec<LaneImage>,
    /// Per op of the build, its position on its lane.
    pub(super) pos: Vec<u32>,
    /// Per op of the build, its number in the template (`u32::MAX` outside the domain).
    pub(super) new_id: Vec<u32>,
    /// Per lane of the build, its ops in lane order.
    pub(super) lane_ops: Vec<Vec<u32>>,
    /// Ops of the domain.
    pub(super) domain_ops: u32,
}

impl Numbering {
    /// Number `plan`'s lanes (whose window keys are `keys`) and ops; an op naming a lane the
    /// plan lacks is an error.
    pub(super) fn new(
        plan: &Plan,
        keys: &[Option<LaneKey>],
        shift: &dyn HostShift,
    ) -> Result<Self> {
        let nl = plan.lanes.len();
        let period_of: Vec<Option<u32>> = plan
            .lanes
            .iter()
            .map(|l| shift.period_of(l.location))
            .collect();
        let domain_lane: Vec<bool> = period_of.iter().map(|p| *p == Some(0)).collect();
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
        let own_image = (0..nl)
            .map(|l| match period_of[l] {
                None => LaneImage::NoPeriod,
                Some(k) => match keys.get(l).copied().flatten() {
                    Some(key) => match shift_key(shift, key, k) {
                        Some(back) => LaneImage::Lane(key_to_lane.get(&back).copied()),
                        None => LaneImage::NoKey,
                    },
                    None => LaneImage::NoKey,
                },
            })
            .collect();
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
        Ok(Numbering {
            period_of,
            domain_lane,
            lane_new,
            lanes,
            key_to_lane,
            own_image,
            pos,
            new_id,
            lane_ops,
            domain_ops: next,
        })
    }
}

/// Where the images of a lane's ops lie: the lane its key names moved back by the lane's own
/// period, or why there is none.
#[derive(Clone, Copy)]
enum LaneImage {
    /// The lane's device lies in no period of hosts.
    NoPeriod,
    /// The lane has no key, or its key has no image that many periods back.
    NoKey,
    /// The build's lane of the moved key, if the build has one (in the domain or not).
    Lane(Option<u32>),
}

/// The build's staging buffers numbered for the template: those of the domain renumbered in
/// order; one elsewhere maps to its image, the buffer of the same rank among those of the
/// shifted device ([`Folding::scratch_image`]).
pub(super) struct StagingNumbering {
    /// Per device, its staging buffers in plan order.
    pub(super) per_loc: BTreeMap<Location, Vec<u32>>,
    /// Per staging buffer, its rank among its device's.
    pub(super) rank_in_loc: Vec<usize>,
    /// Per staging buffer, its number in the template (`u32::MAX` outside the domain).
    pub(super) scratch_new: Vec<u32>,
    /// The domain's staging buffers, in the template's order.
    pub(super) scratch: Vec<Scratch>,
}

impl StagingNumbering {
    /// Number `plan`'s staging buffers.
    pub(super) fn new(plan: &Plan, shift: &dyn HostShift) -> Self {
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
        StagingNumbering {
            per_loc,
            rank_in_loc,
            scratch_new,
            scratch,
        }
    }
}

/// A region of a domain op (build numbering) whose offset rotates, and how: ((op, region),
/// (elements per period, block)), as [`relaycc_plan::RegionShift`] records it.
pub(super) type ShiftAt = ((u32, u32), (u64, u64));

/// The fold in progress: the windowed build, the shift it folds by, and the numbering the
/// first passes made, which every later pass reads.
pub(super) struct Folding<'a> {
    pub(super) plan: &'a Plan,
    pub(super) shift: &'a dyn HostShift,
    pub(super) window: &'a Window,
    /// The window key of each lane of the build.
    pub(super) keys: &'a [Option<LaneKey>],
    pub(super) num: &'a Numbering,
    pub(super) staging: &'a StagingNumbering,
    /// Ranks of the request.
    pub(super) nranks: u64,
    /// Ranks per period of hosts.
    pub(super) per_period: u64,
    /// The build's limit: the passes stop at its deadline.
    pub(super) limit: Option<&'a crate::limits::Limit>,
}

impl Folding<'_> {
    /// The build's lane whose key is lane `l`'s moved `k` periods back, if the build has one.
    pub(super) fn lane_back(&self, l: usize, k: u32) -> Option<usize> {
        if self.num.period_of[l] == Some(k) {
            return match self.num.own_image[l] {
                LaneImage::Lane(il) => il.map(|il| il as usize),
                LaneImage::NoPeriod | LaneImage::NoKey => None,
            };
        }
        self.keys
            .get(l)
            .copied()
            .flatten()
            .and_then(|key| shift_key(self.shift, key, k))
            .and_then(|key| self.num.key_to_lane.get(&key).copied())
            .map(|il| il as usize)
    }

    /// Staging buffer `i`'s image in the domain (template numbering) and the period it lies
    /// in; an image that is missing or of another length is an error.
    pub(super) fn scratch_image(&self, i: u32) -> Result<(u32, u32)> {
        let (plan, st) = (self.plan, self.staging);
        let s = plan.scratch[i as usize];
        if st.scratch_new[i as usize] != u32::MAX {
            return Ok((st.scratch_new[i as usize], 0));
        }
        let rank = st.rank_in_loc[i as usize];
        let k = self
            .shift
            .period_of(s.location)
            .ok_or_else(|| asym(format!("staging on {} lies in no period", s.location)))?;
        let img = self
            .shift
            .shift_back(s.location, k)
            .ok_or_else(|| asym(format!("staging on {} has no image", s.location)))?;
        let j = st
            .per_loc
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
        if t.len != s.len || st.scratch_new[j as usize] == u32::MAX {
            return Err(asym(format!(
                "staging buffer {rank} of {} ({} elements) differs from its image on {img} ({})",
                s.location, s.len, t.len
            )));
        }
        Ok((st.scratch_new[j as usize], k))
    }

    /// The image in the domain (build numbering) of op `d`, on a window device's lane: the
    /// op at the same position of the shifted lane. Only finds it, for ops [`Self::image`]
    /// verified already.
    pub(super) fn image_of(&self, d: usize) -> Result<u32> {
        let (plan, num) = (self.plan, self.num);
        let dl = plan.ops[d].lane as usize;
        let lane = &plan.lanes[dl];
        let image_lane = match num.own_image[dl] {
            LaneImage::NoPeriod => {
                return Err(asym(format!(
                    "{} lies in no period of hosts",
                    lane.location
                )));
            }
            LaneImage::NoKey => return Err(asym(format!("lane {} has no image", lane.label))),
            LaneImage::Lane(l) => l,
        };
        image_lane
            .filter(|&l| num.domain_lane[l as usize])
            .and_then(|l| num.lane_ops[l as usize].get(num.pos[d] as usize))
            .copied()
            .ok_or_else(|| {
                asym(format!(
                    "op {d} (lane {}, position {}) has no image in the domain",
                    lane.label, num.pos[d]
                ))
            })
    }
}
