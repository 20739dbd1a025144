//! Plans over ranks that are processes (rank space): rank `r` is process `r`, its memory
//! `Location::Gpu(r)`, and every op has a lane of its own, so only real dependencies order
//! ops and each phase is one dependency level of a process's schedule (every message of a
//! level is posted at once). The MPI backend of relaycc-collectives plans its typed calls and
//! exchanges here.
//!
//! - all_gather_v, all_to_all_v and send_recv: [Lockhart-2023]'s strategies through
//!   [`crate::nodeaware::rank_space_plan`], the strategy picked by the max-rate model over the
//!   processes' (virtual) nodes ([`modelled_strategies`]) unless the caller forces one; the plan
//!   counts bytes. The Standard strategy of all_to_all_v is the pairwise exchange
//!   ([`pairwise_all_to_all_v`]).
//! - every other collective: [`direct_plan`], built from the request's expected pieces
//!   ([`Request::expected`]), typed.
//!
//! Every plan is plain data that passes [`relaycc_plan::check`]; callers prove it before a message
//! moves.

use std::collections::BTreeMap;

use crate::nodeaware::{
    ClusterCounts, ExchangeMessage, MessageCostModel, Pattern, Staging, Strategy, model_time,
    rank_space_plan,
};
use crate::plan_writer::PlanWriter;
use crate::staging::Slots;
use relaycc_plan::DType;
use relaycc_plan::{BufferRef, Location, Plan, Region};
use relaycc_plan::{Collective, Request};
use relaycc_plan::{Result, RouteError};

/// The strategies an exchange between processes can run (Split+DD shares device pointers
/// between processes of one GPU, which host processes cannot).
pub const PROCESS_STRATEGIES: [Strategy; 4] = [
    Strategy::Standard,
    Strategy::ThreeStep,
    Strategy::TwoStep,
    Strategy::SplitMd,
];

/// The processes a rank-space plan runs on.
#[derive(Debug, Clone, Copy)]
pub struct RankSpace<'a> {
    /// The (virtual) node of every rank, `0..nodes`.
    pub node_of: &'a [u32],
    /// Device memory may go to the network directly (a CUDA-aware MPI): the model also weighs
    /// device-aware staging.
    pub device_aware: bool,
    /// Split+MD's message cap in bytes ([Lockhart-2023, Algorithm 1]'s `message_cap`).
    pub split_cap_bytes: u64,
    /// Staging bytes each process may allocate ([`crate::staging::DEFAULT_STAGING_BUDGET_BYTES`]
    /// by default).
    pub staging_budget: u64,
}

/// True for the collectives planned by [Lockhart-2023]'s strategies (in bytes).
pub fn is_exchange(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllGatherV | Collective::AllToAllV | Collective::SendRecv
    )
}

/// The plan of a typed request over ranks `0..n` (processes) on `space`: an exchange
/// collective with `strategy` (or the model's fastest of [`PROCESS_STRATEGIES`] when `None`;
/// a send/recv pair is always Standard: no other rank may relay it), every other collective
/// [`direct_plan`].
///
/// Errors: a request that does not validate, a strategy processes cannot run (Split+DD), a
/// staging budget that even the smallest chunk exceeds.
pub fn plan(req: &Request, space: &RankSpace<'_>, strategy: Option<Strategy>) -> Result<Plan> {
    req.validate()?;
    if !is_exchange(req.collective) {
        return direct_plan(req, space.staging_budget);
    }
    let bytes = byte_request(req);
    let strategy = match strategy {
        Some(s) if PROCESS_STRATEGIES.contains(&s) => s,
        Some(s) => {
            return Err(RouteError::BadRequest(format!(
                "{s} is not available between processes (use one of Standard, 3-Step, 2-Step, \
                 Split+MD)"
            )));
        }
        None if req.collective == Collective::SendRecv => Strategy::Standard,
        None => modelled_strategies(&bytes, space)?
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(Strategy::Standard, |m| m.0),
    };
    if strategy == Strategy::Standard && req.collective == Collective::AllToAllV {
        // Standard moves every block straight to its receiver: the pairwise order keeps the
        // ranks from all sending to one peer at once.
        return pairwise_all_to_all_v(req);
    }
    rank_space_plan(
        &bytes,
        space.node_of,
        strategy,
        space.split_cap_bytes,
        space.staging_budget,
    )
}

