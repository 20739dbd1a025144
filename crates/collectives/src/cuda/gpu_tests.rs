//! Device tests: launch the forward kernel and every reduce kernel on a real GPU and compare
//! with host arithmetic. Ignored by default; run on a GPU machine with
//! `cargo test -p relaycc-collectives -- --ignored`.
//!
//! Expectations are exact: the kernels are compiled with `--fmad=false`, fold sources left in
//! order as the host backend does, accumulate f16/bf16 in f32 and round once to nearest-even
//! (what the `half` crate does on the host), divide Avg once, and wrap integer sums and
//! products. `bandwidth_of_the_reduce_and_forward_kernels_against_a_device_copy` and
//! `calibrate_measures_the_device_rates_and_the_write_share` print rates that
//! `scripts/gpu-check` reads.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use half::{bf16, f16};
use relaycc_route::{DType, ReduceOp};

use super::{CacheConfig, KernelCache, LaunchShape, ReduceArgs, devices, reduce_entry};

/// Device 0 with the kernels loaded (compiled for its architecture, or from RELAYCC_PTX_DIR).
fn setup() -> (Arc<CudaStream>, Arc<cudarc::driver::CudaModule>) {
    let devs = devices().unwrap_or_else(|e| panic!("{e}"));
    let dev = devs.first().unwrap_or_else(|| panic!("no CUDA device"));
    let arch = dev.arch().unwrap_or_else(|e| panic!("{e}"));
    let cache = KernelCache::new(CacheConfig::from_env());
    let ptx = cache.ptx(arch).unwrap_or_else(|e| panic!("{e}"));
    let ctx = CudaContext::new(0).unwrap_or_else(|e| panic!("{e:?}"));
    let module = ctx
        .load_module(Ptx::from_src(ptx.ptx.clone()))
        .unwrap_or_else(|e| panic!("{e:?}"));
    (ctx.default_stream(), module)
}

fn function(module: &Arc<cudarc::driver::CudaModule>, name: &str) -> CudaFunction {
    module
        .load_function(name)
        .unwrap_or_else(|e| panic!("{name}: {e:?}"))
}

fn config(shape: LaunchShape) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (shape.blocks, 1, 1),
        block_dim: (shape.threads_per_block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launch `f` in `shape` on `stream` with `args` as its one parameter, passed by value;
/// panics when the driver refuses the launch.
///
/// # Safety
///
/// `A` is the layout of the kernel's one parameter, and every address in `args` is valid for
/// what the kernel reads and writes through it.
unsafe fn launch_with<A>(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    shape: LaunchShape,
    args: &mut A,
) {
    let mut params: [*mut std::ffi::c_void; 1] = [(args as *mut A).cast()];
    // SAFETY: the caller's contract; the driver copies the parameter before returning.
    unsafe { super::launch::launch(f.cu_function(), shape, stream.cu_stream(), &mut params) }
        .result()
        .unwrap_or_else(|e| panic!("launch: {e:?}"));
}

fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> CudaSlice<u8> {
    stream.clone_htod(bytes).unwrap_or_else(|e| panic!("{e:?}"))
}

fn download(stream: &Arc<CudaStream>, slice: &CudaSlice<u8>) -> Vec<u8> {
    stream.clone_dtoh(slice).unwrap_or_else(|e| panic!("{e:?}"))
}

fn ptr(stream: &Arc<CudaStream>, slice: &CudaSlice<u8>) -> u64 {
    slice.device_ptr(stream).0
}

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A float in [-4, 4) with few mantissa bits, so products stay finite.
    fn small_float(&mut self) -> f64 {
        (self.next() % 8192) as f64 / 1024.0 - 4.0
    }
}

fn random_elements(dtype: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size() as usize);
    for _ in 0..n {
        match dtype {
            DType::F32 => out.extend_from_slice(&(rng.small_float() as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&rng.small_float().to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(rng.small_float()).to_le_bytes()),
            DType::Bf16 => out.extend_from_slice(&bf16::from_f64(rng.small_float()).to_le_bytes()),
            _ => out.extend_from_slice(&rng.next().to_le_bytes()[..dtype.size() as usize]),
        }
    }
    out
}

