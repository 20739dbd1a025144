//! Hand-built plans, right and wrong, against the checker.

use super::*;
use crate::dtype::{DType, ReduceOp};
use crate::plan::BufferRef::{Input, Output};
use crate::plan::Location;
use crate::plan::{BufferRef, OpKind, Region};
use crate::request::{Collective, Request};

fn reg(b: BufferRef, off: u64, len: u64) -> Region {
    Region::new(b, off, len)
}

fn p2p(len: u64) -> Plan {
    let mut p = Plan::new(Request::point_to_point(0, 1, len), "test");
    let l = p.add_lane(Location::Gpu(0), "copy");
    p.copy(
        l,
        reg(Input(0), 0, len),
        reg(Output(1), 0, len),
        vec![],
        vec![],
    );
    p
}

#[test]
fn direct_copy_passes_and_half_copy_fails() {
    check(&p2p(100)).unwrap();
    let mut p = p2p(100);
    if let OpKind::Copy { src, dst } = &mut p.ops[0].kind {
        src.len = 50;
        dst.len = 50;
    }
    let err = check(&p).unwrap_err().to_string();
    assert!(err.contains("never written"), "{err}");
}

#[test]
fn staged_relay_needs_its_dependency() {
    let req = Request::point_to_point(0, 2, 64);
    let mut p = Plan::new(req, "relay");
    let stage = p.add_scratch(Location::Gpu(3), 64);
    let l0 = p.add_lane(Location::Gpu(0), "in");
    let l1 = p.add_lane(Location::Gpu(3), "out");
    let a = p.copy(l0, reg(Input(0), 0, 64), reg(stage, 0, 64), vec![], vec![]);
    p.copy(
        l1,
        reg(stage, 0, 64),
        reg(Output(1), 0, 64),
        vec![],
        vec![a],
    );
    check(&p).unwrap();
    p.ops[1].deps.clear();
    let err = check(&p).unwrap_err().to_string();
    assert!(
        err.contains("may still be writing") || err.contains("before anything wrote"),
        "{err}"
    );
}

#[test]
fn out_of_bounds_cycle_and_missing_lane_are_errors() {
    let mut p = p2p(10);
    if let OpKind::Copy { dst, .. } = &mut p.ops[0].kind {
        dst.offset = 5;
    }
    assert!(check(&p).unwrap_err().to_string().contains("exceeds"));
    let mut p = p2p(10);
    p.ops[0].deps = vec![0];
    assert!(check(&p).unwrap_err().to_string().contains("cycle"));
    let mut p = p2p(10);
    p.ops[0].lane = 7;
    assert!(check(&p).unwrap_err().to_string().contains("lane"));
}

/// A 3-rank all_reduce by hand: gather to rank 0, reduce, broadcast back.
fn star_all_reduce(op: ReduceOp, finalize: bool) -> Plan {
    let n = 3u32;
    let c = 8u64;
    let req = Request::new(Collective::AllReduce, vec![0, 1, 2], c, DType::F32).with_op(op);
    let mut p = Plan::new(req, "star");
    let lane0 = p.add_lane(Location::Gpu(0), "root");
    let mut deps = Vec::new();
    let mut srcs = vec![reg(Input(0), 0, c)];
    for r in 1..n {
        let s = p.add_scratch(Location::Gpu(0), c);
        let l = p.add_lane(Location::Gpu(r), "up");
        deps.push(p.copy(l, reg(Input(r), 0, c), reg(s, 0, c), vec![], vec![]));
        srcs.push(reg(s, 0, c));
    }
    let red = p.reduce(lane0, srcs, reg(Output(0), 0, c), finalize, deps);
    for r in 1..n {
        p.copy(
            lane0,
            reg(Output(0), 0, c),
            reg(Output(r), 0, c),
            vec![],
            vec![red],
        );
    }
    p
}

