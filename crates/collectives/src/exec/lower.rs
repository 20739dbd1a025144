//! The one lowering: a checked plan cut for one rank into stages of cross-rank messages and
//! backend programs of local commands. With every memory on one rank it yields no message and
//! one program with the plan's lanes and events, the in-process [`super::Executable`]. See
//! `README.md` beside this file for the stages and why running them cannot deadlock.

use std::collections::HashMap;

use relaycc_route::{BufferRef, Location, OpKind, Plan, Region};

use super::{from_route, invalid};
use crate::backend::{Command, Program, Slot};
use crate::error::Result;

/// MPI guarantees tags up to 32767 (MPI 4.0 §3.2.3); op ids are folded into that range. Two
/// messages of one stage between the same pair with the same folded tag still match
/// correctly, because both sides post them in op id order and neither MPI nor the in-process
/// transport lets messages of one pair and tag overtake each other.
pub const TAG_RANGE: u32 = 32768;

/// One cross-rank step of a rank: a send of `slot` to `peer`, or a receive into `slot` from
/// `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// The plan's op (a copy between two ranks' memories).
    pub op: u32,
    /// The other rank.
    pub peer: u32,
    /// The tag both sides use: the op id folded into `0..TAG_RANGE`.
    pub tag: u32,
    /// The bytes sent or received, in this rank's bindings.
    pub slot: Slot,
}

/// Local commands of one rank that run as one backend launch, with the plan ops they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// The commands (copies, reductions, records, waits) on this rank's lanes.
    pub program: Program,
    /// The plan's ops in it, in the order they were emitted.
    pub ops: Vec<u32>,
    /// Per command of `program`, the plan op it runs ([`NO_OP`] for a `Record` or a `Wait`):
    /// what count binding ([`super::counts`]) rewrites a command from.
    pub command_ops: Vec<u32>,
}

/// The `command_ops` entry of a command that runs no plan op (a `Record` or a `Wait`).
pub const NO_OP: u32 = u32::MAX;

impl Segment {
    /// True when there is no command to launch.
    pub fn is_empty(&self) -> bool {
        self.program.commands.is_empty()
    }
}

/// One dependency level at which a rank sends or receives: the local work of the levels before
/// it (after the previous stage), then the level's messages with its local work beside them.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The plan's dependency level of the messages.
    pub level: u32,
    /// Local ops of the levels between the previous stage and this one: they run, and finish,
    /// before this stage's sends read their bytes.
    pub before: Segment,
    /// Receives, each rank's peers starting with the previous rank.
    pub recvs: Vec<Message>,
    /// Sends, each rank's peers starting with the next rank.
    pub sends: Vec<Message>,
    /// Local ops of this level: unordered with the level's messages, so the checker proved
    /// them disjoint from the bytes the messages touch; they run while messages are in flight.
    pub during: Segment,
}

/// One rank's part of a plan: stages of messages, then the local work after the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct RankProgram {
    /// The stages, by increasing level.
    pub stages: Vec<Stage>,
    /// Local ops after the last stage (for a plan on one rank: every op).
    pub tail: Segment,
    /// Bytes of each binding (this rank's buffers, in binding order).
    pub binding_bytes: Vec<u64>,
}

impl RankProgram {
    /// Messages this rank sends and receives per run.
    pub fn messages(&self) -> (usize, usize) {
        self.stages.iter().fold((0, 0), |(s, r), st| {
            (s + st.sends.len(), r + st.recvs.len())
        })
    }

    /// The largest total of bytes one stage sends, and the largest it receives, among the
    /// messages `staged` picks (the staging memory a run needs).
    pub fn staged_bytes(&self, staged: impl Fn(&Slot) -> bool) -> (u64, u64) {
        let total = |ms: &[Message]| -> u64 {
            ms.iter()
                .filter(|m| staged(&m.slot))
                .map(|m| m.slot.bytes)
                .sum()
        };
        self.stages.iter().fold((0, 0), |(s, r), st| {
            (s.max(total(&st.sends)), r.max(total(&st.recvs)))
        })
    }