/// [Lockhart-2023]'s max-rate model time of each of [`PROCESS_STRATEGIES`] for the exchange
/// `bytes` (a request of `U8` elements over ranks `0..n`) on `space`, the best staging each.
///
/// Errors: a request that is not an exchange, or whose ranks `space.node_of` does not cover.
pub fn modelled_strategies(bytes: &Request, space: &RankSpace<'_>) -> Result<Vec<(Strategy, f64)>> {
    let node_of = space.node_of;
    if node_of.len() < bytes.nranks() {
        return Err(RouteError::BadRequest(format!(
            "{} ranks, {} of them placed on nodes",
            bytes.nranks(),
            node_of.len()
        )));
    }
    let nodes = node_of.iter().copied().max().map_or(1, |m| m + 1);
    let mut per_node = vec![0u32; nodes as usize];
    let mut pos = vec![0u32; node_of.len()];
    for (r, nd) in node_of.iter().enumerate() {
        pos[r] = per_node[*nd as usize];
        per_node[*nd as usize] += 1;
    }
    let gpn = per_node.iter().copied().max().unwrap_or(1).max(1);
    let id = |r: u32| node_of[r as usize] * gpn + pos[r as usize];
    let pattern = Pattern {
        messages: Pattern::from_request(bytes)?
            .messages
            .iter()
            .map(|m| ExchangeMessage {
                src: id(m.src),
                dst: id(m.dst),
                bytes: m.bytes,
            })
            .collect(),
    };
    let shape = ClusterCounts {
        nodes,
        gpus_per_node: gpn,
        sockets_per_node: 1,
        procs_per_node: gpn,
    };
    let stagings: &[Staging] = if space.device_aware {
        &[Staging::Host, Staging::DeviceAware]
    } else {
        &[Staging::Host]
    };
    Ok(PROCESS_STRATEGIES
        .iter()
        .map(|s| {
            let t = stagings
                .iter()
                .map(|st| model_time(*s, *st, &pattern, &shape, MessageCostModel::MaxRate))
                .fold(f64::INFINITY, f64::min);
            (*s, t)
        })
        .collect())
}

/// The byte request of a request: the same layout in `U8` elements, as [`rank_space_plan`]
/// plans exchanges.
pub fn byte_request(req: &Request) -> Request {
    let esize = req.dtype.size();
    let mut b = req.clone();
    b.dtype = DType::U8;
    b.count = req.count.saturating_mul(esize);
    b.counts = req.counts.iter().map(|c| c.saturating_mul(esize)).collect();
    b.matrix = req
        .matrix
        .iter()
        .map(|row| row.iter().map(|c| c.saturating_mul(esize)).collect())
        .collect();
    for t in &mut b.transfers {
        t.count = t.count.saturating_mul(esize);
    }
    b
}

/// The terms of a reduction: (rank, input offset) per contributor.
type Terms = Vec<(u32, u64)>;

/// The direct plan of a request over ranks `0..n` (ranks are processes).
///
/// - A piece with one term (data movement, or any collective of one rank) is one copy from
///   the source rank's input to the destination rank's output: one message, or a local copy
///   when both are one rank.
/// - Pieces with several terms (reductions) that share their terms and length are one
///   reduction, split into `n` slices, slice `o` reduced on rank `o`: every other rank sends
///   its part of the slice to a scratch buffer on `o` (level 0), `o` reduces them with its own
///   part into its output when it needs the result, else into scratch (level 1), then sends
///   the result to every other rank that needs it (level 2). This is a direct reduce-scatter
///   followed by a direct all-gather: each rank moves `2 (n-1)/n` of the data, as a ring
///   does, in three levels instead of `2 (n-1)` steps. A reduction with one destination
///   among several (reduce_scatter's blocks) is reduced whole on its destination, so the
///   blocks spread the work over the ranks.
///
/// Reductions run in rounds of at most one chunk of elements whose staging (the parts sent to
/// `o` and a result `o` does not keep) lives in two reused slot sets; [`crate::staging::fit`] picks
/// the chunk so that every process stages at most `budget` bytes (one round when the whole
/// message fits).
///
/// Errors: a request that does not validate; `RouteError::StagingBudget` when even the
/// smallest chunk exceeds `budget`.
///
/// Complexity: O(n^2) ops for n ranks.
pub fn direct_plan(req: &Request, budget: u64) -> Result<Plan> {
    let longest = req
        .expected()?
        .iter()
        .filter(|p| p.terms.len() > 1)
        .map(|p| p.len)
        .max()
        .unwrap_or(0)
        .max(1);
    crate::staging::fit(
        longest,
        crate::staging::min_chunk_elems(req),
        budget,
        None,
        |chunk| direct_in_rounds(req, chunk),
    )
}

