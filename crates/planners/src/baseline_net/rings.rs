//! NCCL's rail-aligned rings across nodes: one ring per channel, each channel on its own rail.
//!
//! Channel `c` takes rail `r` (the `c`-th rail that node 0's members have). In every node the
//! ring enters at the member whose home NIC is on rail `r`, visits the node's other members
//! (each step to the fastest unvisited one), and leaves from the member nearest that NIC (on a
//! DGX H100 the GPU sharing its PCIe switch), whose send crosses the network from the NIC of
//! rail `r` to the next node's NIC of rail `r` (PXN when the leaving GPU's path to the NIC
//! crosses the CPU). So every channel uses one NIC per node in both directions, the channels
//! together use every NIC, and on a rail-optimized fabric the ring's network hops stay on the
//! rail's leaf within a scalable unit. Built from the rail structure directly: O(nodes x
//! members^2) connection look-ups per channel, none between nodes but the ring's own.
//!
//! What a channel does on its ring (the all_reduce, all_gather and reduce_scatter passes, in
//! loops over staging of its own) is the flat rings' channel body ([`crate::ring`]):
//! the rail rings differ only in their orders, their pinned hops and in building each channel
//! on a thread of its own.
//!
//! Source: [NCCL-src], `src/graph/search.cc` (rings per channel entering and leaving each node
//! by a NIC, one NIC per channel, `crossNic` off), `src/graph/paths.cc` (PXN), and NCCL's
//! ring all_reduce, all_gather and reduce_scatter kernels.

use std::sync::Arc;

use crate::builder::PlanBuilder;
use crate::channels::build_channels;
use crate::connect::Connection;
use crate::pipelined_tree::{UP_CHANNEL, broadcast_pass, reduce_pass};
use crate::ring::{
    CH_LOCAL, all_gather_channel, all_reduce_channel, pin_hops, reduce_scatter_channel,
};
use crate::{PlannerContext, split_even};
use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::links::NetLinks;

/// One channel's ring: rank positions and the connection of each hop (position `i` to `i+1`).
pub(super) struct RailRing {
    /// Ranks in ring order.
    pub order: Vec<u32>,
    /// The connection from `order[i]` to `order[i + 1]` (the last closes the ring).
    pub hops: Vec<Arc<Connection>>,
}

impl RailRing {
    /// The ring's bandwidth: its slowest hop, GB/s.
    pub fn gbps(&self) -> f64 {
        self.hops
            .iter()
            .map(|c| c.gbps())
            .fold(f64::INFINITY, f64::min)
    }
}

/// The rails channels run on: those of node 0's members, in rail order (at least one).
pub(super) fn channel_rails(links: &NetLinks) -> Vec<usize> {
    let mut rails: Vec<usize> = links.nodes[0]
        .ranks
        .iter()
        .filter_map(|&r| links.rail[r as usize])
        .collect();
    rails.sort_unstable();
    rails.dedup();
    if rails.is_empty() {
        rails.push(0);
    }
    rails
}

/// The order of node `k`'s members for a channel on `rail`: enter at the member of that rail,
/// fastest unvisited member next, leave from the member nearest the rail's NIC.
pub(super) fn node_chain(links: &NetLinks, k: usize, rail: usize, c: usize) -> Result<Vec<u32>> {
    let ranks = &links.nodes[k].ranks;
    let entry = ranks
        .iter()
        .copied()
        .find(|&r| links.rail[r as usize] == Some(rail))
        .unwrap_or(ranks[c % ranks.len()]);
    if ranks.len() == 1 {
        return Ok(vec![entry]);
    }
    // The exit: the member nearest the rail's NIC without crossing a CPU (GPU Direct RDMA),
    // the first such in rank order after the entry.
    let at = ranks.iter().position(|&r| r == entry).unwrap_or(0);
    let exit = (1..ranks.len())
        .map(|i| ranks[(at + i) % ranks.len()])
        .min_by_key(|&r| links.nic_reach(r, rail).unwrap_or((true, usize::MAX)))
        .unwrap_or(entry);
    // Members by position in the node's ranks, rated by the node's kept rates.
    let m = ranks.len();
    let rates = links.local_rates(k);
    let pos = |r: u32| ranks.iter().position(|&x| x == r).unwrap_or(0);
    let mut left: Vec<usize> = (0..m)
        .filter(|&i| ranks[i] != entry && ranks[i] != exit)
        .collect();
    let mut chain = vec![entry];
    let mut from = pos(entry);
    while !left.is_empty() {
        let mut best = (0, f64::NEG_INFINITY);
        for (i, &to) in left.iter().enumerate() {
            let mut g = rates[from * m + to];
            if g.is_nan() {
                // No connection: the error says between which GPUs.
                g = links.local(ranks[from], ranks[to])?.gbps();
            }
            if g > best.1 {
                best = (i, g);
            }
        }
        from = left.remove(best.0);
        chain.push(ranks[from]);
    }
    chain.push(exit);
    Ok(chain)
}

