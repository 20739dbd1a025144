//! From a checked matrix to a graph: CPU sockets, a PCIe tree per socket that reproduces the
//! PIX/PXB/PHB/NODE/SYS cells, and NVLink bonds or an NVSwitch fabric that reproduce the NV#
//! cells.
//!
//! The PCIe cells of one machine form an ultrametric: with PIX=1 < PXB=2 < PHB=3 < NODE=4 <
//! SYS=5, every cell (a, c) is at most the larger of (a, b) and (b, c), because each class only
//! says how high the lowest common ancestor of a and c sits in the tree. NV# cells hide the PCIe
//! relation of a GPU pair, so those cells are unknown; each is filled with the smallest value the
//! known cells allow (the minimax path through known cells). A known cell that is larger than
//! such a path cannot come from any tree and is refused.

use crate::classify::PathClass;
use crate::error::{Result, TopoError};
use crate::graph::{GpuInfo, NicInfo, NodeId};
use crate::rates::{CpuFamily, NvLinkGen};
use crate::topology_builder::TopologyBuilder;

use super::matrix::Matrix;

/// At most a single PCIe switch between the two devices.
const PIX: u8 = 1;
/// Several PCIe switches, no host bridge.
const PXB: u8 = 2;
/// Through a host bridge (or the CPU's root ports).
const PHB: u8 = 3;
/// Between host bridges of one socket.
const NODE: u8 = 4;
/// Across sockets.
const SYS: u8 = 5;
/// A cell the matrix does not give (NV# hides the PCIe relation).
const UNKNOWN: u8 = u8::MAX;

/// NVLink ports of the largest GPUs (H100, H200, B200: 18; [NVIDIA-H100], [NVIDIA-B200]). A GPU
/// whose NV# cells add up to more than this cannot have direct links to all its peers, so it
/// sits behind an NVSwitch.
pub(super) const MAX_NVLINKS_PER_GPU: u32 = 18;
/// NVLink ports of a V100 (NVLink 2). A GPU using more than this many is NVLink 3 or later.
const V100_NVLINKS: u32 = 6;
/// NVLink ports of an A100 (NVLink 3). A GPU using more than this many is NVLink 4 or later.
const A100_NVLINKS: u32 = 12;
/// PCIe lane count given to every reconstructed PCIe link; the matrix does not show widths.
const PCIE_WIDTH: u32 = 16;

/// The PCIe level of a cell; NV# is unknown.
fn level(c: PathClass) -> u8 {
    match c {
        PathClass::SameDevice => 0,
        PathClass::NvLink(_) => UNKNOWN,
        PathClass::Pix => PIX,
        PathClass::Pxb => PXB,
        PathClass::Phb => PHB,
        PathClass::Node => NODE,
        PathClass::Sys => SYS,
    }
}

/// The class name of a level, for messages.
fn level_name(l: u8) -> &'static str {
    match l {
        0 => "X",
        PIX => "PIX",
        PXB => "PXB",
        PHB => "PHB",
        NODE => "NODE",
        SYS => "SYS",
        _ => "NV#",
    }
}

