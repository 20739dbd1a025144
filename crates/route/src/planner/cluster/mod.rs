//! Hierarchical plans for clusters of like machines: an intra-node phase over NVLink, an
//! inter-node phase per rail (the GPU at local position j of every node, each behind its own
//! NIC), and a second intra-node phase. Every phase is a pipelined ring, so each byte crosses
//! the network once per rail instead of once per GPU, and the planner touches only ring
//! neighbours: g + N connections per rail instead of the n^2 a flat ring search reads.
//!
//! | collective | intra-node | inter-node, rail j | intra-node |
//! |---|---|---|---|
//! | all_reduce | reduce-scatter into g node partials | all_reduce of block j | all_gather |
//! | reduce_scatter | reduce-scatter, per destination node | reduce-scatter of block j | |
//! | all_gather | | all_gather of rank j's blocks | all_gather, per source node |
//!
//! From [`HALVING_MIN_NODES`] nodes the all_reduce's rail phase runs by distance halving
//! (`halving.rs`): log2 N dependent steps instead of 2 (N-1). all_to_all gets the node-aware
//! 2-step plan of [`all_to_all()`].
//!
//! Op counts: all_reduce is O(n (g + N)) copies; reduce_scatter and all_gather move n blocks
//! into (or out of) every rank, O(n^2 / g + n g) copies.
//!
//! Every rail hop is pinned to a rail-aligned connection: out through the sender's home NIC,
//! in through the receiver's NIC of the same rail (the baseline's `NetLinks`), so each of a
//! node's NICs carries one rail in both directions. The all_reduce runs each rail's ring as two
//! channels in opposite directions (one channel's start costs overlap the other's transfers)
//! and cuts the vector into loops whose phases overlap: two node-partial slots per rank let
//! loop k+1's intra-node reduce-scatter (NVLink) run while loop k's rail ring (NICs) reads the
//! partials of loop k and loop k-1's all_gather finishes. The loop count is a candidate
//! parameter ([`PIPELINE_LOOPS`]): fewer loops pay a longer fill and drain, more pay more
//! per-step start costs on the rails.

use relaycc_topo::Topology;

use crate::error::Result;
use crate::plan::{BufferRef, Plan, Region};
use crate::request::{Collective, Request};

use super::baseline_net::links::NetLinks;
use super::builder::PlanBuilder;
use super::ring::{self, BlockRegionFn, RsStaging};
use super::{CHUNKS_PER_BLOCK, Ctx, direct, links_and_chunk, split_even};

mod all_to_all;
mod halving;
mod shape;

pub use all_to_all::all_to_all;
pub use shape::ClusterShape;

/// Node-partial slots per rank of a ring-railed all_reduce: two let the intra-node
/// reduce-scatter of one loop run while the rail ring of the loop before reads its partials.
const PART_SLOTS: u64 = 2;

/// Lane channels of the phases: intra-node first phase, inter-node, intra-node last phase,
/// and the local copies of all_gather.
const CH_INTRA: u32 = 0;
const CH_RAIL: u32 = 1;
const CH_BACK: u32 = 2;
const CH_LOCAL: u32 = 3;

/// Pin every rail ring's hops on channel `ch` to rail-aligned connections: out through the
/// sender's home NIC (its nearest in the PCIe tree, by PXN over NVLink where that path
/// crosses a CPU), in through the receiver's NIC of the same rail. The connection cache's
/// widest single routes tie between a node's NICs and may put two rails on one NIC, halving
/// both; rail-aligned hops give each rail its own NIC in both directions.
fn pin_rails(
    b: &mut PlanBuilder,
    topo: &Topology,
    req: &Request,
    shape: &ClusterShape,
    ctx: &Ctx,
    ch: u32,
    c: u32,
) -> Result<()> {
    let links = NetLinks::new(topo, &req.gpus, ctx.cache, ctx.limit)?;
    let nn = shape.nodes();
    for j in 0..shape.per_node() {
        let ord = rail_order(shape, j, c);
        for p in 0..nn {
            let (a, d) = (ord[p], ord[(p + 1) % nn]);
            if a == d {
                continue;
            }
            let Some(rail) = links.rail[a as usize] else {
                continue;
            };
            let conn = links.across(a, d, rail, j + p)?;
            b.pin(ch, req.gpus[a as usize], req.gpus[d as usize], conn);
        }
    }
    Ok(())
}

/// Rail `j`'s ring order on rail channel `c`: odd channels run backwards, so each NIC sends
/// to both neighbours and one channel's start costs overlap the other's transfers.
fn rail_order(shape: &ClusterShape, j: usize, c: u32) -> Vec<u32> {
    let mut o = shape.rail(j);
    if c % 2 == 1 {
        o[1..].reverse();
    }
    o
}

/// Lane channels of an all_reduce's rail rings, one per rail channel.
const CH_RAILS: [u32; 2] = [CH_RAIL, 4];

/// Ring reduce-scatter over the ranks `ord` ([`ring::reduce_scatter_steps`] with partials in
/// `st`): position q ends with block q in `fin`, finalized when `finalize` (the last reduction
/// of every element), pipelined in `chunk`s.
#[allow(clippy::too_many_arguments)]
fn reduce_scatter_ring(
    b: &mut PlanBuilder,
    ord: &[u32],
    ch: u32,
    lens: &[u64],
    chunk: u64,
    st: &RsStaging,
    input: BlockRegionFn,
    fin: BlockRegionFn,
    finalize: bool,
) -> Result<()> {
    b.set_chunk_elems(chunk);
    ring::reduce_scatter_steps(b, ord, ch, lens, chunk, st, input, None, fin, finalize)
}

