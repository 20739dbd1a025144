//! Direct all-pairs: every rank sends straight to every rank that needs its data, in one step.
//!
//! Serves every collective: data-movement collectives (all_to_all(_v), all_gather(_v),
//! gather, scatter, broadcast, send_recv) move each expected piece from its source rank to its
//! destination; reducing collectives (all_reduce, reduce, reduce_scatter) copy every remote
//! contribution into a staging ring at the rank that owns the result and reduce there, chunk by
//! chunk, with `finalize` on that one reduction. Latency-optimal (one step); it moves
//! (n-1) x S into each rank for all_reduce, so it wins for small messages only.

use relaycc_topo::Topology;

use relaycc_plan::Request;
use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};

use super::builder::PlanBuilder;
use super::{PlannerContext, RECV_SLOTS, chunks, name};

/// Remote terms of a piece, the staging ring at its owner, and the ring's slot length.
type Staging = (Vec<(u32, u64)>, Option<BufferRef>, u64);

/// Plan `req` by direct all-pairs transfers.
///
/// # Arguments
/// - `_topo`: the masked topology (routes come from `ctx.cache`);
/// - `req`: any collective;
/// - `ctx`: connections, link mode and chunk size (`channels` is ignored).
///
/// # Returns
/// A complete plan, or [`relaycc_plan::RouteError::NoRoute`] when a pair has no route.
///
/// # Complexity
/// One transfer per expected piece (n^2 for all-pairs collectives), each lowered to
/// chunks x routes x hops copies; reductions add one op per chunk per owner.
///
/// Source: NCCL's grouped send/recv (all_to_all) and the latency-optimal one-step all_reduce.
pub fn plan(_topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let mut b = PlanBuilder::new(req, ctx, name("direct", ctx));
    let pieces = req.expected()?;
    if !req.collective.reduces() {
        for p in &pieces {
            let (s, off) = p.terms[0];
            b.send(
                Region::new(BufferRef::Input(s), off, p.len),
                Region::new(BufferRef::Output(p.rank), p.out_offset, p.len),
                0,
            )?;
        }
        return Ok(b.finish());
    }
    let chunk = ctx.chunk_elems.max(1);
    // Per piece: the remote terms and a staging ring at the owner for them.
    let mut rings: Vec<Staging> = Vec::new();
    for p in &pieces {
        let others: Vec<(u32, u64)> = p.terms.iter().copied().filter(|t| t.0 != p.rank).collect();
        let slot = chunk.min(p.len);
        let ring = if others.is_empty() {
            None
        } else {
            Some(b.scratch(p.rank, others.len() as u64 * RECV_SLOTS * slot))
        };
        rings.push((others, ring, slot));
    }
    let most = pieces
        .iter()
        .map(|p| p.len.div_ceil(chunk))
        .max()
        .unwrap_or(0);
    for k in 0..most {
        // All sends of chunk k first, then the reductions, so that an in-place reduction never
        // overwrites an input another rank still has to send.
        let mut pending = Vec::new();
        for (p, (others, ring, slot)) in pieces.iter().zip(&rings) {
            let Some((rel, len)) = chunks(p.len, chunk).nth(k as usize) else {
                continue;
            };
            let mut srcs = Vec::with_capacity(p.terms.len());
            if let Some(&(_, off)) = p.terms.iter().find(|t| t.0 == p.rank) {
                srcs.push(Region::new(BufferRef::Input(p.rank), off + rel, len));
            }
            if let Some(ring) = *ring {
                let base = (k % RECV_SLOTS) * others.len() as u64;
                for (j, &(s, off)) in others.iter().enumerate() {
                    let rv = Region::new(ring, (base + j as u64) * slot, len);
                    b.send(Region::new(BufferRef::Input(s), off + rel, len), rv, 0)?;
                    srcs.push(rv);
                }
            }
            pending.push((
                srcs,
                Region::new(BufferRef::Output(p.rank), p.out_offset + rel, len),
            ));
        }
        for (srcs, dst) in pending {
            b.reduce(srcs, dst, true, 0)?;
        }
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConnCache, LinkMode};
    use relaycc_plan::Collective;
    use relaycc_plan::path::RelayPolicy;
    use relaycc_plan::{DType, ReduceOp};
    use relaycc_plan::{check, check_routes};

    #[test]
    fn one_rank_and_irregular_counts() {
        let topo = relaycc_topo::preset("pcie-4gpu").unwrap();
        let cache = ConnCache::new(&topo, &[2], &RelayPolicy::None);
        let ctx = PlannerContext::new(&cache, LinkMode::Single, 4, 1);
        // One rank: Avg divides by one, in a single local reduction per chunk.
        let req =
            Request::new(Collective::AllReduce, vec![2], 9, DType::F32).with_op(ReduceOp::Avg);
        let p = plan(&topo, &req, &ctx).unwrap();
        check(&p).unwrap();
        assert!(p.ops.iter().all(|o| o.edges.is_empty()));
        // all_to_all_v with empty rows and columns moves only what the matrix asks.
        let gpus = vec![0, 1, 3];
        let cache = ConnCache::new(&topo, &gpus, &RelayPolicy::None);
        let ctx = PlannerContext::new(&cache, LinkMode::Single, 4, 1);
        let mut req = Request::new(Collective::AllToAllV, gpus, 0, DType::U8);
        req.matrix = vec![vec![0, 5, 0], vec![0, 0, 0], vec![2, 0, 1]];
        let p = plan(&topo, &req, &ctx).unwrap();
        check(&p).unwrap();
        check_routes(&p, &topo).unwrap();
        let moved: u64 = p
            .ops
            .iter()
            .filter(|o| !o.edges.is_empty())
            .map(|o| o.len())
            .sum();
        assert!(moved >= 7);
    }

    #[test]
    fn every_collective_directly() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let gpus = vec![0, 2, 5, 7];
        for c in Collective::ALL {
            let mut req = Request::new(c, gpus.clone(), 37, DType::F32).with_root(2);
            req.counts = vec![3, 0, 40, 1];
            req.matrix = vec![vec![1, 0, 2, 3]; 4];
            req.transfers = vec![relaycc_plan::Transfer {
                src: 0,
                dst: 3,
                count: 11,
            }];
            if c.reduces() {
                req = req.with_op(ReduceOp::Avg);
            }
            let cache = ConnCache::new(&topo, &gpus, &RelayPolicy::Any);
            for mode in [LinkMode::Nccl, LinkMode::Single, LinkMode::Multipath] {
                let ctx = PlannerContext::new(&cache, mode, 8, 1);
                let p = plan(&topo, &req, &ctx).unwrap();
                check(&p).unwrap_or_else(|e| panic!("{c} {mode:?}: {e}"));
                check_routes(&p, &topo).unwrap();
            }
        }
    }
}
