//! A node-aware all_to_all across nodes of like GPUs, in two steps: inside each node every
//! GPU hands the GPU on rail j, over NVLink, its pieces for rail j of every other node; then
//! each GPU sends one message per other node over its own rail-aligned NIC, holding the pieces
//! of all its node's GPUs for its peer there. Pieces between GPUs of one node go directly.
//!
//! NCCL's PXN all_to_all (the baseline) takes the same path, piece by piece: g (N-1) network
//! sends per GPU, each a small message that pays a send's start cost, through one ring of
//! slots per proxy and NIC. Here a GPU makes N-1 network sends of g pieces each, every one
//! landing contiguous in its receiver's output (the sources of one node are consecutive ranks),
//! so the start costs fall g-fold and the sends to all nodes are in flight at once.
//!
//! Staging: each GPU gathers, for the nodes in flight, the g pieces its rail peer there receives
//! from its node, in slots of g parts of `sub` elements reused round the nodes (a slot is
//! refilled after the network send of the node before): `sub` is the whole piece unless the
//! chunk the staging budget leaves is smaller, and then the vector moves in loops of
//! `sub`-element parts of every piece.
//!
//! Every node walks the other nodes by distance (node h + t in round t), so the plan is the same
//! on every node and folds into a template of one domain of hosts.
//!
//! Source: the 2-step node-aware exchange of [Lockhart-2023] (gather to the process that owns
//! the inter-node link, one message per node pair and link), with rails for its NIC-owning
//! processes as NCCL's PXN assigns them ([NCCL-src], `src/graph/paths.cc`).

use relaycc_topo::Topology;

use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::super::baseline_net::links::NetLinks;
use super::super::builder::PlanBuilder;
use super::super::{PlannerContext, direct, links_and_chunk};
use super::shape::ClusterShape;

/// Lane channels: the NVLink gather, the network sends, the pieces within a node.
const CH_GATHER: u32 = 0;
const CH_NET: u32 = 1;
const CH_LOCAL: u32 = 2;

/// Chunks' worth of staging a GPU's gather for one node may hold, per GPU of the node: with the
/// request's chunk (a quarter of a rank's block, [`super::super::pipeline_chunk_elems`]) every
/// piece fits whole, so loops start only where the staging budget shrank the chunk.
const GATHER_CHUNKS: u64 = 4;

/// Most nodes a GPU's gathers run ahead of its network sends: the staging holds their pieces.
const MAX_IN_FLIGHT: u64 = 16;

/// The two-step node-aware all_to_all (module docs). Falls back to [`direct::plan`] off a
/// multi-node shape or for other collectives.
///
/// # Complexity
/// Per GPU and loop: (g-1) (N-1) NVLink copies of one piece part, N-1 network sends (g (N-1)
/// when loops cut the pieces), g-1 local pieces: O(n (g N)) ops in all.
pub fn all_to_all(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let Some(shape) =
        ClusterShape::of(topo, req)?.filter(|_| req.collective == Collective::AllToAll)
    else {
        return direct::plan(topo, req, ctx);
    };
    let (nn, g) = (shape.nodes(), shape.per_node());
    let count = req.count;
    // Staging of GATHER_CHUNKS chunks per node, as slots of g piece parts for the nodes in
    // flight: whole pieces where two nodes' worth fit, and as many nodes as fit, up to
    // MAX_IN_FLIGHT.
    let cap = ctx
        .chunk_elems
        .saturating_mul(GATHER_CHUNKS)
        .saturating_mul(nn as u64);
    let sub = count.min(cap / (2 * g as u64)).max(1);
    let window = (cap / (g as u64 * sub)).clamp(2, MAX_IN_FLIGHT.min(nn as u64 - 1).max(2));
    let mut b = PlanBuilder::new(
        req,
        ctx,
        format!("node-aware 2-step {nn}x{g} {}", links_and_chunk(ctx)),
    );
    // Sources of one node are consecutive ranks in local order: a node's g pieces for one
    // receiver are then one region of its output.
    let node_major = shape
        .hosts
        .iter()
        .enumerate()
        .all(|(h, rs)| rs.iter().enumerate().all(|(i, &r)| r as usize == h * g + i));
    let merged = node_major && sub == count;
    let links = NetLinks::new(topo, &req.gpus, ctx.cache, ctx.limit)?;
    // Laying out a connection costs a path search and writes no op, so the op limit never
    // stops this loop: it reads the clock (a window grown over many hosts of a 1,024-node
    // cluster lays out millions of them).
    let mut laid = 0;
    for (h, rs) in shape.hosts.iter().enumerate() {
        for (j, &a) in rs.iter().enumerate() {
            for t in 1..nn {
                let e = shape.hosts[(h + t) % nn][j];
                if !b.may_touch(&[a, e]) {
                    continue;
                }
                crate::limits::check_deadline(ctx.limit, laid, "laid out on the cluster's NICs")?;
                laid += 1;
                let rail = links.rail[a as usize].unwrap_or(j);
                let conn = links.across(a, e, rail, j + t)?;
                b.pin(CH_NET, req.gpus[a as usize], req.gpus[e as usize], conn);
            }
        }
    }
    // stage[r]: for the node at distance t and local source i, the part of the piece for rail
    // peer (h + t, j) at (((t - 1) mod window) g + i) sub; a slot's reuse waits for the network
    // send of the node `window` before.
    let stage: Vec<BufferRef> = (0..req.nranks() as u32)
        .map(|r| b.scratch(r, window * g as u64 * sub))
        .collect();
    b.set_chunk_elems(count.max(1).saturating_mul(g as u64));
    let mut base = 0;
    while base < count {
        let len = sub.min(count - base);
        for (h, rs) in shape.hosts.iter().enumerate() {
            // Pieces within the node.
            for &a in rs {
                for &d in rs {
                    if !b.may_touch(&[a, d]) {
                        continue;
                    }
                    b.send(
                        Region::new(BufferRef::Input(a), u64::from(d) * count + base, len),
                        Region::new(BufferRef::Output(d), u64::from(a) * count + base, len),
                        CH_LOCAL,
                    )?;
                }
            }
            for t in 1..nn {
                let h2 = (h + t) % nn;
                for (j, &via) in rs.iter().enumerate() {
                    let d = shape.hosts[h2][j];
                    let w = (t as u64 - 1) % window;
                    let slot = |i: usize, l: u64| {
                        Region::new(stage[via as usize], (w * g as u64 + i as u64) * sub, l)
                    };
                    for (i, &a) in rs.iter().enumerate() {
                        if !b.may_touch(&[a, via]) {
                            continue;
                        }
                        let src =
                            Region::new(BufferRef::Input(a), u64::from(d) * count + base, len);
                        b.send(src, slot(i, len), CH_GATHER)?;
                    }
                    if !b.may_touch(&[via, d]) {
                        continue;
                    }
                    if merged {
                        let first = u64::from(rs[0]) * count;
                        b.send(
                            slot(0, g as u64 * count),
                            Region::new(BufferRef::Output(d), first, g as u64 * count),
                            CH_NET,
                        )?;
                    } else {
                        for (i, &a) in rs.iter().enumerate() {
                            b.send(
                                slot(i, len),
                                Region::new(BufferRef::Output(d), u64::from(a) * count + base, len),
                                CH_NET,
                            )?;
                        }
                    }
                }
            }
        }
        base += len;
    }
    Ok(b.finish())
}
