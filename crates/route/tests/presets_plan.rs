//! The presets of current machines plan real collectives: every new preset plans an all_reduce
//! whose chosen plan and baseline pass both checkers, and on GeForce boxes, where the driver
//! refuses PCIe peer-to-peer, every GPU-to-GPU byte is staged through host memory.

use relaycc_route::path::{RelayPolicy, route_from_links};
use relaycc_route::{
    Collective, DType, Location, OpKind, Plan, PlanOptions, ReduceOp, Request, check, check_routes,
    plan,
};
use relaycc_topo::{LinkKind, Topology};

const PRESETS: [&str; 7] = [
    "dgx-b200",
    "hgx-h200",
    "gb200-nvl72",
    "gh200-quad",
    "l40s-8gpu",
    "rtx4090-8gpu",
    "rtx5090-8gpu",
];

fn all_reduce(gpus: Vec<u32>, count: u64) -> Request {
    Request::new(Collective::AllReduce, gpus, count, DType::F32).with_op(ReduceOp::Sum)
}

fn verify(p: &Plan, topo: &Topology, what: &str) {
    check(p).unwrap_or_else(|e| panic!("{what} {}: {e}", p.algorithm));
    check_routes(p, topo).unwrap_or_else(|e| panic!("{what} {} routes: {e}", p.algorithm));
}

/// Copies between two locations of `p`: (from, to, edges).
fn copies(p: &Plan) -> Vec<(Location, Location, Vec<u32>)> {
    p.ops
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Copy { src, dst } => Some((
                p.location(src.buffer)?,
                p.location(dst.buffer)?,
                op.edges.clone(),
            )),
            OpKind::Reduce { .. } => None,
        })
        .collect()
}

