//! The ring order of a set of ranks: the order that maximises the slowest ring connection,
//! then the sum of their rates, searched exhaustively up to [`RING_SEARCH_BUDGET`] orders
//! (branch and bound) and greedily beyond. The ring planners (`ring.rs`, `ring_pack.rs`), the
//! ring chains of the trees (`pipelined_tree.rs`) and the NCCL-like baseline take their orders from it.

use relaycc_plan::Request;
use relaycc_plan::Result;

use super::PlannerContext;

/// Ring orders evaluated exhaustively at most (7! = every order of 8 ranks with rank 0 fixed);
/// larger rings, or rings whose order count exceeds it, are built greedily.
pub const RING_SEARCH_BUDGET: u64 = 5040;

/// The ring order (rank positions) maximising the slowest connection, then the sum.
///
/// # Arguments
/// - `ctx`: connections and link mode;
/// - `req`: the request (its GPUs);
/// - `both`: also score the reverse direction of every ring link (for two channels).
///
/// # Returns
/// Ranks in ring order, starting with rank 0; [`relaycc_plan::RouteError::OverLimit`] where the
/// build's deadline passes while the n^2 connections are laid out (8,192 ranks ask for 67M).
///
/// # Complexity
/// n^2 connections, then (n-1)! orders (at most [`RING_SEARCH_BUDGET`]) x n, or greedy
/// O(n^2); once per planning call and (mode, `both`) when `req`'s GPUs are the connection
/// cache's members (the search is remembered there).
///
/// Source: NCCL's ring search (`src/graph/search.cc`) maximises the ring's bandwidth the same
/// way, over its own link rules.
pub fn ring_order(ctx: &PlannerContext, req: &Request, both: bool) -> Result<Vec<u32>> {
    if req.gpus == ctx.cache.members() {
        ctx.cache
            .ring_order(ctx.mode, both, || search_ring_order(ctx, req, both))
    } else {
        search_ring_order(ctx, req, both)
    }
}

fn search_ring_order(ctx: &PlannerContext, req: &Request, both: bool) -> Result<Vec<u32>> {
    let n = req.nranks();
    let g = &req.gpus;
    let rate = |a: usize, b: usize| ctx.cache.gbps(ctx.mode, g[a], g[b]);
    // Flat, with both directions already folded in: the search reads it (n-1)! times. Each
    // entry may search a path or a max-flow (a quarter second over the 2M network links of
    // 1,024 GB200 racks on a fat-tree) and writes no op, so the clock is read before each.
    let link: Vec<f64> = (0..n * n)
        .map(|k| {
            crate::limits::check_deadline_now(ctx.limit, "ordered as a ring")?;
            let (a, b) = (k / n, k % n);
            Ok(match (a == b, both) {
                (true, _) => 0.0,
                (false, true) => rate(a, b).min(rate(b, a)),
                (false, false) => rate(a, b),
            })
        })
        .collect::<Result<_>>()?;
    Ok(best_order(&link, n).into_iter().map(|r| r as u32).collect())
}

/// The ring order (positions `0..n`, starting at 0) maximising the slowest link, then the sum
/// of links, under the flat `n x n` matrix `link` (`link[a * n + b]`, GB/s): exact up to 8
/// ranks within [`RING_SEARCH_BUDGET`], greedy (fastest next link) beyond.
pub(super) fn best_order(link: &[f64], n: usize) -> Vec<usize> {
    // (n-1)! overflows u64 from 22 ranks (a GB200 NVL72 rack has 72); saturate instead.
    let orders = (1..n as u64).try_fold(1u64, |acc, k| acc.checked_mul(k));
    let orders = orders.unwrap_or(u64::MAX);
    if n <= 3 {
        // Every order is the same ring or its reverse.
        (0..n).collect()
    } else if n <= 8 && orders <= RING_SEARCH_BUDGET {
        best_ring(link, n)
    } else {
        let mut best = vec![0];
        let mut left: Vec<usize> = (1..n).collect();
        while !left.is_empty() {
            let at = best[best.len() - 1];
            let (i, _) = left
                .iter()
                .enumerate()
                .fold((0, f64::NEG_INFINITY), |acc, (i, &c)| {
                    let r = link[at * n + c];
                    if r > acc.1 { (i, r) } else { acc }
                });
            best.push(left.remove(i));
        }
        best
    }
}

