//! The communicator: a set of ranks on devices of a topology, a backend, and a plan cache.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use relaycc_route::{Location, MAX_ELEMENTS, ReduceOp, Request, RouteError};
use relaycc_topo::Topology;

use crate::backend::host::HostBackend;
use crate::backend::{Backend, ByteRegion, DeviceMem};
use crate::buffer::{AsView, BufferView, DeviceBuffer, RawView};
use crate::element::Element;
use crate::error::{CollectivesError, Result};
use crate::group::{Checked, Group, Pending};
use crate::plan_cache::{Cached, PlanCache, PlanCacheLimits, PlanSource};
use relaycc_topo::host_topology;

/// Ids that tell communicators apart, so a buffer of one is refused by another.
static NEXT_COMM: AtomicU64 = AtomicU64::new(1);

/// Ranks on devices of a topology, the devices it may relay through, and a backend (NCCL's
/// `ncclComm_t`, MPI's communicator). Rank `r` runs on `devices()[r]`.
///
/// Every operation checks its buffers before any byte moves, gets its plan from a cache keyed
/// by the request shape (planned, checked and lowered on the first call only) and returns a
/// [`Pending`] handle. Operations on one communicator run in the order they are issued.
#[derive(Debug)]
pub struct Communicator {
    id: u64,
    topo: Topology,
    devices: Vec<u32>,
    relays: Vec<u32>,
    backend: Arc<dyn Backend>,
    cache: PlanCache,
    /// Staging memory a plan may allocate per device, bytes.
    staging_budget: u64,
    /// The ranks share one host memory: plan with the shared-memory planner.
    /// A zero-byte allocation bound to buffers a rank does not have (a non-root's input).
    null: DeviceMem,
}

/// A topology whose devices are arenas of host memory (`host-N`, [`host_topology`]) paired
/// with the CUDA backend is an error that says which topology to use.
#[cfg(feature = "cuda")]
fn check_gpu_topology(topo: &Topology, devices: &[u32], backend: &dyn Backend) -> Result<()> {
    use crate::backend::sealed::Private;
    match backend.as_cuda(Private) {
        Some(_) => refuse_host_arenas(topo, devices),
        None => Ok(()),
    }
}

/// An error where any of `devices` is an arena of host memory in `topo` (`host-N`,
/// [`host_topology`]), for ranks on GPUs: such a topology's shared-memory plans move 64 KiB
/// chunks, one kernel or copy each, which a CPU's caches want and a GPU pays a launch for
/// (the crate's README measures 60x slower at 64 MiB). The error names the topologies to use.
#[cfg(feature = "cuda")]
pub(crate) fn refuse_host_arenas(topo: &Topology, devices: &[u32]) -> Result<()> {
    let arenas: Vec<u32> = devices
        .iter()
        .copied()
        .filter(|&d| topo.gpu_info(d).is_ok_and(|info| info.host_arena))
        .collect();
    if arenas.is_empty() {
        return Ok(());
    }
    let n = devices.len();
    Err(CollectivesError::Setup(format!(
        "topology {} describes host memory, not GPUs (its devices {arenas:?} are arenas of host \
         memory, the host backend's ranks), and the CUDA backend would run its shared-memory \
         plans a launch per 64 KiB chunk; plan GPU ranks on the machine's own topology \
         (RankComm::cuda reads it through NVML; relaycc_topo::load(\"auto\"), a topology file \
         or a preset) or, without one, nvswitch_topology({n}) (the nvswitch-{n} preset)",
        topo.name(),
    )))
}

