//! The CUDA layer: kernels compiled at run time with NVRTC, and the driver probed before use.
//!
//! | need | here |
//! | --- | --- |
//! | which GPUs exist, their architecture, who can reach whom | [`devices`], [`DeviceInfo`] |
//! | is a driver / NVRTC present at all | [`driver`], [`nvrtc()`] |
//! | the kernels' PTX for a GPU (cached in memory and on disk, or precompiled) | [`KernelCache`] |
//! | the entry point for a type and operator, the reduce kernels' argument | [`reduce_entry`], [`FORWARD_ENTRY`], [`ReduceArgs`], [`FORWARD_BATCH_ENTRY`], [`CopyBatchArgs`] |
//! | the driver calls the CUDA backend makes for a program, counted without a GPU | [`driver_calls`] (made directly), [`replay_driver_calls`] (a captured graph replayed) |
//! | compile once, no cache (what `scripts/check-kernels` checks) | [`compile_ptx`] |
//! | NCCL on the same GPUs, for comparisons (`relaycc bench --vs-nccl`) | `nccl::NcclComms`, `nccl::nccl` (feature `nccl`) |
//!
//! Invariant: nothing here panics or aborts when CUDA is absent. Every entry point probes the
//! library it needs first (cudarc itself panics without libcuda / libnvrtc) and returns
//! [`CudaError::NoDriver`], [`CudaError::NoNvrtc`] or [`CudaError::NoNccl`]. Unsafe code lives in `libs` (dlopen),
//! `driver` and `nvrtc` (FFI through cudarc), each block with its reason.
//!
//! See `README.md` beside this file for how kernels are built and found, the environment
//! variables, and how to run the GPU tests.

mod backend;
mod cache;
mod calls;
mod copy_batch;
mod driver;
mod error;
mod fan_out;
pub mod flags;
mod graph;
mod kernel_sources;
mod launch;
mod libs;
pub mod measure;
mod memory;
#[cfg(feature = "nccl")]
#[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
pub mod nccl;
mod nvrtc;
mod schedule;

#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
mod schedule_tests;

pub use backend::{CUDA_OP_ISSUE_US, CudaBackend, Rejected};
pub use cache::{CacheConfig, KernelCache, KernelPtx, PtxOrigin, ptx_file_name};
pub use calls::{CallCountSetup, DriverCalls, driver_calls, replay_driver_calls};
pub use driver::{DeviceInfo, DriverInfo, devices, driver};
pub use error::CudaError;
pub use kernel_sources::{
    BLOCKS_PER_SM, BYTES_PER_THREAD_STEP, COPY_BATCH_ARGS_BYTES, CopyBatchArgs,
    FORWARD_BATCH_ENTRY, FORWARD_ENTRY, LaunchShape, MAX_BATCH_COPIES, MAX_REDUCE_DSTS,
    MAX_REDUCE_SRCS, REDUCE_ARGS_BYTES, REDUCE_ENTRIES, ReduceArgs, SOURCES, THREADS_PER_BLOCK,
    entry_params, expected_entries, kernel_source, missing_entries, ptx_entries, reduce_entry,
    stale_entries,
};
pub use nvrtc::{Arch, COMPILE_OPTIONS, NvrtcInfo, check_entries, compile_ptx, nvrtc};
