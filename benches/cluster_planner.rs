//! Cold planning on clusters of DGX H100 nodes (`cluster:<N>xdgx-h100:ib-ndr`), 1 GiB as
//! nccl-tests counts it: all_reduce, all_gather and reduce_scatter on 1, 2, 4 and 16 nodes
//! (8 to 128 GPUs), all_to_all on 1 and 2 nodes (its direct plan holds n^2 copies); and in a
//! second group, with few samples, the templates above 64 ranks: all_reduce, all_gather,
//! reduce_scatter and all_to_all (NCCL's PXN send/recv, the baseline's plan) on 32, 64 and 128
//! nodes (256 to 1,024 GPUs). The budget is unlimited here so
//! every run does the same work; `relaycc plan --budget` bounds it for users.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use relaycc::route::{Collective, DType, PlanOptions, Request, plan};

/// One GiB in f32 elements, split as nccl-tests does for `c` on `n` ranks.
fn request(c: Collective, n: u32) -> Request {
    let total = (1u64 << 30) / 4;
    let count = match c {
        Collective::AllReduce => total,
        _ => total / u64::from(n),
    };
    Request::new(c, (0..n).collect(), count, DType::F32)
}

fn cluster_planning(c: &mut Criterion) {
    let opts = PlanOptions {
        budget: Duration::from_secs(3600),
        ..PlanOptions::default()
    };
    let mut g = c.benchmark_group("plan cluster");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(100));
    let cases: &[(Collective, &[u32])] = &[
        (Collective::AllReduce, &[1, 2, 4, 16]),
        (Collective::AllGather, &[1, 2, 4, 16]),
        (Collective::ReduceScatter, &[1, 2, 4, 16]),
        (Collective::AllToAll, &[1, 2]),
    ];
    for &(coll, nodes) in cases {
        for &n in nodes {
            let topo = relaycc::topo::preset(&format!("cluster:{n}xdgx-h100:ib-ndr"))
                .expect("cluster preset");
            let req = request(coll, n * 8);
            g.bench_function(format!("{coll} 1GiB {n}xdgx-h100 {} GPUs", n * 8), |b| {
                b.iter(|| plan(black_box(&topo), black_box(&req), &opts).expect("plan"))
            });
        }
    }
    g.finish();
}

fn template_planning(c: &mut Criterion) {
    let opts = PlanOptions {
        budget: Duration::from_secs(3600),
        ..PlanOptions::default()
    };
    let mut g = c.benchmark_group("plan cluster templates");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(100));
    g.measurement_time(Duration::from_secs(10));
    for coll in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
    ] {
        for n in [32u32, 64, 128] {
            let topo = relaycc::topo::preset(&format!("cluster:{n}xdgx-h100:ib-ndr"))
                .expect("cluster preset");
            let req = request(coll, n * 8);
            g.bench_function(format!("{coll} 1GiB {n}xdgx-h100 {} GPUs", n * 8), |b| {
                b.iter(|| plan(black_box(&topo), black_box(&req), &opts).expect("plan"))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, cluster_planning, template_planning);
criterion_main!(benches);
