//! # relaycc-route: plans, routes, simulation
//!
//! Given a (masked) topology, the GPUs of a job, the GPUs allowed to relay and a [`Request`],
//! relaycc-route produces the fastest [`Plan`] it can find and says how fast it is, beside the
//! NCCL-like baseline and the bound.
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

mod bound;
mod check;
mod dtype;
mod error;
pub mod fidelity;
mod limits;
pub mod nodeaware;
pub(crate) mod nvls_support;
mod order;
pub mod p2p;
pub mod path;
mod plan;
pub mod planner;
mod reach;
mod request;
pub mod rounds;
pub mod route_pipeline;
mod select;
pub mod sim;
pub mod staging;
pub mod step_samples;
pub mod template;

pub use bound::collective_bound_gbps;
pub use check::{
    CheckOptions, CheckedPlan, check, check_rounds, check_routes, check_template, check_with,
    clock_bytes as check_clock_bytes,
};
pub use dtype::{DType, ReduceOp};
pub use error::{Result, RouteError};
pub use limits::{
    CANDIDATE_OPS, CallOps, DEFAULT_BUDGET, LEAST_BUILD_TIME, LEAST_SIMULATION_GRACE, LargeBuild,
    Limit, MAX_CALL_OPS,
};
pub use order::DepGraph;
pub use plan::{
    BufferRef, EdgeScale, Lane, LaneKey, Location, NvlsShare, OffsetAt, Op, OpKind, PeriodOffset,
    Plan, Region, RegionShift, Rounds, Scratch, StepSamples, Template,
};
pub use reach::{require_reachable, require_relays_exist};
pub use relaycc_topo::rates::Protocol;
pub use request::{Collective, ExpectedPiece, InPlace, MAX_ELEMENTS, Request, Transfer};
pub use select::{
    CandidateTime, EXPAND_MAX_RANKS, PlanOptions, Planned, Planner,
    SAMPLED_PROOF_ABOVE_CLOCK_BYTES, plan, proved_by_checker,
};
pub use sim::{
    DEADLINE_CHECK_BATCHES, DEADLINE_CHECK_WORK, DEFAULT_OP_OVERHEAD_US, EdgeUse, MemUse, OpSpan,
    Perf, PreparedSim, SimConfig, SimResult, chrome_trace, simulate,
};

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