#[test]
fn reductions_are_checked_term_by_term() {
    check(&star_all_reduce(ReduceOp::Sum, false)).unwrap();
    check(&star_all_reduce(ReduceOp::Avg, true)).unwrap();
    let err = check(&star_all_reduce(ReduceOp::Avg, false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("never divided"), "{err}");
    // Counting rank 0's input twice.
    let mut p = star_all_reduce(ReduceOp::Sum, false);
    let red = p
        .ops
        .iter()
        .position(|o| matches!(o.kind, OpKind::Reduce { .. }))
        .unwrap();
    if let OpKind::Reduce { srcs, .. } = &mut p.ops[red].kind {
        srcs[1] = srcs[0];
    }
    let err = check(&p).unwrap_err().to_string();
    assert!(err.contains("twice"), "{err}");
    // Reading a remote buffer in a reduction.
    let mut p = star_all_reduce(ReduceOp::Sum, false);
    if let OpKind::Reduce { srcs, .. } = &mut p.ops[red].kind {
        srcs[1] = reg(Input(1), 0, 8);
    }
    assert!(
        check(&p)
            .unwrap_err()
            .to_string()
            .contains("another device")
    );
}

#[test]
fn unordered_writers_race() {
    // Two lanes write the same output without ordering.
    let mut p = p2p(10);
    let l = p.add_lane(Location::Gpu(0), "second");
    p.copy(
        l,
        reg(Input(0), 0, 10),
        reg(Output(1), 0, 10),
        vec![],
        vec![],
    );
    let err = check(&p).unwrap_err().to_string();
    assert!(err.contains("may still be writing"), "{err}");
    p.ops[1].deps = vec![0];
    check(&p).unwrap();
}

#[test]
fn in_place_all_gather_keeps_own_block() {
    let c = 4u64;
    let req = Request::new(Collective::AllGather, vec![0, 1], c, DType::I32);
    let mut p = Plan::new(req, "pairs");
    let l0 = p.add_lane(Location::Gpu(0), "a");
    let l1 = p.add_lane(Location::Gpu(1), "b");
    // Only the foreign blocks move: in place, each rank's own block is already there.
    p.copy(
        l0,
        reg(Input(0), 0, c),
        reg(Output(1), 0, c),
        vec![],
        vec![],
    );
    p.copy(
        l1,
        reg(Input(1), 0, c),
        reg(Output(0), c, c),
        vec![],
        vec![],
    );
    check_with(&p, CheckOptions { in_place: true }).unwrap();
    let err = check(&p).unwrap_err().to_string();
    assert!(err.contains("never written"), "{err}");
}

#[test]
fn routes_follow_links() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let mut p = p2p(10);
    let (g0, g1) = (topo.gpu(0).unwrap(), topo.gpu(1).unwrap());
    let e = topo.link_between(g0, g1).unwrap().index() as u32;
    p.ops[0].edges = vec![e];
    check_routes(&p, &topo).unwrap();
    let back = topo.link_between(g1, g0).unwrap().index() as u32;
    p.ops[0].edges = vec![back];
    assert!(check_routes(&p, &topo).is_err());
    p.ops[0].edges = vec![];
    assert!(check_routes(&p, &topo).is_err());
    let mut m = relaycc_topo::Mask::default();
    m.link_down("GPU0", "GPU1");
    let masked = topo.with_mask(m).unwrap();
    p.ops[0].edges = vec![e];
    assert!(
        check_routes(&p, &masked)
            .unwrap_err()
            .to_string()
            .contains("down")
    );
}

#[test]
fn a_plan_too_large_to_prove_is_an_error_not_an_abort() {
    // 50,000 copies on 50,000 lanes need 2.5e9 clock entries (9.3 GiB): refused by size.
    let mut p = Plan::new(Request::point_to_point(0, 1, 1), "huge");
    for i in 0..50_000u32 {
        let l = p.add_lane(Location::Gpu(0), "copy");
        p.copy(
            l,
            reg(Input(0), 0, 1),
            reg(Output(1), 0, 1),
            vec![],
            if i > 0 { vec![i - 1] } else { vec![] },
        );
    }
    let err = check(&p).unwrap_err().to_string();
    assert!(err.contains("too large to prove"), "{err}");
    assert!(err.contains("50000 ops x 50000 lanes"), "{err}");
}
