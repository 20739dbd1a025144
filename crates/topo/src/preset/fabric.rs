//! Cluster fabrics as they are built: the network that joins the NICs of a cluster's nodes.
//!
//! A cluster spec names a link type and, after it, a layout:
//! `cluster:<N>x<preset>:<link>[:<layout>]`.
//!
//! | layout | network |
//! |---|---|
//! | `switch` (the default) | every NIC on one non-blocking switch, `NetSwitch0` |
//! | `rail`, `rail=D:U` | rail-optimized: nodes in scalable units of as many nodes as a leaf has down ports; in each unit one leaf per rail (NIC `i` of every node of the unit on leaf `i`); leaves joined by a spine layer |
//! | `fat-tree`, `fat-tree=D:U` | two-level fat-tree: NICs fill leaves in node order (a node's NICs side by side), leaves joined by a spine layer |
//!
//! `D:U` is the leaf's oversubscription, down-link bandwidth to up-link bandwidth (`1:1`, the
//! default, is non-blocking; `2:1` halves the up-links). A leaf of `P` ports
//! ([`leaf_ports`]) gives `floor(P x D / (D + U))` ports to NICs and up-links worth
//! `down x U / D` ports; the spine layer has `ceil(leaves x up / P)` switches of `P` ports, each
//! joined to every leaf by one link carrying that leaf's up-link share (`up / spines` ports'
//! worth). Beyond `P` leaves a real two-level tree runs out of spine ports and adds a core
//! layer; the model folds that layer into the spines, which keeps every leaf's up-link
//! bandwidth and the bisection as built. The DGX SuperPOD's four scalable units of 32 DGX
//! nodes come out as its reference architecture lists them: 32 leaves, 16 spines, 1,024
//! node-leaf and 1,024 leaf-spine cables ([NVIDIA-SuperPOD]).
//!
//! Switches are named `Leaf<i>` and `Spine<j>` (`NetSwitch0` for the single switch); every
//! network link has the link type's port rate and [`crate::rates::NETWORK_HOP_LATENCY_US`]
//! per hop.

use crate::graph::{LinkKind, NodeId, NodeKind};
use crate::rates::Fabric;
use crate::topology_builder::TopologyBuilder;

/// Ports of one leaf or spine switch of a link type: the switch the vendor builds for it.
/// InfiniBand EDR: SB7800, 36 ports; HDR: QM8700, 40 ports; NDR: QM9700, 64 ports (32 OSFP
/// cages of two ports) ([NVIDIA-IBSwitches]); 100 GbE: SN2700, 32 ports; 25 GbE: SN2410, 48
/// ports ([NVIDIA-SpectrumSwitches]).
pub fn leaf_ports(link: Fabric) -> u32 {
    match link {
        Fabric::IbEdr => 36,
        Fabric::IbHdr => 40,
        Fabric::IbNdr => 64,
        Fabric::Roce100g => 32,
        Fabric::Eth25g => 48,
    }
}

/// How the NICs of a cluster are joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One non-blocking switch.
    Switch,
    /// Rail-optimized leaves (one per rail and scalable unit) under a spine layer, with the
    /// leaves' down:up bandwidth ratio.
    Rail {
        /// Down-link share of the ratio.
        down: u32,
        /// Up-link share of the ratio.
        up: u32,
    },
    /// A two-level fat-tree, NICs filling leaves in node order, with the leaves' down:up ratio.
    FatTree {
        /// Down-link share of the ratio.
        down: u32,
        /// Up-link share of the ratio.
        up: u32,
    },
}

/// A cluster's network: the link type and the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetSpec {
    /// Link type (port rate and hop latency).
    pub link: Fabric,
    /// How the switches are arranged.
    pub layout: Layout,
}

/// The layouts `cluster:` accepts, for listings and error messages.
pub const LAYOUTS: &str = "switch (default), rail[=D:U], fat-tree[=D:U]";

/// Largest side of an oversubscription ratio; keeps a typo from building leaves of no ports.
const MAX_RATIO: u32 = 64;

