//! Max-min fair sharing of resources among fluid flows (progressive filling), recomputed
//! incrementally: only the connected components (flows linked by shared resources) that a
//! change touched are refilled, because max-min fair rates of one component do not depend on
//! any other.
//!
//! A flow `f` loads resource `r` with `c(f, r)` bytes per byte it moves (1 for an edge, 2 for a
//! copy inside one memory, `srcs + 1` for a reduction). Rates `x(f)` are max-min fair under
//! `sum_f c(f, r) x(f) <= cap(r)`: every flow is raised at the same pace until some resource
//! fills; the flows crossing it freeze at that level; the rest go on.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Buffers and per-resource flow lists for repeated max-min fair solves. Nothing here
/// allocates once the vectors have grown to the plan's peak concurrency.
///
/// Active flows live in *slots*: each slot holds its flow's resources and coefficients side
/// by side in a dense table, reused as flows end. A solve walks the flows of a component,
/// whose rows in the model's table of every op lie far apart; read from the slots they stay
/// in cache (on a 512-GPU rail fabric the walk's loads were most of the simulation's time).
#[derive(Debug)]
pub(super) struct FairShare {
    /// The active flows (slots) crossing each resource.
    res_flows: Vec<Vec<u32>>,
    /// Each slot's flow, the number of its resources, and its resources and coefficients at
    /// `slot * width`.
    slot_op: Vec<u32>,
    slot_len: Vec<u32>,
    slot_res: Vec<u32>,
    slot_coef: Vec<f64>,
    /// Room per slot: the most resources any flow so far had.
    width: usize,
    /// Slots whose flow ended, to reuse.
    free: Vec<u32>,
    /// Each op's slot while its flow is active.
    op_slot: Vec<u32>,
    /// Sum of the coefficients of the active flows on each resource, kept up to date so a
    /// solve need not add them up again (integer sums, exact in f64).
    res_weight: Vec<f64>,
    /// Resources whose flow set changed since the last solve.
    dirty: Vec<u32>,
    /// Solve epoch; a stamp equal to it means "visited in this solve".
    epoch: u32,
    res_seen: Vec<u32>,
    /// Per slot: stamps of "in the component" and "frozen" in this solve.
    flow_seen: Vec<u32>,
    flow_frozen: Vec<u32>,
    /// Capacity not yet taken by frozen flows, per resource.
    rem: Vec<f64>,
    /// Sum of the coefficients of unfrozen flows, per resource.
    weight: Vec<f64>,
    stack: Vec<u32>,
    comp_res: Vec<u32>,
    /// The component's slots.
    comp_flows: Vec<u32>,
    /// The fill's heap of (level bits, resource), kept for its allocation.
    levels: Vec<Reverse<(u64, u32)>>,
    /// Components of at most this many resources are filled by scans
    /// ([`SCAN_MAX_RESOURCES`]; tests set it to compare both ways).
    scan_max_resources: usize,
}

/// A resource's pending weight is a sum of small integers, exact in f64; anything under a half
/// is zero.
const MIN_WEIGHT: f64 = 0.5;

/// Components of at most this many resources are filled by scanning them each round
/// ([`FairShare::fill_by_scan`]) instead of with a heap of levels.
const SCAN_MAX_RESOURCES: usize = 32;

/// Resources within this relative distance of the lowest fill level saturate together; it
/// merges ties that rounding split, so equal links freeze in one round.
const LEVEL_TIE: f64 = 1e-12;

impl FairShare {
    /// Empty lists for `n_res` resources and `n_flows` possible flows.
    pub(super) fn new(n_res: usize, n_flows: usize) -> Self {
        FairShare {
            res_flows: vec![Vec::new(); n_res],
            slot_op: Vec::new(),
            slot_len: Vec::new(),
            slot_res: Vec::new(),
            slot_coef: Vec::new(),
            width: 0,
            free: Vec::new(),
            op_slot: vec![u32::MAX; n_flows],
            res_weight: vec![0.0; n_res],
            dirty: Vec::new(),
            epoch: 0,
            res_seen: vec![0; n_res],
            flow_seen: Vec::new(),
            flow_frozen: Vec::new(),
            rem: vec![0.0; n_res],
            weight: vec![0.0; n_res],
            stack: Vec::new(),
            comp_res: Vec::new(),
            comp_flows: Vec::new(),
            levels: Vec::new(),
            scan_max_resources: SCAN_MAX_RESOURCES,
        }
    }

