//! What the CUDA backend enqueues for a launch, worked out as data before any driver call: the
//! launch's programs become a [`LaunchSchedule`] of [`Step`]s, each one driver call on one stream
//! (a copy, a kernel launch, an event record or wait), with addresses kept relative to the
//! launch's bindings ([`LaunchAddr`]) so that a cached schedule serves every later call of the same
//! programs with only the bound addresses patched in.
//!
//! A schedule depends on the programs, on where each lane and each binding lives (devices and
//! peer access), on which devices have their kernels loaded, on the SM-copy threshold, and on
//! a few relations between the bound addresses: whether a copy's ranges are the same, apart
//! or overlapping, which source of a reduction is its destination, and whether the
//! destination of a copy that could fuse into a reduction overlaps the reduction's operands.
//! Those relations are the launch's [`Fact`]s: [`facts`] reads them off the addresses, and
//! [`build`] takes them instead of the addresses. A cached schedule is therefore the one
//! [`build`] would make for any call whose facts, devices and kernels match, which is what
//! the launch checks before it reuses one (`launch.rs`).
//!
//! What the schedule changes against the program, each provably invisible to the program's
//! ops (the rules of `backend/mod.rs`):
//! - a reduction is one kernel launch of up to [`MAX_REDUCE_SRCS`] sources; more sources are
//!   a chain of launches, each folding the next sources into the destination (exact for every
//!   type but f16 and bf16, which round once per launch of the chain);
//! - copies of a reduction's whole result that follow it on its lane with nothing between
//!   (no event, so no other lane is ordered between them) become further destinations of its
//!   last launch when their destinations overlap neither the reduction's sources (equal to one
//!   is fine: the kernel reads an element of every source before it writes that element), its
//!   destination nor each other, and the lane's GPU reaches them (its own memory or a peer's
//!   with peer access): every byte ends as the reduction and then the copies would leave it;
//! - a copy between device memories the lane's GPU reaches, of fewer bytes than the SM-copy
//!   threshold, is the forward kernel instead of a copy-engine copy (the same bytes).
//!
//! The schedule also says where the launch must be ordered after the previous one: before the
//! first step that touches memory on each stream that has not by then waited for an event of
//! a stream so ordered (`frame_at`), and which streams' ends cover the whole launch (`sinks`),
//! whose tail events the next launch waits for.

use relaycc_route::{DType, Location, ReduceOp};

use super::backend::err;
use super::kernel_sources::{MAX_REDUCE_DSTS, MAX_REDUCE_SRCS, REDUCE_ENTRIES, reduce_entry};
use super::{copy_batch, fan_out};
use crate::backend::{Command, Program, Slot};
use crate::error::Result;

/// A stream or an event: (index into the backend's devices, index on that device).
pub(crate) type OnDevice = (usize, usize);

/// Most chunks a partially overlapping copy is split into (chunks of the distance between its
/// ranges, in the direction that never overwrites unread bytes).
pub(crate) const MAX_OVERLAP_CHUNKS: u64 = 64;

/// An address of a launch: `offset` bytes into the launch's binding `binding`, counted over
/// all its programs' bindings in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaunchAddr {
    /// The binding, over the launch's programs.
    pub binding: u32,
    /// Bytes into it.
    pub offset: u64,
}

/// How a copy moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyBy {
    /// `cuMemcpyAsync` (one GPU, or with pinned host memory).
    Engine,
    /// `cuMemcpyPeerAsync` between the memories of two devices (indices into the backend's).
    Peer {
        /// Device of the source.
        src: usize,
        /// Device of the destination.
        dst: usize,
    },
    /// The forward kernel on the stream's GPU.
    Sm,
}

