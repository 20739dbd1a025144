//! NVIDIA DGX machines.

use super::gpu_info;
use crate::graph::{NicInfo, NodeId};
use crate::rates::{CpuFamily, IB_EDR_GBPS, IB_HDR_GBPS, IB_NDR_GBPS, NvLinkGen};
use crate::topology_builder::TopologyBuilder;

fn nic(b: &mut TopologyBuilder, name: String, numa: u32, gbps: f64) -> NodeId {
    b.add_nic(NicInfo {
        name,
        numa: Some(numa),
        gbps,
        pci_bus_id: None,
    })
}

/// The DGX-1 PCIe tree: two Broadwell sockets, two PCIe Gen3 switches per socket, each with a
/// pair of GPUs and one EDR NIC (mlx5_0 with GPUs 0-1, mlx5_1 with 2-3, mlx5_2 with 4-5,
/// mlx5_3 with 6-7, as the Microway sample prints). Returns the GPUs and NICs.
fn dgx1_pcie(
    b: &mut TopologyBuilder,
    base: u32,
    gpu_name: &str,
    sm: u32,
    mem_gib: u64,
) -> (Vec<NodeId>, Vec<NodeId>) {
    const BUS: [&str; 8] = [
        "0000:06:00.0",
        "0000:07:00.0",
        "0000:0A:00.0",
        "0000:0B:00.0",
        "0000:85:00.0",
        "0000:86:00.0",
        "0000:89:00.0",
        "0000:8A:00.0",
    ];
    let cpus = [
        b.add_cpu(0, CpuFamily::IntelBroadwell),
        b.add_cpu(1, CpuFamily::IntelBroadwell),
    ];
    b.inter_socket(cpus[0], cpus[1], CpuFamily::IntelBroadwell);
    let mut gpus = Vec::new();
    let mut nics = Vec::new();
    for sw_i in 0..4u32 {
        let socket = (sw_i / 2) as usize;
        let sw = b.add_pcie_switch();
        b.pcie(cpus[socket], sw, 3, 16);
        for k in 0..2u32 {
            let local = sw_i * 2 + k;
            let g = b.add_gpu(gpu_info(
                base + local,
                gpu_name,
                sm,
                BUS[local as usize],
                socket as u32,
                mem_gib,
            ));
            b.pcie(sw, g, 3, 16);
            gpus.push(g);
        }
        let n = nic(b, format!("mlx5_{sw_i}"), socket as u32, IB_EDR_GBPS);
        b.pcie(sw, n, 3, 16);
        nics.push(n);
    }
    (gpus, nics)
}

/// DGX-1 with P100: each GPU's 4 NVLink 1 links go one to each GPU of its quad and one across.
pub(super) fn dgx1_p100(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    let (g, nics) = dgx1_pcie(b, base, "Tesla P100-SXM2-16GB", 60, 16);
    for quad in [0usize, 4] {
        for i in 0..4 {
            for j in (i + 1)..4 {
                b.nvlink(g[quad + i], g[quad + j], NvLinkGen::V1, 1);
            }
        }
    }
    for i in 0..4 {
        b.nvlink(g[i], g[i + 4], NvLinkGen::V1, 1);
    }
    nics
}

/// DGX-1 V100 NVLink bonds (GPU a, GPU b, lanes), exactly as the Microway `nvidia-smi topo -m`
/// sample shows: each GPU has 6 lanes, NV1 to two quad peers, NV2 to one quad peer and its
/// partner across.
pub const DGX1_V100_NVLINKS: [(u32, u32, u32); 16] = [
    (0, 1, 1),
    (0, 2, 1),
    (0, 3, 2),
    (0, 4, 2),
    (1, 2, 2),
    (1, 3, 1),
    (1, 5, 2),
    (2, 3, 2),
    (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1),
    (4, 6, 1),
    (4, 7, 2),
    (5, 6, 2),
    (5, 7, 1),
    (6, 7, 2),
];