/// One-shot calls, each a group of one operation, from the table of all-ranks collectives
/// (`group.rs`, `all_rank_collectives!`): `name (arguments);` makes
/// `pub fn name<T: Element, I: AsView<T>, O: AsView<T>>(&self, arguments) ->
/// Result<Pending<'_>>`, which adds [`Group`]'s `name` with the arguments and launches it.
macro_rules! one_shot {
    ($($(#[$doc:meta])* $name:ident ($($a:ident: $t:ty),*);)*) => {
        $(
            $(#[$doc])*
            pub fn $name<T: Element, I: AsView<T>, O: AsView<T>>(
                &self,
                $($a: $t),*
            ) -> Result<Pending<'_>> {
                let mut g = self.group();
                g.$name($($a),*)?;
                g.launch()
            }
        )*
    };
}

impl Communicator {
    /// A communicator over `devices` (GPU indices of `topo`, in rank order) that may relay
    /// through `relays`, running on `backend`.
    pub fn new(
        topo: Topology,
        devices: &[u32],
        relays: &[u32],
        backend: Arc<dyn Backend>,
    ) -> Result<Self> {
        let setup = |m: String| Err(CollectivesError::Setup(m));
        if devices.is_empty() {
            return setup("no devices given".into());
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return setup(format!("device {d} is listed twice"));
            }
            topo.gpu(*d)?;
            if !topo.gpu_present(*d) || !topo.gpu_free(*d) {
                return setup(format!("device {d} is masked busy or absent"));
            }
        }
        for r in relays {
            topo.gpu(*r)?;
            if devices.contains(r) {
                return setup(format!("relay {r} is also a member"));
            }
        }
        #[cfg(feature = "cuda")]
        check_gpu_topology(&topo, devices, backend.as_ref())?;
        let null = backend.allocate(Location::Gpu(devices[0]), 0)?;
        Ok(Communicator {
            id: NEXT_COMM.fetch_add(1, Ordering::Relaxed),
            topo,
            devices: devices.to_vec(),
            relays: relays.to_vec(),
            backend,
            cache: PlanCache::with_limits(PlanCacheLimits::for_ranks(devices.len())),
            staging_budget: relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES,
            null,
        })
    }

    /// As [`Communicator::new`], relaying also through the GPUs this process may borrow:
    /// [`Communicator::allowed_relays`] (the GPUs in `relays`, plus every other GPU that the
    /// backend can reach and NVML reports idle). Meant for a topology discovered from the live
    /// machine (`--topology auto`), whose GPU indices are NVML's. Without NVML (no driver, or
    /// relaycc-topo built without its `nvml` feature) only the GPUs in `relays` relay.
    pub fn with_idle_relays(
        topo: Topology,
        devices: &[u32],
        relays: &[u32],
        backend: Arc<dyn Backend>,
    ) -> Result<Self> {
        let allowed = Self::allowed_relays(&topo, devices, relays, backend.as_ref());
        Self::new(topo, devices, &allowed, backend)
    }

    /// The GPUs a communicator over `devices` may relay through on this machine: every GPU
    /// listed in `listed`, and every other GPU of `topo` that is not a member, is present and
    /// not masked, that the process can see (`backend` allocates on it) and on which no other
    /// process runs (no compute or graphics process, per NVML:
    /// [`relaycc_topo::import::nvml::idle_gpus`]). Without NVML the list is `listed`, sorted.
    /// Staging a plan puts on a relay counts against that GPU's staging budget like any other.
    pub fn allowed_relays(
        topo: &Topology,
        devices: &[u32],
        listed: &[u32],
        backend: &dyn Backend,
    ) -> Vec<u32> {
        let mut out: Vec<u32> = listed.to_vec();
        let idle = relaycc_topo::import::nvml::idle_gpus().unwrap_or_default();
        for g in idle {
            if devices.contains(&g) || out.contains(&g) || topo.gpu(g).is_err() {
                continue;
            }
            if !topo.gpu_present(g) || !topo.gpu_free(g) {
                continue;
            }
            // Visible to this process: the backend can place memory there.
            if let Ok(m) = backend.allocate(Location::Gpu(g), 0) {
                backend.free(m);
                out.push(g);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// As [`Communicator::new`], with the topology given as `--topology` takes it (a preset,
    /// a file, `auto`), through [`relaycc_topo::load`].
    pub fn from_spec(
        spec: &str,
        devices: &[u32],
        relays: &[u32],
        backend: Arc<dyn Backend>,
    ) -> Result<Self> {
        Self::new(relaycc_topo::load(spec)?, devices, relays, backend)
    }

    /// `n` ranks on `n` logical devices of one host (the `host-N` preset,
    /// [`host_topology`]) on a new [`HostBackend`]. The topology says the ranks share one
    /// memory, so plans come from relaycc-route's shared-memory planner.
    pub fn host(n: u32) -> Result<Self> {
        let devices: Vec<u32> = (0..n).collect();
        Self::new(
            host_topology(n)?,
            &devices,
            &[],
            Arc::new(HostBackend::new()),
        )
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.devices.len()
    }
    /// The device of each rank.
    pub fn devices(&self) -> &[u32] {
        &self.devices
    }
    /// The devices plans may relay through.
    pub fn relays(&self) -> &[u32] {
        &self.relays
    }
    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }
    /// The backend.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }
    /// Number of request shapes whose plans the cache holds.
    pub fn cached_plans(&self) -> usize {
        self.cache.len()
    }
    /// Scratch bytes the cached plans hold, over all devices.
    pub fn cached_scratch_bytes(&self) -> u64 {
        self.cache.scratch_bytes()
    }
    /// The plan cache's limits.
    pub fn plan_cache_limits(&self) -> PlanCacheLimits {
        self.cache.limits()
    }
    /// Bound the plan cache (count and scratch bytes); plans beyond the new limits leave at
    /// once, least recently used first, and their scratch is freed on the backend.
    pub fn set_plan_cache_limits(&self, limits: PlanCacheLimits) {
        self.cache.set_limits(limits, self.backend.as_ref());
    }
    /// Drop every cached plan and free its scratch on the backend (a plan a call holds right
    /// now is freed once that call has submitted). Later calls plan again.
    pub fn clear_plan_cache(&self) {
        self.cache.clear(self.backend.as_ref());
    }
    /// The staging budget plans are made within, bytes per device.
    pub fn staging_budget(&self) -> u64 {
        self.staging_budget
    }
    /// Plan within `bytes` of staging per device from now on (default
    /// [`relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES`]); cached plans are dropped,
    /// since they were made within the old budget. A request no plan fits fails with
    /// [`relaycc_route::RouteError::StagingBudget`] before anything is allocated.
    pub fn set_staging_budget(&mut self, bytes: u64) {
        self.staging_budget = bytes;
        self.cache.clear(self.backend.as_ref());
    }
    /// The checked plan this communicator runs for `request` (planning it on a miss), for
    /// printing and simulation.
    pub fn plan(&self, request: &Request, in_place: bool) -> Result<relaycc_route::Plan> {
        Ok(self
            .plan_for("plan", request, in_place)?
            .exec
            .plan()
            .clone())
    }

    /// `len` zeroed elements on rank `rank`'s device.
    pub fn alloc<T: Element>(&self, rank: usize, len: usize) -> Result<DeviceBuffer<T>> {
        let dev = *self.devices.get(rank).ok_or(CollectivesError::BadRank {
            call: "alloc",
            rank,
            ranks: self.ranks(),
        })?;
        let bytes = (len as u64)
            .checked_mul(T::DTYPE.size())
            .filter(|_| len as u64 <= MAX_ELEMENTS)
            .ok_or_else(|| CollectivesError::Overflow {
                call: "alloc",
                what: format!("{len} elements"),
            })?;
        let mem = self.backend.allocate(Location::Gpu(dev), bytes)?;
        Ok(DeviceBuffer::new(
            self.backend.clone(),
            self.id,
            rank,
            mem,
            len,
        ))
    }

    /// A buffer on rank `rank`'s device holding a copy of `data`.
    pub fn from_slice<T: Element>(&self, rank: usize, data: &[T]) -> Result<DeviceBuffer<T>> {
        let b = self.alloc(rank, data.len())?;
        b.copy_from(data)?;
        Ok(b)
    }

    /// Take a cudarc `CudaSlice<T>` that lives on rank `rank`'s GPU as that rank's buffer,
    /// without copying, so cudarc-based engines (candle and others) pass their tensors' storage
    /// straight to collectives. [`DeviceBuffer::into_cuda_slice`] gives the slice back.
    ///
    /// Needs the CUDA backend ([`crate::CudaBackend`]), and the slice on the CUDA device that
    /// the rank's logical GPU maps to. The slice's own stream is synchronized first; work on
    /// other streams that writes it must be finished by the caller. On error the slice comes
    /// back untouched inside [`Rejected`](crate::cuda::Rejected).
    ///
    /// ```no_run
    /// # // no_run: needs a CUDA GPU and driver.
    /// use std::sync::Arc;
    /// use relaycc_collectives::{Communicator, CudaBackend, ReduceOp, nvswitch_topology};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Two ranks; both on GPU 0 here (a device map), on GPUs 0 and 1 with `vec![0, 1]`.
    /// let backend = Arc::new(CudaBackend::new(vec![0, 0])?);
    /// let comm = Communicator::new(nvswitch_topology(2)?, &[0, 1], &[], backend)?;
    ///
    /// // Storage that a cudarc-based engine owns (e.g. candle's `CudaStorage` slice).
    /// let stream = cudarc::driver::CudaContext::new(0)?.default_stream();
    /// let grads: Vec<_> = (0..2)
    ///     .map(|r| stream.clone_htod(&vec![r as f32; 1024]))
    ///     .collect::<Result<_, _>>()?;
    ///
    /// let bufs: Vec<_> = grads
    ///     .into_iter()
    ///     .enumerate()
    ///     .map(|(r, s)| comm.wrap_cuda_slice(r, s).map_err(|rej| rej.error))
    ///     .collect::<Result<_, _>>()?;
    /// comm.all_reduce(&bufs, &bufs, ReduceOp::Avg)?.wait()?; // in place
    /// let back: Vec<cudarc::driver::CudaSlice<f32>> = bufs
    ///     .into_iter()
    ///     .map(|b| b.into_cuda_slice())
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(stream.clone_dtoh(&back[1])?[0], 0.5);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cuda")]
    pub fn wrap_cuda_slice<T: Element>(
        &self,
        rank: usize,
        slice: cudarc::driver::CudaSlice<T>,
    ) -> std::result::Result<DeviceBuffer<T>, Box<crate::cuda::Rejected<T>>> {
        use crate::backend::sealed::Private;
        use crate::cuda::Rejected;
        let reject = |error, slice| Box::new(Rejected { error, slice });
        let Some(&dev) = self.devices.get(rank) else {
            let e = CollectivesError::BadRank {
                call: "wrap_cuda_slice",
                rank,
                ranks: self.ranks(),
            };
            return Err(reject(e, slice));
        };
        let Some(cuda) = self.backend.as_cuda(Private) else {
            let e = CollectivesError::Backend {
                backend: self.backend.name(),
                message: "wrap_cuda_slice needs the CUDA backend".into(),
            };
            return Err(reject(e, slice));
        };
        let len = slice.len();
        if len as u64 > MAX_ELEMENTS {
            let e = CollectivesError::Overflow {
                call: "wrap_cuda_slice",
                what: format!("{len} elements"),
            };
            return Err(reject(e, slice));
        }
        let mem = cuda.adopt(dev, slice)?;
        Ok(DeviceBuffer::new(
            self.backend.clone(),
            self.id,
            rank,
            mem,
            len,
        ))
    }

    /// Start a group: operations added to it run as one launch.
    pub fn group(&self) -> Group<'_> {
        Group::new(self)
    }

    crate::group::all_rank_collectives!(one_shot);

    /// Run a [`Request`] as given, with one optional buffer per rank and side (`None` where
    /// the request gives the rank no buffer). The typed calls above build their request and
    /// come here; tools that sweep collectives (`relaycc bench`) use it directly.
    pub fn launch_request<T: Element>(
        &self,
        request: &Request,
        inputs: &[Option<BufferView<'_, T>>],
        outputs: &[Option<BufferView<'_, T>>],
    ) -> Result<Pending<'_>> {
        if request.dtype != T::DTYPE {
            return Err(CollectivesError::TypeMismatch {
                call: "launch_request",
                a: request.dtype,
                b: T::DTYPE,
            });
        }
        if request.gpus != self.devices {
            return Err(CollectivesError::Plan {
                call: "launch_request",
                source: RouteError::BadRequest(
                    "the request's GPUs are not the ranks' devices".into(),
                ),
            });
        }
        let raw = |v: &[Option<BufferView<'_, T>>]| v.iter().map(|x| x.map(|x| x.raw())).collect();
        let checked = self.check(
            "launch_request",
            request.clone(),
            raw(inputs),
            raw(outputs),
            None,
        )?;
        let mut g = self.group();
        g.push_checked(checked);
        g.launch()
    }

    /// The backend, shared (a split shares its parent's device backend).
    pub(crate) fn backend_arc(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// The id that buffers of this communicator carry.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn null_region(&self) -> ByteRegion {
        ByteRegion {
            mem: self.null,
            offset: 0,
            bytes: 0,
        }
    }

    pub(crate) fn plan_for(
        &self,
        call: &'static str,
        request: &Request,
        in_place: bool,
    ) -> Result<Arc<Cached>> {
        self.cache.get(
            call,
            PlanSource {
                topo: &self.topo,
                relays: &self.relays,
                staging_budget: self.staging_budget,
            },
            self.backend.as_ref(),
            request,
            in_place,
        )
    }

    /// Check that `view` is a buffer of this communicator on rank `rank`'s device.
    pub(crate) fn owns(
        &self,
        call: &'static str,
        rank: usize,
        side: &'static str,
        view: &RawView,
    ) -> Result<()> {
        if view.comm != self.id {
            return Err(CollectivesError::ForeignBuffer { call, rank, side });
        }
        if view.rank != rank {
            return Err(CollectivesError::WrongRank {
                call,
                rank,
                side,
                owner: view.rank,
            });
        }
        Ok(())
    }

    /// Check one operation's request and buffers (see `call_checks.rs`).
    pub(crate) fn check(
        &self,
        call: &'static str,
        request: Request,
        inputs: Vec<Option<RawView>>,
        outputs: Vec<Option<RawView>>,
        ranks: Option<&[usize]>,
    ) -> Result<Checked> {
        crate::call_checks::check(self, call, request, inputs, outputs, ranks)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Frees wait for launches in flight; errors stay with the backend.
        self.cache.clear_all(self.backend.as_ref());
        self.backend.free(self.null);
    }
}
