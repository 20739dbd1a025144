//! # relaycc
//!
//! Topology-aware collective communication for GPUs. This facade re-exports the workspace's
//! crates as modules, and the types most programs need at its root:
//!
//! | module | crate | owns |
//! |---|---|---|
//! | [`topo`] | relaycc-topo | the machine as a graph; presets, importers, exporters |
//! | [`route`] | relaycc-route | the Plan IR, planners, the flow simulator, bounds |
//! | [`collectives`] | relaycc-collectives | the safe API, the executor, the backends |
//!
//! | at the root | for |
//! |---|---|
//! | [`Topology`], [`preset`], [`load`], [`Mask`] | describing the machine |
//! | [`plan`], [`PlanOptions`], [`Request`], [`Collective`], [`DType`], [`Plan`], [`Planned`], [`check`] | planning a collective |
//! | [`simulate`], [`SimConfig`], [`SimResult`] | timing a plan on the model |
//! | [`Communicator`], [`DeviceBuffer`], [`Element`], [`ReduceOp`], [`Group`], [`Pending`] | running collectives |
//! | [`RankComm`], [`RankGroup`], [`SendBuf`], [`RecvBuf`], `OnStream` (feature `cuda`) | running collectives from one thread per rank, on each rank's own buffers |
//! | [`Backend`], [`HostBackend`], `CudaBackend` (feature `cuda`), [`host_topology`], [`nvswitch_topology`] | where buffers live |
//! | [`TopoError`], [`RouteError`], [`CollectivesError`] | errors, one per crate |
//! | `MpiCommunicator`, `MpiError`, `rsmpi` (feature `mpi`) | one rank per process: typed per-rank collectives, `split` |
//!
//! Feature `cuda` (on by default) adds the CUDA backend, `cudarc` (the version the backend
//! is built on, for `Communicator::wrap_cuda_slice`) and NVML discovery. Without it nothing
//! CUDA or NVML is compiled, for programs that only plan, simulate or use the host backend:
//!
//! ```
//! use relaycc::{Collective, DType, PlanOptions, Request, plan, preset};
//!
//! let topo = preset("dgx1-v100")?;
//! let req = Request::new(Collective::AllReduce, (0..8).collect(), 1 << 20, DType::F32);
//! let planned = plan(&topo, &req, &PlanOptions::default())?;
//! // The chosen plan is never slower, on the model, than the NCCL-like baseline.
//! assert!(planned.predicted.time_us <= planned.baseline.time_us);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use relaycc_collectives as collectives;
pub use relaycc_route as route;
pub use relaycc_topo as topo;

/// One rank per process over MPI (feature `mpi`): typed per-rank collectives on host slices
/// (`all_reduce`, `all_gather_v`, ...), `split`, and rsmpi at the version they are built on.
#[cfg(feature = "mpi")]
#[cfg_attr(docsrs, doc(cfg(feature = "mpi")))]
pub use relaycc_collectives::mpi::{MpiCommunicator, MpiError, rsmpi};
pub use relaycc_collectives::{
    Backend, BufferView, Collectives, CollectivesError, Communicator, DeviceBuffer, Element, Group,
    HostBackend, Pending, RankComm, RankGroup, RecvBuf, ReduceOp, SendBuf, bf16, f16,
    host_topology, nvswitch_topology,
};
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use relaycc_collectives::{CudaBackend, OnStream, cudarc};
pub use relaycc_route::{
    Collective, DType, Plan, PlanOptions, Planned, Request, RouteError, SimConfig, SimResult,
    check, plan, simulate,
};
pub use relaycc_topo::{Mask, TopoError, Topology, load, preset};
