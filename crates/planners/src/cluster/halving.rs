//! A rail's all_reduce by distance halving: a reduce-scatter in ceil(log2 N) steps, then the
//! all-gather that retraces them, instead of a ring's 2 (N-1) dependent steps.
//!
//! Positions are a rail's nodes in ring order. With `m_0 = N` and distances `d_i` the powers of
//! two below N, largest first (`m_{i+1} = d_i`), position p holds after step i the partials of
//! the sub-blocks at offsets `[0, m_{i+1})` from its own: at step i it sends offsets
//! `[d_i, m_i)` to position `p + d_i`, where they land at offsets `[0, m_i - d_i)` and are added
//! in. After the last step (`d = 1`) p holds its own sub-block complete. The all-gather runs the
//! steps backwards: at step i position p returns offsets `[0, m_i - d_i)` to `p - d_i`.
//! Every position sends N-1 sub-blocks each way, as in a ring, so the bytes on each NIC are the
//! ring's; the dependent steps fall from 2 (N-1) to 2 ceil(log2 N), and within a step the
//! sub-blocks are independent, so their start costs overlap across the step's lanes.
//!
//! Every pattern is a shift of positions (p talks to p + d), so the plan is the same on every
//! node and a template of one domain of hosts folds it; each sub-block is its own op, because a
//! range of sub-blocks wraps around the rail's vector on some nodes and not on others.
//!
//! Source: the dissemination pattern of Bruck et al.'s concatenation ([Bruck-1997]), run as a
//! reduce-scatter and reversed as an all-gather, as [Thakur-2005]'s recursive halving does with
//! partners at distances 2^k.

use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Region};

use super::super::builder::PlanBuilder;
use super::super::chunks;
use super::super::ring::BlockRegionFn;

/// Distances of a halving reduce-scatter over `n` positions, in step order: the powers of two
/// below `n`, largest first.
pub(super) fn distances(n: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut d = n.next_power_of_two() / 2;
    while d >= 1 {
        v.push(d);
        d /= 2;
    }
    v
}

/// Most receive slots per position and step: the chunks that may be in flight into one rank
/// over one distance before the first is added in (each reuse waits for the reduction of the
/// slot's previous chunk).
pub(super) const HALVING_SLOTS: u64 = 4;

/// The lanes of one halving all_reduce: sub-block at offset `t` of a step goes on lane channel
/// `base + t % queues`, so a step's independent sub-blocks start on several lanes at once.
#[derive(Debug, Clone, Copy)]
pub(super) struct HalvingLanes {
    /// First lane channel.
    pub base: u32,
    /// Lane channels used.
    pub queues: u32,
}

impl HalvingLanes {
    fn of(&self, t: usize) -> u32 {
        self.base + (t as u32) % self.queues.max(1)
    }
}

/// The receive slots of a halving reduce-scatter on the positions of a rail: per step, up to
/// [`HALVING_SLOTS`] slots of `most` elements per position. Each step's slots receive from one
/// sender only (the position `d` before), so a slot's reuse waits on that sender's own earlier
/// copy and the receiver's reduction, the same on every node.
pub(super) struct HalvingSlots {
    bufs: Vec<BufferRef>,
    most: u64,
    /// Per step: (first slot, slots).
    steps: Vec<(u64, u64)>,
}

impl HalvingSlots {
    /// HalvingSlots of `most` elements on every rank of `ord` for sub-blocks cut in `per_sub` chunks.
    pub(super) fn new(b: &mut PlanBuilder, ord: &[u32], most: u64, per_sub: u64) -> HalvingSlots {
        let n = ord.len();
        let ds = distances(n);
        let mut steps = Vec::with_capacity(ds.len());
        let mut at = 0;
        for (i, &d) in ds.iter().enumerate() {
            let m = if i == 0 { n } else { ds[i - 1] };
            let k = ((m - d) as u64)
                .saturating_mul(per_sub.max(1))
                .min(HALVING_SLOTS);
            steps.push((at, k));
            at += k;
        }
        let bufs = if most == 0 || n < 2 {
            Vec::new()
        } else {
            ord.iter().map(|&r| b.scratch(r, at * most)).collect()
        };
        HalvingSlots { bufs, most, steps }
    }
    fn region(&self, p: usize, step: usize, k: u64, l: u64) -> Region {
        let (first, slots) = self.steps[step];
        Region::new(self.bufs[p], (first + k % slots.max(1)) * self.most, l)
    }
}