/// Reduce-scatter staging of every node's ring (blocks of at most `intra_most`; none on
/// one-GPU nodes) and of every rail's ring (at most `rail_most`), allocated once and reused by
/// every loop of the plan (the builder orders each reuse after the reads of the loop before).
type Staging = (Vec<RsStaging>, Vec<(Vec<u32>, RsStaging)>);

fn ring_staging(
    b: &mut PlanBuilder,
    shape: &ClusterShape,
    intra_most: u64,
    rail_most: u64,
) -> Staging {
    let scratch =
        |b: &mut PlanBuilder, ord: &[u32], most| RsStaging::new(b, ord, most, ord.len() > 2);
    let intra = if shape.per_node() > 1 {
        shape
            .hosts
            .iter()
            .map(|ord| scratch(b, ord, intra_most))
            .collect()
    } else {
        Vec::new()
    };
    let rails = (0..shape.per_node())
        .map(|j| {
            let ord = shape.rail(j);
            let st = scratch(b, &ord, rail_most);
            (ord, st)
        })
        .collect();
    (intra, rails)
}

/// Ring all_gather over the ranks `ord`: position q starts with block q in `out` (or sends it
/// from `first`); at step t position p forwards block p-t to p+1.
fn all_gather_ring(
    b: &mut PlanBuilder,
    ord: &[u32],
    ch: u32,
    lens: &[u64],
    chunk: u64,
    first: Option<BlockRegionFn>,
    out: BlockRegionFn,
) -> Result<()> {
    b.set_chunk_elems(chunk);
    ring::all_gather_pass(b, ord, ch, lens, chunk, first, out)
}

/// How a piece of a rail-hierarchical plan is cut: its per-GPU blocks, half the largest block,
/// the intra-node phases' chunk and the rail phase's chunk.
struct PieceChunks {
    blocks: Vec<(u64, u64)>,
    half_most: u64,
    chunk: u64,
    rail_chunk: u64,
}

/// Cut `piece` elements over `g` GPUs per node and `nn` nodes (shared by the halving and
/// the ring all_reduce, whose phases must cut alike for their templates to fold).
fn piece_chunks(ctx: &Ctx, piece: u64, g: usize, nn: usize) -> PieceChunks {
    let blocks = split_even(piece, g as u64);
    let most = blocks.iter().map(|x| x.1).max().unwrap_or(0);
    // The intra-node phases cut blocks at the rail channels' halves (or not at all): a
    // rail step reads or writes one node sub-block, whose index relative to the node's
    // ring position is what every node shares. An intra-node chunk covering part of a half
    // would make node h's rail step s wait for a chunk that depends on h, so the plan's
    // order would differ between nodes and a template could not fold it.
    let half_most = most.div_ceil(CH_RAILS.len() as u64).max(1);
    let chunk = if phase_chunk(ctx, most) >= most {
        most.max(1)
    } else {
        half_most
    };
    // A rail ring over N nodes moves a different sub-block at every step, so from
    // CHUNKS_PER_BLOCK nodes on the steps themselves pipeline and whole sub-blocks suffice.
    let sub = most.div_ceil(CH_RAILS.len() as u64).div_ceil(nn as u64);
    let rail_chunk = if nn as u64 >= CHUNKS_PER_BLOCK {
        sub.max(ctx.chunk_elems).max(1)
    } else {
        phase_chunk(ctx, sub)
    };
    PieceChunks {
        blocks,
        half_most,
        chunk,
        rail_chunk,
    }
}

/// The chunk (elements) of a phase whose blocks are at most `most` long: the request's
/// pipelining chunk, or a [`CHUNKS_PER_BLOCK`]th of the block where that is larger. The
/// request's chunk is sized for n blocks of a flat ring; intra-node phases move blocks N times
/// larger, which the request's chunk would cut into N times more ops than pipelining needs.
fn phase_chunk(ctx: &Ctx, most: u64) -> u64 {
    ctx.chunk_elems.max(most.div_ceil(CHUNKS_PER_BLOCK)).max(1)
}

/// Pipelining chunks per block of one loop: the vector is planned in loops of `g x N x
/// LOOP_CHUNKS` chunks (all_reduce; `LOOP_CHUNKS` chunks of every block for reduce_scatter),
/// each loop running the three phases on its piece with the same staging, so staging follows
/// the chunk (which the staging budget shrinks), not the message, as NCCL's rings loop over
/// `nranks x chunk` pieces ([NCCL-src]).
const LOOP_CHUNKS: u64 = 2;

/// Loop counts the orchestrator tries for a cluster all_reduce (each a candidate, passed as
/// [`Ctx::channels`]): more loops shorten the fill and drain of the overlapped phases (about one
/// loop's intra-node phases) but cut every rail step smaller, and each step pays a copy's start
/// and a reduction's launch. Which wins depends on the node count and the message: simulated at
/// 1 GiB on DGX H100 clusters, 4 loops are fastest on 2 and 16 nodes, 8 on 4 and 8 nodes;
/// at 64 MiB one loop (which the chunk still cuts into pieces) is.
pub const PIPELINE_LOOPS: [u32; 4] = [1, 4, 8, 16];

