//! One process's part of a plan on host memory: the executor's per-rank lowering
//! ([`crate::exec::lower`]) with this rank's buffers as bindings, run by the executor's one
//! runner ([`crate::exec::run::run`]) inline on host memory over the MPI transport
//! ([`super::transport::MpiTransport`]). See README.md beside this file.

use std::time::{Duration, Instant};

use relaycc_route::{BufferRef, Location, Plan};

use super::MpiError;
use super::requests::Requests;
use super::shared_buffer::SharedHostBuffer;
use super::shm_transport::{SINGLE_COPY_MIN_BYTES, ShmSegment};
use super::transport::MpiTransport;
use crate::backend::Command;
use crate::exec::lower::{self, Lanes, RankLayout, RankProgram};
use crate::exec::run::{self, HostMemory};

/// The memory one run of a [`RankSchedule`] works in: this rank's input, output and scratch,
/// owned here so that a failed run can hand it over to the graveyard while MPI still holds
/// requests into it. `u128` words align the bytes for every element type.
#[derive(Debug, Default)]
pub(crate) struct RunBuffers {
    input: ZeroedWords,
    output: ZeroedWords,
    scratch: Vec<ZeroedWords>,
    /// Staging for messages the transport cannot reach in place (none over MPI on host
    /// memory; kept so that the runner's memory is owned here too).
    staging: Vec<u128>,
}

/// Zeroed `u128` words on the heap, or in a [`SharedHostBuffer`] that the other local ranks
/// map (single-copy messages from it are then copied in user space, `shm_transport.rs`).
#[derive(Debug)]
enum ZeroedWords {
    Heap(Vec<u128>),
    Shared(SharedHostBuffer<u128>),
}

impl Default for ZeroedWords {
    fn default() -> Self {
        ZeroedWords::Heap(Vec::new())
    }
}

impl ZeroedWords {
    /// ZeroedWords holding `bytes`: shared when `shared` and they can hold a single-copy message
    /// (smaller ones never leave through one, and each mapping holds a descriptor), on the
    /// heap otherwise or when the system refuses the mapping.
    fn zeroed(bytes: usize, shared: bool) -> ZeroedWords {
        let n = bytes.div_ceil(16);
        if shared
            && bytes >= SINGLE_COPY_MIN_BYTES
            && let Ok(b) = SharedHostBuffer::zeroed(n)
        {
            return ZeroedWords::Shared(b);
        }
        ZeroedWords::Heap(vec![0u128; n])
    }
}

impl std::ops::Deref for ZeroedWords {
    type Target = [u128];
    fn deref(&self) -> &[u128] {
        match self {
            ZeroedWords::Heap(v) => v,
            ZeroedWords::Shared(b) => b,
        }
    }
}

impl std::ops::DerefMut for ZeroedWords {
    fn deref_mut(&mut self) -> &mut [u128] {
        match self {
            ZeroedWords::Heap(v) => v,
            ZeroedWords::Shared(b) => b,
        }
    }
}

impl RunBuffers {
    /// Zeroed buffers of the sizes `s` needs; `shared`: where a run's messages go through a
    /// shared-memory transport whose peers may map them ([`SharedHostBuffer`]).
    pub(crate) fn new(s: &RankSchedule, shared: bool) -> Self {
        RunBuffers {
            input: ZeroedWords::zeroed(s.input_len, shared),
            output: ZeroedWords::zeroed(s.output_len, shared),
            scratch: s
                .scratch
                .iter()
                .map(|n| ZeroedWords::zeroed(*n, shared))
                .collect(),
            staging: Vec::new(),
        }
    }

