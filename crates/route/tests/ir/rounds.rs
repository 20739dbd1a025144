//! Tests of plans of rounds: pieces, the slicing lemma the proof rests on, the checker's
//! refusals, and the expansion an executor runs against the plan of rounds it stands for.

use std::collections::BTreeMap;

use relaycc_route::rounds::*;
use relaycc_route::sim::{SimConfig, simulate};
use relaycc_route::{
    BufferRef, CheckOptions, Collective, DType, Location, Plan, PlanOptions, Region, Request,
    Transfer, check, check_routes, check_with, plan,
};

/// A request of every collective on 3 ranks whose pieces have `c` elements (or about).
fn requests(c: u64) -> Vec<Request> {
    Collective::ALL
        .iter()
        .map(|&coll| {
            let mut r = Request::new(coll, vec![0, 1, 2], c, DType::F32).with_root(1);
            match coll {
                Collective::AllGatherV | Collective::ReduceScatterV => {
                    r.counts = vec![c, c / 2, c + 3]
                }
                Collective::AllToAllV => {
                    r.matrix = vec![vec![c, 0, 2], vec![c + 1, c, 5], vec![1, c / 3, c]]
                }
                Collective::SendRecv => {
                    r.transfers = vec![
                        Transfer {
                            src: 0,
                            dst: 2,
                            count: c,
                        },
                        Transfer {
                            src: 0,
                            dst: 1,
                            count: c + 4,
                        },
                        Transfer {
                            src: 2,
                            dst: 0,
                            count: 3,
                        },
                    ]
                }
                _ => {}
            }
            r
        })
        .collect()
}

fn buffers(req: &Request) -> Vec<BufferRef> {
    (0..req.nranks() as u32)
        .flat_map(|r| [BufferRef::Input(r), BufferRef::Output(r)])
        .collect()
}

#[test]
fn pieces_tile_every_buffer() {
    for req in requests(11) {
        for b in buffers(&req) {
            let len = match b {
                BufferRef::Input(r) => req.input_len(r).unwrap(),
                BufferRef::Output(r) => req.output_len(r).unwrap(),
                BufferRef::Scratch(_) => unreachable!(),
            };
            let p = pieces(&req, b).unwrap();
            assert_eq!(p.iter().sum::<u64>(), len, "{} {b:?}", req.collective);
        }
    }
}

/// Every output element as the set of input elements it must hold: `(rank, element)` to
/// sorted `(src rank, src element)`.
type Elementwise = BTreeMap<(u32, u64), Vec<(u32, u64)>>;

fn elementwise(req: &Request, mut map: impl FnMut(BufferRef, u64) -> u64) -> Elementwise {
    let mut out = Elementwise::new();
    for p in req.expected().unwrap() {
        for i in 0..p.len {
            let mut terms: Vec<(u32, u64)> = p
                .terms
                .iter()
                .map(|&(r, off)| (r, map(BufferRef::Input(r), off + i)))
                .collect();
            terms.sort_unstable();
            let at = map(BufferRef::Output(p.rank), p.out_offset + i);
            assert!(out.insert((p.rank, at), terms).is_none());
        }
    }
    out
}

/// The lemma the proof of a plan of rounds rests on: the expectations of the rounds' and the
/// tail's requests, mapped onto the full buffers, are exactly the full request's.
#[test]
fn rounds_and_tail_tile_the_full_request() {
    for c in [7u64, 11, 12] {
        for req in requests(c) {
            let full = elementwise(&req, |_, e| e);
            for rounds in [2u64, 3, 5] {
                let split = split_into(&req, rounds);
                let mut got = Elementwise::new();
                let segments = (0..rounds)
                    .map(|k| (RoundSegment::Round(k), &split.body))
                    .chain(split.tail.iter().map(|t| (RoundSegment::Tail, t)));
                for (seg, sub) in segments {
                    let mut m = RegionMap::new(&req, rounds, seg == RoundSegment::Tail);
                    let part = elementwise(sub, |b, e| {
                        m.region_in_full(Region::new(b, e, 1), seg).unwrap().offset
                    });
                    for (k, v) in part {
                        assert!(
                            got.insert(k, v).is_none(),
                            "{} written twice",
                            req.collective
                        );
                    }
                }
                assert_eq!(got, full, "{} of {c} in {rounds} rounds", req.collective);
            }
        }
    }
}