/// One driver call of a launch's programs, on one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Copy `bytes` bytes.
    Copy {
        stream: OnDevice,
        src: LaunchAddr,
        dst: LaunchAddr,
        bytes: u64,
        by: CopyBy,
    },
    /// Launch reduce kernel `REDUCE_ENTRIES[entry]` over `LaunchSchedule::operands[operands..]`:
    /// `nsrcs` sources, then `ndsts` destinations, `len` elements (`bytes` bytes) each.
    Reduce {
        stream: OnDevice,
        entry: u16,
        operands: u32,
        nsrcs: u8,
        ndsts: u8,
        len: u64,
        bytes: u64,
        /// `Avg` at the plan's finalize step: the divisor, else 0.
        divisor: u32,
    },
    /// Launch the batched forward kernel over `LaunchSchedule::batched[first..first + count]`:
    /// copies a stream would make one after the other, independent of each other.
    CopyBatch {
        stream: OnDevice,
        first: u32,
        count: u8,
    },
    /// `cuEventRecord(event, stream)`.
    Record { stream: OnDevice, event: OnDevice },
    /// `cuStreamWaitEvent(stream, event)`.
    Wait { stream: OnDevice, event: OnDevice },
}

impl Step {
    /// The stream the call is made on.
    pub(crate) fn stream(&self) -> OnDevice {
        match *self {
            Step::Copy { stream, .. }
            | Step::Reduce { stream, .. }
            | Step::CopyBatch { stream, .. }
            | Step::Record { stream, .. }
            | Step::Wait { stream, .. } => stream,
        }
    }

    fn touches_memory(&self) -> bool {
        matches!(
            self,
            Step::Copy { .. } | Step::Reduce { .. } | Step::CopyBatch { .. }
        )
    }
}

/// How two byte ranges of equal length relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// The same range.
    Same,
    /// No common byte.
    Apart,
    /// Partly overlapping, `dist` bytes apart, the destination after the source or not.
    Partial { dist: u64, dst_after: bool },
}

/// A relation between a launch's addresses that changes its schedule (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fact {
    /// A copy of at least one byte: how its ranges relate.
    Copy(Overlap),
    /// A reduction of at least one element: the first source equal to its destination.
    ReduceDst(Option<u32>),
    /// A source of a reduction of more than [`MAX_REDUCE_SRCS`] sources (a chain of
    /// launches): whether it is the destination, one fact per source in order.
    ChainSrcIsDst(bool),
    /// A copy that could fuse into the reduction before it: whether its destination is apart
    /// from (or, for a source, equal to) the reduction's sources, apart from its destination
    /// and from the earlier such copies'.
    Fuse(bool),
}

/// Where a launch's lanes and memories live, and what its GPUs can run.
pub(crate) struct LaunchPlacement<'a> {
    /// The device (index into the backend's) that drives a lane of this location.
    pub lane_dev: &'a dyn Fn(Location) -> Result<usize>,
    /// The device of each binding's memory (`None`: host memory), over the launch's programs.
    pub binding_dev: &'a [Option<usize>],
    /// Whether kernels on device `a` reach device `b`'s memory (`a == b`, or peer access).
    pub reaches: &'a dyn Fn(usize, usize) -> bool,
    /// Per device: its kernels are loaded, so copies may run on its SMs.
    pub sm_ok: &'a [bool],
    /// Copies of fewer bytes run on SMs where they may.
    pub sm_copy_below: u64,
    /// Devices of the backend.
    pub devices: usize,
}

/// A launch worked out: its driver calls in order and what they need.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LaunchSchedule {
    /// The calls, in an order where every wait follows its record.
    pub steps: Vec<Step>,
    /// Operands of the reduce steps.
    pub operands: Vec<LaunchAddr>,
    /// The copies of the batched-copy steps: source, destination, bytes.
    pub batched: Vec<(LaunchAddr, LaunchAddr, u64)>,
    /// Streams needed per device.
    pub streams_per_device: Vec<usize>,
    /// Events needed per device.
    pub events_per_device: Vec<usize>,
    /// Streams with at least one step, in order of first use.
    pub used: Vec<OnDevice>,
    /// (step index, stream): where a stream must wait for the previous launch (see the
    /// module docs), in step order; the first is the hub that waits for every tail.
    pub frame_at: Vec<(usize, OnDevice)>,
    /// Streams whose ends cover the whole launch.
    pub sinks: Vec<OnDevice>,
    /// Devices that launch kernels (reductions or SM copies).
    pub kernel_devices: Vec<usize>,
}

