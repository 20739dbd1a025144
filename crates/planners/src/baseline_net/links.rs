//! The cluster as NCCL sees it for the baseline: the member GPUs of each node, each GPU's home
//! NIC (its rail), and the connections NCCL makes between them, built from the rail structure
//! directly instead of searched pair by pair.
//!
//! - A GPU's home NIC is the node's NIC nearest to it in the PCIe tree (fewest steps to a
//!   common ancestor), ties going to a NIC no other member took yet: on a DGX H100 GPU `i`
//!   gets `mlx5_i`. Its rail is the NIC's position among the node's NICs.
//! - Two GPUs of one node behind a common NVSwitch connect through it (one hop, the switch
//!   ports counted whole); other pairs in a node use NCCL's link rule
//!   ([`LinkMode::Nccl`], searched once per pair).
//! - A send to another node leaves by a chosen NIC and enters by a chosen NIC: over the PCIe
//!   tree to the NIC when the GPU's path to it passes no CPU (NCCL's GPU Direct RDMA, up to
//!   PXB); otherwise by PXN: over NVLink to the member GPU whose home NIC it is, which posts it
//!   ([NCCL-src], `src/graph/paths.cc`: a peer GPU on NVLink whose path to the NIC is at most
//!   PXB, used when the GPU's own path crosses the CPU). Between NICs the path follows the
//!   fabric: the shared leaf, or leaf, spine, leaf, the spine chosen by a salt so channels
//!   spread over the spines as ECMP spreads flows. GPUs the driver refuses PCIe peer-to-peer
//!   (GeForce) have no GPU Direct RDMA either; their sends across nodes take NCCL's link rule,
//!   staged through host memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use relaycc_topo::{LinkId, LinkKind, NodeId, NodeKind, Topology};

use crate::{ConnCache, Connection, LinkMode};
use relaycc_plan::Location;
use relaycc_plan::path::{Hop, Route};
use relaycc_plan::{Result, RouteError};

/// The members of one node.
#[derive(Debug, Clone)]
pub(crate) struct NodeRanks {
    /// Ranks on this node, in rank order.
    pub ranks: Vec<u32>,
    /// The node's NICs, in rail order.
    pub nics: Vec<NodeId>,
}

/// The member layout of a request on a cluster and the connections between members.
pub(crate) struct NetLinks<'t> {
    pub topo: &'t Topology,
    /// The request's GPUs, by rank.
    pub gpus: Vec<u32>,
    /// Nodes holding members, by host id.
    pub nodes: Vec<NodeRanks>,
    /// Per rank: index into `nodes`.
    pub node_of: Vec<usize>,
    /// Per rank: the rail of its home NIC (None when its node has no NIC).
    pub rail: Vec<Option<usize>>,
    cache: &'t ConnCache<'t>,
    /// Per node: the rates between its members ([`NetLinks::local_rates`]), read once.
    local_rates: Vec<OnceLock<Vec<f64>>>,
    /// Per pair of leaf switches: the usable two-link paths between them through a common
    /// neighbour switch ([`NetLinks::net_path`]), found once: a spine has a link per leaf.
    spines: Mutex<HashMap<(NodeId, NodeId), SpinePaths>>,
}

/// The paths between two leaf switches through their common neighbours: (up, down) links.
type SpinePaths = Arc<[(LinkId, LinkId)]>;

/// A node's ancestors of a device in the PCIe tree, the device first, up to its socket (a GPU
/// without a PCIe parent climbs its C2C link to the CPU it attaches to).
fn ancestors(topo: &Topology, id: NodeId) -> Vec<NodeId> {
    let mut v = vec![id];
    let mut cur = id;
    while let Some(p) = topo.pcie_parent(cur) {
        v.push(p);
        cur = p;
    }
    if topo.node(cur).cpu().is_none()
        && let Some(c) = topo.attached_cpu(cur)
    {
        v.push(c);
    }
    v
}

/// The fastest directed link from `a` into `b`, found among `b`'s incoming links
/// ([`Topology::link_between`] walks `a`'s outgoing ones).
fn link_into(topo: &Topology, a: NodeId, b: NodeId) -> Option<LinkId> {
    use petgraph::visit::EdgeRef;
    topo.graph()
        .edges_directed(b, petgraph::Direction::Incoming)
        .filter(|e| e.source() == a)
        .max_by(|x, y| x.weight().gbps.total_cmp(&y.weight().gbps))
        .map(|e| e.id())
}

