//! Tests of the lowering: loads, latencies, waits, resource names and the checks it makes.
use relaycc_topo::{Mask, Topology};

use super::*;
use relaycc_plan::{BufferRef, Request};
use relaycc_plan::{Location::Gpu, Region};
use relaycc_topo::rates;

fn dgx1() -> Topology {
    relaycc_topo::preset("dgx1-v100").unwrap()
}

/// Two 1 MiB copies GPU0 -> GPU1 on two lanes; the caller breaks one.
fn two(topo: &Topology) -> Plan {
    let (g0, g1) = (topo.gpu(0).unwrap(), topo.gpu(1).unwrap());
    let e = topo.link_between(g0, g1).unwrap().index() as u32;
    let mut p = Plan::new(Request::point_to_point(0, 1, 1 << 20), "test");
    for l in 0..2 {
        let lane = p.add_lane(Gpu(0), "l");
        let src = Region::new(p.add_scratch(Gpu(0), 1 << 20), 0, 1 << 20);
        let dst = Region::new(p.add_scratch(Gpu(1), 1 << 20), 0, 1 << 20);
        assert_eq!(p.copy(lane, src, dst, vec![e], vec![]), l);
    }
    p
}

/// Building (and simulating) `p` fails at op `op` with a message holding `words`.
fn check(topo: &Topology, p: &Plan, op: usize, words: &str) {
    match crate::simulate(topo, p, &SimConfig::default()) {
        Err(RouteError::PlanCheck { op: got, message }) => {
            assert_eq!(got, op, "{message}");
            assert!(message.contains(words), "{message:?} lacks {words:?}");
        }
        other => panic!("expected a plan check error, got {other:?}"),
    }
}

/// A protocol share at zero's edge (set past `CostModel::set`'s floor) would put
/// infinite bytes on the wire and stall the run: it is refused with the share named (and
/// an infinite latency too).
#[test]
fn a_degenerate_cost_model_is_named_not_taken_for_a_cycle() {
    let mut topo = dgx1();
    let mut costs = *topo.costs();
    costs.bw_fraction[2] = 5e-324;
    topo.set_costs(costs);
    let mut p = two(&topo);
    p.protocol = Some(relaycc_topo::rates::Protocol::Simple);
    check(&topo, &p, usize::MAX, "share of a link");
    let mut costs = *topo.costs();
    costs.bw_fraction[2] = 1.0;
    costs.nvlink_step_us[2] = f64::INFINITY;
    topo.set_costs(costs);
    check(&topo, &p, 0, "latency of inf");
}

#[test]
fn lowering_counts_loads_latency_and_waits() {
    let topo = dgx1();
    let mut p = two(&topo);
    p.ops[1].lane = 0;
    p.ops[1].deps = vec![0, 0];
    let m = Model::build(&topo, &p, &SimConfig::default()).unwrap();
    assert_eq!(m.deps.in_degrees(), &[0, 3]);
    assert_eq!(m.deps.successors(0), &[1, 1, 1]);
    assert_eq!(m.deps.lane_predecessor(1), Some(0));
    // 1 MiB to an NVLink peer runs on SMs: the first starts a kernel launch, the second (its
    // dependencies only its own lane's order) joins it; both cross the NVLink's latency; no
    // extra overhead by default.
    let k = rates::KERNEL_LAUNCH_US;
    assert_eq!(m.latency_us, vec![k + 0.6, 0.6]);
    assert_eq!(m.start_us, 0.0);
    assert_eq!(m.bytes, vec![1048576.0, 1048576.0]);
    assert_eq!(m.uses.of(0).1, &[1.0]);
    // Only what the ops load is a resource: two copies over one NVLink, no memory.
    assert_eq!(m.caps.len(), 1);
    assert!(m.edge_of(0).is_some() && m.memory_of(0).is_none());
    let mut caps = Vec::new();
    let (places, _) = memories::memory_resources(&topo, &mut caps);
    assert_eq!(
        (places.mem_loc[0], caps[0]),
        (Gpu(0), 900e3),
        "GPU0 is a V100"
    );
    // Named by the topology's edge, not the resource's place among the plan's.
    let e = m.edge_of(0).unwrap();
    assert_ne!(e, 0);
    assert_eq!(
        m.resource_name(&topo, 0),
        format!("edge {e} (GPU0 -> GPU1)")
    );
}

#[test]
fn a_dependency_cycle() {
    let topo = dgx1();
    let mut p = two(&topo);
    (p.ops[0].deps, p.ops[1].deps) = (vec![1], vec![0]);
    check(&topo, &p, 0, "cycle");
    // A dep on a later op of the same lane is a cycle through lane order.
    let mut p = two(&topo);
    (p.ops[1].lane, p.ops[0].deps) = (0, vec![1]);
    check(&topo, &p, 0, "cycle");
    let mut p = two(&topo);
    p.ops[1].deps = vec![1];
    check(&topo, &p, 1, "cycle");
}

