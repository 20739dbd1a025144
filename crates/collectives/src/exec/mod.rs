//! The executor: turns a checked [`Plan`] into a backend [`Program`] once, then runs it on
//! any [`Backend`] as often as asked. See `README.md` beside this file for the protocol
//! (lanes, events, why it cannot deadlock).

use relaycc_route::{
    BufferRef, CheckOptions, CheckedPlan, DepGraph, Location, OpKind, Plan, Region, RouteError,
};

use crate::backend::{Backend, ByteRegion, Command, Launch, Program, Slot};
use crate::error::{CollectivesError, Result};

/// A plan proved correct and lowered to a [`Program`]; built once per request shape and
/// cached, so the checker's cost is paid once, not per call. Only [`compile`] makes one, from
/// a [`CheckedPlan`], so its program carries the checker's proof:
///
/// ```compile_fail,E0308
/// fn unchecked(plan: relaycc_route::Plan) {
///     let _ = relaycc_collectives::exec::compile(plan);
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Executable {
    plan: CheckedPlan,
    program: Program,
    scratch: Vec<(Location, u64)>,
}

impl Executable {
    /// The plan.
    pub fn plan(&self) -> &Plan {
        self.plan.plan()
    }
    /// Whether the plan was checked as an in-place call.
    pub fn in_place(&self) -> bool {
        self.plan.in_place()
    }
    /// The lowered program.
    pub fn program(&self) -> &Program {
        &self.program
    }
    /// Location and bytes of each scratch buffer, in the plan's order.
    pub fn scratch(&self) -> &[(Location, u64)] {
        &self.scratch
    }
}

/// Binding index of a plan buffer: inputs first, then outputs, then scratch buffers.
pub fn binding_of(b: BufferRef, ranks: u32) -> u32 {
    match b {
        BufferRef::Input(r) => r,
        BufferRef::Output(r) => ranks + r,
        BufferRef::Scratch(i) => 2 * ranks + i,
    }
}

fn invalid(op: Option<usize>, message: impl Into<String>) -> CollectivesError {
    CollectivesError::InvalidPlan {
        op,
        message: message.into(),
    }
}

/// Check `plan` (structure, data and ordering: [`CheckedPlan::new`]) as an in-place call or
/// not, with the checker's complaint as [`CollectivesError::InvalidPlan`] naming the op.
///
/// Inputs are read-only outside the in-place layout: the per-rank API lends them as shared
/// slices (`&[T]`) that other threads may read meanwhile, so an op that writes a
/// [`BufferRef::Input`] of a call that is not in place is refused here, before any plan of
/// it is cached or run ([`input_write`]).
pub fn check(plan: Plan, in_place: bool) -> Result<CheckedPlan> {
    if !in_place && let Some((k, r)) = input_write(&plan) {
        return Err(invalid(
            Some(k),
            format!(
                "writes rank {r}'s input buffer; inputs are read-only (callers lend them \
                 shared) except in an in-place call"
            ),
        ));
    }
    CheckedPlan::new(plan, CheckOptions { in_place }).map_err(from_route)
}

/// The first op of `plan` that writes an input buffer, with that buffer's rank.
pub fn input_write(plan: &Plan) -> Option<(usize, u32)> {
    plan.ops.iter().enumerate().find_map(|(k, op)| {
        let dst = match &op.kind {
            OpKind::Copy { dst, .. } | OpKind::Reduce { dst, .. } => dst,
        };
        match dst.buffer {
            BufferRef::Input(r) => Some((k, r)),
            _ => None,
        }
    })
}

/// Lower a checked plan (see [`check`]) to a program.
///
/// Errors: a region or scratch buffer whose size in bytes overflows, naming the op or the
/// scratch buffer; nothing has run then.
pub fn compile(checked: CheckedPlan) -> Result<Executable> {
    let plan = checked.plan();
    let ranks = plan.request.gpus.len() as u32;
    let graph = LaneGraph::new(plan)?;
    let order = graph.deps.topological_order().map_err(from_route)?;
    let (commands, srcs) = emit(plan, &graph, &order)?;
    let scratch = scratch_bytes(plan)?;
    let program = Program {
        lanes: plan.lanes.iter().map(|l| l.location).collect(),
        events: graph.events,
        dtype: plan.dtype,
        op: plan.request.op,
        divisor: ranks,
        bindings: 2 * ranks + plan.scratch.len() as u32,
        commands,
        srcs,
    };
    Ok(Executable {
        plan: checked,
        program,
        scratch,
    })
}

/// A checker or dependency-order error as an invalid plan at the same op.
fn from_route(e: RouteError) -> CollectivesError {
    match e {
        RouteError::PlanCheck { op, message } => invalid((op != usize::MAX).then_some(op), message),
        other => invalid(None, other.to_string()),
    }
}

/// A plan's dependency graph ([`Plan::dependency_graph`]: deps plus lane order) and the events
/// its cross-lane deps need.
struct LaneGraph {
    deps: DepGraph,
    /// The event of each op that an op of another lane depends on.
    event_of: Vec<Option<u32>>,
    events: u32,
}

impl LaneGraph {
    fn new(plan: &Plan) -> Result<LaneGraph> {
        let deps = plan.dependency_graph().map_err(from_route)?;
        let mut needs_event = vec![false; plan.ops.len()];
        for op in &plan.ops {
            for &d in &op.deps {
                if plan.ops[d as usize].lane != op.lane {
                    needs_event[d as usize] = true;
                }
            }
        }
        let mut events = 0u32;
        let event_of = needs_event
            .iter()
            .map(|&needs| {
                needs.then(|| {
                    events += 1;
                    events - 1
                })
            })
            .collect();
        Ok(LaneGraph {
            deps,
            event_of,
            events,
        })
    }
}