/// Smallest message a rail ring's step moves when the vector is cut into more loops, bytes:
/// each step pays a copy's start and a reduction's launch (about 8 us), against 10 us of
/// transfer at 50 GB/s for 512 KiB; smaller steps lost in every simulated case (16 DGX H100
/// nodes at 1 GiB: 12,682 us with 256 KiB steps, 9,509 with 512 KiB, 8,341 with 1 MiB).
const MIN_RAIL_STEP_BYTES: u64 = 512 << 10;

/// Loops an all_reduce is cut into: `asked` ([`Ctx::channels`]), fewer where a rail step would
/// fall below [`MIN_RAIL_STEP_BYTES`], at least one.
fn pipeline_loops(req: &Request, nn: usize, g: usize, asked: u32) -> u64 {
    let min_step = if nn >= HALVING_MIN_NODES {
        MIN_HALVING_SUB_BYTES
    } else {
        MIN_RAIL_STEP_BYTES
    };
    let step = (g * nn * CH_RAILS.len()) as u64 * min_step;
    (req.count.saturating_mul(req.dtype.size()) / step.max(1)).clamp(1, u64::from(asked.max(1)))
}

/// The distinct loop counts of [`PIPELINE_LOOPS`] that an all_reduce `req` of `shape` is
/// planned with ([`all_reduce`] cuts fewer where rail steps would be small), one candidate each.
pub fn all_reduce_loops(req: &Request, shape: &ClusterShape) -> Vec<u32> {
    let (nn, g) = (shape.nodes(), shape.per_node());
    // One loop (pieces only as the chunk cuts them) serves small messages; where four whole
    // loops fit it lost in every simulated case (8 DGX H100 nodes at 1 GiB: 7,215 us against
    // 7,105 with four loops) and on 16 nodes no chunk within the op limit fits its staging.
    let four_fit = pipeline_loops(req, nn, g, 4) == 4;
    let mut v: Vec<u32> = PIPELINE_LOOPS
        .iter()
        .filter(|&&l| !(four_fit && l == 1))
        .map(|&l| pipeline_loops(req, nn, g, l) as u32)
        .collect();
    v.dedup();
    v
}

/// `count` elements cut into loops of at most `per` elements, all of one length where a loop
/// count up to twice the fewest divides `count` (powers of two do), the first ones one longer
/// otherwise. A loop reuses the node-partial slot of the loop two before it and waits for that
/// loop's rail steps on the elements it overwrites; with equal loops each sub-block overwrites
/// the same sub-block, whose reader at a node's rail step depends only on the node's ring
/// position, so the plan's order is the same on every node and its template folds. A shorter
/// last loop would overwrite the start of a sub-block that one node's rail send reads and
/// another's reduction.
fn even_pieces(count: u64, per: u64) -> Vec<(u64, u64)> {
    let need = count.div_ceil(per.max(1)).max(1);
    let n = (need..=need.saturating_mul(2))
        .find(|&n| count.is_multiple_of(n))
        .unwrap_or(need);
    split_even(count, n)
}

/// The plan's display name: `rail-hier multi-node ...`.
fn label(ctx: &Ctx, shape: &ClusterShape) -> String {
    format!(
        "rail-hier {}x{} {}",
        shape.nodes(),
        shape.per_node(),
        links_and_chunk(ctx)
    )
}

