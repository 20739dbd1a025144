//! The error type of the CUDA layer: every failure names the step and its context.

use std::path::PathBuf;

/// Why a CUDA call of relaycc failed. No CUDA entry point panics: a missing driver, a missing
/// NVRTC, a compile error or a stale precompiled PTX file all come back as one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library (libcuda) could not be loaded: no NVIDIA driver on this machine,
    /// or it is not on the loader's path.
    #[error("no CUDA driver: could not load any of {searched:?} (is the NVIDIA driver installed?)")]
    NoDriver {
        /// The library names and paths tried, in order.
        searched: Vec<String>,
    },
    /// NVRTC (libnvrtc) could not be loaded, so kernels cannot be compiled at run time.
    #[error(
        "no NVRTC: could not load any of {searched:?} (set RELAYCC_NVRTC_LIB to libnvrtc.so.12 or \
         its directory, e.g. a pip nvidia-cuda-nvrtc-cu12 wheel's nvidia/cuda_nvrtc/lib, or set \
         RELAYCC_PTX_DIR to precompiled kernels)"
    )]
    NoNvrtc {
        /// The library names and paths tried, in order.
        searched: Vec<String>,
    },
    /// NCCL (libnccl) could not be loaded, so relaycc cannot be compared with it.
    #[error(
        "no NCCL: could not load any of {searched:?} (install libnccl2, or put the directory \
         holding libnccl.so.2 on LD_LIBRARY_PATH)"
    )]
    NoNccl {
        /// The library names and paths tried, in order.
        searched: Vec<String>,
    },
    /// An NCCL call returned an error status.
    #[error("nccl call {call} failed: {status}")]
    Nccl {
        /// The NCCL function, e.g. `ncclCommInitAll`.
        call: &'static str,
        /// The status NCCL returned.
        status: String,
    },
    /// A request NCCL cannot serve as asked (one GPU shared by several ranks, say).
    #[error("nccl: {0}")]
    NcclUnsupported(String),
    /// A library was found but lacks a function relaycc calls (too old, or not the real one).
    #[error("{library} lacks the symbol {symbol} (too old a version?)")]
    MissingSymbol {
        /// The library file or name that was loaded.
        library: String,
        /// The missing function.
        symbol: String,
    },
    /// A CUDA driver call returned an error status.
    #[error("cuda driver call {call} failed: {status}")]
    Driver {
        /// The driver function, e.g. `cuDeviceGetCount`.
        call: &'static str,
        /// The status the driver returned.
        status: String,
    },
    /// An NVRTC call other than the compilation itself returned an error status.
    #[error("nvrtc call {call} failed: {status}")]
    Nvrtc {
        /// The NVRTC function, e.g. `nvrtcCreateProgram`.
        call: &'static str,
        /// The status NVRTC returned.
        status: String,
    },
    /// NVRTC rejected the kernel sources.
    #[error("nvrtc could not compile the kernels for {arch}: {status}\n{log}")]
    Compile {
        /// The virtual architecture, e.g. `compute_80`.
        arch: String,
        /// The status NVRTC returned.
        status: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// A compute capability relaycc has no kernels for (below 7.0, the oldest it targets).
    #[error("unsupported compute capability {major}.{minor} (relaycc kernels need 7.0 or newer)")]
    UnsupportedArch {
        /// Major version.
        major: u32,
        /// Minor version.
        minor: u32,
    },
    /// PTX (compiled, cached or precompiled) lacks entry points the library expects.
    #[error("PTX from {origin} for {arch} lacks {} entry point(s): {missing:?}", missing.len())]
    MissingEntryPoints {
        /// Where the PTX came from (NVRTC, a cache file, a precompiled file).
        origin: String,
        /// The virtual architecture, e.g. `compute_80`.
        arch: String,
        /// The expected entry points that are absent.
        missing: Vec<String>,
    },
    /// PTX (compiled, cached or precompiled) has entry points whose parameters are not the
    /// ones this relaycc launches them with: PTX built from other kernel sources.
    #[error(
        "PTX from {origin} for {arch} has {} entry point(s) whose parameters differ from this \
         relaycc's kernels (PTX of another relaycc version?): {stale:?}",
        stale.len()
    )]
    StaleEntryPoints {
        /// Where the PTX came from (NVRTC, a cache file, a precompiled file).
        origin: String,
        /// The virtual architecture, e.g. `compute_80`.
        arch: String,
        /// Each such entry point with the parameters it has.
        stale: Vec<String>,
    },
    /// A precompiled or cached PTX file could not be read or written.
    #[error("PTX file {}: {message}", path.display())]
    PtxFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// No kernel exists for this element type and operator (avg on an integer type).
    #[error("no reduce kernel for {op} on {dtype} (avg is defined for floating types only)")]
    NoKernel {
        /// The element type.
        dtype: relaycc_route::DType,
        /// The reduce operator.
        op: relaycc_route::ReduceOp,
    },
}
