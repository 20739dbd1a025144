//! Planning a request as rounds: the body's request and the tail's are planned as any
//! request is (at once, each within the budget), and their plans, baselines, bounds and
//! figures combine into the plan of rounds.

use std::collections::BTreeMap;
use std::time::Instant;

use relaycc_topo::Topology;

use super::{Split, assemble};
use crate::error::Result;
use crate::p2p::RouteShare;
use crate::request::Request;
use crate::select::{CandidateTime, PlanOptions, Planned};
use crate::sim::{EdgeUse, MemUse, Perf, SimResult};

/// `count` times `body` and `tail` once, microseconds.
fn rounds_us(count: u64, body: f64, tail: Option<f64>) -> f64 {
    count as f64 * body + tail.unwrap_or(0.0)
}

/// The routes of `count` rounds of `body`'s and `tail`'s: each route once, with the elements
/// every segment moves over it.
fn merged_routes(count: u64, body: &[RouteShare], tail: &[RouteShare]) -> Vec<RouteShare> {
    let mut out: Vec<RouteShare> = body
        .iter()
        .map(|r| RouteShare {
            route: r.route.clone(),
            elements: r.elements.saturating_mul(count),
        })
        .collect();
    for t in tail {
        match out.iter_mut().find(|r| r.route == t.route) {
            Some(r) => r.elements = r.elements.saturating_add(t.elements),
            None => out.push(t.clone()),
        }
    }
    out
}

/// Plan `req` as the rounds of `split`: the body's request and the tail's planned with
/// [`crate::plan()`] under `opts` (side by side, each within the budget), combined:
/// the plan and the baseline are plans of rounds of theirs ([`assemble`]), every figure
/// `count` times the body's plus the tail's, each candidate of the body with the tail's
/// winner. A baseline cut by the budget in either segment is cut here, and reported by the
/// body's cut where the body's was (else the tail's).
pub(crate) fn plan_rounds(
    topo: &Topology,
    req: &Request,
    opts: &PlanOptions,
    split: Split,
) -> Result<Planned> {
    let started = Instant::now();
    let Split { count, body, tail } = split;
    let (body, tail) = rayon::join(
        || crate::select::plan(topo, &body, opts),
        || tail.as_ref().map(|t| crate::select::plan(topo, t, opts)),
    );
    let body = body?;
    let tail = tail.transpose()?;
    let t = tail.as_ref();
    let time = |b: &Perf, t: Option<&Perf>| rounds_us(count, b.time_us, t.map(|p| p.time_us));
    let predicted = Perf::from_time(req, time(&body.predicted, t.map(|t| &t.predicted)));
    let baseline = Perf::from_time(req, time(&body.baseline, t.map(|t| &t.baseline)));
    let bound = Perf::from_time(req, time(&body.bound, t.map(|t| &t.bound)));
    let tail_us = t.map(|t| t.predicted.time_us);
    let mut candidates: Vec<CandidateTime> = body
        .candidates
        .iter()
        .map(|c| CandidateTime {
            algorithm: format!("{count} rounds of [{}]", c.algorithm),
            time_us: rounds_us(count, c.time_us, tail_us),
        })
        .collect();
    candidates.sort_by(|a, b| a.time_us.total_cmp(&b.time_us));
    let routes = merged_routes(count, &body.routes, t.map_or(&[], |t| &t.routes));
    let mut skipped = body.skipped.clone();
    for s in t.map_or(&[][..], |t| &t.skipped) {
        if !skipped.contains(s) {
            skipped.push(s.clone());
        }
    }
    let baseline_cut = body.baseline_cut.or(t.and_then(|t| t.baseline_cut));
    let budget_exhausted = body.budget_exhausted || t.is_some_and(|t| t.budget_exhausted);
    let (tail_plan, tail_baseline) = match tail {
        Some(t) => (Some(t.plan), Some(t.baseline_plan)),
        None => (None, None),
    };
    Ok(Planned {
        plan: assemble(req, count, body.plan, tail_plan),
        predicted,
        baseline_plan: assemble(req, count, body.baseline_plan, tail_baseline),
        baseline,
        baseline_cut,
        bound,
        candidates,
        routes,
        budget_exhausted,
        elapsed: started.elapsed(),
        skipped,
    })
}

/// The simulation of a plan of rounds from its segments': the makespan `count` times the
/// body's plus the tail's; no op spans (the plan holds no op of its own); each edge's and
/// memory's bytes and busy time summed over the segments, and its utilisation their
/// time-weighted mean over the makespan.
pub(crate) fn combine_results(count: u64, body: &SimResult, tail: Option<&SimResult>) -> SimResult {
    let r = count as f64;
    let time_us = rounds_us(count, body.time_us, tail.map(|t| t.time_us));
    let weight = |seg: &SimResult, w: f64| w * seg.time_us;
    let segs: Vec<(&SimResult, f64)> = std::iter::once((body, r))
        .chain(tail.map(|t| (t, 1.0)))
        .collect();
    let share = |util_x_time: f64| {
        if time_us > 0.0 {
            util_x_time / time_us
        } else {
            0.0
        }
    };
    let mut edges: BTreeMap<u32, (f64, f64, f64)> = BTreeMap::new();
    let mut mems: BTreeMap<crate::plan::Location, (String, f64, f64, f64)> = BTreeMap::new();
    for &(seg, w) in &segs {
        for e in &seg.edges {
            let v = edges.entry(e.edge).or_default();
            v.0 += w * e.bytes;
            v.1 += w * e.busy_us;
            v.2 += e.utilisation * weight(seg, w);
        }
        for m in &seg.memories {
            let v = mems
                .entry(m.location)
                .or_insert_with(|| (m.name.clone(), 0.0, 0.0, 0.0));
            v.1 += w * m.bytes;
            v.2 += w * m.busy_us;
            v.3 += m.utilisation * weight(seg, w);
        }
    }
    SimResult {
        time_us,
        ops: Vec::new(),
        edges: edges
            .into_iter()
            .map(|(edge, (bytes, busy_us, u))| EdgeUse {
                edge,
                bytes,
                busy_us,
                utilisation: share(u),
            })
            .collect(),
        memories: mems
            .into_iter()
            .map(|(location, (name, bytes, busy_us, u))| MemUse {
                location,
                name,
                bytes,
                busy_us,
                utilisation: share(u),
            })
            .collect(),
    }
}
