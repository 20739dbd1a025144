//! Pipelined trees and chains: broadcast, reduce, and all_reduce (reduce up, then broadcast
//! down), in chunks so every level of the tree works at once.
//!
//! The tree is laid over the ring order (good connections between neighbours) rotated to start
//! at the root: a chain has node i's parent at i-1, a binary tree at (i-1)/2. Reduction goes
//! leaves first: a node adds its children's partials (copied into a staging ring at the node)
//! to its input and sends the sum to its parent; the root's reduction is the last one and
//! finalizes Avg. The broadcast copies each chunk from parent to child; relaycc connections
//! relay or split the tree edges the machine lacks.

use relaycc_topo::Topology;

use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::builder::PlanBuilder;
use super::ring_order::ring_order;
use super::{PlannerContext, RECV_SLOTS, chunks, direct, name, split_even};

/// Lane channel of the reduce-up pass, apart from the broadcast's (channel c uses
/// `c + UP_CHANNEL`), so that a node's reductions never queue behind its forwarding.
pub(crate) const UP_CHANNEL: u32 = 1 << 8;

fn parent(i: usize, arity: usize) -> usize {
    (i - 1) / arity
}

/// Broadcast pass over `ord` (root first): chunk by chunk, every node copies to its children.
#[allow(clippy::too_many_arguments)]
pub(crate) fn broadcast_pass(
    b: &mut PlanBuilder,
    ord: &[u32],
    arity: usize,
    ch: u32,
    lo: u64,
    len: u64,
    chunk: u64,
    root_src: BufferRef,
) -> Result<()> {
    for (rel, l) in chunks(len, chunk) {
        for i in 1..ord.len() {
            let p = parent(i, arity);
            let src = if p == 0 {
                Region::new(root_src, lo + rel, l)
            } else {
                Region::new(BufferRef::Output(ord[p]), lo + rel, l)
            };
            b.send(src, Region::new(BufferRef::Output(ord[i]), lo + rel, l), ch)?;
        }
    }
    Ok(())
}

/// Reduce pass over `ord` (root first) into the root's output, chunk by chunk, leaves first.
pub(crate) fn reduce_pass(
    b: &mut PlanBuilder,
    ord: &[u32],
    arity: usize,
    ch: u32,
    lo: u64,
    len: u64,
    chunk: u64,
) -> Result<()> {
    let n = ord.len();
    let slot = chunk.min(len);
    if slot == 0 {
        return Ok(());
    }
    let kids = |i: usize| (i * arity + 1..(i * arity + arity + 1).min(n)).collect::<Vec<_>>();
    let recv: Vec<Option<BufferRef>> = (0..n)
        .map(|i| {
            let k = kids(i).len() as u64;
            (k > 0).then(|| b.scratch(ord[i], k * RECV_SLOTS * slot))
        })
        .collect();
    let acc: Vec<Option<BufferRef>> = (0..n)
        .map(|i| (i > 0 && !kids(i).is_empty()).then(|| b.scratch(ord[i], RECV_SLOTS * slot)))
        .collect();
    for (k, (rel, l)) in chunks(len, chunk).enumerate() {
        let s = k as u64 % RECV_SLOTS;
        for i in (0..n).rev() {
            let input = Region::new(BufferRef::Input(ord[i]), lo + rel, l);
            let mut partial = input;
            if let Some(rb) = recv[i] {
                let mut srcs = vec![input];
                let nk = kids(i).len() as u64;
                for j in 0..nk {
                    srcs.push(Region::new(rb, (s * nk + j) * slot, l));
                }
                partial = match acc[i] {
                    Some(a) => Region::new(a, s * slot, l),
                    None => Region::new(BufferRef::Output(ord[i]), lo + rel, l),
                };
                b.reduce(srcs, partial, i == 0, ch + UP_CHANNEL)?;
            }
            if i > 0 {
                let p = parent(i, arity);
                let j = (i - (p * arity + 1)) as u64;
                let Some(rb) = recv[p] else { continue };
                let nk = kids(p).len() as u64;
                let dst = Region::new(rb, (s * nk + j) * slot, l);
                b.send(partial, dst, ch + UP_CHANNEL)?;
            }
        }
    }
    Ok(())
}

