//! The executor: one lowering of a checked [`Plan`] per rank ([`lower`]: backend commands on
//! the rank's lanes, and sends and receives between ranks) and one runner of it ([`run`]) over
//! a [`run::Transport`]. In one process the plan lowers on one rank to a single backend
//! [`Program`], run on any [`Backend`] as often as asked ([`compile`], [`launch`]). See
//! `README.md` beside this file for the protocol (lanes, events, stages, why it cannot
//! deadlock).

pub mod call_book;
pub mod counts;
pub mod flag_host;
pub mod flag_transport;
pub mod lower;
#[cfg(feature = "nccl")]
#[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
pub mod nccl_transport;
pub mod run;
#[cfg(any(feature = "mpi", feature = "cuda"))]
pub(crate) mod run_memory;
pub mod sampled_cone;
pub mod thread_transport;

use relaycc_route::{BufferRef, CheckOptions, CheckedPlan, Location, OpKind, Plan, RouteError};

use crate::backend::{Backend, ByteRegion, Launch, Program};
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
    /// The plan op of each command of `program` ([`lower::NO_OP`] for events).
    command_ops: Vec<u32>,
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
    /// The plan op of each command of [`Executable::program`] ([`lower::NO_OP`] for events).
    pub(crate) fn command_ops(&self) -> &[u32] {
        &self.command_ops
    }
    /// Location and bytes of each scratch buffer, in the plan's order (for a plan of rounds,
    /// its expansion's arenas: one per device, the larger of the body's and tail's staging).
    pub fn scratch(&self) -> &[(Location, u64)] {
        &self.scratch
    }
    /// The program rewritten into `out` for a v-collective call's `counts`, when this is the
    /// capacity plan `pieces` was cut from ([`counts::CountPieces::bind_program`]).
    pub fn bind_counts(
        &self,
        pieces: &counts::CountPieces,
        counts: &counts::CallCounts,
        out: &mut Program,
    ) -> Result<()> {
        pieces.bind_program(self.plan(), &self.program, &self.command_ops, counts, out)
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

/// The first op of `plan` that writes an input buffer, with that buffer's rank; for a plan of
/// rounds, the first of its body's, else of its tail's (each round writes what the body does,
/// on its own slice).
pub fn input_write(plan: &Plan) -> Option<(usize, u32)> {
    if let Some(r) = &plan.rounds {
        return input_write(&r.body).or_else(|| r.tail.as_ref().and_then(input_write));
    }
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

/// Lower a checked plan (see [`check`]) to a program: the plan's lowering on one rank
/// ([`lower::lower_whole`]), which has no cross-rank step, so its one segment is the program.
/// A plan of rounds is lowered as its expansion ([`relaycc_route::rounds::expand`]): every
/// round of its body on its slices of the buffers, then its tail, each after the one before,
/// their staging in one arena per device; the checker's proof of the plan of rounds covers
/// that order, and the expansion's size is bounded by the buffers it runs on (a round per
/// 2 GiB of a piece by default), refused past
/// [`relaycc_route::rounds::MAX_EXPANDED_OPS`].
///
/// Errors: a region or scratch buffer whose size in bytes overflows, naming the op or the
/// scratch buffer; an expansion past its limit; nothing has run then.
pub fn compile(checked: CheckedPlan) -> Result<Executable> {
    let plan = runnable(checked.plan())?;
    let scratch = scratch_bytes(&plan)?;
    let rank = lower::lower_whole(&plan)?;
    if !rank.stages.is_empty() {
        return Err(invalid(None, "a plan on one rank lowered to messages"));
    }
    Ok(Executable {
        plan: checked,
        program: rank.tail.program,
        command_ops: rank.tail.command_ops,
        scratch,
    })
}

/// `plan` as the executor runs it: a plan of rounds as its expansion (see [`compile`]),
/// any other as it is.
pub(crate) fn runnable(plan: &Plan) -> Result<std::borrow::Cow<'_, Plan>> {
    if plan.rounds.is_none() {
        return Ok(std::borrow::Cow::Borrowed(plan));
    }
    relaycc_route::rounds::expand(plan, relaycc_route::rounds::MAX_EXPANDED_OPS)
        .map(std::borrow::Cow::Owned)
        .map_err(from_route)
}

/// A checker or dependency-order error as an invalid plan at the same op.
fn from_route(e: RouteError) -> CollectivesError {
    match e {
        RouteError::PlanCheck { op, message } => invalid((op != usize::MAX).then_some(op), message),
        other => invalid(None, other.to_string()),
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
    let programs: Vec<(&Program, &str, &[ByteRegion])> = work
        .iter()
        .map(|(e, b)| (&e.program, e.plan().algorithm.as_str(), *b))
        .collect();
    // SAFETY: the caller's contract, passed on unchanged to `Backend::submit`.
    unsafe { launch_via(&programs, |l| backend.submit(l)) }
}

/// As [`launch`] for programs of executables (each with its plan's algorithm, for errors):
/// an [`Executable`]'s own, or one [`Executable::bind_counts`] rewrote for a call, with the
/// launches handed to `submit` (a backend's own way of enqueuing, such as the CUDA
/// backend's on callers' streams) after the binding counts are checked.
///
/// # Safety
///
/// As [`launch`], where the bound program's bindings are its call's packed buffers;
/// `submit` must enqueue what it is given with [`Backend::submit`]'s guarantees.
pub(crate) unsafe fn launch_via(
    work: &[(&Program, &str, &[ByteRegion])],
    submit: impl FnOnce(&[Launch<'_>]) -> Result<()>,
) -> Result<()> {
    let launches: Vec<Launch<'_>> = work
        .iter()
        .map(|(p, _, b)| Launch {
            program: p,
            bindings: b,
        })
        .collect();
    for (l, (_, algorithm, _)) in launches.iter().zip(work) {
        if l.bindings.len() != l.program.bindings as usize {
            return Err(invalid(
                None,
                format!(
                    "plan `{algorithm}` needs {} buffers, got {}",
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
