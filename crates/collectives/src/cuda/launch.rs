//! Launches on the CUDA backend, in two steps under the backend's lock.
//!
//! [`CudaBackend::prepare`] checks a launch (the shared validation of `backend/validate.rs`,
//! plus the one rule of its own: no copy between ranges that overlap almost entirely) and maps
//! its lanes to streams and its events to CUDA events; nothing is enqueued yet, so an error
//! leaves every buffer unchanged. [`CudaBackend::launch_prepared`] loads the kernels the launch
//! needs, makes sure its streams and events exist, orders its streams after the previous
//! launch's tails, enqueues every command, and records the tails the next launch waits for.

use std::collections::HashMap;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use relaycc_route::{DType, ReduceOp};

use super::backend::{CudaBackend, State, drv, err, resolve};
use crate::backend::Launch;
use crate::backend::validate::{self, Bound, Resolved};
use crate::cuda::{self, LaunchShape};
use crate::error::Result;

/// Most chunks a partially overlapping copy is split into (see `enqueue_copy`).
pub(super) const MAX_OVERLAP_CHUNKS: u64 = 64;

/// A stream or an event: (index into `State::devices`, index on that device).
type OnDevice = (usize, usize);

/// One resolved command.
#[derive(Debug, Clone, Copy)]
enum Task {
    Copy {
        stream: OnDevice,
        src: u64,
        src_dev: Option<usize>,
        dst: u64,
        dst_dev: Option<usize>,
        bytes: u64,
    },
    Reduce {
        stream: OnDevice,
        /// Sources: `Prepared::srcs[first..first + count]`.
        first: usize,
        count: usize,
        dst: u64,
        len: u64,
        divisor: Option<u32>,
    },
    Record {
        stream: OnDevice,
        event: OnDevice,
    },
    Wait {
        stream: OnDevice,
        event: OnDevice,
    },
}

impl Task {
    fn stream(&self) -> OnDevice {
        match *self {
            Task::Copy { stream, .. }
            | Task::Reduce { stream, .. }
            | Task::Record { stream, .. }
            | Task::Wait { stream, .. } => stream,
        }
    }
}

/// A launch checked and mapped to streams and events; nothing enqueued yet.
#[derive(Debug)]
pub(super) struct Prepared {
    tasks: Vec<Task>,
    /// The program of each task.
    task_prog: Vec<usize>,
    /// Source addresses of the reductions.
    srcs: Vec<u64>,
    /// Element type and op of each program.
    kinds: Vec<(DType, ReduceOp)>,
    /// Streams and events needed per device.
    lane_count: Vec<usize>,
    event_count: Vec<usize>,
    /// Streams the launch uses.
    used: Vec<OnDevice>,
    /// (device, program) pairs that run reduction kernels.
    need_kernels: Vec<(usize, usize)>,
}

impl Prepared {
    /// The streams the launch uses, (device index, stream index).
    pub(super) fn used(&self) -> &[OnDevice] {
        &self.used
    }
}

/// The kernels of one program on one device, loaded before anything is enqueued.
struct Funcs {
    reduce: CudaFunction,
}

