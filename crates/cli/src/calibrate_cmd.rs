//! `relaycc calibrate`: measure the machine's links and write a calibration file.
//!
//! Measured: for every ordered pair of the listed GPUs, peer-copy bandwidth (`--bytes`, 256 MiB
//! by default, `--reps` times) and latency (8-byte copies); for every GPU, pinned host-to-device
//! and device-to-host rates, and its device-memory rates by copy engine, by SM copy (relaycc's
//! forward kernel) and by the reduce kernel (two f32 sources), as bytes read plus written per
//! second: what chooses the CUDA backend's SM-copy threshold
//! (`CudaBackend::set_sm_copy_below`) and what its reductions cost.
//!
//! What goes into `links` (which `relaycc_topo::Calibration::apply` requires to name ADJACENT
//! nodes): a pair whose topology GPUs have a direct edge (`Topology::link_between`, NVLink on
//! DGX machines) becomes a per-link entry with the measured rate. A pair without a direct edge
//! is a path over several links (PCIe switches, host bridges, the inter-socket link), so its
//! rate cannot be pinned on one link without guessing which one limits it; the same holds for
//! host links, whose path also crosses switches. Those figures go into the file's `notes`
//! object (kept by the parser, never applied), so nothing false enters the model and nothing
//! measured is lost; so do the device-memory rates, which no entry of the format takes. No kind
//! override is written: one measured path says nothing certain about every link of its kind.
//! Device rates need the kernels (NVRTC or `RELAYCC_PTX_DIR`); without them they are left out
//! with a warning on stderr.

use std::io::Write;

use anyhow::{Context, Result, bail};
use relaycc_collectives::cuda::{self, measure};
use relaycc_topo::{Calibration, LinkRate, Topology};
use serde::Serialize;

use crate::args::CalibrateArgs;

/// One measured figure kept in `notes`.
#[derive(Debug, Serialize)]
struct Measured {
    from: String,
    to: String,
    /// What moved the bytes: `copy_engine`, `sm_copy` (the forward kernel) or `reduce_kernel`.
    mechanism: &'static str,
    /// GB/s: bytes copied per second between two memories; within one GPU's memory, bytes
    /// read plus written per second.
    gbps: f64,
    latency_us: f64,
    /// Why it is a note and not a link entry.
    why: &'static str,
}

/// The file: what `Calibration::parse` reads, plus `notes`.
#[derive(Debug, Serialize)]
struct File {
    source: String,
    kinds: Vec<relaycc_topo::KindRate>,
    links: Vec<LinkRate>,
    notes: Vec<Measured>,
}

/// The topology GPU of CUDA device `info`: by PCI address when the topology has them, else by
/// index (the two orders agree under `CUDA_DEVICE_ORDER=PCI_BUS_ID`).
fn topo_gpu(topo: &Topology, info: &cuda::DeviceInfo) -> Result<u32> {
    if let Some(g) = relaycc_topo::import::nvml::gpu_at_bus_id(topo, &info.pci_bus_id) {
        return Ok(g);
    }
    let g = u32::try_from(info.ordinal)?;
    topo.gpu(g)
        .with_context(|| format!("CUDA device {} has no GPU in the topology", info.ordinal))?;
    Ok(g)
}

