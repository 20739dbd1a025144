//! Plan generators for the node-aware strategies: an irregular exchange (send_recv,
//! all_gather_v, all_to_all_v) on a cluster topology, planned as Standard, 3-Step, 2-Step,
//! Split+MD or Split+DD, staged through host or device-aware ([Lockhart-2023 §2.3, §3, §4,
//! Table 5]).
//!
//! Common to all: a rank's data to itself is a local copy; data between ranks of one node moves
//! directly (device-aware) or through the ranks' host staging buffers (staged); only the
//! inter-node data follows the strategy. Staged plans copy each rank's outgoing input to pinned
//! memory of its socket first and its incoming output back last ([Lockhart-2023, Eq. 4.5]).
//!
//! A message larger than the staging budget is moved in rounds of one chunk of every piece,
//! each round staging in one of two reused slot sets ([`crate::staging::Slots`]).

use std::collections::BTreeMap;

use relaycc_topo::Topology;

use super::lowering::{NodeAwarePlanBuilder, Side};
use super::messages::{Piece, aggregates, group_by, pieces, ranks_of_nodes, rounds, split_chunk};
use super::params::ModelParams;
use super::strategy::{ClusterCounts, Staging, Strategy, exchange_only};
use crate::staging::{DEFAULT_STAGING_BUDGET_BYTES, fit, min_chunk_elems};
use relaycc_plan::Request;
use relaycc_plan::{Location, Plan, Region};
use relaycc_plan::{Result, RouteError};

/// The plan of one node-aware strategy for an irregular exchange across nodes.
///
/// # Arguments
/// - `topo`: a cluster topology (`cluster:<N>x<preset>:<fabric>`), possibly masked; a single
///   machine works too (every piece is then on-node).
/// - `req`: a send_recv, all_gather_v or all_to_all_v request; ranks sit on their GPUs' hosts.
/// - `strategy`, `staging`: one of the pairs of [Lockhart-2023, Table 5].
///
/// # Returns
/// A plan that passes [`relaycc_plan::check`] and [`relaycc_plan::check_routes`]; an error for other
/// collectives, for split strategies asked device-aware (Table 5 has none), for GPUs missing
/// from the topology, or when no route joins two memories.
///
/// # Complexity
/// O(p log p + p * h) for p pieces and h = the cost of one hop search (O(E log V)); split
/// strategies add O(c * (V^2 + E)) for c distinct (socket, NIC, NIC, socket) routes.
///
/// # Example
/// ```
/// use relaycc_planners::nodeaware::{Staging, Strategy, node_aware_plan};
/// use relaycc_plan::{Request, check, check_routes};
///
/// let topo = relaycc_topo::preset("cluster:2xdgx1-v100:ib-edr").unwrap();
/// let req = Request::point_to_point(0, 8, 1 << 20); // GPU0 on node 0 to GPU8 on node 1
/// let plan = node_aware_plan(&topo, &req, Strategy::SplitMd, Staging::Host).unwrap();
/// check(&plan).unwrap();
/// check_routes(&plan, &topo).unwrap();
/// ```
///
/// Source: [Lockhart-2023 §2.3] (strategies), §3 (staging), §4.2 (split across a node's
/// processes).
pub fn node_aware_plan(
    topo: &Topology,
    req: &Request,
    strategy: Strategy,
    staging: Staging,
) -> Result<Plan> {
    node_aware_plan_within(topo, req, strategy, staging, DEFAULT_STAGING_BUDGET_BYTES)
}

