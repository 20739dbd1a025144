//! Staging budgets: how much staging memory a plan may allocate on each device, and how a
//! candidate is fitted to it by shrinking its pipelining chunk (every planner's staging is a
//! fixed number of chunk-sized slots per device plus buffers of a fixed size, so staging is
//! affine in the chunk).

use relaycc_plan::{Result, RouteError};
use std::collections::BTreeMap;

use relaycc_plan::Request;
use relaycc_plan::{BufferRef, Location, Plan};

/// NCCL's default buffer per connection and protocol Simple, bytes (`NCCL_BUFFSIZE`, 4 MiB,
/// [NCCL-env]); NCCL splits it into `NCCL_STEPS` = 8 slots of 512 KiB ([NCCL-src]).
pub const NCCL_BUFFSIZE_BYTES: u64 = 4 << 20;

/// NCCL's most channels (`MAXCHANNELS`, 32 in NCCL 2.x `src/include/device.h`, [NCCL-src]).
pub const NCCL_MAX_CHANNELS: u64 = 32;

/// Default staging budget per device, bytes: NCCL's Simple buffers ([`NCCL_BUFFSIZE_BYTES`],
/// [NCCL-env]) for its most channels ([`NCCL_MAX_CHANNELS`]) with two receiving connections
/// each (a ring's and a tree's): 32 x 2 x 4 MiB = 256 MiB. Fixed, like NCCL's buffers: it does
/// not grow with the message.
pub const DEFAULT_STAGING_BUDGET_BYTES: u64 = NCCL_MAX_CHANNELS * 2 * NCCL_BUFFSIZE_BYTES;

/// A budget that bounds nothing (what-if planning; plans as large as the message asks).
pub const UNBOUNDED_STAGING: u64 = u64::MAX;

/// Smallest slot a candidate is shrunk to, bytes: below it a copy is mostly its start cost.
pub const MIN_SLOT_BYTES: u64 = 64 << 10;

/// Most pipelining chunks one rank's block is cut into when a candidate is shrunk to fit: keeps
/// a plan's op count, and so planning time, bounded for any message.
pub const MAX_CHUNKS_PER_BLOCK: u64 = 256;

/// Most ops a candidate is shrunk to: a chunk that would give more is below the candidate's
/// smallest (a plan of this size plans and simulates in a few seconds).
pub const MAX_FITTED_OPS: u64 = 65_536;

/// The device whose staging is furthest over `budget` (by bytes over), with its bytes; `None`
/// when every device fits.
pub fn over_budget(plan: &Plan, budget: u64) -> Option<(Location, u64)> {
    plan.staging_per_location()
        .into_iter()
        .filter(|(_, b)| *b > budget)
        .max_by_key(|(_, b)| *b)
}

/// The error for `plan` needing `needed` bytes on `at` against `budget` at its smallest chunk
/// (the budget's floor).
pub fn budget_error(plan: &Plan, at: Location, needed: u64, budget: u64) -> RouteError {
    RouteError::StagingBudget {
        algorithm: plan.algorithm.clone(),
        device: at.to_string(),
        needed_bytes: needed,
        budget_bytes: budget,
        ops_needed: None,
        op_cap: MAX_FITTED_OPS,
    }
}

/// The smallest pipelining chunk (elements) a candidate for `req` is shrunk to:
/// [`MIN_SLOT_BYTES`], or a block cut into [`MAX_CHUNKS_PER_BLOCK`] when that is larger.
pub fn min_chunk_elems(req: &Request) -> u64 {
    let esize = req.dtype.size().max(1);
    let block = req.size_bytes() / (req.nranks().max(1) as u64);
    (MIN_SLOT_BYTES.max(block / MAX_CHUNKS_PER_BLOCK) / esize).max(1)
}

/// Most builds [`fit`] makes for one candidate: the first, the one that measures how staging
/// grows with the chunk, the solved chunk, and a few shrinks where rounding leaves a device
/// just above the budget (the last always at the smallest chunk).
pub const MAX_FIT_BUILDS: u32 = 6;

/// What two builds say about the chunk that fits (see [`solve_affine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Solved {
    /// The largest chunk at which every device fits.
    Fits(u64),
    /// A device's fixed part alone is over the budget: only the smallest chunk is worth a try.
    Never,
    /// Staging did not fall with the chunk on a device over the budget: shrink in proportion.
    Unknown,
}

