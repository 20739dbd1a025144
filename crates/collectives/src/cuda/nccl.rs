//! NCCL on the same GPUs, through cudarc's `nccl` bindings, so that `relaycc bench --vs-nccl`
//! can print NCCL's figures beside relaycc's from one run.
//!
//! cudarc loads libnccl lazily and panics when none of its names loads or a symbol is missing,
//! so [`nccl`] probes first, like [`super::driver`]. cudarc asks the loader for `libnccl.so`
//! (and CUDA-versioned names), never for `libnccl.so.2`, the only name NCCL's runtime package
//! and its pip wheel install; [`CudaError::NoNccl`] then says where `libnccl.so.2` was seen
//! and that a `libnccl.so` link beside it is what is missing.
//!
//! Timing matches `relaycc bench`'s own: each iteration launches the collective on every rank
//! (one NCCL group from this thread, as `ncclCommInitAll` communicators require) and waits for
//! every stream, and the wall time is averaged, so launch and synchronisation costs are
//! counted alike on both sides.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DriverError};
use cudarc::nccl::{result as nc, sys as ns};
use relaycc_route::{Collective, DType, ReduceOp};

use super::CudaError;
use super::libs::{self, LibKind, LibSpec};

/// The NCCL functions relaycc calls; the probe checks each one resolves.
const NCCL_SYMBOLS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitAll",
    "ncclCommInitRank",
    "ncclCommDestroy",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclSend",
    "ncclRecv",
];

/// The loaded NCCL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclInfo {
    /// The library name cudarc loads it by (`libnccl.so`).
    pub library: String,
    /// NCCL's version, (major, minor, patch), from `ncclGetVersion`.
    pub version: (u32, u32, u32),
}

/// `ncclGetVersion`'s code as (major, minor, patch): `major*10000 + minor*100 + patch` since
/// NCCL 2.9, `major*1000 + minor*100 + patch` before.
fn decode_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    if code >= 20900 {
        (code / 10000, (code % 10000) / 100, code % 100)
    } else {
        (code / 1000, (code % 1000) / 100, code % 100)
    }
}

pub(crate) fn nccl_error(call: &'static str) -> impl Fn(nc::NcclError) -> CudaError {
    move |e| CudaError::Nccl {
        call,
        status: format!("{:?}", e.0),
    }
}

pub(crate) fn driver_error(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        status: format!("{e:?}"),
    }
}

/// Checks one process's NCCL ranks on CUDA devices `ordinals` (rank `i` on `ordinals[i]`)
/// before `ncclCommInitAll`, in this order: an empty list or a device that repeats
/// ([`CudaError::NcclUnsupported`]: NCCL runs one rank per GPU), no driver or no NCCL, a
/// device that does not exist, too many ranks. Gives the rank count.
pub(crate) fn single_process_ranks(ordinals: &[usize]) -> Result<c_int, CudaError> {
    if ordinals.is_empty() {
        return Err(CudaError::NcclUnsupported("no ranks".into()));
    }
    if let Some(d) = ordinals
        .iter()
        .enumerate()
        .find_map(|(i, o)| ordinals[..i].contains(o).then_some(*o))
    {
        return Err(CudaError::NcclUnsupported(format!(
            "CUDA device {d} hosts more than one rank; NCCL runs one rank per GPU"
        )));
    }
    super::driver()?;
    nccl()?;
    let visible = super::devices()?.len();
    if let Some(bad) = ordinals.iter().find(|&&o| o >= visible) {
        return Err(CudaError::NcclUnsupported(format!(
            "CUDA device {bad} does not exist ({visible} visible)"
        )));
    }
    c_int::try_from(ordinals.len()).map_err(|_| CudaError::NcclUnsupported("too many ranks".into()))
}

