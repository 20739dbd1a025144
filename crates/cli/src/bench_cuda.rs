//! The CUDA side of `relaycc bench`: the communicator on CUDA GPUs, device memory for the
//! pre-allocation check, and NCCL timed beside relaycc (`--vs-nccl`).
//!
//! Built with the `cuda` feature (on by default). Without it every entry point returns an
//! error that says the binary is built without CUDA, and [`Nccl`] has no values, so the
//! NCCL columns are never filled.

use anyhow::Result;
#[cfg(feature = "cuda")]
use anyhow::{Context, bail};
use relaycc_collectives::Communicator;
use relaycc_route::{Collective, DType, ReduceOp};

use crate::args::BenchArgs;

/// What a CUDA-less build says when CUDA is asked for.
#[cfg(not(feature = "cuda"))]
pub(crate) const NO_CUDA: &str = "this relaycc is built without the `cuda` feature (cargo install relaycc-cli with default features)";

/// NCCL communicators on the ranks' devices.
#[cfg(feature = "cuda")]
pub(crate) type Nccl = relaycc_collectives::cuda::nccl::NcclComms;
/// NCCL communicators on the ranks' devices: none exist without CUDA.
#[cfg(not(feature = "cuda"))]
pub(crate) enum Nccl {}

/// A communicator on CUDA GPUs, its ranks' devices, and each rank's CUDA device.
///
/// Without `--topology`: `--gpus LIST` puts rank `i` on CUDA device `LIST[i]` (a device may be
/// listed more than once: several logical ranks on one GPU) and `--ranks N` puts rank `i` on
/// visible device `i mod visible`; plans see `shared-gpu-N` when every rank is on one device
/// (the shared-memory planner's reductions that read every input where it lies), else
/// `nvswitch-N` (every rank a GPU on one switch: GPU algorithms with MiB chunks). With `--topology T`: the
/// ranks are GPUs of T (`--gpus`, or `--ranks N` for GPUs 0..N), every other free GPU of T may
/// relay. GPU `g` of T runs on the visible CUDA device at its PCI address where T records
/// addresses of this machine's devices (`auto`, or an `nvidia-smi` or NCCL XML file of it); a
/// GPU no visible device sits at has no device, and a rank on it is an error naming it. On
/// another machine's topology (a preset played on fewer GPUs), GPU `g` runs on device
/// `g mod visible`. Without a driver: one clear error.
#[cfg(feature = "cuda")]
pub(crate) fn communicator(args: &BenchArgs) -> Result<(Communicator, Vec<u32>, Vec<usize>)> {
    let visible = relaycc_collectives::cuda::devices().context("--backend cuda")?;
    if visible.is_empty() {
        bail!("--backend cuda: the CUDA driver reports no GPU");
    }
    if let Some(t) = &args.topology {
        let topo = crate::topo_cmd::load_topology(&crate::args::TopologyArgs {
            topology: t.clone(),
            mask_gpus: Vec::new(),
            links_down: Vec::new(),
            calibration: None,
        })?;
        let ranks: Vec<u32> = match (&args.gpus, args.ranks) {
            (g, _) if !g.is_empty() => g.clone(),
            (_, Some(n)) if n > 0 => (0..n).collect(),
            _ => bail!("give --ranks N or --gpus LIST"),
        };
        let gpus = topo.gpu_count();
        let bus_ids: Vec<&str> = visible.iter().map(|d| d.pci_bus_id.as_str()).collect();
        let map = device_map(&topo, &bus_ids);
        let relays: Vec<u32> = (0..gpus)
            .filter(|g| {
                !ranks.contains(g)
                    && topo.gpu_present(*g)
                    && topo.gpu_free(*g)
                    && map.get(*g as usize).is_some_and(Option::is_some)
            })
            .collect();
        let ordinals = ranks
            .iter()
            .map(|&g| match map.get(g as usize) {
                Some(Some(o)) => Ok(*o),
                Some(None) => bail!(
                    "--gpus: GPU {g} of topology {t} (PCI address {}) is no visible CUDA device \
                     (CUDA_VISIBLE_DEVICES may hide it)",
                    topo.gpu_info(g)
                        .ok()
                        .and_then(|i| i.pci_bus_id.clone())
                        .unwrap_or_default()
                ),
                None => bail!("--gpus: topology {t} has no GPU {g} ({gpus} GPUs)"),
            })
            .collect::<Result<Vec<_>>>()?;
        let backend = std::sync::Arc::new(relaycc_collectives::CudaBackend::for_gpus(map)?);
        let comm = Communicator::new(topo, &ranks, &relays, backend)?;
        return Ok((comm, ranks, ordinals));
    }
    let map: Vec<usize> = match (&args.gpus, args.ranks) {
        (g, _) if !g.is_empty() => g.iter().map(|&d| d as usize).collect(),
        (_, Some(n)) if n > 0 => (0..n as usize).map(|i| i % visible.len()).collect(),
        _ => bail!("give --ranks N or --gpus LIST"),
    };
    if let Some(bad) = map.iter().find(|&&d| d >= visible.len()) {
        bail!(
            "--gpus: CUDA device {bad} does not exist ({} visible)",
            visible.len()
        );
    }
    let n = u32::try_from(map.len()).context("too many ranks")?;
    let devices: Vec<u32> = (0..n).collect();
    let topo = relaycc_collectives::flat_topology_for_devices(&map)?;
    let backend = std::sync::Arc::new(relaycc_collectives::CudaBackend::new(map.clone())?);
    Ok((
        Communicator::new(topo, &devices, &[], backend)?,
        devices,
        map,
    ))
}

