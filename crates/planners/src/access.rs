//! Access tracking for the plan builder: per memory, which op last wrote each run of elements
//! and which ops read it since, so every new op can be given the dependencies that order it
//! after what it reads and overwrites.
//!
//! A memory's runs are kept in a vector sorted by start while they are few (`SORTED_MAX_RUNS`):
//! planners touch most memories in a few hundred chunk-sized runs, where a binary search and a
//! short shift beat a tree's node allocations (planning time was dominated by this structure,
//! about 40% of a cold 8-GPU all_reduce, before it was written this way). Past that they move
//! to a B-tree keyed by start: a ring over hundreds of ranks touches one memory in thousands
//! of runs, where every new run shifted most of the vector (a 512-GPU reduce_scatter spent a
//! third of its planning in `memmove`). Most runs are read by one or two ops, so readers live
//! inline until a third arrives.

use std::collections::BTreeMap;

/// Readers kept inline before spilling to the heap.
const INLINE_READERS: usize = 2;

/// The ops that read a run since its last write, in the order they were recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Readers {
    inline: [u32; INLINE_READERS],
    len: usize,
    spill: Vec<u32>,
}

impl Readers {
    fn one(op: u32) -> Self {
        Readers {
            inline: [op; INLINE_READERS],
            len: 1,
            spill: Vec::new(),
        }
    }
    fn last(&self) -> Option<u32> {
        match self.len {
            0 => None,
            n if n <= INLINE_READERS => Some(self.inline[n - 1]),
            _ => self.spill.last().copied(),
        }
    }
    /// Record `op` unless it is already the latest reader (one op reading a run twice).
    fn push(&mut self, op: u32) {
        if self.last() == Some(op) {
            return;
        }
        if self.len < INLINE_READERS {
            self.inline[self.len] = op;
        } else {
            self.spill.push(op);
        }
        self.len += 1;
    }
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.inline[..self.len.min(INLINE_READERS)]
            .iter()
            .chain(&self.spill)
            .copied()
    }
}

/// Elements `[start, end)` of a memory: the op that wrote them last and the ops that read them
/// since.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    start: u64,
    end: u64,
    writer: Option<u32>,
    readers: Readers,
}

/// Runs held in a sorted vector up to this many; past it, in a B-tree.
const SORTED_MAX_RUNS: usize = 512;

impl Run {
    /// Append to `out` what an access of this run waits for: its last writer, and for a write
    /// also its readers since.
    fn waits(&self, write: bool, out: &mut Vec<u32>) {
        out.extend(self.writer);
        if write {
            out.extend(self.readers.iter());
        }
    }
}

/// The runs of one memory, disjoint, by start; gaps are elements never touched.
#[derive(Debug)]
pub(super) struct AccessTrack {
    runs: Runs,
    /// Runs kept in a sorted vector before they move to a B-tree.
    sorted_max: usize,
}

impl Default for AccessTrack {
    fn default() -> Self {
        AccessTrack::with_sorted_max(SORTED_MAX_RUNS)
    }
}

#[derive(Debug)]
enum Runs {
    Sorted(SortedRuns),
    Tree(TreeRuns),
}

impl AccessTrack {
    /// An empty track whose runs move from a sorted vector to a B-tree past `sorted_max`.
    fn with_sorted_max(sorted_max: usize) -> Self {
        AccessTrack {
            runs: Runs::Sorted(SortedRuns::default()),
            sorted_max,
        }
    }

    /// Append to `out` the ops an access of `[a, b)` must wait for: the last writers, and for a
    /// write (`write == true`) also the readers since. Repeats are left for the caller to
    /// remove.
    pub(super) fn deps(&self, a: u64, b: u64, write: bool, out: &mut Vec<u32>) {
        match &self.runs {
            Runs::Sorted(r) => r.deps(a, b, write, out),
            Runs::Tree(r) => r.deps(a, b, write, out),
        }
    }

    /// Record that `op` reads `[a, b)`.
    pub(super) fn read(&mut self, a: u64, b: u64, op: u32) {
        match &mut self.runs {
            Runs::Sorted(r) => r.read(a, b, op),
            Runs::Tree(r) => r.read(a, b, op),
        }
        self.grow_up();
    }

