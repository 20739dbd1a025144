//! Host-shift symmetry: the smallest shift of hosts that maps a cluster topology onto itself,
//! so that planners build and simulate one fundamental domain of hosts and fold the rest.
//!
//! A cluster of `H` identical machines on a regular fabric looks the same from every host, or
//! from every host of a scalable unit: moving each host's nodes `p` hosts on (host `h` to host
//! `h + p mod H`, each node to the node of the same ordinal, the position among its host's nodes
//! in index order) and each network switch to its image is an automorphism of the graph.
//! [`Topology::host_symmetry`] finds the smallest such `p` (the *period*) among the divisors of
//! `H`, in increasing order, by building the shift for each candidate and verifying it; it
//! reports `p == H` (the trivial symmetry) when no smaller shift verifies.
//!
//! What a shift must preserve, exactly:
//! - nodes: the kind and its data, names and GPU indices aside (GPU product, compute
//!   capability, PCI bus id, NUMA node, memory, host arena and peer-to-peer flags; CPU info in
//!   full; NIC NUMA node, port rate and PCI bus id), and for GPUs the mask's verdicts
//!   ([`Topology::gpu_present`], [`Topology::gpu_free`]);
//! - links: every directed link goes onto a directed link between the images of its ends with
//!   the same kind, rate, latency and [`Topology::link_usable`] verdict (parallel links between
//!   one pair are matched in index order, so their counts must agree too).
//!
//! Network switches ([`NodeKind::NetSwitch`]) are the *fabric*: they belong to no host,
//! whatever their `host` field says (cluster presets give them the last host's). Their images
//! come from their neighbours' images, layer by layer outwards from the hosts (a leaf's NICs
//! decide its image, a spine's leaves decide its); switches with the same neighbours in lower
//! layers (twins, such as the spines that join every leaf) are matched in index order. A switch
//! no image fits means the candidate fails, so the period found is always a verified
//! automorphism; a twin matching that the links within one layer contradict makes that
//! candidate fail too (the period reported is then larger than the smallest there is, never
//! wrong). Switches that no path joins to a host stay where they are.
//!
//! Measured on the presets (the module's tests check them): one switch, `rail` with all hosts
//! in one scalable unit (`cluster:16xdgx-h100:ib-ndr:rail`, or racks of `gb200-nvl72` as in
//! `cluster:4xgb200-nvl72:ib-ndr:rail`): period 1; `rail` with scalable units of
//! `D` hosts (`cluster:128xdgx-h100:ib-ndr:rail`, 32 hosts per leaf): period `D`, since a ring
//! hop inside a unit stays on its leaf and one across units crosses a spine; `fat-tree` with
//! leaves of `P` down ports and `n` NICs a host: the `lcm(P, n) / n` hosts after which the
//! leaves' pattern repeats (4 for DGX H100 on NDR leaves of 32 down ports, 9 for DGX-1 on EDR
//! leaves of 18). Hosts that end in a partial unit or leaf, or a mask that sets one host apart,
//! give the trivial symmetry.
//!
//! Computing the symmetry costs about O(V + E) per candidate period, with the adjacency sorted
//! once; nothing is cached on the topology.

use std::collections::{HashMap, VecDeque};

use petgraph::graph::{EdgeIndex, NodeIndex};

use crate::graph::{GpuInfo, Link, LinkId, Node, NodeId, NodeKind, Topology};

/// No host: the `host` of a fabric node, and the GPU of a node that is not a GPU.
const NONE: u32 = u32::MAX;

/// Where an element (node or link) sits in its orbit under the shifts: its orbit is
/// `cycles[start..start + len]`, the representative first, and it is element `pos` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Orbit {
    start: u32,
    len: u32,
    pos: u32,
}

