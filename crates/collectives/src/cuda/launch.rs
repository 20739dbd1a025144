//! Launches on the CUDA backend, under the backend's lock: the launch's programs become a
//! schedule (`schedule.rs`), kept and reused by later calls of the same programs, and its
//! driver calls (`calls.rs`) are made one by one on raw handles.
//!
//! A call of programs seen before costs one comparison of the programs with the kept copies,
//! one lookup per binding, the binding checks of `backend/validate.rs` (`bindings_fit`) and a
//! pass that compares the launch's facts with the kept ones; then the kept schedule runs with
//! this call's addresses. Anything else (new programs, bindings on other devices, other facts,
//! kernels loaded since) builds the schedule anew after the full validation, so a kept
//! schedule runs only where [`schedule::build`] would make the same one.
//!
//! A kept schedule on one device whose addresses repeat is captured into a CUDA graph and
//! replayed (`graph.rs`); the framing around it is `calls.rs`'s `walk_replay`.
//!
//! Function handles are resolved once per device, when its kernels are loaded.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaEvent, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use super::backend::{CudaBackend, State, drv, err};
use super::calls::{Around, Call, walk, walk_replay};
use super::graph::{self, GraphReplay};
use super::kernel_sources::{
    BLOCKS_PER_SM, CopyBatchArgs, FORWARD_BATCH_ENTRY, FORWARD_ENTRY, LaunchShape,
    MAX_BATCH_COPIES, MAX_REDUCE_DSTS, MAX_REDUCE_SRCS, REDUCE_ENTRIES, ReduceArgs,
};
use super::memory::resolve;
use super::schedule::{
    self, CopyBy, Fact, LaunchAddr, LaunchPlacement, LaunchSchedule, OnDevice, Step,
};
use crate::backend::validate::{self, Bound};
use crate::backend::{Command, Launch, Program};
use crate::error::Result;

/// Launch schedules kept per backend, least recently used out: a training step's collectives
/// are a few shapes, each one schedule.
pub(super) const SCHEDULES_KEPT: usize = 32;

/// One device's kernels: the module and every function handle, resolved once.
#[derive(Debug)]
pub(super) struct Kernels {
    _module: Arc<CudaModule>,
    forward: CudaFunction,
    forward_batch: CudaFunction,
    /// By index into [`REDUCE_ENTRIES`].
    reduce: Vec<CudaFunction>,
}

/// Whether a device's kernels are loaded.
#[derive(Debug)]
pub(super) enum KernelState {
    /// Not yet asked for.
    NotTried,
    /// Loaded.
    Loaded(Arc<Kernels>),
    /// Loading failed (no NVRTC, say): copies stay on copy engines; a reduction tries again
    /// and reports the error.
    Failed,
}

/// A launch's schedule and what it was built from.
#[derive(Debug)]
struct Kept {
    programs: Vec<Program>,
    binding_dev: Vec<Option<usize>>,
    sm_ok: Vec<bool>,
    facts: Vec<Fact>,
    schedule: Arc<LaunchSchedule>,
    used: u64,
    /// Its captured graph, and when to capture one (`graph.rs`).
    replay: GraphReplay,
}

/// Schedules of recent launches (module docs).
#[derive(Debug, Default)]
pub(super) struct LaunchCache {
    kept: Vec<Kept>,
    clock: u64,
}

impl LaunchCache {
    /// Forget every schedule (the SM-copy threshold changed).
    pub(super) fn clear(&mut self) {
        self.kept.clear();
    }

