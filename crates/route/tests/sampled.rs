//! Templates above the checker's 64 ranks, checked by executing the data cones of sampled
//! output elements over the lazily expanded plan (`template::check_sampled`): 128 and 1,024
//! GPUs of DGX H100 nodes, four collectives, several element types and ops; a template with
//! one op's offset shifted is caught.

use std::time::Instant;

use relaycc_route::planner::BaselineOptions;
use relaycc_route::planner::baseline_net::tuner::Algo;
use relaycc_route::template::{SampleOptions, check_elements, check_sampled};
use relaycc_route::{
    BufferRef, Collective, DType, OpKind, Plan, PlanOptions, ReduceOp, Request, plan,
};

/// The cases: (collective, element type, op).
const CASES: [(Collective, DType, ReduceOp); 6] = [
    (Collective::AllReduce, DType::I32, ReduceOp::Sum),
    (Collective::AllReduce, DType::U8, ReduceOp::Max),
    (Collective::AllGather, DType::I64, ReduceOp::Sum),
    (Collective::ReduceScatter, DType::F32, ReduceOp::Sum),
    (Collective::ReduceScatter, DType::I64, ReduceOp::Prod),
    (Collective::AllToAll, DType::U8, ReduceOp::Sum),
];

/// Plan each case on `topo_name` and check the winner and the baseline (both templates; for a
/// step-sampled baseline, the rings it stands for) by sampled execution; returns how many
/// templates were checked.
fn sampled_cases(topo_name: &str, cases: &[(Collective, DType, ReduceOp)]) -> usize {
    let topo = relaycc_topo::preset(topo_name).unwrap();
    let n = topo.gpu_count();
    let mut checked = 0;
    for &(c, t, op) in cases {
        // Every channel of every rank gets a block of all_reduce's elements (uneven blocks
        // are not the same on every period, so they are built in full).
        let count = if c == Collective::AllReduce {
            1 << 14
        } else {
            1 << 10
        };
        let req = Request::new(c, (0..n).collect(), count, t).with_op(op);
        // What is tested is what the templates deliver, not the planning time: a budget
        // that a loaded machine does not pass (the default 5 s can be, while other builds
        // share the cores, and the baseline is then refused).
        let opts = PlanOptions {
            budget: std::time::Duration::from_secs(120),
            ..PlanOptions::default()
        };
        let planned = plan(&topo, &req, &opts).unwrap_or_else(|e| panic!("{topo_name} {c}: {e}"));
        // A step-sampled baseline stands for NCCL's rings, which are checked as a template of
        // their own (built here as the baseline's samples are, every step).
        let rings = planned.baseline_plan.is_step_sampled().then(|| {
            let sym = topo.host_symmetry();
            BaselineOptions {
                algo: (c == Collective::AllReduce).then_some(Algo::Ring),
                template: Some(&sym),
                ..Default::default()
            }
            .plan(&topo, &req)
            .unwrap_or_else(|e| panic!("{topo_name} {c}: the sampled baseline's rings: {e}"))
        });
        let baseline = rings.as_ref().unwrap_or(&planned.baseline_plan);
        for p in [&planned.plan, baseline] {
            let Some(info) = p.template.as_ref() else {
                eprintln!(
                    "{topo_name} {c} {}: built in full ({:?})",
                    p.algorithm, planned.skipped
                );
                continue;
            };
            if !info.exact {
                eprintln!(
                    "{topo_name} {c} {}: not exact: {:?}",
                    p.algorithm, info.inexact
                );
                continue;
            }
            let start = Instant::now();
            let r = check_sampled(p, &topo, &SampleOptions::default())
                .unwrap_or_else(|e| panic!("{topo_name} {c} {t} {op} {}: {e}", p.algorithm));
            eprintln!(
                "{topo_name} {c} {t} {op} {}: {} elements of ranks {:?}, cone {} ops ({} \
                 values) of {} ops, {:.1} ms",
                p.algorithm,
                r.targets.len(),
                {
                    let mut v: Vec<u32> = r.targets.iter().map(|x| x.0).collect();
                    v.dedup();
                    v
                },
                r.cone_ops,
                r.cone_values,
                r.full_ops,
                start.elapsed().as_secs_f64() * 1e3
            );
            assert!(r.targets.len() >= 6 && r.cone_ops > 0);
            checked += 1;
        }
    }
    checked
}