    /// Record that `op` overwrites `[a, b)`: earlier writers and readers there are forgotten.
    pub(super) fn write(&mut self, a: u64, b: u64, op: u32) {
        match &mut self.runs {
            Runs::Sorted(r) => r.write(a, b, op),
            Runs::Tree(r) => r.write(a, b, op),
        }
        self.grow_up();
    }

    /// Move the runs to a B-tree once the sorted vector holds more than `sorted_max`.
    fn grow_up(&mut self) {
        if let Runs::Sorted(r) = &mut self.runs
            && r.runs.len() > self.sorted_max
        {
            let runs = std::mem::take(&mut r.runs);
            self.runs = Runs::Tree(TreeRuns {
                runs: runs.into_iter().map(|r| (r.start, r)).collect(),
                gaps: Vec::new(),
            });
        }
    }

    /// The runs in order.
    #[cfg(test)]
    fn runs(&self) -> Vec<&Run> {
        match &self.runs {
            Runs::Sorted(r) => r.runs.iter().collect(),
            Runs::Tree(r) => r.runs.values().collect(),
        }
    }
}

/// Runs in a vector sorted by start: a binary search and a short shift beat a tree's node
/// allocations for the few hundred runs of most memories.
#[derive(Debug, Default)]
struct SortedRuns {
    runs: Vec<Run>,
}

impl SortedRuns {
    /// Index of the first run that ends after `at`.
    fn first_ending_after(&self, at: u64) -> usize {
        self.runs.partition_point(|r| r.end <= at)
    }

    /// Split the run straddling `at`, if any; returns the index of the first run starting at
    /// or after `at`.
    fn split(&mut self, at: u64) -> usize {
        let i = self.first_ending_after(at);
        match self.runs.get(i) {
            Some(r) if r.start < at => {
                let mut right = r.clone();
                right.start = at;
                self.runs[i].end = at;
                self.runs.insert(i + 1, right);
                i + 1
            }
            _ => i,
        }
    }

    /// Append to `out` the ops an access of `[a, b)` must wait for: the last writers, and for a
    /// write (`write == true`) also the readers since. Repeats are left for the caller to
    /// remove.
    fn deps(&self, a: u64, b: u64, write: bool, out: &mut Vec<u32>) {
        if a >= b {
            return;
        }
        let from = self.first_ending_after(a);
        for r in self.runs[from..].iter().take_while(|r| r.start < b) {
            r.waits(write, out);
        }
    }

    /// Record that `op` reads `[a, b)`.
    fn read(&mut self, a: u64, b: u64, op: u32) {
        if a >= b {
            return;
        }
        let mut i = self.split(a);
        let mut hi = self.split(b);
        let mut pos = a;
        while pos < b {
            match self.runs.get_mut(i) {
                Some(r) if i < hi && r.start == pos => {
                    r.readers.push(op);
                    pos = r.end;
                }
                next => {
                    // A gap: elements nobody wrote or read yet.
                    let end = match next {
                        Some(r) if i < hi => r.start,
                        _ => b,
                    };
                    self.runs.insert(
                        i,
                        Run {
                            start: pos,
                            end,
                            writer: None,
                            readers: Readers::one(op),
                        },
                    );
                    hi += 1;
                    pos = end;
                }
            }
            i += 1;
        }
    }

    /// Record that `op` overwrites `[a, b)`: earlier writers and readers there are forgotten.
    fn write(&mut self, a: u64, b: u64, op: u32) {
        if a >= b {
            return;
        }
        let lo = self.split(a);
        let hi = self.split(b);
        let run = Run {
            start: a,
            end: b,
            writer: Some(op),
            readers: Readers::default(),
        };
        if hi > lo {
            self.runs[lo] = run;
            self.runs.drain(lo + 1..hi);
        } else {
            self.runs.insert(lo, run);
        }
    }
}

