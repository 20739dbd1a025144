//! How two devices are connected, in nvidia-smi's words (X, NV#, PIX, PXB, PHB, NODE, SYS).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::graph::{NodeId, NodeKind, Topology};

/// The connection between two devices, ordered best to worst, as `nvidia-smi topo -m` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PathClass {
    /// The device itself (`X`).
    SameDevice,
    /// A bonded set of this many NVLinks, direct or through NVSwitch (`NV#`).
    NvLink(u32),
    /// At most a single PCIe switch/bridge (`PIX`).
    Pix,
    /// Several PCIe switches, no host bridge (`PXB`).
    Pxb,
    /// Through a PCIe host bridge, typically the CPU (`PHB`).
    Phb,
    /// Between host bridges inside one NUMA node (`NODE`).
    Node,
    /// Across the inter-socket link (`SYS`; older drivers printed `SOC`).
    Sys,
}

impl PathClass {
    /// Parse a matrix cell (`X`, `NV12`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`, `SOC`).
    pub fn parse(cell: &str) -> Option<PathClass> {
        Some(match cell {
            "X" => PathClass::SameDevice,
            "PIX" => PathClass::Pix,
            "PXB" => PathClass::Pxb,
            "PHB" => PathClass::Phb,
            "NODE" => PathClass::Node,
            "SYS" | "SOC" => PathClass::Sys,
            _ => {
                let n: u32 = cell.strip_prefix("NV")?.parse().ok()?;
                if n == 0 {
                    return None;
                }
                PathClass::NvLink(n)
            }
        })
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathClass::SameDevice => f.write_str("X"),
            PathClass::NvLink(n) => write!(f, "NV{n}"),
            PathClass::Pix => f.write_str("PIX"),
            PathClass::Pxb => f.write_str("PXB"),
            PathClass::Phb => f.write_str("PHB"),
            PathClass::Node => f.write_str("NODE"),
            PathClass::Sys => f.write_str("SYS"),
        }
    }
}

impl Topology {
    /// Classify the connection between two devices (GPUs or NICs) as nvidia-smi would.
    ///
    /// NVLink wins for GPU pairs that have it. Otherwise the PCIe tree decides: the lowest
    /// common ancestor is a switch (PIX for one switch on the path, PXB for more), a host bridge
    /// (PHB), the CPU (PHB when both hang directly under the CPU's root ports, NODE when either
    /// goes through its own host bridge or attaches without PCIe), or there is none (SYS).
    pub fn classify(&self, a: NodeId, b: NodeId) -> PathClass {
        if a == b {
            return PathClass::SameDevice;
        }
        let g = self.graph();
        if g[a].gpu().is_some() && g[b].gpu().is_some() {
            let lanes = self.nvlink_lanes(a, b);
            if lanes > 0 {
                return PathClass::NvLink(lanes);
            }
        }
        let chain = |n: NodeId| {
            let mut v = Vec::new();
            let mut cur = n;
            while let Some(p) = self.pcie_parent(cur) {
                v.push(p);
                cur = p;
            }
            v
        };
        let (ca, cb) = (chain(a), chain(b));
        if let Some((ia, ib)) = ca
            .iter()
            .enumerate()
            .find_map(|(i, x)| cb.iter().position(|y| y == x).map(|j| (i, j)))
        {
            let lca = ca[ia];
            match g[lca].kind {
                NodeKind::PcieSwitch => {
                    let switches = ca[..ia]
                        .iter()
                        .chain(&cb[..ib])
                        .filter(|n| matches!(g[**n].kind, NodeKind::PcieSwitch))
                        .count()
                        + 1;
                    return if switches == 1 {
                        PathClass::Pix
                    } else {
                        PathClass::Pxb
                    };
                }
                NodeKind::HostBridge => return PathClass::Phb,
                NodeKind::Cpu(_) => {
                    let via_bridge =
                        |c: &[NodeId]| c.iter().any(|n| matches!(g[*n].kind, NodeKind::HostBridge));
                    return if via_bridge(&ca) || via_bridge(&cb) {
                        PathClass::Node
                    } else {
                        PathClass::Phb
                    };
                }
                _ => return PathClass::Sys,
            }
        }
        // No common PCIe ancestor: same socket (one side attached without PCIe) or not.
        match (self.attached_cpu(a), self.attached_cpu(b)) {
            (Some(x), Some(y)) if x == y => PathClass::Node,
            _ => PathClass::Sys,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_parse_and_print() {
        for cell in ["X", "NV1", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"] {
            assert_eq!(PathClass::parse(cell).unwrap().to_string(), cell);
        }
        assert_eq!(PathClass::parse("SOC"), Some(PathClass::Sys));
        assert_eq!(PathClass::parse("NV0"), None);
        assert_eq!(PathClass::parse("NVx"), None);
        assert_eq!(PathClass::parse("bogus"), None);
        assert!(PathClass::NvLink(1) < PathClass::Pix);
        assert!(PathClass::Node < PathClass::Sys);
    }
}
