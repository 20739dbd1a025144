//! The CUDA backend: plans run on NVIDIA GPUs through cudarc.
//!
//! | protocol | CUDA |
//! | --- | --- |
//! | a logical device `Location::Gpu(i)` | physical device `device_map[i]`; several logical devices may share one GPU |
//! | a physical device | its primary context (shared with cudarc-based engines such as candle), peer access enabled both ways wherever `cuDeviceCanAccessPeer` allows |
//! | `Location::Host(_)` | pinned host memory (`cuMemHostAlloc`, portable, *not* write-combined: the host reads it back) |
//! | a lane | a stream of the lane's physical device, from a pool kept between launches (`Location::Host` lanes run on the first mapped device) |
//! | `Record` / `Wait` | `cuEventRecord` / `cuStreamWaitEvent` |
//! | `Copy` | below the SM-copy threshold ([`CudaBackend::set_sm_copy_below`]) between device memories the lane's GPU reaches: the `relaycc_forward` kernel on the lane's stream; otherwise `cuMemcpyPeerAsync` between two GPUs (copy engines), `cuMemcpyAsync` on one GPU or with host memory |
//! | `Reduce` | one launch of the `relaycc_reduce_<type>_<op>` kernel of [`crate::cuda::KernelCache`] (k sources, the copies of its result that follow it on the lane as further destinations), on the lane's stream |
//!
//! Launches of one backend run one after another, as the protocol asks, without a host
//! round trip (a [`CudaBackend::sibling`] has an order of its own, so a sub-communicator's
//! launches do not wait for its parent's or its siblings'): the
//! streams of a launch that touch memory before they hear from another of its streams first
//! wait for the tail events recorded at the end of the previous launch (one of them waits for
//! each tail, the others for one join event it records). What each launch enqueues is worked
//! out once per programs and kept (`schedule.rs`, `launch.rs`); a later call of the same
//! programs checks its bindings and patches its addresses in. Host access (`upload`,
//! `download`, `release`) synchronizes the streams in use first; `free` orders the release
//! after the last launch on the memory's stream and waits for nothing.
//!
//! Without a driver [`CudaBackend::new`] returns [`CudaError::NoDriver`] (as
//! [`CollectivesError::Cuda`]); the driver is probed ([`crate::cuda::driver`]) before any cudarc
//! call, since cudarc panics when libcuda is absent. Kernels are loaded on a device's first
//! reduction (or its first copy below the SM-copy threshold, which falls back to copy engines
//! when they cannot be loaded), so copy-only collectives need no NVRTC.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};
use relaycc_route::Location;
use relaycc_topo::rates::SM_COPY_BELOW_BYTES;

use super::launch::{CallScratch, KernelState, LaunchCache};
use super::memory::Alloc;
use crate::backend::sealed::{Lending, Loan, Private, Trusted};
use crate::backend::{Backend, ByteRegion, DeviceMem, Launch, RawRegion};
use crate::cuda::{self, CudaError, KernelCache};
use crate::error::{CollectivesError, Result};

/// Host time to enqueue one op of a plan on this backend, microseconds ([`Backend::op_issue_us`]):
/// its copy or kernel launch, context binding and event records and waits, issued one after
/// another under the backend's lock. Measured on an H200 (driver 580): a 4 KiB all_reduce,
/// where launches are all the cost, took 74.7 us on 4 logical ranks (7 ops) and 119.5 us on 8
/// (15 ops), 5.6 us per extra op.
pub const CUDA_OP_ISSUE_US: f64 = 5.0;

pub(super) fn err(message: impl Into<String>) -> CollectivesError {
    CollectivesError::Backend {
        backend: "cuda",
        message: message.into(),
    }
}

