//! The flow simulator against answers worked out by hand.
//!
//! Modules: `fixtures` (topologies and plan builders), then one module per area: single
//! flows, sharing, ordering and pipelining, memories, reports, and properties. Bad plans are
//! tested beside the checks, in `crates/sim/src/model.rs`.

mod fixtures {
    use relaycc_route::{BufferRef, DType, Location, Plan, Region, Request};
    use relaycc_topo::{GpuInfo, LinkKind, Topology, TopologyBuilder, rates};

    pub const MIB: u64 = 1 << 20;

    /// The DGX-1 V100 with mechanism costs taken out ([`bare`]).
    pub fn dgx1() -> Topology {
        bare(relaycc_topo::preset("dgx1-v100").unwrap())
    }

    /// `t` with no copy-engine or kernel launch cost, so that every op pays only the
    /// settings' overhead ([`cfg`]) and its links' latencies: these tests check the fluid
    /// engine against hand-worked answers, not the cost model (tested in `tests/costs.rs`).
    pub fn bare(mut t: Topology) -> Topology {
        let mut c = *t.costs();
        c.copy_engine_launch_us = 0.0;
        c.kernel_launch_us = 0.0;
        t.set_costs(c);
        t
    }

    /// Settings with the 1 us per-op overhead the hand-worked answers assume.
    pub fn cfg() -> relaycc_route::SimConfig {
        overhead(1.0)
    }

    /// The directed edge between GPUs `a` and `b`.
    pub fn gpu_edge(topo: &Topology, a: u32, b: u32) -> u32 {
        let (x, y) = (topo.gpu(a).unwrap(), topo.gpu(b).unwrap());
        topo.link_between(x, y).unwrap().index() as u32
    }

    /// An empty byte-typed plan (one element is one byte).
    pub fn plan() -> Plan {
        Plan::new(Request::point_to_point(0, 1, 1 << 30), "test")
    }

    /// Copy `bytes` from a fresh buffer at `from` to a fresh one at `to`.
    pub fn copy(
        plan: &mut Plan,
        lane: u32,
        from: Location,
        to: Location,
        bytes: u64,
        edges: &[u32],
        deps: &[u32],
    ) -> u32 {
        let src = plan.add_scratch(from, bytes);
        let dst = plan.add_scratch(to, bytes);
        let (edges, deps) = (edges.to_vec(), deps.to_vec());
        plan.copy(lane, whole(src, bytes), whole(dst, bytes), edges, deps)
    }

    /// Copy `bytes` from GPU `from` to GPU `to` over the direct edge between them.
    pub fn gpu_copy(
        topo: &Topology,
        plan: &mut Plan,
        lane: u32,
        from: u32,
        to: u32,
        bytes: u64,
        deps: &[u32],
    ) -> u32 {
        let (a, b) = (Location::Gpu(from), Location::Gpu(to));
        copy(plan, lane, a, b, bytes, &[gpu_edge(topo, from, to)], deps)
    }

    /// Settings with this per-op overhead.
    pub fn overhead(op_overhead_us: f64) -> relaycc_route::SimConfig {
        relaycc_route::SimConfig {
            op_overhead_us,
            ..Default::default()
        }
    }

    pub fn whole(b: BufferRef, len: u64) -> Region {
        Region::new(b, 0, len)
    }

