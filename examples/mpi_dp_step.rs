//! Data-parallel training steps across processes (feature `mpi`), then a split into
//! tensor-parallel groups:
//!
//! ```text
//! mpirun -np 4 cargo run --release --features mpi --example mpi_dp_step -- [parameters] [steps]
//! ```
//!
//! 1. **Data parallel.** Every process holds a replica of the weights and computes a gradient
//!    on its own data shard; `all_reduce_in_place` with `Avg` averages the gradients, and every
//!    replica applies the same update, so the weights stay equal on every rank (checked with
//!    a `broadcast` of rank 0's weights).
//! 2. **Tensor parallel.** `split` cuts the job into groups of two consecutive ranks (the
//!    tensor-parallel groups: each holds half of a layer's columns and `all_gather`s the
//!    activations) and into groups of ranks with the same position in their pair (the
//!    data-parallel groups: they average the gradient of their half with `all_reduce`). The
//!    two sub-communicators overlap and are used in alternation.
//! 3. **Pipeline parallel.** Every rank is a stage: at each tick it receives a microbatch's
//!    activations from the stage before and sends the previous tick's output to the stage
//!    after, both in one group (`ncclGroupStart` ... `ncclGroupEnd`), so no stage has to
//!    order its send and receive against its neighbours'. The last stage checks every
//!    microbatch against the whole pipeline computed locally.
//!
//! Errors end the job through `MpiCommunicator::abort`: after a failed call the peers may be
//! gone, so nothing waits in another collective.

use std::time::Instant;

use relaycc::{Collectives, CollectivesError, MpiCommunicator, ReduceOp, rsmpi};
use rsmpi::traits::*;

mod dp_common;
use dp_common::{apply, average_gradients, local_gradient};

fn main() {
    let Some(universe) = rsmpi::initialize() else {
        eprintln!("mpi_dp_step: MPI cannot be initialized");
        std::process::exit(2);
    };
    let world = universe.world();
    let mut comm = match MpiCommunicator::from_mpi(&world, world.rank() as u32, None) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mpi_dp_step: setup: {e}");
            std::process::exit(2);
        }
    };
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().ok());
    let params = args.next().flatten().unwrap_or(1 << 20);
    let steps = args.next().flatten().unwrap_or(5);
    if let Err(e) = run(&mut comm, params, steps) {
        eprintln!("rank {}: {e}", comm.rank());
        comm.abort(1);
    }
}

fn run(comm: &mut MpiCommunicator, params: usize, steps: usize) -> Result<(), CollectivesError> {
    let (me, n) = (comm.rank(), comm.ranks());
    let lr = 0.1f32;
    let mut weights = vec![1.0f32; params];
    let mut grads = vec![0.0f32; params];
    let mut comm_secs = 0.0;
    for step in 0..steps {
        local_gradient(&weights, me, step, &mut grads);
        let t = Instant::now();
        average_gradients(comm, &mut grads)?;
        comm_secs += t.elapsed().as_secs_f64();
        apply(&mut weights, &grads, lr);
    }
    // Every replica applied the same updates: rank 0's weights equal everyone's.
    let mut reference = weights.clone();
    comm.broadcast_in_place(&mut reference, 0)?;
    let same = u8::from(reference == weights);
    let mut all_same = [0u8];
    comm.all_reduce(&[same], &mut all_same, ReduceOp::Min)?;
    if me == 0 {
        println!(
            "data parallel: {n} processes, {params} parameters, {steps} steps, all_reduce \
             {:.2} ms per step (plan: {}), weights equal on every rank: {}",
            comm_secs * 1e3 / steps.max(1) as f64,
            comm.last_algorithm().unwrap_or_default(),
            all_same[0] == 1
        );
    }

    // Tensor parallel in pairs, data parallel across the pairs.
    let color = |c: usize| Some(c as u32);
    let tp = comm.split(color(me / 2), me as i32)?;
    let dp = comm.split(color(me % 2), me as i32)?;
    let (Some(mut tp), Some(mut dp)) = (tp, dp) else {
        return Err(CollectivesError::Setup("every rank passes a color".into()));
    };
    // This rank's half of the layer's columns.
    let half = params / 2;
    let start = (tp.rank() * half).min(weights.len());
    let columns = &weights[start..(start + half).min(weights.len())];
    let mut activations = vec![0.0f32; half * tp.ranks()];
    let mut shard_grad = vec![0.0f32; half];
    for step in 0..steps {
        // Forward: each member computes its half of the activations; the pair gathers them.
        let mine: Vec<f32> = columns.iter().map(|w| w * (step + 1) as f32).collect();
        tp.all_gather(&mine, &mut activations)?;
        // Backward: the gradient of this rank's half, averaged over the data-parallel group.
        local_gradient(columns, me, step, &mut shard_grad);
        average_gradients(&mut dp, &mut shard_grad)?;
    }
    if me == 0 {
        println!(
            "tensor parallel: {} pairs of {} ranks, data-parallel groups of {}, {steps} steps \
             alternating all_gather (pair) and all_reduce (group): done",
            n.div_ceil(2),
            tp.ranks(),
            dp.ranks()
        );
    }
    pipeline(comm, half.max(1), 2 * n)
}

/// Stage `s`'s layer: exact in `f32` for the small integers the pipeline carries.
fn stage(s: usize, x: &[f32], out: &mut [f32]) {
    for (o, x) in out.iter_mut().zip(x) {
        *o = x * 2.0 + s as f32;
    }
}

/// `micro` microbatches of `width` activations through one stage per rank (module docs, 3).
fn pipeline(
    comm: &mut MpiCommunicator,
    width: usize,
    micro: usize,
) -> Result<(), CollectivesError> {
    let (me, n) = (comm.rank(), comm.ranks());
    let input = |m: usize| -> Vec<f32> { (0..width).map(|i| ((m + i) % 5) as f32).collect() };
    let (mut x, mut y, mut out) = (vec![0f32; width], vec![0f32; width], vec![0f32; width]);
    let mut wrong = 0usize;
    // At tick t this stage works on microbatch t - me; its output goes on at tick t + 1.
    for t in 0..micro + n {
        let (m, sent) = (t.checked_sub(me), t.checked_sub(me + 1));
        let mut g = comm.group();
        if me + 1 < n && sent.is_some_and(|m| m < micro) {
            g.send(&y, me + 1);
        }
        if me > 0 && m.is_some_and(|m| m < micro) {
            g.recv(&mut x, me - 1);
        }
        g.launch()?;
        let Some(m) = m.filter(|&m| m < micro) else {
            continue;
        };
        if me == 0 {
            x = input(m);
        }
        stage(me, &x, &mut out);
        std::mem::swap(&mut y, &mut out);
        if me + 1 == n {
            // The whole pipeline, locally.
            let mut want = input(m);
            for s in 0..n {
                stage(s, &want, &mut out);
                want.copy_from_slice(&out);
            }
            wrong += usize::from(want != y);
        }
    }
    if me + 1 == n {
        println!(
            "pipeline: {n} stages, {micro} microbatches of {width} activations, a group of a \
             send and a receive per stage and tick: {wrong} wrong"
        );
    }
    Ok(())
}
