//! NVML discovery of the live machine: GPUs, their NVLinks, and the PCIe/CPU tree between them.
//!
//! Two layers. [`discover`] asks NVML (through nvml-wrapper, which loads `libnvidia-ml.so.1`
//! at run time) and gathers [`MachineFacts`]; [`reconstruct`] turns facts into a
//! [`Topology`] without touching NVML, so it is tested everywhere and facts can be replayed.
//!
//! | NVML call | fact |
//! |---|---|
//! | `nvmlDeviceGetIndex`, `GetName`, `GetCudaComputeCapability`, `GetPciInfo`, `GetMemoryInfo` | [`crate::GpuInfo`] |
//! | sysfs `/sys/bus/pci/devices/<bus id>/numa_node` (NVML 0.11 has no NUMA call) | GPU NUMA node |
//! | `GetMaxPcieLinkGeneration`, `GetMaxPcieLinkWidth` | the GPU's PCIe link |
//! | `GetNvLinkState`, `GetNvLinkRemotePciInfo` per link | [`NvLinkFact`] |
//! | `GetTopologyCommonAncestor` per pair | [`CommonAncestor`] |
//! | `/proc/cpuinfo` | CPU family |
//! | `GetComputeRunningProcesses`, `GetGraphicsRunningProcesses` | [`idle_gpus`] |
//!
//! The far end of an NVLink is a GPU when its bus id is one of the GPUs found, the CPU when its
//! PCI vendor is IBM (the POWER9 NVLink bridge), else an NVSwitch. nvml-wrapper 0.11 does not
//! wrap `nvmlDeviceGetNvLinkRemoteDeviceType`, and calling the raw symbol would need unsafe code
//! and a direct dependency on nvml-wrapper-sys; the bus id answers the same question.
//!
//! Missing driver: `Nvml::init` loads the library with libloading and returns
//! `NvmlError::LibloadingError` when it is absent; every later call resolves its symbol through
//! `nvml_sym`, which returns `NvmlError::FailedToLoadSymbol` for a symbol an old driver lacks
//! (nvml-wrapper 0.11 `src/lib.rs`, `src/error.rs`). No path used here unwraps. [`discover`]
//! still runs inside `std::panic::catch_unwind`, so that a panic in a future nvml-wrapper
//! release becomes a [`TopoError::Nvml`] instead of unwinding into the caller.

mod facts;
mod rebuild;

pub use facts::{CommonAncestor, GpuFacts, MachineFacts, NvLinkFact, NvLinkRemote};
pub use rebuild::reconstruct;

#[cfg(feature = "nvml")]
use std::panic::{AssertUnwindSafe, catch_unwind};

#[cfg(feature = "nvml")]
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
#[cfg(feature = "nvml")]
use nvml_wrapper::error::NvmlError;
#[cfg(feature = "nvml")]
use nvml_wrapper::{Device, Nvml};

use crate::error::{Result, TopoError};
use crate::graph::Topology;
#[cfg(feature = "nvml")]
use crate::graph::{ComputeCapability, GpuInfo};
use crate::import::nccl_xml::BusId;
#[cfg(any(feature = "nvml", test))]
use crate::rates::CpuFamily;

/// Links per GPU that NVML can report (`NVML_NVLINK_MAX_LINKS` in nvml.h of CUDA 12: 18).
#[cfg(feature = "nvml")]
const NVML_NVLINK_MAX_LINKS: u32 = 18;
/// PCI vendor id of IBM: the far end of a POWER9 GPU's NVLink to its CPU.
#[cfg(any(feature = "nvml", test))]
const PCI_VENDOR_IBM: u32 = 0x1014;

