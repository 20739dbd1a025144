//! Calibration: measured rates that override the rates table, per link kind or per link.
//!
//! The file is JSON:
//! ```json
//! {
//!   "source": "relaycc calibrate on dgx01, 2026-11-22",
//!   "kinds": [ { "kind": "nvlink", "generation": 2, "gbps_per_lane": 23.1, "latency_us": 0.9 },
//!              { "kind": "pcie", "generation": 3, "gbps_per_x16": 11.2 } ],
//!   "links": [ { "from": "GPU0", "to": "GPU1", "gbps": 22.4, "latency_us": 1.1 } ]
//! }
//! ```
//! Kind entries apply first (`kind` is `nvlink`, `pcie`, `inter_socket`, `c2c` or `network`;
//! `generation` narrows NVLink/PCIe entries; NVLink rates scale with lanes, PCIe with width).
//! Link entries then set one directed link each and must name two adjacent nodes.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TopoError};
use crate::graph::{LinkKind, Topology};

/// A calibration override for every link of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindRate {
    /// `nvlink`, `pcie`, `inter_socket`, `c2c` or `network`.
    pub kind: String,
    /// NVLink or PCIe generation this entry is limited to (all generations when absent).
    #[serde(default)]
    pub generation: Option<u32>,
    /// NVLink: GB/s per lane and direction.
    #[serde(default)]
    pub gbps_per_lane: Option<f64>,
    /// PCIe: GB/s per direction of an x16 link (narrower links scale down).
    #[serde(default)]
    pub gbps_per_x16: Option<f64>,
    /// Other kinds: GB/s per direction.
    #[serde(default)]
    pub gbps: Option<f64>,
    /// Latency of one traversal, microseconds (unchanged when absent).
    #[serde(default)]
    pub latency_us: Option<f64>,
}

/// A calibration override for one directed link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkRate {
    /// Source node name.
    pub from: String,
    /// Target node name.
    pub to: String,
    /// Measured GB/s.
    pub gbps: f64,
    /// Measured latency, microseconds (unchanged when absent).
    #[serde(default)]
    pub latency_us: Option<f64>,
}

/// Measured rates for a machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Where the figures come from.
    #[serde(default)]
    pub source: String,
    /// Per-kind overrides.
    #[serde(default)]
    pub kinds: Vec<KindRate>,
    /// Per-link overrides.
    #[serde(default)]
    pub links: Vec<LinkRate>,
}

fn kind_name(k: &LinkKind) -> (&'static str, Option<u32>) {
    match *k {
        LinkKind::Nvlink { generation, .. } => ("nvlink", Some(generation as u32)),
        LinkKind::Pcie { generation, .. } => ("pcie", Some(u32::from(generation))),
        LinkKind::InterSocket { .. } => ("inter_socket", None),
        LinkKind::C2c => ("c2c", None),
        LinkKind::Network { .. } => ("network", None),
    }
}

impl Calibration {
    /// Parse a calibration file's text.
    pub fn parse(text: &str, source_name: &str) -> Result<Calibration> {
        serde_json::from_str(text)
            .map_err(|e| TopoError::parse(source_name, e.line(), e.to_string()))
    }