#[test]
fn split_only_above_the_round_and_keeps_rounds_within_it() {
    let req = Request::new(Collective::AllReduce, vec![0, 1], 1000, DType::F32);
    assert_eq!(split(&req, 4000).unwrap(), None);
    assert_eq!(split(&req, u64::MAX).unwrap(), None);
    let s = split(&req, 1000).unwrap().unwrap();
    assert_eq!((s.count, s.body.count), (4, 250));
    assert!(s.tail.is_none());
    let s = split(&req, 1200).unwrap().unwrap();
    assert_eq!((s.count, s.body.count), (4, 250));
    let s = split(&req, 1196).unwrap().unwrap();
    assert_eq!((s.count, s.body.count), (4, 250));
    let s = split(&Request::point_to_point(0, 7, 1 << 46), 2 << 30)
        .unwrap()
        .unwrap();
    assert_eq!((s.count, s.body.transfers[0].count), (1 << 15, 1 << 31));
    assert!(s.tail.is_none());
    let bytes = (1u64 << 46) + 3;
    let s = split(&Request::point_to_point(0, 7, bytes), 2 << 30)
        .unwrap()
        .unwrap();
    assert_eq!(s.count, (1 << 15) + 1);
    assert!(s.body.transfers[0].count <= 1 << 31);
    assert_eq!(s.tail.unwrap().transfers[0].count, bytes % s.count);
}

/// Plans of rounds of every collective on a DGX-1, with a tail and without: the checker
/// proves them, their expansion (the plan an executor runs) passes the checker on its own,
/// and the simulator times them as their expansion (the NCCL-like ones no faster: they pay
/// a kernel launch per round).
#[test]
fn plans_of_rounds_prove_and_time_as_their_expansion() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let opts = PlanOptions {
        round_bytes: 4096,
        ..PlanOptions::default()
    };
    let mut reqs: Vec<Request> = requests(3000)
        .into_iter()
        .map(|mut r| {
            r.gpus = vec![0, 3, 5];
            r
        })
        .collect();
    reqs.push(Request::point_to_point(0, 7, 20_003));
    reqs.push(Request::new(
        Collective::AllReduce,
        vec![0, 1, 2, 3],
        4096,
        DType::F32,
    ));
    let mut runs: Vec<(Request, PlanOptions)> =
        reqs.into_iter().map(|r| (r, opts.clone())).collect();
    // relaycc's own point-to-point plans (a forced strategy leaves the baseline out).
    for strategy in [
        relaycc_route::p2p::P2pStrategy::Multipath,
        relaycc_route::p2p::P2pStrategy::Relay,
    ] {
        for bytes in [3 << 20, (3 << 20) + 7] {
            let o = PlanOptions {
                strategy,
                round_bytes: 1 << 20,
                ..PlanOptions::default()
            };
            runs.push((Request::point_to_point(0, 7, bytes), o));
        }
    }
    let (mut own_plans, mut tails) = (0, 0);
    for (req, opts) in runs {
        let p = plan(&topo, &req, &opts).unwrap();
        let r = p.plan.rounds.as_ref().expect("rounds");
        tails += usize::from(r.tail.is_some());
        assert!(r.count >= 2);
        check(&p.plan).unwrap();
        check_routes(&p.plan, &topo).unwrap();
        check(&p.baseline_plan).unwrap();
        let expanded = expand(&p.plan, MAX_EXPANDED_OPS).unwrap();
        check(&expanded).unwrap_or_else(|e| panic!("{}: {e}", p.plan.algorithm));
        check_routes(&expanded, &topo).unwrap();
        let cfg = SimConfig::default();
        let rounds = simulate(&topo, &p.plan, &cfg).unwrap().time_us;
        assert_eq!(rounds, p.predicted.time_us);
        let whole = simulate(&topo, &expanded, &cfg).unwrap().time_us;
        let own = r.body.protocol.is_none() && r.tail.as_ref().is_none_or(|t| t.protocol.is_none());
        if own {
            own_plans += 1;
            let b = simulate(&topo, &r.body, &cfg).unwrap().time_us;
            let t = r
                .tail
                .as_ref()
                .map(|t| simulate(&topo, t, &cfg).unwrap().time_us);
            assert!(
                (rounds - whole).abs() <= 1e-9 * whole,
                "{}: {rounds} vs {whole} ({} x {b} + {t:?})",
                p.plan.algorithm,
                r.count
            );
        } else if r
            .tail
            .as_ref()
            .is_none_or(|t| t.protocol == r.body.protocol)
        {
            // One NCCL protocol throughout: the expansion pays its kernel launch once.
            assert!(
                rounds >= whole * (1.0 - 1e-9),
                "{}: {rounds} vs {whole}",
                p.plan.algorithm
            );
        }
        assert!(p.predicted.algbw_gbps <= p.bound.algbw_gbps * (1.0 + 1e-9));
    }
    assert!(
        own_plans >= 3 && tails >= 3,
        "{own_plans} of relaycc's, {tails} tails"
    );
}

