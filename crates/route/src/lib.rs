//! # relaycc-route: plans, routes, simulation
//!
//! Given a (masked) topology, the GPUs of a job, the GPUs allowed to relay and a [`Request`],
//! relaycc-route produces the fastest [`Plan`] it can find and says how fast it is, beside the
//! NCCL-like baseline and the bound.
//!
//! It is the top of four crates that stack, each depending only on those below it:
//! relaycc-plan (the IR, paths, the checker), relaycc-sim (the simulator, the bounds),
//! relaycc-planners (every way to build a plan) and this one (the choice). It re-exports what
//! their users need, so this crate is the routing layer's one door:
//!
//! | what | where |
//! |---|---|
//! | the request and its buffer layouts | [`Request`], [`Collective`], [`DType`], [`ReduceOp`] |
//! | the Plan IR (plain data, serde JSON) | [`Plan`], [`Op`], [`OpKind`], [`Region`], [`Location`] |
//! | proof that a plan delivers its request | [`check`], [`check_with`], [`check_routes`], [`CheckedPlan`] |
//! | whether a masked machine can carry a request at all | [`require_reachable`] |
//! | hops, relays, host staging, max-flow split | [`path`] |
//! | chunked, pipelined lowering of routes | [`route_pipeline`] |
//! | point-to-point candidates | [`p2p`] |
//! | collective candidates and the NCCL-like baseline | [`planner`] |
//! | node-aware inter-node strategies and models | [`nodeaware`] |
//! | staging budgets per device and fitting a plan to one | [`staging`] |
//! | templates: one domain of a plan on hosts that repeat, folded by their symmetry | [`template`] |
//! | plans of rounds: one round's plan repeated over slices of a large message | [`rounds`] |
//! | step-sampled plans: a baseline too large to build, timed from its first steps | [`step_samples`] |
//! | the fluid flow simulator | [`simulate`], [`SimResult`], [`Perf`], [`chrome_trace`] |
//! | choose the fastest, report it beside baseline and bound | [`plan()`], [`Planner`] (cached) |
//!
//! Invariant: this crate knows nothing of how bytes move; it never calls a backend.

#![deny(missing_docs)]

pub mod fidelity;
mod select;

pub use relaycc_plan::{
    BufferRef, CheckOptions, CheckedPlan, Collective, DType, DepGraph, EdgeScale, ExpectedPiece,
    InPlace, Lane, LaneKey, Location, MAX_ELEMENTS, NvlsShare, OffsetAt, Op, OpKind, PeriodOffset,
    Plan, Protocol, ReduceOp, Region, RegionShift, Request, Result, Rounds, RouteError, Scratch,
    StepSamples, Template, Transfer, check, check_rounds, check_routes, check_template, check_with,
    clock_bytes as check_clock_bytes, path, rounds, step_samples,
};
pub use relaycc_planners as planner;
pub use relaycc_planners::{
    CANDIDATE_OPS, CallOps, DEFAULT_BUDGET, LEAST_BUILD_TIME, LEAST_SIMULATION_GRACE, LargeBuild,
    Limit, MAX_CALL_OPS, nodeaware, p2p, require_reachable, require_relays_exist, route_pipeline,
    staging, template,
};
pub use relaycc_sim as sim;
pub use relaycc_sim::{
    DEADLINE_CHECK_BATCHES, DEADLINE_CHECK_WORK, DEFAULT_OP_OVERHEAD_US, EdgeUse, MemUse, OpSpan,
    Perf, PreparedSim, SimConfig, SimResult, chrome_trace, collective_bound_gbps, simulate,
};
pub use select::{
    CandidateTime, EXPAND_MAX_RANKS, PlanOptions, Planned, Planner,
    SAMPLED_PROOF_ABOVE_CLOCK_BYTES, plan, proved_by_checker,
};

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
