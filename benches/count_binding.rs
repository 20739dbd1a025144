//! Count binding against its target: all_to_all_v of f32 over 8 per-rank handles
//! (`RankComm`, host backend) driven from one thread with `RankGroup::launch_all`, with a new
//! random count matrix every call (`fresh_matrix`) against one matrix repeated every call
//! (`repeated_matrix`). Counts go up to 1,024 elements per pair, one pair at 513 or more, so
//! every matrix runs the same capacity plan (1,024) with its counts bound per call.
//!
//! Both cases run in alternation, a fresh call then a repeated one, within every sample of
//! both benchmarks, so the machine's noise falls on both alike; drawing a fresh matrix is
//! outside the timed span. After the run the bench prints the ratio of the two cases' total
//! times over every pair, the elements a fresh matrix moves on average against the repeated
//! one's, and the plan cache's size before and after.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use relaycc::{Collectives, RankComm, RankGroup};

/// Ranks of the communicator.
const RANKS: usize = 8;
/// The largest count of one pair, elements.
const MAX_COUNT: usize = 1024;

/// The ranks, their buffers, the repeated matrix, a generator of fresh ones, and the times of
/// every pair of calls so far.
struct State {
    ranks: Vec<RankComm>,
    send: Vec<Vec<f32>>,
    recv: Vec<Vec<f32>>,
    repeated: Vec<Vec<usize>>,
    seed: u64,
    calls: u64,
    totals: [Duration; 2],
    pairs: u64,
    /// Elements the fresh matrices moved, summed.
    fresh_elements: u64,
}

impl State {
    fn new() -> Option<Self> {
        let ranks = RankComm::host(RANKS as u32)
            .map_err(|e| eprintln!("cannot make {RANKS} host ranks: {e}"))
            .ok()?;
        let mut s = State {
            ranks,
            send: (0..RANKS)
                .map(|r| vec![r as f32; RANKS * MAX_COUNT])
                .collect(),
            recv: vec![vec![0f32; RANKS * MAX_COUNT]; RANKS],
            repeated: Vec::new(),
            seed: 0x9e37_79b9_7f4a_7c15,
            calls: 0,
            totals: [Duration::ZERO; 2],
            pairs: 0,
            fresh_elements: 0,
        };
        s.repeated = s.matrix();
        Some(s)
    }

    /// A new random matrix (row: sender) with the same capacity as every other.
    fn matrix(&mut self) -> Vec<Vec<usize>> {
        let mut next = |hi: usize| {
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            (self.seed % (hi as u64 + 1)) as usize
        };
        let mut m: Vec<Vec<usize>> = (0..RANKS)
            .map(|_| (0..RANKS).map(|_| next(MAX_COUNT)).collect())
            .collect();
        let (s, d) = (next(RANKS - 1), next(RANKS - 1));
        m[s][d] = MAX_COUNT / 2 + 1 + next(MAX_COUNT / 2 - 1);
        m
    }

    /// One all_to_all_v of `m` on every rank; its wall time.
    fn call(&mut self, m: &[Vec<usize>]) -> Duration {
        let cols: Vec<Vec<usize>> = (0..RANKS)
            .map(|d| (0..RANKS).map(|s| m[s][d]).collect())
            .collect();
        let t = Instant::now();
        let groups = self
            .ranks
            .iter_mut()
            .zip(self.send.iter().zip(self.recv.iter_mut()))
            .enumerate()
            .map(|(r, (rank, (send, recv)))| {
                let (ins, outs) = (m[r].iter().sum(), cols[r].iter().sum());
                let mut g = rank.group();
                g.all_to_all_v(&send[..ins], &m[r], &mut recv[..outs], &cols[r]);
                g
            });
        if let Err(e) = RankGroup::launch_all(groups) {
            eprintln!("all_to_all_v failed: {e}");
        }
        let took = t.elapsed();
        self.calls += 1;
        took
    }

    /// `iters` pairs of calls, a fresh matrix then the repeated one; their total times.
    fn pairs(&mut self, iters: u64) -> [Duration; 2] {
        let repeated = std::mem::take(&mut self.repeated);
        let mut t = [Duration::ZERO; 2];
        for _ in 0..iters {
            let fresh = self.matrix();
            self.fresh_elements += elements(&fresh);
            t[0] += self.call(&fresh);
            t[1] += self.call(&repeated);
        }
        self.repeated = repeated;
        self.totals[0] += t[0];
        self.totals[1] += t[1];
        self.pairs += iters;
        t
    }

    fn cached_plans(&self) -> usize {
        self.ranks
            .first()
            .map_or(0, |r| r.communicator().cached_plans())
    }
}

/// Elements a matrix moves.
fn elements(m: &[Vec<usize>]) -> u64 {
    m.iter().flatten().map(|c| *c as u64).sum()
}

fn count_binding(c: &mut Criterion) {
    let Some(mut state) = State::new() else {
        return;
    };
    // The first call plans the capacity; the cache holds it from then on.
    let warm = state.repeated.clone();
    state.call(&warm);
    let before = state.cached_plans();
    let state = RefCell::new(state);
    let mut g = c.benchmark_group("all_to_all_v_8_ranks_counts_to_1024");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (id, case) in [("fresh_matrix", 0usize), ("repeated_matrix", 1)] {
        g.bench_function(id, |b| {
            b.iter_custom(|iters| state.borrow_mut().pairs(iters)[case]);
        });
    }
    g.finish();
    let s = state.borrow();
    let ratio = s.totals[0].as_secs_f64() / s.totals[1].as_secs_f64().max(f64::MIN_POSITIVE);
    let pairs = s.pairs.max(1) as f64;
    println!(
        "count_binding: {} pairs in alternation: fresh {:.1} us/call, repeated {:.1} us/call, \
         fresh/repeated {ratio:.3}; elements per call: fresh {:.0} on average, repeated {}; \
         plans cached {before} before, {} after {} calls",
        s.pairs,
        s.totals[0].as_secs_f64() * 1e6 / pairs,
        s.totals[1].as_secs_f64() * 1e6 / pairs,
        s.fresh_elements as f64 / pairs,
        elements(&s.repeated),
        s.cached_plans(),
        s.calls
    );
}

criterion_group!(benches, count_binding);
criterion_main!(benches);