    pub fn close(got: f64, want: f64) {
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1e-9),
            "got {got}, want {want}"
        );
    }

    /// Three GPUs joined by zero-latency links of chosen rates, `g0 -> g1` and `g1 -> g2`.
    pub fn chain(g01: f64, g12: f64) -> (Topology, u32, u32) {
        let mut b = TopologyBuilder::new("chain");
        let g: Vec<_> = (0..3).map(|i| b.add_gpu(GpuInfo::new(i))).collect();
        let kind = LinkKind::C2c;
        let (e01, _) = b.connect_with(g[0], g[1], kind, g01, 0.0);
        let (e12, _) = b.connect_with(g[1], g[2], kind, g12, 0.0);
        (
            bare(b.build().unwrap()),
            e01.index() as u32,
            e12.index() as u32,
        )
    }

    /// One Broadwell socket whose host memory runs at `host_gbps`, two GPUs under it on PCIe
    /// Gen3 x16 (10 GB/s). Returns the topology and the CPU's node index.
    pub fn one_socket(host_gbps: f64) -> (Topology, u32) {
        let mut b = TopologyBuilder::new("one-socket");
        let cpu = b.add_cpu(0, rates::CpuFamily::IntelBroadwell);
        for i in 0..2 {
            let g = b.add_gpu(GpuInfo::new(i));
            b.pcie(cpu, g, 3, 16);
        }
        if let Some(relaycc_topo::Node {
            kind: relaycc_topo::NodeKind::Cpu(c),
            ..
        }) = b.node_mut(cpu)
        {
            c.host_mem_gbps = host_gbps;
        }
        (bare(b.build().unwrap()), cpu.index() as u32)
    }

    /// A chunked ring on the DGX-1 NVLink ring 0-1-2-3-7-6-5-4: `channels` lanes per GPU; each
    /// step a lane reduces the chunk it received into its own and sends the result on.
    pub fn ring_plan(topo: &Topology, channels: u32, steps: u32, chunk: u64) -> Plan {
        const RING: [u32; 8] = [0, 1, 2, 3, 7, 6, 5, 4];
        let req = Request::new(
            relaycc_route::Collective::AllReduce,
            RING.to_vec(),
            chunk,
            DType::F32,
        );
        let mut plan = Plan::new(req, "ring");
        let mut lanes = Vec::new();
        let mut bufs = Vec::new();
        for (pos, &g) in RING.iter().enumerate() {
            for c in 0..channels {
                lanes.push(plan.add_lane(Location::Gpu(g), format!("GPU{g} ch{c}")));
                let next = RING[(pos + 1) % 8];
                let stage = plan.add_scratch(Location::Gpu(next), chunk);
                let acc = plan.add_scratch(Location::Gpu(g), chunk);
                bufs.push((acc, stage, gpu_edge(topo, g, next)));
            }
        }
        let n = lanes.len();
        let ch = channels as usize;
        let mut last_send = vec![u32::MAX; n];
        for _ in 0..steps {
            let prev_send = last_send.clone();
            for pos in 0..8 {
                for c in 0..ch {
                    let l = pos * ch + c;
                    let from = ((pos + 7) % 8) * ch + c;
                    let (acc, _, edge) = bufs[l];
                    let (_, staged, _) = bufs[from];
                    let deps = if prev_send[from] == u32::MAX {
                        vec![]
                    } else {
                        vec![prev_send[from]]
                    };
                    plan.reduce(
                        lanes[l],
                        vec![whole(staged, chunk), whole(acc, chunk)],
                        whole(acc, chunk),
                        false,
                        deps,
                    );
                    let (_, stage, _) = bufs[l];
                    last_send[l] = plan.copy(
                        lanes[l],
                        whole(acc, chunk),
                        whole(stage, chunk),
                        vec![edge],
                        vec![],
                    );
                }
            }
        }
        plan
    }
}

/// One flow alone: latency plus bytes over the edge's rate.
mod single {
    use super::fixtures::*;
    use relaycc_route::Location::Gpu;
    use relaycc_route::simulate;

    #[test]
    fn one_256_mib_copy_over_nv1() {
        let topo = dgx1();
        let e = gpu_edge(&topo, 0, 1);
        assert_eq!(topo.link(relaycc_topo::LinkId::new(e as usize)).gbps, 24.2);
        let mut p = plan();
        let lane = p.add_lane(Gpu(0), "send");
        let bytes = 256 * MIB;
        copy(&mut p, lane, Gpu(0), Gpu(1), bytes, &[e], &[]);
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        let flow_us = bytes as f64 / 24.2e3;
        close(r.time_us, 1.0 + 0.6 + flow_us);
        close(r.ops[0].flow_start_us, 1.6);
        let used = r.edge(e).unwrap();
        close(used.bytes, bytes as f64);
        close(used.busy_us, flow_us);
        close(used.utilisation, flow_us / r.time_us);
        assert_eq!(r.edges.len(), 1);
        assert!(
            r.memories.is_empty(),
            "copies over links charge no device memory"
        );
    }

