//! The reduction loops against plain folds: types, ops, grouped passes, the fan-out's line
//! and block loops at every cache-line phase.

use super::*;

fn reduce_vec<T: Copy + Default>(
    dtype: DType,
    op: ReduceOp,
    srcs: &[Vec<T>],
    div: Option<u32>,
) -> Vec<T> {
    let len = srcs[0].len();
    let mut out = vec![T::default(); len];
    let ptrs: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr() as *const u8).collect();
    // SAFETY: every vector holds `len` elements of the right type and lives to the end.
    unsafe { reduce(dtype, op, &ptrs, out.as_mut_ptr() as *mut u8, len, div) };
    out
}

#[test]
fn integer_sum_wraps() {
    let out = reduce_vec(
        DType::U8,
        ReduceOp::Sum,
        &[vec![200u8; 3000], vec![100u8; 3000]],
        None,
    );
    assert!(out.iter().all(|v| *v == 44));
    let out = reduce_vec(
        DType::I32,
        ReduceOp::Prod,
        &[vec![i32::MAX; 5], vec![2; 5]],
        None,
    );
    assert!(out.iter().all(|v| *v == -2));
}

#[test]
fn half_types_accumulate_in_f32() {
    // 2048 + 1 + 1 is not representable step by step in f16 (2049 rounds to 2048), but is
    // exact when accumulated in f32 and rounded once (2050).
    let a = vec![f16::from_f32(2048.0); 7];
    let b = vec![f16::from_f32(1.0); 7];
    let out = reduce_vec(DType::F16, ReduceOp::Sum, &[a, b.clone(), b], None);
    assert!(out.iter().all(|v| v.to_f32() == 2050.0));
    let out = reduce_vec(
        DType::Bf16,
        ReduceOp::Avg,
        &[vec![bf16::from_f32(3.0); 2], vec![bf16::from_f32(6.0); 2]],
        Some(2),
    );
    assert!(out.iter().all(|v| v.to_f32() == 4.5));
}

/// Nine sources (a pass of four, another of four, one of one) and lengths around the
/// block size give bit for bit the left-to-right fold, where float association matters.
#[test]
fn grouped_passes_fold_left_to_right() {
    let vals = [1e8f32, 1.0, -1e8, 0.5, 3.0e-3, -7.0, 1e7, 0.25, -1e7];
    for len in [1usize, BLOCK - 1, BLOCK + 3, 3 * BLOCK] {
        let srcs: Vec<Vec<f32>> = (0..vals.len())
            .map(|k| (0..len).map(|i| vals[(k + i) % vals.len()]).collect())
            .collect();
        let want: Vec<f32> = (0..len)
            .map(|i| srcs[1..].iter().fold(srcs[0][i], |a, s| a + s[i]))
            .collect();
        let got = reduce_vec(DType::F32, ReduceOp::Sum, &srcs, None);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits()),
            "len {len}"
        );
    }
}

/// The fan-out writes the reduction's bits to every destination, streamed or not, for
/// lengths around the block size and in place.
#[test]
fn fan_out_writes_the_result_everywhere() {
    for len in [1usize, BLOCK - 1, BLOCK + 5, 3 * BLOCK + 17] {
        let srcs: Vec<Vec<f32>> = (0..6)
            .map(|k| {
                (0..len)
                    .map(|i| ((k * 31 + i) % 13) as f32 * 0.37)
                    .collect()
            })
            .collect();
        let want = reduce_vec(DType::F32, ReduceOp::Avg, &srcs, Some(6));
        let mut own = srcs[0].clone();
        let mut x = vec![0f32; len];
        let mut y = vec![0f32; len];
        let mut ptrs: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr().cast()).collect();
        ptrs[0] = own.as_ptr().cast();
        let outs = [
            (x.as_mut_ptr() as usize, true),
            (y.as_mut_ptr() as usize, false),
        ];
        // SAFETY: every vector holds `len` f32; `own` is the first source exactly (in
        // place) and the further destinations overlap nothing.
        unsafe {
            reduce_fan_out(
                DType::F32,
                ReduceOp::Avg,
                &ptrs,
                (own.as_mut_ptr() as usize, true),
                &outs,
                len,
                Some(6),
            )
        };
        super::super::host::store_fence();
        for got in [&own, &x, &y] {
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "len {len}"
            );
        }
    }
}

