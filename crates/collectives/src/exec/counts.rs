//! Count binding: the v-collectives (all_gather_v, reduce_scatter_v, all_to_all_v) run a plan
//! made once for their *capacity*, with the call's counts bound when the call is made, so a
//! count matrix that changes every call neither re-plans nor grows the plan cache. A capacity
//! plan that cannot be bound falls back to a plan of the exact counts.
//!
//! # The capacity plan
//!
//! A [`CountLayout`] replaces every count of a v-collective by one capacity `C`
//! ([`CountLayout::capacity_for`]: the largest count rounded up to a power of two): rank `s`'s
//! block for rank `d` of an all_to_all_v is `C` elements at `d x C` of its input, and so on.
//! That request (an all_to_all_v of a uniform matrix, an all_gather_v of uniform counts, a
//! reduce_scatter of count `C`) is planned and proved by the checker like any other.
//!
//! # Identities
//!
//! Every element of a user buffer in the capacity layout has a *position identity*
//! `(key, j)`: which count it belongs to (`key`: `s x n + d` for all_to_all_v's block from `s`
//! to `d`, `s` for all_gather_v's rank `s`, `b` for reduce_scatter_v's block `b`) and its index
//! `j` inside that block. It exists in the packed buffer of a call iff `j < counts[key]`, at
//! `displacement(key) + j`. [`CountPieces::new`] runs the plan once in dependency order and
//! tracks the *content identity* of every scratch element (which user element's data it
//! holds: copies carry it, a reduction's result has its sources' identity), then cuts each op
//! into pieces inside which identities run contiguously.
//!
//! # Binding a call
//!
//! Per call ([`CountPieces::copy_pieces`], [`CountPieces::reduce_pieces`]) each piece keeps
//! its live prefix (the elements with `j < counts[key]`), placed at its packed offset in user
//! buffers and at its capacity offset in scratch. A piece whose content is unknown (scratch
//! written by nothing the plan tracks) moves whole.
//!
//! # Why the bound program is the proved one
//!
//! A plan is bindable only if every user-buffer element an op touches has a content identity
//! equal to its position identity, and a reduction's sources agree on theirs
//! ([`CountPieces::new`] refuses it otherwise, and the caller plans the exact counts instead).
//! Then (1) every live element follows the same chain of ops as in the capacity plan, so the
//! checker's data proof carries over; (2) the packed placement is injective per buffer
//! (`displacement(key) + j` with `j < counts[key]`, displacements of one buffer's keys
//! disjoint), so ops the checker proved disjoint stay disjoint; (3) the in-place aliasing of
//! the capacity check (a rank's input is its block of its output) maps to the packed aliasing
//! the caller lends (the input view at the block's displacement).

use std::collections::BTreeMap;

use relaycc_route::{BufferRef, Collective, OpKind, Plan, Region, Request};

use super::invalid;
use super::lower::{Message, NO_OP, RankProgram, Segment};
use crate::backend::{Command, Program, Slot};
use crate::error::Result;

/// The v-collective a capacity plan serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VCollective {
    /// Every rank's `counts[s]` elements, concatenated in rank order, to every rank.
    AllGatherV,
    /// `matrix[s][d]` elements from rank `s` to rank `d`.
    AllToAllV,
    /// Block `b` (`counts[b]` elements) of the reduction to rank `b`.
    ReduceScatterV,
}

impl VCollective {
    /// The v-collective `c` is, if any.
    pub fn of(c: Collective) -> Option<Self> {
        match c {
            Collective::AllGatherV => Some(VCollective::AllGatherV),
            Collective::AllToAllV => Some(VCollective::AllToAllV),
            Collective::ReduceScatterV => Some(VCollective::ReduceScatterV),
            _ => None,
        }
    }
}

/// A v-collective over `ranks` ranks with every count replaced by `capacity` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CountLayout {
    /// The collective.
    pub collective: VCollective,
    /// Ranks.
    pub ranks: u32,
    /// Elements per block in the capacity layout.
    pub capacity: u64,
}

/// `(key, j)`: element `j` of the block counted by `counts[key]`.
type Identity = (u32, u64);

impl CountLayout {
    /// The capacity that serves counts up to `largest`: the next power of two (at least 1), so
    /// calls whose counts change every time reuse a handful of plans.
    pub fn capacity_for(largest: u64) -> u64 {
        largest
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(largest)
    }

