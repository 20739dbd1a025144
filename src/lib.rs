//! # relaycc
//!
//! Topology-aware collective communication for GPUs. This facade re-exports the workspace's
//! crates:
//!
//! | module | crate | owns |
//! |---|---|---|
//! | [`topo`] | relaycc-topo | the machine as a graph; presets, importers, exporters |
//! | [`route`] | relaycc-route | the Plan IR, planners, the flow simulator, bounds |
//! | [`collectives`] | relaycc-collectives | the safe API, the executor, the backends |

#![deny(missing_docs)]

pub use relaycc_collectives as collectives;
pub use relaycc_route as route;
pub use relaycc_topo as topo;
