//! A data-parallel training step on GPUs (feature `cuda`), one thread per GPU, each rank's
//! gradients averaged on the caller's CUDA stream:
//!
//! ```text
//! cargo run --release --example gpu_dp_step -- [gpus, e.g. 0,1,2,3] [parameters] [steps]
//! ```
//!
//! `RankComm::cuda` makes one rank per GPU on the machine's topology (NVML); each rank's
//! thread makes a stream on its device (`RankComm::cuda_device`), and each step uploads the
//! rank's gradient (its data shard's, as a backward pass leaves it in device memory), averages
//! it with `all_reduce_in_place(.., Avg)` through `RankComm::on(&stream)`, and reads it back
//! on the same stream for the optimizer: the read is ordered after the collective without any
//! host synchronization in between, as a kernel enqueued there would be. The step is written
//! against the `Collectives` trait, so the same function runs on threads with host slices
//! (`examples/dp_step.rs`) and under MPI (`examples/mpi_dp_step.rs`).
//!
//! On a machine without a GPU or driver it prints the error and exits with status 1.

use std::sync::Arc;
use std::time::Instant;

use relaycc::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use relaycc::{RankComm, collectives::cuda};

mod dp_common;
use dp_common::{apply, average_gradients, local_gradient};

/// What a rank reports: its weights' checksum and its seconds in the collective.
type RankResult = Result<(f64, f64), Box<dyn std::error::Error + Send + Sync>>;

fn rank_main(mut rank: RankComm, params: usize, steps: usize) -> RankResult {
    let ordinal = rank
        .cuda_device()
        .ok_or("RankComm::cuda made a rank without a CUDA device")?;
    let stream: Arc<CudaStream> = CudaContext::new(ordinal)?.new_stream()?;
    let lr = 0.1f32;
    let mut weights = vec![1.0f32; params];
    let mut host_grads = vec![0.0f32; params];
    let mut grads: CudaSlice<f32> = stream.alloc_zeros(params)?;
    let mut comm_secs = 0.0;
    for step in 0..steps {
        local_gradient(&weights, rank.rank(), step, &mut host_grads);
        stream.memcpy_htod(&host_grads, &mut grads)?;
        let t = Instant::now();
        average_gradients(&mut rank.on(&stream), &mut grads)?;
        comm_secs += t.elapsed().as_secs_f64();
        // Ordered after the collective on the same stream: it reads the average. The
        // optimizer runs on the host here, so the stream is synchronized before it reads.
        stream.memcpy_dtoh(&grads, &mut host_grads)?;
        stream.synchronize()?;
        apply(&mut weights, &host_grads, lr);
    }
    Ok((weights.iter().map(|&w| f64::from(w)).sum(), comm_secs))
}

/// The GPUs to run on: the first argument (`0,1,2,3`), else every visible device.
fn gpus(arg: Option<String>) -> Result<Vec<usize>, Box<dyn std::error::Error>> {
    match arg {
        Some(list) => Ok(list
            .split(',')
            .map(|g| g.trim().parse::<usize>())
            .collect::<Result<_, _>>()?),
        None => Ok((0..cuda::devices()?.len()).collect()),
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let gpus = gpus(args.next())?;
    let params: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1 << 22);
    let steps: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    let ranks = RankComm::cuda(&gpus)?;
    let n = ranks.len();
    let topology = ranks[0].communicator().topology().name().to_owned();
    let results: Vec<RankResult> = std::thread::scope(|s| {
        let threads: Vec<_> = ranks
            .into_iter()
            .map(|rank| s.spawn(move || rank_main(rank, params, steps)))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a rank thread panicked".into()))
            })
            .collect()
    });
    let mut sums = Vec::with_capacity(n);
    let mut secs: f64 = 0.0;
    for (r, res) in results.into_iter().enumerate() {
        let (sum, s) = res.map_err(|e| format!("rank {r}: {e}"))?;
        sums.push(sum);
        secs = secs.max(s);
    }
    if sums.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!("replicas diverged: {sums:?}").into());
    }
    let bytes = (params * 4 * steps) as f64;
    println!(
        "{n} GPU ranks {gpus:?} on {topology}, {params} parameters, {steps} steps: replicas \
         agree (checksum {:.3}); all_reduce {:.3} ms/step, {:.2} GB/s algbw",
        sums[0],
        secs * 1e3 / steps as f64,
        bytes / secs / 1e9
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("gpu_dp_step: {e}");
        std::process::exit(1);
    }
}
