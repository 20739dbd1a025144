//! The fold's checks of the other periods: every op the window holds outside the domain is
//! an image of a domain op, with the same kind, length, edges, ends and order, and every moved
//! region rotates by one shift per period; what they find decides whether the template is
//! exact.

use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Location, Region};

use super::images::{Folding, ShiftAt, asym, gcd, region, region_count, rotate};

/// A region of an op on another period whose offset differs from its image's in the domain:
/// the image (the domain op, build numbering), the region, the period and the offset there.
/// Ordered by image and region first, so the observations of one region sort together.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct MovedRegion {
    image: u32,
    region: u32,
    period: u32,
    offset: u64,
}

impl Folding<'_> {
    /// [`Self::image_of`], verified: the image has `d`'s kind, length, representative edges
    /// and ends shifted back to the domain.
    fn image(&self, d: usize) -> Result<u32> {
        let (plan, shift) = (self.plan, self.shift);
        let img = self.image_of(d)?;
        let dl = plan.ops[d].lane as usize;
        let k = self.num.period_of[dl].unwrap_or(0);
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
    }

    /// Every domain lane's image on period 1 (whose devices the window always holds) has as
    /// many ops: an op of the domain without an image there (a root's extra work) makes the
    /// plan differ between periods as surely as an op without an image in the domain.
    pub(super) fn check_lane_counts(&self) -> Result<()> {
        let (plan, num) = (self.plan, self.num);
        let nl = plan.lanes.len();
        let mut imaged = vec![false; nl];
        for l in 0..nl {
            if num.period_of[l] != Some(1) || !self.window.has(plan.lanes[l].location) {
                continue;
            }
            let Some(il) = self.lane_back(l, 1).filter(|&il| num.domain_lane[il]) else {
                continue;
            };
            imaged[il] = true;
            if num.lane_ops[l].len() != num.lane_ops[il].len() {
                return Err(asym(format!(
                    "lane {} runs {} ops, its image in the domain {}: the plan is not the same \
                     on every period of hosts",
                    plan.lanes[l].label,
                    num.lane_ops[l].len(),
                    num.lane_ops[il].len()
                )));
            }
        }
        if self.shift.periods() > 1
            && let Some(l) =
                (0..nl).find(|&l| num.domain_lane[l] && !imaged[l] && !num.lane_ops[l].is_empty())
        {
            return Err(asym(format!(
                "lane {} of the domain has no image on the next period of hosts: the plan is \
                 not the same on every period of hosts",
                plan.lanes[l].label
            )));
        }
        Ok(())
    }

    /// Every op of a window device outside the domain must be an image of a domain op
    /// ([`Self::image`]) and wait for the images of what its image waits for
    /// ([`Self::check_image_deps`]). Returns the regions whose offsets moved, and why the
    /// template cannot be exact where a region's buffer is not its image's shifted
    /// ([`Self::image_regions`]).
    pub(super) fn verify_periods(&self) -> Result<(Vec<MovedRegion>, Option<String>)> {
        let plan = self.plan;
        let mut moved = Vec::new();
        let mut inexact = None;
        for (d, op) in plan.ops.iter().enumerate() {
            crate::limits::check_deadline(self.limit, d, "folded")?;
            let l = op.lane as usize;
            if self.num.domain_lane[l] || !self.window.has(plan.lanes[l].location) {
                continue;
            }
            let img = self.image(d)? as usize;
            let Some(kd) = self.num.period_of[l] else {
                continue;
            };
            if inexact.is_none()
                && let Err(why) = self.image_regions(d, img, kd, &mut moved)
            {
                inexact = Some(why);
            }
            self.check_image_deps(d, img, kd)?;
        }
        Ok((moved, inexact))
    }

    /// Exact expansion: each region of op `d` in period `kd` must be its image `img`'s region
    /// with the rank of a user buffer `kd x m` on, a staging buffer the image's `kd` periods
    /// on, and an offset moved by some rotation ([`Self::region_shifts`] reads it from the
    /// offsets recorded in `moved`). A plan that is the same on every period up to a layout
    /// these cannot express still folds (the simulator needs no offsets), but its template is
    /// not exact: the error says why.
    fn image_regions(
        &self,
        d: usize,
        img: usize,
        kd: u32,
        moved: &mut Vec<MovedRegion>,
    ) -> std::result::Result<(), String> {
        let (a, b) = (&self.plan.ops[d], &self.plan.ops[img]);
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
                    u64::from(x)
                        == (u64::from(y) + u64::from(kd) * self.per_period) % self.nranks.max(1)
                }
                (BufferRef::Scratch(x), BufferRef::Scratch(y)) => {
                    match (self.scratch_image(x), self.scratch_image(y)) {
                        (Ok((ix, px)), Ok((iy, py))) => {
                            ix == iy && px == (py + kd) % self.shift.periods().max(1)
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
                moved.push(MovedRegion {
                    image: img as u32,
                    region: j as u32,
                    period: kd,
                    offset: ra.offset,
                });
            }
        }
        Ok(())
    }

    /// Op `d` (in period `kd`, image `img`) waits for the images of what its image waits for:
    /// each of its dependencies on a window device's lane has its image among the image's
    /// (its other dependencies come from memories outside the window, whose tracks are
    /// partial). An order that differs between periods is an error.
    fn check_image_deps(&self, d: usize, img: usize, kd: u32) -> Result<()> {
        let plan = self.plan;
        let l = plan.ops[d].lane as usize;
        for &e in &plan.ops[d].deps {
            let e = e as usize;
            let Some(el) = plan.ops.get(e).map(|x| x.lane as usize) else {
                continue;
            };
            if !self.window.has(plan.lanes[el].location) {
                continue;
            }
            // The op that `e`'s image under `d`'s shift is: same position, shifted lane.
            let Some(il) = self
                .lane_back(el, kd)
                .filter(|&il| self.window.has(plan.lanes[il].location))
            else {
                continue;
            };
            let ie = self.num.lane_ops[il]
                .get(self.num.pos[e] as usize)
                .copied()
                .ok_or_else(|| {
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
        Ok(())
    }

    /// Each moved region rotates within a block of its buffer: the shift per period is read
    /// from period 1, the block is a ring of `periods` blocks (one per period) or the buffer,
    /// whichever every observed period agrees with. Returns the shifts sorted by (op, region),
    /// and the first region no rotation expresses (the shifts found before it stay).
    pub(super) fn region_shifts(
        &self,
        moved: &mut [MovedRegion],
    ) -> (Vec<ShiftAt>, Option<String>) {
        let p = u64::from(self.shift.periods().max(1));
        let mut region_shift = Vec::new();
        moved.sort_unstable();
        for group in moved.chunk_by(|x, y| (x.image, x.region) == (y.image, y.region)) {
            let (img, j) = (group[0].image, group[0].region);
            let seen = || group.iter().map(|m| (m.period, m.offset));
            let Some(r) = region(&self.plan.ops[img as usize], j as usize) else {
                continue;
            };
            let m = self.buf_len(r.buffer);
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
            match [g.saturating_mul(p), m].into_iter().find_map(fits) {
                Some(sb) => region_shift.push(((img, j), sb)),
                None => {
                    let why = format!(
                        "region {j} of op {img} is at {:?} on periods {:?}, no rotation of its \
                         offset {}",
                        seen().map(|x| x.1).collect::<Vec<_>>(),
                        seen().map(|x| x.0).collect::<Vec<_>>(),
                        r.offset
                    );
                    return (region_shift, Some(why));
                }
            }
        }
        (region_shift, None)
    }

    /// Elements of buffer `b` (at least 1, so a block always divides it).
    fn buf_len(&self, b: BufferRef) -> u64 {
        let plan = self.plan;
        let r = match b {
            BufferRef::Input(r) => plan.request.input_len(r).ok(),
            BufferRef::Output(r) => plan.request.output_len(r).ok(),
            BufferRef::Scratch(s) => plan.scratch.get(s as usize).map(|x| x.len),
        };
        r.unwrap_or(0).max(1)
    }
}
