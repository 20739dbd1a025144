//! Node-aware plans in *rank space*: the strategies of [`node_aware_plan`](super::node_aware_plan)
//! (Standard, 3-Step, 2-Step, Split+MD) planned for processes rather than for a hardware
//! topology.
//!
//! Every rank `r` is one process whose memory is `Location::Gpu(r)` (the request's `gpus` are
//! `0..n`); `node_of[r]` says which (possibly virtual) node the rank sits on. Plans use the
//! `U8` element type, so regions count bytes. Each op gets a lane of its own: ordering comes
//! only from `deps`, so every phase of a strategy (gather, inter-node, redistribute) is one
//! dependency level, which is what the MPI executor posts at once.
//!
//! The plans are plain [`Plan`]s, so [`relaycc_plan::check`] proves them correct (every output byte
//! receives exactly the input byte the request asks for) without running MPI; the unit tests
//! below do that for every strategy on random sparse patterns (proptest).

use std::collections::BTreeMap;

use super::lowering::Slots;
use super::messages::{
    Piece, aggregates, group_by, pick, pieces, ranks_of_nodes, rounds, split_chunk,
};
use super::strategy::{Strategy, exchange_only};
use crate::plan_writer::PlanWriter;
use crate::staging::{fit, min_chunk_elems};
use relaycc_plan::Request;
use relaycc_plan::{BufferRef, Location, Plan, Region};
use relaycc_plan::{Result, RouteError};

/// A rank-space plan under construction (every op on a lane of its own), with the node of
/// each rank, the ranks of each node and the relay slots of the split strategies.
struct RankSpacePlanBuilder<'a> {
    w: PlanWriter<'static>,
    node_of: &'a [u32],
    ranks_of: BTreeMap<u32, Vec<u32>>,
    slots: Slots,
}

impl RankSpacePlanBuilder<'_> {
    /// A copy on a lane of its own, so that only its data, `deps` and (where `deps` is empty)
    /// its round's gate order it.
    fn copy(&mut self, from: u32, src: Region, dst: Region, deps: Vec<u32>) -> Result<u32> {
        let lane = self
            .w
            .plan
            .add_lane(Location::Gpu(from), format!("rank{from}"));
        let after = self.slots.gated(&deps);
        self.w.copy(lane, src, dst, Vec::new(), &after)
    }

    /// The `k`-th rank of `node`, round robin (every rank of a node stays busy,
    /// [Lockhart-2023 §2.3.1]).
    fn pick(&self, node: u32, k: usize) -> u32 {
        pick(&self.ranks_of, node, k as u32)
    }

    /// Ranks of `node`.
    fn count(&self, node: u32) -> usize {
        self.ranks_of.get(&node).map_or(1, |v| v.len().max(1))
    }

    /// One inter-node message from `sender` to `receiver` carrying `parts` in order: packed at
    /// the sender unless the parts already lie contiguously in its input, unpacked at the
    /// receiver unless they go contiguously to its output. Adjacent parts of one source (one
    /// destination) become one gather (one redistribution) copy.
    fn bundle(&mut self, parts: &[Piece], sender: u32, receiver: u32) -> Result<()> {
        let total: u64 = parts.iter().map(|p| p.len).sum();
        let Some(first) = parts.first().copied() else {
            return Ok(());
        };
        if total == 0 {
            return Ok(());
        }
        let contiguous = |f: &dyn Fn(&Piece) -> (u32, u64)| {
            parts.windows(2).all(|w| {
                let (a, b) = (f(&w[0]), f(&w[1]));
                a.0 == b.0 && a.1 + w[0].len == b.1
            })
        };
        let send_direct = first.src == sender && contiguous(&|p| (p.src, p.src_off));
        let recv_direct = first.dst == receiver && contiguous(&|p| (p.dst, p.dst_off));
        let (src, deps) = if send_direct {
            (
                Region::new(BufferRef::Input(sender), first.src_off, total),
                Vec::new(),
            )
        } else {
            let g = self
                .slots
                .slot(&mut self.w.plan, Location::Gpu(sender), total);
            let mut deps = Vec::new();
            for (off, run) in runs(parts, |p| (p.src, p.src_off)) {
                let n: u64 = run.iter().map(|p| p.len).sum();
                let s = Region::new(BufferRef::Input(run[0].src), run[0].src_off, n);
                deps.push(self.copy(run[0].src, s, Region::new(g, off, n), Vec::new())?);
            }
            (Region::new(g, 0, total), deps)
        };
        if recv_direct {
            let dst = Region::new(BufferRef::Output(receiver), first.dst_off, total);
            self.copy(sender, src, dst, deps)?;
            return Ok(());
        }
        let rbuf = self
            .slots
            .slot(&mut self.w.plan, Location::Gpu(receiver), total);
        let arrived = self.copy(sender, src, Region::new(rbuf, 0, total), deps)?;
        for (off, run) in runs(parts, |p| (p.dst, p.dst_off)) {
            let n: u64 = run.iter().map(|p| p.len).sum();
            let d = Region::new(BufferRef::Output(run[0].dst), run[0].dst_off, n);
            self.copy(receiver, Region::new(rbuf, off, n), d, vec![arrived])?;
        }
        Ok(())
    }
}

