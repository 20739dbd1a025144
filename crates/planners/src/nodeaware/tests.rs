//! Plan generator tests: message counts per strategy on fixed exchanges, and property tests
//! that every generated plan passes the plan checker and the route checker on cluster presets.

use proptest::prelude::{Just, ProptestConfig, TestCaseError, prop_oneof, proptest};
use proptest::strategy::Strategy as Gen;
use relaycc_topo::Topology;

use super::*;
use relaycc_plan::{Collective, Request, Transfer};
use relaycc_plan::{DType, check, check_routes};
use relaycc_plan::{Location, OpKind, Plan};

const PRESETS: [&str; 2] = ["cluster:2xdgx1-v100:ib-edr", "cluster:4xpcie-4gpu:ib-hdr"];

fn host_of(topo: &Topology, plan: &Plan, loc: Location) -> u32 {
    let node = relaycc_plan::path::location_node(topo, loc).unwrap();
    let _ = plan;
    topo.node(node).host
}

/// Copies whose source and destination memories sit on different nodes.
fn inter_node_copies(topo: &Topology, plan: &Plan) -> usize {
    plan.ops
        .iter()
        .filter(|op| match &op.kind {
            OpKind::Copy { src, dst } => {
                let a = plan.location(src.buffer).unwrap();
                let b = plan.location(dst.buffer).unwrap();
                host_of(topo, plan, a) != host_of(topo, plan, b)
            }
            OpKind::Reduce { .. } => false,
        })
        .count()
}

fn send_recv(gpus: Vec<u32>, transfers: &[(u32, u32, u64)], dtype: DType) -> Request {
    let mut r = Request::new(Collective::SendRecv, gpus, 0, dtype);
    r.transfers = transfers
        .iter()
        .map(|&(src, dst, count)| Transfer { src, dst, count })
        .collect();
    r
}

fn checked(topo: &Topology, req: &Request) -> Vec<(Strategy, Staging, Plan)> {
    let all = node_aware_candidates(topo, req).unwrap();
    assert_eq!(all.len(), 8);
    for (s, st, plan) in &all {
        check(plan).unwrap_or_else(|e| panic!("{s} {st}: {e}"));
        check_routes(plan, topo).unwrap_or_else(|e| panic!("{s} {st}: {e}"));
    }
    all
}

#[test]
fn message_counts_follow_the_strategies() {
    // Two DGX-1 nodes: GPUs 0..7 and 8..15. Ranks 0-3 on node 0 each send two messages to
    // node 1's ranks 4-7.
    let topo = relaycc_topo::preset("cluster:2xdgx1-v100:ib-edr").unwrap();
    let gpus = vec![0, 1, 4, 5, 8, 9, 12, 13];
    let mut t = Vec::new();
    for s in 0..4 {
        t.push((s, 4 + s, 100));
        t.push((s, 4 + (s + 1) % 4, 50));
    }
    let req = send_recv(gpus, &t, DType::F32);
    for (s, st, plan) in checked(&topo, &req) {
        let n = inter_node_copies(&topo, &plan);
        match s {
            Strategy::Standard => assert_eq!(n, 8, "{st}: one per message"),
            Strategy::ThreeStep => assert_eq!(n, 1, "{st}: one per node pair"),
            Strategy::TwoStep => assert_eq!(n, 4, "{st}: one per (rank, node)"),
            // 600 f32 = 2400 bytes fit the 8 KiB cap: one message for the pair.
            Strategy::SplitMd | Strategy::SplitDd => assert_eq!(n, 1, "{s}"),
        }
    }
}