    /// The layout and counts of an exact v-collective request (all_gather_v's and
    /// reduce_scatter_v's `counts`, all_to_all_v's `matrix` flattened row by row); `None` for
    /// any other collective.
    pub fn of_request(req: &Request) -> Option<(CountLayout, Vec<u64>)> {
        let collective = VCollective::of(req.collective)?;
        let counts = match collective {
            VCollective::AllGatherV | VCollective::ReduceScatterV => req.counts.clone(),
            VCollective::AllToAllV => req.matrix.iter().flatten().copied().collect(),
        };
        let largest = counts.iter().copied().max().unwrap_or(0);
        let layout = CountLayout {
            collective,
            ranks: req.nranks() as u32,
            capacity: CountLayout::capacity_for(largest),
        };
        Some((layout, counts))
    }

    /// The request this layout plans: `exact`'s collective, ranks, type and op with every
    /// count `capacity` (reduce_scatter_v: a reduce_scatter of `capacity` per block).
    pub fn capacity_request(&self, exact: &Request) -> Request {
        let n = self.ranks as usize;
        let c = self.capacity;
        let collective = match self.collective {
            VCollective::AllGatherV => Collective::AllGatherV,
            VCollective::AllToAllV => Collective::AllToAllV,
            VCollective::ReduceScatterV => Collective::ReduceScatter,
        };
        let mut req = Request::new(collective, exact.gpus.clone(), 0, exact.dtype)
            .with_op(exact.op)
            .with_root(exact.root);
        match self.collective {
            VCollective::AllGatherV => req.counts = vec![c; n],
            VCollective::AllToAllV => req.matrix = vec![vec![c; n]; n],
            VCollective::ReduceScatterV => req.count = c,
        }
        req
    }

    /// Number of counts of a call (`n`, or `n x n` for all_to_all_v).
    pub fn keys(&self) -> usize {
        let n = self.ranks as usize;
        match self.collective {
            VCollective::AllToAllV => n * n,
            _ => n,
        }
    }

    /// The position identity of element `o` of `buffer` in the capacity layout, and where its
    /// block ends (`None` for scratch).
    fn position(&self, buffer: BufferRef, o: u64) -> Option<(Identity, u64)> {
        let c = self.capacity.max(1);
        let (n, block, j) = (self.ranks, (o / c) as u32, o % c);
        let block_end = (o / c + 1) * c;
        let key = match (self.collective, buffer) {
            (_, BufferRef::Scratch(_)) => return None,
            (VCollective::AllToAllV, BufferRef::Input(s)) => s * n + block,
            (VCollective::AllToAllV, BufferRef::Output(d)) => block * n + d,
            (VCollective::AllGatherV, BufferRef::Input(s)) => return Some(((s, o), u64::MAX)),
            (VCollective::AllGatherV, BufferRef::Output(_)) => block,
            (VCollective::ReduceScatterV, BufferRef::Input(_)) => block,
            (VCollective::ReduceScatterV, BufferRef::Output(b)) => {
                return Some(((b, o), u64::MAX));
            }
        };
        Some(((key, j), block_end))
    }
}

/// One piece of an op: `len` elements from `rel` of each of its regions, with the content
/// identity of its first element (`None`: unknown, moved whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    rel: u64,
    len: u64,
    content: Option<Identity>,
}

/// The counts of one call and the displacements they give, by key ([`CountLayout::keys`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallCounts {
    counts: Vec<u64>,
    /// Where each key's block starts in the packed input and output buffers.
    input_at: Vec<u64>,
    output_at: Vec<u64>,
}

impl CallCounts {
    /// The counts of an all_gather_v (`counts[s]` from rank `s`) or a reduce_scatter_v
    /// (`counts[b]` for block `b`), or the flattened matrix of an all_to_all_v
    /// (`counts[s x n + d]` from `s` to `d`), in the plan's elements.
    ///
    /// Errors: a count list of another length than `layout.keys()`, or displacements that
    /// overflow.
    pub fn new(layout: &CountLayout, counts: &[u64]) -> Result<Self> {
        let mut c = CallCounts::default();
        c.set(layout, counts)?;
        Ok(c)
    }

