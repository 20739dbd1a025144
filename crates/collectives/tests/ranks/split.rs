//! Split: sub-communicators used in alternation, and what children keep of their parent.

use super::*;

/// Two overlapping sub-communicators of six ranks (even ranks, and ranks 0..4 ordered by a
/// reversed key), used in alternation, give the right sums; a rank with no color opts out.
#[test]
fn split_into_overlapping_groups_used_in_alternation() {
    let ranks = RankComm::host(6).expect("host ranks");
    let res = on_ranks(
        ranks,
        |mut rank| -> Result<Vec<(u64, usize, usize)>, CollectivesError> {
            let r = rank.rank();
            let mut even = rank.split((r % 2 == 0).then_some(0), 0)?;
            let mut low = rank.split((r < 4).then_some(7), -(r as i64))?;
            let mut out = Vec::new();
            for round in 0..4u64 {
                if let Some(e) = even.as_mut() {
                    let mut a = [r as u64 + round; 8];
                    e.all_reduce_in_place(&mut a, ReduceOp::Sum)?;
                    out.push((a[0], e.rank(), e.ranks()));
                }
                if let Some(l) = low.as_mut() {
                    let mut b = [10 * r as u64 + round; 8];
                    l.all_reduce_in_place(&mut b, ReduceOp::Sum)?;
                    out.push((b[0], l.rank(), l.ranks()));
                }
            }
            Ok(out)
        },
    );
    for (r, got) in res.into_iter().enumerate() {
        let got = got.expect("split rank");
        let mut want = Vec::new();
        for round in 0..4u64 {
            if r % 2 == 0 {
                want.push(([0u64, 2, 4].iter().map(|s| s + round).sum(), r / 2, 3));
            }
            if r < 4 {
                // Keys -r: rank 3 first.
                want.push(((0..4u64).map(|s| 10 * s + round).sum(), 3 - r, 4));
            }
        }
        assert_eq!(got, want, "rank {r}");
    }
}

/// A split's communicators plan within the parent's staging budget and keep its plan-cache
/// limits.
#[test]
fn split_children_keep_the_parents_budget_and_cache_limits() {
    let mut parent = relaycc_collectives::Communicator::host(4).expect("host communicator");
    let budget = 3 << 20;
    parent.set_staging_budget(budget);
    let limits = relaycc_collectives::PlanCacheLimits {
        max_plans: 5,
        max_scratch_bytes: 7 << 20,
    };
    parent.set_plan_cache_limits(limits);
    let res = on_ranks(parent.into_ranks(), |mut rank| {
        let r = rank.rank();
        let child = rank
            .split(Some(u32::from(r < 2)), 0)
            .expect("split")
            .expect("every rank has a color");
        let c = child.communicator();
        (c.ranks(), c.staging_budget(), c.plan_cache_limits())
    });
    for got in res {
        assert_eq!(got, (2, budget, limits));
    }
}
