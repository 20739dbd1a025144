//! Building a [`Topology`]: [`TopologyBuilder`] names nodes by the model's conventions, adds
//! links in both directions, and checks the model's rules before it hands out a topology (with
//! its PCIe tree and NVSwitch fabrics worked out once).

use std::collections::{BTreeMap, VecDeque};

use petgraph::graph::DiGraph;
use petgraph::visit::EdgeRef;

use crate::error::{Result, TopoError};
use crate::graph::{
    CpuInfo, GpuInfo, Link, LinkId, LinkKind, NicInfo, Node, NodeId, NodeKind, Topology,
};
use crate::mask::Mask;
use crate::rates::{CpuFamily, Fabric, NvLinkGen};

/// Builds a [`Topology`], naming nodes by the model's conventions and checking its rules.
///
/// # Example
/// ```
/// use relaycc_topo::{TopologyBuilder, GpuInfo, rates::{CpuFamily, NvLinkGen}};
/// let mut b = TopologyBuilder::new("two-gpus");
/// let cpu = b.add_cpu(0, CpuFamily::IntelSkylake);
/// let sw = b.add_pcie_switch();
/// b.pcie(cpu, sw, 3, 16);
/// let g0 = b.add_gpu(GpuInfo::new(0));
/// let g1 = b.add_gpu(GpuInfo::new(1));
/// b.pcie(sw, g0, 3, 16);
/// b.pcie(sw, g1, 3, 16);
/// b.nvlink(g0, g1, NvLinkGen::V2, 2);
/// let topo = b.build().unwrap();
/// assert_eq!(topo.gpu_count(), 2);
/// assert_eq!(topo.nvlink_lanes(topo.gpu(0).unwrap(), topo.gpu(1).unwrap()), 2);
/// ```
#[derive(Debug)]
pub struct TopologyBuilder {
    name: String,
    graph: DiGraph<Node, Link>,
    host: u32,
    prefix: String,
    counters: BTreeMap<&'static str, u32>,
}