    #[test]
    fn zero_byte_ops_take_only_their_latency() {
        let topo = dgx1();
        let mut p = plan();
        let lane = p.add_lane(Gpu(0), "send");
        let a = gpu_copy(&topo, &mut p, lane, 0, 1, 0, &[]);
        gpu_copy(&topo, &mut p, lane, 0, 1, 0, &[a]);
        let cfg = overhead(2.0);
        let r = simulate(&topo, &p, &cfg).unwrap();
        close(r.time_us, 2.0 * 2.6);
        assert!(r.edges.is_empty());
    }

    #[test]
    fn empty_plan_takes_no_time() {
        let r = simulate(&dgx1(), &plan(), &super::fixtures::cfg()).unwrap();
        assert_eq!(r.time_us, 0.0);
        assert!(r.ops.is_empty());
    }
}

/// Concurrent flows and max-min fairness.
mod sharing {
    use super::fixtures::*;
    use relaycc_route::Location::Gpu;
    use relaycc_route::simulate;

    #[test]
    fn two_copies_on_one_edge_take_twice_as_long() {
        let topo = dgx1();
        let e = gpu_edge(&topo, 0, 1);
        let mut p = plan();
        for l in 0..2 {
            let lane = p.add_lane(Gpu(0), format!("send{l}"));
            copy(&mut p, lane, Gpu(0), Gpu(1), 64 * MIB, &[e], &[]);
        }
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        let want = 1.6 + 2.0 * (64 * MIB) as f64 / 24.2e3;
        close(r.ops[0].end_us, want);
        close(r.ops[1].end_us, want);
        close(r.edge(e).unwrap().utilisation, (want - 1.6) / want);
    }

    #[test]
    fn copies_on_different_edges_do_not_interfere() {
        let topo = dgx1();
        let mut p = plan();
        let (a, b) = (p.add_lane(Gpu(0), "a"), p.add_lane(Gpu(2), "b"));
        gpu_copy(&topo, &mut p, a, 0, 1, 64 * MIB, &[]);
        gpu_copy(&topo, &mut p, b, 2, 3, 64 * MIB, &[]);
        // Opposite direction of the first edge: full duplex, so no sharing either.
        let c = p.add_lane(Gpu(1), "c");
        gpu_copy(&topo, &mut p, c, 1, 0, 64 * MIB, &[]);
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        close(r.ops[0].end_us, 1.6 + (64 * MIB) as f64 / 24.2e3);
        close(r.ops[1].end_us, 1.6 + (64 * MIB) as f64 / 48.4e3); // GPU2-GPU3 is NV2
        close(r.ops[2].end_us, r.ops[0].end_us);
    }

    #[test]
    fn three_flows_get_the_water_filling_answer() {
        // A: e01 (10 GB/s); B: e01 then e12; C: e12 (30 GB/s). e01 binds A and B at 5 GB/s;
        // C gets 25. A and B (5 MB each) end at 1000 us; C (50 MB) has moved 25 MB by then
        // and finishes the other 25 MB alone at 30 GB/s: 1000 + 25e6 / 30e3 us.
        let (topo, e01, e12) = chain(10.0, 30.0);
        let mut p = plan();
        let lanes: Vec<u32> = (0..3)
            .map(|i| p.add_lane(Gpu(0), format!("l{i}")))
            .collect();
        copy(&mut p, lanes[0], Gpu(0), Gpu(1), 5_000_000, &[e01], &[]);
        copy(
            &mut p,
            lanes[1],
            Gpu(0),
            Gpu(2),
            5_000_000,
            &[e01, e12],
            &[],
        );
        copy(&mut p, lanes[2], Gpu(1), Gpu(2), 50_000_000, &[e12], &[]);
        let r = simulate(&topo, &p, &overhead(0.0)).unwrap();
        close(r.ops[0].end_us, 1000.0);
        close(r.ops[1].end_us, 1000.0);
        close(r.ops[2].end_us, 1000.0 + 25e6 / 30e3);
        close(r.edge(e12).unwrap().bytes, 55e6);
        close(r.edge(e12).unwrap().busy_us, r.time_us);
    }