/// All_reduce of the sub-blocks `lens` (sub-block q belongs to position q) over the positions
/// `ord`: the halving reduce-scatter (module docs) accumulating in `acc`, then its all-gather
/// into `acc`.
///
/// - `inp(p, q, rel, l)`: position p's contribution to sub-block q;
/// - `acc(p, q, rel, l)`: where position p accumulates sub-block q and where it ends complete;
/// - `acc_holds_input`: `acc` already holds p's contribution (the node partials of a
///   hierarchical plan), so `inp` is never read;
/// - copies and reductions are cut in `chunk`s, each received into one of `slots`.
#[allow(clippy::too_many_arguments)]
pub(super) fn all_reduce(
    b: &mut PlanBuilder,
    ord: &[u32],
    lanes: HalvingLanes,
    lens: &[u64],
    chunk: u64,
    slots: &HalvingSlots,
    inp: BlockRegionFn,
    acc: BlockRegionFn,
    acc_holds_input: bool,
) -> Result<()> {
    reduce_scatter(
        b,
        ord,
        lanes,
        lens,
        chunk,
        slots,
        inp,
        acc,
        acc,
        acc_holds_input,
    )?;
    all_gather(b, ord, lanes, lens, chunk, None, acc)
}

/// The halving reduce-scatter: position p accumulates sub-block q in `acc` (which holds p's
/// contribution already when `acc_holds_input`, else `inp` is read) and writes its own
/// sub-block complete, finalized, to `fin`. Arguments as [`all_reduce`].
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_scatter(
    b: &mut PlanBuilder,
    ord: &[u32],
    lanes: HalvingLanes,
    lens: &[u64],
    chunk: u64,
    slots: &HalvingSlots,
    inp: BlockRegionFn,
    acc: BlockRegionFn,
    fin: BlockRegionFn,
    acc_holds_input: bool,
) -> Result<()> {
    let n = ord.len();
    if n < 2 || lens.iter().all(|l| *l == 0) {
        return Ok(());
    }
    let chunk = chunk.max(1);
    let ds = distances(n);
    // Whether position p's `acc` holds its partial at offset t: the same for every p.
    let mut held = vec![acc_holds_input; n];
    let mut received = vec![0u64; n];
    if slots.bufs.len() != n || lens.iter().any(|&l| l.min(chunk) > slots.most) {
        return Err(relaycc_plan::RouteError::BadRequest(format!(
            "halving slots of {} elements on {} positions for chunks of {chunk}",
            slots.most,
            slots.bufs.len()
        )));
    }
    for (i, &d) in ds.iter().enumerate() {
        let m = if i == 0 { n } else { ds[i - 1] };
        let last = i + 1 == ds.len();
        received.fill(0);
        // Highest offsets first: they land where the next steps send from soonest.
        for t in (d..m).rev() {
            let ch = lanes.of(t);
            let to = t - d;
            for p in 0..n {
                let q = (p + t) % n;
                let pd = (p + d) % n;
                let emit = b.may_touch(&[ord[p], ord[pd]]);
                for (rel, l) in chunks(lens[q], chunk) {
                    let k = received[pd];
                    received[pd] += 1;
                    if !emit {
                        continue;
                    }
                    let src = if held[t] {
                        acc(p, q, rel, l)
                    } else {
                        inp(p, q, rel, l)
                    };
                    let rv = slots.region(pd, i, k, l);
                    b.send(src, rv, ch)?;
                    let own = if held[to] {
                        acc(pd, q, rel, l)
                    } else {
                        inp(pd, q, rel, l)
                    };
                    let done = last && to == 0;
                    let dst = if done {
                        fin(pd, q, rel, l)
                    } else {
                        acc(pd, q, rel, l)
                    };
                    b.reduce(vec![own, rv], dst, done, ch)?;
                }
            }
            held[to] = true;
        }
    }
    Ok(())
}

/// The halving all-gather: the reduce-scatter's steps backwards, position p starting with its
/// own sub-block in `out` (or sending it from `first`) and ending with every sub-block in
/// `out`; copies cut in `chunk`s. Arguments as [`all_reduce`].
pub(super) fn all_gather(
    b: &mut PlanBuilder,
    ord: &[u32],
    lanes: HalvingLanes,
    lens: &[u64],
    chunk: u64,
    first: Option<BlockRegionFn>,
    out: BlockRegionFn,
) -> Result<()> {
    let n = ord.len();
    if n < 2 {
        return Ok(());
    }
    let ds = distances(n);
    b.set_chunk_elems(chunk.max(1));
    for (i, &d) in ds.iter().enumerate().rev() {
        let m = if i == 0 { n } else { ds[i - 1] };
        for t in 0..m - d {
            let ch = lanes.of(t);
            for p in 0..n {
                let pd = (p + n - d) % n;
                if !b.may_touch(&[ord[p], ord[pd]]) {
                    continue;
                }
                let q = (p + t) % n;
                let l = lens[q];
                let src = match first {
                    Some(f) if t == 0 => f(p, q, 0, l),
                    _ => out(p, q, 0, l),
                };
                b.send(src, out(pd, q, 0, l), ch)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_are_the_powers_of_two_below_n_largest_first() {
        assert_eq!(distances(2), vec![1]);
        assert_eq!(distances(3), vec![2, 1]);
        assert_eq!(distances(8), vec![4, 2, 1]);
        assert_eq!(distances(9), vec![8, 4, 2, 1]);
        assert_eq!(distances(128).len(), 7);
    }
}