/// Which visible CUDA device drives each GPU of `topo`, given the devices' PCI addresses
/// (`bus_ids`, in ordinal order). Where some visible device sits at the PCI address of a GPU
/// of `topo` (a topology read from this machine), GPU `g` runs on the device at its address,
/// and a GPU at no visible device's address has none: the driver may number devices otherwise
/// than NVML and `nvidia-smi` do (`CUDA_DEVICE_ORDER`, `CUDA_VISIBLE_DEVICES`), so an index is
/// no address. Otherwise (a preset, or another machine's file), GPU `g` runs on device
/// `g mod visible`, several logical GPUs to a device when the topology has more, and an arena
/// of GPU `d`'s memory (`shared-gpu-N`) on device `d mod visible`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn device_map(topo: &relaycc_topo::Topology, bus_ids: &[&str]) -> Vec<Option<usize>> {
    let gpus = topo.gpu_count() as usize;
    let mut map = vec![None; gpus];
    for (ordinal, bus) in bus_ids.iter().enumerate() {
        if let Some(g) = relaycc_topo::import::nvml::gpu_at_bus_id(topo, bus)
            && let Some(slot) = map.get_mut(g as usize)
        {
            slot.get_or_insert(ordinal);
        }
    }
    if map.iter().all(Option::is_none) && !bus_ids.is_empty() {
        // Ranks that are arenas of one GPU's memory (`shared-gpu-N`) run on that GPU.
        let device = |g: usize| {
            let arena = topo.gpu_info(g as u32).ok().and_then(|i| i.device_arena);
            arena.map_or(g, |d| d as usize) % bus_ids.len()
        };
        return (0..gpus).map(|g| Some(device(g))).collect();
    }
    map
}

/// A communicator on CUDA GPUs: this build has no CUDA.
#[cfg(not(feature = "cuda"))]
pub(crate) fn communicator(_args: &BenchArgs) -> Result<(Communicator, Vec<u32>, Vec<usize>)> {
    anyhow::bail!("--backend cuda: {NO_CUDA}")
}

/// Total memory of each visible CUDA device, bytes, in ordinal order.
#[cfg(feature = "cuda")]
pub(crate) fn device_memory_bytes() -> Result<Vec<u64>> {
    let visible = relaycc_collectives::cuda::devices().context("--backend cuda")?;
    Ok(visible.iter().map(|d| d.total_memory_bytes).collect())
}

/// Total memory of each visible CUDA device: this build has no CUDA.
#[cfg(not(feature = "cuda"))]
pub(crate) fn device_memory_bytes() -> Result<Vec<u64>> {
    anyhow::bail!("--backend cuda: {NO_CUDA}")
}

/// NCCL on the ranks' CUDA devices, with buffers for `count` elements per rank (the largest
/// size), or why not.
#[cfg(feature = "cuda")]
pub(crate) fn nccl_baseline(
    ordinals: &[usize],
    count: u64,
    c: Collective,
    dtype: DType,
) -> std::result::Result<Nccl, String> {
    use relaycc_collectives::cuda::nccl::{NcclComms, nccl_buffer_elems};
    let (ins, outs) = nccl_buffer_elems(c, count, ordinals.len() as u64);
    let capacity = ins.max(outs).saturating_mul(dtype.size());
    NcclComms::new(ordinals, capacity).map_err(|e| e.to_string())
}

