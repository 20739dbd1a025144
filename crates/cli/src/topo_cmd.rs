//! `relaycc topo list | show`.

use std::fmt::Write as _;

use anyhow::{Context, Result, bail};
use relaycc_topo::{Calibration, Mask, Topology, export};

use crate::args::{ShowArgs, ShowFormat, TopoCommand, TopologyArgs};

/// Run a `topo` subcommand, writing its output to `out`.
pub fn run(cmd: &TopoCommand, out: &mut Vec<u8>) -> Result<()> {
    let text = match cmd {
        TopoCommand::List => list(),
        TopoCommand::Show(args) => show(args)?,
    };
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

fn list() -> String {
    let mut s = String::new();
    for (name, description) in relaycc_topo::list_presets() {
        let _ = writeln!(s, "{name:<32} {description}");
    }
    s
}

/// Load, calibrate and mask a topology as the common arguments say.
pub fn load_topology(args: &TopologyArgs) -> Result<Topology> {
    let mut topo = relaycc_topo::load(&args.topology)
        .with_context(|| format!("loading topology {:?}", args.topology))?;
    for w in topo.warnings() {
        eprintln!("warning: {w}");
    }
    if let Some(path) = &args.calibration {
        topo = Calibration::from_path(path)?.apply(&topo)?;
    }
    let mut mask = Mask::busy(args.mask_gpus.iter().copied());
    for pair in &args.links_down {
        let Some((a, b)) = pair.split_once('-') else {
            bail!("--links-down {pair:?}: expected two node names joined by '-', e.g. GPU0-GPU4");
        };
        mask.link_down(a, b);
    }
    Ok(topo.with_mask(mask)?)
}

/// Devices (GPUs and NICs) the `nvidia-smi topo -m` matrix is printed for at most: it has a
/// cell per pair, so a rack-scale cluster's would run to billions (nvidia-smi itself prints
/// one host's).
pub const SMI_MAX_DEVICES: usize = 1024;

fn show(args: &ShowArgs) -> Result<String> {
    let topo = load_topology(&args.topology)?;
    Ok(match args.format {
        ShowFormat::Json => export::to_json(&topo) + "\n",
        ShowFormat::Dot => export::to_dot(&topo),
        ShowFormat::Smi => {
            let devices = topo.gpu_count() as usize + topo.nics().count();
            if devices > SMI_MAX_DEVICES {
                bail!(
                    "topo show --format smi: {} has {devices} GPUs and NICs, so its \
                     nvidia-smi matrix would have {} cells; the matrix is printed for at most \
                     {SMI_MAX_DEVICES} devices (nvidia-smi prints one host's): use --format \
                     table, json or dot, or a preset of one host",
                    topo.name(),
                    devices * devices
                );
            }
            export::to_smi(&topo)
        }
        ShowFormat::Table => table(&topo),
    })
}

fn table(topo: &Topology) -> String {
    let doc = export::TopologyJson::from_topology(topo);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "topology {}: {} GPUs, {} NICs, {} CPU sockets, {} hosts",
        topo.name(),
        topo.gpu_count(),
        doc.nics.len(),
        topo.cpus().count(),
        topo.host_count()
    );
    let _ = writeln!(s, "\nGPUs");
    let _ = writeln!(
        s,
        "  {:<6} {:<26} {:<4} {:<5} {:<14} state",
        "gpu", "name", "cc", "numa", "pci"
    );
    for g in &doc.gpus {
        let state = if !topo.gpu_present(g.index) {
            "absent"
        } else if !topo.gpu_free(g.index) {
            "busy"
        } else {
            "free"
        };
        let _ = writeln!(
            s,
            "  GPU{:<3} {:<26} {:<4} {:<5} {:<14} {state}",
            g.index,
            g.name,
            g.compute_capability.as_deref().unwrap_or("-"),
            g.numa.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
            g.pci_bus_id.as_deref().unwrap_or("-"),
        );
    }
    if !doc.nics.is_empty() {
        let _ = writeln!(s, "\nNICs");
        for n in &doc.nics {
            let _ = writeln!(
                s,
                "  {:<24} numa {:<4} {:.1} GB/s",
                n.name,
                n.numa.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                n.gbps
            );
        }
    }
    let n = topo.gpu_count();
    if n <= 32 {
        let _ = writeln!(s, "\nGPU x GPU (class / best direct-path GB/s)");
        let mut header = String::from("        ");
        for b in 0..n {
            let _ = write!(header, "{:>12}", format!("GPU{b}"));
        }
        let _ = writeln!(s, "{header}");
        for a in 0..n {
            let _ = write!(s, "  {:<6}", format!("GPU{a}"));
            for b in 0..n {
                let (Ok(x), Ok(y)) = (topo.gpu(a), topo.gpu(b)) else {
                    continue;
                };
                let class = topo.classify(x, y);
                let cell = if a == b {
                    "X".to_string()
                } else {
                    match topo.link_between(x, y) {
                        Some(l) => format!("{class}/{:.1}", topo.link(l).gbps),
                        None => class.to_string(),
                    }
                };
                let _ = write!(s, "{cell:>12}");
            }
            let _ = writeln!(s);
        }
    }
    let _ = writeln!(s, "\nLinks (full duplex; GB/s per direction)");
    let mut seen = std::collections::BTreeSet::new();
    for l in &doc.links {
        let key = if l.from < l.to {
            (l.from.clone(), l.to.clone())
        } else {
            (l.to.clone(), l.from.clone())
        };
        if !seen.insert(key) {
            continue;
        }
        let _ = writeln!(
            s,
            "  {:<18} -- {:<18} {:<14} {:>7.1} GB/s {:>5.2} us",
            l.from,
            l.to,
            l.link.kind.label(),
            l.link.gbps,
            l.link.latency_us
        );
    }
    s
}
