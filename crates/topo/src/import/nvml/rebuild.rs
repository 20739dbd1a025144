//! The topology rebuilt from NVML's facts ([`MachineFacts`]), in named passes: the ancestor
//! matrix checked to be a tree, socket NUMA ids, each socket's PCIe tree, the inter-socket
//! links, the NVLinks.

use std::collections::BTreeMap;

use super::facts::{CommonAncestor, MachineFacts, NvLinkRemote};
use crate::error::{Result, TopoError};
use crate::graph::{NodeId, Topology};
use crate::import::nccl_xml::BusId;
use crate::rates::NvLinkGen;
use crate::topology_builder::TopologyBuilder;

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
/// The passes: `Levels::check` (the ancestor matrix is a tree), `socket_numas`, then
/// `Rebuild::socket` per socket (CPU, host bridges, switches, GPUs), the inter-socket links,
/// and `Rebuild::nvlinks`.
///
/// # Errors
/// [`TopoError::Nvml`] at step `topology reconstruction` when the ancestor matrix is not
/// n x n, not symmetric, or not a tree (two GPUs nearer to a third than to each other);
/// [`TopoError::Invalid`] when GPU indices are not 0..n.
pub fn reconstruct(facts: &MachineFacts) -> Result<Topology> {
    let levels = Levels::check(&facts.ancestors, facts.gpus.len())?;
    let all: Vec<usize> = (0..facts.gpus.len()).collect();
    let sockets = groups(&all, &levels.node);
    let numas = socket_numas(facts, &sockets);
    let mut r = Rebuild {
        facts,
        b: TopologyBuilder::new(facts.name.clone()),
        gpu_nodes: vec![None; facts.gpus.len()],
        cpu_of: vec![0; facts.gpus.len()],
        cpu_nodes: Vec::with_capacity(sockets.len()),
    };
    for (s, members) in sockets.iter().enumerate() {
        r.socket(s, members, numas[s], &levels);
    }
    for i in 0..r.cpu_nodes.len() {
        for j in (i + 1)..r.cpu_nodes.len() {
            r.b.inter_socket(r.cpu_nodes[i], r.cpu_nodes[j], facts.cpu_family);
        }
    }
    r.nvlinks()?;
    r.b.build()
}

/// The GPU classes at the levels that shape the PCIe/CPU tree: `class[i]` is the smallest
/// GPU index of the class holding GPU `i` (union-find over pairs at that level or nearer).
struct Levels {
    single: Vec<usize>,
    multiple: Vec<usize>,
    host_bridge: Vec<usize>,
    node: Vec<usize>,
}

impl Levels {
    /// Check that the ancestor matrix is `n` x `n`, symmetric and a tree (the level at which
    /// two GPUs first share a class is theirs: an ultrametric), and return its classes.
    fn check(anc: &[Vec<CommonAncestor>], n: usize) -> Result<Levels> {
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
        let Ok([_, single, multiple, host_bridge, node, _]) = <[Vec<usize>; 6]>::try_from(by_level)
        else {
            return Err(fail("internal: level table".into()));
        };
        Ok(Levels {
            single,
            multiple,
            host_bridge,
            node,
        })
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

/// NUMA id per socket: its first GPU's own where no earlier socket took it, else the lowest
/// id no GPU claims and no socket took.
fn socket_numas(facts: &MachineFacts, sockets: &[Vec<usize>]) -> Vec<u32> {
    let mut claimed: Vec<u32> = facts.gpus.iter().filter_map(|g| g.info.numa).collect();
    let mut used = Vec::with_capacity(sockets.len());
    for s in sockets {
        let own = s.iter().find_map(|m| facts.gpus[*m].info.numa);
        let numa = match own.filter(|x| !used.contains(x)) {
            Some(x) => x,
            None => (0u32..)
                .find(|x| !claimed.contains(x) && !used.contains(x))
                .unwrap_or(0),
        };
        used.push(numa);
        claimed.push(numa);
    }
    used
}

/// The graph as [`reconstruct`]'s passes make it.
struct Rebuild<'f> {
    facts: &'f MachineFacts,
    b: TopologyBuilder,
    /// Node per GPU, once placed.
    gpu_nodes: Vec<Option<NodeId>>,
    /// Socket per GPU.
    cpu_of: Vec<usize>,
    /// CPU node per socket.
    cpu_nodes: Vec<NodeId>,
}

impl Rebuild<'_> {
    /// The fastest PCIe generation and width among `members` (an uplink they share).
    fn gen_width(&self, members: &[usize]) -> (u8, u32) {
        let gpus = &self.facts.gpus;
        let g = members
            .iter()
            .map(|m| gpus[*m].pcie_gen.unwrap_or(DEFAULT_PCIE_GEN))
            .max()
            .unwrap_or(DEFAULT_PCIE_GEN);
        let w = members
            .iter()
            .map(|m| gpus[*m].pcie_width.unwrap_or(DEFAULT_PCIE_WIDTH))
            .max()
            .unwrap_or(DEFAULT_PCIE_WIDTH);
        (g, w)
    }