    /// As [`CallCounts::new`], reusing this value's memory.
    pub fn set(&mut self, layout: &CountLayout, counts: &[u64]) -> Result<()> {
        if counts.len() != layout.keys() {
            return Err(invalid(
                None,
                format!(
                    "{} counts for a {:?} of {} ranks",
                    counts.len(),
                    layout.collective,
                    layout.ranks
                ),
            ));
        }
        let n = layout.ranks as usize;
        self.counts.clear();
        self.counts.extend_from_slice(counts);
        self.input_at.clear();
        self.input_at.resize(counts.len(), 0);
        self.output_at.clear();
        self.output_at.resize(counts.len(), 0);
        let overflow = || invalid(None, "the counts' displacements overflow u64".to_string());
        match layout.collective {
            VCollective::AllToAllV => {
                for s in 0..n {
                    let mut at = 0u64;
                    for d in 0..n {
                        self.input_at[s * n + d] = at;
                        at = at.checked_add(counts[s * n + d]).ok_or_else(overflow)?;
                    }
                }
                for d in 0..n {
                    let mut at = 0u64;
                    for s in 0..n {
                        self.output_at[s * n + d] = at;
                        at = at.checked_add(counts[s * n + d]).ok_or_else(overflow)?;
                    }
                }
            }
            VCollective::AllGatherV | VCollective::ReduceScatterV => {
                let mut at = 0u64;
                let side = if layout.collective == VCollective::AllGatherV {
                    &mut self.output_at
                } else {
                    &mut self.input_at
                };
                for (k, &c) in counts.iter().enumerate() {
                    side[k] = at;
                    at = at.checked_add(c).ok_or_else(overflow)?;
                }
            }
        }
        Ok(())
    }

    /// Elements of `piece` that exist in this call (a prefix).
    fn live(&self, p: &Piece) -> u64 {
        match p.content {
            None => p.len,
            Some((k, j)) => {
                let c = self.counts.get(k as usize).copied().unwrap_or(0);
                c.saturating_sub(j).min(p.len)
            }
        }
    }
}

/// A capacity plan cut into pieces of contiguous identity, once per plan; each call binds
/// its counts to it.
#[derive(Debug, Clone)]
pub struct CountPieces {
    layout: CountLayout,
    /// Per op: `pieces[start[i]..start[i + 1]]`.
    start: Vec<u32>,
    pieces: Vec<Piece>,
}

/// What a scratch buffer holds, by runs of elements: start -> (end, content identity).
type Runs = BTreeMap<u64, (u64, Identity)>;

/// The content runs of `r` (a scratch region: from `runs`; a user region: its positions) as
/// breakpoints relative to `r.offset`, each with the identity at its start.
fn content_runs(
    layout: &CountLayout,
    runs: &[Runs],
    r: &Region,
    out: &mut Vec<(u64, Option<Identity>)>,
) {
    out.clear();
    let end = r.offset.saturating_add(r.len);
    match r.buffer {
        BufferRef::Scratch(s) => {
            let map = &runs[s as usize];
            let mut at = r.offset;
            // The run that covers `at`, if any, then every run that starts before `end`.
            let first = map.range(..=at).next_back().filter(|(_, (e, _))| *e > at);
            let later = map.range(at + 1..end);
            for (&s0, &(e0, (k, j))) in first.into_iter().chain(later) {
                if s0 > at {
                    out.push((at - r.offset, None));
                    at = s0;
                }
                out.push((at - r.offset, Some((k, j + (at - s0)))));
                at = e0.min(end);
                if at >= end {
                    break;
                }
            }
            if at < end {
                out.push((at - r.offset, None));
            }
        }
        _ => {
            let mut at = r.offset;
            while at < end {
                let Some((id, block_end)) = layout.position(r.buffer, at) else {
                    break;
                };
                out.push((at - r.offset, Some(id)));
                at = block_end.min(end);
            }
        }
    }
}

/// The identity at `rel` of a region whose runs are `runs` (sorted by start).
fn identity_at(runs: &[(u64, Option<Identity>)], rel: u64) -> Option<Identity> {
    let k = runs.partition_point(|(s, _)| *s <= rel).checked_sub(1)?;
    let (s, id) = runs[k];
    id.map(|(key, j)| (key, j + (rel - s)))
}

