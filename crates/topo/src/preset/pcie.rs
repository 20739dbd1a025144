//! PCIe-only boxes: no NVLink, GPUs under PCIe switches.

use super::gpu_info;
use crate::graph::{NicInfo, NodeId, TopologyBuilder};
use crate::rates::{CpuFamily, ETH_100G_GBPS};

const GPU_NAME: &str = "Tesla V100-PCIE-32GB";

/// `sockets` Skylake sockets; under each, `uppers` upper switches, each with two lower switches
/// holding two GPUs; one 100 GbE NIC per socket on its own root port.
fn pcie_box(b: &mut TopologyBuilder, base: u32, sockets: u32, nested: bool) -> Vec<NodeId> {
    let cpus: Vec<NodeId> = (0..sockets)
        .map(|s| b.add_cpu(s, CpuFamily::IntelSkylake))
        .collect();
    for w in cpus.windows(2) {
        b.inter_socket(w[0], w[1], CpuFamily::IntelSkylake);
    }
    let mut nics = Vec::new();
    let mut index = 0u32;
    for (s, &cpu) in cpus.iter().enumerate() {
        let parent = if nested {
            let upper = b.add_pcie_switch();
            b.pcie(cpu, upper, 3, 16);
            upper
        } else {
            cpu
        };
        for _ in 0..2 {
            let sw = b.add_pcie_switch();
            b.pcie(parent, sw, 3, 16);
            for _ in 0..2 {
                let bus = format!("0000:{:02X}:00.0", 0x1A + index * 0x10);
                let g = b.add_gpu(gpu_info(base + index, GPU_NAME, 70, &bus, s as u32, 32));
                b.pcie(sw, g, 3, 16);
                index += 1;
            }
        }
        let n = b.add_nic(NicInfo {
            name: format!("mlx5_{s}"),
            numa: Some(s as u32),
            gbps: ETH_100G_GBPS,
            pci_bus_id: None,
        });
        b.pcie(cpu, n, 3, 16);
        nics.push(n);
    }
    nics
}

/// One socket, 4 GPUs in pairs under two switches (pairs PIX, across PHB).
pub(super) fn pcie_4gpu(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    pcie_box(b, base, 1, false)
}

/// Two sockets, 4 GPUs each under an upper switch with two lower ones (PIX, PXB, SYS).
pub(super) fn pcie_8gpu(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    pcie_box(b, base, 2, true)
}