/// Build the topology the matrix describes.
pub(super) fn build(m: &Matrix, source_name: &str) -> Result<crate::graph::Topology> {
    let n = m.devices.len();
    let known: Vec<Vec<u8>> = m
        .cells
        .iter()
        .map(|row| row.iter().map(|c| level(*c)).collect())
        .collect();
    let closed = minimax_closure(&known);
    check_tree_consistent(m, &known, &closed, source_name)?;
    let sockets = sockets(m, &known, &closed);
    let numa = socket_numa(m, &sockets);
    let mut socket_of = vec![0; n];
    for (s, members) in sockets.iter().enumerate() {
        for &d in members {
            socket_of[d] = s;
        }
    }

    let mut b = TopologyBuilder::new("");
    let mut node: Vec<Option<NodeId>> = vec![None; n];
    let mut gpus: Vec<(u32, usize)> = m
        .devices
        .iter()
        .enumerate()
        .filter_map(|(d, dev)| dev.gpu.map(|g| (g, d)))
        .collect();
    gpus.sort_unstable();
    for &(index, d) in &gpus {
        let mut info = GpuInfo::new(index);
        info.numa = Some(numa[socket_of[d]]);
        node[d] = Some(b.add_gpu(info));
    }
    for (d, dev) in m.devices.iter().enumerate() {
        if dev.gpu.is_none() {
            node[d] = Some(b.add_nic(NicInfo {
                name: dev.nic_name.clone(),
                numa: Some(numa[socket_of[d]]),
                gbps: 0.0,
                pci_bus_id: None,
            }));
        }
    }
    let node: Vec<NodeId> = node.into_iter().flatten().collect();

    let generation = nvlinks(&mut b, m, &node);
    let pcie_gen = match generation {
        Some(NvLinkGen::V5 | NvLinkGen::V4) => 5,
        Some(NvLinkGen::V3) => 4,
        _ => 3,
    };
    let mut cpus = Vec::new();
    for (s, members) in sockets.iter().enumerate() {
        let cpu = b.add_cpu(numa[s], CpuFamily::Unknown);
        let affinity = members
            .iter()
            .find_map(|&d| m.devices[d].cpu_affinity.clone());
        if let Some(crate::graph::NodeKind::Cpu(info)) = b.node_mut(cpu).map(|n| &mut n.kind) {
            info.affinity = affinity;
        }
        for &other in &cpus {
            b.inter_socket(other, cpu, CpuFamily::Unknown);
        }
        cpus.push(cpu);
        let dist = |a: usize, c: usize| closed[a][c].min(NODE);
        let mut tree = Tree {
            b: &mut b,
            node: &node,
            dist: &dist,
            generation: pcie_gen,
        };
        tree.socket(cpu, members);
    }
    b.build().map_err(|e| {
        TopoError::parse(
            source_name,
            0,
            format!("the matrix cannot be modelled: {e}"),
        )
    })
}

/// All-pairs minimax path values over known cells: `closed[a][b]` is the smallest, over paths
/// a -> ... -> b through known cells, of the largest cell on the path. In a tree-consistent
/// matrix it equals every known cell and is the tightest value for every unknown one.
fn minimax_closure(known: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let n = known.len();
    let mut m = known.to_vec();
    for k in 0..n {
        let via = m[k].clone();
        for row in m.iter_mut() {
            let ik = row[k];
            if ik == UNKNOWN {
                continue;
            }
            for (cell, kj) in row.iter_mut().zip(&via) {
                *cell = (*cell).min(ik.max(*kj));
            }
        }
    }
    m
}

/// Refuse a matrix whose known cells no PCIe tree can give, naming a pair and the shorter route.
fn check_tree_consistent(
    m: &Matrix,
    known: &[Vec<u8>],
    closed: &[Vec<u8>],
    source_name: &str,
) -> Result<()> {
    let n = known.len();
    for a in 0..n {
        for c in (a + 1)..n {
            if known[a][c] == UNKNOWN || closed[a][c] >= known[a][c] {
                continue;
            }
            let via = (0..n).find(|&k| {
                k != a
                    && k != c
                    && known[a][k] != UNKNOWN
                    && known[a][k].max(closed[k][c]) == closed[a][c]
            });
            let (da, dc) = (&m.devices[a], &m.devices[c]);
            let route = match via {
                Some(k) => format!(
                    ", but {} is {} to {} and {} is within {} of {}",
                    da.label,
                    level_name(known[a][k]),
                    m.devices[k].label,
                    m.devices[k].label,
                    level_name(closed[k][c]),
                    dc.label
                ),
                None => String::new(),
            };
            return Err(TopoError::parse(
                source_name,
                da.line,
                format!(
                    "cell ({}, {}) is {}{route}: no PCIe tree gives these cells",
                    da.label,
                    dc.label,
                    level_name(known[a][c]),
                ),
            ));
        }
    }
    Ok(())
}