    #[test]
    fn a_late_flow_slows_an_early_one_only_while_both_run() {
        // 10 MB alone for 500 us at 10 GB/s (5 MB done), then 5 MB each at 5 GB/s for 1000 us;
        // the second flow then has 5 MB left alone: 500 us more.
        let (topo, e01, _) = chain(10.0, 10.0);
        let mut p = plan();
        let (a, b) = (p.add_lane(Gpu(0), "a"), p.add_lane(Gpu(0), "b"));
        let delay = copy(&mut p, b, Gpu(0), Gpu(0), 0, &[], &[]);
        copy(&mut p, a, Gpu(0), Gpu(1), 10_000_000, &[e01], &[]);
        copy(&mut p, b, Gpu(0), Gpu(1), 10_000_000, &[e01], &[delay]);
        let r = simulate(&topo, &p, &overhead(500.0)).unwrap();
        close(r.ops[1].end_us, 500.0 + 500.0 + 1000.0);
        close(r.ops[2].end_us, 2500.0);
    }
}

/// Lane order, dependencies and pipelines.
mod ordering {
    use super::fixtures::*;
    use relaycc_route::Location::Gpu;
    use relaycc_route::simulate;

    #[test]
    fn ops_wait_for_the_host_to_issue_them_in_op_order() {
        // Two independent 1 MB copies on two lanes over separate 10 GB/s links (100 us each),
        // no launch costs. Issued 40 us apart, op i starts at 40 (i + 1) us; without an issue
        // cost both run at once.
        let (topo, e01, e12) = chain(10.0, 10.0);
        let mut p = plan();
        let lanes: Vec<u32> = (0..2)
            .map(|i| p.add_lane(Gpu(0), format!("l{i}")))
            .collect();
        copy(&mut p, lanes[0], Gpu(0), Gpu(1), 1_000_000, &[e01], &[]);
        copy(&mut p, lanes[1], Gpu(1), Gpu(2), 1_000_000, &[e12], &[]);
        let free = simulate(&topo, &p, &overhead(0.0)).unwrap();
        close(free.time_us, 100.0);
        let cfg = relaycc_route::SimConfig {
            issue_us: 40.0,
            ..overhead(0.0)
        };
        let r = simulate(&topo, &p, &cfg).unwrap();
        for (i, op) in r.ops.iter().enumerate() {
            close(op.start_us, 40.0 * (i as f64 + 1.0));
        }
        close(r.time_us, 80.0 + 100.0);
        // The lower bound knows the host issues the last op at 80 us.
        let lb = relaycc_route::PreparedSim::new(&topo, &p, &cfg)
            .unwrap()
            .lower_bound_us();
        assert!((100.0..=r.time_us).contains(&lb), "{lb}");
        assert!(lb >= 80.0);
        // A plan of no ops ends at 0, and so does its bound.
        let empty = plan();
        let none = relaycc_route::PreparedSim::new(&topo, &empty, &cfg).unwrap();
        assert_eq!(none.lower_bound_us(), 0.0);
        assert_eq!(simulate(&topo, &empty, &cfg).unwrap().time_us, 0.0);
        let bad = relaycc_route::SimConfig {
            issue_us: -1.0,
            ..overhead(0.0)
        };
        assert!(simulate(&topo, &p, &bad).is_err());
    }

    #[test]
    fn lane_order_serializes() {
        let topo = dgx1();
        let mut p = plan();
        let lane = p.add_lane(Gpu(0), "send");
        gpu_copy(&topo, &mut p, lane, 0, 1, 16 * MIB, &[]);
        gpu_copy(&topo, &mut p, lane, 0, 3, 16 * MIB, &[]);
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        assert_eq!(r.ops[1].start_us, r.ops[0].end_us);
        close(
            r.time_us,
            1.6 + (16 * MIB) as f64 / 24.2e3 + 1.6 + (16 * MIB) as f64 / 48.4e3,
        );
    }

