//! Clusters: building the fabrics of 128 DGX H100 nodes (1,024 GPUs) and finding their host-shift
//! symmetry, and NCCL's multi-node baseline plan on 2 and 16 nodes.

use criterion::{Criterion, criterion_group, criterion_main};
use relaycc::route::planner::baseline_plan;
use relaycc::route::{Collective, DType, Request};
use std::hint::black_box;

fn fabrics(c: &mut Criterion) {
    let mut g = c.benchmark_group("cluster");
    g.sample_size(10);
    for layout in ["switch", "rail", "fat-tree=2:1"] {
        let spec = format!("cluster:128xdgx-h100:ib-ndr:{layout}");
        g.bench_function(format!("build {spec}"), |b| {
            b.iter(|| relaycc::topo::preset(black_box(&spec)).expect("preset"))
        });
        let topo = relaycc::topo::preset(&spec).expect("preset");
        g.bench_function(format!("host_symmetry {spec}"), |b| {
            b.iter(|| black_box(&topo).host_symmetry())
        });
    }
    for nodes in [2u32, 16] {
        let topo = relaycc::topo::preset(&format!("cluster:{nodes}xdgx-h100:ib-ndr:rail"))
            .expect("preset");
        for coll in [Collective::AllReduce, Collective::AllToAll] {
            let req = Request::new(coll, (0..nodes * 8).collect(), (1 << 30) / 4, DType::F32);
            g.bench_function(format!("baseline {coll} 1GiB {nodes}xdgx-h100 rail"), |b| {
                b.iter(|| baseline_plan(black_box(&topo), black_box(&req)).expect("plan"))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, fabrics);
criterion_main!(benches);