/// Loads NCCL once per process and reads its version; [`CudaError::NoNccl`] when cudarc could
/// not load it (nothing panics).
pub fn nccl() -> Result<&'static NcclInfo, CudaError> {
    static PROBED: OnceLock<Result<NcclInfo, CudaError>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            let spec = LibSpec {
                kind: LibKind::Nccl,
                stem: "nccl",
                file_names: &[],
                explicit: None,
                // Preloading by path cannot help: cudarc's names are not NCCL's soname.
                dirs: Vec::new(),
                symbols: NCCL_SYMBOLS,
            };
            let found = match libs::probe(&spec) {
                Ok(found) => found,
                Err(CudaError::NoNccl { mut searched }) => {
                    if libs::loads("libnccl.so.2") {
                        searched.push(
                            "libnccl.so.2 loads, but cudarc only asks for libnccl.so: link \
                             libnccl.so -> libnccl.so.2 in a directory on LD_LIBRARY_PATH"
                                .into(),
                        );
                    }
                    return Err(CudaError::NoNccl { searched });
                }
                Err(e) => return Err(e),
            };
            let code = nc::get_nccl_version().map_err(nccl_error("ncclGetVersion"))?;
            Ok(NcclInfo {
                library: found.name,
                version: decode_version(code),
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// NCCL's element type for `dtype`.
pub fn nccl_dtype(dtype: DType) -> ns::ncclDataType_t {
    use ns::ncclDataType_t as T;
    match dtype {
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::F16 => T::ncclFloat16,
        DType::Bf16 => T::ncclBfloat16,
        DType::I8 => T::ncclInt8,
        DType::U8 => T::ncclUint8,
        DType::I32 => T::ncclInt32,
        DType::U32 => T::ncclUint32,
        DType::I64 => T::ncclInt64,
        DType::U64 => T::ncclUint64,
    }
}

/// NCCL's reduction for `op` (`ncclAvg` needs NCCL 2.10 or newer).
pub fn nccl_op(op: ReduceOp) -> ns::ncclRedOp_t {
    use ns::ncclRedOp_t as O;
    match op {
        ReduceOp::Sum => O::ncclSum,
        ReduceOp::Prod => O::ncclProd,
        ReduceOp::Min => O::ncclMin,
        ReduceOp::Max => O::ncclMax,
        ReduceOp::Avg => O::ncclAvg,
    }
}

/// Elements of (input, output) a rank's buffers hold for `collective` with nccl-tests' count
/// convention (relaycc's [`relaycc_route::Request`] count; per-rank blocks for the gathers,
/// scatters and all-to-alls), on `n` ranks.
pub fn nccl_buffer_elems(collective: Collective, count: u64, n: u64) -> (u64, u64) {
    match collective {
        Collective::AllGather | Collective::AllGatherV | Collective::Gather => (count, n * count),
        Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Scatter => {
            (n * count, count)
        }
        Collective::AllToAll | Collective::AllToAllV => (n * count, n * count),
        _ => (count, count),
    }
}

/// One collective as NCCL is asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclCall {
    /// The collective.
    pub collective: Collective,
    /// Elements, counted as nccl-tests counts them ([`nccl_buffer_elems`]).
    pub count: u64,
    /// Element type.
    pub dtype: DType,
    /// Reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Root rank of rooted collectives.
    pub root: u32,
}

/// One rank of an NCCL job: its communicator, stream and buffers.
struct Rank {
    comm: ns::ncclComm_t,
    stream: Arc<CudaStream>,
    input: CudaSlice<u8>,
    output: CudaSlice<u8>,
}

/// NCCL communicators over distinct CUDA devices, one per rank (`ncclCommInitAll`), with
/// buffers for timing collectives of up to a given size.
pub struct NcclComms {
    ranks: Vec<Rank>,
    ordinals: Vec<usize>,
    capacity_bytes: u64,
}

impl std::fmt::Debug for NcclComms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComms")
            .field("ordinals", &self.ordinals)
            .field("capacity_bytes", &self.capacity_bytes)
            .finish()
    }
}

