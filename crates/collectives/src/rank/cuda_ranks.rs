//! Ranks on CUDA GPUs, one per device, made as an engine makes NCCL's communicators
//! (`ncclCommInitAll(comms, n, devlist)`): [`RankComm::cuda`] plans on the machine as NVML
//! describes it, [`RankComm::cuda_or`] falls back to a topology the caller states where NVML
//! cannot describe it, and [`RankComm::cuda_with_topology`] plans on a stated topology
//! without asking NVML.
//!
//! The rule for discovery: with a CUDA driver present, a machine NVML cannot describe (no
//! `libnvidia-ml`, a query that fails, a CUDA device NVML does not list) is an error of
//! [`RankComm::cuda`], never a guessed topology; the fallback is one the caller names, and
//! the topology then carries a warning that says why it was used ([`Topology::warnings`]).
//! Without a driver every constructor is [`CollectivesError::Cuda`] with
//! [`crate::cuda::CudaError::NoDriver`]: no fallback makes GPUs appear.
//!
//! Each rank's communicator is restricted to the ranks' GPUs: the topology's other GPUs are
//! masked busy (neither members nor relays; their links stay paths through switches), and
//! the backend makes contexts on the ranks' devices only.

use std::sync::Arc;

use relaycc_topo::Topology;
use relaycc_topo::import::nvml;

use super::RankComm;
use crate::backend::sealed::Private;
use crate::communicator::{Communicator, refuse_host_arenas};
use crate::cuda::{self, CudaBackend, DeviceInfo};
use crate::error::{CollectivesError, Result};

impl RankComm {
    /// One rank per CUDA device in `ordinals`, rank `r` on device `ordinals[r]` (ordinals as
    /// the driver numbers them, after `CUDA_VISIBLE_DEVICES`), planning on the machine as NVML
    /// describes it (`ncclCommInitAll`): the topology is NVML's ([`nvml::discover`]), each
    /// device found in it by its PCI address, the other GPUs masked busy. Each handle's calls
    /// take cudarc buffers on the caller's stream ([`RankComm::on`]).
    ///
    /// Errors, before any context is made: no driver ([`CollectivesError::Cuda`] with
    /// [`crate::cuda::CudaError::NoDriver`], never a panic); no device given, a device that
    /// does not exist or one listed twice (one rank per GPU, as NCCL: ranks that share a GPU
    /// are made with [`CudaBackend::new`], [`Communicator::new`] (on
    /// [`crate::shared_gpu_topology`] for ranks on one GPU) and [`Communicator::into_ranks`]); NVML unable to describe the machine
    /// ([`CollectivesError::Setup`] saying why; [`RankComm::cuda_or`] names a fallback).
    ///
    /// ```no_run
    /// # // no_run: needs CUDA GPUs and a driver.
    /// use relaycc_collectives::{Collectives, RankComm, ReduceOp};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ranks = RankComm::cuda(&[0, 1])?;
    /// std::thread::scope(|s| {
    ///     for mut rank in ranks {
    ///         s.spawn(move || -> relaycc_collectives::Result<()> {
    ///             let ordinal = rank.cuda_device().expect("a CUDA rank");
    ///             let stream = cudarc::driver::CudaContext::new(ordinal)
    ///                 .expect("context")
    ///                 .new_stream()
    ///                 .expect("stream");
    ///             let mut grads = stream.clone_htod(&vec![1.0f32; 1 << 20]).expect("upload");
    ///             rank.on(&stream).all_reduce_in_place(&mut grads, ReduceOp::Avg)
    ///         });
    ///     }
    /// });
    /// # Ok(()) }
    /// ```
    pub fn cuda(ordinals: &[usize]) -> Result<Vec<RankComm>> {
        let infos = checked_devices(ordinals)?;
        let (topo, gpus) = discovered(&infos, ordinals).map_err(|why| {
            CollectivesError::Setup(format!(
                "RankComm::cuda: NVML cannot describe this machine ({why}); relaycc does not \
                 guess a topology where a driver is present: state one with \
                 RankComm::cuda_with_topology, or name a fallback with RankComm::cuda_or \
                 (nvswitch_topology({}) where nothing better is known)",
                visible_span(ordinals)
            ))
        })?;
        ranks_on(topo, &gpus, ordinals)
    }

    /// As [`RankComm::cuda`], planning on `fallback` where NVML cannot describe the machine
    /// (no `libnvidia-ml`, a failed query, a device NVML does not list); the topology then
    /// carries a warning naming why ([`Topology::warnings`], on
    /// [`RankComm::communicator`]). `fallback` is read as
    /// [`RankComm::cuda_with_topology`] reads its topology: its GPU `i` is CUDA device `i`
    /// (`nvswitch_topology(n)` for `n` visible devices, where nothing better is known).
    ///
    /// Errors: as [`RankComm::cuda`] and [`RankComm::cuda_with_topology`]; without a driver
    /// [`crate::cuda::CudaError::NoDriver`], whatever the fallback.
    pub fn cuda_or(ordinals: &[usize], fallback: Topology) -> Result<Vec<RankComm>> {
        refuse_host_arenas(&fallback, &as_gpus(ordinals))?;
        let infos = checked_devices(ordinals)?;
        match discovered(&infos, ordinals) {
            Ok((topo, gpus)) => ranks_on(topo, &gpus, ordinals),
            Err(why) => {
                let mut topo = fallback;
                let warning = format!(
                    "NVML cannot describe this machine ({why}): planning on the stated \
                     fallback {}",
                    topo.name()
                );
                topo.add_warning(warning);
                stated(topo, ordinals)
            }
        }
    }

