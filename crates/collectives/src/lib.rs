//! # relaycc-collectives: the safe collectives API
//!
//! Users hold typed buffers in the memory of each rank's device and call collectives on a
//! [`Communicator`]; every call is checked, planned once per request shape by the planner,
//! proved correct by the plan checker, and executed by one executor on a [`Backend`].
//!
//! Main types: [`Communicator`] (ranks, topology, backend, plan cache), [`DeviceBuffer`] and
//! [`BufferView`] (typed memory of one rank), [`Element`] (the ten element types),
//! [`ReduceOp`], [`Group`] and [`Pending`], [`Backend`] with [`HostBackend`], and the
//! per-rank handles [`RankComm`] and [`RankGroup`] (one thread per rank, each calling on its
//! own slices, or a few threads each driving several ranks with [`RankGroup::launch_all`]).
//!
//! | NCCL | MPI | relaycc |
//! |---|---|---|
//! | `ncclCommInitAll` | `MPI_Comm_split` | [`Communicator::new`], [`Communicator::host`] |
//! | `ncclCommInitAll`, one `ncclComm_t` per thread | (one rank per thread) | [`Communicator::into_ranks`], [`RankComm::host`], `RankComm::cuda` (feature `cuda`: one rank per GPU on NVML's topology; `cuda_or`, `cuda_with_topology` on a stated one) |
//! | `ncclCommSplit` | `MPI_Comm_split` | [`RankComm::split`] |
//! | `ncclAllReduce(send, recv, ..., comm)` on one rank | `MPI_Allreduce` on one rank | [`RankComm::all_reduce`] and the other [`RankComm`] calls |
//! | `ncclAllReduce(..., comm, stream)` on device buffers | (none) | `RankComm::on(&stream).all_reduce(..)` (feature `cuda`) |
//! | `cudaMalloc` + `cudaMemcpy` | `MPI_Alloc_mem` | [`Communicator::alloc`], [`Communicator::from_slice`], [`DeviceBuffer::to_vec`] |
//! | `ncclAllReduce` | `MPI_Allreduce` | [`Communicator::all_reduce`] |
//! | `ncclReduce` | `MPI_Reduce` | [`Communicator::reduce`] |
//! | `ncclBroadcast` | `MPI_Bcast` | [`Communicator::broadcast`] |
//! | `ncclAllGather` | `MPI_Allgather` | [`Communicator::all_gather`] |
//! | (none: a series of `ncclBroadcast`) | `MPI_Allgatherv` | [`Communicator::all_gather_v`] |
//! | `ncclReduceScatter` | `MPI_Reduce_scatter_block` | [`Communicator::reduce_scatter`] |
//! | (none: a series of `ncclReduce`) | `MPI_Reduce_scatter` | [`Communicator::reduce_scatter_v`] |
//! | grouped `ncclSend`/`ncclRecv` | `MPI_Alltoall` | [`Communicator::all_to_all`] |
//! | grouped `ncclSend`/`ncclRecv` | `MPI_Alltoallv` | [`Communicator::all_to_all_v`] |
//! | grouped `ncclSend`/`ncclRecv` | `MPI_Gather` | [`Communicator::gather`] |
//! | grouped `ncclSend`/`ncclRecv` | `MPI_Scatter` | [`Communicator::scatter`] |
//! | `ncclSend` / `ncclRecv` | `MPI_Isend` / `MPI_Irecv` | [`Group::send`] / [`Group::recv`] |
//! | `ncclGroupStart` / `ncclGroupEnd` | (none) | [`Communicator::group`] / [`Group::launch`] |
//! | one thread, several comms between `ncclGroupStart` / `ncclGroupEnd` | (none) | [`RankGroup::launch_all`] |
//! | `cudaStreamSynchronize` | `MPI_Wait` | [`Pending::wait`] |
//! | `ncclRedOp_t` | `MPI_Op` | [`ReduceOp`] |
//! | `ncclDataType_t` | `MPI_Datatype` | [`Element`] (`f32`, `f64`, `f16`, `bf16`, `i8`, `u8`, `i32`, `u32`, `i64`, `u64`) |
//! | `ncclCommInitRank` (bootstrapped by MPI) | one process per rank | `mpi::MpiCommunicator::from_mpi` (feature `mpi`): the communicator is this process's rank, with the same `Collectives` calls as threads make, on its own host slices |
//! | `ncclCommSplit` | `MPI_Comm_split` | `mpi::MpiCommunicator::split` (feature `mpi`) |
//!
//! Calls are in place, as in NCCL, when a rank's input and output are the same memory (for
//! all_gather: the input is the rank's block of the output; for reduce_scatter: the output
//! is the rank's block of the input). Any other overlap is an error.
//!
//! Mixing element types does not compile:
//!
//! ```compile_fail
//! use relaycc_collectives::{Communicator, ReduceOp};
//! let comm = Communicator::host(2).unwrap();
//! let a = [comm.alloc::<f32>(0, 4).unwrap(), comm.alloc::<f32>(1, 4).unwrap()];
//! let b = [comm.alloc::<i32>(0, 4).unwrap(), comm.alloc::<i32>(1, 4).unwrap()];
//! comm.all_reduce(&a, &b, ReduceOp::Sum);
//! ```
//!
//! Planning goes through one function (`plan_cache::make_plan`): `relaycc_route::plan`, which
//! times every candidate with the flow simulator and keeps the fastest, or, for ranks that
//! share one host memory (the `host-N` topology of [`Communicator::host`]), relaycc-route's
//! shared-memory planner, asked directly.
//! `unsafe` code lives in `backend/host.rs` (arenas, copies, lent slices) and
//! `backend/host_lanes.rs` (the lanes' copies and reductions), `rank/group_run.rs` (the per-rank
//! calls lending their slices to the backend for one call), `backend/host_reduce.rs`
//! (reduction loops), `backend/mod.rs` and `exec/mod.rs` (the contracts of `Backend::submit`,
//! of the sealed `Trusted::lend` and `Trusted::submit_on_streams`, and of `exec::launch`),
//! `exec/run.rs` and `exec/thread_transport.rs` (the `unsafe trait RankMemory`, the runner's host
//! memory run inline, its transports' raw messages), `exec/sampled_cone.rs` and `exec/nccl_transport.rs`,
//! `group.rs` (the one launch of checked plans, whose SAFETY argument ties the checker's proof
//! to the submit contract), `cuda/backend.rs` and `cuda/launch.rs` (driver calls, kernel
//! launches), the rest of the `cuda` module (FFI) and, with feature `mpi`, every file of `mpi/`
//! but `exchange.rs` and `indexed.rs` (MPI calls on raw buffers, shared-memory windows and
//! mappings).
#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod buffer;
mod call;
mod call_checks;
mod communicator;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda;
mod element;
mod error;
pub mod exec;
mod group;
#[cfg(feature = "mpi")]
#[cfg_attr(docsrs, doc(cfg(feature = "mpi")))]
pub mod mpi;
mod plan_cache;
mod rank;

