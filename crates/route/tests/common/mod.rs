//! What the route test binaries share: requests with irregular layouts.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use relaycc_route::{Collective, DType, ReduceOp, Request, Transfer};

/// A request of collective `c` over `gpus` with `count` elements, `dtype` and `op` (for the
/// reducing collectives), rooted at `root`; the irregular layouts (per-rank counts, the
/// all_to_all_v matrix, point-to-point transfers) are derived from `count` with some zeros.
pub fn request(
    c: Collective,
    gpus: Vec<u32>,
    count: u64,
    dtype: DType,
    op: ReduceOp,
    root: u32,
) -> Request {
    let n = gpus.len();
    let mut r = Request::new(c, gpus, count, dtype).with_root(root);
    if c.reduces() {
        r = r.with_op(op);
    }
    let mix = |i: usize, j: usize| (count + (i * 7 + j * 3) as u64) % (count + 3);
    r.counts = (0..n)
        .map(|i| if i % 3 == 1 { 0 } else { mix(i, 0) })
        .collect();
    r.matrix = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if (i + j) % 4 == 3 { 0 } else { mix(i, j) })
                .collect()
        })
        .collect();
    r.transfers = (0..n)
        .map(|i| Transfer {
            src: i as u32,
            dst: ((i + 1) % n) as u32,
            count: mix(i, 1),
        })
        .collect();
    r
}