/// DGX-1 with V100: hybrid cube-mesh of NVLink 2 bonds ([`DGX1_V100_NVLINKS`]).
pub(super) fn dgx1_v100(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    let (g, nics) = dgx1_pcie(b, base, "Tesla V100-SXM2-32GB", 70, 32);
    for (x, y, lanes) in DGX1_V100_NVLINKS {
        b.nvlink(g[x as usize], g[y as usize], NvLinkGen::V2, lanes);
    }
    nics
}

/// DGX-2: two baseboards of 8 V100 and 6 NVSwitches; every GPU has one link to each switch of
/// its board, and switch k of one board joins switch k of the other with 8 links. PCIe: per
/// board one Skylake socket, two upper PCIe switches, each with two lower switches holding two
/// GPUs and one EDR NIC.
pub(super) fn dgx2(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    let cpus = [
        b.add_cpu(0, CpuFamily::IntelSkylake),
        b.add_cpu(1, CpuFamily::IntelSkylake),
    ];
    b.inter_socket(cpus[0], cpus[1], CpuFamily::IntelSkylake);
    let mut gpus = Vec::new();
    let mut nics = Vec::new();
    for board in 0..2u32 {
        for upper_i in 0..2u32 {
            let upper = b.add_pcie_switch();
            b.pcie(cpus[board as usize], upper, 3, 16);
            for lower_i in 0..2u32 {
                let lower = b.add_pcie_switch();
                b.pcie(upper, lower, 3, 16);
                let pair = board * 4 + upper_i * 2 + lower_i;
                for k in 0..2u32 {
                    let local = pair * 2 + k;
                    let bus = format!("0000:{:02X}:00.0", 0x34 + local * 3);
                    let gi = gpu_info(base + local, "Tesla V100-SXM3-32GB", 70, &bus, board, 32);
                    let g = b.add_gpu(gi);
                    b.pcie(lower, g, 3, 16);
                    gpus.push(g);
                }
                let n = nic(b, format!("mlx5_{pair}"), board, IB_EDR_GBPS);
                b.pcie(lower, n, 3, 16);
                nics.push(n);
            }
        }
    }
    let mut switches = [[NodeId::end(); 6]; 2];
    for (board, row) in switches.iter_mut().enumerate() {
        for s in row.iter_mut() {
            *s = b.add_nvswitch();
            for g in &gpus[board * 8..board * 8 + 8] {
                b.nvlink(*g, *s, NvLinkGen::V2, 1);
            }
        }
    }
    for (s0, s1) in switches[0].iter().zip(&switches[1]) {
        b.nvlink(*s0, *s1, NvLinkGen::V2, 8);
    }
    nics
}

/// An 8-GPU NVSwitch board as its vendor documents it: what [`nvswitch_board`] builds.
struct NvSwitchBoard {
    family: CpuFamily,
    pcie_gen: u8,
    gpu_name: &'static str,
    sm: u32,
    mem_gib: u64,
    nic_gbps: f64,
    nvlink: NvLinkGen,
    /// NVLink lanes from every GPU to each NVSwitch chip, one entry per chip.
    lanes_per_switch: &'static [u32],
}

/// The layout DGX A100, H100, H200 and B200 share: two sockets with four GPUs each; per GPU
/// pair a host bridge and an upper PCIe switch; under it each GPU and each NIC on a lower switch
/// of its own (so GPU-to-its-NIC is PXB, other devices of the socket NODE); every GPU joined to
/// every NVSwitch chip by `lanes_per_switch` links. Returns the NICs.
fn nvswitch_board(b: &mut TopologyBuilder, base: u32, spec: &NvSwitchBoard) -> Vec<NodeId> {
    let (family, pcie_gen) = (spec.family, spec.pcie_gen);
    let cpus = [b.add_cpu(0, family), b.add_cpu(1, family)];
    b.inter_socket(cpus[0], cpus[1], family);
    let mut gpus = Vec::new();
    let mut nics = Vec::new();
    for pair in 0..4u32 {
        let socket = pair / 2;
        let hb = b.add_host_bridge();
        b.pcie(cpus[socket as usize], hb, pcie_gen, 16);
        let upper = b.add_pcie_switch();
        b.pcie(hb, upper, pcie_gen, 16);
        for k in 0..2u32 {
            let local = pair * 2 + k;
            let lower = b.add_pcie_switch();
            b.pcie(upper, lower, pcie_gen, 16);
            let bus = format!("0000:{:02X}:00.0", 0x07 + local * 0x20);
            let info = gpu_info(
                base + local,
                spec.gpu_name,
                spec.sm,
                &bus,
                socket,
                spec.mem_gib,
            );
            let g = b.add_gpu(info);
            b.pcie(lower, g, pcie_gen, 16);
            gpus.push(g);
            let nic_sw = b.add_pcie_switch();
            b.pcie(upper, nic_sw, pcie_gen, 16);
            let n = nic(b, format!("mlx5_{local}"), socket, spec.nic_gbps);
            b.pcie(nic_sw, n, pcie_gen, 16);
            nics.push(n);
        }
    }
    for &lanes in spec.lanes_per_switch {
        let s = b.add_nvswitch();
        for g in &gpus {
            b.nvlink(*g, s, spec.nvlink, lanes);
        }
    }
    nics
}