impl Drop for NcclComms {
    fn drop(&mut self) {
        for r in &self.ranks {
            // Best effort: a failed destroy at the end of a benchmark loses nothing, and a
            // destructor has nowhere to report it (cudarc's own `Comm` panics here instead).
            let _ = r.stream.synchronize();
            // SAFETY: `comm` came from ncclCommInitAll and is destroyed once, here.
            let _ = unsafe { nc::comm_destroy(r.comm) };
        }
    }
}

impl NcclComms {
    /// One NCCL rank per CUDA device of `ordinals` (rank `i` on `ordinals[i]`), each with input
    /// and output buffers of `capacity_bytes`.
    ///
    /// Errors, in the order they are checked: [`CudaError::NcclUnsupported`] when the list is
    /// empty or a device repeats (NCCL runs one rank per GPU, so several logical ranks on one
    /// GPU cannot be compared with it); [`CudaError::NoDriver`] or [`CudaError::NoNccl`] when
    /// a library is absent; a device that does not exist; a driver or NCCL status.
    pub fn new(ordinals: &[usize], capacity_bytes: u64) -> Result<NcclComms, CudaError> {
        let n = single_process_ranks(ordinals)?;
        let bytes = usize::try_from(capacity_bytes.max(1))
            .map_err(|_| CudaError::NcclUnsupported("buffer too large".into()))?;
        let mut streams = Vec::with_capacity(ordinals.len());
        let mut buffers = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let ctx = CudaContext::new(o).map_err(driver_error("cuDevicePrimaryCtxRetain"))?;
            // SAFETY: this module synchronises every stream before reading results or freeing,
            // so cudarc's per-slice event tracking is not needed on this handle.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().map_err(driver_error("cuStreamCreate"))?;
            let input = stream
                .alloc_zeros::<u8>(bytes)
                .map_err(driver_error("cuMemAlloc"))?;
            let output = stream
                .alloc_zeros::<u8>(bytes)
                .map_err(driver_error("cuMemAlloc"))?;
            streams.push(stream);
            buffers.push((input, output));
        }
        let devlist: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        let mut comms: Vec<ns::ncclComm_t> = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: `comms` and `devlist` hold `n` entries each; the probe found libnccl with
        // ncclCommInitAll, and every device exists.
        unsafe { nc::comm_init_all(comms.as_mut_ptr(), n, devlist.as_ptr()) }
            .map_err(nccl_error("ncclCommInitAll"))?;
        let ranks = comms
            .into_iter()
            .zip(streams)
            .zip(buffers)
            .map(|((comm, stream), (input, output))| Rank {
                comm,
                stream,
                input,
                output,
            })
            .collect();
        Ok(NcclComms {
            ranks,
            ordinals: ordinals.to_vec(),
            capacity_bytes,
        })
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Average wall time of one `call`, over `iters` iterations after `warmup`, microseconds. Each
    /// iteration is one NCCL group over every rank followed by a wait on every stream.
    ///
    /// NCCL has no all_gather_v, reduce_scatter_v or all_to_all_v: all_gather_v runs as one
    /// broadcast per rank (what [Rolinger-2017] reports NCCL users do), reduce_scatter_v as
    /// one reduce per rank (its mirror), and all_to_all(_v), gather
    /// and scatter as grouped send/recv, as NCCL's documentation shows.
    ///
    /// Errors: buffers larger than the capacity given to [`NcclComms::new`], a root out of
    /// range, an NCCL or driver status.
    pub fn time_us(&self, call: &NcclCall, warmup: u32, iters: u32) -> Result<f64, CudaError> {
        let NcclCall {
            collective,
            count,
            dtype,
            root,
            ..
        } = *call;
        let n = self.ranks.len() as u64;
        let (ins, outs) = nccl_buffer_elems(collective, count, n);
        let esize = dtype.size();
        let need = ins.max(outs).saturating_mul(esize);
        if need > self.capacity_bytes {
            return Err(CudaError::NcclUnsupported(format!(
                "{need} bytes per buffer, {} allocated",
                self.capacity_bytes
            )));
        }
        if u64::from(root) >= n {
            return Err(CudaError::NcclUnsupported(format!(
                "root {root} of {n} ranks"
            )));
        }
        for _ in 0..warmup {
            self.launch(call)?;
        }
        let iters = iters.max(1);
        let start = Instant::now();
        for _ in 0..iters {
            self.launch(call)?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / f64::from(iters))
    }