    /// The segments in the order a run launches them.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.stages
            .iter()
            .flat_map(|s| [&s.before, &s.during])
            .chain(std::iter::once(&self.tail))
    }
}

/// How one rank's memories and lanes are laid out for [`lower`].
pub struct RankLayout<'a> {
    /// This rank.
    pub me: u32,
    /// The rank that holds each buffer of the plan (`None`: no rank does, an error).
    pub owner: &'a dyn Fn(BufferRef) -> Option<u32>,
    /// This rank's binding of each buffer it holds.
    pub binding: &'a dyn Fn(BufferRef) -> Option<u32>,
    /// Bytes of each binding, in binding order.
    pub binding_bytes: Vec<u64>,
    /// Lanes: the plan's own (with their events), or every local op folded onto this many
    /// lanes at one location.
    pub lanes: Lanes,
}

/// The lanes of a lowered rank's programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lanes {
    /// The plan's lanes, each at its location (the in-process program).
    Plan,
    /// Plan lane `l` becomes lane `l % count` at `at`: a process drives its own device only,
    /// and rank-space plans give every op a lane of its own, which as host threads or streams
    /// would cost more than they overlap.
    Fold {
        /// Lanes per program (at least one).
        count: u32,
        /// Where each lane runs.
        at: Location,
    },
}

/// The binding layout of a whole plan in one process: inputs `0..n`, outputs `n..2n`, scratch
/// `2n..` ([`super::binding_of`]), with their sizes in bytes.
pub fn whole_plan_bindings(plan: &Plan) -> Result<Vec<u64>> {
    let n = plan.request.gpus.len() as u32;
    let esize = plan.dtype.size();
    let mut bytes = Vec::with_capacity(2 * n as usize + plan.scratch.len());
    for side in 0..2 {
        for r in 0..n {
            let len = if side == 0 {
                plan.request.input_len(r)
            } else {
                plan.request.output_len(r)
            }
            .map_err(from_route)?;
            bytes.push(len.saturating_mul(esize));
        }
    }
    bytes.extend(plan.scratch.iter().map(|s| s.len.saturating_mul(esize)));
    Ok(bytes)
}

/// Lower `plan` (proved by the checker: [`super::check`]) for rank `layout.me`.
///
/// A reduction runs on the rank holding its destination (the IR keeps reductions local); a
/// copy between two buffers of this rank is local; a copy from this rank to another is a send,
/// one into this rank a receive (zero-byte copies between ranks move nothing and are left out);
/// other ops are not this rank's. Every rank computes the same dependency levels from the same
/// plan ([`Plan::dependency_levels`]: one more than the deepest of an op's deps and of the
/// previous op of its lane), and a stage is a level where this rank has messages. Local ops go
/// to the stage of their level (`during`), to the `before` of the next stage, or to the tail.
/// Inside each segment the commands follow one topological order of "deps plus lane order",
/// lowest op id first; a dependency on another lane of the same segment is a `Record` after
/// the op and a `Wait` before the dependent, unless the waiting lane already waited for a later
/// op of that plan lane; a dependency on another segment needs nothing, since segments run one
/// after another.
///
/// Errors: a dependency cycle, a buffer no rank holds or one this rank holds without a
/// binding, a region outside its binding, or a region whose size in bytes overflows, naming
/// the op; nothing has run then.
///
/// Complexity: O(ops + deps) plus a hash-map lookup per cross-lane dependency.
pub fn lower(plan: &Plan, layout: &RankLayout<'_>) -> Result<RankProgram> {
    let order = PlanOrder::new(plan)?;
    lower_ops(plan, &order, layout, &order.order)
}