/// Hierarchical all_reduce: reduce-scatter inside each node (rank j ends with the node's
/// partial of block j), ring all_reduce of block j along rail j across the nodes, all_gather
/// inside each node. Falls back to [`direct::plan`] off a multi-node shape.
///
/// # Arguments
/// - `topo`: the masked topology (nodes come from it);
/// - `req`: an all_reduce;
/// - `ctx`: connections, link mode, chunk size; `channels` is the number of loops the vector is
///   cut into (fewer where a rail step would fall below 512 KiB), whose phases overlap.
///
/// # Returns
/// A complete plan, or [`crate::RouteError::NoRoute`] when ring neighbours cannot connect.
///
/// # Complexity
/// 2(g-1) intra steps and 2(N-1) rail steps, each a chunked copy per rank: O(n (g + N))
/// copies for n = N g ranks.
///
/// Source: the hierarchical all_reduce of [Temucin-2021] with nodes for sockets and one
/// inter-node ring per rail, as NCCL's rings leave every node on the NIC of the GPU they
/// entered by ([NCCL-src], `src/graph/search.cc`).
pub fn all_reduce(topo: &Topology, req: &Request, ctx: &Ctx) -> Result<Plan> {
    let Some(shape) =
        ClusterShape::of(topo, req)?.filter(|_| req.collective == Collective::AllReduce)
    else {
        return direct::plan(topo, req, ctx);
    };
    let (nn, g) = (shape.nodes(), shape.per_node());
    if nn < HALVING_MIN_NODES {
        return all_reduce_rings(topo, req, ctx, shape);
    }
    let loops = pipeline_loops(req, nn, g, ctx.channels);
    let mut b = PlanBuilder::new(
        req,
        ctx,
        format!("{} halving x{loops} loops", label(ctx, &shape)),
    );
    let lanes = |c: usize| halving::HalvingLanes {
        base: CH_HALVING + (c as u32) * HALVING_QUEUES,
        queues: HALVING_QUEUES,
    };
    for c in 0..CH_RAILS.len() {
        let l = lanes(c);
        let chs: Vec<u32> = (0..l.queues).map(|q| l.base + q).collect();
        pin_halving(&mut b, topo, req, &shape, ctx, &chs, c as u32)?;
    }
    let per = (g as u64)
        .saturating_mul(nn as u64)
        .saturating_mul(LOOP_CHUNKS.saturating_mul(ctx.chunk_elems.max(1)))
        .min(req.count.div_ceil(loops).max(1));
    let pieces = even_pieces(req.count, per);
    // The first loop's piece is the largest: it sizes the staging every loop reuses.
    let most_all = pieces.first().map_or(0, |x| x.1).div_ceil(g as u64);
    let sub_all = most_all.div_ceil(CH_RAILS.len() as u64).div_ceil(nn as u64);
    // Node partials live in the output: rank j's intra-node reduce-scatter leaves the node's
    // partial of block j where the rail phase completes it, so only receive slots are staged.
    let (intra, _) = ring_staging(&mut b, &shape, most_all, 0);
    let rail_chunk_all = if nn as u64 >= CHUNKS_PER_BLOCK {
        sub_all.max(ctx.chunk_elems).max(1)
    } else {
        phase_chunk(ctx, sub_all)
    };
    let rails: Vec<Vec<(Vec<u32>, halving::HalvingSlots)>> = (0..CH_RAILS.len() as u32)
        .map(|c| {
            (0..g)
                .map(|j| {
                    let ord = rail_order(&shape, j, c);
                    let per_sub = sub_all.div_ceil(rail_chunk_all.max(1));
                    let most = sub_all.min(rail_chunk_all);
                    let sl = halving::HalvingSlots::new(&mut b, &ord, most, per_sub);
                    (ord, sl)
                })
                .collect()
        })
        .collect();
    for &(base, piece) in &pieces {
        let PieceChunks {
            blocks,
            half_most,
            chunk,
            rail_chunk,
        } = piece_chunks(ctx, piece, g, nn);
        let out = |r: u32, at: u64, l: u64| Region::new(BufferRef::Output(r), base + at, l);
        if g > 1 {
            let lens: Vec<u64> = blocks.iter().map(|x| x.1).collect();
            b.set_chunk_elems(chunk);
            for (ord, st) in shape.hosts.iter().zip(&intra) {
                let inp = |p: usize, q: usize, rel: u64, l: u64| {
                    Region::new(BufferRef::Input(ord[p]), base + blocks[q].0 + rel, l)
                };
                let acc = |p: usize, q: usize, rel: u64, l: u64| out(ord[p], blocks[q].0 + rel, l);
                ring::reduce_scatter_steps(
                    &mut b,
                    ord,
                    CH_INTRA,
                    &lens,
                    chunk,
                    st,
                    &inp,
                    Some(&acc),
                    &acc,
                    false,
                )?;
            }
        }
        b.set_chunk_elems(rail_chunk);
        for (j, &(off, len)) in blocks.iter().enumerate() {
            // Halves cut where the intra-node chunks cut (chunks of `half_most`).
            let first = len.min(half_most);
            let halves = [(0, first), (first, len - first)];
            for (c, &(h_off, h_len)) in halves.iter().enumerate() {
                let (ord, sl) = &rails[c][j];
                let at = off + h_off;
                let subs = split_even(h_len, nn as u64);
                let lens: Vec<u64> = subs.iter().map(|x| x.1).collect();
                let inp = |p: usize, q: usize, rel: u64, l: u64| {
                    let buf = if g > 1 {
                        BufferRef::Output(ord[p])
                    } else {
                        BufferRef::Input(ord[p])
                    };
                    Region::new(buf, base + at + subs[q].0 + rel, l)
                };
                let acc =
                    |p: usize, q: usize, rel: u64, l: u64| out(ord[p], at + subs[q].0 + rel, l);
                halving::all_reduce(
                    &mut b,
                    ord,
                    lanes(c),
                    &lens,
                    rail_chunk,
                    sl,
                    &inp,
                    &acc,
                    g > 1,
                )?;
            }
        }
        if g > 1 {
            let lens: Vec<u64> = blocks.iter().map(|x| x.1).collect();
            for ord in &shape.hosts {
                let acc = |p: usize, q: usize, rel: u64, l: u64| out(ord[p], blocks[q].0 + rel, l);
                all_gather_ring(&mut b, ord, CH_BACK, &lens, chunk, None, &acc)?;
            }
        }
    }
    Ok(b.finish())
}