/// A pipelined tree of fan-out `arity` over `ord` (root first) for broadcast, reduce or
/// all_reduce; odd channels reverse the non-root part of the order.
pub(crate) fn pipelined(
    topo: &Topology,
    req: &Request,
    ctx: &PlannerContext,
    ord: &[u32],
    arity: usize,
    label: &str,
) -> Result<Plan> {
    let c = req.collective;
    let n = req.nranks();
    if n < 2
        || ord.len() != n
        || !matches!(
            c,
            Collective::Broadcast | Collective::Reduce | Collective::AllReduce
        )
    {
        return direct::plan(topo, req, ctx);
    }
    let mut b = PlanBuilder::new(req, ctx, name(label, ctx));
    let root = ord[0];
    let chunk = ctx.chunk_elems.max(1);
    let channels = ctx.channels.max(1);
    for (ch, (lo, len)) in split_even(req.count, u64::from(channels))
        .into_iter()
        .enumerate()
    {
        let mut o = ord.to_vec();
        if ch % 2 == 1 {
            o[1..].reverse();
        }
        let ch = ch as u32;
        match c {
            Collective::Broadcast => {
                b.send(
                    Region::new(BufferRef::Input(root), lo, len),
                    Region::new(BufferRef::Output(root), lo, len),
                    ch,
                )?;
                broadcast_pass(
                    &mut b,
                    &o,
                    arity,
                    ch,
                    lo,
                    len,
                    chunk,
                    BufferRef::Input(root),
                )?;
            }
            Collective::Reduce => reduce_pass(&mut b, &o, arity, ch, lo, len, chunk)?,
            _ => {
                reduce_pass(&mut b, &o, arity, ch, lo, len, chunk)?;
                broadcast_pass(
                    &mut b,
                    &o,
                    arity,
                    ch,
                    lo,
                    len,
                    chunk,
                    BufferRef::Output(root),
                )?;
            }
        }
    }
    Ok(b.finish())
}

/// A pipelined chain over `ord` (root first): broadcast, reduce or all_reduce.
pub(crate) fn chain_plan(
    topo: &Topology,
    req: &Request,
    ctx: &PlannerContext,
    ord: &[u32],
    label: &str,
) -> Result<Plan> {
    pipelined(topo, req, ctx, ord, 1, label)
}

fn binary(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let order = ring_order(ctx, req, false)?;
    let root = if req.collective == Collective::AllReduce {
        0
    } else {
        req.root
    };
    let at = order.iter().position(|r| *r == root).unwrap_or(0);
    let ord: Vec<u32> = order[at..].iter().chain(&order[..at]).copied().collect();
    pipelined(topo, req, ctx, &ord, 2, "binary tree")
}

/// Pipelined binary-tree broadcast from the root.
///
/// # Arguments
/// - `topo`: the masked topology; `req`: a broadcast; `ctx`: connections, mode, chunk,
///   channels.
///
/// # Returns
/// A complete plan, or [`relaycc_plan::RouteError::NoRoute`] when a tree edge has no route.
///
/// # Complexity
/// (n-1) x chunks transfers, each lowered to routes x hops copies.
///
/// Source: NCCL's pipelined trees; relayed and split tree edges from [Ranganath-2019] and
/// [Temucin-2021].
pub fn broadcast(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    binary(topo, req, ctx)
}

/// Pipelined binary-tree reduce into the root; arguments and returns as [`broadcast`].
pub fn reduce(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    binary(topo, req, ctx)
}

/// Pipelined binary-tree all_reduce: reduce up to rank 0, broadcast back down, every chunk of
/// both passes in flight at once; arguments and returns as [`broadcast`].
pub fn all_reduce(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    binary(topo, req, ctx)
}
