//! all_to_all (and all_to_all_v, gather, scatter, send/recv) across nodes as NCCL runs it: grouped send/recv where every send to another node
//! goes by PXN, rail-aligned.
//!
//! A send from rank `a` to rank `b` on another node moves over NVLink to the member of `a`'s
//! node on `b`'s rail, whose NIC sends it to `b`'s home NIC (a single network hop on `b`'s
//! rail, never across rails); when `a` is itself on that rail it sends directly. So each NIC
//! carries exactly the traffic for its rail's GPUs, and on a rail-optimized fabric the
//! all_to_all crosses the spine only between scalable units. Sends inside a node take NVLink.
//!
//! Source: [NCCL-src], `src/graph/paths.cc` (PXN: a send to a remote rank goes through the
//! local GPU nearest the NIC the remote rank's rail uses, `NCCL_PXN_DISABLE=0` by default since
//! NCCL 2.12) and `src/enqueue.cc` (all_to_all as grouped send/recv).

use crate::error::Result;
use crate::plan::{BufferRef, Plan, Region};
use crate::planner::Ctx;
use crate::planner::builder::Builder;
use crate::request::{Collective, Request};

use super::links::NetLinks;

/// The PXN all_to_all (or any data-movement collective whose pieces are point to point):
/// every expected piece sent over its rail-aligned connection.
pub(super) fn plan(req: &Request, ctx: &Ctx, links: &NetLinks) -> Result<Plan> {
    let mut b = Builder::new(req, ctx, "grouped send/recv pxn");
    let mut pieces = req.expected()?;
    // NCCL schedules a rank's sends by peer distance, `(rank + k) mod n` in round k
    // ([NCCL-src], `src/enqueue.cc`): every rank's sends go out in the same rotated order, so
    // the plan is the same from every host ([`crate::template`]).
    let n = req.nranks().max(1) as u64;
    pieces.sort_by_key(|p| {
        let s = u64::from(p.terms.first().map_or(p.rank, |t| t.0));
        ((u64::from(p.rank) + n - s % n) % n, s)
    });
    for (i, p) in pieces.iter().enumerate() {
        let (s, off) = p.terms[0];
        if s != p.rank {
            let rail = links.rail[p.rank as usize].unwrap_or(0);
            let conn = links.connect(s, p.rank, rail, i)?;
            let (gs, gd) = (links.gpus[s as usize], links.gpus[p.rank as usize]);
            b.pin(0, gs, gd, conn);
        }
        b.send(
            Region::new(BufferRef::Input(s), off, p.len),
            Region::new(BufferRef::Output(p.rank), p.out_offset, p.len),
            0,
        )?;
    }
    Ok(b.finish())
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
