//! Bounds on collective performance, as algbw (GB/s): no plan on the masked machine can beat
//! them, so every prediction is reported beside its bound.
//!
//! The point-to-point bound is the max-flow ([`crate::p2p::p2p_bound_gbps`]). For collectives
//! the standard per-GPU ingress/egress bound: the bytes rank r must receive cannot arrive
//! faster than `in_r`, the sum of the rates of the usable links into its GPU from nodes the job
//! may use (switches, sockets, member GPUs, GPUs the relay policy admits), and what it must
//! send cannot leave faster than `out_r`. With S the nccl-tests size (`Request::size_bytes`),
//! c the per-rank count in bytes and n ranks, the time T is at least:
//!
//! | collective | T >= |
//! |---|---|
//! | all_reduce | 2(n-1)/n x S / min_r in_r; (n-1)/n x S / min_r in_r where the members' NVSwitch reduces (NVLS) |
//! | all_gather | (n-1)/n x S / min_r in_r, and c / min_r out_r |
//! | reduce_scatter | (n-1)/n x S / min_r out_r, and c / min_r in_r |
//! | all_gather_v | max_r (total - c_r) / in_r, and max_r c_r / out_r |
//! | reduce_scatter_v | max_r (total - c_r) / out_r, and max_r c_r / in_r |
//! | broadcast | S / min_{r != root} in_r, S / out_root, S / min_r maxflow(root, r) |
//! | reduce | S / min_{r != root} out_r, S / in_root, S / min_r maxflow(r, root) |
//! | all_to_all(_v) | max_r max(recv_r / in_r, send_r / out_r) ((n-1)/n x S / min(in, out) when regular) |
//! | gather / scatter | (n-1)c / in_root (out_root), c / out_r (in_r) |
//! | send_recv | max_r max(recv_r / in_r, send_r / out_r), max over transfers of bytes / maxflow |
//!
//! **Cut bounds.** A set X of topology nodes holding k of the n members (0 < k < n) is a cut:
//! every byte from a member inside to one outside crosses a link leaving X, so the time is at
//! least the bytes that must leave X over `out_X`, the summed rates of the usable links leaving
//! X, and the bytes that must enter X over `in_X` (the max-flow/min-cut theorem
//! [FordFulkerson-1956]: no flow exceeds a cut's capacity; with several flows, their sum does
//! not). The sets are every host (machine; network switches are outside all hosts), and
//! inside it every socket and every PCIe switch with the devices below it, so on a cluster the
//! NICs bound what leaves a node, and on a PCIe server the inter-socket link bounds what
//! crosses sockets. An NVSwitch port, whose planes the simulator pools, counts once at its
//! whole rate. With c the per-rank count in bytes, the bytes that must leave (enter) X:
//!
//! | collective | leave X | enter X |
//! |---|---|---|
//! | all_reduce | S | S |
//! | all_gather | k c | (n-k) c |
//! | all_gather_v | sum of c_r inside | sum of c_r outside |
//! | reduce_scatter | (n-k) c (partial sums of the outside shards) | k c |
//! | reduce_scatter_v | sum of c_r outside | sum of c_r inside |
//! | all_to_all | k (n-k) c | k (n-k) c |
//! | all_to_all_v, send_recv | bytes from members inside to members outside | the reverse |
//! | broadcast, scatter | S, (n-k) c when X holds the root | S, k c otherwise |
//! | reduce, gather | S, k c when X lacks the root | S, (n-k) c when it holds it |
//!
//! A reduction or a copy outside X cannot shrink these: every output element outside X
//! depends on an input inside X, so at least one element-sized message about it leaves X.
//! For all_reduce over N >= 2 hosts that are all the topology's hosts, each element also
//! needs 2(N-1) messages between hosts (directed gossip needs 2N-2 calls, [Harary-1974]; each
//! message is received once, and sent once where no switch between hosts multicasts), so
//! T >= 2(N-1) S / sum_h in_h (and / sum_h out_h): 2(N-1)/N x S per host on like hosts, as a
//! bandwidth-optimal all_reduce sends [Patarasuk-2009]. The cuts cost O(links x depth) for the
//! capacities, O(regions) for the regular collectives, O(n^2 x depth) for all_to_all_v.
//!
//! The bound is S / T for the largest T of all. Rates are exactly the directed links
//! `relaycc topo show --format json` prints, so anyone can recompute it.