/// The fastest link into `b` from each node with a link to it, as [`link_into`] picks it
/// (the last of equally fast ones in petgraph's order).
fn links_into(topo: &Topology, b: NodeId) -> HashMap<NodeId, LinkId> {
    use petgraph::visit::EdgeRef;
    let mut best: HashMap<NodeId, (LinkId, f64)> = HashMap::new();
    for e in topo
        .graph()
        .edges_directed(b, petgraph::Direction::Incoming)
    {
        let gbps = e.weight().gbps;
        best.entry(e.source())
            .and_modify(|kept| {
                if gbps.total_cmp(&kept.1).is_ge() {
                    *kept = (e.id(), gbps);
                }
            })
            .or_insert((e.id(), gbps));
    }
    best.into_iter().map(|(a, (e, _))| (a, e)).collect()
}

/// The tree path from `a` to `b`: links up from `a` to the lowest common ancestor and down to
/// `b`, and whether it passes a CPU; None when the two share no ancestor or a link is missing.
fn tree_path(topo: &Topology, a: NodeId, b: NodeId) -> Option<(Vec<LinkId>, bool)> {
    let up_a = ancestors(topo, a);
    let up_b = ancestors(topo, b);
    let (i, j) = up_a
        .iter()
        .enumerate()
        .find_map(|(i, x)| up_b.iter().position(|y| y == x).map(|j| (i, j)))?;
    let mut links = Vec::with_capacity(i + j);
    for w in up_a[..=i].windows(2) {
        links.push(topo.link_between(w[0], w[1])?);
    }
    for w in up_b[..=j].windows(2).rev() {
        links.push(topo.link_between(w[1], w[0])?);
    }
    let via_cpu = topo.node(up_a[i]).cpu().is_some();
    Some((links, via_cpu))
}