pub use backend::host::{HostBackend, HostTransfers};
pub use backend::{
    AddressSpace, Backend, ByteRegion, Command, DeviceMem, Launch, Program, RawRegion, Slot,
};
pub use buffer::{AsView, BufferView, DeviceBuffer};
pub use communicator::Communicator;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use cuda::{CudaBackend, Rejected};
/// cudarc, the CUDA bindings [`CudaBackend`] is built on, at the version this crate uses, so
/// buffers passed to [`Communicator::wrap_cuda_slice`] come from the same cudarc.
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use cudarc;
pub use element::Element;
pub use error::{CollectivesError, Result};
pub use group::{Group, Pending};
pub use half::{bf16, f16};
pub use plan_cache::PlanCacheLimits;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use rank::OnStream;
pub use rank::{
    Collectives, DEFAULT_RANK_TIMEOUT, RankCalls, RankComm, RankGroup, RecvBuf, SendBuf,
};
pub use relaycc_route::ReduceOp;
/// Presets of relaycc-topo: `host-N`, the topology of [`Communicator::host`]; `nvswitch-N`,
/// the flat machine for CUDA ranks when no description of the real one is at hand, and
/// `shared-gpu-N` for ranks on one GPU (`flat_topology_for_devices` picks between them).
pub use relaycc_topo::{
    flat_topology_for_devices, host_topology, nvswitch_topology, shared_gpu_topology,
};