use relaycc_topo::{NodeKind, Topology};

use relaycc_plan::Result;
use relaycc_plan::path::{RelayPolicy, max_flow_routes};
use relaycc_plan::{Collective, Request};

/// Per topology node (by index): whether the job may use it, a member GPU or one the relay
/// policy admits, or any node that is no GPU. Built once per bound, so that scans over every
/// link ask in O(1) rather than searching the member list for each link.
fn job_nodes(topo: &Topology, members: &[u32], relay: &RelayPolicy) -> Vec<bool> {
    let mut member = vec![false; topo.gpu_count() as usize];
    for &g in members {
        if let Some(m) = member.get_mut(g as usize) {
            *m = true;
        }
    }
    topo.nodes()
        .map(|(_, node)| match &node.kind {
            NodeKind::Gpu(info) => {
                let m = member.get(info.index as usize).copied().unwrap_or(false);
                m || relay.allows_known(topo, info.index, m)
            }
            _ => true,
        })
        .collect()
}

/// Rates into and out of each member GPU (in the order of `members`) over usable links to
/// nodes the job may use (`usable_node`, from [`job_nodes`]), GB/s: one pass over each
/// member's own links.
fn port_rates(
    topo: &Topology,
    members: &[u32],
    usable_node: &[bool],
) -> Result<(Vec<f64>, Vec<f64>)> {
    use petgraph::Direction;
    use petgraph::visit::EdgeRef;
    let graph = topo.graph();
    let mut inbound = Vec::with_capacity(members.len());
    let mut outbound = Vec::with_capacity(members.len());
    for &g in members {
        let me = topo.gpu(g)?;
        let sum = |dir: Direction| -> f64 {
            graph
                .edges_directed(me, dir)
                .filter(|e| {
                    let other = if dir == Direction::Incoming {
                        e.source()
                    } else {
                        e.target()
                    };
                    usable_node[other.index()] && topo.link_usable(e.id())
                })
                .map(|e| e.weight().gbps)
                .sum()
        };
        inbound.push(sum(Direction::Incoming));
        outbound.push(sum(Direction::Outgoing));
    }
    Ok((inbound, outbound))
}

