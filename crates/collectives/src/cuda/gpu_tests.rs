//! Device tests: launch the forward kernel and every reduce kernel on a real GPU and compare
//! with host arithmetic. Ignored by default; run on a GPU machine with
//! `cargo test -p relaycc-collectives -- --ignored`.
//!
//! Expectations are exact: the kernels are compiled with `--fmad=false`, f16/bf16 accumulate in
//! f32 and round once to nearest-even (what the `half` crate does on the host), and integer
//! sums and products wrap.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use half::{bf16, f16};
use relaycc_route::{DType, ReduceOp};

use super::{CacheConfig, KernelCache, LaunchShape, devices, reduce_entry};

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

/// The host's answer for one element pair, as little-endian bytes.
fn host_element(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8], scale: f64) -> Vec<u8> {
    macro_rules! float {
        ($t:ty, $a:expr, $b:expr, $s:expr) => {{
            let (x, y, s): ($t, $t, $t) = ($a, $b, $s);
            match op {
                ReduceOp::Sum => x + y,
                ReduceOp::Prod => x * y,
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
                ReduceOp::Avg => (x + y) * s,
            }
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let x = <$t>::from_le_bytes(a.try_into().unwrap());
            let y = <$t>::from_le_bytes(b.try_into().unwrap());
            let r = match op {
                ReduceOp::Sum => x.wrapping_add(y),
                ReduceOp::Prod => x.wrapping_mul(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
                ReduceOp::Avg => unreachable!("no integer avg kernels"),
            };
            r.to_le_bytes().to_vec()
        }};
    }
    let f16_of = |v: &[u8]| f16::from_le_bytes(v.try_into().unwrap()).to_f32();
    let bf16_of = |v: &[u8]| bf16::from_le_bytes(v.try_into().unwrap()).to_f32();
    match dtype {
        DType::F32 => {
            let (x, y) = (
                f32::from_le_bytes(a.try_into().unwrap()),
                f32::from_le_bytes(b.try_into().unwrap()),
            );
            float!(f32, x, y, scale as f32).to_le_bytes().to_vec()
        }
        DType::F64 => {
            let (x, y) = (
                f64::from_le_bytes(a.try_into().unwrap()),
                f64::from_le_bytes(b.try_into().unwrap()),
            );
            float!(f64, x, y, scale).to_le_bytes().to_vec()
        }
        DType::F16 => f16::from_f32(float!(f32, f16_of(a), f16_of(b), scale as f32))
            .to_le_bytes()
            .to_vec(),
        DType::Bf16 => bf16::from_f32(float!(f32, bf16_of(a), bf16_of(b), scale as f32))
            .to_le_bytes()
            .to_vec(),
        DType::I8 => int!(i8),
        DType::U8 => int!(u8),
        DType::I32 => int!(i32),
        DType::U32 => int!(u32),
        DType::I64 => int!(i64),
        DType::U64 => int!(u64),
    }
}

fn host_reduce(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8], scale: f64) -> Vec<u8> {
    let size = dtype.size() as usize;
    a.chunks(size)
        .zip(b.chunks(size))
        .flat_map(|(x, y)| host_element(dtype, op, x, y, scale))
        .collect()
}

/// Launches one reduce or reduce-copy kernel on raw device pointers (so dst may alias a).
#[allow(clippy::too_many_arguments)]
fn launch_reduce(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    shape: LaunchShape,
    dst: u64,
    dst2: Option<u64>,
    a: u64,
    b: u64,
    n: u64,
    scale: Option<f64>,
) {
    let mut builder = stream.launch_builder(f);
    builder.arg(&dst);
    if let Some(dst2) = &dst2 {
        builder.arg(dst2);
    }
    builder.arg(&a).arg(&b).arg(&n);
    if let Some(scale) = &scale {
        builder.arg(scale);
    }
    // SAFETY: the arguments match the kernel's signature (pointers as u64, n as u64, scale as
    // f64 for avg kernels), and every pointer addresses at least n elements on this device.
    unsafe { builder.launch(config(shape)) }.unwrap_or_else(|e| panic!("launch: {e:?}"));
    stream.synchronize().unwrap_or_else(|e| panic!("{e:?}"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_reduce_and_reduce_copy_kernel_matches_the_host() {
    let (stream, module) = setup();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // An odd count, so no kernel can rely on a multiple of anything.
    let n: usize = 100_003;
    for dtype in DType::ALL {
        for op in ReduceOp::ALL {
            if op == ReduceOp::Avg && !dtype.is_float() {
                continue;
            }
            let scale = (op == ReduceOp::Avg).then_some(0.25);
            let a = random_elements(dtype, n, &mut rng);
            let b = random_elements(dtype, n, &mut rng);
            let want = host_reduce(dtype, op, &a, &b, scale.unwrap_or(1.0));
            let (da, db) = (upload(&stream, &a), upload(&stream, &b));
            let dst = upload(&stream, &vec![0u8; a.len()]);
            let dst2 = upload(&stream, &vec![0u8; a.len()]);
            let shape = LaunchShape::for_items(n as u64, 264);

            let f = function(&module, reduce_entry(dtype, op, false).unwrap());
            launch_reduce(
                &stream,
                &f,
                shape,
                ptr(&stream, &dst),
                None,
                ptr(&stream, &da),
                ptr(&stream, &db),
                n as u64,
                scale,
            );
            assert_eq!(download(&stream, &dst), want, "reduce {dtype} {op}");

            let f = function(&module, reduce_entry(dtype, op, true).unwrap());
            let fresh = upload(&stream, &vec![0u8; a.len()]);
            launch_reduce(
                &stream,
                &f,
                LaunchShape::ONE_WARP,
                ptr(&stream, &fresh),
                Some(ptr(&stream, &dst2)),
                ptr(&stream, &da),
                ptr(&stream, &db),
                n as u64,
                scale,
            );
            assert_eq!(
                download(&stream, &fresh),
                want,
                "reduce_copy {dtype} {op} dst"
            );
            assert_eq!(
                download(&stream, &dst2),
                want,
                "reduce_copy {dtype} {op} dst2"
            );

            // In place: dst is a.
            let f = function(&module, reduce_entry(dtype, op, false).unwrap());
            launch_reduce(
                &stream,
                &f,
                shape,
                ptr(&stream, &da),
                None,
                ptr(&stream, &da),
                ptr(&stream, &db),
                n as u64,
                scale,
            );
            assert_eq!(download(&stream, &da), want, "in-place reduce {dtype} {op}");
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
                LaunchShape::for_items(bytes as u64 / 16, 264),
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
