//! Every driver call of one launch, in order, as data: the schedule's steps with the calls
//! around them (binding a device's context, ordering the launch after the previous one and
//! within the callers' streams, recording the tails the next launch waits for). The launch
//! makes exactly these calls (`launch.rs` executes [`walk`]'s sequence), and
//! [`DriverCalls::of`] counts the same sequence, so the count needs no GPU and cannot drift
//! from what runs.

use relaycc_route::Location;

use super::backend::err;
use super::schedule::{self, CopyBy, LaunchPlacement, LaunchSchedule, OnDevice, Step};
use crate::backend::Program;
use crate::backend::validate::{self, Bound};
use crate::error::Result;

/// One driver call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call<'a> {
    /// `cuCtxSetCurrent` with a device's context (only when the device changes).
    Bind(usize),
    /// The schedule's step.
    Step(&'a Step),
    /// `cuEventRecord` of fork event `fork` on caller stream `caller` (callers of
    /// `submit_on`).
    RecordFork { caller: usize, fork: usize },
    /// `cuStreamWaitEvent(stream, tail of stream `tail`)`: the hub waits for the previous
    /// launch.
    WaitTail { stream: OnDevice, tail: OnDevice },
    /// `cuStreamWaitEvent(stream, fork)`: the hub waits for a caller.
    WaitFork { stream: OnDevice, fork: usize },
    /// `cuEventRecord(join of the stream's device, stream)` on the hub.
    RecordJoin { stream: OnDevice },
    /// `cuStreamWaitEvent(stream, join of device hub)`.
    WaitJoin { stream: OnDevice, hub: usize },
    /// `cuEventRecord(tail of stream, stream)` on a sink.
    RecordTail { stream: OnDevice },
    /// `cuStreamWaitEvent(caller, tail of stream tail)`: a caller waits for the launch.
    CallerWait { caller: usize, tail: OnDevice },
    /// `cuGraphLaunch` of the schedule's captured graph on `stream` (a replayed launch).
    GraphLaunch { stream: OnDevice },
}

/// What a launch is ordered against: the previous launch's sinks, and the callers' streams
/// (`submit_on`) with the device each runs on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Around<'a> {
    /// Streams whose tail events the previous launch recorded.
    pub previous: &'a [OnDevice],
    /// Device of each caller stream.
    pub callers: &'a [usize],
}

/// Passes driver calls on to `f`, binding a device's context first whenever the next call
/// runs on another device than the last; the framing calls both walks make.
struct Issuer<'s, 'f> {
    current: Option<usize>,
    f: &'f mut dyn FnMut(Call<'s>) -> Result<()>,
}

impl<'s> Issuer<'s, '_> {
    fn on(&mut self, dev: usize, call: Call<'s>) -> Result<()> {
        if self.current != Some(dev) {
            self.current = Some(dev);
            (self.f)(Call::Bind(dev))?;
        }
        (self.f)(call)
    }

    /// Each caller records its fork event.
    fn record_forks(&mut self, around: Around<'_>) -> Result<()> {
        for (caller, &dev) in around.callers.iter().enumerate() {
            let fork = caller;
            self.on(dev, Call::RecordFork { caller, fork })?;
        }
        Ok(())
    }

    /// The hub waits for the previous launch's tails (but its own stream's) and the forks.
    fn hub_waits(&mut self, hub: OnDevice, around: Around<'_>) -> Result<()> {
        for &tail in around.previous {
            if tail != hub {
                self.on(hub.0, Call::WaitTail { stream: hub, tail })?;
            }
        }
        for fork in 0..around.callers.len() {
            self.on(hub.0, Call::WaitFork { stream: hub, fork })?;
        }
        Ok(())
    }

    /// Each caller waits for each of `tails`.
    fn caller_waits(&mut self, around: Around<'_>, tails: &[OnDevice]) -> Result<()> {
        for (caller, &dev) in around.callers.iter().enumerate() {
            for &tail in tails {
                self.on(dev, Call::CallerWait { caller, tail })?;
            }
        }
        Ok(())
    }
}