/// The bound on a collective's algbw, GB/s (see the module docs for the formulas).
///
/// # Arguments
/// - `topo`: the masked topology;
/// - `req`: the request (any collective);
/// - `relay`: which GPUs may relay (their links count towards a rank's ingress and egress,
///   and max-flows may pass them).
///
/// # Returns
/// The algbw bound in GB/s; infinity when nothing has to move (one rank, zero bytes); 0 when a
/// rank that must receive or send has no usable link.
///
/// # Complexity
/// O(n E) for the port rates, plus up to n max-flows (Dinic's, O(V^2 E)) for broadcast, reduce
/// and send_recv, plus O(E x depth) for the cuts (O(n^2 x depth) for all_to_all_v).
///
/// Source: the standard ingress/egress argument (every byte a rank needs crosses its links);
/// the max-flow/min-cut bound for rooted one-to-all traffic as ARCHITECTURE.md asks; the cut
/// bounds of hosts, sockets and PCIe switches (module docs, [FordFulkerson-1956]).
pub fn collective_bound_gbps(topo: &Topology, req: &Request, relay: &RelayPolicy) -> Result<f64> {
    req.validate()?;
    let n = req.nranks();
    let g = &req.gpus;
    let es = req.dtype.size() as f64;
    let size = req.size_bytes() as f64;
    let usable_node = job_nodes(topo, g, relay);
    let (inr, outr) = port_rates(topo, g, &usable_node)?;
    // Time lower bounds in bytes / (GB/s); `need(bytes, rate)` is 0 when nothing moves.
    let need = |bytes: f64, gbps: f64| {
        if bytes <= 0.0 {
            0.0
        } else if gbps <= 0.0 {
            f64::INFINITY
        } else {
            bytes / gbps
        }
    };
    let flow = |a: u32, b: u32| -> Result<f64> {
        let allowed = |x: u32| x != a && x != b && relay.allows(topo, g, x);
        Ok(max_flow_routes(topo, a, b, &allowed)?.0)
    };
    let nf = n as f64;
    let c = req.count as f64 * es;
    let root = req.root as usize;
    let mut t: f64 = 0.0;
    if n > 1 {
        match req.collective {
            Collective::AllReduce => {
                // Without a reducing switch every rank receives the others' shares of its
                // shard and the reduced other shards, 2(n-1)/n of the vector. Where the
                // NVSwitch reduces the request's op and type (NVLS), the sums arrive reduced:
                // (n-1)/n of it.
                let nvls = relaycc_plan::nvls_support::nvls_switch_for(topo, req).is_some();
                let share = if nvls { 1.0 } else { 2.0 };
                for x in &inr {
                    t = t.max(need(share * (nf - 1.0) / nf * size, *x));
                }
            }
            Collective::AllGather | Collective::ReduceScatter => {
                // all_gather: the others' blocks in, one's own out. reduce_scatter mirrors it:
                // one's contributions to the others' shards out, one shard's sum (reduced
                // anywhere) in.
                let (much, one) = if req.collective == Collective::AllGather {
                    (&inr, &outr)
                } else {
                    (&outr, &inr)
                };
                for r in 0..n {
                    t = t.max(need((nf - 1.0) / nf * size, much[r]));
                    t = t.max(need(c, one[r]));
                }
            }
            Collective::AllGatherV | Collective::ReduceScatterV => {
                // all_gather_v: the others' blocks in, one's own out. reduce_scatter_v mirrors
                // it: one's contributions to the others' shards out, one shard's sum in.
                let (much, one) = if req.collective == Collective::AllGatherV {
                    (&inr, &outr)
                } else {
                    (&outr, &inr)
                };
                let total: u64 = req.counts.iter().sum();
                for r in 0..n {
                    let mine = req.counts[r] as f64 * es;
                    t = t.max(need(total as f64 * es - mine, much[r]));
                    t = t.max(need(mine, one[r]));
                }
            }
            Collective::Broadcast | Collective::Reduce => {
                let down = req.collective == Collective::Broadcast;
                for r in (0..n).filter(|r| *r != root) {
                    t = t.max(need(size, if down { inr[r] } else { outr[r] }));
                    let f = if down {
                        flow(g[root], g[r])?
                    } else {
                        flow(g[r], g[root])?
                    };
                    t = t.max(need(size, f));
                }
                t = t.max(need(size, if down { outr[root] } else { inr[root] }));
            }
            Collective::Gather | Collective::Scatter => {
                let gather = req.collective == Collective::Gather;
                for r in (0..n).filter(|r| *r != root) {
                    t = t.max(need(c, if gather { outr[r] } else { inr[r] }));
                }
                let at_root = (nf - 1.0) * c;
                t = t.max(need(at_root, if gather { inr[root] } else { outr[root] }));
            }
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => {
                let mut send = vec![0.0f64; n];
                let mut recv = vec![0.0f64; n];
                let mut add = |s: usize, d: usize, elems: u64| {
                    if s != d {
                        send[s] += elems as f64 * es;
                        recv[d] += elems as f64 * es;
                    }
                };
                match req.collective {
                    Collective::AllToAll => {
                        (0..n).for_each(|s| (0..n).for_each(|d| add(s, d, req.count)))
                    }
                    Collective::AllToAllV => {
                        (0..n).for_each(|s| (0..n).for_each(|d| add(s, d, req.matrix[s][d])))
                    }
                    _ => req
                        .transfers
                        .iter()
                        .for_each(|x| add(x.src as usize, x.dst as usize, x.count)),
                }
                for r in 0..n {
                    t = t.max(need(recv[r], inr[r])).max(need(send[r], outr[r]));
                }
                if req.collective == Collective::SendRecv {
                    for x in req
                        .transfers
                        .iter()
                        .filter(|x| x.src != x.dst && x.count > 0)
                    {
                        t = t.max(need(
                            x.count as f64 * es,
                            flow(g[x.src as usize], g[x.dst as usize])?,
                        ));
                    }
                }
            }
        }
    }
    if n > 1 {
        t = t.max(cut_time(topo, req, &usable_node)?);
    }
    Ok(if t <= 0.0 { f64::INFINITY } else { size / t })
}