/// The commands of the ops in `order`: before each op, a wait per cross-lane dep not already
/// implied; the op's copy or reduction; after it, a record if another lane waits for it.
fn emit(plan: &Plan, graph: &LaneGraph, order: &[u32]) -> Result<(Vec<Command>, Vec<Slot>)> {
    let ranks = plan.request.gpus.len() as u32;
    let esize = plan.dtype.size();
    let nlanes = plan.lanes.len();
    // waited[l * nlanes + m]: the furthest position of lane m that lane l already waited for;
    // a wait for an earlier position of m is implied and left out.
    let mut waited = vec![0u32; nlanes * nlanes];
    let mut commands = Vec::with_capacity(order.len() + graph.events as usize * 2);
    let mut srcs = Vec::new();
    let slot = |id: usize, r: &Region| slot_of(id, r, ranks, esize);
    for &i in order {
        let id = i as usize;
        let op = &plan.ops[id];
        let lane = op.lane;
        for &d in &op.deps {
            let dl = plan.ops[d as usize].lane;
            let (Some(event), false) = (graph.event_of[d as usize], dl == lane) else {
                continue;
            };
            let w = &mut waited[lane as usize * nlanes + dl as usize];
            let pos = graph.deps.lane_position(d);
            if *w >= pos {
                continue;
            }
            *w = pos;
            commands.push(Command::Wait { lane, event });
        }
        if !op.is_empty() {
            match &op.kind {
                OpKind::Copy { src, dst } => commands.push(Command::Copy {
                    lane,
                    src: slot(id, src)?,
                    dst: slot(id, dst)?,
                }),
                OpKind::Reduce {
                    srcs: s,
                    dst,
                    finalize,
                } => {
                    let first = srcs.len() as u32;
                    for r in s {
                        srcs.push(slot(id, r)?);
                    }
                    commands.push(Command::Reduce {
                        lane,
                        first,
                        count: s.len() as u32,
                        dst: slot(id, dst)?,
                        divide: *finalize,
                    });
                }
            }
        }
        if let Some(event) = graph.event_of[id] {
            commands.push(Command::Record { lane, event });
        }
    }
    Ok((commands, srcs))
}

/// The byte slot of region `r` of op `id`.
fn slot_of(id: usize, r: &Region, ranks: u32, esize: u64) -> Result<Slot> {
    match (r.offset.checked_mul(esize), r.len.checked_mul(esize)) {
        (Some(offset), Some(bytes)) => Ok(Slot {
            binding: binding_of(r.buffer, ranks),
            offset,
            bytes,
        }),
        _ => Err(invalid(
            Some(id),
            format!(
                "region {}+{} of {:?} overflows in bytes",
                r.offset, r.len, r.buffer
            ),
        )),
    }
}

/// Location and bytes of each scratch buffer.
fn scratch_bytes(plan: &Plan) -> Result<Vec<(Location, u64)>> {
    let esize = plan.dtype.size();
    plan.scratch
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.len
                .checked_mul(esize)
                .map(|b| (s.location, b))
                .ok_or_else(|| {
                    invalid(
                        None,
                        format!(
                            "scratch buffer {i} of {} elements overflows in bytes",
                            s.len
                        ),
                    )
                })
        })
        .collect()
}

/// Run executables with their bindings as one launch (see [`Backend::submit`]).
///
/// Errors: a binding count that differs from a program's, and whatever the backend refuses;
/// nothing has run then.
///
/// # Safety
///
/// `work[i].1[b]` is the region of buffer `b` of executable `i` (inputs, outputs, scratch:
/// [`binding_of`]), of the size that buffer has in the plan. The regions of one executable
/// are disjoint, except that input and output of a rank may share memory exactly as
/// [`relaycc_route::CheckOptions::in_place`] describes when the plan was checked in place;
/// regions of different executables are disjoint where either writes (scratch included); and
/// no library touches them through raw addresses while the launch runs. With these, the
/// checker's proof that unordered ops touch disjoint elements is the race freedom
/// [`Backend::submit`] asks for.
pub unsafe fn launch(backend: &dyn Backend, work: &[(&Executable, &[ByteRegion])]) -> Result<()> {
    // SAFETY: the caller's contract, passed on unchanged to `Backend::submit`.
    unsafe { launch_via(work, |l| backend.submit(l)) }
}

/// As [`launch`], with the launches handed to `submit` (a backend's own way of enqueuing,
/// such as the CUDA backend's on callers' streams) after the binding counts are checked.
///
/// # Safety
///
/// As [`launch`]; `submit` must enqueue what it is given with [`Backend::submit`]'s
/// guarantees.
pub(crate) unsafe fn launch_via(
    work: &[(&Executable, &[ByteRegion])],
    submit: impl FnOnce(&[Launch<'_>]) -> Result<()>,
) -> Result<()> {
    let launches: Vec<Launch<'_>> = work
        .iter()
        .map(|(e, b)| Launch {
            program: &e.program,
            bindings: b,
        })
        .collect();
    for (l, (e, _)) in launches.iter().zip(work) {
        if l.bindings.len() != l.program.bindings as usize {
            return Err(invalid(
                None,
                format!(
                    "plan `{}` needs {} buffers, got {}",
                    e.plan().algorithm,
                    l.program.bindings,
                    l.bindings.len()
                ),
            ));
        }
    }
    submit(&launches)
}

#[cfg(test)]
mod tests;