    /// Errors unless these buffers hold what `s` needs.
    fn fits(&self, s: &RankSchedule) -> Result<(), MpiError> {
        let holds = |v: &ZeroedWords, n: usize| v.len() * 16 >= n;
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
    pub(crate) fn input_bytes(&mut self, s: &RankSchedule) -> Result<&mut [u8], MpiError> {
        self.fits(s)?;
        Ok(&mut bytemuck::cast_slice_mut(&mut self.input[..])[..s.input_len])
    }

    /// This rank's output bytes (`s.output_len`).
    pub(crate) fn output_bytes(&mut self, s: &RankSchedule) -> Result<&mut [u8], MpiError> {
        self.fits(s)?;
        Ok(&mut bytemuck::cast_slice_mut(&mut self.output[..])[..s.output_len])
    }
}

/// One rank's part of a plan: the executor's lowering for this rank, with its bindings
/// (input 0, output 1, then the scratch buffers this rank holds).
#[derive(Debug, Clone)]
pub(crate) struct RankSchedule {
    pub(super) program: RankProgram,
    /// Bytes of each scratch buffer this rank owns.
    pub(crate) scratch: Vec<usize>,
    /// Where the plan puts each of those scratch buffers.
    pub(crate) scratch_at: Vec<Location>,
    /// Bytes of this rank's input and output.
    pub(crate) input_len: usize,
    pub(crate) output_len: usize,
    /// Some op of this rank writes its input (a plan may use it as scratch).
    writes_input: bool,
}

impl RankSchedule {
    /// The part of `plan` that rank `me` runs; `owner` maps a memory to the rank that holds
    /// it. Local ops are folded onto one lane (they run inline, see [`RankSchedule::run_at`]).
    ///
    /// Errors: as [`RankSchedule::with_lanes`].
    pub(crate) fn new(
        plan: &Plan,
        me: u32,
        owner: &dyn Fn(Location) -> Option<u32>,
    ) -> Result<Self, MpiError> {
        let lanes = Lanes::Fold {
            count: 1,
            at: Location::Host(0),
        };
        Self::with_lanes(plan, me, owner, lanes)
    }

    /// The part of `plan` that rank `me` runs, its local ops on `lanes`
    /// ([`crate::exec::lower::lower`]).
    ///
    /// Errors: a dependency cycle, a memory no rank owns, a process that holds two ranks'
    /// inputs, a region outside its buffer (the lowering's errors, as
    /// [`MpiError::Backend`]).
    ///
    /// Complexity: O(ops + deps).
    pub(crate) fn with_lanes(
        plan: &Plan,
        me: u32,
        owner: &dyn Fn(Location) -> Option<u32>,
        lanes: Lanes,
    ) -> Result<Self, MpiError> {
        let size = plan.dtype.size() as usize;
        let own = |b: BufferRef| plan.location(b).and_then(owner);
        // This rank's request rank: the one whose input lives here (one per process).
        let mut mine = None;
        for r in 0..plan.request.nranks() as u32 {
            let here = own(BufferRef::Input(r)).ok_or_else(|| {
                MpiError::Unsupported(format!(
                    "no rank holds input {r} of plan {}",
                    plan.algorithm
                ))
            })?;
            if here == me {
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
                scratch_ix[i] = Some(2 + scratch.len() as u32);
                scratch.push(s.len as usize * size);
                scratch_at.push(s.location);
            }
        }
        let binding = |b: BufferRef| match b {
            BufferRef::Input(x) if Some(x) == mine => Some(0),
            BufferRef::Output(x) if Some(x) == mine => Some(1),
            BufferRef::Scratch(i) => scratch_ix.get(i as usize).copied().flatten(),
            _ => None,
        };
        let mut binding_bytes = vec![input_len as u64, output_len as u64];
        binding_bytes.extend(scratch.iter().map(|n| *n as u64));
        let layout = RankLayout {
            me,
            owner: &own,
            binding: &binding,
            binding_bytes,
            lanes,
        };
        let program = lower::lower(plan, &layout)?;
        let writes_input = program
            .stages
            .iter()
            .any(|s| s.recvs.iter().any(|m| m.slot.binding == 0))
            || program.segments().any(|seg| {
                seg.program.commands.iter().any(|c| match c {
                    Command::Copy { dst, .. } | Command::Reduce { dst, .. } => dst.binding == 0,
                    _ => false,
                })
            });
        Ok(RankSchedule {
            program,
            scratch,
            scratch_at,
            input_len,
            output_len,
            writes_input,
        })
    }

