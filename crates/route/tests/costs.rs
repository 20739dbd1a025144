//! The cost model: NCCL's protocols in the baseline (latency-bound sizes scale with hops and
//! protocol, bandwidth-bound sizes with links, predicted time monotone in size), NVLS where
//! the NVSwitch reduces, relaycc's copy-engine and kernel launches, and calibration files that
//! replace each cost.

use proptest::prelude::*;
use relaycc_route::planner::baseline_plan;
use relaycc_route::{Collective, DType, Plan, Protocol, Request, SimConfig, simulate};
use relaycc_topo::{Calibration, Topology, preset};

fn all_reduce(gpus: Vec<u32>, bytes: u64) -> Request {
    Request::new(Collective::AllReduce, gpus, bytes / 4, DType::F32)
}

fn time_us(topo: &Topology, plan: &Plan) -> f64 {
    simulate(topo, plan, &SimConfig::default()).unwrap().time_us
}

/// The baseline's plan and predicted time.
fn baseline(topo: &Topology, req: &Request) -> (Plan, f64) {
    let p = baseline_plan(topo, req).unwrap();
    let t = time_us(topo, &p);
    (p, t)
}

fn calibrated(name: &str, json: &str) -> Topology {
    Calibration::parse(json, "test")
        .unwrap()
        .apply(&preset(name).unwrap())
        .unwrap()
}

#[test]
fn small_messages_use_ll_and_large_ones_simple() {
    for name in ["dgx1-v100", "dgx-a100", "dgx-h100", "pcie-8gpu"] {
        let topo = preset(name).unwrap();
        let n = topo.gpu_count();
        let (small, t_small) = baseline(&topo, &all_reduce((0..n).collect(), 4 << 10));
        assert_eq!(
            small.protocol,
            Some(Protocol::Ll),
            "{name}: {}",
            small.algorithm
        );
        assert!(small.algorithm.ends_with(" LL"), "{}", small.algorithm);
        // A ring all_reduce of 2(n-1) LL steps after the launch: microseconds, not zero.
        assert!(
            t_small > 6.6 + 2.0 * (n - 1) as f64 * 0.6,
            "{name}: {t_small}"
        );
        let (large, _) = baseline(&topo, &all_reduce((0..n).collect(), 1 << 30));
        assert_ne!(
            large.protocol,
            Some(Protocol::Ll),
            "{name}: {}",
            large.algorithm
        );
    }
}

#[test]
fn latency_bound_time_grows_with_hops() {
    // A 4 KiB ring all_reduce pays one step per hop: more ranks, more steps.
    let topo = preset("dgx-a100").unwrap();
    let mut last = 0.0;
    for n in 2..=8u32 {
        let (_, t) = baseline(&topo, &all_reduce((0..n).collect(), 4 << 10));
        assert!(t > last, "{n} ranks: {t} <= {last}");
        last = t;
    }
}