    /// Socket `s`: its CPU node, then a host bridge per `HostBridge` class when there are
    /// several, then [`Rebuild::switches`] below each.
    fn socket(&mut self, s: usize, members: &[usize], numa: u32, levels: &Levels) {
        let cpu = self.b.add_cpu(numa, self.facts.cpu_family);
        self.cpu_nodes.push(cpu);
        let bridges = groups(members, &levels.host_bridge);
        for hb in &bridges {
            let hb_parent = if bridges.len() > 1 {
                let id = self.b.add_host_bridge();
                let (g, w) = self.gen_width(hb);
                self.b.pcie(cpu, id, g, w);
                id
            } else {
                cpu
            };
            for multi in groups(hb, &levels.multiple) {
                self.switches(s, hb_parent, &multi, levels);
            }
        }
    }

    /// One `Multiple` class under `hb_parent`: an upper switch holding one switch per `Single`
    /// class (PXB across, PIX within), one switch when all share it, none for a lone GPU; then
    /// the GPUs.
    fn switches(&mut self, s: usize, hb_parent: NodeId, multi: &[usize], levels: &Levels) {
        let singles = groups(multi, &levels.single);
        let parent_of_singles = if multi.len() == 1 {
            None
        } else if singles.len() == 1 {
            Some(hb_parent)
        } else {
            let (g, w) = self.gen_width(multi);
            let upper = self.b.add_pcie_switch();
            self.b.pcie(hb_parent, upper, g, w);
            Some(upper)
        };
        for one in &singles {
            let parent = match parent_of_singles {
                None => hb_parent,
                Some(p) => {
                    let sw = self.b.add_pcie_switch();
                    let (g, w) = self.gen_width(one);
                    self.b.pcie(p, sw, g, w);
                    sw
                }
            };
            for &m in one {
                let f = &self.facts.gpus[m];
                let id = self.b.add_gpu(f.info.clone());
                self.b.pcie(
                    parent,
                    id,
                    f.pcie_gen.unwrap_or(DEFAULT_PCIE_GEN),
                    f.pcie_width.unwrap_or(DEFAULT_PCIE_WIDTH),
                );
                self.gpu_nodes[m] = Some(id);
                self.cpu_of[m] = s;
            }
        }
    }

    /// NVLink generation of GPU `k`: from its compute capability, else the default.
    fn generation(&self, k: usize) -> NvLinkGen {
        self.facts.gpus[k]
            .info
            .compute_capability
            .and_then(|c| NvLinkGen::for_sm(c.sm()))
            .unwrap_or(DEFAULT_NVLINK_GEN)
    }

    fn node_of(&self, k: usize) -> Result<NodeId> {
        self.gpu_nodes[k].ok_or_else(|| fail(format!("internal: GPU{k} placed nowhere")))
    }

    /// NVLinks: GPU bonds (the larger count of the two sides), NVSwitch lanes (one switch
    /// node per remote bus id), CPU lanes to the GPU's socket.
    fn nvlinks(&mut self) -> Result<()> {
        let facts = self.facts;
        let by_bus: BTreeMap<BusId, usize> = facts
            .gpus
            .iter()
            .enumerate()
            .filter_map(|(k, g)| Some((BusId::parse(g.info.pci_bus_id.as_deref()?)?, k)))
            .collect();
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
        for (&(a, c), &lanes) in &pair {
            if a > c && pair.contains_key(&(c, a)) {
                continue;
            }
            let lanes = lanes.max(pair.get(&(c, a)).copied().unwrap_or(0));
            let generation = self.generation(a).min(self.generation(c));
            let (na, nc) = (self.node_of(a)?, self.node_of(c)?);
            self.b.nvlink(na, nc, generation, lanes);
        }
        let switches: BTreeMap<BusId, NodeId> = switch_order
            .iter()
            .map(|bus| (*bus, self.b.add_nvswitch()))
            .collect();
        for (&(k, bus), &lanes) in &to_switch {
            if let Some(&sw) = switches.get(&bus) {
                let (node, generation) = (self.node_of(k)?, self.generation(k));
                self.b.nvlink(node, sw, generation, lanes);
            }
        }
        for (&k, &lanes) in &to_cpu {
            let (node, generation) = (self.node_of(k)?, self.generation(k));
            let cpu = self.cpu_nodes[self.cpu_of[k]];
            self.b.nvlink(node, cpu, generation, lanes);
        }
        Ok(())
    }
}
