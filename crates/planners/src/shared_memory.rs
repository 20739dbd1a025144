//! The shared-memory planner: for ranks that are arenas of one memory, of a host (the
//! `host-N` preset) or of one GPU (`shared-gpu-N`), where every copy moves through the same
//! memory, not over separate links. The flow simulator models links, so it cannot rank
//! algorithms for this case; `relaycc_route::plan()` uses this planner directly when the topology
//! says the ranks share one memory (`Topology::shares_memory`).
//!
//! Algorithms (one lane per rank, on the rank's device; every copy is one hop whose edges are
//! found by a breadth-first search over usable links through non-GPU nodes, so plans also pass
//! [`relaycc_plan::check_routes`]; relay GPUs are not used):
//!
//! - **reductions** (all_reduce, reduce, reduce_scatter): the elements are split in slices,
//!   each owned by one rank (for reduce_scatter, block `o` by rank `o`). An all_reduce or a
//!   reduce has one slice per rank where each slice holds at least [`MIN_SLICE_BYTES`], and
//!   fewer, spread over the ranks from the root on, where the message is smaller: every
//!   slice costs `2n - 1` ops however small it is, so a 1 KiB all_reduce on 1,024 ranks is
//!   one slice of 2,047 ops, not 256 slices of one element each. The owner works through its
//!   slice in chunks of [`REDUCE_CHUNK_BYTES`]: it copies the chunk of every other rank's input
//!   into its scratch, reduces them with its own input into the destination (its output, or
//!   scratch for a reduce whose root is elsewhere), then copies the result to every rank that
//!   needs it. This is reduce-scatter plus all-gather with direct copies; on one host the
//!   chunks stay in cache between the copy-in, the reduction and the copies out, so main
//!   memory sees about what `n` plain copies would move.
//!
//!   Ranks on one GPU (arenas of one device memory, [`Topology::shared_device`]) take the
//!   same slices without the copy-in: a GPU kernel reads every rank's input where it lies, and
//!   chunks would only multiply launches. An all_reduce or a reduce is one slice (one
//!   reduction of every input into its destination, then the copies of the result, which the
//!   CUDA executor fuses into that kernel's further destinations: each input read once, each
//!   output written once); a reduce_scatter is one reduction per rank.
//! - **data movement** (broadcast, all_gather(_v), all_to_all(_v), scatter, send_recv): each
//!   receiving rank's lane pulls its pieces directly; gather pushes from each sender's lane.
//!   On one GPU, broadcast and all_gather push from the sender's lane instead: the copies of
//!   one source then follow each other on one lane, and the CUDA executor makes them one
//!   kernel that reads the source once.
//!   In-place calls skip the copies whose source already sits where the output wants it.
//! - **one rank**: a reduction's result is the rank's input, so it is one copy of the input
//!   into the output, and nothing in place.
//!
//! Every op of a rank runs on that rank's lane, and no two lanes touch the same element while
//! one writes it, so the plans need no cross-lane dependencies: the ops are written through
//! the plan writer (`plan_writer.rs`), whose derived dependencies then order ops of one lane
//! only (a test holds every planner here to it).

use std::collections::{HashMap, VecDeque};

use relaycc_plan::{BufferRef, Collective, Location, Plan, Region, Request, Result, RouteError};
use relaycc_topo::{NodeId, Topology};

use crate::plan_writer::PlanWriter;

/// Bytes per chunk of a reduction: small enough that a chunk of every rank (8 x 64 KiB)
/// stays in a core's L2 cache between the copy-in and the reduction, large enough that the
/// per-op cost is noise. Chosen with `relaycc bench all_reduce --backend host`; a CPU with
/// other cache sizes may prefer another.
pub const REDUCE_CHUNK_BYTES: u64 = 64 * 1024;

/// Smallest slice of an all_reduce or a reduce that gets an owner of its own: a page, so an
/// op moves at least a page per copy (its issue cost on the host is well under a page's
/// copy time) while messages of a few pages per rank still spread over every rank's lane.
pub const MIN_SLICE_BYTES: u64 = 4096;