/// Calls `sink` with every fact of a launch, in the order [`build`] reads them; stops and
/// returns false as soon as `sink` does. `programs[p]`'s binding `b` is the launch's binding
/// `bases[p] + b`, at address `addr(binding)`.
pub(crate) fn facts<'p>(
    programs: impl IntoIterator<Item = &'p Program>,
    bases: &[u32],
    addr: &dyn Fn(u32) -> u64,
    sink: &mut dyn FnMut(Fact) -> bool,
) -> bool {
    for (p, prog) in programs.into_iter().enumerate() {
        let at = |s: &Slot| addr(bases[p] + s.binding) + s.offset;
        for (ci, c) in prog.commands.iter().enumerate() {
            match c {
                Command::Copy { src, dst, .. } if src.bytes > 0 => {
                    let o = overlap(at(src), at(dst), src.bytes);
                    if !sink(Fact::Copy(o))
                        || !fan_out::facts(prog, ci, o, &at, sink)
                        || !copy_batch::facts(prog, ci, &at, sink)
                    {
                        return false;
                    }
                }
                Command::Reduce {
                    first,
                    count,
                    dst,
                    divide,
                    ..
                } if dst.bytes > 0 => {
                    let srcs = sources(prog, *first, *count);
                    let d = at(dst);
                    let j = srcs.iter().position(|s| at(s) == d).map(|j| j as u32);
                    if !sink(Fact::ReduceDst(j)) {
                        return false;
                    }
                    if srcs.len() > MAX_REDUCE_SRCS
                        && !srcs.iter().all(|s| sink(Fact::ChainSrcIsDst(at(s) == d)))
                    {
                        return false;
                    }
                    if !is_kernel(prog, *count, *divide) {
                        continue;
                    }
                    // The destinations of the reduction and of the candidates so far.
                    let mut taken = [0u64; MAX_REDUCE_DSTS];
                    taken[0] = d;
                    let mut len = 1;
                    for c in copies_of_slot_after(prog, ci, *dst) {
                        let Command::Copy { dst: to, .. } = &prog.commands[c] else {
                            continue;
                        };
                        let to = at(to);
                        let n = dst.bytes;
                        let apart = |a: u64| to.saturating_add(n) <= a || a.saturating_add(n) <= to;
                        // A destination equal to a source is read and written by the same
                        // thread at the same element (the kernel's in-place rule): an
                        // in-place all_reduce's copies of the result onto the other ranks'
                        // inputs fuse.
                        let ok = taken[..len].iter().all(|&t| apart(t))
                            && srcs.iter().all(|s| at(s) == to || apart(at(s)));
                        if len < taken.len() {
                            taken[len] = to;
                            len += 1;
                        }
                        if !sink(Fact::Fuse(ok)) {
                            return false;
                        }
                    }
                }
                _ => {}
            }
        }
    }
    true
}

fn overlap(src: u64, dst: u64, bytes: u64) -> Overlap {
    let dist = src.abs_diff(dst);
    if dist == 0 {
        Overlap::Same
    } else if dist >= bytes {
        Overlap::Apart
    } else {
        Overlap::Partial {
            dist,
            dst_after: dst > src,
        }
    }
}

/// Sources `first..first + count` of a program (none when out of range: the shared validation
/// refuses such a program before a schedule is made).
fn sources(prog: &Program, first: u32, count: u32) -> &[Slot] {
    let (first, count) = (first as usize, count as usize);
    first
        .checked_add(count)
        .and_then(|end| prog.srcs.get(first..end))
        .unwrap_or(&[])
}

/// Whether a reduction runs a kernel: more than one source, or one to divide. One source
/// without a division is a copy.
fn is_kernel(prog: &Program, count: u32, divide: bool) -> bool {
    count > 1 || (divide && prog.op == ReduceOp::Avg)
}

