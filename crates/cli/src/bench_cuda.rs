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
/// visible device `i mod visible`; plans see `nvswitch-N` (every rank a GPU on one switch: GPU
/// algorithms with MiB chunks, not the host arenas' cache-sized ones). With `--topology T`: the
/// ranks are GPUs of T (`--gpus`, or `--ranks N` for GPUs 0..N), every other free GPU of T may
/// relay, and GPU `g` of T runs on CUDA device `g mod visible`. Without a driver: one clear
/// error.
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
        let map: Vec<usize> = (0..gpus).map(|g| g as usize % visible.len()).collect();
        let relays: Vec<u32> = (0..gpus)
            .filter(|g| !ranks.contains(g) && topo.gpu_present(*g) && topo.gpu_free(*g))
            .collect();
        let ordinals = ranks
            .iter()
            .map(|&g| {
                map.get(g as usize)
                    .copied()
                    .with_context(|| format!("--gpus: topology {t} has no GPU {g} ({gpus} GPUs)"))
            })
            .collect::<Result<Vec<_>>>()?;
        let backend = std::sync::Arc::new(relaycc_collectives::CudaBackend::new(map)?);
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
    let topo = relaycc_collectives::nvswitch_topology(n)?;
    let backend = std::sync::Arc::new(relaycc_collectives::CudaBackend::new(map.clone())?);
    Ok((
        Communicator::new(topo, &devices, &[], backend)?,
        devices,
        map,
    ))
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