/// [`node_aware_plan`] with its staging fitted to `budget` bytes per device: the request's
/// pieces are cut into rounds of at most one chunk each, every round stages in one of two
/// reused slot sets, and [`crate::staging::fit`] shrinks the chunk until every device's slots
/// fit (a single round when the whole message fits).
///
/// # Errors
/// As [`node_aware_plan`]; [`RouteError::StagingBudget`] when even the smallest chunk
/// ([`min_chunk_elems`]) does not fit.
///
/// # Complexity
/// A few builds of O(rounds x p) pieces (see [`crate::staging::fit`]).
pub fn node_aware_plan_within(
    topo: &Topology,
    req: &Request,
    strategy: Strategy,
    staging: Staging,
    budget: u64,
) -> Result<Plan> {
    exchange_only(req)?;
    if !strategy.supports(staging) {
        return Err(RouteError::BadRequest(format!(
            "{strategy} is defined staged through host only ([Lockhart-2023, Table 5]), not {staging}"
        )));
    }
    let all = pieces(req)?;
    let longest = all.iter().map(|p| p.len).max().unwrap_or(0).max(1);
    fit(longest, min_chunk_elems(req), budget, None, |chunk| {
        in_rounds(topo, req, &all, strategy, staging, chunk)
    })
}

/// The plan of `strategy` and `staging` for `all` (the pieces of `req`) cut into rounds: round
/// `k` moves elements `[k * chunk, (k + 1) * chunk)` of every piece, in the slot set of parity
/// `k % 2` (so staging is two rounds' worth, whatever the message).
pub(super) fn in_rounds(
    topo: &Topology,
    req: &Request,
    all: &[Piece],
    strategy: Strategy,
    staging: Staging,
    chunk: u64,
) -> Result<Plan> {
    let name = format!("node-aware {strategy} {staging}");
    let mut b = NodeAwarePlanBuilder::new(topo, Plan::new(req.clone(), name))?;
    for (k, slice) in rounds(all, chunk, 1) {
        b.begin_round(k);
        round(&mut b, &slice, strategy, staging)?;
        b.end_round()?;
    }
    Ok(b.finish())
}

/// One round of a node-aware plan: every piece of `pieces` (a slice of each of the request's
/// pieces) moved by `strategy`, staged in this round's slots.
fn round(
    b: &mut NodeAwarePlanBuilder,
    pieces: &[Piece],
    strategy: Strategy,
    staging: Staging,
) -> Result<()> {
    let staged = staging == Staging::Host;
    let inter =
        |b: &NodeAwarePlanBuilder, p: &Piece| b.node[p.src as usize] != b.node[p.dst as usize];
    // Split+DD copies inter-node data between GPU and the sending processes with duplicate
    // device pointers, so those pieces skip the per-rank staging buffers.
    let via_stage = |b: &NodeAwarePlanBuilder, p: &Piece| {
        staged && p.src != p.dst && !(strategy == Strategy::SplitDd && inter(b, p))
    };
    let mut needed: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for p in pieces.iter().filter(|p| via_stage(b, p)) {
        needed.entry(p.src).or_default().push((p.src_off, p.len));
    }
    for (r, spans) in &needed {
        b.stage_out(*r, spans)?;
    }
    let mut remote = Vec::new();
    for p in pieces {
        if inter(b, p) {
            remote.push(*p);
            continue;
        }
        // On-node (or to itself): one move from the send side to the receive side.
        let s = side_of(b, p, via_stage(b, p));
        let r = b.recv_side(p.dst, p.dst_off, p.len, via_stage(b, p))?;
        deliver(b, p, s, r, 0)?;
    }
    match strategy {
        Strategy::Standard => {
            for p in &remote {
                let s = side_of(b, p, staged);
                let r = b.recv_side(p.dst, p.dst_off, p.len, staged)?;
                deliver(b, p, s, r, 0)?;
            }
        }
        Strategy::ThreeStep | Strategy::TwoStep => {
            let ranks = ranks_of_nodes(&b.node);
            let by_source = strategy == Strategy::TwoStep;
            for m in aggregates(&remote, &b.node, &ranks, by_source) {
                aggregate(b, &m.pieces, m.sender, m.receiver, staged)?;
            }
        }
        Strategy::SplitMd | Strategy::SplitDd => {
            split(b, &remote, strategy == Strategy::SplitMd)?;
        }
    }
    Ok(())
}