/// [`direct_plan`] with its reductions cut into rounds of at most `chunk` elements: round `k`
/// reduces elements `[k x chunk, (k + 1) x chunk)` of every reduction, staging in one of two
/// reused slot sets ([`crate::staging::Slots`]).
fn direct_in_rounds(req: &Request, chunk: u64) -> Result<Plan> {
    let chunk = chunk.max(1);
    let n = req.nranks() as u32;
    let mut w = PlanWriter::new(Plan::new(req.clone(), "rank-space direct"), None);
    let mut slots = crate::staging::Slots::default();
    // Every op on a lane of its own, ordered by its data and its round's gate only.
    let copy = |w: &mut PlanWriter<'_>,
                slots: &Slots,
                from: u32,
                src: Region,
                dst: Region,
                deps: &[u32]| {
        let lane = w.plan.add_lane(Location::Gpu(from), format!("rank{from}"));
        w.copy(lane, src, dst, Vec::new(), &slots.gated(deps))
    };
    // Reductions grouped by (terms, length): destinations (rank, output offset) in order.
    let mut reductions: BTreeMap<(Terms, u64), Vec<(u32, u64)>> = BTreeMap::new();
    for p in req.expected()? {
        match p.terms.as_slice() {
            // One term (a move, or one rank's reduction, which is its input): a copy.
            [(s, soff)] => {
                let src = Region::new(BufferRef::Input(*s), *soff, p.len);
                let dst = Region::new(BufferRef::Output(p.rank), p.out_offset, p.len);
                copy(&mut w, &slots, *s, src, dst, &[])?;
            }
            _ => reductions
                .entry((p.terms.clone(), p.len))
                .or_default()
                .push((p.rank, p.out_offset)),
        }
    }
    let groups = reductions.len();
    let longest = reductions.keys().map(|k| k.1).max().unwrap_or(0);
    for k in 0..longest.div_ceil(chunk) {
        slots.begin(&w.plan, k);
        for ((terms, full), dests) in &reductions {
            let base = k * chunk;
            if base >= *full {
                continue;
            }
            let len = (full - base).min(chunk);
            let slices: Vec<(u32, u64, u64)> = match dests.as_slice() {
                [(d, _)] if groups > 1 => vec![(*d, 0, len)],
                _ => (0..n)
                    .map(|o| {
                        let (lo, hi) = slice(len, n, o);
                        (o, lo, hi - lo)
                    })
                    .collect(),
            };
            for (o, lo, m) in slices {
                if m == 0 {
                    continue;
                }
                let lo = base + lo;
                let mut srcs = Vec::with_capacity(terms.len());
                let mut deps = Vec::new();
                for &(k, off) in terms {
                    let part = Region::new(BufferRef::Input(k), off + lo, m);
                    if k == o {
                        srcs.push(part);
                    } else {
                        let s = slots.slot(&mut w.plan, Location::Gpu(o), m);
                        let into = Region::new(s, 0, m);
                        deps.push(copy(&mut w, &slots, k, part, into, &[])?);
                        srcs.push(into);
                    }
                }
                let result = match dests.iter().find(|(d, _)| *d == o) {
                    Some(&(_, out)) => Region::new(BufferRef::Output(o), out + lo, m),
                    None => Region::new(slots.slot(&mut w.plan, Location::Gpu(o), m), 0, m),
                };
                let lane = w.plan.add_lane(Location::Gpu(o), format!("rank{o} reduce"));
                let red = w.reduce(lane, srcs, result, true, &slots.gated(&deps))?;
                for &(d, out) in dests.iter().filter(|(d, _)| *d != o) {
                    let dst = Region::new(BufferRef::Output(d), out + lo, m);
                    copy(&mut w, &slots, o, result, dst, &[red])?;
                }
            }
        }
        slots.end(&w.plan);
    }
    Ok(w.plan)
}

