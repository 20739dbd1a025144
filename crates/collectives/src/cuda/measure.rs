//! Measurements for `relaycc calibrate`, timed with CUDA events: peer copy bandwidth and
//! latency between two GPUs, pinned host-to-device / device-to-host rates, and on one GPU the
//! rates of its three ways to move device memory (a copy-engine copy, the forward kernel, a
//! copy on SMs, and the reduce kernel) and of its writes alone (a memset).

use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::CudaError;
use super::{
    BLOCKS_PER_SM, CacheConfig, FORWARD_ENTRY, KernelCache, LaunchShape, ReduceArgs, devices,
    reduce_entry,
};

/// A measured rate: the bandwidth of large transfers and the time of a small one, of one
/// direction of a link or of a GPU's copies or reductions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasuredRate {
    /// Bandwidth of large copies, GB/s (1e9 bytes per second).
    pub gbps: f64,
    /// Mean time of one small (8-byte) copy, microseconds.
    pub latency_us: f64,
}

fn drv(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        status: format!("{e:?}"),
    }
}

/// Copies made for the latency figure.
const LATENCY_REPS: u32 = 100;

fn context(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    let n = devices()?.len();
    if ordinal >= n {
        return Err(CudaError::Driver {
            call: "cuDeviceGet",
            status: format!("CUDA device {ordinal} does not exist ({n} visible)"),
        });
    }
    CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))
}

/// Time `reps` runs of `enqueue` on `stream`, in milliseconds per run.
fn time(
    stream: &Arc<CudaStream>,
    reps: u32,
    mut enqueue: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let ctx = stream.context();
    let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end): (CudaEvent, CudaEvent) = (
        ctx.new_event(timed).map_err(drv("cuEventCreate"))?,
        ctx.new_event(timed).map_err(drv("cuEventCreate"))?,
    );
    // One untimed run first: the first copy of a pair sets up mappings.
    enqueue()?;
    start.record(stream).map_err(drv("cuEventRecord"))?;
    for _ in 0..reps.max(1) {
        enqueue()?;
    }
    end.record(stream).map_err(drv("cuEventRecord"))?;
    end.synchronize().map_err(drv("cuEventSynchronize"))?;
    let ms = start.elapsed_ms(&end).map_err(drv("cuEventElapsedTime"))?;
    Ok(f64::from(ms) / f64::from(reps.max(1)))
}

/// Peer copies from GPU `src` to GPU `dst` (CUDA ordinals, distinct): `bytes`-byte copies
/// `reps` times for bandwidth, 8-byte copies for latency, on a stream of `src`, with peer
/// access enabled where the hardware allows (staged through the host otherwise, as CUDA does).
pub fn measure_p2p(
    src: usize,
    dst: usize,
    bytes: usize,
    reps: u32,
) -> Result<MeasuredRate, CudaError> {
    let (a, b) = (context(src)?, context(dst)?);
    a.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: two live primary contexts; `a`'s is current. "Not supported" and "already
    // enabled" both leave a working (if slower) copy path, so the status is ignored.
    let _ = unsafe { sys::cuCtxEnablePeerAccess(b.cu_ctx(), 0) };
    let stream = a.new_stream().map_err(drv("cuStreamCreate"))?;
    let s = stream
        .alloc_zeros::<u8>(bytes.max(8))
        .map_err(drv("cuMemAlloc"))?;
    let d = b
        .new_stream()
        .and_then(|t| t.alloc_zeros::<u8>(bytes.max(8)))
        .map_err(drv("cuMemAlloc"))?;
    b.synchronize().map_err(drv("cuCtxSynchronize"))?;
    let (sp, _g1) = cudarc::driver::DevicePtr::device_ptr(&s, &stream);
    let (dp, _g2) = cudarc::driver::DevicePtr::device_ptr(&d, &stream);
    let copy = |n: usize| {
        // SAFETY: both allocations hold at least `n` bytes and live until the stream is
        // synchronized inside `time`.
        unsafe { result::memcpy_peer_async(b.cu_ctx(), dp, a.cu_ctx(), sp, n, stream.cu_stream()) }
            .map_err(drv("cuMemcpyPeerAsync"))
    };
    let ms = time(&stream, reps, || copy(bytes))?;
    let lat_ms = time(&stream, LATENCY_REPS, || copy(8))?;
    Ok(MeasuredRate {
        gbps: bytes as f64 / (ms * 1e-3) / 1e9,
        latency_us: lat_ms * 1e3,
    })
}

