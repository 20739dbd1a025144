//! The kernel sources (the relaycc-kernels crate, which embeds `kernels/`), the list of entry
//! points they define, the reduce kernels' one parameter ([`ReduceArgs`]), and how to read
//! entry points and their parameters back out of PTX.
//!
//! NVRTC reads no files, so relaycc-kernels embeds every source with `include_str!`, and
//! [`kernel_source`] builds the one translation unit NVRTC compiles by expanding
//! `#include "NAME"` lines against [`SOURCES`] (each file at most once, as `#pragma once` asks).
//! Nothing else is preprocessed by hand.

use relaycc_kernels::UNITS;
use relaycc_route::{DType, ReduceOp};

use super::CudaError;

pub use relaycc_kernels::SOURCES;

/// The forward (peer copy) kernel: `relaycc_forward(void* dst, const void* src, u64 bytes)`.
pub const FORWARD_ENTRY: &str = "relaycc_forward";

/// The batched forward kernel: `relaycc_forward_batch(RelayccCopyBatch args)`, up to
/// [`MAX_BATCH_COPIES`] independent copies in one launch ([`CopyBatchArgs`]).
pub const FORWARD_BATCH_ENTRY: &str = "relaycc_forward_batch";

/// Most copies one batched forward launch makes (`RELAYCC_MAX_COPIES` in `kernels/forward.cu`;
/// the simulator's [`relaycc_topo::rates::SM_COPY_BATCH_MAX`], which it is).
pub const MAX_BATCH_COPIES: usize = relaycc_topo::rates::SM_COPY_BATCH_MAX;

/// The one parameter of the batched forward kernel, `RelayccCopyBatch` in
/// `kernels/forward.cu`, passed by value: copy `bytes[e]` bytes from `srcs[e]` to `dsts[e]` for
/// `e < count`, none of them writing what another reads or writes. Unused slots are 0. Its
/// size is checked against the entry point's PTX parameter ([`stale_entries`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyBatchArgs {
    /// Destination addresses, the first `count` used.
    pub dsts: [u64; MAX_BATCH_COPIES],
    /// Source addresses, the first `count` used.
    pub srcs: [u64; MAX_BATCH_COPIES],
    /// Bytes of each copy.
    pub bytes: [u64; MAX_BATCH_COPIES],
    /// Copies, 1 to [`MAX_BATCH_COPIES`].
    pub count: u32,
    /// Zero (the C struct's padding, named so the layout is explicit).
    pub reserved: u32,
}

/// Bytes of [`CopyBatchArgs`], as the PTX declares the parameter (`.b8 NAME_param_0[392]`).
pub const COPY_BATCH_ARGS_BYTES: usize = std::mem::size_of::<CopyBatchArgs>();

/// Declares the type x operator table once, so the names the library launches and the names
/// it checks in PTX come from one place.
macro_rules! reduce_table {
    ($( $ty:ident : [$($op:ident),*] ; )*) => {
        /// Every `relaycc_reduce_<type>_<op>` entry point: `dsts[j] = op(srcs...)`, one
        /// [`ReduceArgs`] parameter.
        pub const REDUCE_ENTRIES: &[&str] =
            &[$( $( concat!("relaycc_reduce_", stringify!($ty), "_", stringify!($op)), )* )*];
    };
}

reduce_table! {
    f32: [sum, prod, min, max, avg];
    f64: [sum, prod, min, max, avg];
    f16: [sum, prod, min, max, avg];
    bf16: [sum, prod, min, max, avg];
    i8: [sum, prod, min, max];
    u8: [sum, prod, min, max];
    i32: [sum, prod, min, max];
    u32: [sum, prod, min, max];
    i64: [sum, prod, min, max];
    u64: [sum, prod, min, max];
}

/// Every entry point the compiled kernels must define, the forward kernels first.
pub fn expected_entries() -> impl Iterator<Item = &'static str> {
    [FORWARD_ENTRY, FORWARD_BATCH_ENTRY]
        .into_iter()
        .chain(REDUCE_ENTRIES.iter().copied())
}

/// The reduce kernel for an element type and operator: `relaycc_reduce_<type>_<op>`, whose one
/// parameter is a [`ReduceArgs`]. f16 and bf16 buffers hold the IEEE / bfloat16 bits (`u16` on
/// the host).
pub fn reduce_entry(dtype: DType, op: ReduceOp) -> Result<&'static str, CudaError> {
    let name = format!("relaycc_reduce_{}_{}", dtype.name(), op.name());
    REDUCE_ENTRIES
        .iter()
        .copied()
        .find(|entry| *entry == name)
        .ok_or(CudaError::NoKernel { dtype, op })
}

