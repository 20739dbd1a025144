//! Host reduction kernels: `dst = op(srcs...)` over raw element pointers.
//!
//! One monomorphised loop per (element type, op): the type and op are matched once per
//! command, never per element. Elements are combined block by block in a small accumulator on
//! the stack (L1-resident), up to four sources per pass (left to right, so results equal a
//! one-source-at-a-time fold bit for bit), so every inner loop is a straight elementwise loop
//! over a few slices that the compiler vectorises. Semantics per type:
//!
//! - `f32`, `f64`: IEEE arithmetic in the type itself; `min`/`max` ignore a NaN operand (as
//!   `f32::min` does);
//! - `f16`, `bf16`: each element is widened to `f32`, combined and (for `Avg`) divided in
//!   `f32`, and rounded to the storage type once per reduce command;
//! - integers: `Sum` and `Prod` wrap around on overflow (two's complement, as CUDA's integer
//!   arithmetic and NCCL do); `Avg` is refused before a plan runs, so it never reaches here.

use std::slice;

use half::{bf16, f16};
use relaycc_route::{DType, ReduceOp};

/// Elements combined per step: 4 KiB of `f32` accumulator, well inside L1.
const BLOCK: usize = 1024;

/// Arithmetic of an accumulator type.
trait Arith: Copy + Default {
    fn add(self, b: Self) -> Self;
    fn mul(self, b: Self) -> Self;
    fn min(self, b: Self) -> Self;
    fn max(self, b: Self) -> Self;
    fn div(self, n: u32) -> Self;
}

macro_rules! float_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(self, b: Self) -> Self {
                self + b
            }
            #[inline(always)]
            fn mul(self, b: Self) -> Self {
                self * b
            }
            #[inline(always)]
            fn min(self, b: Self) -> Self {
                <$t>::min(self, b)
            }
            #[inline(always)]
            fn max(self, b: Self) -> Self {
                <$t>::max(self, b)
            }
            #[inline(always)]
            fn div(self, n: u32) -> Self {
                self / (n as $t)
            }
        }
    };
}

macro_rules! int_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(self, b: Self) -> Self {
                self.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(self, b: Self) -> Self {
                self.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(self, b: Self) -> Self {
                Ord::min(self, b)
            }
            #[inline(always)]
            fn max(self, b: Self) -> Self {
                Ord::max(self, b)
            }
            #[inline(always)]
            fn div(self, _n: u32) -> Self {
                // Avg on integers is refused when the call is checked; never divide here.
                self
            }
        }
    };
}

float_arith!(f32);
float_arith!(f64);
int_arith!(i8);
int_arith!(u8);
int_arith!(i32);
int_arith!(u32);
int_arith!(i64);
int_arith!(u64);

/// A stored element type and the type it is combined in.
trait Elem: Copy {
    type Acc: Arith;
    fn load(self) -> Self::Acc;
    fn store(a: Self::Acc) -> Self;
}

macro_rules! same_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            type Acc = $t;
            #[inline(always)]
            fn load(self) -> $t {
                self
            }
            #[inline(always)]
            fn store(a: $t) -> $t {
                a
            }
        }
    )*};
}
same_elem!(f32, f64, i8, u8, i32, u32, i64, u64);

impl Elem for f16 {
    type Acc = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(a: f32) -> f16 {
        f16::from_f32(a)
    }
}

impl Elem for bf16 {
    type Acc = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(a: f32) -> bf16 {
        bf16::from_f32(a)
    }
}

/// A reduce op as a type, so that it is resolved at compile time inside the loops.
trait BinOp {
    fn apply<A: Arith>(a: A, b: A) -> A;
}
struct Sum;
struct Prod;
struct Min;
struct Max;
impl BinOp for Sum {
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.add(b)
    }
}
impl BinOp for Prod {
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.mul(b)
    }
}
impl BinOp for Min {
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.min(b)
    }
}
impl BinOp for Max {
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.max(b)
    }
}