pub(super) fn drv(call: &'static str) -> impl Fn(DriverError) -> CollectivesError {
    move |e| {
        CollectivesError::Cuda(CudaError::Driver {
            call,
            status: format!("{e:?}"),
        })
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One physical GPU the backend drives: its ordinal, context, architecture, SM count and the
/// stream of its allocations and host copies.
#[derive(Debug)]
pub(super) struct GpuInUse {
    pub(super) ordinal: usize,
    pub(super) ctx: Arc<CudaContext>,
    pub(super) arch: cuda::Arch,
    pub(super) sms: u32,
    /// The stream that allocates, zeroes and copies to and from the host, and frees.
    pub(super) io: Arc<CudaStream>,
    /// The kernels and their function handles, loaded once.
    pub(super) kernels: KernelState,
    /// Lane streams, reused between launches; `tails[k]` is recorded on `streams[k]` at the end
    /// of every launch that used it.
    pub(super) streams: Vec<Arc<CudaStream>>,
    pub(super) tails: Vec<CudaEvent>,
    /// Events for `Record` commands, reused between launches (a wait binds to the record
    /// enqueued before it, so re-recording later is harmless).
    pub(super) events: Vec<CudaEvent>,
    /// Recorded on a launch's hub once it has waited for the previous launch's tails, so that
    /// the launch's other streams wait for that one event instead of every tail.
    pub(super) join: Option<CudaEvent>,
    /// Events recorded on callers' streams of this device (`submit_on`), reused.
    pub(super) forks: Vec<CudaEvent>,
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) devices: Vec<GpuInUse>,
    pub(super) allocs: HashMap<u64, Alloc>,
    /// Streams (device index, stream index) whose tail events the previous launch recorded
    /// (its sinks, which cover it and every launch before it), which the next launch waits
    /// for.
    pub(super) last: Vec<(usize, usize)>,
    /// Streams used since the last host synchronization.
    pub(super) dirty: Vec<(usize, usize)>,
    /// Schedules of recent launches, reused by later calls of the same programs.
    pub(super) schedules: LaunchCache,
    /// Per-call buffers, kept so a call allocates nothing it could keep.
    pub(super) scratch: CallScratch,
    /// Copies of fewer bytes run on SMs where they may ([`CudaBackend::set_sm_copy_below`]).
    pub(super) sm_copy_below: u64,
    /// Launches on one device may be captured and replayed as graphs
    /// ([`CudaBackend::set_graph_replay`]).
    pub(super) graph_replay: bool,
}

/// The CUDA backend (see the module docs).
#[derive(Debug)]
pub struct CudaBackend {
    /// Logical GPU index -> index into `State::devices`; `None` for a GPU of the topology
    /// this backend does not drive ([`CudaBackend::for_gpus`]).
    pub(super) map: Vec<Option<usize>>,
    /// The device that drives lanes on host memory (the first mapped one).
    pub(super) host_dev: usize,
    /// Physical ordinal of each entry of `State::devices`.
    pub(super) ordinals: Vec<usize>,
    /// `reach[a][b]`: kernels on device `a` reach device `b`'s memory (the same device, or
    /// peer access enabled).
    pub(super) reach: Vec<Vec<bool>>,
    /// Compiled PTX, shared with this backend's siblings ([`CudaBackend::sibling`]).
    pub(super) kernels: Arc<KernelCache>,
    pub(super) state: Mutex<State>,
    /// An error met where it could not be returned (`free`, `Drop`, an asynchronous failure).
    pending: Mutex<Option<String>>,
}

/// A `CudaSlice` that could not be adopted, given back with the reason.
#[derive(Debug)]
pub struct Rejected<T> {
    /// Why.
    pub error: CollectivesError,
    /// The caller's slice, untouched.
    pub slice: CudaSlice<T>,
}

impl CudaBackend {
    /// A backend where logical GPU `i` (`Location::Gpu(i)`) runs on CUDA device
    /// `device_map[i]` (an ordinal after `CUDA_VISIBLE_DEVICES`). Several logical GPUs may map
    /// to one device, so every plan can run on a one-GPU machine.
    ///
    /// Errors: [`CudaError::NoDriver`] without a driver (nothing panics), an empty map, an
    /// ordinal the driver does not have, a GPU older than compute capability 7.0.
    pub fn new(device_map: Vec<usize>) -> Result<CudaBackend> {
        Self::for_gpus(device_map.into_iter().map(Some).collect())
    }

    /// As [`CudaBackend::new`], for a topology that has GPUs this backend does not drive:
    /// logical GPU `i` runs on CUDA device `device_map[i]` where that is `Some`, and has no
    /// device where it is `None` (a GPU of the machine that belongs to another job, or that
    /// `CUDA_VISIBLE_DEVICES` hides). Contexts are made on the mapped devices only; memory or
    /// a lane on an unmapped GPU is an error when a call asks for it. `RankComm::cuda` builds
    /// its backend so over the machine's NVML topology.
    ///
    /// Errors: as [`CudaBackend::new`]; a map with no device is an error.
    pub fn for_gpus(device_map: Vec<Option<usize>>) -> Result<CudaBackend> {
        let infos = cuda::devices()?;
        if device_map.iter().all(Option::is_none) {
            return Err(CollectivesError::Setup("empty CUDA device map".into()));
        }
        let mut ordinals: Vec<usize> = Vec::new();
        let mut map = Vec::with_capacity(device_map.len());
        for &o in &device_map {
            let Some(o) = o else {
                map.push(None);
                continue;
            };
            if o >= infos.len() {
                return Err(CollectivesError::Setup(format!(
                    "CUDA device {o} does not exist ({} visible)",
                    infos.len()
                )));
            }
            let idx = match ordinals.iter().position(|&x| x == o) {
                Some(i) => i,
                None => {
                    ordinals.push(o);
                    ordinals.len() - 1
                }
            };
            map.push(Some(idx));
        }
        let mut devices = Vec::with_capacity(ordinals.len());
        for &o in &ordinals {
            let info = &infos[o];
            let ctx = CudaContext::new(o).map_err(drv("cuDevicePrimaryCtxRetain"))?;
            // SAFETY: this backend orders every use of its memory with its own events and
            // synchronizations (see the module docs), so cudarc's per-slice tracking is not
            // needed; it only affects slices created through this `CudaContext` handle.
            unsafe { ctx.disable_event_tracking() };
            let io = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
            devices.push(GpuInUse {
                ordinal: o,
                arch: info.arch()?,
                sms: info.multiprocessor_count,
                ctx,
                io,
                kernels: KernelState::NotTried,
                streams: Vec::new(),
                tails: Vec::new(),
                events: Vec::new(),
                join: None,
                forks: Vec::new(),
            });
        }
        let mut reach: Vec<Vec<bool>> = (0..devices.len())
            .map(|a| (0..devices.len()).map(|b| a == b).collect())
            .collect();
        // Peer access both ways wherever the hardware allows: kernels may then read a peer's
        // memory and peer copies take the direct path.
        for (ia, a) in devices.iter().enumerate() {
            for (ib, b) in devices.iter().enumerate() {
                if a.ordinal == b.ordinal || !infos[a.ordinal].can_access_peer[b.ordinal] {
                    continue;
                }
                a.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
                // SAFETY: both contexts are live primary contexts; `a`'s is current.
                let r = unsafe { sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
                match r {
                    sys::CUresult::CUDA_SUCCESS
                    | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                        reach[ia][ib] = true;
                    }
                    other => {
                        return Err(drv("cuCtxEnablePeerAccess")(DriverError(other)));
                    }
                }
            }
        }
        let host_dev = map.iter().flatten().copied().next().unwrap_or(0);
        Ok(CudaBackend {
            map,
            host_dev,
            ordinals,
            reach,
            kernels: Arc::new(KernelCache::from_env()),
            state: Mutex::new(State {
                devices,
                allocs: HashMap::new(),
                last: Vec::new(),
                dirty: Vec::new(),
                schedules: LaunchCache::default(),
                scratch: CallScratch::default(),
                sm_copy_below: SM_COPY_BELOW_BYTES,
                graph_replay: true,
            }),
            pending: Mutex::new(None),
        })
    }

    /// A backend on the same devices (the same device map, primary contexts and peer access)
    /// with streams, events, launch order and kept schedules of its own: a communicator on
    /// it is ordered against this one's only through its callers' streams, as two NCCL
    /// communicators are. `split` gives each sub-communicator of a GPU communicator one, so
    /// a data-parallel and a tensor-parallel group run concurrently. The kernels this
    /// backend has loaded and its compiled PTX are shared, not built again; the SM-copy
    /// threshold carries over. Memory allocated by one is unknown to the other.
    ///
    /// Errors: as [`CudaBackend::for_gpus`] (a stream that cannot be made, say).
    pub fn sibling(&self) -> Result<CudaBackend> {
        let mut sibling = Self::for_gpus(self.device_map())?;
        sibling.kernels = Arc::clone(&self.kernels);
        let st = lock(&self.state);
        let theirs = sibling.state.get_mut().unwrap_or_else(|p| p.into_inner());
        theirs.sm_copy_below = st.sm_copy_below;
        theirs.graph_replay = st.graph_replay;
        // The same map makes the same devices in the same order.
        for (mine, its) in st.devices.iter().zip(theirs.devices.iter_mut()) {
            if let KernelState::Loaded(k) = &mine.kernels {
                its.kernels = KernelState::Loaded(Arc::clone(k));
            }
        }
        drop(st);
        Ok(sibling)
    }

    /// One logical GPU per visible CUDA device (`Location::Gpu(i)` on device `i`).
    pub fn identity() -> Result<CudaBackend> {
        let n = cuda::devices()?.len();
        if n == 0 {
            return Err(CollectivesError::Setup(
                "the CUDA driver reports no device".into(),
            ));
        }
        Self::new((0..n).collect())
    }

    /// The physical device (CUDA ordinal) of logical GPU `gpu`.
    pub fn physical_device(&self, gpu: u32) -> Option<usize> {
        self.map
            .get(gpu as usize)
            .copied()
            .flatten()
            .map(|i| self.ordinals[i])
    }

    /// The logical-to-physical device map: the CUDA device of each logical GPU, `None` for
    /// one this backend does not drive ([`CudaBackend::for_gpus`]).
    pub fn device_map(&self) -> Vec<Option<usize>> {
        self.map
            .iter()
            .map(|i| i.map(|i| self.ordinals[i]))
            .collect()
    }

    /// Copies of fewer than `bytes` bytes between device memories a lane's GPU reaches (its
    /// own, or a peer's with peer access) run on that GPU's SMs (the forward kernel); larger
    /// ones, and every copy with host memory, on copy engines. 0 sends every copy to the copy
    /// engines, `u64::MAX` every copy it can to the SMs. The default is
    /// [`relaycc_topo::rates::SM_COPY_BELOW_BYTES`]; `relaycc calibrate` measures both rates
    /// on a machine. Applies to launches from the next one on.
    pub fn set_sm_copy_below(&self, bytes: u64) {
        let mut st = lock(&self.state);
        st.sm_copy_below = bytes;
        st.schedules.clear();
    }

    /// Whether a launch on one device whose addresses repeat is captured into a CUDA graph
    /// and replayed (on by default; see the CUDA layer's README). Off, every launch makes its
    /// driver calls one by one, as a profiler or a debugger may want; the graphs captured so
    /// far are dropped. Applies from the next launch on.
    pub fn set_graph_replay(&self, on: bool) {
        let mut st = lock(&self.state);
        st.graph_replay = on;
        if !on {
            st.schedules.clear();
        }
    }

    /// Whether launches may be replayed as graphs ([`CudaBackend::set_graph_replay`]).
    pub fn graph_replay(&self) -> bool {
        lock(&self.state).graph_replay
    }

    /// The SM-copy threshold in bytes ([`CudaBackend::set_sm_copy_below`]).
    pub fn sm_copy_below(&self) -> u64 {
        lock(&self.state).sm_copy_below
    }

    pub(super) fn dev_of(&self, location: Location) -> Result<Option<usize>> {
        match location {
            Location::Host(_) => Ok(None),
            Location::Gpu(g) => match self.map.get(g as usize) {
                Some(Some(d)) => Ok(Some(*d)),
                Some(None) => Err(err(format!(
                    "logical GPU {g} is a GPU of the topology this backend does not drive (no \
                     CUDA device is mapped to it)"
                ))),
                None => Err(err(format!(
                    "logical GPU {g} has no CUDA device in the device map ({} entries)",
                    self.map.len()
                ))),
            },
        }
    }

    /// The device that drives a lane (host lanes run on the first mapped device).
    pub(super) fn lane_dev(&self, location: Location) -> Result<usize> {
        Ok(self.dev_of(location)?.unwrap_or(self.host_dev))
    }

    pub(super) fn keep(&self, e: impl std::fmt::Display) {
        lock(&self.pending).get_or_insert(e.to_string());
    }

    /// Synchronize every stream used since the last call; errors are kept for `synchronize`.
    pub(super) fn wait_idle(&self, st: &mut State) {
        for (d, s) in std::mem::take(&mut st.dirty) {
            if let Err(e) = st.devices[d].streams[s].synchronize() {
                self.keep(format!(
                    "a launch failed on CUDA device {}: {e:?}",
                    st.devices[d].ordinal
                ));
            }
        }
    }
}

/// The CUDA backend lends device memory of the callers' streams: a lent allocation is the
/// caller's (never freed here), used by launches ordered within the callers' streams.
impl Trusted for CudaBackend {
    fn lending(&self, _: Private) -> Lending {
        Lending::DeviceBuffers
    }

    unsafe fn lend(&self, location: Location, loan: Loan, _: Private) -> Result<DeviceMem> {
        let Loan::Device {
            ordinal,
            ptr,
            bytes,
        } = loan
        else {
            return Err(err("host memory lent to the CUDA backend"));
        };
        // SAFETY: the caller keeps `Trusted::lend`'s contract, which is `lend_device`'s.
        unsafe { self.lend_device(location, ptr, bytes, ordinal) }
    }

    /// It does not wait: the launches already enqueued keep their addresses, and the lender
    /// orders its memory's reuse after them on its stream.
    fn unlend(&self, mem: DeviceMem, _: Private) {
        self.unlend_device(mem);
    }

    /// Device memory comes back as a device pointer (usable by CUDA-aware MPI only), pinned
    /// memory as a host pointer; whether device pointers may go to MPI is the caller's call
    /// (`RELAYCC_MPI_CUDA_AWARE`), not the backend's.
    fn raw_region(&self, region: ByteRegion, _: Private) -> Result<Option<RawRegion>> {
        self.raw_region_mem(region)
    }

    unsafe fn submit_on_streams(
        &self,
        launches: &[Launch<'_>],
        streams: &[&CudaStream],
        _: Private,
    ) -> Result<()> {
        // SAFETY: the caller keeps `Backend::submit`'s contract, which is `submit_on`'s.
        unsafe { self.submit_on(launches, streams) }
    }

    fn as_cuda(&self, _: Private) -> Option<&CudaBackend> {
        Some(self)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn op_issue_us(&self) -> f64 {
        CUDA_OP_ISSUE_US
    }

    fn allocate(&self, location: Location, bytes: u64) -> Result<DeviceMem> {
        self.allocate_mem(location, bytes)
    }

    fn free(&self, mem: DeviceMem) {
        self.free_mem(mem);
    }

    fn upload(&self, dst: ByteRegion, src: &[u8]) -> Result<()> {
        self.upload_mem(dst, src)
    }

    fn download(&self, src: ByteRegion, dst: &mut [u8]) -> Result<()> {
        self.download_mem(src, dst)
    }

    unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()> {
        // One step under the state lock: nothing else that touches memory can come between
        // ordering after the previous launch and enqueuing this one.
        let mut st = lock(&self.state);
        self.launch(&mut st, launches, &[])
    }

    fn synchronize(&self) -> Result<()> {
        let mut st = lock(&self.state);
        self.wait_idle(&mut st);
        drop(st);
        match lock(&self.pending).take() {
            Some(e) => Err(err(e)),
            None => Ok(()),
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let mut st = lock(&self.state);
        self.wait_idle(&mut st);
        Self::free_all(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (CI) every constructor returns NoDriver through the crate's error type,
    /// with a message that says so; nothing panics. With one, they agree with the probe.
    #[test]
    fn constructors_without_a_driver_give_no_driver() {
        match cuda::driver() {
            Err(probe) => {
                for r in [
                    CudaBackend::new(vec![0]),
                    CudaBackend::new(vec![0, 0, 0, 0]),
                    CudaBackend::identity(),
                ] {
                    let e = r.expect_err("no driver, no backend");
                    assert!(
                        matches!(&e, CollectivesError::Cuda(c) if *c == probe),
                        "{e}"
                    );
                    assert!(e.to_string().starts_with("no CUDA driver"), "{e}");
                }
            }
            Ok(_) => {
                let n = cuda::devices().map(|d| d.len()).unwrap_or(0);
                // An ordinal past the last device is a setup error, not a panic.
                assert!(CudaBackend::new(vec![n]).is_err());
                assert!(CudaBackend::new(Vec::new()).is_err());
            }
        }
    }

    #[test]
    fn into_cuda_slice_needs_the_cuda_backend() {
        let comm = crate::Communicator::host(2).expect("host communicator");
        let b = comm.from_slice(0, &[1f32, 2.0]).expect("buffer");
        let e = b
            .into_cuda_slice()
            .expect_err("host memory is no CudaSlice");
        assert!(e.to_string().contains("needs the CUDA backend"), "{e}");
        // The buffer was dropped normally: nothing is pending on the backend.
        assert!(comm.backend().synchronize().is_ok());
    }
}
