//! The memories as the simulator's resources, and what each op loads of them.
//!
//! Each GPU's device memory is one resource at its rate ([`relaycc_topo::GpuInfo::mem_gbps`]:
//! bytes read plus written per second), shared by every arena of it (ranks that share one
//! GPU, [`relaycc_topo::GpuInfo::device_arena`]), and a second resource of its writes alone,
//! at the share of that rate a calibration measured
//! ([`relaycc_topo::GpuInfo::measured_write_share`]), or [`DEVICE_WRITE_SHARE`] where none
//! did. Each CPU socket's memory is one resource.
//!
//! What an op loads:
//! - a copy inside one device memory (its own, or between two arenas of one device, whose
//!   links it does not load: the bytes never leave the memory) reads and writes it, and
//!   writes alone when it joins a launch that already reads its source (a reduction's result
//!   or a fan-out's source written to one more destination, [`OpLaunch::JoinedFanOut`]);
//! - a copy across links loads only host memory (device memory outruns every link);
//! - a reduction reads every source and writes its result in its destination's memory.
//!
//! A kernel's bytes count at its GPU's measured kernel rate where a calibration gave one
//! (charged as more or fewer bytes of that memory, so that alone the op takes what the
//! kernel took).

use relaycc_plan::{BufferRef, Location, Op, OpKind, Plan};
use relaycc_plan::{Result, RouteError};
use relaycc_topo::Topology;

use super::launches::OpLaunch;
use crate::config::BYTES_PER_US_PER_GBPS;

/// The share of a device memory's rate (bytes read plus written) that its writes alone
/// reach, where no calibration measured it. Fit to one H200 ("CUDA collectives on one H200"
/// in `docs/MEASUREMENTS.md`, run 4, 4 ranks of one GPU at 256 MiB): the collectives that write four times what they read
/// (all_gather's and broadcast's fan-outs, 525 and 528 us) take as long as copies that read
/// what they write (all_to_all 527 us, the device-to-device memcpy of the same bytes), while
/// reduce_scatter, which reads four times what it writes, moves its bytes 1.6x as fast.
pub const DEVICE_WRITE_SHARE: f64 = 0.5;

/// Maps plan locations to memory resources.
#[derive(Debug)]
pub(super) struct Memories {
    n_edges: usize,
    /// Per GPU: its device memory's resource, from the first memory on.
    gpu: Vec<u32>,
    /// Per GPU: its device memory's writes' resource, from the first memory on.
    gpu_writes: Vec<u32>,
    /// The memory resource of each topology node that is a CPU.
    host: Vec<Option<u32>>,
    /// Some device memory has several arenas.
    arenas: bool,
}

/// Where the memory resources stand among all resources: the location of each memory
/// (`mem_loc`, one per device memory, named by its first GPU, then each CPU socket's), then
/// the location of each device memory's writes (`write_loc`).
pub(super) struct MemoryPlaces {
    pub mem_loc: Vec<Location>,
    pub write_loc: Vec<Location>,
}

/// The memories of `topo` as resources after the edges already in `caps`: each device
/// memory's at its calibrated or table rate, shared by its arenas, then each CPU socket's,
/// then each device memory's writes'.
pub(super) fn memory_resources(topo: &Topology, caps: &mut Vec<f64>) -> (MemoryPlaces, Memories) {
    let n_edges = caps.len();
    let n_gpus = topo.gpu_count() as usize;
    let mut mem_loc = Vec::with_capacity(n_gpus + 2);
    // The rate of each device memory and the share its writes alone reach, and each GPU's
    // memory.
    let mut mem_gbps = Vec::with_capacity(n_gpus);
    let mut gpu = Vec::with_capacity(n_gpus);
    // The memory of each device arena met so far.
    let mut arena_mem: Vec<(u32, u32)> = Vec::new();
    for i in 0..n_gpus as u32 {
        let info = topo.gpu_info(i).ok();
        let arena = info.and_then(|x| x.device_arena);
        if let Some(&(_, k)) = arena.and_then(|a| arena_mem.iter().find(|(d, _)| *d == a)) {
            gpu.push(k);
            continue;
        }
        let gbps = info.map_or(relaycc_topo::rates::gpu_mem_gbps(None), |x| x.mem_gbps());
        let write_share = info
            .and_then(|x| x.measured_write_share)
            .unwrap_or(DEVICE_WRITE_SHARE);
        let k = mem_loc.len() as u32;
        if let Some(a) = arena {
            arena_mem.push((a, k));
        }
        caps.push(gbps * BYTES_PER_US_PER_GBPS);
        mem_gbps.push((gbps, write_share));
        mem_loc.push(Location::Gpu(i));
        gpu.push(k);
    }
    let mut host = vec![None; topo.graph().node_count()];
    for (id, cpu) in topo.cpus() {
        host[id.index()] = Some(mem_loc.len() as u32);
        caps.push(cpu.host_mem_gbps * BYTES_PER_US_PER_GBPS);
        mem_loc.push(Location::Host(id.index() as u32));
    }
    let first_write = mem_loc.len() as u32;
    let mut write_loc = Vec::with_capacity(mem_gbps.len());
    for (k, (gbps, write_share)) in mem_gbps.iter().enumerate() {
        caps.push(gbps * write_share * BYTES_PER_US_PER_GBPS);
        write_loc.push(mem_loc[k]);
    }
    let gpu_writes = gpu.iter().map(|&k| first_write + k).collect();
    // Fewer device memories than GPUs: some GPUs are arenas of one device.
    let arenas = gpu.len() > mem_gbps.len();
    let mems = Memories {
        n_edges,
        gpu,
        gpu_writes,
        host,
        arenas,
    };
    (MemoryPlaces { mem_loc, write_loc }, mems)
}

