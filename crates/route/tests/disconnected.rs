//! Disconnected and degenerate machines: random presets (and a two-node cluster) with random
//! links down and GPUs masked, every collective. Planning gives an error or a plan the checker
//! proves, never a panic; the prediction never exceeds the bound; no error prints an internal
//! sentinel. Each planner, called directly (without the up-front reachability check), does the
//! same.

mod common;

use proptest::prelude::*;
use relaycc_route::path::RelayPolicy;
use relaycc_route::planner::{
    ConnCache, LinkMode, PlannerContext, baseline_plan, planners_for, shared_memory,
};
use relaycc_route::{
    Collective, DType, Plan, PlanOptions, ReduceOp, Request, RouteError, check, check_routes, plan,
    require_reachable,
};
use relaycc_topo::{Mask, Topology};

const PRESETS: [&str; 8] = [
    "pcie-4gpu",
    "cluster:2xpcie-4gpu:ib-edr",
    "pcie-8gpu",
    "dgx1-v100",
    "dgx-a100",
    "ac922",
    "summit-node",
    "dgx1-p100",
];
const COUNTS: [u64; 6] = [0, 1, 7, 64, 1031, 40_000];

/// A request of collective `c` over `gpus` with `count` `f32` elements (sums where it reduces).
fn request(c: Collective, gpus: Vec<u32>, count: u64, root: u32) -> Request {
    common::request(c, gpus, count, DType::F32, ReduceOp::Sum, root)
}

