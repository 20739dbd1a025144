//! Fixtures shared by the integration tests: element helpers, inputs and the naive reference.

#![allow(dead_code)]

use relaycc_collectives::{Element, ReduceOp, bf16, f16};
use relaycc_route::Request;

/// What tests need of an element type beyond [`Element`] (whose `from_i64` and `to_f64`
/// make inputs and compare results).
pub trait TestElem: Element + PartialOrd {
    /// `sum / n` computed as the host backend does (in f32 for f32/f16/bf16, f64 for f64).
    fn avg(sum: i64, n: usize) -> Self;
    /// True for floating types.
    const FLOAT: bool;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(impl TestElem for $t {
        fn avg(sum: i64, _n: usize) -> Self { sum as $t }
        const FLOAT: bool = false;
    })*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

impl TestElem for f32 {
    fn avg(sum: i64, n: usize) -> Self {
        sum as f32 / n as f32
    }
    const FLOAT: bool = true;
}
impl TestElem for f64 {
    fn avg(sum: i64, n: usize) -> Self {
        sum as f64 / n as f64
    }
    const FLOAT: bool = true;
}
impl TestElem for f16 {
    fn avg(sum: i64, n: usize) -> Self {
        f16::from_f32(sum as f32 / n as f32)
    }
    const FLOAT: bool = true;
}
impl TestElem for bf16 {
    fn avg(sum: i64, n: usize) -> Self {
        bf16::from_f32(sum as f32 / n as f32)
    }
    const FLOAT: bool = true;
}

/// Input element `i` of rank `r`.
///
/// Floats get integers small enough that every reduction is exact in every order and type:
/// sums of at most 16 ranks of values in -8..=8 stay within +-128 (bf16 holds integers
/// exactly up to 256, f16 up to 2048); products use +-1 and +-2 on at most 8 ranks (|p| <=
/// 256). Integers get any values: their sums and products wrap, which is order-independent.
pub fn input<T: TestElem>(op: ReduceOp, seed: u64, r: u32, i: u64) -> i64 {
    let h = (seed ^ (u64::from(r) << 32) ^ i)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(29);
    if !T::FLOAT {
        return ((h >> 3) % 2001) as i64 - 1000;
    }
    match op {
        ReduceOp::Prod => {
            let mag = if r < 8 && h & 2 == 0 { 2 } else { 1 };
            if h & 1 == 0 { mag } else { -mag }
        }
        _ => (h % 17) as i64 - 8,
    }
}

/// The reference value of one output element combining `terms` (each an input value).
pub fn reference<T: TestElem>(reduces: bool, op: ReduceOp, n: usize, vals: &[i64]) -> T {
    if !reduces {
        return T::from_i64(vals[0]);
    }
    match op {
        ReduceOp::Sum => T::from_i64(vals.iter().fold(0i64, |a, b| a.wrapping_add(*b))),
        ReduceOp::Prod => T::from_i64(vals.iter().fold(1i64, |a, b| a.wrapping_mul(*b))),
        ReduceOp::Avg => T::avg(vals.iter().sum(), n),
        ReduceOp::Min | ReduceOp::Max => {
            // Compare in the element type's own order (u8 255 is the largest u8).
            let mut best = T::from_i64(vals[0]);
            for v in &vals[1..] {
                let x = T::from_i64(*v);
                let better = if op == ReduceOp::Min {
                    x < best
                } else {
                    x > best
                };
                if better {
                    best = x;
                }
            }
            best
        }
    }
}

/// Compare every output element a request defines; `outs[r]` is rank r's output contents.
pub fn verify<T: TestElem>(req: &Request, seed: u64, outs: &[Vec<T>]) -> Result<(), String> {
    let reduces = req.collective.reduces();
    let n = req.nranks();
    for p in req.expected().map_err(|e| e.to_string())? {
        for i in 0..p.len {
            let vals: Vec<i64> = p
                .terms
                .iter()
                .map(|(r, off)| input::<T>(req.op, seed, *r, off + i))
                .collect();
            let want: T = reference(reduces, req.op, n, &vals);
            let got = outs[p.rank as usize][(p.out_offset + i) as usize];
            let same = if T::FLOAT {
                got.to_f64() == want.to_f64()
            } else {
                got == want
            };
            if !same {
                return Err(format!(
                    "{} rank {} element {}: got {got:?}, want {want:?}",
                    req.collective,
                    p.rank,
                    p.out_offset + i
                ));
            }
        }
    }
    Ok(())
}
