//! The plan checker: proves a plan delivers exactly what its request asks.
//!
//! It executes the plan symbolically. Every element of every buffer holds either nothing
//! (never written) or the set of input elements `(rank, index)` whose op-combination it now
//! equals. Intervals stand for runs of elements, so the cost grows with the number of ops and
//! region boundaries, not with the bytes. Checked:
//! - structure: lanes, deps and buffers exist; regions lie inside their buffers; copies keep
//!   lengths; reductions are local; the dependency graph (deps plus lane order) has no cycle;
//! - data: no op reads an element before something wrote it; no reduction counts an input
//!   twice or combines an already averaged value; at the end every output element holds
//!   exactly its expected inputs (and, for `Avg`, was divided exactly once);
//! - ordering: every read sees a write that happens before it, and no two ops that are not
//!   ordered touch the same element while one of them writes it (a data race on a GPU).
//!
//! Happens-before is tracked with one vector clock per op over the plan's lanes (ops x lanes
//! words), so plans of 100k ops check in a few hundred megabytes at most.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use relaycc_topo::{NodeKind, Topology};

use crate::dtype::ReduceOp;
use crate::error::{Result, RouteError};
use crate::plan::{BufferRef, Location, OpKind, Plan, Region};
use crate::request::Collective;

/// Options of [`check_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// Check the plan as an in-place call: input and output of a rank share memory as NCCL
    /// defines it (same buffer for all_reduce, broadcast, reduce; input inside the output at
    /// the rank's block for all_gather(_v) and gather; output inside the input for
    /// reduce_scatter and scatter). Collectives without an in-place form ignore it.
    pub in_place: bool,
}

/// Check that `plan` delivers its request (out-of-place).
pub fn check(plan: &Plan) -> Result<()> {
    check_with(plan, CheckOptions::default())
}

/// Symbolic content of a run of elements: the element at `start + i` of the run equals the
/// combination of input elements `(rank, idx + i)` for each `(rank, idx)` in `terms`.
#[derive(Debug, Clone, PartialEq)]
struct Seg {
    start: u64,
    end: u64,
    terms: Vec<(u32, u64)>,
    finalized: bool,
    /// The op that wrote the run (`NONE` for the caller's input).
    writer: u32,
    /// Ops that read the run since it was written.
    readers: Vec<u32>,
}

const NONE: u32 = u32::MAX;

impl Seg {
    /// The part `[a, b)` of this run (absolute positions inside it).
    fn slice(&self, a: u64, b: u64) -> Seg {
        let shift = a - self.start;
        Seg {
            start: a,
            end: b,
            terms: self.terms.iter().map(|(r, i)| (*r, i + shift)).collect(),
            finalized: self.finalized,
            writer: self.writer,
            readers: self.readers.clone(),
        }
    }
}

/// One buffer's symbolic memory: sorted, non-overlapping runs.
#[derive(Debug, Default)]
struct Memory {
    segs: Vec<Seg>,
}

impl Memory {
    /// Split runs so that `at` is a boundary.
    fn split_at(&mut self, at: u64) {
        if let Some(i) = self.segs.iter().position(|s| s.start < at && at < s.end) {
            let s = self.segs[i].clone();
            self.segs[i] = s.slice(s.start, at);
            self.segs.insert(i + 1, s.slice(at, s.end));
        }
    }
    /// Indices of runs inside `[a, b)` after splitting at both ends; None if a gap exists.
    fn range(&mut self, a: u64, b: u64) -> std::result::Result<std::ops::Range<usize>, u64> {
        self.split_at(a);
        self.split_at(b);
        let first = self.segs.partition_point(|s| s.end <= a);
        let mut pos = a;
        let mut i = first;
        while pos < b {
            match self.segs.get(i) {
                Some(s) if s.start == pos => {
                    pos = s.end;
                    i += 1;
                }
                _ => return Err(pos),
            }
        }
        Ok(first..i)
    }
    /// Replace `[a, b)` with `new` runs (absolute positions); returns the runs it replaced.
    fn write(&mut self, a: u64, b: u64, new: Vec<Seg>) -> Vec<Seg> {
        self.split_at(a);
        self.split_at(b);
        let first = self.segs.partition_point(|s| s.end <= a);
        let last = self.segs.partition_point(|s| s.start < b);
        let old: Vec<Seg> = self.segs.splice(first..last, new).collect();
        old
    }
}