/// A host-shift symmetry of a [`Topology`] ([`Topology::host_symmetry`]).
///
/// Moving every host's nodes [`HostSymmetry::period`] hosts on (host `h` to
/// `h + period mod hosts`, each node to the node of the same ordinal in that host, ordinals
/// counting a host's nodes in index order) and every fabric node (network switch) to its image
/// maps the topology onto itself: node kinds and data equal up to names and GPU indices, every
/// directed link onto a link with equal kind, rate, latency and usability under the mask, GPUs
/// onto GPUs equally present and free. The module documentation lists exactly what is compared.
///
/// The shifts by `0, period, 2 x period, ...` form a cyclic group of
/// [`HostSymmetry::periods`] elements. Its *fundamental domain* holds the hosts
/// `0..period` and one representative of every fabric orbit; every node and link is the
/// image of exactly one domain element (its representative, `rep_*`) under `k` periods
/// (`periods_of_*`), with `k` below the size of its orbit. A host node's orbit has `periods()` elements,
/// so `k` is `host / period`; a fabric node's or a fabric-only link's orbit may be smaller
/// (the single switch of a `switch` fabric is fixed by every shift).
///
/// Ids are those of the topology the symmetry was computed from. A node, link or GPU index that
/// topology lacks is treated as fixed by every shift: it is its own representative, its
/// orbit has size 1 and `periods_of_*` gives 0; `host_of_gpu` gives [`HostSymmetry::hosts`]
/// for it.
#[derive(Debug, Clone)]
pub struct HostSymmetry {
    hosts: u32,
    period: u32,
    node_host: Vec<u32>,
    /// Per link, the host of the end that decides its representative (the source's when it
    /// is a host node, else the target's; NONE between fabric nodes).
    edge_host: Vec<u32>,
    node_orbit: Vec<Orbit>,
    node_cycles: Vec<u32>,
    edge_orbit: Vec<Orbit>,
    edge_cycles: Vec<u32>,
    gpu_node: Vec<u32>,
    node_gpu: Vec<u32>,
}

