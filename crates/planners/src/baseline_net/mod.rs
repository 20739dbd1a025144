//! The NCCL-like baseline across nodes: what NCCL does when a communicator spans several
//! machines, built from the cluster's rail structure.
//!
//! | collective | plan |
//! |---|---|
//! | all_reduce | the tuner's choice ([`tuner`]) between rail-aligned rings (`rings.rs`) and the double binary tree (`double_tree.rs`) |
//! | all_gather, reduce_scatter | rail-aligned rings, one channel per rail |
//! | all_to_all(_v), gather, scatter, send/recv | grouped send/recv, every inter-node send by PXN on the receiver's rail (`pxn.rs`) |
//!
//! The other collectives keep the single-node baseline's plans. Every plan here is built from
//! each GPU's home NIC and the fabric's switches (`links.rs`); no connection is searched
//! between nodes except the hops the plan uses, so a 1,024-GPU baseline costs
//! O(GPUs x members per node) look-ups. NVLink SHARP across nodes (NCCL's NVLS tree) is not
//! modelled: NCCL enables NVLS across nodes only with CollNet, and the NVLS tree's inter-node
//! part is the tree here.

mod double_tree;
pub(crate) mod links;
mod pxn;
mod rings;
pub mod tuner;

use relaycc_topo::Topology;

use relaycc_plan::Plan;
use relaycc_plan::Result;
use relaycc_plan::{Collective, Request};

use super::PlannerContext;
use links::NetLinks;

/// True when the members of `req` sit on more than one node of `topo`.
pub fn spans_nodes(topo: &Topology, req: &Request) -> bool {
    let mut hosts = req
        .gpus
        .iter()
        .filter_map(|&g| topo.gpu(g).ok().map(|id| topo.node(id).host));
    let first = hosts.next();
    hosts.any(|h| Some(h) != first)
}

/// The multi-node baseline plan of `req`, or None when its members are on one node or its
/// collective keeps the single-node baseline.
///
/// # Arguments
/// - `topo`: the masked topology;
/// - `req`: the request;
/// - `ctx`: NCCL's link rule, the baseline's chunk, the connection cache of the call;
/// - `algo`: the all_reduce algorithm forced (as `NCCL_ALGO` forces it), or `None` for the
///   tuner's choice.
///
/// # Complexity
/// O(nodes x members per node^2) connection look-ups for the rings, O(ops) to build.
pub fn plan(
    topo: &Topology,
    req: &Request,
    ctx: &PlannerContext,
    algo: Option<tuner::Algo>,
) -> Result<Option<Plan>> {
    if req.nranks() < 2 || !spans_nodes(topo, req) {
        return Ok(None);
    }
    let served = rings::serves(req.collective) || pxn::serves(req.collective);
    if !served {
        return Ok(None);
    }
    let links = NetLinks::new(topo, &req.gpus, ctx.cache, ctx.limit)?;
    let mut plan = match req.collective {
        c if pxn::serves(c) => pxn::plan(req, ctx, &links)?,
        Collective::AllReduce => {
            let rings = rings::rail_rings(&links, ctx.limit)?;
            match algo.unwrap_or_else(|| tuner::choose(topo, req, &links, &rings)) {
                tuner::Algo::Ring => rings::all_reduce(req, ctx, &links, &rings)?,
                // The tree's shape differs between hosts, so a template build of it would
                // fail at the fold after building its whole window: refuse it at once.
                tuner::Algo::Tree if ctx.window.is_some() => {
                    return Err(relaycc_plan::RouteError::NotSymmetric(
                        "NCCL's double binary tree differs between hosts (each node's place \
                         in the trees), so it is the same on no period of hosts"
                            .into(),
                    ));
                }
                tuner::Algo::Tree => double_tree::all_reduce(req, ctx, &links, &rings)?,
            }
        }
        Collective::AllGather => {
            let rings = rings::rail_rings(&links, ctx.limit)?;
            rings::all_gather(req, ctx, &links, &rings)?
        }
        Collective::Broadcast | Collective::Reduce => {
            let rings = rings::rail_rings(&links, ctx.limit)?;
            rings::rooted(req, ctx, &links, &rings)?
        }
        _ => {
            let rings = rings::rail_rings(&links, ctx.limit)?;
            rings::reduce_scatter(req, ctx, &links, &rings)?
        }
    };
    plan.algorithm = format!("nccl-like {}", plan.algorithm);
    Ok(Some(plan))
}

/// The channels of NCCL's rail-aligned rings over `req`'s members (one per rail of node 0's
/// members), or `None` where the members sit on one node.
pub fn ring_channels(topo: &Topology, req: &Request) -> Result<Option<usize>> {
    if req.nranks() < 2 || !spans_nodes(topo, req) {
        return Ok(None);
    }
    let cache = super::ConnCache::new(topo, &req.gpus, &relaycc_plan::path::RelayPolicy::Members);
    let links = NetLinks::new(topo, &req.gpus, &cache, None)?;
    Ok(Some(rings::channel_rails(&links).len()))
}

/// The all_reduce algorithm NCCL's tuner chooses for `req` across nodes, or `None` where its
/// members sit on one node or it is no all_reduce. Lays out the rail rings (no plan is built).
pub fn tuner_choice(
    topo: &Topology,
    req: &Request,
    limit: Option<&crate::limits::Limit>,
) -> Result<Option<tuner::Algo>> {
    if req.collective != Collective::AllReduce || req.nranks() < 2 || !spans_nodes(topo, req) {
        return Ok(None);
    }
    let cache = super::ConnCache::new(topo, &req.gpus, &relaycc_plan::path::RelayPolicy::Members);
    let links = NetLinks::new(topo, &req.gpus, &cache, limit)?;
    let rings = rings::rail_rings(&links, limit)?;
    Ok(Some(tuner::choose(topo, req, &links, &rings)))
}

#[cfg(test)]
mod tests;