/// How many slices (owners) an all_reduce or reduce of `count` elements of `esize` bytes on
/// `n` ranks gets: one per rank, or fewer so that each holds [`MIN_SLICE_BYTES`]; at least 1.
/// Ranks on one GPU (`on_one_gpu`) get one: a kernel spreads any slice over every SM.
fn owners(count: u64, esize: u64, n: u32, on_one_gpu: bool) -> u32 {
    if on_one_gpu {
        return 1;
    }
    let by_size = count.saturating_mul(esize) / MIN_SLICE_BYTES;
    by_size.clamp(1, u64::from(n)) as u32
}

/// The rank that owns slice `k` of `m`: spread evenly over the `n` ranks, slice 0 on `root`
/// (the reduce's root then reduces its first slice straight into its output).
fn owner(k: u32, m: u32, n: u32, root: u32) -> u32 {
    let at = u64::from(k) * u64::from(n) / u64::from(m.max(1));
    ((at + u64::from(root)) % u64::from(n)) as u32
}

/// Plan `request` on `topo` (see the module docs); `in_place` selects the in-place layout.
pub fn plan(topo: &Topology, request: &Request, in_place: bool) -> Result<Plan> {
    request.validate()?;
    let mut b = SharedMemoryPlanBuilder::new(topo, request, in_place)?;
    let n = request.nranks() as u32;
    let c = request.count;
    let (inp, out) = (BufferRef::Input, BufferRef::Output);
    let direct = b.direct_reads;
    if request.collective.reduces() && n == 1 {
        // One rank's result is its input, bit for bit under every op and type (a half type
        // widened and rounded back, divided by one): one copy, or nothing in place.
        let len = match request.collective {
            Collective::ReduceScatterV => request.counts.first().copied().unwrap_or(0),
            _ => c,
        };
        if !in_place && len > 0 {
            b.copy(0, Region::new(inp(0), 0, len), Region::new(out(0), 0, len))?;
        }
        return Ok(b.w.plan);
    }
    match request.collective {
        Collective::AllReduce => {
            let m = owners(c, request.dtype.size(), n, direct);
            for k in 0..m {
                let o = owner(k, m, n, 0);
                let (lo, hi) = slice(c, m, k);
                b.reduce_slice(o, hi - lo, |_| lo, Dest::Own(lo), (0..n).collect())?;
            }
        }
        Collective::Reduce => {
            let root = request.root;
            let m = owners(c, request.dtype.size(), n, direct);
            for k in 0..m {
                let o = owner(k, m, n, root);
                let (lo, hi) = slice(c, m, k);
                let dest = if o == root {
                    Dest::Own(lo)
                } else {
                    Dest::Root(root, lo)
                };
                b.reduce_slice(o, hi - lo, |_| lo, dest, Vec::new())?;
            }
        }
        Collective::ReduceScatter => {
            for o in 0..n {
                let base = u64::from(o) * c;
                b.reduce_slice(o, c, |_| base, Dest::Own(0), Vec::new())?;
            }
        }
        Collective::ReduceScatterV => {
            let mut base = 0;
            for (o, &len) in (0..n).zip(&request.counts) {
                b.reduce_slice(o, len, |_| base, Dest::Own(0), Vec::new())?;
                base += len;
            }
        }
        Collective::Broadcast => {
            for r in 0..n {
                if !(in_place && r == request.root) {
                    b.copy(
                        if direct { request.root } else { r },
                        Region::new(inp(request.root), 0, c),
                        Region::new(out(r), 0, c),
                    )?;
                }
            }
        }
        Collective::AllGather | Collective::AllGatherV => {
            let counts: Vec<u64> = if request.collective == Collective::AllGather {
                vec![c; n as usize]
            } else {
                request.counts.clone()
            };
            for r in 0..n {
                let mut displ = 0;
                for (k, &len) in counts.iter().enumerate() {
                    let k = k as u32;
                    if !(in_place && k == r) {
                        b.copy(
                            if direct { k } else { r },
                            Region::new(inp(k), 0, len),
                            Region::new(out(r), displ, len),
                        )?;
                    }
                    displ += len;
                }
            }
        }
        Collective::AllToAll | Collective::AllToAllV => {
            let m = |s: u32, d: u32| -> u64 {
                if request.collective == Collective::AllToAll {
                    c
                } else {
                    request.matrix[s as usize][d as usize]
                }
            };
            for d in 0..n {
                let mut roff = 0;
                for s in 0..n {
                    let soff: u64 = (0..d).map(|k| m(s, k)).sum();
                    let len = m(s, d);
                    b.copy(
                        d,
                        Region::new(inp(s), soff, len),
                        Region::new(out(d), roff, len),
                    )?;
                    roff += len;
                }
            }
        }
        Collective::Gather => {
            for k in 0..n {
                if !(in_place && k == request.root) {
                    let dst = Region::new(out(request.root), u64::from(k) * c, c);
                    b.copy(k, Region::new(inp(k), 0, c), dst)?;
                }
            }
        }
        Collective::Scatter => {
            for r in 0..n {
                if !(in_place && r == request.root) {
                    let src = Region::new(inp(request.root), u64::from(r) * c, c);
                    b.copy(r, src, Region::new(out(r), 0, c))?;
                }
            }
        }
        Collective::SendRecv => {
            let mut send_off = vec![0u64; n as usize];
            let mut recv_off = vec![0u64; n as usize];
            for t in &request.transfers {
                let (s, d) = (t.src as usize, t.dst as usize);
                let src = Region::new(inp(t.src), send_off[s], t.count);
                b.copy(t.dst, src, Region::new(out(t.dst), recv_off[d], t.count))?;
                send_off[s] += t.count;
                recv_off[d] += t.count;
            }
        }
    }
    Ok(b.w.plan)
}