/// (slowest link, sum of links) of the closed ring `order` under the flat `link` matrix.
fn ring_score(link: &[f64], n: usize, order: &[usize]) -> (f64, f64) {
    let mut min = f64::INFINITY;
    let mut sum = 0.0;
    for i in 0..order.len() {
        let r = link[order[i] * n + order[(i + 1) % order.len()]];
        min = min.min(r);
        sum += r;
    }
    (min, sum)
}

/// The lexicographically first ring order starting at 0 with the greatest (slowest link, sum
/// of links), by depth-first search in lexicographic order that abandons a partial ring once
/// its slowest link is below the best complete ring's: such a ring can neither beat nor tie
/// it. Exact; far fewer than (n-1)! rings are completed on real topologies.
fn best_ring(link: &[f64], n: usize) -> Vec<usize> {
    struct Search<'l> {
        link: &'l [f64],
        n: usize,
        /// Each rank's fastest outgoing link: a bound on the link the ring leaves it by.
        widest_out: Vec<f64>,
        /// Sum of `widest_out` over the ranks not yet in the partial ring.
        unused_out: f64,
        cur: Vec<usize>,
        used: Vec<bool>,
        best: Vec<usize>,
        top: (f64, f64),
    }
    impl Search<'_> {
        fn extend(&mut self, min: f64, sum: f64) {
            let n = self.n;
            let at = self.cur[self.cur.len() - 1];
            if self.cur.len() == n {
                let r = self.link[at * n + self.cur[0]];
                let (m, s) = (min.min(r), sum + r);
                if m > self.top.0 || (m == self.top.0 && s > self.top.1) {
                    self.top = (m, s);
                    self.best.clone_from(&self.cur);
                }
                return;
            }
            for c in 1..n {
                if self.used[c] {
                    continue;
                }
                let r = self.link[at * n + c];
                let m = min.min(r);
                // Every rank not yet left (c and the unused ones) adds one outgoing link.
                let most = sum + r + self.unused_out;
                // The slack keeps rounding in `most` from cutting a ring that ties or wins.
                if m < self.top.0
                    || (m == self.top.0 && most < self.top.1 - 1e-9 * self.top.1.abs())
                {
                    continue;
                }
                self.used[c] = true;
                self.unused_out -= self.widest_out[c];
                self.cur.push(c);
                self.extend(m, sum + r);
                self.cur.pop();
                self.unused_out += self.widest_out[c];
                self.used[c] = false;
            }
        }
    }
    let identity: Vec<usize> = (0..n).collect();
    let widest_out: Vec<f64> = (0..n)
        .map(|a| link[a * n..(a + 1) * n].iter().copied().fold(0.0, f64::max))
        .collect();
    let mut search = Search {
        link,
        n,
        widest_out: widest_out.clone(),
        unused_out: widest_out[1..].iter().sum(),
        cur: vec![0],
        used: (0..n).map(|c| c == 0).collect(),
        top: ring_score(link, n, &identity),
        best: identity,
    };
    search.extend(f64::INFINITY, 0.0);
    search.best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build whose deadline has passed: its ring order's n^2 connections stop at the first
    /// read of the clock, with the error that names what was being done, and the connection
    /// cache remembers no order (the next search starts again).
    #[test]
    fn a_ring_order_search_stops_at_its_deadline() {
        use crate::{ConnCache, LinkMode};
        use relaycc_plan::Collective;
        use relaycc_plan::DType;
        use relaycc_plan::path::RelayPolicy;
        let topo = relaycc_topo::preset("cluster:4xdgx-h100:ib-ndr").unwrap();
        let gpus: Vec<u32> = (0..32).collect();
        let req = Request::new(Collective::Broadcast, gpus.clone(), 1, DType::F32);
        let cache = ConnCache::new(&topo, &gpus, &RelayPolicy::Members);
        let passed = crate::limits::Limit {
            ops: crate::limits::CallOps::new(u64::MAX),
            share: None,
            until: Some(std::time::Instant::now()),
            what: "a candidate",
            large: None,
        };
        let ctx = PlannerContext {
            limit: Some(&passed),
            ..PlannerContext::new(&cache, LinkMode::Single, 1, 1)
        };
        match ring_order(&ctx, &req, false) {
            Err(relaycc_plan::RouteError::OverLimit { what, .. }) => {
                assert!(what.contains("ordered as a ring"), "{what}");
            }
            other => panic!("a search past its deadline went on: {other:?}"),
        }
        let free = PlannerContext::new(&cache, LinkMode::Single, 1, 1);
        assert_eq!(ring_order(&free, &req, false).unwrap().len(), 32);
    }

    /// The slowest connection of a ring order, GB/s (both directions when `both`).
    fn slowest(ctx: &PlannerContext, req: &Request, ord: &[u32], both: bool) -> f64 {
        let g = |p: usize| req.gpus[ord[p % ord.len()] as usize];
        (0..ord.len())
            .map(|p| {
                let f = ctx.cache.gbps(ctx.mode, g(p), g(p + 1));
                let b = ctx.cache.gbps(ctx.mode, g(p + 1), g(p));
                if both { f.min(b) } else { f }
            })
            .fold(f64::INFINITY, f64::min)
    }

    #[test]
    fn dgx1_subset_rings_relay_where_nccl_goes_through_host() {
        use crate::{ConnCache, LinkMode};
        use relaycc_plan::Collective;
        use relaycc_plan::DType;
        use relaycc_plan::path::RelayPolicy;
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        for gpus in [vec![0, 7], vec![0, 2, 5, 7], vec![1, 2, 4, 7]] {
            let req = Request::new(Collective::AllReduce, gpus.clone(), 1, DType::F32);
            let cache = ConnCache::new(&topo, &gpus, &RelayPolicy::Any);
            let rate = |mode| {
                let ctx = PlannerContext::new(&cache, mode, 1, 2);
                let ord = ring_order(&ctx, &req, true).unwrap();
                slowest(&ctx, &req, &ord, true)
            };
            let (nccl, single) = (rate(LinkMode::Nccl), rate(LinkMode::Single));
            // NCCL's ring crosses the sockets through host memory (PCIe, 10 GB/s); relaycc
            // relays the missing links over NVLink (at least one NV1 lane, 24.2 GB/s).
            assert!((nccl - 10.0).abs() < 1e-9, "{gpus:?} nccl {nccl}");
            assert!(single >= 24.2 - 1e-9, "{gpus:?} single {single}");
        }
    }

    /// Lexicographic next permutation; false when `v` was the last.
    fn next_permutation(v: &mut [usize]) -> bool {
        let Some(i) = (1..v.len()).rev().find(|&i| v[i - 1] < v[i]) else {
            return false;
        };
        let j = (i..v.len()).rev().find(|&j| v[j] > v[i - 1]).unwrap_or(i);
        v.swap(i - 1, j);
        v[i..].reverse();
        true
    }

    /// The exhaustive search the branch-and-bound one replaced: every order in lexicographic
    /// order, keeping strict improvements.
    fn exhaustive_ring(link: &[f64], n: usize) -> Vec<usize> {
        let mut cur: Vec<usize> = (0..n).collect();
        let mut best = cur.clone();
        let mut top = ring_score(link, n, &cur);
        while next_permutation(&mut cur[1..]) {
            let s = ring_score(link, n, &cur);
            if s.0 > top.0 || (s.0 == top.0 && s.1 > top.1) {
                top = s;
                best.clone_from(&cur);
            }
        }
        best
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, failure_persistence: None, ..proptest::prelude::ProptestConfig::default() })]
        #[test]
        fn branch_and_bound_ring_equals_exhaustive(
            n in 4usize..=8,
            // Few distinct rates, so ties on the slowest link (and on sums) are common.
            rates in proptest::collection::vec(0u8..4, 64),
        ) {
            let link: Vec<f64> = (0..n * n)
                .map(|k| if k / n == k % n { 0.0 } else { f64::from(rates[k % 64]) * 12.1 })
                .collect();
            proptest::prop_assert_eq!(best_ring(&link, n), exhaustive_ring(&link, n));
        }
    }

    #[test]
    fn permutations_are_lexicographic() {
        let mut v = vec![0, 1, 2];
        let mut seen = vec![v.clone()];
        while next_permutation(&mut v) {
            seen.push(v.clone());
        }
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[1], vec![0, 2, 1]);
    }
}
