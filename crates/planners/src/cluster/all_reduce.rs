//! The hierarchical all_reduce on clusters: reduce-scatter inside each node, an all_reduce of
//! block j along rail j (rail rings below [`HALVING_MIN_NODES`] nodes, distance halving,
//! `halving.rs`, from there), all_gather inside each node, the vector cut into
//! [`PIPELINE_LOOPS`] loops whose phases overlap.

use relaycc_topo::Topology;

use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::super::builder::PlanBuilder;
use super::super::ring::{self, RsStaging};
use super::super::{CHUNKS_PER_BLOCK, PlannerContext, direct, split_even};
use super::halving;
use super::phases::{
    CH_BACK, CH_INTRA, CH_RAIL, LOOP_CHUNKS, RailHops, even_pieces, label, phase_chunk,
    pin_rail_hops, pin_rails, rail_order, ring_staging,
};
use super::shape::ClusterShape;

/// Node-partial slots per rank of a ring-railed all_reduce: two let the intra-node
/// reduce-scatter of one loop run while the rail ring of the loop before reads its partials.
const PART_SLOTS: u64 = 2;

/// Lane channels of an all_reduce's rail rings, one per rail channel.
const CH_RAILS: [u32; 2] = [CH_RAIL, 4];

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
fn piece_chunks(ctx: &PlannerContext, piece: u64, g: usize, nn: usize) -> PieceChunks {
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
    PieceChunks {
        blocks,
        half_most,
        chunk,
        rail_chunk: rail_chunk(ctx, most, nn),
    }
}

/// The rail phase's chunk for node blocks of at most `most` elements over `nn` nodes: a rail
/// ring over N nodes moves a different sub-block at every step, so from [`CHUNKS_PER_BLOCK`]
/// nodes on the steps themselves pipeline and whole sub-blocks suffice.
fn rail_chunk(ctx: &PlannerContext, most: u64, nn: usize) -> u64 {
    let sub = most.div_ceil(CH_RAILS.len() as u64).div_ceil(nn as u64);
    if nn as u64 >= CHUNKS_PER_BLOCK {
        sub.max(ctx.chunk_elems).max(1)
    } else {
        phase_chunk(ctx, sub)
    }
}

/// How an all_reduce's vector is cut into loops: the pieces (offset, length), and the largest
/// node block and rail sub-block of a piece, which size the staging every loop reuses.
struct LoopCut {
    pieces: Vec<(u64, u64)>,
    most_all: u64,
    sub_all: u64,
}

/// Most chunks of a loop's node block (its piece over a node's `g` ranks). The node rings'
/// receive staging holds two blocks per rank, so with this cap it follows the chunk (which a
/// staging budget shrinks) at every node count; below 128 nodes the `g x N x LOOP_CHUNKS`
/// cut is the smaller. Without it, 1 GiB on 1,024 DGX H100 nodes is one loop whose node
/// block (128 MiB) no chunk shrinks, and its staging passes the default budget.
const MAX_BLOCK_CHUNKS: u64 = 256;

/// The builder of an all_reduce `req` of `shape` whose rail phase is `rail_phase` (named in
/// the plan's name), and its loops: pieces of at most `g x N x LOOP_CHUNKS` chunks (and
/// `g x MAX_BLOCK_CHUNKS`), at least [`pipeline_loops`] of them, of one length where they
/// can be.
fn start<'a, 't>(
    req: &Request,
    ctx: &'a PlannerContext<'t>,
    shape: &ClusterShape,
    rail_phase: &str,
) -> (PlanBuilder<'a, 't>, LoopCut) {
    let (nn, g) = (shape.nodes(), shape.per_node());
    let loops = pipeline_loops(req, nn, g, ctx.channels);
    let block_chunks = (nn as u64)
        .saturating_mul(LOOP_CHUNKS)
        .min(MAX_BLOCK_CHUNKS);
    let per = (g as u64)
        .saturating_mul(block_chunks.saturating_mul(ctx.chunk_elems.max(1)))
        .min(req.count.div_ceil(loops).max(1));
    let pieces = even_pieces(req.count, per);
    // The first loop's piece is the largest: it sizes the staging every loop reuses.
    let most_all = pieces.first().map_or(0, |x| x.1).div_ceil(g as u64);
    let sub_all = most_all.div_ceil(CH_RAILS.len() as u64).div_ceil(nn as u64);
    let b = PlanBuilder::new(
        req,
        ctx,
        format!("{} {rail_phase} x{loops} loops", label(ctx, shape)),
    );
    let cut = LoopCut {
        pieces,
        most_all,
        sub_all,
    };
    (b, cut)
}