    #[test]
    fn deps_serialize_across_lanes() {
        let topo = dgx1();
        let mut p = plan();
        let (a, b) = (p.add_lane(Gpu(0), "a"), p.add_lane(Gpu(2), "b"));
        let first = gpu_copy(&topo, &mut p, a, 0, 1, 16 * MIB, &[]);
        gpu_copy(&topo, &mut p, b, 2, 3, 16 * MIB, &[first]);
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        assert_eq!(r.ops[1].start_us, r.ops[0].end_us);
    }

    /// k chunks relayed GPU0 -> `via` -> GPU7, hop 2 of chunk i after hop 1 of chunk i.
    fn relay(via: u32, k: u32, chunk: u64) -> (f64, f64, f64) {
        let topo = dgx1();
        let (e1, e2) = (gpu_edge(&topo, 0, via), gpu_edge(&topo, via, 7));
        let rate = |e: u32| topo.link(relaycc_topo::LinkId::new(e as usize)).gbps * 1e3;
        let mut p = plan();
        let (a, b) = (p.add_lane(Gpu(0), "hop1"), p.add_lane(Gpu(via), "hop2"));
        for _ in 0..k {
            let h1 = copy(&mut p, a, Gpu(0), Gpu(via), chunk, &[e1], &[]);
            copy(&mut p, b, Gpu(via), Gpu(7), chunk, &[e2], &[h1]);
        }
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        let t1 = 1.6 + chunk as f64 / rate(e1);
        let t2 = 1.6 + chunk as f64 / rate(e2);
        (r.time_us, t1, t2)
    }

    #[test]
    fn a_two_hop_relay_pipelines() {
        // GPU0 -> GPU3 is NV2 (48.4), GPU3 -> GPU7 NV1 (24.2): the slower second hop sets the
        // pace once the first chunk has arrived: T1 + k T2.
        let k = 8;
        let (t, t1, t2) = relay(3, k, 4 * MIB);
        close(t, t1 + f64::from(k) * t2);
        // GPU0 -> GPU4 -> GPU7 is NV2 then NV2: equal hops take (k + 1) chunk times, which is
        // (k + 1) / k of the unrelayed chunked copy.
        let (t, t1, t2) = relay(4, k, 4 * MIB);
        close(t1, t2);
        close(t, f64::from(k + 1) * t1);
    }
}

/// Memory bandwidth: reductions, copies inside a memory, host staging.
mod memory {
    use super::fixtures::*;
    use relaycc_route::Location::{Gpu, Host};
    use relaycc_route::simulate;

    #[test]
    fn reductions_cost_device_memory_bandwidth() {
        let topo = dgx1(); // V100: 900 GB/s HBM2
        let mut p = plan();
        let n = 64 * MIB;
        let reduce = |p: &mut relaycc_route::Plan, lane| {
            let (a, b) = (p.add_scratch(Gpu(0), n), p.add_scratch(Gpu(0), n));
            p.reduce(
                lane,
                vec![whole(a, n), whole(b, n)],
                whole(a, n),
                false,
                vec![],
            )
        };
        let l0 = p.add_lane(Gpu(0), "r0");
        reduce(&mut p, l0);
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        close(r.time_us, 1.0 + 3.0 * n as f64 / 900e3);
        let mem = r.memory(Gpu(0)).unwrap();
        close(mem.bytes, 3.0 * n as f64);
        assert_eq!(mem.name, "GPU0");
        // Two at once on one GPU halve each other; a copy off that GPU is not slowed.
        let l1 = p.add_lane(Gpu(0), "r1");
        reduce(&mut p, l1);
        let l2 = p.add_lane(Gpu(0), "send");
        gpu_copy(&topo, &mut p, l2, 0, 1, n, &[]);
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        close(r.ops[0].end_us, 1.0 + 6.0 * n as f64 / 900e3);
        close(r.ops[1].end_us, r.ops[0].end_us);
        close(r.ops[2].end_us, 1.6 + n as f64 / 24.2e3);
    }

