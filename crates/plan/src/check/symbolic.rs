//! The checker's symbolic execution of one plan (not a plan of rounds): every element of
//! every buffer holds either nothing or the set of input elements it now combines, in
//! intervals, with one vector clock per op for happens-before (see the module above for what
//! it proves). Also the structure-only checks of templates and of plans too large to execute.

use crate::dtype::ReduceOp;
use crate::error::{Result, RouteError};
use crate::order::DepGraph;
use crate::plan::{BufferRef, OpKind, Plan, Region};
use crate::request::Collective;

/// Options of [`super::check_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// Check the plan as an in-place call: input and output of a rank share memory as NCCL
    /// defines it (same buffer for all_reduce, broadcast, reduce; input inside the output at
    /// the rank's block for all_gather(_v) and gather; output inside the input for
    /// reduce_scatter(_v) and scatter). Collectives without an in-place form ignore it.
    pub in_place: bool,
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
        // Runs are sorted and disjoint: the first one ending after `at` is the only candidate.
        let i = self.segs.partition_point(|s| s.end <= at);
        if self.segs.get(i).is_some_and(|s| s.start < at && at < s.end) {
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

/// The symbolic execution's state.
struct Checker<'a> {
    plan: &'a Plan,
    mems: Vec<Memory>,
    /// The plan's dependency order (lane positions for [`Checker::hb`]).
    deps: DepGraph,
    /// Vector clocks, ops x lanes, flattened (see [`happens_before`]).
    clocks: Vec<u32>,
    lanes: usize,
    /// Whether inputs and outputs share memory (see [`CheckOptions::in_place`]).
    in_place: bool,
}

pub(super) fn fail(op: usize, message: impl Into<String>) -> RouteError {
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
        self.clocks[b as usize * self.lanes + lane] >= self.deps.lane_position(a)
    }
}

/// Which memory a buffer is, and where inside it the buffer starts.
fn memory_of(plan: &Plan, b: BufferRef, in_place: bool) -> Option<(usize, u64)> {
    let n = plan.request.gpus.len();
    let req = &plan.request;
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
            match req.in_place(r) {
                Some(at) => (mem, if is_out { at.output_at } else { at.input_at }),
                None => (mem + usize::from(is_out), 0),
            }
        }
    })
}

/// Check `plan` with options (see [`CheckOptions`]).
///
/// The passes, in order: `check_header` (request and dtype), the plan's dependency graph
/// (lanes and deps exist), `check_structure` (lengths, local reductions, regions inside
/// their buffers), `happens_before` (dependency order and vector clocks), `load_inputs` and
/// `execute` (symbolic execution: reads, writes, races) and `check_outputs` (every output
/// holds its expected inputs).
///
/// A plan of rounds is not one plan: [`super::check_with`] proves it through its body and
/// tail, with this.
pub(crate) fn check_single(plan: &Plan, opts: CheckOptions) -> Result<()> {
    if let Some(t) = &plan.template {
        return Err(fail(
            usize::MAX,
            format!(
                "{} is a template of hosts 0..{} of {} ({} of {} ops): it holds one domain's \
                 ops, so it cannot prove delivery; check it with check_template",
                plan.algorithm,
                t.period,
                t.hosts,
                plan.ops.len(),
                t.full_ops
            ),
        ));
    }
    check_header(plan)?;
    let in_place = opts.in_place
        && !matches!(
            plan.request.collective,
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv
        );
    let deps = plan.dependency_graph()?;
    check_structure(plan)?;
    check_nvls(plan)?;
    let (order, clocks) = happens_before(plan, &deps)?;
    let mut ck = Checker {
        plan,
        mems: Vec::new(),
        deps,
        clocks,
        lanes: plan.lanes.len().max(1),
        in_place,
    };
    ck.load_inputs()?;
    ck.execute(&order)?;
    ck.check_outputs()
}