/// In place, the rounds of an all_gather and a reduce_scatter stay in their own slices of the
/// shared buffer.
#[test]
fn plans_of_rounds_prove_in_place() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let opts = PlanOptions {
        round_bytes: 1024,
        ..PlanOptions::default()
    };
    let mut proved = 0;
    for coll in [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllReduce,
    ] {
        let req = Request::new(coll, vec![0, 1, 2, 3], 1001, DType::F32);
        let p = plan(&topo, &req, &opts).unwrap();
        // Relaycc's plans write no input; the checker proves them as the in-place call.
        let in_place = CheckOptions { in_place: true };
        if check_with(&p.plan, in_place).is_ok() {
            check_with(&expand(&p.plan, MAX_EXPANDED_OPS).unwrap(), in_place).unwrap();
            proved += 1;
        }
    }
    assert!(proved >= 2, "{proved} plans proved in place");
}

#[test]
fn the_checker_refuses_what_the_proof_does_not_cover() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let opts = PlanOptions {
        round_bytes: 4000,
        ..PlanOptions::default()
    };
    let req = Request::new(Collective::AllGather, vec![0, 1, 2], 2501, DType::F32);
    let good = plan(&topo, &req, &opts).unwrap().plan;
    check(&good).unwrap();
    let broken = |f: &dyn Fn(&mut Plan)| {
        let mut p = good.clone();
        f(&mut p);
        check(&p).unwrap_err().to_string()
    };
    let e = broken(&|p| p.rounds.as_mut().unwrap().count += 1);
    assert!(e.contains("request"), "{e}");
    let e = broken(&|p| p.rounds.as_mut().unwrap().tail = None);
    assert!(e.contains("no tail"), "{e}");
    let e = broken(&|p| p.rounds.as_mut().unwrap().count = 1);
    assert!(e.contains("1 rounds"), "{e}");
    let e = broken(&|p| {
        p.add_lane(Location::Gpu(0), "own");
    });
    assert!(e.contains("of its own"), "{e}");
    // A copy of the body spanning two output blocks of rank 1 maps onto two runs.
    let e = broken(&|p| {
        let body = &mut p.rounds.as_mut().unwrap().body;
        let s = body.request.count;
        let lane = body.add_lane(Location::Gpu(3), "extra");
        body.copy(
            lane,
            Region::new(BufferRef::Output(1), s - 1, 2),
            Region::new(BufferRef::Output(1), s - 1, 2),
            Vec::new(),
            Vec::new(),
        );
    });
    assert!(e.contains("body"), "{e}");
    // The body's proof is required: an op removed leaves outputs unwritten.
    let e = broken(&|p| {
        let body = &mut p.rounds.as_mut().unwrap().body;
        body.ops.truncate(body.ops.len() - 1);
    });
    assert!(e.contains("the body"), "{e}");
}

#[test]
fn the_expansion_is_bounded_and_orders_need_it() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let req = Request::point_to_point(0, 7, 1 << 20);
    let opts = PlanOptions {
        round_bytes: 4096,
        ..PlanOptions::default()
    };
    let p = plan(&topo, &req, &opts).unwrap().plan;
    let e = expand(&p, 100).unwrap_err().to_string();
    assert!(e.contains("above 100 ops"), "{e}");
    assert!(p.dependency_graph().is_err());
    assert!(relaycc_route::sim::PreparedSim::new(&topo, &p, &SimConfig::default()).is_err());
    // Staging is the larger of the body's and the tail's on each device, not their sum.
    let r = p.rounds.as_ref().unwrap();
    for (at, b) in p.staging_per_location() {
        let seg = |q: &Plan| q.staging_per_location().get(&at).copied().unwrap_or(0);
        assert_eq!(b, seg(&r.body).max(r.tail.as_ref().map_or(0, seg)));
    }
    let json = p.to_json();
    assert_eq!(Plan::from_json(&json).unwrap(), p);
}
