//! Simulator throughput: a synthetic 100k-op plan on dgx1-v100.
//!
//! The plan is a chunked ring all-reduce shape on the NVLink ring 0-1-2-3-7-6-5-4 with 8
//! channels (lanes) per GPU: each step every lane reduces the chunk its ring predecessor sent
//! into its accumulator (GPU memory) and sends the result on (NVLink). 64 lanes x 782 steps x
//! 2 ops = 100,096 ops, with up to 64 copies and 64 reductions in flight, 8 copies sharing
//! each ring edge and 8 reductions sharing each GPU's memory.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use relaycc::route::{BufferRef, Collective, DType, Location, Plan, Region, Request, SimConfig};
use relaycc::topo::Topology;

/// The DGX-1 V100 ring that uses NVLink on every hop.
const RING: [u32; 8] = [0, 1, 2, 3, 7, 6, 5, 4];

fn whole(b: BufferRef, len: u64) -> Region {
    Region::new(b, 0, len)
}

/// `channels` lanes per GPU, `steps` reduce-and-send steps each, `chunk` f32 elements a step.
fn ring_plan(topo: &Topology, channels: usize, steps: usize, chunk: u64) -> Plan {
    let req = Request::new(Collective::AllReduce, RING.to_vec(), chunk, DType::F32);
    let mut plan = Plan::new(req, "bench ring");
    // Per lane: its accumulator, the staging buffer it fills at the next GPU, its edge.
    let mut lanes = Vec::new();
    for (pos, &g) in RING.iter().enumerate() {
        let next = RING[(pos + 1) % RING.len()];
        let (a, b) = (
            topo.gpu(g).expect("ring GPU"),
            topo.gpu(next).expect("ring GPU"),
        );
        let edge = topo.link_between(a, b).expect("NVLink on the ring").index() as u32;
        for c in 0..channels {
            let lane = plan.add_lane(Location::Gpu(g), format!("GPU{g} ch{c}"));
            let acc = plan.add_scratch(Location::Gpu(g), chunk);
            let stage = plan.add_scratch(Location::Gpu(next), chunk);
            lanes.push((lane, acc, stage, edge));
        }
    }
    let n = RING.len();
    let mut last_send: Vec<Option<u32>> = vec![None; lanes.len()];
    for _ in 0..steps {
        let prev = last_send.clone();
        for pos in 0..n {
            for c in 0..channels {
                let l = pos * channels + c;
                let from = ((pos + n - 1) % n) * channels + c;
                let (lane, acc, stage, edge) = lanes[l];
                let staged = lanes[from].2;
                let srcs = vec![whole(staged, chunk), whole(acc, chunk)];
                let deps = prev[from].into_iter().collect();
                plan.reduce(lane, srcs, whole(acc, chunk), false, deps);
                let (src, dst) = (whole(acc, chunk), whole(stage, chunk));
                last_send[l] = Some(plan.copy(lane, src, dst, vec![edge], vec![]));
            }
        }
    }
    plan
}

fn simulator(c: &mut Criterion) {
    let topo = relaycc::topo::preset("dgx1-v100").expect("preset");
    let plan = ring_plan(&topo, 8, 782, 64 * 1024);
    let cfg = SimConfig::default();
    let once = relaycc::route::simulate(&topo, &plan, &cfg).expect("simulate");
    eprintln!(
        "ring plan: {} ops, {} lanes, predicted {:.1} us",
        plan.ops.len(),
        plan.lanes.len(),
        once.time_us
    );
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    group.bench_function("ring_100k_ops_dgx1_v100", |b| {
        b.iter(|| relaycc::route::simulate(black_box(&topo), black_box(&plan), &cfg))
    });
    group.finish();
}

criterion_group!(benches, simulator);
criterion_main!(benches);
