//! Count binding against a reference: capacity plans of every v-collective (planned on
//! machines, and in rank space with node-aware relays through scratch), bound to random
//! counts and run by an interpreter of the bound pieces, deliver exactly what the call asks.

use proptest::prelude::*;
use relaycc_route::nodeaware::Strategy as Exchange;
use relaycc_route::planner::ranks::{self, RankSpace};
use relaycc_route::{BufferRef, Collective, DType, OpKind, Plan, PlanOptions, ReduceOp, Request};

use super::{CallCounts, CountLayout, CountPieces, VCollective};

/// The capacity request of `layout` (element type u64).
fn capacity_request(layout: &CountLayout) -> Request {
    let n = layout.ranks;
    let c = layout.capacity;
    let gpus = (0..n).collect();
    let mut req = match layout.collective {
        VCollective::AllGatherV => Request::new(Collective::AllGatherV, gpus, 0, DType::U64),
        VCollective::AllToAllV => Request::new(Collective::AllToAllV, gpus, 0, DType::U64),
        VCollective::ReduceScatterV => {
            Request::new(Collective::ReduceScatter, gpus, c, DType::U64).with_op(ReduceOp::Sum)
        }
    };
    req.counts = match layout.collective {
        VCollective::AllGatherV => vec![c; n as usize],
        _ => Vec::new(),
    };
    if layout.collective == VCollective::AllToAllV {
        req.matrix = vec![vec![c; n as usize]; n as usize];
    }
    req
}

/// Run `plan` bound to `counts` on packed buffers; returns every rank's output.
fn run(plan: &Plan, pieces: &CountPieces, counts: &[u64]) -> Vec<Vec<u64>> {
    let layout = *pieces.layout();
    let n = layout.ranks as usize;
    let call = CallCounts::new(&layout, counts).expect("counts");
    // Packed buffers: each element holds a unique value of its (rank, position).
    let (in_len, out_len): (Vec<u64>, Vec<u64>) = (0..n)
        .map(|r| match layout.collective {
            VCollective::AllToAllV => (
                (0..n).map(|d| counts[r * n + d]).sum(),
                (0..n).map(|s| counts[s * n + r]).sum(),
            ),
            VCollective::AllGatherV => (counts[r], counts.iter().sum()),
            VCollective::ReduceScatterV => (counts.iter().sum(), counts[r]),
        })
        .unzip();
    // Every buffer in one list: inputs, then outputs, then scratch.
    let mut bufs: Vec<Vec<u64>> = (0..n)
        .map(|r| {
            (0..in_len[r])
                .map(|i| (r as u64 + 1) * 1_000_000 + i)
                .collect()
        })
        .chain(out_len.iter().map(|l| vec![u64::MAX; *l as usize]))
        .chain(plan.scratch.iter().map(|s| vec![0; s.len as usize]))
        .collect();
    let at = |b: BufferRef| match b {
        BufferRef::Input(r) => r as usize,
        BufferRef::Output(r) => n + r as usize,
        BufferRef::Scratch(s) => 2 * n + s as usize,
    };
    let (mut lens, mut offsets) = (Vec::new(), Vec::new());
    for i in plan.topological_order().expect("order") {
        match &plan.ops[i as usize].kind {
            OpKind::Copy { src, dst } => {
                let moves: Vec<_> = pieces.copy_pieces(i, src, dst, &call).collect();
                for (so, dof, len) in moves {
                    let vals = bufs[at(src.buffer)][so as usize..(so + len) as usize].to_vec();
                    bufs[at(dst.buffer)][dof as usize..(dof + len) as usize].copy_from_slice(&vals);
                }
            }
            OpKind::Reduce { srcs, dst, .. } => {
                pieces.reduce_pieces(i, (srcs, dst), &call, &mut lens, &mut offsets);
                let k = srcs.len() + 1;
                for (p, len) in lens.iter().enumerate() {
                    let o = &offsets[p * k..(p + 1) * k];
                    let sum: Vec<u64> = (0..*len as usize)
                        .map(|e| {
                            srcs.iter()
                                .zip(o)
                                .map(|(r, off)| bufs[at(r.buffer)][*off as usize + e])
                                .fold(0u64, u64::wrapping_add)
                        })
                        .collect();
                    let d = o[k - 1] as usize;
                    bufs[at(dst.buffer)][d..d + sum.len()].copy_from_slice(&sum);
                }
            }
        }
    }
    bufs[n..2 * n].to_vec()
}