/// The node sets the cut bounds use (see the module docs): every host, and under it every
/// socket and PCIe switch with the devices below it. A node's regions, innermost first; a
/// network switch belongs to none.
struct Regions {
    /// Per node index: the regions holding the node.
    chain: Vec<Vec<u32>>,
    /// Per region: true for a whole host.
    host: Vec<bool>,
}

impl Regions {
    fn new(topo: &Topology) -> Regions {
        let nodes = topo.graph().node_count();
        // Region of each node that roots a PCIe subtree (a socket, host bridge or switch).
        let mut root: Vec<Option<u32>> = vec![None; nodes];
        let mut host = Vec::new();
        let mut mark = |id: relaycc_topo::NodeId, root: &mut Vec<Option<u32>>| {
            if root[id.index()].is_none() {
                root[id.index()] = Some(host.len() as u32);
                host.push(false);
            }
        };
        for (id, node) in topo.nodes() {
            if node.cpu().is_some() {
                mark(id, &mut root);
            }
            if let Some(p) = topo.pcie_parent(id) {
                mark(p, &mut root);
            }
        }
        let mut hosts: Vec<Option<u32>> = Vec::new();
        let mut chain = vec![Vec::new(); nodes];
        for (id, node) in topo.nodes() {
            if matches!(node.kind, NodeKind::NetSwitch) {
                continue;
            }
            let c = &mut chain[id.index()];
            let mut cur = id;
            loop {
                c.extend(root[cur.index()]);
                match topo.pcie_parent(cur) {
                    Some(p) => cur = p,
                    None => break,
                }
            }
            // A GPU on a C2C link (no PCIe parent) sits in its CPU's socket.
            if topo.node(cur).cpu().is_none()
                && let Some(cpu) = topo.attached_cpu(cur)
            {
                c.extend(root[cpu.index()]);
            }
            let h = node.host as usize;
            if hosts.len() <= h {
                hosts.resize(h + 1, None);
            }
            let r = *hosts[h].get_or_insert_with(|| {
                host.push(true);
                host.len() as u32 - 1
            });
            c.push(r);
        }
        Regions { chain, host }
    }
}

/// The cut bounds' time (bytes / (GB/s)): for every region of [`Regions`] holding some
/// members but not all, the bytes that must leave it over the usable links leaving it, and
/// the bytes that must enter it over the links entering it ([`RegionCapacity`],
/// [`region_traffic`]); for all_reduce across every host of the topology also the
/// directed-gossip total ([`all_reduce_hosts_time`], module docs). 0 when no region separates
/// the members.
fn cut_time(topo: &Topology, req: &Request, usable_node: &[bool]) -> Result<f64> {
    let regions = Regions::new(topo);
    let nreg = regions.host.len();
    let n = req.gpus.len();
    let mut chains: Vec<&[u32]> = Vec::with_capacity(n);
    // Members per region.
    let mut members = vec![0usize; nreg];
    for &x in &req.gpus {
        let c = &regions.chain[topo.gpu(x)?.index()];
        c.iter().for_each(|&r| members[r as usize] += 1);
        chains.push(c);
    }
    // A region that separates the members: it holds some but not all.
    let separates = |r: &usize| members[*r] > 0 && members[*r] < n;
    if !(0..nreg).any(|r| separates(&r)) {
        return Ok(0.0);
    }
    let capacity = RegionCapacity::new(topo, &regions, usable_node);
    let (leave, enter) = region_traffic(req, &chains, &members);
    let mut t: f64 = 0.0;
    for r in (0..nreg).filter(separates) {
        t = t
            .max(transfer_time(leave[r], capacity.out[r]))
            .max(transfer_time(enter[r], capacity.inn[r]));
    }
    Ok(t.max(all_reduce_hosts_time(req, &regions, &members, &capacity)))
}

/// `bytes` over `gbps`: 0 for nothing to move, infinite over no capacity.
fn transfer_time(bytes: f64, gbps: f64) -> f64 {
    if bytes <= 0.0 {
        0.0
    } else if gbps <= 0.0 {
        f64::INFINITY
    } else {
        bytes / gbps
    }
}

