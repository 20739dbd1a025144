//! The executor: turns a checked [`Plan`] into a backend [`Program`] once, then runs it on
//! any [`Backend`] as often as asked. See `README.md` beside this file for the protocol
//! (lanes, events, why it cannot deadlock).

use relaycc_route::{BufferRef, CheckOptions, Location, OpKind, Plan, Region, RouteError};

use crate::backend::{Backend, ByteRegion, Command, Launch, Program, Slot};
use crate::error::{CollectivesError, Result};

/// A plan proved correct and lowered to a [`Program`]; built once per request shape and
/// cached, so the checker's cost is paid once, not per call.
#[derive(Debug, Clone)]
pub struct Executable {
    /// The plan.
    pub plan: Plan,
    /// Whether the plan was checked as an in-place call.
    pub in_place: bool,
    /// The lowered program.
    pub program: Program,
    /// Location and bytes of each scratch buffer, in the plan's order.
    pub scratch: Vec<(Location, u64)>,
}

/// Binding index of a plan buffer: inputs first, then outputs, then scratch buffers.
pub fn binding_of(b: BufferRef, ranks: u32) -> u32 {
    match b {
        BufferRef::Input(r) => r,
        BufferRef::Output(r) => ranks + r,
        BufferRef::Scratch(i) => 2 * ranks + i,
    }
}

fn invalid(op: usize, message: impl Into<String>) -> CollectivesError {
    CollectivesError::InvalidPlan {
        op,
        message: message.into(),
    }
}

/// A checker or dependency-order error as an invalid plan at the same op.
fn from_route(e: RouteError) -> CollectivesError {
    match e {
        RouteError::PlanCheck { op, message } => invalid(op, message),
        other => invalid(usize::MAX, other.to_string()),
    }
}

/// Check `plan` (structure, data and ordering, with `relaycc_route::check_with`) and lower it.
///
/// Returns an error naming the op when the plan is wrong; nothing has run then.
pub fn compile(plan: Plan, in_place: bool) -> Result<Executable> {
    relaycc_route::check_with(&plan, CheckOptions { in_place }).map_err(from_route)?;
    let ranks = plan.request.gpus.len() as u32;
    let esize = plan.dtype.size();
    let nops = plan.ops.len();
    let nlanes = plan.lanes.len();
    let deps = plan.dependency_graph().map_err(from_route)?;
    // Every record is emitted before any wait on it: ops go in dependency order.
    let order = deps.topological_order().map_err(from_route)?;
    // Event ids for the ops other lanes wait on.
    let mut needs_event = vec![false; nops];
    for op in &plan.ops {
        for &d in &op.deps {
            if plan.ops[d as usize].lane != op.lane {
                needs_event[d as usize] = true;
            }
        }
    }
    let mut event_of = vec![u32::MAX; nops];
    let mut events = 0u32;
    for (id, e) in event_of.iter_mut().enumerate() {
        if needs_event[id] {
            *e = events;
            events += 1;
        }
    }
    // waited[l * nlanes + m]: the furthest position of lane m that lane l already waited for;
    // a wait for an earlier position of m is implied and left out.
    let mut waited = vec![0u32; nlanes * nlanes];
    let mut commands = Vec::with_capacity(nops + events as usize * 2);
    let mut srcs = Vec::new();
    let slot = |r: &Region| -> Result<Slot> {
        let offset = r.offset.checked_mul(esize);
        let bytes = r.len.checked_mul(esize);
        match (offset, bytes) {
            (Some(offset), Some(bytes)) => Ok(Slot {
                binding: binding_of(r.buffer, ranks),
                offset,
                bytes,
            }),
            _ => Err(invalid(usize::MAX, "a region's byte offset overflows")),
        }
    };
    for &i in &order {
        let id = i as usize;
        let op = &plan.ops[id];
        let lane = op.lane;
        for &d in &op.deps {
            let dl = plan.ops[d as usize].lane;
            if dl == lane {
                continue;
            }
            let w = &mut waited[lane as usize * nlanes + dl as usize];
            let pos = deps.lane_position(d);
            if *w >= pos {
                continue;
            }
            *w = pos;
            commands.push(Command::Wait {
                lane,
                event: event_of[d as usize],
            });
        }
        if !op.is_empty() {
            match &op.kind {
                OpKind::Copy { src, dst } => commands.push(Command::Copy {
                    lane,
                    src: slot(src)?,
                    dst: slot(dst)?,
                }),
                OpKind::Reduce {
                    srcs: s,
                    dst,
                    finalize,
                } => {
                    let first = srcs.len() as u32;
                    for r in s {
                        srcs.push(slot(r)?);
                    }
                    commands.push(Command::Reduce {
                        lane,
                        first,
                        count: s.len() as u32,
                        dst: slot(dst)?,
                        divide: *finalize,
                    });
                }
            }
        }
        if needs_event[id] {
            commands.push(Command::Record {
                lane,
                event: event_of[id],
            });
        }
    }
    let scratch = plan
        .scratch
        .iter()
        .map(|s| {
            s.len
                .checked_mul(esize)
                .map(|b| (s.location, b))
                .ok_or_else(|| invalid(usize::MAX, "scratch size overflows"))
        })
        .collect::<Result<Vec<_>>>()?;
    let program = Program {
        lanes: plan.lanes.iter().map(|l| l.location).collect(),
        events,
        dtype: plan.dtype,
        op: plan.request.op,
        divisor: ranks,
        bindings: 2 * ranks + plan.scratch.len() as u32,
        commands,
        srcs,
    };
    Ok(Executable {
        plan,
        in_place,
        program,
        scratch,
    })
}

/// Run executables with their bindings as one launch (see [`Backend::submit`]).
pub fn launch(backend: &dyn Backend, work: &[(&Executable, &[ByteRegion])]) -> Result<()> {
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
                usize::MAX,
                format!(
                    "plan `{}` needs {} buffers, got {}",
                    e.plan.algorithm,
                    l.program.bindings,
                    l.bindings.len()
                ),
            ));
        }
    }
    backend.submit(&launches)
}

#[cfg(test)]
mod tests;