impl HostSymmetry {
    /// Hosts (machines) in the topology: [`Topology::host_count`], 1 for a single machine.
    pub fn hosts(&self) -> u32 {
        self.hosts
    }
    /// The smallest shift, in hosts, that is an automorphism; it divides [`Self::hosts`], and
    /// equals it when no smaller shift is one (the trivial symmetry).
    pub fn period(&self) -> u32 {
        self.period
    }
    /// `hosts / period`: how many images each host node has, the fold factor.
    pub fn periods(&self) -> u32 {
        self.hosts / self.period.max(1)
    }
    /// True when no shift but the identity maps the topology onto itself (`periods() == 1`).
    pub fn is_trivial(&self) -> bool {
        self.periods() == 1
    }
    /// The host of a node, `None` for a fabric node (network switch) or an id the topology
    /// lacks.
    pub fn host_of(&self, n: NodeId) -> Option<u32> {
        match self.node_host.get(n.index()) {
            Some(&h) if h != NONE => Some(h),
            _ => None,
        }
    }
    /// True for a node of the fundamental domain: a host node of hosts `0..period`, or the
    /// representative (lowest index) of a fabric orbit.
    pub fn in_domain(&self, n: NodeId) -> bool {
        self.rep_node(n) == n
    }
    /// The node's image in the domain: a host node shifted back by `host / period` periods (to
    /// the same ordinal in host `host % period`), a fabric node's orbit representative (the
    /// orbit's lowest index).
    pub fn rep_node(&self, n: NodeId) -> NodeId {
        match self.node_orbit.get(n.index()) {
            Some(o) => NodeIndex::new(self.node_cycles[o.start as usize] as usize),
            None => n,
        }
    }
    /// `k` such that `n == shift_node(rep_node(n), k)`, below [`Self::node_orbit_size`]
    /// (`host / period` for a host node).
    pub fn periods_of_node(&self, n: NodeId) -> u32 {
        self.node_orbit.get(n.index()).map_or(0, |o| o.pos)
    }
    /// How many distinct nodes the shifts map `n` onto: [`Self::periods`] for a host node, a
    /// divisor of it for a fabric node (1 for a switch every shift fixes).
    pub fn node_orbit_size(&self, n: NodeId) -> u32 {
        self.node_orbit.get(n.index()).map_or(1, |o| o.len)
    }
    /// The image of `n` after `k` periods (`k x period` hosts on, modulo the hosts).
    pub fn shift_node(&self, n: NodeId, k: u32) -> NodeId {
        match self.node_orbit.get(n.index()) {
            Some(o) => NodeIndex::new(self.node_cycles[step(o, k)] as usize),
            None => n,
        }
    }
    /// True for a link of the fundamental domain (`rep_edge(e) == e`).
    pub fn edge_in_domain(&self, e: LinkId) -> bool {
        self.rep_edge(e) == e
    }
    /// The link's image in the domain. A link with a host end is shifted back until that end
    /// (its source when both are host nodes) lies in hosts `0..period`, so a link within one
    /// host goes to the link between the representatives of its ends; a link between two
    /// fabric nodes goes to its orbit's lowest index.
    pub fn rep_edge(&self, e: LinkId) -> LinkId {
        match self.edge_orbit.get(e.index()) {
            Some(o) => EdgeIndex::new(self.edge_cycles[o.start as usize] as usize),
            None => e,
        }
    }
    /// `k` such that `e == shift_edge(rep_edge(e), k)`, below [`Self::edge_orbit_size`] (the
    /// host of the end `rep_edge` brings into the domain, divided by the period, for a link
    /// with a host end).
    pub fn periods_of_edge(&self, e: LinkId) -> u32 {
        self.edge_orbit.get(e.index()).map_or(0, |o| o.pos)
    }
    /// How many distinct links the shifts map `e` onto: [`Self::periods`] for a link with a
    /// host end, a divisor of it for a link between fabric nodes (1 for one every shift
    /// fixes). Summed over the domain's links it gives the topology's link count.
    pub fn edge_orbit_size(&self, e: LinkId) -> u32 {
        self.edge_orbit.get(e.index()).map_or(1, |o| o.len)
    }
    /// The image of link `e` after `k` periods: the link between the images of its ends that
    /// the verified shift pairs it with.
    pub fn shift_edge(&self, e: LinkId, k: u32) -> LinkId {
        match self.edge_orbit.get(e.index()) {
            Some(o) => EdgeIndex::new(self.edge_cycles[step(o, k)] as usize),
            None => e,
        }
    }
    /// [`Self::rep_node`] in GPU indices: the GPU of the domain the shifts map onto `gpu`.
    pub fn rep_gpu(&self, gpu: u32) -> u32 {
        self.gpu_map(gpu, |n| self.rep_node(n))
    }
    /// [`Self::shift_node`] in GPU indices: GPU `gpu`'s image after `k` periods.
    pub fn shift_gpu(&self, gpu: u32, k: u32) -> u32 {
        self.gpu_map(gpu, |n| self.shift_node(n, k))
    }
    /// The host of GPU `gpu` ([`Self::hosts`] for an index the topology lacks).
    pub fn host_of_gpu(&self, gpu: u32) -> u32 {
        self.gpu_node
            .get(gpu as usize)
            .and_then(|&n| self.host_of(NodeIndex::new(n as usize)))
            .unwrap_or(self.hosts)
    }
    /// `k` such that `gpu == shift_gpu(rep_gpu(gpu), k)`: `host_of_gpu(gpu) / period`.
    pub fn periods_of_gpu(&self, gpu: u32) -> u32 {
        self.gpu_node
            .get(gpu as usize)
            .map_or(0, |&n| self.periods_of_node(NodeIndex::new(n as usize)))
    }

    /// The symmetry of the shifts by multiples of `period` hosts alone (a subgroup), for a
    /// caller whose data repeat only every `period` hosts (ranks on some hosts, say): its
    /// domain is hosts `0..period`, its orbits those of the shift by `period / self.period()`
    /// of this one's periods. `None` unless `period` is a multiple of [`Self::period`] that
    /// divides [`Self::hosts`]. Costs O(V + E).
    pub fn with_period(&self, period: u32) -> Option<HostSymmetry> {
        if period == 0 || !period.is_multiple_of(self.period) || !self.hosts.is_multiple_of(period)
        {
            return None;
        }
        let m = period / self.period;
        let node_map: Vec<u32> = (0..self.node_orbit.len())
            .map(|i| self.shift_node(NodeIndex::new(i), m).index() as u32)
            .collect();
        let edge_map: Vec<u32> = (0..self.edge_orbit.len())
            .map(|i| self.shift_edge(EdgeIndex::new(i), m).index() as u32)
            .collect();
        Some(assemble(
            self.hosts,
            period,
            self.node_host.clone(),
            self.edge_host.clone(),
            &node_map,
            &edge_map,
            (self.node_gpu.clone(), self.gpu_node.clone()),
        ))
    }

