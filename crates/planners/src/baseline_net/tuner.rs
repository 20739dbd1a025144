//! NCCL's tuner for all_reduce across nodes: the time each algorithm would take under NCCL's
//! own cost model (a latency plus the size over a bus bandwidth, for the Simple protocol), and
//! the faster of ring and tree.
//!
//! Ring: bus bandwidth `channels x bw` (each channel's bandwidth, here its slowest hop),
//! algorithm bandwidth `bus x n / (2(n-1))`; latency `base + (2(n-1) - 2(N-1)) x intra +
//! 2(N-1) x inter`, where `intra` is at least three network overheads. Tree: bus bandwidth
//! `min(0.92 x channels x bw, channels x per-channel tree cap)`, algorithm bandwidth half of it;
//! latency `base + 2((n/N - 1) x intra + log2(N) x inter)`. `n` ranks, `N` nodes; times in
//! microseconds, `bytes / (1000 x GB/s)`.
//!
//! Source: [NCCL-src], `src/graph/tuning.cc` (`ncclTopoTuneModel`: the base and hardware
//! latencies of the Simple protocol, `perChMaxTreeBws`, the 0.92 tree factor, the bus to
//! algorithm bandwidth ratios, `getNetOverhead`) and `src/enqueue.cc` (time = latency + bytes
//! over bandwidth, the smallest wins).

use relaycc_topo::rates::CpuFamily;
use relaycc_topo::{LinkId, Topology};

use relaycc_plan::Request;

use super::links::NetLinks;
use super::rings::RailRing;

/// An algorithm NCCL's tuner chooses between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// Rail-aligned rings.
    Ring,
    /// The double binary tree.
    Tree,
}

/// Base latency of ring and tree, Simple protocol, microseconds ([NCCL-src], tuning.cc
/// `baseLatencies`).
pub const BASE_LATENCY_US: f64 = 8.4;
/// Ring step over NVLink, Simple protocol, microseconds ([NCCL-src], tuning.cc `hwLatencies`).
pub const RING_NVLINK_LATENCY_US: f64 = 3.4;
/// Ring step over PCIe, Simple protocol, microseconds ([NCCL-src], tuning.cc `hwLatencies`).
pub const RING_PCI_LATENCY_US: f64 = 5.7;
/// Tree step inside a node (NVLink or PCIe), Simple protocol, microseconds ([NCCL-src],
/// tuning.cc `hwLatencies`).
pub const TREE_INTRA_LATENCY_US: f64 = 4.0;
/// Network step of ring or tree, Simple protocol, microseconds ([NCCL-src], tuning.cc
/// `hwLatencies` NET).
pub const NET_LATENCY_US: f64 = 14.0;
/// Network post overhead on Intel hosts (AMD: twice), microseconds; the Simple protocol pays it
/// three times per step ([NCCL-src], tuning.cc `getNetOverhead`).
pub const NET_OVERHEAD_US: f64 = 1.0;
/// Tree bandwidth factor for all_reduce ([NCCL-src], tuning.cc).
pub const TREE_BW_FACTOR: f64 = 0.92;

/// Per-channel tree bandwidth caps, GB/s, by GPU generation (Volta, Ampere, Hopper,
/// Blackwell) and node count (1, 2, more) ([NCCL-src], tuning.cc `perChMaxTreeBws`).
pub const PER_CHANNEL_TREE_MAX_GBPS: [[f64; 3]; 4] = [
    [26.5, 18.5, 10.0],
    [24.0, 23.6, 17.8],
    [38.7, 41.4, 36.0],
    [70.0, 42.8, 24.0],
];

/// NCCL's predicted time of `algo` for `req`, microseconds, and the inputs it used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Latency term, microseconds.
    pub latency_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Latency plus bytes over bandwidth, microseconds.
    pub time_us: f64,
}

/// What the model needs of the communicator.
#[derive(Debug, Clone, Copy)]
pub struct CommShape {
    /// Ranks.
    pub ranks: usize,
    /// Nodes.
    pub nodes: usize,
    /// Channels.
    pub channels: usize,
    /// Bandwidth of one channel, GB/s.
    pub channel_gbps: f64,
    /// Smallest compute capability's `sm` number among the members (90 for H100).
    pub sm: u32,
    /// Members' nodes join their GPUs by NVLink (else PCIe).
    pub nvlink: bool,
    /// The hosts are AMD (a larger network overhead).
    pub amd: bool,
}

