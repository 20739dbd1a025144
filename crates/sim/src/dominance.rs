//! Resources that can never limit a flow, left out of fair sharing: a resource `r` is
//! *dominated* by a resource `s` when every op that loads `r` also loads `s`, and loads `r`
//! no harder relative to its capacity (`c(f, r) / cap(r) <= c(f, s) / cap(s)` for each such
//! op `f`). At every instant the flows on `r` are then some of the flows on `s`, so
//!
//! ```text
//! sum_f c(f, r) x(f) / cap(r)  <=  sum_f c(f, s) x(f) / cap(s)  <=  1
//! ```
//!
//! whatever the rates: `r`'s constraint follows from `s`'s, and max-min fair rates without it
//! are the rates with it. A GPU's PCIe link to its NIC that carries only that NIC's traffic at
//! a higher rate is one; on a rail-optimized fabric they are most of a large component's
//! resources, and every flow's start or end refilled them.
//!
//! Ties (the same ops, the same ratios) would let two resources dominate each other; only
//! the lower index dominates then, unless every ratio is strictly lower, so dominance has no
//! cycle and every chain of it ends at a resource that is kept. Each op therefore keeps at
//! least one resource (the end of the chain from any of its own). The simulator still counts
//! every resource's bytes and busy time from the full table ([`Uses`]); only the fair share
//! reads the reduced one.

use super::model::Uses;

/// Candidate dominators of each resource: `None` until an op loads it, then the resources
/// that every op loading it so far also loads at a ratio at least as high.
type Candidates = Vec<Option<Vec<u32>>>;

/// `uses` without the resources some other resource dominates (module docs), for `caps` in
/// bytes per microsecond.
pub(super) fn binding_uses(uses: &Uses, caps: &[f64], ops: usize) -> Uses {
    let mut cand: Candidates = vec![None; caps.len()];
    // Whether `s` may dominate `r` on one op: (r, its coefficient) against (s, its). An equal
    // ratio counts for the lower index only, so a candidate above `r` stays only if every op
    // of `r` loads it strictly harder.
    let dominates = |(r, cr): (u32, f64), (s, cs): (u32, f64)| {
        let (load_r, load_s) = (cr * caps[s as usize], cs * caps[r as usize]);
        s != r && (load_r < load_s || (load_r == load_s && s < r))
    };
    for op in 0..ops as u32 {
        let (res, coef) = uses.of(op);
        for (&r, &cr) in res.iter().zip(coef) {
            let slot = &mut cand[r as usize];
            match slot {
                None => {
                    *slot = Some(
                        res.iter()
                            .zip(coef)
                            .filter(|&(&s, &cs)| dominates((r, cr), (s, cs)))
                            .map(|(&s, _)| s)
                            .collect(),
                    );
                }
                Some(list) => list.retain(|&s| {
                    res.iter()
                        .zip(coef)
                        .find(|&(&x, _)| x == s)
                        .is_some_and(|(_, &cs)| dominates((r, cr), (s, cs)))
                }),
            }
        }
    }
    let dominated: Vec<bool> = cand
        .iter()
        .map(|c| c.as_ref().is_some_and(|l| !l.is_empty()))
        .collect();
    uses.filtered(ops, |r| !dominated[r as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(u: &Uses, ops: usize) -> Vec<Vec<u32>> {
        (0..ops as u32).map(|f| u.of(f).0.to_vec()).collect()
    }

    #[test]
    fn a_faster_link_behind_a_slower_one_is_left_out() {
        // Both flows cross a 51.5 link (0) and a 50 link (1); the 50 link binds first.
        let u = Uses::from_rows(&[&[(0, 1.0), (1, 1.0)], &[(0, 1.0), (1, 1.0)]]);
        let got = binding_uses(&u, &[51.5, 50.0], 2);
        assert_eq!(rows(&got, 2), vec![vec![1], vec![1]]);
    }

    #[test]
    fn a_link_with_flows_of_its_own_is_kept() {
        // Flow 1 crosses link 0 only: link 1 does not see all of link 0's flows.
        let u = Uses::from_rows(&[&[(0, 1.0), (1, 1.0)], &[(0, 1.0)]]);
        let got = binding_uses(&u, &[51.5, 50.0], 2);
        assert_eq!(rows(&got, 2), vec![vec![0, 1], vec![0]]);
    }

    /// Max-min fair rates with and without the dominated resources agree, through random
    /// arrivals and departures on random sharing problems built to have dominated resources
    /// (each flow crosses a chain of links of random rates, some of them private to a group).
    #[test]
    fn fair_rates_do_not_change() {
        use super::super::fairshare::FairShare;
        use super::super::fairshare::tests::{random_uses, same_rates, xorshift};
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let mut left_out = 0;
        for case in 0..300 {
            let n_res = 2 + next(30) as usize;
            let n_flows = 1 + next(50) as usize;
            // Few distinct capacities, so ties are common.
            let caps: Vec<f64> = (0..n_res)
                .map(|_| [50.0, 51.5, 100.0][next(3) as usize])
                .collect();
            let full = random_uses(&mut next, n_res, n_flows, 2);
            let kept = binding_uses(&full, &caps, n_flows);
            for f in 0..n_flows as u32 {
                assert!(
                    !kept.of(f).0.is_empty(),
                    "case {case}: flow {f} kept nothing"
                );
                left_out += full.of(f).0.len() - kept.of(f).0.len();
            }
            same_rates(
                &format!("case {case}, every resource against the binding ones"),
                &caps,
                (&mut FairShare::new(n_res, n_flows), &full),
                (&mut FairShare::new(n_res, n_flows), &kept),
            );
        }
        // The cases exercise the pruning, not only the identity.
        assert!(left_out > 100, "only {left_out} resources left out");
    }

    #[test]
    fn ties_keep_exactly_one() {
        // Two equal links with the same flows: the lower index stays.
        let u = Uses::from_rows(&[&[(0, 1.0), (1, 1.0)], &[(1, 1.0), (0, 1.0)]]);
        let got = binding_uses(&u, &[50.0, 50.0], 2);
        assert_eq!(rows(&got, 2), vec![vec![0], vec![0]]);
        // A memory read twice per byte (a copy inside it) is tighter than a link at twice
        // its rate with one load: neither dominates strictly, the lower index stays.
        let u = Uses::from_rows(&[&[(0, 2.0), (1, 1.0)]]);
        let got = binding_uses(&u, &[100.0, 50.0], 1);
        assert_eq!(rows(&got, 1), vec![vec![0]]);
    }
}