impl TopologyBuilder {
    /// A builder for a topology called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        TopologyBuilder {
            name: name.into(),
            graph: DiGraph::new(),
            host: 0,
            prefix: String::new(),
            counters: BTreeMap::new(),
        }
    }
    /// Start adding the nodes of host `host` of a cluster: later non-GPU names get the prefix
    /// `node<host>/`, and per-host counters (switch numbers) restart.
    pub fn begin_host(&mut self, host: u32) {
        self.host = host;
        self.prefix = format!("node{host}/");
        self.counters.clear();
    }
    /// The host that nodes are being added to.
    pub fn current_host(&self) -> u32 {
        self.host
    }
    fn next(&mut self, key: &'static str) -> u32 {
        let c = self.counters.entry(key).or_insert(0);
        let v = *c;
        *c += 1;
        v
    }
    /// Add a node with an explicit name and kind (importers use this).
    pub fn add_node(&mut self, name: String, kind: NodeKind) -> NodeId {
        self.graph.add_node(Node {
            name,
            host: self.host,
            kind,
        })
    }
    /// Add GPU `info.index`, named `GPU<index>`.
    pub fn add_gpu(&mut self, info: GpuInfo) -> NodeId {
        let name = format!("GPU{}", info.index);
        self.add_node(name, NodeKind::Gpu(info))
    }
    /// Add the socket of NUMA node `numa`, named `CPU<numa>`, with its family's memory rate.
    pub fn add_cpu(&mut self, numa: u32, family: CpuFamily) -> NodeId {
        let name = format!("{}CPU{numa}", self.prefix);
        self.add_node(
            name,
            NodeKind::Cpu(CpuInfo {
                numa,
                family,
                host_mem_gbps: family.host_mem_gbps(),
                affinity: None,
            }),
        )
    }
    /// Add a PCIe switch, named `PCIe<n>`.
    pub fn add_pcie_switch(&mut self) -> NodeId {
        let n = self.next("pcie");
        let name = format!("{}PCIe{n}", self.prefix);
        self.add_node(name, NodeKind::PcieSwitch)
    }
    /// Add a PCIe host bridge (root complex), named `HostBridge<n>`.
    pub fn add_host_bridge(&mut self) -> NodeId {
        let n = self.next("hostbridge");
        let name = format!("{}HostBridge{n}", self.prefix);
        self.add_node(name, NodeKind::HostBridge)
    }
    /// Add an NVSwitch, named `NVSwitch<n>`.
    pub fn add_nvswitch(&mut self) -> NodeId {
        let n = self.next("nvswitch");
        let name = format!("{}NVSwitch{n}", self.prefix);
        self.add_node(name, NodeKind::NvSwitch)
    }
    /// Add a network switch of a cluster fabric, named `NetSwitch<n>` (never host-prefixed).
    pub fn add_net_switch(&mut self) -> NodeId {
        let n = self.next("netswitch");
        self.add_node(format!("NetSwitch{n}"), NodeKind::NetSwitch)
    }
    /// Add a NIC, named after `info.name` (host-prefixed in clusters).
    pub fn add_nic(&mut self, mut info: NicInfo) -> NodeId {
        let name = format!("{}{}", self.prefix, info.name);
        info.name = name.clone();
        self.add_node(name, NodeKind::Nic(info))
    }
    /// Mutable access to a node added earlier (importers fill in details late).
    pub fn node_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.graph.node_weight_mut(id)
    }
    /// Read access to the nodes added so far.
    pub fn graph(&self) -> &DiGraph<Node, Link> {
        &self.graph
    }
    /// Join `a` and `b` with a full-duplex link of `kind` at its table rate and latency.
    pub fn connect(&mut self, a: NodeId, b: NodeId, kind: LinkKind) -> (LinkId, LinkId) {
        self.connect_with(a, b, kind, kind.default_gbps(), kind.default_latency_us())
    }
    /// Join `a` and `b` with a full-duplex link of `kind`, `gbps` each way and `latency_us`.
    pub fn connect_with(
        &mut self,
        a: NodeId,
        b: NodeId,
        kind: LinkKind,
        gbps: f64,
        latency_us: f64,
    ) -> (LinkId, LinkId) {
        let link = Link {
            kind,
            gbps,
            latency_us,
        };
        (
            self.graph.add_edge(a, b, link),
            self.graph.add_edge(b, a, link),
        )
    }
    /// Add one directed link (importers of relaycc JSON use this; links may be asymmetric).
    pub fn add_directed(&mut self, from: NodeId, to: NodeId, link: Link) -> LinkId {
        self.graph.add_edge(from, to, link)
    }
    /// NVLink bond of `lanes` links of generation `generation` between `a` and `b`.
    pub fn nvlink(&mut self, a: NodeId, b: NodeId, generation: NvLinkGen, lanes: u32) {
        self.connect(a, b, LinkKind::Nvlink { generation, lanes });
    }
    /// PCIe link from `parent` (switch, host bridge or CPU) down to `child`.
    pub fn pcie(&mut self, parent: NodeId, child: NodeId, generation: u8, width: u32) {
        self.connect(parent, child, LinkKind::Pcie { generation, width });
    }
    /// Inter-socket link between two CPU nodes.
    pub fn inter_socket(&mut self, a: NodeId, b: NodeId, family: CpuFamily) {
        self.connect(a, b, LinkKind::InterSocket { family });
    }
    /// Network link between a NIC and a network switch.
    pub fn network(&mut self, nic: NodeId, switch: NodeId, fabric: Fabric, gbps: f64) {
        let kind = LinkKind::Network { fabric };
        self.connect_with(nic, switch, kind, gbps, kind.default_latency_us());
    }

    /// Check the model's rules and build the topology.
    ///
    /// Rules: node names are unique and not empty; GPU indices are exactly 0..n; no link joins a
    /// node to itself; every rate is finite and positive and every latency finite and >= 0.
    /// Hosts come out numbered 0..h in the order of the numbers given (a file's hosts 3 and
    /// 4,000,000,000 are hosts 0 and 1), so what is sized per host stays sized by the machine.
    pub fn build(mut self) -> Result<Topology> {
        renumber_hosts(&mut self.graph);
        let invalid = |message: String| TopoError::Invalid {
            topology: self.name.clone(),
            message,
        };
        let mut by_name = BTreeMap::new();
        let mut gpus: Vec<Option<NodeId>> = Vec::new();
        for id in self.graph.node_indices() {
            let node = &self.graph[id];
            if node.name.is_empty() {
                return Err(invalid(format!("node {} has an empty name", id.index())));
            }
            if by_name.insert(node.name.clone(), id).is_some() {
                return Err(invalid(format!("two nodes are named {:?}", node.name)));
            }
            if let Some(g) = node.gpu() {
                let i = g.index as usize;
                if i >= 1 << 20 {
                    return Err(invalid(format!("GPU index {i} is out of range")));
                }
                if gpus.len() <= i {
                    gpus.resize(i + 1, None);
                }
                if gpus[i].replace(id).is_some() {
                    return Err(invalid(format!("two GPUs have index {i}")));
                }
            }
        }
        let gpus = gpus
            .into_iter()
            .enumerate()
            .map(|(i, g)| g.ok_or_else(|| invalid(format!("GPU indices skip {i}"))))
            .collect::<Result<Vec<_>>>()?;
        for e in self.graph.edge_references() {
            let (a, b) = (&self.graph[e.source()].name, &self.graph[e.target()].name);
            if e.source() == e.target() {
                return Err(invalid(format!("a link joins {a} to itself")));
            }
            let l = e.weight();
            if !(l.gbps.is_finite() && l.gbps > 0.0) {
                return Err(invalid(format!("link {a} -> {b} has rate {} GB/s", l.gbps)));
            }
            if !(l.latency_us.is_finite() && l.latency_us >= 0.0) {
                return Err(invalid(format!(
                    "link {a} -> {b} has latency {} us",
                    l.latency_us
                )));
            }
        }
        let pcie_parent = pcie_tree(&self.graph);
        let nvswitch_fabric = nvswitch_components(&self.graph);
        Ok(Topology {
            name: self.name,
            graph: self.graph,
            gpus,
            by_name,
            pcie_parent,
            nvswitch_fabric,
            mask: Mask::default(),
            warnings: Vec::new(),
            costs: crate::rates::CostModel::default(),
            link_tables: Default::default(),
        })
    }
}