/// Maximal runs of consecutive parts whose `key` continues contiguously (same rank, next
/// offset), with each run's offset in the concatenated stream.
fn runs(parts: &[Piece], key: impl Fn(&Piece) -> (u32, u64)) -> Vec<(u64, &[Piece])> {
    let mut out = Vec::new();
    let (mut start, mut off, mut run_off) = (0usize, 0u64, 0u64);
    for i in 0..parts.len() {
        let breaks = i + 1 == parts.len() || {
            let (a, b) = (key(&parts[i]), key(&parts[i + 1]));
            !(a.0 == b.0 && a.1 + parts[i].len == b.1)
        };
        off += parts[i].len;
        if breaks {
            out.push((run_off, &parts[start..=i]));
            start = i + 1;
            run_off = off;
        }
    }
    out
}

/// The plan of `strategy` for `req` with ranks on nodes `node_of`.
///
/// # Arguments
/// - `req`: a send_recv, all_gather_v or all_to_all_v request of `U8` elements (bytes) whose
///   `gpus` are `0..n` (rank r = process r = `Location::Gpu(r)`).
/// - `node_of`: the node of every rank (`n` entries).
/// - `strategy`: Standard, 3-Step, 2-Step or Split+MD; Split+DD (duplicate device pointers)
///   has no meaning between processes and is refused.
/// - `split_cap`: Split+MD's message cap in bytes (`message_cap` of
///   [Lockhart-2023, Algorithm 1]).
/// - `budget`: staging bytes each process may allocate
///   ([`crate::staging::DEFAULT_STAGING_BUDGET_BYTES`] by default): the pieces are cut into
///   rounds of one chunk each, every round packs and unpacks in one of two reused slot sets,
///   and [`crate::staging::fit`] shrinks the chunk until every process's slots fit.
///
/// # Returns
/// A plan that passes [`relaycc_plan::check`]; an error for other collectives, a bad layout, or
/// ([`RouteError::StagingBudget`]) a budget that even the smallest chunk exceeds.
///
/// # Complexity
/// O(p log p) for p pieces, plus O(p) per split chunk, per round; a few builds.
///
/// Source: [Lockhart-2023 §2.3] (3-Step, 2-Step), §2.3.3 and Algorithm 1 (Split), with the pairing of
/// [`node_aware_plan`](super::node_aware_plan).
pub fn rank_space_plan(
    req: &Request,
    node_of: &[u32],
    strategy: Strategy,
    split_cap: u64,
    budget: u64,
) -> Result<Plan> {
    exchange_only(req)?;
    let n = req.nranks();
    if node_of.len() != n || req.gpus.iter().enumerate().any(|(i, g)| *g as usize != i) {
        return Err(RouteError::BadRequest(format!(
            "rank-space plans need gpus 0..{n} and a node for each rank ({} given)",
            node_of.len()
        )));
    }
    if strategy == Strategy::SplitDd {
        return Err(RouteError::BadRequest(
            "Split+DD shares device pointers inside a node; between processes use Split+MD".into(),
        ));
    }
    let all: Vec<Piece> = pieces(req)?.into_iter().filter(|p| p.len > 0).collect();
    let longest = all.iter().map(|p| p.len).max().unwrap_or(0).max(1);
    fit(longest, min_chunk_elems(req), budget, None, |chunk| {
        in_rounds(req, node_of, &all, strategy, split_cap, chunk)
    })
}

/// The rank-space plan for `all` (the non-empty pieces of `req`) cut into rounds: round `k`
/// moves elements `[k * chunk, (k + 1) * chunk)` of every piece, in the slot set of parity
/// `k % 2`.
fn in_rounds(
    req: &Request,
    node_of: &[u32],
    all: &[Piece],
    strategy: Strategy,
    split_cap: u64,
    chunk: u64,
) -> Result<Plan> {
    let mut g = RankSpacePlanBuilder {
        w: PlanWriter::new(
            Plan::new(req.clone(), format!("rank-space {strategy}")),
            None,
        ),
        node_of,
        ranks_of: ranks_of_nodes(node_of),
        slots: Slots::default(),
    };
    for (k, slice) in rounds(all, chunk, 0) {
        g.slots.begin(&g.w.plan, k);
        rank_space_round(&mut g, &slice, strategy, split_cap)?;
        g.slots.end(&g.w.plan);
    }
    Ok(g.w.plan)
}