/// Most sources one reduce launch takes (`RELAYCC_MAX_SRCS` in `kernels/reduce.cu`); a
/// reduction of more is a chain of launches.
pub const MAX_REDUCE_SRCS: usize = 16;
/// Most destinations one reduce launch writes (`RELAYCC_MAX_DSTS`): the reduction's own and
/// the copies of its result fused into it (the simulator's
/// [`relaycc_topo::rates::REDUCE_KERNEL_DSTS_MAX`], which it is).
pub const MAX_REDUCE_DSTS: usize = relaycc_topo::rates::REDUCE_KERNEL_DSTS_MAX;

/// The one parameter of every reduce kernel, `RelayccReduceArgs` in `kernels/reduce.cu`, passed
/// by value: `dsts[j][i] = op(srcs[0][i], ..., srcs[nsrcs - 1][i])` for `i < n` and
/// `j < ndsts`, divided by `divisor` when the op is `Avg` and `divisor` is not 0. Pointers are
/// device addresses (unified addressing: a peer's memory when peer access is enabled); unused
/// slots are 0. Its size is checked against every reduce entry point's PTX parameter
/// ([`stale_entries`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReduceArgs {
    /// Source addresses, the first `nsrcs` used.
    pub srcs: [u64; MAX_REDUCE_SRCS],
    /// Destination addresses, the first `ndsts` used.
    pub dsts: [u64; MAX_REDUCE_DSTS],
    /// Elements per source and destination.
    pub n: u64,
    /// Sources, 1 to [`MAX_REDUCE_SRCS`].
    pub nsrcs: u32,
    /// Destinations, 1 to [`MAX_REDUCE_DSTS`].
    pub ndsts: u32,
    /// `Avg` only: the divisor of the result (0: none).
    pub divisor: u32,
    /// Zero (the C struct's padding, named so the layout is explicit).
    pub reserved: u32,
}

/// Bytes of [`ReduceArgs`], as the PTX declares the parameter (`.b8 NAME_param_0[216]`).
pub const REDUCE_ARGS_BYTES: usize = std::mem::size_of::<ReduceArgs>();

/// The parameter declarations of entry point `entry` in `ptx` (`.param .u64 NAME_param_0`,
/// ...), or `None` when `ptx` does not define it.
pub fn entry_params(ptx: &str, entry: &str) -> Option<Vec<String>> {
    let mut lines = ptx.lines();
    lines.find(|line| {
        let mut words = line.split_whitespace();
        let name = match words.next() {
            Some(".entry") => words.next(),
            Some(".visible" | ".weak") if words.next() == Some(".entry") => words.next(),
            _ => None,
        };
        name.and_then(|n| n.split('(').next()) == Some(entry)
    })?;
    let mut params = Vec::new();
    for line in lines {
        let t = line.trim();
        if t.starts_with(')') || t.starts_with('{') {
            break;
        }
        if t.starts_with(".param") {
            params.push(t.trim_end_matches(',').to_owned());
        }
    }
    Some(params)
}

/// The parameters each entry point must have: the forward kernel three 64-bit values, the
/// batched forward kernel one [`COPY_BATCH_ARGS_BYTES`]-byte struct, every reduce kernel one
/// [`REDUCE_ARGS_BYTES`]-byte struct.
fn params_match(entry: &str, params: &[String]) -> bool {
    if entry == FORWARD_ENTRY {
        return params.len() == 3 && params.iter().all(|p| p.starts_with(".param .u64 "));
    }
    let bytes = if entry == FORWARD_BATCH_ENTRY {
        COPY_BATCH_ARGS_BYTES
    } else {
        REDUCE_ARGS_BYTES
    };
    let want = format!("{entry}_param_0[{bytes}]");
    params.len() == 1 && params[0].starts_with(".param .align 8 .b8 ") && params[0].ends_with(&want)
}

/// The expected entry points `ptx` defines with other parameters than this library launches
/// them with, each with the parameters it has: PTX compiled from other kernel sources (an old
/// `RELAYCC_PTX_DIR`), which must never be launched.
pub fn stale_entries(ptx: &str) -> Vec<String> {
    expected_entries()
        .filter_map(|e| {
            let params = entry_params(ptx, e)?;
            (!params_match(e, &params)).then(|| format!("{e}({})", params.join(", ")))
        })
        .collect()
}

/// The whole translation unit NVRTC compiles: the units in order, includes expanded.
pub fn kernel_source() -> String {
    let mut out = String::new();
    let mut included: Vec<&str> = Vec::new();
    for unit in UNITS {
        expand(unit, &mut included, &mut out);
    }
    out
}

