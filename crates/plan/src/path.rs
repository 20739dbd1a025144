//! Paths between memories: single hops through switches, relay and host-staged routes, and the
//! multi-path split from a max-flow decomposition of the masked graph.
//!
//! A *hop* moves bytes between two memories (a GPU's, or a socket's pinned host memory) that the
//! hardware connects: its links may pass PCIe switches, host bridges, NVSwitches, NICs, network
//! switches and a CPU's root complex, but never another GPU, and cross the inter-socket link
//! only when one end is host memory (GPU peer-to-peer across sockets is not used; NCCL does not
//! either). A hop between two GPUs uses PCIe only where the driver grants both PCIe
//! peer-to-peer ([`Topology::pcie_peer_ok`]; GeForce cards are refused it), so on such machines
//! GPU-to-GPU traffic is staged through host memory. A *route* is a chain of hops; intermediate
//! memories are relays that stage chunks.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use petgraph::graph::{DiGraph, NodeIndex};
use relaycc_topo::{LinkId, LinkKind, NodeId, NodeKind, Topology};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RouteError};
use crate::plan::Location;

/// Which GPUs may relay (stage and forward) data for a job.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RelayPolicy {
    /// No GPU relays; host staging is still allowed.
    None,
    /// Only the job's own GPUs (NCCL's NVB rule).
    Members,
    /// Any present, free GPU, inside the job or not (the idea of [Ranganath-2019]). The default.
    #[default]
    Any,
    /// The job's GPUs plus these.
    List(Vec<u32>),
}

impl RelayPolicy {
    /// True when GPU `g` may relay for a job over `members`.
    pub fn allows(&self, topo: &Topology, members: &[u32], g: u32) -> bool {
        self.allows_known(topo, g, members.contains(&g))
    }
    /// [`RelayPolicy::allows`] where the caller knows whether `g` is a member (`member`), so
    /// that a scan over every link need not search the member list for each.
    pub fn allows_known(&self, topo: &Topology, g: u32, member: bool) -> bool {
        if !topo.gpu_present(g) {
            return false;
        }
        match self {
            RelayPolicy::None => false,
            RelayPolicy::Members => member,
            RelayPolicy::Any => member || topo.gpu_free(g),
            RelayPolicy::List(l) => member || (l.contains(&g) && topo.gpu_free(g)),
        }
    }
    /// Parse `none`, `members`, `any` or a comma-separated GPU list.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(RelayPolicy::None),
            "members" => Ok(RelayPolicy::Members),
            "any" => Ok(RelayPolicy::Any),
            list => list
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("relay {x:?} is not none, members, any or a GPU list"))
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(RelayPolicy::List),
        }
    }
}

/// One hop between two memories.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    /// Source memory.
    pub from: Location,
    /// Destination memory.
    pub to: Location,
    /// Directed topology links, in order (topology edge indices).
    pub edges: Vec<u32>,
    /// The slowest link's rate, GB/s.
    pub gbps: f64,
    /// Sum of link latencies, microseconds.
    pub latency_us: f64,
}

/// A chain of hops from a source memory to a destination memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    /// The hops, in order; consecutive hops meet at a relay memory.
    pub hops: Vec<Hop>,
}

impl Route {
    /// Bottleneck rate over all hops, GB/s.
    pub fn gbps(&self) -> f64 {
        self.hops
            .iter()
            .map(|h| h.gbps)
            .fold(f64::INFINITY, f64::min)
    }
    /// Sum of hop latencies, microseconds.
    pub fn latency_us(&self) -> f64 {
        self.hops.iter().map(|h| h.latency_us).sum()
    }
    /// The memories visited, source first.
    pub fn waypoints(&self) -> Vec<Location> {
        let mut v: Vec<Location> = self.hops.iter().map(|h| h.from).collect();
        if let Some(h) = self.hops.last() {
            v.push(h.to);
        }
        v
    }
    /// Waypoint names as `topo show` prints them (`GPU0`, `CPU1`).
    pub fn names(&self, topo: &Topology) -> Vec<String> {
        self.waypoints()
            .into_iter()
            .map(|l| location_name(topo, l))
            .collect()
    }
}

