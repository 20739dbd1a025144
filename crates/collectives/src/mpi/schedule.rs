//! One process's part of a plan, and its execution over MPI (see README.md beside this file).
//!
//! A [`Schedule`] is built once per plan and rank: ops are put on dependency levels, and each
//! level lists the receives, sends and local copies this rank takes part in. [`Schedule::run`]
//! executes it: per level, post every receive, then every send (nonblocking, tag = op id), run
//! the local copies, then poll `MPI_Testall` until the level completes or the deadline passes.

use std::os::raw::c_int;
use std::time::{Duration, Instant};

use relaycc_route::{BufferRef, DType, Location, OpKind, Plan, ReduceOp};

use super::MpiError;
use super::requests::Requests;
use crate::backend::host_reduce;

/// MPI guarantees tags up to 32767 (MPI 4.0 §3.2.3); op ids are folded into that range. Two
/// messages of one level between the same pair with the same folded tag still match
/// correctly, because both sides post them in op id order and MPI does not let messages
/// overtake each other.
const TAG_RANGE: u32 = 32768;

/// The memory one run of a [`Schedule`] works in: this rank's input, output and scratch,
/// owned here so that a failed run can hand it over to the graveyard while MPI still holds
/// requests into it. `u128` words align the bytes for every element type.
#[derive(Debug, Default)]
pub(crate) struct RunBuffers {
    input: Vec<u128>,
    output: Vec<u128>,
    scratch: Vec<Vec<u128>>,
}

/// Words holding `bytes`.
fn words(bytes: usize) -> Vec<u128> {
    vec![0u128; bytes.div_ceil(16)]
}

impl RunBuffers {
    /// Zeroed buffers of the sizes `s` needs.
    pub(crate) fn new(s: &Schedule) -> Self {
        RunBuffers {
            input: words(s.input_len),
            output: words(s.output_len),
            scratch: s.scratch.iter().map(|n| words(*n)).collect(),
        }
    }

    /// Errors unless these buffers hold what `s` needs.
    fn fits(&self, s: &Schedule) -> Result<(), MpiError> {
        let holds = |v: &Vec<u128>, n: usize| v.len() * 16 >= n;
        if holds(&self.input, s.input_len)
            && holds(&self.output, s.output_len)
            && self.scratch.len() == s.scratch.len()
            && self
                .scratch
                .iter()
                .zip(&s.scratch)
                .all(|(v, n)| holds(v, *n))
        {
            Ok(())
        } else {
            Err(MpiError::Unsupported(
                "run buffers do not match the schedule (a failed run gave them up)".into(),
            ))
        }
    }

    /// This rank's input bytes (`s.input_len`).
    pub(crate) fn input_bytes(&mut self, s: &Schedule) -> Result<&mut [u8], MpiError> {
        self.fits(s)?;
        Ok(&mut bytemuck::cast_slice_mut(&mut self.input[..])[..s.input_len])
    }

    /// This rank's output bytes (`s.output_len`).
    pub(crate) fn output_bytes(&mut self, s: &Schedule) -> Result<&mut [u8], MpiError> {
        self.fits(s)?;
        Ok(&mut bytemuck::cast_slice_mut(&mut self.output[..])[..s.output_len])
    }
}

/// A buffer of this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Buf {
    Input,
    Output,
    Scratch(usize),
}

/// A byte range of a buffer of this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) buf: Buf,
    pub(super) off: usize,
    pub(super) len: usize,
}

/// What one rank does on one dependency level.
#[derive(Debug, Default, Clone)]
pub(super) struct Level {
    /// (peer, tag, destination).
    pub(super) recvs: Vec<(c_int, c_int, Loc)>,
    /// (peer, tag, source).
    pub(super) sends: Vec<(c_int, c_int, Loc)>,
    /// (source, destination), both here.
    pub(super) locals: Vec<(Loc, Loc)>,
    /// (sources, destination, finalize): local reductions (the plan IR keeps them local).
    pub(super) reduces: Vec<(Vec<Loc>, Loc, bool)>,
}

/// One rank's part of a plan, by dependency level.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    pub(super) levels: Vec<Level>,
    /// Element type, reduce op and rank count of the plan (for reductions).
    pub(super) dtype: DType,
    pub(super) op: ReduceOp,
    pub(super) nranks: u32,
    /// Bytes of each scratch buffer this rank owns.
    pub(crate) scratch: Vec<usize>,
    /// Where the plan puts each of those scratch buffers.
    pub(crate) scratch_at: Vec<Location>,
    /// Bytes of this rank's input and output.
    pub(crate) input_len: usize,
    pub(crate) output_len: usize,
}

