//! What every part of the simulator shares and depends on nothing else of it: the settings
//! ([`SimConfig`]) and the unit rates convert by.

/// Extra fixed cost of every op, microseconds, beyond its mechanism's: 0 by default, since the
/// topology's cost model ([`relaycc_topo::rates::CostModel`]) charges copy-engine launches,
/// kernel launches and NCCL's protocol steps; a positive value models extra software
/// overhead per op.
pub const DEFAULT_OP_OVERHEAD_US: f64 = 0.0;

/// Simulator settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Fixed cost every op pays when it starts, before its bytes flow, on top of its
    /// mechanism's cost from the topology's cost model, microseconds. Default
    /// [`DEFAULT_OP_OVERHEAD_US`] (0).
    pub op_overhead_us: f64,
    /// Host time to enqueue one launch, microseconds, paid one launch after another in op
    /// order: the op of launch `k` cannot start before `(k + 1) x issue_us`, and an op that
    /// joins the launch before it on its lane (a batch of small copies on SMs) is issued with
    /// it. An executor that launches a plan from one thread, a copy or kernel launch and its
    /// event records and waits per launch, pays it on a GPU backend (see
    /// `relaycc_collectives::Backend::op_issue_us`). Default 0: the simulator's
    /// figures for NCCL-like plans model NCCL's persistent kernels, which pay no such cost.
    pub issue_us: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            op_overhead_us: DEFAULT_OP_OVERHEAD_US,
            issue_us: 0.0,
        }
    }
}

/// GB/s to bytes per microsecond: 1 GB/s = 1e9 B / 1e6 us = 1e3 B/us.
pub(super) const BYTES_PER_US_PER_GBPS: f64 = 1e3;