/// Per device, staging as an affine function of the chunk, `fixed + growth x chunk` bytes,
/// from builds at chunks `c0` and `c1`: the largest chunk at which every device fits `budget`.
fn solve_affine(
    c0: u64,
    s0: &BTreeMap<Location, u64>,
    c1: u64,
    s1: &BTreeMap<Location, u64>,
    budget: u64,
) -> Solved {
    let mut best = u64::MAX;
    let dc = c0 as f64 - c1 as f64;
    let cap = budget as f64;
    for (loc, &b1) in s1 {
        let b0 = s0.get(loc).copied().unwrap_or(0) as f64;
        let b1 = b1 as f64;
        let growth = if dc != 0.0 { (b0 - b1) / dc } else { 0.0 };
        if growth <= 0.0 {
            if b1 > cap {
                return Solved::Unknown;
            }
            continue;
        }
        let fixed = b1 - growth * c1 as f64;
        if fixed > cap {
            return Solved::Never;
        }
        best = best.min(((cap - fixed) / growth).floor().max(0.0) as u64);
    }
    Solved::Fits(best)
}

/// Build a plan with `build(chunk)` (a [`Plan`], or anything that holds one and borrows as it)
/// from `chunk` elements down until every device's staging is within `budget`, never below
/// `min_chunk` nor below the chunk that would give
/// [`MAX_FITTED_OPS`] ops.
///
/// Every planner's staging is affine in the chunk (slots of a chunk each, plus buffers of a
/// fixed size), so two builds give each device's fixed part and growth, and the third is at
/// the largest chunk that fits; rounding may cost a few more shrinks, at most
/// [`MAX_FIT_BUILDS`] builds in all. The builds thrown away give their ops back to `limit`,
/// the limit `build` charges them to ([`crate::Limit`]).
///
/// # Errors
/// [`RouteError::StagingBudget`] naming the device and its bytes at the smallest chunk when no
/// chunk fits, with `ops_needed` set when the op cap, not the budget's floor, stopped the
/// shrinking; any error of `build`.
pub fn fit<P: std::borrow::Borrow<Plan>>(
    chunk: u64,
    min_chunk: u64,
    budget: u64,
    limit: Option<&crate::limits::Limit>,
    build: impl Fn(u64) -> Result<P>,
) -> Result<P> {
    let min_chunk = min_chunk.max(1);
    let c0 = chunk.max(1);
    let built = build(c0)?;
    let first: &Plan = built.borrow();
    let Some((at, needed)) = over_budget(first, budget) else {
        return Ok(built);
    };
    // Ops grow as the chunk shrinks: no smaller chunk than gives MAX_FITTED_OPS.
    let ops0 = first.ops.len() as u128;
    let by_ops =
        u64::try_from((c0 as u128 * ops0).div_ceil(u128::from(MAX_FITTED_OPS))).unwrap_or(u64::MAX);
    let floor = min_chunk.max(by_ops);
    let s0 = first.staging_per_location();
    // The op cap set the floor and a smaller chunk `fits` would fit: say so, with its ops.
    let stop = |plan: &Plan, at: Location, needed: u64, fits: Option<u64>| {
        let mut e = budget_error(plan, at, needed, budget);
        if let (true, Some(c), RouteError::StagingBudget { ops_needed, .. }) =
            (by_ops > min_chunk, fits, &mut e)
            && c >= min_chunk
        {
            *ops_needed =
                Some(u64::try_from(ops0 * c0 as u128 / u128::from(c.max(1))).unwrap_or(u64::MAX));
        }
        e
    };
    // Without a second build, staging is taken as proportional to the chunk.
    let proportional = |needed: u64| (c0 as u128 * budget as u128 / needed.max(1) as u128) as u64;
    // A build thrown away gives its ops back to the planning call ([`crate::Limit`]).
    let discard = |plan: &Plan| crate::limits::refund(limit, plan.ops.len() as u64);
    if c0 <= floor {
        let e = stop(first, at, needed, Some(proportional(needed)));
        discard(first);
        return Err(e);
    }
    let mut c = proportional(needed).clamp(floor, c0 - 1);
    discard(first);
    drop(built);
    let mut solved: Option<u64> = None;
    let mut builds = 1;
    loop {
        let built = build(c)?;
        builds += 1;
        let plan: &Plan = built.borrow();
        let Some((at, needed)) = over_budget(plan, budget) else {
            return Ok(built);
        };
        let shrunk = (c as u128 * budget as u128 / needed.max(1) as u128) as u64;
        let next = if builds == 2 {
            match solve_affine(c0, &s0, c, &plan.staging_per_location(), budget) {
                Solved::Fits(s) => {
                    solved = Some(s);
                    s
                }
                Solved::Never => floor,
                Solved::Unknown => shrunk,
            }
        } else {
            shrunk
        };
        if c <= floor {
            let e = stop(plan, at, needed, solved);
            discard(plan);
            return Err(e);
        }
        discard(plan);
        // The last build allowed is at the floor, so an error always reports the smallest
        // chunk's staging.
        c = if builds + 1 >= MAX_FIT_BUILDS {
            floor
        } else {
            next.min(c - 1).max(floor)
        };
    }
}