/// Number the hosts of `graph`'s nodes 0..h, keeping their order (a no-op when they already
/// are).
fn renumber_hosts(graph: &mut DiGraph<Node, Link>) {
    let mut hosts: Vec<u32> = graph.node_weights().map(|n| n.host).collect();
    hosts.sort_unstable();
    hosts.dedup();
    if hosts
        .last()
        .is_none_or(|&last| last as usize + 1 == hosts.len())
    {
        return;
    }
    for n in graph.node_weights_mut() {
        n.host = hosts.binary_search(&n.host).unwrap_or_else(|i| i) as u32;
    }
}

/// Parents in the PCIe tree: breadth-first from each CPU over PCIe links, expanding only
/// through switches and host bridges (devices are leaves).
fn pcie_tree(graph: &DiGraph<Node, Link>) -> Vec<Option<NodeId>> {
    let mut parent = vec![None; graph.node_count()];
    let mut seen = vec![false; graph.node_count()];
    let mut queue = VecDeque::new();
    for id in graph.node_indices() {
        if graph[id].cpu().is_some() {
            seen[id.index()] = true;
            queue.push_back(id);
        }
    }
    while let Some(n) = queue.pop_front() {
        let expands = matches!(
            graph[n].kind,
            NodeKind::Cpu(_) | NodeKind::PcieSwitch | NodeKind::HostBridge
        );
        if !expands {
            continue;
        }
        for e in graph.edges(n) {
            let t = e.target();
            if matches!(e.weight().kind, LinkKind::Pcie { .. }) && !seen[t.index()] {
                seen[t.index()] = true;
                parent[t.index()] = Some(n);
                queue.push_back(t);
            }
        }
    }
    parent
}

/// Connected components of NVSwitch chips (one per NVLink fabric): two switches share a fabric
/// when an NVLink joins them or a GPU has NVLinks to both (DGX-2's six switches per board
/// are joined only through the GPUs).
fn nvswitch_components(graph: &DiGraph<Node, Link>) -> Vec<Option<usize>> {
    let mut comp = vec![None; graph.node_count()];
    let mut next = 0;
    for start in graph.node_indices() {
        if !matches!(graph[start].kind, NodeKind::NvSwitch) || comp[start.index()].is_some() {
            continue;
        }
        let mut stack = vec![start];
        comp[start.index()] = Some(next);
        while let Some(n) = stack.pop() {
            for e in graph.edges(n) {
                let t = e.target();
                if !e.weight().kind.is_nvlink() {
                    continue;
                }
                let hop = |x: NodeId| -> Vec<NodeId> {
                    if matches!(graph[x].kind, NodeKind::NvSwitch) {
                        vec![x]
                    } else if graph[x].gpu().is_some() {
                        graph
                            .edges(x)
                            .filter(|f| {
                                f.weight().kind.is_nvlink()
                                    && matches!(graph[f.target()].kind, NodeKind::NvSwitch)
                            })
                            .map(|f| f.target())
                            .collect()
                    } else {
                        Vec::new()
                    }
                };
                for s in hop(t) {
                    if comp[s.index()].is_none() {
                        comp[s.index()] = Some(next);
                        stack.push(s);
                    }
                }
            }
        }
        next += 1;
    }
    comp
}
