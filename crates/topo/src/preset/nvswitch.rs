//! The `nvswitch-<N>` preset: N GPUs on one NVSwitch, the flat topology of CUDA communicators
//! that are given no machine description.

use crate::error::Result;
use crate::graph::Topology;
use crate::rates::{CpuFamily, NvLinkGen};
use crate::topology_builder::TopologyBuilder;

use super::gpu_info;

/// The most GPUs an `nvswitch-<N>` topology has: as many ranks as `relaycc bench` takes, since
/// several logical ranks may share one physical GPU.
pub const MAX_NVSWITCH_GPUS: u32 = 1024;

/// NVLink 4 links from each GPU to the switch: a DGX H100's 18 (450 GB/s per direction).
const LINKS_PER_GPU: u32 = 18;

/// The topology `nvswitch-<n>`: `n` GPUs `GPU0..GPU<n-1>` (H100-class, compute capability 9.0),
/// each joined to one NVSwitch by 18 NVLink 4 links and to one CPU socket by PCIe Gen5 x16.
///
/// This is the flat machine a CUDA communicator plans on when nothing better is known: `relaycc
/// bench --backend cuda` without `--topology`, and several logical ranks sharing one GPU. Unlike
/// [`super::host_topology`] its devices are GPUs, not host arenas, so the planner picks GPU
/// algorithms (rings and trees with MiB chunks, a few kernels per chunk) instead of the
/// shared-memory planner's cache-sized chunks, whose thousands of small copies and kernel
/// launches are what a CPU wants and a GPU does not. On a real multi-GPU machine, give its own
/// topology (`auto`, a file or a preset) instead: this one knows nothing of its links.
///
/// Errors: `n` outside `1..=`[`MAX_NVSWITCH_GPUS`].
///
/// # Example
/// ```
/// let topo = relaycc_topo::nvswitch_topology(4).unwrap();
/// assert_eq!(topo.gpu_count(), 4);
/// assert_eq!(topo.name(), "nvswitch-4");
/// assert!(!topo.shares_host_memory(&[0, 1, 2, 3]));
/// assert_eq!(relaycc_topo::preset("nvswitch-4").unwrap().gpu_count(), 4);
/// ```
pub fn nvswitch_topology(n: u32) -> Result<Topology> {
    let name = super::sized_name("nvswitch", n, MAX_NVSWITCH_GPUS)?;
    let mut b = TopologyBuilder::new(name);
    let cpu = b.add_cpu(0, CpuFamily::Unknown);
    let switch = b.add_nvswitch();
    for i in 0..n {
        let bus = format!("{:04X}:{:02X}:00.0", i / 256, i % 256);
        let g = b.add_gpu(gpu_info(i, "GPU on one NVSwitch", 90, &bus, 0, 80));
        b.pcie(cpu, g, 5, 16);
        b.nvlink(g, switch, NvLinkGen::V4, LINKS_PER_GPU);
    }
    b.build()
}
