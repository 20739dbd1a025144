//! The same data-parallel step written twice, side by side (feature `nccl`): once against
//! cudarc's NCCL bindings (`cudarc::nccl`), once against relaycc, one thread per GPU, each
//! rank's gradients averaged on the rank's own stream. Both runs start from the same weights
//! and gradients, and their weights are compared at the end.
//!
//! ```text
//! cargo run --release --features nccl --example nccl_vs_relaycc -- [gpus, e.g. 0,1] [parameters] [steps]
//! ```
//!
//! | step | cudarc::nccl | relaycc |
//! |---|---|---|
//! | one communicator per GPU | `Id::new()`, then `Comm::from_rank(stream, rank, n, id)` on each thread (`ncclCommInitRank`) | `RankComm::cuda(&gpus)`, one handle moved to each thread |
//! | average the gradients | `comm.all_reduce_in_place(&mut grads, &ReduceOp::Avg)` | `rank.on(&stream).all_reduce_in_place(&mut grads, ReduceOp::Avg)` |
//! | errors | `NcclError(status)` | `CollectivesError` naming the call and the rank |
//!
//! Everything else (buffers, streams, the optimizer) is the engine's own cudarc code, shared
//! by both. On a machine without a GPU, driver or libnccl it prints the error and exits with
//! status 1.

use std::sync::Arc;
use std::time::Instant;

use relaycc::collectives::cuda;
use relaycc::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use relaycc::cudarc::nccl::{self, Comm, Id};
use relaycc::{Collectives, RankComm, ReduceOp};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The step's collective on one rank: the gradient replaced by the average over the ranks.
trait AverageGradients {
    fn average(&mut self, grads: &mut CudaSlice<f32>) -> Result<(), Error>;
}

/// cudarc::nccl: the communicator holds the stream it enqueues on.
struct NcclRank(Comm);

impl AverageGradients for NcclRank {
    fn average(&mut self, grads: &mut CudaSlice<f32>) -> Result<(), Error> {
        self.0
            .all_reduce_in_place(grads, &nccl::ReduceOp::Avg)
            .map_err(|e| format!("ncclAllReduce: {e:?}"))?;
        Ok(())
    }
}

/// relaycc: the rank's handle, its calls on the caller's stream.
struct RelayccRank(RankComm, Arc<CudaStream>);

impl AverageGradients for RelayccRank {
    fn average(&mut self, grads: &mut CudaSlice<f32>) -> Result<(), Error> {
        self.0
            .on(&self.1)
            .all_reduce_in_place(grads, ReduceOp::Avg)?;
        Ok(())
    }
}

/// The engine's training loop, the same for both: upload this rank's gradient (as a backward
/// pass leaves it), average it, read it back on the stream and apply SGD. Returns the weights
/// and the seconds spent in the collective.
fn train(
    comm: &mut impl AverageGradients,
    stream: &Arc<CudaStream>,
    rank: usize,
    params: usize,
    steps: usize,
) -> Result<(Vec<f32>, f64), Error> {
    let mut weights = vec![1.0f32; params];
    let mut host = vec![0.0f32; params];
    let mut grads: CudaSlice<f32> = stream.alloc_zeros(params)?;
    let mut secs = 0.0;
    for step in 0..steps {
        for (i, (g, w)) in host.iter_mut().zip(&weights).enumerate() {
            *g = w * 0.01 + ((rank + i + step) % 5) as f32;
        }
        stream.memcpy_htod(&host, &mut grads)?;
        let t = Instant::now();
        comm.average(&mut grads)?;
        secs += t.elapsed().as_secs_f64();
        stream.memcpy_dtoh(&grads, &mut host)?;
        stream.synchronize()?;
        for (w, g) in weights.iter_mut().zip(&host) {
            *w -= 0.1 * g;
        }
    }
    Ok((weights, secs))
}

/// Run `rank_main` on one thread per GPU, each with its rank's state and a new stream on
/// its GPU; the ranks' results in rank order.
fn on_threads<S, F>(
    gpus: &[usize],
    states: Vec<S>,
    rank_main: F,
) -> Result<Vec<(Vec<f32>, f64)>, Error>
where
    S: Send,
    F: Fn(usize, S, Arc<CudaStream>) -> Result<(Vec<f32>, f64), Error> + Sync,
{
    std::thread::scope(|s| {
        let threads: Vec<_> = gpus
            .iter()
            .zip(states)
            .enumerate()
            .map(|(rank, (&gpu, state))| {
                let rank_main = &rank_main;
                s.spawn(move || rank_main(rank, state, CudaContext::new(gpu)?.new_stream()?))
            })
            .collect();
        threads
            .into_iter()
            .enumerate()
            .map(|(r, t)| {
                t.join()
                    .unwrap_or_else(|_| Err("a rank thread panicked".into()))
                    .map_err(|e| format!("rank {r}: {e}").into())
            })
            .collect()
    })
}

fn run() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let gpus: Vec<usize> = match args.next() {
        Some(list) => list
            .split(',')
            .map(|g| g.trim().parse::<usize>())
            .collect::<Result<_, _>>()?,
        None => (0..cuda::devices()?.len()).collect(),
    };
    let params: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1 << 22);
    let steps: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    let n = gpus.len();

    // relaycc: one handle per GPU, on the machine's topology.
    let relaycc = on_threads(&gpus, RankComm::cuda(&gpus)?, |rank, handle, stream| {
        let mut comm = RelayccRank(handle, stream.clone());
        train(&mut comm, &stream, rank, params, steps)
    })?;

    // cudarc::nccl: probed first, since cudarc panics where libnccl is missing.
    cuda::nccl::nccl()?;
    let id = Id::new().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
    let nccl = on_threads(&gpus, vec![id; n], |rank, id, stream| {
        let comm = Comm::from_rank(stream.clone(), rank, n, id)
            .map_err(|e| format!("ncclCommInitRank: {e:?}"))?;
        train(&mut NcclRank(comm), &stream, rank, params, steps)
    })?;

    let worst = relaycc
        .iter()
        .zip(&nccl)
        .flat_map(|((a, _), (b, _))| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0.0f32, f32::max);
    if worst > 1e-3 {
        return Err(format!("relaycc and NCCL weights differ by up to {worst}").into());
    }
    let per_step =
        |r: &[(Vec<f32>, f64)]| r.iter().map(|(_, s)| *s).fold(0.0, f64::max) * 1e3 / steps as f64;
    println!(
        "{n} GPUs {gpus:?}, {params} parameters, {steps} steps: the same weights (largest \
         difference {worst:e}); all_reduce per step: relaycc {:.3} ms, NCCL {:.3} ms",
        per_step(&relaycc),
        per_step(&nccl)
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("nccl_vs_relaycc: {e}");
        std::process::exit(1);
    }
}