#[test]
fn a_missing_dependency_or_lane() {
    let topo = dgx1();
    let mut p = two(&topo);
    p.ops[1].deps = vec![7];
    check(&topo, &p, 1, "op 7");
    let mut p = two(&topo);
    p.ops[1].lane = 9;
    check(&topo, &p, 1, "lane 9");
}

#[test]
fn a_missing_or_masked_edge() {
    let topo = dgx1();
    let mut p = two(&topo);
    p.ops[0].edges = vec![u32::MAX];
    check(&topo, &p, 0, "edge");
    let mut mask = Mask::default();
    mask.link_down("GPU0", "GPU1");
    check(&topo.with_mask(mask).unwrap(), &two(&topo), 0, "masked");
    let mut mask = Mask::default();
    mask.absent_gpus.insert(1);
    check(&topo.with_mask(mask).unwrap(), &two(&topo), 0, "masked");
}

#[test]
fn missing_buffers_locations_and_edges() {
    let topo = dgx1();
    let set = |p: &mut Plan, f: &dyn Fn(&mut Region, &mut Region)| {
        if let OpKind::Copy { src, dst } = &mut p.ops[1].kind {
            f(src, dst);
        }
    };
    let mut p = two(&topo);
    set(&mut p, &|src, _| src.buffer = BufferRef::Scratch(99));
    check(&topo, &p, 1, "buffer");
    let mut p = two(&topo);
    let far = p.add_scratch(Gpu(9), 1 << 20);
    set(&mut p, &|_, dst| dst.buffer = far);
    check(&topo, &p, 1, "GPU9");
    let mut p = two(&topo);
    let not_cpu = topo.gpu(1).unwrap().index() as u32;
    let host = p.add_scratch(Location::Host(not_cpu), 1 << 20);
    set(&mut p, &|_, dst| dst.buffer = host);
    check(&topo, &p, 1, "not a CPU");
    let mut p = two(&topo);
    p.ops[1].edges.clear();
    check(&topo, &p, 1, "no edges");
}

#[test]
fn a_bad_overhead() {
    let topo = dgx1();
    let cfg = SimConfig {
        op_overhead_us: f64::NAN,
        ..SimConfig::default()
    };
    let r = Model::build(&topo, &two(&topo), &cfg);
    assert!(matches!(
        r,
        Err(RouteError::PlanCheck { op: usize::MAX, .. })
    ));
}