/// Slice `o` of `n` of `count` elements: `[o*count/n, (o+1)*count/n)`.
fn slice(count: u64, n: u32, o: u32) -> (u64, u64) {
    let at = |k: u32| (u128::from(count) * u128::from(k) / u128::from(n)) as u64;
    (at(o), at(o + 1))
}

/// Where a reduced slice goes.
#[derive(Clone, Copy)]
enum Dest {
    /// The owner's output, from this element on.
    Own(u64),
    /// The root's output, from this element on (reduced into the owner's scratch first).
    Root(u32, u64),
}

/// A plan of ranks in one memory under construction: the topology, the plan's writer, the
/// route cached per pair of ranks, and whether reductions read every rank's input where it
/// lies (ranks on one GPU) instead of copying chunks into the owner's scratch first (one host).
struct SharedMemoryPlanBuilder<'a> {
    topo: &'a Topology,
    w: PlanWriter<'static>,
    routes: HashMap<(u32, u32), Vec<u32>>,
    direct_reads: bool,
}

impl<'a> SharedMemoryPlanBuilder<'a> {
    fn new(topo: &'a Topology, request: &Request, in_place: bool) -> Result<Self> {
        let name = match (request.gpus.len() == 1, in_place) {
            (true, false) => "one rank",
            (true, true) => "one rank (in place)",
            (false, false) => "fallback direct",
            (false, true) => "fallback direct (in place)",
        };
        let mut plan = Plan::new(request.clone(), name);
        for (r, g) in request.gpus.iter().enumerate() {
            topo.gpu(*g)?;
            plan.add_lane(Location::Gpu(*g), format!("rank{r} GPU{g}"));
        }
        let direct_reads = topo.shared_device(&request.gpus).is_some();
        plan.one_device_memory = direct_reads;
        Ok(SharedMemoryPlanBuilder {
            topo,
            // An in-place plan is tracked in the in-place layout, an out-of-place plan (whose
            // copies would clash in place) with inputs and outputs apart.
            w: if in_place {
                PlanWriter::new(plan, None)
            } else {
                PlanWriter::out_of_place(plan, None)
            },
            routes: HashMap::new(),
            direct_reads,
        })
    }

    fn gpu_of(&self, b: BufferRef) -> Result<u32> {
        match self.w.plan.location(b) {
            Some(Location::Gpu(g)) => Ok(g),
            _ => Err(RouteError::BadRequest(format!("{b:?} has no GPU"))),
        }
    }