    /// The kept schedule of exactly these programs, if any.
    fn find(&self, launches: &[Launch<'_>]) -> Option<usize> {
        self.kept.iter().position(|k| {
            k.programs.len() == launches.len()
                && k.programs.iter().zip(launches).all(|(p, l)| p == l.program)
        })
    }

    fn insert(&mut self, kept: Kept) {
        if let Some(i) = self.find_programs(&kept.programs) {
            self.kept[i] = kept;
        } else if self.kept.len() < SCHEDULES_KEPT {
            self.kept.push(kept);
        } else if let Some(i) = (0..self.kept.len()).min_by_key(|&i| self.kept[i].used) {
            self.kept[i] = kept;
        }
    }

    fn find_programs(&self, programs: &[Program]) -> Option<usize> {
        self.kept.iter().position(|k| k.programs == programs)
    }

    /// The graph state of kept schedule `i`.
    pub(super) fn replay_mut(&mut self, i: usize) -> Option<&mut GraphReplay> {
        self.kept.get_mut(i).map(|k| &mut k.replay)
    }
}

/// Buffers of one call, kept in the state so that a call allocates nothing it could keep.
#[derive(Debug, Default)]
pub(super) struct CallScratch {
    /// Each binding of the launch, over its programs: address and bytes.
    bound: Vec<Bound>,
    /// The device of each binding's memory.
    devs: Vec<Option<usize>>,
    /// The launch binding of each program's binding 0.
    bases: Vec<u32>,
    /// Per device: kernels loaded and copies may use them.
    sm_ok: Vec<bool>,
    /// The device of each caller stream (`n + i` for a caller whose context is none of the
    /// backend's `n` devices).
    callers: Vec<usize>,
    /// Each caller's fork event: (device, index into its `forks`), or `None` for one made
    /// for this call alone.
    forks: Vec<Option<OnDevice>>,
}

impl CallScratch {
    /// This call's binding addresses, in launch order.
    pub(super) fn addrs(&self) -> impl Iterator<Item = u64> + Clone + '_ {
        self.bound.iter().map(|b| b.addr)
    }
}