struct Checker<'a> {
    plan: &'a Plan,
    mems: Vec<Memory>,
    /// For each op: its 1-based position in its lane.
    pos: Vec<u32>,
    /// Vector clocks, ops x lanes, flattened.
    clocks: Vec<u32>,
    lanes: usize,
}

fn fail(op: usize, message: impl Into<String>) -> RouteError {
    RouteError::PlanCheck {
        op,
        message: message.into(),
    }
}

impl Checker<'_> {
    /// True when op `a` happens before op `b`.
    fn hb(&self, a: u32, b: u32) -> bool {
        if a == NONE {
            return true;
        }
        let lane = self.plan.ops[a as usize].lane as usize;
        self.clocks[b as usize * self.lanes + lane] >= self.pos[a as usize]
    }
}

/// Which memory a buffer is, and where inside it the buffer starts.
fn memory_of(plan: &Plan, b: BufferRef, in_place: bool) -> Option<(usize, u64)> {
    let n = plan.request.gpus.len();
    let req = &plan.request;
    let c = req.count;
    Some(match b {
        BufferRef::Input(r) | BufferRef::Output(r) if r as usize >= n => return None,
        BufferRef::Scratch(i) => (2 * n + i as usize, 0),
        BufferRef::Input(r) | BufferRef::Output(r) if !in_place => (
            2 * r as usize + usize::from(matches!(b, BufferRef::Output(_))),
            0,
        ),
        BufferRef::Input(r) | BufferRef::Output(r) => {
            let is_out = matches!(b, BufferRef::Output(_));
            let mem = 2 * r as usize;
            let own = |v: u64| v.checked_mul(u64::from(r));
            match req.collective {
                Collective::AllReduce => (mem, 0),
                Collective::Broadcast | Collective::Reduce => (mem, 0),
                // Input sits inside the output at the rank's block.
                Collective::AllGather => (mem, if is_out { 0 } else { own(c)? }),
                Collective::AllGatherV => {
                    let displ: u64 = req.counts.get(..r as usize)?.iter().sum();
                    (mem, if is_out { 0 } else { displ })
                }
                Collective::Gather if r == req.root => (mem, if is_out { 0 } else { own(c)? }),
                // Output sits inside the input at the rank's block.
                Collective::ReduceScatter => (mem, if is_out { own(c)? } else { 0 }),
                Collective::Scatter if r == req.root => (mem, if is_out { own(c)? } else { 0 }),
                _ => (mem + usize::from(is_out), 0),
            }
        }
    })
}

