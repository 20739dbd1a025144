//! `relaycc plan`: plan one collective.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use relaycc_route::{Planned, plan, sim};
use serde_json::json;

use crate::args::{PlanArgs, TableFormat};
use crate::report::{
    PREDICTION_NOTE, check_relays, job_gpus, perf_json, ratio, request, staging_bytes, staging_text,
};
use crate::size::format_size;
use crate::topo_cmd::load_topology;

/// Run `relaycc plan`: plan the request, write the files asked for ([`write_files`]), verify
/// the plan where asked ([`verify`]), and report it as JSON ([`PlanReport::json`]) or a table
/// ([`PlanReport::table`]).
pub fn run(args: &PlanArgs) -> Result<String> {
    let topo = load_topology(&args.request.topology)?;
    let gpus = job_gpus(&args.request, &topo)?;
    check_relays(&args.request.relay, &topo, &args.request.topology.mask_gpus)?;
    let req = request(&args.request, &gpus, args.size)?;
    let opts = args.request.plan_options();
    let spin = crate::progress::spinner(format!(
        "planning {} on {} GPUs of {}",
        req.collective,
        gpus.len(),
        topo.name()
    ));
    let p = plan(&topo, &req, &opts);
    spin.finish_and_clear();
    let p = p?;
    write_files(args, &topo, &opts, &p)?;
    let staging = staging_bytes(&topo, &p.plan);
    let verified = if args.verify {
        Some(verify(&topo, &p.plan)?)
    } else {
        None
    };
    let report = PlanReport {
        args,
        topo: &topo,
        gpus: &gpus,
        req: &req,
        opts: &opts,
        planned: &p,
        staging,
        verified,
    };
    let out = match args.format {
        TableFormat::Json => report.json()?,
        TableFormat::Table => report.table(),
    };
    drop(report);
    // The process ends once this is printed, and freeing the plans op by op (millions of
    // vectors for NCCL's tree over 512 ranks) would hold the answer back by a second.
    std::mem::forget(p);
    Ok(out)
}