impl CudaBackend {
    /// Check, schedule and enqueue a launch after the previous one; with `callers`, ordered
    /// within those streams too (`submit_on`). An error before the first driver call leaves
    /// everything unchanged.
    pub(super) fn launch(
        &self,
        st: &mut State,
        launches: &[Launch<'_>],
        callers: &[&CudaStream],
    ) -> Result<()> {
        let (schedule, kept) = self.prepare(st, launches)?;
        if schedule.steps.is_empty() {
            return Ok(());
        }
        for &d in &schedule.kernel_devices {
            self.kernels(st, d)?;
        }
        Self::reserve(st, &schedule)?;
        let extra = self.forks(st, callers)?;
        for &s in &schedule.used {
            if !st.dirty.contains(&s) {
                st.dirty.push(s);
            }
        }
        // SAFETY: as the calls below.
        let graph = unsafe { self.graph_for(st, kept, &schedule) };
        // A panic part way leaves part of the launch enqueued with no tail recorded: the
        // launch is finished before the panic goes on, so nothing later can race it.
        let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let st: &State = st;
            let around = Around {
                previous: &st.last,
                callers: &st.scratch.callers,
            };
            // Every call below is safe to make: the launch passed the shared validation
            // against live allocations (or matched a launch that did, `prepare`), the caller
            // of `submit` promised no data race, and every handle used is a live stream, event
            // or function of this backend (reserved above), a caller's stream, or the graph
            // captured from this schedule with these addresses (`graph_for`).
            let mut call = |c: Call<'_>| match (c, graph) {
                // SAFETY: see above.
                (Call::GraphLaunch { stream }, Some((exec, _))) => unsafe {
                    Self::launch_graph(st, exec, stream)
                },
                // SAFETY: see above.
                (other, _) => unsafe { self.call(st, &schedule, other, callers, &extra) },
            };
            match graph {
                Some(_) => walk_replay(&schedule, around, &mut call),
                None => walk(&schedule, around, &mut call),
            }
        }));
        match walked {
            Ok(Ok(())) => {
                st.last.clear();
                match graph {
                    Some((_, hub)) => st.last.push(hub),
                    None => st.last.extend_from_slice(&schedule.sinks),
                }
                Ok(())
            }
            Ok(Err(e)) => {
                // Every stream of the launch records its tail so the next launch is ordered
                // after whatever was enqueued; without them, wait here.
                match Self::record_tails(st, &schedule.used) {
                    Ok(()) => {
                        st.last.clear();
                        st.last.extend_from_slice(&schedule.used);
                    }
                    Err(_) => {
                        self.wait_idle(st);
                        st.last.clear();
                    }
                }
                Err(e)
            }
            Err(panic) => {
                self.wait_idle(st);
                st.last.clear();
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Enqueue a launch ordered within callers' streams, without host synchronization: the
    /// launch's first stream to touch memory waits for an event recorded now on each of
    /// `callers` (and the launch's other streams for it), and each of `callers` then waits for
    /// the launch's sinks, so work a caller enqueues after this call sees the result, and
    /// waiting on a caller's stream waits for this launch (and what came before it on that
    /// stream) only.
    ///
    /// # Safety
    ///
    /// As [`crate::Backend::submit`].
    pub(crate) unsafe fn submit_on(
        &self,
        launches: &[Launch<'_>],
        callers: &[&CudaStream],
    ) -> Result<()> {
        let mut st = super::backend::lock(&self.state);
        let launched = self.launch(&mut st, launches, callers);
        if launched.is_err() {
            // Part of the launch may be enqueued without the callers' streams waiting for it:
            // finish it here, so a caller that sees the error may reuse its memory. (A panic
            // inside `launch` finishes what it enqueued before it goes on.)
            self.wait_idle(&mut st);
        }
        launched
    }

    /// The schedule of a launch: the kept one when the call matches it (with its index among
    /// the kept), else built anew. Leaves the bound addresses in `st.scratch`.
    fn prepare(
        &self,
        st: &mut State,
        launches: &[Launch<'_>],
    ) -> Result<(Arc<LaunchSchedule>, Option<usize>)> {
        let sc = &mut st.scratch;
        sc.bound.clear();
        sc.devs.clear();
        sc.bases.clear();
        for l in launches {
            sc.bases.push(
                u32::try_from(sc.bound.len()).map_err(|_| err("too many bindings in a launch"))?,
            );
            for r in l.bindings {
                let (addr, dev) = resolve(&st.allocs, r)?;
                sc.bound.push(Bound {
                    addr,
                    bytes: r.bytes,
                });
                sc.devs.push(dev);
            }
        }
        Self::refresh_sm_ok(st);
        if let Some(i) = st.schedules.find(launches)
            && Self::matches(st, i, launches)
        {
            let c = &mut st.schedules;
            c.clock += 1;
            c.kept[i].used = c.clock;
            return Ok((c.kept[i].schedule.clone(), Some(i)));
        }
        Ok((self.build(st, launches)?, None))
    }

    /// Whether kept schedule `i` (of these programs) is the one `build` would make now.
    fn matches(st: &State, i: usize, launches: &[Launch<'_>]) -> bool {
        let k = &st.schedules.kept[i];
        let sc = &st.scratch;
        if k.binding_dev != sc.devs || k.sm_ok != sc.sm_ok {
            return false;
        }
        let fits = launches.iter().zip(&sc.bases).all(|(l, &b)| {
            let b = b as usize;
            sc.bound
                .get(b..b + l.bindings.len())
                .is_some_and(|bound| validate::bindings_fit(l.program, bound))
        });
        if !fits {
            return false;
        }
        // The facts depend on the programs and the addresses only, and were checked for the
        // addresses of this schedule's graph when it was captured.
        if k.replay.captured_at(sc.addrs()) {
            return true;
        }
        let mut kept = k.facts.iter();
        let addr = |b: u32| sc.bound.get(b as usize).map_or(0, |x| x.addr);
        let programs = launches.iter().map(|l| l.program);
        schedule::facts(programs, &sc.bases, &addr, &mut |f| kept.next() == Some(&f))
            && kept.next().is_none()
    }

    /// The full path: validate every program, load the kernels copies may use, read the
    /// facts, build the schedule and keep it.
    fn build(&self, st: &mut State, launches: &[Launch<'_>]) -> Result<Arc<LaunchSchedule>> {
        for (pi, l) in launches.iter().enumerate() {
            let b = st.scratch.bases[pi] as usize;
            let bound = &st.scratch.bound[b..b + l.bindings.len()];
            validate::resolve("cuda", pi, l.program, bound)?;
        }
        let programs: Vec<&Program> = launches.iter().map(|l| l.program).collect();
        if wants_sm_copies(&programs, st.sm_copy_below) {
            for p in &programs {
                for loc in &p.lanes {
                    let d = self.lane_dev(*loc)?;
                    if matches!(st.devices[d].kernels, KernelState::NotTried) {
                        // A failure leaves the device's copies on copy engines.
                        let _ = self.kernels(st, d);
                    }
                }
            }
            Self::refresh_sm_ok(st);
        }
        let sc = &st.scratch;
        let mut facts = Vec::new();
        let addr = |b: u32| sc.bound.get(b as usize).map_or(0, |x| x.addr);
        schedule::facts(programs.iter().copied(), &sc.bases, &addr, &mut |f| {
            facts.push(f);
            true
        });
        let lane_dev = |loc| self.lane_dev(loc);
        let reaches = |a: usize, b: usize| self.reach[a][b];
        let place = LaunchPlacement {
            lane_dev: &lane_dev,
            binding_dev: &sc.devs,
            reaches: &reaches,
            sm_ok: &sc.sm_ok,
            sm_copy_below: st.sm_copy_below,
            devices: st.devices.len(),
        };
        let schedule = Arc::new(schedule::build(&programs, &sc.bases, &place, &facts)?);
        let kept = Kept {
            programs: programs.iter().map(|p| (*p).clone()).collect(),
            binding_dev: sc.devs.clone(),
            sm_ok: sc.sm_ok.clone(),
            facts,
            schedule: schedule.clone(),
            used: st.schedules.clock + 1,
            replay: GraphReplay::after(sc.addrs(), graph::capturable(&schedule)),
        };
        st.schedules.clock += 1;
        st.schedules.insert(kept);
        Ok(schedule)
    }

    /// Per device: copies may run on its SMs (a threshold above 0 and its kernels loaded).
    fn refresh_sm_ok(st: &mut State) {
        let on = st.sm_copy_below > 0;
        st.scratch.sm_ok.clear();
        st.scratch.sm_ok.extend(
            st.devices
                .iter()
                .map(|d| on && matches!(d.kernels, KernelState::Loaded(_))),
        );
    }

    /// The kernels of device `d`: loaded (NVRTC or precompiled PTX) and every function handle
    /// resolved on first use, kept after.
    pub(super) fn kernels(&self, st: &mut State, d: usize) -> Result<Arc<Kernels>> {
        if let KernelState::Loaded(k) = &st.devices[d].kernels {
            return Ok(k.clone());
        }
        let loaded = self.load_kernels(st, d);
        st.devices[d].kernels = match &loaded {
            Ok(k) => KernelState::Loaded(k.clone()),
            Err(_) => KernelState::Failed,
        };
        loaded
    }

    fn load_kernels(&self, st: &State, d: usize) -> Result<Arc<Kernels>> {
        let ptx = self.kernels.ptx(st.devices[d].arch)?;
        let module = st.devices[d]
            .ctx
            .load_module(Ptx::from_src(ptx.ptx.clone()))
            .map_err(drv("cuModuleLoadData"))?;
        let function = |name: &str| {
            module
                .load_function(name)
                .map_err(drv("cuModuleGetFunction"))
        };
        let forward = function(FORWARD_ENTRY)?;
        let forward_batch = function(FORWARD_BATCH_ENTRY)?;
        let reduce = REDUCE_ENTRIES
            .iter()
            .map(|e| function(e))
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Kernels {
            _module: module,
            forward,
            forward_batch,
            reduce,
        }))
    }

    /// Create the streams, tail events, program events and join event the schedule needs
    /// that the pools lack.
    fn reserve(st: &mut State, s: &LaunchSchedule) -> Result<()> {
        for (d, dev) in st.devices.iter_mut().enumerate() {
            while dev.streams.len() < s.streams_per_device[d] {
                dev.streams
                    .push(dev.ctx.new_stream().map_err(drv("cuStreamCreate"))?);
                dev.tails
                    .push(dev.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
            }
            while dev.events.len() < s.events_per_device[d] {
                dev.events
                    .push(dev.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
            }
        }
        if let Some(&(_, (d, _))) = s.frame_at.first() {
            let dev = &mut st.devices[d];
            if dev.join.is_none() {
                dev.join = Some(dev.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
            }
        }
        Ok(())
    }

    /// The callers' devices and fork events: pooled events of the caller's device, or, for a
    /// caller whose context is none of the backend's, an event made for this call (returned,
    /// kept alive until the launch is enqueued).
    fn forks(&self, st: &mut State, callers: &[&CudaStream]) -> Result<Vec<CudaEvent>> {
        let n = st.devices.len();
        let mut extra = Vec::new();
        st.scratch.callers.clear();
        st.scratch.forks.clear();
        for (i, c) in callers.iter().enumerate() {
            let ctx = c.context().cu_ctx();
            match st.devices.iter().position(|d| d.ctx.cu_ctx() == ctx) {
                Some(d) => {
                    // The caller's fork is the next pooled event of its device.
                    let k = st.scratch.callers.iter().filter(|&&c| c == d).count();
                    let dev = &mut st.devices[d];
                    if dev.forks.len() <= k {
                        dev.forks
                            .push(dev.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
                    }
                    st.scratch.callers.push(d);
                    st.scratch.forks.push(Some((d, k)));
                }
                None => {
                    extra.push(c.context().new_event(None).map_err(drv("cuEventCreate"))?);
                    st.scratch.callers.push(n + i);
                    st.scratch.forks.push(None);
                }
            }
        }
        Ok(extra)
    }

    /// Record the tail event of every stream in `streams` (after a failed launch).
    fn record_tails(st: &State, streams: &[OnDevice]) -> Result<()> {
        for &(d, k) in streams {
            let dev = &st.devices[d];
            dev.tails[k]
                .record(&dev.streams[k])
                .map_err(drv("cuEventRecord"))?;
        }
        Ok(())
    }

    /// Make one driver call of [`walk`].
    ///
    /// # Safety
    ///
    /// `s` is the schedule of a launch that passed the shared validation with the bindings in
    /// `st.scratch`, reserved (`reserve`, `forks`), whose memory no other work races.
    pub(super) unsafe fn call(
        &self,
        st: &State,
        s: &LaunchSchedule,
        c: Call<'_>,
        callers: &[&CudaStream],
        extra: &[CudaEvent],
    ) -> Result<()> {
        let n = st.devices.len();
        let stream = |(d, k): OnDevice| st.devices[d].streams[k].cu_stream();
        let tail = |(d, k): OnDevice| st.devices[d].tails[k].cu_event();
        let fork = |i: usize| -> Result<sys::CUevent> {
            match st.scratch.forks.get(i).copied().flatten() {
                Some((d, k)) => Ok(st.devices[d].forks[k].cu_event()),
                None => {
                    let j = st.scratch.forks[..i].iter().filter(|f| f.is_none()).count();
                    extra
                        .get(j)
                        .map(CudaEvent::cu_event)
                        .ok_or_else(|| err("no fork event for a caller"))
                }
            }
        };
        let join = |d: usize| -> Result<sys::CUevent> {
            st.devices[d]
                .join
                .as_ref()
                .map(CudaEvent::cu_event)
                .ok_or_else(|| err("join event not reserved"))
        };
        // SAFETY: every handle below is live (the pools only grow, and callers' streams
        // outlive the call); the function's contract covers the memory.
        let r = unsafe {
            match c {
                Call::Bind(d) => {
                    let ctx = match d.checked_sub(n) {
                        None => st.devices[d].ctx.cu_ctx(),
                        Some(i) => callers[i].context().cu_ctx(),
                    };
                    return sys::cuCtxSetCurrent(ctx)
                        .result()
                        .map_err(drv("cuCtxSetCurrent"));
                }
                Call::Step(step) => return self.step(st, s, step),
                Call::RecordFork { caller, fork: f } => {
                    sys::cuEventRecord(fork(f)?, callers[caller].cu_stream())
                }
                Call::WaitTail {
                    stream: on,
                    tail: t,
                } => sys::cuStreamWaitEvent(stream(on), tail(t), 0),
                Call::WaitFork {
                    stream: on,
                    fork: f,
                } => sys::cuStreamWaitEvent(stream(on), fork(f)?, 0),
                Call::RecordJoin { stream: on } => sys::cuEventRecord(join(on.0)?, stream(on)),
                Call::WaitJoin { stream: on, hub } => {
                    sys::cuStreamWaitEvent(stream(on), join(hub)?, 0)
                }
                Call::RecordTail { stream: on } => sys::cuEventRecord(tail(on), stream(on)),
                Call::CallerWait { caller, tail: t } => {
                    sys::cuStreamWaitEvent(callers[caller].cu_stream(), tail(t), 0)
                }
                Call::GraphLaunch { .. } => return Err(err("a graph launch outside a replay")),
            }
        };
        let name = match c {
            Call::RecordFork { .. } | Call::RecordJoin { .. } | Call::RecordTail { .. } => {
                "cuEventRecord"
            }
            _ => "cuStreamWaitEvent",
        };
        r.result().map_err(drv(name))
    }

    /// Make one step's driver call with this call's addresses.
    ///
    /// # Safety
    ///
    /// As [`CudaBackend::call`].
    pub(super) unsafe fn step(&self, st: &State, s: &LaunchSchedule, step: &Step) -> Result<()> {
        let bound = &st.scratch.bound;
        let at = |a: LaunchAddr| -> Result<u64> {
            bound
                .get(a.binding as usize)
                .map(|b| b.addr + a.offset)
                .ok_or_else(|| err("schedule names a binding the launch lacks"))
        };
        let on = |(d, k): OnDevice| st.devices[d].streams[k].cu_stream();
        let kernels = |d: usize| -> Result<&Kernels> {
            match &st.devices[d].kernels {
                KernelState::Loaded(k) => Ok(k),
                _ => Err(err("kernels not loaded")),
            }
        };
        let max_blocks = |d: usize| st.devices[d].sms.saturating_mul(BLOCKS_PER_SM);
        match *step {
            Step::Copy {
                stream,
                src,
                dst,
                bytes,
                by,
            } => {
                let (a, b) = (at(src)?, at(dst)?);
                let size = usize::try_from(bytes).map_err(|_| err("copy size does not fit"))?;
                // SAFETY: both ranges lie inside live allocations (validated), which `free`
                // releases only after this launch; the caller of `submit` promised no
                // concurrent writer. Unified addressing serves device-to-device on one GPU and
                // every copy with pinned host memory.
                let r = unsafe {
                    match by {
                        CopyBy::Engine => sys::cuMemcpyAsync(b, a, size, on(stream)),
                        CopyBy::Peer { src: sd, dst: dd } => sys::cuMemcpyPeerAsync(
                            b,
                            st.devices[dd].ctx.cu_ctx(),
                            a,
                            st.devices[sd].ctx.cu_ctx(),
                            size,
                            on(stream),
                        ),
                        CopyBy::Sm => {
                            let f = kernels(stream.0)?.forward.cu_function();
                            let shape = LaunchShape::for_bytes(bytes, max_blocks(stream.0));
                            let mut params: [*mut c_void; 3] = [
                                (&b as *const u64).cast_mut().cast(),
                                (&a as *const u64).cast_mut().cast(),
                                (&bytes as *const u64).cast_mut().cast(),
                            ];
                            // SAFETY: relaycc_forward(void* dst, const void* src, u64 bytes):
                            // three 64-bit values, read by the driver before the call returns;
                            // the schedule sends only copies between device memories the
                            // stream's GPU reaches here.
                            launch(f, shape, on(stream), &mut params)
                        }
                    }
                };
                let name = match by {
                    CopyBy::Engine => "cuMemcpyAsync",
                    CopyBy::Peer { .. } => "cuMemcpyPeerAsync",
                    CopyBy::Sm => "cuLaunchKernel",
                };
                r.result().map_err(drv(name))
            }
            Step::Reduce {
                stream,
                entry,
                operands,
                nsrcs,
                ndsts,
                len,
                bytes,
                divisor,
            } => {
                let (ns, nd) = (usize::from(nsrcs), usize::from(ndsts));
                let ops = s
                    .operands
                    .get(operands as usize..operands as usize + ns + nd)
                    .filter(|_| (1..=MAX_REDUCE_SRCS).contains(&ns))
                    .filter(|_| (1..=MAX_REDUCE_DSTS).contains(&nd))
                    .ok_or_else(|| err("schedule: reduce operands out of range"))?;
                let mut args = ReduceArgs {
                    n: len,
                    nsrcs: u32::from(nsrcs),
                    ndsts: u32::from(ndsts),
                    divisor,
                    ..ReduceArgs::default()
                };
                for (slot, &a) in args.srcs.iter_mut().zip(&ops[..ns]) {
                    *slot = at(a)?;
                }
                for (slot, &a) in args.dsts.iter_mut().zip(&ops[ns..]) {
                    *slot = at(a)?;
                }
                let f = kernels(stream.0)?
                    .reduce
                    .get(usize::from(entry))
                    .ok_or_else(|| err("schedule: no such reduce kernel"))?
                    .cu_function();
                let shape = LaunchShape::for_bytes(bytes, max_blocks(stream.0));
                let mut params: [*mut c_void; 1] = [(&mut args as *mut ReduceArgs).cast()];
                // SAFETY: every reduce kernel takes one RelayccReduceArgs by value, whose
                // layout ReduceArgs mirrors (checked against the PTX when it was loaded); the
                // driver copies it before the call returns. Every operand holds `len` elements
                // of the program's type inside live allocations (validated), each destination
                // equals or avoids each source and the destinations are apart (the facts).
                unsafe { launch(f, shape, on(stream), &mut params) }
                    .result()
                    .map_err(drv("cuLaunchKernel"))
            }
            Step::CopyBatch {
                stream,
                first,
                count,
            } => {
                let copies = s
                    .batched
                    .get(first as usize..first as usize + usize::from(count))
                    .ok_or_else(|| err("schedule: batched copies out of range"))?;
                let (mut args, total) = batch_args(copies, &at)?;
                let f = kernels(stream.0)?.forward_batch.cu_function();
                let shape = LaunchShape::for_bytes(total, max_blocks(stream.0));
                let mut params: [*mut c_void; 1] = [(&mut args as *mut CopyBatchArgs).cast()];
                // SAFETY: relaycc_forward_batch(RelayccCopyBatch) takes one struct by value,
                // read by the driver before the call returns; the schedule batches only copies
                // between device memories the stream's GPU reaches, inside live allocations
                // (validated), whose ranges are apart from each other's (the batch facts).
                unsafe { launch(f, shape, on(stream), &mut params) }
                    .result()
                    .map_err(drv("cuLaunchKernel"))
            }
            Step::Record { stream, event } => {
                let e = st.devices[event.0].events[event.1].cu_event();
                // SAFETY: a live event and stream of this backend.
                unsafe { sys::cuEventRecord(e, on(stream)) }
                    .result()
                    .map_err(drv("cuEventRecord"))
            }
            Step::Wait { stream, event } => {
                let e = st.devices[event.0].events[event.1].cu_event();
                // SAFETY: as above; the record was enqueued before (schedule order).
                unsafe { sys::cuStreamWaitEvent(on(stream), e, 0) }
                    .result()
                    .map_err(drv("cuStreamWaitEvent"))
            }
        }
    }
}

/// `cuLaunchKernel` of `f` in `shape` on `stream`.
///
/// # Safety
///
/// `params` point at values matching `f`'s parameters, and the kernel's memory accesses are
/// the caller's to vouch for.
/// The batched forward kernel's argument for `copies` (source, destination, bytes, with
/// addresses resolved by `at`), and their bytes in all.
fn batch_args(
    copies: &[(LaunchAddr, LaunchAddr, u64)],
    at: &dyn Fn(LaunchAddr) -> Result<u64>,
) -> Result<(CopyBatchArgs, u64)> {
    if !(1..=MAX_BATCH_COPIES).contains(&copies.len()) {
        return Err(err("schedule: a batch of no copies or too many"));
    }
    let mut args = CopyBatchArgs {
        count: copies.len() as u32,
        ..CopyBatchArgs::default()
    };
    let mut total = 0u64;
    for (e, &(src, dst, bytes)) in copies.iter().enumerate() {
        args.srcs[e] = at(src)?;
        args.dsts[e] = at(dst)?;
        args.bytes[e] = bytes;
        total = total.saturating_add(bytes);
    }
    Ok((args, total))
}

/// `cuLaunchKernel` of `f` in `shape` (one dimension, no shared memory) on `stream`.
///
/// # Safety
///
/// `params` point at values laid out as the kernel's parameters, and every address among them
/// is valid for what the kernel reads and writes until the stream passes the launch.
pub(super) unsafe fn launch(
    f: sys::CUfunction,
    shape: LaunchShape,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> sys::CUresult {
    // SAFETY: the caller's contract.
    unsafe {
        sys::cuLaunchKernel(
            f,
            shape.blocks,
            1,
            1,
            shape.threads_per_block,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
}

/// Whether a launch has a copy (or a one-source reduction) that may run on SMs: one small
/// enough, or one that heads a fan-out (a kernel at any size), so its devices' kernels load.
pub(super) fn wants_sm_copies(programs: &[&Program], below: u64) -> bool {
    programs.iter().any(|p| {
        p.commands.iter().enumerate().any(|(ci, c)| match c {
            // Copies of one source back to back are a kernel at any size (`fan_out.rs`).
            Command::Copy { src, .. } => {
                src.bytes > 0 && (src.bytes < below || super::fan_out::heads(p, ci))
            }
            Command::Reduce { count: 1, dst, .. } => dst.bytes > 0 && dst.bytes < below,
            _ => false,
        })
    })
}