/// The command before `ci` on `ci`'s lane: what decides whether `ci` starts a fan-out or a
/// batch, or continues one.
pub(super) fn before_on_lane(prog: &Program, ci: usize) -> Option<&Command> {
    let lane = prog.commands[ci].lane();
    prog.commands[..ci].iter().rev().find(|c| c.lane() == lane)
}

/// The commands after command `ci` on its lane, with their indices.
pub(super) fn after_on_lane(
    prog: &Program,
    ci: usize,
) -> impl Iterator<Item = (usize, &Command)> + '_ {
    let lane = prog.commands[ci].lane();
    prog.commands
        .iter()
        .enumerate()
        .skip(ci + 1)
        .filter(move |(_, c)| c.lane() == lane)
}

/// The copies of exactly `slot` that follow command `ci` on its lane with nothing else
/// between, at most `MAX_REDUCE_DSTS - 1` of them: what may fuse into a reduction whose
/// destination is `slot`, or into the fan-out of a copy whose source is `slot`. Allocates
/// nothing: the launch reads these facts per call.
pub(super) fn copies_of_slot_after(
    prog: &Program,
    ci: usize,
    slot: Slot,
) -> impl Iterator<Item = usize> + '_ {
    after_on_lane(prog, ci)
        .map_while(move |(k, c)| match c {
            Command::Copy { src, .. } if *src == slot => Some(k),
            _ => None,
        })
        .take(MAX_REDUCE_DSTS - 1)
}

/// The facts of a launch in [`build`]'s order, one at a time; a fact of the wrong kind is an
/// error (facts made for other programs), never a wrong schedule.
pub(super) struct Facts<'a>(std::slice::Iter<'a, Fact>);

impl Facts<'_> {
    fn next(&mut self, what: &str) -> Result<Fact> {
        self.0
            .next()
            .copied()
            .ok_or_else(|| err(format!("schedule: no fact for a {what}")))
    }
    fn overlap(&mut self) -> Result<Overlap> {
        match self.next("copy")? {
            Fact::Copy(o) => Ok(o),
            other => Err(err(format!(
                "schedule: {other:?} where a copy's fact belongs"
            ))),
        }
    }
    fn reduce_dst(&mut self) -> Result<Option<u32>> {
        match self.next("reduction")? {
            Fact::ReduceDst(j) => Ok(j),
            other => Err(err(format!(
                "schedule: {other:?} where a reduction's fact belongs"
            ))),
        }
    }
    fn chain_src_is_dst(&mut self) -> Result<bool> {
        match self.next("chained source")? {
            Fact::ChainSrcIsDst(is) => Ok(is),
            other => Err(err(format!(
                "schedule: {other:?} where a chained source's fact belongs"
            ))),
        }
    }
    pub(super) fn fuse(&mut self) -> Result<bool> {
        match self.next("fusion")? {
            Fact::Fuse(ok) => Ok(ok),
            other => Err(err(format!(
                "schedule: {other:?} where a fusion's fact belongs"
            ))),
        }
    }
}

/// The schedule of a launch of `programs` (their bindings numbered from `bases`, as in
/// [`facts`]) placed by `place`, under `facts` (what [`facts`] gave for its addresses).
///
/// The programs must have passed the shared validation (`backend/validate.rs`) with those
/// addresses: lanes, events and slots exist, every wait follows its record.
pub(crate) fn build(
    programs: &[&Program],
    bases: &[u32],
    place: &LaunchPlacement<'_>,
    facts: &[Fact],
) -> Result<LaunchSchedule> {
    let mut b = ScheduleBuilder {
        place,
        out: LaunchSchedule {
            steps: Vec::new(),
            operands: Vec::new(),
            batched: Vec::new(),
            streams_per_device: vec![0; place.devices],
            events_per_device: vec![0; place.devices],
            used: Vec::new(),
            frame_at: Vec::new(),
            sinks: Vec::new(),
            kernel_devices: Vec::new(),
        },
        facts: Facts(facts.iter()),
    };
    for (p, prog) in programs.iter().enumerate() {
        b.program(prog, bases[p])?;
    }
    if b.facts.0.next().is_some() {
        return Err(err("schedule: facts left over (made for other programs)"));
    }
    let mut out = b.out;
    finish(&mut out);
    Ok(out)
}