/// Record that `r` (scratch) now holds identities starting at `id` (or unknown data).
fn set_runs(runs: &mut [Runs], r: &Region, id: Option<Identity>) {
    let BufferRef::Scratch(s) = r.buffer else {
        return;
    };
    let map = &mut runs[s as usize];
    let (a, b) = (r.offset, r.offset.saturating_add(r.len));
    // Cut the runs that straddle `a` or `b`, then drop everything inside.
    if let Some((&s0, &(e0, (k, j)))) = map.range(..a).next_back()
        && e0 > a
    {
        map.insert(s0, (a, (k, j)));
        if e0 > b {
            map.insert(b, (e0, (k, j + (b - s0))));
        }
    }
    if let Some((&s0, &(e0, (k, j)))) = map.range(..b).next_back()
        && e0 > b
        && s0 >= a
    {
        map.insert(b, (e0, (k, j + (b - s0))));
    }
    let inside: Vec<u64> = map.range(a..b).map(|(s, _)| *s).collect();
    for s in inside {
        map.remove(&s);
    }
    if let Some(id) = id {
        map.insert(a, (b, id));
    }
}

impl CountPieces {
    /// Cut `plan` (the capacity plan of `layout`, proved by the checker) into pieces.
    ///
    /// Errors: a plan that is not bindable (an op writes or reads a user element holding
    /// another element's data, or reduces sources of different identities), naming the op;
    /// the caller then plans the call's exact counts instead.
    ///
    /// Complexity: O((ops + pieces) log runs), once per plan.
    pub fn new(plan: &Plan, layout: CountLayout) -> Result<Self> {
        let order = plan.topological_order().map_err(super::from_route)?;
        let mut runs: Vec<Runs> = vec![Runs::new(); plan.scratch.len()];
        let mut per_op: Vec<Vec<Piece>> = vec![Vec::new(); plan.ops.len()];
        let mut cuts: Vec<u64> = Vec::new();
        let mut region_runs: Vec<Vec<(u64, Option<Identity>)>> = Vec::new();
        for &i in &order {
            let op = &plan.ops[i as usize];
            let regions: Vec<&Region> = match &op.kind {
                OpKind::Copy { src, dst } => vec![src, dst],
                OpKind::Reduce { srcs, dst, .. } => srcs.iter().chain([dst]).collect(),
            };
            let len = regions.last().map_or(0, |r| r.len);
            region_runs.resize_with(regions.len(), Vec::new);
            cuts.clear();
            for (r, out) in regions.iter().zip(region_runs.iter_mut()) {
                content_runs(&layout, &runs, r, out);
                cuts.extend(out.iter().map(|(s, _)| *s));
            }
            cuts.push(0);
            cuts.push(len);
            cuts.sort_unstable();
            cuts.dedup();
            let pieces = &mut per_op[i as usize];
            for w in cuts.windows(2) {
                let (rel, piece_len) = (w[0], w[1] - w[0]);
                if piece_len == 0 || rel >= len {
                    continue;
                }
                let ids: Vec<Option<Identity>> =
                    region_runs.iter().map(|rr| identity_at(rr, rel)).collect();
                let last = ids.len() - 1;
                let dst_is_user = !matches!(regions[last].buffer, BufferRef::Scratch(_));
                // Content: the first source's that is known; where none is, a user
                // destination's position. (A scratch destination's runs are what it held
                // before this op, which says nothing of what the op writes.)
                let content = ids[..last]
                    .iter()
                    .flatten()
                    .next()
                    .copied()
                    .or(if dst_is_user { ids[last] } else { None });
                let disagree = ids.iter().enumerate().any(|(k, id)| {
                    let is_user = !matches!(regions[k].buffer, BufferRef::Scratch(_));
                    if k == last && !is_user {
                        return false;
                    }
                    match (id, content) {
                        (Some(a), Some(b)) => *a != b,
                        // A user element whose content is unknown cannot be placed.
                        _ => is_user,
                    }
                });
                if disagree {
                    return Err(invalid(
                        Some(i as usize),
                        format!(
                            "elements {rel}..{} of this op hold data of another element of \
                             the count layout; the call is planned for its exact counts",
                            rel + piece_len
                        ),
                    ));
                }
                pieces.push(Piece {
                    rel,
                    len: piece_len,
                    content,
                });
            }
            if let Some(dst) = regions.last() {
                for p in pieces.iter() {
                    let r = Region::new(dst.buffer, dst.offset + p.rel, p.len);
                    set_runs(&mut runs, &r, p.content);
                }
            }
        }
        let mut start = Vec::with_capacity(plan.ops.len() + 1);
        let mut pieces = Vec::new();
        for p in per_op {
            start.push(pieces.len() as u32);
            pieces.extend(p);
        }
        start.push(pieces.len() as u32);
        Ok(CountPieces {
            layout,
            start,
            pieces,
        })
    }

