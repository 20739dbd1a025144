//! Batched copies: copies that a lane makes one after the other, each small enough for the
//! forward kernel, as one launch of the batched forward kernel (up to [`MAX_BATCH_COPIES`]).
//! An all_to_all of ranks sharing one GPU then makes one launch per lane, not one per block.
//!
//! Which copies form a batch is structural (the program alone decides it): a copy heads one
//! when the command before it on its lane is not a copy, nor a reduction whose destination is
//! its source (whose copies fuse into the reduction instead), and it heads no fan-out
//! (`fan_out.rs`, which takes copies of one source); the candidates are the copies that
//! follow it on its lane with nothing between, up to the first that copies the same source
//! as the copy before it or heads a fan-out. Whether each candidate joins is a fact of the
//! addresses (`Fact::Fuse`: every copy so far apart from itself, and its ranges apart from
//! the destinations of the copies before it and its destination from their sources, so the
//! order the stream would have kept does not matter), and of the placement (each copy would
//! have run on the forward kernel).

use super::backend::err;
use super::fan_out;
use super::kernel_sources::MAX_BATCH_COPIES;
use super::schedule::{
    Fact, LaunchAddr, OnDevice, Overlap, ScheduleBuilder, Step, after_on_lane, before_on_lane,
};
use crate::backend::{Command, Program, Slot};
use crate::error::Result;

/// The copies that may join copy `ci`'s batch, in order, when `ci` heads one (see the module
/// docs); `None` when it does not. Allocates nothing: the launch reads these facts per call.
pub(super) fn candidates(prog: &Program, ci: usize) -> Option<impl Iterator<Item = usize> + '_> {
    let Command::Copy { src, .. } = &prog.commands[ci] else {
        return None;
    };
    if src.bytes == 0 || fan_out::heads(prog, ci) {
        return None;
    }
    match before_on_lane(prog, ci) {
        Some(Command::Copy { .. }) => return None,
        Some(Command::Reduce { dst, .. }) if dst == src => return None,
        _ => {}
    }
    let mut last_src = *src;
    Some(
        after_on_lane(prog, ci)
            .map_while(move |(k, c)| match c {
                Command::Copy { src: s, .. }
                    if s.bytes > 0 && *s != last_src && !fan_out::heads(prog, k) =>
                {
                    last_src = *s;
                    Some(k)
                }
                _ => None,
            })
            .take(MAX_BATCH_COPIES - 1),
    )
}

/// Byte ranges `[a, a + m)` and `[b, b + n)` share no byte.
fn apart(a: u64, m: u64, b: u64, n: u64) -> bool {
    a.saturating_add(m) <= b || b.saturating_add(n) <= a
}

/// The batch facts of copy `ci`, one per candidate, into `sink`; false as soon as `sink`
/// refuses one.
pub(super) fn facts(
    prog: &Program,
    ci: usize,
    at: &dyn Fn(&Slot) -> u64,
    sink: &mut dyn FnMut(Fact) -> bool,
) -> bool {
    let Some(cands) = candidates(prog, ci) else {
        return true;
    };
    // (source, destination, bytes) of the batch so far.
    let mut taken = [(0u64, 0u64, 0u64); MAX_BATCH_COPIES];
    let mut len = 0;
    let mut ok = true;
    for c in std::iter::once(ci).chain(cands) {
        let Command::Copy { src, dst, .. } = &prog.commands[c] else {
            return false;
        };
        let (s, d, n) = (at(src), at(dst), src.bytes);
        ok = ok
            && apart(s, n, d, n)
            && taken[..len].iter().all(|&(ts, td, tn)| {
                apart(d, n, ts, tn) && apart(d, n, td, tn) && apart(s, n, td, tn)
            });
        if len < taken.len() {
            taken[len] = (s, d, n);
            len += 1;
        }
        if c != ci && !sink(Fact::Fuse(ok)) {
            return false;
        }
    }
    true
}

impl ScheduleBuilder<'_, '_> {
    /// Copy `ci` (whose fact was `o`) as the head of a batch, when it heads one and at least
    /// one candidate joins (a prefix of them, while each is apart and would run on the
    /// forward kernel); true when it pushed the launch and marked the joined copies in `fused`.
    pub(super) fn copy_batch(
        &mut self,
        prog: &Program,
        ci: usize,
        stream: OnDevice,
        at: &dyn Fn(&Slot) -> LaunchAddr,
        o: Overlap,
        fused: &mut [bool],
    ) -> Result<bool> {
        let Some(cands) = candidates(prog, ci) else {
            return Ok(false);
        };
        let Command::Copy { src, dst, .. } = &prog.commands[ci] else {
            return Ok(false);
        };
        let mut joining =
            o == Overlap::Apart && self.runs_on_sms(stream, at(src), at(dst), src.bytes);
        let mut batch = vec![(at(src), at(dst), src.bytes)];
        let mut joined = Vec::new();
        for c in cands {
            let ok = self.facts.fuse()?;
            let Command::Copy { src: s, dst: d, .. } = &prog.commands[c] else {
                continue;
            };
            joining = joining && ok && self.runs_on_sms(stream, at(s), at(d), s.bytes);
            if joining {
                batch.push((at(s), at(d), s.bytes));
                joined.push(c);
            }
        }
        if joined.is_empty() {
            return Ok(false);
        }
        let first = u32::try_from(self.out.batched.len())
            .map_err(|_| err("schedule: too many batched copies"))?;
        let count = batch.len() as u8;
        self.out.batched.extend(batch);
        self.out.steps.push(Step::CopyBatch {
            stream,
            first,
            count,
        });
        for c in joined {
            fused[c] = true;
        }
        Ok(true)
    }
}
