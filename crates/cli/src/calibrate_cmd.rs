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
//! measured is lost. No kind override is written: one measured path says nothing certain about
//! every link of its kind.
//!
//! What this executor pays on each GPU goes where the simulator reads it:
//! - `memories`: each GPU's device-memory rate, its copy engines' device-to-device rate (bytes
//!   read plus written), which the simulator charges copies within the GPU and reductions,
//!   its reduce kernel's rate (`reduce_gbps`, the same unit), at which the simulator runs a
//!   reduction alone on that GPU, its SM copy's (`sm_copy_gbps`, the forward kernel's),
//!   at which it runs a copy within that GPU that the executor makes on SMs, and the share
//!   of the memory's rate its writes alone reach (`write_share`: a memset's bytes written per
//!   second over the copy engines' rate, at most 1), at which the simulator caps the writes
//!   of fan-outs and reductions;
//! - `costs`: `copy_engine_launch_us`, the time of one small copy-engine copy issued back to
//!   back on a stream, and `kernel_launch_us`, the same for one small reduce-kernel launch;
//!   the simulator charges them per launch of relaycc's plans (a copy on a copy engine, a
//!   reduction or a launch of copies on SMs). Over several GPUs the slowest GPU's figure is
//!   taken, so no op is predicted cheaper than measured.
//!
//! Every device rate is in `notes` too. Device rates need the kernels (NVRTC or `RELAYCC_PTX_DIR`); without them they are
//! left out with a warning on stderr.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, Result, bail};
use relaycc_collectives::cuda::{self, measure};
use relaycc_topo::{Calibration, LinkRate, MemoryRate, Topology};
use serde::Serialize;

use crate::args::CalibrateArgs;

/// One measured figure kept in `notes`.
#[derive(Debug, Serialize)]
struct Measured {
    from: String,
    to: String,
    /// What moved the bytes: `copy_engine`, `sm_copy` (the forward kernel), `reduce_kernel` or
    /// `memset` (bytes written alone).
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    memories: Vec<MemoryRate>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    costs: BTreeMap<String, f64>,
    notes: Vec<Measured>,
}

/// The device-memory entries of GPU `gpu` (its node name) from its measured rates: the copy
/// engines' rate as the memory's, the reduce kernel's as its reductions', the forward
/// kernel's as its SM copies', the memset's over the copy engines' as its write share, every
/// rate in `notes`.
fn device_entries(gpu: &str, d: &measure::DeviceRates, notes: &mut Vec<Measured>) -> MemoryRate {
    for (mechanism, r) in [
        ("copy_engine", d.copy_engine),
        ("sm_copy", d.sm_copy),
        ("reduce_kernel", d.reduce),
        ("memset", d.write),
    ] {
        notes.push(Measured {
            from: gpu.to_string(),
            to: gpu.to_string(),
            mechanism,
            gbps: r.gbps,
            latency_us: r.latency_us,
            why: "device memory of one GPU, bytes read plus written (no link)",
        });
    }
    MemoryRate {
        gpu: gpu.to_string(),
        gbps: d.copy_engine.gbps,
        reduce_gbps: Some(d.reduce.gbps),
        sm_copy_gbps: Some(d.sm_copy.gbps),
        write_share: Some(d.write_share()),
    }
}

