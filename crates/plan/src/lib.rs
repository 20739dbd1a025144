//! # relaycc-plan: the Plan IR, its paths and its checker
//!
//! The bottom layer of relaycc's routing: what a plan is and how to prove it, with no
//! planner, simulator or backend in it.
//!
//! | what | where |
//! |---|---|
//! | the request and its buffer layouts | [`Request`], [`Collective`], [`DType`], [`ReduceOp`] |
//! | the Plan IR (plain data, serde JSON) | [`Plan`], [`Op`], [`OpKind`], [`Region`], [`Location`] |
//! | the dependency order of a plan's ops | [`DepGraph`] |
//! | proof that a plan delivers its request | [`check()`], [`check_with`], [`check_routes`], [`CheckedPlan`] |
//! | hops, relays, host staging, max-flow split over a topology | [`path`] |
//! | plans of rounds: one round's plan repeated over slices of a large message | [`rounds`] |
//! | step-sampled plans: a baseline too large to build, timed from its first steps | [`step_samples`] |
//! | which data types and reductions NVLink SHARP serves | [`nvls_support`] |
//! | the one error type of the routing crates | [`RouteError`] |
//!
//! Invariant: this crate imports nothing from the crates above it (relaycc-sim,
//! relaycc-planners, relaycc-route); Cargo enforces it.

#![deny(missing_docs)]

mod check;
mod dtype;
mod error;
pub mod nvls_support;
mod order;
pub mod path;
mod plan;
mod request;
pub mod rounds;
pub mod step_samples;

pub use check::{
    CheckOptions, CheckedPlan, check, check_rounds, check_routes, check_structure_only,
    check_template, check_with, clock_bytes,
};
pub use dtype::{DType, ReduceOp};
pub use error::{Result, RouteError};
pub use order::DepGraph;
pub use plan::{
    BufferRef, EdgeScale, Lane, LaneKey, Location, Mem, NvlsShare, OffsetAt, Op, OpKind,
    PeriodOffset, Plan, Region, RegionShift, Rounds, Scratch, StepSamples, Template, mem_of,
};
pub use relaycc_topo::rates::Protocol;
pub use request::{Collective, ExpectedPiece, InPlace, MAX_ELEMENTS, Request, Transfer};
