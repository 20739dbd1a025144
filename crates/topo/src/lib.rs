//! # relaycc-topo: the machine as a graph
//!
//! relaycc plans how bytes travel between GPUs; this crate says what links exist. A
//! [`Topology`] is a petgraph directed graph of GPUs, CPU sockets (NUMA nodes with their memory
//! bandwidth), PCIe switches and host bridges, NVSwitches, NICs and network switches. Every
//! full-duplex link is two directed edges with a capacity (GB/s) and a latency (us), because
//! copies in opposite directions do not compete.
//!
//! | where a topology comes from | call |
//! |---|---|
//! | an embedded preset (`dgx1-v100`, `ac922`, `host-4`, `cluster:4xdgx1-v100:ib-edr`, ...) | [`preset()`] |
//! | `nvidia-smi topo -m` output | [`import::smi::parse`] |
//! | NCCL topology XML (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`) | [`import::nccl_xml::parse`] |
//! | the live machine, through NVML | [`import::nvml::discover`] |
//! | relaycc's own JSON | [`import::json::parse`] |
//! | any of the above, as `--topology` takes it | [`load`] |
//!
//! | where it goes | call |
//! |---|---|
//! | relaycc JSON (round-trips exactly) | [`export::to_json`] |
//! | Graphviz DOT | [`export::to_dot`] |
//! | the `nvidia-smi topo -m` matrix | [`export::to_smi`] |
//!
//! Rates come from one table ([`rates`]); a [`Calibration`] file overrides them with measured
//! figures. A [`Mask`] marks GPUs busy or absent and links down; queries see the masked view.
//!
//! ```
//! let topo = relaycc_topo::preset("dgx1-v100").unwrap();
//! let (g0, g3, g7) = (topo.gpu(0).unwrap(), topo.gpu(3).unwrap(), topo.gpu(7).unwrap());
//! assert_eq!(topo.classify(g0, g3).to_string(), "NV2");
//! assert_eq!(topo.classify(g0, g7).to_string(), "SYS");
//! ```
//!
//! Invariant: this crate knows nothing of plans, backends, CUDA or MPI.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod calibration;
mod classify;
mod error;
pub mod export;
mod graph;
pub mod import;
mod link_tables;
mod mask;
mod nvlink;
mod preset;
pub mod rates;
mod symmetry;
mod topology_builder;

pub use calibration::{
    Calibration, KindRate, LinkRate, MAX_DEVICE_MEM_GBPS, MAX_LATENCY_US, MAX_LINK_GBPS,
    MAX_NVLINK_LANE_GBPS, MAX_NVLINK_LANES, MAX_PCIE_X16_GBPS, MIN_LINK_GBPS, MemoryRate,
};
pub use classify::PathClass;
pub use error::{Result, TopoError};
pub use graph::{
    ComputeCapability, CpuInfo, GpuInfo, Link, LinkId, LinkKind, NicInfo, Node, NodeId, NodeKind,
    Topology,
};
pub use import::load;
pub use mask::Mask;
pub use preset::{
    DGX1_V100_NVLINKS, MAX_HOST_ARENAS, MAX_NVSWITCH_GPUS, MAX_SHARED_GPU_RANKS,
    flat_topology_for_devices, host_topology, is_preset, list as list_presets, nvswitch_topology,
    preset, shared_gpu_topology,
};
pub use symmetry::HostSymmetry;
pub use topology_builder::TopologyBuilder;

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