/// Every plan Table 5 of [Lockhart-2023] defines for `req` on `topo` (eight), in
/// [`Strategy::combinations`] order.
///
/// # Arguments
/// As [`node_aware_plan`].
///
/// # Returns
/// (strategy, staging, plan) triples; the first error stops it.
///
/// # Complexity
/// Eight times [`node_aware_plan`].
///
/// Source: [Lockhart-2023, Table 5].
pub fn node_aware_candidates(
    topo: &Topology,
    req: &Request,
) -> Result<Vec<(Strategy, Staging, Plan)>> {
    Strategy::combinations()
        .into_iter()
        .map(|(s, st)| node_aware_plan(topo, req, s, st).map(|p| (s, st, p)))
        .collect()
}

/// The send side of a piece: host staging when `staged`, else the GPU input.
fn side_of(b: &NodeAwarePlanBuilder, p: &Piece, staged: bool) -> Side {
    if staged {
        b.send_side(p.src, p.src_off, p.len)
    } else {
        Side {
            loc: b.gpu(p.src),
            region: Region::new(relaycc_plan::BufferRef::Input(p.src), p.src_off, p.len),
            deps: Vec::new(),
        }
    }
}

/// Move a piece's data from `s` to `r` and record the arrival when `r` is host staging.
fn deliver(b: &mut NodeAwarePlanBuilder, p: &Piece, s: Side, r: Side, channel: u32) -> Result<()> {
    let ops = b.mv(s.loc, s.region, r.loc, r.region, &s.deps, channel)?;
    if matches!(r.loc, Location::Host(_)) {
        b.received(p.dst, p.dst_off, r.region.offset, p.len, ops);
    }
    Ok(())
}

/// 3-Step and 2-Step: pack `group` at `sender` (skipped for a single piece already there), send
/// one inter-node message to `receiver`, which unpacks to the destinations (skipped likewise).
fn aggregate(
    b: &mut NodeAwarePlanBuilder,
    group: &[Piece],
    sender: u32,
    receiver: u32,
    staged: bool,
) -> Result<()> {
    let total: u64 = group.iter().map(|p| p.len).sum();
    if total == 0 {
        return Ok(());
    }
    let home =
        |b: &NodeAwarePlanBuilder, r: u32| if staged { b.host[r as usize] } else { b.gpu(r) };
    let (sloc, rloc) = (home(b, sender), home(b, receiver));
    let single = if let [p] = group { Some(*p) } else { None };
    let msg_src = match single {
        Some(p) if home(b, p.src) == sloc => side_of(b, &p, staged),
        _ => {
            let g = b.slot(sloc, total);
            let mut deps = Vec::new();
            let mut off = 0;
            for p in group {
                let s = side_of(b, p, staged);
                deps.extend(b.mv(
                    s.loc,
                    s.region,
                    sloc,
                    Region::new(g, off, p.len),
                    &s.deps,
                    0,
                )?);
                off += p.len;
            }
            Side {
                loc: sloc,
                region: Region::new(g, 0, total),
                deps,
            }
        }
    };
    if let Some(p) = single.filter(|p| home(b, p.dst) == rloc) {
        let r = b.recv_side(p.dst, p.dst_off, p.len, staged)?;
        return deliver(b, &p, msg_src, r, 0);
    }
    let rbuf = b.slot(rloc, total);
    let arrived = b.mv(
        msg_src.loc,
        msg_src.region,
        rloc,
        Region::new(rbuf, 0, total),
        &msg_src.deps,
        0,
    )?;
    let mut off = 0;
    for p in group {
        let from = Side {
            loc: rloc,
            region: Region::new(rbuf, off, p.len),
            deps: arrived.clone(),
        };
        let r = b.recv_side(p.dst, p.dst_off, p.len, staged)?;
        deliver(b, p, from, r, 0)?;
        off += p.len;
    }
    Ok(())
}

