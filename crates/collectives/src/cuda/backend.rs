//! The CUDA backend: plans run on NVIDIA GPUs through cudarc.
//!
//! | protocol | CUDA |
//! | --- | --- |
//! | a logical device `Location::Gpu(i)` | physical device `device_map[i]`; several logical devices may share one GPU |
//! | a physical device | its primary context (shared with cudarc-based engines such as candle), peer access enabled both ways wherever `cuDeviceCanAccessPeer` allows |
//! | `Location::Host(_)` | pinned host memory (`cuMemHostAlloc`, portable, *not* write-combined: the host reads it back) |
//! | a lane | a stream of the lane's physical device, from a pool kept between launches (`Location::Host` lanes run on the first mapped device) |
//! | `Record` / `Wait` | `cuEventRecord` / `cuStreamWaitEvent` |
//! | `Copy` | `cuMemcpyPeerAsync` between two GPUs (copy engines), `cuMemcpyAsync` on one GPU or with host memory |
//! | `Reduce` | the `relaycc_reduce_<type>_<op>` kernels of [`crate::cuda::KernelCache`], on the lane's stream |
//!
//! Launches run one after another, as the protocol asks, without a host round trip: every
//! stream of a launch first waits for the events recorded at the end of the previous launch.
//! Host access (`upload`, `download`, `free`) synchronizes the streams in use first.
//!
//! Without a driver [`CudaBackend::new`] returns [`CudaError::NoDriver`] (as
//! [`CollectivesError::Cuda`]); the driver is probed ([`crate::cuda::driver`]) before any cudarc
//! call, since cudarc panics when libcuda is absent. Kernels are loaded on the first reduction
//! per device, so copy-only collectives need no NVRTC.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaEvent, CudaModule, CudaSlice, CudaStream, DevicePtr};
use cudarc::nvrtc::Ptx;
use relaycc_route::Location;

use crate::backend::sealed::{Lending, Loan, Private, Trusted};
use crate::backend::{AddressSpace, Backend, ByteRegion, DeviceMem, Launch, RawRegion};
use crate::cuda::{self, CudaError, KernelCache};
use crate::element::Element;
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One physical GPU in use.
#[derive(Debug)]
pub(super) struct Device {
    ordinal: usize,
    pub(super) ctx: Arc<CudaContext>,
    arch: cuda::Arch,
    pub(super) sms: u32,
    /// The stream that allocates, zeroes and copies to and from the host.
    io: Arc<CudaStream>,
    /// The kernels, loaded on the first reduction.
    module: Option<Arc<CudaModule>>,
    /// Lane streams, reused between launches; `tails[k]` is recorded on `streams[k]` at the end
    /// of every launch that used it.
    pub(super) streams: Vec<Arc<CudaStream>>,
    pub(super) tails: Vec<CudaEvent>,
    /// Events for `Record` commands, reused between launches (a wait binds to the record
    /// enqueued before it, so re-recording later is harmless).
    pub(super) events: Vec<CudaEvent>,
    /// Recorded on a launch's first stream once it has waited for the previous launch's tails,
    /// so that the launch's other streams wait for that one event instead of every tail.
    pub(super) join: Option<CudaEvent>,
}

/// What backs an allocation.
#[derive(Debug)]
enum Storage {
    /// Zero bytes: no memory.
    Empty,
    /// Device memory allocated here.
    Device(CudaSlice<u8>),
    /// Pinned host memory from `cuMemHostAlloc` (freed with `cuMemFreeHost`).
    Pinned,
    /// A caller's `CudaSlice<T>` ([`CudaBackend::adopt`]), kept whole so it can be given back.
    Foreign(Box<dyn Any + Send + Sync>),
    /// Memory a per-rank call lends for one launch (`Trusted::lend`): the caller's,
    /// never freed here.
    Lent,
}

#[derive(Debug)]
pub(super) struct Alloc {
    /// Device (or, for pinned memory, unified host) address of the first byte.
    ptr: u64,
    bytes: u64,
    /// Index into `State::devices`; `None` for host memory.
    dev: Option<usize>,
    storage: Storage,
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) devices: Vec<Device>,
    pub(super) allocs: HashMap<u64, Alloc>,
    /// Streams (device index, stream index) the previous launch used, whose tail events the
    /// next launch waits for.
    pub(super) last: Vec<(usize, usize)>,
    /// Streams used since the last host synchronization.
    pub(super) dirty: Vec<(usize, usize)>,
}