/// Discover this machine through NVML.
///
/// # Errors
/// [`TopoError::Nvml`] naming the step: `init` when the driver or `libnvidia-ml.so.1` is
/// missing, `device 3 name` and so on when a query fails, `topology reconstruction` when the
/// answers do not form a tree. Never panics.
#[cfg(feature = "nvml")]
pub fn discover() -> Result<Topology> {
    match catch_unwind(AssertUnwindSafe(gather)) {
        Ok(facts) => reconstruct(&facts?),
        Err(_) => Err(TopoError::Nvml {
            step: "discovery".into(),
            message: "nvml-wrapper panicked; the panic was caught".into(),
        }),
    }
}

/// Discover this machine through NVML: this build has no NVML support.
///
/// # Errors
/// Always [`TopoError::Nvml`] at step `init`: relaycc-topo is built without its `nvml`
/// feature, so nvml-wrapper is not compiled in. Topology files and presets still load.
#[cfg(not(feature = "nvml"))]
pub fn discover() -> Result<Topology> {
    Err(TopoError::Nvml {
        step: "init".into(),
        message: "relaycc-topo is built without its `nvml` feature (enable it, or the \
                  `cuda` feature of relaycc, relaycc-collectives or relaycc-cli)"
            .into(),
    })
}

/// The GPU of `topo` at PCI address `bus_id`, in any spelling of it (NVML's eight-digit
/// domain `00000000:06:00.0`, sysfs's and CUDA's four-digit `0000:06:00.0`, any case): how a
/// CUDA device, which the driver numbers in its own order and after `CUDA_VISIBLE_DEVICES`,
/// finds its node in a topology that [`discover`] numbered in NVML's order. `None` when no
/// GPU of `topo` has that address or `bus_id` is not one.
pub fn gpu_at_bus_id(topo: &Topology, bus_id: &str) -> Option<u32> {
    let want = BusId::parse(bus_id)?;
    (0..topo.gpu_count()).find(|&g| {
        topo.gpu_info(g)
            .ok()
            .and_then(|info| BusId::parse(info.pci_bus_id.as_deref()?))
            == Some(want)
    })
}

/// The GPUs (NVML indices, as [`discover`] numbers them) on which no process runs: NVML lists
/// no running compute process and no running graphics process. A GPU whose process list NVML
/// cannot give is not idle. relaycc-collectives relays through such GPUs only when they are
/// idle, since a relay's copies and staging compete with whatever else runs there.
///
/// # Errors
/// [`TopoError::Nvml`] naming the step (`init` when the driver or `libnvidia-ml.so.1` is
/// missing). Never panics.
#[cfg(feature = "nvml")]
pub fn idle_gpus() -> Result<Vec<u32>> {
    let ask = || -> Result<Vec<u32>> {
        let nvml = Nvml::init().map_err(nvml_err("init"))?;
        let count = nvml.device_count().map_err(nvml_err("device count"))?;
        let mut idle = Vec::new();
        for i in 0..count {
            let Ok(d) = nvml.device_by_index(i) else {
                continue;
            };
            let compute = d.running_compute_processes().map(|p| p.is_empty());
            let graphics = d.running_graphics_processes().map(|p| p.is_empty());
            if matches!((compute, graphics), (Ok(true), Ok(true))) {
                idle.push(i);
            }
        }
        Ok(idle)
    };
    match catch_unwind(AssertUnwindSafe(ask)) {
        Ok(r) => r,
        Err(_) => Err(TopoError::Nvml {
            step: "process lists".into(),
            message: "nvml-wrapper panicked; the panic was caught".into(),
        }),
    }
}

/// Idle GPUs through NVML: this build has no NVML support.
///
/// # Errors
/// Always [`TopoError::Nvml`] at step `init`.
#[cfg(not(feature = "nvml"))]
pub fn idle_gpus() -> Result<Vec<u32>> {
    discover().map(|_| Vec::new())
}

#[cfg(feature = "nvml")]
fn nvml_err(step: impl Into<String>) -> impl FnOnce(NvmlError) -> TopoError {
    let step = step.into();
    move |e| TopoError::Nvml {
        step,
        message: e.to_string(),
    }
}