/// Write what `--save` (the plan's JSON) and `--trace` (a Chrome trace of its simulation)
/// ask for.
fn write_files(
    args: &PlanArgs,
    topo: &relaycc_topo::Topology,
    opts: &relaycc_route::PlanOptions,
    p: &Planned,
) -> Result<()> {
    if let Some(path) = &args.save {
        std::fs::write(path, p.plan.to_json() + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.trace {
        // A plan of rounds holds no op of its own: its trace is one round's; a step-sampled
        // plan's is its long sample's (its first steps).
        let traced = match (&p.plan.rounds, &p.plan.step_samples) {
            (Some(r), _) => &r.body,
            (None, Some(s)) => &s.long,
            (None, None) => &p.plan,
        };
        let result = sim::simulate(topo, traced, &opts.sim)?;
        std::fs::write(path, sim::chrome_trace(topo, traced, &result))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// What `relaycc plan` reports: the request, the planned result, its staging per device and
/// what `--verify` found.
struct PlanReport<'a> {
    args: &'a PlanArgs,
    topo: &'a relaycc_topo::Topology,
    gpus: &'a [u32],
    req: &'a relaycc_route::Request,
    opts: &'a relaycc_route::PlanOptions,
    planned: &'a Planned,
    /// Staging bytes per device, by name.
    staging: Vec<(String, u64)>,
    verified: Option<serde_json::Value>,
}

impl PlanReport<'_> {
    /// The report as one JSON document.
    fn json(&self) -> Result<String> {
        let (topo, req, opts, p) = (self.topo, self.req, self.opts, self.planned);
        let doc = json!({
            "topology": topo.name(),
            "collective": req.collective.name(),
            "gpus": self.gpus,
            "bytes": req.size_bytes(),
            "count": req.count,
            "dtype": req.dtype.name(),
            "op": req.op.name(),
            "root": req.root,
            "algorithm": p.plan.algorithm,
            "ops": p.plan.stored_ops(),
            "full_ops": p.plan.full_ops(),
            "rounds": p.plan.rounds.as_ref().map(|r| r.count),
            "step_samples": p.plan.step_samples.as_ref().map(|s| json!({
                "what": s.what,
                "full": s.full,
                "short_kept": s.short_kept,
                "long_kept": s.long_kept,
            })),
            "lanes": p.plan.lanes.len() + p.plan.rounds.as_ref().map_or(0, |r| {
                r.body.lanes.len() + r.tail.as_ref().map_or(0, |t| t.lanes.len())
            }),
            "scratch_bytes": p.plan.scratch_bytes(),
            "staging_bytes": crate::report::staging_json(&self.staging),
            "staging_budget_bytes": (opts.staging_budget != relaycc_route::staging::UNBOUNDED_STAGING)
                .then_some(opts.staging_budget),
            "predicted": perf_json(&p.predicted),
            "baseline": perf_json(&p.baseline),
            "baseline_algorithm": p.baseline_plan.algorithm,
            "bound": perf_json(&p.bound),
            "candidates": p.candidates,
            "budget_exhausted": p.budget_exhausted,
            "baseline_cut": p.baseline_cut.map(|c| json!({
                "reached_us": c.reached_us,
                "ops_done": c.ops_done,
                "ops": c.ops,
            })),
            "planning_s": p.elapsed.as_secs_f64(),
            "skipped": p.skipped,
            "verified": self.verified,
        });
        Ok(serde_json::to_string_pretty(&doc)? + "\n")
    }

    /// The report as text: what was planned and chosen ([`PlanReport::table_header`]), then
    /// the figures and the candidates ([`PlanReport::table_figures`]).
    fn table(&self) -> String {
        let mut s = String::new();
        self.table_header(&mut s);
        self.table_figures(&mut s);
        s
    }

    /// Whether the baseline is the plan because nothing was shown faster than the lower
    /// bound its cut simulation gave.
    fn baseline_chosen_cut(&self) -> bool {
        let p = self.planned;
        p.baseline_cut.is_some() && p.plan.algorithm == p.baseline_plan.algorithm
    }

    /// The request, the chosen plan and its staging, and the notes on the budget, the
    /// baseline's cut, what was skipped and what `--verify` found.
    fn table_header(&self, s: &mut String) {
        let (req, opts, p) = (self.req, self.opts, self.planned);
        let _ = writeln!(
            s,
            "{} of {} {} on {} GPUs {:?} of {} (relays: {:?})",
            req.collective,
            format_size(req.size_bytes()),
            req.dtype,
            self.gpus.len(),
            self.gpus,
            self.topo.name(),
            self.args.request.relay
        );
        let _ = writeln!(
            s,
            "chosen: {} ({})",
            p.plan.algorithm,
            crate::report::plan_shape(&p.plan)
        );
        let templated = p.plan.is_template()
            || p.plan.rounds.as_ref().is_some_and(|r| r.body.is_template())
            || p.plan
                .step_samples
                .as_ref()
                .is_some_and(|s| s.long.is_template());
        let _ = writeln!(
            s,
            "staging: {}{} in all: {} (budget {})",
            format_size(p.plan.scratch_bytes()),
            if templated {
                " per period of hosts"
            } else {
                ""
            },
            staging_text(&self.staging),
            crate::report::budget_text(opts.staging_budget)
        );
        let _ = writeln!(s, "{PREDICTION_NOTE}");
        if p.budget_exhausted {
            let _ = writeln!(
                s,
                "budget of {:?} spent (planning took {:.2} s, its builds stopped ahead of the \
                 budget to answer within it): the best plan of the candidates simulated so far",
                opts.budget,
                p.elapsed.as_secs_f64()
            );
        }
        if let Some(cut) = &p.baseline_cut {
            // The baseline is the plan when nothing was shown faster than its lower bound.
            let chosen = if self.baseline_chosen_cut() {
                "; no plan of relaycc's was shown faster within the budget, so the baseline is \
                 the plan, predicted by that bound"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "baseline: its simulation was cut by the budget after {} of {} ops, at {:.2} \
                 us simulated: its time is at least {:.2} us (busbw at most {:.2} GB/s){chosen}",
                cut.ops_done, cut.ops, cut.reached_us, p.baseline.time_us, p.baseline.busbw_gbps
            );
        }
        for why in &p.skipped {
            let _ = writeln!(s, "skipped: {why}");
        }
        if let Some(v) = &self.verified {
            let _ = writeln!(s, "verified: {}", v["summary"].as_str().unwrap_or_default());
        }
    }

    /// relaycc's prediction beside the baseline's and the bound, the baseline's algorithm,
    /// and the fastest candidates.
    fn table_figures(&self, s: &mut String) {
        let p = self.planned;
        let _ = writeln!(
            s,
            "\n  {:<10} {:>12} {:>12} {:>12} {:>9}",
            "predicted", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "vs base"
        );
        // A baseline cut by the budget is known from below: its row says so.
        let mark = |on: bool| if on { ">=" } else { "" };
        for (name, perf, mark) in [
            ("relaycc", &p.predicted, mark(self.baseline_chosen_cut())),
            ("baseline", &p.baseline, mark(p.baseline_cut.is_some())),
            ("bound", &p.bound, ""),
        ] {
            let name = format!("{name}{mark}");
            let _ = writeln!(
                s,
                "  {:<10} {:>12.2} {:>12.2} {:>12.2} {:>8.2}x",
                name,
                perf.time_us,
                perf.algbw_gbps,
                perf.busbw_gbps,
                ratio(perf.busbw_gbps, p.baseline.busbw_gbps)
            );
        }
        let _ = writeln!(s, "\n  baseline: {}", p.baseline_plan.algorithm);
        let _ = writeln!(s, "\n  candidates (fastest predicted first):");
        for c in p.candidates.iter().take(12) {
            let _ = writeln!(s, "    {:>12.2} us  {}", c.time_us, c.algorithm);
        }
    }
}

/// Host memory `--verify` gives the run of the sampled ranks' cone; above it the run is left
/// out and the output says so (plan at a smaller `--size` to run it).
const HOST_RUN_MAX_BYTES: u64 = 4 << 30;

/// Ops `--verify` lets the sampled ranks' cone hold.
const HOST_RUN_MAX_OPS: usize = 4_000_000;

/// What `--verify` checked: a full plan of up to 64 ranks is proved by the checker before
/// `plan` returns it; a template, or a larger plan built in full, has its sampled output
/// elements executed over its lazily expanded plan
/// ([`relaycc_route::template::check_sampled`]) and the op cone of the sampled ranks run on
/// the host by the executor ([`relaycc_collectives::exec::sampled_cone::execute_cone`]).
///
/// A plan of rounds is verified through its body and its tail, each as above; the checker's
/// argument for the rounds ([`relaycc_route::rounds`]) rests on theirs. A step-sampled plan
/// (the baseline, where relaycc has no plan) delivers nothing and is not verified.
fn verify(topo: &relaycc_topo::Topology, plan: &relaycc_route::Plan) -> Result<serde_json::Value> {
    if let Some(r) = &plan.rounds {
        let body = verify(topo, &r.body)?;
        let tail = r.tail.as_ref().map(|t| verify(topo, t)).transpose()?;
        let summary = format!(
            "each of its {} rounds: {}{}",
            r.count,
            body["summary"].as_str().unwrap_or_default(),
            tail.as_ref().map_or(String::new(), |t| format!(
                "; its tail: {}",
                t["summary"].as_str().unwrap_or_default()
            ))
        );
        return Ok(json!({ "summary": summary, "method": "rounds", "body": body, "tail": tail }));
    }
    if let Some(s) = &plan.step_samples {
        let summary = format!(
            "not verified: step-sampled, it is timed from builds of {} and {} of its {} {}, \
             which deliver nothing",
            s.short_kept, s.long_kept, s.full, s.what
        );
        return Ok(json!({ "summary": summary, "method": "none" }));
    }
    const PROVED: &str = "proved by the checker (every output element, every order)";
    let proved = relaycc_route::proved_by_checker(plan);
    if proved && plan.request.gpus.len() <= relaycc_route::EXPAND_MAX_RANKS {
        return Ok(json!({ "summary": PROVED, "method": "check" }));
    }
    let opts = relaycc_route::template::SampleOptions::default();
    let start = std::time::Instant::now();
    let r = relaycc_route::template::check_sampled(plan, topo, &opts)
        .with_context(|| format!("sampled execution of {}", plan.algorithm))?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let mut ranks: Vec<u32> = r.targets.iter().map(|x| x.0).collect();
    ranks.dedup();
    let host = host_run(topo, plan, &ranks)?;
    let sampled = format!(
        "{} sampled output elements of ranks {:?} hold their reference values (cones of {} of \
         {} ops, {:.0} ms); {}",
        r.targets.len(),
        ranks,
        r.cone_ops,
        r.full_ops,
        ms,
        host["summary"].as_str().unwrap_or("")
    );
    let summary = match &plan.template {
        _ if proved => format!("{PROVED}; and {sampled}"),
        Some(t) => format!(
            "{sampled}; the template's structure and routes are checked, its {} periods are \
             not proved",
            t.periods
        ),
        None => format!(
            "{sampled}; the plan's structure and routes are checked; its vector clocks would \
             take {:.1} GiB, so it is not proved as a whole",
            relaycc_route::check_clock_bytes(plan) as f64 / (1u64 << 30) as f64
        ),
    };
    Ok(json!({
        "summary": summary,
        "method": if proved { "check" } else { "sampled" },
        "targets": r.targets,
        "cone_ops": r.cone_ops,
        "cone_values": r.cone_values,
        "full_ops": r.full_ops,
        "ms": ms,
        "host_run": host,
    }))
}

/// The op cone of `ranks`' outputs run on the host by the executor, within
/// [`HOST_RUN_MAX_BYTES`] and [`HOST_RUN_MAX_OPS`].
fn host_run(
    topo: &relaycc_topo::Topology,
    plan: &relaycc_route::Plan,
    ranks: &[u32],
) -> Result<serde_json::Value> {
    use relaycc_collectives::exec::sampled_cone::{ConeOptions, cone_bytes, execute_cone};
    let start = std::time::Instant::now();
    let Some(cone) = relaycc_route::template::extract_cone(plan, topo, ranks, HOST_RUN_MAX_OPS)
        .with_context(|| format!("the op cone of ranks {ranks:?} of {}", plan.algorithm))?
    else {
        return Ok(json!({
            "summary": format!(
                "the host run of ranks {ranks:?} was left out: their cone holds more than \
                 {HOST_RUN_MAX_OPS} ops (plan at a smaller --size to run it)"
            ),
            "ran": false,
        }));
    };
    let bytes = cone_bytes(&cone, topo)?;
    if bytes > HOST_RUN_MAX_BYTES {
        return Ok(json!({
            "summary": format!(
                "the host run of ranks {ranks:?} was left out: its {} ops need {:.1} GiB of \
                 buffers, over {} GiB (plan at a smaller --size to run it)",
                cone.plan.ops.len(),
                bytes as f64 / (1u64 << 30) as f64,
                HOST_RUN_MAX_BYTES >> 30
            ),
            "ran": false,
            "cone_ops": cone.plan.ops.len(),
            "bytes": bytes,
        }));
    }
    let r = execute_cone(&cone, topo, &ConeOptions::default()).with_context(|| {
        format!(
            "host run of the cone of ranks {ranks:?} of {}",
            plan.algorithm
        )
    })?;
    let s = start.elapsed().as_secs_f64();
    Ok(json!({
        "summary": format!(
            "the executor ran the cone of ranks {ranks:?} on the host ({} of {} ops, {} ranks, \
             {} messages, {:.1} MB, {s:.2} s) and their {} output elements equal the reference",
            r.ops, r.full_ops, r.ranks_run, r.messages, r.bytes as f64 / 1e6, r.elements
        ),
        "ran": true,
        "cone_ops": r.ops,
        "ranks_run": r.ranks_run,
        "messages": r.messages,
        "elements": r.elements,
        "bytes": r.bytes,
        "s": s,
    }))
}