/// The host backend's reduction (`backend/host_reduce.rs`, the oracle every backend is held
/// to) of `srcs`, divided by `divisor` when given.
fn host_reduce(dtype: DType, op: ReduceOp, srcs: &[&[u8]], divisor: Option<u32>) -> Vec<u8> {
    let len = srcs[0].len() / dtype.size() as usize;
    // Aligned copies: the host loops read typed elements.
    let words: Vec<Vec<u64>> = srcs
        .iter()
        .map(|s| {
            let mut w = vec![0u64; s.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut w)[..s.len()].copy_from_slice(s);
            w
        })
        .collect();
    let ptrs: Vec<*const u8> = words.iter().map(|w| w.as_ptr().cast()).collect();
    let mut out = vec![0u64; srcs[0].len().div_ceil(8)];
    // SAFETY: every pointer holds `len` elements of `dtype`, 8-byte aligned; `out` is apart.
    unsafe {
        crate::backend::host_reduce::reduce(dtype, op, &ptrs, out.as_mut_ptr().cast(), len, divisor)
    };
    bytemuck::cast_slice::<u64, u8>(&out)[..srcs[0].len()].to_vec()
}

/// Launches one reduce kernel on raw device pointers (so a destination may be a source).
fn launch_reduce(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    shape: LaunchShape,
    srcs: &[u64],
    dsts: &[u64],
    n: u64,
    divisor: u32,
) {
    let mut args = ReduceArgs {
        n,
        nsrcs: srcs.len() as u32,
        ndsts: dsts.len() as u32,
        divisor,
        ..ReduceArgs::default()
    };
    args.srcs[..srcs.len()].copy_from_slice(srcs);
    args.dsts[..dsts.len()].copy_from_slice(dsts);
    // SAFETY: the kernel takes one RelayccReduceArgs by value (ReduceArgs mirrors it); every
    // pointer addresses at least n elements on this device.
    unsafe { launch_with(stream, f, shape, &mut args) };
    stream.synchronize().unwrap_or_else(|e| panic!("{e:?}"));
}