    /// One group over every rank, then a wait on every stream.
    fn launch(&self, call: &NcclCall) -> Result<(), CudaError> {
        nc::group_start().map_err(nccl_error("ncclGroupStart"))?;
        let mut issued = Ok(());
        for r in 0..self.ranks.len() {
            issued = self.issue(r, call);
            if issued.is_err() {
                break;
            }
        }
        // The group must be closed even when a call failed, or NCCL stays inside it.
        let closed = nc::group_end().map_err(nccl_error("ncclGroupEnd"));
        issued?;
        closed?;
        for r in &self.ranks {
            r.stream
                .synchronize()
                .map_err(driver_error("cuStreamSynchronize"))?;
        }
        Ok(())
    }

    /// Enqueue rank `r`'s part of the collective (inside an open group).
    fn issue(&self, r: usize, call: &NcclCall) -> Result<(), CudaError> {
        let NcclCall {
            collective,
            count,
            dtype,
            op,
            root,
        } = *call;
        let me = &self.ranks[r];
        let n = self.ranks.len();
        let (dt, rop) = (nccl_dtype(dtype), nccl_op(op));
        let esize = dtype.size() as usize;
        let count = count as usize;
        let (input, _) = me.input.device_ptr(&me.stream);
        let (output, _) = me.output.device_ptr(&me.stream);
        let send = input as *const c_void;
        let recv = output as *mut c_void;
        // Byte offset `k` blocks of `count` elements into a buffer.
        let block = |k: usize| k * count * esize;
        let stream = me.stream.cu_stream() as ns::cudaStream_t;
        let (comm, root_i) = (me.comm, root as c_int);
        let peer = |p: usize| p as c_int;
        let at = |base: *const c_void, k: usize| (base as usize + block(k)) as *const c_void;
        let at_mut = |base: *mut c_void, k: usize| (base as usize + block(k)) as *mut c_void;
        // SAFETY: for every call below, `comm` is a live communicator of this rank from
        // ncclCommInitAll; `send` and `recv` point to this rank's buffers on its device, each
        // at least `nccl_buffer_elems` elements long (checked against the capacity by the
        // caller), and every offset stays inside them; `stream` belongs to the same device.
        let status = unsafe {
            match collective {
                Collective::AllReduce => nc::all_reduce(send, recv, count, dt, rop, comm, stream),
                Collective::Broadcast => nc::broadcast(send, recv, count, dt, root_i, comm, stream),
                Collective::Reduce => nc::reduce(send, recv, count, dt, rop, root_i, comm, stream),
                Collective::AllGather => nc::all_gather(send, recv, count, dt, comm, stream),
                Collective::ReduceScatter => {
                    nc::reduce_scatter(send, recv, count, dt, rop, comm, stream)
                }
                Collective::AllGatherV => (0..n)
                    .try_for_each(|q| {
                        nc::broadcast(send, at_mut(recv, q), count, dt, peer(q), comm, stream)
                            .map(drop)
                    })
                    .map(|()| nc::NcclStatus::Success),
                // Only rank q's `recv` takes the reduce rooted at q.
                Collective::ReduceScatterV => (0..n)
                    .try_for_each(|q| {
                        nc::reduce(at(send, q), recv, count, dt, rop, peer(q), comm, stream)
                            .map(drop)
                    })
                    .map(|()| nc::NcclStatus::Success),
                Collective::AllToAll | Collective::AllToAllV => (0..n)
                    .try_for_each(|p| {
                        nc::send(at(send, p), count, dt, peer(p), comm, stream)?;
                        nc::recv(at_mut(recv, p), count, dt, peer(p), comm, stream).map(drop)
                    })
                    .map(|()| nc::NcclStatus::Success),
                Collective::Gather => {
                    let mut s = nc::send(send, count, dt, root_i, comm, stream).map(drop);
                    if r == root as usize {
                        for p in 0..n {
                            s = s.and_then(|()| {
                                nc::recv(at_mut(recv, p), count, dt, peer(p), comm, stream)
                                    .map(drop)
                            });
                        }
                    }
                    s.map(|()| nc::NcclStatus::Success)
                }
                Collective::Scatter => {
                    let mut s = Ok(());
                    if r == root as usize {
                        for p in 0..n {
                            s = s.and_then(|()| {
                                nc::send(at(send, p), count, dt, peer(p), comm, stream).map(drop)
                            });
                        }
                    }
                    s.and_then(|()| nc::recv(recv, count, dt, root_i, comm, stream))
                }
                Collective::SendRecv => nc::send(send, count, dt, peer((r + 1) % n), comm, stream)
                    .and_then(|_| nc::recv(recv, count, dt, peer((r + n - 1) % n), comm, stream)),
            }
        };
        status
            .map(drop)
            .map_err(nccl_error(nccl_call_name(collective)))
    }
}

