//! Tests of the fold on a two-node cluster: a symmetric plan folds into a template the
//! checkers tell apart from a full plan; a plan that differs between hosts is refused.

use super::build_template;
use crate::check::{check, check_template};
use crate::dtype::DType;
use crate::error::RouteError;
use crate::planner::baseline_plan_chunked;
use crate::request::{Collective, Request};

#[test]
fn a_template_is_refused_by_check_and_accepted_by_check_template() {
    let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
    let sym = topo.host_symmetry();
    let req = Request::new(
        Collective::AllGather,
        (0..16).collect(),
        1 << 16,
        DType::F32,
    );
    let t = build_template(&topo, &sym, || baseline_plan_chunked(&topo, &req, 1 << 14)).unwrap();
    let info = t.template.as_ref().unwrap();
    assert_eq!((info.period, info.periods, info.hosts), (1, 2, 2));
    assert_eq!(info.full_ops, 2 * t.ops.len() as u64);
    check_template(&t).unwrap();
    let e = check(&t).unwrap_err().to_string();
    assert!(e.contains("template"), "{e}");
    let full = baseline_plan_chunked(&topo, &req, 1 << 14).unwrap();
    assert!(check_template(&full).is_err());
    check(&full).unwrap();
}

#[test]
fn uneven_blocks_do_not_fold() {
    let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
    let sym = topo.host_symmetry();
    // 8 channels of 1,001 elements split over 16 ranks: the first ranks' blocks are longer.
    let req = Request::new(
        Collective::AllReduce,
        (0..16).collect(),
        8 * 1001,
        DType::F32,
    );
    let ring = Some(crate::planner::baseline_net::tuner::Algo::Ring);
    let r = build_template(&topo, &sym, || {
        crate::planner::baseline_plan_algo(&topo, &req, ring)
    });
    assert!(matches!(r, Err(RouteError::NotSymmetric(_))), "{r:?}");
    // Even blocks fold.
    let req = Request::new(
        Collective::AllReduce,
        (0..16).collect(),
        8 * 1024,
        DType::F32,
    );
    build_template(&topo, &sym, || {
        crate::planner::baseline_plan_algo(&topo, &req, ring)
    })
    .unwrap();
}