/// Check `plan` with options (see [`CheckOptions`]).
pub fn check_with(plan: &Plan, opts: CheckOptions) -> Result<()> {
    let req = &plan.request;
    req.validate()?;
    if plan.dtype != req.dtype {
        return Err(fail(usize::MAX, "plan dtype differs from the request's"));
    }
    let n = req.gpus.len();
    let in_place = opts.in_place
        && !matches!(
            req.collective,
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv
        );
    let len_of = |b: BufferRef| -> Result<u64> {
        match b {
            BufferRef::Input(r) if (r as usize) < n => req.input_len(r),
            BufferRef::Output(r) if (r as usize) < n => req.output_len(r),
            BufferRef::Scratch(i) => plan
                .scratch
                .get(i as usize)
                .map(|s| s.len)
                .ok_or_else(|| fail(usize::MAX, format!("scratch {i} does not exist"))),
            _ => Err(fail(
                usize::MAX,
                format!("{b:?} names a rank outside 0..{n}"),
            )),
        }
    };
    // Structure.
    for (id, op) in plan.ops.iter().enumerate() {
        if op.lane as usize >= plan.lanes.len() {
            return Err(fail(id, format!("lane {} does not exist", op.lane)));
        }
        for d in &op.deps {
            if *d as usize >= plan.ops.len() {
                return Err(fail(id, format!("depends on op {d}, which does not exist")));
            }
        }
        let regions: Vec<&Region> = match &op.kind {
            OpKind::Copy { src, dst } => {
                if src.len != dst.len {
                    return Err(fail(
                        id,
                        format!("copies {} elements into {}", src.len, dst.len),
                    ));
                }
                vec![src, dst]
            }
            OpKind::Reduce { srcs, dst, .. } => {
                if srcs.is_empty() {
                    return Err(fail(id, "reduction without sources"));
                }
                let here = plan.location(dst.buffer);
                for s in srcs {
                    if s.len != dst.len {
                        return Err(fail(
                            id,
                            "reduction sources and destination differ in length",
                        ));
                    }
                    if plan.location(s.buffer) != here {
                        return Err(fail(id, "reduction reads memory of another device"));
                    }
                }
                srcs.iter().chain(std::iter::once(dst)).collect()
            }
        };
        for r in regions {
            let cap = len_of(r.buffer).map_err(|e| fail(id, e.to_string()))?;
            if r.offset.checked_add(r.len).is_none_or(|end| end > cap) {
                return Err(fail(
                    id,
                    format!(
                        "region {:?}[{}..+{}] exceeds its {cap} elements",
                        r.buffer, r.offset, r.len
                    ),
                ));
            }
        }
    }
    // Topological order over deps and lane order; lowest id first for determinism.
    let nops = plan.ops.len();
    let lanes = plan.lanes.len().max(1);
    let mut pos = vec![0u32; nops];
    let mut lane_prev = vec![u32::MAX; plan.lanes.len()];
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); nops];
    let mut lane_count = vec![0u32; plan.lanes.len()];
    for (id, op) in plan.ops.iter().enumerate() {
        let l = op.lane as usize;
        lane_count[l] += 1;
        pos[id] = lane_count[l];
        preds[id].extend(op.deps.iter().copied());
        if lane_prev[l] != u32::MAX {
            preds[id].push(lane_prev[l]);
        }
        lane_prev[l] = id as u32;
    }
    let mut indeg: Vec<usize> = preds.iter().map(|p| p.len()).collect();
    let mut succs: Vec<Vec<u32>> = vec![Vec::new(); nops];
    for (id, p) in preds.iter().enumerate() {
        for &q in p {
            succs[q as usize].push(id as u32);
        }
    }
    let mut ready: BinaryHeap<Reverse<u32>> = (0..nops as u32)
        .filter(|i| indeg[*i as usize] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(nops);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &s in &succs[i as usize] {
            indeg[s as usize] -= 1;
            if indeg[s as usize] == 0 {
                ready.push(Reverse(s));
            }
        }
    }
    if order.len() != nops {
        let stuck = (0..nops).find(|i| indeg[*i] > 0).unwrap_or(0);
        return Err(fail(stuck, "dependency cycle (deps plus lane order)"));
    }
    let mut clocks = vec![0u32; nops * lanes];
    let mut mine = vec![0u32; lanes];
    for &i in &order {
        let i = i as usize;
        mine.fill(0);
        for &p in &preds[i] {
            let theirs = &clocks[p as usize * lanes..(p as usize + 1) * lanes];
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m = (*m).max(*t);
            }
        }
        mine[plan.ops[i].lane as usize] = pos[i];
        clocks[i * lanes..(i + 1) * lanes].copy_from_slice(&mine);
    }
    let mut ck = Checker {
        plan,
        mems: Vec::new(),
        pos,
        clocks,
        lanes,
    };
    ck.mems
        .resize_with(2 * n + plan.scratch.len(), Memory::default);
    for r in 0..n as u32 {
        let len = req.input_len(r)?;
        if let Some((m, base)) = memory_of(plan, BufferRef::Input(r), in_place) {
            if len > 0 {
                ck.mems[m].segs.push(Seg {
                    start: base,
                    end: base + len,
                    terms: vec![(r, 0)],
                    finalized: false,
                    writer: NONE,
                    readers: Vec::new(),
                });
            }
        }
    }
    let avg = req.op == ReduceOp::Avg && req.collective.reduces();
    for &id in &order {
        let id = id as usize;
        let op = &plan.ops[id];
        match &op.kind {
            OpKind::Copy { src, dst } => {
                let pieces = read(&mut ck, id, src, in_place)?;
                write(&mut ck, id, dst, pieces, in_place)?;
            }
            OpKind::Reduce {
                srcs,
                dst,
                finalize,
            } => {
                let mut inputs = Vec::with_capacity(srcs.len());
                for s in srcs {
                    inputs.push(read(&mut ck, id, s, in_place)?);
                }
                let combined = combine(id, &inputs, dst.len, avg && *finalize)?;
                write(&mut ck, id, dst, combined, in_place)?;
            }
        }
    }
    // Results.
    for piece in req.expected()? {
        let (m, base) = memory_of(plan, BufferRef::Output(piece.rank), in_place)
            .ok_or_else(|| fail(usize::MAX, "output buffer missing"))?;
        let a = base + piece.out_offset;
        let b = a + piece.len;
        let range = ck.mems[m].range(a, b).map_err(|at| {
            fail(
                usize::MAX,
                format!(
                    "rank {} output element {} is never written",
                    piece.rank,
                    at - base
                ),
            )
        })?;
        let mut want: Vec<(u32, u64)> = piece.terms.clone();
        want.sort_unstable();
        for s in &ck.mems[m].segs[range] {
            let shift = s.start - a;
            let want_here: Vec<(u32, u64)> = want.iter().map(|(r, i)| (*r, i + shift)).collect();
            if s.terms != want_here {
                return Err(fail(
                    usize::MAX,
                    format!(
                        "rank {} output elements {}..{} hold {} instead of {}",
                        piece.rank,
                        s.start - base,
                        s.end - base,
                        describe(&s.terms),
                        describe(&want_here)
                    ),
                ));
            }
            if avg && !s.finalized {
                return Err(fail(
                    usize::MAX,
                    format!(
                        "rank {} output elements {}..{} are summed but never divided for avg",
                        piece.rank,
                        s.start - base,
                        s.end - base
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn describe(terms: &[(u32, u64)]) -> String {
    let shown: Vec<String> = terms
        .iter()
        .take(4)
        .map(|(r, i)| format!("in[{r}][{i}]"))
        .collect();
    let more = if terms.len() > 4 {
        format!(" +{} more", terms.len() - 4)
    } else {
        String::new()
    };
    format!("{{{}{more}}}", shown.join(", "))
}

/// Read a region: its runs relative to the region's start; records the reader and checks that
/// each run's writer happens before the reader.
fn read(ck: &mut Checker, id: usize, r: &Region, in_place: bool) -> Result<Vec<Seg>> {
    if r.len == 0 {
        return Ok(Vec::new());
    }
    let (m, base) =
        memory_of(ck.plan, r.buffer, in_place).ok_or_else(|| fail(id, "buffer missing"))?;
    let a = base + r.offset;
    let range = ck.mems[m].range(a, a + r.len).map_err(|at| {
        fail(
            id,
            format!(
                "reads {:?} element {} before anything wrote it",
                r.buffer,
                at - base
            ),
        )
    })?;
    let mut out = Vec::with_capacity(range.len());
    for k in range {
        let w = ck.mems[m].segs[k].writer;
        if !ck.hb(w, id as u32) {
            return Err(fail(
                id,
                format!(
                    "reads {:?} while op {w} may still be writing it (no dependency)",
                    r.buffer
                ),
            ));
        }
        let s = &mut ck.mems[m].segs[k];
        s.readers.push(id as u32);
        let mut rel = s.clone();
        rel.start -= a;
        rel.end -= a;
        rel.readers.clear();
        out.push(rel);
    }
    Ok(out)
}

/// Write relative runs into a region; checks the previous writer and readers happen before.
fn write(ck: &mut Checker, id: usize, r: &Region, pieces: Vec<Seg>, in_place: bool) -> Result<()> {
    if r.len == 0 {
        return Ok(());
    }
    let (m, base) =
        memory_of(ck.plan, r.buffer, in_place).ok_or_else(|| fail(id, "buffer missing"))?;
    let a = base + r.offset;
    let new: Vec<Seg> = pieces
        .into_iter()
        .map(|mut s| {
            s.start += a;
            s.end += a;
            s.writer = id as u32;
            s.readers.clear();
            s
        })
        .collect();
    let old = ck.mems[m].write(a, a + r.len, new);
    for s in old {
        if !ck.hb(s.writer, id as u32) {
            return Err(fail(
                id,
                format!(
                    "writes {:?} while op {} may still be writing it (no dependency)",
                    r.buffer, s.writer
                ),
            ));
        }
        if let Some(rd) = s
            .readers
            .iter()
            .find(|rd| **rd != id as u32 && !ck.hb(**rd, id as u32))
        {
            return Err(fail(
                id,
                format!(
                    "overwrites {:?} while op {rd} may still be reading it (no dependency)",
                    r.buffer
                ),
            ));
        }
    }
    Ok(())
}

/// Combine the runs of several sources elementwise (all relative to 0..len).
fn combine(id: usize, inputs: &[Vec<Seg>], len: u64, finalize: bool) -> Result<Vec<Seg>> {
    let mut cuts: Vec<u64> = inputs
        .iter()
        .flat_map(|v| v.iter().flat_map(|s| [s.start, s.end]))
        .collect();
    cuts.push(0);
    cuts.push(len);
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut idx = vec![0usize; inputs.len()];
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a >= len {
            break;
        }
        let mut terms: Vec<(u32, u64)> = Vec::new();
        for (k, v) in inputs.iter().enumerate() {
            while idx[k] < v.len() && v[idx[k]].end <= a {
                idx[k] += 1;
            }
            let s = &v[idx[k].min(v.len().saturating_sub(1))];
            if s.finalized {
                return Err(fail(
                    id,
                    format!("reduces elements {a}..{b}, which were already divided for avg"),
                ));
            }
            let shift = a - s.start;
            terms.extend(s.terms.iter().map(|(r, i)| (*r, i + shift)));
        }
        terms.sort_unstable();
        if let Some(d) = terms.windows(2).find(|p| p[0] == p[1]) {
            return Err(fail(
                id,
                format!("counts input in[{}][{}] twice", d[0].0, d[0].1),
            ));
        }
        out.push(Seg {
            start: a,
            end: b,
            terms,
            finalized: finalize,
            writer: NONE,
            readers: Vec::new(),
        });
    }
    Ok(out)
}

/// Check that every copy of `plan` follows real links of `topo`: its edges form a path from
/// the source memory to the destination memory, through switches and sockets but no other
/// GPU, every edge usable under the mask, and over PCIe only between GPUs the driver grants
/// peer-to-peer access ([`Topology::pcie_peer_ok`]); and that every GPU the plan touches is
/// present and not busy, unless it is a member.
pub fn check_routes(plan: &Plan, topo: &Topology) -> Result<()> {
    let node_of = |loc: Location, id: usize| -> Result<relaycc_topo::NodeId> {
        match loc {
            Location::Gpu(g) => topo.gpu(g).map_err(|e| fail(id, e.to_string())),
            Location::Host(n) => {
                let node = relaycc_topo::NodeId::new(n as usize);
                match topo.graph().node_weight(node) {
                    Some(w) if matches!(w.kind, NodeKind::Cpu(_)) => Ok(node),
                    _ => Err(fail(id, format!("host location {n} is not a CPU node"))),
                }
            }
        }
    };
    let members: Vec<u32> = plan.request.gpus.clone();
    let usable_gpu = |g: u32, id: usize| -> Result<()> {
        if !topo.gpu_present(g) {
            return Err(fail(id, format!("GPU{g} is absent")));
        }
        if !members.contains(&g) && !topo.gpu_free(g) {
            return Err(fail(id, format!("GPU{g} is busy and may not relay")));
        }
        Ok(())
    };
    for &g in &members {
        if !topo.gpu_present(g) {
            return Err(fail(usize::MAX, format!("member GPU{g} is absent")));
        }
    }
    for (i, s) in plan.scratch.iter().enumerate() {
        if let Location::Gpu(g) = s.location {
            usable_gpu(g, usize::MAX).map_err(|_| {
                fail(
                    usize::MAX,
                    format!("scratch {i} sits on GPU{g}, which may not be used"),
                )
            })?;
        }
    }
    let nedges = topo.graph().edge_count();
    for (id, op) in plan.ops.iter().enumerate() {
        let OpKind::Copy { src, dst } = &op.kind else {
            continue;
        };
        let (Some(from), Some(to)) = (plan.location(src.buffer), plan.location(dst.buffer)) else {
            return Err(fail(id, "copy names a missing buffer"));
        };
        let (a, b) = (node_of(from, id)?, node_of(to, id)?);
        if a == b {
            if !op.edges.is_empty() {
                return Err(fail(id, "a copy inside one memory occupies links"));
            }
            continue;
        }
        if op.edges.is_empty() {
            return Err(fail(
                id,
                format!("copy {from:?} -> {to:?} occupies no link"),
            ));
        }
        let mut at = a;
        for (k, &e) in op.edges.iter().enumerate() {
            if e as usize >= nedges {
                return Err(fail(id, format!("edge {e} does not exist")));
            }
            let eid = relaycc_topo::LinkId::new(e as usize);
            let (x, y) = topo.link_ends(eid);
            if x != at {
                return Err(fail(
                    id,
                    format!(
                        "edge {e} does not continue the path at {}",
                        topo.node(at).name
                    ),
                ));
            }
            if !topo.link_usable(eid) {
                return Err(fail(
                    id,
                    format!(
                        "edge {e} ({} -> {}) is down",
                        topo.node(x).name,
                        topo.node(y).name
                    ),
                ));
            }
            let last = k + 1 == op.edges.len();
            if !last && topo.node(y).gpu().is_some() {
                return Err(fail(
                    id,
                    format!("path passes through {} without staging", topo.node(y).name),
                ));
            }
            at = y;
        }
        if at != b {
            return Err(fail(
                id,
                format!(
                    "path ends at {}, not at the destination",
                    topo.node(at).name
                ),
            ));
        }
        let over_pcie = op.edges.iter().any(|&e| {
            let eid = relaycc_topo::LinkId::new(e as usize);
            matches!(topo.link(eid).kind, relaycc_topo::LinkKind::Pcie { .. })
        });
        if over_pcie && !topo.pcie_peer_ok(a, b) {
            return Err(fail(
                id,
                format!(
                    "copy {} -> {} crosses PCIe, but the driver refuses them peer-to-peer \
                     access; stage it through host memory",
                    topo.node(a).name,
                    topo.node(b).name
                ),
            ));
        }
        for loc in [from, to] {
            if let Location::Gpu(g) = loc {
                usable_gpu(g, id)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
