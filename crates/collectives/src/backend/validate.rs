//! The protocol checks of a launch, in one place for every backend.
//!
//! A backend resolves each binding of a [`Launch`](super::Launch) to an address and a size ([`Bound`]) and
//! hands the launch here; what comes back is every command resolved to addresses, or the
//! first broken rule, named by program and command, before anything is enqueued:
//!
//! - the launch gives as many bindings as the program asks, and lanes and events exist;
//! - every slot lies inside its binding, copies keep lengths, reduction slots are whole
//!   elements aligned for the type, a reduction has sources and its destination equals or
//!   avoids each of them, `Avg` has a divisor;
//! - every event is recorded once, and every `Wait(e)` comes after the `Record(e)` of the same
//!   program in command order. Lanes run their commands in that order, so no lane waits for a
//!   record that is never enqueued and waits form no cycle: of the lanes blocked at a wait, the
//!   one blocked earliest in command order waits for a record placed before it, on a lane that
//!   is not blocked before that record. A launch therefore always ends.
//!
//! What costs more than a pass over the commands, that lanes which touch one byte are ordered
//! (a data race otherwise), is the caller's promise to [`Backend::submit`](super::Backend).
//!
//! The rules split in two: those about the program alone (lanes, events, source ranges,
//! lengths, the divisor) and those about the bound memory (bindings given, slots inside them,
//! reduction slots aligned, a reduction's destination equal to or apart from each source).
//! [`bindings_fit`] checks the second kind alone, so a backend that keeps what [`resolve`]
//! accepted for a program (the CUDA backend's cached schedules) checks a later call of the
//! same program against its new bindings only: `resolve` accepts a program with bindings
//! exactly when it accepts the program with some bindings and `bindings_fit` accepts these.

use relaycc_route::ReduceOp;

use super::{Command, Program, Slot};
use crate::error::{CollectivesError, Result};

/// A binding as a backend resolved it: the address of its first byte and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bound {
    /// Address of the first byte (host or device, the backend's own).
    pub addr: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One command, checked and resolved. Lanes and events are the program's own indices.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resolved {
    /// Copy `bytes` bytes from `src` to `dst` (of binding `dst_binding`).
    Copy {
        lane: usize,
        src: u64,
        dst: u64,
        dst_binding: usize,
        bytes: u64,
    },
    /// Reduce `ResolvedProgram::srcs[first..first + count]` into `dst`, `len` elements.
    Reduce {
        lane: usize,
        first: usize,
        count: usize,
        dst: u64,
        len: u64,
        divisor: Option<u32>,
    },
    /// Record `event` on `lane`.
    Record { lane: usize, event: usize },
    /// Hold `lane` until `event` is recorded.
    Wait { lane: usize, event: usize },
}

/// A program's commands resolved to addresses, in command order.
#[derive(Debug, Default)]
pub(crate) struct ResolvedProgram {
    pub commands: Vec<Resolved>,
    /// Source addresses of the reductions.
    pub srcs: Vec<u64>,
}

/// Check program `index` of a launch against the protocol and its resolved `bound`ings, and
/// resolve its commands. Errors name `backend`, the program and the command. One pass over
/// the commands, each checked by its kind ([`ProgramCheck`]).
pub(crate) fn resolve(
    backend: &'static str,
    index: usize,
    p: &Program,
    bound: &[Bound],
) -> Result<ResolvedProgram> {
    let check = ProgramCheck {
        backend,
        index,
        program: p,
        bound,
        esize: p.dtype.size(),
    };
    if bound.len() != p.bindings as usize {
        return Err(check.fail(
            None,
            format!(
                "needs {} bindings, the launch gives {}",
                p.bindings,
                bound.len()
            ),
        ));
    }
    let mut recorded = vec![false; p.events as usize];
    let mut out = ResolvedProgram {
        commands: Vec::with_capacity(p.commands.len()),
        srcs: Vec::with_capacity(p.srcs.len()),
    };
    for (ci, c) in p.commands.iter().enumerate() {
        let r = match c {
            Command::Copy { lane, src, dst } => check.copy(ci, *lane, src, dst)?,
            Command::Reduce {
                lane,
                first,
                count,
                dst,
                divide,
            } => check.reduce(ci, *lane, (*first, *count), dst, *divide, &mut out.srcs)?,
            Command::Record { lane, event } => check.record(ci, *lane, *event, &mut recorded)?,
            Command::Wait { lane, event } => check.wait(ci, *lane, *event, &recorded)?,
        };
        out.commands.push(r);
    }
    Ok(out)
}

/// The check of one program of a launch against its bound memory: what each command's rules
/// read, and how an error names the program.
struct ProgramCheck<'a> {
    backend: &'static str,
    /// The program's index in the launch.
    index: usize,
    program: &'a Program,
    bound: &'a [Bound],
    /// Bytes per element of the program's type.
    esize: u64,
}

