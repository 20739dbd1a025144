//! The data-parallel step the examples `dp_step` (threads, host slices), `gpu_dp_step` (one
//! thread per GPU, cudarc buffers on each rank's stream) and `mpi_dp_step` (one process per
//! rank) share word for word: they differ only in how each makes its communicator.

use relaycc::collectives::RecvBuf;
use relaycc::{Collectives, CollectivesError, ReduceOp};

/// The collective part of the step: every rank's gradient replaced by the average over the
/// ranks. Generic over the surface: host slices on threads, cudarc buffers on a stream, MPI.
pub fn average_gradients<C, B>(comm: &mut C, grads: &mut B) -> Result<(), CollectivesError>
where
    C: Collectives,
    B: RecvBuf<f32> + ?Sized,
{
    comm.all_reduce_in_place(grads, ReduceOp::Avg)
}

/// A gradient that differs per rank (its data shard) and per step.
pub fn local_gradient(weights: &[f32], rank: usize, step: usize, out: &mut [f32]) {
    for (i, (g, w)) in out.iter_mut().zip(weights).enumerate() {
        *g = w * 0.01 + ((rank + i + step) % 5) as f32;
    }
}

/// Plain gradient descent: `weights -= lr * grads`.
pub fn apply(weights: &mut [f32], grads: &[f32], lr: f32) {
    for (w, g) in weights.iter_mut().zip(grads) {
        *w -= lr * g;
    }
}