fn expand<'a>(name: &'a str, included: &mut Vec<&'a str>, out: &mut String) {
    if included.contains(&name) {
        return;
    }
    included.push(name);
    let Some(text) = relaycc_kernels::source(name) else {
        return;
    };
    out.push_str(&format!("// ---- {name} ----\n"));
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed == "#pragma once" {
            continue;
        }
        let header = trimmed
            .strip_prefix("#include \"")
            .and_then(|rest| rest.strip_suffix('"'))
            .and_then(|header| SOURCES.iter().find(|(n, _)| *n == header).map(|(n, _)| *n));
        match header {
            Some(header) => expand(header, included, out),
            // Anything else, including an include of a file not embedded, goes to NVRTC as is,
            // so a mistake surfaces as a compile error naming the file.
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
}

/// The entry points a PTX module defines (`.entry NAME(` or `.visible .entry NAME(`).
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let first = words.next()?;
            let name = match first {
                ".entry" => words.next()?,
                ".visible" | ".weak" if words.next()? == ".entry" => words.next()?,
                _ => return None,
            };
            let name = name.split('(').next().unwrap_or(name);
            (!name.is_empty()).then(|| name.to_owned())
        })
        .collect()
}

/// The expected entry points absent from `ptx`.
pub fn missing_entries(ptx: &str) -> Vec<String> {
    let present = ptx_entries(ptx);
    expected_entries()
        .filter(|e| !present.iter().any(|p| p == e))
        .map(str::to_owned)
        .collect()
}

/// A launch shape for the grid-stride kernels: every kernel is correct for any shape, so this
/// only trades speed against interference with other work on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    /// Thread blocks in the grid.
    pub blocks: u32,
    /// Threads per block (a multiple of 32).
    pub threads_per_block: u32,
}

/// Threads per block for full launches: 512 keeps enough loads in flight per SM for
/// memory-bound copies while letting two blocks share an SM (the reduce kernels use 50 to 70
/// registers per thread for the 32-bit and 16-bit types).
pub const THREADS_PER_BLOCK: u32 = 512;

/// Bytes of one operand a thread moves per step of the kernels' main loop: four 16-byte
/// packs (`RELAYCC_UNROLL`, `RELAYCC_FORWARD_UNROLL`).
pub const BYTES_PER_THREAD_STEP: u64 = 64;

/// Thread blocks per SM a full launch asks for at most: two blocks of
/// [`THREADS_PER_BLOCK`] threads are resident per SM, so the grid is one wave.
pub const BLOCKS_PER_SM: u32 = 2;

impl LaunchShape {
    /// One warp: what a relay GPU uses so a forward barely touches its own work.
    pub const ONE_WARP: LaunchShape = LaunchShape {
        blocks: 1,
        threads_per_block: 32,
    };