/// NCCL's estimate of `algo` on `shape` for an all_reduce of `bytes`.
pub fn estimate(shape: &CommShape, algo: Algo, bytes: u64) -> Estimate {
    let n = shape.ranks.max(2) as f64;
    let nodes = shape.nodes.max(1);
    let generation = match shape.sm {
        s if s >= 100 => 3,
        s if s >= 90 => 2,
        s if s >= 80 => 1,
        _ => 0,
    };
    let idx2 = nodes.clamp(1, 3) - 1;
    let bus = shape.channels as f64 * shape.channel_gbps;
    let inter = NET_LATENCY_US;
    let (latency_us, algbw_gbps) = match algo {
        Algo::Ring => {
            let steps = 2.0 * (n - 1.0);
            let inter_steps = 2.0 * (nodes as f64 - 1.0);
            let overhead = NET_OVERHEAD_US * if shape.amd { 2.0 } else { 1.0 } * 3.0;
            let hw = if shape.nvlink {
                RING_NVLINK_LATENCY_US
            } else {
                RING_PCI_LATENCY_US
            };
            let intra = hw.max(overhead);
            (
                BASE_LATENCY_US + (steps - inter_steps) * intra + inter_steps * inter,
                bus * n / steps,
            )
        }
        Algo::Tree => {
            let cap = shape.channels as f64 * PER_CHANNEL_TREE_MAX_GBPS[generation][idx2];
            let ppn = n / nodes as f64;
            let log2 = f64::from(usize::BITS - 1 - nodes.leading_zeros());
            (
                BASE_LATENCY_US + 2.0 * ((ppn - 1.0) * TREE_INTRA_LATENCY_US + log2 * inter),
                (bus * TREE_BW_FACTOR).min(cap) * 0.5,
            )
        }
    };
    let time_us = latency_us + bytes as f64 / (1000.0 * algbw_gbps.max(1e-9));
    Estimate {
        latency_us,
        algbw_gbps,
        time_us,
    }
}

/// The shape of a request on the cluster, from its rail rings.
pub(super) fn shape(
    topo: &Topology,
    req: &Request,
    links: &NetLinks,
    rings: &[RailRing],
) -> CommShape {
    let sm = req
        .gpus
        .iter()
        .filter_map(|&g| topo.gpu_info(g).ok()?.compute_capability.map(|c| c.sm()))
        .min()
        .unwrap_or(70);
    let channel_gbps = rings
        .iter()
        .map(RailRing::gbps)
        .fold(f64::INFINITY, f64::min);
    // NCCL's intra-node link type: NVLink when the first two members of every node are
    // joined by NVLink alone.
    let nvlink = links.nodes.iter().all(|n| {
        n.ranks.len() < 2
            || links.local(n.ranks[0], n.ranks[1]).is_ok_and(|c| {
                c.routes.iter().flat_map(|r| &r.hops).all(|h| {
                    h.edges
                        .iter()
                        .all(|e| topo.link(LinkId::new(*e as usize)).kind.is_nvlink())
                })
            })
    });
    let amd = topo
        .cpus()
        .next()
        .is_some_and(|(_, c)| c.family == CpuFamily::Amd);
    CommShape {
        ranks: req.nranks(),
        nodes: links.nodes.len(),
        channels: rings.len().max(1),
        channel_gbps: if channel_gbps.is_finite() {
            channel_gbps
        } else {
            0.0
        },
        sm,
        nvlink,
        amd,
    }
}

/// The algorithm NCCL's tuner picks for the all_reduce `req`: the smaller estimated time (ring
/// on a tie).
pub(super) fn choose(topo: &Topology, req: &Request, links: &NetLinks, rings: &[RailRing]) -> Algo {
    let s = shape(topo, req, links, rings);
    let bytes = req.size_bytes();
    let ring = estimate(&s, Algo::Ring, bytes);
    let tree = estimate(&s, Algo::Tree, bytes);
    if tree.time_us < ring.time_us {
        Algo::Tree
    } else {
        Algo::Ring
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100(nodes: usize) -> CommShape {
        CommShape {
            ranks: 8 * nodes,
            nodes,
            channels: 8,
            channel_gbps: 50.0,
            sm: 90,
            nvlink: true,
            amd: false,
        }
    }

    #[test]
    fn tree_wins_small_ring_wins_large() {
        for nodes in [2, 4, 16] {
            let s = h100(nodes);
            let small = 64 << 10;
            let large = 1 << 30;
            assert!(
                estimate(&s, Algo::Tree, small).time_us < estimate(&s, Algo::Ring, small).time_us,
                "{nodes} nodes"
            );
            assert!(
                estimate(&s, Algo::Ring, large).time_us < estimate(&s, Algo::Tree, large).time_us,
                "{nodes} nodes"
            );
        }
        // 2 nodes of H100: the tree is capped at 41.4 GB/s per channel, halved for algbw.
        let t = estimate(&h100(2), Algo::Tree, 0);
        assert!((t.algbw_gbps - 8.0 * 41.4 * 0.5).abs() < 1e-9);
        let r = estimate(&h100(2), Algo::Ring, 0);
        assert!((r.algbw_gbps - 400.0 * 16.0 / 30.0).abs() < 1e-9);
        assert!((r.latency_us - (8.4 + 28.0 * 3.4 + 2.0 * 14.0)).abs() < 1e-9);
    }
}