    fn gpu_map(&self, gpu: u32, f: impl Fn(NodeId) -> NodeId) -> u32 {
        let Some(&n) = self.gpu_node.get(gpu as usize) else {
            return gpu;
        };
        let image = f(NodeIndex::new(n as usize));
        match self.node_gpu.get(image.index()) {
            Some(&g) if g != NONE => g,
            _ => gpu,
        }
    }
}

/// Index into the cycles of the element `k` steps on from the one `o` describes.
fn step(o: &Orbit, k: u32) -> usize {
    let len = u64::from(o.len.max(1));
    let pos = (u64::from(o.pos) + u64::from(k)) % len;
    o.start as usize + pos as usize
}

impl Topology {
    /// The host-shift symmetry of this topology (see [`HostSymmetry`]): the smallest number of
    /// hosts whose shift is a verified automorphism, and the orbits of nodes and links under
    /// it. Costs about O(V + E) per divisor of the host count tried; callers keep the result.
    /// A single machine, hosts with different node counts, or a topology whose nodes all sit
    /// in host 0 give the trivial symmetry.
    pub fn host_symmetry(&self) -> HostSymmetry {
        let prep = Prep::new(self);
        let found = prep.as_ref().and_then(|p| {
            divisors(p.hosts)
                .into_iter()
                .filter(|&d| d < p.hosts)
                .find_map(|d| p.try_period(d).map(|maps| (d, maps)))
        });
        match (prep, found) {
            (Some(p), Some((period, (node_map, edge_map)))) => {
                p.symmetry(period, &node_map, &edge_map)
            }
            _ => trivial(self),
        }
    }
}