/// One rail channel's half of node block `j` in a piece: rail channel `c`, its offset `h_off`
/// within the block and `at` within the piece, and its sub-blocks per node (`subs`, with
/// their lengths `lens`). Halves cut where the intra-node chunks cut (chunks of `half_most`).
struct RailHalf {
    j: usize,
    c: usize,
    h_off: u64,
    at: u64,
    subs: Vec<(u64, u64)>,
    lens: Vec<u64>,
}

/// The rail halves of a piece's node `blocks`, block by block, rail channel by channel.
fn rail_halves(blocks: &[(u64, u64)], half_most: u64, nn: usize) -> impl Iterator<Item = RailHalf> {
    blocks.iter().enumerate().flat_map(move |(j, &(off, len))| {
        let first = len.min(half_most);
        [(0, first), (first, len - first)]
            .into_iter()
            .enumerate()
            .map(move |(c, (h_off, h_len))| {
                let subs = split_even(h_len, nn as u64);
                let lens = subs.iter().map(|x| x.1).collect();
                RailHalf {
                    j,
                    c,
                    h_off,
                    at: off + h_off,
                    subs,
                    lens,
                }
            })
    })
}

/// The last phase of a piece at `base`: every node's ring all_gather of its completed
/// `blocks`, on [`CH_BACK`] in `chunk`s.
fn gather_in_nodes(
    b: &mut PlanBuilder,
    shape: &ClusterShape,
    blocks: &[(u64, u64)],
    base: u64,
    chunk: u64,
) -> Result<()> {
    let lens: Vec<u64> = blocks.iter().map(|x| x.1).collect();
    for ord in &shape.hosts {
        let out = |p: usize, q: usize, rel: u64, l: u64| {
            Region::new(BufferRef::Output(ord[p]), base + blocks[q].0 + rel, l)
        };
        ring::all_gather_pass(b, ord, CH_BACK, &lens, chunk, None, &out)?;
    }
    Ok(())
}

/// Loop counts the orchestrator tries for a cluster all_reduce (each a candidate, passed as
/// [`PlannerContext::channels`]): more loops shorten the fill and drain of the overlapped phases (about one
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

