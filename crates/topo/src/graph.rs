//! The topology graph: nodes (GPUs, CPU sockets, switches, NICs) and directed links, and the
//! queries on them (`topology_builder.rs` builds one and checks the model's rules).

use std::collections::BTreeMap;
use std::fmt;

use petgraph::graph::{DiGraph, EdgeIndex, NodeIndex};
use petgraph::visit::EdgeRef;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TopoError};
use crate::mask::Mask;
use crate::rates::{self, CpuFamily, Fabric, NvLinkGen};

/// A node of the topology graph.
pub type NodeId = NodeIndex<u32>;
/// A directed link (edge) of the topology graph.
pub type LinkId = EdgeIndex<u32>;

/// A GPU's compute capability (`7.0` for V100).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major version (7 for V100).
    pub major: u32,
    /// Minor version (0 for V100).
    pub minor: u32,
}

impl ComputeCapability {
    /// From NCCL's `sm` number (70 -> 7.0, 86 -> 8.6).
    pub fn from_sm(sm: u32) -> Self {
        ComputeCapability {
            major: sm / 10,
            minor: sm % 10,
        }
    }
    /// NCCL's `sm` number (7.0 -> 70); `u32::MAX` for a capability past it (a file may give
    /// any numbers), which no table knows.
    pub fn sm(self) -> u32 {
        self.major.saturating_mul(10).saturating_add(self.minor)
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What is known of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The GPU's index (CUDA device order on its host; global across a cluster).
    pub index: u32,
    /// Product name, e.g. `Tesla V100-SXM2-32GB`; empty when unknown (`product` in JSON, where
    /// `name` is the node's).
    #[serde(rename = "product")]
    pub name: String,
    /// Compute capability, when known.
    pub compute_capability: Option<ComputeCapability>,
    /// PCI bus id, e.g. `0000:06:00.0`, when known.
    pub pci_bus_id: Option<String>,
    /// NUMA node of the GPU's host memory affinity, when known.
    pub numa: Option<u32>,
    /// Device memory in bytes, when known.
    pub memory_bytes: Option<u64>,
    /// The device is an arena of its socket's host memory (a logical device of the `host-N`
    /// preset), not a GPU: ranks on such devices share one memory and its caches, which the
    /// link model does not describe, so planners use their shared-memory algorithms for them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_arena: bool,
    /// The device is one rank's view of physical GPU `d`'s memory (several ranks on one GPU,
    /// as on the `shared-gpu-N` preset): devices with the same `d` share one device memory,
    /// so planners give them the shared-memory algorithms that read every rank's buffer where
    /// it lies. In JSON only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_arena: Option<u32>,
    /// True when the driver grants this GPU peer-to-peer access over PCIe (another GPU, or a NIC
    /// carrying a remote GPU's data, reads and writes its memory without host memory). GeForce
    /// drivers refuse it, so every transfer between such a GPU and another GPU that PCIe carries
    /// is staged through host memory; NVLink peers are unaffected. In JSON only when false.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub pcie_p2p: bool,
    /// Device-memory rate measured on this GPU (bytes read plus written per second, GB/s), from
    /// a calibration file's `memories`; `None` takes the rates table's figure for its compute
    /// capability ([`GpuInfo::mem_gbps`]). In JSON only when set.
    #[serde(default, rename = "mem_gbps", skip_serializing_if = "Option::is_none")]
    pub measured_mem_gbps: Option<f64>,
    /// The rate of relaycc's reduce kernel measured on this GPU (bytes read plus written per
    /// second, GB/s), from a calibration file's `memories`; `None` where unmeasured, when a
    /// reduction is taken to run at the memory's rate. In JSON only when set.
    #[serde(
        default,
        rename = "reduce_gbps",
        skip_serializing_if = "Option::is_none"
    )]
    pub measured_reduce_gbps: Option<f64>,
    /// The rate of relaycc's SM copy (the forward kernel) measured on this GPU, within its
    /// memory (bytes read plus written per second, GB/s), from a calibration file's
    /// `memories`; `None` where unmeasured, when an SM copy is taken to run at the memory's
    /// rate. In JSON only when set.
    #[serde(
        default,
        rename = "sm_copy_gbps",
        skip_serializing_if = "Option::is_none"
    )]
    pub measured_sm_copy_gbps: Option<f64>,
    /// The share of this GPU's device-memory rate that its writes alone reach (a memset's
    /// bytes written per second over a device-to-device copy's bytes read plus written),
    /// measured from a calibration file's `memories`; `None` where unmeasured, when the
    /// simulator takes its fitted default. In JSON only when set.
    #[serde(
        default,
        rename = "write_share",
        skip_serializing_if = "Option::is_none"
    )]
    pub measured_write_share: Option<f64>,
}