/// Calls `f` with every driver call of a launch of `s` in order, stopping at its first error.
///
/// Ordering: callers record their fork events; the first stream that touches memory before it
/// is ordered (the hub) waits for the previous launch's tails and the forks and, when other
/// streams need it, records its device's join event, which each of them waits for right
/// before its first such step; the sinks record their tails; the callers wait for them. A
/// device's context is bound when the next call runs on another device than the last.
pub(crate) fn walk<'s>(
    s: &'s LaunchSchedule,
    around: Around<'_>,
    f: &mut dyn FnMut(Call<'s>) -> Result<()>,
) -> Result<()> {
    let mut out = Issuer { current: None, f };
    out.record_forks(around)?;
    let framing = !around.previous.is_empty() || !around.callers.is_empty();
    let mut frames = s.frame_at.iter().peekable();
    let hub = replay_hub(s);
    for (i, step) in s.steps.iter().enumerate() {
        while let Some(&&(at, stream)) = frames.peek() {
            if at != i {
                break;
            }
            frames.next();
            if !framing {
                continue;
            }
            if Some(stream) == hub {
                out.hub_waits(stream, around)?;
                if s.frame_at.len() > 1 {
                    out.on(stream.0, Call::RecordJoin { stream })?;
                }
            } else if let Some(h) = hub {
                out.on(stream.0, Call::WaitJoin { stream, hub: h.0 })?;
            }
        }
        out.on(step.stream().0, Call::Step(step))?;
    }
    for &stream in &s.sinks {
        out.on(stream.0, Call::RecordTail { stream })?;
    }
    out.caller_waits(around, &s.sinks)
}

/// The stream a replayed launch of `s` runs its graph on: the first to touch memory (the
/// hub of a direct launch).
pub(crate) fn replay_hub(s: &LaunchSchedule) -> Option<OnDevice> {
    s.frame_at.first().map(|&(_, stream)| stream)
}

/// Calls `f` with every driver call of a replayed launch of `s` (its steps captured in a
/// graph, `graph.rs`), in order: the callers record their forks, the hub waits for the
/// previous launch's tails and the forks, launches the graph (which ends when every step has)
/// and records its tail, which the callers wait for. Nothing when `s` has no step.
pub(crate) fn walk_replay<'s>(
    s: &'s LaunchSchedule,
    around: Around<'_>,
    f: &mut dyn FnMut(Call<'s>) -> Result<()>,
) -> Result<()> {
    let Some(hub) = replay_hub(s) else {
        return Ok(());
    };
    let mut out = Issuer { current: None, f };
    out.record_forks(around)?;
    out.hub_waits(hub, around)?;
    out.on(hub.0, Call::GraphLaunch { stream: hub })?;
    out.on(hub.0, Call::RecordTail { stream: hub })?;
    out.caller_waits(around, &[hub])
}