/// Loops an all_reduce is cut into: `asked` ([`PlannerContext::channels`]), fewer where a rail step would
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
/// A complete plan, or [`relaycc_plan::RouteError::NoRoute`] when ring neighbours cannot connect.
///
/// # Complexity
/// 2(g-1) intra steps and 2(N-1) rail steps, each a chunked copy per rank: O(n (g + N))
/// copies for n = N g ranks.
///
/// Source: the hierarchical all_reduce of [Temucin-2021] with nodes for sockets and one
/// inter-node ring per rail, as NCCL's rings leave every node on the NIC of the GPU they
/// entered by ([NCCL-src], `src/graph/search.cc`).
pub fn all_reduce(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let Some(shape) =
        ClusterShape::of(topo, req)?.filter(|_| req.collective == Collective::AllReduce)
    else {
        return direct::plan(topo, req, ctx);
    };
    let (nn, g) = (shape.nodes(), shape.per_node());
    if nn < HALVING_MIN_NODES {
        return all_reduce_rings(topo, req, ctx, shape);
    }
    let (mut b, cut) = start(req, ctx, &shape, "halving");
    let (most_all, sub_all) = (cut.most_all, cut.sub_all);
    let lanes = |c: usize| halving::HalvingLanes {
        base: CH_HALVING + (c as u32) * HALVING_QUEUES,
        queues: HALVING_QUEUES,
    };
    for c in 0..CH_RAILS.len() {
        let l = lanes(c);
        let chs: Vec<u32> = (0..l.queues).map(|q| l.base + q).collect();
        pin_halving(&mut b, topo, req, &shape, ctx, &chs, c as u32)?;
    }
    // Node partials live in the output: rank j's intra-node reduce-scatter leaves the node's
    // partial of block j where the rail phase completes it, so only receive slots are staged.
    let intra: Vec<RsStaging> = if g > 1 {
        let slots = |ord: &Vec<u32>| RsStaging::new(&mut b, ord, most_all, false);
        shape.hosts.iter().map(slots).collect()
    } else {
        Vec::new()
    };
    let rail_chunk_all = rail_chunk(ctx, most_all, nn);
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
    for &(base, piece) in &cut.pieces {
        let PieceChunks {
            blocks,
            half_most,
            chunk,
            rail_chunk,
        } = piece_chunks(ctx, piece, g, nn);
        let out = |r: u32, at: u64, l: u64| Region::new(BufferRef::Output(r), base + at, l);
        if g > 1 {
            let lens: Vec<u64> = blocks.iter().map(|x| x.1).collect();
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
        for RailHalf {
            j,
            c,
            at,
            subs,
            lens,
            ..
        } in rail_halves(&blocks, half_most, nn)
        {
            let (ord, sl) = &rails[c][j];
            let inp = |p: usize, q: usize, rel: u64, l: u64| {
                let buf = if g > 1 {
                    BufferRef::Output(ord[p])
                } else {
                    BufferRef::Input(ord[p])
                };
                Region::new(buf, base + at + subs[q].0 + rel, l)
            };
            let acc = |p: usize, q: usize, rel: u64, l: u64| out(ord[p], at + subs[q].0 + rel, l);
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
        if g > 1 {
            gather_in_nodes(&mut b, &shape, &blocks, base, chunk)?;
        }
    }
    Ok(b.finish())
}

/// [`all_reduce`] below [`HALVING_MIN_NODES`]: rail rings, node partials in two staged slots
/// per rank.
fn all_reduce_rings(
    topo: &Topology,
    req: &Request,
    ctx: &PlannerContext,
    shape: ClusterShape,
) -> Result<Plan> {
    let (nn, g) = (shape.nodes(), shape.per_node());
    let (mut b, cut) = start(req, ctx, &shape, "ring");
    let (most_all, sub_all) = (cut.most_all, cut.sub_all);
    for (c, &ch) in CH_RAILS.iter().enumerate() {
        pin_rails(&mut b, topo, req, &shape, ctx, ch, c as u32)?;
    }
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
    for (k, &(base, piece)) in cut.pieces.iter().enumerate() {
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
                ring::reduce_scatter_steps(
                    &mut b, ord, CH_INTRA, &lens, chunk, st, &inp, None, &fin, false,
                )?;
            }
        }
        for RailHalf {
            j,
            c,
            h_off,
            at,
            subs,
            lens,
        } in rail_halves(&blocks, half_most, nn)
        {
            let (ord, st) = &rails[c][j];
            let ch = CH_RAILS[c];
            let inp = |p: usize, q: usize, rel: u64, l: u64| match part[ord[p] as usize] {
                Some(buf) => Region::new(buf, slot + h_off + subs[q].0 + rel, l),
                None => Region::new(BufferRef::Input(ord[p]), base + at + subs[q].0 + rel, l),
            };
            let out = |p: usize, q: usize, rel: u64, l: u64| {
                Region::new(BufferRef::Output(ord[p]), base + at + subs[q].0 + rel, l)
            };
            ring::reduce_scatter_steps(
                &mut b, ord, ch, &lens, rail_chunk, st, &inp, None, &out, true,
            )?;
            ring::all_gather_pass(&mut b, ord, ch, &lens, rail_chunk, None, &out)?;
        }
        if g > 1 {
            gather_in_nodes(&mut b, &shape, &blocks, base, chunk)?;
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
    ctx: &PlannerContext,
    chs: &[u32],
    c: u32,
) -> Result<()> {
    let hops = RailHops {
        chs,
        c,
        distances: &halving::distances(shape.nodes()),
        both_ways: true,
    };
    pin_rail_hops(b, topo, req, shape, ctx, &hops)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConnCache, LinkMode};
    use relaycc_plan::DType;
    use relaycc_plan::path::RelayPolicy;

    /// The largest node block of a loop of an all_reduce of `bytes` on `preset`, pipelined in
    /// `chunk`s, elements.
    fn most_block(preset: &str, bytes: u64, chunk: u64) -> u64 {
        let topo = relaycc_topo::preset(preset).unwrap();
        let n = topo.gpu_count() as u32;
        let req = Request::new(
            Collective::AllReduce,
            (0..n).collect(),
            bytes / 4,
            DType::F32,
        );
        let shape = ClusterShape::of(&topo, &req).unwrap().unwrap();
        let cache = ConnCache::new(&topo, &req.gpus, &RelayPolicy::Members);
        let ctx = PlannerContext::new(&cache, LinkMode::Single, chunk, 1);
        start(&req, &ctx, &shape, "halving").1.most_all
    }

    /// A loop's node block, which sizes the node rings' staging, follows the chunk at every
    /// node count: on 256 nodes it is at most MAX_BLOCK_CHUNKS chunks (and halves with the
    /// chunk), where on 16 nodes the g x N x LOOP_CHUNKS cut binds as before.
    #[test]
    fn a_loops_node_block_follows_the_chunk_at_every_node_count() {
        let chunk = 1 << 17;
        let big = most_block("cluster:256xdgx-h100:ib-ndr", 1 << 30, chunk);
        assert!(big <= MAX_BLOCK_CHUNKS * chunk, "{big}");
        let half = most_block("cluster:256xdgx-h100:ib-ndr", 1 << 30, chunk / 2);
        assert!(half <= MAX_BLOCK_CHUNKS * chunk / 2, "{half}");
        let small = most_block("cluster:16xdgx-h100:ib-ndr", 1 << 30, chunk);
        assert_eq!(small, 16 * LOOP_CHUNKS * chunk);
    }
}
