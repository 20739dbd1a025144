//! The checker's part for plans of rounds: the plan's shape, its segments' requests, their
//! proofs, and that every region of a segment maps onto one run of the full buffer. The
//! argument that these prove the plan is in the module docs of [`crate::rounds`].

use super::{CheckOptions, check_single};
use crate::error::{Result, RouteError};
use crate::plan::{OpKind, Plan, Rounds};
use crate::rounds::{RegionMap, split_into};

fn fail(message: impl Into<String>) -> RouteError {
    RouteError::PlanCheck {
        op: usize::MAX,
        message: message.into(),
    }
}

/// What every plan of rounds must be besides its segments' proofs: nothing of its own, at
/// least 2 rounds, segments of its element type that are not plans of rounds themselves, and
/// segments whose requests are the slices and remainders of its request ([`split_into`]).
pub(crate) fn check_shape(plan: &Plan, r: &Rounds) -> Result<()> {
    if !plan.ops.is_empty() || !plan.lanes.is_empty() || !plan.scratch.is_empty() {
        return Err(fail(format!(
            "{} is a plan of rounds with ops, lanes or staging of its own",
            plan.algorithm
        )));
    }
    if plan.template.is_some() {
        return Err(fail("a plan of rounds is a template itself"));
    }
    if r.count < 2 {
        return Err(fail(format!("a plan of {} rounds", r.count)));
    }
    plan.request.validate()?;
    let split = split_into(&plan.request, r.count);
    let parts = [
        ("body", Some(&r.body), Some(&split.body)),
        ("tail", r.tail.as_ref(), split.tail.as_ref()),
    ];
    for (what, part, expected) in parts {
        match (part, expected) {
            (None, None) => {}
            (Some(p), Some(e)) => {
                if p.is_rounds() {
                    return Err(fail(format!("the {what} is a plan of rounds itself")));
                }
                if p.dtype != plan.dtype || &p.request != e {
                    return Err(fail(format!(
                        "the {what}'s request is not the {} of {} rounds of the plan's",
                        if what == "body" { "slice" } else { "remainder" },
                        r.count
                    )));
                }
            }
            (Some(_), None) => {
                return Err(fail("a tail where every piece divides into the rounds"));
            }
            (None, Some(_)) => return Err(fail("no tail for the remainders of the rounds")),
        }
    }
    Ok(())
}

/// Every user region of `part` (the body, or the tail when `tail`) lies in one piece of its
/// buffer, so that it maps onto one run of the full buffer.
fn check_pieces(plan: &Plan, r: &Rounds, part: &Plan, tail: bool) -> Result<()> {
    let mut map = RegionMap::new(&plan.request, r.count, tail);
    for (id, op) in part.ops.iter().enumerate() {
        let regions: Vec<_> = match &op.kind {
            OpKind::Copy { src, dst } => vec![*src, *dst],
            OpKind::Reduce { srcs, dst, .. } => srcs.iter().chain([dst]).copied().collect(),
        };
        for region in regions {
            if matches!(region.buffer, crate::BufferRef::Scratch(_)) {
                continue;
            }
            if map.piece_of(&region)?.is_none() {
                return Err(RouteError::PlanCheck {
                    op: id,
                    message: format!(
                        "the {}'s region {}+{} of {:?} crosses a piece of its buffer",
                        if tail { "tail" } else { "body" },
                        region.offset,
                        region.len,
                        region.buffer
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Check a plan of rounds (see the module docs of [`crate::rounds`] for why this proves it):
/// its shape (`check_shape`), the body and the tail with `check_single` under `opts`, and
/// that each of their regions lies in one piece of its buffer.
///
/// Errors: [`RouteError::PlanCheck`] naming what is wrong (an op index is the body's or the
/// tail's, as the message says).
pub fn check_rounds(plan: &Plan, opts: CheckOptions) -> Result<()> {
    let Some(r) = &plan.rounds else {
        return Err(fail(format!("{} is no plan of rounds", plan.algorithm)));
    };
    check_shape(plan, r)?;
    for (part, tail) in std::iter::once((&r.body, false)).chain(r.tail.iter().map(|t| (t, true))) {
        let what = if tail { "the tail" } else { "the body" };
        let within = |e: RouteError| match e {
            RouteError::PlanCheck { op, message } => RouteError::PlanCheck {
                op,
                message: format!("{what}: {message}"),
            },
            other => other,
        };
        check_single(part, opts).map_err(within)?;
        check_pieces(plan, r, part, tail).map_err(within)?;
    }
    Ok(())
}
