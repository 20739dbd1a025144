//! Calibration: measured rates that override the rates table, per link kind or per link.
//!
//! The file is JSON:
//! ```json
//! {
//!   "source": "relaycc calibrate on dgx01",
//!   "kinds": [ { "kind": "nvlink", "generation": 2, "gbps_per_lane": 23.1, "latency_us": 0.9 },
//!              { "kind": "pcie", "generation": 3, "gbps_per_x16": 11.2 } ],
//!   "links": [ { "from": "GPU0", "to": "GPU1", "gbps": 22.4, "latency_us": 1.1 } ],
//!   "memories": [ { "gpu": "GPU0", "gbps": 780.5, "reduce_gbps": 702.0, "sm_copy_gbps": 760.0,
//!                   "write_share": 0.55 } ]
//! }
//! ```
//! Kind entries apply first (`kind` is `nvlink`, `pcie`, `inter_socket`, `c2c` or `network`;
//! `generation` narrows NVLink/PCIe entries; NVLink rates scale with lanes, PCIe with width).
//! Link entries then set one directed link each and must name two adjacent nodes. Memory
//! entries set a GPU's device-memory rate (bytes read plus written per second), which the
//! simulator charges copies within one GPU and reductions, and optionally the rate of
//! relaycc's reduce kernel there (`reduce_gbps`, the same unit), at which the simulator runs
//! a reduction alone on that GPU, and of its SM copy (`sm_copy_gbps`), at which it runs a copy
//! within that GPU's memory that the executor makes on SMs, and the share of its rate that its
//! writes alone reach (`write_share`, a fraction from [`rates::MIN_CALIBRATED_FRACTION`] to
//! 1), which the simulator caps a memory's writes at. `notes` holds
//! figures for people (what `relaycc calibrate` measured on multi-link paths) and changes no
//! rate. `costs` replaces entries of the cost model ([`crate::rates::CostModel`]) by name:
//! NCCL's protocol fractions and step latencies, NVLS, and relaycc's copy and kernel launches
//! (`{"costs": {"copy_engine_launch_us": 4.2, "ll128_bw_fraction": 0.9}}`). Any other key is an
//! error, as is a rate or latency outside the physical ranges below.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TopoError};
use crate::graph::{LinkKind, MemoryMeasures, Topology};
use crate::rates;

/// NVLink lanes (links) one GPU has at most: 18 on H100, H200 and B200 ([NVIDIA-H100]: 18
/// links = 450 GB/s for NVLink 4; [NVIDIA-B200]: 18 links = 900 GB/s for NVLink 5).
pub const MAX_NVLINK_LANES: u32 = 18;
/// The fastest one NVLink lane carries, GB/s per direction: NVLink 5's nominal rate, the fastest
/// generation ([`rates::NVLINK5_LANE_NOMINAL_GBPS`]). A measurement above it is a measuring error.
pub const MAX_NVLINK_LANE_GBPS: f64 = rates::NVLINK5_LANE_NOMINAL_GBPS;
/// The fastest PCIe x16 link, GB/s per direction: PCIe 6.0 signals 64 GT/s per lane, 16 lanes
/// carry 128 GB/s before FLIT overhead (PCI-SIG, PCI Express Base Specification 6.0).
pub const MAX_PCIE_X16_GBPS: f64 = 128.0;
/// The fastest single directed link of any kind, GB/s: a GPU's whole NVLink 5 bond, 18 lanes of
/// [`MAX_NVLINK_LANE_GBPS`] (900 GB/s per direction on B200), above NVLink-C2C's
/// [`rates::NVLINK_C2C_GBPS`], any inter-socket link and any NIC.
pub const MAX_LINK_GBPS: f64 = MAX_NVLINK_LANES as f64 * MAX_NVLINK_LANE_GBPS;
/// The slowest rate accepted, GB/s: below PCIe 1.0 x1 (2.5 GT/s with 8b/10b, 0.25 GB/s per
/// direction), the narrowest, oldest link a GPU or NIC attaches by. Slower figures are a unit
/// mistake (Gb/s for GB/s) or a failed measurement.
pub const MIN_LINK_GBPS: f64 = 0.25;
/// The fastest device memory accepted, GB/s: B200's HBM3e, the fastest in the rates table
/// ([`rates::HBM_B200_GBPS`]). A measurement above it is a measuring error.
pub const MAX_DEVICE_MEM_GBPS: f64 = rates::HBM_B200_GBPS;
/// The longest latency accepted for one link traversal, microseconds. Modelled hops take 0.5 to
/// 2.5 us ([`rates::NETWORK_HOP_LATENCY_US`] is the longest); 1 ms leaves room for software
/// overhead in a measurement while refusing figures off by the factor of a unit (ms for us).
pub const MAX_LATENCY_US: f64 = 1000.0;

