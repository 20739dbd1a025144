//! Shared pieces of the planning commands: building requests, printing figures.

use anyhow::{Result, bail};
use relaycc_route::path::RelayPolicy;
use relaycc_route::{Collective, Request, sim::Perf};
use relaycc_topo::Topology;
use serde_json::{Value, json};

use crate::args::{CollectiveArgs, usage};
use crate::sizing::{element_count, whole_elements};

/// A `{time_us, algbw_gbps, busbw_gbps}` object.
pub fn perf_json(p: &Perf) -> Value {
    json!({ "time_us": p.time_us, "algbw_gbps": p.algbw_gbps, "busbw_gbps": p.busbw_gbps })
}

/// The request for `args` at `size_bytes` (nccl-tests' size: one rank's larger buffer), its
/// count by [`element_count`]. Variable-size collectives get a deterministic irregular
/// pattern of the size's elements in total.
pub fn request(args: &CollectiveArgs, gpus: &[u32], size_bytes: u64) -> Result<Request> {
    let n = gpus.len() as u64;
    if n == 0 {
        bail!("no GPUs given");
    }
    let (c, dtype) = (args.collective, args.element.dtype);
    let elems = whole_elements(size_bytes, dtype)?;
    let count = element_count(c, dtype, size_bytes, n)?;
    let mut r = Request::new(c, gpus.to_vec(), count, dtype)
        .with_op(args.element.op)
        .with_root(args.root);
    match c {
        Collective::AllGatherV | Collective::ReduceScatterV => {
            // Irregular blocks summing to about `elems`: rank k gets a share growing with k.
            let weights: u64 = (1..=n).sum();
            r.counts = (1..=n).map(|k| elems * k / weights).collect();
        }
        Collective::AllToAllV => {
            r.matrix = (0..n)
                .map(|s| (0..n).map(|d| count * ((s + d) % 3) / 2).collect())
                .collect();
        }
        Collective::SendRecv => bail!("use `relaycc route` for point-to-point copies"),
        _ => {}
    }
    r.validate()?;
    Ok(r)
}

/// The job's GPUs: as given, or every GPU the mask leaves free. A listed GPU that the topology
/// lacks, or that is masked busy, is an error naming `--gpus`.
pub fn job_gpus(args: &CollectiveArgs, topo: &Topology) -> Result<Vec<u32>> {
    if args.gpus.is_empty() {
        return Ok((0..topo.gpu_count())
            .filter(|g| topo.gpu_free(*g))
            .collect());
    }
    for &g in &args.gpus {
        if g >= topo.gpu_count() || !topo.gpu_present(g) {
            bail!(
                "--gpus: GPU {g} does not exist in {} ({} GPUs)",
                topo.name(),
                topo.gpu_count()
            );
        }
        if args.topology.mask_gpus.contains(&g) {
            return Err(usage(format!(
                "--gpus {g} is also in --mask-gpus: a busy GPU cannot be a member"
            )));
        }
        if !topo.gpu_free(g) {
            bail!("--gpus: GPU {g} is busy in the topology's mask");
        }
    }
    Ok(args.gpus.clone())
}

/// Checks a `--relay` GPU list against the topology: every GPU exists and is not masked busy.
pub fn check_relays(relay: &RelayPolicy, topo: &Topology, masked: &[u32]) -> Result<()> {
    let RelayPolicy::List(list) = relay else {
        return Ok(());
    };
    relaycc_route::require_relays_exist(topo, relay)
        .map_err(|e| anyhow::anyhow!("--relay: {e}"))?;
    for &g in list {
        if masked.contains(&g) {
            return Err(usage(format!(
                "--relay {g} is also in --mask-gpus: a busy GPU cannot relay"
            )));
        }
    }
    Ok(())
}

/// Ratio `a / b`, or 0 when `b` is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The kind of link a hop crosses, as people name it: `NVLink2 x2` for a direct bond,
/// `NVSwitch`, `C2C`, `PCIe switch` (through switches only), `PCIe host bridge` (through a
/// CPU's root complex), `host memory` (staged in pinned host memory), `network`.
pub fn hop_kind(topo: &Topology, hop: &relaycc_route::path::Hop) -> String {
    use relaycc_route::Location;
    use relaycc_topo::{LinkId, LinkKind, NodeKind};
    if matches!(hop.from, Location::Host(_)) || matches!(hop.to, Location::Host(_)) {
        return "host memory".into();
    }
    let links: Vec<LinkId> = hop.edges.iter().map(|&e| LinkId::new(e as usize)).collect();
    let kinds: Vec<LinkKind> = links.iter().map(|&l| topo.link(l).kind).collect();
    // The nodes a hop passes between its two memories.
    let inner: Vec<&NodeKind> = links
        .iter()
        .skip(1)
        .map(|&l| &topo.node(topo.link_ends(l).0).kind)
        .collect();
    if kinds.iter().any(|k| matches!(k, LinkKind::Network { .. })) {
        "network".into()
    } else if inner.iter().any(|k| matches!(k, NodeKind::NvSwitch)) {
        "NVSwitch".into()
    } else if let [k @ LinkKind::Nvlink { .. }] = kinds.as_slice() {
        k.label()
    } else if kinds.iter().any(|k| matches!(k, LinkKind::C2c)) {
        "C2C".into()
    } else if inner
        .iter()
        .any(|k| matches!(k, NodeKind::Cpu(_) | NodeKind::HostBridge))
    {
        "PCIe host bridge".into()
    } else if kinds.iter().all(|k| matches!(k, LinkKind::Pcie { .. })) {
        "PCIe switch".into()
    } else {
        kinds
            .iter()
            .map(|k| k.label())
            .collect::<Vec<_>>()
            .join("+")
    }
}