/// Check a template plan (`relaycc_planners::template`) for what one domain's ops can show: the
/// request, lanes and dependencies exist, copies keep lengths, reductions are local, regions
/// lie inside their buffers, NVLS groups are well formed, the dependencies have no cycle, and
/// its capacity scales lie in (0, 1]. A plan that is no template is refused:
/// [`super::check`] proves those.
pub fn check_template(plan: &Plan) -> Result<()> {
    let Some(t) = &plan.template else {
        return Err(fail(
            usize::MAX,
            format!("{} is no template; check proves it", plan.algorithm),
        ));
    };
    if t.periods == 0 || t.period.saturating_mul(t.periods) != t.hosts {
        return Err(fail(
            usize::MAX,
            format!(
                "template of {} periods of {} hosts on {} hosts",
                t.periods, t.period, t.hosts
            ),
        ));
    }
    if let Some(s) = t
        .capacity_scale
        .iter()
        .find(|s| !(s.scale > 0.0 && s.scale <= 1.0))
    {
        return Err(fail(
            usize::MAX,
            format!("template scales edge {} by {}", s.edge, s.scale),
        ));
    }
    check_structure_only(plan)
}

/// Memory the vector clocks of [`super::check`]'s proof of `plan` take, bytes (ops x lanes
/// x 4).
pub fn clock_bytes(plan: &Plan) -> u64 {
    plan.ops.len() as u64 * plan.lanes.len().max(1) as u64 * 4
}

/// Check what a full plan's structure can show without executing it: the request, lanes and
/// dependencies exist, copies keep lengths, reductions are local, regions lie inside their
/// buffers, NVLS groups are well formed, and the dependencies have no cycle. Together with a
/// sampled execution (`relaycc_planners::template::sample`) and [`super::check_routes`], this proves
/// plans whose vector clocks are too large for [`super::check`].
pub fn check_structure_only(plan: &Plan) -> Result<()> {
    check_header(plan)?;
    let deps = plan.dependency_graph()?;
    check_structure(plan)?;
    check_nvls(plan)?;
    deps.topological_order()?;
    Ok(())
}

/// Pass 1: the request is valid and the plan's element type is the request's.
fn check_header(plan: &Plan) -> Result<()> {
    plan.request.validate()?;
    if plan.dtype != plan.request.dtype {
        return Err(fail(usize::MAX, "plan dtype differs from the request's"));
    }
    Ok(())
}

/// Elements of buffer `b` of `plan`, or an error naming what is missing.
fn buffer_len(plan: &Plan, b: BufferRef) -> Result<u64> {
    let req = &plan.request;
    let n = req.gpus.len();
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
}

/// Pass 2: copies keep lengths, reductions have sources of their destination's length in
/// its memory (any of the plan's when they are all one device's, [`Plan::one_device_memory`]),
/// and every region lies inside its buffer. (Lanes and deps exist: the
/// dependency graph checked them.)
fn check_structure(plan: &Plan) -> Result<()> {
    for (id, op) in plan.ops.iter().enumerate() {
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
                    if plan.location(s.buffer) != here && !plan.one_device_memory {
                        return Err(fail(id, "reduction reads memory of another device"));
                    }
                }
                srcs.iter().chain(std::iter::once(dst)).collect()
            }
        };
        for r in regions {
            let cap = buffer_len(plan, r.buffer).map_err(|e| fail(id, e.to_string()))?;
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
    Ok(())
}

