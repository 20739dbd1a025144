//! [Lockhart-2023]'s performance models of the node-aware strategies (§2.2, §4, Table 6), with
//! Lassen's parameters ([`super::params`]).
//!
//! The text of [Lockhart-2023] used here lost its typeset equations; each formula below is rebuilt
//! from [Lockhart-2023]'s prose around the equation it names, and says so. The models cover the
//! inter-node part of an exchange (on-node messages cost the same under every strategy) and,
//! like [Lockhart-2023]'s, take the worst node and the worst process (Table 7's maxima).

use serde::{Deserialize, Serialize};

use super::params::{ModelParams, ProcessPlacement};
use super::strategy::{ClusterCounts, Pattern, Staging, Strategy};

/// Which model times the off-node step of staged-through-host strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageCostModel {
    /// The postal model, `alpha + beta * s` per message ([Lockhart-2023, Eq. 2.1]), everywhere.
    Postal,
    /// The max-rate model ([Lockhart-2023, Eq. 2.2]): adds the NIC injection limit to the off-node
    /// step of staged-through-host strategies ([Lockhart-2023 §4.3], Table 6). Device-aware steps
    /// stay postal, as in [Lockhart-2023] (GPU injection limits are not reached with 4 GPUs per
    /// node, §3).
    MaxRate,
}

/// [Lockhart-2023]'s Table 7 parameters of a pattern (plus the split bookkeeping of its Algorithm
/// 1), over inter-node messages only.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PatternStats {
    /// Max inter-node bytes sent by a single GPU (Table 7 `s_proc`).
    pub s_proc_bytes: f64,
    /// Max inter-node bytes received by a single GPU.
    pub r_proc_bytes: f64,
    /// Max inter-node messages sent by a single GPU.
    pub n_proc: f64,
    /// Largest inter-node message, bytes.
    pub s_msg_bytes: f64,
    /// Max bytes injected by a single node (Table 7 `s_node`).
    pub s_node_bytes: f64,
    /// Max bytes between any two nodes (Table 7 `s_node->node`).
    pub s_pair_bytes: f64,
    /// Max bytes from one GPU to one destination node (a 2-Step message).
    pub s_gpu_node_bytes: f64,
    /// Max destination nodes of a node.
    pub n_dest_nodes: f64,
    /// Max destination nodes of a GPU (Table 7 `n_nodes`).
    pub n_dest_nodes_per_gpu: f64,
    /// Max messages between any two nodes (Table 7 `m_node->node`).
    pub m_pair: f64,
    /// Max inter-node messages a node sends after splitting ([Lockhart-2023, Algorithm 1, lines
    /// 12-18]).
    pub n_split: f64,
    /// Largest split message, bytes.
    pub split_msg_bytes: f64,
}

