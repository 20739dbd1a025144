//! `CheckedPlan`: the only form of a plan an executor accepts.

use relaycc_route::{
    CheckOptions, CheckedPlan, Collective, DType, PlanOptions, Request, RouteError, plan,
};

/// A plan that passes the checker comes back whole with its options; one that fails is
/// an error, not a `CheckedPlan`.
#[test]
fn only_plans_that_pass_the_checker_become_checked() {
    let topo = relaycc_topo::preset("dgx1-v100").expect("preset");
    let request = Request::new(Collective::AllReduce, (0..4).collect(), 1024, DType::F32);
    let plan = plan(&topo, &request, &PlanOptions::default())
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