/// Group devices into CPU sockets. Devices joined by non-SYS PCIe cells share a socket. Groups
/// that only NV# cells join are merged when no SYS cell forbids it: first those whose NUMA
/// Affinity agrees, then any others (devices not SYS to each other share a socket). Sockets come
/// in order of their first device.
fn sockets(m: &Matrix, known: &[Vec<u8>], closed: &[Vec<u8>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (d, row) in closed.iter().enumerate() {
        match groups.iter_mut().find(|g| row[g[0]] < SYS) {
            Some(g) => g.push(d),
            None => groups.push(vec![d]),
        }
    }
    let compatible =
        |x: &[usize], y: &[usize]| x.iter().all(|&a| y.iter().all(|&c| known[a][c] != SYS));
    let numa_of = |g: &[usize]| majority(g.iter().filter_map(|&d| m.devices[d].numa));
    let mut merged: Vec<Vec<usize>> = Vec::new();
    for g in groups {
        let numa = numa_of(&g);
        let into = merged
            .iter_mut()
            .find(|s| numa.is_some() && numa_of(s) == numa && compatible(s, &g));
        match into {
            Some(s) => s.extend(g),
            None => merged.push(g),
        }
    }
    let mut sockets: Vec<Vec<usize>> = Vec::new();
    for g in merged {
        let numa = numa_of(&g);
        let into = sockets.iter_mut().find(|s| {
            let other = numa_of(s);
            (numa.is_none() || other.is_none() || numa == other) && compatible(s, &g)
        });
        match into {
            Some(s) => s.extend(g),
            None => sockets.push(g),
        }
    }
    for s in &mut sockets {
        s.sort_unstable();
    }
    sockets.sort_unstable_by_key(|s| s.first().copied());
    sockets
}

/// The most frequent value (the smallest among equals), None when there are none.
fn majority(values: impl Iterator<Item = u32>) -> Option<u32> {
    let mut counts = std::collections::BTreeMap::new();
    for v in values {
        *counts.entry(v).or_insert(0u32) += 1;
    }
    let best = counts.values().copied().max()?;
    counts.into_iter().find(|(_, c)| *c == best).map(|(v, _)| v)
}

/// The NUMA id of each socket: the NUMA Affinity most of its devices print, unless an earlier
/// socket took it (the matrix wins over the affinity column); sockets with no id get the
/// smallest free ids in order.
fn socket_numa(m: &Matrix, sockets: &[Vec<usize>]) -> Vec<u32> {
    let mut ids: Vec<Option<u32>> = Vec::new();
    for s in sockets {
        let id = majority(s.iter().filter_map(|&d| m.devices[d].numa));
        ids.push(id.filter(|id| !ids.contains(&Some(*id))));
    }
    let mut next = 0;
    ids.iter()
        .map(|id| match id {
            Some(id) => *id,
            None => {
                while ids.contains(&Some(next)) {
                    next += 1;
                }
                next += 1;
                next - 1
            }
        })
        .collect()
}

/// Add the NV# cells as links and return the NVLink generation chosen, None without NVLink.
///
/// Each group of GPUs joined by NV# cells gets direct bonds, one per cell, unless every pair of
/// the group is NV#, a GPU's cells add up to more than [`MAX_NVLINKS_PER_GPU`], and one switch
/// reproduces every cell: then one NVSwitch joins the group, each GPU by its largest NV# count
/// (a pair through a switch counts the smaller of its two GPUs' links). The generation is a
/// guess from the most links one GPU uses, because the matrix does not print it: more than 12
/// is NVLink 4 (H100/H200), more than 6 NVLink 3 (A100), otherwise NVLink 2 (V100, the most
/// common earlier part; P100's NVLink 1 and bridged workstation cards look the same).
fn nvlinks(b: &mut TopologyBuilder, m: &Matrix, node: &[NodeId]) -> Option<NvLinkGen> {
    let n = m.devices.len();
    let lanes = |a: usize, c: usize| match m.cells[a][c] {
        PathClass::NvLink(l) => l,
        _ => 0,
    };
    let mut group_of: Vec<Option<usize>> = vec![None; n];
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for start in 0..n {
        if group_of[start].is_some() || (0..n).all(|c| lanes(start, c) == 0) {
            continue;
        }
        let id = groups.len();
        let mut members = vec![start];
        group_of[start] = Some(id);
        let mut k = 0;
        while let Some(&a) = members.get(k) {
            for (c, slot) in group_of.iter_mut().enumerate() {
                if lanes(a, c) > 0 && slot.is_none() {
                    *slot = Some(id);
                    members.push(c);
                }
            }
            k += 1;
        }
        groups.push(members);
    }
    let mut plans: Vec<(Vec<usize>, Option<Vec<u32>>)> = Vec::new();
    let mut most = 0;
    for g in groups {
        let total = |a: usize| g.iter().map(|&c| lanes(a, c)).sum::<u32>();
        let widest = |a: usize| g.iter().map(|&c| lanes(a, c)).max().unwrap_or(0);
        let all_pairs = g
            .iter()
            .all(|&a| g.iter().all(|&c| a == c || lanes(a, c) > 0));
        let over = g.iter().any(|&a| total(a) > MAX_NVLINKS_PER_GPU);
        let ports: Vec<u32> = g.iter().map(|&a| widest(a)).collect();
        let switch_fits = g.iter().enumerate().all(|(i, &a)| {
            g.iter()
                .enumerate()
                .all(|(j, &c)| i == j || ports[i].min(ports[j]) == lanes(a, c))
        });
        if g.len() >= 3 && all_pairs && over && switch_fits {
            most = most.max(ports.iter().copied().max().unwrap_or(0));
            plans.push((g, Some(ports)));
        } else {
            most = most.max(g.iter().map(|&a| total(a)).max().unwrap_or(0));
            plans.push((g, None));
        }
    }
    if plans.is_empty() {
        return None;
    }
    let generation = if most > A100_NVLINKS {
        NvLinkGen::V4
    } else if most > V100_NVLINKS {
        NvLinkGen::V3
    } else {
        NvLinkGen::V2
    };
    for (g, switch) in plans {
        match switch {
            Some(ports) => {
                let sw = b.add_nvswitch();
                for (&a, &p) in g.iter().zip(&ports) {
                    b.nvlink(node[a], sw, generation, p);
                }
            }
            None => {
                for (i, &a) in g.iter().enumerate() {
                    for &c in &g[i + 1..] {
                        if lanes(a, c) > 0 {
                            b.nvlink(node[a], node[c], generation, lanes(a, c));
                        }
                    }
                }
            }
        }
    }
    Some(generation)
}

/// Builds the PCIe tree of one socket from its completed cells.
struct Tree<'a, F: Fn(usize, usize) -> u8> {
    b: &'a mut TopologyBuilder,
    node: &'a [NodeId],
    /// Completed PCIe level of two devices of the socket (at most NODE).
    dist: &'a F,
    generation: u8,
}

