//! CUDA graphs of kept schedules: a launch whose steps all run on one device, called again
//! with the addresses of its previous call, is captured once (stream capture of exactly the
//! steps a direct launch makes, `launch.rs`) into a graph, and every later call with the same
//! addresses replays it with one `cuGraphLaunch` between the framing calls (`calls.rs`,
//! `walk_replay`). A launch of hundreds of copies, kernels and event waits then costs the host
//! a handful of driver calls.
//!
//! When a graph is used ([`GraphReplay::mode`]; never with `CudaBackend::set_graph_replay(false)`):
//! - the launch spans one device (capture across devices is left out: every such launch runs
//!   directly, as before) and copies no more than [`GRAPH_COPY_MAX_BYTES`] at a time
//!   ([`capturable`], worked out once per kept schedule);
//! - its addresses equal the graph's: replay; else, equal to the previous call's (a training
//!   loop's buffers, the second time round): capture anew, replacing the graph; else direct.
//!   So buffers that change every call cost one comparison of addresses and no capture.
//! - a capture that fails (a driver without graphs, an error inside it) leaves the schedule
//!   direct for good; the call runs directly.
//!
//! A graph holds its addresses as the capture saw them, so it runs only where they are this
//! call's: the memory is the same, validated as the kept schedule's was. Dropping a graph
//! (its schedule evicted or rebuilt) frees it without waiting: the driver releases an
//! executable graph still running once it finishes.

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaEvent};

use super::backend::{CudaBackend, State, drv};
use super::calls::replay_hub;
use super::schedule::{LaunchSchedule, OnDevice, Step};
use crate::error::Result;

/// Copies above this many bytes keep a launch out of graphs: a single 1 GiB copy-engine copy
/// replayed from a graph ran slower than made directly, while copies of up to 256 MiB ran as
/// fast or faster replayed (`docs/MEASUREMENTS.md`); beside a copy this long the driver calls
/// a graph saves are nothing.
pub(super) const GRAPH_COPY_MAX_BYTES: u64 = 256 << 20;

/// Whether a launch of `s` may be captured: it has a step, every stream it uses is on the hub's
/// device, and it copies no more than [`GRAPH_COPY_MAX_BYTES`] at a time. Worked out once
/// per kept schedule.
pub(super) fn capturable(s: &LaunchSchedule) -> bool {
    replay_hub(s).is_some_and(|hub| {
        s.used.iter().all(|&(d, _)| d == hub.0)
            && s.steps.iter().all(|step| match *step {
                Step::Copy { bytes, .. } => bytes <= GRAPH_COPY_MAX_BYTES,
                _ => true,
            })
    })
}

/// An instantiated graph of one kept schedule, and the addresses it was captured with.
#[derive(Debug)]
pub(super) struct Graph {
    exec: sys::CUgraphExec,
    /// The launch's binding addresses at capture.
    addrs: Vec<u64>,
    /// Its device's context, kept alive for the destroy.
    ctx: Arc<CudaContext>,
}

// SAFETY: a graph's handle is used only under the backend's lock (launches) and destroyed
// once, on drop; the driver's graph calls may come from any thread.
unsafe impl Send for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        // Errors cannot be returned from a drop; a failed destroy leaks the graph only.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `exec` came from cuGraphInstantiateWithFlags and is destroyed once; an
        // in-flight launch of it finishes before the driver frees it.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
        }
    }
}

/// How a kept schedule's next call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RunMode {
    /// Its steps one by one (`calls::walk`).
    Direct,
    /// Captured into a graph now, then replayed.
    Capture,
    /// Its graph replayed (`calls::walk_replay`).
    Replay,
}

/// A kept schedule's graph and what decides when to capture one (module docs).
#[derive(Debug)]
pub(super) struct GraphReplay {
    /// The previous call's addresses.
    last: Vec<u64>,
    graph: Option<Graph>,
    /// The schedule may be captured ([`capturable`]) and no capture of it has failed.
    capturable: bool,
}