/// GPU `dev`'s host link: (host-to-device, device-to-host) copies of `bytes` bytes from and to
/// pinned (not write-combined) host memory.
pub fn measure_host(
    dev: usize,
    bytes: usize,
    reps: u32,
) -> Result<(MeasuredRate, MeasuredRate), CudaError> {
    let ctx = context(dev)?;
    let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
    let dmem = stream
        .alloc_zeros::<u8>(bytes.max(8))
        .map_err(drv("cuMemAlloc"))?;
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: a plain allocation; freed below after the stream is idle.
    let host = unsafe { result::malloc_host(bytes.max(8), sys::CU_MEMHOSTALLOC_PORTABLE) }
        .map_err(drv("cuMemHostAlloc"))? as u64;
    let (dp, _g) = cudarc::driver::DevicePtr::device_ptr(&dmem, &stream);
    let run = || -> Result<(MeasuredRate, MeasuredRate), CudaError> {
        let h2d = |n: usize| {
            // SAFETY: both buffers hold at least `n` bytes and outlive the timed runs.
            unsafe { sys::cuMemcpyHtoDAsync_v2(dp, host as *const _, n, stream.cu_stream()) }
                .result()
                .map_err(drv("cuMemcpyHtoDAsync"))
        };
        let d2h = |n: usize| {
            // SAFETY: as above.
            unsafe { sys::cuMemcpyDtoHAsync_v2(host as *mut _, dp, n, stream.cu_stream()) }
                .result()
                .map_err(drv("cuMemcpyDtoHAsync"))
        };
        let rate = |ms: f64, lat: f64| MeasuredRate {
            gbps: bytes as f64 / (ms * 1e-3) / 1e9,
            latency_us: lat * 1e3,
        };
        let up = rate(
            time(&stream, reps, || h2d(bytes))?,
            time(&stream, LATENCY_REPS, || h2d(8))?,
        );
        let down = rate(
            time(&stream, reps, || d2h(bytes))?,
            time(&stream, LATENCY_REPS, || d2h(8))?,
        );
        Ok((up, down))
    };
    let out = run();
    // Whatever happened, wait for the stream before freeing the host memory.
    let _ = stream.synchronize();
    // SAFETY: from cuMemHostAlloc above, freed once, the stream is idle.
    let _ = unsafe { result::free_host(host as *mut _) };
    out
}

/// One GPU's device-memory rates: bytes read plus written per second (a copy of `b` bytes
/// moves `2b`, a two-source reduction `3b`), and the time of one small operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceRates {
    /// `cuMemcpyAsync` device to device on the GPU (its copy engines).
    pub copy_engine: MeasuredRate,
    /// The forward kernel (relaycc's copies below the SM-copy threshold).
    pub sm_copy: MeasuredRate,
    /// The reduce kernel, two f32 sources summed into one destination.
    pub reduce: MeasuredRate,
    /// `cuMemsetD32Async`: bytes written per second, nothing read.
    pub write: MeasuredRate,
}

impl DeviceRates {
    /// The share of the memory's rate (the copy engines' bytes read plus written per second)
    /// that its writes alone reach: the memset's rate over the copy's, at most 1 (a memory
    /// whose writes alone outrun a copy's reads and writes is bound by the rate alone).
    pub fn write_share(&self) -> f64 {
        (self.write.gbps / self.copy_engine.gbps).min(1.0)
    }
}