/// A plan's dependency order as every rank's lowering reads it: computed once per plan and
/// shared by the ranks lowered from it ([`lower_ops`]), so lowering many ranks of one large
/// plan costs the graph once, not once per rank.
#[derive(Debug, Clone)]
pub struct PlanOrder {
    /// Each op's dependency level ([`Plan::dependency_levels`]).
    level: Vec<u32>,
    /// One topological order of "deps plus lane order", lowest op id first.
    order: Vec<u32>,
    /// Each op's position in `order`.
    position: Vec<u32>,
    /// Each op's position on its lane.
    lane_position: Vec<u32>,
}

impl PlanOrder {
    /// The order of `plan`; an error naming the cycle when there is one.
    pub fn new(plan: &Plan) -> Result<Self> {
        let deps = plan.dependency_graph().map_err(from_route)?;
        let level = deps.levels().map_err(from_route)?;
        let order = deps.topological_order().map_err(from_route)?;
        let mut position = vec![0u32; plan.ops.len()];
        for (k, &i) in order.iter().enumerate() {
            position[i as usize] = k as u32;
        }
        let lane_position = (0..plan.ops.len() as u32)
            .map(|i| deps.lane_position(i))
            .collect();
        Ok(PlanOrder {
            level,
            order,
            position,
            lane_position,
        })
    }

    /// `ops` sorted as this order runs them.
    pub fn sort(&self, ops: &mut [u32]) {
        ops.sort_unstable_by_key(|&i| self.position.get(i as usize).copied().unwrap_or(u32::MAX));
    }
}

/// [`lower`] with the plan's order computed once ([`PlanOrder::new`] of the same plan) and only
/// the ops `ops` considered: they must include every op that touches a buffer of rank
/// `layout.me` (others among them are skipped as in [`lower`]), in the order
/// [`PlanOrder::sort`] gives. The rank's program is then exactly [`lower`]'s.
///
/// Three named passes: `RankLowering::classify` (each op local, a message, or not this
/// rank's), `RankLowering::mark_events` (segments and the events that order lanes inside
/// one) and `RankLowering::emit` (the commands), then `RankLowering::assemble`.
///
/// Complexity: O(ops + their deps x log ops).
pub fn lower_ops(
    plan: &Plan,
    order: &PlanOrder,
    layout: &RankLayout<'_>,
    ops: &[u32],
) -> Result<RankProgram> {
    if order.level.len() != plan.ops.len() || ops.iter().any(|&i| i as usize >= plan.ops.len()) {
        return Err(invalid(None, "the plan's order is of another plan"));
    }
    let mut lowering = RankLowering::new(plan, order, layout, ops);
    let msgs = lowering.classify()?;
    let events = lowering.mark_events();
    let builders = lowering.emit(&events)?;
    lowering.assemble(builders, events.per_segment, msgs)
}

/// One message of the rank before it is placed in its stage: its level, whether it is a
/// send, and the message.
type Pending = (u32, bool, Message);

/// Where each local op lands and which ops record an event ([`RankLowering::mark_events`]).
struct Events {
    /// Per op of `ops` (by its index there): its segment, if local.
    seg_of: Vec<Option<usize>>,
    /// Per op of `ops`: its event, if an op on another lane of its segment waits for it.
    event_of: Vec<Option<u32>>,
    /// Events per segment.
    per_segment: Vec<u32>,
}

/// The lowering of one rank of one plan, pass by pass.
struct RankLowering<'a> {
    plan: &'a Plan,
    order: &'a PlanOrder,
    layout: &'a RankLayout<'a>,
    ops: &'a [u32],
    /// `(op id, index in ops)`, sorted by op id: lookups and op-id order.
    sorted: Vec<(u32, u32)>,
    /// Per op of `ops`: it runs on this rank as a local command.
    local: Vec<bool>,
    /// The levels where this rank has messages, ascending: its stages.
    levels: Vec<u32>,
    esize: u64,
}

