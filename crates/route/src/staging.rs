//! Staging budgets: how much staging memory a plan may allocate on each device, and how a
//! candidate is fitted to it by shrinking its pipelining chunk (every planner's staging is a
//! fixed number of chunk-sized slots per device, so staging falls with the chunk).

use crate::error::{Result, RouteError};
use std::collections::BTreeMap;

use crate::plan::{BufferRef, Location, Plan};
use crate::request::Request;

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

/// The error for `plan` needing `needed` bytes on `at` against `budget`.
pub fn budget_error(plan: &Plan, at: Location, needed: u64, budget: u64) -> RouteError {
    RouteError::StagingBudget {
        algorithm: plan.algorithm.clone(),
        device: at.to_string(),
        needed_bytes: needed,
        budget_bytes: budget,
    }
}

/// The smallest pipelining chunk (elements) a candidate for `req` is shrunk to:
/// [`MIN_SLOT_BYTES`], or a block cut into [`MAX_CHUNKS_PER_BLOCK`] when that is larger.
pub fn min_chunk_elems(req: &Request) -> u64 {
    let esize = req.dtype.size().max(1);
    let block = req.size_bytes() / (req.nranks().max(1) as u64);
    (MIN_SLOT_BYTES.max(block / MAX_CHUNKS_PER_BLOCK) / esize).max(1)
}

/// Build a plan with `build(chunk)` from `chunk` elements down, shrinking the chunk in
/// proportion to the worst device's excess until every device's staging is within `budget`,
/// never below `min_chunk` nor below the chunk that would give [`MAX_FITTED_OPS`] ops.
///
/// # Errors
/// [`RouteError::StagingBudget`] naming the device and its bytes when even `min_chunk` does
/// not fit; any error of `build`.
///
/// Complexity: a few builds (each shrink at least halves the excess or reaches `min_chunk`).
pub fn fit(
    chunk: u64,
    min_chunk: u64,
    budget: u64,
    build: impl Fn(u64) -> Result<Plan>,
) -> Result<Plan> {
    let mut min_chunk = min_chunk.max(1);
    let mut c = chunk.max(1);
    let mut first = true;
    loop {
        let plan = build(c)?;
        if first {
            // Ops grow as the chunk shrinks: no smaller chunk than gives MAX_FITTED_OPS.
            let ops = plan.ops.len() as u128;
            let by_ops = (c as u128 * ops).div_ceil(MAX_FITTED_OPS as u128);
            min_chunk = min_chunk.max(u64::try_from(by_ops).unwrap_or(u64::MAX));
            first = false;
        }
        let Some((at, needed)) = over_budget(&plan, budget) else {
            return Ok(plan);
        };
        if c <= min_chunk {
            return Err(budget_error(&plan, at, needed, budget));
        }
        // Staging is a fixed number of chunk-sized slots: scale the chunk by the excess.
        let scaled = (c as u128 * budget as u128 / needed.max(1) as u128) as u64;
        c = scaled.min(c - 1).max(min_chunk);
    }
}

/// Bytes with a binary unit for messages: `402653184 bytes (384 MiB)`.
pub fn describe_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ];
    let (u, d) = UNITS
        .iter()
        .copied()
        .find(|(_, d)| b >= *d)
        .unwrap_or(("B", 1));
    if d == 1 {
        format!("{b} bytes")
    } else {
        format!("{b} bytes ({:.1} {u})", b as f64 / d as f64)
    }
}

/// Staging slots shared by the rounds of a plan that moves its message one chunk per round:
/// the buffers of round `k` are those of round `k - 2` (two slot sets, so one round's transfers
/// overlap the next's), and every op of round `k` that waits on nothing else waits on the last
/// ops of round `k - 2`, so a slot is rewritten only after its previous occupant was consumed
/// (the checker proves each reuse). Staging is then two rounds' worth, whatever the message.
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
}

impl Slots {
    /// Start round `k` of `plan`: the slot set of parity `k % 2`, none handed out yet.
    pub fn begin(&mut self, plan: &Plan, k: u64) {
        self.parity = (k % 2) as u32;
        self.used.clear();
        self.round_start = plan.ops.len() as u32;
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

    /// End the round: every op of it that waits on nothing waits on the last ops of the round
    /// two before (the previous occupants' readers of this round's slots), so every op of
    /// this round follows every op of that one.
    pub fn end(&mut self, plan: &mut Plan) {
        let start = self.round_start as usize;
        let p = self.parity as usize;
        let gate = std::mem::take(&mut self.gates[p]);
        let end = plan.ops.len();
        let mut has_dependent = vec![false; end - start];
        for op in &mut plan.ops[start..end] {
            if op.deps.is_empty() {
                op.deps.clone_from(&gate);
            }
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
