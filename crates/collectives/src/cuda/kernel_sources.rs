//! The kernel sources (the relaycc-kernels crate, which embeds `kernels/`), the list of entry
//! points they define, and how to read entry points back out of PTX.
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

/// Declares the type x operator table once and derives both entry lists from it, so the names
/// the library launches and the names it checks in PTX come from one place.
macro_rules! reduce_table {
    ($( $ty:ident : [$($op:ident),*] ; )*) => {
        /// Every `relaycc_reduce_<type>_<op>` entry point (dst = a op b).
        pub const REDUCE_ENTRIES: &[&str] =
            &[$( $( concat!("relaycc_reduce_", stringify!($ty), "_", stringify!($op)), )* )*];
        /// Every `relaycc_reduce_copy_<type>_<op>` entry point (dst = dst2 = a op b).
        pub const REDUCE_COPY_ENTRIES: &[&str] =
            &[$( $( concat!("relaycc_reduce_copy_", stringify!($ty), "_", stringify!($op)), )* )*];
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

/// Every entry point the compiled kernels must define, forward first.
pub fn expected_entries() -> impl Iterator<Item = &'static str> {
    std::iter::once(FORWARD_ENTRY)
        .chain(REDUCE_ENTRIES.iter().copied())
        .chain(REDUCE_COPY_ENTRIES.iter().copied())
}

/// The reduce kernel for an element type and operator; `copy` picks the reduce-copy form.
///
/// Signatures (pointers are device pointers, `n` counts elements, `scale` is an `f64`):
/// `reduce(dst, a, b, n)`, `reduce_copy(dst, dst2, a, b, n)`, and for `Avg` the same with a
/// trailing `scale` the sum is multiplied by (1/n at the plan's finalize step, else 1).
/// f16 and bf16 buffers hold the IEEE / bfloat16 bits (`u16` on the host).
pub fn reduce_entry(dtype: DType, op: ReduceOp, copy: bool) -> Result<&'static str, CudaError> {
    let prefix = if copy {
        "relaycc_reduce_copy_"
    } else {
        "relaycc_reduce_"
    };
    let table = if copy {
        REDUCE_COPY_ENTRIES
    } else {
        REDUCE_ENTRIES
    };
    let name = format!("{prefix}{}_{}", dtype.name(), op.name());
    table
        .iter()
        .copied()
        .find(|entry| *entry == name)
        .ok_or(CudaError::NoKernel { dtype, op })
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
/// memory-bound copies while letting several blocks share an SM.
pub const THREADS_PER_BLOCK: u32 = 512;

/// Elements (or 16-byte words) one thread handles per loop trip before more blocks are added;
/// a few per thread amortise the index arithmetic of the grid-stride loop.
pub const ITEMS_PER_THREAD: u64 = 4;

impl LaunchShape {
    /// One warp: what a relay GPU uses so a forward barely touches its own work.
    pub const ONE_WARP: LaunchShape = LaunchShape {
        blocks: 1,
        threads_per_block: 32,
    };

    /// A shape covering `items` work items (elements, or 16-byte words for forward), at most
    /// `max_blocks` blocks (e.g. a few per SM); never zero blocks.
    pub fn for_items(items: u64, max_blocks: u32) -> LaunchShape {
        let per_block = u64::from(THREADS_PER_BLOCK) * ITEMS_PER_THREAD;
        let wanted = items.div_ceil(per_block).max(1);
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
                        reduce_entry(dtype, op, false),
                        Err(CudaError::NoKernel { dtype, op })
                    );
                    continue;
                }
                expected.push(format!("relaycc_reduce_{}_{}", dtype.name(), op.name()));
                assert!(reduce_entry(dtype, op, false).is_ok());
                assert!(
                    reduce_entry(dtype, op, true)
                        .is_ok_and(|e| e.starts_with("relaycc_reduce_copy_"))
                );
            }
        }
        assert_eq!(REDUCE_ENTRIES, expected.as_slice());
        assert_eq!(REDUCE_COPY_ENTRIES.len(), REDUCE_ENTRIES.len());
        assert_eq!(expected_entries().count(), 89);
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
        // The CUDA side builds names with RELAYCC_REDUCE(TNAME, E, ONAME, OP) lines; check
        // each type and op of the Rust table has its instantiation line.
        let src = kernel_source();
        for dtype in DType::ALL {
            assert!(
                src.contains(&format!("RELAYCC_REDUCE_ALL_OPS({},", dtype.name())),
                "{dtype}"
            );
            if dtype.is_float() {
                assert!(
                    src.contains(&format!("RELAYCC_REDUCE_AVG({},", dtype.name())),
                    "{dtype}"
                );
            }
        }
    }

    #[test]
    fn ptx_entries_are_parsed() {
        let ptx = "//\n.version 8.8\n.visible .entry relaycc_forward(\n\t.param .u64 a\n)\n\
                   .entry plain_one(\n.func not_an_entry(\n// .entry commented\n";
        assert_eq!(ptx_entries(ptx), vec!["relaycc_forward", "plain_one"]);
        let missing = missing_entries(ptx);
        assert_eq!(missing.len(), 88);
        assert!(!missing.contains(&"relaycc_forward".to_owned()));
    }

    #[test]
    fn launch_shapes() {
        assert_eq!(LaunchShape::for_items(0, 132).blocks, 1);
        assert_eq!(LaunchShape::for_items(2048, 132).blocks, 1);
        assert_eq!(LaunchShape::for_items(2049, 132).blocks, 2);
        assert_eq!(LaunchShape::for_items(u64::MAX, 132).blocks, 132);
        assert_eq!(LaunchShape::for_items(10, 0).blocks, 1);
        assert_eq!(LaunchShape::ONE_WARP.threads_per_block, 32);
    }
}
