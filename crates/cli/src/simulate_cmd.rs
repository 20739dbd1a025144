//! `relaycc simulate`: nccl-tests-style table of predicted performance over a size range.

use std::fmt::Write as _;

use anyhow::Result;
use relaycc_route::Planner;
use serde_json::json;

use crate::args::{SimulateArgs, TableFormat};
use crate::report::{check_relays, job_gpus, perf_json, ratio, request};
use crate::sizing::size_series;
use crate::topo_cmd::load_topology;

/// One size's figures.
struct Row {
    /// Request size, bytes.
    pub bytes: u64,
    /// Elements per rank.
    pub count: u64,
    /// relaycc's prediction.
    pub predicted: relaycc_route::sim::Perf,
    /// The baseline's.
    pub baseline: relaycc_route::sim::Perf,
    /// The bound.
    pub bound: relaycc_route::sim::Perf,
    /// The chosen algorithm.
    pub algorithm: String,
}

/// Run `relaycc simulate`.
pub fn run(args: &SimulateArgs) -> Result<String> {
    let topo = load_topology(&args.request.topology)?;
    let gpus = job_gpus(&args.request, &topo)?;
    check_relays(&args.request.relay, &topo, &args.request.topology.mask_gpus)?;
    let planner = Planner::new(topo.clone());
    let opts = args.request.plan_options();
    let mut rows = Vec::new();
    let sizes = size_series(args.min_bytes, args.max_bytes, args.step_factor)?;
    let pb = crate::progress::bar(sizes.len() as u64, "simulating sizes");
    for bytes in sizes {
        let req = request(&args.request, &gpus, bytes)?;
        let p = planner.plan(&req, &opts)?;
        pb.inc(1);
        pb.println(format!(
            "{:>12} bytes  {:>10.2} GB/s busbw  baseline {:>10.2}{}  {}",
            req.size_bytes(),
            p.predicted.busbw_gbps,
            p.baseline.busbw_gbps,
            if p.budget_exhausted {
                " (budget exhausted)"
            } else {
                ""
            },
            p.plan.algorithm
        ));
        rows.push(Row {
            bytes: req.size_bytes(),
            count: req.count,
            predicted: p.predicted,
            baseline: p.baseline,
            bound: p.bound,
            algorithm: p.plan.algorithm.clone(),
        });
    }
    pb.finish_and_clear();
    if let Some(path) = &args.svg {
        let points: Vec<crate::plot::BusbwPoint> = rows
            .iter()
            .map(|r| crate::plot::BusbwPoint {
                bytes: r.bytes,
                relaycc: r.predicted.busbw_gbps,
                baseline: r.baseline.busbw_gbps,
                bound: r.bound.busbw_gbps,
            })
            .collect();
        crate::plot::write_svg(
            path,
            &points,
            &format!(
                "{} on {} GPUs {:?} of {}",
                args.request.collective,
                gpus.len(),
                gpus,
                topo.name()
            ),
        )?;
    }
    let c = &args.request;
    let root = if c.collective.rooted() {
        c.root.to_string()
    } else {
        "-1".to_string()
    };
    let redop = if c.collective.reduces() {
        c.element.op.name()
    } else {
        "none"
    };
    Ok(match args.format {
        TableFormat::Json => {
            let results: Vec<_> = rows
                .iter()
                .map(|r| {
                    json!({"size": r.bytes, "count": r.count, "type": c.element.dtype.nccl_name(), "redop": redop, "root": root,
                        "predicted": perf_json(&r.predicted), "baseline": perf_json(&r.baseline), "bound": perf_json(&r.bound),
                        "algorithm": r.algorithm})
                })
                .collect();
            serde_json::to_string_pretty(
                &json!({"topology": topo.name(), "collective": c.collective.name(), "gpus": gpus, "results": results}),
            )? + "\n"
        }
        TableFormat::Table => {
            let mut s = String::new();
            let _ = writeln!(
                s,
                "# relaycc simulate {} on {} GPUs {:?} of {} (relays: {:?}); predictions of the flow simulator",
                c.collective,
                gpus.len(),
                gpus,
                topo.name(),
                c.relay
            );
            let _ = writeln!(s, "#");
            let _ = writeln!(
                s,
                "# {:>12} {:>12} {:>9} {:>6} {:>5} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>8} | {:>7}  algorithm",
                "size",
                "count",
                "type",
                "redop",
                "root",
                "time",
                "algbw",
                "busbw",
                "base time",
                "algbw",
                "busbw",
                "bound",
                "speedup"
            );
            let _ = writeln!(
                s,
                "# {:>12} {:>12} {:>9} {:>6} {:>5} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>8} | {:>7}",
                "(B)",
                "(elements)",
                "",
                "",
                "",
                "(us)",
                "(GB/s)",
                "(GB/s)",
                "(us)",
                "(GB/s)",
                "(GB/s)",
                "busbw",
                "(x)"
            );
            for r in &rows {
                let _ = writeln!(
                    s,
                    "  {:>12} {:>12} {:>9} {:>6} {:>5} | {:>10.2} {:>8.2} {:>8.2} | {:>10.2} {:>8.2} {:>8.2} | {:>8.2} | {:>7.2}  {}",
                    r.bytes,
                    r.count,
                    c.element.dtype.nccl_name(),
                    redop,
                    root,
                    r.predicted.time_us,
                    r.predicted.algbw_gbps,
                    r.predicted.busbw_gbps,
                    r.baseline.time_us,
                    r.baseline.algbw_gbps,
                    r.baseline.busbw_gbps,
                    r.bound.busbw_gbps,
                    ratio(r.predicted.algbw_gbps, r.baseline.algbw_gbps),
                    r.algorithm
                );
            }
            s
        }
    })
}
