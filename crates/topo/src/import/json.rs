//! Import relaycc's own JSON (see [`crate::export::TopologyJson`]).

use crate::calibration::{MAX_LATENCY_US, MAX_LINK_GBPS, MIN_LINK_GBPS};
use crate::error::{Result, TopoError};
use crate::export::json::{FORMAT, TopologyJson, VERSION};
use crate::graph::Topology;
use crate::topology_builder::TopologyBuilder;

/// Parse relaycc JSON. The derived views (`gpus`, `nics`, `nvlinks`) are ignored: `nodes`,
/// `links` and `mask` are the source of truth. Link rates and latencies outside the physical
/// ranges calibration files respect ([`crate::MIN_LINK_GBPS`] to [`crate::MAX_LINK_GBPS`],
/// at most [`crate::MAX_LATENCY_US`]) are errors.
pub fn parse(text: &str, source_name: &str) -> Result<Topology> {
    let doc: TopologyJson = serde_json::from_str(text)
        .map_err(|e| TopoError::parse(source_name, e.line(), e.to_string()))?;
    if doc.format != FORMAT {
        return Err(TopoError::parse(
            source_name,
            0,
            format!("format is {:?}, expected {FORMAT:?}", doc.format),
        ));
    }
    if doc.version != VERSION {
        return Err(TopoError::parse(
            source_name,
            0,
            format!(
                "version {} is not supported (expected {VERSION})",
                doc.version
            ),
        ));
    }
    let mut b = TopologyBuilder::new(doc.name);
    let mut ids = std::collections::BTreeMap::new();
    for node in doc.nodes {
        let name = node.name.clone();
        let host = node.host;
        let id = b.add_node(name.clone(), node.kind);
        if let Some(n) = b.node_mut(id) {
            n.host = host;
        }
        ids.insert(name, id);
    }
    for (i, l) in doc.links.iter().enumerate() {
        let find = |name: &str| {
            ids.get(name).copied().ok_or_else(|| {
                TopoError::parse(
                    source_name,
                    0,
                    format!("links[{i}] names node {name:?}, which is not in nodes"),
                )
            })
        };
        let (from, to) = (find(&l.from)?, find(&l.to)?);
        // The same physical ranges a calibration file must respect.
        let (gbps, latency_us) = (l.link.gbps, l.link.latency_us);
        if !(MIN_LINK_GBPS..=MAX_LINK_GBPS).contains(&gbps) {
            return Err(TopoError::parse(
                source_name,
                0,
                format!(
                    "links[{i}] ({} -> {}): gbps must be from {MIN_LINK_GBPS} to {MAX_LINK_GBPS}, got {gbps}",
                    l.from, l.to
                ),
            ));
        }
        if !(0.0..=MAX_LATENCY_US).contains(&latency_us) {
            return Err(TopoError::parse(
                source_name,
                0,
                format!(
                    "links[{i}] ({} -> {}): latency_us must be from 0 to {MAX_LATENCY_US}, got {latency_us}",
                    l.from, l.to
                ),
            ));
        }
        b.add_directed(from, to, l.link);
    }
    let mut topo = b
        .build()
        .map_err(|e| TopoError::parse(source_name, 0, e.to_string()))?;
    // The same names and ranges as a calibration file's `costs`.
    let mut costs = *topo.costs();
    for (name, &value) in &doc.costs {
        costs
            .set(name, value, MAX_LATENCY_US)
            .map_err(|m| TopoError::parse(source_name, 0, format!("costs: {m}")))?;
    }
    topo.set_costs(costs);
    topo.with_mask(doc.mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_link_rates_are_refused() {
        let topo = crate::preset("dgx1-v100").unwrap();
        let mut doc: serde_json::Value =
            serde_json::from_str(&crate::export::to_json(&topo)).unwrap();
        for (field, value, needle) in [
            ("gbps", 1e300, "gbps must be from 0.25 to 900"),
            ("gbps", 0.0, "gbps must be from"),
            ("latency_us", 1e9, "latency_us must be from 0 to 1000"),
        ] {
            let mut bad = doc.clone();
            bad["links"][3][field] = serde_json::json!(value);
            let err = parse(&bad.to_string(), "t").unwrap_err().to_string();
            assert!(err.contains(needle), "{field}={value}: {err}");
        }
        doc["links"][3]["gbps"] = serde_json::json!(MAX_LINK_GBPS);
        assert!(parse(&doc.to_string(), "t").is_ok());
    }

    #[test]
    fn a_calibrated_cost_model_survives_export_and_import() {
        let mut topo = crate::preset("dgx-h100").unwrap();
        // Presets carry the defaults: their JSON names no costs.
        assert!(!crate::export::to_json(&topo).contains("\"costs\""));
        let mut costs = *topo.costs();
        costs
            .set("copy_engine_launch_us", 2.5, MAX_LATENCY_US)
            .unwrap();
        costs.set("ll128_bw_fraction", 0.8, MAX_LATENCY_US).unwrap();
        topo.set_costs(costs);
        let back = parse(&crate::export::to_json(&topo), "t").unwrap();
        assert_eq!(back.costs(), topo.costs());
        let mut doc: serde_json::Value =
            serde_json::from_str(&crate::export::to_json(&topo)).unwrap();
        doc["costs"]["ll_bw_fraction"] = serde_json::json!(1.5);
        let err = parse(&doc.to_string(), "t").unwrap_err().to_string();
        assert!(
            err.contains("costs: ll_bw_fraction must be a fraction"),
            "{err}"
        );
        doc["costs"] = serde_json::json!({"warp_speed": 1.0});
        let err = parse(&doc.to_string(), "t").unwrap_err().to_string();
        assert!(err.contains("unknown cost"), "{err}");
    }
}
