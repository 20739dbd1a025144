//! What NVML says about a machine, as plain data, and the topology rebuilt from it.
//!
//! Kept apart from the NVML calls so that the reconstruction is tested on machines without a
//! GPU, and so that facts gathered on one machine can be replayed on another.

use std::collections::BTreeMap;

use crate::error::{Result, TopoError};
use crate::graph::{GpuInfo, NodeId, Topology, TopologyBuilder};
use crate::import::nccl_xml::BusId;
use crate::rates::{CpuFamily, NvLinkGen};

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

/// PCIe generation assumed where NVML does not say: gen 3, the NCCL XML fallback too.
const DEFAULT_PCIE_GEN: u8 = 3;
/// PCIe width assumed where NVML does not say.
const DEFAULT_PCIE_WIDTH: u32 = 16;
/// NVLink generation where the compute capability is unknown (as in the XML importer).
const DEFAULT_NVLINK_GEN: NvLinkGen = NvLinkGen::V2;

fn fail(message: String) -> TopoError {
    TopoError::Nvml {
        step: "topology reconstruction".into(),
        message,
    }
}

/// Union-find classes of GPUs whose common ancestor is at most `level`.
fn classes(anc: &[Vec<CommonAncestor>], level: CommonAncestor) -> Vec<usize> {
    let n = anc.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    for (i, row) in anc.iter().enumerate() {
        for (j, l) in row.iter().enumerate() {
            if i != j && *l <= level {
                let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    (0..n).map(|i| find(&mut parent, i)).collect()
}

/// Groups of `members` by class id, each group in index order, groups by their first member.
fn groups(members: &[usize], class: &[usize]) -> Vec<Vec<usize>> {
    let mut by: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &m in members {
        by.entry(class[m]).or_default().push(m);
    }
    let mut v: Vec<Vec<usize>> = by.into_values().collect();
    v.sort_by_key(|g| g[0]);
    v
}

/// Rebuild the machine from NVML's facts.
///
/// The PCIe/CPU tree is made so that [`Topology::classify`] gives back every pair's level:
/// GPUs that meet at `System` or nearer form a socket (one CPU node each; sockets are joined
/// pairwise); within a socket, `HostBridge` classes get a host bridge each when there are
/// several (pairs across them read NODE), else hang from the CPU (PHB); within a host bridge,
/// `Multiple` classes of more than one GPU get an upper switch holding one switch per `Single`
/// class (PXB across, PIX within), or one switch when all share a single switch. A GPU alone
/// at a level hangs directly from the level above. Uplinks take the fastest member's PCIe
/// generation and width. NVLinks: a bond per GPU pair with lanes = links seen (the larger
/// count of the two sides: a link seen active from either end exists); one NVSwitch node per
/// distinct remote bus id; CPU links go to the GPU's socket. Links to a GPU that NVML did not
/// list (hidden by a container) are left out: that GPU is not part of this topology.
///
/// # Errors
/// [`TopoError::Nvml`] at step `topology reconstruction` when the ancestor matrix is not
/// n x n, not symmetric, or not a tree (two GPUs nearer to a third than to each other);
/// [`TopoError::Invalid`] when GPU indices are not 0..n.
pub fn reconstruct(facts: &MachineFacts) -> Result<Topology> {
    let n = facts.gpus.len();
    let anc = &facts.ancestors;
    if anc.len() != n || anc.iter().any(|r| r.len() != n) {
        return Err(fail(format!("the ancestor matrix is not {n} x {n}")));
    }
    for (i, row) in anc.iter().enumerate() {
        for (j, level) in row.iter().enumerate().skip(i + 1) {
            if *level != anc[j][i] {
                return Err(fail(format!(
                    "GPU{i}-GPU{j} is {level:?} but GPU{j}-GPU{i} is {:?}",
                    anc[j][i]
                )));
            }
        }
    }
    use CommonAncestor as A;
    let levels = [
        A::Internal,
        A::Single,
        A::Multiple,
        A::HostBridge,
        A::Node,
        A::System,
    ];
    let by_level: Vec<Vec<usize>> = levels.iter().map(|l| classes(anc, *l)).collect();
    // A tree gives an ultrametric: the level at which two GPUs first share a class is theirs.
    for i in 0..n {
        for j in (i + 1)..n {
            let first = levels
                .iter()
                .zip(&by_level)
                .find(|(_, c)| c[i] == c[j])
                .map(|(l, _)| *l);
            if first != Some(anc[i][j]) {
                return Err(fail(format!(
                    "GPU{i}-GPU{j} is {:?}, but through other GPUs they meet at {:?}: not a tree",
                    anc[i][j],
                    first.unwrap_or(A::System)
                )));
            }
        }
    }
    let [_, single, multiple, host_bridge, node, _] = &by_level[..] else {
        return Err(fail("internal: level table".into()));
    };

    let mut b = TopologyBuilder::new(facts.name.clone());
    let gen_width = |members: &[usize]| -> (u8, u32) {
        let g = members
            .iter()
            .map(|m| facts.gpus[*m].pcie_gen.unwrap_or(DEFAULT_PCIE_GEN))
            .max()
            .unwrap_or(DEFAULT_PCIE_GEN);
        let w = members
            .iter()
            .map(|m| facts.gpus[*m].pcie_width.unwrap_or(DEFAULT_PCIE_WIDTH))
            .max()
            .unwrap_or(DEFAULT_PCIE_WIDTH);
        (g, w)
    };
    let all: Vec<usize> = (0..n).collect();
    let sockets = groups(&all, node);

    // NUMA ids: the first GPU's own where it is free, else the lowest id nobody claims.
    let mut claimed: Vec<u32> = facts.gpus.iter().filter_map(|g| g.info.numa).collect();
    let mut socket_numa = Vec::with_capacity(sockets.len());
    let mut used = Vec::new();
    for s in &sockets {
        let own = s.iter().find_map(|m| facts.gpus[*m].info.numa);
        let numa = match own.filter(|x| !used.contains(x)) {
            Some(x) => x,
            None => {
                let free = (0u32..).find(|x| !claimed.contains(x) && !used.contains(x));
                free.unwrap_or(0)
            }
        };
        used.push(numa);
        claimed.push(numa);
        socket_numa.push(numa);
    }

    let mut gpu_nodes: Vec<Option<NodeId>> = vec![None; n];
    let mut cpu_of = vec![0usize; n];
    let mut cpu_nodes = Vec::with_capacity(sockets.len());
    for (s, members) in sockets.iter().enumerate() {
        let cpu = b.add_cpu(socket_numa[s], facts.cpu_family);
        cpu_nodes.push(cpu);
        let bridges = groups(members, host_bridge);
        for hb in &bridges {
            let hb_parent = if bridges.len() > 1 {
                let id = b.add_host_bridge();
                let (g, w) = gen_width(hb);
                b.pcie(cpu, id, g, w);
                id
            } else {
                cpu
            };
            for multi in groups(hb, multiple) {
                let singles = groups(&multi, single);
                let (g, w) = gen_width(&multi);
                let parent_of_singles = if multi.len() == 1 {
                    None
                } else if singles.len() == 1 {
                    Some(hb_parent)
                } else {
                    let upper = b.add_pcie_switch();
                    b.pcie(hb_parent, upper, g, w);
                    Some(upper)
                };
                for one in &singles {
                    let parent = match parent_of_singles {
                        None => hb_parent,
                        Some(p) => {
                            let sw = b.add_pcie_switch();
                            let (g, w) = gen_width(one);
                            b.pcie(p, sw, g, w);
                            sw
                        }
                    };
                    for &m in one {
                        let f = &facts.gpus[m];
                        let id = b.add_gpu(f.info.clone());
                        b.pcie(
                            parent,
                            id,
                            f.pcie_gen.unwrap_or(DEFAULT_PCIE_GEN),
                            f.pcie_width.unwrap_or(DEFAULT_PCIE_WIDTH),
                        );
                        gpu_nodes[m] = Some(id);
                        cpu_of[m] = s;
                    }
                }
            }
        }
    }
    for i in 0..cpu_nodes.len() {
        for j in (i + 1)..cpu_nodes.len() {
            b.inter_socket(cpu_nodes[i], cpu_nodes[j], facts.cpu_family);
        }
    }

    // NVLinks.
    let by_bus: BTreeMap<BusId, usize> = facts
        .gpus
        .iter()
        .enumerate()
        .filter_map(|(k, g)| {
            let bus = BusId::parse(g.info.pci_bus_id.as_deref()?)?;
            Some((bus, k))
        })
        .collect();
    let generation = |k: usize| {
        facts.gpus[k]
            .info
            .compute_capability
            .and_then(|c| NvLinkGen::for_sm(c.sm()))
            .unwrap_or(DEFAULT_NVLINK_GEN)
    };
    let mut pair: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    let mut to_switch: BTreeMap<(usize, BusId), u32> = BTreeMap::new();
    let mut switch_order: Vec<BusId> = Vec::new();
    let mut to_cpu: BTreeMap<usize, u32> = BTreeMap::new();
    for (k, g) in facts.gpus.iter().enumerate() {
        for l in &g.nvlinks {
            let Some(bus) = BusId::parse(&l.remote_bus_id) else {
                return Err(fail(format!(
                    "GPU{k} has an NVLink to {:?}, which is not a PCI bus id",
                    l.remote_bus_id
                )));
            };
            match l.remote {
                NvLinkRemote::Gpu => {
                    if let Some(&t) = by_bus.get(&bus).filter(|t| **t != k) {
                        *pair.entry((k, t)).or_insert(0) += 1;
                    }
                }
                NvLinkRemote::Switch => {
                    if !switch_order.contains(&bus) {
                        switch_order.push(bus);
                    }
                    *to_switch.entry((k, bus)).or_insert(0) += 1;
                }
                NvLinkRemote::Cpu => *to_cpu.entry(k).or_insert(0) += 1,
            }
        }
    }
    let node_of =
        |k: usize| gpu_nodes[k].ok_or_else(|| fail(format!("internal: GPU{k} placed nowhere")));
    for (&(a, c), &lanes) in &pair {
        if a > c && pair.contains_key(&(c, a)) {
            continue;
        }
        let lanes = lanes.max(pair.get(&(c, a)).copied().unwrap_or(0));
        b.nvlink(
            node_of(a)?,
            node_of(c)?,
            generation(a).min(generation(c)),
            lanes,
        );
    }
    let switches: BTreeMap<BusId, NodeId> = switch_order
        .iter()
        .map(|bus| (*bus, b.add_nvswitch()))
        .collect();
    for (&(k, bus), &lanes) in &to_switch {
        if let Some(&sw) = switches.get(&bus) {
            b.nvlink(node_of(k)?, sw, generation(k), lanes);
        }
    }
    for (&k, &lanes) in &to_cpu {
        b.nvlink(node_of(k)?, cpu_nodes[cpu_of[k]], generation(k), lanes);
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PathClass;
    use crate::graph::ComputeCapability;
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
