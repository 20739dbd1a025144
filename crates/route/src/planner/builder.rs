//! The plan builder every collective planner writes through: it sends regions over cached
//! connections, reduces locally, and derives every dependency itself.
//!
//! Planners describe only data movement; the builder tracks, per memory, which op last wrote
//! each run of elements and which ops read it since, and gives each new op the dependencies
//! that order it after the writes it reads (read-after-write) and after the reads and writes of
//! what it overwrites (write-after-read, write-after-write). The checker's race rule therefore
//! holds by construction. Inputs and outputs are tracked as they alias in NCCL's in-place
//! calls (the layout [`crate::CheckOptions::in_place`] describes), so a plan built here is
//! ordered for both the in-place and the out-of-place call.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Result, RouteError};
use crate::lower::{LaneMap, emit_transfer};
use crate::plan::{BufferRef, Location, Plan, Region};
use crate::request::{Collective, Request};

use super::Ctx;

/// Lane channels reserved per planner channel: each route of a split connection gets its own
/// lanes (`channel * CH_STRIDE + route`), more than [`crate::path::MAX_FLOW_PATHS`] routes.
pub const CH_STRIDE: u32 = 64;

/// A memory as the in-place call lays it out: a rank's input and output share one memory for
/// collectives with an in-place form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mem {
    Rank(u32),
    RankOut(u32),
    Scratch(u32),
}

/// Where a buffer sits in the in-place layout (memory and base offset), as the checker's
/// in-place mode places it.
fn mem_of(req: &Request, b: BufferRef) -> (Mem, u64) {
    let c = req.count;
    let (r, out) = match b {
        BufferRef::Scratch(i) => return (Mem::Scratch(i), 0),
        BufferRef::Input(r) => (r, false),
        BufferRef::Output(r) => (r, true),
    };
    let own = c.saturating_mul(u64::from(r));
    let root = r == req.root;
    match req.collective {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (Mem::Rank(r), 0),
        Collective::AllGather => (Mem::Rank(r), if out { 0 } else { own }),
        Collective::AllGatherV => {
            let displ = req.counts.iter().take(r as usize).sum::<u64>();
            (Mem::Rank(r), if out { 0 } else { displ })
        }
        Collective::Gather if root => (Mem::Rank(r), if out { 0 } else { own }),
        Collective::ReduceScatter => (Mem::Rank(r), if out { own } else { 0 }),
        Collective::Scatter if root => (Mem::Rank(r), if out { own } else { 0 }),
        _ if out => (Mem::RankOut(r), 0),
        _ => (Mem::Rank(r), 0),
    }
}

/// One run of elements: who wrote it last and who read it since.
#[derive(Debug, Clone, Default)]
struct Run {
    end: u64,
    writer: Option<u32>,
    readers: Vec<u32>,
}

/// Runs of one memory, keyed by start; gaps are elements never touched.
#[derive(Debug, Default)]
struct Track {
    runs: BTreeMap<u64, Run>,
}

impl Track {
    fn split(&mut self, at: u64) {
        let hit = self
            .runs
            .range(..at)
            .next_back()
            .filter(|(_, r)| r.end > at)
            .map(|(s, r)| (*s, r.clone()));
        if let Some((s, r)) = hit {
            if let Some(first) = self.runs.get_mut(&s) {
                first.end = at;
            }
            self.runs.insert(at, r);
        }
    }
    /// Ops a reader (`write == false`) or writer of `[a, b)` must wait for.
    fn deps(&mut self, a: u64, b: u64, write: bool, out: &mut Vec<u32>) {
        self.split(a);
        self.split(b);
        for r in self.runs.range(a..b).map(|(_, r)| r) {
            out.extend(r.writer);
            if write {
                out.extend(r.readers.iter().copied());
            }
        }
    }
    fn read(&mut self, a: u64, b: u64, op: u32) {
        self.split(a);
        self.split(b);
        let mut pos = a;
        let mut gaps = Vec::new();
        for (s, r) in self.runs.range_mut(a..b) {
            if *s > pos {
                gaps.push((pos, *s));
            }
            if r.readers.last() != Some(&op) {
                r.readers.push(op);
            }
            pos = r.end;
        }
        if pos < b {
            gaps.push((pos, b));
        }
        for (s, e) in gaps {
            self.runs.insert(
                s,
                Run {
                    end: e,
                    writer: None,
                    readers: vec![op],
                },
            );
        }
    }
    fn write(&mut self, a: u64, b: u64, op: u32) {
        self.split(a);
        self.split(b);
        let keys: Vec<u64> = self.runs.range(a..b).map(|(s, _)| *s).collect();
        for k in keys {
            self.runs.remove(&k);
        }
        self.runs.insert(
            a,
            Run {
                end: b,
                writer: Some(op),
                readers: Vec::new(),
            },
        );
    }
}

/// Writes a plan through cached connections, deriving dependencies (see the module docs).
pub(crate) struct Builder<'a, 't> {
    /// The plan being built.
    pub plan: Plan,
    ctx: &'a Ctx<'t>,
    lanes: LaneMap,
    mems: BTreeMap<Mem, Track>,
    /// Ops every lane's first op after the last fence waits for.
    fence: Vec<u32>,
    fenced: BTreeSet<u32>,
    lane_last: BTreeMap<u32, u32>,
}