/// `acc[i] = op(acc[i], s[0][i], s[1][i], ...)` for up to four sources at once, folding left
/// in source order (the same association as one source at a time, so float results do not
/// change); one pass over the accumulator per four sources instead of one per source.
#[inline(always)]
fn fold<E: Elem, O: BinOp>(acc: &mut [E::Acc], s: &[&[E]]) {
    let n = acc.len();
    match *s {
        [a] => {
            for (x, a) in acc.iter_mut().zip(&a[..n]) {
                *x = O::apply(*x, a.load());
            }
        }
        [a, b] => {
            let (a, b) = (&a[..n], &b[..n]);
            for i in 0..n {
                acc[i] = O::apply(O::apply(acc[i], a[i].load()), b[i].load());
            }
        }
        [a, b, c] => {
            let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
            for i in 0..n {
                let x = O::apply(O::apply(acc[i], a[i].load()), b[i].load());
                acc[i] = O::apply(x, c[i].load());
            }
        }
        [a, b, c, d, ..] => {
            let (a, b, c, d) = (&a[..n], &b[..n], &c[..n], &d[..n]);
            for i in 0..n {
                let x = O::apply(O::apply(acc[i], a[i].load()), b[i].load());
                acc[i] = O::apply(O::apply(x, c[i].load()), d[i].load());
            }
        }
        [] => {}
    }
}

/// Where a reduction's result goes: its destination (address, streamed) and further
/// destinations that receive the same bytes.
#[derive(Clone, Copy)]
struct Sinks<'a> {
    dst: (usize, bool),
    outs: &'a [(usize, bool)],
}

/// The typed loop, dispatched to a build for AVX2 where the CPU has it (the loops are
/// elementwise, so every build gives the same bits).
///
/// # Safety
/// As [`reduce`], with `E` the element type the pointers point to, and for every further
/// destination as [`reduce_fan_out`].
unsafe fn run<E: Elem, O: BinOp>(
    srcs: &[*const u8],
    sinks: Sinks<'_>,
    len: usize,
    divisor: Option<u32>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (just checked); the rest is the caller's contract.
        unsafe { run_avx2::<E, O>(srcs, sinks, len, divisor) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { body::<E, O>(srcs, sinks, len, divisor) };
}

/// [`body`] compiled for AVX2: 32-byte vectors, twice SSE2's.
///
/// # Safety
/// As [`run`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_avx2<E: Elem, O: BinOp>(
    srcs: &[*const u8],
    sinks: Sinks<'_>,
    len: usize,
    divisor: Option<u32>,
) {
    // SAFETY: forwarded.
    unsafe { body::<E, O>(srcs, sinks, len, divisor) };
}

/// The loop: block by block, the first source into the accumulator, the others folded in
/// four at a time, then the block stored to every destination.
///
/// # Safety
/// As [`run`].
#[inline(always)]
unsafe fn body<E: Elem, O: BinOp>(
    srcs: &[*const u8],
    sinks: Sinks<'_>,
    len: usize,
    divisor: Option<u32>,
) {
    let Some((&first, rest)) = srcs.split_first() else {
        return;
    };
    let mut acc = [E::Acc::default(); BLOCK];
    let mut out = [E::store(E::Acc::default()); BLOCK];
    let size = std::mem::size_of::<E>();
    let mut start = 0;
    while start < len {
        let n = BLOCK.min(len - start);
        let acc = &mut acc[..n];
        // SAFETY: the caller guarantees `len` valid, aligned elements at each source and no
        // concurrent writer; `start + n <= len`. The shared slice ends before `dst` is
        // borrowed mutably below, so an aliasing destination is never borrowed twice.
        let s0 = unsafe { slice::from_raw_parts((first as *const E).add(start), n) };
        for (a, s) in acc.iter_mut().zip(s0) {
            *a = s.load();
        }
        for group in rest.chunks(4) {
            let mut four: [&[E]; 4] = [&[]; 4];
            for (slot, &p) in four.iter_mut().zip(group) {
                // SAFETY: as above, for another source.
                *slot = unsafe { slice::from_raw_parts((p as *const E).add(start), n) };
            }
            fold::<E, O>(acc, &four[..group.len()]);
        }
        if let Some(d) = divisor {
            for a in acc.iter_mut() {
                *a = a.div(d);
            }
        }
        let (dst, stream) = sinks.dst;
        if sinks.outs.is_empty() && !stream {
            // SAFETY: the caller guarantees `len` valid, aligned elements at `dst` that no
            // other thread touches; every source slice of this block is dead by now.
            let d = unsafe { slice::from_raw_parts_mut((dst as *mut E).add(start), n) };
            for (d, a) in d.iter_mut().zip(acc.iter()) {
                *d = E::store(*a);
            }
        } else {
            for (o, a) in out.iter_mut().zip(acc.iter()) {
                *o = E::store(*a);
            }
            let block = out.as_ptr().cast::<u8>();
            for &(to, stream) in std::iter::once(&sinks.dst).chain(sinks.outs) {
                let at = (to + start * size) as *mut u8;
                // SAFETY: every destination holds `len` elements that nothing else touches
                // (the caller), apart from the local block; `store_fence` orders streamed
                // stores before the lane's next event.
                unsafe {
                    if stream {
                        super::host::stream_copy(block, at, n * size);
                    } else {
                        std::ptr::copy_nonoverlapping(block, at, n * size);
                    }
                }
            }
        }
        start += n;
    }
}