impl Memories {
    /// The memory resource of `loc`, for op `op`'s messages.
    pub(super) fn resource(&self, op: usize, loc: Location) -> Result<u32> {
        let k = match loc {
            Location::Gpu(g) => *self.gpu.get(g as usize).ok_or_else(|| {
                check(
                    op,
                    format!(
                        "names GPU{g}, which the topology lacks ({} GPUs)",
                        self.gpu.len()
                    ),
                )
            })?,
            Location::Host(n) => self
                .host
                .get(n as usize)
                .copied()
                .flatten()
                .ok_or_else(|| {
                    check(
                        op,
                        format!("names host memory of node {n}, which is not a CPU socket"),
                    )
                })?,
        };
        Ok(self.n_edges as u32 + k)
    }

    /// The resource of `loc`'s writes, where it is a device memory.
    fn writes(&self, loc: Location) -> Option<u32> {
        match loc {
            Location::Gpu(g) => self
                .gpu_writes
                .get(g as usize)
                .map(|&k| self.n_edges as u32 + k),
            Location::Host(_) => None,
        }
    }

    /// Whether op `i` of `plan` is a copy between two arenas of one device: it loads that
    /// memory, not the links its path names. (A copy from a GPU's memory back to itself over
    /// links, as through an NVSwitch, crosses them.)
    pub(super) fn between_arenas(&self, plan: &Plan, i: usize, op: &Op) -> Result<bool> {
        let OpKind::Copy { src, dst } = &op.kind else {
            return Ok(false);
        };
        if !self.arenas {
            return Ok(false);
        }
        let (ls, ld) = (
            location(plan, i, src.buffer)?,
            location(plan, i, dst.buffer)?,
        );
        Ok(ls != ld
            && matches!(ls, Location::Gpu(_))
            && self.resource(i, ls)? == self.resource(i, ld)?)
    }

    /// The memories op `i` of `plan` loads (module docs), each given to `load` with its
    /// bytes per byte of the op; `launch` is how the executor runs the op, `arenas` whether it
    /// is a copy between arenas ([`Memories::between_arenas`]).
    pub(super) fn loads(
        &self,
        topo: &Topology,
        plan: &Plan,
        (i, op, launch, arenas): (usize, &Op, Option<OpLaunch>, bool),
        mut load: impl FnMut(u32, f64),
    ) -> Result<()> {
        match &op.kind {
            OpKind::Copy { src, dst } => {
                let (ls, ld) = (
                    location(plan, i, src.buffer)?,
                    location(plan, i, dst.buffer)?,
                );
                let (rs, rd) = (self.resource(i, ls)?, self.resource(i, ld)?);
                if op.edges.is_empty() || arenas {
                    if rs != rd {
                        return Err(check(i, format!("copies {ls:?} -> {ld:?} over no edges")));
                    }
                    let on_sms = launch.is_some_and(|l| l != OpLaunch::CopyEngine);
                    let kernel = if on_sms {
                        kernel_factor(topo, ls, |g| g.measured_sm_copy_gbps)
                    } else {
                        1.0
                    };
                    let reads = launch != Some(OpLaunch::JoinedFanOut);
                    load(rs, if reads { 2.0 } else { 1.0 } * kernel);
                    if let Some(w) = self.writes(ld) {
                        load(w, kernel);
                    }
                } else {
                    if matches!(ls, Location::Host(_)) {
                        load(rs, 1.0);
                    }
                    if matches!(ld, Location::Host(_)) {
                        load(rd, 1.0);
                    }
                }
            }
            OpKind::Reduce { srcs, dst, .. } => {
                let at = location(plan, i, dst.buffer)?;
                let r = self.resource(i, at)?;
                let kernel = kernel_factor(topo, at, |g| g.measured_reduce_gbps);
                load(r, (srcs.len() as f64 + 1.0) * kernel);
                if let Some(w) = self.writes(at) {
                    load(w, kernel);
                }
            }
        }
        Ok(())
    }
}

/// An error at op `op`.
fn check(op: usize, message: String) -> RouteError {
    RouteError::PlanCheck { op, message }
}

fn location(plan: &Plan, i: usize, b: BufferRef) -> Result<Location> {
    plan.location(b)
        .ok_or_else(|| check(i, format!("names buffer {b:?}, which the plan lacks")))
}

/// Bytes of memory `at` a kernel's byte counts for: the memory's rate over the kernel's
/// where a calibration measured the kernel (`measured`) on that GPU, so that alone it takes
/// what the kernel took; 1 elsewhere.
fn kernel_factor(
    topo: &Topology,
    at: Location,
    measured: impl Fn(&relaycc_topo::GpuInfo) -> Option<f64>,
) -> f64 {
    match at {
        Location::Gpu(g) => topo
            .gpu_info(g)
            .ok()
            .and_then(|info| measured(info).map(|k| info.mem_gbps() / k)),
        Location::Host(_) => None,
    }
    .unwrap_or(1.0)
}
