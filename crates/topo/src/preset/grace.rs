//! Grace machines: GPUs attach to a Grace CPU by NVLink-C2C instead of PCIe.

use super::gpu_info;
use crate::graph::{LinkKind, NicInfo, NodeId};
use crate::rates::{
    C2C_LATENCY_US, CpuFamily, IB_NDR_GBPS, IB_NDR200_GBPS, NVLINK_C2C_GB200_PER_GPU_GBPS,
    NvLinkGen,
};
use crate::topology_builder::TopologyBuilder;

/// A NIC on a PCIe Gen5 x16 root port of `cpu`.
fn root_port_nic(
    b: &mut TopologyBuilder,
    cpu: NodeId,
    name: String,
    numa: u32,
    gbps: f64,
) -> NodeId {
    let n = b.add_nic(NicInfo {
        name,
        numa: Some(numa),
        gbps,
        pci_bus_id: None,
    });
    b.pcie(cpu, n, 5, 16);
    n
}

/// GB200 NVL72: 18 compute trays, each two GB200 superchips (one Grace CPU and two Blackwell
/// GPUs joined by NVLink-C2C, 900 GB/s bidirectional per superchip, halved per GPU) and four
/// ConnectX-7 400 Gb/s NICs, two on each Grace's PCIe Gen5. Nine NVLink switch trays hold two
/// NVSwitch chips each; every GPU sends one of its 18 NVLink 5 links to each of the 18 chips,
/// so all 72 GPUs are one NVLink domain at NV18. The sources name no link between Graces, and
/// the trays' BlueField-3 DPUs (front-end network) are left out.
/// Source: [NVIDIA-GB200NVL72], [NVIDIA-GB200Tuning].
pub(super) fn gb200_nvl72(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    const TRAYS: u32 = 18;
    const NVSWITCH_CHIPS: u32 = 18;
    let mut gpus = Vec::new();
    let mut nics = Vec::new();
    for tray in 0..TRAYS {
        for half in 0..2u32 {
            let socket = tray * 2 + half;
            let grace = b.add_cpu(socket, CpuFamily::Grace);
            for k in 0..2u32 {
                let local = socket * 2 + k;
                let bus = format!("{:04X}:01:00.0", local);
                let g = b.add_gpu(gpu_info(
                    base + local,
                    "NVIDIA GB200",
                    100,
                    &bus,
                    socket,
                    186,
                ));
                b.connect_with(
                    g,
                    grace,
                    LinkKind::C2c,
                    NVLINK_C2C_GB200_PER_GPU_GBPS,
                    C2C_LATENCY_US,
                );
                gpus.push(g);
                let name = format!("mlx5_{local}");
                nics.push(root_port_nic(b, grace, name, socket, IB_NDR_GBPS));
            }
        }
    }
    for _ in 0..NVSWITCH_CHIPS {
        let s = b.add_nvswitch();
        for g in &gpus {
            b.nvlink(*g, s, NvLinkGen::V5, 1);
        }
    }
    nics
}

/// A node of four GH200 superchips (the JUPITER Booster and HPE Cray EX254n node): each Hopper
/// GPU on its own Grace by NVLink-C2C (900 GB/s bidirectional); every pair of GPUs joined by six
/// NVLink 4 links (150 GB/s per direction); every pair of Graces by coherent NVLink at 100 GB/s
/// per direction; one InfiniBand NDR200 NIC on each Grace's PCIe Gen5.
/// Source: [JSC-Jupiter], [NVIDIA-GH200].
pub(super) fn gh200_quad(b: &mut TopologyBuilder, base: u32) -> Vec<NodeId> {
    const SUPERCHIPS: u32 = 4;
    const GPU_PAIR_LANES: u32 = 6;
    let mut cpus = Vec::new();
    let mut gpus = Vec::new();
    let mut nics = Vec::new();
    for i in 0..SUPERCHIPS {
        let grace = b.add_cpu(i, CpuFamily::Grace);
        for &other in &cpus {
            b.inter_socket(other, grace, CpuFamily::Grace);
        }
        let bus = format!("{:04X}:01:00.0", 9 * i);
        let g = b.add_gpu(gpu_info(
            base + i,
            "NVIDIA GH200 96GB HBM3",
            90,
            &bus,
            i,
            96,
        ));
        b.connect(g, grace, LinkKind::C2c);
        for &other in &gpus {
            b.nvlink(other, g, NvLinkGen::V4, GPU_PAIR_LANES);
        }
        nics.push(root_port_nic(
            b,
            grace,
            format!("mlx5_{i}"),
            i,
            IB_NDR200_GBPS,
        ));
        cpus.push(grace);
        gpus.push(g);
    }
    nics
}