/// `dst = op(srcs...)` over `len` elements of `dtype`; with `divisor`, divide the result.
///
/// # Safety
/// Every pointer is aligned for `dtype` and points to `len` elements inside one live
/// allocation; no other thread writes those elements during the call; `dst` either equals a
/// source pointer or overlaps none of them.
pub(crate) unsafe fn reduce(
    dtype: DType,
    op: ReduceOp,
    srcs: &[*const u8],
    dst: *mut u8,
    len: usize,
    divisor: Option<u32>,
) {
    let sinks = Sinks {
        dst: (dst as usize, false),
        outs: &[],
    };
    // SAFETY: forwarded from this function's contract.
    unsafe { dispatch(dtype, op, srcs, sinks, len, divisor) };
}

/// [`reduce`] whose result also goes to every destination of `outs`, block by block while
/// the block is in the L1 cache; `dst.1` and each `outs[k].1` ask for streaming stores
/// (ordered by the caller's `sfence` before another thread reads them).
///
/// # Safety
/// As [`reduce`] for the sources and `dst.0`; every `outs[k].0` holds `len` writable
/// elements of `dtype` that no other thread touches during the call and that overlap no
/// source, `dst.0`, or another destination.
pub(crate) unsafe fn reduce_fan_out(
    dtype: DType,
    op: ReduceOp,
    srcs: &[*const u8],
    dst: (usize, bool),
    outs: &[(usize, bool)],
    len: usize,
    divisor: Option<u32>,
) {
    // SAFETY: forwarded from this function's contract.
    unsafe { dispatch(dtype, op, srcs, Sinks { dst, outs }, len, divisor) };
}

/// The typed loop of `dtype` and `op`.
///
/// # Safety
/// As [`run`].
unsafe fn dispatch(
    dtype: DType,
    op: ReduceOp,
    srcs: &[*const u8],
    sinks: Sinks<'_>,
    len: usize,
    divisor: Option<u32>,
) {
    macro_rules! by_op {
        ($t:ty) => {
            // SAFETY: forwarded from this function's contract, with the matching type.
            unsafe {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => run::<$t, Sum>(srcs, sinks, len, divisor),
                    ReduceOp::Prod => run::<$t, Prod>(srcs, sinks, len, divisor),
                    ReduceOp::Min => run::<$t, Min>(srcs, sinks, len, divisor),
                    ReduceOp::Max => run::<$t, Max>(srcs, sinks, len, divisor),
                }
            }
        };
    }
    match dtype {
        DType::F32 => by_op!(f32),
        DType::F64 => by_op!(f64),
        DType::F16 => by_op!(f16),
        DType::Bf16 => by_op!(bf16),
        DType::I8 => by_op!(i8),
        DType::U8 => by_op!(u8),
        DType::I32 => by_op!(i32),
        DType::U32 => by_op!(u32),
        DType::I64 => by_op!(i64),
        DType::U64 => by_op!(u64),
    }
}

#[cfg(test)]
mod tests {
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
}