/// DGX A100: 8 A100-SXM4-80GB; 6 NVSwitches, 2 NVLink 3 links from every GPU to each (NV12);
/// two AMD Rome sockets; PCIe Gen4; 8 HDR NICs.
pub(super) fn dgx_a100(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    let spec = NvSwitchBoard {
        family: CpuFamily::Amd,
        pcie_gen: 4,
        gpu_name: "NVIDIA A100-SXM4-80GB",
        sm: 80,
        mem_gib: 80,
        nic_gbps: IB_HDR_GBPS,
        nvlink: NvLinkGen::V3,
        lanes_per_switch: &[2; 6],
    };
    nvswitch_board(b, base, &spec)
}

/// DGX H100: 8 H100-SXM5-80GB; 4 NVSwitches taking 5, 4, 4 and 5 NVLink 4 links from every
/// GPU (NV18); two Sapphire Rapids sockets; PCIe Gen5; 8 NDR NICs.
pub(super) fn dgx_h100(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    nvswitch_board(b, base, &h100_board("NVIDIA H100 80GB HBM3", 80))
}

/// The DGX H100 board with `gpu_name` GPUs of `mem_gib` GiB (H100 or H200).
fn h100_board(gpu_name: &'static str, mem_gib: u64) -> NvSwitchBoard {
    NvSwitchBoard {
        family: CpuFamily::IntelSapphireRapids,
        pcie_gen: 5,
        gpu_name,
        sm: 90,
        mem_gib,
        nic_gbps: IB_NDR_GBPS,
        nvlink: NvLinkGen::V4,
        lanes_per_switch: &[5, 4, 4, 5],
    }
}

/// DGX B200: 8 B200 (180 GB each); 2 NVSwitch chips taking 9 NVLink 5 links from every GPU
/// (NV18, 1.8 TB/s per GPU bidirectional); two Xeon 8570 (Emerald Rapids) sockets; PCIe Gen5;
/// 8 ConnectX-7 NICs at 400 Gb/s. The two BlueField-3 DPUs serve storage and management, not
/// the compute fabric, and are left out. Source: [NVIDIA-DGXB200].
pub(super) fn dgx_b200(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    let spec = NvSwitchBoard {
        family: CpuFamily::IntelEmeraldRapids,
        pcie_gen: 5,
        gpu_name: "NVIDIA B200",
        sm: 100,
        mem_gib: 180,
        nic_gbps: IB_NDR_GBPS,
        nvlink: NvLinkGen::V5,
        lanes_per_switch: &[9, 9],
    };
    nvswitch_board(b, base, &spec)
}

/// HGX H200 in its DGX H200 form: the DGX H100 wiring (4 NVSwitch chips taking 5, 4, 4 and 5
/// NVLink 4 links from every GPU, NV18; two Sapphire Rapids sockets; PCIe Gen5; 8 NDR NICs)
/// with H200 141 GB GPUs. Source: [NVIDIA-H200], [NVIDIA-H100].
pub(super) fn hgx_h200(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    nvswitch_board(b, base, &h100_board("NVIDIA H200", 141))
}