/// GPU `dev`'s device-memory rates ([`DeviceRates`]) on buffers of `bytes` bytes, `reps`
/// times each, and 8-byte operations for the latencies. The kernels come from the kernel cache
/// (NVRTC, or `RELAYCC_PTX_DIR`), so this needs one of them as the backend does.
pub fn measure_device(dev: usize, bytes: usize, reps: u32) -> Result<DeviceRates, CudaError> {
    let info = devices()?
        .into_iter()
        .nth(dev)
        .ok_or_else(|| CudaError::Driver {
            call: "cuDeviceGet",
            status: format!("CUDA device {dev} does not exist"),
        })?;
    let ptx = KernelCache::new(CacheConfig::from_env()).ptx(info.arch()?)?;
    let ctx = context(dev)?;
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_src(ptx.ptx.clone()))
        .map_err(drv("cuModuleLoadData"))?;
    let forward = module
        .load_function(FORWARD_ENTRY)
        .map_err(drv("cuModuleGetFunction"))?;
    let reduce = module
        .load_function(reduce_entry(
            relaycc_route::DType::F32,
            relaycc_route::ReduceOp::Sum,
        )?)
        .map_err(drv("cuModuleGetFunction"))?;
    let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
    let bytes = bytes.max(8) / 4 * 4;
    let buf = || stream.alloc_zeros::<u8>(bytes).map_err(drv("cuMemAlloc"));
    let (a, b, out) = (buf()?, buf()?, buf()?);
    let ptr =
        |s: &cudarc::driver::CudaSlice<u8>| cudarc::driver::DevicePtr::device_ptr(s, &stream).0;
    let (pa, pb, po) = (ptr(&a), ptr(&b), ptr(&out));
    let max_blocks = info.multiprocessor_count.saturating_mul(BLOCKS_PER_SM);
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    let launch =
        |f: &cudarc::driver::CudaFunction, n: u64, params: &mut [*mut std::ffi::c_void]| {
            let shape = LaunchShape::for_bytes(n, max_blocks);
            // SAFETY: `params` match the kernel's parameters (set by the callers below) and every
            // pointer addresses at least `n` bytes of this device's memory, alive until the
            // stream is synchronized inside `time`.
            unsafe { super::launch::launch(f.cu_function(), shape, stream.cu_stream(), params) }
                .result()
                .map_err(drv("cuLaunchKernel"))
        };
    let copy = |n: usize| {
        // SAFETY: both buffers hold at least `n` bytes of this device.
        unsafe { sys::cuMemcpyAsync(po, pa, n, stream.cu_stream()) }
            .result()
            .map_err(drv("cuMemcpyAsync"))
    };
    let sm_copy = |n: usize| {
        let len = n as u64;
        let mut params: [*mut std::ffi::c_void; 3] = [
            (&po as *const u64).cast_mut().cast(),
            (&pa as *const u64).cast_mut().cast(),
            (&len as *const u64).cast_mut().cast(),
        ];
        launch(&forward, len, &mut params)
    };
    let reduce_two = |n: usize| {
        let mut args = ReduceArgs {
            n: (n / 4) as u64,
            nsrcs: 2,
            ndsts: 1,
            ..ReduceArgs::default()
        };
        args.srcs[..2].copy_from_slice(&[pa, pb]);
        args.dsts[0] = po;
        let mut params: [*mut std::ffi::c_void; 1] = [(&mut args as *mut ReduceArgs).cast()];
        launch(&reduce, n as u64, &mut params)
    };
    let memset = |n: usize| {
        // SAFETY: the buffer holds at least `n` bytes of this device (`n` is a multiple of 4:
        // `bytes` is rounded down to one, and 8 is one).
        unsafe { sys::cuMemsetD32Async(po, 0x5a5a_5a5a, n / 4, stream.cu_stream()) }
            .result()
            .map_err(drv("cuMemsetD32Async"))
    };
    let rate = |moved: usize, ms: f64, lat_ms: f64| MeasuredRate {
        gbps: moved as f64 / (ms * 1e-3) / 1e9,
        latency_us: lat_ms * 1e3,
    };
    let out_rates = DeviceRates {
        copy_engine: rate(
            2 * bytes,
            time(&stream, reps, || copy(bytes))?,
            time(&stream, LATENCY_REPS, || copy(8))?,
        ),
        sm_copy: rate(
            2 * bytes,
            time(&stream, reps, || sm_copy(bytes))?,
            time(&stream, LATENCY_REPS, || sm_copy(8))?,
        ),
        reduce: rate(
            3 * bytes,
            time(&stream, reps, || reduce_two(bytes))?,
            time(&stream, LATENCY_REPS, || reduce_two(8))?,
        ),
        write: rate(
            bytes,
            time(&stream, reps, || memset(bytes))?,
            time(&stream, LATENCY_REPS, || memset(8))?,
        ),
    };
    stream.synchronize().map_err(drv("cuStreamSynchronize"))?;
    Ok(out_rates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_measurements_give_no_driver() {
        if let Err(probe) = super::super::driver() {
            assert_eq!(measure_p2p(0, 1, 1 << 20, 2), Err(probe.clone()));
            assert_eq!(measure_host(0, 1 << 20, 2).map(|_| ()), Err(probe.clone()));
            assert_eq!(measure_device(0, 1 << 20, 2).map(|_| ()), Err(probe));
        }
    }
}