/// The all_to_all_v plan of `req` over ranks `0..n` in pairwise-exchange order: step `k`
/// (`0..n`) moves rank `s`'s block for rank `(s + k) mod n`, one copy each, straight from the
/// sender's input to the receiver's output (no staging). Every copy is on a lane of its own,
/// so the whole exchange is one dependency level; op ids follow the steps, so each rank posts
/// its sends in the order `s + 1, s + 2, ...` and its receives in the order `d - 1, d - 2,
/// ...`: at every step each rank sends to one peer and receives from one other, instead of
/// every rank sending its first block to rank 0 at once ([Thakur-2005]'s pairwise exchange).
/// Step 0 is the rank's own block, a local copy.
///
/// Errors: a request that does not validate or is not all_to_all_v.
///
/// Complexity: O(n^2) ops and time for n ranks.
pub fn pairwise_all_to_all_v(req: &Request) -> Result<Plan> {
    req.validate()?;
    if req.collective != Collective::AllToAllV {
        return Err(RouteError::BadRequest(format!(
            "the pairwise exchange plans all_to_all_v, not {}",
            req.collective
        )));
    }
    let n = req.nranks();
    let m = &req.matrix;
    // Offsets of block (s, d) in s's input and in d's output.
    let send_off = |s: usize, d: usize| -> u64 { m[s][..d].iter().sum() };
    let recv_off = |s: usize, d: usize| -> u64 { (0..s).map(|q| m[q][d]).sum() };
    let mut w = PlanWriter::new(Plan::new(req.clone(), "rank-space pairwise"), None);
    for k in 0..n {
        for (s, row) in m.iter().enumerate() {
            let d = (s + k) % n;
            let len = row[d];
            if len == 0 {
                continue;
            }
            let (s32, d32) = (s as u32, d as u32);
            let src = Region::new(BufferRef::Input(s32), send_off(s, d), len);
            let dst = Region::new(BufferRef::Output(d32), recv_off(s, d), len);
            let lane = w
                .plan
                .add_lane(Location::Gpu(s32), format!("rank{s} to {d}"));
            w.copy(lane, src, dst, Vec::new(), &[])?;
        }
    }
    Ok(w.plan)
}

