//! Chrome trace-event JSON of a simulated plan, for Perfetto (ui.perfetto.dev) or
//! `chrome://tracing`: one process per device that drives lanes, one thread per lane, one
//! complete event per op, and one counter track per busy edge.

use std::collections::BTreeMap;

use relaycc_topo::{LinkId, Topology};
use serde_json::{Value, json};

use relaycc_plan::{Location, OpKind, Plan};

use super::model::location_name;
use super::result::SimResult;

/// A byte count for labels: `512 B`, `4.0 KiB`, `4.0 MiB`, `1.5 GiB`.
pub(super) fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024.0 {
        return format!("{bytes} B");
    }
    let mut v = bytes / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// The trace-event JSON (`{"traceEvents": [...]}`) of `result`, which
/// [`simulate`](crate::simulate) produced for `plan` on `topo`.
///
/// Each op is a complete event (`"ph": "X"`, `ts` and `dur` in us) on the process of its
/// lane's device (`GPU0`, `CPU1`) and the thread of its lane (tid = lane index, named by the
/// lane's label). Its name reads `copy GPU0->GPU4 4.0 MiB` or `reduce GPU0 4.0 MiB`; its args
/// give the op id, bytes, edges and when its bytes began to flow. Edges that carried bytes get
/// a counter track (`"ph": "C"`) of their utilisation, stepping at every op start and end of
/// the ops that cross them.
///
/// Ops or lanes that `result` does not cover (a result from another plan) are left out.
pub fn chrome_trace(topo: &Topology, plan: &Plan, result: &SimResult) -> String {
    let mut events = Vec::with_capacity(plan.ops.len() + plan.lanes.len() * 2 + 8);
    // Perfetto wants integer pids: number devices in a stable order.
    let mut pids: BTreeMap<Location, usize> = BTreeMap::new();
    for lane in &plan.lanes {
        let next = pids.len();
        pids.entry(lane.location).or_insert(next);
    }
    for (&loc, &pid) in &pids {
        events.push(json!({
            "ph": "M", "name": "process_name", "pid": pid,
            "args": { "name": location_name(topo, loc) },
        }));
    }
    for (tid, lane) in plan.lanes.iter().enumerate() {
        events.push(json!({
            "ph": "M", "name": "thread_name", "pid": pids[&lane.location], "tid": tid,
            "args": { "name": lane.label },
        }));
    }
    let elem = plan.dtype.size() as f64;
    for (id, (op, span)) in plan.ops.iter().zip(&result.ops).enumerate() {
        let Some(lane) = plan.lanes.get(op.lane as usize) else {
            continue;
        };
        let bytes = op.len() as f64 * elem;
        let (name, cat) = match &op.kind {
            OpKind::Copy { src, dst } => {
                let end = |b| {
                    plan.location(b)
                        .map_or("?".to_string(), |l| location_name(topo, l))
                };
                let (s, d) = (end(src.buffer), end(dst.buffer));
                (format!("copy {s}->{d} {}", human_bytes(bytes)), "copy")
            }
            OpKind::Reduce { dst, .. } => {
                let at = plan
                    .location(dst.buffer)
                    .map_or("?".to_string(), |l| location_name(topo, l));
                (format!("reduce {at} {}", human_bytes(bytes)), "reduce")
            }
        };
        events.push(json!({
            "ph": "X", "name": name, "cat": cat,
            "pid": pids[&lane.location], "tid": op.lane,
            "ts": span.start_us, "dur": span.duration_us(),
            "args": {
                "op": id, "bytes": bytes, "edges": op.edges,
                "flow_start_us": span.flow_start_us, "deps": op.deps,
            },
        }));
    }
    edge_counters(topo, plan, result, pids.len(), &mut events);
    json!({ "traceEvents": events, "displayTimeUnit": "ns" }).to_string()
}

