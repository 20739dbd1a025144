//! # relaycc
//!
//! Topology-aware collective communication for GPUs. This facade re-exports the workspace's
//! crates as modules, and the types most programs need at its root:
//!
//! | module | crate | owns |
//! |---|---|---|
//! | [`topo`] | relaycc-topo | the machine as a graph; presets, importers, exporters |
//! | [`route`] | relaycc-route | choosing a plan, and at its door the Plan IR and checker (relaycc-plan), the flow simulator and bounds (relaycc-sim), the planners (relaycc-planners) |
//! | [`collectives`] | relaycc-collectives | the safe API, the executor, the backends |
//!
//! | at the root | for |
//! |---|---|
//! | [`Topology`], [`preset`], [`load`], [`Mask`] | describing the machine |
//! | [`plan`], [`PlanOptions`], [`Request`], [`Collective`], [`DType`], [`Plan`], [`Planned`], [`check`] | planning a collective |
//! | [`simulate`], [`SimConfig`], [`SimResult`] | timing a plan on the model |
//! | [`Collectives`], [`RankComm`], [`RankGroup`], [`RankCalls`], [`SendBuf`], [`RecvBuf`], [`ReduceOp`], [`DEFAULT_RANK_TIMEOUT`] | per-rank collectives, one thread (or process) per rank, each on its own buffers: the same calls on every transport |
//! | `RankComm::cuda`, `OnStream`, `CudaBackend`, `Rejected`, `CudaError`, `cudarc` (feature `cuda`) | GPU ranks, their calls on the caller's CUDA stream |
//! | `MpiCommunicator`, `MpiError`, `MpiResult`, `NeighborExchange`, `TransferMode`, `DevicePlan`, `SharedHostBuffer`, `rsmpi` (feature `mpi`); `MpiGpu`, `MpiOnStream`, `GpuTransport` (features `mpi` and `cuda`) | one rank per process over MPI, on host or GPU memory |
//! | [`Communicator`], [`DeviceBuffer`], [`BufferView`], [`Element`], [`Group`], [`Pending`], [`PlanCacheLimits`] | all ranks' collectives from one thread, on buffers the communicator allocates |
//! | [`Backend`], [`HostBackend`], [`HostTransfers`], [`host_topology`], [`nvswitch_topology`], [`shared_gpu_topology`], [`flat_topology_for_devices`] | where buffers live |
//! | [`TopoError`], [`RouteError`], [`CollectivesError`] | errors, one per crate |
//!
//! Feature `cuda` (on by default) adds the CUDA backend, `cudarc` (the version the backend
//! is built on, for `Communicator::wrap_cuda_slice` and buffers on a stream) and NVML
//! discovery; `nccl` (off) NCCL beside relaycc (`cuda::nccl`, the NCCL transport of GPU ranks
//! over MPI) and cudarc's NCCL bindings; `mpi` (off) one rank per process. Without `cuda`
//! nothing CUDA or NVML is compiled, for programs that only plan, simulate or use the host
//! backend.
//!
//! ## A data-parallel step, one thread per rank
//!
//! Each rank averages its gradients with the others' through its own handle, as an engine
//! calls `ncclAllReduce` from one thread per GPU. The step is written against the
//! [`Collectives`] trait, so the same function runs on every transport:
//!
//! ```
//! use relaycc::{Collectives, RankComm, RecvBuf, ReduceOp};
//!
//! fn step<C: Collectives, B: RecvBuf<f32> + ?Sized>(comm: &mut C, grads: &mut B) -> relaycc::collectives::Result<()> {
//!     comm.all_reduce_in_place(grads, ReduceOp::Avg)
//! }
//!
//! // Four ranks in this process's memory, one thread each.
//! let threads: Vec<_> = RankComm::host(4)?
//!     .into_iter()
//!     .map(|mut rank| {
//!         std::thread::spawn(move || {
//!             let mut grads = vec![rank.rank() as f32; 1 << 16];
//!             step(&mut rank, &mut grads[..]).map(|()| grads[0])
//!         })
//!     })
//!     .collect();
//! for t in threads {
//!     assert_eq!(t.join().expect("rank thread")?, 1.5); // (0 + 1 + 2 + 3) / 4
//! }
//! # Ok::<(), relaycc::CollectivesError>(())
//! ```
//!
//! On GPUs (feature `cuda`) the ranks come from `RankComm::cuda`, one per GPU on
//! the machine's topology as NVML describes it, and the same step runs on cudarc buffers on
//! each rank's own stream, enqueued there without a host synchronization
//! (`examples/gpu_dp_step.rs`; `examples/nccl_vs_relaycc.rs` writes it beside
//! `cudarc::nccl`):
//!
//! ```no_run
//! # // no_run: needs CUDA GPUs and a driver (without one, RankComm::cuda returns
//! # // CollectivesError::Cuda(CudaError::NoDriver)).
//! # #[cfg(feature = "cuda")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use relaycc::cudarc::driver::CudaContext;
//! use relaycc::{Collectives, RankComm, ReduceOp};
//!
//! let ranks = RankComm::cuda(&[0, 1, 2, 3])?;
//! std::thread::scope(|s| {
//!     for mut rank in ranks {
//!         s.spawn(move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!             let stream = CudaContext::new(rank.cuda_device().ok_or("no GPU")?)?.new_stream()?;
//!             let mut grads = stream.alloc_zeros::<f32>(1 << 20)?; // the backward pass's output
//!             rank.on(&stream).all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
//!             Ok(()) // a kernel enqueued on `stream` now reads the average
//!         });
//!     }
//! });
//! # Ok(()) }
//! # #[cfg(not(feature = "cuda"))]
//! # fn main() {}
//! ```
//!
//! Across processes (feature `mpi`, under `mpirun`) each process is one rank
//! (`examples/mpi_dp_step.rs`):
//!
//! ```no_run
//! # // no_run: needs an MPI launcher.
//! # #[cfg(feature = "mpi")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use relaycc::rsmpi::traits::Communicator as _;
//! use relaycc::{Collectives, MpiCommunicator, ReduceOp, rsmpi};
//!
//! let universe = rsmpi::initialize().ok_or("MPI cannot be initialized")?;
//! let world = universe.world();
//! // The communicator is this process's rank: the same `Collectives` calls as threads make.
//! let mut comm = MpiCommunicator::from_mpi(&world, world.rank() as u32, None)?;
//! let mut grads = vec![comm.rank() as f32; 1 << 20];
//! comm.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
//! # Ok(()) }
//! # #[cfg(not(feature = "mpi"))]
//! # fn main() {}
//! ```
//!
//! Planning alone needs no GPU:
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
/// (`all_reduce`, `all_gather_v`, ...), `split`, persistent node-aware exchanges, memory other
/// local ranks map, plans run on a backend's memory, and rsmpi at the version they are built on.
#[cfg(feature = "mpi")]
#[cfg_attr(docsrs, doc(cfg(feature = "mpi")))]
pub use relaycc_collectives::mpi::{
    DevicePlan, MpiCommunicator, MpiError, MpiResult, NeighborExchange, SharedHostBuffer,
    TransferMode, rsmpi,
};
/// GPU ranks across processes (features `mpi` and `cuda`): collectives on cudarc buffers on
/// the caller's stream, over MPI or NCCL.
#[cfg(all(feature = "mpi", feature = "cuda"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "mpi", feature = "cuda"))))]
pub use relaycc_collectives::mpi::{GpuTransport, MpiGpu, MpiOnStream};
pub use relaycc_collectives::{
    Backend, BufferView, Collectives, CollectivesError, Communicator, DEFAULT_RANK_TIMEOUT,
    DeviceBuffer, Element, Group, HostBackend, HostTransfers, Pending, PlanCacheLimits, RankCalls,
    RankComm, RankGroup, RecvBuf, ReduceOp, SendBuf, bf16, f16, flat_topology_for_devices,
    host_topology, nvswitch_topology, shared_gpu_topology,
};
/// The CUDA backend and GPU ranks on the caller's stream (feature `cuda`), and cudarc at the
/// version they are built on.
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use relaycc_collectives::{CudaBackend, OnStream, Rejected, cuda::CudaError, cudarc};
pub use relaycc_route::{
    Collective, DType, Plan, PlanOptions, Planned, Request, RouteError, SimConfig, SimResult,
    check, plan, simulate,
};
pub use relaycc_topo::{Mask, TopoError, Topology, load, preset};

/// The README's Rust code, compiled and run as doctests so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
