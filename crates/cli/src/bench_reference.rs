//! `relaycc bench --check`'s reference: the inputs every rank is filled with, and the
//! expected output computed in the element type, as the executor computes it.
//!
//! Every rank's input element `i` is a small integer ([`value`], in -3..=3) converted to the
//! element type, so for an unsigned type -3 is its largest values less two (253 for `u8`).
//! The reference converts each term to the element type first and then combines the terms
//! with the element type's own arithmetic and order ([`RefElement::combine`]): integer sums
//! and products wrap, `min` and `max` compare unsigned values as unsigned, floats combine in
//! IEEE arithmetic (`f16` and `bf16` through `f32`, rounded back each step). With these
//! inputs every partial result is an integer that every type holds exactly, so the order of
//! the terms does not matter and the comparison is exact, except for `avg`, whose quotient
//! is compared within a relative 1e-2.

use std::collections::HashMap;

use anyhow::Result;
use relaycc_collectives::{Element, bf16, f16};
use relaycc_route::{ReduceOp, Request};

/// The input value of element `i` of rank `r`: in -3..=3.
pub(crate) fn value(r: u32, i: u64) -> i64 {
    ((u64::from(r) * 3 + i) % 7) as i64 - 3
}

/// An element type's reduction arithmetic, as the host backend's reduction loops apply it.
pub(crate) trait RefElement: Element {
    /// `a op b` in this type: wrapping for integer sums and products, the type's own order
    /// for `min` and `max`; `avg` combines as `sum` (the division comes last).
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
}

macro_rules! int_ref {
    ($($t:ty),*) => {$(
        impl RefElement for $t {
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
        }
    )*};
}
int_ref!(i8, u8, i32, u32, i64, u64);

/// Floating types combine in `$w` and round back to `$t` with `$back`.
macro_rules! float_ref {
    ($t:ty, $w:ty, $to:expr, $back:expr) => {
        impl RefElement for $t {
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y): ($w, $w) = ($to(a), $to(b));
                $back(match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    ReduceOp::Prod => x * y,
                    ReduceOp::Min => x.min(y),
                    ReduceOp::Max => x.max(y),
                })
            }
        }
    };
}
float_ref!(f32, f32, |v| v, |v| v);
float_ref!(f64, f64, |v| v, |v| v);
float_ref!(f16, f32, f32::from, f16::from_f32);
float_ref!(bf16, f32, f32::from, bf16::from_f32);

/// The expected value of one output element whose terms are the inputs `terms` (each
/// `(rank, element)`): the first term for data movement, else the terms combined in `T`.
fn expected<T: RefElement>(req: &Request, terms: &[(u32, u64)], i: u64) -> T {
    let mut vals = terms.iter().map(|&(r, off)| T::from_i64(value(r, off + i)));
    let Some(first) = vals.next() else {
        return T::from_i64(0);
    };
    if !req.collective.reduces() {
        return first;
    }
    vals.fold(first, |acc, v| T::combine(req.op, acc, v))
}

/// What a piece's expected values depend on: its terms and its length.
type PieceKey<'a> = (&'a [(u32, u64)], u64);