impl GraphReplay {
    /// A replay state of a schedule that may be captured or not, whose previous call had
    /// `addrs`.
    pub(super) fn after(addrs: impl Iterator<Item = u64>, capturable: bool) -> GraphReplay {
        GraphReplay {
            last: addrs.collect(),
            graph: None,
            capturable,
        }
    }

    /// How a call with binding addresses `addrs` runs. Remembers `addrs` as the previous
    /// call's.
    pub(super) fn mode(&mut self, addrs: impl Iterator<Item = u64> + Clone) -> RunMode {
        if !self.capturable {
            return RunMode::Direct;
        }
        if self.captured_at(addrs.clone()) {
            return RunMode::Replay;
        }
        if self.last.iter().copied().eq(addrs.clone()) {
            return RunMode::Capture;
        }
        self.last.clear();
        self.last.extend(addrs);
        RunMode::Direct
    }

    /// Whether a graph was captured with exactly these addresses.
    pub(super) fn captured_at(&self, addrs: impl Iterator<Item = u64>) -> bool {
        (self.graph.as_ref()).is_some_and(|g| g.addrs.iter().copied().eq(addrs))
    }

    /// The graph to replay: the one `mode` answered `Replay` or a capture stored for.
    pub(super) fn exec(&self) -> Option<sys::CUgraphExec> {
        self.graph.as_ref().map(|g| g.exec)
    }

    /// Keep a captured graph, or, when the capture failed, run directly from now on.
    pub(super) fn captured(&mut self, graph: Option<Graph>) {
        self.capturable = graph.is_some();
        self.graph = graph;
    }
}

impl CudaBackend {
    /// The graph this launch of `s` replays, and its hub stream: `None` to run it directly
    /// (not a kept schedule `kept`, several devices, new addresses, a failed capture). Captures
    /// when [`GraphReplay::mode`] says so.
    ///
    /// # Safety
    ///
    /// As [`CudaBackend::capture`].
    pub(super) unsafe fn graph_for(
        &self,
        st: &mut State,
        kept: Option<usize>,
        s: &LaunchSchedule,
    ) -> Option<(sys::CUgraphExec, OnDevice)> {
        if !st.graph_replay {
            return None;
        }
        let (i, hub) = (kept?, replay_hub(s)?);
        let mode = st.schedules.replay_mut(i)?.mode(st.scratch.addrs());
        if mode == RunMode::Capture {
            // SAFETY: the caller's contract.
            let graph = unsafe { self.capture(st, s, hub) };
            st.schedules.replay_mut(i)?.captured(graph);
        }
        match mode {
            RunMode::Direct => None,
            RunMode::Capture | RunMode::Replay => Some((st.schedules.replay_mut(i)?.exec()?, hub)),
        }
    }

    /// `cuGraphLaunch` of `exec` on `stream`.
    ///
    /// # Safety
    ///
    /// `exec` is a live graph captured from this launch's schedule with this call's addresses
    /// ([`CudaBackend::graph_for`]), whose memory no other work races.
    pub(super) unsafe fn launch_graph(
        st: &State,
        exec: sys::CUgraphExec,
        stream: OnDevice,
    ) -> Result<()> {
        let on = st.devices[stream.0].streams[stream.1].cu_stream();
        // SAFETY: the caller's contract; `on` is a live stream of the graph's device.
        unsafe { sys::cuGraphLaunch(exec, on) }
            .result()
            .map_err(drv("cuGraphLaunch"))
    }