/// Staging slots shared by the rounds of a plan that moves its message one chunk per round:
/// the buffers of round `k` are those of round `k - 2` (two slot sets, so one round's transfers
/// overlap the next's), and every op of round `k` that the planner orders after nothing else
/// waits on the last ops of round `k - 2` ([`Slots::gated`]), so a slot is rewritten only after
/// its previous occupant was consumed and a round runs at most two ahead (the checker proves
/// each reuse). Staging is then two rounds' worth, whatever the message.
#[derive(Debug, Default)]
pub struct Slots {
    /// Buffers by (round parity, location), in allocation order within a round.
    pool: BTreeMap<(u32, Location), Vec<BufferRef>>,
    /// Buffers handed out this round, by location.
    used: BTreeMap<Location, usize>,
    /// Parity of the current round.
    parity: u32,
    /// First op of the current round.
    round_start: u32,
    /// Ops that end each parity's last round (nothing of that round depends on them).
    gates: [Vec<u32>; 2],
    /// The ops that end round `k - 2`, which this round's first ops wait on.
    gate: Vec<u32>,
}

impl Slots {
    /// Start round `k` of `plan`: the slot set of parity `k % 2`, none handed out yet.
    pub fn begin(&mut self, plan: &Plan, k: u64) {
        self.parity = (k % 2) as u32;
        self.used.clear();
        self.round_start = plan.ops.len() as u32;
        self.gate = std::mem::take(&mut self.gates[self.parity as usize]);
    }

    /// What an op of this round that the planner orders after `deps` waits on besides its
    /// data: `deps`, or where it names none, the ops that end round `k - 2`.
    pub fn gated(&self, deps: &[u32]) -> Vec<u32> {
        if deps.is_empty() {
            self.gate.clone()
        } else {
            deps.to_vec()
        }
    }

    /// A staging slot of at least `len` elements in `loc` for this round: the next unused
    /// buffer of this round's slot set there (grown to `len`), or a new one.
    pub fn slot(&mut self, plan: &mut Plan, loc: Location, len: u64) -> BufferRef {
        let idx = self.used.entry(loc).or_default();
        let i = *idx;
        *idx += 1;
        let set = self.pool.entry((self.parity, loc)).or_default();
        let buf = match set.get(i) {
            Some(b) => *b,
            None => {
                let b = plan.add_scratch(loc, 0);
                set.push(b);
                b
            }
        };
        grow(plan, buf, len);
        buf
    }

    /// End the round: its ops that no op of it depends on become the gate of round `k + 2`,
    /// so that, with every op the planner ordered after nothing waiting on it
    /// ([`Slots::gated`]), every op of that round follows every op of this one.
    pub fn end(&mut self, plan: &Plan) {
        let start = self.round_start as usize;
        let p = self.parity as usize;
        let end = plan.ops.len();
        let mut has_dependent = vec![false; end - start];
        for op in &plan.ops[start..end] {
            for &d in &op.deps {
                if let Some(i) = (d as usize).checked_sub(start) {
                    has_dependent[i] = true;
                }
            }
        }
        self.gates[p] = (start..end)
            .filter(|&i| !has_dependent[i - start])
            .map(|i| i as u32)
            .collect();
    }
}

