//! The node-aware strategies ([Lockhart-2023 §2.3], Table 5), how data leaves the GPU (staged
//! through host or device-aware, [Lockhart-2023 §3]), and the two inputs of the models: the
//! cluster's shape and the irregular exchange's pattern.

use std::fmt;

use relaycc_topo::Topology;
use serde::{Deserialize, Serialize};

use super::params::{LASSEN_GPUS_PER_NODE, LASSEN_PROCS_PER_NODE, LASSEN_SOCKETS_PER_NODE};
use relaycc_plan::{Collective, Request};
use relaycc_plan::{Result, RouteError};

/// An inter-node communication strategy ([Lockhart-2023 §2.3]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Every message goes directly from its sender to its receiver.
    Standard,
    /// Gather a node's data for each destination node on one rank, send one message per node
    /// pair to the paired rank there, which redistributes ([Lockhart-2023 §2.3.1]).
    ThreeStep,
    /// Each rank sends one message per destination node to its paired rank there, which
    /// redistributes ([Lockhart-2023 §2.3.2]).
    TwoStep,
    /// Split each node pair's data into capped messages spread over the node's processes (and
    /// NICs); data reaches those processes by extra on-node messages ([Lockhart-2023 §2.3.3],
    /// §4.2).
    SplitMd,
    /// As [`Strategy::SplitMd`], but several host processes copy from the GPU with duplicate
    /// device pointers instead of on-node messages ([Lockhart-2023 §4.2], §4.4).
    SplitDd,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 5] = [
        Strategy::Standard,
        Strategy::ThreeStep,
        Strategy::TwoStep,
        Strategy::SplitMd,
        Strategy::SplitDd,
    ];
    /// [Lockhart-2023]'s name (`3-Step`, `Split+MD`).
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Standard => "Standard",
            Strategy::ThreeStep => "3-Step",
            Strategy::TwoStep => "2-Step",
            Strategy::SplitMd => "Split+MD",
            Strategy::SplitDd => "Split+DD",
        }
    }
    /// True when [Lockhart-2023] defines the strategy with this staging (Table 5: split strategies
    /// are staged through host only).
    pub const fn supports(self, staging: Staging) -> bool {
        !matches!(
            (self, staging),
            (Strategy::SplitMd | Strategy::SplitDd, Staging::DeviceAware)
        )
    }
    /// Every (strategy, staging) pair of Table 5 of [Lockhart-2023] (eight).
    pub fn combinations() -> Vec<(Strategy, Staging)> {
        let mut v = Vec::new();
        for s in Strategy::ALL {
            for st in [Staging::Host, Staging::DeviceAware] {
                if s.supports(st) {
                    v.push((s, st));
                }
            }
        }
        v
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How inter-node data leaves and enters GPU memory ([Lockhart-2023 §3]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Staging {
    /// Copied to the host CPU, sent between host processes, copied to the receiving GPU.
    Host,
    /// Sent from device memory through the NIC directly (CUDA-aware MPI, GPUDirect).
    DeviceAware,
}

impl fmt::Display for Staging {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Staging::Host => "staged-through-host",
            Staging::DeviceAware => "device-aware",
        })
    }
}

/// The counts of a cluster that the models read: nodes, and per node its GPUs, sockets and
/// processes (nodes of equal make).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterCounts {
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node (one rank per GPU).
    pub gpus_per_node: u32,
    /// CPU sockets per node.
    pub sockets_per_node: u32,
    /// CPU processes per node that split strategies may use.
    pub procs_per_node: u32,
}

