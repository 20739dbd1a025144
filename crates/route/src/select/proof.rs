//! What a planning call proves before it returns a plan ([`prove`]), and where the checker
//! stands for the proof and where structure, sampled execution and routes do
//! ([`proved_by_checker`]).

use relaycc_topo::Topology;

use relaycc_plan::Plan;
use relaycc_plan::Request;
use relaycc_plan::{Result, RouteError};

/// Largest request (ranks) whose plans are built in full and proved by the checker on a
/// topology whose hosts repeat. Above it, where the topology's host symmetry folds and the
/// ranks are the same on every period of hosts, candidates are built as templates of one
/// domain of hosts ([`relaycc_planners::template`]), checked by [`relaycc_plan::check_template`] and
/// [`relaycc_plan::check_routes`] and timed by the simulator on the template.
pub const EXPAND_MAX_RANKS: usize = 64;

/// Above [`EXPAND_MAX_RANKS`] ranks, a plan built in full (its hosts do not repeat, so it
/// cannot be a template) whose proof's vector clocks would take more than this many bytes is
/// proved by its structure, sampled execution ([`relaycc_planners::template::check_sampled`]) and
/// [`relaycc_plan::check_routes`], as templates are, instead of by [`relaycc_plan::check()`]: 512 MiB keeps
/// planning a 1,024-GPU cluster's peak memory under 1 GiB.
pub const SAMPLED_PROOF_ABOVE_CLOCK_BYTES: u64 = 512 << 20;

/// Whether [`crate::plan()`] proves `p` with the checker (every output element, every order) before
/// returning it: a full plan of up to [`EXPAND_MAX_RANKS`] ranks, or a larger one whose vector
/// clocks stay within [`SAMPLED_PROOF_ABOVE_CLOCK_BYTES`]. Templates and the larger full plans
/// are checked on their structure, routes and sampled execution instead.
///
/// A plan of rounds is proved by the checker when its body and tail are; a step-sampled plan
/// (the baseline only) never is.
pub fn proved_by_checker(p: &Plan) -> bool {
    if p.is_step_sampled() {
        return false;
    }
    if let Some(r) = &p.rounds {
        return proved_by_checker(&r.body) && r.tail.as_ref().is_none_or(proved_by_checker);
    }
    !p.is_template()
        && (p.request.nranks() <= EXPAND_MAX_RANKS
            || relaycc_plan::clock_bytes(p) <= SAMPLED_PROOF_ABOVE_CLOCK_BYTES)
}

/// Prove that `plan` delivers `req` on `topo`: it is a plan of this request, every output
/// element holds exactly its inputs without a race ([`relaycc_plan::check()`]), and every copy follows
/// usable links through GPUs the job may use ([`relaycc_plan::check_routes`]). A step-sampled
/// baseline ([`relaycc_plan::step_samples`]) delivers nothing: its shape and samples are checked. A template
/// ([`relaycc_planners::template`]) passes [`relaycc_plan::check_template`] instead (its routes were checked on
/// the windowed build it was folded from).
pub(super) fn prove(topo: &Topology, req: &Request, plan: &Plan) -> Result<()> {
    if plan.request != *req {
        return Err(RouteError::PlanCheck {
            op: usize::MAX,
            message: format!(
                "{} plans another request than the one asked",
                plan.algorithm
            ),
        });
    }
    let named = |e: RouteError| match e {
        RouteError::PlanCheck { op, message } => RouteError::PlanCheck {
            op,
            message: format!("{}: {message}", plan.algorithm),
        },
        other => other,
    };
    if plan.is_template() {
        return relaycc_plan::check_template(plan).map_err(named);
    }
    if let Some(s) = &plan.step_samples {
        // Samples deliver nothing: their shape, their copies' links and, for templates,
        // their folds are checked (the baseline is reported, never chosen).
        relaycc_plan::step_samples::check_step_samples(plan)?;
        for sample in [&s.short, &s.long] {
            if sample.is_template() {
                // Its routes were checked on the windowed build it was folded from.
                relaycc_plan::check_template(sample).map_err(named)?;
            } else {
                relaycc_plan::check_routes(sample, topo).map_err(named)?;
            }
        }
        return Ok(());
    }
    if plan.request.nranks() > EXPAND_MAX_RANKS
        && relaycc_plan::clock_bytes(plan) > SAMPLED_PROOF_ABOVE_CLOCK_BYTES
    {
        // A full plan of a cluster whose hosts do not repeat: vector clocks would take
        // gigabytes, so it is proved as a template is, on its structure and by sampled
        // execution of its data cones, and its routes are checked as usual. The three read
        // the plan only, so they run at once (about a second each for NCCL's 3M-op tree on
        // 64 nodes); errors are reported in that order.
        let (structure, (sampled, routes)) = rayon::join(
            || relaycc_plan::check_structure_only(plan),
            || {
                rayon::join(
                    || {
                        relaycc_planners::template::check_sampled(
                            plan,
                            topo,
                            &relaycc_planners::template::SampleOptions::default(),
                        )
                    },
                    || relaycc_plan::check_routes(plan, topo),
                )
            },
        );
        structure.map_err(named)?;
        sampled.map_err(named)?;
        return routes.map_err(named);
    }
    relaycc_plan::check(plan).map_err(named)?;
    relaycc_plan::check_routes(plan, topo).map_err(named)
}