/// NCCL on the ranks' CUDA devices: this build has no CUDA.
#[cfg(not(feature = "cuda"))]
pub(crate) fn nccl_baseline(
    _ordinals: &[usize],
    _count: u64,
    _c: Collective,
    _dtype: DType,
) -> std::result::Result<Nccl, String> {
    Err(NO_CUDA.to_owned())
}

/// The NCCL library in use, `libnccl.so.2 2.24.3`, when one loads.
#[cfg(feature = "cuda")]
pub(crate) fn nccl_library() -> Option<String> {
    let i = relaycc_collectives::cuda::nccl::nccl().ok()?;
    Some(format!(
        "{} {}.{}.{}",
        i.library, i.version.0, i.version.1, i.version.2
    ))
}

/// The NCCL library in use: none without CUDA.
#[cfg(not(feature = "cuda"))]
pub(crate) fn nccl_library() -> Option<String> {
    None
}

/// NCCL's time for one collective of `count` elements, microseconds (bench's warm-up and
/// iteration counts).
#[cfg(feature = "cuda")]
pub(crate) fn nccl_time_us(
    nc: &Nccl,
    c: Collective,
    count: u64,
    dtype: DType,
    op: ReduceOp,
    args: &BenchArgs,
) -> Result<f64> {
    let call = relaycc_collectives::cuda::nccl::NcclCall {
        collective: c,
        count,
        dtype,
        op,
        root: args.root,
    };
    nc.time_us(&call, args.warmup, args.iters)
        .context("timing NCCL")
}

/// NCCL's time for one collective: unreachable without CUDA, as no [`Nccl`] exists.
#[cfg(not(feature = "cuda"))]
pub(crate) fn nccl_time_us(
    nc: &Nccl,
    _c: Collective,
    _count: u64,
    _dtype: DType,
    _op: ReduceOp,
    _args: &BenchArgs,
) -> Result<f64> {
    match *nc {}
}

#[cfg(test)]
mod map_tests {
    use super::device_map;

    /// A topology of another machine (no GPU at a visible device's address): GPU `g` on
    /// device `g mod visible`.
    #[test]
    fn a_preset_plays_on_the_visible_devices_in_turn() {
        let topo = relaycc_topo::preset("dgx-h100").unwrap();
        let map = device_map(&topo, &["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"]);
        let want: Vec<Option<usize>> = (0..8).map(|g| Some(g % 3)).collect();
        assert_eq!(map, want);
        assert_eq!(device_map(&topo, &[]), vec![None; 8]);
        // Ranks sharing one GPU's memory stay on one device, however many are visible.
        let shared = relaycc_topo::preset("shared-gpu-4").unwrap();
        assert_eq!(device_map(&shared, &["a", "b"]), vec![Some(0); 4]);
    }

    /// A topology read from a machine maps by address: the driver's order (here reversed,
    /// one device hidden) is not NVML's.
    #[test]
    fn a_machine_s_topology_maps_gpus_by_pci_address() {
        let mut b = relaycc_topo::TopologyBuilder::new("read");
        let cpu = b.add_cpu(0, relaycc_topo::rates::CpuFamily::IntelSkylake);
        for (i, bus) in ["0000:18:00.0", "0000:2A:00.0", "0000:3a:00.0"]
            .iter()
            .enumerate()
        {
            let mut info = relaycc_topo::GpuInfo::new(i as u32);
            info.pci_bus_id = Some((*bus).to_string());
            let g = b.add_gpu(info);
            b.pcie(cpu, g, 4, 16);
        }
        let topo = b.build().unwrap();
        // CUDA device 0 is NVML's GPU 2, device 1 its GPU 1 (address case differs); GPU 0 is
        // hidden.
        let map = device_map(&topo, &["00000000:3A:00.0", "0000:2a:00.0"]);
        assert_eq!(map, vec![None, Some(1), Some(0)]);
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_every_entry_point_says_so() {
        use clap::Parser;
        let cli = crate::args::Cli::try_parse_from([
            "relaycc",
            "bench",
            "all_reduce",
            "--backend",
            "cuda",
            "--ranks",
            "2",
        ]);
        let Ok(crate::args::Cli {
            command: crate::args::Command::Bench(args),
        }) = cli
        else {
            panic!("bench arguments parse");
        };
        let err = communicator(&args).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("without the `cuda` feature")),
            "{err:?}"
        );
        let err = device_memory_bytes().err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("without the `cuda` feature")),
            "{err:?}"
        );
        assert_eq!(
            nccl_baseline(&[0, 1], 1024, Collective::AllReduce, DType::F32)
                .err()
                .as_deref(),
            Some(NO_CUDA)
        );
        assert_eq!(nccl_library(), None);
    }
}