    /// Bytes of the memory a run of this part works in: this rank's input, output and
    /// scratch (what its run buffers hold, and what a shape counts against the plan cache's
    /// byte limit).
    pub(crate) fn run_bytes(&self) -> u64 {
        [self.input_len, self.output_len]
            .iter()
            .chain(&self.scratch)
            .fold(0u64, |a, b| a.saturating_add(*b as u64))
    }

    /// Messages this rank sends and receives per run.
    pub(crate) fn messages(&self) -> (usize, usize) {
        self.program.messages()
    }

    /// Dependency levels at which this rank sends or receives (its stages).
    pub(crate) fn depth(&self) -> usize {
        self.program.stages.len()
    }

    /// Run this rank's part with `input` and `output`, through `bufs` (see
    /// [`RankSchedule::run_in`]): `input` is copied into `bufs` first, and the output copied out
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
        self.run_in(reqs, bufs, timeout, None)?;
        output.copy_from_slice(bufs.output_bytes(self)?);
        Ok(())
    }

    /// Run this rank's part on `reqs`' communicator in the memory of `bufs` (made by
    /// [`RunBuffers::new`] for this schedule), within `timeout`; messages go through `shm`
    /// when given, else as MPI messages on `reqs`' communicator.
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
        shm: Option<&ShmSegment>,
    ) -> Result<(), MpiError> {
        bufs.fits(self)?;
        // Raw base pointers, taken once: pending receives write through them while local
        // copies write other (disjoint, checked by the plan checker) ranges of the same
        // buffers, so no `&mut` to those buffers may be formed until the run ends.
        let in_ptr = bufs.input.as_mut_ptr().cast::<u8>();
        let out_ptr = bufs.output.as_mut_ptr().cast::<u8>();
        // SAFETY: both point to buffers of `bufs` holding the schedule's lengths (`fits`),
        // which live, untouched by anything else, for the whole call.
        unsafe { self.run_at(reqs, in_ptr, out_ptr, bufs, timeout, shm) }
    }

    /// True when some op of this rank writes its input buffer (a plan may use it as
    /// scratch); the caller's input then cannot serve as the run's input.
    pub(crate) fn writes_input(&self) -> bool {
        self.writes_input
    }

    /// Run this rank's part with its input at `in_ptr` and its output at `out_ptr` (the
    /// caller's memory, or buffers of `bufs`), and scratch from `bufs`: the executor's runner
    /// with the local segments inline ([`HostMemory`]) and messages through the shared window
    /// `shm` when given (no request is then left with MPI), else over MPI.
    ///
    /// # Safety
    /// `in_ptr` must point to `self.input_len` readable bytes (written only when
    /// [`RankSchedule::writes_input`]) and `out_ptr` to `self.output_len` writable bytes, not
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
        shm: Option<&ShmSegment>,
    ) -> Result<(), MpiError> {
        bufs.fits(self)?;
        let mut ptrs: Vec<(*mut u8, usize)> = Vec::with_capacity(2 + bufs.scratch.len());
        ptrs.push((in_ptr, self.input_len));
        ptrs.push((out_ptr, self.output_len));
        for (v, n) in bufs.scratch.iter_mut().zip(&self.scratch) {
            ptrs.push((v.as_mut_ptr().cast::<u8>(), *n));
        }
        // SAFETY: the input and output ranges are the caller's promise; each scratch buffer
        // holds its length (`fits`) and lives in `bufs` for the whole call (and, after a
        // failure that leaves requests, in the graveyard the caller moves `bufs` to).
        let mut mem = unsafe { HostMemory::new(&self.program, &ptrs, &mut bufs.staging)? };
        let deadline = Instant::now() + timeout;
        if let Some(shm) = shm {
            return run::run(
                &self.program,
                &mut mem,
                &mut shm.transport(deadline, timeout),
            );
        }
        let mut transport = MpiTransport::new(reqs, deadline, timeout, false);
        run::run(&self.program, &mut mem, &mut transport)
    }
}