impl PatternStats {
    /// Table 7's maxima of `pattern` on `shape`, splitting at `cap_bytes` (Algorithm 1).
    ///
    /// Complexity: O(m log m) for m messages.
    pub fn of(pattern: &Pattern, shape: &ClusterCounts, cap_bytes: u64) -> Self {
        use std::collections::BTreeMap;
        let gpn = shape.gpus_per_node.max(1);
        let node = |r: u32| r / gpn;
        let mut gpu_out: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
        let mut gpu_in: BTreeMap<u32, f64> = BTreeMap::new();
        let mut node_out: BTreeMap<u32, f64> = BTreeMap::new();
        let mut pair: BTreeMap<(u32, u32), (f64, f64)> = BTreeMap::new();
        let mut gpu_node: BTreeMap<(u32, u32), f64> = BTreeMap::new();
        let mut st = PatternStats::default();
        for m in pattern.messages.iter().filter(|m| m.bytes > 0) {
            let (a, b) = (node(m.src), node(m.dst));
            if a == b {
                continue;
            }
            let bytes = m.bytes as f64;
            st.s_msg_bytes = st.s_msg_bytes.max(bytes);
            let g = gpu_out.entry(m.src).or_default();
            g.0 += bytes;
            g.1 += 1.0;
            *gpu_in.entry(m.dst).or_default() += bytes;
            *node_out.entry(a).or_default() += bytes;
            let p = pair.entry((a, b)).or_default();
            p.0 += bytes;
            p.1 += 1.0;
            *gpu_node.entry((m.src, b)).or_default() += bytes;
        }
        let fmax = |it: &mut dyn Iterator<Item = f64>| it.fold(0.0, f64::max);
        st.s_proc_bytes = fmax(&mut gpu_out.values().map(|v| v.0));
        st.n_proc = fmax(&mut gpu_out.values().map(|v| v.1));
        st.r_proc_bytes = fmax(&mut gpu_in.values().copied());
        st.s_node_bytes = fmax(&mut node_out.values().copied());
        st.s_pair_bytes = fmax(&mut pair.values().map(|v| v.0));
        st.m_pair = fmax(&mut pair.values().map(|v| v.1));
        st.s_gpu_node_bytes = fmax(&mut gpu_node.values().copied());
        let mut dests: BTreeMap<u32, f64> = BTreeMap::new();
        for (a, _) in pair.keys() {
            *dests.entry(*a).or_default() += 1.0;
        }
        st.n_dest_nodes = fmax(&mut dests.values().copied());
        let mut gdests: BTreeMap<u32, f64> = BTreeMap::new();
        for (g, _) in gpu_node.keys() {
            *gdests.entry(*g).or_default() += 1.0;
        }
        st.n_dest_nodes_per_gpu = fmax(&mut gdests.values().copied());
        // Algorithm 1, lines 12-17: one message per node pair when every pair fits the cap;
        // otherwise raise the cap to volume / PPN when that many capped messages would
        // outnumber the node's processes.
        let cap = cap_bytes.max(1) as f64;
        let ppn = f64::from(shape.procs_per_node.max(1));
        for (&a, &vol) in &node_out {
            let pairs = pair.iter().filter(|((x, _), _)| *x == a).map(|(_, v)| v.0);
            let max_pair = pair
                .iter()
                .filter(|((x, _), _)| *x == a)
                .map(|(_, v)| v.0)
                .fold(0.0, f64::max);
            let (n, piece) = if max_pair <= cap {
                (pairs.count() as f64, max_pair)
            } else {
                let c = if vol / cap > ppn { vol / ppn } else { cap };
                let n: f64 = pairs.map(|v| (v / c).ceil()).sum();
                (n, c.min(max_pair))
            };
            st.n_split = st.n_split.max(n);
            st.split_msg_bytes = st.split_msg_bytes.max(piece);
        }
        st
    }
}

/// [Lockhart-2023, Eq. 2.1], the postal model: `alpha + beta * s` seconds for one message of `s`
/// bytes.
fn postal((alpha_s, beta_s_per_byte): (f64, f64), bytes: f64) -> f64 {
    alpha_s + beta_s_per_byte * bytes
}

/// [Lockhart-2023, Eq. 4.3] (staged, max-rate, from Eq. 2.2) and Eq. 4.4 (device-aware, postal):
/// the off-node step, `n * alpha + max(s_node / R_N, s * beta)` for `n` messages of at most `msg`
/// bytes, `s` bytes from the busiest process and `s_node` from the busiest node. The injection
/// term only applies to staged messages under [`MessageCostModel::MaxRate`].
fn off_node(
    p: &ModelParams,
    staging: Staging,
    model: MessageCostModel,
    (n, s, s_node, msg): (f64, f64, f64, f64),
) -> f64 {
    if n <= 0.0 {
        return 0.0;
    }
    match staging {
        Staging::DeviceAware => {
            let (a, b) = p.gpu(ProcessPlacement::OffNode, msg);
            n * a + b * s
        }
        Staging::Host => {
            let (a, b) = p.cpu(ProcessPlacement::OffNode, msg);
            match model {
                MessageCostModel::Postal => n * a + b * s,
                MessageCostModel::MaxRate => n * a + (s_node * p.injection_s_per_byte).max(b * s),
            }
        }
    }
}