/// The usable capacity out of and into each region of [`Regions`], GB/s: usable links
/// between nodes the job may use, an NVSwitch port (whose planes the simulator pools)
/// counted once at its whole rate.
struct RegionCapacity {
    /// Per region, the capacity of the links leaving it.
    out: Vec<f64>,
    /// Per region, the capacity of the links entering it.
    inn: Vec<f64>,
    /// Whether every link between hosts ends at a network switch (no switch that multicasts
    /// or reduces joins two hosts).
    plain_network: bool,
}

impl RegionCapacity {
    /// The capacities of `regions` on `topo`, over the links between nodes `usable_node`
    /// marks.
    fn new(topo: &Topology, regions: &Regions, usable_node: &[bool]) -> Self {
        let nreg = regions.host.len();
        let ok = |id: relaycc_topo::NodeId| usable_node[id.index()];
        let mut out = vec![0.0f64; nreg];
        let mut inn = vec![0.0f64; nreg];
        let mut ports: std::collections::HashSet<(u32, relaycc_topo::NodeId, bool)> =
            std::collections::HashSet::new();
        let mut plain_network = true;
        for (id, x, y, l) in topo.links() {
            if !topo.link_usable(id) || !ok(x) || !ok(y) {
                continue;
            }
            let (nx, ny) = (topo.node(x), topo.node(y));
            if nx.host != ny.host
                && !matches!(nx.kind, NodeKind::NetSwitch)
                && !matches!(ny.kind, NodeKind::NetSwitch)
            {
                plain_network = false;
            }
            let port = topo.nvswitch_port(id);
            let (cx, cy) = (&regions.chain[x.index()], &regions.chain[y.index()]);
            let mut add = |r: u32, into: bool, v: &mut Vec<f64>| match port {
                Some((gpu, dir)) => {
                    if ports.insert((r * 2 + u32::from(into), gpu, dir)) {
                        v[r as usize] += topo.striped_gbps(id);
                    }
                }
                None => v[r as usize] += l.gbps,
            };
            for &r in cx.iter().filter(|r| !cy.contains(r)) {
                add(r, false, &mut out);
            }
            for &r in cy.iter().filter(|r| !cx.contains(r)) {
                add(r, true, &mut inn);
            }
        }
        RegionCapacity {
            out,
            inn,
            plain_network,
        }
    }
}

/// The bytes that must leave and enter each region for `req`, whose rank `q` lies in the
/// regions `chains[q]` and which holds `members[r]` ranks in region `r`: summed over every
/// pair for an exchange of pairs (all_to_all_v, send/recv), else what the collective moves
/// across a region that separates the members ([`separated_bytes`]).
fn region_traffic(req: &Request, chains: &[&[u32]], members: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let nreg = members.len();
    let n = chains.len();
    let es = req.dtype.size() as f64;
    let mut leave = vec![0.0f64; nreg];
    let mut enter = vec![0.0f64; nreg];
    match req.collective {
        Collective::AllToAllV | Collective::SendRecv => {
            let mut add = |s: usize, d: usize, elems: u64| {
                if s == d || elems == 0 {
                    return;
                }
                let b = elems as f64 * es;
                for &r in chains[s].iter().filter(|r| !chains[d].contains(r)) {
                    leave[r as usize] += b;
                }
                for &r in chains[d].iter().filter(|r| !chains[s].contains(r)) {
                    enter[r as usize] += b;
                }
            };
            if req.collective == Collective::AllToAllV {
                (0..n).for_each(|s| (0..n).for_each(|d| add(s, d, req.matrix[s][d])));
            } else {
                req.transfers
                    .iter()
                    .for_each(|x| add(x.src as usize, x.dst as usize, x.count));
            }
        }
        _ => {
            // O(ranks) to find: once, not once per region.
            let size = req.size_bytes() as f64;
            for r in (0..nreg).filter(|&r| members[r] > 0 && members[r] < n) {
                (leave[r], enter[r]) = separated_bytes(req, size, chains, (r, members[r]));
            }
        }
    }
    (leave, enter)
}