/// The undirected links of `topo` as node-name pairs, each once.
fn link_pairs(topo: &Topology) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = topo
        .links()
        .map(|(_, a, b, _)| {
            let (x, y) = (topo.node(a).name.clone(), topo.node(b).name.clone());
            if x <= y { (x, y) } else { (y, x) }
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// A deterministic stream of numbers from `seed`.
fn stream(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        s >> 33
    }
}

/// The checker passes `p` for `req` on `topo`.
fn proved(p: &Plan, req: &Request, topo: &Topology, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(&p.request, req, "{} {}: another request", what, p.algorithm);
    check(p).map_err(|e| TestCaseError::fail(format!("{what} {}: {e}", p.algorithm)))?;
    check_routes(p, topo)
        .map_err(|e| TestCaseError::fail(format!("{what} {} routes: {e}", p.algorithm)))
}

/// An error message says something and carries no `usize::MAX` / `u64::MAX` sentinel.
fn clear(e: &RouteError, what: &str) -> Result<(), TestCaseError> {
    let m = e.to_string();
    prop_assert!(!m.is_empty(), "{}: empty error", what);
    prop_assert!(
        !m.contains(&usize::MAX.to_string()) && !m.contains(&u64::MAX.to_string()),
        "{}: sentinel in {}",
        what,
        m
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        // Failures are reported with their inputs; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]
    #[test]
    fn disconnected_machines_give_errors_or_proved_plans(
        preset in 0..PRESETS.len(),
        seed in any::<u64>(),
        nranks in 1usize..=8,
        down_per_16 in prop::sample::select(vec![0u64, 1, 3, 8, 16]),
        count in 0..COUNTS.len(),
        coll in 0..Collective::ALL.len(),
        policy in 0..5usize,
        mask_members in any::<bool>(),
    ) {
        let base = relaycc_topo::load(PRESETS[preset]).unwrap();
        let g = base.gpu_count();
        let mut next = stream(seed);
        let mut all: Vec<u32> = (0..g).collect();
        for i in (1..all.len()).rev() {
            all.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let k = nranks.min(g as usize);
        let gpus = all[..k].to_vec();
        // Links down at random; some other GPUs busy or absent; members too when asked.
        let mut mask = Mask::default();
        for (a, b) in link_pairs(&base) {
            if next() % 16 < down_per_16 {
                mask.link_down(&a, &b);
            }
        }
        let pool = if mask_members { &all[..] } else { &all[k..] };
        for &x in pool {
            match next() % 8 {
                0 => { mask.busy_gpus.insert(x); }
                1 => { mask.absent_gpus.insert(x); }
                _ => {}
            }
        }
        let topo = base.with_mask(mask.clone()).unwrap();
        let relay = match policy {
            0 => RelayPolicy::None,
            1 => RelayPolicy::Members,
            2 => RelayPolicy::Any,
            3 => RelayPolicy::List(all[k..].iter().copied().filter(|_| next().is_multiple_of(2)).collect()),
            // A relay the machine lacks.
            _ => RelayPolicy::List(vec![g + 3]),
        };
        let c = Collective::ALL[coll];
        let root = (next() % k as u64) as u32;
        let req = request(c, gpus.clone(), COUNTS[count], root);
        let what = format!(
            "{} {c} {gpus:?} count {} {relay:?} down {:?} busy {:?} absent {:?}",
            PRESETS[preset], COUNTS[count], mask.down_links, mask.busy_gpus, mask.absent_gpus
        );

        let reach = require_reachable(&topo, &req, &relay);
        let opts = PlanOptions { relay: relay.clone(), ..PlanOptions::default() };
        match plan(&topo, &req, &opts) {
            Ok(p) => {
                prop_assert!(reach.is_ok(), "{}: planned what reachability refuses", what);
                proved(&p.plan, &req, &topo, &what)?;
                proved(&p.baseline_plan, &req, &topo, &what)?;
                // A bound of 0 GB/s in 0 us is the infinite bound of a request with nothing
                // to move between GPUs.
                let infinite = p.bound.algbw_gbps == 0.0 && p.bound.time_us == 0.0;
                prop_assert!(
                    infinite || p.predicted.algbw_gbps <= p.bound.algbw_gbps * (1.0 + 1e-9),
                    "{}: {} predicted {} GB/s above the bound {}",
                    what, p.plan.algorithm, p.predicted.algbw_gbps, p.bound.algbw_gbps
                );
            }
            Err(e) => clear(&e, &what)?,
        }
        if let Err(e) = &reach {
            clear(e, &what)?;
            // A relay list naming a missing GPU, or a masked member, is refused by name.
            if policy == 4 {
                prop_assert!(matches!(e, RouteError::BadRequest(_)), "{}: {}", what, e);
            }
        }

        // Each planner on its own, without the up-front check, on valid members: an error or
        // a proved plan.
        let members_ok = gpus.iter().all(|&x| topo.gpu_free(x));
        if members_ok && policy != 4 {
            for (mode, cache_relay) in [
                (LinkMode::Nccl, RelayPolicy::Members),
                (LinkMode::Single, relay.clone()),
                (LinkMode::Multipath, relay.clone()),
            ] {
                let cache = ConnCache::new(&topo, &gpus, &cache_relay);
                for (planner, channels) in planners_for(c, gpus.len()) {
                    let ctx = PlannerContext::new(&cache, mode, 500, channels);
                    match planner(&topo, &req, &ctx) {
                        Ok(p) => proved(&p, &req, &topo, &format!("{what} {mode:?}"))?,
                        Err(e) => clear(&e, &what)?,
                    }
                }
            }
            match shared_memory::plan(&topo, &req, false) {
                Ok(p) => proved(&p, &req, &topo, &format!("{what} shared memory"))?,
                Err(e) => clear(&e, &what)?,
            }
            match baseline_plan(&topo, &req) {
                Ok(p) => proved(&p, &req, &topo, &what)?,
                Err(e) => clear(&e, &what)?,
            }
        }
    }
}

/// The machine of the issue: pcie-4gpu with its second switch cut off. Every collective over
/// all four GPUs is refused naming a pair across the cut; each half plans.
#[test]
fn split_pcie_box_names_the_pair_across_the_cut() {
    let base = relaycc_topo::preset("pcie-4gpu").unwrap();
    let mut mask = Mask::default();
    mask.link_down("CPU0", "PCIe1");
    let topo = base.with_mask(mask).unwrap();
    for c in Collective::ALL {
        let req = request(c, vec![0, 1, 2, 3], 1 << 14, 0);
        let e = plan(&topo, &req, &PlanOptions::default()).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, RouteError::NoRoute { .. }), "{c}: {m}");
        assert!(m.contains("cannot reach"), "{c}: {m}");
        let half = request(c, vec![2, 3], 1 << 14, 0);
        let p = plan(&topo, &half, &PlanOptions::default()).unwrap();
        check(&p.plan).unwrap();
    }
}

/// A machine with no links at all, every link masked down or a JSON topology that lists none:
/// every multi-GPU request is an error, a one-GPU request plans a local copy.
#[test]
fn a_machine_without_links_plans_only_single_gpus() {
    let base = relaycc_topo::preset("pcie-4gpu").unwrap();
    let mut mask = Mask::default();
    for (a, b) in link_pairs(&base) {
        mask.link_down(&a, &b);
    }
    let mut json: serde_json::Value =
        serde_json::from_str(&relaycc_topo::export::to_json(&base)).unwrap();
    json["links"] = serde_json::json!([]);
    json["nvlinks"] = serde_json::json!([]);
    let unlinked = relaycc_topo::import::parse_str(&json.to_string(), "no-links.json").unwrap();
    assert_eq!(unlinked.links().count(), 0);
    for topo in [base.with_mask(mask).unwrap(), unlinked] {
        unlinked_machine_plans_only_single_gpus(&topo);
    }
}

fn unlinked_machine_plans_only_single_gpus(topo: &Topology) {
    for c in Collective::ALL {
        let req = request(c, vec![1, 3], 1000, 1);
        let e = plan(topo, &req, &PlanOptions::default()).unwrap_err();
        assert!(e.to_string().contains("cannot reach"), "{c}: {e}");
        let one = request(c, vec![2], 1000, 0);
        let p = plan(topo, &one, &PlanOptions::default()).unwrap();
        check(&p.plan).unwrap();
        check_routes(&p.plan, topo).unwrap();
    }
}

/// Planning on busy GPUs and relaying through a GPU the machine lacks are refused by name.
#[test]
fn busy_members_and_unknown_relays_are_refused() {
    let base = relaycc_topo::preset("dgx1-v100").unwrap();
    let req = Request::new(Collective::AllReduce, vec![0, 1], 1 << 20, DType::F32);
    let busy = base.with_mask(Mask::busy(0..8)).unwrap();
    let e = plan(&busy, &req, &PlanOptions::default()).unwrap_err();
    assert!(e.to_string().contains("GPU0 is masked busy"), "{e}");
    let opts = PlanOptions {
        relay: RelayPolicy::List(vec![3, 99]),
        ..PlanOptions::default()
    };
    let e = plan(&base, &req, &opts).unwrap_err();
    assert!(matches!(e, RouteError::BadRequest(_)), "{e}");
    assert!(e.to_string().contains("relay GPU 99"), "{e}");
    let p2p = Request::point_to_point(0, 7, 1 << 20);
    let e = plan(&base, &p2p, &opts).unwrap_err();
    assert!(e.to_string().contains("relay GPU 99"), "{e}");
}