#[test]
fn split_spreads_large_pairs_over_nics() {
    let topo = relaycc_topo::preset("cluster:2xdgx1-v100:ib-edr").unwrap();
    // 64 KiB from GPU0 to GPU8: eight 8 KiB messages over the four NIC pairs.
    let req = send_recv(vec![0, 8], &[(0, 1, 65536)], DType::U8);
    for s in [Strategy::SplitMd, Strategy::SplitDd] {
        let plan = node_aware_plan(&topo, &req, s, Staging::Host).unwrap();
        check(&plan).unwrap();
        check_routes(&plan, &topo).unwrap();
        assert_eq!(inter_node_copies(&topo, &plan), 8, "{s}");
        let mut nic_edges = std::collections::BTreeSet::new();
        for op in &plan.ops {
            for e in &op.edges {
                let (a, _) = topo.link_ends(relaycc_topo::LinkId::new(*e as usize));
                if topo.node(a).nic().is_some() {
                    nic_edges.insert(a);
                }
            }
        }
        assert!(
            nic_edges.len() >= 8,
            "{s}: all four NICs of both nodes send"
        );
    }
    // Split+DD never stages the inter-node data in a rank's own buffers: its copies leave the
    // GPU straight into the sending socket's chunk buffer.
    let dd = node_aware_plan(&topo, &req, Strategy::SplitDd, Staging::Host).unwrap();
    let md = node_aware_plan(&topo, &req, Strategy::SplitMd, Staging::Host).unwrap();
    assert!(dd.ops.len() < md.ops.len());
}

#[test]
fn collectives_and_errors() {
    let topo = relaycc_topo::preset("cluster:4xpcie-4gpu:ib-hdr").unwrap();
    let mut agv = Request::new(Collective::AllGatherV, vec![0, 5, 10, 15], 0, DType::F32);
    agv.counts = vec![3, 0, 7, 1];
    checked(&topo, &agv);
    let mut a2a = Request::new(Collective::AllToAllV, vec![1, 2, 6, 12], 0, DType::I32);
    a2a.matrix = vec![
        vec![1, 2, 0, 4],
        vec![0, 0, 0, 0],
        vec![5, 0, 6, 0],
        vec![7, 8, 9, 10],
    ];
    checked(&topo, &a2a);
    let ar = Request::new(Collective::AllReduce, vec![0, 4], 8, DType::F32);
    assert!(node_aware_plan(&topo, &ar, Strategy::Standard, Staging::Host).is_err());
    let req = send_recv(vec![0, 4], &[(0, 1, 8)], DType::F32);
    assert!(node_aware_plan(&topo, &req, Strategy::SplitMd, Staging::DeviceAware).is_err());
    let missing = send_recv(vec![0, 99], &[(0, 1, 8)], DType::F32);
    assert!(node_aware_plan(&topo, &missing, Strategy::Standard, Staging::Host).is_err());
}

#[test]
fn models_read_requests() {
    let topo = relaycc_topo::preset("cluster:4xpcie-4gpu:ib-hdr").unwrap();
    let shape = ClusterCounts::of(&topo);
    assert_eq!(
        (shape.nodes, shape.gpus_per_node, shape.sockets_per_node),
        (4, 4, 1)
    );
    let req = send_recv(
        vec![0, 1, 4, 9],
        &[(0, 2, 1000), (1, 3, 0), (0, 1, 5)],
        DType::F32,
    );
    let p = Pattern::from_request(&req).unwrap();
    assert_eq!(p.messages.len(), 2, "empty messages are dropped");
    for (s, st) in Strategy::combinations() {
        let t = model_time(s, st, &p, &shape, MessageCostModel::MaxRate);
        assert!(t.is_finite() && t > 0.0, "{s} {st}");
    }
    let ar = Request::new(Collective::AllReduce, vec![0, 4], 8, DType::F32);
    assert!(Pattern::from_request(&ar).is_err());
}