    #[test]
    fn a_copy_inside_one_memory_reads_and_writes_it() {
        let topo = dgx1();
        let mut p = plan();
        let lane = p.add_lane(Gpu(5), "local");
        copy(&mut p, lane, Gpu(5), Gpu(5), 90 * MIB, &[], &[]);
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        close(r.time_us, 1.0 + 2.0 * (90 * MIB) as f64 / 900e3);
    }

    #[test]
    fn host_staging_is_limited_by_host_memory_when_it_binds() {
        let bytes = 80_000_000;
        // Fast host memory: PCIe (10 GB/s) binds; slow (8 GB/s): host memory binds.
        for (host_gbps, rate) in [(76.8, 10.0), (8.0, 8.0)] {
            let (topo, cpu) = one_socket(host_gbps);
            let down = |g: u32| {
                let (c, g) = (topo.node_by_name("CPU0").unwrap(), topo.gpu(g).unwrap());
                (
                    topo.link_between(g, c).unwrap().index() as u32,
                    topo.link_between(c, g).unwrap().index() as u32,
                )
            };
            let mut p = plan();
            let lane = p.add_lane(Gpu(0), "stage");
            copy(&mut p, lane, Gpu(0), Host(cpu), bytes, &[down(0).0], &[]);
            let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
            close(r.time_us, 1.5 + bytes as f64 / (rate * 1e3));
            close(r.memory(Host(cpu)).unwrap().bytes, bytes as f64);
        }
        // Staging in and out at once: the slow host memory is shared, 4 GB/s each, though the
        // two PCIe edges are distinct.
        let (topo, cpu) = one_socket(8.0);
        let c = topo.node_by_name("CPU0").unwrap();
        let up = topo.link_between(topo.gpu(0).unwrap(), c).unwrap().index() as u32;
        let dn = topo.link_between(c, topo.gpu(1).unwrap()).unwrap().index() as u32;
        let mut p = plan();
        let (a, b) = (p.add_lane(Gpu(0), "in"), p.add_lane(Gpu(1), "out"));
        copy(&mut p, a, Gpu(0), Host(cpu), bytes, &[up], &[]);
        copy(&mut p, b, Host(cpu), Gpu(1), bytes, &[dn], &[]);
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        close(r.time_us, 1.5 + bytes as f64 / 4e3);
        close(
            r.memory(Host(cpu)).unwrap().utilisation,
            2.0 * bytes as f64 / (8e3 * r.time_us),
        );
    }
}

/// nccl-tests figures (the Chrome trace is tested in `crates/sim/src/trace.rs`).
mod reports {
    use super::fixtures::*;
    use relaycc_route::Location::Gpu;
    use relaycc_route::{BufferRef, Collective, DType, Plan, Request, simulate};

    #[test]
    fn all_reduce_on_four_ranks() {
        let topo = dgx1();
        let count = 16 * MIB;
        let req = Request::new(Collective::AllReduce, vec![0, 1, 2, 3], count, DType::F32);
        let mut p = Plan::new(req.clone(), "one copy");
        let lane = p.add_lane(Gpu(0), "send");
        let (a, b) = (BufferRef::Input(0), BufferRef::Output(1));
        p.copy(
            lane,
            whole(a, count),
            whole(b, count),
            vec![gpu_edge(&topo, 0, 1)],
            vec![],
        );
        let r = simulate(&topo, &p, &super::fixtures::cfg()).unwrap();
        let perf = r.perf(&req);
        let algbw = (count * 4) as f64 / (r.time_us * 1e-6) / 1e9;
        close(perf.time_us, r.time_us);
        close(perf.algbw_gbps, algbw);
        close(perf.busbw_gbps, algbw * 2.0 * 3.0 / 4.0);
    }
}

/// Properties over random plans.
mod properties {
    use super::fixtures::*;
    use proptest::prelude::*;
    use relaycc_route::Location::Gpu;
    use relaycc_route::simulate;

    /// (lane, edge pick, bytes, dep picks) for each op.
    type Spec = Vec<(u32, usize, u64, Vec<usize>)>;

