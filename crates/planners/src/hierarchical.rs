//! The hierarchical all_reduce of [Temucin-2021]: group the ranks by CPU socket, reduce inside
//! each socket to a leader, let the leaders exchange and reduce their partials, broadcast the
//! result back inside each socket; the three steps are pipelined chunk by chunk.
//!
//! With [`super::LinkMode::Multipath`] connections the intra-socket steps split each copy over
//! NVLink and host-staged paths at once, as [Temucin-2021] does with several streams. Each step has
//! its own lanes, so a leader's reduction of chunk k+1 never waits behind the exchange of chunk
//! k. The leader's final reduction is the last one of every element (it finalizes Avg); the
//! broadcast copies finalized data only.

use relaycc_topo::Topology;

use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::builder::PlanBuilder;
use super::{PlannerContext, RECV_SLOTS, chunks, direct, name};

/// Lane channels of the three steps (intra-socket reduce, leader exchange, broadcast back).
const CH_INTRA: u32 = 1;
const CH_LEADERS: u32 = 2;
const CH_BACK: u32 = 3;

/// Ranks grouped by the CPU socket their GPU attaches to, groups in order of their first rank;
/// the first rank of a group is its leader.
pub fn socket_groups(topo: &Topology, req: &Request) -> Result<Vec<Vec<u32>>> {
    let mut keys: Vec<Option<usize>> = Vec::new();
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for (r, &g) in req.gpus.iter().enumerate() {
        let key = topo.attached_cpu(topo.gpu(g)?).map(|c| c.index());
        match keys.iter().position(|k| *k == key) {
            Some(i) => groups[i].push(r as u32),
            None => {
                keys.push(key);
                groups.push(vec![r as u32]);
            }
        }
    }
    Ok(groups)
}

/// Hierarchical all_reduce (socket groups, leaders, broadcast back), pipelined.
///
/// # Arguments
/// - `topo`: the masked topology (sockets come from it);
/// - `req`: an all_reduce (other collectives fall back to [`direct::plan`]);
/// - `ctx`: connections, link mode, chunk size (`channels` is ignored).
///
/// # Returns
/// A complete plan, or [`relaycc_plan::RouteError::NoRoute`] when a member cannot reach its leader
/// or two leaders cannot reach each other.
///
/// # Complexity
/// Per chunk: (n - groups) intra copies, groups x (groups - 1) leader copies, (n - groups)
/// broadcast copies, each lowered to routes x hops ops; 2 x groups reductions.
///
/// Source: [Temucin-2021], "Hierarchical Allreduce with Multi-Path Copy": 1. intra-socket
/// multi-path reduce, 2. inter-socket leaders exchange and reduce, 3. intra-socket multi-path
/// broadcast; steps 1-3 pipelined.
pub fn all_reduce(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    if req.nranks() < 2 || req.collective != Collective::AllReduce {
        return direct::plan(topo, req, ctx);
    }
    let groups = socket_groups(topo, req)?;
    let ng = groups.len() as u64;
    let chunk = ctx.chunk_elems.max(1);
    let slot = chunk.min(req.count);
    let mut b = PlanBuilder::new(req, ctx, name("hierarchical", ctx));
    if slot == 0 {
        return Ok(b.finish());
    }
    let mut intra = Vec::new();
    let mut partial = Vec::new();
    let mut inter = Vec::new();
    for g in &groups {
        let l = g[0];
        let others = g.len() as u64 - 1;
        intra.push((others > 0).then(|| b.scratch(l, others * RECV_SLOTS * slot)));
        partial.push((others > 0 && ng > 1).then(|| b.scratch(l, RECV_SLOTS * slot)));
        inter.push((ng > 1).then(|| b.scratch(l, (ng - 1) * RECV_SLOTS * slot)));
    }
    for (k, (rel, len)) in chunks(req.count, chunk).enumerate() {
        let s = k as u64 % RECV_SLOTS;
        let input = |r: u32| Region::new(BufferRef::Input(r), rel, len);
        let output = |r: u32| Region::new(BufferRef::Output(r), rel, len);
        // 1. Reduce inside each socket to its leader.
        let mut part = Vec::with_capacity(groups.len());
        for (gi, g) in groups.iter().enumerate() {
            let l = g[0];
            let Some(ring) = intra[gi] else {
                part.push(input(l));
                continue;
            };
            let others = g.len() as u64 - 1;
            let mut srcs = vec![input(l)];
            for (j, &m) in g[1..].iter().enumerate() {
                let rv = Region::new(ring, (s * others + j as u64) * slot, len);
                b.send(input(m), rv, CH_INTRA)?;
                srcs.push(rv);
            }
            let dst = match partial[gi] {
                Some(p) => Region::new(p, s * slot, len),
                None => output(l),
            };
            b.reduce(srcs, dst, ng == 1, CH_INTRA)?;
            part.push(dst);
        }
        // 2. Leaders exchange partials and reduce.
        if ng > 1 {
            let mut srcs: Vec<Vec<Region>> = part.iter().map(|p| vec![*p]).collect();
            for (gi, from) in part.iter().enumerate() {
                for hi in 0..groups.len() {
                    let Some(ring) = inter[hi].filter(|_| hi != gi) else {
                        continue;
                    };
                    let j = if gi < hi { gi } else { gi - 1 } as u64;
                    let rv = Region::new(ring, (s * (ng - 1) + j) * slot, len);
                    b.send(*from, rv, CH_LEADERS)?;
                    srcs[hi].push(rv);
                }
            }
            for (g, srcs) in groups.iter().zip(srcs) {
                b.reduce(srcs, output(g[0]), true, CH_LEADERS)?;
            }
        }
        // 3. Broadcast back inside each socket.
        for g in &groups {
            for &m in &g[1..] {
                b.send(output(g[0]), output(m), CH_BACK)?;
            }
        }
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConnCache, LinkMode};
    use relaycc_plan::path::RelayPolicy;
    use relaycc_plan::{DType, ReduceOp};
    use relaycc_plan::{check, check_routes};

    #[test]
    fn ac922_groups_by_socket_and_checks() {
        let topo = relaycc_topo::preset("ac922").unwrap();
        let req = Request::new(Collective::AllReduce, vec![0, 1, 2, 3], 1001, DType::F32)
            .with_op(ReduceOp::Avg);
        assert_eq!(
            socket_groups(&topo, &req).unwrap(),
            vec![vec![0, 1], vec![2, 3]]
        );
        let cache = ConnCache::new(&topo, &req.gpus, &RelayPolicy::Any);
        for mode in [LinkMode::Single, LinkMode::Multipath] {
            let ctx = PlannerContext::new(&cache, mode, 100, 1);
            let p = all_reduce(&topo, &req, &ctx).unwrap();
            check(&p).unwrap();
            check_routes(&p, &topo).unwrap();
        }
    }
}