/// Pass 2b: every NVLS group ([`crate::NvlsShare`]) is one the switch can combine: copies of
/// equal length, each crossing the group's shared edge, on distinct lanes with no member
/// waiting on another (they run side by side); and either one source region for all
/// (multicast, the shared edge first on each path) or one destination memory for all
/// (reduction in the switch, the shared edge last).
fn check_nvls(plan: &Plan) -> Result<()> {
    let mut groups: std::collections::HashMap<u32, Vec<usize>> = Default::default();
    for (id, op) in plan.ops.iter().enumerate() {
        if let Some(share) = op.nvls {
            groups.entry(share.group).or_default().push(id);
        }
    }
    for (group, ids) in groups {
        let first = &plan.ops[ids[0]];
        let Some(share) = first.nvls else { continue };
        let mut lanes = std::collections::HashSet::new();
        let (mut same_src, mut same_dst) = (true, true);
        let copy = |id: usize| match &plan.ops[id].kind {
            OpKind::Copy { src, dst } => Ok((*src, *dst)),
            OpKind::Reduce { .. } => Err(fail(id, format!("NVLS group {group} holds a reduction"))),
        };
        let (src0, dst0) = copy(ids[0])?;
        for &id in &ids {
            let op = &plan.ops[id];
            let (src, dst) = copy(id)?;
            if op.nvls.map(|s| s.shared_edge) != Some(share.shared_edge) {
                return Err(fail(
                    id,
                    format!("NVLS group {group} names two shared edges"),
                ));
            }
            if src.len != src0.len {
                return Err(fail(id, format!("NVLS group {group} mixes copy lengths")));
            }
            if !op.edges.contains(&share.shared_edge) {
                return Err(fail(
                    id,
                    format!(
                        "NVLS group {group}: the copy does not cross shared edge {}",
                        share.shared_edge
                    ),
                ));
            }
            if !lanes.insert(op.lane) {
                return Err(fail(
                    id,
                    format!("NVLS group {group} puts two copies on lane {}", op.lane),
                ));
            }
            if op.deps.iter().any(|d| ids.contains(&(*d as usize))) {
                return Err(fail(
                    id,
                    format!("NVLS group {group}: a copy waits for another of its group"),
                ));
            }
            same_src &= src == src0;
            same_dst &= plan.location(dst.buffer) == plan.location(dst0.buffer);
        }
        let multicast = same_src
            && ids
                .iter()
                .all(|&i| plan.ops[i].edges.first() == Some(&share.shared_edge));
        let reduction = same_dst
            && ids
                .iter()
                .all(|&i| plan.ops[i].edges.last() == Some(&share.shared_edge));
        if !(multicast || reduction) {
            return Err(fail(
                ids[0],
                format!(
                    "NVLS group {group} is neither a multicast (one source, shared edge first) \
                     nor a reduction (one destination, shared edge last)"
                ),
            ));
        }
    }
    Ok(())
}

/// The most memory the vector clocks of one proof may take (ops x lanes x 4 bytes): above it
/// the checker refuses with an error instead of letting the allocation abort the process.
/// Plans that large are proved on their template's structure instead ([`check_template`]).
pub const MAX_CLOCK_BYTES: usize = 8 << 30;

/// The error for a plan whose vector clocks exceed [`MAX_CLOCK_BYTES`] or this machine's
/// memory.
fn too_large(plan: &Plan, lanes: usize) -> RouteError {
    fail(
        usize::MAX,
        format!(
            "{} is too large to prove: {} ops x {} lanes of vector clocks need {:.1} GiB, above \
             the checker's limit of {} GiB or this machine's memory (plan fewer ranks, or a \
             cluster whose hosts repeat, which is planned as a template)",
            plan.algorithm,
            plan.ops.len(),
            lanes,
            plan.ops.len() as f64 * lanes as f64 * 4.0 / f64::from(1u32 << 30),
            MAX_CLOCK_BYTES >> 30
        ),
    )
}

/// Pass 3: the ops in dependency order (lowest id first among ready ones) and one vector
/// clock per op over the plan's lanes (ops x lanes, flattened): entry `l` of op `i`'s clock
/// is the furthest position of lane `l` that happens before or at `i`.
fn happens_before(plan: &Plan, deps: &DepGraph) -> Result<(Vec<u32>, Vec<u32>)> {
    let order = deps.topological_order()?;
    let lanes = plan.lanes.len().max(1);
    let cells = plan
        .ops
        .len()
        .checked_mul(lanes)
        .filter(|c| c.saturating_mul(4) <= MAX_CLOCK_BYTES)
        .ok_or_else(|| too_large(plan, lanes))?;
    let mut clocks = Vec::new();
    clocks
        .try_reserve_exact(cells)
        .map_err(|_| too_large(plan, lanes))?;
    clocks.resize(cells, 0u32);
    let mut mine = vec![0u32; lanes];
    for &i in &order {
        let op = &plan.ops[i as usize];
        mine.fill(0);
        for &p in op.deps.iter().chain(deps.lane_predecessor(i).as_ref()) {
            let theirs = &clocks[p as usize * lanes..(p as usize + 1) * lanes];
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m = (*m).max(*t);
            }
        }
        mine[op.lane as usize] = deps.lane_position(i);
        let i = i as usize;
        clocks[i * lanes..(i + 1) * lanes].copy_from_slice(&mine);
    }
    Ok((order, clocks))
}

