//! Fan-out: copies of one source on one lane, back to back, as one kernel that reads the
//! source once and writes every destination (the reduce kernel with one source and up to
//! [`MAX_REDUCE_DSTS`] destinations, on bytes). A broadcast or an all_gather of ranks sharing
//! one GPU then reads each source once, not once per receiver, and makes one launch per source.
//!
//! Which copies form a fan-out is structural (the program alone decides it): a copy heads one
//! when the command before it on its lane is neither a copy of the same source nor a reduction
//! whose destination is that source (whose copies fuse into the reduction instead), and the
//! candidates are the copies of exactly its source that follow it on its lane with nothing
//! between. Whether each candidate joins is a fact of the addresses (`Fact::Fuse`: apart
//! from the source, the head's destination and the earlier candidates'), read as the
//! reduction's fusion facts are, and of the placement (kernels loaded, every memory reached).

use relaycc_route::{DType, ReduceOp};

use super::kernel_sources::MAX_REDUCE_DSTS;
use super::schedule::{
    LaunchAddr, OnDevice, Overlap, ScheduleBuilder, Step, before_on_lane, copies_of_slot_after,
    reduce_entry_index,
};

use super::backend::err;
use crate::backend::{Command, Program, Slot};
use crate::error::Result;

/// The copies that may join copy `ci`'s fan-out, in order, when `ci` heads one (see the module
/// docs); `None` when it does not. Allocates nothing: the launch reads these facts per call.
pub(super) fn candidates(prog: &Program, ci: usize) -> Option<impl Iterator<Item = usize> + '_> {
    let Command::Copy { src, .. } = &prog.commands[ci] else {
        return None;
    };
    if src.bytes == 0 {
        return None;
    }
    match before_on_lane(prog, ci) {
        Some(Command::Copy { src: s, .. }) if s == src => return None,
        Some(Command::Reduce { dst, .. }) if dst == src => return None,
        _ => {}
    }
    Some(copies_of_slot_after(prog, ci, *src))
}

/// Whether copy `ci` heads a fan-out with at least one candidate.
pub(super) fn heads(prog: &Program, ci: usize) -> bool {
    candidates(prog, ci).is_some_and(|mut c| c.next().is_some())
}

/// The fan-out facts of copy `ci` (whose own fact was `o`), one per candidate, into `sink`;
/// false as soon as `sink` refuses one.
pub(super) fn facts(
    prog: &Program,
    ci: usize,
    o: Overlap,
    at: &dyn Fn(&Slot) -> u64,
    sink: &mut dyn FnMut(super::schedule::Fact) -> bool,
) -> bool {
    let Some(cands) = candidates(prog, ci) else {
        return true;
    };
    let Command::Copy { src, dst, .. } = &prog.commands[ci] else {
        return true;
    };
    let (s, n) = (at(src), src.bytes);
    let mut taken = [0u64; MAX_REDUCE_DSTS];
    taken[0] = at(dst);
    let mut len = 1;
    for c in cands {
        let Command::Copy { dst: to, .. } = &prog.commands[c] else {
            return false;
        };
        let to = at(to);
        let apart = |a: u64| to.saturating_add(n) <= a || a.saturating_add(n) <= to;
        let ok = o == Overlap::Apart && apart(s) && taken[..len].iter().all(|&d| apart(d));
        if len < taken.len() {
            taken[len] = to;
            len += 1;
        }
        if !sink(super::schedule::Fact::Fuse(ok)) {
            return false;
        }
    }
    true
}

impl ScheduleBuilder<'_, '_> {
    /// Copy `ci` as the head of a fan-out, when it heads one and at least one candidate joins
    /// (a prefix of them, while each is apart and reached from a stream whose device has its
    /// kernels); true when it pushed the kernel and marked the joined copies in `fused`.
    pub(super) fn fan_out(
        &mut self,
        prog: &Program,
        ci: usize,
        stream: OnDevice,
        at: &dyn Fn(&Slot) -> LaunchAddr,
        fused: &mut [bool],
    ) -> Result<bool> {
        let Some(cands) = candidates(prog, ci) else {
            return Ok(false);
        };
        let Command::Copy { src, dst, .. } = &prog.commands[ci] else {
            return Ok(false);
        };
        let kernels = self.place.sm_ok.get(stream.0).copied().unwrap_or(false)
            && self.reaches(stream.0, at(src).binding)
            && self.reaches(stream.0, at(dst).binding);
        let mut dsts = vec![at(dst)];
        let mut joining = kernels;
        let mut joined = Vec::new();
        for c in cands {
            let ok = self.facts.fuse()?;
            let Command::Copy { dst: to, .. } = &prog.commands[c] else {
                continue;
            };
            joining = joining && ok && self.reaches(stream.0, at(to).binding);
            if joining {
                dsts.push(at(to));
                joined.push(c);
            }
        }
        if joined.is_empty() {
            return Ok(false);
        }
        // Bytes, summed over one source: a copy, exact for any data.
        let entry = reduce_entry_index(DType::U8, ReduceOp::Sum)?;
        let operands = u32::try_from(self.out.operands.len())
            .map_err(|_| err("schedule: too many operands"))?;
        self.out.operands.push(at(src));
        self.out.operands.extend_from_slice(&dsts);
        self.out.steps.push(Step::Reduce {
            stream,
            entry,
            operands,
            nsrcs: 1,
            ndsts: dsts.len() as u8,
            len: src.bytes,
            bytes: src.bytes,
            divisor: 0,
        });
        for c in joined {
            fused[c] = true;
        }
        Ok(true)
    }
}