/// One round of a rank-space plan: every piece of `all` (a slice of each of the request's
/// pieces) moved by `strategy`, packed and unpacked in this round's slots.
fn rank_space_round(
    g: &mut RankSpacePlanBuilder,
    all: &[Piece],
    strategy: Strategy,
    split_cap: u64,
) -> Result<()> {
    let node_of = g.node_of;
    let node = |r: u32| node_of[r as usize];
    let mut remote = Vec::new();
    for p in all {
        if node(p.src) == node(p.dst) || strategy == Strategy::Standard {
            let s = Region::new(BufferRef::Input(p.src), p.src_off, p.len);
            let d = Region::new(BufferRef::Output(p.dst), p.dst_off, p.len);
            g.copy(p.src, s, d, Vec::new())?;
        } else {
            remote.push(*p);
        }
    }
    // Sources in rank order, so that one source's parts are adjacent (one gather copy each).
    remote.sort_by_key(|p| (p.src, p.src_off));
    match strategy {
        Strategy::Standard | Strategy::SplitDd => Ok(()),
        Strategy::ThreeStep | Strategy::TwoStep => {
            let by_source = strategy == Strategy::TwoStep;
            for m in aggregates(&remote, node_of, &g.ranks_of, by_source) {
                g.bundle(&m.pieces, m.sender, m.receiver)?;
            }
            Ok(())
        }
        Strategy::SplitMd => split(g, &remote, split_cap.max(1)),
    }
}