/// A random sparse exchange: a subset of a preset's GPUs, a few transfers (some empty), some
/// ranks with no neighbours; as send_recv, all_gather_v or all_to_all_v.
fn exchange() -> impl Gen<Value = (usize, Request)> {
    (
        0..PRESETS.len(),
        proptest::sample::subsequence((0u32..16).collect::<Vec<_>>(), 2..7),
        proptest::collection::vec((0u32..8, 0u32..8, 0u64..40), 0..10),
        0..3u8,
        prop_oneof![Just(DType::U8), Just(DType::F32), Just(DType::F64)],
    )
        .prop_map(|(preset, gpus, sends, kind, dtype)| {
            let n = gpus.len() as u32;
            let req = match kind {
                0 => send_recv(
                    gpus,
                    &sends
                        .iter()
                        .map(|&(s, d, c)| (s % n, d % n, c))
                        .collect::<Vec<_>>(),
                    dtype,
                ),
                1 => {
                    let mut r = Request::new(Collective::AllGatherV, gpus, 0, dtype);
                    r.counts = (0..n as usize)
                        .map(|i| sends.get(i).map(|s| s.2 % 9).unwrap_or(0))
                        .collect();
                    r
                }
                _ => {
                    let mut r = Request::new(Collective::AllToAllV, gpus, 0, dtype);
                    r.matrix = vec![vec![0; n as usize]; n as usize];
                    for &(s, d, c) in &sends {
                        r.matrix[(s % n) as usize][(d % n) as usize] = c;
                    }
                    r
                }
            };
            (preset, req)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_checks((preset, req) in exchange()) {
        let topo = relaycc_topo::preset(PRESETS[preset]).unwrap();
        for (s, st) in Strategy::combinations() {
            let plan = node_aware_plan(&topo, &req, s, st)
                .map_err(|e| TestCaseError::fail(format!("{s} {st}: {e}")))?;
            check(&plan).map_err(|e| TestCaseError::fail(format!("{s} {st}: {e}")))?;
            check_routes(&plan, &topo)
                .map_err(|e| TestCaseError::fail(format!("{s} {st}: {e}")))?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, failure_persistence: None, ..ProptestConfig::default() })]

    /// Plans cut into rounds of a few elements reuse their slots: every one still checks
    /// (each output element gets its input, no slot is rewritten before it was read) and
    /// stages no more than the single-round plan.
    #[test]
    fn rounds_reuse_slots((preset, req) in exchange(), chunk in 1u64..6) {
        let topo = relaycc_topo::preset(PRESETS[preset]).unwrap();
        let all = super::messages::pieces(&req).unwrap();
        for (s, st) in Strategy::combinations() {
            let fail = |e: relaycc_plan::RouteError| TestCaseError::fail(format!("{s} {st} chunk {chunk}: {e}"));
            let plan = super::generate::in_rounds(&topo, &req, &all, s, st, chunk).map_err(fail)?;
            check(&plan).map_err(fail)?;
            check_routes(&plan, &topo).map_err(fail)?;
            let whole = super::generate::in_rounds(&topo, &req, &all, s, st, u64::MAX).map_err(fail)?;
            let (a, b) = (plan.staging_per_location(), whole.staging_per_location());
            for (loc, bytes) in &a {
                let limit = b.get(loc).copied().unwrap_or(0);
                if *bytes > limit {
                    return Err(TestCaseError::fail(format!("{s} {st} chunk {chunk}: {loc:?} stages {bytes} > {limit}")));
                }
            }
        }
    }
}

/// A 1 GiB all_to_all_v on four DGX-1 nodes: every node-aware plan fits the default staging
/// budget on every device and still checks.
#[test]
fn large_exchange_fits_the_default_budget() {
    let topo = relaycc_topo::preset("cluster:4xdgx1-v100:ib-edr").unwrap();
    let n = 32u32;
    let per = (1u64 << 30) / 4 / u64::from(n * n);
    let mut req = Request::new(Collective::AllToAllV, (0..n).collect(), 0, DType::F32);
    req.matrix = vec![vec![per; n as usize]; n as usize];
    for (s, st) in Strategy::combinations() {
        let plan = node_aware_plan(&topo, &req, s, st).unwrap();
        for (loc, bytes) in plan.staging_per_location() {
            assert!(
                bytes <= crate::staging::DEFAULT_STAGING_BUDGET_BYTES,
                "{s} {st}: {loc:?} stages {bytes}"
            );
        }
        check(&plan).unwrap_or_else(|e| panic!("{s} {st}: {e}"));
    }
}
