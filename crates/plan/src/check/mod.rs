//! The plan checker: proves a plan delivers exactly what its request asks.
//!
//! It executes the plan symbolically. Every element of every buffer holds either nothing
//! (never written) or the set of input elements `(rank, index)` whose op-combination it now
//! equals. Intervals stand for runs of elements, so the cost grows with the number of ops and
//! region boundaries, not with the bytes. Checked:
//! - structure: lanes, deps and buffers exist; regions lie inside their buffers; copies keep
//!   lengths; reductions are local; the dependency graph (deps plus lane order) has no cycle;
//! - data: no op reads an element before something wrote it; no reduction counts an input
//!   twice or combines an already averaged value; at the end every output element holds
//!   exactly its expected inputs (and, for `Avg`, was divided exactly once);
//! - ordering: every read sees a write that happens before it, and no two ops that are not
//!   ordered touch the same element while one of them writes it (a data race on a GPU).
//!
//! Happens-before is tracked with one vector clock per op over the plan's lanes (ops x lanes
//! words), so plans of 100k ops check in a few hundred megabytes at most.
//!
//! [`CheckedPlan`] is a plan together with the checker's proof that it delivers its request.
//! Executors take this type rather than a bare [`Plan`], so a plan reaches one only through
//! [`check_with`]. Its fields are private and it has no other constructor, so safe code
//! outside this module cannot forge one:
//!
//! ```compile_fail,E0451
//! use relaycc_plan::{CheckedPlan, Plan};
//! fn forge(plan: Plan) -> CheckedPlan {
//!     CheckedPlan { plan, in_place: false }
//! }
//! ```

mod rounds;
mod routes;
mod symbolic;

pub use rounds::check_rounds;
pub use routes::check_routes;
pub(crate) use symbolic::check_single;
pub use symbolic::{CheckOptions, check_structure_only, check_template, clock_bytes};

use crate::error::Result;
use crate::plan::Plan;

/// Check that `plan` delivers its request (out-of-place).
pub fn check(plan: &Plan) -> Result<()> {
    check_with(plan, CheckOptions::default())
}

/// Check that `plan` delivers its request under `opts`: one plan by symbolic execution
/// (`check_single`, in named passes), a plan of rounds ([`Plan::rounds`]) through its body and
/// tail ([`check_rounds`]). A step-sampled plan ([`Plan::step_samples`])
/// delivers nothing (its samples end their phases early) and is refused.
pub fn check_with(plan: &Plan, opts: CheckOptions) -> Result<()> {
    if plan.step_samples.is_some() {
        return Err(crate::RouteError::PlanCheck {
            op: usize::MAX,
            message: format!(
                "{} is step-sampled: it times a plan too large to build from samples of its \
                 first steps, which deliver nothing, so there is nothing to prove",
                plan.algorithm
            ),
        });
    }
    if plan.rounds.is_some() {
        return check_rounds(plan, opts);
    }
    check_single(plan, opts)
}

/// A plan the checker proved correct (structure, data, ordering) under the options it was
/// checked with. The plan inside cannot be changed; [`CheckedPlan::into_plan`] gives it back
/// without the proof.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedPlan {
    plan: Plan,
    in_place: bool,
}

impl CheckedPlan {
    /// Check `plan` with `opts` ([`check_with`]) and keep the proof with it.
    ///
    /// Errors: whatever the checker finds ([`crate::RouteError::PlanCheck`] naming the op, or
    /// a malformed request).
    pub fn new(plan: Plan, opts: CheckOptions) -> Result<CheckedPlan> {
        check_with(&plan, opts)?;
        Ok(CheckedPlan {
            plan,
            in_place: opts.in_place,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Whether the plan was checked as an in-place call (see [`CheckOptions::in_place`]).
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// The plan, giving up the proof.
    pub fn into_plan(self) -> Plan {
        self.plan
    }
}

impl AsRef<Plan> for CheckedPlan {
    fn as_ref(&self) -> &Plan {
        &self.plan
    }
}

#[cfg(test)]
mod tests;