/// A route as `GPU0 -[NVLink2 x1]-> GPU4 -[NVLink2 x2]-> GPU7`.
pub fn route_text(topo: &Topology, route: &relaycc_route::path::Route) -> String {
    let names = route.names(topo);
    let mut s = names.first().cloned().unwrap_or_default();
    for (hop, to) in route.hops.iter().zip(names.iter().skip(1)) {
        s.push_str(&format!(" -[{}]-> {to}", hop_kind(topo, hop)));
    }
    s
}

/// What a plan holds, for the `chosen:` line: its ops and lanes; a template's share of the
/// full plan's; a plan of rounds' body and tail, and the ops it holds and runs; a step-sampled
/// plan's samples.
pub fn plan_shape(plan: &relaycc_route::Plan) -> String {
    if let Some(r) = &plan.rounds {
        let tail = r.tail.as_ref().map_or(String::new(), |t| {
            format!(", then a tail of {}", plan_shape(t))
        });
        return format!(
            "{} rounds of {}{tail}: {} ops held, {} run",
            r.count,
            plan_shape(&r.body),
            plan.stored_ops(),
            plan.full_ops()
        );
    }
    if let Some(s) = &plan.step_samples {
        return format!(
            "step-sampled: {} and {} of {} {}, the long sample {}; {} ops held, about {} in full",
            s.short_kept,
            s.long_kept,
            s.full,
            s.what,
            plan_shape(&s.long),
            plan.stored_ops(),
            plan.full_ops()
        );
    }
    match &plan.template {
        Some(t) => format!(
            "template of hosts 0..{} of {}: {} ops of {}, {} lanes of {}",
            t.period,
            t.hosts,
            plan.ops.len(),
            t.full_ops,
            plan.lanes.len(),
            t.full_lanes
        ),
        None => format!("{} ops on {} lanes", plan.ops.len(), plan.lanes.len()),
    }
}

/// Staging (scratch) bytes a plan allocates, per memory (`GPU3`, `CPU0`), GPUs first by index.
pub fn staging_bytes(topo: &Topology, plan: &relaycc_route::Plan) -> Vec<(String, u64)> {
    plan.staging_per_location()
        .into_iter()
        .map(|(at, b)| (relaycc_route::path::location_name(topo, at), b))
        .collect()
}

/// A staging budget as people read it: `64 MiB per device`, or `unbounded`.
pub fn budget_text(budget: u64) -> String {
    if budget == relaycc_route::staging::UNBOUNDED_STAGING {
        "unbounded".into()
    } else {
        format!("{} per device", crate::size::format_size(budget))
    }
}

/// Staging per memory as one line: `GPU3 64 MiB, GPU5 64 MiB`; an amount more than four
/// memories share is counted, not named (`16 MiB on each of 128 GPUs`); or `none`.
pub fn staging_text(per: &[(String, u64)]) -> String {
    if per.is_empty() {
        return "none".into();
    }
    // Amounts in order of first appearance, each with its memories.
    let mut groups: Vec<(u64, Vec<&str>)> = Vec::new();
    for (n, b) in per {
        match groups.iter_mut().find(|(x, _)| x == b) {
            Some((_, names)) => names.push(n),
            None => groups.push((*b, vec![n])),
        }
    }
    groups
        .iter()
        .flat_map(|(b, names)| {
            let size = crate::size::format_size(*b);
            if names.len() > 4 {
                let gpus = names.iter().all(|n| n.starts_with("GPU"));
                let what = if gpus { "GPUs" } else { "memories" };
                vec![format!("{size} on each of {} {what}", names.len())]
            } else {
                names.iter().map(|n| format!("{n} {size}")).collect()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The note printed under every predicted figure.
pub const PREDICTION_NOTE: &str = "figures are predictions of the flow simulator on the \
    topology's rates (a calibration file replaces them with measured ones), not measurements";

/// Staging per memory as a JSON object of bytes: `{"GPU3": 67108864}`.
pub fn staging_json(per: &[(String, u64)]) -> Value {
    Value::Object(per.iter().map(|(n, b)| (n.clone(), json!(b))).collect())
}
