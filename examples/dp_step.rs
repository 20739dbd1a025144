//! A data-parallel training step as an engine with one thread per rank runs it: each rank
//! computes the gradient of its own data shard, averages it with the others through its
//! per-rank handle (`all_reduce_in_place` with `Avg`, in `dp_common/`: the same step
//! `gpu_dp_step` runs on GPU streams and `mpi_dp_step` across processes), and applies the
//! same update; then the ranks split into two tensor-parallel groups (ranks `0..n/2` and
//! `n/2..n`), and each group sums its partial activations with an all_reduce of its own.
//!
//! Runs on the host backend (one logical device per rank in this machine's memory):
//! `cargo run --release --example dp_step -- [ranks] [parameters] [steps]`.

use std::time::Instant;

use relaycc::{Collectives, CollectivesError, RankComm, ReduceOp};

mod dp_common;
use dp_common::{apply, average_gradients, local_gradient};

/// What one rank reports: its final weights' checksum and its seconds in all_reduce.
type RankResult = Result<(f64, f64), CollectivesError>;

fn rank_main(mut rank: RankComm, params: usize, steps: usize) -> RankResult {
    let r = rank.rank();
    let n = rank.ranks();
    let lr = 0.1f32;
    // Every replica starts from the same weights.
    let mut weights = vec![1.0f32; params];
    let mut grads = vec![0.0f32; params];
    let mut comm_secs = 0.0;
    for step in 0..steps {
        // The "backward pass": a gradient that differs per rank (its data shard).
        local_gradient(&weights, r, step, &mut grads);
        let t = Instant::now();
        average_gradients(&mut rank, &mut grads)?;
        comm_secs += t.elapsed().as_secs_f64();
        apply(&mut weights, &grads, lr);
    }
    // Tensor parallelism: two groups of n/2 ranks, each holding a shard of a layer; each
    // rank's partial output is summed within its group only.
    let color = u32::from(r >= n / 2);
    let mut tp = rank
        .split(Some(color), r as i64)?
        .ok_or_else(|| CollectivesError::Setup(format!("rank {r} got no tensor-parallel group")))?;
    let mut partial = vec![(tp.rank() + 1) as f32; 8];
    tp.all_reduce_in_place(&mut partial, ReduceOp::Sum)?;
    let k = tp.ranks() as f32;
    assert_eq!(partial[0], k * (k + 1.0) / 2.0, "group sum on rank {r}");
    Ok((weights.iter().map(|&w| f64::from(w)).sum(), comm_secs))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let ranks = args.next().transpose()?.unwrap_or(4).max(2);
    let params = args.next().transpose()?.unwrap_or(1 << 20);
    let steps = args.next().transpose()?.unwrap_or(10);
    let handles: Vec<_> = RankComm::host(ranks as u32)?
        .into_iter()
        .map(|rank| std::thread::spawn(move || rank_main(rank, params, steps)))
        .collect();
    let mut sums = Vec::new();
    let mut secs: f64 = 0.0;
    for h in handles {
        let (sum, s) = h.join().map_err(|_| "a rank thread panicked")??;
        sums.push(sum);
        secs = secs.max(s);
    }
    // Averaged gradients keep the replicas identical.
    assert!(
        sums.windows(2).all(|w| w[0] == w[1]),
        "replicas diverged: {sums:?}"
    );
    let bytes = (params * 4 * steps) as f64;
    println!(
        "{ranks} ranks, {params} parameters, {steps} steps: replicas agree (checksum {:.3}); \
         all_reduce {:.2} ms/step, {:.2} GB/s algbw; tensor-parallel groups of {} and {} summed",
        sums[0],
        secs * 1e3 / steps as f64,
        bytes / secs / 1e9,
        ranks / 2,
        ranks - ranks / 2
    );
    Ok(())
}