/// [`all_reduce`] below [`HALVING_MIN_NODES`]: rail rings, node partials in two staged slots
/// per rank.
fn all_reduce_rings(
    topo: &Topology,
    req: &Request,
    ctx: &Ctx,
    shape: ClusterShape,
) -> Result<Plan> {
    let (nn, g) = (shape.nodes(), shape.per_node());
    let loops = pipeline_loops(req, nn, g, ctx.channels);
    let mut b = PlanBuilder::new(
        req,
        ctx,
        format!("{} ring x{loops} loops", label(ctx, &shape)),
    );
    for (c, &ch) in CH_RAILS.iter().enumerate() {
        pin_rails(&mut b, topo, req, &shape, ctx, ch, c as u32)?;
    }
    let per = (g as u64)
        .saturating_mul(nn as u64)
        .saturating_mul(LOOP_CHUNKS.saturating_mul(ctx.chunk_elems.max(1)))
        .min(req.count.div_ceil(loops).max(1));
    let pieces = even_pieces(req.count, per);
    // The first loop's piece is the largest: it sizes the staging every loop reuses.
    let most_all = pieces.first().map_or(0, |x| x.1).div_ceil(g as u64);
    let sub_all = most_all.div_ceil(CH_RAILS.len() as u64).div_ceil(nn as u64);
    // Each rank's node partials of its block (the input itself on one-GPU nodes), one per
    // loop in flight: loop k+1's intra-node reduce-scatter fills one while loop k's rail ring
    // reads the other, so NVLink and the NICs work at once.
    let part: Vec<Option<BufferRef>> = (0..req.nranks() as u32)
        .map(|r| (g > 1).then(|| b.scratch(r, PART_SLOTS * most_all)))
        .collect();
    let (intra, _) = ring_staging(&mut b, &shape, most_all, 0);
    let rails: Vec<Vec<(Vec<u32>, RsStaging)>> = (0..CH_RAILS.len() as u32)
        .map(|c| {
            (0..g)
                .map(|j| {
                    let ord = rail_order(&shape, j, c);
                    let st = RsStaging::new(&mut b, &ord, sub_all, nn > 2);
                    (ord, st)
                })
                .collect()
        })
        .collect();
    for (k, &(base, piece)) in pieces.iter().enumerate() {
        let slot = (k as u64 % PART_SLOTS) * most_all;
        let PieceChunks {
            blocks,
            half_most,
            chunk,
            rail_chunk,
        } = piece_chunks(ctx, piece, g, nn);
        if g > 1 {
            let lens: Vec<u64> = blocks.iter().map(|x| x.1).collect();
            for (ord, st) in shape.hosts.iter().zip(&intra) {
                let inp = |p: usize, q: usize, rel: u64, l: u64| {
                    Region::new(BufferRef::Input(ord[p]), base + blocks[q].0 + rel, l)
                };
                let fin = |p: usize, _q: usize, rel: u64, l: u64| {
                    let buf = part[ord[p] as usize].unwrap_or(BufferRef::Input(ord[p]));
                    Region::new(buf, slot + rel, l)
                };
                reduce_scatter_ring(&mut b, ord, CH_INTRA, &lens, chunk, st, &inp, &fin, false)?;
            }
        }
        for (j, &(off, len)) in blocks.iter().enumerate() {
            // Halves cut where the intra-node chunks cut (chunks of `half_most`).
            let first = len.min(half_most);
            let halves = [(0, first), (first, len - first)];
            for (c, &(h_off, h_len)) in halves.iter().enumerate() {
                let (ord, st) = &rails[c][j];
                let ch = CH_RAILS[c];
                let at = off + h_off;
                let subs = split_even(h_len, nn as u64);
                let lens: Vec<u64> = subs.iter().map(|x| x.1).collect();
                let inp = |p: usize, q: usize, rel: u64, l: u64| match part[ord[p] as usize] {
                    Some(buf) => Region::new(buf, slot + h_off + subs[q].0 + rel, l),
                    None => Region::new(BufferRef::Input(ord[p]), base + at + subs[q].0 + rel, l),
                };
                let out = |p: usize, q: usize, rel: u64, l: u64| {
                    Region::new(BufferRef::Output(ord[p]), base + at + subs[q].0 + rel, l)
                };
                reduce_scatter_ring(&mut b, ord, ch, &lens, rail_chunk, st, &inp, &out, true)?;
                all_gather_ring(&mut b, ord, ch, &lens, rail_chunk, None, &out)?;
            }
        }
        if g > 1 {
            let lens: Vec<u64> = blocks.iter().map(|x| x.1).collect();
            for ord in &shape.hosts {
                let out = |p: usize, q: usize, rel: u64, l: u64| {
                    Region::new(BufferRef::Output(ord[p]), base + blocks[q].0 + rel, l)
                };
                all_gather_ring(&mut b, ord, CH_BACK, &lens, chunk, None, &out)?;
            }
        }
    }
    Ok(b.finish())
}