/// What a calibration measured of one GPU's memory beside its rate: its reduce kernel's and
/// its SM copy's rates (GB/s, bytes read plus written) and the share of the rate its writes
/// alone reach; each `None` where not measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct MemoryMeasures {
    pub reduce_gbps: Option<f64>,
    pub sm_copy_gbps: Option<f64>,
    pub write_share: Option<f64>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl GpuInfo {
    /// A GPU with only its index known.
    pub fn new(index: u32) -> Self {
        GpuInfo {
            index,
            name: String::new(),
            compute_capability: None,
            pci_bus_id: None,
            numa: None,
            memory_bytes: None,
            host_arena: false,
            device_arena: None,
            pcie_p2p: true,
            measured_mem_gbps: None,
            measured_reduce_gbps: None,
            measured_sm_copy_gbps: None,
            measured_write_share: None,
        }
    }
    /// The rate of this GPU's device memory, GB/s (bytes read plus written per second): the
    /// calibrated one where a calibration file measured it, otherwise the rates table's for
    /// its compute capability ([`crate::rates::gpu_mem_gbps`]).
    pub fn mem_gbps(&self) -> f64 {
        self.measured_mem_gbps.unwrap_or_else(|| {
            crate::rates::gpu_mem_gbps(self.compute_capability.map(|cc| cc.sm()))
        })
    }
}

/// A CPU socket (NUMA node) and its memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuInfo {
    /// NUMA node id (as the OS numbers it on its host).
    pub numa: u32,
    /// CPU family; decides inter-socket and memory rates.
    pub family: CpuFamily,
    /// Host memory bandwidth of this socket, GB/s (staging through host memory costs it).
    pub host_mem_gbps: f64,
    /// CPU affinity as the source printed it (`0-19,40-59`), when known.
    pub affinity: Option<String>,
}

/// A network interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicInfo {
    /// Device name, e.g. `mlx5_0` (`device` in JSON, where `name` is the node's).
    #[serde(rename = "device")]
    pub name: String,
    /// NUMA node, when known.
    pub numa: Option<u32>,
    /// Port rate, GB/s per direction, when known (0 when not).
    pub gbps: f64,
    /// PCI bus id, when known.
    pub pci_bus_id: Option<String>,
}

/// What a node is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NodeKind {
    /// A GPU.
    Gpu(GpuInfo),
    /// A CPU socket with its memory (one NUMA node).
    Cpu(CpuInfo),
    /// A PCIe switch (or bridge).
    PcieSwitch,
    /// A PCIe host bridge (root complex) inside a socket.
    HostBridge,
    /// An NVSwitch chip.
    NvSwitch,
    /// A network interface.
    Nic(NicInfo),
    /// A network switch of a cluster fabric.
    NetSwitch,
}

/// A node: its unique name, the host (machine) it sits in, and what it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Unique name: `GPU<i>`, `CPU<n>`, `PCIe<n>`, `HostBridge<n>`, `NVSwitch<n>`, the NIC's
    /// name, `NetSwitch<n>`; in clusters non-GPU names carry a `node<h>/` prefix.
    pub name: String,
    /// The host (machine) index, 0 on a single machine.
    pub host: u32,
    /// What the node is.
    #[serde(flatten)]
    pub kind: NodeKind,
}

impl Node {
    /// The GPU info, if this node is a GPU.
    pub fn gpu(&self) -> Option<&GpuInfo> {
        match &self.kind {
            NodeKind::Gpu(g) => Some(g),
            _ => None,
        }
    }
    /// The CPU info, if this node is a CPU socket.
    pub fn cpu(&self) -> Option<&CpuInfo> {
        match &self.kind {
            NodeKind::Cpu(c) => Some(c),
            _ => None,
        }
    }
    /// The NIC info, if this node is a NIC.
    pub fn nic(&self) -> Option<&NicInfo> {
        match &self.kind {
            NodeKind::Nic(n) => Some(n),
            _ => None,
        }
    }
}