impl<F: Fn(usize, usize) -> u8> Tree<'_, F> {
    /// Split `members` into classes of devices closer than `level` to each other. The cells
    /// are an ultrametric, so comparing with a class's first member is enough.
    fn classes(&self, members: &[usize], level: u8) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        for &d in members {
            match out.iter_mut().find(|c| (self.dist)(c[0], d) < level) {
                Some(c) => c.push(d),
                None => out.push(vec![d]),
            }
        }
        out
    }

    fn link(&mut self, parent: NodeId, child: NodeId) {
        self.b.pcie(parent, child, self.generation, PCIE_WIDTH);
    }

    /// NODE separates host bridges: with several NODE classes each gets a host bridge under
    /// the CPU; with one, its devices hang from the CPU's root ports (PHB without a bridge).
    fn socket(&mut self, cpu: NodeId, members: &[usize]) {
        let classes = self.classes(members, NODE);
        if classes.len() == 1 {
            self.host_bridge_domain(cpu, members);
            return;
        }
        for c in classes {
            let hb = self.b.add_host_bridge();
            self.link(cpu, hb);
            self.host_bridge_domain(hb, &c);
        }
    }

    /// PHB separates what hangs directly from a host bridge (or root port).
    fn host_bridge_domain(&mut self, root: NodeId, members: &[usize]) {
        for c in self.classes(members, PHB) {
            self.switch_domain(root, &c);
        }
    }

    /// Devices at most PXB apart: one switch when all are PIX to each other, else an upper
    /// switch with one switch per PIX class below it (a class of one too, so that two lone
    /// devices are PXB, not PIX, to each other).
    fn switch_domain(&mut self, root: NodeId, members: &[usize]) {
        if let [d] = members {
            let child = self.node[*d];
            self.link(root, child);
            return;
        }
        let classes = self.classes(members, PXB);
        let top = if classes.len() == 1 {
            root
        } else {
            let up = self.b.add_pcie_switch();
            self.link(root, up);
            up
        };
        for c in classes {
            let sw = self.b.add_pcie_switch();
            self.link(top, sw);
            for d in c {
                let child = self.node[d];
                self.link(sw, child);
            }
        }
    }
}
