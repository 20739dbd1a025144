//! Gradient averaging as a data-parallel training loop does it: every rank computes its local
//! gradient, all_reduce with `Avg` in place, every rank applies the same averaged update.
//!
//! Runs on the host backend (one logical device per rank in this machine's memory):
//! `cargo run --release --example allreduce -- [ranks] [parameters] [steps]`.

use std::time::Instant;

use relaycc::{Communicator, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let ranks = args.next().transpose()?.unwrap_or(4);
    let params = args.next().transpose()?.unwrap_or(1 << 20);
    let steps = args.next().transpose()?.unwrap_or(10);
    let lr = 0.1f32;
    let comm = Communicator::host(ranks as u32)?;
    // Every replica starts from the same weights.
    let mut weights = vec![vec![1.0f32; params]; ranks];
    let grads: Vec<_> = (0..ranks)
        .map(|r| comm.alloc::<f32>(r, params))
        .collect::<Result<_, _>>()?;
    let mut comm_secs = 0.0;
    for step in 0..steps {
        // Each rank's "backward pass": a gradient that differs per rank (its data shard).
        for (r, g) in grads.iter().enumerate() {
            let local: Vec<f32> = weights[r]
                .iter()
                .enumerate()
                .map(|(i, w)| w * 0.01 + ((r + i + step) % 5) as f32)
                .collect();
            g.copy_from(&local)?;
        }
        let t = Instant::now();
        comm.all_reduce(&grads, &grads, ReduceOp::Avg)?.wait()?;
        comm_secs += t.elapsed().as_secs_f64();
        for (r, g) in grads.iter().enumerate() {
            let avg = g.to_vec()?;
            for (w, d) in weights[r].iter_mut().zip(avg) {
                *w -= lr * d;
            }
        }
        // Data parallelism's invariant: the replicas stay identical.
        let same = weights.iter().all(|w| w == &weights[0]);
        println!(
            "step {step}: w[0] = {:.5}, replicas identical: {same}",
            weights[0][0]
        );
        if !same {
            return Err("replicas diverged".into());
        }
    }
    let bytes = (params * 4 * steps) as f64;
    println!(
        "{ranks} ranks, {params} parameters: all_reduce {:.1} ms per step, {:.2} GB/s algbw",
        comm_secs * 1e3 / steps as f64,
        bytes / comm_secs / 1e9
    );
    Ok(())
}