    fn specs() -> impl Strategy<Value = Spec> {
        prop::collection::vec(
            (
                0u32..6,
                any::<usize>(),
                0u64..(8 * MIB),
                prop::collection::vec(any::<usize>(), 0..3),
            ),
            1..40,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn random_copy_dags_stay_within_bounds(spec in specs()) {
            let topo = dgx1();
            let edges: Vec<_> = topo.links().map(|(id, _, _, l)| (id.index() as u32, *l)).collect();
            let mut p = plan();
            for l in 0..6 {
                p.add_lane(Gpu(l), format!("lane{l}"));
            }
            let cfg = super::fixtures::cfg();
            let (mut lower, mut serial) = (0.0f64, 0.0f64);
            for (i, (lane, pick, bytes, deps)) in spec.iter().enumerate() {
                let (e, link) = edges[pick % edges.len()];
                // Deps only on earlier ops: a DAG.
                let deps = if i == 0 { vec![] } else { deps.iter().map(|d| (d % i) as u32).collect() };
                copy(&mut p, *lane, Gpu(0), Gpu(1), *bytes, &[e], &deps);
                let alone = cfg.op_overhead_us + link.latency_us + *bytes as f64 / (link.gbps * 1e3);
                lower = lower.max(alone);
                serial += alone;
            }
            let r = simulate(&topo, &p, &cfg).unwrap();
            prop_assert!(r.time_us >= lower * (1.0 - 1e-9), "{} < {}", r.time_us, lower);
            prop_assert!(r.time_us <= serial * (1.0 + 1e-9), "{} > {}", r.time_us, serial);
            for (op, s) in p.ops.iter().zip(&r.ops) {
                prop_assert!(s.start_us <= s.flow_start_us && s.flow_start_us <= s.end_us);
                for &d in &op.deps {
                    prop_assert!(r.ops[d as usize].end_us <= s.start_us);
                }
            }
        }

        #[test]
        fn random_edges_and_deps_never_panic(
            ops in prop::collection::vec((0u32..4, 0u32..200, 0u64..1000, prop::collection::vec(0u32..40, 0..3)), 0..30),
        ) {
            let topo = dgx1();
            let mut p = plan();
            for l in 0..3 {
                p.add_lane(Gpu(l), "l");
            }
            for (lane, edge, bytes, deps) in ops {
                copy(&mut p, lane, Gpu(0), Gpu(1), bytes, &[edge], &deps);
            }
            // Any outcome is fine but a panic; an Ok must cover every op.
            if let Ok(r) = simulate(&topo, &p, &super::fixtures::cfg()) {
                prop_assert_eq!(r.ops.len(), p.ops.len());
                prop_assert!(r.time_us.is_finite());
            }
        }
    }

    #[test]
    fn a_chunked_ring_is_paced_by_its_slowest_link() {
        // 8 GPUs, 2 channels: each NV1 hop of the ring carries 2 flows, so a step's copy runs at
        // 12.1 GB/s; the makespan lies between steps x (slowest copy) and the serial sum.
        let topo = dgx1();
        let (channels, steps, chunk) = (2, 20, 256 * 1024);
        let plan = ring_plan(&topo, channels, steps, chunk);
        assert_eq!(plan.ops.len(), (8 * channels * steps * 2) as usize);
        let r = simulate(&topo, &plan, &super::fixtures::cfg()).unwrap();
        let copy_us = 1.6 + (chunk * 4) as f64 / 12.1e3;
        assert!(r.time_us >= f64::from(steps) * copy_us, "{}", r.time_us);
        assert!(
            r.time_us <= f64::from(steps) * 8.0 * 2.0 * copy_us * 2.0,
            "{}",
            r.time_us
        );
        assert!(r.memories.len() == 8 && r.edges.len() == 8);
        assert!(
            r.edges
                .iter()
                .all(|e| e.utilisation > 0.0 && e.utilisation <= 1.0 + 1e-9)
        );
    }
}

/// A simulation given a deadline already past gives up (none of its result is reported); with
/// no deadline, or a distant one, it runs to the same end as `simulate`.
mod deadline {
    use std::time::{Duration, Instant};

    use relaycc_route::{Collective, DType, PlanOptions, PreparedSim, Request, SimConfig, plan};