/// [`walk`] or [`walk_replay`].
pub(crate) type Walker<'s> =
    fn(&'s LaunchSchedule, Around<'_>, &mut dyn FnMut(Call<'s>) -> Result<()>) -> Result<()>;

/// The driver calls of one launch by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCalls {
    /// Copy-engine copies (`cuMemcpyAsync`, `cuMemcpyPeerAsync`).
    pub copies: u32,
    /// Forward-kernel launches (copies on SMs; a batch of copies is one).
    pub sm_copies: u32,
    /// Reduce-kernel launches.
    pub reduce_kernels: u32,
    /// `cuEventRecord`: the program's events, the join, the tails and the callers' forks.
    pub event_records: u32,
    /// `cuStreamWaitEvent`: the program's waits, the framing and the callers' waits.
    pub stream_waits: u32,
    /// `cuCtxSetCurrent`, once per change of device.
    pub context_binds: u32,
    /// `cuGraphLaunch`: a replayed launch's captured steps.
    pub graph_launches: u32,
}

impl DriverCalls {
    /// Every call of [`walk`] over `s` in `around`, counted.
    pub(crate) fn of(s: &LaunchSchedule, around: Around<'_>) -> DriverCalls {
        Self::of_walk(walk, s, around)
    }

    /// Every call of [`walk_replay`] over `s` in `around`, counted.
    pub(crate) fn of_replay(s: &LaunchSchedule, around: Around<'_>) -> DriverCalls {
        Self::of_walk(walk_replay, s, around)
    }

    fn of_walk<'s>(walker: Walker<'s>, s: &'s LaunchSchedule, around: Around<'_>) -> DriverCalls {
        let mut n = DriverCalls::default();
        let counted = walker(s, around, &mut |c| {
            n.count(c);
            Ok(())
        });
        debug_assert!(counted.is_ok());
        n
    }

    fn count(&mut self, c: Call<'_>) {
        let n = self;
        match c {
            Call::Bind(_) => n.context_binds += 1,
            Call::Step(Step::Copy { by: CopyBy::Sm, .. } | Step::CopyBatch { .. }) => {
                n.sm_copies += 1
            }
            Call::Step(Step::Copy { .. }) => n.copies += 1,
            Call::Step(Step::Reduce { .. }) => n.reduce_kernels += 1,
            Call::Step(Step::Record { .. })
            | Call::RecordFork { .. }
            | Call::RecordJoin { .. }
            | Call::RecordTail { .. } => n.event_records += 1,
            Call::Step(Step::Wait { .. })
            | Call::WaitTail { .. }
            | Call::WaitFork { .. }
            | Call::WaitJoin { .. }
            | Call::CallerWait { .. } => n.stream_waits += 1,
            Call::GraphLaunch { .. } => n.graph_launches += 1,
        }
    }

    /// All of them.
    pub fn total(&self) -> u32 {
        self.copies
            + self.sm_copies
            + self.reduce_kernels
            + self.event_records
            + self.stream_waits
            + self.context_binds
            + self.graph_launches
    }
}

impl std::fmt::Display for DriverCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} calls: {} copies, {} SM copies, {} reduce kernels, {} event records, {} stream \
             waits, {} context binds, {} graph launches",
            self.total(),
            self.copies,
            self.sm_copies,
            self.reduce_kernels,
            self.event_records,
            self.stream_waits,
            self.context_binds,
            self.graph_launches
        )
    }
}

/// Where a program's lanes and bindings run, for counting its driver calls without a GPU
/// ([`driver_calls`]).
#[derive(Debug, Clone, Copy)]
pub struct CallCountSetup<'a> {
    /// The CUDA device of each logical GPU, as [`crate::CudaBackend::new`] takes it.
    pub device_map: &'a [usize],
    /// Where each binding of the program lives (a plan's inputs, outputs and scratch buffers:
    /// [`crate::exec::binding_of`]).
    pub bindings: &'a [Location],
    /// Copies of fewer bytes run on SMs ([`crate::CudaBackend::set_sm_copy_below`]).
    pub sm_copy_below: u64,
}

/// The driver calls the CUDA backend makes to run `program` with [`crate::Backend::submit`]
/// directly (its steps one by one), counted without a GPU, from the same schedule and call
/// sequence the backend executes: a call after the first of a run of calls of the same
/// program (ordered after the previous one, as the backend orders launches), with every
/// binding its own allocation, kernels loaded and peer access between all devices (as on
/// NVLink and NVSwitch machines). A launch on several devices always runs so; one on a single
/// device runs so until its addresses repeat, and is replayed as a graph after
/// ([`replay_driver_calls`]).
///
/// Errors: a program the backend would refuse (the shared validation), a lane or binding on a
/// logical GPU the device map lacks.
pub fn driver_calls(program: &Program, setup: &CallCountSetup<'_>) -> Result<DriverCalls> {
    let s = schedule_for_count(program, setup)?;
    let previous = s.sinks.clone();
    Ok(DriverCalls::of(
        &s,
        Around {
            previous: &previous,
            callers: &[],
        },
    ))
}

