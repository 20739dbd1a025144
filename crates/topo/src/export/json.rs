//! relaycc's own JSON: the full graph (nodes, directed links, mask) plus derived views
//! (`gpus`, `nics`, `nvlinks`) that tools and people read. Importing it gives back exactly the
//! same topology.

use serde::{Deserialize, Serialize};

use crate::graph::{Link, Node, Topology};
use crate::mask::Mask;

/// The format tag written into every document.
pub const FORMAT: &str = "relaycc-topology";
/// The format version written into every document.
pub const VERSION: u32 = 1;

/// A GPU as the derived view shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// GPU index.
    pub index: u32,
    /// Product name.
    pub name: String,
    /// NUMA node (its own, else its CPU's).
    pub numa: Option<u32>,
    /// PCI bus id.
    pub pci_bus_id: Option<String>,
    /// Compute capability as `major.minor`.
    pub compute_capability: Option<String>,
    /// Host (machine) index.
    pub host: u32,
}

/// A NIC as the derived view shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicView {
    /// NIC name (node name).
    pub name: String,
    /// NUMA node (its own, else its CPU's).
    pub numa: Option<u32>,
    /// Port rate, GB/s.
    pub gbps: f64,
    /// Host (machine) index.
    pub host: u32,
}

/// A pair of GPUs joined by NVLink, directly or through NVSwitch (`a < b`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvlinkView {
    /// Lower GPU index.
    pub a: u32,
    /// Higher GPU index.
    pub b: u32,
    /// Bonded links between them (through NVSwitch: the smaller GPU's lanes into the fabric).
    pub lanes: u32,
    /// True when the pair is joined through NVSwitch rather than directly.
    pub via_nvswitch: bool,
}

/// One directed link, by node names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkView {
    /// Source node name.
    pub from: String,
    /// Target node name.
    pub to: String,
    /// Kind, capacity and latency.
    #[serde(flatten)]
    pub link: Link,
}

/// The whole document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopologyJson {
    /// Always `relaycc-topology`.
    pub format: String,
    /// Always 1 (this format version).
    pub version: u32,
    /// Topology name.
    pub name: String,
    /// Derived: GPUs in index order.
    #[serde(default)]
    pub gpus: Vec<GpuView>,
    /// Derived: NICs.
    #[serde(default)]
    pub nics: Vec<NicView>,
    /// Derived: NVLink-joined GPU pairs.
    #[serde(default)]
    pub nvlinks: Vec<NvlinkView>,
    /// Every node, in graph order.
    pub nodes: Vec<Node>,
    /// Every directed link, in graph order.
    pub links: Vec<LinkView>,
    /// The mask in force.
    #[serde(default, skip_serializing_if = "Mask::is_empty")]
    pub mask: Mask,
    /// The cost model's entries that differ from the defaults (a calibration's `costs`), by
    /// the names of [`crate::rates::CostModel::names`].
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub costs: std::collections::BTreeMap<String, f64>,
}

impl TopologyJson {
    /// The document for `topo`.
    pub fn from_topology(topo: &Topology) -> Self {
        let gpus = (0..topo.gpu_count())
            .filter_map(|i| {
                let id = topo.gpu(i).ok()?;
                let g = topo.node(id).gpu()?;
                Some(GpuView {
                    index: g.index,
                    name: g.name.clone(),
                    numa: topo.gpu_numa(i).ok().flatten(),
                    pci_bus_id: g.pci_bus_id.clone(),
                    compute_capability: g.compute_capability.map(|c| c.to_string()),
                    host: topo.node(id).host,
                })
            })
            .collect();
        let nics = topo
            .nics()
            .map(|(id, n)| NicView {
                name: n.name.clone(),
                numa: n.numa.or_else(|| {
                    topo.attached_cpu(id)
                        .and_then(|c| topo.node(c).cpu().map(|c| c.numa))
                }),
                gbps: n.gbps,
                host: topo.node(id).host,
            })
            .collect();
        let nvlinks = topo
            .nvlink_gpu_pairs()
            .into_iter()
            .map(|(a, b, lanes)| NvlinkView {
                a,
                b,
                lanes,
                via_nvswitch: match (topo.gpu(a), topo.gpu(b)) {
                    (Ok(x), Ok(y)) => topo.link_between(x, y).is_none(),
                    _ => true,
                },
            })
            .collect();
        TopologyJson {
            format: FORMAT.to_string(),
            version: VERSION,
            name: topo.name().to_string(),
            gpus,
            nics,
            nvlinks,
            nodes: topo.nodes().map(|(_, n)| n.clone()).collect(),
            links: topo
                .links()
                .map(|(_, a, b, l)| LinkView {
                    from: topo.node(a).name.clone(),
                    to: topo.node(b).name.clone(),
                    link: *l,
                })
                .collect(),
            mask: topo.mask().clone(),
            costs: topo.costs().changed(),
        }
    }
}

/// The topology as pretty-printed relaycc JSON.
pub fn to_json(topo: &Topology) -> String {
    // Serializing plain data with string keys cannot fail.
    serde_json::to_string_pretty(&TopologyJson::from_topology(topo)).unwrap_or_default()
}
