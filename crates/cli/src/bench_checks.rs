//! `relaycc bench`'s check before anything is allocated: whether its largest size fits in
//! host and device memory.

use anyhow::Result;
use relaycc_collectives::Communicator;

use crate::args::{BackendKind, BenchArgs};
use crate::size::format_size;

/// Refuses a largest size whose buffers do not fit: on the host, in the memory this process
/// may still take ([`crate::resources::host_available_bytes`]); on CUDA, in each device's
/// memory. Counted: every rank's input and output, the two copy buffers of the memcpy
/// reference, and in host memory the vector that fills one buffer and, with `--check`, the
/// copies of every output read back. Plan staging is not known yet; if it does not fit, its
/// allocation fails with an error.
pub fn check_memory(
    comm: &Communicator,
    args: &BenchArgs,
    ordinals: &[usize],
    max: u64,
) -> Result<()> {
    let dtype = args.element.dtype;
    let how = (args.collective, dtype, args.element.op, args.root);
    let req = crate::sizing::bench_request(comm.devices(), how, max)?;
    let copy = req.size_bytes().saturating_mul(2);
    let mut per_rank = Vec::with_capacity(comm.ranks());
    let mut largest = 0u64;
    let mut read_back = 0u64;
    for r in 0..comm.ranks() as u32 {
        let (i, o) = (req.input_len(r)?, req.output_len(r)?);
        largest = largest.max(i.max(o).saturating_mul(dtype.size()));
        if args.check {
            // `--check` copies every output back into host memory at once.
            read_back = read_back.saturating_add(o.saturating_mul(dtype.size()));
        }
        per_rank.push(
            i.saturating_add(o)
                .saturating_mul(dtype.size())
                .saturating_add(copy),
        );
    }
    let what = |need: u64, place: &str, have: u64| {
        anyhow::anyhow!(
            "-e {} on {} rank(s) needs {} of {place} for inputs, outputs and copy buffers; {} is available",
            format_size(max),
            comm.ranks(),
            format_size(need),
            format_size(have)
        )
    };
    // Host memory holds the fill vector and read-back copies on every backend, and the buffers
    // themselves on the host backend.
    let mut host_need = largest.saturating_add(read_back);
    if args.backend == BackendKind::Host {
        host_need = per_rank.iter().fold(host_need, |a, &b| a.saturating_add(b));
    }
    if let Some(have) = crate::resources::host_available_bytes()
        && host_need > have
    {
        return Err(what(host_need, "host memory", have));
    }
    if args.backend == BackendKind::Cuda {
        let visible = crate::bench_cuda::device_memory_bytes()?;
        for (d, &total) in visible.iter().enumerate() {
            let need = ordinals
                .iter()
                .zip(&per_rank)
                .filter(|(o, _)| **o == d)
                .fold(0u64, |a, (_, &b)| a.saturating_add(b));
            if need > total {
                return Err(what(need, &format!("CUDA device {d} memory"), total));
            }
        }
    }
    Ok(())
}