impl<'a, 't> Builder<'a, 't> {
    /// A builder for `req`, named `algorithm`.
    pub fn new(req: &Request, ctx: &'a Ctx<'t>, algorithm: impl Into<String>) -> Self {
        Builder {
            plan: Plan::new(req.clone(), algorithm),
            ctx,
            lanes: LaneMap::default(),
            mems: BTreeMap::new(),
            fence: Vec::new(),
            fenced: BTreeSet::new(),
            lane_last: BTreeMap::new(),
        }
    }
    /// The GPU of rank `r`.
    pub fn gpu(&self, r: u32) -> u32 {
        self.plan.request.gpus.get(r as usize).copied().unwrap_or(0)
    }
    /// A staging buffer of `len` elements on rank `r`'s GPU.
    pub fn scratch(&mut self, r: u32, len: u64) -> BufferRef {
        let g = self.gpu(r);
        self.plan.add_scratch(Location::Gpu(g), len)
    }
    fn location(&self, b: BufferRef) -> Result<Location> {
        self.plan
            .location(b)
            .ok_or_else(|| RouteError::BadRequest(format!("planner named a missing buffer {b:?}")))
    }
    fn deps_of(&mut self, reads: &[Region], write: Option<Region>) -> Vec<u32> {
        let mut d = Vec::new();
        for (r, w) in reads
            .iter()
            .map(|r| (r, false))
            .chain(write.iter().map(|r| (r, true)))
        {
            let (m, base) = mem_of(&self.plan.request, r.buffer);
            let a = base + r.offset;
            self.mems
                .entry(m)
                .or_default()
                .deps(a, a + r.len, w, &mut d);
        }
        d.sort_unstable();
        d.dedup();
        d
    }
    fn record(&mut self, r: Region, op: u32, write: bool) {
        let (m, base) = mem_of(&self.plan.request, r.buffer);
        let a = base + r.offset;
        let t = self.mems.entry(m).or_default();
        if write {
            t.write(a, a + r.len, op);
        } else {
            t.read(a, a + r.len, op);
        }
    }
    /// Apply the fence to new ops `from..` and note each lane's last op.
    fn settle(&mut self, from: usize) {
        for id in from..self.plan.ops.len() {
            let lane = self.plan.ops[id].lane;
            if !self.fence.is_empty() && self.fenced.insert(lane) {
                let f = self.fence.clone();
                self.plan.ops[id].deps.extend(f);
            }
            self.lane_last.insert(lane, id as u32);
        }
    }
    /// Order everything emitted after this call after everything emitted before it (one
    /// collective call after another on one stream).
    pub fn fence(&mut self) {
        if self.lane_last.is_empty() {
            return;
        }
        self.fence = self.lane_last.values().copied().collect();
        self.lane_last.clear();
        self.fenced.clear();
    }
    /// Move `src` to `dst` (same length): a local copy, or chunks over the connection between
    /// the two GPUs, on planner channel `ch`.
    pub fn send(&mut self, src: Region, dst: Region, ch: u32) -> Result<()> {
        if src.len != dst.len {
            return Err(RouteError::BadRequest(format!(
                "planner sends {} elements into {}",
                src.len, dst.len
            )));
        }
        if src.len == 0 {
            return Ok(());
        }
        let (from, to) = (self.location(src.buffer)?, self.location(dst.buffer)?);
        let deps = self.deps_of(&[src], Some(dst));
        let start = self.plan.ops.len();
        if from == to {
            let lane = self.lanes.local(&mut self.plan, from, ch);
            let id = self.plan.copy(lane, src, dst, Vec::new(), deps);
            self.record(src, id, false);
            self.record(dst, id, true);
            self.settle(start);
            return Ok(());
        }
        let (Location::Gpu(a), Location::Gpu(b)) = (from, to) else {
            return Err(RouteError::BadRequest(
                "planners send between GPU buffers only".into(),
            ));
        };
        let conn = self.ctx.cache.get(self.ctx.mode, a, b)?;
        let shares = conn.shares(src.len);
        let arrivals = emit_transfer(
            &mut self.plan,
            &mut self.lanes,
            src,
            dst,
            &conn.routes,
            &shares,
            self.ctx.chunk_elems.max(1),
            ch * CH_STRIDE,
            &deps,
        );
        for arr in arrivals {
            let rel = arr.dst.offset - dst.offset;
            self.record(
                Region::new(src.buffer, src.offset + rel, arr.dst.len),
                arr.op,
                false,
            );
            self.record(arr.dst, arr.op, true);
        }
        self.settle(start);
        Ok(())
    }
    /// `dst = op(srcs...)` on `dst`'s device, lane channel `ch`; `finalize` applies the Avg
    /// division (only passed on when the request's op is Avg).
    pub fn reduce(
        &mut self,
        srcs: Vec<Region>,
        dst: Region,
        finalize: bool,
        ch: u32,
    ) -> Result<()> {
        if dst.len == 0 {
            return Ok(());
        }
        let at = self.location(dst.buffer)?;
        let deps = self.deps_of(&srcs, Some(dst));
        let start = self.plan.ops.len();
        let lane = self.lanes.local(&mut self.plan, at, ch);
        let fin = finalize && self.plan.request.op == crate::dtype::ReduceOp::Avg;
        let id = self.plan.reduce(lane, srcs.clone(), dst, fin, deps);
        for s in srcs {
            self.record(s, id, false);
        }
        self.record(dst, id, true);
        self.settle(start);
        Ok(())
    }
    /// The finished plan.
    pub fn finish(self) -> Plan {
        self.plan
    }
}
