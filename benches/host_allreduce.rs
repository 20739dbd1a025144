//! Host backend all_reduce: 64 MiB of f32 over 4 and 8 logical devices of one host, in place,
//! after the plan is cached (the first call plans, checks and lowers it).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use relaycc::{Communicator, ReduceOp};

const BYTES: usize = 64 << 20;

fn host_allreduce(c: &mut Criterion) {
    let mut g = c.benchmark_group("host_allreduce_64MiB_f32");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(BYTES as u64));
    for ranks in [4u32, 8] {
        let Ok(comm) = Communicator::host(ranks) else {
            eprintln!("cannot build a {ranks}-rank host communicator");
            continue;
        };
        let Ok(bufs) = (0..ranks as usize)
            .map(|r| comm.from_slice(r, &vec![1.0f32; BYTES / 4]))
            .collect::<Result<Vec<_>, _>>()
        else {
            eprintln!("cannot allocate {ranks} x 64 MiB");
            continue;
        };
        g.bench_function(format!("{ranks}_ranks"), |b| {
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
    g.finish();
}

criterion_group!(benches, host_allreduce);
criterion_main!(benches);
