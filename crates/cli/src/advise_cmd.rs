//! `relaycc advise`: which free GPUs to give a k-GPU job.

use std::fmt::Write as _;

use anyhow::{Result, bail};
use relaycc_route::{PlanOptions, Planner, RouteError};
use relaycc_topo::Mask;
use serde_json::json;

use crate::args::{AdviseArgs, CollectiveArgs, TableFormat};
use crate::report::{check_relays, perf_json, request};
use crate::topo_cmd::load_topology;

/// Subsets examined at most (C(16, 8) = 12870 would take too long to plan): a search budget.
pub const MAX_SUBSETS: usize = 256;

fn subsets(free: &[u32], k: usize, out: &mut Vec<Vec<u32>>, cur: &mut Vec<u32>, start: usize) {
    if out.len() >= MAX_SUBSETS {
        return;
    }
    if cur.len() == k {
        out.push(cur.clone());
        return;
    }
    for i in start..free.len() {
        cur.push(free[i]);
        subsets(free, k, out, cur, i + 1);
        cur.pop();
    }
}

/// Run `relaycc advise`.
pub fn run(args: &AdviseArgs) -> Result<String> {
    let mut targs = args.topology.clone();
    targs.mask_gpus.extend(args.busy.iter().copied());
    let topo = load_topology(&targs)?;
    let topo = topo.with_mask(Mask {
        busy_gpus: targs.mask_gpus.iter().copied().collect(),
        ..topo.mask().clone()
    })?;
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
    let mut sets = Vec::new();
    subsets(&free, k, &mut sets, &mut Vec::new(), 0);
    let cargs = CollectiveArgs {
        collective: args.collective,
        topology: args.topology.clone(),
        gpus: Vec::new(),
        element: args.element.clone(),
        root: 0,
        relay: args.relay.clone(),
        staging_budget: relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES,
    };
    let planner = Planner::new(topo.clone());
    let opts = PlanOptions {
        relay: args.relay.clone(),
        ..PlanOptions::default()
    };
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
        match planner.plan(&req, &opts) {
            Ok(p) => scored.push((set.clone(), p.predicted, p.baseline)),
            Err(e @ RouteError::NoRoute { .. }) => {
                unroutable.get_or_insert(e);
            }
            Err(e) => return Err(e.into()),
        }
    }
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