    /// The edges of a shortest usable path from GPU `a` to GPU `b` through non-GPU nodes.
    fn route(&mut self, a: u32, b: u32) -> Result<Vec<u32>> {
        if a == b {
            return Ok(Vec::new());
        }
        if let Some(r) = self.routes.get(&(a, b)) {
            return Ok(r.clone());
        }
        let (from, to) = (self.topo.gpu(a)?, self.topo.gpu(b)?);
        let mut prev: HashMap<NodeId, (NodeId, u32)> = HashMap::new();
        let mut queue = VecDeque::from([from]);
        while let Some(at) = queue.pop_front() {
            if at == to {
                break;
            }
            if at != from && self.topo.node(at).gpu().is_some() {
                continue;
            }
            for (link, next, _) in self.topo.links_from(at) {
                if next != from && !prev.contains_key(&next) && self.topo.link_usable(link) {
                    prev.insert(next, (at, link.index() as u32));
                    queue.push_back(next);
                }
            }
        }
        let mut edges = Vec::new();
        let mut at = to;
        while at != from {
            let Some(&(p, e)) = prev.get(&at) else {
                return Err(RouteError::NoRoute {
                    what: format!("GPU{a} -> GPU{b}"),
                    why: "no usable path through switches and sockets".into(),
                });
            };
            edges.push(e);
            at = p;
        }
        edges.reverse();
        self.routes.insert((a, b), edges.clone());
        Ok(edges)
    }

    /// A copy on `rank`'s lane.
    fn copy(&mut self, rank: u32, src: Region, dst: Region) -> Result<()> {
        if src.len == 0 {
            return Ok(());
        }
        let edges = self.route(self.gpu_of(src.buffer)?, self.gpu_of(dst.buffer)?)?;
        self.w.copy(rank, src, dst, edges, &[])?;
        Ok(())
    }

