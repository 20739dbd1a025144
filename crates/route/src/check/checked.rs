//! [`CheckedPlan`]: a plan together with the checker's proof that it delivers its request.
//!
//! Executors take this type rather than a bare [`Plan`], so a plan reaches one only through
//! [`check_with`]. Its fields are private and it has no other constructor, so safe code
//! outside this module cannot forge one:
//!
//! ```compile_fail,E0451
//! use relaycc_route::{CheckedPlan, Plan};
//! fn forge(plan: Plan) -> CheckedPlan {
//!     CheckedPlan { plan, in_place: false }
//! }
//! ```

use super::{CheckOptions, check_with};
use crate::error::Result;
use crate::plan::Plan;

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
mod tests {
    use super::*;
    use crate::RouteError;

    /// A plan that passes the checker comes back whole with its options; one that fails is
    /// an error, not a `CheckedPlan`.
    #[test]
    fn only_plans_that_pass_the_checker_become_checked() {
        let topo = relaycc_topo::preset("dgx1-v100").expect("preset");
        let request = crate::Request::new(
            crate::Collective::AllReduce,
            (0..4).collect(),
            1024,
            crate::DType::F32,
        );
        let plan = crate::plan(&topo, &request, &crate::PlanOptions::default())
            .expect("plan")
            .plan;
        let checked = CheckedPlan::new(plan.clone(), CheckOptions { in_place: true })
            .expect("the planner's plans pass the checker");
        assert!(checked.in_place());
        assert_eq!(checked.plan(), &plan);
        let mut broken = plan;
        broken.ops.truncate(1);
        let e = CheckedPlan::new(broken, CheckOptions::default()).expect_err("incomplete plan");
        assert!(matches!(e, RouteError::PlanCheck { .. }), "{e}");
    }
}
