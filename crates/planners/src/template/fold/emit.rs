//! The fold's last pass: the domain's ops with every region, dependency and edge mapped into
//! the domain, the period offsets and region shifts expansion needs, and what the window lacks.

use crate::template::window::UserMem;
use relaycc_plan::Result;
use relaycc_plan::mem_of;
use relaycc_plan::{BufferRef, Location, OffsetAt, Op, PeriodOffset, RegionShift};

use super::images::{Folding, ShiftAt, asym, region_count, region_mut};

/// What the emit pass writes: the template's ops and, beside them, what expansion and the
/// simulator need, or what the window lacks.
pub(super) struct Emitted {
    /// The domain's ops, references mapped into the domain.
    pub(super) ops: Vec<Op>,
    /// Per representative edge, its capacity scale (NaN where no op uses it).
    pub(super) scale: Vec<f64>,
    /// The period offsets the mapping dropped ([`relaycc_plan::Template::offsets`]).
    pub(super) offsets: Vec<PeriodOffset>,
    /// How regions move per period ([`relaycc_plan::Template::shifts`]).
    pub(super) shifts: Vec<RegionShift>,
    /// Devices the window lacks: whose lanes the domain's ops wait on or whose memory they
    /// touch.
    pub(super) grow_devs: Vec<Location>,
    /// User-buffer ranges the domain's ops touch that the window does not cover.
    pub(super) grow_ranges: Vec<(UserMem, u64, u64)>,
}

impl Emitted {
    /// Reference `at` of template op `op` lies `p` periods on (nothing to record for 0).
    fn note(&mut self, op: u32, at: OffsetAt, p: u32) {
        if p != 0 {
            self.offsets.push(PeriodOffset { op, at, periods: p });
        }
    }
}

impl Folding<'_> {
    /// The domain's ops with every reference mapped into the domain: regions
    /// ([`Self::emit_regions`]), dependencies ([`Self::emit_deps`]) and edges
    /// ([`Self::emit_edges`]), with the period offsets and region shifts that expansion
    /// needs, and what the window lacks.
    pub(super) fn emit(&self, region_shift: &[ShiftAt]) -> Result<Emitted> {
        let mut out = Emitted {
            ops: Vec::with_capacity(self.num.domain_ops as usize),
            scale: Vec::new(),
            offsets: Vec::new(),
            shifts: Vec::new(),
            grow_devs: Vec::new(),
            grow_ranges: Vec::new(),
        };
        // (image, period) pairs of one op's dependencies, kept across ops.
        let mut dep_pairs: Vec<(u32, u32)> = Vec::new();
        for (i, op) in self.plan.ops.iter().enumerate() {
            crate::limits::check_deadline(self.limit, i, "folded")?;
            let me = self.num.new_id[i];
            if me == u32::MAX {
                continue;
            }
            let mut o = op.clone();
            o.lane = self.num.lane_new[op.lane as usize];
            self.emit_regions(i, me, &mut o, region_shift, &mut out)?;
            self.emit_deps(i, me, &mut o, &mut dep_pairs, &mut out)?;
            self.emit_edges(me, &mut o, &mut out)?;
            out.ops.push(o);
        }
        Ok(out)
    }

    /// Op `i`'s regions (template op `me`, `o`): each on a window device, or a user range the
    /// window covers (else the window grows); staging mapped to its image; region shifts
    /// recorded.
    fn emit_regions(
        &self,
        i: usize,
        me: u32,
        o: &mut Op,
        region_shift: &[ShiftAt],
        out: &mut Emitted,
    ) -> Result<()> {
        let plan = self.plan;
        for ri in 0..region_count(o) {
            let Some(r) = region_mut(o, ri) else {
                continue;
            };
            let loc = plan
                .location(r.buffer)
                .ok_or_else(|| asym(format!("op {i} names a missing buffer {:?}", r.buffer)))?;
            if !self.window.has(loc) {
                let (m, base) = mem_of(&plan.request, r.buffer);
                match UserMem::of(m) {
                    Some(u) if self.window.covers(u, base + r.offset, base + r.end()) => {}
                    Some(u) => out.grow_ranges.push((u, base + r.offset, base + r.end())),
                    None => out.grow_devs.push(loc),
                }
            }
            if let BufferRef::Scratch(s) = r.buffer {
                let (img, p) = self.scratch_image(s)?;
                r.buffer = BufferRef::Scratch(img);
                out.note(me, OffsetAt::Region(ri as u32), p);
            }
            if let Ok(k) = region_shift.binary_search_by_key(&(i as u32, ri as u32), |x| x.0)
                && let (_, (elems, block)) = region_shift[k]
                && elems != 0
            {
                out.shifts.push(RegionShift {
                    op: me,
                    region: ri as u32,
                    elems,
                    block,
                });
            }
        }
        Ok(())
    }

    /// Op `i`'s dependencies (template op `me`, `o`), as (image, period) pairs: one on a
    /// domain op stays, one on a window device outside the domain becomes its image with the
    /// period recorded (two on images of one op in different periods both stay), one on a
    /// device outside the window grows the window.
    fn emit_deps(
        &self,
        i: usize,
        me: u32,
        o: &mut Op,
        dep_pairs: &mut Vec<(u32, u32)>,
        out: &mut Emitted,
    ) -> Result<()> {
        let (plan, num) = (self.plan, self.num);
        dep_pairs.clear();
        for &d in &o.deps {
            let d = d as usize;
            if num.new_id.get(d).is_some_and(|&n| n != u32::MAX) {
                dep_pairs.push((num.new_id[d], 0));
                continue;
            }
            let dl = plan
                .ops
                .get(d)
                .map(|x| x.lane as usize)
                .ok_or_else(|| asym(format!("op {i} waits for a missing op {d}")))?;
            let owner = plan.lanes[dl].location;
            if !self.window.has(owner) {
                out.grow_devs.push(owner);
                continue;
            }
            let p = num.period_of[dl].unwrap_or(0);
            // `d` lies on a window device outside the domain: `verify_periods` verified it.
            dep_pairs.push((num.new_id[self.image_of(d)? as usize], p));
        }
        dep_pairs.sort_unstable();
        dep_pairs.dedup();
        o.deps.clear();
        for (j, &(d, p)) in dep_pairs.iter().enumerate() {
            o.deps.push(d);
            out.note(me, OffsetAt::Dep(j as u32), p);
        }
        Ok(())
    }

    /// Template op `me`'s edges (`o`) mapped to their orbits' representatives, each with its
    /// capacity scale (`orbit size / periods`) and period recorded; an NVLS group's shared
    /// edge likewise.
    fn emit_edges(&self, me: u32, o: &mut Op, out: &mut Emitted) -> Result<()> {
        let shift = self.shift;
        let periods = shift.periods().max(1);
        for (j, e) in o.edges.iter_mut().enumerate() {
            let rep = shift
                .rep_edge(*e)
                .ok_or_else(|| asym(format!("edge {e} has no representative")))?;
            let s = f64::from(shift.edge_orbit(*e)) / f64::from(periods);
            let at = rep as usize;
            if at >= out.scale.len() {
                out.scale.resize(at + 1, f64::NAN);
            }
            out.scale[at] = s;
            out.note(me, OffsetAt::Edge(j as u32), shift.edge_period(*e));
            *e = rep;
        }
        if let Some(n) = &mut o.nvls {
            out.note(me, OffsetAt::Nvls, shift.edge_period(n.shared_edge));
            n.shared_edge = shift.rep_edge(n.shared_edge).unwrap_or(n.shared_edge);
        }
        Ok(())
    }
}
