//! Host backend all_reduce: 64 MiB of f32 over 4 and 8 logical devices of one host, in place,
//! after the plan is cached (the first call plans, checks and lowers it).

mod common;

use common::BYTES;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use relaycc::Communicator;

fn host_allreduce(c: &mut Criterion) {
    let mut g = c.benchmark_group("host_allreduce_64MiB_f32");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(BYTES as u64));
    for ranks in [4u32, 8] {
        let Ok(comm) = Communicator::host(ranks) else {
            eprintln!("cannot build a {ranks}-rank host communicator");
            continue;
        };
        let failed = format!("cannot allocate {ranks} x 64 MiB");
        common::in_place_all_reduce(&mut g, &comm, format!("{ranks}_ranks"), &failed);
    }
    g.finish();
}

criterion_group!(benches, host_allreduce);
criterion_main!(benches);