/// Reduce `srcs` into destinations carved from one buffer at byte `phases[k]` past a
/// cache line each (the first in place, a copy of source 0 there) and compare every
/// destination with the plain reduction, bit for bit.
fn fan_out_at<T: Copy + Default + PartialEq + std::fmt::Debug>(
    dtype: DType,
    srcs: &[Vec<T>],
    phases: &[usize],
) {
    let len = srcs[0].len();
    let size = std::mem::size_of::<T>();
    let want = reduce_vec(dtype, ReduceOp::Sum, srcs, None);
    let stride = (len * size).next_multiple_of(LINE_BYTES) + LINE_BYTES;
    let mut backing = vec![0u64; (stride * phases.len() + LINE_BYTES) / 8];
    let base = (backing.as_mut_ptr() as usize).next_multiple_of(LINE_BYTES);
    let at: Vec<usize> = (0..phases.len())
        .map(|k| base + k * stride + phases[k])
        .collect();
    // SAFETY: each destination's `len` elements lie inside `backing`, apart from each
    // other (a stride each); `at[0]` is aligned for `T` (phases are multiples of it).
    unsafe { std::ptr::copy_nonoverlapping(srcs[0].as_ptr(), at[0] as *mut T, len) };
    let mut ptrs: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr().cast()).collect();
    ptrs[0] = at[0] as *const u8;
    let outs: Vec<(usize, bool)> = at[1..].iter().map(|&a| (a, true)).collect();
    // SAFETY: as above; the first destination is the first source exactly.
    unsafe {
        reduce_fan_out(dtype, ReduceOp::Sum, &ptrs, (at[0], true), &outs, len, None);
    }
    super::super::host::store_fence();
    for (k, &a) in at.iter().enumerate() {
        // SAFETY: `len` elements of `T` written above.
        let got = unsafe { slice::from_raw_parts(a as *const T, len) };
        assert_eq!(
            got,
            &want[..],
            "{dtype:?}, len {len}, phases {phases:?}, dst {k}"
        );
    }
}

/// The line loop (destinations at one phase of a cache line: a plain head, then whole
/// lines) and the block loop (phases that differ) give the plain reduction's bits, for
/// every line length (1, 2, 4 and 8-byte elements), lengths shorter than the head and
/// around blocks and lines, in place, with fewer, as many and more destinations than
/// sources.
#[test]
fn fan_out_lines_match_the_plain_reduction_at_every_phase() {
    for len in [1usize, 5, 40, BLOCK - 3, BLOCK + 1, 2 * BLOCK + 37] {
        let make = |k: usize, i: usize| ((k * 7 + i * 13) % 29) as f32 - 9.5;
        let f32s: Vec<Vec<f32>> = (0..5)
            .map(|k| (0..len).map(|i| make(k, i) * 0.1).collect())
            .collect();
        let f16s: Vec<Vec<f16>> = (0..5)
            .map(|k| (0..len).map(|i| f16::from_f32(make(k, i) * 0.3)).collect())
            .collect();
        let f64s: Vec<Vec<f64>> = (0..5)
            .map(|k| (0..len).map(|i| f64::from(make(k, i)) * 1e-3).collect())
            .collect();
        let u8s: Vec<Vec<u8>> = (0..5)
            .map(|k| (0..len).map(|i| (make(k, i) as i32 * 17) as u8).collect())
            .collect();
        let phase_sets: [&[usize]; 7] = [
            &[0, 0, 0],
            &[16, 16, 16],
            &[56, 56, 56],
            &[0, 24, 48],
            // One destination (fewer than the sources) and eight (more), whose writes
            // the sources' steps share out unevenly.
            &[0],
            &[32; 8],
            &[0, 0, 0, 0, 0],
        ];
        for phases in phase_sets {
            fan_out_at(DType::F32, &f32s, phases);
            fan_out_at(DType::F16, &f16s, phases);
            let p8: Vec<usize> = phases.iter().map(|p| p / 8 * 8).collect();
            fan_out_at(DType::F64, &f64s, &p8);
            let p1: Vec<usize> = phases.iter().map(|p| p + 3).collect();
            fan_out_at(DType::U8, &u8s, &p1);
            // Two sources: each step writes several destinations.
            fan_out_at(DType::F32, &f32s[..2], phases);
        }
    }
}

#[test]
fn min_max_and_in_place() {
    let mut a = vec![1.0f64, 5.0, -3.0];
    let b = [2.0f64, 4.0, -4.0];
    let pa = a.as_mut_ptr() as *mut u8;
    let ptrs = [pa as *const u8, b.as_ptr() as *const u8];
    // SAFETY: both hold 3 f64; the destination is the first source exactly.
    unsafe { reduce(DType::F64, ReduceOp::Max, &ptrs, pa, 3, None) };
    assert_eq!(a, vec![2.0, 5.0, -3.0]);
    let out = reduce_vec(
        DType::I64,
        ReduceOp::Min,
        &[vec![3i64, -9], vec![-1, 7]],
        None,
    );
    assert_eq!(out, vec![-1, -9]);
}