/// What each rank's output must hold.
fn expected(layout: &CountLayout, counts: &[u64]) -> Vec<Vec<u64>> {
    let n = layout.ranks as usize;
    let value = |r: usize, i: u64| (r as u64 + 1) * 1_000_000 + i;
    (0..n)
        .map(|me| match layout.collective {
            VCollective::AllToAllV => (0..n)
                .flat_map(|s| {
                    let at: u64 = (0..me).map(|d| counts[s * n + d]).sum();
                    (0..counts[s * n + me]).map(move |j| value(s, at + j))
                })
                .collect(),
            VCollective::AllGatherV => (0..n)
                .flat_map(|s| (0..counts[s]).map(move |j| value(s, j)))
                .collect(),
            VCollective::ReduceScatterV => {
                let at: u64 = counts[..me].iter().sum();
                (0..counts[me])
                    .map(|j| (0..n).map(|r| value(r, at + j)).sum())
                    .collect()
            }
        })
        .collect()
}

fn layouts() -> impl Strategy<Value = (CountLayout, Vec<u64>)> {
    (
        prop_oneof![
            Just(VCollective::AllGatherV),
            Just(VCollective::AllToAllV),
            Just(VCollective::ReduceScatterV)
        ],
        2u32..6,
        0u32..5,
    )
        .prop_flat_map(|(collective, ranks, log_cap)| {
            let layout = CountLayout {
                collective,
                ranks,
                capacity: 1 << log_cap,
            };
            let keys = layout.keys();
            (
                Just(layout),
                proptest::collection::vec(0..=layout.capacity, keys),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Plans of the machine planner (host memory and one NVSwitch) bound to random counts.
    #[test]
    fn machine_plans_bound_to_random_counts((layout, counts) in layouts(), host in any::<bool>()) {
        let n = layout.ranks;
        let topo = if host {
            relaycc_topo::host_topology(n)
        } else {
            relaycc_topo::nvswitch_topology(n)
        }
        .expect("preset");
        let req = capacity_request(&layout);
        let options = PlanOptions { expand: true, ..PlanOptions::default() };
        let plan = relaycc_route::plan(&topo, &req, &options).expect("plans").plan;
        relaycc_route::check(&plan).expect("capacity plan checks");
        let pieces = CountPieces::new(&plan, layout).expect("bindable");
        prop_assert_eq!(run(&plan, &pieces, &counts), expected(&layout, &counts));
    }

    /// Rank-space plans, node-aware strategies relaying through scratch on virtual nodes.
    #[test]
    fn rank_space_plans_bound_to_random_counts(
        (layout, counts) in layouts(),
        strategy in prop_oneof![
            Just(Exchange::Standard), Just(Exchange::ThreeStep), Just(Exchange::TwoStep),
            Just(Exchange::SplitMd)
        ],
    ) {
        let n = layout.ranks;
        let node_of: Vec<u32> = (0..n).map(|r| r / 2).collect();
        let space = RankSpace {
            node_of: &node_of,
            device_aware: false,
            split_cap_bytes: 24,
            staging_budget: relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES,
        };
        let req = capacity_request(&layout);
        let plan = ranks::plan(&req, &space, Some(strategy)).expect("plans");
        relaycc_route::check(&plan).expect("capacity plan checks");
        // Exchange plans may count bytes: bind counts in the plan's elements.
        let esize = if plan.dtype == req.dtype { 1 } else { req.dtype.size() };
        let layout = CountLayout { capacity: layout.capacity * esize, ..layout };
        let pieces = CountPieces::new(&plan, layout).expect("bindable");
        let byte_counts: Vec<u64> = counts.iter().map(|c| c * esize).collect();
        // Values are per plan element (bytes of an exchange plan), so the reference is too.
        prop_assert_eq!(run(&plan, &pieces, &byte_counts), expected(&layout, &byte_counts));
    }
}

/// A plan that parks one rank's data in another element's place is refused, not bound.
#[test]
fn a_plan_that_moves_data_through_other_user_elements_is_refused() {
    let layout = CountLayout {
        collective: VCollective::AllGatherV,
        ranks: 2,
        capacity: 4,
    };
    let req = capacity_request(&layout);
    let mut plan = Plan::new(req, "swap through the output");
    let lane = plan.add_lane(relaycc_route::Location::Gpu(0), "l");
    // Rank 0's input lands in rank 1's block of rank 0's output first.
    let src = relaycc_route::Region::new(BufferRef::Input(0), 0, 4);
    let wrong = relaycc_route::Region::new(BufferRef::Output(0), 4, 4);
    plan.copy(lane, src, wrong, Vec::new(), Vec::new());
    assert!(CountPieces::new(&plan, layout).is_err());
}

#[test]
fn capacity_is_the_next_power_of_two() {
    assert_eq!(CountLayout::capacity_for(0), 1);
    assert_eq!(CountLayout::capacity_for(1), 1);
    assert_eq!(CountLayout::capacity_for(5), 8);
    assert_eq!(CountLayout::capacity_for(64), 64);
    assert_eq!(CountLayout::capacity_for(u64::MAX), u64::MAX);
}