/// The cost-model entries the measured GPUs give: per copy-engine copy and per kernel launch
/// (the reduce kernel's or the forward kernel's, whichever is slower), the slowest GPU's time
/// of one small operation back to back; none without a GPU.
fn measured_costs(devices: &[measure::DeviceRates]) -> BTreeMap<String, f64> {
    let slowest = |f: fn(&measure::DeviceRates) -> f64| devices.iter().map(f).reduce(f64::max);
    let mut costs = BTreeMap::new();
    if let Some(us) = slowest(|d| d.copy_engine.latency_us) {
        costs.insert("copy_engine_launch_us".to_string(), us);
    }
    if let Some(us) = slowest(|d| d.reduce.latency_us.max(d.sm_copy.latency_us)) {
        costs.insert("kernel_launch_us".to_string(), us);
    }
    costs
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
    let mut memories = Vec::new();
    let mut device_rates = Vec::new();
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
                memories.push(device_entries(&names[a].1, &d, &mut notes));
                device_rates.push(d);
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
        memories,
        costs: measured_costs(&device_rates),
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
    use relaycc_collectives::cuda::measure::{DeviceRates, MeasuredRate};

    fn rates(copy_us: f64, reduce_us: f64, copy_gbps: f64) -> DeviceRates {
        let r = |gbps, latency_us| MeasuredRate { gbps, latency_us };
        DeviceRates {
            copy_engine: r(copy_gbps, copy_us),
            sm_copy: r(copy_gbps * 0.9, 3.0),
            reduce: r(copy_gbps * 0.8, reduce_us),
            write: r(copy_gbps * 0.6, 2.0),
        }
    }

    /// The file a calibration makes, from measurements of two GPUs (no GPU needed): links,
    /// device memories and per-op costs parse, apply to the topology, and reach the model; the
    /// other figures stay in the notes.
    #[test]
    fn measured_files_parse_apply_and_reach_the_model() {
        let topo = relaycc_topo::load("dgx1-v100").expect("preset");
        let (a, b) = (topo.gpu(0).expect("gpu"), topo.gpu(1).expect("gpu"));
        assert!(topo.link_between(a, b).is_some());
        let mut notes = vec![Measured {
            from: "host".into(),
            to: "GPU0".into(),
            mechanism: "copy_engine",
            gbps: 20.0,
            latency_us: 9.0,
            why: "test",
        }];
        let devices = [rates(2.5, 4.0, 780.0), rates(3.5, 3.0, 760.0)];
        let memories = vec![
            device_entries("GPU0", &devices[0], &mut notes),
            device_entries("GPU1", &devices[1], &mut notes),
        ];
        let file = File {
            source: "test".into(),
            kinds: Vec::new(),
            links: vec![LinkRate {
                from: topo.node(a).name.clone(),
                to: topo.node(b).name.clone(),
                gbps: 40.0,
                latency_us: Some(2.0),
            }],
            memories,
            costs: measured_costs(&devices),
            notes,
        };
        let text = serde_json::to_string(&file).expect("json");
        let cal = Calibration::parse(&text, "t").expect("parses");
        assert_eq!(cal.links.len(), 1);
        assert_eq!(cal.notes.as_array().map(Vec::len), Some(9));
        let t = cal.apply(&topo).expect("applies");
        assert_eq!(t.gpu_info(0).expect("gpu").mem_gbps(), 780.0);
        assert_eq!(t.gpu_info(1).expect("gpu").mem_gbps(), 760.0);
        // The reduce kernel's and the forward kernel's rates (0.8 and 0.9 of the copy
        // engines' in `rates`).
        let info = t.gpu_info(1).expect("gpu");
        assert_eq!(info.measured_reduce_gbps, Some(760.0 * 0.8));
        assert_eq!(info.measured_sm_copy_gbps, Some(760.0 * 0.9));
        // The memset's share of the copy engines' rate (0.6 in `rates`), capped at 1.
        assert!((info.measured_write_share.expect("measured") - 0.6).abs() < 1e-12);
        let mut fast_writes = devices[0];
        fast_writes.write.gbps = 2.0 * fast_writes.copy_engine.gbps;
        assert_eq!(fast_writes.write_share(), 1.0);
        // The slowest GPU's per-op times: a kernel launch is the slower kernel's.
        assert_eq!(t.costs().copy_engine_launch_us, 3.5);
        assert_eq!(t.costs().kernel_launch_us, 4.0);
        let slow_forward = [rates(2.5, 4.0, 780.0), {
            let mut d = rates(3.5, 3.0, 760.0);
            d.sm_copy.latency_us = 6.5;
            d
        }];
        assert_eq!(measured_costs(&slow_forward)["kernel_launch_us"], 6.5);
        assert!(measured_costs(&[]).is_empty());
    }
}