/// The driver calls of `program` launched ordered within one caller's stream on the device
/// of logical GPU `caller` (`CudaBackend::submit_on`, as a rank's part over CUDA flag lanes
/// launches each of its segments), counted as [`driver_calls`] counts.
#[cfg(test)]
pub(crate) fn driver_calls_within_stream(
    program: &Program,
    setup: &CallCountSetup<'_>,
    caller: u32,
) -> Result<DriverCalls> {
    let s = schedule_for_count(program, setup)?;
    // The dense device index `schedule_for_count` gives the caller's CUDA device.
    let ordinal = setup.device_map.get(caller as usize).copied().unwrap_or(0);
    let mut seen: Vec<usize> = Vec::new();
    for &o in setup.device_map {
        if !seen.contains(&o) {
            seen.push(o);
        }
    }
    let dev = seen.iter().position(|&o| o == ordinal).unwrap_or(0);
    let previous = s.sinks.clone();
    Ok(DriverCalls::of(
        &s,
        Around {
            previous: &previous,
            callers: &[dev],
        },
    ))
}

/// The driver calls of a replayed launch of `program` (its steps captured once in a CUDA
/// graph, `cuGraphLaunch` after), counted as [`driver_calls`] counts: the steady state of a
/// program called again and again on the same buffers. `None` where the launch is never
/// captured: it spans several devices, has no step, or copies more than 256 MiB at once.
///
/// Errors: as [`driver_calls`].
pub fn replay_driver_calls(
    program: &Program,
    setup: &CallCountSetup<'_>,
) -> Result<Option<DriverCalls>> {
    let s = schedule_for_count(program, setup)?;
    let Some(hub) = replay_hub(&s).filter(|_| super::graph::capturable(&s)) else {
        return Ok(None);
    };
    Ok(Some(DriverCalls::of_replay(
        &s,
        Around {
            previous: &[hub],
            callers: &[],
        },
    )))
}

/// The schedule the backend makes for `program` in `setup` (see [`driver_calls`]).
fn schedule_for_count(program: &Program, setup: &CallCountSetup<'_>) -> Result<LaunchSchedule> {
    let mut ordinals: Vec<usize> = Vec::new();
    let dense: Vec<usize> = setup
        .device_map
        .iter()
        .map(|&o| match ordinals.iter().position(|&x| x == o) {
            Some(i) => i,
            None => {
                ordinals.push(o);
                ordinals.len() - 1
            }
        })
        .collect();
    let dev = |loc: Location| -> Result<Option<usize>> {
        match loc {
            Location::Host(_) => Ok(None),
            Location::Gpu(g) => dense.get(g as usize).copied().map(Some).ok_or_else(|| {
                err(format!(
                    "logical GPU {g} has no device in the map ({} entries)",
                    dense.len()
                ))
            }),
        }
    };
    let binding_dev = setup
        .bindings
        .iter()
        .map(|&l| dev(l))
        .collect::<Result<Vec<_>>>()?;
    // Every binding its own allocation: 1 TiB apart, each as large as a slot can reach.
    const SPACING: u64 = 1 << 40;
    let bound: Vec<Bound> = (0..setup.bindings.len() as u64)
        .map(|i| Bound {
            addr: (i + 1) * SPACING,
            bytes: SPACING / 2,
        })
        .collect();
    validate::resolve("cuda", 0, program, &bound)?;
    let mut facts = Vec::new();
    let addr = |b: u32| bound.get(b as usize).map_or(0, |x| x.addr);
    schedule::facts([program], &[0], &addr, &mut |f| {
        facts.push(f);
        true
    });
    let first = dense.first().copied().unwrap_or(0);
    let lane_dev = |loc: Location| Ok(dev(loc)?.unwrap_or(first));
    let devices = ordinals.len().max(1);
    let sm_ok = vec![true; devices];
    let place = LaunchPlacement {
        lane_dev: &lane_dev,
        binding_dev: &binding_dev,
        reaches: &|_, _| true,
        sm_ok: &sm_ok,
        sm_copy_below: setup.sm_copy_below,
        devices,
    };
    schedule::build(&[program], &[0], &place, &facts)
}
