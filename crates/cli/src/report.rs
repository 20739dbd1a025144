//! Shared pieces of the planning commands: building requests, printing figures.

use anyhow::{Result, bail};
use relaycc_route::{Collective, Request, sim::Perf};
use serde_json::{Value, json};

use crate::args::CollectiveArgs;

/// A `{time_us, algbw_gbps, busbw_gbps}` object.
pub fn perf_json(p: &Perf) -> Value {
    json!({ "time_us": p.time_us, "algbw_gbps": p.algbw_gbps, "busbw_gbps": p.busbw_gbps })
}

/// The request for `args` at `size_bytes` (nccl-tests' size: one rank's larger buffer).
/// Variable-size collectives get a deterministic irregular pattern of that total.
pub fn request(args: &CollectiveArgs, gpus: &[u32], size_bytes: u64) -> Result<Request> {
    let n = gpus.len() as u64;
    if n == 0 {
        bail!("no GPUs given");
    }
    let esize = args.request_dtype().size();
    let elems = size_bytes / esize;
    // nccl-tests sizes all_gather/all_to_all/gather by the whole output, others by one buffer.
    let count = match args.collective {
        Collective::AllGather
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter
        | Collective::ReduceScatter => elems / n,
        _ => elems,
    };
    let mut r = Request::new(args.collective, gpus.to_vec(), count, args.dtype)
        .with_op(args.op)
        .with_root(args.root);
    match args.collective {
        Collective::AllGatherV => {
            // Irregular blocks summing to about `elems`: rank k gets a share growing with k.
            let weights: u64 = (1..=n).sum();
            r.counts = (1..=n).map(|k| elems * k / weights).collect();
        }
        Collective::AllToAllV => {
            let per = elems / n.max(1);
            r.matrix = (0..n)
                .map(|s| (0..n).map(|d| per * ((s + d) % 3) / 2).collect())
                .collect();
        }
        Collective::SendRecv => bail!("use `relaycc route` for point-to-point copies"),
        _ => {}
    }
    r.validate()?;
    Ok(r)
}

impl CollectiveArgs {
    /// The element type.
    pub fn request_dtype(&self) -> relaycc_route::DType {
        self.dtype
    }
}

/// The job's GPUs: as given, or every GPU the mask leaves free.
pub fn job_gpus(args: &CollectiveArgs, topo: &relaycc_topo::Topology) -> Vec<u32> {
    if args.gpus.is_empty() {
        (0..topo.gpu_count())
            .filter(|g| topo.gpu_free(*g))
            .collect()
    } else {
        args.gpus.clone()
    }
}

/// Ratio `a / b`, or 0 when `b` is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}