/// Runs in a B-tree keyed by start, for memories of thousands of runs.
#[derive(Debug, Default)]
struct TreeRuns {
    runs: BTreeMap<u64, Run>,
    /// Gaps a read fills, reused between calls.
    gaps: Vec<(u64, u64)>,
}

impl TreeRuns {
    /// Start of the run holding element `at`, if one does.
    fn holding(&self, at: u64) -> Option<u64> {
        self.runs
            .range(..=at)
            .next_back()
            .filter(|(_, r)| r.end > at)
            .map(|(&s, _)| s)
    }

    /// Split the run straddling `at` (starting before it, ending after it) in two.
    fn split(&mut self, at: u64) {
        let right = match self.runs.range_mut(..at).next_back() {
            Some((_, r)) if r.end > at => {
                let mut right = r.clone();
                right.start = at;
                r.end = at;
                right
            }
            _ => return,
        };
        self.runs.insert(at, right);
    }

    /// Append to `out` the ops an access of `[a, b)` must wait for: the last writers, and for a
    /// write (`write == true`) also the readers since. Repeats are left for the caller to
    /// remove.
    fn deps(&self, a: u64, b: u64, write: bool, out: &mut Vec<u32>) {
        if a >= b {
            return;
        }
        let from = self.holding(a).unwrap_or(a);
        for (_, r) in self.runs.range(from..b) {
            r.waits(write, out);
        }
    }

    /// Record that `op` reads `[a, b)`.
    fn read(&mut self, a: u64, b: u64, op: u32) {
        if a >= b {
            return;
        }
        self.split(a);
        self.split(b);
        let mut gaps = std::mem::take(&mut self.gaps);
        gaps.clear();
        let mut pos = a;
        for (&start, r) in self.runs.range_mut(a..b) {
            if start > pos {
                // Elements nobody wrote or read yet.
                gaps.push((pos, start));
            }
            r.readers.push(op);
            pos = r.end;
        }
        if pos < b {
            gaps.push((pos, b));
        }
        for &(start, end) in &gaps {
            self.runs.insert(
                start,
                Run {
                    start,
                    end,
                    writer: None,
                    readers: Readers::one(op),
                },
            );
        }
        self.gaps = gaps;
    }