impl<'t> NetLinks<'t> {
    /// The layout of `gpus` on `topo`; connections not built from the rail structure come from
    /// `cache` (NCCL's link rule). Laying it out stops at `limit`'s deadline.
    pub fn new(
        topo: &'t Topology,
        gpus: &[u32],
        cache: &'t ConnCache<'t>,
        limit: Option<&crate::limits::Limit>,
    ) -> Result<Self> {
        let mut host_nics: BTreeMap<u32, Vec<NodeId>> = BTreeMap::new();
        for (id, n) in topo.nodes() {
            if n.nic().is_some() {
                host_nics.entry(n.host).or_default().push(id);
            }
        }
        let mut by_host: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (r, &g) in gpus.iter().enumerate() {
            let host = topo.node(topo.gpu(g)?).host;
            by_host.entry(host).or_default().push(r as u32);
        }
        let mut nodes = Vec::with_capacity(by_host.len());
        let mut node_of = vec![0; gpus.len()];
        let mut rail = vec![None; gpus.len()];
        for (k, (host, ranks)) in by_host.into_iter().enumerate() {
            let nics = host_nics.remove(&host).unwrap_or_default();
            let mut taken = vec![false; nics.len()];
            for &r in &ranks {
                crate::limits::check_deadline(limit, r as usize, "laid out on the cluster's NICs")?;
                node_of[r as usize] = k;
                let gn = topo.gpu(gpus[r as usize])?;
                let best = nics
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &nic)| tree_path(topo, gn, nic).map(|(p, _)| (i, p.len())))
                    .min_by_key(|&(i, steps)| (steps, taken[i], i));
                if let Some((i, _)) = best {
                    taken[i] = true;
                    rail[r as usize] = Some(i);
                }
            }
            nodes.push(NodeRanks { ranks, nics });
        }
        Ok(NetLinks {
            topo,
            gpus: gpus.to_vec(),
            local_rates: nodes.iter().map(|_| OnceLock::new()).collect(),
            spines: Mutex::new(HashMap::new()),
            nodes,
            node_of,
            rail,
            cache,
        })
    }

    /// How rank `r` reaches its node's NIC of `rail`: (passes a CPU, PCIe steps); None when
    /// the node lacks the rail.
    pub fn nic_reach(&self, r: u32, rail: usize) -> Option<(bool, usize)> {
        let nic = *self.nodes[self.node_of[r as usize]].nics.get(rail)?;
        let g = self.topo.gpu(self.gpus[r as usize]).ok()?;
        tree_path(self.topo, g, nic).map(|(p, cpu)| (cpu, p.len()))
    }

    /// The hop of `links` between two memories.
    fn hop(&self, from: Location, to: Location, links: &[LinkId]) -> Hop {
        Hop {
            from,
            to,
            edges: links.iter().map(|e| e.index() as u32).collect(),
            gbps: links
                .iter()
                .map(|e| self.topo.striped_gbps(*e))
                .fold(f64::INFINITY, f64::min),
            latency_us: links.iter().map(|e| self.topo.link(*e).latency_us).sum(),
        }
    }

    /// The links from GPU `na` into an NVSwitch and on to GPU `nb`, where a usable NVSwitch
    /// joins them.
    fn through_switch(&self, na: NodeId, nb: NodeId) -> Option<[LinkId; 2]> {
        self.topo.links_from(na).find_map(|(e, s, l)| {
            if !l.kind.is_nvlink() || !matches!(self.topo.node(s).kind, NodeKind::NvSwitch) {
                return None;
            }
            let to_b = self.topo.link_between(s, nb)?;
            (self.topo.link_usable(e) && self.topo.link_usable(to_b)).then_some([e, to_b])
        })
    }

    /// The connection between ranks `a` and `b` of one node: through a shared NVSwitch, else
    /// NCCL's link rule.
    pub fn local(&self, a: u32, b: u32) -> Result<Arc<Connection>> {
        let (ga, gb) = (self.gpus[a as usize], self.gpus[b as usize]);
        let (na, nb) = (self.topo.gpu(ga)?, self.topo.gpu(gb)?);
        match self.through_switch(na, nb) {
            Some(links) => {
                let hop = self.hop(Location::Gpu(ga), Location::Gpu(gb), &links);
                Ok(Arc::new(Connection::single(Route { hops: vec![hop] })))
            }
            None => self.cache.get(LinkMode::Nccl, ga, gb),
        }
    }

    /// The rate of [`NetLinks::local`]'s connection from `a` to `b`, GB/s, without making it.
    fn local_gbps(&self, a: u32, b: u32) -> Result<f64> {
        let (ga, gb) = (self.gpus[a as usize], self.gpus[b as usize]);
        let (na, nb) = (self.topo.gpu(ga)?, self.topo.gpu(gb)?);
        match self.through_switch(na, nb) {
            Some(links) => Ok(links
                .iter()
                .map(|e| self.topo.striped_gbps(*e))
                .fold(f64::INFINITY, f64::min)),
            None => Ok(self.cache.get(LinkMode::Nccl, ga, gb)?.gbps()),
        }
    }

    /// The rates between node `k`'s members, GB/s: `m x m` by position in the node's ranks
    /// (`[i * m + j]` from member `i` to member `j`), NaN where [`NetLinks::local`] finds no
    /// connection. Read once per node and kept, since every channel's ring and tree orders
    /// the node's members by them: a GB200 NVL72 rack has 72 members and 72 rails, 5,184
    /// pairs per node. Through an NVSwitch a pair's rate is the lesser of the sender's port
    /// out and the receiver's port in (every link of a port carries the port's striped rate),
    /// so each member's ports and switch links are read once, not once per pair.
    pub fn local_rates(&self, k: usize) -> &[f64] {
        self.local_rates[k].get_or_init(|| {
            let topo = self.topo;
            let ranks = &self.nodes[k].ranks;
            let m = ranks.len();
            let node = |r: u32| topo.gpu(self.gpus[r as usize]).ok();
            // Per member: its usable NVLinks into switches, in link order (as `through_switch`
            // walks them), with the port rate out; and per switch the link into it, usable or
            // not (`through_switch` asks for the fastest link, `link_between`), with the port
            // rate in.
            let ups: Vec<Vec<(LinkId, NodeId)>> = ranks
                .iter()
                .map(|&r| {
                    node(r).map_or_else(Vec::new, |na| {
                        topo.links_from(na)
                            .filter(|(e, s, l)| {
                                l.kind.is_nvlink()
                                    && matches!(topo.node(*s).kind, NodeKind::NvSwitch)
                                    && topo.link_usable(*e)
                            })
                            .map(|(e, s, _)| (e, s))
                            .collect()
                    })
                })
                .collect();
            // Every usable link of a port carries the port's rate: the first stands for all.
            let port_out: Vec<f64> = ups
                .iter()
                .map(|u| u.first().map_or(0.0, |(e, _)| topo.striped_gbps(*e)))
                .collect();
            let switches: Vec<NodeId> = {
                let mut v: Vec<NodeId> = ups.iter().flatten().map(|(_, s)| *s).collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            // Per member: per switch (by position in `switches`), the usable link into it.
            let downs: Vec<Vec<Option<LinkId>>> = ranks
                .iter()
                .map(|&r| {
                    switches
                        .iter()
                        .map(|&sw| {
                            let nb = node(r)?;
                            topo.link_between(sw, nb).filter(|e| topo.link_usable(*e))
                        })
                        .collect()
                })
                .collect();
            let port_in: Vec<f64> = downs
                .iter()
                .map(|d| {
                    d.iter()
                        .flatten()
                        .next()
                        .map_or(0.0, |e| topo.striped_gbps(*e))
                })
                .collect();
            let mut rates = vec![0.0; m * m];
            for i in 0..m {
                for j in (0..m).filter(|&j| j != i) {
                    let joined = ups[i].iter().any(|(_, sw)| {
                        switches
                            .binary_search(sw)
                            .is_ok_and(|at| downs[j][at].is_some())
                    });
                    rates[i * m + j] = if joined {
                        port_out[i].min(port_in[j])
                    } else {
                        self.local_gbps(ranks[i], ranks[j]).unwrap_or(f64::NAN)
                    };
                }
            }
            rates
        })
    }

    /// The network links from NIC `x` to NIC `y`: through their shared switch, or leaf, a
    /// common neighbour switch (picked by `salt`), leaf.
    fn net_path(&self, x: NodeId, y: NodeId, salt: usize) -> Option<Vec<LinkId>> {
        let topo = self.topo;
        let uplink = |nic: NodeId| {
            topo.links_from(nic).find(|(e, s, l)| {
                matches!(l.kind, LinkKind::Network { .. })
                    && matches!(topo.node(*s).kind, NodeKind::NetSwitch)
                    && topo.link_usable(*e)
            })
        };
        let (ex, sx, _) = uplink(x)?;
        let (_, sy, _) = uplink(y)?;
        // Looked up from the NIC's side: a switch may have a thousand links, a NIC a few.
        let down = link_into(topo, sy, y).filter(|e| topo.link_usable(*e))?;
        if sx == sy {
            return Some(vec![ex, down]);
        }
        let spines = self.spines_between(sx, sy);
        let (up, over) = *spines.get(salt % spines.len().max(1))?;
        Some(vec![ex, up, over, down])
    }

    /// The usable paths from switch `sx` up to a neighbour switch and down to switch `sy`,
    /// in `sx`'s link order: found once per pair of switches and kept (a poisoned lock only
    /// loses the memo).
    fn spines_between(&self, sx: NodeId, sy: NodeId) -> SpinePaths {
        let kept = self
            .spines
            .lock()
            .ok()
            .and_then(|m| m.get(&(sx, sy)).cloned());
        if let Some(v) = kept {
            return v;
        }
        let topo = self.topo;
        // The fastest link into `sy` from each of its neighbours, read in one walk of `sy`'s
        // links: asking per spine would walk them once per spine (577 spines and 619 links a
        // leaf on 1,024 GB200 racks of a 2:1 fat-tree).
        let into_sy = links_into(topo, sy);
        let found: SpinePaths = topo
            .links_from(sx)
            .filter(|(e, s, _)| {
                matches!(topo.node(*s).kind, NodeKind::NetSwitch) && topo.link_usable(*e)
            })
            .filter_map(|(e, s, _)| {
                let &f = into_sy.get(&s)?;
                topo.link_usable(f).then_some((e, f))
            })
            .collect();
        if let Ok(mut m) = self.spines.lock() {
            m.insert((sx, sy), Arc::clone(&found));
        }
        found
    }

    /// The connection from rank `a` to rank `b` on another node over rail `rail`: out through
    /// the node's NIC of that rail (directly, or by PXN through the member at that NIC), in
    /// through the other node's NIC of the same rail; `salt` picks the spine. Falls back to the
    /// widest route when a node lacks the rail.
    pub fn across(&self, a: u32, b: u32, rail: usize, salt: usize) -> Result<Arc<Connection>> {
        let (ga, gb) = (self.gpus[a as usize], self.gpus[b as usize]);
        let (ka, kb) = (self.node_of[a as usize], self.node_of[b as usize]);
        let none = || RouteError::NoRoute {
            what: format!("GPU{ga} -> GPU{gb}"),
            why: format!("rail {rail} has no path between their nodes"),
        };
        // Without PCIe peer-to-peer the NIC cannot reach GPU memory (no GPU Direct RDMA):
        // NCCL stages through host memory, as its link rule does.
        let p2p = |g: u32| self.topo.gpu_info(g).is_ok_and(|i| i.pcie_p2p);
        if !p2p(ga) || !p2p(gb) {
            return self.cache.get(LinkMode::Nccl, ga, gb);
        }
        let (Some(&nic_a), Some(&rail_b)) =
            (self.nodes[ka].nics.get(rail), self.nodes[kb].nics.get(rail))
        else {
            return self.cache.get(LinkMode::Nccl, ga, gb);
        };
        let topo = self.topo;
        // The receiver takes the rail's NIC when PCIe reaches it without a CPU, else its own.
        let nic_b = match tree_path(topo, rail_b, topo.gpu(gb)?) {
            Some((_, false)) => rail_b,
            _ => self.rail[b as usize]
                .and_then(|r| self.nodes[kb].nics.get(r).copied())
                .unwrap_or(rail_b),
        };
        let Some((into, _)) = tree_path(topo, nic_b, topo.gpu(gb)?) else {
            return self.cache.get(LinkMode::Nccl, ga, gb);
        };
        let net = self.net_path(nic_a, nic_b, salt).ok_or_else(none)?;
        // Over PCIe to the NIC unless that path crosses a CPU (or another socket).
        let out = tree_path(topo, topo.gpu(ga)?, nic_a);
        let via_cpu = out.as_ref().is_none_or(|(_, cpu)| *cpu);
        // PXN: the member whose home NIC this is posts the send, if NVLink reaches it.
        let proxy = self.nodes[ka]
            .ranks
            .iter()
            .copied()
            .find(|&p| p != a && self.rail[p as usize] == Some(rail));
        let pxn = proxy.filter(|&p| via_cpu && self.nvlink_between(a, p));
        if let Some(p) = pxn {
            let gp = self.gpus[p as usize];
            let first = self.local(a, p)?;
            let (up, _) = tree_path(topo, topo.gpu(gp)?, nic_a).ok_or_else(none)?;
            let links: Vec<LinkId> = up.into_iter().chain(net).chain(into).collect();
            let mut hops = first.routes.first().ok_or_else(none)?.hops.clone();
            hops.push(self.hop(Location::Gpu(gp), Location::Gpu(gb), &links));
            return Ok(Arc::new(Connection::single(Route { hops })));
        }
        let Some((out, _)) = out else {
            // No PCIe path to the rail's NIC and no proxy: NCCL's own rule decides.
            return self.cache.get(LinkMode::Nccl, ga, gb);
        };
        let links: Vec<LinkId> = out.into_iter().chain(net).chain(into).collect();
        let hop = self.hop(Location::Gpu(ga), Location::Gpu(gb), &links);
        Ok(Arc::new(Connection::single(Route { hops: vec![hop] })))
    }

    /// True when NVLink joins ranks `a` and `b`, directly or through an NVSwitch.
    fn nvlink_between(&self, a: u32, b: u32) -> bool {
        let (Ok(na), Ok(nb)) = (
            self.topo.gpu(self.gpus[a as usize]),
            self.topo.gpu(self.gpus[b as usize]),
        ) else {
            return false;
        };
        self.topo.links_from(na).any(|(_, s, l)| {
            l.kind.is_nvlink()
                && (s == nb
                    || matches!(self.topo.node(s).kind, NodeKind::NvSwitch)
                        && self.topo.link_between(s, nb).is_some())
        })
    }

    /// The connection from rank `a` to rank `b`: [`NetLinks::local`] inside a node,
    /// [`NetLinks::across`] over `rail` between nodes.
    pub fn connect(&self, a: u32, b: u32, rail: usize, salt: usize) -> Result<Arc<Connection>> {
        if self.node_of[a as usize] == self.node_of[b as usize] {
            self.local(a, b)
        } else {
            self.across(a, b, rail, salt)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_topo::rates::Fabric;
    use relaycc_topo::{Link, TopologyBuilder};

    /// Every link [`links_into`] keeps is the one [`link_into`] picks for the same pair.
    fn same_as_link_into(topo: &Topology) {
        let nodes: Vec<NodeId> = topo.nodes().map(|(id, _)| id).collect();
        for &b in &nodes {
            let into = links_into(topo, b);
            for &a in &nodes {
                assert_eq!(
                    into.get(&a).copied(),
                    link_into(topo, a, b),
                    "{a:?} -> {b:?}"
                );
            }
        }
    }

    #[test]
    fn links_into_picks_what_link_into_picks_among_parallel_links() {
        let mut b = TopologyBuilder::new("parallel switches");
        let [x, y, z] = [0, 1, 2].map(|_| b.add_net_switch());
        let link = |gbps| Link {
            kind: relaycc_topo::LinkKind::Network {
                fabric: Fabric::IbNdr,
            },
            gbps,
            latency_us: 1.0,
        };
        for (from, to, gbps) in [(x, z, 10.0), (x, z, 20.0), (y, z, 20.0), (y, z, 20.0)] {
            b.add_directed(from, to, link(gbps));
        }
        b.add_directed(z, x, link(5.0));
        same_as_link_into(&b.build().unwrap());
        same_as_link_into(&relaycc_topo::preset("cluster:4xdgx-h100:ib-ndr:fat-tree=2:1").unwrap());
    }
}