impl<'a> RankLowering<'a> {
    fn new(
        plan: &'a Plan,
        order: &'a PlanOrder,
        layout: &'a RankLayout<'a>,
        ops: &'a [u32],
    ) -> Self {
        let mut sorted: Vec<(u32, u32)> = ops
            .iter()
            .enumerate()
            .map(|(k, &i)| (i, k as u32))
            .collect();
        sorted.sort_unstable();
        RankLowering {
            plan,
            order,
            layout,
            ops,
            sorted,
            local: vec![false; ops.len()],
            levels: Vec::new(),
            esize: plan.dtype.size(),
        }
    }

    /// The index in `ops` of op `i`, if it is there.
    fn local_of(&self, i: u32) -> Option<usize> {
        self.sorted
            .binary_search_by_key(&i, |e| e.0)
            .ok()
            .map(|k| self.sorted[k].1 as usize)
    }

    fn owner(&self, id: usize, b: BufferRef) -> Result<u32> {
        (self.layout.owner)(b).ok_or_else(|| invalid(Some(id), format!("no rank holds {b:?}")))
    }

    /// Region `r` of op `id` as a slot of this rank's bindings, bounded by its binding.
    fn slot(&self, id: usize, r: &Region) -> Result<Slot> {
        let layout = self.layout;
        let binding = (layout.binding)(r.buffer).ok_or_else(|| {
            invalid(
                Some(id),
                format!("{:?} is not a buffer of rank {}", r.buffer, layout.me),
            )
        })?;
        let (Some(offset), Some(bytes)) = (
            r.offset.checked_mul(self.esize),
            r.len.checked_mul(self.esize),
        ) else {
            return Err(invalid(
                Some(id),
                format!(
                    "region {}+{} of {:?} overflows in bytes",
                    r.offset, r.len, r.buffer
                ),
            ));
        };
        let cap = layout.binding_bytes.get(binding as usize).copied();
        if cap.is_none_or(|c| offset.checked_add(bytes).is_none_or(|e| e > c)) {
            return Err(invalid(
                Some(id),
                format!(
                    "{r:?} lies outside its buffer of {} bytes",
                    cap.unwrap_or(0)
                ),
            ));
        }
        Ok(Slot {
            binding,
            offset,
            bytes,
        })
    }

    /// Pass 1: which ops run here as local commands, and this rank's messages, in op id order
    /// (the order both ends of a pair post their messages in); sets the stage levels.
    fn classify(&mut self) -> Result<Vec<Pending>> {
        let me = self.layout.me;
        let mut msgs: Vec<Pending> = Vec::new();
        for &(i, k) in &self.sorted {
            let id = i as usize;
            let level = self.order.level[id];
            match &self.plan.ops[id].kind {
                OpKind::Reduce { dst, .. } => {
                    self.local[k as usize] = self.owner(id, dst.buffer)? == me;
                }
                OpKind::Copy { src, dst } => {
                    let (a, b) = (self.owner(id, src.buffer)?, self.owner(id, dst.buffer)?);
                    let tag = i % TAG_RANGE;
                    let message = |peer, slot| Message {
                        op: i,
                        peer,
                        tag,
                        slot,
                    };
                    match (a == me, b == me) {
                        (true, true) => self.local[k as usize] = true,
                        _ if dst.len == 0 => {}
                        (true, false) => msgs.push((level, true, message(b, self.slot(id, src)?))),
                        (false, true) => {
                            msgs.push((level, false, message(a, self.slot(id, dst)?)));
                        }
                        (false, false) => {}
                    }
                }
            }
        }
        self.levels = msgs.iter().map(|m| m.0).collect();
        self.levels.sort_unstable();
        self.levels.dedup();
        Ok(msgs)
    }

    /// Segments in run order: `before` and `during` of each stage, then the tail.
    fn segments(&self) -> usize {
        2 * self.levels.len() + 1
    }

    /// The segment of a local op of level `l`: its stage's `during`, the `before` of the next
    /// stage, or the tail.
    fn segment_of_level(&self, l: u32) -> usize {
        let k = self.levels.partition_point(|&c| c < l);
        match self.levels.get(k) {
            Some(&c) if c == l => 2 * k + 1,
            Some(_) => 2 * k,
            None => 2 * self.levels.len(),
        }
    }

