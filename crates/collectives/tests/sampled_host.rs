//! Plans above the checker's 64 ranks, executed on the host: the op cone of sampled ranks'
//! outputs (`route::template::extract_cone`, from the template or a full plan) lowered per rank
//! and run by the executor, one thread per rank that holds memory of the cone, over the
//! in-process transport (`exec::sampled_cone::execute_cone`); the sampled outputs must equal the
//! request's reference, and a template with one copy moved by an element must not.

use std::time::Instant;

use relaycc_collectives::exec::sampled_cone::{ConeOptions, execute_cone};
use relaycc_route::path::RelayPolicy;
use relaycc_route::planner::Candidates;
use relaycc_route::template::extract_cone;
use relaycc_route::{
    BufferRef, Collective, DType, OpKind, Plan, PlanOptions, ReduceOp, Request, plan,
};
use relaycc_topo::Topology;

/// The cone's cap: far above what the cases need, far below a full plan of 1,024 ranks.
const MAX_CONE_OPS: usize = 2_000_000;

/// Run the cones of ranks 1 and n-3 of `p`; panics naming `what` on any failure.
fn run_cone(topo: &Topology, req: &Request, p: &Plan, what: &str) {
    let n = req.nranks() as u32;
    let ranks = [1, n - 3];
    let start = Instant::now();
    let cone = extract_cone(p, topo, &ranks, MAX_CONE_OPS)
        .unwrap_or_else(|e| panic!("{what} {}: {e}", p.algorithm))
        .unwrap_or_else(|| panic!("{what} {}: a cone above {MAX_CONE_OPS} ops", p.algorithm));
    let cut = start.elapsed();
    let r = execute_cone(&cone, topo, &ConeOptions::default())
        .unwrap_or_else(|e| panic!("{what} {}: {e}", p.algorithm));
    eprintln!(
        "{what} {} ({}): cone {} of {} ops on {} ranks, {} messages, {} elements equal, \
         {:.1} MB, cut {:.2} s, run {:.2} s",
        p.algorithm,
        if p.is_template() { "template" } else { "full" },
        r.ops,
        r.full_ops,
        r.ranks_run,
        r.messages,
        r.elements,
        r.bytes as f64 / 1e6,
        cut.as_secs_f64(),
        r.elapsed.as_secs_f64()
    );
    let want: u64 = ranks.iter().map(|x| req.output_len(*x).unwrap()).sum();
    assert_eq!(
        r.elements, want,
        "{what}: both sampled outputs compared in full"
    );
    assert!(
        r.ops > 0 && (r.ops as u64) < r.full_ops,
        "{what}: a cone, not the plan"
    );
}

/// relaycc's own candidates for `req` (the rail-hierarchical plans and the node-aware
/// all_to_all), each built as a template without simulating anything: at the small counts
/// that keep the ranks' buffers small the planner picks NCCL's tree, so the winner alone would
/// leave them out.
fn relaycc_templates(topo: &Topology, req: &Request) -> Vec<Plan> {
    let set = Candidates::new(topo, req, &RelayPolicy::Members).unwrap();
    let sym = topo.host_symmetry();
    (0..set.len())
        .map(|i| {
            let chunk = relaycc_route::planner::pipeline_chunk_elems(req);
            set.build_template(i, chunk, &sym, None)
                .unwrap_or_else(|e| panic!("{} candidate {i}: {e}", req.collective))
        })
        .collect()
}

/// The cases: (collective, element type, op, count).
type Case = (Collective, DType, ReduceOp, u64);

/// For each case on `topo_name`: relaycc's candidates as templates and, with `planned`, the
/// planner's winner and baseline; returns how many plans ran.
fn host_cases(topo_name: &str, cases: &[Case], planned: bool) -> usize {
    let topo = relaycc_topo::preset(topo_name).unwrap();
    let n = topo.gpu_count();
    let mut ran = 0;
    for &(c, t, op, count) in cases {
        let req = Request::new(c, (0..n).collect(), count, t).with_op(op);
        let what = format!("{topo_name} {c} {t} {op}");
        for p in relaycc_templates(&topo, &req) {
            assert!(p.is_template(), "{what} {}: a template", p.algorithm);
            run_cone(&topo, &req, &p, &what);
            ran += 1;
        }
        if planned {
            let planned = plan(&topo, &req, &PlanOptions::default()).unwrap();
            for p in [&planned.plan, &planned.baseline_plan] {
                run_cone(&topo, &req, p, &what);
                ran += 1;
            }
        }
    }
    ran
}

#[test]
fn cones_of_128_gpus_run_on_the_host() {
    let cases = [
        (Collective::AllReduce, DType::I32, ReduceOp::Sum, 1 << 14),
        (Collective::AllGather, DType::I64, ReduceOp::Sum, 1 << 10),
        (
            Collective::ReduceScatter,
            DType::F32,
            ReduceOp::Avg,
            1 << 10,
        ),
        (Collective::AllToAll, DType::U8, ReduceOp::Sum, 1 << 8),
    ];
    assert!(host_cases("cluster:16xdgx-h100:ib-ndr", &cases, true) >= 12);
}

#[test]
fn cones_of_1024_gpus_run_on_the_host() {
    // relaycc's templates only: planning 1,024 ranks in full is the route tests' part.
    let cases = [
        (Collective::AllReduce, DType::I64, ReduceOp::Max, 1 << 13),
        (Collective::AllToAll, DType::U8, ReduceOp::Sum, 16),
    ];
    assert!(host_cases("cluster:128xdgx-h100:ib-ndr", &cases, false) >= 2);
}

/// A copy into a rank's output from an offset past 0, in `p`: (op, rank).
fn output_copy(p: &Plan) -> Option<(usize, u32)> {
    p.ops.iter().enumerate().find_map(|(i, o)| match &o.kind {
        OpKind::Copy { src, dst } => match dst.buffer {
            BufferRef::Output(r) if dst.len > 0 && src.offset > 0 => Some((i, r)),
            _ => None,
        },
        OpKind::Reduce { .. } => None,
    })
}

#[test]
fn a_template_with_a_copy_moved_by_one_element_fails_its_host_run() {
    let topo = relaycc_topo::preset("cluster:16xdgx-h100:ib-ndr").unwrap();
    let req = Request::new(
        Collective::AllGather,
        (0..128).collect(),
        1 << 10,
        DType::I32,
    );
    let planned = plan(&topo, &req, &PlanOptions::default()).unwrap();
    let good = planned.plan;
    assert!(good.is_template());
    let (i, r) = output_copy(&good).expect("a copy into an output");
    let cone = extract_cone(&good, &topo, &[r], MAX_CONE_OPS)
        .unwrap()
        .unwrap();
    execute_cone(&cone, &topo, &ConeOptions::default()).unwrap();
    let mut bad = good.clone();
    if let OpKind::Copy { src, .. } = &mut bad.ops[i].kind {
        src.offset -= 1;
    }
    let cone = extract_cone(&bad, &topo, &[r], MAX_CONE_OPS)
        .unwrap()
        .unwrap();
    let e = execute_cone(&cone, &topo, &ConeOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("rank {r}'s output element")), "{e}");
}