/// The kind of a link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LinkKind {
    /// NVLink of a generation, `lanes` links bonded (NV# in nvidia-smi).
    Nvlink {
        /// NVLink generation.
        generation: NvLinkGen,
        /// Number of bonded links.
        lanes: u32,
    },
    /// PCIe of a generation and width.
    Pcie {
        /// PCIe generation (3 = 8 GT/s).
        generation: u8,
        /// Lane count (16 for x16).
        width: u32,
    },
    /// The link between two CPU sockets (QPI/UPI, X-Bus, Infinity Fabric).
    InterSocket {
        /// CPU family that decides the rate.
        family: CpuFamily,
    },
    /// NVLink-C2C between a Grace CPU and a Hopper GPU.
    C2c,
    /// A network link between a NIC and a network switch.
    Network {
        /// The fabric.
        fabric: Fabric,
    },
}

impl LinkKind {
    /// Nominal rate of this kind from the rates table, GB/s per direction.
    pub fn default_gbps(&self) -> f64 {
        match *self {
            // Rounded to 1e-9 GB/s so that 9 x 40.1 reads back as the 360.9 a file holds.
            LinkKind::Nvlink { generation, lanes } => {
                (generation.lane_gbps() * f64::from(lanes) * 1e9).round() / 1e9
            }
            LinkKind::Pcie { generation, width } => rates::pcie_gbps(generation, width),
            LinkKind::InterSocket { family } => family.inter_socket_gbps(),
            LinkKind::C2c => rates::NVLINK_C2C_GBPS,
            LinkKind::Network { fabric } => fabric.gbps(),
        }
    }
    /// Latency of one traversal of this kind from the rates table, microseconds.
    pub fn default_latency_us(&self) -> f64 {
        match self {
            LinkKind::Nvlink { .. } => rates::NVLINK_LATENCY_US,
            LinkKind::Pcie { .. } => rates::PCIE_HOP_LATENCY_US,
            LinkKind::InterSocket { .. } => rates::INTER_SOCKET_LATENCY_US,
            LinkKind::C2c => rates::C2C_LATENCY_US,
            LinkKind::Network { .. } => rates::NETWORK_HOP_LATENCY_US,
        }
    }
    /// A short label: `NVLink2 x2`, `PCIe3 x16`, `QPI`, `X-Bus`, `C2C`, `ib-edr`.
    pub fn label(&self) -> String {
        match *self {
            LinkKind::Nvlink { generation, lanes } => {
                format!("NVLink{} x{}", generation as u8, lanes)
            }
            LinkKind::Pcie { generation, width } => format!("PCIe{generation} x{width}"),
            LinkKind::InterSocket { family } => match family {
                CpuFamily::IntelBroadwell => "QPI".to_string(),
                CpuFamily::Power9 => "X-Bus".to_string(),
                CpuFamily::Amd => "xGMI".to_string(),
                CpuFamily::Grace => "C2C-socket".to_string(),
                _ => "UPI".to_string(),
            },
            LinkKind::C2c => "C2C".to_string(),
            LinkKind::Network { fabric } => fabric.name().to_string(),
        }
    }
    /// True for NVLink.
    pub fn is_nvlink(&self) -> bool {
        matches!(self, LinkKind::Nvlink { .. })
    }
}

/// One directed link: its kind, capacity and latency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// What the link is.
    #[serde(flatten)]
    pub kind: LinkKind,
    /// Capacity in this direction, GB/s.
    pub gbps: f64,
    /// Latency of one traversal, microseconds.
    pub latency_us: f64,
}

/// The machine (or cluster) as a directed graph, with a mask of busy/absent GPUs and down links.
///
/// Built with [`TopologyBuilder`](crate::TopologyBuilder), from a preset ([`crate::preset`]), or by an importer
/// ([`crate::load`]). Every full-duplex link is two directed edges.
#[derive(Debug, Clone)]
pub struct Topology {
    pub(crate) name: String,
    pub(crate) graph: DiGraph<Node, Link>,
    pub(crate) gpus: Vec<NodeId>,
    pub(crate) by_name: BTreeMap<String, NodeId>,
    pub(crate) pcie_parent: Vec<Option<NodeId>>,
    /// The NVSwitch fabric of each switch node, by node index (`nvlink.rs` reads it).
    pub(crate) nvswitch_fabric: Vec<Option<usize>>,
    pub(crate) mask: Mask,
    pub(crate) warnings: Vec<String>,
    pub(crate) costs: crate::rates::CostModel,
    /// Per link, its usability and routing rate, made on first use ([`crate::link_tables`]).
    pub(crate) link_tables: crate::link_tables::LinkTablesCell,
}