/// Run `relaycc calibrate`.
pub fn run(args: &CalibrateArgs, out: &mut Vec<u8>) -> Result<()> {
    let visible = cuda::devices().context("calibrate needs a CUDA driver")?;
    let bytes = usize::try_from(args.bytes)?;
    let mut infos = Vec::new();
    for &g in &args.gpus {
        let Some(info) = visible.get(g as usize) else {
            bail!("CUDA device {g} does not exist ({} visible)", visible.len());
        };
        infos.push(info);
    }
    let topo = relaycc_topo::load(&args.topology)?;
    let names: Vec<(u32, String)> = infos
        .iter()
        .map(|i| {
            let g = topo_gpu(&topo, i)?;
            Ok((g, topo.node(topo.gpu(g)?).name.clone()))
        })
        .collect::<Result<_>>()?;
    let mut links = Vec::new();
    let mut notes = Vec::new();
    for (a, ia) in infos.iter().enumerate() {
        for (b, ib) in infos.iter().enumerate() {
            if a == b {
                continue;
            }
            let r = measure::measure_p2p(ia.ordinal, ib.ordinal, bytes, args.reps)
                .with_context(|| format!("GPU {} -> GPU {}", ia.ordinal, ib.ordinal))?;
            let (na, nb) = (topo.gpu(names[a].0)?, topo.gpu(names[b].0)?);
            if topo.link_between(na, nb).is_some() {
                links.push(LinkRate {
                    from: names[a].1.clone(),
                    to: names[b].1.clone(),
                    gbps: r.gbps,
                    latency_us: Some(r.latency_us),
                });
            } else {
                notes.push(Measured {
                    from: names[a].1.clone(),
                    to: names[b].1.clone(),
                    mechanism: "copy_engine",
                    gbps: r.gbps,
                    latency_us: r.latency_us,
                    why: "no direct link between these GPUs: a multi-link path",
                });
            }
        }
    }
    for (a, ia) in infos.iter().enumerate() {
        let (up, down) = measure::measure_host(ia.ordinal, bytes, args.reps)
            .with_context(|| format!("GPU {} host link", ia.ordinal))?;
        let why = "host path (pinned memory) crosses PCIe switches and host bridges";
        for (from, to, r) in [
            ("host".to_string(), names[a].1.clone(), up),
            (names[a].1.clone(), "host".to_string(), down),
        ] {
            notes.push(Measured {
                from,
                to,
                mechanism: "copy_engine",
                gbps: r.gbps,
                latency_us: r.latency_us,
                why,
            });
        }
        match measure::measure_device(ia.ordinal, bytes, args.reps) {
            Ok(d) => {
                for (mechanism, r) in [
                    ("copy_engine", d.copy_engine),
                    ("sm_copy", d.sm_copy),
                    ("reduce_kernel", d.reduce),
                ] {
                    notes.push(Measured {
                        from: names[a].1.clone(),
                        to: names[a].1.clone(),
                        mechanism,
                        gbps: r.gbps,
                        latency_us: r.latency_us,
                        why: "device memory of one GPU, bytes read plus written (no link)",
                    });
                }
            }
            Err(e) => eprintln!(
                "relaycc calibrate: GPU {}: device-memory rates left out: {e}",
                ia.ordinal
            ),
        }
    }
    let devices: Vec<String> = infos
        .iter()
        .map(|i| format!("{} ({})", i.name, i.pci_bus_id))
        .collect();
    let file = File {
        source: format!(
            "relaycc calibrate: {} byte copies x {} on {}",
            bytes,
            args.reps,
            devices.join(", ")
        ),
        kinds: Vec::new(),
        links,
        notes,
    };
    let text = serde_json::to_string_pretty(&file)?;
    // Check the file is what the topology crate accepts, on this very topology.
    let cal = Calibration::parse(&text, "calibrate output")?;
    cal.apply(&topo)
        .context("the measured calibration does not apply to the topology")?;
    match &args.output {
        Some(path) => std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => writeln!(out, "{text}")?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file shape with notes parses as a calibration and applies to a preset.
    #[test]
    fn files_with_notes_parse_and_apply() {
        let topo = relaycc_topo::load("dgx1-v100").expect("preset");
        let (a, b) = (topo.gpu(0).expect("gpu"), topo.gpu(1).expect("gpu"));
        assert!(topo.link_between(a, b).is_some());
        let file = File {
            source: "test".into(),
            kinds: Vec::new(),
            links: vec![LinkRate {
                from: topo.node(a).name.clone(),
                to: topo.node(b).name.clone(),
                gbps: 40.0,
                latency_us: Some(2.0),
            }],
            notes: vec![Measured {
                from: "host".into(),
                to: "GPU0".into(),
                mechanism: "copy_engine",
                gbps: 20.0,
                latency_us: 9.0,
                why: "test",
            }],
        };
        let text = serde_json::to_string(&file).expect("json");
        let cal = Calibration::parse(&text, "t").expect("parses");
        assert_eq!(cal.links.len(), 1);
        assert!(cal.apply(&topo).is_ok());
    }
}
