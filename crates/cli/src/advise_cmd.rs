//! `relaycc advise`: which free GPUs to give a k-GPU job.

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{Result, bail};
use relaycc_route::{Planner, RouteError};
use relaycc_topo::{Mask, PathClass, Topology};
use serde_json::json;

use crate::args::{AdviseArgs, CollectiveArgs, TableFormat};
use crate::report::{check_relays, perf_json, request};
use crate::topo_cmd::load_topology;

/// Placements examined at most: a search bound beside the time budget.
pub const MAX_SUBSETS: usize = 256;

/// How well two GPUs connect, higher better: NVLink by lanes, then PCIe classes, then the
/// inter-socket link, then another node.
fn affinity(topo: &Topology, a: u32, b: u32) -> u32 {
    let (Ok(x), Ok(y)) = (topo.gpu(a), topo.gpu(b)) else {
        return 0;
    };
    if topo.node(x).host != topo.node(y).host {
        return 1;
    }
    match topo.classify(x, y) {
        PathClass::SameDevice => 0,
        PathClass::NvLink(lanes) => 100 + lanes,
        PathClass::Pix => 50,
        PathClass::Pxb => 40,
        PathClass::Phb => 30,
        PathClass::Node => 20,
        PathClass::Sys => 10,
    }
}

/// What makes two placements alike for planning, as far as cheap facts tell: the sorted
/// pairwise connection classes and how many GPUs each node holds. Placements with one
/// signature are mirror images on the machines relaycc models (DGX boards, like nodes), so
/// one of each is planned.
fn signature(topo: &Topology, set: &[u32]) -> (Vec<u32>, Vec<usize>) {
    let mut pairs = Vec::with_capacity(set.len() * set.len() / 2);
    for (i, &a) in set.iter().enumerate() {
        for &b in &set[i + 1..] {
            pairs.push(affinity(topo, a, b));
        }
    }
    pairs.sort_unstable();
    let mut hosts: Vec<u32> = set
        .iter()
        .filter_map(|&g| topo.gpu(g).ok().map(|id| topo.node(id).host))
        .collect();
    hosts.sort_unstable();
    let mut per_host: Vec<usize> = hosts.chunk_by(|a, b| a == b).map(<[u32]>::len).collect();
    per_host.sort_unstable();
    (pairs, per_host)
}

/// Share of the budget the search for placements may take before planning them: a quarter,
/// so that the placements found are planned within the rest.
const SEARCH_SHARE: u32 = 4;

/// The placement grown greedily from `seed`: each step adds the free GPU best connected to
/// those already chosen (sum of [`affinity`]), the lowest index on ties. Each GPU's sum is
/// kept and raised by the GPU just chosen, so a placement of `k` of `f` free GPUs costs
/// O(k f) affinities; `None` once `until` passes.
fn grow(topo: &Topology, free: &[u32], k: usize, seed: u32, until: Instant) -> Option<Vec<u32>> {
    let mut member = vec![false; free.len()];
    let mut score = vec![0u32; free.len()];
    let mut set = Vec::with_capacity(k);
    let mut next = free.iter().position(|&g| g == seed);
    while let Some(i) = next {
        member[i] = true;
        set.push(free[i]);
        for (j, s) in score.iter_mut().enumerate() {
            if !member[j] {
                *s += affinity(topo, free[j], free[i]);
            }
        }
        if set.len() >= k {
            break;
        }
        if Instant::now() >= until {
            return None;
        }
        // The best sum; on ties the first (lowest index: `free` is sorted).
        next = (0..free.len())
            .filter(|&j| !member[j])
            .fold(None, |best: Option<usize>, j| match best {
                Some(b) if score[b] >= score[j] => Some(b),
                _ => Some(j),
            });
    }
    if set.is_empty() {
        return None;
    }
    set.sort_unstable();
    Some(set)
}

