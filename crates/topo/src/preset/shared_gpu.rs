//! The `shared-gpu-<N>` preset: N ranks on one GPU, each an arena of its device memory.

use crate::error::Result;
use crate::graph::{ComputeCapability, GpuInfo, LinkKind, Topology};
use crate::rates::HBM_H100_GBPS;
use crate::topology_builder::TopologyBuilder;

/// The most ranks a `shared-gpu-<N>` topology has, as for `nvswitch-<N>`.
pub const MAX_SHARED_GPU_RANKS: u32 = 1024;

/// The topology `shared-gpu-<n>`: `n` logical devices `GPU0..GPU<n-1>` that are all ranks on
/// one physical GPU (an H100-class device, compute capability 9.0), each an arena of its
/// memory ([`GpuInfo::device_arena`] `= Some(0)`), joined to one node that stands for that
/// memory at half its bandwidth in each direction ([`HBM_H100_GBPS`] / 2: a copy from one
/// arena to another reads and writes the same memory), so that every arena has a path to
/// every other. The node is a switch of the PCIe kind: a hub that offers nothing of its own,
/// where an NVSwitch node would let the baseline model NVLink SHARP reductions that one GPU's
/// memory does not do.
///
/// The links are not what a plan pays for here: the planner sees the shared memory
/// ([`Topology::shared_device`]) and gives these ranks the shared-memory algorithms that read
/// every rank's buffer where it lies, so an all_reduce moves what it must (each input read
/// once, each output written once) in a handful of kernels; the simulator charges a copy
/// between two arenas to the one device memory they share, not to these links. This is the topology of several
/// CUDA ranks on one GPU (`relaycc bench --backend cuda --gpus 0,0,0,0`).
///
/// Errors: `n` outside `1..=`[`MAX_SHARED_GPU_RANKS`].
///
/// # Example
/// ```
/// let topo = relaycc_topo::shared_gpu_topology(4).unwrap();
/// assert_eq!(topo.name(), "shared-gpu-4");
/// assert_eq!(topo.shared_device(&[0, 1, 2, 3]), Some(0));
/// assert!(topo.shares_memory(&[3, 1]) && !topo.shares_host_memory(&[3, 1]));
/// assert_eq!(relaycc_topo::preset("shared-gpu-4").unwrap().gpu_count(), 4);
/// ```
pub fn shared_gpu_topology(n: u32) -> Result<Topology> {
    let name = super::sized_name("shared-gpu", n, MAX_SHARED_GPU_RANKS)?;
    let mut b = TopologyBuilder::new(name);
    let memory = b.add_pcie_switch();
    for i in 0..n {
        let mut info = GpuInfo::new(i);
        info.name = format!("rank {i} on GPU 0");
        info.compute_capability = Some(ComputeCapability::from_sm(90));
        info.device_arena = Some(0);
        let g = b.add_gpu(info);
        let kind = LinkKind::Pcie {
            generation: 5,
            width: 16,
        };
        b.connect_with(g, memory, kind, HBM_H100_GBPS / 2.0, 0.0);
    }
    b.build()
}

/// The flat topology for ranks on the CUDA devices `devices` (rank `r` on `devices[r]`) when no
/// description of the machine is at hand: [`shared_gpu_topology`] when every rank is on one
/// device (they share its memory), [`super::nvswitch_topology`] otherwise (one GPU per rank on
/// one switch). `relaycc bench --backend cuda` without `--topology` plans on it.
///
/// Errors: no device, or more ranks than the topology takes.
///
/// # Example
/// ```
/// assert_eq!(relaycc_topo::flat_topology_for_devices(&[0, 0, 0]).unwrap().name(), "shared-gpu-3");
/// assert_eq!(relaycc_topo::flat_topology_for_devices(&[0, 1]).unwrap().name(), "nvswitch-2");
/// ```
pub fn flat_topology_for_devices(devices: &[usize]) -> Result<Topology> {
    let n = u32::try_from(devices.len()).unwrap_or(u32::MAX);
    if devices.windows(2).all(|w| w[0] == w[1]) {
        shared_gpu_topology(n)
    } else {
        super::nvswitch_topology(n)
    }
}