    /// Read and parse a calibration file.
    pub fn from_path(path: &std::path::Path) -> Result<Calibration> {
        let text = std::fs::read_to_string(path).map_err(|source| TopoError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Calibration::parse(&text, &path.display().to_string())
    }

    /// `topo` with these rates applied. Nothing changes unless every entry applies.
    pub fn apply(&self, topo: &Topology) -> Result<Topology> {
        let err = |message: String| TopoError::Calibration {
            source_name: if self.source.is_empty() {
                "calibration".into()
            } else {
                self.source.clone()
            },
            message,
        };
        let positive = |what: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(err(format!("{what} must be a positive number, got {v}")))
            }
        };
        let mut out = topo.clone();
        for (i, k) in self.kinds.iter().enumerate() {
            if !["nvlink", "pcie", "inter_socket", "c2c", "network"].contains(&k.kind.as_str()) {
                return Err(err(format!("kinds[{i}]: unknown kind {:?}", k.kind)));
            }
            if let Some(l) = k.latency_us {
                if !(l.is_finite() && l >= 0.0) {
                    return Err(err(format!("kinds[{i}]: latency_us must be >= 0, got {l}")));
                }
            }
            let updates: Vec<_> = topo
                .links()
                .filter(|(_, _, _, link)| {
                    let (name, generation) = kind_name(&link.kind);
                    name == k.kind && (k.generation.is_none() || k.generation == generation)
                })
                .map(|(id, _, _, link)| (id, *link))
                .collect();
            for (id, link) in updates {
                let gbps = match link.kind {
                    LinkKind::Nvlink { lanes, .. } => {
                        let per = k.gbps_per_lane.ok_or_else(|| {
                            err(format!("kinds[{i}]: nvlink needs gbps_per_lane"))
                        })?;
                        positive("gbps_per_lane", per)? * f64::from(lanes)
                    }
                    LinkKind::Pcie { width, .. } => {
                        let per = k
                            .gbps_per_x16
                            .ok_or_else(|| err(format!("kinds[{i}]: pcie needs gbps_per_x16")))?;
                        positive("gbps_per_x16", per)? * f64::from(width.max(1)) / 16.0
                    }
                    _ => positive(
                        "gbps",
                        k.gbps
                            .ok_or_else(|| err(format!("kinds[{i}]: {} needs gbps", k.kind)))?,
                    )?,
                };
                out.set_link_rate(id, gbps, k.latency_us.unwrap_or(link.latency_us));
            }
        }
        for (i, l) in self.links.iter().enumerate() {
            let a = topo
                .node_by_name(&l.from)
                .map_err(|e| err(format!("links[{i}]: {e}")))?;
            let b = topo
                .node_by_name(&l.to)
                .map_err(|e| err(format!("links[{i}]: {e}")))?;
            let id = topo
                .link_between(a, b)
                .ok_or_else(|| err(format!("links[{i}]: no link joins {} to {}", l.from, l.to)))?;
            let gbps = positive("gbps", l.gbps)?;
            let latency = match l.latency_us {
                Some(x) if x.is_finite() && x >= 0.0 => x,
                Some(x) => {
                    return Err(err(format!("links[{i}]: latency_us must be >= 0, got {x}")));
                }
                None => out.link(id).latency_us,
            };
            out.set_link_rate(id, gbps, latency);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_link_overrides_apply_in_order() {
        let topo = crate::preset("dgx1-v100").unwrap();
        let cal = Calibration::parse(
            r#"{"source":"test","kinds":[{"kind":"nvlink","generation":2,"gbps_per_lane":20.0}],
                "links":[{"from":"GPU0","to":"GPU1","gbps":19.5,"latency_us":2.0}]}"#,
            "t",
        )
        .unwrap();
        let t = cal.apply(&topo).unwrap();
        let (g0, g1, g3) = (t.gpu(0).unwrap(), t.gpu(1).unwrap(), t.gpu(3).unwrap());
        let l01 = t.link(t.link_between(g0, g1).unwrap());
        assert_eq!((l01.gbps, l01.latency_us), (19.5, 2.0));
        let l10 = t.link(t.link_between(g1, g0).unwrap());
        assert_eq!(l10.gbps, 20.0);
        assert_eq!(t.link(t.link_between(g0, g3).unwrap()).gbps, 40.0);
    }

    #[test]
    fn bad_entries_are_errors() {
        let topo = crate::preset("dgx1-v100").unwrap();
        for (json, needle) in [
            (r#"{"kinds":[{"kind":"warp","gbps":1}]}"#, "unknown kind"),
            (r#"{"kinds":[{"kind":"nvlink","gbps":1}]}"#, "gbps_per_lane"),
            (
                r#"{"links":[{"from":"GPU0","to":"GPU7","gbps":1}]}"#,
                "no link joins",
            ),
            (
                r#"{"links":[{"from":"GPU0","to":"GPU9","gbps":1}]}"#,
                "GPU9",
            ),
            (
                r#"{"links":[{"from":"GPU0","to":"GPU1","gbps":-1}]}"#,
                "positive",
            ),
        ] {
            let err = Calibration::parse(json, "t")
                .unwrap()
                .apply(&topo)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
        assert!(Calibration::parse("{", "t").is_err());
    }
}