/// Every reduce kernel against the host backend's reduction, exactly: 1 to 16 sources, one
/// or three destinations, an odd count, pointers 16-byte aligned, all off by one element (the
/// scalar head), or with differing offsets (the scalar path), full grid and one warp, in
/// place. Exact for every type: the kernel folds sources left in order as the host does,
/// widens f16/bf16 to f32 and rounds once, divides Avg once (IEEE division, as the host), and
/// wraps integers; the data has no NaN and no negative zero (where min and max may differ).
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_reduce_kernel_matches_the_host_reduction() {
    let (stream, module) = setup();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let n: usize = 100_003;
    for dtype in DType::ALL {
        let size = dtype.size() as usize;
        for op in ReduceOp::ALL {
            if op == ReduceOp::Avg && !dtype.is_float() {
                continue;
            }
            let f = function(&module, reduce_entry(dtype, op).unwrap());
            for (k, ndsts, offsets) in [
                (1usize, 1usize, [0usize, 0]),
                (2, 1, [0, 0]),
                (2, 3, [1, 1]),
                (3, 1, [0, 1]),
                (8, 2, [0, 0]),
                (16, 1, [1, 1]),
            ] {
                let divisor = if op == ReduceOp::Avg { k as u32 + 1 } else { 0 };
                let srcs: Vec<Vec<u8>> = (0..k)
                    .map(|_| random_elements(dtype, n, &mut rng))
                    .collect();
                let refs: Vec<&[u8]> = srcs.iter().map(Vec::as_slice).collect();
                let want = host_reduce(dtype, op, &refs, (divisor > 0).then_some(divisor));
                // Sources at offsets[0] elements, destinations at offsets[1] (past 64 bytes of
                // slack on each side, checked untouched).
                let slack = 64usize;
                let place = |data: &[u8], off: usize| {
                    let mut buf = vec![0x5au8; data.len() + 2 * slack];
                    buf[slack + off * size..slack + off * size + data.len()].copy_from_slice(data);
                    buf
                };
                let dev_srcs: Vec<CudaSlice<u8>> = srcs
                    .iter()
                    .map(|s| upload(&stream, &place(s, offsets[0])))
                    .collect();
                let src_ptrs: Vec<u64> = dev_srcs
                    .iter()
                    .map(|d| ptr(&stream, d) + (slack + offsets[0] * size) as u64)
                    .collect();
                for shape in [
                    LaunchShape::for_bytes((n * size) as u64, 264),
                    LaunchShape::ONE_WARP,
                ] {
                    let blank = vec![0u8; n * size];
                    let dev_dsts: Vec<CudaSlice<u8>> = (0..ndsts)
                        .map(|_| upload(&stream, &place(&blank, offsets[1])))
                        .collect();
                    let dst_ptrs: Vec<u64> = dev_dsts
                        .iter()
                        .map(|d| ptr(&stream, d) + (slack + offsets[1] * size) as u64)
                        .collect();
                    launch_reduce(&stream, &f, shape, &src_ptrs, &dst_ptrs, n as u64, divisor);
                    for (j, d) in dev_dsts.iter().enumerate() {
                        let got = download(&stream, d);
                        let at = slack + offsets[1] * size;
                        assert!(
                            got[at..at + n * size] == want[..],
                            "{dtype} {op}: {k} sources, destination {j} of {ndsts}, offsets \
                             {offsets:?}, {shape:?}"
                        );
                        assert!(got[..at].iter().all(|&b| b == 0x5a), "{dtype} {op}: head");
                        assert!(
                            got[at + n * size..].iter().all(|&b| b == 0x5a),
                            "{dtype} {op}: tail"
                        );
                    }
                }
                // In place: the last source is the destination.
                let last = *src_ptrs.last().unwrap();
                launch_reduce(
                    &stream,
                    &f,
                    LaunchShape::for_bytes((n * size) as u64, 264),
                    &src_ptrs,
                    &[last],
                    n as u64,
                    divisor,
                );
                let got = download(&stream, dev_srcs.last().unwrap());
                let at = slack + offsets[0] * size;
                assert!(
                    got[at..at + n * size] == want[..],
                    "in-place {dtype} {op}, {k} sources"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_copies_every_size_and_alignment_and_nothing_more() {
    let (stream, module) = setup();
    let f = function(&module, super::FORWARD_ENTRY);
    let mut rng = Rng(7);
    let sizes = [0usize, 1, 15, 16, 17, 31, 4096 + 5, (1 << 20) + 3];
    let offsets = [(0usize, 0usize), (1, 1), (8, 8), (0, 1), (3, 0), (5, 9)];
    for bytes in sizes {
        for (src_off, dst_off) in offsets {
            for shape in [
                LaunchShape::ONE_WARP,
                LaunchShape::for_bytes(bytes as u64, 264),
            ] {
                let src: Vec<u8> = (0..bytes + 32).map(|_| rng.next() as u8).collect();
                let dsrc = upload(&stream, &src);
                let ddst = upload(&stream, &vec![0xab; bytes + 32]);
                let (s, d) = (
                    ptr(&stream, &dsrc) + src_off as u64,
                    ptr(&stream, &ddst) + dst_off as u64,
                );
                let len = bytes as u64;
                let mut builder = stream.launch_builder(&f);
                builder.arg(&d).arg(&s).arg(&len);
                // SAFETY: forward(void* dst, const void* src, u64 bytes); both buffers have 32
                // bytes of slack past `bytes` plus the offset (at most 9).
                unsafe { builder.launch(config(shape)) }.unwrap_or_else(|e| panic!("{e:?}"));
                stream.synchronize().unwrap_or_else(|e| panic!("{e:?}"));
                let got = download(&stream, &ddst);
                let mut want = vec![0xab; bytes + 32];
                want[dst_off..dst_off + bytes].copy_from_slice(&src[src_off..src_off + bytes]);
                assert!(
                    got == want,
                    "forward {bytes} bytes, offsets {src_off}/{dst_off}, {shape:?}"
                );
            }
        }
    }
}

/// The batched forward kernel: sixteen copies of sizes 0 to 1 MiB + 3 at assorted alignments,
/// in one launch of one warp and of a full grid, each into its own window of one destination
/// buffer: every copy lands, and no byte outside them changes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_batch_copies_each_of_its_copies_and_nothing_more() {
    use super::{CopyBatchArgs, MAX_BATCH_COPIES};
    let (stream, module) = setup();
    let f = function(&module, super::FORWARD_BATCH_ENTRY);
    let mut rng = Rng(11);
    let sizes = [0usize, 1, 15, 16, 17, 31, 4096 + 5, (1 << 20) + 3];
    let offsets = [(0usize, 0usize), (1, 1), (8, 8), (0, 1), (3, 0), (5, 9)];
    // Copy e: sizes[e % 8] bytes at offsets[e % 6], in window e of 1 MiB + 64 bytes.
    let window = (1usize << 20) + 64;
    let src: Vec<u8> = (0..window * MAX_BATCH_COPIES)
        .map(|_| rng.next() as u8)
        .collect();
    let dsrc = upload(&stream, &src);
    for shape in [LaunchShape::ONE_WARP, LaunchShape::for_bytes(16 << 20, 264)] {
        let ddst = upload(&stream, &vec![0xab; window * MAX_BATCH_COPIES]);
        let (s0, d0) = (ptr(&stream, &dsrc), ptr(&stream, &ddst));
        let mut args = CopyBatchArgs {
            count: MAX_BATCH_COPIES as u32,
            ..CopyBatchArgs::default()
        };
        let mut want = vec![0xab; window * MAX_BATCH_COPIES];
        for e in 0..MAX_BATCH_COPIES {
            let (bytes, (so, dof)) = (sizes[e % sizes.len()], offsets[e % offsets.len()]);
            let (sa, da) = (e * window + so, e * window + dof);
            args.srcs[e] = s0 + sa as u64;
            args.dsts[e] = d0 + da as u64;
            args.bytes[e] = bytes as u64;
            want[da..da + bytes].copy_from_slice(&src[sa..sa + bytes]);
        }
        // SAFETY: one RelayccCopyBatch by value; every copy inside its window of both buffers.
        unsafe { launch_with(&stream, &f, shape, &mut args) };
        stream.synchronize().unwrap_or_else(|e| panic!("{e:?}"));
        assert!(
            download(&stream, &ddst) == want,
            "batched forward, {shape:?}"
        );
    }
}

/// Milliseconds per run of `enqueue`, timed with CUDA events over `reps` runs after one
/// untimed run.
fn time_ms(stream: &Arc<CudaStream>, reps: u32, mut enqueue: impl FnMut()) -> f64 {
    let ctx = stream.context();
    let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx.new_event(timed).unwrap_or_else(|e| panic!("{e:?}"));
    let end = ctx.new_event(timed).unwrap_or_else(|e| panic!("{e:?}"));
    enqueue();
    start.record(stream).unwrap_or_else(|e| panic!("{e:?}"));
    for _ in 0..reps {
        enqueue();
    }
    end.record(stream).unwrap_or_else(|e| panic!("{e:?}"));
    f64::from(start.elapsed_ms(&end).unwrap_or_else(|e| panic!("{e:?}"))) / f64::from(reps)
}

/// The reduce kernel (two f32 sources, 256 MiB each) and the forward kernel against a
/// copy-engine device-to-device copy on one GPU, rates counted as bytes read plus written
/// (the copy moves 2 x 256 MiB, the reduction 3 x 256 MiB). The figures are printed on one
/// `gpu-check:` line for `scripts/gpu-check`, which holds the reduce kernel to 90% of the copy
/// rate (a benchmark's target, not this test's: it checks the results are right).
#[test]
#[ignore = "needs a CUDA GPU"]
fn bandwidth_of_the_reduce_and_forward_kernels_against_a_device_copy() {
    let (stream, module) = setup();
    let sms = devices().unwrap_or_else(|e| panic!("{e}"))[0].multiprocessor_count;
    let max_blocks = sms * super::BLOCKS_PER_SM;
    let bytes: usize = 256 << 20;
    let n = bytes / 4;
    let a = upload(&stream, &vec![0x3fu8; bytes]);
    let b = upload(&stream, &vec![0x40u8; bytes]);
    let out = upload(&stream, &vec![0u8; bytes]);
    let (pa, pb, po) = (ptr(&stream, &a), ptr(&stream, &b), ptr(&stream, &out));
    let reps = 20;
    let copy_ms = time_ms(&stream, reps, || {
        // SAFETY: both buffers hold `bytes` bytes on this device.
        unsafe { cudarc::driver::sys::cuMemcpyAsync(po, pa, bytes, stream.cu_stream()) }
            .result()
            .unwrap_or_else(|e| panic!("{e:?}"));
    });
    let reduce = function(&module, reduce_entry(DType::F32, ReduceOp::Sum).unwrap());
    let shape = LaunchShape::for_bytes(bytes as u64, max_blocks);
    let reduce_ms = time_ms(&stream, reps, || {
        let mut args = ReduceArgs {
            n: n as u64,
            nsrcs: 2,
            ndsts: 1,
            ..ReduceArgs::default()
        };
        args.srcs[..2].copy_from_slice(&[pa, pb]);
        args.dsts[0] = po;
        // SAFETY: one RelayccReduceArgs by value; three buffers of n f32 on this device.
        unsafe { launch_with(&stream, &reduce, shape, &mut args) };
    });
    let forward = function(&module, super::FORWARD_ENTRY);
    let forward_ms = time_ms(&stream, reps, || {
        let len = bytes as u64;
        let mut builder = stream.launch_builder(&forward);
        builder.arg(&po).arg(&pa).arg(&len);
        // SAFETY: forward(void* dst, const void* src, u64 bytes) on two buffers of `bytes`.
        unsafe { builder.launch(config(shape)) }.unwrap_or_else(|e| panic!("{e:?}"));
    });
    stream.synchronize().unwrap_or_else(|e| panic!("{e:?}"));
    // The last run was the forward: `out` holds `a`.
    let gbps = |moved: usize, ms: f64| moved as f64 / (ms * 1e-3) / 1e9;
    let (copy, red, fwd) = (
        gbps(2 * bytes, copy_ms),
        gbps(3 * bytes, reduce_ms),
        gbps(2 * bytes, forward_ms),
    );
    assert!(copy > 0.0 && red > 0.0 && fwd > 0.0, "{copy} {red} {fwd}");
    assert_eq!(download(&stream, &out)[..64], vec![0x3fu8; 64][..]);
    println!(
        "gpu-check: device_copy_gbps={copy:.1} reduce_f32_2in_gbps={red:.1} \
         forward_gbps={fwd:.1} reduce_vs_copy={:.3} forward_vs_copy={:.3}",
        red / copy,
        fwd / copy
    );
}

/// A copy-engine copy against the forward kernel, GPU time per copy of 1 to 64 MiB on one
/// GPU (CUDA events over 20 copies each): where the SM-copy threshold
/// (`rates::SM_COPY_BELOW_BYTES`) should sit on this GPU. One `gpu-check: copy_by_size` line
/// per size for `scripts/gpu-check`; the test checks the last copy's bytes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn copy_engine_and_forward_kernel_by_size() {
    let (stream, module) = setup();
    let sms = devices().unwrap_or_else(|e| panic!("{e}"))[0].multiprocessor_count;
    let max_blocks = sms * super::BLOCKS_PER_SM;
    let most: usize = 64 << 20;
    let a = upload(&stream, &vec![0x5au8; most]);
    let out = upload(&stream, &vec![0u8; most]);
    let (pa, po) = (ptr(&stream, &a), ptr(&stream, &out));
    let forward = function(&module, super::FORWARD_ENTRY);
    for mib in [1usize, 4, 8, 16, 32, 64] {
        let bytes = mib << 20;
        let engine_ms = time_ms(&stream, 20, || {
            // SAFETY: both buffers hold at least `bytes` bytes on this device.
            unsafe { cudarc::driver::sys::cuMemcpyAsync(po, pa, bytes, stream.cu_stream()) }
                .result()
                .unwrap_or_else(|e| panic!("{e:?}"));
        });
        let shape = LaunchShape::for_bytes(bytes as u64, max_blocks);
        let forward_ms = time_ms(&stream, 20, || {
            let len = bytes as u64;
            let mut builder = stream.launch_builder(&forward);
            builder.arg(&po).arg(&pa).arg(&len);
            // SAFETY: forward(void* dst, const void* src, u64 bytes) on two buffers of at
            // least `bytes` bytes.
            unsafe { builder.launch(config(shape)) }.unwrap_or_else(|e| panic!("{e:?}"));
        });
        assert!(engine_ms > 0.0 && forward_ms > 0.0);
        println!(
            "gpu-check: copy_by_size mib={mib} engine_us={:.2} forward_us={:.2}",
            engine_ms * 1e3,
            forward_ms * 1e3
        );
    }
    stream.synchronize().unwrap_or_else(|e| panic!("{e:?}"));
    assert!(download(&stream, &out).iter().all(|&b| b == 0x5a));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn devices_report_a_gpu_with_a_supported_arch() {
    let devs = devices().unwrap_or_else(|e| panic!("{e}"));
    assert!(!devs.is_empty());
    for d in devs {
        assert!(d.arch().is_ok(), "{d:?}");
        assert!(
            d.multiprocessor_count > 0 && d.total_memory_bytes > 0,
            "{d:?}"
        );
    }
}

/// What `relaycc calibrate` measures of one GPU's memory: every rate positive and finite,
/// every small operation's time positive, and the write share (a memset's rate over the copy
/// engines') a fraction the calibration file accepts. One `gpu-check: write_share` line for
/// `scripts/gpu-check`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn calibrate_measures_the_device_rates_and_the_write_share() {
    let d = super::measure::measure_device(0, 64 << 20, 5).unwrap_or_else(|e| panic!("{e}"));
    for (what, r) in [
        ("copy engine", d.copy_engine),
        ("sm copy", d.sm_copy),
        ("reduce", d.reduce),
        ("memset", d.write),
    ] {
        assert!(r.gbps.is_finite() && r.gbps > 0.0, "{what}: {r:?}");
        assert!(
            r.latency_us.is_finite() && r.latency_us > 0.0,
            "{what}: {r:?}"
        );
    }
    let share = d.write_share();
    assert!(
        (relaycc_topo::rates::MIN_CALIBRATED_FRACTION..=1.0).contains(&share),
        "{d:?}"
    );
    println!(
        "gpu-check: write_share={share:.3} memset_gbps={:.1} device_copy_gbps={:.1}",
        d.write.gbps, d.copy_engine.gbps
    );
}
