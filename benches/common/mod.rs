//! What the all_reduce benches (`host_allreduce`, `cuda_allreduce`) share: the buffer size
//! and the timed in-place call.

use criterion::BenchmarkGroup;
use criterion::measurement::WallTime;
use relaycc::{Communicator, ReduceOp};

/// Bytes of f32 each rank reduces.
pub const BYTES: usize = 64 << 20;

/// Times an in-place all_reduce (max) of [`BYTES`] per rank on `comm` as benchmark `id`,
/// after the first call has planned and cached it. When the buffers cannot be allocated it
/// prints `alloc_failed` and adds nothing.
pub fn in_place_all_reduce(
    g: &mut BenchmarkGroup<'_, WallTime>,
    comm: &Communicator,
    id: String,
    alloc_failed: &str,
) {
    let Ok(bufs) = (0..comm.ranks())
        .map(|r| comm.from_slice(r, &vec![1.0f32; BYTES / 4]))
        .collect::<Result<Vec<_>, _>>()
    else {
        eprintln!("{alloc_failed}");
        return;
    };
    g.bench_function(id, |b| {
        b.iter(|| {
            if let Err(e) = comm
                .all_reduce(&bufs, &bufs, ReduceOp::Max)
                .and_then(|p| p.wait())
            {
                eprintln!("all_reduce failed: {e}");
            }
        })
    });
}