impl Schedule {
    /// The part of `plan` that rank `me` runs; `owner` maps a memory to the rank that holds it.
    ///
    /// A copy whose source and destination this rank owns is a local copy; one it sends from
    /// is an `MPI_Isend`, one it receives into an `MPI_Irecv`; others are not its business.
    /// Levels: an op's level is one more than that of its deps and of the previous op of its
    /// lane (lanes run in order; [`Plan::dependency_levels`]). Every rank computes the same
    /// levels from the same plan.
    ///
    /// A reduction runs on the rank that holds its destination (its sources are in the same
    /// memory: the plan IR keeps reductions local).
    ///
    /// Errors: a dependency cycle, a memory no rank owns, a region outside its buffer, or a
    /// message over `i32::MAX` bytes.
    ///
    /// Complexity: O(ops + deps).
    pub(crate) fn new(
        plan: &Plan,
        me: u32,
        owner: &dyn Fn(Location) -> Option<u32>,
    ) -> Result<Self, MpiError> {
        let size = plan.dtype.size() as usize;
        let level = plan.dependency_levels()?;
        let own = |b: BufferRef| -> Result<u32, MpiError> {
            plan.location(b).and_then(owner).ok_or_else(|| {
                MpiError::Unsupported(format!("no rank holds {b:?} of plan {}", plan.algorithm))
            })
        };
        // This rank's request rank: the one whose input lives here (one per process).
        let mut mine = None;
        for r in 0..plan.request.nranks() as u32 {
            if own(BufferRef::Input(r))? == me {
                if mine.is_some() {
                    return Err(MpiError::Unsupported(
                        "one process serves one rank of a plan".into(),
                    ));
                }
                mine = Some(r);
            }
        }
        let (input_len, output_len) = match mine {
            Some(r) => (
                plan.request.input_len(r)? as usize * size,
                plan.request.output_len(r)? as usize * size,
            ),
            None => (0, 0),
        };
        let mut scratch_ix = vec![None; plan.scratch.len()];
        let mut scratch = Vec::new();
        let mut scratch_at = Vec::new();
        for (i, s) in plan.scratch.iter().enumerate() {
            if owner(s.location) == Some(me) {
                scratch_ix[i] = Some(scratch.len());
                scratch.push(s.len as usize * size);
                scratch_at.push(s.location);
            }
        }
        let loc = |r: relaycc_route::Region| -> Result<Loc, MpiError> {
            let (buf, cap) = match r.buffer {
                BufferRef::Input(x) if Some(x) == mine => (Buf::Input, input_len),
                BufferRef::Output(x) if Some(x) == mine => (Buf::Output, output_len),
                BufferRef::Scratch(i) => match scratch_ix.get(i as usize).copied().flatten() {
                    Some(j) => (Buf::Scratch(j), scratch[j]),
                    None => return Err(MpiError::Unsupported(format!("{r:?} is not here"))),
                },
                _ => return Err(MpiError::Unsupported(format!("{r:?} is not here"))),
            };
            let (off, len) = (r.offset as usize * size, r.len as usize * size);
            if off.checked_add(len).is_none_or(|e| e > cap) {
                return Err(MpiError::Unsupported(format!(
                    "{r:?} lies outside its {cap}-byte buffer"
                )));
            }
            Ok(Loc { buf, off, len })
        };
        let depth = level.iter().copied().max().map_or(0, |d| d as usize + 1);
        let mut levels = vec![Level::default(); depth];
        for (id, op) in plan.ops.iter().enumerate() {
            let (src, dst) = match &op.kind {
                OpKind::Copy { src, dst } => (*src, *dst),
                OpKind::Reduce {
                    srcs,
                    dst,
                    finalize,
                } => {
                    if dst.len > 0 && own(dst.buffer)? == me {
                        let from = srcs
                            .iter()
                            .map(|s| loc(*s))
                            .collect::<Result<Vec<_>, _>>()?;
                        levels[level[id] as usize]
                            .reduces
                            .push((from, loc(*dst)?, *finalize));
                    }
                    continue;
                }
            };
            if dst.len == 0 {
                continue;
            }
            let (a, b) = (own(src.buffer)?, own(dst.buffer)?);
            let tag = (id as u32 % TAG_RANGE) as c_int;
            let lv = &mut levels[level[id] as usize];
            let msg = |l: Loc| -> Result<Loc, MpiError> {
                if l.len > i32::MAX as usize {
                    return Err(MpiError::Unsupported(format!(
                        "op {id} moves {} bytes, over MPI's int count",
                        l.len
                    )));
                }
                Ok(l)
            };
            match (a == me, b == me) {
                (true, true) => lv.locals.push((loc(src)?, loc(dst)?)),
                (true, false) => lv.sends.push((b as c_int, tag, msg(loc(src)?)?)),
                (false, true) => lv.recvs.push((a as c_int, tag, msg(loc(dst)?)?)),
                (false, false) => {}
            }
        }
        // Each rank posts its messages starting with its next neighbour (receives: with its
        // previous one), so that at every moment the ranks talk to different peers instead of
        // all to rank 0 first. The sort is stable, so one pair's messages keep their op-id
        // order, which tag matching relies on.
        let n = i64::from(plan.request.nranks().max(1) as u32);
        let me_i = i64::from(me);
        for l in &mut levels {
            l.sends
                .sort_by_key(|(peer, _, _)| (i64::from(*peer) - me_i).rem_euclid(n));
            l.recvs
                .sort_by_key(|(peer, _, _)| (me_i - i64::from(*peer)).rem_euclid(n));
        }
        levels.retain(|l| {
            !(l.recvs.is_empty()
                && l.sends.is_empty()
                && l.locals.is_empty()
                && l.reduces.is_empty())
        });
        Ok(Schedule {
            levels,
            dtype: plan.dtype,
            op: plan.request.op,
            nranks: plan.request.nranks() as u32,
            scratch,
            scratch_at,
            input_len,
            output_len,
        })
    }

