//! How to plan: [`PlanOptions`], what a caller of [`crate::plan()`] may set.

use std::time::Duration;

use relaycc_plan::path::RelayPolicy;
use relaycc_planners::limits::DEFAULT_BUDGET;
use relaycc_planners::p2p::P2pStrategy;
use relaycc_sim::SimConfig;

/// How to plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Which GPUs may relay. Default: any free GPU.
    pub relay: RelayPolicy,
    /// Which point-to-point route kinds to consider. Default: all.
    pub strategy: P2pStrategy,
    /// Simulator settings used to rank candidates.
    pub sim: SimConfig,
    /// Planning time allowed ([`DEFAULT_BUDGET`] by default). Once it is spent, candidates not
    /// yet built or simulated are left out and the best plan found so far is returned, with
    /// [`crate::Planned::budget_exhausted`] set. The baseline and the most promising candidate are
    /// always simulated, so a budget of zero still plans: those of 200,000 ops or more, the
    /// baseline until the deadline or for [`relaycc_planners::LEAST_SIMULATION_GRACE`] of its own where it
    /// passed (cut there, it is reported as a lower bound, [`crate::Planned::baseline_cut`]), relaycc's
    /// most promising candidate for a budget's time of its own (at least that grace), unless
    /// its progress shows it cannot end by then. Builds stop at their deadline
    /// ([`relaycc_planners::LEAST_BUILD_TIME`] at least): relaycc's candidates at the budget's, left out then;
    /// the baseline at 1.25 times the budget, the call then an error saying so
    /// ([`relaycc_plan::RouteError::OverLimit`]). Every call's builds hold at most [`relaycc_planners::MAX_CALL_OPS`]
    /// ops at once, and a request no plan could hold within them is refused at once.
    pub budget: Duration,
    /// Staging memory a plan may allocate on each device (GPU or host socket), bytes. Default:
    /// [`relaycc_planners::staging::DEFAULT_STAGING_BUDGET_BYTES`]; [`relaycc_planners::staging::UNBOUNDED_STAGING`]
    /// bounds nothing.
    pub staging_budget: u64,
    /// Build every plan in full, never as a template ([`relaycc_planners::template`]), whatever the
    /// ranks: what an executor asks for, since only a full plan can be proved and run.
    /// Default: false (templates above [`crate::EXPAND_MAX_RANKS`] ranks where the hosts repeat).
    pub expand: bool,
    /// Largest slice of one piece (a block of `count` elements, a `v` count, a transfer) one
    /// round moves, bytes: a request with a longer piece is planned as a plan of rounds
    /// ([`relaycc_plan::rounds`]), one round's plan repeated over successive slices and a tail's for
    /// the remainder, so neither its op count nor its planning time grows with the message.
    /// Default: [`relaycc_plan::rounds::DEFAULT_ROUND_BYTES`]; [`u64::MAX`] plans every request as
    /// one plan.
    pub round_bytes: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            relay: RelayPolicy::default(),
            strategy: P2pStrategy::default(),
            sim: SimConfig::default(),
            budget: DEFAULT_BUDGET,
            staging_budget: relaycc_planners::staging::DEFAULT_STAGING_BUDGET_BYTES,
            expand: false,
            round_bytes: relaycc_plan::rounds::DEFAULT_ROUND_BYTES,
        }
    }
}