/// Pin the connections of a halving rail phase on lane channels `chs` (rail channel `c`'s
/// order): every distance a halving step sends over, both ways, rail-aligned as [`pin_rails`]
/// pins a ring's hops.
fn pin_halving(
    b: &mut PlanBuilder,
    topo: &Topology,
    req: &Request,
    shape: &ClusterShape,
    ctx: &Ctx,
    chs: &[u32],
    c: u32,
) -> Result<()> {
    let links = NetLinks::new(topo, &req.gpus, ctx.cache, ctx.limit)?;
    let nn = shape.nodes();
    let ds = halving::distances(nn);
    for j in 0..shape.per_node() {
        let ord = rail_order(shape, j, c);
        for p in 0..nn {
            for (k, &d) in ds.iter().enumerate() {
                for (a, e) in [(ord[p], ord[(p + d) % nn]), (ord[(p + d) % nn], ord[p])] {
                    // A windowed build skips every send between two cold ranks before it
                    // looks up their connection.
                    if a == e || !b.may_touch(&[a, e]) {
                        continue;
                    }
                    let Some(rail) = links.rail[a as usize] else {
                        continue;
                    };
                    let conn = links.across(a, e, rail, j + p + k)?;
                    for &ch in chs {
                        b.pin(ch, req.gpus[a as usize], req.gpus[e as usize], conn.clone());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Lane channels of the halving rail phase start here: [`HALVING_QUEUES`] per rail channel.
const CH_HALVING: u32 = 8;

/// Lane channels each halving rail channel spreads its sub-blocks over, so a step's
/// independent sub-blocks pay their start costs on several lanes at once.
const HALVING_QUEUES: u32 = 4;

/// Fewest nodes whose rail phase runs by distance halving (`halving.rs`) rather than as a ring.
/// Simulated at 1 GiB on DGX H100 clusters (us, ring against halving): 4 nodes 5,451 / 5,541,
/// 8 nodes 6,479 / 5,533, 16 nodes 6,713 / 5,989, 32 nodes 9,632 / 6,965, 64 nodes 11,925 /
/// 7,225, 128 nodes 20,351 / 8,238: from 8 nodes on the ring's 2 (N-1) dependent steps cost
/// more than halving's spread of sub-blocks over log2 N distances.
pub const HALVING_MIN_NODES: usize = 8;

/// Smallest sub-block a halving rail phase moves when the vector is cut into more loops, bytes:
/// its sub-blocks are independent within a step and spread over [`HALVING_QUEUES`] lanes, so
/// their start costs overlap and smaller ones than a ring step's pay (128 DGX H100 nodes at
/// 1 GiB: 8,238 us with four loops of 128 KiB sub-blocks, 10,133 us with eight of 64 KiB).
const MIN_HALVING_SUB_BYTES: u64 = 128 << 10;

/// Hierarchical reduce_scatter: inside each node, a reduce-scatter per destination node leaves
/// rank j with the node's partial of every block its rail delivers; rail j then reduce-scatters
/// those across the nodes, so each byte crosses the network once. Falls back to
/// [`direct::plan`] off a multi-node shape. Arguments and returns as [`all_reduce`].
///
/// # Complexity
/// N (g-1) intra steps of one block per rank and N-1 rail steps: O(n N g) copies.
pub fn reduce_scatter(topo: &Topology, req: &Request, ctx: &Ctx) -> Result<Plan> {
    let Some(shape) =
        ClusterShape::of(topo, req)?.filter(|_| req.collective == Collective::ReduceScatter)
    else {
        return direct::plan(topo, req, ctx);
    };
    let (nn, g) = (shape.nodes(), shape.per_node());
    let count = req.count;
    let mut b = PlanBuilder::new(req, ctx, label(ctx, &shape));
    pin_rails(&mut b, topo, req, &shape, ctx, CH_RAIL, 0)?;
    let per = LOOP_CHUNKS
        .saturating_mul(CHUNKS_PER_BLOCK)
        .saturating_mul(ctx.chunk_elems.max(1));
    let most = count.min(per);
    // part[r] holds, at h * most, the node partial of the piece of the block rank hosts[h][j]
    // receives.
    let part: Vec<Option<BufferRef>> = (0..req.nranks() as u32)
        .map(|r| (g > 1).then(|| b.scratch(r, nn as u64 * most)))
        .collect();
    let (intra, rails) = ring_staging(&mut b, &shape, most, most);
    // Loops of one length, as the all_reduce's, so every loop reuses the partial slots alike.
    for (base, piece) in even_pieces(count, per.max(1)) {
        let chunk = phase_chunk(ctx, piece);
        if g > 1 {
            let lens = vec![piece; g];
            // One ring per destination node: the N rings pipeline one another, so whole
            // pieces suffice.
            let chunk = piece.max(1);
            for (hh, (ord, st)) in shape.hosts.iter().zip(&intra).enumerate() {
                // Destination nodes in the order the rail ring asks for them: node hh - 1
                // first, its own last; the order relative to the node is the same on every
                // node, so the plan folds into a template.
                for t in 1..=nn {
                    let h = (hh + nn - t) % nn;
                    let dest = &shape.hosts[h];
                    let inp = |p: usize, q: usize, rel: u64, l: u64| {
                        Region::new(
                            BufferRef::Input(ord[p]),
                            u64::from(dest[q]) * count + base + rel,
                            l,
                        )
                    };
                    let fin = |p: usize, _q: usize, rel: u64, l: u64| {
                        let buf = part[ord[p] as usize].unwrap_or(BufferRef::Input(ord[p]));
                        Region::new(buf, h as u64 * most + rel, l)
                    };
                    reduce_scatter_ring(
                        &mut b, ord, CH_INTRA, &lens, chunk, st, &inp, &fin, false,
                    )?;
                }
            }
        }
        for (ord, st) in &rails {
            let lens = vec![piece; nn];
            let inp = |p: usize, q: usize, rel: u64, l: u64| match part[ord[p] as usize] {
                Some(buf) => Region::new(buf, q as u64 * most + rel, l),
                None => Region::new(
                    BufferRef::Input(ord[p]),
                    u64::from(ord[q]) * count + base + rel,
                    l,
                ),
            };
            let fin = |p: usize, _q: usize, rel: u64, l: u64| {
                Region::new(BufferRef::Output(ord[p]), base + rel, l)
            };
            reduce_scatter_ring(&mut b, ord, CH_RAIL, &lens, chunk, st, &inp, &fin, true)?;
        }
    }
    Ok(b.finish())
}

/// Hierarchical all_gather: rail j all-gathers the blocks of its ranks across the nodes, then
/// inside each node every rank forwards what its rail brought, one ring per source node. Falls
/// back to [`direct::plan`] off a multi-node shape or for all_gather_v. Arguments and returns
/// as [`all_reduce`].
///
/// # Complexity
/// N-1 rail steps and N (g-1) intra steps of one block per rank: O(n N g) copies.
pub fn all_gather(topo: &Topology, req: &Request, ctx: &Ctx) -> Result<Plan> {
    let Some(shape) =
        ClusterShape::of(topo, req)?.filter(|_| req.collective == Collective::AllGather)
    else {
        return direct::plan(topo, req, ctx);
    };
    let (nn, g) = (shape.nodes(), shape.per_node());
    let count = req.count;
    let chunk = phase_chunk(ctx, count);
    let mut b = PlanBuilder::new(req, ctx, label(ctx, &shape));
    pin_rails(&mut b, topo, req, &shape, ctx, CH_RAIL, 0)?;
    for r in 0..req.nranks() as u32 {
        b.send(
            Region::new(BufferRef::Input(r), 0, count),
            Region::new(BufferRef::Output(r), u64::from(r) * count, count),
            CH_LOCAL,
        )?;
    }
    for j in 0..g {
        let ord = shape.rail(j);
        let lens = vec![count; nn];
        let inp =
            |p: usize, _q: usize, rel: u64, l: u64| Region::new(BufferRef::Input(ord[p]), rel, l);
        let out = |p: usize, q: usize, rel: u64, l: u64| {
            Region::new(
                BufferRef::Output(ord[p]),
                u64::from(ord[q]) * count + rel,
                l,
            )
        };
        all_gather_ring(&mut b, &ord, CH_RAIL, &lens, chunk, Some(&inp), &out)?;
    }
    if g > 1 {
        let lens = vec![count; g];
        // One ring per source node: the N rings pipeline one another, so whole blocks suffice.
        let chunk = count.max(1);
        for (hh, ord) in shape.hosts.iter().enumerate() {
            // Source nodes in the order the rail ring brings them: its own first, then node
            // hh - 1, hh - 2, ...; relative to the node, the same on every node.
            for t in 0..nn {
                let src = &shape.hosts[(hh + nn - t) % nn];
                let out = |p: usize, q: usize, rel: u64, l: u64| {
                    Region::new(
                        BufferRef::Output(ord[p]),
                        u64::from(src[q]) * count + rel,
                        l,
                    )
                };
                all_gather_ring(&mut b, ord, CH_BACK, &lens, chunk, None, &out)?;
            }
        }
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, check_routes};
    use crate::dtype::{DType, ReduceOp};
    use crate::path::RelayPolicy;
    use crate::planner::{ConnCache, LinkMode};

    fn prove(topo: &Topology, req: &Request, planner: super::super::PlannerFn, chunk: u64) -> Plan {
        let cache = ConnCache::new(topo, &req.gpus, &RelayPolicy::Any);
        let ctx = Ctx {
            cache: &cache,
            mode: LinkMode::Single,
            chunk_elems: chunk,
            channels: 1,
            window: None,
            limit: None,
        };
        let p = planner(topo, req, &ctx).unwrap();
        check(&p).unwrap();
        check_routes(&p, topo).unwrap();
        // Every collective with an in-place form is served in place too.
        crate::check::check_with(&p, crate::check::CheckOptions { in_place: true }).unwrap();
        p
    }

    #[test]
    fn shapes_group_ranks_by_node_and_refuse_uneven_nodes() {
        let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
        let req = Request::new(Collective::AllReduce, vec![9, 0, 8, 1], 10, DType::F32);
        let shape = ClusterShape::of(&topo, &req).unwrap().unwrap();
        // Ranks 0 and 2 sit on node 1 (GPUs 9 and 8), ranks 1 and 3 on node 0 (GPUs 0, 1).
        assert_eq!(shape.hosts, vec![vec![2, 0], vec![1, 3]]);
        assert_eq!(shape.rail(1), vec![0, 3]);
        let uneven = Request::new(Collective::AllReduce, vec![0, 1, 8], 10, DType::F32);
        assert_eq!(ClusterShape::of(&topo, &uneven).unwrap(), None);
        let one = Request::new(Collective::AllReduce, vec![0, 1], 10, DType::F32);
        assert_eq!(ClusterShape::of(&topo, &one).unwrap(), None);
    }

    #[test]
    fn every_hierarchical_plan_is_proved_on_clusters() {
        // Two and three nodes pipeline rail rings in chunks; five nodes in whole sub-blocks;
        // from eight nodes on the all_reduce's rails run by distance halving (nine: a count of
        // nodes that is no power of two).
        for spec in [
            "cluster:2xdgx-h100:ib-ndr",
            "cluster:3xdgx1-v100:ib-edr",
            "cluster:5xdgx-h100:ib-ndr",
            "cluster:8xdgx-h100:ib-ndr",
            "cluster:9xdgx-h100:ib-ndr",
        ] {
            let topo = relaycc_topo::preset(spec).unwrap();
            let all: Vec<u32> = (0..topo.gpu_count()).collect();
            // Whole nodes, two GPUs of each node (a rail subset), odd counts included, and one
            // GPU per node (the rail phase alone).
            let pairs: Vec<u32> = all.iter().copied().filter(|g| g % 8 < 2).collect();
            let singles: Vec<u32> = all.iter().copied().filter(|g| g % 8 == 3).collect();
            let sets = if topo.gpu_count() > 24 {
                vec![pairs, singles]
            } else {
                vec![all.clone(), pairs]
            };
            for gpus in sets {
                for count in [1, 29, 1000] {
                    let ar = Request::new(Collective::AllReduce, gpus.clone(), count, DType::F32)
                        .with_op(ReduceOp::Avg);
                    prove(&topo, &ar, all_reduce, 7);
                    let rs =
                        Request::new(Collective::ReduceScatter, gpus.clone(), count, DType::F32);
                    prove(&topo, &rs, reduce_scatter, 7);
                    let ag = Request::new(Collective::AllGather, gpus.clone(), count, DType::F32);
                    prove(&topo, &ag, all_gather, 7);
                    // A chunk of 7 cuts pieces of 29 and 1,000 elements into loops.
                    let a2a = Request::new(Collective::AllToAll, gpus.clone(), count, DType::F32);
                    prove(&topo, &a2a, all_to_all, 7);
                    prove(&topo, &a2a, all_to_all, 1 << 20);
                }
            }
        }
    }

    #[test]
    fn staging_follows_the_chunk_not_the_message() {
        // Loops of g x N x LOOP_CHUNKS chunks reuse one set of staging: a message four times
        // larger than a loop stages exactly what one loop does, and the plans are proved.
        let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
        let gpus: Vec<u32> = (0..16).collect();
        let chunk = 64;
        let per = 8 * 2 * LOOP_CHUNKS * chunk;
        for (c, planner) in [
            (Collective::AllReduce, all_reduce as super::super::PlannerFn),
            (Collective::ReduceScatter, reduce_scatter),
        ] {
            let staging = |count: u64| {
                let req = Request::new(c, gpus.clone(), count, DType::F32);
                let p = prove(&topo, &req, planner, chunk);
                p.staging_per_location()
                    .values()
                    .copied()
                    .max()
                    .unwrap_or(0)
            };
            let one = staging(per);
            assert!(one > 0, "{c}");
            assert_eq!(staging(4 * per), one, "{c}");
            // An all_reduce cuts a message that is no whole number of loops into more loops of
            // equal length (7 of 1,171 elements here), which stage less than one loop.
            let odd = staging(4 * per + 5);
            assert!(odd > 0 && odd <= one, "{c}: {odd} against {one}");
        }
    }

    #[test]
    fn all_reduce_copies_grow_with_ranks_times_nodes_plus_node_size() {
        let topo = relaycc_topo::preset("cluster:4xdgx-h100:ib-ndr").unwrap();
        let req = Request::new(Collective::AllReduce, (0..32).collect(), 32 * 8, DType::F32);
        let p = prove(&topo, &req, all_reduce, 1 << 20);
        // One chunk per block: per rank 2 (g-1) intra copies and 2 (N-1) rail copies; the
        // rail copies go through the NIC (several ops each), so count the hops' first ops.
        let copies = p
            .ops
            .iter()
            .filter(|o| matches!(o.kind, crate::plan::OpKind::Copy { .. }))
            .count();
        assert!(copies <= 32 * (2 * 7 + 2 * 3) * 4, "{copies} copies");
    }
}

#[cfg(test)]
mod fold_tests {
    use super::*;
    use crate::dtype::DType;
    use crate::path::RelayPolicy;
    use crate::planner::{Candidates, pipeline_chunk_elems};
    use crate::sim::SimConfig;

    #[test]
    fn reduce_scatter_and_all_gather_fold_and_time_like_their_expanded_plans() {
        // Each node walks the other nodes in the order its rail ring needs them, relative to
        // itself, so node h's ops wait for what node 0's do, shifted: the templates fold.
        for nodes in [4u32, 5] {
            let topo = relaycc_topo::preset(&format!("cluster:{nodes}xdgx-h100:ib-ndr")).unwrap();
            let sym = topo.host_symmetry();
            let n = topo.gpu_count();
            for c in [
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::AllToAll,
            ] {
                let req = Request::new(c, (0..n).collect(), (64 << 20) / u64::from(n), DType::F32);
                let chunk = pipeline_chunk_elems(&req).max(1);
                let set = Candidates::new(&topo, &req, &RelayPolicy::default()).unwrap();
                let i = (0..set.len())
                    .find(|&i| {
                        set.build_unfitted(i, chunk, None)
                            .is_ok_and(|p| !p.algorithm.starts_with("direct"))
                    })
                    .unwrap();
                let full = set.build(i, chunk, None).unwrap();
                let t = set
                    .build_template(i, chunk, &sym, None)
                    .unwrap_or_else(|e| panic!("{nodes} nodes {c}: {e}"));
                crate::check::check_template(&t).unwrap();
                let cfg = SimConfig::default();
                let a = crate::simulate(&topo, &full, &cfg).unwrap().time_us;
                let b = crate::simulate(&topo, &t, &cfg).unwrap().time_us;
                assert!(
                    (a - b).abs() < 0.01 * a,
                    "{nodes} nodes {c}: {a} against {b}"
                );
            }
        }
    }
}