    /// Messages this rank sends and receives per run.
    pub(crate) fn messages(&self) -> (usize, usize) {
        self.levels
            .iter()
            .fold((0, 0), |(s, r), l| (s + l.sends.len(), r + l.recvs.len()))
    }

    /// Levels this rank takes part in.
    pub(crate) fn depth(&self) -> usize {
        self.levels.len()
    }

    /// Run this rank's part with `input` and `output`, through `bufs` (see
    /// [`Schedule::run_in`]): `input` is copied into `bufs` first, and the output copied out
    /// after a successful run.
    pub(crate) fn run(
        &self,
        reqs: &mut Requests,
        input: &[u8],
        output: &mut [u8],
        bufs: &mut RunBuffers,
        timeout: Duration,
    ) -> Result<(), MpiError> {
        let bad =
            |side: &'static str, got: usize, needs: usize| MpiError::Buffer { side, got, needs };
        if input.len() != self.input_len {
            return Err(bad("input", input.len(), self.input_len));
        }
        if output.len() != self.output_len {
            return Err(bad("output", output.len(), self.output_len));
        }
        bufs.input_bytes(self)?.copy_from_slice(input);
        self.run_in(reqs, bufs, timeout)?;
        output.copy_from_slice(bufs.output_bytes(self)?);
        Ok(())
    }

    /// Run this rank's part on `reqs`' communicator in the memory of `bufs` (made by
    /// [`RunBuffers::new`] for this schedule), within `timeout`.
    ///
    /// Every message reads or writes `bufs`, never a caller's memory: on a timeout or an MPI
    /// error the pending requests are cancelled, and those MPI keeps
    /// ([`Requests::take_stuck`]) still point into `bufs`, which the caller then keeps alive
    /// and untouched ([`super::requests::Health::bury`]).
    pub(crate) fn run_in(
        &self,
        reqs: &mut Requests,
        bufs: &mut RunBuffers,
        timeout: Duration,
    ) -> Result<(), MpiError> {
        bufs.fits(self)?;
        // Raw base pointers, taken once: pending receives write through them while local
        // copies write other (disjoint, checked by the plan checker) ranges of the same
        // buffers, so no `&mut` to those buffers may be formed until the run ends.
        let in_ptr = bufs.input.as_mut_ptr().cast::<u8>();
        let out_ptr = bufs.output.as_mut_ptr().cast::<u8>();
        // SAFETY: both point to buffers of `bufs` holding the schedule's lengths (`fits`),
        // which live, untouched by anything else, for the whole call.
        unsafe { self.run_at(reqs, in_ptr, out_ptr, bufs, timeout) }
    }

    /// True when some op of this rank writes its input buffer (a plan may use it as
    /// scratch); the caller's input then cannot serve as the run's input.
    pub(crate) fn writes_input(&self) -> bool {
        self.levels.iter().any(|l| {
            l.recvs.iter().any(|(_, _, d)| d.buf == Buf::Input)
                || l.locals.iter().any(|(_, d)| d.buf == Buf::Input)
                || l.reduces.iter().any(|(_, d, _)| d.buf == Buf::Input)
        })
    }