/// The rail-aligned rings of `links`, one per channel rail.
pub(super) fn rail_rings(
    links: &NetLinks,
    limit: Option<&crate::limits::Limit>,
) -> Result<Vec<RailRing>> {
    let rails = channel_rails(links);
    let mut rings = Vec::with_capacity(rails.len());
    // Every channel visits every node: on a thousand racks of 72 GPUs and 72 rails, millions
    // of steps before the first op, so the build's deadline is read as they go.
    let mut step = 0usize;
    for (c, &rail) in rails.iter().enumerate() {
        let mut order = Vec::with_capacity(links.gpus.len());
        for k in 0..links.nodes.len() {
            step += 1;
            crate::limits::check_deadline(limit, step, "laid out on NCCL's rings")?;
            order.extend(node_chain(links, k, rail, c)?);
        }
        let n = order.len();
        let mut hops = Vec::with_capacity(n);
        for i in 0..n {
            step += 1;
            crate::limits::check_deadline(limit, step, "laid out on NCCL's rings")?;
            let (a, b) = (order[i], order[(i + 1) % n]);
            hops.push(links.connect(a, b, rail, c + i)?);
        }
        rings.push(RailRing { order, hops });
    }
    Ok(rings)
}

/// Pin ring `c`'s hop connections in the builder.
fn pin(b: &mut PlanBuilder, links: &NetLinks, c: u32, ring: &RailRing) {
    pin_hops(b, &links.gpus, c, &ring.order, &ring.hops);
}

/// A plan of one channel per rail ring, named `ring x<channels> rail-aligned`: channel `c` is
/// pinned to ring `c`'s hops and built by `part(builder, c, ring order, share)`, its share the
/// `c`-th even `(offset, length)` of `count` elements. Each channel touches its own share on
/// lanes and staging of its own, so the channels are built at once ([`build_channels`]).
fn on_rings(
    req: &Request,
    ctx: &PlannerContext,
    links: &NetLinks,
    rings: &[RailRing],
    count: u64,
    part: impl Fn(&mut PlanBuilder, u32, &[u32], (u64, u64)) -> Result<()> + Sync,
) -> Result<Plan> {
    let splits = split_even(count, rings.len() as u64);
    build_channels(req, ctx, &label("ring", rings), splits.len(), |b, c| {
        pin(b, links, c as u32, &rings[c]);
        part(b, c as u32, &rings[c].order, splits[c])
    })
}

/// Ring all_reduce over the rail rings: each channel reduce-scatters then all-gathers its
/// share of the buffer.
pub(super) fn all_reduce(
    req: &Request,
    ctx: &PlannerContext,
    links: &NetLinks,
    rings: &[RailRing],
) -> Result<Plan> {
    let chunk = ctx.chunk_elems.max(1);
    on_rings(req, ctx, links, rings, req.count, |b, ch, ord, share| {
        all_reduce_channel(b, ord, ch, share, chunk)
    })
}