/// Output elements of every rank's output `outs[r]` that differ from the expected result.
///
/// Pieces that combine the same terms (every rank's output of an all_reduce) share one
/// computed reference, so checking n ranks costs n comparisons per element, not n^2 terms.
pub(crate) fn count_wrong_in<T: RefElement>(req: &Request, outs: &[Vec<T>]) -> Result<u64> {
    let n = req.nranks() as f64;
    let avg = req.collective.reduces() && req.op == ReduceOp::Avg;
    let pieces = req.expected()?;
    let mut known: HashMap<PieceKey<'_>, Vec<T>> = HashMap::new();
    let mut wrong = 0;
    for p in &pieces {
        let want = known.entry((&p.terms, p.len)).or_insert_with(|| {
            (0..p.len)
                .map(|i| expected::<T>(req, &p.terms, i))
                .collect()
        });
        let out = outs
            .get(p.rank as usize)
            .ok_or_else(|| anyhow::anyhow!("no output of rank {}", p.rank))?;
        for (i, w) in want.iter().enumerate() {
            let at = (p.out_offset + i as u64) as usize;
            let got = *out
                .get(at)
                .ok_or_else(|| anyhow::anyhow!("rank {}'s output has no element {at}", p.rank))?;
            let ok = if avg {
                let w = w.to_f64() / n;
                (got.to_f64() - w).abs() <= 1e-2 * w.abs().max(1.0)
            } else {
                got == *w
            };
            if !ok {
                wrong += 1;
            }
        }
    }
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_route::{Collective, DType};

    /// Unsigned types order -3 (converted: near the top of the type) above 0: the minimum of
    /// a u8 all_reduce of {253, 0} is 0, which a signed comparison calls wrong.
    #[test]
    fn unsigned_min_and_max_compare_in_the_element_type() {
        // Rank 0's element 0 is -3, rank 1's is 0.
        assert_eq!((value(0, 0), value(1, 0)), (-3, 0));
        for (op, want) in [(ReduceOp::Min, 0u8), (ReduceOp::Max, 253)] {
            let req = Request::new(Collective::AllReduce, vec![0, 1], 1, DType::U8).with_op(op);
            assert_eq!(expected::<u8>(&req, &[(0, 0), (1, 0)], 0), want, "{op:?}");
            let right = vec![vec![want]; 2];
            assert_eq!(count_wrong_in(&req, &right).unwrap(), 0, "{op:?}");
            let wrong = vec![vec![want.wrapping_add(1)]; 2];
            assert_eq!(count_wrong_in(&req, &wrong).unwrap(), 2, "{op:?}");
        }
        let req =
            Request::new(Collective::AllReduce, vec![0, 1], 1, DType::U64).with_op(ReduceOp::Max);
        assert_eq!(
            expected::<u64>(&req, &[(0, 0), (1, 0)], 0),
            u64::MAX - 2,
            "-3 as u64 is the larger"
        );
    }

    /// Integer sums and products wrap in the type: 100 + 100 in i8 is -56.
    #[test]
    fn integer_arithmetic_wraps_in_the_type() {
        assert_eq!(i8::combine(ReduceOp::Sum, 100, 100), -56);
        assert_eq!(u8::combine(ReduceOp::Prod, 16, 17), 16);
        assert_eq!(
            bf16::combine(ReduceOp::Sum, bf16::from_f32(2.0), bf16::from_f32(3.0)),
            bf16::from_f32(5.0)
        );
    }

    /// Every element type with every op it takes, for every reducing collective: the bench's
    /// own run on the host backend (the executor's reduction loops) and its reference agree
    /// on every element.
    #[test]
    fn the_reference_matches_the_executor_for_every_type_and_op() {
        use clap::Parser;
        let types = [
            "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64",
        ];
        let ops = ["sum", "prod", "min", "max", "avg"];
        let mut failures = Vec::new();
        for coll in ["all_reduce", "reduce", "reduce_scatter"] {
            for dtype in types {
                for op in ops {
                    if op == "avg" && !dtype.starts_with(['f', 'b']) {
                        continue;
                    }
                    let line = format!(
                        "relaycc bench {coll} --backend host --ranks 4 -d {dtype} -o {op} \
                         -b 64 -e 64 -n 1 -w 0 --check --format json"
                    );
                    let cli = crate::args::Cli::try_parse_from(line.split_whitespace())
                        .unwrap_or_else(|e| panic!("{line}: {e}"));
                    let crate::args::Command::Bench(args) = &cli.command else {
                        panic!("{line}: not a bench command");
                    };
                    let mut out = Vec::new();
                    crate::bench_cmd::run(args, &mut out).unwrap_or_else(|e| panic!("{line}: {e}"));
                    let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
                    let wrong = &v["results"][0]["wrong"];
                    if wrong.as_u64() != Some(0) {
                        failures.push(format!("{coll} {dtype} {op}: {wrong} wrong"));
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}