    /// A shape for `bytes` bytes per operand: one step of [`BYTES_PER_THREAD_STEP`] per thread
    /// (every load of the operand in flight at once), at most `max_blocks` blocks (a grid
    /// the GPU holds at once); never zero blocks.
    pub fn for_bytes(bytes: u64, max_blocks: u32) -> LaunchShape {
        let per_block = u64::from(THREADS_PER_BLOCK) * BYTES_PER_THREAD_STEP;
        let wanted = bytes.div_ceil(per_block).max(1);
        let blocks = u32::try_from(wanted)
            .unwrap_or(u32::MAX)
            .min(max_blocks.max(1));
        LaunchShape {
            blocks,
            threads_per_block: THREADS_PER_BLOCK,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_table_is_the_product_of_route_types_and_ops() {
        let mut expected = Vec::new();
        for dtype in DType::ALL {
            for op in ReduceOp::ALL {
                if op == ReduceOp::Avg && !dtype.is_float() {
                    assert_eq!(
                        reduce_entry(dtype, op),
                        Err(CudaError::NoKernel { dtype, op })
                    );
                    continue;
                }
                expected.push(format!("relaycc_reduce_{}_{}", dtype.name(), op.name()));
                assert!(reduce_entry(dtype, op).is_ok());
            }
        }
        assert_eq!(REDUCE_ENTRIES, expected.as_slice());
        assert_eq!(expected_entries().count(), 46);
    }

    #[test]
    fn source_expands_the_header_once_and_has_no_other_includes() {
        let src = kernel_source();
        assert_eq!(src.matches("// ---- common.cuh ----").count(), 1);
        assert!(!src.lines().any(|l| l.trim_start().starts_with("#include")));
        assert!(!src.contains("#pragma once"));
        assert!(src.contains("relaycc_forward("));
        assert!(!src.contains('\0'));
    }

    #[test]
    fn every_entry_name_is_spelled_by_the_cuda_macros() {
        // The CUDA side builds names with RELAYCC_REDUCE_ALL_OPS(TNAME, E) and
        // RELAYCC_REDUCE_AVG(TNAME, E) lines; check each type of the Rust table has them.
        let src = kernel_source();
        for dtype in DType::ALL {
            assert!(
                src.contains(&format!("RELAYCC_REDUCE_ALL_OPS({},", dtype.name())),
                "{dtype}"
            );
            assert_eq!(
                src.contains(&format!("RELAYCC_REDUCE_AVG({},", dtype.name())),
                dtype.is_float(),
                "{dtype}"
            );
        }
    }

    /// The Rust mirror has the C struct's layout: 16 + 8 pointers, the count, three 32-bit
    /// fields and the padding, 8-byte aligned; and the C side names the same limits.
    #[test]
    fn reduce_args_mirror_the_c_struct() {
        assert_eq!(REDUCE_ARGS_BYTES, 216);
        assert_eq!(std::mem::align_of::<ReduceArgs>(), 8);
        assert_eq!(std::mem::offset_of!(ReduceArgs, dsts), 128);
        assert_eq!(std::mem::offset_of!(ReduceArgs, n), 192);
        assert_eq!(std::mem::offset_of!(ReduceArgs, nsrcs), 200);
        assert_eq!(std::mem::offset_of!(ReduceArgs, ndsts), 204);
        assert_eq!(std::mem::offset_of!(ReduceArgs, divisor), 208);
        let src = kernel_source();
        assert!(src.contains(&format!("#define RELAYCC_MAX_SRCS {MAX_REDUCE_SRCS}\n")));
        assert!(src.contains(&format!("#define RELAYCC_MAX_DSTS {MAX_REDUCE_DSTS}\n")));
    }

    #[test]
    fn copy_batch_args_mirror_the_c_struct() {
        // RelayccCopyBatch: 16 destinations, 16 sources, 16 lengths (u64 each), then the
        // count and a reserved u32: 392 bytes, 8-aligned, as `stale_entries` checks in PTX.
        assert_eq!(COPY_BATCH_ARGS_BYTES, 392);
        assert_eq!(std::mem::offset_of!(CopyBatchArgs, srcs), 128);
        assert_eq!(std::mem::offset_of!(CopyBatchArgs, bytes), 256);
        assert_eq!(std::mem::offset_of!(CopyBatchArgs, count), 384);
        let src = kernel_source();
        assert!(src.contains(&format!("#define RELAYCC_MAX_COPIES {MAX_BATCH_COPIES}\n")));
    }

    #[test]
    fn ptx_entries_and_their_parameters_are_parsed() {
        let ptx = "//\n.version 8.8\n.visible .entry relaycc_forward(\n\t.param .u64 relaycc_forward_param_0,\n\
                   \t.param .u64 relaycc_forward_param_1,\n\t.param .u64 relaycc_forward_param_2\n)\n{\n}\n\
                   .visible .entry relaycc_reduce_f32_sum(\n\t.param .align 8 .b8 relaycc_reduce_f32_sum_param_0[216]\n)\n\
                   .entry relaycc_reduce_f32_prod(\n\t.param .u64 relaycc_reduce_f32_prod_param_0,\n\
                   \t.param .u64 relaycc_reduce_f32_prod_param_1\n)\n\
                   .func not_an_entry(\n// .entry commented\n";
        assert_eq!(
            ptx_entries(ptx),
            vec![
                "relaycc_forward",
                "relaycc_reduce_f32_sum",
                "relaycc_reduce_f32_prod"
            ]
        );
        let missing = missing_entries(ptx);
        assert_eq!(missing.len(), 43);
        assert!(!missing.contains(&"relaycc_forward".to_owned()));
        assert_eq!(
            entry_params(ptx, "relaycc_reduce_f32_sum"),
            Some(vec![
                ".param .align 8 .b8 relaycc_reduce_f32_sum_param_0[216]".to_owned()
            ])
        );
        assert_eq!(entry_params(ptx, "relaycc_reduce_f64_sum"), None);
        // The old two-input signature is stale; the forward kernel and the struct are not.
        let stale = stale_entries(ptx);
        assert_eq!(stale.len(), 1, "{stale:?}");
        assert!(stale[0].starts_with("relaycc_reduce_f32_prod(.param .u64"));
    }

    #[test]
    fn launch_shapes() {
        let step = u64::from(THREADS_PER_BLOCK) * BYTES_PER_THREAD_STEP;
        assert_eq!(LaunchShape::for_bytes(0, 264).blocks, 1);
        assert_eq!(LaunchShape::for_bytes(step, 264).blocks, 1);
        assert_eq!(LaunchShape::for_bytes(step + 1, 264).blocks, 2);
        assert_eq!(LaunchShape::for_bytes(u64::MAX, 264).blocks, 264);
        assert_eq!(LaunchShape::for_bytes(10, 0).blocks, 1);
        assert_eq!(LaunchShape::ONE_WARP.threads_per_block, 32);
    }
}
