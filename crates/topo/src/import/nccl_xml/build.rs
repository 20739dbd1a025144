//! From what the reader took from the file to a [`Topology`], in named passes: sockets, PCIe
//! switches, GPUs, NICs, NVLinks, C2C links. Each pass adds the nodes and links of one kind
//! and checks the rules that concern it (see the module docs of [`super`]).

use std::collections::{BTreeMap, BTreeSet};

use super::{BusId, CLASS_NVLINK_CPU, DEFAULT_NVLINK_GEN, File, MAX_NVLINK_LANES, Parent, XCpu};
use crate::error::{Result, TopoError};
use crate::graph::{ComputeCapability, GpuInfo, LinkKind, NicInfo, NodeId, Topology};
use crate::rates::{CpuFamily, NvLinkGen};
use crate::topology_builder::TopologyBuilder;

/// NIC name prefixes that relaycc's own node names use (`GPU3`, `PCIe2`, ...).
const RESERVED_PREFIXES: [&str; 6] = ["GPU", "CPU", "PCIe", "NVSwitch", "HostBridge", "NetSwitch"];

/// The graph as the passes make it, with what later passes look up.
struct Build<'f> {
    file: &'f File,
    source_name: &'f str,
    b: TopologyBuilder,
    /// Socket node per `cpu` element.
    cpu_nodes: Vec<NodeId>,
    /// NUMA id per `cpu` element.
    numas: Vec<u32>,
    /// Switch node per entry of [`File::switches`].
    switch_nodes: Vec<NodeId>,
    /// GPU node per entry of [`File::gpus`].
    gpu_nodes: Vec<NodeId>,
    /// GPU index per entry of [`File::gpus`].
    indices: Vec<u32>,
    /// Entry of [`File::gpus`] per bus id.
    by_bus: BTreeMap<BusId, usize>,
    warnings: Vec<String>,
}

/// Build the topology of `file`; `source_name` labels errors and names the topology.
pub(super) fn build(file: &File, source_name: &str) -> Result<Topology> {
    let name = std::path::Path::new(source_name)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| source_name.to_string());
    let mut s = Build {
        file,
        source_name,
        b: TopologyBuilder::new(name),
        cpu_nodes: Vec::new(),
        numas: Vec::new(),
        switch_nodes: Vec::new(),
        gpu_nodes: Vec::new(),
        indices: Vec::new(),
        by_bus: BTreeMap::new(),
        warnings: Vec::new(),
    };
    s.sockets()?;
    s.switches();
    s.gpu_indices()?;
    s.gpus()?;
    s.nics()?;
    s.nvlinks()?;
    s.c2c_links();
    let mut topo = s.b.build()?;
    for w in s.warnings {
        topo.add_warning(w);
    }
    Ok(topo)
}