/// A copy inside one GPU's memory loads it twice per byte (read and write) at its rate: the
/// table's for its generation, or the rate a calibration file measured (`memories`).
#[test]
fn a_calibrated_device_memory_rate_times_copies_within_a_gpu() {
    let topo = dgx1();
    // A point-to-point request moves bytes: one element is one byte.
    let elems: u64 = 1 << 30;
    let bytes = elems;
    let mut p = Plan::new(Request::point_to_point(0, 0, elems), "local");
    let lane = p.add_lane(Gpu(0), "l");
    let src = Region::new(p.add_scratch(Gpu(0), elems), 0, elems);
    let dst = Region::new(p.add_scratch(Gpu(0), elems), 0, elems);
    p.copy(lane, src, dst, vec![], vec![]);
    let flow_us = |topo: &Topology| {
        let r = crate::simulate(topo, &p, &SimConfig::default()).unwrap();
        r.time_us - topo.costs().copy_engine_launch_us
    };
    // V100's HBM2: 900 GB/s for the 2 GiB read and written.
    let table = flow_us(&topo);
    assert!(
        (table - 2.0 * bytes as f64 / 900e3).abs() < 1e-6 * table,
        "{table}"
    );
    let cal = relaycc_topo::Calibration::parse(r#"{"memories":[{"gpu":"GPU0","gbps":450}]}"#, "t")
        .unwrap();
    let measured = flow_us(&cal.apply(&topo).unwrap());
    assert!(
        (measured / table - 2.0).abs() < 1e-9,
        "{measured} vs {table}"
    );
}

/// A reduction loads its GPU's memory once per source and once for the result; where a
/// calibration measured the reduce kernel (`memories`' `reduce_gbps`), it alone takes what the
/// kernel took on those bytes.
#[test]
fn a_calibrated_reduce_kernel_rate_times_reductions_on_its_gpu() {
    let topo = dgx1();
    let elems: u64 = 1 << 28;
    let mut p = Plan::new(Request::point_to_point(0, 0, elems), "local");
    let lane = p.add_lane(Gpu(0), "l");
    let a = Region::new(p.add_scratch(Gpu(0), elems), 0, elems);
    let b = Region::new(p.add_scratch(Gpu(0), elems), 0, elems);
    let out = Region::new(p.add_scratch(Gpu(0), elems), 0, elems);
    p.reduce(lane, vec![a, b], out, false, vec![]);
    let flow_us = |topo: &Topology| {
        let r = crate::simulate(topo, &p, &SimConfig::default()).unwrap();
        r.time_us - topo.costs().kernel_launch_us
    };
    // Two sources read and one result written at V100's 900 GB/s.
    let table = flow_us(&topo);
    let moved = 3.0 * elems as f64;
    assert!((table - moved / 900e3).abs() < 1e-6 * table, "{table}");
    for (json, want) in [
        // The kernel at half the memory's rate: twice the time.
        (
            r#"{"memories":[{"gpu":"GPU0","gbps":900,"reduce_gbps":450}]}"#,
            2.0,
        ),
        // Memory measured slower, the kernel unmeasured: the memory's rate.
        (r#"{"memories":[{"gpu":"GPU0","gbps":600}]}"#, 1.5),
        // On another GPU, no change here.
        (
            r#"{"memories":[{"gpu":"GPU1","gbps":900,"reduce_gbps":300}]}"#,
            1.0,
        ),
    ] {
        let cal = relaycc_topo::Calibration::parse(json, "t").unwrap();
        let measured = flow_us(&cal.apply(&topo).unwrap());
        assert!(
            (measured / table - want).abs() < 1e-9,
            "{json}: {measured} vs {table}"
        );
    }
}

/// A copy within one GPU loads its memory twice per byte; where the executor makes it on SMs
/// (a small one) and a calibration measured the SM copy there (`memories`' `sm_copy_gbps`),
/// it alone takes what the forward kernel took on those bytes. A copy-engine copy keeps the
/// memory's rate.
#[test]
fn a_calibrated_sm_copy_rate_times_small_copies_within_its_gpu() {
    let topo = dgx1();
    for (elems, on_sms) in [(1u64 << 20, true), (1 << 26, false)] {
        let mut p = Plan::new(Request::point_to_point(0, 0, elems), "local");
        let lane = p.add_lane(Gpu(0), "l");
        let a = Region::new(p.add_scratch(Gpu(0), elems), 0, elems);
        let b = Region::new(p.add_scratch(Gpu(0), elems), 0, elems);
        p.copy(lane, a, b, vec![], vec![]);
        let flow_us = |topo: &Topology| {
            let r = crate::simulate(topo, &p, &SimConfig::default()).unwrap();
            let c = topo.costs();
            let launch = if on_sms {
                c.kernel_launch_us
            } else {
                c.copy_engine_launch_us
            };
            r.time_us - launch
        };
        let table = flow_us(&topo);
        assert!(
            (table - 2.0 * elems as f64 / 900e3).abs() < 1e-6 * table,
            "{elems}: {table}"
        );
        let json = r#"{"memories":[{"gpu":"GPU0","gbps":900,"sm_copy_gbps":450}]}"#;
        let cal = relaycc_topo::Calibration::parse(json, "t").unwrap();
        let measured = flow_us(&cal.apply(&topo).unwrap());
        let want = if on_sms { 2.0 } else { 1.0 };
        assert!(
            (measured / table - want).abs() < 1e-9,
            "{elems}: {measured} vs {table}"
        );
    }
}

/// The host issues launches, not ops: small copies that join a batch are issued with its
/// first copy. With 10 us per launch, three batched 1 MiB copies of one lane are issued at
/// 10 us, another lane's copy between them in op order at 20 us, and a 16 MiB copy after
/// them on the first lane (a copy engine's launch) at 30 us.
#[test]
fn ops_in_one_launch_are_issued_together() {
    let topo = dgx1();
    let e = topo
        .link_between(topo.gpu(0).unwrap(), topo.gpu(1).unwrap())
        .unwrap()
        .index() as u32;
    let mut p = Plan::new(Request::point_to_point(0, 1, 1 << 24), "batched");
    let lane = p.add_lane(Gpu(0), "l");
    let other = p.add_lane(Gpu(0), "other");
    for (l, len) in [
        (lane, 1u64 << 20),
        (other, 1 << 20),
        (lane, 1 << 20),
        (lane, 1 << 20),
        (lane, 1 << 24),
    ] {
        let src = Region::new(p.add_scratch(Gpu(0), len), 0, len);
        let dst = Region::new(p.add_scratch(Gpu(1), len), 0, len);
        p.copy(l, src, dst, vec![e], vec![]);
    }
    let cfg = SimConfig {
        issue_us: 10.0,
        ..SimConfig::default()
    };
    let m = Model::build(&topo, &p, &cfg).unwrap();
    assert_eq!(m.issue_order, [0, 1, 0, 0, 2]);
    let at: Vec<f64> = (0..5).map(|i| m.issued_at_us(i)).collect();
    assert_eq!(at, [10.0, 20.0, 10.0, 10.0, 30.0]);
    let k = rates::KERNEL_LAUNCH_US;
    let ce = rates::COPY_ENGINE_LAUNCH_US;
    assert_eq!(m.latency_us, [k + 0.6, k + 0.6, 0.6, 0.6, ce + 0.6]);
}

/// Four ranks of one GPU (`shared-gpu-4`): the all_reduce the shared-memory planner gives
/// them is one reduction of every rank's input into rank 0's output and three copies of that
/// result to the other outputs, which the executor runs as one kernel. The four arenas are one
/// memory; the copies between arenas load it, not their path's links; the joined copies move
/// no bytes of their own and their writes are the reduction's: 4 reads and 4 writes per byte,
/// of which the writes bind at half the memory's rate, so the whole takes 8 bytes per byte at
/// the memory's rate (the copies after it took 6 more on their own). A calibrated write share
/// moves the writes' cap, and with it which of the two binds.
#[test]
fn arenas_of_one_gpu_share_its_memory_and_a_fan_out_is_one_flow() {
    let topo = relaycc_topo::preset("shared-gpu-4").unwrap();
    let len = 64u64 << 20;
    let mut p = Plan::new(Request::point_to_point(0, 1, len), "test");
    let lane = p.add_lane(Gpu(0), "l");
    let region = |p: &mut Plan, g: u32| Region::new(p.add_scratch(Gpu(g), len), 0, len);
    let srcs: Vec<Region> = (0..4).map(|g| region(&mut p, g)).collect();
    let out = region(&mut p, 0);
    p.reduce(lane, srcs, out, false, vec![]);
    // The node standing for the memory, every arena's one neighbour.
    let hub = topo.graph().neighbors(topo.gpu(0).unwrap()).next().unwrap();
    for g in 1..4 {
        let dst = region(&mut p, g);
        let path = [topo.gpu(0).unwrap(), hub, topo.gpu(g).unwrap()];
        let edges = path
            .windows(2)
            .map(|w| topo.link_between(w[0], w[1]).unwrap().index() as u32)
            .collect();
        p.copy(lane, out, dst, edges, vec![]);
    }
    let fan_out = p.clone();
    let m = Model::build(&topo, &p, &SimConfig::default()).unwrap();
    // The memory and its writes, nothing else.
    assert_eq!(m.caps.len(), 2, "{:?}", m.res_orig);
    assert!(m.edge_of(0).is_none() && m.edge_of(1).is_none());
    assert_eq!(m.memory_of(0), Some(Gpu(0)));
    assert_eq!(m.resource_name(&topo, 1), "GPU0 memory writes");
    assert_eq!(m.uses.of(0), (&[0, 1][..], &[8.0, 4.0][..]));
    assert_eq!(&m.bytes[1..], &[0.0; 3]);
    let mem = rates::HBM_H100_GBPS * 1e3;
    assert_eq!(m.caps, [mem, mem * crate::DEVICE_WRITE_SHARE]);
    let r = crate::simulate(&topo, &p, &SimConfig::default()).unwrap();
    let want = rates::KERNEL_LAUNCH_US + 8.0 * len as f64 / mem;
    assert!(
        (r.time_us - want).abs() < 1e-6 * want,
        "{} vs {want}",
        r.time_us
    );
    // A calibrated write share caps the writes instead: at 0.25 of the rate the four writes
    // per byte bind, 16 bytes per byte at the memory's rate; at 0.8 the 8 reads and writes do.
    for (share, per_byte) in [(0.25, 16.0), (0.8, 8.0)] {
        let json = format!(
            r#"{{"memories":[{{"gpu":"GPU0","gbps":{},"write_share":{share}}}]}}"#,
            rates::HBM_H100_GBPS
        );
        let cal = relaycc_topo::Calibration::parse(&json, "t").unwrap();
        let t = cal.apply(&topo).unwrap();
        let m = Model::build(&t, &fan_out, &SimConfig::default()).unwrap();
        assert_eq!(m.caps, [mem, mem * share]);
        let r = crate::simulate(&t, &fan_out, &SimConfig::default()).unwrap();
        let want = rates::KERNEL_LAUNCH_US + per_byte * len as f64 / mem;
        assert!(
            (r.time_us - want).abs() < 1e-6 * want,
            "{share}: {} vs {want}",
            r.time_us
        );
    }
}