/// Grow staging buffer `buf` of `plan` to at least `len` elements.
pub fn grow(plan: &mut Plan, buf: BufferRef, len: u64) {
    if let BufferRef::Scratch(i) = buf
        && let Some(s) = plan.scratch.get_mut(i as usize)
    {
        s.len = s.len.max(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A plan of `ceil(total / chunk)` copies with `fixed + slots x chunk` staging elements
    /// (bytes: a point-to-point request moves u8) on GPU0: the shape every planner's plans
    /// have.
    fn shaped(chunk: u64, fixed: u64, slots: u64, total: u64) -> Plan {
        let req = Request::point_to_point(0, 1, total * 4);
        let mut p = Plan::new(req, "shaped");
        p.add_scratch(Location::Gpu(0), fixed + slots * chunk);
        let lane = p.add_lane(Location::Gpu(0), "l");
        let one = |b| relaycc_plan::Region::new(b, 0, 1);
        for _ in 0..total.div_ceil(chunk) {
            p.copy(
                lane,
                one(BufferRef::Input(0)),
                one(BufferRef::Output(1)),
                vec![],
                vec![],
            );
        }
        p
    }

    #[test]
    fn fit_names_the_op_cap_when_it_stops_the_shrinking() {
        let total = 1u64 << 30;
        let budget = 1000 * 2;
        // Two slots of 1000 elements fit, but 2^30 / 1000 copies are over the op cap.
        let e = fit(1 << 20, 1, budget, None, |c| Ok(shaped(c, 0, 2, total))).unwrap_err();
        let RouteError::StagingBudget {
            ops_needed,
            needed_bytes,
            ..
        } = &e
        else {
            panic!("{e}");
        };
        let ops = ops_needed.unwrap_or_else(|| panic!("no op count: {e}"));
        let fitting = total.div_ceil(1000);
        assert!(
            ops >= fitting * 99 / 100 && ops <= fitting * 101 / 100,
            "{ops}"
        );
        // The plan it reports is at the op cap's chunk: 2^30 / 65536 elements per slot.
        assert_eq!(*needed_bytes, 2 * (total / MAX_FITTED_OPS));
        let m = e.to_string();
        assert!(
            m.contains("op cap") && m.contains(&MAX_FITTED_OPS.to_string()),
            "{m}"
        );
        // With a larger budget the op cap is not reached and the plan fits.
        let budget = 2 * (total / MAX_FITTED_OPS);
        let p = fit(1 << 20, 1, budget, None, |c| Ok(shaped(c, 0, 2, total))).unwrap();
        assert!(p.ops.len() as u64 <= MAX_FITTED_OPS);
    }

    #[test]
    fn fit_names_the_budget_when_a_fixed_part_is_over_it() {
        let e = fit(1 << 16, 1, 4 << 10, None, |c| {
            Ok(shaped(c, 8 << 10, 2, 1 << 20))
        })
        .unwrap_err();
        let RouteError::StagingBudget {
            ops_needed,
            device,
            budget_bytes,
            ..
        } = &e
        else {
            panic!("{e}");
        };
        assert_eq!(
            (*ops_needed, device.as_str(), *budget_bytes),
            (None, "GPU0", 4 << 10)
        );
        assert!(!e.to_string().contains("op cap"), "{e}");
        // The budget's floor: the smallest chunk does not fit either.
        let e = fit(1 << 16, 1 << 12, 4 << 10, None, |c| {
            Ok(shaped(c, 0, 2, 1 << 20))
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                RouteError::StagingBudget {
                    ops_needed: None,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn fit_solves_an_affine_staging_in_three_builds() {
        let builds = Cell::new(0u32);
        let (fixed, slots) = (3 << 20, 8);
        let budget = 256u64 << 20;
        let p = fit(64 << 20, 1, budget, None, |c| {
            builds.set(builds.get() + 1);
            Ok(shaped(c, fixed, slots, 1 << 30))
        })
        .unwrap();
        // The largest chunk whose fixed part and slots fit, found by the third build.
        let best = (budget - fixed) / slots;
        let got = p.scratch[0].len;
        assert_eq!(got, fixed + slots * best, "{got}");
        assert_eq!(builds.get(), 3);
        // Staging that is not affine (a step) still ends within MAX_FIT_BUILDS builds.
        builds.set(0);
        let step = |c: u64| if c > 1000 { 1 << 26 } else { 10 };
        let p = fit(1 << 20, 1, 4 << 20, None, |c| {
            builds.set(builds.get() + 1);
            Ok(shaped(c, step(c), 0, 1 << 20))
        });
        assert!(builds.get() <= MAX_FIT_BUILDS, "{}", builds.get());
        assert!(p.is_ok());
    }
}