impl ProgramCheck<'_> {
    /// The error `message` at command `at` (or of the whole program).
    fn fail(&self, at: Option<usize>, message: String) -> CollectivesError {
        CollectivesError::Backend {
            backend: self.backend,
            message: match at {
                Some(c) => format!("program {}, command {c}: {message}", self.index),
                None => format!("program {}: {message}", self.index),
            },
        }
    }

    /// Lane `lane`, named by command `ci`, if the program has it.
    fn lane(&self, ci: usize, lane: u32) -> Result<usize> {
        let lanes = self.program.lanes.len();
        if (lane as usize) < lanes {
            Ok(lane as usize)
        } else {
            Err(self.fail(
                Some(ci),
                format!("lane {lane} does not exist ({lanes} lanes)"),
            ))
        }
    }

    /// Event `e`, named by command `ci`, if the program has it.
    fn event(&self, ci: usize, e: u32) -> Result<usize> {
        let events = self.program.events;
        if e < events {
            Ok(e as usize)
        } else {
            Err(self.fail(
                Some(ci),
                format!("event {e} does not exist ({events} events)"),
            ))
        }
    }

    /// The address of slot `s` of command `ci`: inside its binding, and at an address and of
    /// a size that are multiples of `align`.
    fn slot(&self, ci: usize, s: &Slot, align: u64) -> Result<u64> {
        let b = self.bound.get(s.binding as usize).ok_or_else(|| {
            self.fail(
                Some(ci),
                format!(
                    "binding {} does not exist ({} bindings)",
                    s.binding, self.program.bindings
                ),
            )
        })?;
        if s.offset.checked_add(s.bytes).is_none_or(|e| e > b.bytes) {
            return Err(self.fail(
                Some(ci),
                format!(
                    "slot {}+{} lies outside binding {} of {} bytes",
                    s.offset, s.bytes, s.binding, b.bytes
                ),
            ));
        }
        let addr = b.addr + s.offset;
        if !addr.is_multiple_of(align) || !s.bytes.is_multiple_of(align) {
            return Err(self.fail(
                Some(ci),
                format!(
                    "slot {}+{} of binding {} is not whole {align}-byte elements at an aligned address",
                    s.offset, s.bytes, s.binding
                ),
            ));
        }
        Ok(addr)
    }

    /// Command `ci`, a copy from `src` to `dst` on `lane`: slots of one length.
    fn copy(&self, ci: usize, lane: u32, src: &Slot, dst: &Slot) -> Result<Resolved> {
        if src.bytes != dst.bytes {
            return Err(self.fail(
                Some(ci),
                format!("copy of {} bytes into a slot of {}", src.bytes, dst.bytes),
            ));
        }
        Ok(Resolved::Copy {
            lane: self.lane(ci, lane)?,
            src: self.slot(ci, src, 1)?,
            dst: self.slot(ci, dst, 1)?,
            dst_binding: dst.binding as usize,
            bytes: src.bytes,
        })
    }

    /// Command `ci`, a reduction of the program's sources `first..first + count` into `dst`
    /// on `lane` (divided where `divide` and the op is `Avg`): sources that exist, of the
    /// destination's length, whole aligned elements, each equal to or apart from the
    /// destination, and a divisor that is not zero. The sources' addresses go to `srcs`.
    fn reduce(
        &self,
        ci: usize,
        lane: u32,
        (first, count): (u32, u32),
        dst: &Slot,
        divide: bool,
        srcs: &mut Vec<u64>,
    ) -> Result<Resolved> {
        let p = self.program;
        let fail = |m: String| self.fail(Some(ci), m);
        let slots = (first as usize)
            .checked_add(count as usize)
            .and_then(|end| p.srcs.get(first as usize..end))
            .ok_or_else(|| {
                fail(format!(
                    "sources {first}..{first}+{count} lie outside the program's {} sources",
                    p.srcs.len()
                ))
            })?;
        if slots.is_empty() {
            return Err(fail("a reduction without sources".into()));
        }
        let d = self.slot(ci, dst, self.esize)?;
        let start = srcs.len();
        for s in slots {
            if s.bytes != dst.bytes {
                return Err(fail(format!(
                    "a source of {} bytes for a destination of {}",
                    s.bytes, dst.bytes
                )));
            }
            let a = self.slot(ci, s, self.esize)?;
            let n = dst.bytes;
            if a != d && a < d + n && d < a + n {
                return Err(fail(
                    "the destination partly overlaps a source (it must equal or avoid each)".into(),
                ));
            }
            srcs.push(a);
        }
        let divisor = (divide && p.op == ReduceOp::Avg).then_some(p.divisor);
        if divisor == Some(0) {
            return Err(fail("an average divided by zero ranks".into()));
        }
        Ok(Resolved::Reduce {
            lane: self.lane(ci, lane)?,
            first: start,
            count: slots.len(),
            dst: d,
            len: dst.bytes / self.esize,
            divisor,
        })
    }

    /// Command `ci`, the record of `event` on `lane`: the event's first, marked in `recorded`.
    fn record(&self, ci: usize, lane: u32, event: u32, recorded: &mut [bool]) -> Result<Resolved> {
        let event = self.event(ci, event)?;
        // One record per event: with two, a wait could be released by either, and backends
        // would disagree about which one it orders after.
        if recorded[event] {
            return Err(self.fail(Some(ci), format!("records event {event} a second time")));
        }
        recorded[event] = true;
        Ok(Resolved::Record {
            lane: self.lane(ci, lane)?,
            event,
        })
    }

    /// Command `ci`, a wait of `lane` for `event`: after the event's record in command order.
    fn wait(&self, ci: usize, lane: u32, event: u32, recorded: &[bool]) -> Result<Resolved> {
        let event = self.event(ci, event)?;
        if !recorded[event] {
            return Err(self.fail(
                Some(ci),
                format!("waits for event {event} before any command records it"),
            ));
        }
        Ok(Resolved::Wait {
            lane: self.lane(ci, lane)?,
            event,
        })
    }
}