/// Ask NVML for everything [`reconstruct`] needs.
#[cfg(feature = "nvml")]
fn gather() -> Result<MachineFacts> {
    let nvml = Nvml::init().map_err(nvml_err("init"))?;
    let count = nvml.device_count().map_err(nvml_err("device count"))?;
    let device = |i: u32| -> Result<Device<'_>> {
        nvml.device_by_index(i)
            .map_err(nvml_err(format!("device {i} handle")))
    };
    let mut gpus = Vec::with_capacity(count as usize);
    for i in 0..count {
        let d = device(i)?;
        let step = |what: &str| format!("device {i} {what}");
        let mut info = GpuInfo::new(d.index().map_err(nvml_err(step("index")))?);
        info.name = d.name().map_err(nvml_err(step("name")))?;
        let cc = d
            .cuda_compute_capability()
            .map_err(nvml_err(step("compute capability")))?;
        info.compute_capability = match (u32::try_from(cc.major), u32::try_from(cc.minor)) {
            (Ok(major), Ok(minor)) => Some(ComputeCapability { major, minor }),
            _ => None,
        };
        let pci = d.pci_info().map_err(nvml_err(step("pci info")))?;
        info.numa = BusId::parse(&pci.bus_id).and_then(sysfs_numa);
        info.pci_bus_id = Some(pci.bus_id);
        // Memory is a detail: a GPU that will not say (MIG, vGPU) is still a GPU.
        info.memory_bytes = d.memory_info().ok().map(|m| m.total);
        let pcie_gen = d
            .max_pcie_link_gen()
            .ok()
            .and_then(|g| u8::try_from(g).ok());
        let pcie_width = d.max_pcie_link_width().ok();
        let mut nvlinks = Vec::new();
        for l in 0..NVML_NVLINK_MAX_LINKS {
            let link = d.link_wrapper_for(l);
            match link.is_active() {
                Ok(true) => {}
                Ok(false) => continue,
                // No NVLink at all, or no link of this number: the links end here.
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => break,
                Err(e) => return Err(nvml_err(step(&format!("nvlink {l} state")))(e)),
            }
            let remote = link
                .remote_pci_info()
                .map_err(nvml_err(step(&format!("nvlink {l} remote pci info"))))?;
            nvlinks.push((remote.bus_id, remote.pci_device_id));
        }
        gpus.push((
            GpuFacts {
                info,
                pcie_gen,
                pcie_width,
                nvlinks: Vec::new(),
            },
            nvlinks,
        ));
    }
    let known: Vec<BusId> = gpus
        .iter()
        .filter_map(|(g, _)| BusId::parse(g.info.pci_bus_id.as_deref()?))
        .collect();
    let gpus: Vec<GpuFacts> = gpus
        .into_iter()
        .map(|(mut g, links)| {
            g.nvlinks = links
                .into_iter()
                .map(|(bus, pci_device_id)| NvLinkFact {
                    remote: remote_kind(&bus, pci_device_id, &known),
                    remote_bus_id: bus,
                })
                .collect();
            g
        })
        .collect();
    let n = gpus.len();
    let mut ancestors = vec![vec![CommonAncestor::Internal; n]; n];
    let pairs = (0..n).flat_map(|i| ((i + 1)..n).map(move |j| (i, j)));
    for (i, j) in pairs {
        let (a, b) = (device(i as u32)?, device(j as u32)?);
        let level = a
            .topology_common_ancestor(b)
            .map_err(nvml_err(format!("device {i} and {j} common ancestor")))?;
        let level = ancestor(level);
        ancestors[i][j] = level;
        ancestors[j][i] = level;
    }
    Ok(MachineFacts {
        name: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "nvml".into()),
        cpu_family: cpu_family(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()),
        gpus,
        ancestors,
    })
}

/// NVML's level as a [`CommonAncestor`].
#[cfg(feature = "nvml")]
fn ancestor(level: TopologyLevel) -> CommonAncestor {
    match level {
        TopologyLevel::Internal => CommonAncestor::Internal,
        TopologyLevel::Single => CommonAncestor::Single,
        TopologyLevel::Multiple => CommonAncestor::Multiple,
        TopologyLevel::HostBridge => CommonAncestor::HostBridge,
        TopologyLevel::Node => CommonAncestor::Node,
        TopologyLevel::System => CommonAncestor::System,
    }
}