/// The NCCL function a collective is timed with (for error messages).
fn nccl_call_name(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "ncclAllReduce",
        Collective::Broadcast | Collective::AllGatherV => "ncclBroadcast",
        Collective::Reduce | Collective::ReduceScatterV => "ncclReduce",
        Collective::AllGather => "ncclAllGather",
        Collective::ReduceScatter => "ncclReduceScatter",
        _ => "ncclSend/ncclRecv",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_in_both_encodings() {
        assert_eq!(decode_version(22105), (2, 21, 5));
        assert_eq!(decode_version(2708), (2, 7, 8));
        assert_eq!(decode_version(-1), (0, 0, 0));
    }

    #[test]
    fn every_type_and_op_maps_to_nccl() {
        use ns::ncclDataType_t as T;
        assert_eq!(nccl_dtype(DType::Bf16), T::ncclBfloat16);
        assert_eq!(nccl_dtype(DType::U64), T::ncclUint64);
        assert_eq!(nccl_op(ReduceOp::Avg), ns::ncclRedOp_t::ncclAvg);
        let mut seen = Vec::new();
        for d in DType::ALL {
            let t = nccl_dtype(d);
            assert!(!seen.contains(&t), "{d:?} shares an NCCL type");
            seen.push(t);
        }
    }

    #[test]
    fn buffer_sizes_follow_nccl_tests_counts() {
        assert_eq!(nccl_buffer_elems(Collective::AllReduce, 10, 4), (10, 10));
        assert_eq!(nccl_buffer_elems(Collective::AllGather, 10, 4), (10, 40));
        assert_eq!(
            nccl_buffer_elems(Collective::ReduceScatter, 10, 4),
            (40, 10)
        );
        assert_eq!(nccl_buffer_elems(Collective::AllToAll, 10, 4), (40, 40));
    }

    #[test]
    fn without_nccl_or_a_driver_comms_are_an_error_not_a_panic() {
        match NcclComms::new(&[0, 1], 1 << 20) {
            Err(CudaError::NoDriver { .. } | CudaError::NoNccl { .. }) => {}
            // A machine with a GPU and NCCL builds the communicators, or refuses a missing
            // second device with a clear error.
            Ok(_) | Err(CudaError::NcclUnsupported(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
        match nccl() {
            Ok(info) => assert!(info.version.0 >= 2, "{info:?}"),
            Err(e) => assert!(matches!(e, CudaError::NoNccl { .. }), "{e}"),
        }
    }

    #[test]
    fn repeated_devices_are_refused_before_any_library_is_touched() {
        let err = NcclComms::new(&[0, 1, 0], 1024).unwrap_err();
        assert!(matches!(err, CudaError::NcclUnsupported(_)), "{err}");
    }
}
