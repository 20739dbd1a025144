//! The CUDA backend's memory: allocations in device memory or pinned host memory, adopted and
//! lent `CudaSlice`s, host access, and releases ordered after the launches that use them.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use relaycc_route::Location;

use super::backend::{CudaBackend, Rejected, State, drv, err, lock};
use crate::backend::{AddressSpace, ByteRegion, DeviceMem, RawRegion};
use crate::element::Element;
use crate::error::Result;

/// What backs an allocation.
#[derive(Debug)]
pub(super) enum Storage {
    /// Zero bytes: no memory.
    Empty,
    /// Device memory allocated here.
    Device(CudaSlice<u8>),
    /// Pinned host memory from `cuMemHostAlloc` (freed with `cuMemFreeHost`).
    Pinned,
    /// A caller's `CudaSlice<T>` ([`CudaBackend::adopt`]), kept whole so it can be given back,
    /// and the stream cudarc frees it on.
    Foreign {
        slice: Box<dyn Any + Send + Sync>,
        stream: Arc<CudaStream>,
    },
    /// Memory a per-rank call lends for one launch (`CudaBackend::lend_device`): the caller's,
    /// never freed here.
    Lent,
}

#[derive(Debug)]
pub(super) struct Alloc {
    /// Device (or, for pinned memory, unified host) address of the first byte.
    pub(super) ptr: u64,
    pub(super) bytes: u64,
    /// Index into `State::devices`; `None` for host memory.
    pub(super) dev: Option<usize>,
    pub(super) storage: Storage,
}

/// The address and device of a region of an allocation.
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

impl CudaBackend {
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
        let stream = slice.stream().clone();
        let mem = DeviceMem::fresh(Location::Gpu(gpu), bytes);
        lock(&self.state).allocs.insert(
            mem.id(),
            Alloc {
                ptr,
                bytes,
                dev: Some(dev),
                storage: Storage::Foreign {
                    slice: Box::new(slice),
                    stream,
                },
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
            Storage::Foreign { slice, .. } if !slice.is::<CudaSlice<T>>() => {
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
            Storage::Foreign { slice, .. } => slice
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

    /// A handle for `bytes` bytes of a caller's device memory at `ptr` at `location` (a GPU
    /// that must run on CUDA device `ordinal`, the caller's stream's), for one launch of a
    /// per-rank call ([`crate::backend::sealed::Trusted::lend`]);
    /// [`CudaBackend::unlend_device`] takes it out of the table without waiting.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + bytes` is device memory of device `ordinal` that stays allocated until
    /// every launch that uses the handle is done on the GPU (a caller orders its free after
    /// the launch on its stream), and no other work writes it, or reads what the launch
    /// writes, unless ordered after the launch.
    pub(super) unsafe fn lend_device(
        &self,
        location: Location,
        ptr: u64,
        bytes: u64,
        ordinal: usize,
    ) -> Result<DeviceMem> {
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

    /// Take a lent handle out of the table. It does not wait: the launches already enqueued
    /// keep their addresses, and the lender orders its memory's reuse after them on its
    /// stream.
    pub(super) fn unlend_device(&self, mem: DeviceMem) {
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

    pub(super) fn allocate_mem(&self, location: Location, bytes: u64) -> Result<DeviceMem> {
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
            let ctx = &st.devices[self.host_dev].ctx;
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

    /// Release an allocation in stream order: device memory is freed on its stream after that
    /// stream waited for the last launch's sinks (which cover every launch before it), so no
    /// host thread waits and no unrelated stream is synchronized; pinned host memory, which
    /// `cuMemFreeHost` releases at once, after those sinks' tail events completed.
    pub(super) fn free_mem(&self, mem: DeviceMem) {
        let mut st = lock(&self.state);
        let Some(a) = st.allocs.remove(&mem.id()) else {
            drop(st);
            self.keep(format!("free of unknown allocation {}", mem.id()));
            return;
        };
        let ordered_on = match &a.storage {
            Storage::Device(_) => a.dev.map(|d| st.devices[d].io.clone()),
            Storage::Foreign { stream, .. } => Some(stream.clone()),
            Storage::Pinned => {
                if let Err(e) = Self::wait_last_launch(&st) {
                    self.keep(e);
                    self.wait_idle(&mut st);
                }
                None
            }
            Storage::Empty | Storage::Lent => None,
        };
        if let Some(stream) = ordered_on
            && let Err(e) = Self::order_after_last_launch(&st, &stream)
        {
            // The memory must not leave before the launches are done: wait for them here.
            self.keep(e);
            self.wait_idle(&mut st);
        }
        drop(st);
        match a.storage {
            Storage::Pinned => {
                // SAFETY: the pointer came from cuMemHostAlloc, left the table (freed once),
                // and every launch that may use it is done (waited for above).
                if let Err(e) = unsafe { cudarc::driver::result::free_host(a.ptr as *mut _) } {
                    self.keep(format!("cuMemFreeHost: {e:?}"));
                }
            }
            // A `CudaSlice`'s drop frees it on its stream (`cuMemFreeAsync`, ordered after the
            // launches above; where the driver has no stream-ordered allocator it synchronizes
            // that stream and frees), keeping any error in its context: cudarc never panics
            // there.
            other => drop(other),
        }
    }

    /// Make `stream` wait for the last launch's tail events.
    fn order_after_last_launch(st: &State, stream: &CudaStream) -> Result<()> {
        for &(d, k) in &st.last {
            stream
                .wait(&st.devices[d].tails[k])
                .map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Wait on the host for the last launch's tail events.
    fn wait_last_launch(st: &State) -> Result<()> {
        for &(d, k) in &st.last {
            st.devices[d].tails[k]
                .synchronize()
                .map_err(drv("cuEventSynchronize"))?;
        }
        Ok(())
    }

    /// Free every pinned allocation still in the table (the backend's drop, after every
    /// launch is done); device memory goes with its slices.
    pub(super) fn free_all(st: &mut State) {
        for (_, a) in st.allocs.drain() {
            if let Storage::Pinned = a.storage {
                // SAFETY: from cuMemHostAlloc, still in the table (not freed), nothing runs.
                // An error here has nowhere to go; dropping never panics.
                let _ = unsafe { cudarc::driver::result::free_host(a.ptr as *mut _) };
            }
        }
    }

    pub(super) fn upload_mem(&self, dst: ByteRegion, src: &[u8]) -> Result<()> {
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

    pub(super) fn download_mem(&self, src: ByteRegion, dst: &mut [u8]) -> Result<()> {
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

    /// Device memory comes back as a device pointer (usable by CUDA-aware MPI only), pinned
    /// memory as a host pointer; whether device pointers may go to MPI is the caller's call
    /// (`RELAYCC_MPI_CUDA_AWARE`), not the backend's.
    pub(super) fn raw_region_mem(&self, region: ByteRegion) -> Result<Option<RawRegion>> {
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
}