/// [Lockhart-2023, Eq. 4.1], the on-node step of 3-Step and 2-Step (gather, or redistribution): in
/// the worst case a GPU exchanges `s` bytes with every other GPU of its node, `gps - 1` on its
/// socket and `gpn - gps` on the other sockets ([Lockhart-2023] writes `gps` for the latter, equal
/// on its two-socket nodes).
fn on_node_multistep(p: &ModelParams, staging: Staging, shape: &ClusterCounts, s: f64) -> f64 {
    if s <= 0.0 {
        return 0.0;
    }
    let gps = f64::from(shape.gpus_per_socket());
    let off = f64::from(shape.gpus_per_node.saturating_sub(shape.gpus_per_socket()));
    let (on_socket, on_node) = match staging {
        Staging::DeviceAware => (
            p.gpu(ProcessPlacement::OnSocket, s),
            p.gpu(ProcessPlacement::OnNode, s),
        ),
        Staging::Host => (
            p.cpu(ProcessPlacement::OnSocket, s),
            p.cpu(ProcessPlacement::OnNode, s),
        ),
    };
    (gps - 1.0) * postal(on_socket, s) + off * postal(on_node, s)
}

/// [Lockhart-2023, Eq. 4.2], the on-node step of the split strategies: `v` bytes of one GPU spread
/// over `q` processes in messages of `v / q` bytes. One process sends them; `ppg` processes already
/// hold their share through duplicate device pointers, so it sends `q - ppg` messages, the first
/// `pps - ppg` on its socket and the rest off socket (with 40 processes and one per GPU: 19
/// on-socket and 20 on-node messages, as §4.2 counts; Split+DD saves `ppg - 1` of them).
fn on_node_split(p: &ModelParams, shape: &ClusterCounts, v: f64, q: f64, ppg: f64) -> f64 {
    if v <= 0.0 || q <= ppg {
        return 0.0;
    }
    let k = q - ppg;
    let on = k.min((f64::from(shape.procs_per_socket()) - ppg).max(0.0));
    let off = k - on;
    let m = v / q;
    on * postal(p.cpu(ProcessPlacement::OnSocket, m), m)
        + off * postal(p.cpu(ProcessPlacement::OnNode, m), m)
}

/// [Lockhart-2023, Eq. 4.5], the staging copies: device-to-host of the `initial` bytes,
/// host-to-device of the `final` bytes, by one process (`procs = 0`) or four at once with duplicate
/// device pointers (`procs = 1`), Table 3's rows fitted against the bytes moved.
fn copies(p: &ModelParams, procs: usize, initial: f64, final_: f64) -> f64 {
    let (h2d, d2h) = (0, 1);
    let one = |dir: usize, s: f64| {
        if s > 0.0 {
            p.copy_alpha_s[procs][dir] + p.copy_beta_s_per_byte[procs][dir] * s
        } else {
            0.0
        }
    };
    one(d2h, initial) + one(h2d, final_)
}

/// Modelled time, seconds, of one node-aware strategy on an irregular exchange.
///
/// [Lockhart-2023]'s Table 6 models: the staging copies (Eq. 4.5, staged only), the on-node gather
/// (Eq. 4.1 for 3-Step, Eq. 4.2 for the split strategies; none for Standard and 2-Step), the
/// off-node exchange (Eq. 4.3 / 4.4), and the on-node redistribution (Eq. 4.1 / 4.2).
///
/// # Arguments
/// - `strategy`, `staging`: the strategy; pairs outside Table 5 of [Lockhart-2023] (split
///   strategies device-aware) have no model and return `f64::INFINITY`.
/// - `pattern`: the exchange; ranks sit on nodes as `rank / shape.gpus_per_node`.
/// - `shape`: the cluster.
/// - `model`: postal or max-rate for the staged off-node step.
///
/// # Returns
/// Seconds; 0 when no message crosses nodes.
///
/// # Complexity
/// O(m log m) for m messages (computing [`PatternStats`]).
///
/// Source: [Lockhart-2023 §4.1-§4.4, Tables 5-7], with Lassen's parameters (Tables 2-4).
pub fn model_time(
    strategy: Strategy,
    staging: Staging,
    pattern: &Pattern,
    shape: &ClusterCounts,
    model: MessageCostModel,
) -> f64 {
    model_time_with(
        &ModelParams::LASSEN,
        strategy,
        staging,
        pattern,
        shape,
        model,
    )
}

