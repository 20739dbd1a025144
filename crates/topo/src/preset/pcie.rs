//! PCIe-only boxes: no NVLink; GPUs under PCIe switches or on CPU root ports.

use super::gpu_info;
use crate::graph::{NicInfo, NodeId};
use crate::rates::{CpuFamily, ETH_100G_GBPS, IB_NDR_GBPS};
use crate::topology_builder::TopologyBuilder;

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

fn add_nic(b: &mut TopologyBuilder, name: String, numa: u32, gbps: f64) -> NodeId {
    b.add_nic(NicInfo {
        name,
        numa: Some(numa),
        gbps,
        pci_bus_id: None,
    })
}

/// 8x L40S in NVIDIA's "PCIe Optimized 2-8-5" reference layout: two Sapphire Rapids sockets,
/// each with two PCIe Gen5 switches holding two L40S (PCIe Gen4 x16, no NVLink) and one
/// ConnectX-7 400 Gb/s NIC; the fifth, north-south adapter is left out. The data-center driver
/// grants PCIe peer-to-peer. Source: [NVIDIA-EnterpriseRA], [NVIDIA-L40S].
pub(super) fn l40s_8gpu(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    let family = CpuFamily::IntelSapphireRapids;
    let cpus = [b.add_cpu(0, family), b.add_cpu(1, family)];
    b.inter_socket(cpus[0], cpus[1], family);
    let mut nics = Vec::new();
    for sw_i in 0..4u32 {
        let socket = sw_i / 2;
        let sw = b.add_pcie_switch();
        b.pcie(cpus[socket as usize], sw, 5, 16);
        for k in 0..2u32 {
            let local = sw_i * 2 + k;
            let bus = format!("0000:{:02X}:00.0", 0x18 + local * 0x10);
            let g = b.add_gpu(gpu_info(base + local, "NVIDIA L40S", 89, &bus, socket, 48));
            b.pcie(sw, g, 4, 16);
        }
        let n = add_nic(b, format!("mlx5_{sw_i}"), socket, IB_NDR_GBPS);
        b.pcie(sw, n, 5, 16);
        nics.push(n);
    }
    nics
}

/// A GeForce card as a consumer box holds it.
struct GeForce {
    name: &'static str,
    sm: u32,
    memory_gib: u64,
    pcie_gen: u8,
}

/// Eight GeForce cards on two AMD EPYC sockets, four on CPU root ports of each (x16 each, no
/// PCIe switch), one 100 GbE NIC per socket: a representative consumer 8-GPU server, not one
/// vendor's product. The GeForce driver refuses PCIe peer-to-peer, so
/// every GPU records `pcie_p2p: false` and all GPU-to-GPU traffic crosses host memory.
fn geforce_8gpu(b: &mut TopologyBuilder, base: u32, card: &GeForce) -> Vec<NodeId> {
    let cpus = [b.add_cpu(0, CpuFamily::Amd), b.add_cpu(1, CpuFamily::Amd)];
    b.inter_socket(cpus[0], cpus[1], CpuFamily::Amd);
    let mut nics = Vec::new();
    for (s, &cpu) in cpus.iter().enumerate() {
        let socket = s as u32;
        for k in 0..4u32 {
            let local = socket * 4 + k;
            let bus = format!("0000:{:02X}:00.0", 0x01 + local * 0x20);
            let mut info = gpu_info(
                base + local,
                card.name,
                card.sm,
                &bus,
                socket,
                card.memory_gib,
            );
            info.pcie_p2p = false;
            let g = b.add_gpu(info);
            b.pcie(cpu, g, card.pcie_gen, 16);
        }
        let n = add_nic(b, format!("mlx5_{s}"), socket, ETH_100G_GBPS);
        b.pcie(cpu, n, 4, 16);
        nics.push(n);
    }
    nics
}

/// 8x GeForce RTX 4090 (Ada, 24 GB, PCIe Gen4 x16, no NVLink, no peer-to-peer).
/// Source: [NVIDIA-RTX4090], [NCCL-Issue1127], [Tinygrad-P2P].
pub(super) fn rtx4090_8gpu(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    let card = GeForce {
        name: "NVIDIA GeForce RTX 4090",
        sm: 89,
        memory_gib: 24,
        pcie_gen: 4,
    };
    geforce_8gpu(b, base, &card)
}

/// 8x GeForce RTX 5090 (Blackwell, 32 GB, PCIe Gen5 x16, no NVLink, no peer-to-peer).
/// Source: [NVIDIA-RTX5090], [Tinygrad-P2P].
pub(super) fn rtx5090_8gpu(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    let card = GeForce {
        name: "NVIDIA GeForce RTX 5090",
        sm: 120,
        memory_gib: 32,
        pcie_gen: 5,
    };
    geforce_8gpu(b, base, &card)
}