/// A calibration override for every link of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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

/// A calibration override for one GPU's device memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRate {
    /// The GPU's node name (`GPU0`).
    pub gpu: String,
    /// Measured GB/s, bytes read plus written per second (a device-to-device copy of `b`
    /// bytes moves `2b`).
    pub gbps: f64,
    /// The reduce kernel's measured GB/s on this GPU, bytes read plus written per second (a
    /// reduction of `k` sources of `b` bytes moves `(k + 1) b`); absent where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_gbps: Option<f64>,
    /// relaycc's SM copy's (the forward kernel's) measured GB/s within this GPU's memory,
    /// bytes read plus written per second; absent where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_copy_gbps: Option<f64>,
    /// The share of `gbps` this GPU's writes alone reach: a memset's bytes written per second
    /// over `gbps`, from [`rates::MIN_CALIBRATED_FRACTION`] to 1; absent where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_share: Option<f64>,
}

/// Measured rates for a machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Per-GPU device-memory overrides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memories: Vec<MemoryRate>,
    /// Cost-model entries by name ([`rates::CostModel::names`]): fractions from
    /// [`rates::MIN_CALIBRATED_FRACTION`] to 1,
    /// latencies in microseconds.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub costs: std::collections::BTreeMap<String, f64>,
    /// Free-form figures for people, such as measurements of multi-link paths; never applied.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub notes: serde_json::Value,
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
        let text = crate::import::read_input(path)?;
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
        let in_range = |what: &str, v: f64, max: f64| {
            if (MIN_LINK_GBPS..=max).contains(&v) {
                Ok(v)
            } else {
                Err(err(format!(
                    "{what} must be a positive number from {MIN_LINK_GBPS} to {max} GB/s, got {v}"
                )))
            }
        };
        let latency = |what: &str, v: f64| {
            if (0.0..=MAX_LATENCY_US).contains(&v) {
                Ok(v)
            } else {
                Err(err(format!(
                    "{what}: latency_us must be from 0 to {MAX_LATENCY_US}, got {v}"
                )))
            }
        };
        let mut out = topo.clone();
        for (i, k) in self.kinds.iter().enumerate() {
            if !["nvlink", "pcie", "inter_socket", "c2c", "network"].contains(&k.kind.as_str()) {
                return Err(err(format!("kinds[{i}]: unknown kind {:?}", k.kind)));
            }
            if let Some(l) = k.latency_us {
                latency(&format!("kinds[{i}]"), l)?;
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
                        in_range("gbps_per_lane", per, MAX_NVLINK_LANE_GBPS)? * f64::from(lanes)
                    }
                    LinkKind::Pcie { width, .. } => {
                        let per = k
                            .gbps_per_x16
                            .ok_or_else(|| err(format!("kinds[{i}]: pcie needs gbps_per_x16")))?;
                        in_range("gbps_per_x16", per, MAX_PCIE_X16_GBPS)? * f64::from(width.max(1))
                            / 16.0
                    }
                    _ => in_range(
                        "gbps",
                        k.gbps
                            .ok_or_else(|| err(format!("kinds[{i}]: {} needs gbps", k.kind)))?,
                        MAX_LINK_GBPS,
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
            let gbps = in_range("gbps", l.gbps, MAX_LINK_GBPS)?;
            let latency_us = match l.latency_us {
                Some(x) => latency(&format!("links[{i}]"), x)?,
                None => out.link(id).latency_us,
            };
            out.set_link_rate(id, gbps, latency_us);
        }
        for (i, m) in self.memories.iter().enumerate() {
            let id = topo
                .node_by_name(&m.gpu)
                .map_err(|e| err(format!("memories[{i}]: {e}")))?;
            if topo.node(id).gpu().is_none() {
                return Err(err(format!("memories[{i}]: {} is not a GPU", m.gpu)));
            }
            let gbps = in_range("memories: gbps", m.gbps, MAX_DEVICE_MEM_GBPS)?;
            let kernel = |what: &str, rate: Option<f64>| {
                rate.map(|r| in_range(what, r, MAX_DEVICE_MEM_GBPS))
                    .transpose()
            };
            let reduce_gbps = kernel("memories: reduce_gbps", m.reduce_gbps)?;
            let sm_copy_gbps = kernel("memories: sm_copy_gbps", m.sm_copy_gbps)?;
            let write_share = m
                .write_share
                .map(|f| {
                    if (rates::MIN_CALIBRATED_FRACTION..=1.0).contains(&f) {
                        Ok(f)
                    } else {
                        Err(err(format!(
                            "memories[{i}]: write_share must be a fraction from {} to 1, got {f}",
                            rates::MIN_CALIBRATED_FRACTION
                        )))
                    }
                })
                .transpose()?;
            let measures = MemoryMeasures {
                reduce_gbps,
                sm_copy_gbps,
                write_share,
            };
            out.set_gpu_mem_gbps(id, gbps, measures);
        }
        let mut costs = *out.costs();
        for (name, &value) in &self.costs {
            costs
                .set(name, value, MAX_LATENCY_US)
                .map_err(|m| err(format!("costs: {m}")))?;
        }
        out.set_costs(costs);
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
            (
                r#"{"links":[{"from":"GPU0","to":"GPU1","gbps":1e300}]}"#,
                "to 900 GB/s",
            ),
            (
                r#"{"links":[{"from":"GPU0","to":"GPU1","gbps":1e-9}]}"#,
                "from 0.25",
            ),
            (
                r#"{"kinds":[{"kind":"nvlink","gbps_per_lane":51}]}"#,
                "to 50 GB/s",
            ),
            (
                r#"{"kinds":[{"kind":"pcie","gbps_per_x16":200}]}"#,
                "to 128 GB/s",
            ),
            (
                r#"{"links":[{"from":"GPU0","to":"GPU1","gbps":20,"latency_us":1e9}]}"#,
                "latency_us must be from 0 to 1000",
            ),
            (r#"{"memories":[{"gpu":"CPU0","gbps":700}]}"#, "not a GPU"),
            (r#"{"memories":[{"gpu":"GPU9","gbps":700}]}"#, "GPU9"),
            (
                r#"{"memories":[{"gpu":"GPU0","gbps":9000}]}"#,
                "to 8000 GB/s",
            ),
            (r#"{"memories":[{"gpu":"GPU0","gbps":0}]}"#, "from 0.25"),
            (
                r#"{"memories":[{"gpu":"GPU0","gbps":700,"reduce_gbps":9000}]}"#,
                "reduce_gbps must be",
            ),
            (
                r#"{"memories":[{"gpu":"GPU0","gbps":700,"sm_copy_gbps":0.1}]}"#,
                "sm_copy_gbps must be",
            ),
            (
                r#"{"memories":[{"gpu":"GPU0","gbps":700,"write_share":1.5}]}"#,
                "write_share must be a fraction from 0.05 to 1",
            ),
            (
                r#"{"memories":[{"gpu":"GPU0","gbps":700,"write_share":0}]}"#,
                "write_share must be",
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

    #[test]
    fn costs_replace_the_cost_model_by_name() {
        let topo = crate::preset("dgx-h100").unwrap();
        let cal = Calibration::parse(
            r#"{"costs":{"copy_engine_launch_us":2.5,"ll128_bw_fraction":0.8,
                "simple_nvlink_step_us":4.0,"nvls_sm90_efficiency":0.7}}"#,
            "t",
        )
        .unwrap();
        let t = cal.apply(&topo).unwrap();
        let c = t.costs();
        assert_eq!(c.copy_engine_launch_us, 2.5);
        assert_eq!(c.bw_fraction(rates::Protocol::Ll128), 0.8);
        assert_eq!(
            c.step_us(rates::Protocol::Simple, rates::StepClass::NvLink),
            4.0
        );
        assert_eq!(c.nvls_efficiency(90), Some(0.7));
        assert_eq!(topo.costs(), &rates::CostModel::default());
        for (json, needle) in [
            (r#"{"costs":{"warp":1}}"#, "unknown cost"),
            (r#"{"costs":{"ll_bw_fraction":2}}"#, "fraction"),
            (r#"{"costs":{"kernel_launch_us":-1}}"#, "from 0 to 1000"),
            // A share this small would make every Simple plan's bytes on the wire infinite;
            // it is refused with the floor and the reason.
            (
                r#"{"costs":{"simple_bw_fraction":5e-324}}"#,
                "simple_bw_fraction must be a fraction from 0.05 to 1",
            ),
            (
                r#"{"costs":{"nvls_sm90_efficiency":0.01}}"#,
                "grow without bound",
            ),
        ] {
            let err = Calibration::parse(json, "t")
                .unwrap()
                .apply(&topo)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn memories_set_a_gpus_device_memory_rate_and_survive_export() {
        let topo = crate::preset("dgx-h100").unwrap();
        let cal =
            Calibration::parse(r#"{"memories":[{"gpu":"GPU3","gbps":2710.5}]}"#, "t").unwrap();
        let t = cal.apply(&topo).unwrap();
        assert_eq!(t.gpu_info(3).unwrap().mem_gbps(), 2710.5);
        // The others keep the table's rate for sm90, as the uncalibrated topology has it.
        assert_eq!(t.gpu_info(2).unwrap().mem_gbps(), rates::HBM_H100_GBPS);
        assert_eq!(topo.gpu_info(3).unwrap().mem_gbps(), rates::HBM_H100_GBPS);
        let back = crate::import::json::parse(&crate::export::json::to_json(&t), "t").unwrap();
        assert_eq!(back.gpu_info(3).unwrap().mem_gbps(), 2710.5);
        assert_eq!(back.gpu_info(2).unwrap().measured_mem_gbps, None);
        assert_eq!(back.gpu_info(3).unwrap().measured_reduce_gbps, None);
    }

    #[test]
    fn a_memory_entry_carries_the_kernels_rates_through_export() {
        let topo = crate::preset("dgx-h100").unwrap();
        let json = r#"{"memories":[{"gpu":"GPU1","gbps":2800,"reduce_gbps":2240.5,
                                    "sm_copy_gbps":2600.25,"write_share":0.625}]}"#;
        let t = Calibration::parse(json, "t").unwrap().apply(&topo).unwrap();
        let kernels = |t: &Topology, g: u32| {
            let info = t.gpu_info(g).unwrap();
            (
                info.measured_reduce_gbps,
                info.measured_sm_copy_gbps,
                info.measured_write_share,
            )
        };
        let measured = (Some(2240.5), Some(2600.25), Some(0.625));
        assert_eq!(t.gpu_info(1).unwrap().mem_gbps(), 2800.0);
        assert_eq!(kernels(&t, 1), measured);
        assert_eq!(kernels(&t, 0), (None, None, None));
        let back = crate::import::json::parse(&crate::export::json::to_json(&t), "t").unwrap();
        assert_eq!(kernels(&back, 1), measured);
        assert_eq!(kernels(&back, 0), (None, None, None));
    }

    #[test]
    fn unknown_keys_are_errors_and_notes_are_kept() {
        for json in [
            r#"{"link":[]}"#,
            r#"{"links":[{"from":"GPU0","to":"GPU1","gbps":20,"latency":1}]}"#,
            r#"{"kinds":[{"kind":"nvlink","gbps_per_link":20}]}"#,
        ] {
            let err = Calibration::parse(json, "t").unwrap_err().to_string();
            assert!(err.contains("unknown field"), "{json}: {err}");
        }
        let cal = Calibration::parse(r#"{"notes":[{"from":"host","gbps":9}]}"#, "t").unwrap();
        assert_eq!(cal.notes[0]["gbps"], 9);
    }
}