impl ClusterCounts {
    /// `nodes` Lassen nodes: 4 GPUs, 2 sockets, 40 processes ([Lockhart-2023 §2.1], §4.2).
    pub const fn lassen(nodes: u32) -> Self {
        ClusterCounts {
            nodes,
            gpus_per_node: LASSEN_GPUS_PER_NODE,
            sockets_per_node: LASSEN_SOCKETS_PER_NODE,
            procs_per_node: LASSEN_PROCS_PER_NODE,
        }
    }
    /// The shape of a topology: hosts, GPUs and sockets of its first host; processes per node
    /// are Lassen's (topologies do not record core counts).
    pub fn of(topo: &Topology) -> Self {
        let nodes = topo.host_count().max(1);
        let host0 = |id| topo.node(id).host == 0;
        let gpus = topo.gpu_nodes().iter().filter(|id| host0(**id)).count() as u32;
        let sockets = topo.cpus().filter(|(id, _)| host0(*id)).count() as u32;
        ClusterCounts {
            nodes,
            gpus_per_node: gpus.max(1),
            sockets_per_node: sockets.max(1),
            procs_per_node: LASSEN_PROCS_PER_NODE,
        }
    }
    /// GPUs per socket (at least one).
    pub fn gpus_per_socket(&self) -> u32 {
        (self.gpus_per_node / self.sockets_per_node.max(1)).max(1)
    }
    /// Processes per socket (at least one).
    pub fn procs_per_socket(&self) -> u32 {
        (self.procs_per_node / self.sockets_per_node.max(1)).max(1)
    }
}

/// One message of an irregular exchange, between ranks (rank r sits on node
/// `r / gpus_per_node` of the shape it is modelled on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExchangeMessage {
    /// Sending rank.
    pub src: u32,
    /// Receiving rank.
    pub dst: u32,
    /// Bytes.
    pub bytes: u64,
}

/// An irregular point-to-point exchange: every rank's messages to every destination.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Pattern {
    /// The messages; empty ones are allowed and ignored.
    pub messages: Vec<ExchangeMessage>,
}

impl Pattern {
    /// [Lockhart-2023]'s §4.6 scenario: node 0 sends `messages` inter-node messages of `bytes`
    /// each, "distributed evenly across on-node GPUs", to `dest_nodes` destination nodes (nodes
    /// 1..=dest_nodes), evenly.
    pub fn seed_scenario(
        shape: &ClusterCounts,
        messages: u32,
        dest_nodes: u32,
        bytes: u64,
    ) -> Self {
        let gpn = shape.gpus_per_node.max(1);
        let dest_nodes = dest_nodes.max(1);
        // GPU g's k-th message goes to node 1 + (k + g * ceil(D / gpn)) mod D, so every GPU
        // reaches as many nodes as it has messages for and every node gets its even share.
        let stride = dest_nodes.div_ceil(gpn);
        let v = (0..messages)
            .map(|i| {
                let (g, k) = (i % gpn, i / gpn);
                let node = 1 + (k + g * stride) % dest_nodes;
                ExchangeMessage {
                    src: g,
                    dst: node * gpn + (k / dest_nodes + g) % gpn,
                    bytes,
                }
            })
            .collect();
        Pattern { messages: v }
    }
    /// The pattern of a send_recv, all_gather_v or all_to_all_v request, in bytes; ranks are
    /// renumbered by GPU index so that `rank / gpus_per_node` is the node on a cluster preset.
    pub fn from_request(req: &Request) -> Result<Self> {
        exchange_only(req)?;
        let size = req.dtype.size();
        let mut messages = Vec::new();
        for p in req.expected()? {
            let (src, _) = p.terms.first().copied().unwrap_or((p.rank, 0));
            let (Some(&s), Some(&d)) = (req.gpus.get(src as usize), req.gpus.get(p.rank as usize))
            else {
                continue;
            };
            messages.push(ExchangeMessage {
                src: s,
                dst: d,
                bytes: p.len.saturating_mul(size),
            });
        }
        Ok(Pattern { messages })
    }
}

/// Refuses collectives other than the irregular exchanges (send_recv, all_gather_v,
/// all_to_all_v), the only ones the node-aware strategies define.
pub(super) fn exchange_only(req: &Request) -> Result<()> {
    if !matches!(
        req.collective,
        Collective::SendRecv | Collective::AllGatherV | Collective::AllToAllV
    ) {
        return Err(RouteError::BadRequest(format!(
            "node-aware strategies serve send_recv, all_gather_v and all_to_all_v, not {}",
            req.collective
        )));
    }
    Ok(())
}
