//! The one sizing rule of the planning and bench commands: which sizes a `-b`/`-e`/`-f` series
//! names, how many elements a size in bytes holds, and the element count of a collective of
//! that size on `n` ranks, as nccl-tests counts it.
//!
//! nccl-tests' size is one rank's larger buffer: the whole buffer of all_reduce, broadcast,
//! reduce and send_recv, so their count is the size's elements; for the gathers, scatters,
//! reduce_scatter and the all-to-alls it is every rank's block together, so their count (one
//! rank's block) is the size's elements divided by the ranks. `plan`, `simulate`, `advise` and
//! every `bench` driver take their counts from [`element_count`].

use anyhow::Result;
use relaycc_route::{Collective, DType, ReduceOp, Request, Transfer};

use crate::args::usage;

/// Elements of `dtype` in `size_bytes`; a size that is no whole number of elements is a usage
/// error rather than silently rounded down.
pub fn whole_elements(size_bytes: u64, dtype: DType) -> Result<u64> {
    let esize = dtype.size();
    if !size_bytes.is_multiple_of(esize) {
        return Err(usage(format!(
            "size {size_bytes} bytes is not a whole number of {dtype} elements ({esize} bytes each)"
        )));
    }
    Ok(size_bytes / esize)
}

/// The element count of a collective `c` of `size_bytes` on `ranks` ranks, as nccl-tests
/// counts it: the size's elements, or one rank's block of them for the gathers, scatters,
/// reduce_scatter and all-to-alls. A size that is no whole number of elements is a usage
/// error.
pub fn element_count(c: Collective, dtype: DType, size_bytes: u64, ranks: u64) -> Result<u64> {
    let elems = whole_elements(size_bytes, dtype)?;
    Ok(match c {
        Collective::AllGather
        | Collective::AllGatherV
        | Collective::ReduceScatter
        | Collective::ReduceScatterV
        | Collective::AllToAll
        | Collective::AllToAllV
        | Collective::Gather
        | Collective::Scatter => elems / ranks.max(1),
        Collective::AllReduce
        | Collective::Broadcast
        | Collective::Reduce
        | Collective::SendRecv => elems,
    })
}

/// The request a bench times at `size_bytes` on the ranks `devices`: [`element_count`]
/// elements per rank, every rank's block of the `v` collectives equal, and send_recv a ring
/// (rank `s` sends to `s + 1`).
pub fn bench_request(
    devices: &[u32],
    (c, dtype, op, root): (Collective, DType, ReduceOp, u32),
    size_bytes: u64,
) -> Result<Request> {
    let n = devices.len();
    let count = element_count(c, dtype, size_bytes, n as u64)?;
    let mut r = Request::new(c, devices.to_vec(), count, dtype)
        .with_op(op)
        .with_root(root);
    match c {
        Collective::AllGatherV | Collective::ReduceScatterV => r.counts = vec![count; n],
        Collective::AllToAllV => r.matrix = vec![vec![count; n]; n],
        Collective::SendRecv => {
            let n = n as u32;
            r.transfers = (0..n)
                .map(|s| Transfer {
                    src: s,
                    dst: (s + 1) % n,
                    count,
                })
                .collect();
        }
        _ => {}
    }
    Ok(r)
}

/// The sizes `-b min -e max -f factor` name, as nccl-tests steps them: `min`, `min * factor`,
/// ... up to `max`, at most [`MAX_SIZE_STEPS`] of them. A usage error when `min` is 0, when
/// `min > max`, or when `factor < 2` and the two differ.
pub fn size_series(min: u64, max: u64, factor: u64) -> Result<Vec<u64>> {
    if min == 0 {
        return Err(usage("-b must be at least 1 byte"));
    }
    if min > max {
        return Err(usage(format!("-b {min} is larger than -e {max}")));
    }
    if factor < 2 && min != max {
        return Err(usage("-f must be at least 2"));
    }
    let mut v = vec![min];
    while let Some(&last) = v.last() {
        match last.checked_mul(factor) {
            Some(next) if next <= max && next > last && v.len() < MAX_SIZE_STEPS => v.push(next),
            _ => break,
        }
    }
    Ok(v)
}

/// The most sizes one series holds: 64 doublings pass `u64::MAX`, so only a factor below 2
/// (refused) could ask for more.
pub const MAX_SIZE_STEPS: usize = 64;

/// The sizes a bench times, `-b` to `-e` multiplying by `-f`, each a whole number of `dtype`
/// elements; anything else is a usage error.
pub fn bench_sizes(min: u64, max: u64, factor: u64, dtype: DType) -> Result<Vec<u64>> {
    let sizes = size_series(min, max, factor)?;
    for &s in &sizes {
        whole_elements(s, dtype)?;
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_series_steps_as_nccl_tests_and_refuses_what_it_cannot_step() {
        assert_eq!(
            size_series(1024, 8192, 2).unwrap(),
            [1024, 2048, 4096, 8192]
        );
        assert_eq!(size_series(1000, 5000, 4).unwrap(), [1000, 4000]);
        assert_eq!(size_series(64, 64, 1).unwrap(), [64]);
        assert_eq!(size_series(1, u64::MAX, 2).unwrap().len(), MAX_SIZE_STEPS);
        for (b, e, f) in [(0, 8, 2), (16, 8, 2), (8, 16, 1)] {
            let err = size_series(b, e, f).unwrap_err();
            assert!(
                err.downcast_ref::<crate::args::UsageError>().is_some(),
                "{b} {e} {f}: {err}"
            );
        }
    }

    /// The count is the size's elements for whole-buffer collectives and one rank's block for
    /// the others; either way the request's nccl-tests size is the size asked for.
    #[test]
    fn every_collective_is_sized_so_its_request_is_the_size_asked_for() {
        let ranks = [0, 1, 2, 3];
        for c in Collective::ALL {
            let count = element_count(c, DType::F32, 4096, 4).unwrap();
            let blocks = !matches!(
                c,
                Collective::AllReduce
                    | Collective::Broadcast
                    | Collective::Reduce
                    | Collective::SendRecv
            );
            assert_eq!(count, if blocks { 256 } else { 1024 }, "{c}");
            let req = bench_request(&ranks, (c, DType::F32, ReduceOp::Sum, 0), 4096).unwrap();
            assert_eq!(req.count, count, "{c}");
            assert_eq!(req.size_bytes(), 4096, "{c}");
        }
        let err = element_count(Collective::AllReduce, DType::F64, 12, 2).unwrap_err();
        assert!(err.downcast_ref::<crate::args::UsageError>().is_some());
    }
}
