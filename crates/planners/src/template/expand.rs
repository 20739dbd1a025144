//! Exact expansion of a template: the ops of any period on demand, numbered as in the full
//! plan, and the full plan itself where it fits in memory.
//!
//! Period `k`'s op `i` (global id `k x ops + i`, period-major; lanes and staging buffers
//! likewise) is the template's op `i` with
//! - its lane's memory shifted `k` periods on;
//! - each user buffer `Input(r)`/`Output(r)` of rank `(r + k x m) mod n` (`m` ranks per
//!   period: the ranks of period `k` are those of period 0 shifted by `k x m`,
//!   [`super::shift::ranks_invariant`]);
//! - each staging buffer, dependency and edge shifted `k` periods on plus the offset the fold
//!   recorded for it ([`relaycc_plan::Template::offsets`]): a reference into period `p` of the domain's
//!   op lies in period `k + p` of its `k`-th image;
//! - each region's offset rotated `k` times its shift per period within its block
//!   ([`relaycc_plan::Template::shifts`]): data blocks follow their ranks.
//!
//! Only a template the fold found exact ([`relaycc_plan::Template::exact`]) expands.

use relaycc_topo::{HostSymmetry, LinkId, NodeId, Topology};

use relaycc_plan::{BufferRef, Lane, Location, OffsetAt, Op, OpKind, Plan, Region, Scratch};
use relaycc_plan::{Result, RouteError};

fn bad(op: usize, message: String) -> RouteError {
    RouteError::PlanCheck { op, message }
}

/// A template with what expanding it needs: the topology's shift and the offsets indexed by
/// op. Holds no op of the full plan; [`Expansion::op`] makes one on demand.
#[derive(Debug)]
pub struct Expansion<'p> {
    plan: &'p Plan,
    sym: HostSymmetry,
    periods: u32,
    ranks: u32,
    per: u32,
    ops: u32,
    lanes: u32,
    scratch: u32,
    groups: u32,
    off_start: Vec<u32>,
    offs: Vec<(OffsetAt, u32)>,
    shift_start: Vec<u32>,
    shifts: Vec<(u32, u64, u64)>,
}