impl Checker<'_> {
    /// Pass 4a: every rank's input holds its own elements, written by no op.
    fn load_inputs(&mut self) -> Result<()> {
        let (plan, n) = (self.plan, self.plan.request.gpus.len());
        self.mems
            .resize_with(2 * n + plan.scratch.len(), Memory::default);
        for r in 0..n as u32 {
            let len = plan.request.input_len(r)?;
            if let Some((m, base)) = memory_of(plan, BufferRef::Input(r), self.in_place)
                && len > 0
            {
                self.mems[m].segs.push(Seg {
                    start: base,
                    end: base + len,
                    terms: vec![(r, 0)],
                    finalized: false,
                    writer: NONE,
                    readers: Vec::new(),
                });
            }
        }
        Ok(())
    }

    /// Pass 4b: run the ops symbolically in `order`; reads see written data written before
    /// them, writes race with nothing, reductions count each input once.
    fn execute(&mut self, order: &[u32]) -> Result<()> {
        let req = &self.plan.request;
        let avg = req.op == ReduceOp::Avg && req.collective.reduces();
        for &id in order {
            let id = id as usize;
            match &self.plan.ops[id].kind {
                OpKind::Copy { src, dst } => {
                    let pieces = read(self, id, src)?;
                    write(self, id, dst, pieces)?;
                }
                OpKind::Reduce {
                    srcs,
                    dst,
                    finalize,
                } => {
                    let mut inputs = Vec::with_capacity(srcs.len());
                    for s in srcs {
                        inputs.push(read(self, id, s)?);
                    }
                    let combined = combine(id, &inputs, dst.len, avg && *finalize)?;
                    write(self, id, dst, combined)?;
                }
            }
        }
        Ok(())
    }

    /// Pass 5: every output element holds exactly its expected inputs, and for `Avg` was
    /// divided once.
    fn check_outputs(&mut self) -> Result<()> {
        let (plan, in_place) = (self.plan, self.in_place);
        let req = &plan.request;
        let avg = req.op == ReduceOp::Avg && req.collective.reduces();
        for piece in req.expected()? {
            let (m, base) = memory_of(plan, BufferRef::Output(piece.rank), in_place)
                .ok_or_else(|| fail(usize::MAX, "output buffer missing"))?;
            let a = base + piece.out_offset;
            let b = a + piece.len;
            let range = self.mems[m].range(a, b).map_err(|at| {
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
            for s in &self.mems[m].segs[range] {
                let shift = s.start - a;
                let want_here: Vec<(u32, u64)> =
                    want.iter().map(|(r, i)| (*r, i + shift)).collect();
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
                // An average of one term is that term: a copy needs no division by one.
                if avg && !s.finalized && want.len() > 1 {
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
fn read(ck: &mut Checker, id: usize, r: &Region) -> Result<Vec<Seg>> {
    if r.len == 0 {
        return Ok(Vec::new());
    }
    let (m, base) =
        memory_of(ck.plan, r.buffer, ck.in_place).ok_or_else(|| fail(id, "buffer missing"))?;
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
fn write(ck: &mut Checker, id: usize, r: &Region, pieces: Vec<Seg>) -> Result<()> {
    if r.len == 0 {
        return Ok(());
    }
    let (m, base) =
        memory_of(ck.plan, r.buffer, ck.in_place).ok_or_else(|| fail(id, "buffer missing"))?;
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