/// The CUDA backend (see the module docs).
#[derive(Debug)]
pub struct CudaBackend {
    /// Logical GPU index -> index into `State::devices`.
    map: Vec<usize>,
    /// Physical ordinal of each entry of `State::devices`.
    ordinals: Vec<usize>,
    kernels: KernelCache,
    state: Mutex<State>,
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
        let infos = cuda::devices()?;
        if device_map.is_empty() {
            return Err(CollectivesError::Setup("empty CUDA device map".into()));
        }
        let mut ordinals: Vec<usize> = Vec::new();
        let mut map = Vec::with_capacity(device_map.len());
        for &o in &device_map {
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
            map.push(idx);
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
            devices.push(Device {
                ordinal: o,
                arch: info.arch()?,
                sms: info.multiprocessor_count,
                ctx,
                io,
                module: None,
                streams: Vec::new(),
                tails: Vec::new(),
                events: Vec::new(),
                join: None,
            });
        }
        // Peer access both ways wherever the hardware allows: kernels may then read a peer's
        // memory and peer copies take the direct path.
        for a in &devices {
            for b in &devices {
                if a.ordinal == b.ordinal || !infos[a.ordinal].can_access_peer[b.ordinal] {
                    continue;
                }
                a.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
                // SAFETY: both contexts are live primary contexts; `a`'s is current.
                let r = unsafe { sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
                match r {
                    sys::CUresult::CUDA_SUCCESS
                    | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
                    other => {
                        return Err(drv("cuCtxEnablePeerAccess")(DriverError(other)));
                    }
                }
            }
        }
        Ok(CudaBackend {
            map,
            ordinals,
            kernels: KernelCache::from_env(),
            state: Mutex::new(State {
                devices,
                allocs: HashMap::new(),
                last: Vec::new(),
                dirty: Vec::new(),
            }),
            pending: Mutex::new(None),
        })
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
        self.map.get(gpu as usize).map(|&i| self.ordinals[i])
    }

    /// The logical-to-physical device map.
    pub fn device_map(&self) -> Vec<usize> {
        self.map.iter().map(|&i| self.ordinals[i]).collect()
    }

    fn dev_of(&self, location: Location) -> Result<Option<usize>> {
        match location {
            Location::Host(_) => Ok(None),
            Location::Gpu(g) => self.map.get(g as usize).copied().map(Some).ok_or_else(|| {
                err(format!(
                    "logical GPU {g} has no CUDA device in the device map ({} entries)",
                    self.map.len()
                ))
            }),
        }
    }

    /// The device that drives a lane (host lanes run on the first mapped device).
    pub(super) fn lane_dev(&self, location: Location) -> Result<usize> {
        Ok(self.dev_of(location)?.unwrap_or(self.map[0]))
    }