    /// Run this rank's part with its input at `in_ptr` and its output at `out_ptr` (the
    /// caller's memory, or buffers of `bufs`), and scratch from `bufs`.
    ///
    /// # Safety
    /// `in_ptr` must point to `self.input_len` readable bytes (written only when
    /// [`Schedule::writes_input`]) and `out_ptr` to `self.output_len` writable bytes, not
    /// overlapping each other or `bufs`, that nothing else touches until this returns. When it
    /// returns an error and [`Requests::take_stuck`] then gives requests, MPI may still read
    /// or write both ranges until those requests complete: the caller must keep them
    /// allocated and untouched until then, or end the process.
    pub(crate) unsafe fn run_at(
        &self,
        reqs: &mut Requests,
        in_ptr: *mut u8,
        out_ptr: *mut u8,
        bufs: &mut RunBuffers,
        timeout: Duration,
    ) -> Result<(), MpiError> {
        bufs.fits(self)?;
        let scr: Vec<*mut u8> = bufs
            .scratch
            .iter_mut()
            .map(|v| v.as_mut_ptr().cast::<u8>())
            .collect();
        let at = |l: &Loc| -> *mut u8 {
            let base = match l.buf {
                Buf::Input => in_ptr,
                Buf::Output => out_ptr,
                Buf::Scratch(i) => scr[i],
            };
            // SAFETY: `Schedule::new` checked `off + len <= ` the buffer's length; `bufs.fits`
            // checked that each scratch buffer holds that length, and the caller that the
            // input and output ranges do, so the pointer stays inside the allocation.
            unsafe { base.add(l.off) }
        };
        let deadline = Instant::now() + timeout;
        for (li, level) in self.levels.iter().enumerate() {
            reqs.clear();
            for (peer, tag, l) in &level.recvs {
                // SAFETY: the destination range is inside a buffer of `bufs` (see `at`), is
                // not touched by anything else until the request completes (the plan checker
                // proves no unordered op touches it), and stays allocated until then: this
                // function returns after completion or cancellation, and requests MPI keeps
                // are buried with `bufs` by the caller.
                unsafe { reqs.irecv(at(l), l.len, *peer, *tag)? };
            }
            for (peer, tag, l) in &level.sends {
                // SAFETY: as for the receives; the source is only read.
                unsafe { reqs.isend(at(l).cast_const(), l.len, *peer, *tag)? };
            }
            for (s, d) in &level.locals {
                // SAFETY: both ranges are inside live buffers (see `at`) and of equal length
                // (the plan checker proves copies are length-preserving and `Schedule::new`
                // took both lengths from the plan). `ptr::copy` allows overlap; ranges
                // written by pending receives are disjoint from these (plan checker).
                unsafe { std::ptr::copy(at(s).cast_const(), at(d), s.len.min(d.len)) };
            }
            for (srcs, d, finalize) in &level.reduces {
                self.reduce(srcs, d, *finalize, &at);
            }
            reqs.wait(li, deadline, timeout)?;
        }
        Ok(())
    }

    /// Run one local reduction `d = op(srcs...)` through the host backend's typed kernels,
    /// dividing by the rank count where an `Avg` result is finalized. Buffers here are bytes
    /// with no alignment promise, so misaligned or partly overlapping operands go through
    /// aligned temporaries.
    fn reduce(&self, srcs: &[Loc], d: &Loc, finalize: bool, at: &dyn Fn(&Loc) -> *mut u8) {
        let esize = self.dtype.size() as usize;
        let len = d.len / esize;
        let divisor = (finalize && self.op == ReduceOp::Avg).then_some(self.nranks);
        let dst = at(d);
        let ptrs: Vec<*const u8> = srcs.iter().map(|s| at(s).cast_const()).collect();
        let aligned = |p: *const u8| (p as usize).is_multiple_of(esize);
        let overlaps = |p: *const u8| {
            let (a, b) = (p as usize, dst as usize);
            a != b && a < b + d.len && b < a + d.len
        };
        if ptrs.iter().all(|p| aligned(*p) && !overlaps(*p)) && aligned(dst.cast_const()) {
            // SAFETY: every operand is `len` elements inside a live buffer (checked lengths
            // and offsets, see `at`), aligned for the type (just checked), and no pending
            // receive touches them (the plan checker proves unordered ops disjoint); the
            // destination equals a source or overlaps none (just checked).
            unsafe { host_reduce::reduce(self.dtype, self.op, &ptrs, dst, len, divisor) };
            return;
        }
        let words = d.len.div_ceil(8);
        let copies: Vec<Vec<u64>> = ptrs
            .iter()
            .map(|p| {
                let mut v = vec![0u64; words];
                // SAFETY: `p` points to `d.len` readable bytes (as above); `v` has room.
                unsafe { std::ptr::copy_nonoverlapping(*p, v.as_mut_ptr().cast::<u8>(), d.len) };
                v
            })
            .collect();
        let mut out = vec![0u64; words];
        let tmp: Vec<*const u8> = copies.iter().map(|v| v.as_ptr().cast::<u8>()).collect();
        // SAFETY: the temporaries are u64-aligned (enough for every element type), hold `len`
        // elements, and are private to this call.
        unsafe {
            host_reduce::reduce(
                self.dtype,
                self.op,
                &tmp,
                out.as_mut_ptr().cast::<u8>(),
                len,
                divisor,
            )
        };
        // SAFETY: `dst` has `d.len` writable bytes that nothing else touches now (as above).
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr().cast::<u8>(), dst, d.len) };
    }
}