impl Topology {
    /// The costs transfers pay besides link bandwidth (protocols, NVLS, copy and kernel
    /// launches): the rates table's, or a calibration file's.
    pub fn costs(&self) -> &crate::rates::CostModel {
        &self.costs
    }
    /// Replace the cost model (a calibration's `costs`).
    pub fn set_costs(&mut self, costs: crate::rates::CostModel) {
        self.costs = costs;
    }
    /// The topology's name (preset name or file name).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The underlying petgraph graph. Edges that the mask takes down are still in it; use
    /// [`Topology::link_usable`] to filter.
    pub fn graph(&self) -> &DiGraph<Node, Link> {
        &self.graph
    }
    /// Number of GPUs (masked ones included).
    pub fn gpu_count(&self) -> u32 {
        self.gpus.len() as u32
    }
    /// The node of GPU `index`.
    pub fn gpu(&self, index: u32) -> Result<NodeId> {
        self.gpus
            .get(index as usize)
            .copied()
            .ok_or(TopoError::UnknownGpu {
                index,
                count: self.gpu_count(),
            })
    }
    /// True when `gpus` is not empty and every one of them is an arena of host memory
    /// ([`GpuInfo::host_arena`]), as on the `host-N` preset: ranks on them share one memory.
    pub fn shares_host_memory(&self, gpus: &[u32]) -> bool {
        !gpus.is_empty()
            && gpus
                .iter()
                .all(|&g| self.gpu_info(g).is_ok_and(|info| info.host_arena))
    }
    /// The physical GPU whose memory every one of `gpus` is an arena of
    /// ([`GpuInfo::device_arena`]), when `gpus` is not empty and they all share one, as on the
    /// `shared-gpu-N` preset.
    pub fn shared_device(&self, gpus: &[u32]) -> Option<u32> {
        let first = self.gpu_info(*gpus.first()?).ok()?.device_arena?;
        gpus.iter()
            .all(|&g| {
                self.gpu_info(g)
                    .is_ok_and(|i| i.device_arena == Some(first))
            })
            .then_some(first)
    }
    /// True when every one of `gpus` lives in one memory, of a host
    /// ([`Topology::shares_host_memory`]) or of one GPU ([`Topology::shared_device`]): the
    /// shared-memory planner plans for them.
    pub fn shares_memory(&self, gpus: &[u32]) -> bool {
        self.shares_host_memory(gpus) || self.shared_device(gpus).is_some()
    }
    /// The info of GPU `index`.
    pub fn gpu_info(&self, index: u32) -> Result<&GpuInfo> {
        let id = self.gpu(index)?;
        self.graph[id].gpu().ok_or(TopoError::UnknownGpu {
            index,
            count: self.gpu_count(),
        })
    }
    /// All GPU nodes in index order.
    pub fn gpu_nodes(&self) -> &[NodeId] {
        &self.gpus
    }
    /// The GPU index of a node, if it is a GPU.
    pub fn gpu_index(&self, id: NodeId) -> Option<u32> {
        self.graph.node_weight(id)?.gpu().map(|g| g.index)
    }
    /// A node.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.graph[id]
    }
    /// All nodes with their ids.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.graph
            .node_indices()
            .map(move |id| (id, &self.graph[id]))
    }
    /// The node with this name (`GPU3`, `CPU0`, `mlx5_1`, `NVSwitch2`).
    pub fn node_by_name(&self, name: &str) -> Result<NodeId> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| TopoError::UnknownNode {
                name: name.to_string(),
            })
    }
    /// A link.
    pub fn link(&self, id: LinkId) -> &Link {
        &self.graph[id]
    }
    /// The endpoints of a link.
    pub fn link_ends(&self, id: LinkId) -> (NodeId, NodeId) {
        // Edge ids come from this graph, which never removes edges, so they stay valid.
        self.graph
            .edge_endpoints(id)
            .unwrap_or((NodeId::end(), NodeId::end()))
    }
    /// All directed links: (id, from, to, link).
    pub fn links(&self) -> impl Iterator<Item = (LinkId, NodeId, NodeId, &Link)> {
        self.graph
            .edge_references()
            .map(|e| (e.id(), e.source(), e.target(), e.weight()))
    }
    /// Outgoing links of a node: (id, to, link).
    pub fn links_from(&self, id: NodeId) -> impl Iterator<Item = (LinkId, NodeId, &Link)> {
        self.graph
            .edges(id)
            .map(|e| (e.id(), e.target(), e.weight()))
    }
    /// The directed link from `a` to `b` (the fastest, if several).
    pub fn link_between(&self, a: NodeId, b: NodeId) -> Option<LinkId> {
        self.graph
            .edges_connecting(a, b)
            .max_by(|x, y| x.weight().gbps.total_cmp(&y.weight().gbps))
            .map(|e| e.id())
    }
    /// CPU socket nodes.
    pub fn cpus(&self) -> impl Iterator<Item = (NodeId, &CpuInfo)> {
        self.nodes().filter_map(|(id, n)| n.cpu().map(|c| (id, c)))
    }
    /// NIC nodes.
    pub fn nics(&self) -> impl Iterator<Item = (NodeId, &NicInfo)> {
        self.nodes().filter_map(|(id, n)| n.nic().map(|c| (id, c)))
    }
    /// Number of hosts (machines).
    pub fn host_count(&self) -> u32 {
        self.graph
            .node_weights()
            .map(|n| n.host.saturating_add(1))
            .max()
            .unwrap_or(1)
    }
    /// The PCIe parent of a node (switch, host bridge or CPU), if it hangs in a PCIe tree.
    pub fn pcie_parent(&self, id: NodeId) -> Option<NodeId> {
        self.pcie_parent.get(id.index()).copied().flatten()
    }
    /// The CPU socket a device attaches to: the root of its PCIe tree, else a CPU it links to
    /// directly (NVLink on POWER9, C2C on Grace).
    pub fn attached_cpu(&self, id: NodeId) -> Option<NodeId> {
        if self.graph[id].cpu().is_some() {
            return Some(id);
        }
        let mut cur = id;
        while let Some(p) = self.pcie_parent(cur) {
            if self.graph[p].cpu().is_some() {
                return Some(p);
            }
            cur = p;
        }
        self.graph
            .edges(id)
            .filter(|e| self.graph[e.target()].cpu().is_some())
            .max_by(|x, y| x.weight().gbps.total_cmp(&y.weight().gbps))
            .map(|e| e.target())
    }
    /// The NUMA node of a GPU: its own record, else that of the CPU it attaches to.
    pub fn gpu_numa(&self, index: u32) -> Result<Option<u32>> {
        let info = self.gpu_info(index)?;
        if info.numa.is_some() {
            return Ok(info.numa);
        }
        let id = self.gpu(index)?;
        Ok(self
            .attached_cpu(id)
            .and_then(|c| self.graph[c].cpu().map(|c| c.numa)))
    }
    /// The NVSwitch port a link belongs to: `(gpu, outbound)` for an NVLink between a GPU and
    /// an NVSwitch chip. A GPU stripes its traffic over every switch plane it is wired to, so
    /// all such links of one GPU in one direction act as one port whose rate is their sum
    /// (DGX A100: 6 planes x 2 links = one 300 GB/s port each way).
    pub fn nvswitch_port(&self, id: LinkId) -> Option<(NodeId, bool)> {
        let link = self.graph.edge_weight(id)?;
        if !link.kind.is_nvlink() {
            return None;
        }
        let (a, b) = self.graph.edge_endpoints(id)?;
        let (ka, kb) = (&self.graph[a].kind, &self.graph[b].kind);
        match (ka, kb) {
            (NodeKind::Gpu(_), NodeKind::NvSwitch) => Some((a, true)),
            (NodeKind::NvSwitch, NodeKind::Gpu(_)) => Some((b, false)),
            _ => None,
        }
    }
    /// True unless `a` and `b` are both GPUs and the driver refuses one of them PCIe
    /// peer-to-peer access ([`GpuInfo::pcie_p2p`]): then a transfer between them that PCIe
    /// carries is staged through host memory.
    pub fn pcie_peer_ok(&self, a: NodeId, b: NodeId) -> bool {
        match (self.graph[a].gpu(), self.graph[b].gpu()) {
            (Some(x), Some(y)) => x.pcie_p2p && y.pcie_p2p,
            _ => true,
        }
    }
    /// True when the GPU connects to an NVSwitch.
    pub fn behind_nvswitch(&self, gpu: NodeId) -> bool {
        self.graph.edges(gpu).any(|e| {
            matches!(self.graph[e.target()].kind, NodeKind::NvSwitch) && e.weight().kind.is_nvlink()
        })
    }
    /// The mask in force.
    pub fn mask(&self) -> &Mask {
        &self.mask
    }
    /// This topology seen through `mask` (replacing any mask it had). Fails when the mask names
    /// GPUs or nodes the topology does not have.
    pub fn with_mask(&self, mask: Mask) -> Result<Topology> {
        mask.validate(self)?;
        let mut t = self.clone();
        t.mask = mask;
        t.forget_link_tables();
        Ok(t)
    }
    /// True unless the mask marks the GPU absent.
    pub fn gpu_present(&self, index: u32) -> bool {
        !self.mask.absent_gpus.contains(&index) && index < self.gpu_count()
    }
    /// True when the GPU is present and not busy: it may join a job or relay for one.
    pub fn gpu_free(&self, index: u32) -> bool {
        self.gpu_present(index) && !self.mask.busy_gpus.contains(&index)
    }
    /// [`Topology::link_usable`] from the mask itself (the link tables read it once per link).
    pub(crate) fn link_usable_under_mask(&self, id: LinkId) -> bool {
        let (a, b) = self.link_ends(id);
        let absent = |n: NodeId| {
            self.graph[n]
                .gpu()
                .is_some_and(|g| self.mask.absent_gpus.contains(&g.index))
        };
        if absent(a) || absent(b) {
            return false;
        }
        !self
            .mask
            .is_link_down(&self.graph[a].name, &self.graph[b].name)
    }
    /// Set the rate and latency of one directed link (calibration).
    pub(crate) fn set_link_rate(&mut self, id: LinkId, gbps: f64, latency_us: f64) {
        if let Some(l) = self.graph.edge_weight_mut(id) {
            l.gbps = gbps;
            l.latency_us = latency_us;
        }
        self.forget_link_tables();
    }
    /// Set GPU node `id`'s measured device-memory rate and what else a calibration's
    /// `memories` measured of it (`measures`); no-op on a node that is not a GPU.
    pub(crate) fn set_gpu_mem_gbps(&mut self, id: NodeId, gbps: f64, measures: MemoryMeasures) {
        if let Some(NodeKind::Gpu(g)) = self.graph.node_weight_mut(id).map(|n| &mut n.kind) {
            g.measured_mem_gbps = Some(gbps);
            g.measured_reduce_gbps = measures.reduce_gbps;
            g.measured_sm_copy_gbps = measures.sm_copy_gbps;
            g.measured_write_share = measures.write_share;
        }
    }
    /// Rename the topology.
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }
    /// What an importer accepted but did not take as written (a self link it ignored, for
    /// instance), one sentence each, in the order met. Empty for presets and clean files.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
    /// Record an import warning (see [`Topology::warnings`]).
    pub fn add_warning(&mut self, warning: impl Into<String>) {
        self.warnings.push(warning.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology_builder::TopologyBuilder;

    fn two_gpus() -> TopologyBuilder {
        let mut b = TopologyBuilder::new("t");
        let cpu = b.add_cpu(0, CpuFamily::IntelSkylake);
        let g0 = b.add_gpu(GpuInfo::new(0));
        let g1 = b.add_gpu(GpuInfo::new(1));
        b.pcie(cpu, g0, 3, 16);
        b.pcie(cpu, g1, 3, 16);
        b
    }

    #[test]
    fn builder_rejects_duplicate_gpu_index() {
        let mut b = two_gpus();
        b.add_node("GPUx".into(), NodeKind::Gpu(GpuInfo::new(1)));
        let err = b.build().unwrap_err().to_string();
        assert!(err.contains("two GPUs have index 1"), "{err}");
    }

    #[test]
    fn builder_rejects_gaps_self_links_and_bad_rates() {
        let mut b = TopologyBuilder::new("t");
        b.add_gpu(GpuInfo::new(1));
        assert!(b.build().unwrap_err().to_string().contains("skip 0"));

        let mut b = two_gpus();
        let g = NodeId::new(1);
        b.connect(g, g, LinkKind::C2c);
        assert!(b.build().unwrap_err().to_string().contains("itself"));

        let mut b = two_gpus();
        b.connect_with(NodeId::new(1), NodeId::new(2), LinkKind::C2c, f64::NAN, 0.0);
        assert!(b.build().unwrap_err().to_string().contains("rate"));
    }

    #[test]
    fn pcie_parents_and_attached_cpu() {
        let t = two_gpus().build().unwrap();
        let g0 = t.gpu(0).unwrap();
        let cpu = t.node_by_name("CPU0").unwrap();
        assert_eq!(t.pcie_parent(g0), Some(cpu));
        assert_eq!(t.attached_cpu(g0), Some(cpu));
        assert_eq!(t.gpu_numa(0).unwrap(), Some(0));
        assert!(t.gpu(2).is_err());
    }
}
