//! What NVML says about a machine, as plain data ([`super::reconstruct`] rebuilds the
//! topology from it).
//!
//! Kept apart from the NVML calls so that the reconstruction is tested on machines without a
//! GPU, and so that facts gathered on one machine can be replayed on another.

use crate::graph::GpuInfo;
use crate::rates::CpuFamily;

/// The closest common ancestor of two GPUs in the PCIe/CPU tree, as NVML reports it
/// (`nvmlGpuTopologyLevel_t`), ordered nearest to farthest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CommonAncestor {
    /// Both on one board (dual-GPU cards such as K80); modelled as a shared switch (PIX).
    Internal,
    /// Behind one PCIe switch (PIX).
    Single,
    /// Behind several PCIe switches, no host bridge (PXB).
    Multiple,
    /// Under one host bridge (PHB).
    HostBridge,
    /// In one NUMA node, across host bridges (NODE).
    Node,
    /// Across the inter-socket link (SYS).
    System,
}

/// What the far end of an active NVLink is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvLinkRemote {
    /// Another GPU (a direct bond).
    Gpu,
    /// An NVSwitch (or a device NVML does not name; NCCL treats those as switches too).
    Switch,
    /// The CPU (POWER9 NVLink bridge).
    Cpu,
}

/// One active NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvLinkFact {
    /// PCI bus id of the far end, as NVML prints it (`00000000:C3:00.0`).
    pub remote_bus_id: String,
    /// What the far end is.
    pub remote: NvLinkRemote,
}

/// What NVML says about one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuFacts {
    /// Index, name, compute capability, bus id, NUMA node, memory.
    pub info: GpuInfo,
    /// Maximum PCIe generation of the GPU's link, when known (3 where not).
    pub pcie_gen: Option<u8>,
    /// Maximum PCIe width of the GPU's link, when known (16 where not).
    pub pcie_width: Option<u32>,
    /// The active NVLinks, one entry per link (bonded links appear once each).
    pub nvlinks: Vec<NvLinkFact>,
}