    #[test]
    fn a_past_deadline_gives_up_and_a_distant_one_does_not() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::new(Collective::AllReduce, (0..8).collect(), 1 << 22, DType::F32);
        let p = plan(&topo, &req, &PlanOptions::default()).unwrap().plan;
        assert!(
            p.ops.len() > 1000,
            "enough event batches to reach a clock check"
        );
        let prepared = PreparedSim::new(&topo, &p, &SimConfig::default()).unwrap();
        let whole = prepared.simulate(&topo).unwrap().time_us;
        let past = Instant::now();
        assert!(
            prepared
                .simulate_until(&topo, Some(past))
                .unwrap()
                .is_none()
        );
        let unbounded = prepared.simulate_until(&topo, None).unwrap().unwrap();
        assert_eq!(unbounded.time_us, whole);
        let later = Instant::now() + Duration::from_secs(3600);
        let bounded = prepared
            .simulate_until(&topo, Some(later))
            .unwrap()
            .unwrap();
        assert_eq!(bounded.time_us, whole);
    }

    /// Few batches of many flows (all sharing one link) are checked by their work: 40,000
    /// copies ending in 128 batches, far fewer than `DEADLINE_CHECK_BATCHES`, still read the
    /// clock, and show their progress when they do.
    #[test]
    fn few_batches_of_many_flows_still_read_the_clock() {
        use super::fixtures::{copy, dgx1, gpu_edge, plan as empty};
        use relaycc_route::Location::Gpu;
        use relaycc_route::sim::{DEADLINE_CHECK_BATCHES, DEADLINE_CHECK_WORK};
        let topo = dgx1();
        let e = gpu_edge(&topo, 0, 1);
        let mut p = empty();
        let lanes = 40_000u32;
        let ends = 128u64;
        for l in 0..lanes {
            let lane = p.add_lane(Gpu(0), format!("send{l}"));
            let bytes = (1 + u64::from(l) % ends) << 10;
            copy(&mut p, lane, Gpu(0), Gpu(1), bytes, &[e], &[]);
        }
        assert!(ends < u64::from(DEADLINE_CHECK_BATCHES));
        assert!(lanes as usize * ends as usize / 2 > 2 * DEADLINE_CHECK_WORK);
        let prepared = PreparedSim::new(&topo, &p, &SimConfig::default()).unwrap();
        let seen = std::cell::Cell::new(Vec::new());
        let r = prepared
            .simulate_watched(&topo, &|progress| {
                let mut v = seen.take();
                v.push(progress.ops_done);
                seen.set(v);
                true
            })
            .unwrap();
        assert!(r.is_ok());
        let seen = seen.take();
        assert!(seen.len() >= 2, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    }

    #[test]
    fn a_cut_simulation_says_how_far_it_got_and_bounds_the_makespan_from_below() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::new(Collective::AllReduce, (0..8).collect(), 1 << 22, DType::F32);
        let p = plan(&topo, &req, &PlanOptions::default()).unwrap().plan;
        let prepared = PreparedSim::new(&topo, &p, &SimConfig::default()).unwrap();
        let whole = prepared.simulate(&topo).unwrap().time_us;
        let cut = prepared
            .simulate_or_cut(&topo, &|| false)
            .unwrap()
            .unwrap_err();
        assert_eq!(cut.ops, p.ops.len());
        assert!(cut.ops_done < cut.ops, "{cut:?}");
        assert!(cut.reached_us <= whole, "{cut:?} vs {whole}");
        // Given up later, it got further, and still not past the makespan.
        let calls = std::cell::Cell::new(0u32);
        let later = prepared
            .simulate_or_cut(&topo, &|| {
                calls.set(calls.get() + 1);
                calls.get() < 3
            })
            .unwrap();
        if let Err(c) = later {
            assert!(c.ops_done >= cut.ops_done && c.reached_us >= cut.reached_us);
            assert!(c.reached_us <= whole);
        }
        let done = prepared.simulate_or_cut(&topo, &|| true).unwrap().unwrap();
        assert_eq!(done.time_us, whole);
    }
}