/// Parse `<link>[:<layout>]` (`ib-ndr`, `ib-ndr:rail`, `ib-ndr:fat-tree=2:1`).
pub fn parse(text: &str) -> Result<NetSpec, String> {
    let (link, layout) = match text.split_once(':') {
        Some((l, rest)) => (l, Some(rest)),
        None => (text, None),
    };
    let link = Fabric::from_name(link).ok_or_else(|| {
        let names: Vec<&str> = Fabric::ALL.iter().map(|(n, _)| *n).collect();
        format!("unknown fabric {link:?} (known: {})", names.join(", "))
    })?;
    let layout = match layout {
        None | Some("switch") => Layout::Switch,
        Some(l) => {
            let (kind, ratio) = match l.split_once('=') {
                Some((k, r)) => (k, Some(r)),
                None => (l, None),
            };
            let (down, up) = match ratio {
                None => (1, 1),
                Some(r) => parse_ratio(r)?,
            };
            match kind {
                "rail" => Layout::Rail { down, up },
                "fat-tree" => Layout::FatTree { down, up },
                _ => return Err(format!("unknown layout {l:?} (known: {LAYOUTS})")),
            }
        }
    };
    Ok(NetSpec { link, layout })
}

fn parse_ratio(r: &str) -> Result<(u32, u32), String> {
    let bad = || format!("oversubscription {r:?} is not D:U with 1 <= U <= D <= {MAX_RATIO}");
    let (d, u) = r.split_once(':').ok_or_else(bad)?;
    let (d, u): (u32, u32) = (d.parse().map_err(|_| bad())?, u.parse().map_err(|_| bad())?);
    if u == 0 || d < u || d > MAX_RATIO {
        return Err(bad());
    }
    Ok((d, u))
}

/// Wire the NICs of every node (`nics[h]`: node `h`'s NICs in order, so `nics[h][i]` is on
/// rail `i`) to the network `spec` describes.
pub(super) fn wire(b: &mut TopologyBuilder, nics: &[Vec<NodeId>], spec: NetSpec) {
    let link = spec.link;
    let rate = link.gbps();
    let kind = LinkKind::Network { fabric: link };
    let lat = kind.default_latency_us();
    let (leaf_of, leaves, down, up) = match spec.layout {
        Layout::Switch => {
            let sw = b.add_net_switch();
            for nic in nics.iter().flatten() {
                b.network(*nic, sw, link, rate);
            }
            return;
        }
        Layout::Rail { down, up } => {
            let ports = leaf_down_ports(link, down, up);
            let rails = nics.iter().map(Vec::len).max().unwrap_or(0);
            let units = nics.len().div_ceil(ports as usize);
            // Leaf of (unit, rail) is unit * rails + rail.
            let leaf_of: Vec<Vec<usize>> = nics
                .iter()
                .enumerate()
                .map(|(h, ns)| {
                    (0..ns.len())
                        .map(|r| (h / ports as usize) * rails + r)
                        .collect()
                })
                .collect();
            (leaf_of, units * rails, down, up)
        }
        Layout::FatTree { down, up } => {
            let ports = leaf_down_ports(link, down, up) as usize;
            let mut k = 0usize;
            let leaf_of: Vec<Vec<usize>> = nics
                .iter()
                .map(|ns| {
                    ns.iter()
                        .map(|_| {
                            k += 1;
                            (k - 1) / ports
                        })
                        .collect()
                })
                .collect();
            (leaf_of, k.div_ceil(ports), down, up)
        }
    };
    let leaf_ids: Vec<NodeId> = (0..leaves)
        .map(|i| b.add_node(format!("Leaf{i}"), NodeKind::NetSwitch))
        .collect();
    for (h, ns) in nics.iter().enumerate() {
        for (i, nic) in ns.iter().enumerate() {
            b.network(*nic, leaf_ids[leaf_of[h][i]], link, rate);
        }
    }
    if leaves < 2 {
        return;
    }
    let p = f64::from(leaf_ports(link));
    let up_ports = f64::from(leaf_down_ports(link, down, up)) * f64::from(up) / f64::from(down);
    let spines = ((leaves as f64 * up_ports / p).ceil() as usize).max(1);
    let per_link_gbps = up_ports * rate / spines as f64;
    let spine_ids: Vec<NodeId> = (0..spines)
        .map(|j| b.add_node(format!("Spine{j}"), NodeKind::NetSwitch))
        .collect();
    for leaf in &leaf_ids {
        for spine in &spine_ids {
            b.connect_with(*leaf, *spine, kind, per_link_gbps, lat);
        }
    }
}

/// Down ports of a leaf of `link` under a `down:up` ratio: `floor(P x down / (down + up))`,
/// at least 1.
pub fn leaf_down_ports(link: Fabric, down: u32, up: u32) -> u32 {
    let p = leaf_ports(link);
    (p * down / (down + up).max(1)).max(1)
}