    fn keep(&self, e: impl std::fmt::Display) {
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

    /// Take a `CudaSlice<T>` on logical GPU `gpu` as an allocation, without copying.
    ///
    /// The slice's own stream is synchronized first, so its pending writes are visible;
    /// work the caller queued on other streams must be finished by the caller. On error the
    /// slice comes back.
    pub fn adopt<T: Element>(
        &self,
        gpu: u32,
        slice: CudaSlice<T>,
    ) -> std::result::Result<DeviceMem, Box<Rejected<T>>> {
        let reject = |error, slice| Box::new(Rejected { error, slice });
        let dev = match self.dev_of(Location::Gpu(gpu)) {
            Ok(Some(d)) => d,
            Ok(None) => return Err(reject(err("not a GPU"), slice)),
            Err(e) => return Err(reject(e, slice)),
        };
        if slice.ordinal() != self.ordinals[dev] {
            let e = err(format!(
                "the slice lives on CUDA device {}, logical GPU {gpu} runs on device {}",
                slice.ordinal(),
                self.ordinals[dev]
            ));
            return Err(reject(e, slice));
        }
        if let Err(e) = slice.stream().synchronize() {
            return Err(reject(drv("cuStreamSynchronize")(e), slice));
        }
        let ptr = {
            let (p, _sync) = slice.device_ptr(slice.stream());
            p
        };
        let bytes = slice.num_bytes() as u64;
        let mem = DeviceMem::fresh(Location::Gpu(gpu), bytes);
        lock(&self.state).allocs.insert(
            mem.id(),
            Alloc {
                ptr,
                bytes,
                dev: Some(dev),
                storage: Storage::Foreign(Box::new(slice)),
            },
        );
        Ok(mem)
    }

    /// Give an allocation back as a `CudaSlice<T>` of `len` elements, without copying, after
    /// the launches in flight. An adopted slice comes back as it was given; memory this
    /// backend allocated comes back as a slice on the backend's stream of that device.
    pub fn release<T: Element>(&self, mem: DeviceMem, len: usize) -> Result<CudaSlice<T>> {
        let mut st = lock(&self.state);
        self.wait_idle(&mut st);
        let Some(a) = st.allocs.get(&mem.id()) else {
            return Err(err(format!("allocation {} is unknown or freed", mem.id())));
        };
        if len as u64 * std::mem::size_of::<T>() as u64 != a.bytes {
            return Err(err("element count does not match the allocation"));
        }
        match &a.storage {
            Storage::Foreign(b) if !b.is::<CudaSlice<T>>() => {
                return Err(err("the adopted slice has another element type"));
            }
            Storage::Pinned => return Err(err("host memory is not a CudaSlice")),
            Storage::Empty => {
                return Err(err(
                    "an empty allocation owns no device memory to give back",
                ));
            }
            _ => {}
        }
        let a = st
            .allocs
            .remove(&mem.id())
            .ok_or_else(|| err("allocation vanished"))?;
        match a.storage {
            Storage::Foreign(b) => b
                .downcast::<CudaSlice<T>>()
                .map(|b| *b)
                .map_err(|_| err("the adopted slice has another element type")),
            Storage::Device(s) => {
                let dev = a.dev.ok_or_else(|| err("device memory without a device"))?;
                let stream = st.devices[dev].io.clone();
                let ptr = s.leak();
                // SAFETY: `ptr` is a live allocation of `a.bytes == len * size_of::<T>()`
                // bytes made by cudarc on this device's `io` stream (so freeing it on that
                // stream is how it was meant to be freed), aligned to 256 bytes, and every
                // bit pattern is a valid `T` (`Element: Pod`). It left the table, so it is
                // owned once.
                Ok(unsafe { stream.upgrade_device_ptr::<T>(ptr, len) })
            }
            Storage::Pinned | Storage::Empty => Err(err("not device memory")),
            Storage::Lent => Err(err("lent memory stays its caller's")),
        }
    }

    /// Enqueue a launch ordered within callers' streams, without host synchronization: every
    /// stream of the launch first waits for an event recorded now on each of `callers`, and
    /// each of `callers` then waits for the launch's tail events, so work a caller enqueues
    /// after this call sees the result, and waiting on a caller's stream waits for this
    /// launch (and what came before it on that stream) only.
    ///
    /// # Safety
    ///
    /// As [`Backend::submit`].
    pub(crate) unsafe fn submit_on(
        &self,
        launches: &[Launch<'_>],
        callers: &[&CudaStream],
    ) -> Result<()> {
        let mut st = lock(&self.state);
        let prepared = self.prepare(&st, launches)?;
        let used = prepared.used().to_vec();
        let forks = callers
            .iter()
            .map(|s| s.record_event(None))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(drv("cuEventRecord"))?;
        for &(d, k) in &used {
            Self::stream(&mut st, d, k)?;
            for e in &forks {
                st.devices[d].streams[k]
                    .wait(e)
                    .map_err(drv("cuStreamWaitEvent"))?;
            }
        }
        // A panic from here on may leave part of the launch enqueued on the callers' memory
        // with no caller stream waiting for it; the callers' frames then unwind and may free
        // that memory, so the launch is finished before the panic goes on.
        let launched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut joined = self.launch_prepared(&mut st, &prepared);
            for &(d, k) in &used {
                for s in callers {
                    if joined.is_ok() {
                        joined = s
                            .wait(&st.devices[d].tails[k])
                            .map_err(drv("cuStreamWaitEvent"));
                    }
                }
            }
            joined
        }));
        let joined = match launched {
            Ok(j) => j,
            Err(panic) => {
                self.wait_idle(&mut st);
                std::panic::resume_unwind(panic)
            }
        };
        if joined.is_err() {
            // Part of the launch may be enqueued without the callers' streams waiting for it:
            // finish it here, so a caller that sees the error may reuse its memory.
            self.wait_idle(&mut st);
        }
        joined
    }

    /// The kernels of device `d`, loaded on first use.
    pub(super) fn module(&self, st: &mut State, d: usize) -> Result<Arc<CudaModule>> {
        if let Some(m) = &st.devices[d].module {
            return Ok(m.clone());
        }
        let ptx = self.kernels.ptx(st.devices[d].arch)?;
        let m = st.devices[d]
            .ctx
            .load_module(Ptx::from_src(ptx.ptx.clone()))
            .map_err(drv("cuModuleLoadData"))?;
        st.devices[d].module = Some(m.clone());
        Ok(m)
    }

    pub(super) fn stream(st: &mut State, d: usize, k: usize) -> Result<()> {
        let dev = &mut st.devices[d];
        while dev.streams.len() <= k {
            dev.streams
                .push(dev.ctx.new_stream().map_err(drv("cuStreamCreate"))?);
            dev.tails
                .push(dev.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
        }
        Ok(())
    }
}