    /// Flow `f` starts on resources `res` with coefficients `coef`.
    pub(super) fn add(&mut self, f: u32, (res, coef): (&[u32], &[f64])) {
        if res.len() > self.width {
            self.widen(res.len());
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let s = self.slot_op.len() as u32;
                self.slot_op.push(0);
                self.slot_len.push(0);
                self.slot_res.resize(self.slot_res.len() + self.width, 0);
                self.slot_coef
                    .resize(self.slot_coef.len() + self.width, 0.0);
                self.flow_seen.push(0);
                self.flow_frozen.push(0);
                s
            }
        };
        let (k, base) = (slot as usize, slot as usize * self.width);
        self.op_slot[f as usize] = slot;
        self.slot_op[k] = f;
        self.slot_len[k] = res.len() as u32;
        self.slot_res[base..base + res.len()].copy_from_slice(res);
        self.slot_coef[base..base + coef.len()].copy_from_slice(coef);
        for (&r, &c) in res.iter().zip(coef) {
            self.res_flows[r as usize].push(slot);
            self.res_weight[r as usize] += c;
            self.dirty.push(r);
        }
    }

    /// Flow `f` ends.
    pub(super) fn remove(&mut self, f: u32) {
        let slot = std::mem::replace(&mut self.op_slot[f as usize], u32::MAX);
        if slot == u32::MAX {
            return;
        }
        let base = slot as usize * self.width;
        for k in base..base + self.slot_len[slot as usize] as usize {
            let (r, c) = (self.slot_res[k], self.slot_coef[k]);
            let list = &mut self.res_flows[r as usize];
            if let Some(j) = list.iter().position(|&x| x == slot) {
                list.swap_remove(j);
                self.res_weight[r as usize] -= c;
            }
            self.dirty.push(r);
        }
        self.free.push(slot);
    }

    /// Room for rows of `width` resources: every slot's row moves to its new place.
    fn widen(&mut self, width: usize) {
        let (old, slots) = (self.width, self.slot_op.len());
        let mut res = vec![0; slots * width];
        let mut coef = vec![0.0; slots * width];
        for s in 0..slots {
            let n = self.slot_len[s] as usize;
            res[s * width..s * width + n].copy_from_slice(&self.slot_res[s * old..s * old + n]);
            coef[s * width..s * width + n].copy_from_slice(&self.slot_coef[s * old..s * old + n]);
        }
        (self.slot_res, self.slot_coef, self.width) = (res, coef, width);
    }

    /// Where slot `s`'s row starts in `slot_res` and `slot_coef`, and where it ends.
    fn row(&self, s: u32) -> (usize, usize) {
        let base = s as usize * self.width;
        (base, base + self.slot_len[s as usize] as usize)
    }

    /// Number of active flows on resource `r`.
    #[cfg(test)]
    fn load(&self, r: u32) -> usize {
        self.res_flows[r as usize].len()
    }

    fn next_epoch(&mut self) {
        if self.epoch == u32::MAX {
            self.res_seen.fill(0);
            self.flow_seen.fill(0);
            self.flow_frozen.fill(0);
            self.epoch = 0;
        }
        self.epoch += 1;
    }

    /// Recompute fair rates of every component touched since the last solve, calling
    /// `set_rate(flow, bytes_per_us)` once for each of their flows.
    pub(super) fn solve(&mut self, caps: &[f64], mut set_rate: impl FnMut(u32, f64)) {
        if self.dirty.is_empty() {
            return;
        }
        self.next_epoch();
        let mut dirty = std::mem::take(&mut self.dirty);
        for &r in &dirty {
            if self.res_seen[r as usize] != self.epoch && !self.res_flows[r as usize].is_empty() {
                self.collect_component(r);
                self.fill(caps, &mut set_rate);
            }
        }
        dirty.clear();
        self.dirty = dirty;
    }

    /// Gather the component of resource `start` into `comp_res` and `comp_flows`.
    fn collect_component(&mut self, start: u32) {
        let epoch = self.epoch;
        self.comp_res.clear();
        self.comp_flows.clear();
        self.stack.clear();
        self.res_seen[start as usize] = epoch;
        self.stack.push(start);
        while let Some(r) = self.stack.pop() {
            self.comp_res.push(r);
            for &f in &self.res_flows[r as usize] {
                if self.flow_seen[f as usize] == epoch {
                    continue;
                }
                self.flow_seen[f as usize] = epoch;
                self.comp_flows.push(f);
                let base = f as usize * self.width;
                let len = self.slot_len[f as usize] as usize;
                for &r2 in &self.slot_res[base..base + len] {
                    if self.res_seen[r2 as usize] != epoch {
                        self.res_seen[r2 as usize] = epoch;
                        self.stack.push(r2);
                    }
                }
            }
        }
    }

    /// Progressive filling of the collected component.
    ///
    /// Each resource's fill level (capacity left over unfrozen weight) only rises as flows
    /// freeze (a flow frozen at the lowest level `L` takes `c x L` of capacity and `c` of weight
    /// from a resource whose level is at least `L`), so a min-heap of levels, refreshed when
    /// popped, finds each round's bottlenecks in O(log R) per change instead of a scan of the
    /// component's resources per round, which dominated components of thousands of flows
    /// behind one spine (a 512-GPU rail fabric of two scalable units).
    fn fill(&mut self, caps: &[f64], set_rate: &mut impl FnMut(u32, f64)) {
        let small = self.comp_res.len() <= self.scan_max_resources;
        self.levels.clear();
        for &r in &self.comp_res {
            self.rem[r as usize] = caps[r as usize];
            let w = self.res_weight[r as usize];
            self.weight[r as usize] = w;
            if w > MIN_WEIGHT && !small {
                let level = caps[r as usize].max(0.0) / w + 0.0;
                self.levels.push(Reverse((level.to_bits(), r)));
            }
        }
        if small {
            self.fill_by_scan(set_rate);
            return;
        }
        // Levels are never negative (`+ 0.0` turns a -0.0 into 0.0), so their bit patterns
        // order as the values do.
        let mut heap = BinaryHeap::from(std::mem::take(&mut self.levels));
        let level_of = |rem: &[f64], weight: &[f64], r: usize| rem[r].max(0.0) / weight[r] + 0.0;
        let mut left = self.comp_flows.len();
        while left > 0 {
            // The lowest level: the least entry that is still current (entries only ever
            // understate a level).
            let mut level = f64::INFINITY;
            while let Some(Reverse((bits, r))) = heap.pop() {
                let r = r as usize;
                if self.weight[r] <= MIN_WEIGHT {
                    continue;
                }
                let now = level_of(&self.rem, &self.weight, r);
                if now.to_bits() > bits {
                    heap.push(Reverse((now.to_bits(), r as u32)));
                    continue;
                }
                level = now;
                heap.push(Reverse((bits, r as u32)));
                break;
            }
            if !level.is_finite() {
                // Unreachable: every unfrozen flow loads some resource of its component.
                break;
            }
            let before = left;
            let cut = level * (1.0 + LEVEL_TIE);
            // Every resource within the tie of the lowest level saturates in this round.
            while let Some(&Reverse((bits, r))) = heap.peek() {
                if f64::from_bits(bits) > cut {
                    break;
                }
                heap.pop();
                let r = r as usize;
                if self.weight[r] <= MIN_WEIGHT {
                    continue;
                }
                let now = level_of(&self.rem, &self.weight, r);
                if now > cut {
                    heap.push(Reverse((now.to_bits(), r as u32)));
                    continue;
                }
                left -= self.freeze(r, level, set_rate);
            }
            if left == before {
                // Unreachable as well (the lowest resource has unfrozen flows); never spin.
                break;
            }
        }
        let mut levels = heap.into_vec();
        levels.clear();
        self.levels = levels;
    }

    /// Freeze the unfrozen flows of resource `r` at `level`, taking their share from every
    /// resource they load; how many it froze.
    fn freeze(&mut self, r: usize, level: f64, set_rate: &mut impl FnMut(u32, f64)) -> usize {
        let mut frozen = 0;
        for j in 0..self.res_flows[r].len() {
            let f = self.res_flows[r][j];
            if self.flow_frozen[f as usize] == self.epoch {
                continue;
            }
            self.flow_frozen[f as usize] = self.epoch;
            frozen += 1;
            set_rate(self.slot_op[f as usize], level);
            let (from, to) = self.row(f);
            for k in from..to {
                let (r2, c) = (self.slot_res[k] as usize, self.slot_coef[k]);
                self.rem[r2] -= c * level;
                self.weight[r2] -= c;
            }
        }
        frozen
    }

    /// [`Self::fill`] of a component of at most [`SCAN_MAX_RESOURCES`] resources, `rem` and
    /// `weight` set: each round scans the resources for the lowest level, then freezes the
    /// flows of every resource within the tie of it. Most components of a plan's simulation
    /// are this small (a transfer and its few neighbours), where building and popping a heap
    /// costs more than the scans.
    fn fill_by_scan(&mut self, set_rate: &mut impl FnMut(u32, f64)) {
        let level_of = |rem: &[f64], weight: &[f64], r: usize| rem[r].max(0.0) / weight[r] + 0.0;
        let mut left = self.comp_flows.len();
        while left > 0 {
            let level = self
                .comp_res
                .iter()
                .map(|&r| r as usize)
                .filter(|&r| self.weight[r] > MIN_WEIGHT)
                .map(|r| level_of(&self.rem, &self.weight, r))
                .fold(f64::INFINITY, f64::min);
            if !level.is_finite() {
                // Unreachable: every unfrozen flow loads some resource of its component.
                break;
            }
            let before = left;
            let cut = level * (1.0 + LEVEL_TIE);
            for k in 0..self.comp_res.len() {
                let r = self.comp_res[k] as usize;
                if self.weight[r] <= MIN_WEIGHT || level_of(&self.rem, &self.weight, r) > cut {
                    continue;
                }
                left -= self.freeze(r, level, set_rate);
            }
            if left == before {
                // Unreachable as well (the lowest resource has unfrozen flows); never spin.
                break;
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::model::Uses;
    use super::*;

    /// Fair rates of flows `rows` (each a list of (resource, coefficient)) on `caps`.
    fn rates(rows: &[&[(u32, f64)]], caps: &[f64]) -> Vec<f64> {
        let uses = Uses::from_rows(rows);
        let mut fs = FairShare::new(caps.len(), rows.len());
        for f in 0..rows.len() as u32 {
            fs.add(f, uses.of(f));
        }
        let mut out = vec![f64::NAN; rows.len()];
        fs.solve(caps, |f, r| out[f as usize] = r);
        out
    }

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-9 * y.abs().max(1.0), "{a:?} != {b:?}");
        }
    }

    #[test]
    fn one_link_splits_evenly() {
        close(&rates(&[&[(0, 1.0)], &[(0, 1.0)]], &[10.0]), &[5.0, 5.0]);
    }

    #[test]
    fn classic_three_flow_water_filling() {
        // A on r0, B on r0 and r1, C on r1: r0 (10) binds A and B at 5; C takes the rest of r1.
        let got = rates(
            &[&[(0, 1.0)], &[(0, 1.0), (1, 1.0)], &[(1, 1.0)]],
            &[10.0, 30.0],
        );
        close(&got, &[5.0, 5.0, 25.0]);
    }

    #[test]
    fn coefficients_weigh_the_share() {
        // A reduction of two sources loads memory 3x per byte; a plain flow once.
        close(&rates(&[&[(0, 3.0)], &[(0, 1.0)]], &[8.0]), &[2.0, 2.0]);
        // Alone, it gets a third of the memory.
        close(&rates(&[&[(0, 3.0)]], &[9.0]), &[3.0]);
    }

    /// Scans and the heap give the same rates on random sharing problems, through a series
    /// of flow arrivals and departures (components of 1 to about 40 resources).
    #[test]
    fn scans_and_the_heap_agree() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        for case in 0..200 {
            let n_res = 1 + next(40) as usize;
            let n_flows = 1 + next(60) as usize;
            let caps: Vec<f64> = (0..n_res).map(|_| 1.0 + next(1000) as f64).collect();
            let uses = random_uses(&mut next, n_res, n_flows, 3);
            let mut by_scan = FairShare::new(n_res, n_flows);
            by_scan.scan_max_resources = usize::MAX;
            let mut by_heap = FairShare::new(n_res, n_flows);
            by_heap.scan_max_resources = 0;
            same_rates(
                &format!("case {case}, scans against the heap"),
                &caps,
                (&mut by_scan, &uses),
                (&mut by_heap, &uses),
            );
        }
    }

    /// A xorshift generator of numbers below its argument.
    pub(crate) fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        }
    }

    /// `n_flows` flows of 1 to 4 distinct resources of `n_res`, coefficients 1 to `coef_max`.
    pub(crate) fn random_uses(
        next: &mut impl FnMut(u64) -> u64,
        n_res: usize,
        n_flows: usize,
        coef_max: u64,
    ) -> Uses {
        let rows: Vec<Vec<(u32, f64)>> = (0..n_flows)
            .map(|_| {
                let mut row: Vec<(u32, f64)> = (0..1 + next(4))
                    .map(|_| (next(n_res as u64) as u32, 1.0 + next(coef_max) as f64))
                    .collect();
                row.sort_by_key(|x| x.0);
                row.dedup_by_key(|x| x.0);
                row
            })
            .collect();
        let refs: Vec<&[(u32, f64)]> = rows.iter().map(|r| &r[..]).collect();
        Uses::from_rows(&refs)
    }

    /// Flows `0..` of two tables of the same flows, started in order on `a` and `b`, every
    /// third step the oldest live one ending: after every solve the live flows' rates agree.
    pub(crate) fn same_rates(
        what: &str,
        caps: &[f64],
        (a, uses_a): (&mut FairShare, &Uses),
        (b, uses_b): (&mut FairShare, &Uses),
    ) {
        let n_flows = a.op_slot.len();
        let (mut ra, mut rb) = (vec![0.0; n_flows], vec![0.0; n_flows]);
        let mut live = std::collections::VecDeque::new();
        for f in 0..n_flows as u32 {
            a.add(f, uses_a.of(f));
            b.add(f, uses_b.of(f));
            live.push_back(f);
            if f % 3 == 2 {
                let gone = live.pop_front().expect("a live flow");
                a.remove(gone);
                b.remove(gone);
            }
            a.solve(caps, |f, r| ra[f as usize] = r);
            b.solve(caps, |f, r| rb[f as usize] = r);
            for &g in &live {
                let (x, y) = (ra[g as usize], rb[g as usize]);
                assert!(
                    (x - y).abs() <= 1e-9 * x.abs().max(1.0),
                    "{what}, flow {g}: {x} != {y}"
                );
            }
        }
    }

    #[test]
    fn components_are_refilled_alone() {
        let uses = Uses::from_rows(&[&[(0, 1.0)], &[(1, 1.0)], &[(1, 1.0)]]);
        let caps = [10.0, 10.0];
        let mut fs = FairShare::new(2, 3);
        for f in 0..3 {
            fs.add(f, uses.of(f));
        }
        let mut seen = Vec::new();
        fs.solve(&caps, |f, r| seen.push((f, r)));
        assert_eq!(seen.len(), 3);
        // Flow 2 ends: only flow 1 shares anything with it, so only flow 1 is rerated.
        fs.remove(2);
        seen.clear();
        fs.solve(&caps, |f, r| seen.push((f, r)));
        assert_eq!(seen, vec![(1, 10.0)]);
        assert_eq!(fs.load(1), 1);
        // Nothing changed: nothing to do.
        seen.clear();
        fs.solve(&caps, |f, r| seen.push((f, r)));
        assert!(seen.is_empty());
    }
}