/// Ring all_gather over the rail rings: every block travels n-1 steps around each channel.
pub(super) fn all_gather(
    req: &Request,
    ctx: &PlannerContext,
    links: &NetLinks,
    rings: &[RailRing],
) -> Result<Plan> {
    let n = req.nranks();
    let chunk = ctx.chunk_elems.max(1);
    let count = req.count;
    // Each channel copies its own slice of every rank's block in place first, as NCCL's ring
    // kernel does in its first step, on a local lane of its own: channels then touch disjoint
    // elements and lanes.
    on_rings(req, ctx, links, rings, count, |b, ch, ord, (lo, len)| {
        if len == 0 {
            return Ok(());
        }
        for r in 0..n as u32 {
            b.send(
                Region::new(BufferRef::Input(r), lo, len),
                Region::new(BufferRef::Output(r), u64::from(r) * count + lo, len),
                CH_LOCAL + ch,
            )?;
        }
        let share = |r: u32| (lo, u64::from(r) * count + lo, len);
        all_gather_channel(b, ord, ch, chunk, &share)
    })
}

/// Ring reduce_scatter over the rail rings: n-1 reduce steps around each channel.
pub(super) fn reduce_scatter(
    req: &Request,
    ctx: &PlannerContext,
    links: &NetLinks,
    rings: &[RailRing],
) -> Result<Plan> {
    let chunk = ctx.chunk_elems.max(1);
    let count = req.count;
    on_rings(req, ctx, links, rings, count, |b, ch, ord, share| {
        reduce_scatter_channel(b, ord, ch, share, count, chunk)
    })
}

/// Broadcast or reduce over the rail rings, as NCCL's ring broadcast and reduce kernels run
/// them: each channel carries its own slice of the buffer along its ring as a pipelined chain,
/// from the root in ring order (broadcast), or into the root, each rank adding its input to
/// the partial it received and passing the sum to its ring successor (reduce). Every hop is
/// the ring's own connection, so on a cluster no pair of ranks is searched beyond the ring's
/// (a flat ring order over thousands of ranks would rate every pair).
pub(super) fn rooted(
    req: &Request,
    ctx: &PlannerContext,
    links: &NetLinks,
    rings: &[RailRing],
) -> Result<Plan> {
    let n = req.nranks();
    let chunk = ctx.chunk_elems.max(1);
    let root = req.root;
    let splits = split_even(req.count, rings.len() as u64);
    build_channels(
        req,
        ctx,
        &label("ring chain", rings),
        splits.len(),
        |b, c| {
            let (lo, len) = splits[c];
            if len == 0 {
                return Ok(());
            }
            let ring = &rings[c].order;
            let at = ring.iter().position(|&r| r == root).unwrap_or(0);
            let ch = c as u32;
            if req.collective == Collective::Broadcast {
                pin(b, links, ch, &rings[c]);
                // The root's own copy on a local lane of the channel's: channels stay disjoint.
                b.send(
                    Region::new(BufferRef::Input(root), lo, len),
                    Region::new(BufferRef::Output(root), lo, len),
                    CH_LOCAL + ch,
                )?;
                let ord: Vec<u32> = (0..n).map(|i| ring[(at + i) % n]).collect();
                broadcast_pass(b, &ord, 1, ch, lo, len, chunk, BufferRef::Input(root))
            } else {
                // The reduce pass sends on its own channels; the root first, then its ring
                // predecessors, so every partial moves to its ring successor.
                pin(b, links, ch + UP_CHANNEL, &rings[c]);
                let ord: Vec<u32> = (0..n).map(|i| ring[(at + n - i) % n]).collect();
                reduce_pass(b, &ord, 1, ch, lo, len, chunk)
            }
        },
    )
}

/// `ring x<channels> rail-aligned`.
fn label(algo: &str, rings: &[RailRing]) -> String {
    format!("{algo} x{} rail-aligned", rings.len())
}

/// True for the collectives the rail rings serve.
pub(super) fn serves(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllReduce
            | Collective::AllGather
            | Collective::ReduceScatter
            | Collective::Broadcast
            | Collective::Reduce
    )
}