#[test]
fn every_new_preset_plans_an_all_reduce_of_eight_gpus() {
    for name in PRESETS {
        let topo = relaycc_topo::preset(name).unwrap();
        let gpus: Vec<u32> = (0..topo.gpu_count().min(8)).collect();
        let planned = plan(&topo, &all_reduce(gpus, 1 << 20), &PlanOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        verify(&planned.plan, &topo, name);
        verify(&planned.baseline_plan, &topo, name);
        assert!(planned.predicted.time_us > 0.0, "{name}");
        assert!(
            planned.bound.time_us <= planned.predicted.time_us * (1.0 + 1e-9),
            "{name}: bound {} above the plan {}",
            planned.bound.time_us,
            planned.predicted.time_us
        );
    }
}

#[test]
fn twenty_four_ranks_across_the_nvl72_get_a_baseline_all_reduce() {
    // Past 21 ranks the ring search's count of (n-1)! orders must saturate, not overflow.
    let topo = relaycc_topo::preset("gb200-nvl72").unwrap();
    let req = all_reduce((0..72).step_by(3).collect(), 24 * 1024);
    let p = relaycc_route::planner::baseline_plan(&topo, &req).unwrap();
    verify(&p, &topo, "gb200-nvl72 baseline");
    // One NVLink domain: no copy touches PCIe or host memory.
    for (from, to, edges) in copies(&p) {
        assert!(matches!((from, to), (Location::Gpu(_), Location::Gpu(_))));
        for e in edges {
            let link = topo.link(relaycc_topo::LinkId::new(e as usize));
            assert!(
                link.kind.is_nvlink(),
                "{from:?} -> {to:?} uses {:?}",
                link.kind
            );
        }
    }
}

#[test]
fn new_presets_plan_across_two_node_clusters() {
    for name in PRESETS {
        let spec = format!("cluster:2x{name}:ib-ndr");
        let topo = relaycc_topo::preset(&spec).unwrap();
        let per_node = topo.gpu_count() / 2;
        // Two GPUs of each node keep the 72-GPU racks quick.
        let gpus = vec![0, 1, per_node, per_node + 1];
        let planned = plan(&topo, &all_reduce(gpus, 4096), &PlanOptions::default())
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        verify(&planned.plan, &topo, &spec);
        verify(&planned.baseline_plan, &topo, &spec);
    }
}

#[test]
fn geforce_plans_stage_every_gpu_to_gpu_byte_through_host_memory() {
    for name in ["rtx4090-8gpu", "rtx5090-8gpu"] {
        let topo = relaycc_topo::preset(name).unwrap();
        let planned = plan(
            &topo,
            &all_reduce((0..8).collect(), 1 << 22),
            &PlanOptions::default(),
        )
        .unwrap();
        for p in [&planned.plan, &planned.baseline_plan] {
            let cs = copies(p);
            assert!(
                cs.iter()
                    .all(|(f, t, _)| !matches!((f, t), (Location::Gpu(_), Location::Gpu(_)))),
                "{name} {}: a copy goes GPU to GPU directly",
                p.algorithm
            );
            assert!(
                cs.iter().any(|(_, t, _)| matches!(t, Location::Host(_))),
                "{name} {}: nothing is staged in host memory",
                p.algorithm
            );
        }
        let req = Request::new(Collective::SendRecv, vec![0, 1], 1 << 20, DType::F32);
        let p2p = plan(&topo, &req, &PlanOptions::default()).unwrap();
        for share in &p2p.routes {
            let hops = &share.route.hops;
            assert!(hops.len() >= 2, "{name}: {:?}", share.route.names(&topo));
            assert!(matches!(hops[0].to, Location::Host(_)));
        }
    }
}

#[test]
fn max_flow_paths_on_geforce_stage_at_the_cpu_they_pass() {
    let topo = relaycc_topo::preset("rtx4090-8gpu").unwrap();
    let all = |_: u32| true;
    let (total, routes) = relaycc_route::path::max_flow_routes(&topo, 0, 1, &all).unwrap();
    assert!(total > 0.0);
    assert!(!routes.is_empty());
    for (r, _) in &routes {
        assert!(r.hops.len() >= 2, "{:?}", r.names(&topo));
        for h in &r.hops {
            let gpu_to_gpu = matches!((h.from, h.to), (Location::Gpu(_), Location::Gpu(_)));
            assert!(!gpu_to_gpu, "{:?}", r.names(&topo));
        }
    }
    // A path that joins GPU0 and GPU1 over PCIe through CPU0 is cut there.
    let g0 = topo.gpu(0).unwrap();
    let g1 = topo.gpu(1).unwrap();
    let cpu = topo.attached_cpu(g0).unwrap();
    let links = [
        topo.link_between(g0, cpu).unwrap(),
        topo.link_between(cpu, g1).unwrap(),
    ];
    assert!(matches!(topo.link(links[0]).kind, LinkKind::Pcie { .. }));
    let r = route_from_links(&topo, &links).unwrap();
    assert_eq!(r.names(&topo), ["GPU0", "CPU0", "GPU1"]);
    // No relay on a GeForce box may forward directly either.
    assert!(relaycc_route::path::relay_routes(&topo, 0, 1, &all).is_empty());
    assert!(relaycc_route::path::direct_route(&topo, 0, 1).is_none());
    assert!(RelayPolicy::Any.allows(&topo, &[0, 1], 2));
}

/// With a per-op issue cost (what relaycc's CUDA executor pays), the planner weighs op counts:
/// on `nvswitch-8` at 16 MiB it picks a plan of far fewer ops than without one, and that plan,
/// timed with the issue cost, is no slower than the issue-free winner timed the same way.
#[test]
fn an_issue_cost_picks_plans_of_fewer_ops() {
    let topo = relaycc_topo::preset("nvswitch-8").unwrap();
    let req = all_reduce((0..8).collect(), 4 << 20);
    let free = plan(&topo, &req, &PlanOptions::default()).unwrap();
    let sim = relaycc_route::SimConfig {
        issue_us: 5.0,
        ..Default::default()
    };
    let costly = plan(
        &topo,
        &req,
        &PlanOptions {
            sim,
            ..PlanOptions::default()
        },
    )
    .unwrap();
    verify(&costly.plan, &topo, "issue-aware");
    assert!(
        costly.plan.ops.len() * 4 <= free.plan.ops.len(),
        "{} ops ({}) vs {} ops ({})",
        costly.plan.ops.len(),
        costly.plan.algorithm,
        free.plan.ops.len(),
        free.plan.algorithm
    );
    let t = |p: &Plan| relaycc_route::simulate(&topo, p, &sim).unwrap().time_us;
    assert!(
        t(&costly.plan) <= t(&free.plan),
        "{} vs {}",
        t(&costly.plan),
        t(&free.plan)
    );
    // Every op waits for its issue: the plan's time is at least its ops' issue time.
    assert!(t(&costly.plan) >= 5.0 * costly.plan.ops.len() as f64);
}
