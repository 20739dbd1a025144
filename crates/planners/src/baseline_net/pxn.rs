//! all_to_all (and all_to_all_v, gather, scatter, send/recv) across nodes as NCCL runs it: grouped send/recv where every send to another node
//! goes by PXN, rail-aligned.
//!
//! A send from rank `a` to rank `b` on another node moves over NVLink to the member of `a`'s
//! node on `b`'s rail, whose NIC sends it to `b`'s home NIC (a single network hop on `b`'s
//! rail, never across rails); when `a` is itself on that rail it sends directly. So each NIC
//! carries exactly the traffic for its rail's GPUs, and on a rail-optimized fabric the
//! all_to_all crosses the spine only between scalable units. Sends inside a node take NVLink.
//!
//! The proxy stages what it forwards in one ring of [`PXN_SLOTS`] chunk-sized slots per NIC it
//! posts to, shared by every rank that sends through it (NCCL's PXN proxies post from a bounded
//! buffer per peer NIC, not one per remote rank), so a proxy's staging is [`PXN_SLOTS`] chunks
//! per rail whatever the number of ranks. Chunks take the ring's slots in turn; a chunk is
//! written into a slot only after the slot's previous chunk was forwarded (the builder derives
//! that write-after-read dependency, and the checker proves it). Pieces go in NCCL's grouped
//! send/recv order, step `i` sending from every rank `r` to rank `r + i`, so at each step every
//! proxy forwards for one sender and every node receives from a few, not all, nodes at once.
//!
//! Source: [NCCL-src], `src/graph/paths.cc` (PXN: a send to a remote rank goes through the
//! local GPU nearest the NIC the remote rank's rail uses, `NCCL_PXN_DISABLE=0` by default since
//! NCCL 2.12), `src/enqueue.cc` (all_to_all as grouped send/recv, peers in the order
//! `(rank + i) % nranks`) and `src/transport/net.cc` (a proxied send's buffer is `NCCL_STEPS`
//! slots on the proxy GPU).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::builder::PlanBuilder;
use crate::connect::Legs;
use crate::{Connection, PlannerContext, chunks};
use relaycc_plan::Result;
use relaycc_plan::path::Route;
use relaycc_plan::{BufferRef, Location, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::links::NetLinks;

/// Slots in a PXN proxy's staging ring per NIC: chunks one proxy has in flight between its
/// senders' NVLink copies and its NIC. Four keep the NIC busy while the next chunks arrive
/// (NCCL's proxied buffer has `NCCL_STEPS` = 8 slots of a smaller step, [NCCL-src]; the chunk
/// here is the baseline's, at least 512 KiB, so half as many hold as many bytes).
pub(super) const PXN_SLOTS: u64 = 4;

/// A proxy's staging ring for one NIC: the buffer and the next slot to hand out.
struct ProxyRing {
    buffer: BufferRef,
    next: u64,
}

/// One piece of the plan: `len` elements from rank `src`'s input at `src_offset` to rank
/// `dst`'s output at `out_offset`, the `salt`-th piece in NCCL's order.
struct Piece {
    salt: usize,
    src: u32,
    src_offset: u64,
    dst: u32,
    out_offset: u64,
    len: u64,
}

/// The PXN all_to_all (or any data-movement collective whose pieces are point to point):
/// every expected piece sent over its rail-aligned connection, relayed pieces through their
/// proxy's shared ring.
pub(super) fn plan(req: &Request, ctx: &PlannerContext, links: &NetLinks) -> Result<Plan> {
    let mut b = PlanBuilder::new(req, ctx, "grouped send/recv pxn");
    let n = req.nranks() as u32;
    let mut rings: BTreeMap<(u32, usize), ProxyRing> = BTreeMap::new();
    // NCCL schedules a rank's sends by peer distance, `(rank + k) mod n` in round k
    // ([NCCL-src], `src/enqueue.cc`): every rank's sends go out in the same rotated order, so
    // the plan is the same from every host ([`crate::template`]).
    if req.collective == Collective::AllToAll {
        // Round k, sender s: the order the general case sorts into, without its n^2 pieces
        // (a windowed build keeps a few of them).
        req.validate()?;
        let c = req.count;
        if c == 0 {
            return Ok(b.finish());
        }
        let slot = ctx.chunk_elems.min(c).max(1);
        // A step sample builds the first rounds only (`PlannerContext::sample_steps`). (Rounds spread
        // evenly over all of them would alias with the node size: every 8th round of a DGX
        // cluster pairs GPUs on one rail, which need no proxy.)
        let rounds = u32::try_from(b.sample_steps(n as usize)).unwrap_or(n);
        for k in 0..rounds {
            for s in 0..n {
                let d = (s + k) % n;
                let p = Piece {
                    salt: k as usize * n as usize + s as usize,
                    src: s,
                    src_offset: u64::from(d) * c,
                    dst: d,
                    out_offset: u64::from(s) * c,
                    len: c,
                };
                send_piece(&mut b, ctx, links, &mut rings, slot, &p)?;
            }
        }
        return Ok(b.finish());
    }
    let mut pieces = req.expected()?;
    pieces.sort_by_key(|p| {
        let s = p.terms[0].0;
        ((p.rank + n - s) % n.max(1), s, p.rank, p.out_offset)
    });
    // A slot holds a chunk, or the largest piece where pieces are smaller.
    let largest = pieces.iter().map(|p| p.len).max().unwrap_or(1);
    let slot = ctx.chunk_elems.min(largest).max(1);
    for (i, p) in pieces.iter().enumerate() {
        let (s, off) = p.terms[0];
        let piece = Piece {
            salt: i,
            src: s,
            src_offset: off,
            dst: p.rank,
            out_offset: p.out_offset,
            len: p.len,
        };
        send_piece(&mut b, ctx, links, &mut rings, slot, &piece)?;
    }
    Ok(b.finish())
}

/// Send piece `p` over its rail-aligned connection, a relayed one through its proxy's ring of
/// `slot`-element slots.
fn send_piece(
    b: &mut PlanBuilder,
    ctx: &PlannerContext,
    links: &NetLinks,
    rings: &mut BTreeMap<(u32, usize), ProxyRing>,
    slot: u64,
    p: &Piece,
) -> Result<()> {
    let (s, d) = (p.src, p.dst);
    let src = Region::new(BufferRef::Input(s), p.src_offset, p.len);
    let dst = Region::new(BufferRef::Output(d), p.out_offset, p.len);
    // Under a window, a piece whose ends' hosts hold no window device and whose regions
    // overlap no window range moves nothing the build keeps (its proxy sits on the sender's
    // host), so its connection is not even looked up. Its proxy's ring then skips the slots
    // it would take: that ring is on a host outside the window, whose ops the fold drops and
    // whose slots no kept op touches.
    if !b.may_send(src, dst, [s, d]) {
        return Ok(());
    }
    if s == d {
        return b.send(src, dst, 0);
    }
    let rail = links.rail[d as usize].unwrap_or(0);
    let (gs, gd) = (links.gpus[s as usize], links.gpus[d as usize]);
    let across = links.node_of[s as usize] != links.node_of[d as usize];
    // The connection depends on the ranks, the rail and the salt only: the cache keeps it
    // for every pass of a windowed build and every build of a staging fit.
    let legs = ctx.cache.legs((gs, gd, rail as u32, p.salt as u64), || {
        let conn = links.connect(s, d, rail, p.salt)?;
        Ok(match across.then(|| at_proxy(&conn, gs)).flatten() {
            Some((first, last, via)) => Legs::Relayed { first, last, via },
            None => Legs::Whole(conn),
        })
    })?;
    let (first, last, gp) = match legs {
        Legs::Whole(conn) => return b.send_over(src, dst, 0, &conn),
        Legs::Relayed { first, last, via } => (first, last, via),
    };
    let ring = rings.entry((gp, rail)).or_insert_with(|| ProxyRing {
        buffer: b.w.plan.add_scratch(Location::Gpu(gp), PXN_SLOTS * slot),
        next: 0,
    });
    for (rel, len) in chunks(p.len, slot) {
        let at = Region::new(ring.buffer, (ring.next % PXN_SLOTS) * slot, len);
        ring.next += 1;
        b.send_over(
            Region::new(src.buffer, src.offset + rel, len),
            at,
            0,
            &first,
        )?;
        b.send_over(at, Region::new(dst.buffer, dst.offset + rel, len), 0, &last)?;
    }
    Ok(())
}

/// A relayed connection cut at its proxy: the hops up to the proxy GPU, the proxy's hop to
/// the receiver, and the proxy; None unless it is one route whose last hop leaves a GPU other
/// than the sender's.
fn at_proxy(conn: &Connection, from: u32) -> Option<(Arc<Connection>, Arc<Connection>, u32)> {
    let [route] = conn.routes.as_slice() else {
        return None;
    };
    let (last, first) = route.hops.split_last()?;
    match last.from {
        Location::Gpu(gp) if gp != from && !first.is_empty() => Some((
            Arc::new(Connection::single(Route {
                hops: first.to_vec(),
            })),
            Arc::new(Connection::single(Route {
                hops: vec![last.clone()],
            })),
            gp,
        )),
        _ => None,
    }
}

/// True for the collectives NCCL runs as grouped send/recv.
pub(super) fn serves(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllToAll
            | Collective::AllToAllV
            | Collective::Gather
            | Collective::Scatter
            | Collective::SendRecv
    )
}