/// Divisors of `n` in increasing order.
fn divisors(n: u32) -> Vec<u32> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1u32;
    while u64::from(d) * u64::from(d) <= u64::from(n) {
        if n.is_multiple_of(d) {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

fn is_fabric(n: &Node) -> bool {
    matches!(n.kind, NodeKind::NetSwitch)
}

/// The identity: every node and link its own orbit.
fn trivial(topo: &Topology) -> HostSymmetry {
    let g = topo.graph();
    let hosts = topo.host_count();
    let fixed = |i: usize| Orbit {
        start: i as u32,
        len: 1,
        pos: 0,
    };
    let (node_gpu, gpu_node) = gpu_tables(topo);
    let node_host: Vec<u32> = g
        .node_weights()
        .map(|n| if is_fabric(n) { NONE } else { n.host })
        .collect();
    HostSymmetry {
        hosts,
        period: hosts,
        edge_host: edge_hosts(topo, &node_host),
        node_host,
        node_orbit: (0..g.node_count()).map(fixed).collect(),
        node_cycles: (0..g.node_count() as u32).collect(),
        edge_orbit: (0..g.edge_count()).map(fixed).collect(),
        edge_cycles: (0..g.edge_count() as u32).collect(),
        gpu_node,
        node_gpu,
    }
}

/// Node -> GPU index (NONE for other nodes) and GPU index -> node.
fn gpu_tables(topo: &Topology) -> (Vec<u32>, Vec<u32>) {
    let mut node_gpu = vec![NONE; topo.graph().node_count()];
    let gpu_node: Vec<u32> = topo.gpu_nodes().iter().map(|n| n.index() as u32).collect();
    for (g, &n) in gpu_node.iter().enumerate() {
        node_gpu[n as usize] = g as u32;
    }
    (node_gpu, gpu_node)
}

/// What the mask says of a GPU node: 0 not a GPU, 1 free, 2 busy, 3 absent.
fn gpu_state(topo: &Topology, n: &Node) -> u8 {
    match n.gpu() {
        None => 0,
        Some(g) if !topo.gpu_present(g.index) => 3,
        Some(g) if !topo.gpu_free(g.index) => 2,
        Some(_) => 1,
    }
}

/// True when two GPU records agree on everything but the index.
fn same_gpu(a: &GpuInfo, b: &GpuInfo) -> bool {
    a.name == b.name
        && a.compute_capability == b.compute_capability
        && a.pci_bus_id == b.pci_bus_id
        && a.numa == b.numa
        && a.memory_bytes == b.memory_bytes
        && a.host_arena == b.host_arena
        && a.device_arena == b.device_arena
        && a.pcie_p2p == b.pcie_p2p
}

/// True when two nodes are the same kind with the same data, names and GPU indices aside.
fn same_node(a: &Node, b: &Node) -> bool {
    match (&a.kind, &b.kind) {
        (NodeKind::Gpu(x), NodeKind::Gpu(y)) => same_gpu(x, y),
        (NodeKind::Cpu(x), NodeKind::Cpu(y)) => x == y,
        (NodeKind::Nic(x), NodeKind::Nic(y)) => {
            x.numa == y.numa && x.gbps == y.gbps && x.pci_bus_id == y.pci_bus_id
        }
        (x, y) => std::mem::discriminant(x) == std::mem::discriminant(y),
    }
}

fn same_link(a: &Link, b: &Link) -> bool {
    a.kind == b.kind && a.gbps == b.gbps && a.latency_us == b.latency_us
}

/// Everything about the topology that does not depend on the candidate period.
struct Prep<'a> {
    topo: &'a Topology,
    hosts: u32,
    /// Nodes per host (equal for every host, or there is no `Prep`).
    per_host: usize,
    /// Host of each node, NONE for fabric nodes.
    host: Vec<u32>,
    /// Ordinal of each host node within its host.
    ordinal: Vec<u32>,
    /// The node of (host, ordinal) at `host * per_host + ordinal`.
    by_host: Vec<u32>,
    /// Each node's mask verdict ([`gpu_state`]).
    state: Vec<u8>,
    /// Out-links sorted by (target, link index): those of node `n` are
    /// `out[out_start[n]..out_start[n + 1]]`, as (target, link).
    out_start: Vec<u32>,
    out: Vec<(u32, u32)>,
    /// For each link, its position among the parallel links of its (source, target) pair and
    /// their count.
    parallel_pos: Vec<u32>,
    parallel_len: Vec<u32>,
    usable: Vec<bool>,
    /// Fabric nodes reached from the hosts, layer by layer (layer 1 touches a host node).
    layers: Vec<Vec<u32>>,
    /// Per fabric node: its neighbours in lower layers (host nodes are layer 0), sorted.
    lower: Vec<Vec<u32>>,
    /// Per layer: fabric nodes by their lower neighbours, each class in index order.
    classes: Vec<HashMap<Vec<u32>, Vec<u32>>>,
    /// Per fabric node: its position in its class.
    class_pos: Vec<u32>,
}

impl<'a> Prep<'a> {
    /// `None` when no shift but the identity can be an automorphism: one host, or hosts with
    /// different node counts.
    fn new(topo: &'a Topology) -> Option<Self> {
        let g = topo.graph();
        let hosts = topo.host_count();
        if hosts < 2 {
            return None;
        }
        let nn = g.node_count();
        let host: Vec<u32> = g
            .node_weights()
            .map(|n| if is_fabric(n) { NONE } else { n.host })
            .collect();
        let mut count = vec![0u32; hosts as usize];
        let mut ordinal = vec![NONE; nn];
        for (i, &h) in host.iter().enumerate() {
            if h != NONE {
                ordinal[i] = count[h as usize];
                count[h as usize] += 1;
            }
        }
        let per_host = count[0] as usize;
        if per_host == 0 || count.iter().any(|&c| c as usize != per_host) {
            return None;
        }
        let mut by_host = vec![0u32; per_host * hosts as usize];
        for (i, &h) in host.iter().enumerate() {
            if h != NONE {
                by_host[h as usize * per_host + ordinal[i] as usize] = i as u32;
            }
        }
        let state = g.node_weights().map(|n| gpu_state(topo, n)).collect();

        let edges = g.raw_edges();
        // Out-links bucketed by source (counting sort), then each bucket sorted by target: linear
        // but for the switches' large buckets.
        let mut out_start = vec![0u32; nn + 1];
        for e in edges {
            out_start[e.source().index() + 1] += 1;
        }
        for i in 0..nn {
            out_start[i + 1] += out_start[i];
        }
        let mut fill = out_start.clone();
        let mut out = vec![(0u32, 0u32); edges.len()];
        for (i, e) in edges.iter().enumerate() {
            let slot = &mut fill[e.source().index()];
            out[*slot as usize] = (e.target().index() as u32, i as u32);
            *slot += 1;
        }
        let mut parallel_pos = vec![0u32; edges.len()];
        let mut parallel_len = vec![0u32; edges.len()];
        for n in 0..nn {
            let bucket = &mut out[out_start[n] as usize..out_start[n + 1] as usize];
            bucket.sort_unstable();
            let mut i = 0;
            while i < bucket.len() {
                let j = i + bucket[i..]
                    .iter()
                    .take_while(|x| x.0 == bucket[i].0)
                    .count();
                for (k, x) in bucket[i..j].iter().enumerate() {
                    parallel_pos[x.1 as usize] = k as u32;
                    parallel_len[x.1 as usize] = (j - i) as u32;
                }
                i = j;
            }
        }
        let usable = g.edge_indices().map(|e| topo.link_usable(e)).collect();

        // Layers of the fabric: breadth-first from every host node over links either way.
        let mut layer = vec![NONE; nn];
        let mut queue = VecDeque::new();
        for (i, &h) in host.iter().enumerate() {
            if h != NONE {
                layer[i] = 0;
                queue.push_back(i);
            }
        }
        let mut layers: Vec<Vec<u32>> = Vec::new();
        while let Some(n) = queue.pop_front() {
            for m in g.neighbors_undirected(NodeIndex::new(n)) {
                let m = m.index();
                if layer[m] == NONE {
                    layer[m] = layer[n] + 1;
                    let l = layer[m] as usize;
                    if layers.len() < l {
                        layers.resize(l, Vec::new());
                    }
                    layers[l - 1].push(m as u32);
                    queue.push_back(m);
                }
            }
        }
        let mut lower = vec![Vec::new(); nn];
        for l in &mut layers {
            l.sort_unstable();
            for &f in l.iter() {
                let mut ns: Vec<u32> = g
                    .neighbors_undirected(NodeIndex::new(f as usize))
                    .map(|m| m.index() as u32)
                    .filter(|&m| layer[m as usize] < layer[f as usize])
                    .collect();
                ns.sort_unstable();
                ns.dedup();
                lower[f as usize] = ns;
            }
        }
        let mut class_pos = vec![0u32; nn];
        let classes = layers
            .iter()
            .map(|l| {
                let mut map: HashMap<Vec<u32>, Vec<u32>> = HashMap::new();
                for &f in l {
                    let class = map.entry(lower[f as usize].clone()).or_default();
                    class_pos[f as usize] = class.len() as u32;
                    class.push(f);
                }
                map
            })
            .collect();
        Some(Prep {
            topo,
            hosts,
            per_host,
            host,
            ordinal,
            by_host,
            state,
            out_start,
            out,
            parallel_pos,
            parallel_len,
            usable,
            layers,
            lower,
            classes,
            class_pos,
        })
    }

    /// The node and link maps of a shift by `period` hosts, when it is an automorphism.
    fn try_period(&self, period: u32) -> Option<(Vec<u32>, Vec<u32>)> {
        let g = self.topo.graph();
        let nn = g.node_count();
        let mut map = vec![NONE; nn];
        let mut used = vec![false; nn];
        for (i, node) in g.node_weights().enumerate() {
            let h = self.host[i];
            if h == NONE {
                continue;
            }
            let to_host = ((u64::from(h) + u64::from(period)) % u64::from(self.hosts)) as usize;
            let m = self.by_host[to_host * self.per_host + self.ordinal[i] as usize];
            if self.state[i] != self.state[m as usize]
                || !same_node(node, &g[NodeIndex::new(m as usize)])
            {
                return None;
            }
            map[i] = m;
            used[m as usize] = true;
        }
        for (layer, classes) in self.layers.iter().zip(&self.classes) {
            for &f in layer {
                let f = f as usize;
                let mut key: Vec<u32> = self.lower[f].iter().map(|&x| map[x as usize]).collect();
                key.sort_unstable();
                let image_class = classes.get(&key)?;
                let own_class = classes.get(&self.lower[f])?;
                if image_class.len() != own_class.len() {
                    return None;
                }
                let m = image_class[self.class_pos[f] as usize];
                if used[m as usize] {
                    return None;
                }
                used[m as usize] = true;
                map[f] = m;
            }
        }
        // Fabric nodes no path joins to a host stay put.
        for i in 0..nn {
            if map[i] == NONE {
                if used[i] {
                    return None;
                }
                map[i] = i as u32;
                used[i] = true;
            }
        }

        let edges = g.raw_edges();
        let mut edge_map = vec![NONE; edges.len()];
        for (i, e) in edges.iter().enumerate() {
            let (s, t) = (
                map[e.source().index()] as usize,
                map[e.target().index()] as usize,
            );
            let out = &self.out[self.out_start[s] as usize..self.out_start[s + 1] as usize];
            let first = out.partition_point(|x| x.0 < t as u32);
            let group = out[first..].iter().take_while(|x| x.0 == t as u32).count();
            if group != self.parallel_len[i] as usize {
                return None;
            }
            let image = out[first + self.parallel_pos[i] as usize].1 as usize;
            if !same_link(&e.weight, &edges[image].weight) || self.usable[i] != self.usable[image] {
                return None;
            }
            edge_map[i] = image as u32;
        }
        Some((map, edge_map))
    }

    /// The symmetry of a verified shift by `period` hosts, its orbits decomposed.
    fn symmetry(&self, period: u32, node_map: &[u32], edge_map: &[u32]) -> HostSymmetry {
        let (node_gpu, gpu_node) = gpu_tables(self.topo);
        assemble(
            self.hosts,
            period,
            self.host.clone(),
            edge_hosts(self.topo, &self.host),
            node_map,
            edge_map,
            (node_gpu, gpu_node),
        )
    }
}

/// Per link, the host that decides its representative ([`HostSymmetry::rep_edge`]).
fn edge_hosts(topo: &Topology, node_host: &[u32]) -> Vec<u32> {
    topo.graph()
        .raw_edges()
        .iter()
        .map(|e| {
            let s = node_host[e.source().index()];
            if s != NONE {
                s
            } else {
                node_host[e.target().index()]
            }
        })
        .collect()
}

/// The symmetry whose shift by one period moves node `i` to `node_map[i]` and link `i` to
/// `edge_map[i]` (a verified automorphism), its orbits decomposed: host nodes start their
/// cycles in the domain hosts `0..period`, links where their deciding end is there, fabric
/// nodes and links between them at their lowest index.
fn assemble(
    hosts: u32,
    period: u32,
    node_host: Vec<u32>,
    edge_host: Vec<u32>,
    node_map: &[u32],
    edge_map: &[u32],
    (node_gpu, gpu_node): (Vec<u32>, Vec<u32>),
) -> HostSymmetry {
    let in_domain = |h: u32| h == NONE || h < period;
    let node_starts = (0..node_map.len() as u32).filter(|&i| in_domain(node_host[i as usize]));
    let (node_orbit, node_cycles) = cycles(node_map, node_starts);
    let edge_starts = (0..edge_map.len() as u32).filter(|&i| in_domain(edge_host[i as usize]));
    let (edge_orbit, edge_cycles) = cycles(edge_map, edge_starts);
    HostSymmetry {
        hosts,
        period,
        node_host,
        edge_host,
        node_orbit,
        node_cycles,
        edge_orbit,
        edge_cycles,
        gpu_node,
        node_gpu,
    }
}

/// Decompose the permutation `map` into cycles, each starting at the first of `starts` (in
/// their order) it holds.
fn cycles(map: &[u32], starts: impl Iterator<Item = u32>) -> (Vec<Orbit>, Vec<u32>) {
    let unset = Orbit {
        start: NONE,
        len: 1,
        pos: 0,
    };
    let mut orbit = vec![unset; map.len()];
    let mut flat = Vec::with_capacity(map.len());
    // A permutation covers every element from the starts; the rest (none, for a verified
    // shift) become cycles of their own so that every id has an orbit.
    for s in starts.chain(0..map.len() as u32) {
        if orbit[s as usize].start != NONE {
            continue;
        }
        let start = flat.len() as u32;
        let mut x = s;
        let mut pos = 0u32;
        loop {
            orbit[x as usize] = Orbit { start, len: 0, pos };
            flat.push(x);
            pos += 1;
            x = map[x as usize];
            if x as usize >= map.len() || orbit[x as usize].start != NONE {
                break;
            }
        }
        for &y in &flat[start as usize..] {
            orbit[y as usize].len = pos;
        }
    }
    (orbit, flat)
}

#[cfg(test)]
mod tests;