    /// Capture the steps of `s` (one device's) into a graph: the hub stream starts the
    /// capture, every other stream of the launch joins it through an event of the capture's, the
    /// steps are made exactly as a direct launch makes them, and each other stream joins
    /// back into the hub before the capture ends. Nothing runs on the GPU. `None` when
    /// any of it fails (the streams leave capture mode either way).
    ///
    /// # Safety
    ///
    /// As a direct launch of `s` (`CudaBackend::call`): `st.scratch` holds the bindings of a
    /// validated launch of `s`, reserved, whose memory no other work races.
    pub(super) unsafe fn capture(
        &self,
        st: &State,
        s: &LaunchSchedule,
        hub: OnDevice,
    ) -> Option<Graph> {
        let d = hub.0;
        let dev = &st.devices[d];
        dev.ctx.bind_to_thread().ok()?;
        let stream = |(_, k): OnDevice| dev.streams[k].cu_stream();
        // Events of the capture's own for its fork and joins: an event recorded inside a
        // capture cannot be waited for outside it until recorded again, so the streams' tails
        // (which the next launch waits for) must not be used here.
        let marks: Vec<CudaEvent> = (0..s.used.len())
            .map(|_| dev.ctx.new_event(None))
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        let mark = |i: usize| marks[i].cu_event();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: live streams and events of this backend's device `d`; the steps are the
        // launch's own under the caller's contract.
        unsafe {
            sys::cuStreamBeginCapture_v2(stream(hub), mode)
                .result()
                .ok()?;
            let body = || -> Result<()> {
                // Mark 0 forks the capture from the hub; mark i + 1 joins the i-th other
                // stream back.
                let joined = s.used.iter().copied().filter(|&o| o != hub);
                sys::cuEventRecord(mark(0), stream(hub))
                    .result()
                    .map_err(drv("cuEventRecord"))?;
                for other in joined.clone() {
                    sys::cuStreamWaitEvent(stream(other), mark(0), 0)
                        .result()
                        .map_err(drv("cuStreamWaitEvent"))?;
                }
                for step in &s.steps {
                    self.step(st, s, step)?;
                }
                for (i, other) in joined.enumerate() {
                    sys::cuEventRecord(mark(i + 1), stream(other))
                        .result()
                        .map_err(drv("cuEventRecord"))?;
                    sys::cuStreamWaitEvent(stream(hub), mark(i + 1), 0)
                        .result()
                        .map_err(drv("cuStreamWaitEvent"))?;
                }
                Ok(())
            };
            let made = body();
            let mut graph: sys::CUgraph = std::ptr::null_mut();
            let ended = sys::cuStreamEndCapture(stream(hub), &mut graph).result();
            if made.is_err() || ended.is_err() || graph.is_null() {
                if !graph.is_null() {
                    let _ = sys::cuGraphDestroy(graph);
                }
                return None;
            }
            let mut exec: sys::CUgraphExec = std::ptr::null_mut();
            let made = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).result();
            let _ = sys::cuGraphDestroy(graph);
            made.ok()?;
            Some(Graph {
                exec,
                addrs: st.scratch.addrs().collect(),
                ctx: dev.ctx.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{GraphReplay, RunMode};

    /// Direct until a call repeats the previous call's addresses, then captured, then
    /// replayed while they stay; new addresses run directly until they repeat.
    #[test]
    fn a_graph_is_captured_when_addresses_repeat_and_replayed_while_they_stay() {
        let at = |a: &'static [u64]| a.iter().copied();
        let mut r = GraphReplay::after(at(&[1, 2]), true);
        assert_eq!(r.mode(at(&[3, 4])), RunMode::Direct);
        assert_eq!(r.mode(at(&[3, 4])), RunMode::Capture);
        // A failed capture leaves the schedule direct for good.
        r.captured(None);
        assert_eq!(r.mode(at(&[3, 4])), RunMode::Direct);
        assert_eq!(r.exec(), None);
        let mut r = GraphReplay::after(at(&[1, 2]), false);
        assert_eq!(r.mode(at(&[1, 2])), RunMode::Direct, "not capturable");
        let mut r = GraphReplay::after(at(&[1, 2]), true);
        assert_eq!(r.mode(at(&[1, 2])), RunMode::Capture);
    }
}