/// The bytes that must leave and enter region `r`, which holds `k` of the ranks (whose
/// regions are `chains`), for a collective other than an exchange of pairs of `size` bytes
/// ([`Request::size_bytes`]).
fn separated_bytes(
    req: &Request,
    size: f64,
    chains: &[&[u32]],
    (r, k): (usize, usize),
) -> (f64, f64) {
    let n = chains.len();
    let es = req.dtype.size() as f64;
    let c = req.count as f64 * es;
    let (nf, kf) = (n as f64, k as f64);
    let holds = |rank: usize| chains[rank].contains(&(r as u32));
    match req.collective {
        // Every element's sum needs the region's inputs outside it and the others' inside it.
        Collective::AllReduce => (size, size),
        Collective::AllGather => (kf * c, (nf - kf) * c),
        Collective::AllGatherV | Collective::ReduceScatterV => {
            let inside: u64 = (0..n).filter(|&q| holds(q)).map(|q| req.counts[q]).sum();
            let total: u64 = req.counts.iter().sum();
            let (inside, outside) = (inside as f64 * es, (total - inside) as f64 * es);
            // reduce_scatter_v: the partial sums of the outside shards leave, the inside
            // shards' contributions enter.
            if req.collective == Collective::AllGatherV {
                (inside, outside)
            } else {
                (outside, inside)
            }
        }
        Collective::ReduceScatter => ((nf - kf) * c, kf * c),
        Collective::AllToAll => (kf * (nf - kf) * c, kf * (nf - kf) * c),
        Collective::Broadcast | Collective::Scatter | Collective::Gather | Collective::Reduce => {
            let at_root = holds(req.root as usize);
            let part = if req.collective == Collective::Broadcast
                || req.collective == Collective::Reduce
            {
                (size, size)
            } else {
                ((nf - kf) * c, kf * c)
            };
            // Data flows from the root (broadcast, scatter) or to it.
            let down = matches!(req.collective, Collective::Broadcast | Collective::Scatter);
            match (at_root, down) {
                (true, true) => (part.0, 0.0),
                (false, true) => (0.0, part.1),
                (true, false) => (0.0, part.0),
                (false, false) => (part.1, 0.0),
            }
        }
        _ => (0.0, 0.0),
    }
}