/// Slice `o` of `n` of `len` elements: `[lo, hi)`, sizes differing by at most one.
fn slice(len: u64, n: u32, o: u32) -> (u64, u64) {
    let n = u64::from(n.max(1));
    let at = |k: u64| len / n * k + (len % n).min(k);
    (at(u64::from(o)), at(u64::from(o) + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::{OpKind, ReduceOp};

    /// Every collective's direct plan passes the checker, for several rank counts, counts
    /// that do not divide evenly, and every reduce op.
    #[test]
    fn direct_plans_pass_the_checker() {
        for n in [1u32, 2, 3, 4, 8] {
            for c in Collective::ALL {
                if is_exchange(c) {
                    continue;
                }
                for count in [0u64, 1, 5, 37] {
                    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                        let mut req = Request::new(c, (0..n).collect(), count, DType::F32)
                            .with_op(op)
                            .with_root(n - 1);
                        if c == Collective::ReduceScatterV {
                            req.counts = (0..u64::from(n)).map(|r| (count + r) % 6).collect();
                        }
                        let plan = direct_plan(&req, crate::staging::DEFAULT_STAGING_BUDGET_BYTES)
                            .expect("plans");
                        relaycc_plan::check(&plan)
                            .unwrap_or_else(|e| panic!("{c} n={n} count={count} {op:?}: {e}"));
                        // Rounds of a few elements reuse two slot sets and still check; each
                        // process stages two rounds: n - 1 parts and a result per reduction.
                        for chunk in [1u64, 3, 8] {
                            let r = direct_in_rounds(&req, chunk).expect("plans");
                            relaycc_plan::check(&r).unwrap_or_else(|e| {
                                panic!("{c} n={n} count={count} {op:?} chunk={chunk}: {e}")
                            });
                            let most = 2 * u64::from(n) * chunk * 4 * u64::from(n);
                            for (at, b) in r.staging_per_location() {
                                assert!(b <= most, "{c} n={n} chunk={chunk}: {at} {b}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// One process's reductions are one local copy each, with no scratch, as MPI's own
    /// one-process all_reduce is a memcpy.
    #[test]
    fn one_rank_reductions_are_one_copy() {
        for c in Collective::ALL.into_iter().filter(|c| c.reduces()) {
            let mut req = Request::new(c, vec![0], 1 << 20, DType::F32).with_op(ReduceOp::Avg);
            req.counts = vec![1 << 20];
            let plan =
                direct_plan(&req, crate::staging::DEFAULT_STAGING_BUDGET_BYTES).expect("plans");
            relaycc_plan::check(&plan).unwrap_or_else(|e| panic!("{c}: {e}"));
            assert!(plan.scratch.is_empty(), "{c}");
            assert_eq!(plan.ops.len(), 1, "{c}");
            assert!(matches!(plan.ops[0].kind, OpKind::Copy { .. }), "{c}");
        }
    }

    /// The pairwise all_to_all_v plan passes the checker for uneven matrices with empty
    /// blocks, and at step `k` rank `s` sends to `(s + k) mod n`.
    #[test]
    fn pairwise_all_to_all_v_checks_and_steps_through_peers() {
        for n in [1u32, 2, 3, 5, 8] {
            let mut req = Request::new(Collective::AllToAllV, (0..n).collect(), 0, DType::F32);
            req.matrix = (0..u64::from(n))
                .map(|s| (0..u64::from(n)).map(|d| (s * 7 + d * 3) % 5).collect())
                .collect();
            let plan = pairwise_all_to_all_v(&req).expect("plans");
            relaycc_plan::check(&plan).unwrap_or_else(|e| panic!("n={n}: {e}"));
            let mut last_step = vec![0u32; n as usize];
            for op in &plan.ops {
                let OpKind::Copy { src, dst } = &op.kind else {
                    panic!("n={n}: a pairwise plan only copies");
                };
                let (BufferRef::Input(s), BufferRef::Output(d)) = (src.buffer, dst.buffer) else {
                    panic!("n={n}: copies go from inputs to outputs");
                };
                let step = (d + n - s) % n;
                assert!(step >= last_step[s as usize], "n={n}: rank {s} steps back");
                last_step[s as usize] = step;
            }
        }
        let req = Request::new(Collective::AllGatherV, vec![0, 1], 0, DType::F32);
        assert!(pairwise_all_to_all_v(&req).is_err());
    }

    /// Exchange collectives planned in bytes pass the checker with virtual nodes.
    #[test]
    fn exchange_plans_pass_the_checker() {
        let n = 4u32;
        let mut req = Request::new(Collective::AllToAllV, (0..n).collect(), 0, DType::F64);
        req.matrix = (0..n as u64)
            .map(|s| (0..n as u64).map(|d| (s + 2 * d) % 3).collect())
            .collect();
        let space = RankSpace {
            node_of: &[0, 0, 1, 1],
            device_aware: false,
            split_cap_bytes: 64,
            staging_budget: crate::staging::DEFAULT_STAGING_BUDGET_BYTES,
        };
        for s in [Strategy::Standard, Strategy::ThreeStep, Strategy::TwoStep] {
            let plan = plan(&req, &space, Some(s)).expect("plans");
            relaycc_plan::check(&plan).expect("checks");
        }
        // The model's pick plans too, having weighed every strategy processes can run.
        relaycc_plan::check(&plan(&req, &space, None).expect("plans")).expect("checks");
        let weighed = modelled_strategies(&byte_request(&req), &space).expect("models");
        assert_eq!(weighed.len(), PROCESS_STRATEGIES.len());
        // Split+DD shares device pointers, which processes cannot.
        assert!(plan(&req, &space, Some(Strategy::SplitDd)).is_err());
    }
}