#[test]
fn templates_of_128_gpus_deliver_their_sampled_elements() {
    assert!(sampled_cases("cluster:16xdgx-h100:ib-ndr", &CASES) >= 6);
}

#[test]
fn templates_of_1024_gpus_deliver_their_sampled_elements() {
    // One case per collective, each with another element type, to keep the planning short.
    let cases = [CASES[0], CASES[2], CASES[3], CASES[5]];
    assert!(sampled_cases("cluster:128xdgx-h100:ib-ndr", &cases) >= 4);
}

/// A copy into a rank's output, in template `p`: (op, rank, first element).
fn output_copy(p: &Plan) -> Option<(usize, u32, u64)> {
    p.ops.iter().enumerate().find_map(|(i, o)| match &o.kind {
        OpKind::Copy { dst, .. } => match dst.buffer {
            BufferRef::Output(r) => Some((i, r, dst.offset)),
            _ => None,
        },
        OpKind::Reduce { .. } => None,
    })
}

/// `p` with copy `i`'s source moved by one element.
fn source_moved_by_one(p: &Plan, i: usize) -> Plan {
    let mut bad = p.clone();
    if let OpKind::Copy { src, .. } = &mut bad.ops[i].kind {
        src.offset = if src.offset > 0 {
            src.offset - 1
        } else {
            src.offset + 1
        };
    }
    bad
}

#[test]
fn a_template_with_a_shifted_offset_is_caught() {
    let topo = relaycc_topo::preset("cluster:16xdgx-h100:ib-ndr").unwrap();
    let req = Request::new(
        Collective::AllGather,
        (0..128).collect(),
        1 << 10,
        DType::I32,
    );
    let planned = plan(&topo, &req, &PlanOptions::default()).unwrap();
    let good = planned.plan;
    assert!(good.template.as_ref().unwrap().exact);
    let (i, r, x) = output_copy(&good).expect("a copy into an output");
    check_elements(&good, &topo, &[(r, x)], 7).unwrap();
    let bad = source_moved_by_one(&good, i);
    let e = check_elements(&bad, &topo, &[(r, x)], 7)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds"), "{e}");
    // Shifted writes are caught where they land too: the element the op now skips.
    let mut bad = good.clone();
    if let OpKind::Copy { src, dst } = &mut bad.ops[i].kind {
        src.offset += 1;
        dst.offset += 1;
        src.len -= 1;
        dst.len -= 1;
    }
    assert!(check_elements(&bad, &topo, &[(r, x)], 7).is_err());
}

/// A plan built in full, on a fat-tree whose leaves split nodes so its hosts never repeat:
/// the sampled execution follows its cones as the expansion of itself, and catches a copy
/// moved by one element.
#[test]
fn a_full_plan_is_its_own_expansion() {
    let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr:fat-tree=2:1").unwrap();
    let req = Request::new(Collective::AllGather, (0..16).collect(), 1 << 8, DType::I32);
    let planned = plan(&topo, &req, &PlanOptions::default()).unwrap();
    let good = planned.baseline_plan;
    assert!(good.template.is_none(), "16 ranks are built in full");
    let report = check_sampled(&good, &topo, &SampleOptions::default()).unwrap();
    assert_eq!(report.full_ops, good.ops.len() as u64);
    assert!(report.cone_ops > 0);
    let (i, r, x) = output_copy(&good).expect("a copy into an output");
    check_elements(&good, &topo, &[(r, x)], 3).unwrap();
    let bad = source_moved_by_one(&good, i);
    let e = check_elements(&bad, &topo, &[(r, x)], 3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds"), "{e}");
}