/// all_reduce over hosts that all hold members: every element's 2(N-1) receipts
/// [Harary-1974] enter the N hosts over their links in (and leave them over their links out,
/// when no switch between hosts multicasts). 0 for another request.
fn all_reduce_hosts_time(
    req: &Request,
    regions: &Regions,
    members: &[usize],
    capacity: &RegionCapacity,
) -> f64 {
    let nreg = members.len();
    let member_hosts: Vec<usize> = (0..nreg)
        .filter(|&r| regions.host[r] && members[r] > 0)
        .collect();
    let all_hosts = (0..nreg).filter(|&r| regions.host[r]).count();
    if req.collective != Collective::AllReduce
        || member_hosts.len() < 2
        || member_hosts.len() != all_hosts
    {
        return 0.0;
    }
    let hosts = member_hosts.len() as f64;
    let total = 2.0 * (hosts - 1.0) * req.size_bytes() as f64;
    let sum = |v: &[f64]| member_hosts.iter().map(|&r| v[r]).sum::<f64>();
    let mut t = transfer_time(total, sum(&capacity.inn));
    if capacity.plain_network {
        t = t.max(transfer_time(total, sum(&capacity.out)));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::DType;

    /// NIC rate of the hand-built clusters, GB/s per direction (a test value, below every
    /// other link so the hosts' cuts bind).
    const NIC_GBPS: f64 = 10.0;

    /// `hosts` machines of 2 GPUs (NVLink between them) and one NIC under one PCIe switch,
    /// the NICs on one network switch at [`NIC_GBPS`].
    fn cluster(hosts: u32) -> Topology {
        use relaycc_topo::rates::{CpuFamily, Fabric, NvLinkGen};
        use relaycc_topo::{GpuInfo, NicInfo, TopologyBuilder};
        let mut b = TopologyBuilder::new("t");
        let mut nics = Vec::new();
        for h in 0..hosts {
            b.begin_host(h);
            let cpu = b.add_cpu(0, CpuFamily::IntelSkylake);
            let sw = b.add_pcie_switch();
            b.pcie(cpu, sw, 3, 16);
            let g0 = b.add_gpu(GpuInfo::new(2 * h));
            let g1 = b.add_gpu(GpuInfo::new(2 * h + 1));
            b.pcie(sw, g0, 3, 16);
            b.pcie(sw, g1, 3, 16);
            b.nvlink(g0, g1, NvLinkGen::V2, 2);
            let nic = b.add_nic(NicInfo {
                name: "mlx5_0".into(),
                numa: Some(0),
                gbps: NIC_GBPS,
                pci_bus_id: None,
            });
            b.pcie(sw, nic, 3, 16);
            nics.push(nic);
        }
        let net = b.add_net_switch();
        for nic in nics {
            b.network(nic, net, Fabric::IbEdr, NIC_GBPS);
        }
        b.build().unwrap()
    }

    /// The rates [`port_rates`] reads from each member's own links equal a scan of every link
    /// of the topology, whatever the members, relay policy and mask (busy, absent GPUs, links
    /// down).
    #[test]
    fn port_rates_equal_a_scan_of_every_link() {
        use relaycc_topo::Mask;
        let scan = |topo: &Topology, members: &[u32], relay: &RelayPolicy, g: u32, inbound| {
            let me = topo.gpu(g).unwrap();
            let ok = |n: relaycc_topo::NodeId| match &topo.node(n).kind {
                NodeKind::Gpu(info) => {
                    members.contains(&info.index) || relay.allows(topo, members, info.index)
                }
                _ => true,
            };
            topo.links()
                .filter(|(id, x, y, _)| {
                    topo.link_usable(*id)
                        && if inbound {
                            *y == me && ok(*x)
                        } else {
                            *x == me && ok(*y)
                        }
                })
                .map(|(_, _, _, l)| l.gbps)
                .sum::<f64>()
        };
        let masks = [
            Mask::default(),
            Mask {
                busy_gpus: [5].into(),
                absent_gpus: [6].into(),
                down_links: [("GPU0".to_string(), "GPU3".to_string())].into(),
            },
        ];
        let relays = [
            RelayPolicy::Any,
            RelayPolicy::Members,
            RelayPolicy::None,
            RelayPolicy::List(vec![4, 5]),
        ];
        for name in ["dgx1-v100", "dgx-h100", "pcie-4gpu"] {
            let base = relaycc_topo::preset(name).unwrap();
            for mask in &masks {
                let Ok(topo) = base.with_mask(mask.clone()) else {
                    continue;
                };
                let members: Vec<u32> = (0..topo.gpu_count().min(4)).collect();
                for relay in &relays {
                    let usable = job_nodes(&topo, &members, relay);
                    let (inr, outr) = port_rates(&topo, &members, &usable).unwrap();
                    // Sums taken in another order: equal up to rounding.
                    let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
                    for (r, &g) in members.iter().enumerate() {
                        let (i, o) = (
                            scan(&topo, &members, relay, g, true),
                            scan(&topo, &members, relay, g, false),
                        );
                        assert!(same(inr[r], i), "{name} GPU{g} in: {} vs {i}", inr[r]);
                        assert!(same(outr[r], o), "{name} GPU{g} out: {} vs {o}", outr[r]);
                    }
                }
            }
        }
    }

    #[test]
    fn host_cuts_bound_two_hosts_of_two_gpus() {
        let topo = cluster(2);
        let any = RelayPolicy::Any;
        let gpus = vec![0, 1, 2, 3];
        let (n, k, c) = (4.0, 2.0, 1u64 << 20);
        let bytes = c as f64 * 4.0;
        // all_to_all: each host sends k (n - k) blocks over its one NIC.
        let req = Request::new(Collective::AllToAll, gpus.clone(), c, DType::F32);
        let t = k * (n - k) * bytes / NIC_GBPS;
        let b = collective_bound_gbps(&topo, &req, &any).unwrap();
        assert!((b - req.size_bytes() as f64 / t).abs() < 1e-9, "{b}");
        // all_reduce: the vector leaves each host once; 2(N-1) = 2 receipts per element over
        // the two NICs in.
        let req = Request::new(Collective::AllReduce, gpus.clone(), c, DType::F32);
        let s = req.size_bytes() as f64;
        let b = collective_bound_gbps(&topo, &req, &any).unwrap();
        assert!((b - NIC_GBPS).abs() < 1e-9, "{b}");
        assert!((b - s / (s / NIC_GBPS)).abs() < 1e-9);
        // all_gather: the other host's k blocks enter over its NIC.
        let req = Request::new(Collective::AllGather, gpus.clone(), c, DType::F32);
        let t = (n - k) * bytes / NIC_GBPS;
        let b = collective_bound_gbps(&topo, &req, &any).unwrap();
        assert!((b - req.size_bytes() as f64 / t).abs() < 1e-9, "{b}");
        // Both members on one host: no cut separates them, the GPUs' ports bound it.
        let req = Request::new(Collective::AllToAll, vec![0, 1], c, DType::F32);
        assert!(collective_bound_gbps(&topo, &req, &any).unwrap() > 2.0 * NIC_GBPS);
    }

    #[test]
    fn all_reduce_over_three_hosts_counts_every_receipt() {
        let topo = cluster(3);
        let req = Request::new(Collective::AllReduce, (0..6).collect(), 1 << 20, DType::F32);
        let s = req.size_bytes() as f64;
        // 2(N-1) S over N NICs in: 4/3 of the vector per host, above the one-cut S.
        let hosts = 3.0;
        let t = 2.0 * (hosts - 1.0) * s / (hosts * NIC_GBPS);
        let b = collective_bound_gbps(&topo, &req, &RelayPolicy::Any).unwrap();
        assert!((b - s / t).abs() < 1e-9, "{b}");
        // On two of the three hosts a third host could combine, so only the per-host cut
        // (the vector out of and into each host) holds.
        let req = Request::new(Collective::AllReduce, (0..4).collect(), 1 << 20, DType::F32);
        let b = collective_bound_gbps(&topo, &req, &RelayPolicy::Any).unwrap();
        assert!((b - NIC_GBPS).abs() < 1e-9, "{b}");
    }

    #[test]
    fn pcie_box_sockets_bound_all_to_all() {
        // pcie-8gpu: two sockets of four GPUs; what crosses sockets takes the inter-socket
        // link (and nothing else leaves a socket).
        let topo = relaycc_topo::preset("pcie-8gpu").unwrap();
        let req = Request::new(Collective::AllToAll, (0..8).collect(), 1 << 20, DType::F32);
        let cpu0 = topo.node_by_name("CPU0").unwrap();
        let cpu1 = topo.node_by_name("CPU1").unwrap();
        let upi = topo.link(topo.link_between(cpu0, cpu1).unwrap()).gbps;
        let t = 4.0 * 4.0 * (1u64 << 22) as f64 / upi;
        let b = collective_bound_gbps(&topo, &req, &RelayPolicy::Any).unwrap();
        assert!(b <= req.size_bytes() as f64 / t * (1.0 + 1e-9), "{b}");
    }

    #[test]
    fn dgx1_all_reduce_and_broadcast_bounds() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::new(Collective::AllReduce, vec![0, 7], 1 << 20, DType::F32);
        // GPU ingress: 6 NVLink lanes (145.2) + PCIe (10); n = 2 so algbw <= in.
        let b = collective_bound_gbps(&topo, &req, &RelayPolicy::Any).unwrap();
        assert!((b - 155.2).abs() < 1e-6, "{b}");
        // Members only: GPU0's NVLink peers may not be used, only PCIe remains.
        let b = collective_bound_gbps(&topo, &req, &RelayPolicy::Members).unwrap();
        assert!((b - 10.0).abs() < 1e-6, "{b}");
        let bc = Request::new(Collective::Broadcast, vec![0, 7], 1 << 20, DType::F32);
        let b = collective_bound_gbps(&topo, &bc, &RelayPolicy::Any).unwrap();
        assert!((b - 155.2).abs() < 1e-6, "{b}");
        let one = Request::new(Collective::AllReduce, vec![3], 10, DType::F32);
        assert!(
            collective_bound_gbps(&topo, &one, &RelayPolicy::Any)
                .unwrap()
                .is_infinite()
        );
    }
}
