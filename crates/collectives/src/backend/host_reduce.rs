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
/// four at a time, then the block stored to its destination; a result that goes to several
/// destinations or with streaming stores takes [`fan_out`] instead.
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
    let size = std::mem::size_of::<E>();
    let fans = !sinks.outs.is_empty() || sinks.dst.1;
    if let Some(head) = line_phase(sinks, size).filter(|_| fans) {
        let head = head.min(len);
        // SAFETY: forwarded; the line holds a whole number of elements of every type, and
        // every destination's lines start `head` elements in.
        unsafe {
            match size {
                1 => fan_out::<E, O, { LINE_BYTES }>(srcs, sinks, len, head, divisor),
                2 => fan_out::<E, O, { LINE_BYTES / 2 }>(srcs, sinks, len, head, divisor),
                4 => fan_out::<E, O, { LINE_BYTES / 4 }>(srcs, sinks, len, head, divisor),
                _ => fan_out::<E, O, { LINE_BYTES / 8 }>(srcs, sinks, len, head, divisor),
            }
        }
        return;
    }
    let Some((&first, rest)) = srcs.split_first() else {
        return;
    };
    let mut out = [E::store(E::Acc::default()); BLOCK];
    let mut acc = [E::Acc::default(); BLOCK];
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

/// Where the cache lines of every destination of `sinks` start, in elements of `size`
/// bytes from the first: the same for all of them (buffers from one allocator usually lie
/// alike), or `None` when they differ or a line boundary falls inside an element.
fn line_phase(sinks: Sinks<'_>, size: usize) -> Option<usize> {
    let phase = |to: usize| (LINE_BYTES - to % LINE_BYTES) % LINE_BYTES;
    let first = phase(sinks.dst.0);
    let same = sinks.outs.iter().all(|&(to, _)| phase(to) == first);
    (same && first.is_multiple_of(size)).then_some(first / size)
}

/// Bytes of a cache line: [`fan_out`] writes a line to each destination at a time.
const LINE_BYTES: usize = 64;

/// The loop of a result that goes to several destinations, or streams: software pipelined,
/// so that the core reads and writes main memory at once, as a copy does. The first `head`
/// elements are reduced and written plainly, so that the lines that follow start at every
/// destination's cache line ([`line_phase`]). Then block `b`'s result is computed a line
/// (`L` elements, [`LINE_BYTES`]) at a time into one of two stack buffers, and after each
/// line of it, the same line of block `b - 1`'s result (in the other buffer) is written to
/// every destination. Computing a block first and then
/// writing it everywhere alternates phases that only read and only write, which on a 2-core
/// EPYC ran at 0.6 of a copy's rate against 0.9 for this loop (`docs/MEASUREMENTS.md`).
/// Whole lines to each destination in turn keep one write-combining buffer busy per stream;
/// a vector per destination in turn leaves eight half-written lines open and ran 5x slower,
/// and so did lines that straddle two of a destination's cache lines.
///
/// # Safety
/// As [`run`], with `head <= len`. A destination equal to a source is written a block
/// behind the reads, so every element is read before it is overwritten.
#[inline(always)]
unsafe fn fan_out<E: Elem, O: BinOp, const L: usize>(
    srcs: &[*const u8],
    sinks: Sinks<'_>,
    len: usize,
    head: usize,
    divisor: Option<u32>,
) {
    let Some((&first, rest)) = srcs.split_first() else {
        return;
    };
    let size = std::mem::size_of::<E>();
    let mut bufs = [[E::store(E::Acc::default()); BLOCK]; 2];
    if head > 0 {
        let line = &mut bufs[0][..head];
        // SAFETY: `head <= len` elements of every source (the caller).
        unsafe { reduce_line::<E, O, L>(first, rest, 0, divisor, head, line) };
        for &(to, _) in std::iter::once(&sinks.dst).chain(sinks.outs) {
            // SAFETY: every destination holds `len >= head` elements that nothing else
            // touches (the caller); the line is on the stack.
            unsafe {
                std::ptr::copy_nonoverlapping(line.as_ptr().cast(), to as *mut u8, head * size);
            }
        }
    }
    // The block whose result waits in the other buffer: its first element and length.
    let mut written: Option<(usize, usize)> = None;
    let mut start = head;
    let mut flip = false;
    loop {
        let n = BLOCK.min(len - start);
        let [a, b] = &mut bufs;
        let (now, done) = if flip { (b, &*a) } else { (a, &*b) };
        let lines = n.div_ceil(L).max(written.map_or(0, |(_, w)| w.div_ceil(L)));
        for j in 0..lines {
            let lo = j * L;
            if lo + L <= n {
                // SAFETY: `start + lo + L <= len` elements of every source (the caller). The
                // length is the constant `L`, so the loops are unrolled and vectorised.
                unsafe {
                    reduce_line::<E, O, L>(first, rest, start + lo, divisor, L, &mut now[lo..]);
                }
            } else if lo < n {
                // SAFETY: as above, for the block's last, partial line.
                unsafe {
                    reduce_line::<E, O, L>(
                        first,
                        rest,
                        start + lo,
                        divisor,
                        n - lo,
                        &mut now[lo..],
                    );
                }
            }
            let Some((at, w)) = written.filter(|&(_, w)| lo < w) else {
                continue;
            };
            let line = &done[lo..(lo + L).min(w)];
            let bytes = std::mem::size_of_val(line);
            for &(to, stream) in std::iter::once(&sinks.dst).chain(sinks.outs) {
                let dst = (to + (at + lo) * size) as *mut u8;
                // SAFETY: every destination holds `len` elements that nothing else touches
                // (the caller) and `at + lo + line.len() <= len`; the line is on the stack.
                // A whole line starts on a line boundary of every destination (`head`,
                // `line_phase`). `store_fence` orders streamed stores before the lane's next
                // event.
                unsafe {
                    match (stream, bytes == LINE_BYTES) {
                        (true, true) => stream_line(line.as_ptr().cast(), dst),
                        (true, false) => {
                            super::host::stream_copy(line.as_ptr().cast(), dst, bytes);
                        }
                        (false, true) => {
                            std::ptr::copy_nonoverlapping(line.as_ptr().cast(), dst, LINE_BYTES);
                        }
                        (false, false) => {
                            std::ptr::copy_nonoverlapping(line.as_ptr().cast(), dst, bytes);
                        }
                    }
                }
            }
        }
        if n == 0 {
            return;
        }
        written = Some((start, n));
        start += n;
        flip = !flip;
    }
}