    /// This rank's lane of plan lane `plan_lane`.
    fn lane_of(&self, plan_lane: u32) -> u32 {
        match self.layout.lanes {
            Lanes::Plan => plan_lane,
            Lanes::Fold { count, .. } => plan_lane % count.max(1),
        }
    }

    /// Pass 2: each local op's segment, and an event for every op that an op on another
    /// lane of the same segment depends on (numbered per segment in op id order).
    fn mark_events(&self) -> Events {
        let plan = self.plan;
        let seg_of: Vec<Option<usize>> = self
            .ops
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                self.local[k].then(|| self.segment_of_level(self.order.level[i as usize]))
            })
            .collect();
        let mut needs = vec![false; self.ops.len()];
        for (k, &i) in self.ops.iter().enumerate() {
            let Some(s) = seg_of[k] else { continue };
            let op = &plan.ops[i as usize];
            for &d in &op.deps {
                if let Some(kd) = self.local_of(d)
                    && seg_of[kd] == Some(s)
                    && self.lane_of(plan.ops[d as usize].lane) != self.lane_of(op.lane)
                {
                    needs[kd] = true;
                }
            }
        }
        let mut event_of: Vec<Option<u32>> = vec![None; self.ops.len()];
        let mut per_segment = vec![0u32; self.segments()];
        for &(_, k) in &self.sorted {
            let k = k as usize;
            if needs[k]
                && let Some(s) = seg_of[k]
            {
                event_of[k] = Some(per_segment[s]);
                per_segment[s] += 1;
            }
        }
        Events {
            seg_of,
            event_of,
            per_segment,
        }
    }

    /// Pass 3: the commands of every segment in one topological order: per local op, a
    /// `Wait` for each dependency on another lane of its segment (unless this lane already
    /// waited for a later op of that plan lane), its copy or reduction, and its `Record`.
    fn emit(&self, ev: &Events) -> Result<Vec<SegmentEmitter>> {
        let plan = self.plan;
        let mut builders: Vec<SegmentEmitter> = (0..self.segments())
            .map(|_| SegmentEmitter::default())
            .collect();
        let mut waited: HashMap<(usize, u32, u32), u32> = HashMap::new();
        for (k, &i) in self.ops.iter().enumerate() {
            let id = i as usize;
            let Some(s) = ev.seg_of[k] else { continue };
            let op = &plan.ops[id];
            let lane = self.lane_of(op.lane);
            let b = &mut builders[s];
            b.ops.push(i);
            for &d in &op.deps {
                let dop = &plan.ops[d as usize];
                let Some(kd) = self.local_of(d) else { continue };
                let Some(event) = ev.event_of[kd] else {
                    continue;
                };
                if ev.seg_of[kd] != Some(s) || self.lane_of(dop.lane) == lane {
                    continue;
                }
                // Waiting for op `d` implies every earlier op of its plan lane, which the same
                // local lane ran before it.
                let pos = self.order.lane_position[d as usize];
                let w = waited.entry((s, lane, dop.lane)).or_insert(0);
                if *w >= pos {
                    continue;
                }
                *w = pos;
                b.commands.push(Command::Wait { lane, event });
                b.command_ops.push(NO_OP);
            }
            if !op.is_empty() {
                let command = match &op.kind {
                    OpKind::Copy { src, dst } => Command::Copy {
                        lane,
                        src: self.slot(id, src)?,
                        dst: self.slot(id, dst)?,
                    },
                    OpKind::Reduce {
                        srcs: from,
                        dst,
                        finalize,
                    } => {
                        let first = b.srcs.len() as u32;
                        for r in from {
                            b.srcs.push(self.slot(id, r)?);
                        }
                        Command::Reduce {
                            lane,
                            first,
                            count: from.len() as u32,
                            dst: self.slot(id, dst)?,
                            divide: *finalize,
                        }
                    }
                };
                b.commands.push(command);
                b.command_ops.push(i);
            }
            if let Some(event) = ev.event_of[k] {
                b.commands.push(Command::Record { lane, event });
                b.command_ops.push(NO_OP);
            }
        }
        Ok(builders)
    }

    /// The rank's program: segments as backend programs on this rank's lanes, stages with
    /// their messages (each rank's peers in the order next rank first for sends, previous
    /// rank first for receives; one pair's messages keep their op-id order), then the tail.
    fn assemble(
        &self,
        builders: Vec<SegmentEmitter>,
        events: Vec<u32>,
        msgs: Vec<Pending>,
    ) -> Result<RankProgram> {
        let plan = self.plan;
        let layout = self.layout;
        let nranks = plan.request.nranks() as u32;
        let lanes: Vec<Location> = match layout.lanes {
            Lanes::Plan => plan.lanes.iter().map(|l| l.location).collect(),
            Lanes::Fold { count, at } => {
                let used = plan.lanes.len().min(count.max(1) as usize).max(1);
                vec![at; used]
            }
        };
        let bindings = layout.binding_bytes.len() as u32;
        let mut segs = builders.into_iter().zip(events).map(|(b, events)| Segment {
            program: Program {
                lanes: lanes.clone(),
                events,
                dtype: plan.dtype,
                op: plan.request.op,
                divisor: nranks,
                bindings,
                commands: b.commands,
                srcs: b.srcs,
            },
            ops: b.ops,
            command_ops: b.command_ops,
        });
        let mut stages = Vec::with_capacity(self.levels.len());
        for &l in &self.levels {
            let (Some(before), Some(during)) = (segs.next(), segs.next()) else {
                return Err(invalid(None, "the lowering lost a segment"));
            };
            stages.push(Stage {
                level: l,
                before,
                recvs: Vec::new(),
                sends: Vec::new(),
                during,
            });
        }
        let Some(tail) = segs.next() else {
            return Err(invalid(None, "the lowering lost its last segment"));
        };
        for (l, is_send, m) in msgs {
            let st = &mut stages[self.levels.partition_point(|&c| c < l)];
            if is_send {
                st.sends.push(m);
            } else {
                st.recvs.push(m);
            }
        }
        // Each rank posts its messages starting with its next neighbour (receives: with its
        // previous one), so that at every moment the ranks talk to different peers instead of
        // all to rank 0 first. The sort is stable, so one pair's messages keep their op-id
        // order, which tag matching relies on.
        let n = i64::from(nranks.max(1));
        let me = i64::from(layout.me);
        for st in &mut stages {
            st.sends
                .sort_by_key(|m| (i64::from(m.peer) - me).rem_euclid(n));
            st.recvs
                .sort_by_key(|m| (me - i64::from(m.peer)).rem_euclid(n));
        }
        Ok(RankProgram {
            stages,
            tail,
            binding_bytes: layout.binding_bytes.clone(),
        })
    }
}

/// The commands of one segment as they are emitted.
#[derive(Default)]
struct SegmentEmitter {
    commands: Vec<Command>,
    srcs: Vec<Slot>,
    ops: Vec<u32>,
    command_ops: Vec<u32>,
}

/// The whole plan on one rank, with the plan's lanes and the bindings of
/// [`whole_plan_bindings`]: no messages, one program.
pub fn lower_whole(plan: &Plan) -> Result<RankProgram> {
    let ranks = plan.request.gpus.len() as u32;
    let nbind = 2 * ranks + plan.scratch.len() as u32;
    let layout = RankLayout {
        me: 0,
        owner: &|_| Some(0),
        binding: &|b| {
            let k = super::binding_of(b, ranks);
            (k < nbind).then_some(k)
        },
        binding_bytes: whole_plan_bindings(plan)?,
        lanes: Lanes::Plan,
    };
    lower(plan, &layout)
}