pub(super) struct ScheduleBuilder<'a, 'p> {
    pub(super) place: &'a LaunchPlacement<'p>,
    pub(super) out: LaunchSchedule,
    pub(super) facts: Facts<'a>,
}

impl ScheduleBuilder<'_, '_> {
    fn program(&mut self, prog: &Program, base: u32) -> Result<()> {
        let mut streams = Vec::with_capacity(prog.lanes.len());
        for loc in &prog.lanes {
            let d = (self.place.lane_dev)(*loc)?;
            streams.push((d, self.out.streams_per_device[d]));
            self.out.streams_per_device[d] += 1;
        }
        let mut events: Vec<Option<OnDevice>> = vec![None; prog.events as usize];
        let mut fused = vec![false; prog.commands.len()];
        let at = |s: &Slot| LaunchAddr {
            binding: base + s.binding,
            offset: s.offset,
        };
        for (ci, c) in prog.commands.iter().enumerate() {
            match c {
                Command::Copy { lane, src, dst } => {
                    if src.bytes == 0 {
                        continue;
                    }
                    let o = self.facts.overlap()?;
                    let stream = lane_stream(&streams, *lane)?;
                    if !fused[ci]
                        && !self.fan_out(prog, ci, stream, &at, &mut fused)?
                        && !self.copy_batch(prog, ci, stream, &at, o, &mut fused)?
                    {
                        self.copy(
                            lane_stream(&streams, *lane)?,
                            at(src),
                            at(dst),
                            src.bytes,
                            o,
                        )?;
                    }
                }
                Command::Reduce { .. } => {
                    self.reduce(prog, ci, &streams, base, &mut fused)?;
                }
                Command::Record { lane, event } => {
                    let stream = lane_stream(&streams, *lane)?;
                    let slot = events
                        .get_mut(*event as usize)
                        .ok_or_else(|| err(format!("event {event} does not exist")))?;
                    let per = &mut self.out.events_per_device;
                    let e = *slot.get_or_insert_with(|| {
                        per[stream.0] += 1;
                        (stream.0, per[stream.0] - 1)
                    });
                    self.out.steps.push(Step::Record { stream, event: e });
                }
                Command::Wait { lane, event } => {
                    let e = events
                        .get(*event as usize)
                        .copied()
                        .flatten()
                        .ok_or_else(|| err(format!("event {event} is waited before a record")))?;
                    self.out.steps.push(Step::Wait {
                        stream: lane_stream(&streams, *lane)?,
                        event: e,
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether a copy of ranges apart runs on the forward kernel: below the SM-copy threshold,
    /// on a stream whose device has its kernels, between memories that device reaches.
    pub(super) fn runs_on_sms(
        &self,
        stream: OnDevice,
        src: LaunchAddr,
        dst: LaunchAddr,
        bytes: u64,
    ) -> bool {
        bytes < self.place.sm_copy_below
            && self.place.sm_ok.get(stream.0).copied().unwrap_or(false)
            && self.reaches(stream.0, src.binding)
            && self.reaches(stream.0, dst.binding)
    }

    /// Whether the stream's GPU reaches a binding's memory with its own loads and stores.
    pub(super) fn reaches(&self, dev: usize, binding: u32) -> bool {
        match self
            .place
            .binding_dev
            .get(binding as usize)
            .copied()
            .flatten()
        {
            Some(d) => (self.place.reaches)(dev, d),
            None => false,
        }
    }

    fn copy(
        &mut self,
        stream: OnDevice,
        src: LaunchAddr,
        dst: LaunchAddr,
        bytes: u64,
        o: Overlap,
    ) -> Result<()> {
        let dev_of = |a: LaunchAddr| {
            self.place
                .binding_dev
                .get(a.binding as usize)
                .copied()
                .flatten()
        };
        let engine = match (dev_of(src), dev_of(dst)) {
            (Some(a), Some(b)) if a != b => CopyBy::Peer { src: a, dst: b },
            _ => CopyBy::Engine,
        };
        match o {
            Overlap::Same => {}
            Overlap::Apart => {
                let by = if self.runs_on_sms(stream, src, dst, bytes) {
                    CopyBy::Sm
                } else {
                    engine
                };
                self.out.steps.push(Step::Copy {
                    stream,
                    src,
                    dst,
                    bytes,
                    by,
                });
            }
            Overlap::Partial { dist, dst_after } => {
                let n = bytes.div_ceil(dist);
                if n > MAX_OVERLAP_CHUNKS {
                    return Err(err(format!(
                        "a copy of {bytes} bytes between ranges {dist} bytes apart (more than \
                         {MAX_OVERLAP_CHUNKS} chunks of their distance)"
                    )));
                }
                // The stream runs the chunks in order; copying from the far end first when the
                // destination lies after the source never overwrites a byte not yet read.
                for c in 0..n {
                    let c = if dst_after { n - 1 - c } else { c };
                    let off = c * dist;
                    self.out.steps.push(Step::Copy {
                        stream,
                        src: LaunchAddr {
                            offset: src.offset + off,
                            ..src
                        },
                        dst: LaunchAddr {
                            offset: dst.offset + off,
                            ..dst
                        },
                        bytes: dist.min(bytes - off),
                        by: engine,
                    });
                }
            }
        }
        Ok(())
    }

    /// Reduction `ci` of `prog`: a copy (one source, nothing to divide), or a chain of kernel
    /// launches with the copies that fuse into it as further destinations of the last.
    fn reduce(
        &mut self,
        prog: &Program,
        ci: usize,
        streams: &[OnDevice],
        base: u32,
        fused: &mut [bool],
    ) -> Result<()> {
        let Command::Reduce {
            lane,
            first,
            count,
            dst,
            divide,
        } = &prog.commands[ci]
        else {
            return Ok(());
        };
        if dst.bytes == 0 {
            return Ok(());
        }
        let at = |s: &Slot| LaunchAddr {
            binding: base + s.binding,
            offset: s.offset,
        };
        let stream = lane_stream(streams, *lane)?;
        let srcs = sources(prog, *first, *count);
        if srcs.is_empty() {
            return Err(err("schedule: a reduction without sources"));
        }
        let j = self.facts.reduce_dst()?;
        // Chains read every source that is the destination in their first launch, before it
        // overwrites the destination; the others keep their order.
        let mut order: Vec<LaunchAddr> = Vec::with_capacity(srcs.len());
        if srcs.len() > MAX_REDUCE_SRCS {
            let mut later = Vec::with_capacity(srcs.len());
            for s in srcs {
                if self.facts.chain_src_is_dst()? {
                    order.push(at(s));
                } else {
                    later.push(at(s));
                }
            }
            order.extend(later);
        } else {
            order.extend(srcs.iter().map(at));
        }
        if !is_kernel(prog, *count, *divide) {
            let o = if j == Some(0) {
                Overlap::Same
            } else {
                Overlap::Apart
            };
            return self.copy(stream, at(&srcs[0]), at(dst), dst.bytes, o);
        }
        // Fusion: a prefix of the candidates, while each is apart and reachable.
        let mut dsts = vec![at(dst)];
        let mut fusing = true;
        for c in copies_of_slot_after(prog, ci, *dst) {
            let ok = self.facts.fuse()?;
            let Command::Copy { dst: to, .. } = &prog.commands[c] else {
                continue;
            };
            fusing = fusing && ok && self.reaches(stream.0, at(to).binding);
            if fusing {
                dsts.push(at(to));
                fused[c] = true;
            }
        }
        let entry = reduce_entry_index(prog.dtype, prog.op)?;
        let divisor = if *divide && prog.op == ReduceOp::Avg {
            prog.divisor
        } else {
            0
        };
        let len = dst.bytes / prog.dtype.size();
        let mut next = 0;
        while next < order.len() {
            let carry = usize::from(next > 0);
            let take = (MAX_REDUCE_SRCS - carry).min(order.len() - next);
            let last = next + take == order.len();
            let operands = u32::try_from(self.out.operands.len())
                .map_err(|_| err("schedule: too many operands"))?;
            if carry == 1 {
                self.out.operands.push(at(dst));
            }
            self.out
                .operands
                .extend_from_slice(&order[next..next + take]);
            let outs: &[LaunchAddr] = if last { &dsts } else { &dsts[..1] };
            self.out.operands.extend_from_slice(outs);
            self.out.steps.push(Step::Reduce {
                stream,
                entry,
                operands,
                nsrcs: (take + carry) as u8,
                ndsts: outs.len() as u8,
                len,
                bytes: dst.bytes,
                divisor: if last { divisor } else { 0 },
            });
            next += take;
        }
        Ok(())
    }
}

/// The index into [`REDUCE_ENTRIES`] of the reduce kernel for a type and operator, as a
/// [`Step::Reduce`] names it.
pub(super) fn reduce_entry_index(dtype: DType, op: ReduceOp) -> Result<u16> {
    let entry = reduce_entry(dtype, op)?;
    REDUCE_ENTRIES
        .iter()
        .position(|e| *e == entry)
        .and_then(|i| u16::try_from(i).ok())
        .ok_or_else(|| err(format!("no reduce kernel named {entry}")))
}

fn lane_stream(streams: &[OnDevice], lane: u32) -> Result<OnDevice> {
    streams
        .get(lane as usize)
        .copied()
        .ok_or_else(|| err(format!("schedule: lane {lane} does not exist")))
}

/// Streams used, where each must be ordered after the previous launch, the sinks, and the
/// devices that launch kernels.
fn finish(s: &mut LaunchSchedule) {
    for step in &s.steps {
        let st = step.stream();
        if !s.used.contains(&st) {
            s.used.push(st);
        }
        let kernel = matches!(
            step,
            Step::Reduce { .. } | Step::Copy { by: CopyBy::Sm, .. } | Step::CopyBatch { .. }
        );
        if kernel && !s.kernel_devices.contains(&st.0) {
            s.kernel_devices.push(st.0);
        }
    }
    let index = |st: OnDevice, used: &[OnDevice]| used.iter().position(|&u| u == st).unwrap_or(0);
    let n = s.used.len();
    let ev_index = |e: OnDevice, per: &[usize]| per[..e.0].iter().sum::<usize>() + e.1;
    let events: usize = s.events_per_device.iter().sum();
    // Framing: a stream is ordered after the previous launch once it waited for the join (or
    // is the hub), or for an event recorded on a stream that was.
    let mut framed = vec![false; n];
    let mut event_framed = vec![false; events];
    // Sinks: vector clocks over every step (a stream's position counts its records and waits
    // too, so a stream that waits for another after its last record stays a sink).
    let mut clock = vec![vec![0u64; n]; n];
    let mut event_clock: Vec<Vec<u64>> = vec![Vec::new(); events];
    for (i, step) in s.steps.iter().enumerate() {
        let k = index(step.stream(), &s.used);
        clock[k][k] += 1;
        match *step {
            Step::Record { event, .. } => {
                let e = ev_index(event, &s.events_per_device);
                event_framed[e] = framed[k];
                event_clock[e] = clock[k].clone();
            }
            Step::Wait { event, .. } => {
                let e = ev_index(event, &s.events_per_device);
                framed[k] |= event_framed[e];
                for (c, &v) in clock[k].iter_mut().zip(&event_clock[e]) {
                    *c = (*c).max(v);
                }
            }
            _ => {}
        }
        if step.touches_memory() && !framed[k] {
            framed[k] = true;
            s.frame_at.push((i, step.stream()));
        }
    }
    s.sinks = (0..n)
        .filter(|&k| (0..n).all(|o| o == k || clock[o][k] < clock[k][k]))
        .map(|k| s.used[k])
        .collect();
}
