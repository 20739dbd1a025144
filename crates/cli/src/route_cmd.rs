//! `relaycc route`: plan a point-to-point copy.

use std::fmt::Write as _;

use anyhow::Result;
use relaycc_route::{Request, plan};
use serde_json::json;

use crate::args::{RouteArgs, RouteFormat};
use crate::report::{
    PREDICTION_NOTE, check_relays, hop_kind, perf_json, ratio, route_text, staging_bytes,
    staging_text,
};
use crate::size::format_size;
use crate::topo_cmd::load_topology;

/// Run `relaycc route`.
pub fn run(args: &RouteArgs) -> Result<String> {
    let topo = load_topology(&args.topology)?;
    check_relays(&args.relay, &topo, &args.topology.mask_gpus)?;
    let req = Request::point_to_point(args.from, args.to, args.size);
    let opts = args.plan_options();
    let p = plan(&topo, &req, &opts)?;
    let paths: Vec<serde_json::Value> = p
        .routes
        .iter()
        .map(|r| {
            json!({
                "hops": r.route.names(&topo),
                "hop_kinds": r.route.hops.iter().map(|h| hop_kind(&topo, h)).collect::<Vec<_>>(),
                "share": ratio(r.elements as f64, args.size as f64),
                "bytes": r.elements,
                "gbps": r.route.gbps(),
                "edges": r.route.hops.iter().map(|h| h.edges.clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let staging = staging_bytes(&topo, &p.plan);
    Ok(match args.format {
        RouteFormat::Json => {
            let doc = json!({
                "topology": topo.name(),
                "from": args.from, "to": args.to, "bytes": args.size,
                "algorithm": p.plan.algorithm,
                "staging_bytes": crate::report::staging_json(&staging),
                "staging_budget_bytes": (opts.staging_budget != relaycc_route::staging::UNBOUNDED_STAGING)
                    .then_some(opts.staging_budget),
                "predicted": perf_json(&p.predicted),
                "baseline": perf_json(&p.baseline),
                "baseline_algorithm": p.baseline_plan.algorithm,
                "bound": perf_json(&p.bound),
                "paths": paths,
                "candidates": p.candidates,
                "budget_exhausted": p.budget_exhausted,
            });
            serde_json::to_string_pretty(&doc)? + "\n"
        }
        RouteFormat::Dot => route_dot(&topo, &p),
        RouteFormat::Table => {
            let mut s = String::new();
            let _ = writeln!(
                s,
                "route GPU{} -> GPU{}, {} on {} (relays: {:?})",
                args.from,
                args.to,
                format_size(args.size),
                topo.name(),
                args.relay
            );
            let _ = writeln!(s, "chosen: {}", p.plan.algorithm);
            let _ = writeln!(
                s,
                "staging: {} (budget {})",
                staging_text(&staging),
                crate::report::budget_text(opts.staging_budget)
            );
            let _ = writeln!(s, "{PREDICTION_NOTE}");
            if p.budget_exhausted {
                let _ = writeln!(
                    s,
                    "the planning budget was spent (planning took {:.2} s, its relay search \
                     and simulations stopped ahead of the budget to answer within it): the \
                     best route of the candidates simulated so far",
                    p.elapsed.as_secs_f64()
                );
            }
            let _ = writeln!(s);
            let texts: Vec<String> = p
                .routes
                .iter()
                .map(|r| route_text(&topo, &r.route))
                .collect();
            // The path column is as wide as the longest path, so long relay chains stay aligned.
            const HEADER: &str = "path (link kind per hop)";
            let width = texts.iter().map(String::len).fold(HEADER.len(), usize::max);
            let _ = writeln!(s, "  {HEADER:<width$} {:>7} {:>9}", "share", "GB/s");
            if p.routes.is_empty() {
                let _ = writeln!(
                    s,
                    "  (the baseline's own route: {})",
                    p.baseline_plan.algorithm
                );
            }
            for (r, text) in p.routes.iter().zip(&texts) {
                let _ = writeln!(
                    s,
                    "  {:<width$} {:>6.1}% {:>9.1}",
                    text,
                    100.0 * ratio(r.elements as f64, args.size as f64),
                    r.route.gbps()
                );
            }
            let _ = writeln!(
                s,
                "\n  {:<10} {:>12} {:>12} {:>10}  algorithm",
                "predicted", "time(us)", "algbw(GB/s)", "vs base"
            );
            let _ = writeln!(
                s,
                "  {:<10} {:>12.2} {:>12.2} {:>9.2}x  {}",
                "relaycc",
                p.predicted.time_us,
                p.predicted.algbw_gbps,
                ratio(p.predicted.algbw_gbps, p.baseline.algbw_gbps),
                p.plan.algorithm
            );
            let _ = writeln!(
                s,
                "  {:<10} {:>12.2} {:>12.2} {:>9.2}x  {}",
                "baseline",
                p.baseline.time_us,
                p.baseline.algbw_gbps,
                1.0,
                p.baseline_plan.algorithm
            );
            let _ = writeln!(
                s,
                "  {:<10} {:>12.2} {:>12.2} {:>9.2}x  max-flow over allowed GPUs",
                "bound",
                p.bound.time_us,
                p.bound.algbw_gbps,
                ratio(p.bound.algbw_gbps, p.baseline.algbw_gbps)
            );
            let _ = writeln!(
                s,
                "\n  relaycc reaches {:.1}% of the bound",
                100.0 * ratio(p.predicted.algbw_gbps, p.bound.algbw_gbps)
            );
            s
        }
    })
}

/// The topology's DOT with the chosen routes drawn over it in red, labelled with their shares.
fn route_dot(topo: &relaycc_topo::Topology, p: &relaycc_route::Planned) -> String {
    let base = relaycc_topo::export::to_dot(topo);
    let body = base.trim_end().trim_end_matches('}');
    let mut s = body.to_string();
    let total: u64 = p.routes.iter().map(|r| r.elements).sum::<u64>().max(1);
    for (i, r) in p.routes.iter().enumerate() {
        let share = 100.0 * r.elements as f64 / total as f64;
        for h in &r.route.hops {
            for e in &h.edges {
                let (a, b) = topo.link_ends(relaycc_topo::LinkId::new(*e as usize));
                let _ = writeln!(
                    s,
                    "  n{} -- n{} [color=\"#d32f2f\", penwidth=3, dir=forward, constraint=false, label=\"path {} {:.0}%\", fontcolor=\"#d32f2f\"];",
                    a.index(),
                    b.index(),
                    i,
                    share
                );
            }
        }
    }
    s.push_str("}\n");
    s
}