/// Split+MD / Split+DD ([Lockhart-2023 §2.3.3], Algorithm 1; §4.2): each node pair's data is cut into
/// messages of at most the message cap (raised to volume / processes when that many messages
/// would outnumber the node's processes), spread over the node's NICs and the sockets that
/// own them. MD gathers each message from the ranks' host staging (extra on-node messages);
/// DD copies it straight from the GPUs (duplicate device pointers) and back to them.
fn split(b: &mut NodeAwarePlanBuilder, remote: &[Piece], md: bool) -> Result<()> {
    let size = b.w.plan.dtype.size().max(1);
    let cap = (ModelParams::LASSEN.split_cap_bytes / size).max(1);
    let ppn = u64::from(ClusterCounts::of(b.topo).procs_per_node.max(1));
    let mut node_volume: BTreeMap<u32, u64> = BTreeMap::new();
    for p in remote {
        *node_volume.entry(b.node[p.src as usize]).or_default() += p.len;
    }
    let groups = group_by(remote, |p| (b.node[p.src as usize], b.node[p.dst as usize]));
    for ((na, nb), group) in groups {
        let total: u64 = group.iter().map(|p| p.len).sum();
        if total == 0 {
            continue;
        }
        let vol = node_volume.get(&na).copied().unwrap_or(total);
        let chunk = split_chunk(total, vol, cap, ppn);
        let (nics_a, nics_b) = match (b.nics.get(&na).cloned(), b.nics.get(&nb).cloned()) {
            (Some(x), Some(y)) if !x.is_empty() && !y.is_empty() => (x, y),
            _ => {
                return Err(RouteError::NoRoute {
                    what: format!("node {na} -> node {nb}"),
                    why: "a node has no NIC for the split strategies".into(),
                });
            }
        };
        // Piece offsets inside the pair's stream.
        let mut starts = Vec::with_capacity(group.len());
        let mut acc = 0;
        for p in &group {
            starts.push(acc);
            acc += p.len;
        }
        let mut lo = 0;
        let mut j = 0u32;
        while lo < total {
            let hi = (lo + chunk).min(total);
            let nic_a = nics_a[(j as usize + nb as usize) % nics_a.len()];
            let nic_b = nics_b[(j as usize + na as usize) % nics_b.len()];
            let host_of = |nic| {
                b.topo
                    .attached_cpu(nic)
                    .map(|c| Location::Host(c.index() as u32))
            };
            let (Some(ha), Some(hb)) = (host_of(nic_a), host_of(nic_b)) else {
                return Err(RouteError::NoRoute {
                    what: format!("node {na} -> node {nb}"),
                    why: "a NIC attaches to no CPU socket".into(),
                });
            };
            let send_buf = b.slot(ha, hi - lo);
            let recv_buf = b.slot(hb, hi - lo);
            let mut deps = Vec::new();
            // (piece, its stream offset, elements of it before the chunk, elements inside).
            let overlap: Vec<(Piece, u64, u64, u64)> = group
                .iter()
                .zip(&starts)
                .filter_map(|(p, &s)| {
                    let (a, z) = (s.max(lo), (s + p.len).min(hi));
                    (a < z).then(|| (*p, s, a - s, z - a))
                })
                .collect();
            for &(p, start, within, n) in &overlap {
                let s = side_of(b, &p, md);
                let src = Region::new(s.region.buffer, s.region.offset + within, n);
                let dst = Region::new(send_buf, start + within - lo, n);
                deps.extend(b.mv(s.loc, src, ha, dst, &s.deps, j)?);
            }
            let route = b.nic_route(ha, nic_a, nic_b, hb)?;
            let n = hi - lo;
            let arrived = b.send(
                &route,
                Region::new(send_buf, 0, n),
                Region::new(recv_buf, 0, n),
                &deps,
                j,
            )?;
            for &(p, start, within, n) in &overlap {
                let off = start + within - lo;
                let from = Side {
                    loc: hb,
                    region: Region::new(recv_buf, off, n),
                    deps: arrived.clone(),
                };
                let r = b.recv_side(p.dst, p.dst_off + within, n, md)?;
                let ops = b.mv(from.loc, from.region, r.loc, r.region, &from.deps, j)?;
                if md {
                    b.received(p.dst, p.dst_off + within, r.region.offset, n, ops);
                }
            }
            lo = hi;
            j += 1;
        }
    }
    Ok(())
}
