//! The `nvidia-smi topo -m` matrix computed from the graph.

use std::fmt::Write;

use crate::graph::{NodeId, Topology};

const LEGEND: &str = "Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
";

/// The matrix as a current driver prints it: tab separated, rows `GPU<i>` then `NIC<j>`, the
/// CPU Affinity, NUMA Affinity and GPU NUMA ID columns, the legend, and a NIC Legend mapping
/// `NIC<j>` to device names.
pub fn to_smi(topo: &Topology) -> String {
    let gpus: Vec<NodeId> = topo.gpu_nodes().to_vec();
    let nics: Vec<(NodeId, String)> = topo.nics().map(|(id, n)| (id, n.name.clone())).collect();
    let mut out = String::new();
    let mut header = String::new();
    for i in 0..gpus.len() {
        let _ = write!(header, "\tGPU{i}");
    }
    for j in 0..nics.len() {
        let _ = write!(header, "\tNIC{j}");
    }
    header.push_str("\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID");
    let _ = writeln!(out, "{header}");
    let devices: Vec<NodeId> = gpus
        .iter()
        .copied()
        .chain(nics.iter().map(|n| n.0))
        .collect();
    let cell = |a: NodeId, b: NodeId| {
        let c = topo.classify(a, b).to_string();
        if c == "X" { " X ".to_string() } else { c }
    };
    for (i, &g) in gpus.iter().enumerate() {
        let mut row = format!("GPU{i}");
        for &d in &devices {
            let _ = write!(row, "\t{}", cell(g, d));
        }
        let cpu = topo.attached_cpu(g).and_then(|c| topo.node(c).cpu());
        let affinity = cpu
            .and_then(|c| c.affinity.clone())
            .unwrap_or_else(|| "N/A".to_string());
        let numa = topo
            .gpu_numa(i as u32)
            .ok()
            .flatten()
            .map(|n| n.to_string())
            .unwrap_or_else(|| "N/A".to_string());
        let _ = writeln!(out, "{row}\t{affinity}\t{numa}\tN/A");
    }
    for (j, (n, _)) in nics.iter().enumerate() {
        let mut row = format!("NIC{j}");
        for &d in &devices {
            let _ = write!(row, "\t{}", cell(*n, d));
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
    out.push_str(LEGEND);
    if !nics.is_empty() {
        out.push_str("\nNIC Legend:\n\n");
        for (j, (_, name)) in nics.iter().enumerate() {
            let _ = writeln!(out, "  NIC{j}: {name}");
        }
    }
    out
}