/// Write the 64 bytes at `src` to the cache line at `dst` with streaming stores (a whole line
/// then leaves the write-combining buffer at once); a plain copy on other targets.
///
/// # Safety
/// `src` holds 64 readable bytes and `dst` 64 writable ones, on a 64-byte boundary, that
/// nothing else touches, not overlapping.
#[inline(always)]
unsafe fn stream_line(src: *const u8, dst: *mut u8) {
    // SAFETY: the caller's contract (a line boundary is 16-byte aligned).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        super::host::stream_line_aligned(src, dst)
    };
    // SAFETY: the caller's contract.
    #[cfg(not(target_arch = "x86_64"))]
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, LINE_BYTES)
    };
}

/// `out[i] = op(first[at + i], rest[0][at + i], ...)` for the first `m <= L` elements of
/// `out` (one line), folded left in source order as [`body`] folds, divided by `divisor`
/// before the one rounding to `E`.
///
/// # Safety
/// Every source holds `at + m` valid, aligned elements of `E` that no thread writes during
/// the call; `m <= out.len()`.
#[inline(always)]
unsafe fn reduce_line<E: Elem, O: BinOp, const L: usize>(
    first: *const u8,
    rest: &[*const u8],
    at: usize,
    divisor: Option<u32>,
    m: usize,
    out: &mut [E],
) {
    let m = m.min(L);
    let mut acc = [E::Acc::default(); L];
    let acc = &mut acc[..m];
    // SAFETY: the caller's contract.
    let s0 = unsafe { slice::from_raw_parts((first as *const E).add(at), m) };
    for (a, s) in acc.iter_mut().zip(s0) {
        *a = s.load();
    }
    // One source at a time over a line that fits in registers: the accumulator stays in
    // them across the sources.
    for &p in rest {
        // SAFETY: as above, for another source.
        let s = unsafe { slice::from_raw_parts((p as *const E).add(at), m) };
        for (a, s) in acc.iter_mut().zip(s) {
            *a = O::apply(*a, s.load());
        }
    }
    if let Some(d) = divisor {
        for a in acc.iter_mut() {
            *a = a.div(d);
        }
    }
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = E::store(*a);
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
mod tests;
