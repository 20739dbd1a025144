//! What every rail-hierarchical cluster plan's phases share: the lane channel of each phase,
//! rail orders and their hops pinned to rail-aligned NICs, the reduce-scatter staging of the
//! node and rail rings (whose passes are the flat rings', [`super::super::ring`]), and how a
//! vector is cut into loops and a phase into chunks.

use relaycc_topo::Topology;

use relaycc_plan::Request;
use relaycc_plan::Result;

use super::super::baseline_net::links::NetLinks;
use super::super::builder::PlanBuilder;
use super::super::ring::RsStaging;
use super::super::{CHUNKS_PER_BLOCK, PlannerContext, links_and_chunk, split_even};
use super::shape::ClusterShape;

/// Lane channels of the phases: intra-node first phase, inter-node, intra-node last phase,
/// and the local copies of all_gather.
pub(super) const CH_INTRA: u32 = 0;
pub(super) const CH_RAIL: u32 = 1;
pub(super) const CH_BACK: u32 = 2;
pub(super) const CH_LOCAL: u32 = 3;

/// Pin every rail ring's hops on channel `ch` to rail-aligned connections: out through the
/// sender's home NIC (its nearest in the PCIe tree, by PXN over NVLink where that path
/// crosses a CPU), in through the receiver's NIC of the same rail. The connection cache's
/// widest single routes tie between a node's NICs and may put two rails on one NIC, halving
/// both; rail-aligned hops give each rail its own NIC in both directions.
pub(super) fn pin_rails(
    b: &mut PlanBuilder,
    topo: &Topology,
    req: &Request,
    shape: &ClusterShape,
    ctx: &PlannerContext,
    ch: u32,
    c: u32,
) -> Result<()> {
    let hops = RailHops {
        chs: &[ch],
        c,
        distances: &[1],
        both_ways: false,
    };
    pin_rail_hops(b, topo, req, shape, ctx, &hops)
}

/// Which hops of every rail [`pin_rail_hops`] pins: from each position of rail channel `c`'s
/// order to the positions `distances` ahead (and back, where `both_ways`), on every lane
/// channel of `chs`.
pub(super) struct RailHops<'a> {
    pub chs: &'a [u32],
    pub c: u32,
    pub distances: &'a [usize],
    pub both_ways: bool,
}

/// Pin `hops` of every rail to rail-aligned connections, as [`pin_rails`] pins a ring's. A
/// windowed build skips every pair of cold ranks, as it skips every send between them before
/// it looks up their connection.
pub(super) fn pin_rail_hops(
    b: &mut PlanBuilder,
    topo: &Topology,
    req: &Request,
    shape: &ClusterShape,
    ctx: &PlannerContext,
    hops: &RailHops,
) -> Result<()> {
    let links = NetLinks::new(topo, &req.gpus, ctx.cache, ctx.limit)?;
    let nn = shape.nodes();
    let ways = if hops.both_ways { 2 } else { 1 };
    for j in 0..shape.per_node() {
        let ord = rail_order(shape, j, hops.c);
        for p in 0..nn {
            for (k, &d) in hops.distances.iter().enumerate() {
                let (x, y) = (ord[p], ord[(p + d) % nn]);
                for &(a, e) in &[(x, y), (y, x)][..ways] {
                    if a == e || !b.may_touch(&[a, e]) {
                        continue;
                    }
                    let Some(rail) = links.rail[a as usize] else {
                        continue;
                    };
                    let conn = links.across(a, e, rail, j + p + k)?;
                    for &ch in hops.chs {
                        b.pin(ch, req.gpus[a as usize], req.gpus[e as usize], conn.clone());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Rail `j`'s ring order on rail channel `c`: odd channels run backwards, so each NIC sends
/// to both neighbours and one channel's start costs overlap the other's transfers.
pub(super) fn rail_order(shape: &ClusterShape, j: usize, c: u32) -> Vec<u32> {
    let mut o = shape.rail(j);
    if c % 2 == 1 {
        o[1..].reverse();
    }
    o
}

/// Reduce-scatter staging of every node's ring (blocks of at most `intra_most`; none on
/// one-GPU nodes) and of every rail's ring (at most `rail_most`), allocated once and reused by
/// every loop of the plan (the builder orders each reuse after the reads of the loop before).
pub(super) type PhaseStaging = (Vec<RsStaging>, Vec<(Vec<u32>, RsStaging)>);

pub(super) fn ring_staging(
    b: &mut PlanBuilder,
    shape: &ClusterShape,
    intra_most: u64,
    rail_most: u64,
) -> PhaseStaging {
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

/// The chunk (elements) of a phase whose blocks are at most `most` long: the request's
/// pipelining chunk, or a [`CHUNKS_PER_BLOCK`]th of the block where that is larger. The
/// request's chunk is sized for n blocks of a flat ring; intra-node phases move blocks N times
/// larger, which the request's chunk would cut into N times more ops than pipelining needs.
pub(super) fn phase_chunk(ctx: &PlannerContext, most: u64) -> u64 {
    ctx.chunk_elems.max(most.div_ceil(CHUNKS_PER_BLOCK)).max(1)
}

/// Pipelining chunks per block of one loop: the vector is planned in loops of `g x N x
/// LOOP_CHUNKS` chunks (all_reduce; `LOOP_CHUNKS` chunks of every block for reduce_scatter),
/// each loop running the three phases on its piece with the same staging, so staging follows
/// the chunk (which the staging budget shrinks), not the message, as NCCL's rings loop over
/// `nranks x chunk` pieces ([NCCL-src]).
pub(super) const LOOP_CHUNKS: u64 = 2;

/// `count` elements cut into loops of at most `per` elements, all of one length where a loop
/// count up to twice the fewest divides `count` (powers of two do), the first ones one longer
/// otherwise. A loop reuses the node-partial slot of the loop two before it and waits for that
/// loop's rail steps on the elements it overwrites; with equal loops each sub-block overwrites
/// the same sub-block, whose reader at a node's rail step depends only on the node's ring
/// position, so the plan's order is the same on every node and its template folds. A shorter
/// last loop would overwrite the start of a sub-block that one node's rail send reads and
/// another's reduction.
pub(super) fn even_pieces(count: u64, per: u64) -> Vec<(u64, u64)> {
    let need = count.div_ceil(per.max(1)).max(1);
    let n = (need..=need.saturating_mul(2))
        .find(|&n| count.is_multiple_of(n))
        .unwrap_or(need);
    split_even(count, n)
}

/// The plan's display name: `rail-hier multi-node ...`.
pub(super) fn label(ctx: &PlannerContext, shape: &ClusterShape) -> String {
    format!(
        "rail-hier {}x{} {}",
        shape.nodes(),
        shape.per_node(),
        links_and_chunk(ctx)
    )
}