/// [`model_time`] with other parameters (a calibration of another machine).
///
/// Complexity: O(m log m) for m messages. Source: [Lockhart-2023 §4], Table 6.
pub fn model_time_with(
    p: &ModelParams,
    strategy: Strategy,
    staging: Staging,
    pattern: &Pattern,
    shape: &ClusterCounts,
    model: MessageCostModel,
) -> f64 {
    if !strategy.supports(staging) {
        return f64::INFINITY;
    }
    let st = PatternStats::of(pattern, shape, p.split_cap_bytes);
    if st.n_proc == 0.0 {
        return 0.0;
    }
    let gpn = f64::from(shape.gpus_per_node.max(1));
    let staged = staging == Staging::Host;
    let copy1 = if staged {
        copies(p, 0, st.s_proc_bytes, st.r_proc_bytes)
    } else {
        0.0
    };
    match strategy {
        Strategy::Standard => {
            let off = (st.n_proc, st.s_proc_bytes, st.s_node_bytes, st.s_msg_bytes);
            copy1 + off_node(p, staging, model, off)
        }
        Strategy::ThreeStep => {
            // Each of the node's GPUs is paired with ceil(nodes / gpn) destination nodes and
            // sends one message of up to s_pair bytes to each.
            let n = (st.n_dest_nodes / gpn).ceil().max(1.0);
            let s = (n * st.s_pair_bytes).min(st.s_node_bytes);
            let gather = (n * st.s_gpu_node_bytes).min(st.s_proc_bytes);
            copy1
                + on_node_multistep(p, staging, shape, gather)
                + off_node(p, staging, model, (n, s, st.s_node_bytes, st.s_pair_bytes))
                + on_node_multistep(p, staging, shape, st.s_pair_bytes)
        }
        Strategy::TwoStep => {
            let off = (
                st.n_dest_nodes_per_gpu,
                st.s_proc_bytes,
                st.s_node_bytes,
                st.s_gpu_node_bytes,
            );
            copy1
                + off_node(p, staging, model, off)
                + on_node_multistep(p, staging, shape, st.s_gpu_node_bytes)
        }
        Strategy::SplitMd | Strategy::SplitDd => {
            let ppn = f64::from(shape.procs_per_node.max(1));
            let active = st.n_split.min(ppn).max(1.0);
            let n = (st.n_split / ppn).ceil().max(1.0);
            let s = n * st.split_msg_bytes;
            // Worst case of §4.2: one GPU's data is spread over every active process.
            let q = active;
            let (copy, ppg) = if strategy == Strategy::SplitMd {
                (copy1, 1.0)
            } else {
                let ppg = f64::from(p.dd_procs_per_gpu.max(1));
                let c = copies(p, 1, st.s_proc_bytes, st.r_proc_bytes);
                (c, ppg)
            };
            copy + on_node_split(p, shape, st.s_proc_bytes, q, ppg)
                + off_node(
                    p,
                    staging,
                    model,
                    (n, s, st.s_node_bytes, st.split_msg_bytes),
                )
                + on_node_split(p, shape, st.r_proc_bytes, q, ppg)
        }
    }
}

/// The (strategy, staging) the model predicts fastest, with its time in seconds.
///
/// # Arguments
/// `pattern`, `shape`, `model` as for [`model_time`].
///
/// # Returns
/// The fastest of [Lockhart-2023]'s eight Table 5 pairs; ties go to the earlier pair in
/// [`Strategy::combinations`] order (Standard first, staged before device-aware).
///
/// # Complexity
/// O(m log m) for m messages, times eight.
///
/// Source: [Lockhart-2023 §4.6] (the circled minima of its Figure 4.3).
pub fn choose_strategy(
    pattern: &Pattern,
    shape: &ClusterCounts,
    model: MessageCostModel,
) -> (Strategy, Staging, f64) {
    let mut best = (Strategy::Standard, Staging::Host, f64::INFINITY);
    for (s, st) in Strategy::combinations() {
        let t = model_time(s, st, pattern, shape, model);
        if t < best.2 {
            best = (s, st, t);
        }
    }
    best
}
