//! Node-aware inter-node strategies and their cost models, after [Lockhart-2023] (the
//! bibliography is `docs/REFERENCES.md`).
//!
//! | [Lockhart-2023] | here |
//! |---|---|
//! | Standard, 3-Step, 2-Step, Split+MD, Split+DD (§2.3, Table 5) | [`Strategy`] |
//! | staged-through-host, device-aware (§3) | [`Staging`] |
//! | postal (Eq. 2.1), max-rate (Eq. 2.2) | [`MessageCostModel`] |
//! | Lassen's parameters (Tables 2-4) | [`ModelParams::LASSEN`] and the `LASSEN_*` constants |
//! | Table 6 models | [`model_time`] |
//! | Table 7 parameters | [`PatternStats`] |
//! | circled minima of Figure 4.3 | [`choose_strategy`] |
//!
//! The models read an exchange as a [`Pattern`] on a [`ClusterCounts`]; the plan generators
//! read a [`relaycc_plan::Request`] on a cluster [`relaycc_topo::Topology`] ([`node_aware_plan`]) or
//! on ranks grouped into nodes, one process per rank ([`rank_space_plan`], what the MPI
//! backend runs).

mod generate;
mod lowering;
mod messages;
mod model;
mod params;
mod rank_space;
mod strategy;

pub use generate::{node_aware_candidates, node_aware_plan, node_aware_plan_within};
pub use model::{MessageCostModel, PatternStats, choose_strategy, model_time, model_time_with};
pub use params::{
    LASSEN_COPY_ALPHA_S, LASSEN_COPY_BETA_S_PER_BYTE, LASSEN_CPU_ALPHA_S,
    LASSEN_CPU_BETA_S_PER_BYTE, LASSEN_CPU_INJECTION_S_PER_BYTE, LASSEN_DD_PROCS_PER_GPU,
    LASSEN_EAGER_MAX_BYTES, LASSEN_GPU_ALPHA_S, LASSEN_GPU_BETA_S_PER_BYTE, LASSEN_GPUS_PER_NODE,
    LASSEN_PROCS_PER_NODE, LASSEN_SHORT_MAX_BYTES, LASSEN_SOCKETS_PER_NODE,
    LASSEN_SPLIT_MESSAGE_CAP_BYTES, ModelParams, MpiProtocol, ProcessPlacement,
};
pub use rank_space::rank_space_plan;
pub use strategy::{ClusterCounts, ExchangeMessage, Pattern, Staging, Strategy};

#[cfg(test)]
mod findings;
#[cfg(test)]
mod tests;