/// The topology node of a memory.
pub fn location_node(topo: &Topology, loc: Location) -> Result<NodeId> {
    match loc {
        Location::Gpu(g) => Ok(topo.gpu(g)?),
        Location::Host(n) => {
            let id = NodeId::new(n as usize);
            match topo.graph().node_weight(id) {
                Some(node) if node.cpu().is_some() => Ok(id),
                _ => Err(RouteError::BadRequest(format!(
                    "host location {n} is not a CPU node"
                ))),
            }
        }
    }
}

/// The name of a memory (`GPU3`, `CPU0`).
pub fn location_name(topo: &Topology, loc: Location) -> String {
    match loc {
        Location::Gpu(g) => format!("GPU{g}"),
        Location::Host(n) => topo
            .graph()
            .node_weight(NodeId::new(n as usize))
            .map(|w| w.name.clone())
            .unwrap_or_else(|| format!("host{n}")),
    }
}

/// The memory of a node, if it has one (GPU or CPU socket).
pub fn node_location(topo: &Topology, id: NodeId) -> Option<Location> {
    let n = topo.node(id);
    match &n.kind {
        NodeKind::Gpu(g) => Some(Location::Gpu(g.index)),
        NodeKind::Cpu(_) => Some(Location::Host(id.index() as u32)),
        _ => None,
    }
}