    /// Reduce elements `[src_at(q), +len)` of every rank `q`'s input on owner `o`'s lane, in
    /// chunks, into `dest`, then copy each reduced chunk to the outputs of `targets` (same
    /// position as the owner's output). With `direct_reads` the whole slice is one chunk,
    /// reduced from the inputs themselves straight into `dest`.
    fn reduce_slice(
        &mut self,
        o: u32,
        len: u64,
        src_at: impl Fn(u32) -> u64,
        dest: Dest,
        targets: Vec<u32>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let n = self.w.plan.request.nranks() as u32;
        let direct = self.direct_reads;
        let chunk = if direct {
            len
        } else {
            (REDUCE_CHUNK_BYTES / self.w.plan.dtype.size())
                .max(1)
                .min(len)
        };
        let acc_slot = u64::from(n - 1);
        let slots = match dest {
            _ if direct => 0,
            Dest::Root(..) => n,
            Dest::Own(_) => n - 1,
        };
        let g = self.w.plan.request.gpus[o as usize];
        let scratch = if slots > 0 {
            Some(
                self.w
                    .plan
                    .add_scratch(Location::Gpu(g), u64::from(slots) * chunk),
            )
        } else {
            None
        };
        let mut k = 0;
        while k < len {
            let l = chunk.min(len - k);
            let mut srcs = vec![Region::new(BufferRef::Input(o), src_at(o) + k, l)];
            let mut slot = 0u64;
            for q in (0..n).filter(|q| *q != o) {
                if direct {
                    srcs.push(Region::new(BufferRef::Input(q), src_at(q) + k, l));
                } else if let Some(s) = scratch {
                    let dst = Region::new(s, slot * chunk, l);
                    self.copy(o, Region::new(BufferRef::Input(q), src_at(q) + k, l), dst)?;
                    srcs.push(dst);
                    slot += 1;
                }
            }
            let (dst, out_at) = match (dest, scratch) {
                (Dest::Own(at), _) => (Region::new(BufferRef::Output(o), at + k, l), at + k),
                (Dest::Root(root, at), _) if direct => {
                    (Region::new(BufferRef::Output(root), at + k, l), at + k)
                }
                (Dest::Root(_, at), Some(s)) => (Region::new(s, acc_slot * chunk, l), at + k),
                (Dest::Root(..), None) => {
                    return Err(RouteError::BadRequest("reduce without scratch".into()));
                }
            };
            self.w.reduce(o, srcs, dst, true, &[])?;
            if let (Dest::Root(root, _), false) = (dest, direct) {
                self.copy(o, dst, Region::new(BufferRef::Output(root), out_at, l))?;
            }
            for &t in targets.iter().filter(|t| **t != o) {
                self.copy(o, dst, Region::new(BufferRef::Output(t), out_at, l))?;
            }
            k += l;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::{CheckOptions, DType, ReduceOp};

    #[test]
    fn plans_pass_the_checker_on_presets() {
        for preset in [
            "host-4",
            "shared-gpu-4",
            "dgx1-v100",
            "pcie-4gpu",
            "ac922",
            "dgx-a100",
        ] {
            let topo = relaycc_topo::preset(preset).unwrap();
            let gpus: Vec<u32> = (0..topo.gpu_count().min(4)).rev().collect();
            for coll in Collective::ALL {
                let mut r = Request::new(coll, gpus.clone(), 70_001, DType::F32)
                    .with_op(ReduceOp::Avg)
                    .with_root(1);
                r.counts = vec![3, 0, 70_000, 5];
                r.matrix = vec![vec![1, 2, 3, 4]; 4];
                r.transfers = vec![
                    relaycc_plan::Transfer {
                        src: 0,
                        dst: 3,
                        count: 9,
                    },
                    relaycc_plan::Transfer {
                        src: 2,
                        dst: 2,
                        count: 4,
                    },
                ];
                for in_place in [false, true] {
                    let p = plan(&topo, &r, in_place).unwrap();
                    relaycc_plan::check_with(&p, CheckOptions { in_place })
                        .unwrap_or_else(|e| panic!("{preset} {coll} {in_place}: {e}"));
                    relaycc_plan::check_routes(&p, &topo).unwrap();
                    // Ranks in one memory run their lanes with nothing ordered across them.
                    for (i, op) in p.ops.iter().enumerate() {
                        for &d in &op.deps {
                            assert_eq!(
                                p.ops[d as usize].lane, op.lane,
                                "{preset} {coll} {in_place}: op {i} waits on another lane"
                            );
                        }
                    }
                }
            }
        }
    }

    /// One rank's reductions, in host memory and in a GPU's: one copy of the whole input
    /// into the output (no chunks, no scratch), and nothing in place; the checker proves
    /// both.
    #[test]
    fn one_rank_reductions_are_one_copy_or_nothing() {
        for preset in ["host-1", "shared-gpu-1", "host-4"] {
            let topo = relaycc_topo::preset(preset).unwrap();
            for coll in Collective::ALL.into_iter().filter(|c| c.reduces()) {
                let mut r = Request::new(coll, vec![0], 1 << 20, DType::F16).with_op(ReduceOp::Avg);
                r.counts = vec![1 << 20];
                for in_place in [false, true] {
                    let p = plan(&topo, &r, in_place).unwrap();
                    relaycc_plan::check_with(&p, CheckOptions { in_place })
                        .unwrap_or_else(|e| panic!("{preset} {coll} {in_place}: {e}"));
                    let what = format!("{preset} {coll} in place {in_place}");
                    assert!(p.scratch.is_empty(), "{what}");
                    if in_place {
                        assert!(p.ops.is_empty(), "{what}");
                        continue;
                    }
                    assert_eq!(p.ops.len(), 1, "{what}");
                    let relaycc_plan::OpKind::Copy { src, dst } = &p.ops[0].kind else {
                        panic!("{what}: {:?}", p.ops[0].kind);
                    };
                    assert_eq!((src.len, dst.len), (1 << 20, 1 << 20), "{what}");
                }
            }
        }
    }

    /// Elements a plan moves through memory when a copy of a reduction's result that follows
    /// it on its lane is one more destination of that reduction (as the CUDA executor fuses
    /// them): a reduction reads its sources and writes its destination, a fused copy only
    /// writes, any other copy reads and writes.
    fn fused_traffic(p: &Plan) -> u64 {
        let mut last_result: HashMap<u32, Region> = HashMap::new();
        let mut moved = 0;
        for op in &p.ops {
            match &op.kind {
                relaycc_plan::OpKind::Reduce { srcs, dst, .. } => {
                    moved += srcs.iter().map(|s| s.len).sum::<u64>() + dst.len;
                    last_result.insert(op.lane, *dst);
                }
                relaycc_plan::OpKind::Copy { src, dst } => {
                    let fused = last_result.get(&op.lane) == Some(src);
                    moved += if fused { dst.len } else { src.len + dst.len };
                    if !fused {
                        last_result.remove(&op.lane);
                    }
                }
            }
        }
        moved
    }

    /// Ranks on one GPU: a reduction reads every rank's input where it lies. An all_reduce is
    /// one reduction and the copies of its result, so memory sees each input read once and
    /// each output written once (`2 n c`, the least an all_reduce can move); a reduce_scatter
    /// reads every input once and writes every output once (`n * n c + n c`); a reduce to a
    /// root reads every input and writes the root's output. No staging.
    #[test]
    fn ranks_on_one_gpu_move_the_least_an_algorithm_can() {
        let topo = relaycc_topo::preset("shared-gpu-4").unwrap();
        let (n, c) = (4u64, 1u64 << 20);
        for in_place in [false, true] {
            for (coll, least) in [
                (Collective::AllReduce, 2 * n * c),
                (Collective::ReduceScatter, n * n * c + n * c),
                (Collective::Reduce, n * c + c),
            ] {
                let r = Request::new(coll, vec![2, 0, 3, 1], c, DType::F32).with_root(2);
                let p = plan(&topo, &r, in_place).unwrap();
                relaycc_plan::check_with(&p, CheckOptions { in_place }).unwrap();
                assert!(p.one_device_memory && p.scratch.is_empty(), "{coll}");
                assert_eq!(fused_traffic(&p), least, "{coll} in place {in_place}");
            }
        }
        // One host's memory keeps its cache-sized copy-in: not a plan of one device.
        let host = relaycc_topo::preset("host-4").unwrap();
        let r = Request::new(Collective::AllReduce, vec![0, 1, 2, 3], c, DType::F32);
        let p = plan(&host, &r, false).unwrap();
        assert!(!p.one_device_memory && !p.scratch.is_empty());
        // A reduction reading another GPU's memory is refused unless the plan is of one device.
        let mut other = plan(&topo, &r, false).unwrap();
        other.one_device_memory = false;
        assert!(relaycc_plan::check(&other).is_err());
    }

    /// All_reduce and reduce get one owner per `MIN_SLICE_BYTES`, at most one per rank: a
    /// small message on many ranks is a few slices of `2n - 1` ops each (no op count that
    /// grows with n^2), and every split passes the checker, on the root or spread from it.
    #[test]
    fn small_reductions_take_few_owners_and_stay_correct() {
        let topo = relaycc_topo::preset("host-8").unwrap();
        for (count, owners_want) in [(1u64, 1u32), (1024, 1), (3 * 1024, 3), (70_001, 8)] {
            assert_eq!(owners(count, 4, 8, false), owners_want, "{count}");
            for (coll, root) in [(Collective::AllReduce, 0), (Collective::Reduce, 5)] {
                let r = Request::new(coll, (0..8).collect(), count, DType::F32).with_root(root);
                for in_place in [false, true] {
                    let p = plan(&topo, &r, in_place).unwrap();
                    relaycc_plan::check_with(&p, CheckOptions { in_place })
                        .unwrap_or_else(|e| panic!("{coll} {count} {in_place}: {e}"));
                    let reductions = p
                        .ops
                        .iter()
                        .filter(|o| matches!(o.kind, relaycc_plan::OpKind::Reduce { .. }))
                        .count();
                    let chunks = count.div_ceil(REDUCE_CHUNK_BYTES / 4) as usize;
                    assert!(
                        reductions <= owners_want as usize + chunks,
                        "{coll} {count}"
                    );
                }
            }
        }
        // 1 KiB on 1,024 ranks: one slice, n - 1 copies in, one reduction, n - 1 copies out.
        let topo = relaycc_topo::preset("host-1024").unwrap();
        let r = Request::new(Collective::AllReduce, (0..1024).collect(), 256, DType::F32);
        let p = plan(&topo, &r, false).unwrap();
        assert_eq!(p.ops.len(), 2 * 1024 - 1);
        relaycc_plan::check(&p).unwrap();
    }
}
