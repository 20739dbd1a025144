//! Collective planners: every candidate and the NCCL-like baseline pass the plan checker and
//! the route checker, on fixed cases and on random presets, masks, subsets, policies, sizes.

use relaycc_route::path::RelayPolicy;
use relaycc_route::planner::{baseline_plan, collective_candidates, supports_in_place};
use relaycc_route::{
    CheckOptions, Collective, DType, Plan, ReduceOp, Request, Transfer, check, check_routes,
    check_with,
};
use relaycc_topo::Topology;

fn request(
    c: Collective,
    gpus: Vec<u32>,
    count: u64,
    dtype: DType,
    op: ReduceOp,
    root: u32,
) -> Request {
    let n = gpus.len();
    let mut r = Request::new(c, gpus, count, dtype).with_root(root);
    if c.reduces() {
        r = r.with_op(op);
    }
    let mix = |i: usize, j: usize| (count + (i * 7 + j * 3) as u64) % (count + 3);
    r.counts = (0..n)
        .map(|i| if i % 3 == 1 { 0 } else { mix(i, 0) })
        .collect();
    r.matrix = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if (i + j) % 4 == 3 { 0 } else { mix(i, j) })
                .collect()
        })
        .collect();
    r.transfers = (0..n)
        .map(|i| Transfer {
            src: i as u32,
            dst: ((i + 1) % n) as u32,
            count: mix(i, 1),
        })
        .collect();
    r
}

fn verify(p: &Plan, topo: &Topology, what: &str) {
    check(p).unwrap_or_else(|e| panic!("{what} {}: {e}", p.algorithm));
    check_routes(p, topo).unwrap_or_else(|e| panic!("{what} {} routes: {e}", p.algorithm));
}

fn in_place_form(c: Collective) -> bool {
    !matches!(
        c,
        Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv
    )
}

#[test]
fn dgx1_subsets_every_collective() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    for gpus in [
        vec![0, 7],
        vec![0, 2, 5, 7],
        vec![1, 2, 4, 7],
        vec![3],
        (0..8).collect(),
    ] {
        for c in Collective::ALL {
            for count in [0u64, 1, 13, 997] {
                let req = request(
                    c,
                    gpus.clone(),
                    count,
                    DType::F32,
                    ReduceOp::Avg,
                    (gpus.len() as u32) - 1,
                );
                let what = format!("{c} {gpus:?} count {count}");
                let cands =
                    collective_candidates(&topo, &req, &RelayPolicy::Any, &[61, 1024]).unwrap();
                assert!(!cands.is_empty());
                for p in &cands {
                    verify(p, &topo, &what);
                    if in_place_form(c) {
                        assert!(
                            supports_in_place(p),
                            "{what} {} in place: {:?}",
                            p.algorithm,
                            check_with(p, CheckOptions { in_place: true })
                        );
                    }
                }
                let b = baseline_plan(&topo, &req).unwrap();
                verify(&b, &topo, &what);
            }
        }
    }
}