/// Split+MD ([Lockhart-2023, Algorithm 1]): each node pair's bytes are cut into messages of at most
/// the cap (raised to volume / ranks-per-node when more messages than ranks would result); sends
/// are dealt to the node's ranks from the last local rank down, receives from local rank 0
/// up, so that every rank of a node takes part.
fn split(g: &mut RankSpacePlanBuilder, remote: &[Piece], cap: u64) -> Result<()> {
    let node = |r: u32| g.node_of[r as usize];
    let mut volume: BTreeMap<u32, u64> = BTreeMap::new();
    for p in remote {
        *volume.entry(node(p.src)).or_default() += p.len;
    }
    let mut sends: BTreeMap<u32, usize> = BTreeMap::new();
    let mut recvs: BTreeMap<u32, usize> = BTreeMap::new();
    for ((na, nb), group) in group_by(remote, |p| (node(p.src), node(p.dst))) {
        let total: u64 = group.iter().map(|p| p.len).sum();
        let ppn = g.count(na) as u64;
        let vol = volume.get(&na).copied().unwrap_or(total);
        let chunk = split_chunk(total, vol, cap, ppn);
        let mut lo = 0;
        while lo < total {
            let hi = (lo + chunk).min(total);
            let mut parts = Vec::new();
            let mut start = 0;
            for p in &group {
                let (a, z) = (start.max(lo), (start + p.len).min(hi));
                if a < z {
                    let within = a - start;
                    parts.push(Piece {
                        src_off: p.src_off + within,
                        dst_off: p.dst_off + within,
                        len: z - a,
                        ..*p
                    });
                }
                start += p.len;
            }
            let s = sends.entry(na).or_default();
            let sender_idx = g.count(na) - 1 - (*s % g.count(na));
            *s += 1;
            let r = recvs.entry(nb).or_default();
            let receiver_idx = *r;
            *r += 1;
            let sender = g.pick(na, sender_idx);
            let receiver = g.pick(nb, receiver_idx);
            g.bundle(&parts, sender, receiver)?;
            lo = hi;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::staging::DEFAULT_STAGING_BUDGET_BYTES;
    use relaycc_plan::{Collective, DType, check};

    /// An all_to_all_v over `n` ranks whose matrix comes from `cells` (row-major, one per
    /// pair); the last rank sends nothing.
    fn sparse(n: usize, cells: &[u64]) -> Request {
        let mut m: Vec<Vec<u64>> = cells.chunks(n).take(n).map(<[u64]>::to_vec).collect();
        m[n - 1].fill(0); // a rank with no neighbours
        let mut r = Request::new(Collective::AllToAllV, (0..n as u32).collect(), 0, DType::U8);
        r.matrix = m;
        r
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 100,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        #[test]
        fn every_strategy_is_correct_on_sparse_patterns(
            (n, k) in proptest::prop_oneof![
                proptest::strategy::Just((4usize, 1u32)),
                proptest::strategy::Just((4, 2)),
                proptest::strategy::Just((8, 2)),
                proptest::strategy::Just((8, 4)),
                proptest::strategy::Just((6, 4)),
            ],
            // Two in three pairs exchange nothing; others up to 39 bytes, empty ones included.
            cells in proptest::collection::vec(
                proptest::prop_oneof![2 => proptest::strategy::Just(0u64), 1 => 0u64..40],
                64,
            ),
            chunk in 1u64..8,
        ) {
            let node_of: Vec<u32> = (0..n as u32).map(|r| r / k).collect();
            let req = sparse(n, &cells);
            let all: Vec<Piece> = pieces(&req).unwrap().into_iter().filter(|p| p.len > 0).collect();
            for s in [Strategy::Standard, Strategy::ThreeStep, Strategy::TwoStep, Strategy::SplitMd] {
                for cap in [7, 1 << 20] {
                    let p = rank_space_plan(&req, &node_of, s, cap, DEFAULT_STAGING_BUDGET_BYTES).unwrap();
                    check(&p).unwrap_or_else(|e| panic!("{s} n={n} k={k}: {e}"));
                    // Rounds of a few bytes reuse two slot sets: still exact, and a process
                    // stages at most two sets of (pack + unpack) slots of one chunk per piece.
                    let r = in_rounds(&req, &node_of, &all, s, cap, chunk).unwrap();
                    check(&r).unwrap_or_else(|e| panic!("{s} n={n} k={k} chunk={chunk}: {e}"));
                    let bound = 4 * all.len() as u64 * chunk;
                    for (loc, b) in r.staging_per_location() {
                        assert!(b <= bound, "{s} chunk={chunk}: {loc:?} {b} > {bound}");
                    }
                }
            }
        }
    }

    #[test]
    fn all_gather_v_plans_are_correct() {
        let mut r = Request::new(Collective::AllGatherV, (0..8).collect(), 0, DType::U8);
        r.counts = vec![3, 0, 5, 1, 0, 9, 2, 4];
        let node_of: Vec<u32> = (0..8).map(|r| r / 4).collect();
        for s in [Strategy::ThreeStep, Strategy::TwoStep, Strategy::SplitMd] {
            check(&rank_space_plan(&r, &node_of, s, 4, DEFAULT_STAGING_BUDGET_BYTES).unwrap())
                .unwrap();
        }
    }

    #[test]
    fn three_step_sends_one_message_per_node_pair() {
        // Every rank of node 0 sends to every rank of node 1: 16 pieces, one inter-node message.
        let mut r = Request::new(Collective::AllToAllV, (0..8).collect(), 0, DType::U8);
        r.matrix = (0..8)
            .map(|s| (0..8).map(|d| u64::from(s < 4 && d >= 4)).collect())
            .collect();
        let node_of: Vec<u32> = (0..8).map(|r| r / 4).collect();
        let p = rank_space_plan(
            &r,
            &node_of,
            Strategy::ThreeStep,
            1 << 20,
            DEFAULT_STAGING_BUDGET_BYTES,
        )
        .unwrap();
        let inter = p
            .ops
            .iter()
            .filter(|o| match &o.kind {
                relaycc_plan::OpKind::Copy { src, dst } => {
                    let owner = |b: BufferRef| match b {
                        BufferRef::Input(r) | BufferRef::Output(r) => Some(r),
                        BufferRef::Scratch(i) => match p.scratch[i as usize].location {
                            Location::Gpu(r) => Some(r),
                            Location::Host(_) => None,
                        },
                    };
                    let (a, b) = (owner(src.buffer), owner(dst.buffer));
                    a.zip(b).is_some_and(|(a, b)| a / 4 != b / 4)
                }
                _ => false,
            })
            .count();
        assert_eq!(inter, 1);
        assert!(
            rank_space_plan(
                &r,
                &node_of,
                Strategy::SplitDd,
                1,
                DEFAULT_STAGING_BUDGET_BYTES
            )
            .is_err()
        );
        let all_reduce = Request::new(Collective::AllReduce, (0..8).collect(), 4, DType::U8);
        let e = rank_space_plan(
            &all_reduce,
            &node_of,
            Strategy::ThreeStep,
            1,
            DEFAULT_STAGING_BUDGET_BYTES,
        )
        .unwrap_err();
        assert!(e.to_string().contains("all_to_all_v"), "{e}");
    }
}
