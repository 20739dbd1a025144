//! Executor tests: lowering (events, waits) and refusal of wrong plans.

use relaycc_route::{BufferRef, Collective, DType, Location, Plan, Region, Request};

use super::*;

fn two_rank_broadcast() -> Plan {
    let req = Request::new(Collective::Broadcast, vec![0, 1], 8, DType::F32);
    let mut p = Plan::new(req, "test: relay through scratch on another lane");
    let l0 = p.add_lane(Location::Gpu(0), "a");
    let l1 = p.add_lane(Location::Gpu(1), "b");
    let s = p.add_scratch(Location::Gpu(1), 8);
    let a = p.copy(
        l0,
        Region::new(BufferRef::Input(0), 0, 8),
        Region::new(BufferRef::Output(0), 0, 8),
        vec![],
        vec![],
    );
    let b = p.copy(
        l0,
        Region::new(BufferRef::Input(0), 0, 8),
        Region::new(s, 0, 8),
        vec![],
        vec![a],
    );
    p.copy(
        l1,
        Region::new(s, 0, 8),
        Region::new(BufferRef::Output(1), 0, 8),
        vec![],
        vec![b, a],
    );
    p
}

#[test]
fn cross_lane_deps_become_record_then_wait() {
    let e = compile(check(two_rank_broadcast(), false).unwrap()).unwrap();
    let c = &e.program().commands;
    let rec = c
        .iter()
        .position(|c| matches!(c, Command::Record { lane: 0, .. }))
        .unwrap();
    let wait = c
        .iter()
        .position(|c| matches!(c, Command::Wait { lane: 1, .. }))
        .unwrap();
    assert!(rec < wait);
    // Both deps are on lane 0; waiting for op 1 implies op 0, so one wait suffices.
    let waits = c
        .iter()
        .filter(|c| matches!(c, Command::Wait { .. }))
        .count();
    assert_eq!(waits, 1);
    assert_eq!(e.program().bindings, 2 * 2 + 1);
    assert_eq!(e.scratch(), &[(Location::Gpu(1), 32)]);
}

#[test]
fn wrong_plans_are_refused_before_running() {
    // A missing dependency is a race: the checker names the op.
    let mut p = two_rank_broadcast();
    p.ops[2].deps.clear();
    let err = check(p, false).unwrap_err();
    assert!(
        matches!(err, CollectivesError::InvalidPlan { op: Some(2), .. }),
        "{err}"
    );
    // A plan that leaves an output unwritten.
    let mut p = two_rank_broadcast();
    p.ops.truncate(2);
    let err = check(p, false).unwrap_err();
    assert!(matches!(err, CollectivesError::InvalidPlan { .. }), "{err}");
    // A whole-plan problem names no op, and the message says so rather than printing a
    // sentinel index.
    let mut p = two_rank_broadcast();
    p.dtype = DType::F64;
    let err = check(p, false).unwrap_err();
    assert!(
        matches!(err, CollectivesError::InvalidPlan { op: None, .. }),
        "{err}"
    );
    assert!(!err.to_string().contains(&usize::MAX.to_string()), "{err}");
}

#[test]
fn a_plan_that_writes_an_input_is_refused_unless_in_place() {
    // Rank 0 uses its own input as scratch: a copy back into `Input(0)` after the broadcast.
    let mut p = two_rank_broadcast();
    assert_eq!(input_write(&p), None);
    let l0 = p.ops[0].lane;
    let last = p.ops.len() as u32 - 1;
    p.copy(
        l0,
        Region::new(BufferRef::Output(0), 0, 8),
        Region::new(BufferRef::Input(0), 0, 8),
        vec![],
        vec![last],
    );
    let k = p.ops.len() - 1;
    assert_eq!(input_write(&p), Some((k, 0)));
    let err = check(p, false).unwrap_err();
    assert!(
        matches!(&err, CollectivesError::InvalidPlan { op: Some(o), message }
            if *o == k && message.contains("input")),
        "{err}"
    );
}