    /// Record that `op` overwrites `[a, b)`: earlier writers and readers there are forgotten.
    fn write(&mut self, a: u64, b: u64, op: u32) {
        if a >= b {
            return;
        }
        self.split(a);
        self.split(b);
        // Runs starting past `a` inside the range go; the one at `a`, if any, is replaced.
        while let Some(&start) = self.runs.range(a + 1..b).next().map(|(s, _)| s) {
            self.runs.remove(&start);
        }
        self.runs.insert(
            a,
            Run {
                start: a,
                end: b,
                writer: Some(op),
                readers: Readers::default(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: one (writer, readers) record per element.
    #[derive(Default)]
    struct PerElement {
        cells: Vec<(Option<u32>, Vec<u32>)>,
    }

    impl PerElement {
        fn grow(&mut self, b: u64) {
            if self.cells.len() < b as usize {
                self.cells.resize(b as usize, (None, Vec::new()));
            }
        }
        fn deps(&mut self, a: u64, b: u64, write: bool) -> Vec<u32> {
            self.grow(b);
            let mut d = Vec::new();
            for (w, rs) in &self.cells[a as usize..b as usize] {
                d.extend(*w);
                if write {
                    d.extend(rs);
                }
            }
            d.sort_unstable();
            d.dedup();
            d
        }
        fn read(&mut self, a: u64, b: u64, op: u32) {
            self.grow(b);
            for c in &mut self.cells[a as usize..b as usize] {
                if c.1.last() != Some(&op) {
                    c.1.push(op);
                }
            }
        }
        fn write(&mut self, a: u64, b: u64, op: u32) {
            self.grow(b);
            for c in &mut self.cells[a as usize..b as usize] {
                *c = (Some(op), Vec::new());
            }
        }
    }

    fn sorted_deps(t: &AccessTrack, a: u64, b: u64, write: bool) -> Vec<u32> {
        let mut d = Vec::new();
        t.deps(a, b, write, &mut d);
        d.sort_unstable();
        d.dedup();
        d
    }

    fn well_formed(t: &AccessTrack) -> bool {
        let keyed = match &t.runs {
            Runs::Sorted(_) => true,
            Runs::Tree(r) => r.runs.iter().all(|(&s, r)| s == r.start),
        };
        let runs = t.runs();
        keyed
            && runs.iter().all(|r| r.start < r.end)
            && runs.windows(2).all(|w| w[0].end <= w[1].start)
    }

    #[test]
    fn write_after_reads_waits_for_every_reader() {
        for sorted_max in [0, usize::MAX] {
            write_after_reads_waits_for_every_reader_in(AccessTrack::with_sorted_max(sorted_max));
        }
    }

    fn write_after_reads_waits_for_every_reader_in(mut t: AccessTrack) {
        t.write(0, 10, 0);
        t.read(2, 6, 1);
        t.read(4, 8, 2);
        t.read(5, 9, 3);
        assert_eq!(sorted_deps(&t, 0, 10, true), vec![0, 1, 2, 3]);
        assert_eq!(sorted_deps(&t, 0, 3, true), vec![0, 1]);
        assert_eq!(sorted_deps(&t, 9, 10, false), vec![0]);
        t.write(3, 7, 4);
        assert_eq!(sorted_deps(&t, 3, 7, true), vec![4]);
        assert_eq!(sorted_deps(&t, 0, 10, false), vec![0, 4]);
        assert!(well_formed(&t));
    }

    #[test]
    fn untouched_elements_need_nothing_and_gaps_are_filled_by_reads() {
        for sorted_max in [0, usize::MAX] {
            gaps_are_filled_by_reads_in(AccessTrack::with_sorted_max(sorted_max));
        }
    }

    fn gaps_are_filled_by_reads_in(mut t: AccessTrack) {
        assert!(sorted_deps(&t, 0, 100, true).is_empty());
        t.write(10, 20, 0);
        t.read(0, 30, 1);
        assert_eq!(sorted_deps(&t, 0, 5, true), vec![1]);
        assert_eq!(sorted_deps(&t, 25, 30, true), vec![1]);
        assert_eq!(sorted_deps(&t, 15, 16, true), vec![0, 1]);
        assert!(well_formed(&t));
        assert_eq!(t.runs().len(), 3);
    }

    #[test]
    fn readers_spill_past_the_inline_ones_in_order() {
        let mut r = Readers::default();
        for op in [5, 5, 6, 7, 7, 8] {
            r.push(op);
        }
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![5, 6, 7, 8]);
        assert_eq!(r.last(), Some(8));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn matches_a_per_element_reference(
            accesses in proptest::collection::vec((0u64..64, 0u64..16, 0u8..3), 1..80),
            // Always a tree, a vector that turns into one midway, always a vector.
            sorted_max in prop::sample::select(vec![0usize, 4, usize::MAX]),
        ) {
            let mut t = AccessTrack::with_sorted_max(sorted_max);
            let mut reference = PerElement::default();
            for (op, (a, len, kind)) in accesses.into_iter().enumerate() {
                let (op, b) = (op as u32, a + len);
                match kind {
                    0 => {
                        prop_assert_eq!(sorted_deps(&t, a, b, false), reference.deps(a, b, false));
                        t.read(a, b, op);
                        reference.read(a, b, op);
                    }
                    1 => {
                        prop_assert_eq!(sorted_deps(&t, a, b, true), reference.deps(a, b, true));
                        t.write(a, b, op);
                        reference.write(a, b, op);
                    }
                    _ => {
                        // A reduction in place: reads and writes the same elements.
                        prop_assert_eq!(sorted_deps(&t, a, b, true), reference.deps(a, b, true));
                        t.read(a, b, op);
                        reference.read(a, b, op);
                        t.write(a, b, op);
                        reference.write(a, b, op);
                    }
                }
                prop_assert!(well_formed(&t));
            }
            prop_assert_eq!(sorted_deps(&t, 0, 80, true), reference.deps(0, 80, true));
        }
    }
}