/// Counter tracks of edge utilisation under one extra process (`links`): at each op start
/// and end, the share of the edge's capacity that the op's bytes over its flow time would use.
/// It is an average per op rather than the exact fair rate, which the result does not keep.
fn edge_counters(
    topo: &Topology,
    plan: &Plan,
    result: &SimResult,
    pid: usize,
    events: &mut Vec<Value>,
) {
    if result.edges.is_empty() {
        return;
    }
    events.push(json!({
        "ph": "M", "name": "process_name", "pid": pid, "args": { "name": "links" },
    }));
    let elem = plan.dtype.size() as f64;
    // (edge, time, change of bytes/us) from every op that crosses a used edge.
    let mut steps: Vec<(u32, f64, f64)> = Vec::new();
    for (op, span) in plan.ops.iter().zip(&result.ops) {
        let flow_us = span.end_us - span.flow_start_us;
        if flow_us <= 0.0 {
            continue;
        }
        let rate = op.len() as f64 * elem / flow_us;
        for &e in &op.edges {
            steps.push((e, span.flow_start_us, rate));
            steps.push((e, span.end_us, -rate));
        }
    }
    steps.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut k = 0;
    while k < steps.len() {
        let e = steps[k].0;
        let Some(link) = topo.graph().edge_weight(LinkId::new(e as usize)) else {
            k += 1;
            continue;
        };
        let (a, b) = topo.link_ends(LinkId::new(e as usize));
        let name = format!("edge {e} {}->{}", topo.node(a).name, topo.node(b).name);
        let cap = link.gbps * super::config::BYTES_PER_US_PER_GBPS;
        let mut level = 0.0;
        while k < steps.len() && steps[k].0 == e {
            let t = steps[k].1;
            while k < steps.len() && steps[k].0 == e && steps[k].1 == t {
                level += steps[k].2;
                k += 1;
            }
            events.push(json!({
                "ph": "C", "name": name, "pid": pid, "ts": t,
                "args": { "utilisation": (level / cap).max(0.0) },
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimConfig, simulate};
    use relaycc_plan::Request;
    use relaycc_plan::{Location::Gpu, Region};

    #[test]
    fn chrome_trace_lists_every_op() {
        const N: u64 = 4 << 20;
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let (g0, g4) = (topo.gpu(0).unwrap(), topo.gpu(4).unwrap());
        let e = topo.link_between(g0, g4).unwrap().index() as u32;
        let mut p = Plan::new(Request::point_to_point(0, 4, N), "test");
        let (a, b) = (
            p.add_lane(Gpu(0), "GPU0 send"),
            p.add_lane(Gpu(4), "GPU4 reduce"),
        );
        let src = Region::new(p.add_scratch(Gpu(0), N), 0, N);
        let dst = Region::new(p.add_scratch(Gpu(4), N), 0, N);
        let c = p.copy(a, src, dst, vec![e], vec![]);
        p.reduce(b, vec![dst, dst], dst, false, vec![c]);
        let r = simulate(&topo, &p, &SimConfig::default()).unwrap();
        let json: Value = serde_json::from_str(&chrome_trace(&topo, &p, &r)).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        let ops: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0]["name"], "copy GPU0->GPU4 4.0 MiB");
        assert_eq!(ops[1]["name"], "reduce GPU4 4.0 MiB");
        assert_eq!((&ops[0]["tid"], &ops[1]["tid"]), (&json!(0), &json!(1)));
        assert_eq!(ops[0]["args"]["op"], 0);
        assert_eq!(ops[0]["args"]["edges"][0], e);
        assert_eq!(ops[1]["dur"].as_f64(), Some(r.ops[1].duration_us()));
        let names: Vec<_> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| e["args"]["name"].clone())
            .collect();
        assert_eq!(names, vec![json!("GPU0"), json!("GPU4"), json!("links")]);
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "C" && e["args"]["utilisation"] == 1.0)
        );
    }

    #[test]
    fn bytes_read_like_people_write_them() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(4096.0), "4.0 KiB");
        assert_eq!(human_bytes(4.0 * 1024.0 * 1024.0), "4.0 MiB");
        assert_eq!(human_bytes(1.5 * 1024.0 * 1024.0 * 1024.0), "1.5 GiB");
    }
}