impl CudaBackend {
    /// Check every program of a launch and map it to streams and events.
    pub(super) fn prepare(&self, st: &State, launches: &[Launch<'_>]) -> Result<Prepared> {
        let mut out = Prepared {
            tasks: Vec::new(),
            task_prog: Vec::new(),
            srcs: Vec::new(),
            kinds: Vec::with_capacity(launches.len()),
            lane_count: vec![0; st.devices.len()],
            event_count: vec![0; st.devices.len()],
            used: Vec::new(),
            need_kernels: Vec::new(),
        };
        for (pi, l) in launches.iter().enumerate() {
            self.prepare_program(st, pi, l, &mut out)?;
        }
        Ok(out)
    }

    fn prepare_program(
        &self,
        st: &State,
        pi: usize,
        l: &Launch<'_>,
        out: &mut Prepared,
    ) -> Result<()> {
        let prog = l.program;
        out.kinds.push((prog.dtype, prog.op));
        let mut bound = Vec::with_capacity(l.bindings.len());
        let mut devs = Vec::with_capacity(l.bindings.len());
        for r in l.bindings {
            let (addr, dev) = resolve(&st.allocs, r)?;
            bound.push(Bound {
                addr,
                bytes: r.bytes,
            });
            devs.push(dev);
        }
        let resolved = validate::resolve("cuda", pi, l, &bound)?;
        let mut streams = Vec::with_capacity(prog.lanes.len());
        for loc in &prog.lanes {
            let d = self.lane_dev(*loc)?;
            streams.push((d, out.lane_count[d]));
            out.lane_count[d] += 1;
        }
        // Each event lives on the device of the lane that records it first; validation put
        // a record before every wait, so a waited event always has one.
        let mut events: Vec<Option<OnDevice>> = vec![None; prog.events as usize];
        let src0 = out.srcs.len();
        out.srcs.extend_from_slice(&resolved.srcs);
        // Lane, binding and event indices below were checked by `validate::resolve`.
        for c in resolved.commands {
            let t = match c {
                Resolved::Copy {
                    lane,
                    src,
                    src_binding,
                    dst,
                    dst_binding,
                    bytes,
                } => {
                    let dist = src.abs_diff(dst);
                    if dist != 0 && dist < bytes && bytes.div_ceil(dist) > MAX_OVERLAP_CHUNKS {
                        return Err(err(format!(
                            "program {pi}: a copy of {bytes} bytes between ranges {dist} bytes \
                             apart (more than {MAX_OVERLAP_CHUNKS} chunks of their distance)"
                        )));
                    }
                    Task::Copy {
                        stream: streams[lane],
                        src,
                        src_dev: devs[src_binding],
                        dst,
                        dst_dev: devs[dst_binding],
                        bytes,
                    }
                }
                Resolved::Reduce {
                    lane,
                    first,
                    count,
                    dst,
                    len,
                    divisor,
                } => {
                    let stream = streams[lane];
                    if len > 0 && (count > 1 || divisor.is_some()) {
                        out.need_kernels.push((stream.0, pi));
                    }
                    Task::Reduce {
                        stream,
                        first: src0 + first,
                        count,
                        dst,
                        len,
                        divisor,
                    }
                }
                Resolved::Record { lane, event } => {
                    let stream = streams[lane];
                    let counts = &mut out.event_count;
                    let event = *events[event].get_or_insert_with(|| {
                        let d = stream.0;
                        counts[d] += 1;
                        (d, counts[d] - 1)
                    });
                    Task::Record { stream, event }
                }
                Resolved::Wait { lane, event } => Task::Wait {
                    stream: streams[lane],
                    event: events[event].ok_or_else(|| {
                        err(format!(
                            "program {pi}: event {event} is waited before a record"
                        ))
                    })?,
                },
            };
            if !out.used.contains(&t.stream()) {
                out.used.push(t.stream());
            }
            out.tasks.push(t);
            out.task_prog.push(pi);
        }
        Ok(())
    }

    /// Enqueue a prepared launch after the previous one and mark its end.
    pub(super) fn launch_prepared(&self, st: &mut State, p: &Prepared) -> Result<()> {
        if p.tasks.is_empty() {
            return Ok(());
        }
        let funcs = self.load_kernels(st, p)?;
        Self::reserve(st, p)?;
        Self::order_after_previous(st, &p.used)?;
        for &s in &p.used {
            if !st.dirty.contains(&s) {
                st.dirty.push(s);
            }
        }
        let r = self.enqueue(st, p, &funcs);
        // Even after a failed enqueue, the tails keep the next launch ordered after whatever
        // was enqueued. Without them, wait here so the next launch has nothing to race.
        match Self::record_tails(st, &p.used) {
            Ok(()) => st.last = p.used.clone(),
            Err(e) => {
                self.wait_idle(st);
                st.last.clear();
                r?;
                return Err(e);
            }
        }
        r
    }

    /// Kernels (NVRTC or precompiled PTX) for every program and device that reduces.
    fn load_kernels(&self, st: &mut State, p: &Prepared) -> Result<HashMap<OnDevice, Funcs>> {
        let mut funcs = HashMap::new();
        for &(d, pi) in &p.need_kernels {
            if funcs.contains_key(&(d, pi)) {
                continue;
            }
            let (dt, op) = p.kinds[pi];
            let name = cuda::reduce_entry(dt, op, false)?;
            let m = self.module(st, d)?;
            let reduce = m.load_function(name).map_err(drv("cuModuleGetFunction"))?;
            funcs.insert((d, pi), Funcs { reduce });
        }
        Ok(funcs)
    }

    /// Create the streams and events the launch needs that the pools lack.
    fn reserve(st: &mut State, p: &Prepared) -> Result<()> {
        for (d, &n) in p.lane_count.iter().enumerate() {
            if n > 0 {
                Self::stream(st, d, n - 1)?;
            }
        }
        for (d, &n) in p.event_count.iter().enumerate() {
            let dev = &mut st.devices[d];
            while dev.events.len() < n {
                dev.events
                    .push(dev.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
            }
        }
        if let Some(&(d, _)) = p.used.first() {
            let dev = &mut st.devices[d];
            if dev.join.is_none() {
                dev.join = Some(dev.ctx.new_event(None).map_err(drv("cuEventCreate"))?);
            }
        }
        Ok(())
    }

    /// Make every stream of the launch wait for the previous launch's tails.
    ///
    /// The first stream waits for every tail and records the device's join event, which the
    /// other streams wait for: `last + used` driver calls instead of `last x used`, which at a
    /// hundred lanes (an NVLS plan on 8 GPUs uses 136) cost more than the collective itself.
    fn order_after_previous(st: &State, used: &[OnDevice]) -> Result<()> {
        let Some((&hub, others)) = used.split_first() else {
            return Ok(());
        };
        if st.last.is_empty() {
            return Ok(());
        }
        let hub_stream = &st.devices[hub.0].streams[hub.1];
        for &(ld, lk) in &st.last {
            if (ld, lk) != hub {
                hub_stream
                    .wait(&st.devices[ld].tails[lk])
                    .map_err(drv("cuStreamWaitEvent"))?;
            }
        }
        if others.is_empty() {
            return Ok(());
        }
        let join = st.devices[hub.0]
            .join
            .as_ref()
            .ok_or_else(|| err("join event not reserved"))?;
        join.record(hub_stream).map_err(drv("cuEventRecord"))?;
        for &(d, k) in others {
            st.devices[d].streams[k]
                .wait(join)
                .map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Record the tail event of every stream the launch used.
    fn record_tails(st: &mut State, used: &[OnDevice]) -> Result<()> {
        for &(d, k) in used {
            let s = st.devices[d].streams[k].clone();
            st.devices[d].tails[k]
                .record(&s)
                .map_err(drv("cuEventRecord"))?;
        }
        Ok(())
    }

    fn enqueue(
        &self,
        st: &mut State,
        p: &Prepared,
        funcs: &HashMap<OnDevice, Funcs>,
    ) -> Result<()> {
        for (i, t) in p.tasks.iter().enumerate() {
            match *t {
                Task::Copy { .. } => Self::enqueue_copy(st, t)?,
                Task::Reduce { stream, .. } => {
                    let pi = p.task_prog[i];
                    let f = funcs.get(&(stream.0, pi)).map(|f| &f.reduce);
                    Self::enqueue_reduce(st, t, &p.srcs, p.kinds[pi], f)?;
                }
                Task::Record {
                    stream: (d, k),
                    event: (ed, ek),
                } => {
                    let s = st.devices[d].streams[k].clone();
                    st.devices[ed].events[ek]
                        .record(&s)
                        .map_err(drv("cuEventRecord"))?;
                }
                Task::Wait {
                    stream: (d, k),
                    event: (ed, ek),
                } => {
                    let s = st.devices[d].streams[k].clone();
                    s.wait(&st.devices[ed].events[ek])
                        .map_err(drv("cuStreamWaitEvent"))?;
                }
            }
        }
        Ok(())
    }

    /// Enqueue a copy on its stream: a peer copy between two GPUs, one call otherwise.
    fn enqueue_copy(st: &State, t: &Task) -> Result<()> {
        let Task::Copy {
            stream: (d, k),
            src,
            src_dev,
            dst,
            dst_dev,
            bytes,
        } = *t
        else {
            return Err(err("not a copy"));
        };
        if bytes == 0 || src == dst {
            return Ok(());
        }
        let dev = &st.devices[d];
        let s = dev.streams[k].cu_stream();
        dev.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // Partly overlapping ranges (legal in the protocol, undefined for
        // cuMemcpy) are copied in chunks of the distance between them, in the
        // direction that never overwrites unread bytes; the stream runs them in
        // order.
        let dist = src.abs_diff(dst);
        let chunks: Vec<(u64, u64, u64)> = if dist >= bytes {
            vec![(src, dst, bytes)]
        } else {
            let n = bytes.div_ceil(dist);
            let mut v: Vec<(u64, u64, u64)> = (0..n)
                .map(|c| {
                    let off = c * dist;
                    (src + off, dst + off, dist.min(bytes - off))
                })
                .collect();
            if dst > src {
                v.reverse();
            }
            v
        };
        for (cs, cd, cb) in chunks {
            let r = match (src_dev, dst_dev) {
                (Some(a), Some(b)) if a != b => {
                    // SAFETY: both ranges were checked inside live allocations of
                    // these devices, which `free` cannot release before this
                    // launch ends; the caller of `submit` promised no concurrent writer.
                    unsafe {
                        sys::cuMemcpyPeerAsync(
                            cd,
                            st.devices[b].ctx.cu_ctx(),
                            cs,
                            st.devices[a].ctx.cu_ctx(),
                            cb as usize,
                            s,
                        )
                    }
                }
                // SAFETY: as above; unified addressing lets one call serve
                // device-to-device on one GPU and any copy with pinned host memory.
                _ => unsafe { sys::cuMemcpyAsync(cd, cs, cb as usize, s) },
            };
            r.result().map_err(drv("cuMemcpyAsync"))?;
        }
        Ok(())
    }

    /// Enqueue a reduction on its stream: a chain of binary kernels, or a copy for one source.
    fn enqueue_reduce(
        st: &State,
        t: &Task,
        srcs: &[u64],
        kind: (DType, ReduceOp),
        f: Option<&CudaFunction>,
    ) -> Result<()> {
        let Task::Reduce {
            stream: (d, k),
            first,
            count,
            dst,
            len,
            divisor,
        } = *t
        else {
            return Err(err("not a reduction"));
        };
        if len == 0 {
            return Ok(());
        }
        let (dt, op) = kind;
        let dev = &st.devices[d];
        let stream = &dev.streams[k];
        let shape = LaunchShape::for_items(len, dev.sms.saturating_mul(4));
        let cfg = LaunchConfig {
            grid_dim: (shape.blocks, 1, 1),
            block_dim: (shape.threads_per_block, 1, 1),
            shared_mem_bytes: 0,
        };
        let s = srcs
            .get(first..first + count)
            .ok_or_else(|| err("reduce sources out of range"))?;
        // Binary kernels: start from the destination when it is a source (so it
        // is read before it is overwritten), then fold the others in.
        let mut order: Vec<u64> = Vec::with_capacity(count + 1);
        if let Some(j) = s.iter().position(|&a| a == dst) {
            order.push(s[j]);
            order.extend(
                s.iter()
                    .enumerate()
                    .filter(|(i, _)| *i != j)
                    .map(|(_, &a)| a),
            );
        } else {
            order.extend_from_slice(s);
        }
        // One source: combine it with itself at half scale (avg), or copy it.
        let steps: Vec<(u64, u64)> = if order.len() == 1 {
            if divisor.is_none() {
                if order[0] != dst {
                    dev.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
                    // SAFETY: both ranges were checked inside live allocations.
                    unsafe {
                        sys::cuMemcpyAsync(
                            dst,
                            order[0],
                            (len * dt.size()) as usize,
                            stream.cu_stream(),
                        )
                    }
                    .result()
                    .map_err(drv("cuMemcpyAsync"))?;
                }
                return Ok(());
            }
            vec![(order[0], order[0])]
        } else {
            let mut v = vec![(order[0], order[1])];
            v.extend(order[2..].iter().map(|&b| (dst, b)));
            v
        };
        let f = f.ok_or_else(|| err("reduction kernel not loaded"))?;
        let nsteps = steps.len();
        for (si, (a, b)) in steps.into_iter().enumerate() {
            let last = si + 1 == nsteps;
            let mut scale = 1.0f64;
            if last && let Some(n) = divisor {
                scale = 1.0 / f64::from(n.max(1));
            }
            if order.len() == 1 {
                scale *= 0.5;
            }
            let mut builder = stream.launch_builder(f);
            builder.arg(&dst).arg(&a).arg(&b).arg(&len);
            if op == ReduceOp::Avg {
                builder.arg(&scale);
            }
            // SAFETY: the kernel's signature is (dst, a, b, n[, scale]) with
            // device pointers as 64-bit values; every range holds `len` elements
            // of the program's type inside live allocations (checked), `dst`
            // equals or avoids each source (checked), and the caller of `submit`
            // promised no concurrent writer.
            unsafe { builder.launch(cfg) }.map_err(drv("cuLaunchKernel"))?;
        }
        Ok(())
    }
}