pub(super) fn resolve(
    allocs: &HashMap<u64, Alloc>,
    r: &ByteRegion,
) -> Result<(u64, Option<usize>)> {
    let a = allocs
        .get(&r.mem.id())
        .ok_or_else(|| err(format!("allocation {} is unknown or freed", r.mem.id())))?;
    if r.offset.checked_add(r.bytes).is_none_or(|e| e > a.bytes) {
        return Err(err(format!(
            "region {}+{} lies outside allocation {} of {} bytes",
            r.offset,
            r.bytes,
            r.mem.id(),
            a.bytes
        )));
    }
    Ok((a.ptr + r.offset, a.dev))
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
        let dev = self
            .dev_of(location)?
            .ok_or_else(|| err(format!("{location:?} is not a GPU")))?;
        if self.ordinals[dev] != ordinal {
            return Err(err(format!(
                "the buffer lives on CUDA device {ordinal}, {location:?} runs on device {}",
                self.ordinals[dev]
            )));
        }
        let mem = DeviceMem::fresh(location, bytes);
        lock(&self.state).allocs.insert(
            mem.id(),
            Alloc {
                ptr,
                bytes,
                dev: Some(dev),
                storage: Storage::Lent,
            },
        );
        Ok(mem)
    }

    /// It does not wait: the launches already enqueued keep their addresses, and the lender
    /// orders its memory's reuse after them on its stream.
    fn unlend(&self, mem: DeviceMem, _: Private) {
        let mut st = lock(&self.state);
        if !matches!(
            st.allocs.get(&mem.id()),
            Some(Alloc {
                storage: Storage::Lent,
                ..
            })
        ) {
            drop(st);
            self.keep(format!(
                "unlend of allocation {} that was not lent",
                mem.id()
            ));
            return;
        }
        st.allocs.remove(&mem.id());
    }

    /// Device memory comes back as a device pointer (usable by CUDA-aware MPI only), pinned
    /// memory as a host pointer; whether device pointers may go to MPI is the caller's call
    /// (`RELAYCC_MPI_CUDA_AWARE`), not the backend's.
    fn raw_region(&self, region: ByteRegion, _: Private) -> Result<Option<RawRegion>> {
        let st = lock(&self.state);
        let (addr, dev) = resolve(&st.allocs, &region)?;
        let addr =
            usize::try_from(addr).map_err(|_| err(format!("address {addr:#x} does not fit")))?;
        Ok(Some(RawRegion {
            addr,
            bytes: region.bytes,
            space: if dev.is_some() {
                AddressSpace::Device
            } else {
                AddressSpace::Host
            },
        }))
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
        let dev = self.dev_of(location)?;
        let size = usize::try_from(bytes).map_err(|_| err(format!("{bytes} bytes do not fit")))?;
        let st = lock(&self.state);
        let alloc = if size == 0 {
            Alloc {
                ptr: 0,
                bytes,
                dev,
                storage: Storage::Empty,
            }
        } else if let Some(d) = dev {
            let io = &st.devices[d].io;
            let s = io.alloc_zeros::<u8>(size).map_err(drv("cuMemAlloc"))?;
            // The zeroing runs on `io`; lanes must not see the memory before it is done.
            io.synchronize().map_err(drv("cuStreamSynchronize"))?;
            let ptr = {
                let (p, _sync) = s.device_ptr(io);
                p
            };
            Alloc {
                ptr,
                bytes,
                dev,
                storage: Storage::Device(s),
            }
        } else {
            let ctx = &st.devices[self.map[0]].ctx;
            ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
            // Portable: every context sees it as pinned. Not write-combined: the host reads it.
            // SAFETY: a plain allocation call; the result is checked before use.
            let p =
                unsafe { cudarc::driver::result::malloc_host(size, sys::CU_MEMHOSTALLOC_PORTABLE) }
                    .map_err(drv("cuMemHostAlloc"))?;
            // SAFETY: `p` points at `size` freshly allocated bytes.
            unsafe { std::ptr::write_bytes(p as *mut u8, 0, size) };
            Alloc {
                ptr: p as u64,
                bytes,
                dev: None,
                storage: Storage::Pinned,
            }
        };
        drop(st);
        let mem = DeviceMem::fresh(location, bytes);
        lock(&self.state).allocs.insert(mem.id(), alloc);
        Ok(mem)
    }

    fn free(&self, mem: DeviceMem) {
        let mut st = lock(&self.state);
        self.wait_idle(&mut st);
        let Some(a) = st.allocs.remove(&mem.id()) else {
            self.keep(format!("free of unknown allocation {}", mem.id()));
            return;
        };
        drop(st);
        if let Storage::Pinned = a.storage {
            // SAFETY: the pointer came from cuMemHostAlloc, left the table (freed once), and
            // no launch is in flight.
            if let Err(e) = unsafe { cudarc::driver::result::free_host(a.ptr as *mut _) } {
                self.keep(format!("cuMemFreeHost: {e:?}"));
            }
        }
        // Device memory and adopted slices are freed by their `CudaSlice`'s drop, which keeps
        // its errors in the context (cudarc never panics there).
    }

    fn upload(&self, dst: ByteRegion, src: &[u8]) -> Result<()> {
        if src.len() as u64 != dst.bytes {
            return Err(err("upload length differs from the region's"));
        }
        let mut st = lock(&self.state);
        self.wait_idle(&mut st);
        let (addr, dev) = resolve(&st.allocs, &dst)?;
        if src.is_empty() {
            return Ok(());
        }
        match dev {
            None => {
                // SAFETY: the region lies inside live pinned memory (checked), no launch runs
                // and the state lock keeps `free` out.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
            }
            Some(d) => {
                st.devices[d]
                    .ctx
                    .bind_to_thread()
                    .map_err(drv("cuCtxSetCurrent"))?;
                // SAFETY: as above, for device memory; the call is synchronous.
                unsafe { cudarc::driver::result::memcpy_htod_sync(addr, src) }
                    .map_err(drv("cuMemcpyHtoD"))?;
            }
        }
        Ok(())
    }

    fn download(&self, src: ByteRegion, dst: &mut [u8]) -> Result<()> {
        if dst.len() as u64 != src.bytes {
            return Err(err("download length differs from the region's"));
        }
        let mut st = lock(&self.state);
        self.wait_idle(&mut st);
        let (addr, dev) = resolve(&st.allocs, &src)?;
        if dst.is_empty() {
            return Ok(());
        }
        match dev {
            None => {
                // SAFETY: as in `upload`, in the other direction.
                unsafe {
                    std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len())
                };
            }
            Some(d) => {
                st.devices[d]
                    .ctx
                    .bind_to_thread()
                    .map_err(drv("cuCtxSetCurrent"))?;
                // SAFETY: as in `upload`, in the other direction.
                unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, addr) }
                    .map_err(drv("cuMemcpyDtoH"))?;
            }
        }
        Ok(())
    }

    unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()> {
        // One step under the state lock: nothing else that touches memory can come between
        // ordering after the previous launch and enqueuing this one.
        let mut st = lock(&self.state);
        let prepared = self.prepare(&st, launches)?;
        self.launch_prepared(&mut st, &prepared)
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
        for (_, a) in st.allocs.drain() {
            if let Storage::Pinned = a.storage {
                // SAFETY: from cuMemHostAlloc, still in the table (not freed), nothing runs.
                // An error here has nowhere to go; dropping never panics.
                let _ = unsafe { cudarc::driver::result::free_host(a.ptr as *mut _) };
            }
        }
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