#[derive(PartialEq)]
struct Best {
    gbps: f64,
    latency_us: f64,
    node: NodeId,
}
impl Eq for Best {}
impl Ord for Best {
    fn cmp(&self, o: &Self) -> Ordering {
        self.gbps
            .total_cmp(&o.gbps)
            .then_with(|| o.latency_us.total_cmp(&self.latency_us))
            .then_with(|| o.node.cmp(&self.node))
    }
}
impl PartialOrd for Best {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The widest single hop between two memories (ties: lowest latency), or None.
///
/// Complexity: O(E log V) on the topology graph.
pub fn hop(topo: &Topology, from: Location, to: Location) -> Option<Hop> {
    let (a, b) = (
        location_node(topo, from).ok()?,
        location_node(topo, to).ok()?,
    );
    let host_end = matches!(from, Location::Host(_)) || matches!(to, Location::Host(_));
    let (edges, gbps, latency_us) = widest_links(topo, a, b, host_end)?;
    Some(Hop {
        from,
        to,
        edges,
        gbps,
        latency_us,
    })
}

/// The widest path of usable links from node `a` to node `b` that passes no GPU (ties: lowest
/// latency), crossing the inter-socket link only when `cross_sockets` and PCIe only when
/// [`Topology::pcie_peer_ok`] admits the two ends: its topology edge indices, bottleneck rate
/// (NVSwitch ports counted whole) and summed latency.
///
/// Complexity: O(E log V) (Dijkstra on the bottleneck rate).
pub fn widest_links(
    topo: &Topology,
    a: NodeId,
    b: NodeId,
    cross_sockets: bool,
) -> Option<(Vec<u32>, f64, f64)> {
    if a == b {
        return None;
    }
    let host_end = cross_sockets;
    let pcie_ok = topo.pcie_peer_ok(a, b);
    let ends = (topo.node(a).host, topo.node(b).host);
    let n = topo.graph().node_count();
    let mut best_bw = vec![0.0f64; n];
    let mut best_lat = vec![f64::INFINITY; n];
    let mut prev: Vec<Option<LinkId>> = vec![None; n];
    let mut heap = BinaryHeap::new();
    best_bw[a.index()] = f64::INFINITY;
    best_lat[a.index()] = 0.0;
    heap.push(Best {
        gbps: f64::INFINITY,
        latency_us: 0.0,
        node: a,
    });
    while let Some(Best {
        gbps,
        latency_us,
        node,
    }) = heap.pop()
    {
        if gbps < best_bw[node.index()]
            || (gbps == best_bw[node.index()] && latency_us > best_lat[node.index()])
        {
            continue;
        }
        if node == b {
            break;
        }
        if node != a && !transit_ok(topo, node) {
            continue;
        }
        for (eid, t, link) in topo.links_from(node) {
            if !topo.link_usable(eid) || !on_the_way(topo, t, ends) {
                continue;
            }
            if matches!(link.kind, LinkKind::InterSocket { .. }) && !host_end {
                continue;
            }
            if matches!(link.kind, LinkKind::Pcie { .. }) && !pcie_ok {
                continue;
            }
            let bw = gbps.min(topo.striped_gbps(eid));
            let lat = latency_us + link.latency_us;
            let ti = t.index();
            if bw > best_bw[ti] || (bw == best_bw[ti] && lat < best_lat[ti]) {
                best_bw[ti] = bw;
                best_lat[ti] = lat;
                prev[ti] = Some(eid);
                heap.push(Best {
                    gbps: bw,
                    latency_us: lat,
                    node: t,
                });
            }
        }
    }
    prev[b.index()]?;
    let mut edges = Vec::new();
    let mut at = b;
    while at != a {
        let e = prev[at.index()]?;
        edges.push(e.index() as u32);
        at = topo.link_ends(e).0;
        if edges.len() > n {
            return None;
        }
    }
    edges.reverse();
    Some((edges, best_bw[b.index()], best_lat[b.index()]))
}

/// Whether a path between machines `ends` may enter `node`: switches of the fabric (network
/// or NVLink) always, the inside of a machine (GPUs, CPUs, PCIe, NICs) only on the two end
/// machines. Data between two machines never gains by entering a third one, and on a cluster
/// this keeps a search to two machines instead of all of them.
fn on_the_way(topo: &Topology, node: NodeId, ends: (u32, u32)) -> bool {
    let n = topo.node(node);
    matches!(n.kind, NodeKind::NetSwitch | NodeKind::NvSwitch)
        || n.host == ends.0
        || n.host == ends.1
}

/// Nodes a hop may pass through: everything but memories, except that a CPU's root complex
/// carries PCIe peer-to-peer traffic between devices of its socket.
fn transit_ok(topo: &Topology, node: NodeId) -> bool {
    !matches!(topo.node(node).kind, NodeKind::Gpu(_))
}

/// The host memory nearest a GPU (the socket it attaches to).
pub fn nearest_host(topo: &Topology, gpu: u32) -> Option<Location> {
    let id = topo.gpu(gpu).ok()?;
    topo.attached_cpu(id)
        .map(|c| Location::Host(c.index() as u32))
}

/// A one-hop route between two GPUs, if one exists.
pub fn direct_route(topo: &Topology, a: u32, b: u32) -> Option<Route> {
    hop(topo, Location::Gpu(a), Location::Gpu(b)).map(|h| Route { hops: vec![h] })
}

/// Routes staged through host memory: through the source's socket and the destination's.
pub fn host_staged_routes(topo: &Topology, a: u32, b: u32) -> Vec<Route> {
    let mut v: Vec<Route> = Vec::new();
    for h in [nearest_host(topo, a), nearest_host(topo, b)]
        .into_iter()
        .flatten()
    {
        if let (Some(x), Some(y)) = (
            hop(topo, Location::Gpu(a), h),
            hop(topo, h, Location::Gpu(b)),
        ) {
            let r = Route { hops: vec![x, y] };
            if !v.contains(&r) {
                v.push(r);
            }
        }
    }
    v
}

/// Routes relayed through exactly one allowed GPU `r` (each hop direct), best first.
pub fn relay_routes(topo: &Topology, a: u32, b: u32, allowed: &dyn Fn(u32) -> bool) -> Vec<Route> {
    relay_routes_with(topo, a, b, allowed, &|x, y| {
        hop(topo, Location::Gpu(x), Location::Gpu(y))
    })
}

/// [`relay_routes`] with the direct hop between two GPUs given by `hop_between` (a cache of
/// [`hop`]: every pair of a job asks for the same hops, one widest-path search each).
///
/// Relays sit on the machine of `a` or of `b`: a relay on a third machine crosses the network
/// twice, where the direct route crosses it once, and would cost a search per GPU of a
/// cluster for every pair.
pub fn relay_routes_with(
    topo: &Topology,
    a: u32,
    b: u32,
    allowed: &dyn Fn(u32) -> bool,
    hop_between: &dyn Fn(u32, u32) -> Option<Hop>,
) -> Vec<Route> {
    let host = |g: u32| topo.gpu(g).ok().map(|id| topo.node(id).host);
    let (ha, hb) = (host(a), host(b));
    let mut v: Vec<Route> = (0..topo.gpu_count())
        .filter(|&r| {
            let h = host(r);
            h == ha || h == hb
        })
        .filter(|r| *r != a && *r != b && allowed(*r))
        .filter_map(|r| {
            let x = hop_between(a, r)?;
            let y = hop_between(r, b)?;
            Some(Route { hops: vec![x, y] })
        })
        .collect();
    v.sort_by(|x, y| {
        y.gbps()
            .total_cmp(&x.gbps())
            .then(x.latency_us().total_cmp(&y.latency_us()))
    });
    v
}

/// Capacities in the max-flow graph are integer MB/s, so the flow is exact and deterministic.
const MBPS_PER_GBPS: f64 = 1000.0;
/// At most this many paths are taken from a flow decomposition (a named search budget).
pub const MAX_FLOW_PATHS: usize = 32;

/// The maximum flow from GPU `a` to GPU `b` in GB/s over usable links, passing only through
/// GPUs that `allowed` admits, with its decomposition into routes (each with its share of the
/// flow, GB/s), widest first.
///
/// Arguments: the masked topology, source and destination GPU, the relay rule.
/// Returns: (max-flow GB/s, routes with rates). Complexity: Dinic's, O(V^2 E), on the topology.
/// Source: [Temucin-2021] (split a copy over every path at once).
pub fn max_flow_routes(
    topo: &Topology,
    a: u32,
    b: u32,
    allowed: &dyn Fn(u32) -> bool,
) -> Result<(f64, Vec<(Route, f64)>)> {
    let (src, dst) = (topo.gpu(a)?, topo.gpu(b)?);
    let mut g: DiGraph<(), u64> =
        DiGraph::with_capacity(topo.graph().node_count(), topo.graph().edge_count());
    for _ in 0..topo.graph().node_count() {
        g.add_node(());
    }
    let mut map: Vec<LinkId> = Vec::new();
    let gpu_ok = |n: NodeId| match topo.node(n).gpu() {
        Some(gi) => n == src || n == dst || allowed(gi.index),
        None => true,
    };
    for (eid, x, y, link) in topo.links() {
        if !topo.link_usable(eid) || y == src || x == dst || !gpu_ok(x) || !gpu_ok(y) {
            continue;
        }
        let cap = (link.gbps * MBPS_PER_GBPS).round() as u64;
        if cap == 0 {
            continue;
        }
        g.add_edge(NodeIndex::new(x.index()), NodeIndex::new(y.index()), cap);
        map.push(eid);
    }
    let (total, mut flow) =
        petgraph::algo::dinics(&g, NodeIndex::new(src.index()), NodeIndex::new(dst.index()));
    let mut routes = Vec::new();
    let n = topo.graph().node_count();
    while routes.len() < MAX_FLOW_PATHS {
        // Depth-first walk along edges that still carry flow.
        let mut path: Vec<usize> = Vec::new();
        let mut seen = vec![false; n];
        let mut at = src.index();
        seen[at] = true;
        let mut stack_edges: Vec<Vec<usize>> = vec![out_edges(&g, &flow, at)];
        loop {
            if at == dst.index() {
                break;
            }
            let Some(frame) = stack_edges.last_mut() else {
                break;
            };
            match frame.pop() {
                Some(e) => {
                    let t = g.raw_edges()[e].target().index();
                    if !seen[t] {
                        seen[t] = true;
                        path.push(e);
                        at = t;
                        stack_edges.push(out_edges(&g, &flow, t));
                    }
                }
                None => {
                    stack_edges.pop();
                    match path.pop() {
                        Some(e) => at = g.raw_edges()[e].source().index(),
                        None => break,
                    }
                }
            }
        }
        if at != dst.index() || path.is_empty() {
            break;
        }
        let bottleneck = path.iter().map(|e| flow[*e]).min().unwrap_or(0);
        if bottleneck == 0 {
            break;
        }
        for e in &path {
            flow[*e] -= bottleneck;
        }
        let links: Vec<LinkId> = path.iter().map(|e| map[*e]).collect();
        if let Some(route) = route_from_links(topo, &links) {
            routes.push((route, bottleneck as f64 / MBPS_PER_GBPS));
        }
    }
    routes.sort_by(|x, y| y.1.total_cmp(&x.1));
    Ok((total as f64 / MBPS_PER_GBPS, routes))
}

fn out_edges(g: &DiGraph<(), u64>, flow: &[u64], node: usize) -> Vec<usize> {
    let mut v: Vec<usize> = g
        .edges(NodeIndex::new(node))
        .filter(|e| flow[petgraph::visit::EdgeRef::id(e).index()] > 0)
        .map(|e| petgraph::visit::EdgeRef::id(&e).index())
        .collect();
    // Pop order: largest flow last, so it is tried first.
    v.sort_by_key(|e| flow[*e]);
    v
}

/// Cut a physical path into hops: at every GPU it passes (a relay), before the inter-socket
/// link when it joins two GPUs (staging in the sending socket's memory), and at a CPU it passes
/// between two GPUs that may not use PCIe peer-to-peer (staging in that socket's memory).
/// None when the path does not end at a memory, or joins two such GPUs over PCIe without
/// passing a CPU.
pub fn route_from_links(topo: &Topology, links: &[LinkId]) -> Option<Route> {
    let mut hops = Vec::new();
    let (first, _) = topo.link_ends(*links.first()?);
    let mut from = node_location(topo, first)?;
    let mut cur: Vec<LinkId> = Vec::new();
    let finish = |from: Location, to: Location, cur: &[LinkId]| Hop {
        from,
        to,
        edges: cur.iter().map(|e| e.index() as u32).collect(),
        gbps: cur
            .iter()
            .map(|e| topo.striped_gbps(*e))
            .fold(f64::INFINITY, f64::min),
        latency_us: cur.iter().map(|e| topo.link(*e).latency_us).sum(),
    };
    // The GPU each link leads towards: where the hop it belongs to ends, unless staged sooner.
    let mut next_gpu: Vec<Option<NodeId>> = vec![None; links.len()];
    let mut ahead = None;
    for (i, &e) in links.iter().enumerate().rev() {
        let y = topo.link_ends(e).1;
        if topo.node(y).gpu().is_some() {
            ahead = Some(y);
        }
        next_gpu[i] = ahead;
    }
    let gpu_node = |loc: Location| match loc {
        Location::Gpu(g) => topo.gpu(g).ok(),
        Location::Host(_) => None,
    };
    for (i, &e) in links.iter().enumerate() {
        let (x, y) = topo.link_ends(e);
        let crosses = matches!(topo.link(e).kind, LinkKind::InterSocket { .. });
        if crosses && matches!(from, Location::Gpu(_)) && !cur.is_empty() {
            // Stage in the socket we are leaving.
            let here = node_location(topo, x)?;
            hops.push(finish(from, here, &cur));
            cur.clear();
            from = here;
        }
        cur.push(e);
        let peers_refused = |a: Option<NodeId>, b: Option<NodeId>| match (a, b) {
            (Some(a), Some(b)) => !topo.pcie_peer_ok(a, b),
            _ => false,
        };
        if topo.node(y).cpu().is_some() && peers_refused(gpu_node(from), next_gpu[i]) {
            let here = node_location(topo, y)?;
            hops.push(finish(from, here, &cur));
            cur.clear();
            from = here;
            continue;
        }
        if let Some(loc @ Location::Gpu(_)) = node_location(topo, y) {
            let over_pcie = cur
                .iter()
                .any(|l| matches!(topo.link(*l).kind, LinkKind::Pcie { .. }));
            if over_pcie && peers_refused(gpu_node(from), Some(y)) {
                return None;
            }
            hops.push(finish(from, loc, &cur));
            cur.clear();
            from = loc;
        }
    }
    if !cur.is_empty() {
        return None;
    }
    Some(Route { hops })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgx1() -> Topology {
        relaycc_topo::preset("dgx1-v100").unwrap()
    }

    #[test]
    fn direct_hops_prefer_nvlink() {
        let t = dgx1();
        let h = hop(&t, Location::Gpu(0), Location::Gpu(3)).unwrap();
        assert_eq!(h.edges.len(), 1);
        assert!((h.gbps - 48.4).abs() < 1e-9);
        // 0 and 7 share no NVLink and sit on different sockets: no peer-to-peer hop.
        assert!(hop(&t, Location::Gpu(0), Location::Gpu(7)).is_none());
        // 0 and 5: different sockets too.
        assert!(direct_route(&t, 0, 5).is_none());
        let staged = host_staged_routes(&t, 0, 7);
        assert!(!staged.is_empty());
        assert!(
            (staged[0].gbps() - 10.0).abs() < 1e-9,
            "{}",
            staged[0].gbps()
        );
    }

    #[test]
    fn pcie_peer_to_peer_inside_a_socket() {
        let t = relaycc_topo::preset("pcie-4gpu").unwrap();
        let h = hop(&t, Location::Gpu(0), Location::Gpu(2)).unwrap();
        assert_eq!(h.edges.len(), 4, "GPU0 -> PCIe0 -> CPU0 -> PCIe1 -> GPU2");
    }

    #[test]
    fn relays_through_gpu3_and_4() {
        let t = dgx1();
        let all = |_| true;
        let r = relay_routes(&t, 0, 7, &all);
        assert_eq!(r[0].names(&t), ["GPU0", "GPU4", "GPU7"]);
        assert!((r[0].gbps() - 48.4).abs() < 1e-9);
        assert!(r.iter().any(|x| x.names(&t) == ["GPU0", "GPU3", "GPU7"]));
    }

    #[test]
    fn max_flow_uses_every_nvlink_and_pcie() {
        let t = dgx1();
        let all = |_| true;
        let (bound, routes) = max_flow_routes(&t, 0, 7, &all).unwrap();
        // 6 NVLink lanes out of GPU0 (145.2) plus the PCIe path (10).
        assert!((bound - 155.2).abs() < 1e-6, "{bound}");
        let sum: f64 = routes.iter().map(|r| r.1).sum();
        assert!((sum - bound).abs() < 1e-6, "{sum}");
        for (r, _) in &routes {
            assert_eq!(r.waypoints().first(), Some(&Location::Gpu(0)));
            assert_eq!(r.waypoints().last(), Some(&Location::Gpu(7)));
        }
        let none = |_| false;
        let (members_only, _) = max_flow_routes(&t, 0, 7, &none).unwrap();
        assert!((members_only - 10.0).abs() < 1e-6, "{members_only}");
    }

    #[test]
    fn relay_policy_parses_and_respects_mask() {
        let t = dgx1().with_mask(relaycc_topo::Mask::busy([3])).unwrap();
        assert!(!RelayPolicy::Any.allows(&t, &[0, 7], 3));
        assert!(RelayPolicy::Any.allows(&t, &[0, 7], 4));
        assert!(!RelayPolicy::Members.allows(&t, &[0, 7], 4));
        assert_eq!(
            RelayPolicy::parse("4,5").unwrap(),
            RelayPolicy::List(vec![4, 5])
        );
        assert!(RelayPolicy::parse("x").is_err());
    }
}