/// What NVML says about a machine: its GPUs and, for every pair, their common ancestor.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineFacts {
    /// Name of the topology to build (the host name, say).
    pub name: String,
    /// Family of the host's CPUs (all sockets alike).
    pub cpu_family: CpuFamily,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<GpuFacts>,
    /// `ancestors[i][j]`: the common ancestor of GPUs `i` and `j` (the diagonal is ignored).
    pub ancestors: Vec<Vec<CommonAncestor>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PathClass;
    use crate::error::{Result, TopoError};
    use crate::graph::ComputeCapability;
    use crate::graph::Topology;
    use crate::import::nvml::reconstruct;
    use crate::rates::NvLinkGen;
    use CommonAncestor as A;

    fn gpu(i: u32, bus: &str, numa: Option<u32>) -> GpuFacts {
        let mut info = GpuInfo::new(i);
        info.pci_bus_id = Some(bus.to_string());
        info.numa = numa;
        info.compute_capability = Some(ComputeCapability::from_sm(80));
        GpuFacts {
            info,
            pcie_gen: Some(4),
            pcie_width: Some(16),
            nvlinks: Vec::new(),
        }
    }

    /// Facts for GPUs whose ancestors are given by a function of the pair.
    fn machine(n: u32, level: impl Fn(usize, usize) -> A) -> MachineFacts {
        let gpus = (0..n)
            .map(|i| {
                gpu(
                    i,
                    &format!("00000000:{:02X}:00.0", 0x10 + i),
                    Some(u32::from(i >= n / 2)),
                )
            })
            .collect();
        let ancestors = (0..n as usize)
            .map(|i| (0..n as usize).map(|j| level(i, j)).collect())
            .collect();
        MachineFacts {
            name: "m".into(),
            cpu_family: CpuFamily::IntelSkylake,
            gpus,
            ancestors,
        }
    }

    fn cell(l: A) -> PathClass {
        match l {
            A::Internal | A::Single => PathClass::Pix,
            A::Multiple => PathClass::Pxb,
            A::HostBridge => PathClass::Phb,
            A::Node => PathClass::Node,
            A::System => PathClass::Sys,
        }
    }

    /// Every pair classifies as its level says.
    fn check_round_trip(f: &MachineFacts) -> Topology {
        let t = reconstruct(f).unwrap();
        let n = f.gpus.len();
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    let got = t.classify(t.gpu(i as u32).unwrap(), t.gpu(j as u32).unwrap());
                    assert_eq!(got, cell(f.ancestors[i][j]), "GPU{i}-GPU{j}");
                }
            }
        }
        t
    }

    /// A DGX-1-like tree: pairs on a switch, two switches per host bridge, two bridges per
    /// socket, two sockets (16 GPUs).
    fn dgx_like(i: usize, j: usize) -> A {
        match () {
            _ if i == j => A::Internal,
            _ if i / 2 == j / 2 => A::Single,
            _ if i / 4 == j / 4 => A::Multiple,
            _ if i / 8 == j / 8 => A::HostBridge,
            _ if i / 16 == j / 16 => A::Node,
            _ => A::System,
        }
    }

    /// A CUDA device finds its GPU by PCI address, whichever spelling either side uses.
    #[test]
    fn gpus_are_found_by_bus_id_in_any_spelling() {
        let t = reconstruct(&machine(3, |_, _| A::Node)).unwrap();
        let at = |bus| crate::import::nvml::gpu_at_bus_id(&t, bus);
        assert_eq!(at("00000000:11:00.0"), Some(1));
        assert_eq!(at("0000:12:00.0"), Some(2));
        assert_eq!(at("10:00.0"), Some(0));
        assert_eq!(at("0000:13:00.0"), None);
        assert_eq!(at("not a bus id"), None);
    }

    #[test]
    fn every_level_round_trips() {
        let f = machine(32, dgx_like);
        let t = check_round_trip(&f);
        assert_eq!(t.cpus().count(), 2);
        assert_eq!(t.gpu_numa(0).unwrap(), Some(0));
        assert_eq!(t.gpu_numa(31).unwrap(), Some(1));
    }

    #[test]
    fn singletons_and_flat_levels_round_trip() {
        // GPU0 alone in its socket; GPUs 1-3: 1 and 2 share a switch, 3 elsewhere in the bridge.
        let f = machine(4, |i, j| {
            let (a, b) = (i.min(j), i.max(j));
            match (a, b) {
                _ if a == b => A::Internal,
                (0, _) => A::System,
                (1, 2) => A::Single,
                _ => A::Multiple,
            }
        });
        check_round_trip(&f);
        // Everything under one host bridge, or one socket across bridges.
        check_round_trip(&machine(4, |_, _| A::HostBridge));
        check_round_trip(&machine(3, |i, j| {
            if i.min(j) == 0 && i != j {
                A::Node
            } else {
                A::HostBridge
            }
        }));
        check_round_trip(&machine(2, |_, _| A::Internal));
        check_round_trip(&machine(1, |_, _| A::Internal));
    }

    #[test]
    fn nvlink_bonds_switches_and_cpu_links() {
        let mut f = machine(4, |i, j| if i / 2 == j / 2 { A::Node } else { A::System });
        let link = |bus: &str, remote| NvLinkFact {
            remote_bus_id: bus.into(),
            remote,
        };
        // GPU0-GPU1: two links seen from GPU0, one from GPU1 (a link mid-training): 2 lanes.
        f.gpus[0].nvlinks = vec![link("00000000:11:00.0", NvLinkRemote::Gpu); 2];
        f.gpus[1].nvlinks = vec![
            link("0000:11:00.0", NvLinkRemote::Gpu),
            link("00000000:10:00.0", NvLinkRemote::Gpu),
        ];
        // GPUs 2 and 3 reach two NVSwitches with 2 links each.
        for g in [2, 3] {
            f.gpus[g].nvlinks = vec![
                link("00000000:C0:00.0", NvLinkRemote::Switch),
                link("00000000:C0:00.0", NvLinkRemote::Switch),
                link("00000000:C1:00.0", NvLinkRemote::Switch),
                link("00000000:c1:00.0", NvLinkRemote::Switch),
                // A GPU NVML did not list (hidden by a container): left out.
                link("00000000:99:00.0", NvLinkRemote::Gpu),
                link("00000004:00:00.0", NvLinkRemote::Cpu),
            ];
        }
        let t = reconstruct(&f).unwrap();
        let g = |i| t.gpu(i).unwrap();
        assert_eq!(t.classify(g(0), g(1)), PathClass::NvLink(2));
        assert_eq!(t.classify(g(2), g(3)), PathClass::NvLink(4));
        assert_eq!(t.classify(g(0), g(2)), PathClass::Sys);
        assert_eq!(
            t.nodes()
                .filter(|(_, n)| matches!(n.kind, crate::NodeKind::NvSwitch))
                .count(),
            2
        );
        let cpu = t.attached_cpu(g(2)).unwrap();
        let l = t.link_between(g(2), cpu).unwrap();
        assert_eq!(
            t.link(l).kind,
            crate::LinkKind::Nvlink {
                generation: NvLinkGen::V3,
                lanes: 1
            }
        );
    }

    #[test]
    fn numa_ids_come_from_the_gpus_else_free_ids() {
        let mut f = machine(4, |i, j| if i / 2 == j / 2 { A::Node } else { A::System });
        for (k, g) in f.gpus.iter_mut().enumerate() {
            g.info.numa = if k < 2 { Some(3) } else { None };
        }
        let t = reconstruct(&f).unwrap();
        assert_eq!(t.gpu_numa(0).unwrap(), Some(3));
        assert_eq!(t.gpu_numa(2).unwrap(), Some(0));
    }

    #[test]
    fn inconsistent_facts_are_errors_not_panics() {
        let is_nvml = |r: Result<Topology>, needle: &str| match r {
            Err(TopoError::Nvml { step, message }) => {
                assert_eq!(step, "topology reconstruction");
                assert!(message.contains(needle), "{message}");
            }
            other => panic!("{other:?}"),
        };
        // Not a tree: 0-1 and 1-2 share switches, 0-2 are across sockets.
        let f = machine(3, |i, j| {
            if i.min(j) == 0 && i.max(j) == 2 {
                A::System
            } else {
                A::Single
            }
        });
        is_nvml(reconstruct(&f), "not a tree");
        let mut f = machine(2, |_, _| A::Single);
        f.ancestors[0][1] = A::Node;
        is_nvml(reconstruct(&f), "GPU0-GPU1 is Node but GPU1-GPU0 is Single");
        let mut f = machine(2, |_, _| A::Single);
        f.ancestors.pop();
        is_nvml(reconstruct(&f), "not 2 x 2");
        let mut f = machine(2, |_, _| A::Single);
        f.gpus[0].nvlinks.push(NvLinkFact {
            remote_bus_id: "??".into(),
            remote: NvLinkRemote::Switch,
        });
        is_nvml(reconstruct(&f), "not a PCI bus id");
        let mut f = machine(2, |_, _| A::Single);
        f.gpus[1].info.index = 5;
        assert!(matches!(reconstruct(&f), Err(TopoError::Invalid { .. })));
    }
}
