//! IBM POWER9 machines: GPUs attach to the CPU by NVLink 2 bricks, sockets join by X-Bus.

use super::gpu_info;
use crate::graph::{NicInfo, NodeId};
use crate::rates::{CpuFamily, IB_EDR_GBPS, NvLinkGen};
use crate::topology_builder::TopologyBuilder;

/// NUMA ids of the two POWER9 sockets (the AC922 sample prints 0 and 8).
const POWER9_NUMA: [u32; 2] = [0, 8];

/// `gpus_per_socket` V100 per POWER9 socket; within a socket every GPU and the CPU are joined
/// pairwise with `bricks` NVLink 2 bricks. One dual-port EDR card per socket (two NICs under one
/// PCIe switch behind a host bridge).
fn power9(b: &mut TopologyBuilder, base: u32, gpus_per_socket: u32, bricks: u32) -> Vec<NodeId> {
    let cpus = [
        b.add_cpu(POWER9_NUMA[0], CpuFamily::Power9),
        b.add_cpu(POWER9_NUMA[1], CpuFamily::Power9),
    ];
    b.inter_socket(cpus[0], cpus[1], CpuFamily::Power9);
    let mut nics = Vec::new();
    for (s, &cpu) in cpus.iter().enumerate() {
        let mut local = Vec::new();
        for k in 0..gpus_per_socket {
            let i = s as u32 * gpus_per_socket + k;
            let bus = format!("{:04X}:{:02X}:00.0", 4 + i, 4 + i);
            let g = b.add_gpu(gpu_info(
                base + i,
                "Tesla V100-SXM2-16GB",
                70,
                &bus,
                POWER9_NUMA[s],
                16,
            ));
            b.nvlink(g, cpu, NvLinkGen::V2, bricks);
            for &other in &local {
                b.nvlink(other, g, NvLinkGen::V2, bricks);
            }
            local.push(g);
        }
        let hb = b.add_host_bridge();
        b.pcie(cpu, hb, 4, 16);
        let sw = b.add_pcie_switch();
        b.pcie(hb, sw, 4, 16);
        for port in 0..2u32 {
            let n = b.add_nic(NicInfo {
                name: format!("mlx5_{}", s as u32 * 2 + port),
                numa: Some(POWER9_NUMA[s]),
                gbps: IB_EDR_GBPS,
                pci_bus_id: None,
            });
            b.pcie(sw, n, 4, 16);
            nics.push(n);
        }
    }
    nics
}

/// IBM AC922 (4-GPU): two V100 per socket, 3 bricks GPU-GPU and 3 bricks GPU-CPU.
pub(super) fn ac922(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    power9(b, base, 2, 3)
}

/// Summit node (6-GPU AC922): three V100 per socket, 2 bricks between each pair and to the CPU.
pub(super) fn summit_node(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    power9(b, base, 3, 2)
}