impl Build<'_> {
    fn err(&self, line: usize, message: String) -> TopoError {
        TopoError::parse(self.source_name, line, message)
    }

    fn parent_node(&self, p: Parent) -> Option<NodeId> {
        match p {
            Parent::Cpu(i) => self.cpu_nodes.get(i).copied(),
            Parent::Switch(i) => self.switch_nodes.get(i).copied(),
        }
    }

    /// Sockets: given NUMA ids first, then the lowest free ids for the others; every pair of
    /// sockets joined by an inter-socket link.
    fn sockets(&mut self) -> Result<()> {
        let mut taken: BTreeMap<u32, usize> = BTreeMap::new();
        for c in &self.file.cpus {
            if let Some(n) = c.numa
                && let Some(first) = taken.insert(n, c.line)
            {
                return Err(self.err(
                        c.line,
                        format!(
                            "two <cpu> elements have numaid {n} (lines {first} and {}); multi-host files are not supported",
                            c.line
                        ),
                    ));
            }
        }
        let mut next_free = 0u32;
        let mut families = Vec::with_capacity(self.file.cpus.len());
        for c in &self.file.cpus {
            let numa = match c.numa {
                Some(n) => n,
                None => {
                    while taken.contains_key(&next_free) {
                        next_free += 1;
                    }
                    taken.insert(next_free, c.line);
                    next_free
                }
            };
            let family = cpu_family(c);
            let id = self.b.add_cpu(numa, family);
            if let (
                Some(a),
                Some(crate::graph::Node {
                    kind: crate::graph::NodeKind::Cpu(info),
                    ..
                }),
            ) = (&c.affinity, self.b.node_mut(id))
            {
                info.affinity = Some(a.clone());
            }
            self.cpu_nodes.push(id);
            families.push(family);
            self.numas.push(numa);
        }
        for i in 0..self.cpu_nodes.len() {
            for j in (i + 1)..self.cpu_nodes.len() {
                let family = if families[i] == families[j] {
                    families[i]
                } else {
                    CpuFamily::Unknown
                };
                self.b
                    .inter_socket(self.cpu_nodes[i], self.cpu_nodes[j], family);
            }
        }
        Ok(())
    }

    /// PCIe switches, each linked to its parent (which comes before it in document order).
    fn switches(&mut self) {
        for up in &self.file.switches {
            let id = self.b.add_pcie_switch();
            if let Some(p) = self.parent_node(up.parent) {
                self.b.pcie(p, id, up.generation, up.width);
            }
            self.switch_nodes.push(id);
        }
    }

    /// GPU indices: `dev` where given (unique, no gaps), the lowest free indices in document
    /// order elsewhere.
    fn gpu_indices(&mut self) -> Result<()> {
        let count = self.file.gpus.len();
        let mut index_line: BTreeMap<u32, usize> = BTreeMap::new();
        for g in &self.file.gpus {
            if let Some(d) = g.dev {
                if let Some(first) = index_line.insert(d, g.line) {
                    return Err(self.err(
                        g.line,
                        format!("two GPUs have dev {d} (lines {first} and {})", g.line),
                    ));
                }
                if d as usize >= count {
                    return Err(self.err(
                        g.line,
                        format!(
                            "GPU dev {d} leaves a gap: the file has {count} GPUs, so devs must be 0..{count}"
                        ),
                    ));
                }
            }
        }
        let mut free = (0..count as u32).filter(|i| !index_line.contains_key(i));
        for g in &self.file.gpus {
            match g.dev.or_else(|| free.next()) {
                Some(i) => self.indices.push(i),
                // Unreachable: `count` GPUs and `count` indices; kept as an error, not a panic.
                None => return Err(self.err(g.line, "no GPU index left for this GPU".into())),
            }
        }
        Ok(())
    }

    /// GPU nodes (bus ids unique), each linked to its PCIe parent.
    fn gpus(&mut self) -> Result<()> {
        for (k, g) in self.file.gpus.iter().enumerate() {
            if let Some(bus) = g.bus
                && let Some(first) = self.by_bus.insert(bus, k)
            {
                return Err(self.err(
                    g.line,
                    format!(
                        "two GPUs have bus id {} (lines {} and {})",
                        g.bus_text.as_deref().unwrap_or(""),
                        self.file.gpus[first].line,
                        g.line
                    ),
                ));
            }
            let mut info = GpuInfo::new(self.indices[k]);
            info.compute_capability = g.sm.map(ComputeCapability::from_sm);
            info.pci_bus_id = g.bus_text.clone();
            info.numa = self.numas.get(g.cpu).copied();
            let id = self.b.add_gpu(info);
            if let Some(p) = self.parent_node(g.up.parent) {
                self.b.pcie(p, id, g.up.generation, g.up.width);
            }
            self.gpu_nodes.push(id);
        }
        Ok(())
    }

    /// NICs: the `net` elements, else the network-class `pci` elements (named `nic<k>`); names
    /// unique and clear of relaycc's own node names.
    fn nics(&mut self) -> Result<()> {
        let (nics, named) = if self.file.nets.is_empty() {
            (&self.file.class_nics, false)
        } else {
            (&self.file.nets, true)
        };
        let mut nic_names: BTreeMap<String, usize> = BTreeMap::new();
        for (k, n) in nics.iter().enumerate() {
            let nic_name = match (&n.name, named) {
                (Some(s), _) => s.clone(),
                _ => format!("nic{k}"),
            };
            let reserved = RESERVED_PREFIXES.iter().any(|p| {
                nic_name.strip_prefix(p).is_some_and(|rest| {
                    !rest.is_empty() && rest.bytes().all(|c| c.is_ascii_digit())
                })
            });
            if reserved {
                return Err(self.err(
                    n.line,
                    format!("NIC name {nic_name:?} clashes with relaycc's node names"),
                ));
            }
            if let Some(first) = nic_names.insert(nic_name.clone(), n.line) {
                return Err(self.err(
                    n.line,
                    format!(
                        "two NICs are named {nic_name:?} (lines {first} and {})",
                        n.line
                    ),
                ));
            }
            let id = self.b.add_nic(NicInfo {
                name: nic_name,
                numa: self.numas.get(n.cpu).copied(),
                gbps: n.gbps,
                pci_bus_id: n.bus_text.clone(),
            });
            if let Some(p) = self.parent_node(n.up.parent) {
                self.b.pcie(p, id, n.up.generation, n.up.width);
            }
        }
        Ok(())
    }

    /// NVLink generation of GPU entry `k`: from its `sm`, else the default.
    fn generation_of(&self, k: usize) -> NvLinkGen {
        self.file.gpus[k]
            .sm
            .and_then(NvLinkGen::for_sm)
            .unwrap_or(DEFAULT_NVLINK_GEN)
    }

    /// NVLinks: GPU-GPU bonds (one bond per pair, counts agreeing on both sides), GPU-NVSwitch
    /// lanes (one NVSwitch node per target bus id), GPU-CPU lanes (POWER9). A link whose target
    /// is the GPU's own bus id is ignored with a warning, as NCCL loads such files.
    fn nvlinks(&mut self) -> Result<()> {
        let mut pair: BTreeMap<(usize, usize), (u32, usize)> = BTreeMap::new();
        let mut to_switch: BTreeMap<(usize, BusId), u32> = BTreeMap::new();
        let mut switch_order: Vec<BusId> = Vec::new();
        let mut to_cpu: BTreeMap<usize, u32> = BTreeMap::new();
        let add = |sum: &mut u32, n: u32, line: usize| -> Result<()> {
            *sum = sum
                .checked_add(n)
                .filter(|s| *s <= MAX_NVLINK_LANES)
                .ok_or_else(|| {
                    self.err(
                        line,
                        format!("more than {MAX_NVLINK_LANES} NVLink lanes to one target"),
                    )
                })?;
            Ok(())
        };
        let mut warnings = Vec::new();
        for (k, g) in self.file.gpus.iter().enumerate() {
            for l in &g.nvlinks {
                if g.bus == Some(l.target) {
                    warnings.push(format!(
                        "{}:{}: <nvlink> of GPU{} targets its own bus id {} ({} lanes); the self link is ignored",
                        self.source_name, l.line, self.indices[k], l.target_text, l.count
                    ));
                    continue;
                }
                let known = self.by_bus.get(&l.target).copied();
                let class_major = l.tclass.map(|c| c >> 16);
                match (l.tclass, class_major, known) {
                    (_, Some(0x03), None) | (None, _, None) => {
                        return Err(self.err(
                            l.line,
                            format!(
                                "<nvlink> target {} is not a GPU of this file{}",
                                l.target_text,
                                if l.tclass.is_none() {
                                    " and has no tclass to say what it is"
                                } else {
                                    ""
                                }
                            ),
                        ));
                    }
                    (_, Some(0x03), Some(t)) | (None, _, Some(t)) => {
                        add(
                            &mut pair.entry((k, t)).or_insert((0, l.line)).0,
                            l.count,
                            l.line,
                        )?;
                    }
                    (Some(c), _, Some(_)) => {
                        return Err(self.err(
                            l.line,
                            format!(
                                "<nvlink> target {} is a GPU of this file but tclass {c:#08x} is not a GPU class",
                                l.target_text
                            ),
                        ));
                    }
                    (Some(CLASS_NVLINK_CPU), _, None) => {
                        add(to_cpu.entry(k).or_insert(0), l.count, l.line)?;
                    }
                    (Some(_), _, None) => {
                        if !switch_order.contains(&l.target) {
                            switch_order.push(l.target);
                        }
                        add(to_switch.entry((k, l.target)).or_insert(0), l.count, l.line)?;
                    }
                }
            }
        }
        self.warnings.extend(warnings);
        self.gpu_bonds(&pair)?;
        let nvswitches: BTreeMap<BusId, NodeId> = switch_order
            .iter()
            .map(|bus| (*bus, self.b.add_nvswitch()))
            .collect();
        for (&(k, bus), &lanes) in &to_switch {
            if let Some(&sw) = nvswitches.get(&bus) {
                let generation = self.generation_of(k);
                self.b.nvlink(self.gpu_nodes[k], sw, generation, lanes);
            }
        }
        for (&k, &lanes) in &to_cpu {
            if let Some(&cpu) = self.cpu_nodes.get(self.file.gpus[k].cpu) {
                let generation = self.generation_of(k);
                self.b.nvlink(self.gpu_nodes[k], cpu, generation, lanes);
            }
        }
        Ok(())
    }

    /// One NVLink bond per GPU pair from the lanes each side lists (`pair[(a, c)]` = lanes and
    /// line of a's elements to c). Both GPUs usually list the bond; it is one bond, so the
    /// counts must agree.
    fn gpu_bonds(&mut self, pair: &BTreeMap<(usize, usize), (u32, usize)>) -> Result<()> {
        let mut seen_pairs = BTreeSet::new();
        for (&(a, c), &(lanes, line)) in pair {
            if !seen_pairs.insert((a.min(c), a.max(c))) {
                continue;
            }
            if let Some(&(back, back_line)) = pair.get(&(c, a))
                && back != lanes
            {
                let (ia, ic) = (self.indices[a], self.indices[c]);
                return Err(self.err(
                        back_line.max(line),
                        format!(
                            "NVLink counts disagree: GPU{ia} lists {lanes} lanes to GPU{ic} (line {line}), GPU{ic} lists {back} back (line {back_line})"
                        ),
                    ));
            }
            let generation = self.generation_of(a).min(self.generation_of(c));
            self.b
                .nvlink(self.gpu_nodes[a], self.gpu_nodes[c], generation, lanes);
        }
        Ok(())
    }

    /// NVLink-C2C links from each GPU to its socket (Grace): `bw` MB/s x `count` / 1000 GB/s,
    /// as NCCL computes it; the table's value where the file gives no bandwidth.
    fn c2c_links(&mut self) {
        for (k, g) in self.file.gpus.iter().enumerate() {
            let Some(&cpu) = self.cpu_nodes.get(g.cpu) else {
                continue;
            };
            for c in &g.c2c {
                let gbps = f64::from(c.bw_mbps) * f64::from(c.count) / 1000.0;
                let kind = LinkKind::C2c;
                let gbps = if gbps > 0.0 {
                    gbps
                } else {
                    kind.default_gbps()
                };
                self.b.connect_with(
                    self.gpu_nodes[k],
                    cpu,
                    kind,
                    gbps,
                    kind.default_latency_us(),
                );
            }
        }
    }
}

/// The CPU family of a `cpu` element (see the module docs).
fn cpu_family(c: &XCpu) -> CpuFamily {
    match c.arch.as_str() {
        "ppc64" | "ppc64le" => CpuFamily::Power9,
        "arm64" | "aarch64" if c.grace_hint => CpuFamily::Grace,
        "arm64" | "aarch64" => CpuFamily::Unknown,
        // x86_64, or no arch with a vendor string that names one.
        _ => CpuFamily::from_x86(&c.vendor, c.family_id, c.model_id),
    }
}
