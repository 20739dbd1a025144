//! Planning time: cold planning of all_reduce on 8 (DGX-1) and 16 (DGX-2) GPUs, point-to-point
//! routes (one of 64 TiB: a plan of rounds, whose planning time does not grow with the
//! message), and a repeated request served from the planner's cache.

use criterion::{Criterion, criterion_group, criterion_main};
use relaycc::route::{Collective, DType, PlanOptions, Planner, Request, plan};
use std::hint::black_box;

fn planning(c: &mut Criterion) {
    let dgx1 = relaycc::topo::preset("dgx1-v100").expect("preset");
    let dgx2 = relaycc::topo::preset("dgx2").expect("preset");
    let opts = PlanOptions::default();
    let ar8 = Request::new(
        Collective::AllReduce,
        (0..8).collect(),
        64 << 20,
        DType::F32,
    );
    let ar16 = Request::new(
        Collective::AllReduce,
        (0..16).collect(),
        64 << 20,
        DType::F32,
    );
    let p2p = Request::point_to_point(0, 7, 256 << 20);
    let p2p_64tib = Request::point_to_point(0, 7, 64 << 40);
    let mut g = c.benchmark_group("plan");
    g.sample_size(10);
    g.bench_function("all_reduce 256MiB dgx1-v100 8 GPUs (cold)", |b| {
        b.iter(|| plan(black_box(&dgx1), black_box(&ar8), &opts).expect("plan"))
    });
    g.bench_function("all_reduce 256MiB dgx2 16 GPUs (cold)", |b| {
        b.iter(|| plan(black_box(&dgx2), black_box(&ar16), &opts).expect("plan"))
    });
    g.bench_function("route 256MiB dgx1-v100 0->7 (cold)", |b| {
        b.iter(|| plan(black_box(&dgx1), black_box(&p2p), &opts).expect("plan"))
    });
    // The target: under 1 s (and 100 MB) for `relaycc route --size 64TiB`.
    g.bench_function("route 64TiB dgx1-v100 0->7 (cold, rounds)", |b| {
        b.iter(|| plan(black_box(&dgx1), black_box(&p2p_64tib), &opts).expect("plan"))
    });
    let planner = Planner::new(dgx1.clone());
    planner.plan(&ar8, &opts).expect("plan");
    g.bench_function("all_reduce 256MiB dgx1-v100 8 GPUs (cached)", |b| {
        b.iter(|| planner.plan(black_box(&ar8), &opts).expect("plan"))
    });
    g.finish();
}

criterion_group!(benches, planning);
criterion_main!(benches);