#[test]
fn latency_bound_time_follows_the_protocols_step_cost() {
    // Doubling LL's NVLink step latency lengthens the small all_reduce by 2(n-1) steps' worth
    // (or less, where another protocol then wins).
    let base = preset("dgx-h100").unwrap();
    let req = all_reduce((0..8).collect(), 4 << 10);
    let (_, t0) = baseline(&base, &req);
    let slow = calibrated("dgx-h100", r#"{"costs":{"ll_nvlink_step_us":1.2}}"#);
    let (_, t1) = baseline(&slow, &req);
    assert!(t1 > t0, "{t1} <= {t0}");
    assert!(t1 <= t0 + 14.0 * 0.6 + 1e-9, "{t1} vs {t0}");
}

#[test]
fn bandwidth_bound_time_follows_the_links() {
    // At 1 GiB the baseline is paced by its links: halving the NVLink rate nearly doubles the
    // time (the fixed latencies and the reductions' device-memory traffic do not slow).
    let req = all_reduce((0..8).collect(), 1 << 30);
    let (_, t0) = baseline(&preset("dgx1-v100").unwrap(), &req);
    let half = calibrated(
        "dgx1-v100",
        r#"{"kinds":[{"kind":"nvlink","gbps_per_lane":12.1}]}"#,
    );
    let (_, t1) = baseline(&half, &req);
    let ratio = t1 / t0;
    assert!((1.8..=2.01).contains(&ratio), "{ratio}");
}

#[test]
fn nvls_is_the_baseline_where_the_switch_reduces() {
    let req = all_reduce((0..8).collect(), 1 << 30);
    for (name, nvls) in [
        ("dgx-h100", true),
        ("hgx-h200", true),
        ("dgx-b200", true),
        ("dgx-a100", false),
        ("dgx2", false),
    ] {
        let topo = preset(name).unwrap();
        let (p, _) = baseline(&topo, &req);
        assert_eq!(
            p.algorithm.contains("nvls"),
            nvls,
            "{name}: {}",
            p.algorithm
        );
        relaycc_route::check(&p).unwrap();
        relaycc_route::check_routes(&p, &topo).unwrap();
    }
    // No NVLS once its efficiency makes it slower than the ring.
    let poor = calibrated("dgx-h100", r#"{"costs":{"nvls_sm90_efficiency":0.3}}"#);
    let (p, _) = baseline(&poor, &req);
    assert!(!p.algorithm.contains("nvls"), "{}", p.algorithm);
}

/// relaycc's copies pay the launch the CUDA executor makes for them: a small copy to an
/// NVLink peer runs on SMs and pays a kernel launch, the next small copy on its lane joins that
/// launch, and a copy of 8 MiB or more pays a copy-engine launch; each then crosses its link.
#[test]
fn relaycc_copies_pay_the_launch_the_executor_makes() {
    let topo = preset("dgx1-v100").unwrap();
    let (g0, g1) = (topo.gpu(0).unwrap(), topo.gpu(1).unwrap());
    let e = topo.link_between(g0, g1).unwrap();
    let link = topo.link(e);
    let cross = |bytes: u64| link.latency_us + bytes as f64 / (link.gbps * 1e3);
    let plan = |sizes: &[u64]| {
        let total = sizes.iter().sum();
        let mut p = Plan::new(Request::point_to_point(0, 1, total), "test");
        let lane = p.add_lane(relaycc_route::Location::Gpu(0), "l");
        let mut at = 0;
        for &n in sizes {
            let src = relaycc_route::Region::new(relaycc_route::BufferRef::Input(0), at, n);
            let dst = relaycc_route::Region::new(relaycc_route::BufferRef::Output(1), at, n);
            p.copy(lane, src, dst, vec![e.index() as u32], vec![]);
            at += n;
        }
        p
    };
    let costs = topo.costs();
    let small = time_us(&topo, &plan(&[4]));
    assert!(
        (small - (costs.kernel_launch_us + cross(4))).abs() < 1e-9,
        "{small}"
    );
    let two = time_us(&topo, &plan(&[4, 4]));
    assert!(
        (two - (costs.kernel_launch_us + 2.0 * cross(4))).abs() < 1e-9,
        "{two}"
    );
    let big = 16 << 20;
    let large = time_us(&topo, &plan(&[big]));
    let want = costs.copy_engine_launch_us + cross(big);
    assert!((large - want).abs() < 1e-6 * want, "{large} vs {want}");
    let cal = calibrated(
        "dgx1-v100",
        r#"{"costs":{"copy_engine_launch_us":1.5,"kernel_launch_us":0.5}}"#,
    );
    let small_cal = time_us(&cal, &plan(&[4]));
    assert!((small - small_cal - (costs.kernel_launch_us - 0.5)).abs() < 1e-9);
    let large_cal = time_us(&cal, &plan(&[big]));
    assert!((large - large_cal - (costs.copy_engine_launch_us - 1.5)).abs() < 1e-6);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 12,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The baseline's predicted time never falls as the message grows.
    #[test]
    fn predicted_time_is_monotone_in_size(
        which in 0usize..4,
        n in 2u32..=8,
        kib in 1u64..4096,
        grow in 1u64..4096,
    ) {
        let name = ["dgx1-v100", "dgx-a100", "dgx-h100", "pcie-8gpu"][which];
        let topo = preset(name).unwrap();
        let gpus: Vec<u32> = (0..n).collect();
        let (_, t0) = baseline(&topo, &all_reduce(gpus.clone(), kib << 10));
        let (_, t1) = baseline(&topo, &all_reduce(gpus, (kib + grow) << 10));
        prop_assert!(t1 >= t0 * (1.0 - 1e-9), "{name} {n}: {t0} then {t1}");
    }
}

/// The simulator against the CUDA executor on one H200 (`docs/MEASUREMENTS.md`, "Ranks
/// sharing the GPU as one memory", run 4: `relaycc bench --backend cuda --gpus 0,0,0,0`,
/// f32 sum): four ranks of one GPU, the memory at the rate of that run's device-to-device
/// memcpy (2,068.5 GB/s copied, 4,137 GB/s read plus written), the host's 5 us per launch.
/// Every collective at 64 and 256 MiB is predicted within 15% of its measured time: the
/// arenas share one memory, whose writes bind at half its rate, and a fan-out is one kernel.
#[test]
fn ranks_sharing_one_gpu_are_timed_as_the_executor_ran_them() {
    let mem = |g: u32| format!(r#"{{"gpu": "GPU{g}", "gbps": 4137.0}}"#);
    let json = format!(
        r#"{{"memories": [{}]}}"#,
        (0..4).map(mem).collect::<Vec<_>>().join(", ")
    );
    let topo = calibrated("shared-gpu-4", &json);
    let cfg = SimConfig {
        issue_us: 5.0,
        ..SimConfig::default()
    };
    let measured: [(Collective, u64, f64); 10] = [
        (Collective::AllReduce, 64 << 20, 152.0),
        (Collective::AllReduce, 256 << 20, 559.0),
        (Collective::ReduceScatter, 64 << 20, 101.0),
        (Collective::ReduceScatter, 256 << 20, 322.0),
        (Collective::Broadcast, 64 << 20, 149.0),
        (Collective::Broadcast, 256 << 20, 528.0),
        (Collective::AllGather, 64 << 20, 145.0),
        (Collective::AllGather, 256 << 20, 525.0),
        (Collective::AllToAll, 64 << 20, 156.0),
        (Collective::AllToAll, 256 << 20, 527.0),
    ];
    for (coll, bytes, us) in measured {
        // nccl-tests' size: a rank's buffer, the larger of its input and output.
        let count = match coll {
            Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll => {
                bytes / 4 / 4
            }
            _ => bytes / 4,
        };
        let req = Request::new(coll, vec![0, 1, 2, 3], count, DType::F32);
        let p = relaycc_route::planner::shared_memory::plan(&topo, &req, false).unwrap();
        let t = simulate(&topo, &p, &cfg).unwrap().time_us;
        let err = (t - us).abs() / us;
        assert!(
            err < 0.15,
            "{coll:?} of {bytes} B: predicted {t:.1} us, measured {us} us"
        );
    }
}