/// What the far end of an NVLink is, from its bus id and PCI ids (see the module docs).
#[cfg(any(feature = "nvml", test))]
fn remote_kind(bus: &str, pci_device_id: u32, gpus: &[BusId]) -> NvLinkRemote {
    if BusId::parse(bus).is_some_and(|b| gpus.contains(&b)) {
        NvLinkRemote::Gpu
    } else if pci_device_id & 0xffff == PCI_VENDOR_IBM {
        NvLinkRemote::Cpu
    } else {
        NvLinkRemote::Switch
    }
}

/// The NUMA node sysfs gives a PCI device; `None` for -1 (no NUMA information) or no file.
#[cfg(feature = "nvml")]
fn sysfs_numa(bus: BusId) -> Option<u32> {
    let path = format!("/sys/bus/pci/devices/{}/numa_node", bus.sysfs());
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The CPU family from `/proc/cpuinfo` text (first processor's fields).
#[cfg(any(feature = "nvml", test))]
fn cpu_family(cpuinfo: &str) -> CpuFamily {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim())
        })
    };
    if field("cpu").is_some_and(|c| c.starts_with("POWER9")) {
        return CpuFamily::Power9;
    }
    match (field("vendor_id"), field("cpu family"), field("model")) {
        (Some(vendor), Some(family), Some(model)) => CpuFamily::from_x86(
            vendor,
            family.parse().unwrap_or(0),
            model.parse().unwrap_or(0),
        ),
        _ => CpuFamily::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_discover_is_an_nvml_error_not_a_panic() {
        let r = discover();
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            // A driver is loaded: any outcome but a panic (or another error kind) is fine.
            assert!(matches!(r, Ok(_) | Err(TopoError::Nvml { .. })), "{r:?}");
        } else {
            match r {
                Err(TopoError::Nvml { step, message }) => {
                    assert_eq!(step, "init", "{message}");
                    assert!(!message.is_empty());
                }
                other => panic!("expected an NVML init error, got {other:?}"),
            }
        }
    }

    #[test]
    #[ignore = "needs an NVIDIA driver"]
    fn discovers_the_live_machine() {
        let t = discover().unwrap();
        assert!(t.gpu_count() > 0);
        for i in 0..t.gpu_count() {
            let info = t.gpu_info(i).unwrap();
            assert!(!info.name.is_empty());
            assert!(info.pci_bus_id.is_some());
            assert!(info.compute_capability.is_some());
        }
        println!("{}", crate::export::to_smi(&t));
    }

    #[test]
    fn remote_kinds() {
        let gpus = [BusId::parse("0000:06:00.0").unwrap()];
        assert_eq!(
            remote_kind("00000000:06:00.0", 0x1db5_10de, &gpus),
            NvLinkRemote::Gpu
        );
        assert_eq!(
            remote_kind("00000004:00:00.0", 0x04ea_1014, &gpus),
            NvLinkRemote::Cpu
        );
        assert_eq!(
            remote_kind("00000000:C3:00.0", 0x1af1_10de, &gpus),
            NvLinkRemote::Switch
        );
        assert_eq!(remote_kind("garbage", 0, &gpus), NvLinkRemote::Switch);
    }

    #[test]
    fn cpu_family_from_cpuinfo() {
        let intel = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n";
        assert_eq!(cpu_family(intel), CpuFamily::IntelSkylake);
        let amd = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n";
        assert_eq!(cpu_family(amd), CpuFamily::Amd);
        assert_eq!(
            cpu_family("processor\t: 0\ncpu\t\t: POWER9, altivec supported\n"),
            CpuFamily::Power9
        );
        assert_eq!(cpu_family(""), CpuFamily::Unknown);
    }
}
