//! Host time of one all-ranks call on 8 host ranks of 256 f32 each, after its plan is cached:
//! adding an all_reduce to a group (`Group::all_reduce`: every rank's part through
//! `RankCalls`, then the argument checks), and the whole one-shot call with its wait.

use criterion::{Criterion, criterion_group, criterion_main};
use relaycc::{Communicator, DeviceBuffer, ReduceOp};

const RANKS: u32 = 8;
const ELEMS: usize = 256;

fn all_ranks_call(c: &mut Criterion) {
    let Ok(comm) = Communicator::host(RANKS) else {
        eprintln!("cannot build a {RANKS}-rank host communicator");
        return;
    };
    let bufs = |fill: f32| -> Option<Vec<DeviceBuffer<f32>>> {
        (0..RANKS as usize)
            .map(|r| comm.from_slice(r, &[fill; ELEMS]).ok())
            .collect()
    };
    let (Some(ins), Some(outs)) = (bufs(1.0), bufs(0.0)) else {
        eprintln!("cannot allocate the buffers");
        return;
    };
    let mut g = c.benchmark_group("all_ranks_call_8_ranks_1KiB");
    g.bench_function("add_to_group", |b| {
        b.iter(|| {
            let mut group = comm.group();
            if let Err(e) = group.all_reduce(&ins, &outs, ReduceOp::Sum) {
                eprintln!("all_reduce failed: {e}");
            }
        })
    });
    g.bench_function("call_and_wait", |b| {
        b.iter(|| {
            if let Err(e) = comm
                .all_reduce(&ins, &outs, ReduceOp::Sum)
                .and_then(|p| p.wait())
            {
                eprintln!("all_reduce failed: {e}");
            }
        })
    });
    g.finish();
}

criterion_group!(benches, all_ranks_call);
criterion_main!(benches);