    /// One rank per CUDA device in `ordinals`, rank `r` on device `ordinals[r]`, planning on
    /// `topo`, a description of this machine whose GPU `i` is CUDA device `i` (a preset or a
    /// file of the machine, numbered as the driver numbers its devices, or `nvswitch_topology(n)`
    /// for `n` devices where nothing better is known). NVML is not asked. The topology's
    /// other GPUs are masked busy.
    ///
    /// Errors: a topology of host memory arenas (`host-N`: its plans are the host backend's,
    /// a launch per 64 KiB on a GPU), checked before the driver is asked; a device the
    /// topology does not have, or that it masks; and those of [`RankComm::cuda`] before
    /// discovery.
    pub fn cuda_with_topology(topo: Topology, ordinals: &[usize]) -> Result<Vec<RankComm>> {
        refuse_host_arenas(&topo, &as_gpus(ordinals))?;
        checked_devices(ordinals)?;
        stated(topo, ordinals)
    }

    /// The CUDA device (ordinal) that this rank's buffers and stream live on, `None` where
    /// the communicator's backend is not CUDA.
    pub fn cuda_device(&self) -> Option<usize> {
        let comm = self.communicator();
        let cuda = comm.backend().as_cuda(Private)?;
        cuda.physical_device(*comm.devices().get(self.rank)?)
    }
}

/// The ordinals as GPU indices of a stated topology (whose GPU `i` is CUDA device `i`);
/// ordinals past `u32` stay out of range.
fn as_gpus(ordinals: &[usize]) -> Vec<u32> {
    ordinals
        .iter()
        .map(|&o| u32::try_from(o).unwrap_or(u32::MAX))
        .collect()
}

/// How many devices a fallback needs to cover `ordinals` (the largest one, plus one).
fn visible_span(ordinals: &[usize]) -> usize {
    ordinals.iter().max().map_or(0, |m| m + 1)
}

/// The driver's devices, after checking that `ordinals` names some of them, each once (the
/// list itself is checked before the driver is asked).
fn checked_devices(ordinals: &[usize]) -> Result<Vec<DeviceInfo>> {
    let setup = |m: String| Err(CollectivesError::Setup(m));
    if ordinals.is_empty() {
        return setup("no CUDA devices given".into());
    }
    for (i, &o) in ordinals.iter().enumerate() {
        if ordinals[..i].contains(&o) {
            return setup(format!(
                "CUDA device {o} is listed twice: these constructors make one rank per GPU, as \
                 NCCL does; ranks that share a GPU come from CudaBackend::new(device_map), \
                 Communicator::new (on shared_gpu_topology(n) for n ranks on one GPU) and \
                 Communicator::into_ranks"
            ));
        }
    }
    let infos = cuda::devices()?;
    if infos.is_empty() {
        return setup("the CUDA driver reports no GPU".into());
    }
    if let Some(o) = ordinals.iter().find(|&&o| o >= infos.len()) {
        return setup(format!(
            "CUDA device {o} does not exist ({} visible)",
            infos.len()
        ));
    }
    Ok(infos)
}

/// The machine as NVML describes it, and the GPU index of each device of `ordinals` in it;
/// `Err` says why NVML cannot describe it.
fn discovered(
    infos: &[DeviceInfo],
    ordinals: &[usize],
) -> std::result::Result<(Topology, Vec<u32>), String> {
    let topo = nvml::discover().map_err(|e| e.to_string())?;
    let gpus = ordinals
        .iter()
        .map(|&o| {
            let bus = &infos[o].pci_bus_id;
            nvml::gpu_at_bus_id(&topo, bus).ok_or_else(|| {
                format!(
                    "CUDA device {o} is at PCI address {bus}, where NVML lists no GPU (NVML \
                     lists {})",
                    topo.gpu_count()
                )
            })
        })
        .collect::<std::result::Result<Vec<u32>, String>>()?;
    Ok((topo, gpus))
}

/// Ranks on a stated topology, whose GPU `i` is CUDA device `i`.
fn stated(topo: Topology, ordinals: &[usize]) -> Result<Vec<RankComm>> {
    let gpus = as_gpus(ordinals);
    for (&g, &o) in gpus.iter().zip(ordinals) {
        if topo.gpu(g).is_err() {
            return Err(CollectivesError::Setup(format!(
                "topology {} has no GPU {g} for CUDA device {o} ({} GPUs; its GPU i is CUDA \
                 device i)",
                topo.name(),
                topo.gpu_count()
            )));
        }
    }
    ranks_on(topo, &gpus, ordinals)
}

/// Rank `r` on GPU `gpus[r]` of `topo`, driven by CUDA device `ordinals[r]`; the topology's
/// other GPUs masked busy, the backend on the ranks' devices only.
fn ranks_on(topo: Topology, gpus: &[u32], ordinals: &[usize]) -> Result<Vec<RankComm>> {
    let mut mask = topo.mask().clone();
    mask.busy_gpus
        .extend((0..topo.gpu_count()).filter(|g| !gpus.contains(g)));
    let topo = topo.with_mask(mask)?;
    let mut map = vec![None; topo.gpu_count() as usize];
    for (&g, &o) in gpus.iter().zip(ordinals) {
        map[g as usize] = Some(o);
    }
    let backend = Arc::new(CudaBackend::for_gpus(map)?);
    Ok(Communicator::new(topo, gpus, &[], backend)?.into_ranks())
}