impl<'p> Expansion<'p> {
    /// The expansion of template `plan` on `topo`, the topology it was planned on. A plan
    /// that is no template is its own expansion of one period.
    ///
    /// # Errors
    /// [`RouteError::PlanCheck`] when template `plan` was folded without period offsets
    /// (JSON written before they were recorded), does not match `topo`'s host symmetry, or
    /// names an offset of an op or reference it lacks.
    pub fn new(plan: &'p Plan, topo: &Topology) -> Result<Self> {
        let none = usize::MAX;
        let Some(t) = plan.template.as_ref() else {
            return Self::whole(plan, topo);
        };
        if !t.exact {
            return Err(bad(
                none,
                format!(
                    "the template of {} is not exact, so it cannot be expanded: {}",
                    plan.algorithm,
                    t.inexact.as_deref().unwrap_or(
                        "it holds no period offsets (written before they were recorded)"
                    )
                ),
            ));
        }
        let mut sym = topo.host_symmetry();
        if sym.hosts() != t.hosts {
            return Err(bad(
                none,
                format!(
                    "the template spans {} hosts, the topology {}",
                    t.hosts,
                    sym.hosts()
                ),
            ));
        }
        if sym.period() != t.period {
            sym = sym.with_period(t.period).ok_or_else(|| {
                bad(
                    none,
                    format!(
                        "the template's period of {} hosts is no symmetry of the topology \
                         (its period is {})",
                        t.period,
                        sym.period()
                    ),
                )
            })?;
        }
        let periods = sym.periods();
        let n = plan.request.gpus.len() as u32;
        if periods != t.periods || periods == 0 || !n.is_multiple_of(periods) {
            return Err(bad(
                none,
                format!(
                    "the template's {} periods do not fold {} ranks on {} periods of the \
                     topology",
                    t.periods, n, periods
                ),
            ));
        }
        if !super::shift::ranks_invariant(&sym, &plan.request.gpus) {
            return Err(bad(
                none,
                "the request's ranks are not the same on every period of hosts".into(),
            ));
        }
        let ops = plan.ops.len() as u32;
        let mut off_start = vec![0u32; ops as usize + 1];
        for o in &t.offsets {
            let op = plan
                .ops
                .get(o.op as usize)
                .ok_or_else(|| bad(none, format!("an offset names op {} of {ops}", o.op)))?;
            let regions = match &op.kind {
                OpKind::Copy { .. } => 2,
                OpKind::Reduce { srcs, .. } => srcs.len() + 1,
            };
            let fits = match o.at {
                OffsetAt::Dep(j) => (j as usize) < op.deps.len(),
                OffsetAt::Region(j) => (j as usize) < regions,
                OffsetAt::Edge(j) => (j as usize) < op.edges.len(),
                OffsetAt::Nvls => op.nvls.is_some(),
            };
            if !fits || o.periods >= periods {
                return Err(bad(
                    o.op as usize,
                    format!("offset {:?} by {} periods names nothing", o.at, o.periods),
                ));
            }
            off_start[o.op as usize + 1] += 1;
        }
        for i in 0..ops as usize {
            off_start[i + 1] += off_start[i];
        }
        let mut fill = off_start.clone();
        let mut offs = vec![(OffsetAt::Nvls, 0u32); t.offsets.len()];
        for o in &t.offsets {
            let at = &mut fill[o.op as usize];
            offs[*at as usize] = (o.at, o.periods);
            *at += 1;
        }
        let mut shift_start = vec![0u32; ops as usize + 1];
        for s in &t.shifts {
            if s.op >= ops {
                return Err(bad(
                    none,
                    format!("a region shift names op {} of {ops}", s.op),
                ));
            }
            shift_start[s.op as usize + 1] += 1;
        }
        for i in 0..ops as usize {
            shift_start[i + 1] += shift_start[i];
        }
        let mut fill = shift_start.clone();
        let mut shifts = vec![(0u32, 0u64, 1u64); t.shifts.len()];
        for s in &t.shifts {
            if s.block == 0 {
                return Err(bad(
                    s.op as usize,
                    "a region shift of a block of 0 elements".into(),
                ));
            }
            let at = &mut fill[s.op as usize];
            shifts[*at as usize] = (s.region, s.elems, s.block);
            *at += 1;
        }
        let groups = nvls_groups(plan);
        Ok(Expansion {
            plan,
            sym,
            periods,
            ranks: n,
            per: n / periods,
            ops,
            lanes: plan.lanes.len() as u32,
            scratch: plan.scratch.len() as u32,
            groups,
            off_start,
            offs,
            shift_start,
            shifts,
        })
    }
    /// A plan built in full as the expansion of itself: one period spanning every host, no
    /// offsets and no shifts, so period 0's op `i` is the plan's op `i`. This lets the sampled
    /// execution ([`super::sample`]) check full plans too large for the checker's vector clocks.
    fn whole(plan: &'p Plan, topo: &Topology) -> Result<Self> {
        let sym = topo.host_symmetry();
        let sym = if sym.periods() == 1 {
            sym
        } else {
            sym.with_period(sym.hosts()).ok_or_else(|| {
                bad(
                    usize::MAX,
                    format!("{} hosts are no period of the topology", sym.hosts()),
                )
            })?
        };
        let ops = plan.ops.len() as u32;
        let groups = nvls_groups(plan);
        let n = plan.request.gpus.len() as u32;
        Ok(Expansion {
            plan,
            sym,
            periods: 1,
            ranks: n,
            per: n,
            ops,
            lanes: plan.lanes.len() as u32,
            scratch: plan.scratch.len() as u32,
            groups,
            off_start: vec![0; ops as usize + 1],
            offs: Vec::new(),
            shift_start: vec![0; ops as usize + 1],
            shifts: Vec::new(),
        })
    }
    /// The template (or the full plan, for a plan that is no template).
    pub fn template(&self) -> &'p Plan {
        self.plan
    }
    /// Periods of hosts: images of the template's ops.
    pub fn periods(&self) -> u32 {
        self.periods
    }
    /// Ranks per period.
    pub fn ranks_per_period(&self) -> u32 {
        self.per
    }
    /// Ops of one period (the template's).
    pub fn ops_per_period(&self) -> u32 {
        self.ops
    }
    /// Staging buffers of one period (the template's).
    pub fn scratch_per_period(&self) -> u32 {
        self.scratch
    }
    /// Ops of the full plan.
    pub fn full_ops(&self) -> u64 {
        u64::from(self.ops) * u64::from(self.periods)
    }
    /// The period offset the fold recorded for reference `at` of template op `i` (0 when none).
    pub fn offset(&self, i: u32, at: OffsetAt) -> u32 {
        let (a, b) = (
            self.off_start[i as usize] as usize,
            self.off_start[i as usize + 1] as usize,
        );
        self.offs[a..b]
            .iter()
            .find(|(x, _)| *x == at)
            .map_or(0, |&(_, p)| p)
    }
    /// Elements region `j` of template op `i` rotates per period and the block it rotates in
    /// (0 elements when it keeps its offset).
    pub fn region_shift(&self, i: u32, j: u32) -> (u64, u64) {
        let (a, b) = (
            self.shift_start[i as usize] as usize,
            self.shift_start[i as usize + 1] as usize,
        );
        self.shifts[a..b]
            .iter()
            .find(|(x, _, _)| *x == j)
            .map_or((0, 1), |&(_, e, b)| (e, b))
    }
    /// Elements of buffer `b` of the full plan.
    pub fn buffer_len(&self, b: BufferRef) -> Result<u64> {
        match b {
            BufferRef::Input(r) => self.plan.request.input_len(r),
            BufferRef::Output(r) => self.plan.request.output_len(r),
            BufferRef::Scratch(s) => self
                .plan
                .scratch
                .get((s % self.scratch.max(1)) as usize)
                .map(|x| x.len)
                .ok_or_else(|| bad(usize::MAX, format!("staging buffer {s} does not exist"))),
        }
    }
    /// Region `j` of template op `i` (`r`) as period `k` names it.
    pub fn region(&self, i: u32, j: u32, r: Region, k: u32) -> Result<Region> {
        let off = self.offset(i, OffsetAt::Region(j));
        let buffer = self.buffer(r.buffer, k, off);
        let (elems, block) = self.region_shift(i, j);
        if elems == 0 || k == 0 {
            return Ok(Region { buffer, ..r });
        }
        let m = self.buffer_len(buffer)?;
        let offset = super::fold::rotate(r.offset, elems, block, k);
        if offset + r.len > m || r.offset % block + r.len > block {
            return Err(bad(
                i as usize,
                format!(
                    "region {j} of op {i} wraps around its buffer on period {k} ({} elements \
                     from {offset} of {m})",
                    r.len
                ),
            ));
        }
        Ok(Region {
            buffer,
            offset,
            ..r
        })
    }
    /// Memory `loc` of the domain shifted `k` periods on.
    pub fn location(&self, loc: Location, k: u32) -> Location {
        match loc {
            Location::Gpu(g) => Location::Gpu(self.sym.shift_gpu(g, k)),
            Location::Host(n) => {
                Location::Host(self.sym.shift_node(NodeId::new(n as usize), k).index() as u32)
            }
        }
    }
    /// Buffer `b` of a template op, as period `k`'s image names it (`off`: the offset the fold
    /// recorded for a staging buffer).
    pub fn buffer(&self, b: BufferRef, k: u32, off: u32) -> BufferRef {
        let rank = |r: u32| {
            ((u64::from(r) + u64::from(k) * u64::from(self.per)) % u64::from(self.ranks)) as u32
        };
        match b {
            BufferRef::Input(r) => BufferRef::Input(rank(r)),
            BufferRef::Output(r) => BufferRef::Output(rank(r)),
            BufferRef::Scratch(s) => {
                BufferRef::Scratch(((k + off) % self.periods) * self.scratch + s)
            }
        }
    }
    /// Template op `i` of period `k` (`k < periods`, `i < ops_per_period`), with the full
    /// plan's lane, op and staging numbering; [`RouteError::PlanCheck`] when the full plan's
    /// ids do not fit the IR's 32-bit ids.
    pub fn op(&self, k: u32, i: u32) -> Result<Op> {
        if self.full_ops() > u64::from(u32::MAX) {
            return Err(bad(
                i as usize,
                format!("{} ops exceed the IR's 32-bit op ids", self.full_ops()),
            ));
        }
        let t = &self.plan.ops[i as usize];
        let mut o = t.clone();
        o.lane = k * self.lanes + t.lane;
        let mut regions: Vec<&mut relaycc_plan::Region> = match &mut o.kind {
            OpKind::Copy { src, dst } => vec![src, dst],
            OpKind::Reduce { srcs, dst, .. } => srcs.iter_mut().chain([dst]).collect(),
        };
        for (j, r) in regions.iter_mut().enumerate() {
            **r = self.region(i, j as u32, **r, k)?;
        }
        for (j, d) in o.deps.iter_mut().enumerate() {
            *d += self.dep_period(k, i, j as u32) * self.ops;
        }
        for (j, e) in o.edges.iter_mut().enumerate() {
            let p = k + self.offset(i, OffsetAt::Edge(j as u32));
            *e = self.sym.shift_edge(LinkId::new(*e as usize), p).index() as u32;
        }
        if let Some(n) = &mut o.nvls {
            let p = k + self.offset(i, OffsetAt::Nvls);
            n.shared_edge = self
                .sym
                .shift_edge(LinkId::new(n.shared_edge as usize), p)
                .index() as u32;
            n.group += k * self.groups;
        }
        Ok(o)
    }
    /// The period of dependency `j` of template op `i`'s image on period `k`: its op is that
    /// period's image of the template op the dependency names.
    pub fn dep_period(&self, k: u32, i: u32, j: u32) -> u32 {
        (k + self.offset(i, OffsetAt::Dep(j))) % self.periods
    }
    /// Template lane `l` of period `k`.
    pub fn lane(&self, k: u32, l: u32) -> Lane {
        let t = &self.plan.lanes[l as usize];
        Lane {
            location: self.location(t.location, k),
            label: if k == 0 {
                t.label.clone()
            } else {
                format!("{} (period {k})", t.label)
            },
        }
    }
    /// Template staging buffer `s` of period `k`.
    pub fn scratch(&self, k: u32, s: u32) -> Scratch {
        let t = self.plan.scratch[s as usize];
        Scratch {
            location: self.location(t.location, k),
            len: t.len,
        }
    }
    /// The full plan: every period's ops, lanes and staging, period-major.
    ///
    /// # Errors
    /// [`RouteError::PlanCheck`] when the full plan's ids do not fit 32 bits.
    pub fn expand(&self) -> Result<Plan> {
        let mut full = Plan::new(self.plan.request.clone(), self.plan.algorithm.clone());
        full.dtype = self.plan.dtype;
        full.protocol = self.plan.protocol;
        full.ops.reserve(self.full_ops() as usize);
        for k in 0..self.periods {
            for l in 0..self.lanes {
                full.lanes.push(self.lane(k, l));
            }
            for s in 0..self.scratch {
                full.scratch.push(self.scratch(k, s));
            }
            for i in 0..self.ops {
                full.ops.push(self.op(k, i)?);
            }
        }
        Ok(full)
    }
}

/// NVLS groups `plan` numbers (one past the highest group id).
fn nvls_groups(plan: &Plan) -> u32 {
    plan.ops
        .iter()
        .filter_map(|o| o.nvls.map(|s| s.group + 1))
        .max()
        .unwrap_or(0)
}

/// The full plan a template stands for, on `topo`, the topology it was planned on
/// ([`Expansion::expand`]). A plan that is no template is returned as it is.
///
/// # Errors
/// Those of [`Expansion::new`] and [`Expansion::expand`].
pub fn expand(plan: &Plan, topo: &Topology) -> Result<Plan> {
    if !plan.is_template() {
        return Ok(plan.clone());
    }
    Expansion::new(plan, topo)?.expand()
}