/// The rules of [`resolve`] that depend on the bound memory, for a program `resolve` accepted
/// with other bindings: as many bindings as the program asks, every slot inside its binding,
/// reduction slots at addresses aligned for the element type, and each reduction's
/// destination equal to or apart from each of its sources. No allocation; one pass.
// The CUDA backend keeps what it checked; the host backend checks every launch in full.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn bindings_fit(program: &Program, bound: &[Bound]) -> bool {
    if bound.len() != program.bindings as usize {
        return false;
    }
    let esize = program.dtype.size();
    let addr = |s: &Slot, align: u64| -> Option<u64> {
        let b = bound.get(s.binding as usize)?;
        let end = s.offset.checked_add(s.bytes)?;
        let a = b.addr.checked_add(s.offset)?;
        (end <= b.bytes && a.is_multiple_of(align)).then_some(a)
    };
    program.commands.iter().all(|c| match c {
        Command::Copy { src, dst, .. } => addr(src, 1).is_some() && addr(dst, 1).is_some(),
        Command::Reduce {
            first, count, dst, ..
        } => {
            let Some(d) = addr(dst, esize) else {
                return false;
            };
            let n = dst.bytes;
            let first = *first as usize;
            let Some(slots) = first
                .checked_add(*count as usize)
                .and_then(|end| program.srcs.get(first..end))
            else {
                return false;
            };
            slots.iter().all(|s| {
                addr(s, esize)
                    .is_some_and(|a| a == d || a.saturating_add(n) <= d || d.saturating_add(n) <= a)
            })
        }
        Command::Record { .. } | Command::Wait { .. } => true,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use relaycc_route::{DType, Location};

    use super::*;

    fn slot() -> impl Strategy<Value = Slot> {
        (0u32..3, 0u64..6, 1u64..4).prop_map(|(binding, o, b)| Slot {
            binding,
            offset: o * 4,
            bytes: b * 4,
        })
    }

    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![
            (0u32..2, slot(), slot()).prop_map(|(lane, src, dst)| Command::Copy {
                lane,
                src,
                dst: Slot {
                    bytes: src.bytes,
                    ..dst
                },
            }),
            (0u32..2, 0u32..3, 1u32..3, slot(), any::<bool>()).prop_map(
                |(lane, first, count, dst, divide)| Command::Reduce {
                    lane,
                    first,
                    count,
                    dst,
                    divide,
                }
            ),
        ]
    }

    fn program() -> impl Strategy<Value = Program> {
        (
            prop::collection::vec(command(), 1..6),
            prop::collection::vec(slot(), 4),
        )
            .prop_map(|(commands, srcs)| {
                // Sources as long as their reduction's destination, so lengths agree.
                let mut srcs = srcs;
                for c in &commands {
                    if let Command::Reduce {
                        first, count, dst, ..
                    } = c
                    {
                        for s in srcs.iter_mut().skip(*first as usize).take(*count as usize) {
                            s.bytes = dst.bytes;
                        }
                    }
                }
                Program {
                    lanes: vec![Location::Gpu(0); 2],
                    events: 0,
                    dtype: DType::F32,
                    op: ReduceOp::Sum,
                    divisor: 2,
                    bindings: 3,
                    commands,
                    srcs,
                }
            })
    }

    fn bound() -> impl Strategy<Value = Vec<Bound>> {
        prop::collection::vec((0u64..48, 8u64..72), 2..4).prop_map(|v| {
            v.into_iter()
                .map(|(addr, bytes)| Bound {
                    addr: 1024 + addr * 2,
                    bytes,
                })
                .collect()
        })
    }

    fn ok(p: &Program, b: &[Bound]) -> bool {
        resolve("test", 0, p, b).is_ok()
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// `bindings_fit` is exactly the binding half of `resolve`: a program `resolve`
        /// accepts with some bindings is accepted with others if and only if they fit.
        /// Bindings here are small, may overlap and may sit at addresses not 4-byte aligned.
        #[test]
        fn bindings_fit_is_the_binding_half_of_resolve(p in program(), b in bound()) {
            prop_assert!(!ok(&p, &b) || bindings_fit(&p, &b));
            let roomy: Vec<Bound> = (0..3).map(|i| Bound { addr: (i + 1) << 20, bytes: 1 << 16 }).collect();
            if ok(&p, &roomy) {
                prop_assert_eq!(ok(&p, &b), bindings_fit(&p, &b));
            }
        }
    }
}
