//! Step-sampled plans: NCCL-like baselines over thousands of ranks, timed without building
//! them.
//!
//! A ring all_reduce over `n` ranks runs `n - 1` reduce-scatter steps and `n - 1` all-gather
//! steps on every channel. On 8,192 GPUs that is 16,382 steps per channel: tens of millions of
//! ops in full and still millions folded to one host (`relaycc_planners::template`), more than a
//! planning call builds within its budget. Every step of a ring has the same shape (every
//! rank sends one block to its successor over the same hop and, in the reduce-scatter, adds
//! it), so once the pipeline is full the simulated ring runs in a steady state: each step
//! takes the same time, and the makespan grows by that time per step. The same holds for the
//! chunks of NCCL's double binary tree (each chunk climbs and descends the same trees) and
//! for the rounds of a grouped send/recv all_to_all (round `k` sends from every rank `r` to
//! `r + k`; past the rounds inside a node, each crosses the network alike).
//!
//! A step-sampled plan ([`Plan::step_samples`]) holds two builds of the plan's first
//! `k1 < k2` steps ([`SHORT_STEPS`], [`LONG_STEPS`]; per ring phase, per tree channel, of the
//! all_to_all), every rank, channel, chunk and loop as in the full plan (a ring phase's last
//! step, which finishes its blocks, comes after `k` steps). The simulator
//! (`relaycc_sim::simulate`) times the full plan of `full` steps as the affine extrapolation of
//! the samples' makespans `T(k1)` and `T(k2)`:
//!
//! ```text
//! T(full) = T(k2) + (full - k2) x max(0, (T(k2) - T(k1)) / (k2 - k1))
//! ```
//!
//! and the loads on edges and memories alike. The module's tests compare it with the
//! simulation of the full plan on clusters where that one is built.
//!
//! A sample does not deliver its request (its phases end early), so a step-sampled plan is
//! never proved or run: [`crate::check()`] refuses it, [`check_step_samples`] checks its
//! shape and [`crate::check_routes`] the samples' copies. The planner makes one only for the
//! NCCL-like baseline where it is too large to build (`select/baseline_choice.rs`) and names
//! it so. It competes with relaycc's candidates by its extrapolated time, as the baseline
//! does; where it wins, the answer says NCCL's plan is the fastest known, and the plan, like
//! a template's, is for prediction only.

use crate::error::{Result, RouteError};
use crate::plan::{Plan, StepSamples};

/// Steps per phase the short sample builds.
pub const SHORT_STEPS: u64 = 16;

/// Steps per phase the long sample builds.
pub const LONG_STEPS: u64 = 32;

/// Chunks per channel the short sample of NCCL's double binary tree builds. A chunk climbs
/// chains and trees some 2 (g + log2 N) hops deep (g GPUs per node, N nodes) before the
/// pipeline runs in a steady state, so the tree's samples start later than a ring's (whose
/// steps move in lockstep from the first): on 64 rail-optimized DGX H100 nodes at 1 GiB the
/// full tree simulates in 12,096.5 us, samples of 24 and 48 chunks extrapolate to 12,171.9 us
/// (+0.6%), of 16 and 32 to 12,627.3 us (+4.4%).
pub const TREE_SHORT_CHUNKS: u64 = 24;

/// Chunks per channel the long sample of NCCL's double binary tree builds.
pub const TREE_LONG_CHUNKS: u64 = 48;

/// Fewest repeating steps (per ring phase, per tree channel, of an all_to_all) for which a
/// baseline is sampled rather than built: four times the long sample's, so that at least
/// three quarters of the time comes from the extrapolation's slope, not from a sample built
/// in full anyway.
pub const SAMPLE_FROM_STEPS: u64 = 4 * LONG_STEPS;

/// The extrapolated makespan of `s` from its samples' (`short_us`, `long_us`), and the
/// weight `more` of the slope: the steps the long sample lacks over the steps between the
/// samples (0 where the long sample is no slower, so the result is never below it).
pub fn extrapolate_us(s: &StepSamples, short_us: f64, long_us: f64) -> (f64, f64) {
    let between = s.long_kept.saturating_sub(s.short_kept).max(1) as f64;
    let lacking = s.full.saturating_sub(s.long_kept) as f64;
    if long_us > short_us {
        let more = lacking / between;
        (long_us + more * (long_us - short_us), more)
    } else {
        (long_us, 0.0)
    }
}

/// A step-sampled plan of `full` steps of `what` per phase from its samples: `short` building
/// `short_kept` of them, `long` building `long_kept`. Named after the long sample, with its
/// protocol.
///
/// # Errors
/// [`RouteError::PlanCheck`] where [`check_step_samples`] refuses the result.
pub fn assemble(
    what: &str,
    full: u64,
    (short_kept, short): (u64, Plan),
    (long_kept, long): (u64, Plan),
) -> Result<Plan> {
    let mut plan = Plan::new(
        long.request.clone(),
        format!(
            "{} ({long_kept} of {full} {what} built, extrapolated)",
            long.algorithm
        ),
    );
    plan.protocol = long.protocol;
    plan.step_samples = Some(Box::new(StepSamples {
        what: what.to_string(),
        full,
        short_kept,
        long_kept,
        short,
        long,
    }));
    check_step_samples(&plan)?;
    Ok(plan)
}

/// Check the shape of a step-sampled plan: it holds no op, lane or staging of its own; its
/// samples are plans of its request with its protocol, neither sampled nor of rounds; and
/// `1 <= short_kept < long_kept < full`. (The samples deliver nothing, so nothing proves
/// more; [`crate::check_routes`] checks their copies' links.)
///
/// # Errors
/// [`RouteError::PlanCheck`] naming what is wrong.
pub fn check_step_samples(plan: &Plan) -> Result<()> {
    let fail = |message: String| RouteError::PlanCheck {
        op: usize::MAX,
        message: format!("{}: {message}", plan.algorithm),
    };
    let Some(s) = &plan.step_samples else {
        return Err(fail("is not step-sampled".into()));
    };
    if !(plan.ops.is_empty() && plan.lanes.is_empty() && plan.scratch.is_empty()) {
        return Err(fail(
            "a step-sampled plan holds ops, lanes or staging of its own".into(),
        ));
    }
    if !(1 <= s.short_kept && s.short_kept < s.long_kept && s.long_kept < s.full) {
        return Err(fail(format!(
            "samples of {} and {} of {} {} are not 1 <= short < long < full",
            s.short_kept, s.long_kept, s.full, s.what
        )));
    }
    for (name, sample) in [("short", &s.short), ("long", &s.long)] {
        if sample.request != plan.request || sample.protocol != plan.protocol {
            return Err(fail(format!(
                "its {name} sample plans another request or protocol"
            )));
        }
        if sample.step_samples.is_some() || sample.rounds.is_some() {
            return Err(fail(format!(
                "its {name} sample is itself sampled or of rounds"
            )));
        }
    }
    Ok(())
}