/// Placements to plan, most promising first, at most [`MAX_SUBSETS`], one per
/// [`signature`]: the lowest-index placement (the naive pick, always first, as the reference;
/// the only one when every free GPU is needed), then one grown greedily from every free GPU,
/// then the rest in lexicographic order, as long as `until` allows.
fn placements(topo: &Topology, free: &[u32], k: usize, until: Instant) -> Vec<Vec<u32>> {
    let naive = free[..k].to_vec();
    if k == free.len() {
        return vec![naive];
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut offer = |set: Vec<u32>, out: &mut Vec<Vec<u32>>| {
        if out.len() < MAX_SUBSETS && set.len() == k && seen.insert(signature(topo, &set)) {
            out.push(set);
        }
    };
    offer(naive, &mut out);
    for &seed in free {
        match grow(topo, free, k, seed, until) {
            Some(set) => offer(set, &mut out),
            None => return out,
        }
    }
    // Lexicographic combinations, stopping once the bound is reached.
    let mut idx: Vec<usize> = (0..k).collect();
    let mut examined = 0usize;
    loop {
        offer(idx.iter().map(|&i| free[i]).collect(), &mut out);
        examined += 1;
        // Signatures repeat heavily on symmetric machines: bound the enumeration itself too.
        if out.len() >= MAX_SUBSETS || examined >= 64 * MAX_SUBSETS || Instant::now() >= until {
            break;
        }
        let Some(i) = (0..k).rev().find(|&i| idx[i] < free.len() - k + i) else {
            break;
        };
        idx[i] += 1;
        for j in i + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
    out
}

/// How far past its budget a planning call may return (`relaycc plan` returns within 1.5
/// times it).
const PLAN_OVERRUN: f64 = 1.5;

/// Run `relaycc advise`.
pub fn run(args: &AdviseArgs) -> Result<String> {
    let mut targs = args.topology.clone();
    targs.mask_gpus.extend(args.busy.iter().copied());
    // One copy of the topology lives at a time (a 1,024-rack GB200 cluster's is hundreds of
    // megabytes): the unmasked one goes once masked, and the planner takes the masked one.
    let topo = {
        let loaded = load_topology(&targs)?;
        loaded.with_mask(Mask {
            busy_gpus: targs.mask_gpus.iter().copied().collect(),
            ..loaded.mask().clone()
        })?
    };
    let free: Vec<u32> = (0..topo.gpu_count())
        .filter(|g| topo.gpu_free(*g))
        .collect();
    check_relays(&args.relay, &topo, &targs.mask_gpus)?;
    let k = args.count as usize;
    if k == 0 || k > free.len() {
        bail!(
            "--count {k}: cannot place {k} GPUs: {} are free ({free:?})",
            free.len()
        );
    }
    // The budget counts from the command's start: reading the topology takes from it.
    let start = crate::args::command_start();
    let search_until = start
        .checked_add(args.budget.budget / SEARCH_SHARE)
        .unwrap_or(start);
    let sets = placements(&topo, &free, k, search_until);
    let cargs = CollectiveArgs {
        collective: args.collective,
        topology: args.topology.clone(),
        gpus: Vec::new(),
        element: args.element.clone(),
        root: 0,
        relay: args.relay.clone(),
        budget: args.budget.clone(),
        staging_budget: relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES,
        issue_us: 0.0,
    };
    let planner = Planner::new(topo);
    let topo = planner.topology();
    // The budget is set per placement, from what the search left.
    let mut opts = cargs.plan_options();
    let mut budget_exhausted = false;
    let pb = crate::progress::bar(sets.len() as u64, "planning placements");
    let mut scored = Vec::new();
    // A placement the masked machine cannot connect is not advice; it is skipped, and its
    // error is reported only when no placement can be planned.
    let mut unroutable = None;
    for set in &sets {
        let req = if k == 1 {
            continue;
        } else {
            request(&cargs, set, args.size)?
        };
        // The first placement (the naive pick, the reference) is always planned.
        let left = args.budget.budget.saturating_sub(start.elapsed());
        if !scored.is_empty() && left.is_zero() {
            budget_exhausted = true;
            break;
        }
        // A planning call returns within 1.5 times its budget (its baseline's build and
        // the last simulations run past it): given the time left over that, the last
        // placement's call still ends within the command's budget.
        opts.budget = left.div_f64(PLAN_OVERRUN);
        pb.inc(1);
        match planner.plan(&req, &opts) {
            Ok(p) => {
                budget_exhausted |= p.budget_exhausted;
                pb.println(format!(
                    "  {:<20} {:>14.2} {:>14.2}",
                    format!("{set:?}"),
                    p.predicted.busbw_gbps,
                    p.baseline.busbw_gbps
                ));
                scored.push((set.clone(), p.predicted, p.baseline));
            }
            Err(e @ RouteError::NoRoute { .. }) => {
                unroutable.get_or_insert(e);
            }
            Err(e) => return Err(e.into()),
        }
    }
    pb.finish_and_clear();
    if let (true, Some(e)) = (scored.is_empty(), unroutable) {
        bail!("no placement of {k} free GPUs can be planned: {e}");
    }
    if scored.is_empty() {
        bail!("a 1-GPU job needs no communication; any free GPU will do: {free:?}");
    }
    let naive = scored[0].clone();
    scored.sort_by(|a, b| b.1.busbw_gbps.total_cmp(&a.1.busbw_gbps));
    Ok(match args.format {
        TableFormat::Json => {
            let best: Vec<_> = scored.iter().take(8).map(|(s, p, b)| json!({"gpus": s, "predicted": perf_json(p), "baseline": perf_json(b)})).collect();
            serde_json::to_string_pretty(
                &json!({"topology": topo.name(), "free": free, "best": best,
                "examined": scored.len(), "budget_exhausted": budget_exhausted,
                "naive": {"gpus": naive.0, "predicted": perf_json(&naive.1), "baseline": perf_json(&naive.2)}}),
            )? + "\n"
        }
        TableFormat::Table => {
            let mut s = String::new();
            let _ = writeln!(
                s,
                "{} GPUs for {} of {} bytes on {} (free: {:?}; {} placements examined; predicted figures)",
                k,
                args.collective,
                args.size,
                topo.name(),
                free,
                scored.len()
            );
            if budget_exhausted {
                let _ = writeln!(
                    s,
                    "budget exhausted after {:?}: advice among the placements planned so far",
                    args.budget.budget
                );
            }
            let _ = writeln!(
                s,
                "\n  {:<20} {:>14} {:>14}",
                "gpus", "busbw relaycc", "busbw baseline"
            );
            for (set, p, b) in scored.iter().take(5) {
                let _ = writeln!(
                    s,
                    "  {:<20} {:>14.2} {:>14.2}",
                    format!("{set:?}"),
                    p.busbw_gbps,
                    b.busbw_gbps
                );
            }
            let best = &scored[0];
            let _ = writeln!(
                s,
                "\n  advice: {:?}, {:.2} GB/s busbw predicted ({:.2}x the naive lowest-index pick {:?} at {:.2} GB/s)",
                best.0,
                best.1.busbw_gbps,
                crate::report::ratio(best.1.busbw_gbps, naive.1.busbw_gbps),
                naive.0,
                naive.1.busbw_gbps
            );
            s
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The greedy growth as first written: every step sums each free GPU's affinity to the
    /// whole placement again.
    fn grow_by_sums(topo: &Topology, free: &[u32], k: usize, seed: u32) -> Vec<u32> {
        let mut set = vec![seed];
        while set.len() < k {
            let next = free
                .iter()
                .filter(|g| !set.contains(g))
                .map(|&g| (set.iter().map(|&m| affinity(topo, g, m)).sum::<u32>(), g))
                .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            match next {
                Some((_, g)) => set.push(g),
                None => break,
            }
        }
        set.sort_unstable();
        set
    }

    /// Keeping each GPU's sum and raising it by the GPU just chosen grows the same placements
    /// as summing again every step, on boards and on a cluster, with GPUs busy.
    #[test]
    fn kept_sums_grow_the_placements_full_sums_do() {
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        for preset in ["dgx1-v100", "pcie-8gpu", "cluster:2xdgx-h100:ib-ndr"] {
            let topo = relaycc_topo::preset(preset).unwrap();
            let all: Vec<u32> = (0..topo.gpu_count()).collect();
            let free: Vec<u32> = all.iter().copied().filter(|g| g % 5 != 2).collect();
            for k in [1, 2, 3, free.len() / 2, free.len()] {
                for &seed in &free {
                    assert_eq!(
                        grow(&topo, &free, k, seed, far),
                        Some(grow_by_sums(&topo, &free, k, seed)),
                        "{preset} k {k} seed {seed}"
                    );
                }
            }
        }
    }

    /// A search past its time offers the naive placement alone.
    #[test]
    fn a_spent_search_keeps_the_naive_placement() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let free: Vec<u32> = (0..8).collect();
        let sets = placements(&topo, &free, 3, Instant::now());
        assert_eq!(sets, vec![vec![0, 1, 2]]);
    }
}