    /// The layout the plan was made for.
    pub fn layout(&self) -> &CountLayout {
        &self.layout
    }

    fn of(&self, op: u32) -> &[Piece] {
        let (a, b) = (
            self.start.get(op as usize).copied().unwrap_or(0) as usize,
            self.start.get(op as usize + 1).copied().unwrap_or(0) as usize,
        );
        self.pieces.get(a..b).unwrap_or(&[])
    }

    /// Where element `rel` of piece-relative region `r` lands in this call: the packed offset
    /// in a user buffer, the capacity offset in scratch.
    fn place(&self, counts: &CallCounts, r: &Region, rel: u64) -> u64 {
        let at = r.offset + rel;
        match self.layout.position(r.buffer, at) {
            None => at,
            Some(((key, j), _)) => {
                let side = match r.buffer {
                    BufferRef::Input(_) => &counts.input_at,
                    _ => &counts.output_at,
                };
                side.get(key as usize).copied().unwrap_or(0) + j
            }
        }
    }

    /// The live pieces of copy op `op` (`src` to `dst`) in this call: (source offset,
    /// destination offset, elements), in the plan's elements.
    pub fn copy_pieces<'a>(
        &'a self,
        op: u32,
        src: &'a Region,
        dst: &'a Region,
        counts: &'a CallCounts,
    ) -> impl Iterator<Item = (u64, u64, u64)> + 'a {
        self.of(op).iter().filter_map(move |p| {
            let live = counts.live(p);
            (live > 0).then(|| {
                (
                    self.place(counts, src, p.rel),
                    self.place(counts, dst, p.rel),
                    live,
                )
            })
        })
    }

    /// The live pieces of reduction op `op` (`srcs` into `dst`) in this call: per piece its
    /// elements in `lens`, and the offsets of its sources then its destination in `offsets`
    /// (`srcs.len() + 1` entries per piece).
    pub fn reduce_pieces(
        &self,
        op: u32,
        (srcs, dst): (&[Region], &Region),
        counts: &CallCounts,
        lens: &mut Vec<u64>,
        offsets: &mut Vec<u64>,
    ) {
        lens.clear();
        offsets.clear();
        for p in self.of(op) {
            let live = counts.live(p);
            if live == 0 {
                continue;
            }
            lens.push(live);
            offsets.extend(
                srcs.iter()
                    .chain([dst])
                    .map(|r| self.place(counts, r, p.rel)),
            );
        }
    }

    /// `program` (a segment of `plan`, the capacity plan, whose commands ran `command_ops`)
    /// rewritten for the call's `counts` into `out`: each copy and reduction becomes its live
    /// pieces, events stay as they were. `out`'s memory is reused.
    ///
    /// Errors: a command whose op is not of its kind in `plan` (a program of another plan).
    pub fn bind_program(
        &self,
        plan: &Plan,
        program: &Program,
        command_ops: &[u32],
        counts: &CallCounts,
        out: &mut Program,
    ) -> Result<()> {
        let e = plan.dtype.size();
        out.lanes.clone_from(&program.lanes);
        out.events = program.events;
        out.dtype = program.dtype;
        out.op = program.op;
        out.divisor = program.divisor;
        out.bindings = program.bindings;
        out.commands.clear();
        out.srcs.clear();
        let (mut lens, mut offsets) = (Vec::new(), Vec::new());
        let other = |op: u32| invalid(Some(op as usize), "a program of another plan");
        for (c, &op) in program.commands.iter().zip(command_ops) {
            let kind = (op != NO_OP).then(|| plan.ops.get(op as usize)).flatten();
            match (c, kind.map(|o| &o.kind)) {
                (Command::Copy { lane, src, dst }, Some(OpKind::Copy { src: rs, dst: rd })) => {
                    for (so, dof, len) in self.copy_pieces(op, rs, rd, counts) {
                        out.commands.push(Command::Copy {
                            lane: *lane,
                            src: Slot {
                                binding: src.binding,
                                offset: so * e,
                                bytes: len * e,
                            },
                            dst: Slot {
                                binding: dst.binding,
                                offset: dof * e,
                                bytes: len * e,
                            },
                        });
                    }
                }
                (
                    Command::Reduce {
                        lane,
                        first,
                        count,
                        dst,
                        divide,
                    },
                    Some(OpKind::Reduce { srcs, dst: rd, .. }),
                ) => {
                    let from = program
                        .srcs
                        .get(*first as usize..(*first + *count) as usize)
                        .filter(|f| f.len() == srcs.len())
                        .ok_or_else(|| other(op))?;
                    self.reduce_pieces(op, (srcs, rd), counts, &mut lens, &mut offsets);
                    let k = srcs.len() + 1;
                    for (p, len) in lens.iter().enumerate() {
                        let at = &offsets[p * k..(p + 1) * k];
                        let new_first = out.srcs.len() as u32;
                        out.srcs.extend(from.iter().zip(at).map(|(s, o)| Slot {
                            binding: s.binding,
                            offset: o * e,
                            bytes: len * e,
                        }));
                        out.commands.push(Command::Reduce {
                            lane: *lane,
                            first: new_first,
                            count: *count,
                            dst: Slot {
                                binding: dst.binding,
                                offset: at[k - 1] * e,
                                bytes: len * e,
                            },
                            divide: *divide,
                        });
                    }
                }
                (Command::Record { .. } | Command::Wait { .. }, None) => {
                    out.commands.push(c.clone())
                }
                _ => return Err(other(op)),
            }
        }
        Ok(())
    }

    /// A rank's part of the capacity plan `plan` rewritten for the call's `counts` into `out`:
    /// its segments as [`CountPieces::bind_program`], each message as the live pieces of its
    /// copy (both ends of a message cut it alike, so they still pair in order). `out`'s
    /// memory is reused; its binding sizes are `program`'s (the caller sets the user
    /// buffers').
    ///
    /// Errors: as [`CountPieces::bind_program`].
    pub fn bind_rank_program(
        &self,
        plan: &Plan,
        program: &RankProgram,
        counts: &CallCounts,
        out: &mut RankProgram,
    ) -> Result<()> {
        let e = plan.dtype.size();
        let bind_segment = |from: &Segment, to: &mut Segment| -> Result<()> {
            self.bind_program(
                plan,
                &from.program,
                &from.command_ops,
                counts,
                &mut to.program,
            )?;
            to.ops.clone_from(&from.ops);
            // Bound commands do not map one to one onto plan ops: nothing rebinds them.
            to.command_ops.clear();
            Ok(())
        };
        let bind_messages = |from: &[Message], to: &mut Vec<Message>, send: bool| -> Result<()> {
            to.clear();
            for m in from {
                let Some(OpKind::Copy { src, dst }) = plan.ops.get(m.op as usize).map(|o| &o.kind)
                else {
                    return Err(invalid(Some(m.op as usize), "a message of another plan"));
                };
                for (so, dof, len) in self.copy_pieces(m.op, src, dst, counts) {
                    to.push(Message {
                        slot: Slot {
                            binding: m.slot.binding,
                            offset: if send { so } else { dof } * e,
                            bytes: len * e,
                        },
                        ..*m
                    });
                }
            }
            Ok(())
        };
        out.stages.truncate(program.stages.len());
        for (k, st) in program.stages.iter().enumerate() {
            if out.stages.len() <= k {
                out.stages.push(st.clone());
            }
            let o = &mut out.stages[k];
            o.level = st.level;
            bind_segment(&st.before, &mut o.before)?;
            bind_segment(&st.during, &mut o.during)?;
            bind_messages(&st.recvs, &mut o.recvs, false)?;
            bind_messages(&st.sends, &mut o.sends, true)?;
        }
        bind_segment(&program.tail, &mut out.tail)?;
        out.binding_bytes.clone_from(&program.binding_bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
