//! `relaycc simulate`: nccl-tests-style table of predicted performance over a size range.

use std::fmt::Write as _;

use anyhow::Result;
use relaycc_route::Planner;
use relaycc_topo::Topology;
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

/// Run `relaycc simulate`: plan every size of the series ([`plan_sizes`]), draw them where
/// asked ([`plot`]), and report them as JSON ([`json_report`]) or nccl-tests' table
/// ([`table_report`]).
pub fn run(args: &SimulateArgs) -> Result<String> {
    let topo = load_topology(&args.request.topology)?;
    let gpus = job_gpus(&args.request, &topo)?;
    check_relays(&args.request.relay, &topo, &args.request.topology.mask_gpus)?;
    let rows = plan_sizes(args, &topo, &gpus)?;
    if let Some(path) = &args.svg {
        plot(path, args, &topo, &gpus, &rows)?;
    }
    let columns = Columns::of(args);
    Ok(match args.format {
        TableFormat::Json => json_report(args, &topo, &gpus, &columns, &rows)?,
        TableFormat::Table => table_report(args, &topo, &gpus, &columns, &rows),
    })
}

/// Plan the request at every size of the series on one [`Planner`] (which caches shapes),
/// each size's line printed beside the progress bar as it is planned.
fn plan_sizes(args: &SimulateArgs, topo: &Topology, gpus: &[u32]) -> Result<Vec<Row>> {
    let planner = Planner::new(topo.clone());
    let opts = args.request.plan_options();
    let mut rows = Vec::new();
    let sizes = size_series(args.min_bytes, args.max_bytes, args.step_factor)?;
    let pb = crate::progress::bar(sizes.len() as u64, "simulating sizes");
    for bytes in sizes {
        let req = request(&args.request, gpus, bytes)?;
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
    Ok(rows)
}

/// The rows' busbw, relaycc's beside the baseline's and the bound, as an SVG plot at `path`.
fn plot(
    path: &std::path::Path,
    args: &SimulateArgs,
    topo: &Topology,
    gpus: &[u32],
    rows: &[Row],
) -> Result<()> {
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
    )
}

/// The columns every row shares, in nccl-tests' words: the root (`-1` where the collective
/// has none) and the reduction (`none` where it reduces nothing).
struct Columns {
    root: String,
    redop: &'static str,
}

impl Columns {
    fn of(args: &SimulateArgs) -> Self {
        let c = &args.request;
        Columns {
            root: if c.collective.rooted() {
                c.root.to_string()
            } else {
                "-1".to_string()
            },
            redop: if c.collective.reduces() {
                c.element.op.name()
            } else {
                "none"
            },
        }
    }
}

/// The rows as JSON: the request, then one result per size.
fn json_report(
    args: &SimulateArgs,
    topo: &Topology,
    gpus: &[u32],
    columns: &Columns,
    rows: &[Row],
) -> Result<String> {
    let c = &args.request;
    let (root, redop) = (&columns.root, columns.redop);
    let results: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({"size": r.bytes, "count": r.count, "type": c.element.dtype.nccl_name(), "redop": redop, "root": root,
                "predicted": perf_json(&r.predicted), "baseline": perf_json(&r.baseline), "bound": perf_json(&r.bound),
                "algorithm": r.algorithm})
        })
        .collect();
    Ok(serde_json::to_string_pretty(
        &json!({"topology": topo.name(), "collective": c.collective.name(), "gpus": gpus, "results": results}),
    )? + "\n")
}

/// The rows as nccl-tests' table: a header naming the request and the columns, then one line
/// per size, relaycc's figures beside the baseline's and the bound.
fn table_report(
    args: &SimulateArgs,
    topo: &Topology,
    gpus: &[u32],
    columns: &Columns,
    rows: &[Row],
) -> String {
    let c = &args.request;
    let (root, redop) = (&columns.root, columns.redop);
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
    for r in rows {
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
