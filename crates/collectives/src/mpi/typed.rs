//! Typed per-rank collectives on an [`MpiCommunicator`]: each process passes its own host
//! buffers (`&[T]`, `&mut [T]`; in place is one `&mut [T]`), as with `MPI_Allreduce` or
//! `ncclAllReduce`.
//!
//! A call goes through four steps:
//! 1. **Local checks**, the single-process API's: buffer lengths against the collective's
//!    layout, a root that is a rank, `Avg` only on floating types, counts per rank.
//! 2. **Agreement** before any data moves: every rank's call descriptor (collective, element
//!    type and size, op, root, count, a hash of its per-rank counts, its sequence number, and
//!    whether its local checks passed) is all-gathered in one nonblocking `MPI_Iallgather`
//!    bounded by the communicator's timeout ([`super::agree`]). Every rank then holds the
//!    same descriptors and reaches the same verdict: a mismatch is the same error on every
//!    rank, a local failure is that rank's error there and [`MpiError::Peer`] elsewhere, a
//!    peer that does not take part is [`MpiError::Absent`], naming it and the call (its
//!    collective and sequence number). Mismatches move no data and leave the communicator
//!    usable.
//! 3. **Plan once per shape**: the agreed descriptors key a cache. On a miss the request is
//!    built in rank space (ranks `0..n` are the processes), planned by route's rank-space
//!    planner, proved by `relaycc_route::check`, and cut into this rank's [`RankSchedule`] with
//!    its run buffers; the ranks agree on the outcome and the shape's weight (the largest
//!    run memory of any rank's part). The cache is bounded by the crate's one eviction rule
//!    ([`crate::plan_cache::lru::Lru`]) under limits set collectively, so with agreed keys and
//!    weights every rank keeps the same shapes: all ranks miss, and evict, together.
//! 4. **Run** through the one per-rank executor ([`RankSchedule::run_at`]): cross-rank copies are
//!    MPI messages, local copies and reductions run here. With owned buffers (the default)
//!    the input is copied into the cached run buffers and the output copied out; zero copy
//!    ([`MpiCommunicator::set_zero_copy`]) runs in the caller's slices. A failed run fails
//!    the communicator, as `execute` does.
//!
//! Point to point (`send`, `recv`) agrees pairwise instead: the sender's descriptor (count,
//! element type, sequence number of the pair) goes to the receiver, which answers whether it
//! matches, on a communicator of their own, before the data message.

use std::ops::Range;
use std::os::raw::c_int;
use std::time::Instant;

use ::mpi::ffi;
use ::mpi::traits::AsRaw;
use relaycc_route::{Collective, DType, Location, Plan, ReduceOp, Request, Transfer};

use super::agree::{self, AgreementCollective};
use super::requests::Requests;
use super::roll_call::WaitPoint;
use super::schedule::{RankSchedule, RunBuffers};
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::element::Element;
use crate::plan_cache::lru::Held;

/// The step name of the agreement, in errors.
const AGREE: &str = "agree on a collective call";
/// The step name of the point-to-point handshake, in errors.
const HANDSHAKE: &str = "agree on a send/recv pair";

/// Words of one rank's call descriptor.
const WORDS: usize = 10;
/// Positions in the descriptor.
const FAILED: usize = 0;
const SEQ: usize = 1;
const COLL: usize = 2;
const DTYPE: usize = 3;
const ESIZE: usize = 4;
const OP: usize = 5;
const ROOT: usize = 6;
const COUNT: usize = 7;
const VHASH: usize = 8;
/// The caller's tag, last: the plan's key is the words from `COLL` up to it.
const TAG: usize = 9;

/// Point-to-point tags on the pair communicator: the descriptor and the answer. The data
/// message is op 0 of its plan, tag 0.
const TAG_DESC: c_int = 1;
const TAG_ACK: c_int = 2;

/// One cached shape: this rank's schedule, its run buffers and requests.
#[derive(Debug)]
pub(super) struct PreparedShape {
    schedule: RankSchedule,
    bufs: RunBuffers,
    reqs: Requests,
    /// The plan's algorithm, for [`MpiCommunicator::last_algorithm`].
    algorithm: String,
    /// What the shape counts against the plan cache's byte limit: the largest run memory of
    /// any rank's part (agreed), or this rank's own for a send/recv pair.
    weight: u64,
}

impl Held for PreparedShape {
    fn held_bytes(&self) -> u64 {
        self.weight
    }
}

/// Where a call's input is.
enum Input<'a, T> {
    /// A buffer of its own.
    Slice(&'a [T]),
    /// Elements of the output buffer (in place).
    InOutput(Range<usize>),
}

/// What this rank asks for, before agreement.
#[derive(Debug)]
pub(super) struct TypedCall {
    collective: Collective,
    dtype: DType,
    esize: u64,
    op: Option<ReduceOp>,
    root: Option<u32>,
    count: u64,
    /// all_gather_v: every rank's count; all_to_all_v: this rank's send counts then its
    /// receive counts.
    counts: Vec<u64>,
    /// The caller's tag of this call ([`crate::Collectives::tag_next`]; 0: none), agreed
    /// with the rest but not part of the plan's key.
    pub(super) tag: u64,
}

#[cfg(feature = "cuda")]
impl TypedCall {
    /// Bytes of one element.
    pub(super) fn esize(&self) -> u64 {
        self.esize
    }
    /// The collective.
    pub(super) fn collective(&self) -> Collective {
        self.collective
    }
}

/// A 62-bit FNV-1a hash of words (non-negative, so it negates and compares as `i64`).
/// The sum of user counts, `None` past `usize`.
fn total(counts: &[usize]) -> Option<usize> {
    counts.iter().try_fold(0usize, |a, &c| a.checked_add(c))
}

fn hash(words: &[u64]) -> i64 {
    let h = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    (h >> 2) as i64
}

/// A typed collective with its arguments other than the buffers: what the local checks and
/// the descriptor need, the same for host slices and device buffers.
#[derive(Debug, Clone, Copy)]
pub(super) enum TypedCollective<'a> {
    /// `all_reduce` out of place.
    AllReduce(ReduceOp),
    /// `all_reduce` in place.
    AllReduceInPlace(ReduceOp),
    /// `reduce` to `root`.
    Reduce(u32, ReduceOp),
    /// `broadcast` from `root`, in place.
    Broadcast(u32),
    /// `all_gather` out of place.
    AllGather,
    /// `all_gather` in place.
    AllGatherInPlace,
    /// `all_gather_v` with every rank's count.
    AllGatherV(&'a [usize]),
    /// `all_gather_v` in place.
    AllGatherVInPlace(&'a [usize]),
    /// `reduce_scatter` (blocks).
    ReduceScatter(ReduceOp),
    /// `all_to_all` (equal blocks).
    AllToAll,
    /// `all_to_all_v` with this rank's send and receive counts.
    AllToAllV(&'a [usize], &'a [usize]),
    /// `gather` to `root`.
    Gather(u32),
    /// `scatter` from `root`.
    Scatter(u32),
}

/// Where a call's input is, by elements.
#[derive(Debug, Clone)]
pub(super) enum InputAt {
    /// A buffer of its own.
    Separate,
    /// These elements of the output buffer (in place).
    InOutput(Range<usize>),
}

/// A call after its local checks: the descriptor to agree on, this rank's local verdict,
/// where its input is, and whether this rank's input and output take part (a non-root's
/// output of `reduce`/`gather`, a non-root's input of `scatter`, do not).
#[derive(Debug)]
pub(super) struct CheckedCall {
    pub(super) call: TypedCall,
    pub(super) local: MpiResult<()>,
    pub(super) input: InputAt,
    pub(super) input_used: bool,
    pub(super) output_used: bool,
}

impl MpiCommunicator {
    /// The local checks of the single-process API for `kind` on buffers of `input` and
    /// `output` elements of `T` (in place: both the one buffer's length).
    pub(super) fn shape<T: Element>(
        &self,
        kind: TypedCollective<'_>,
        input: usize,
        output: usize,
    ) -> CheckedCall {
        self.shape_of(T::DTYPE, kind, input, output)
    }

    /// As [`Self::shape`] for elements of `dtype` named at run time (the front door's calls,
    /// whose descriptors carry their element type).
    pub(super) fn shape_of(
        &self,
        dtype: DType,
        kind: TypedCollective<'_>,
        input: usize,
        output: usize,
    ) -> CheckedCall {
        let me = self.rank() as usize;
        let n = self.size() as usize;
        let mut shape = CheckedCall {
            call: self.call(dtype, Collective::AllReduce, None, None, input as u64),
            local: Ok(()),
            input: InputAt::Separate,
            input_used: true,
            output_used: true,
        };
        let (call, local) = (&mut shape.call, &mut shape.local);
        let mut set = |c: Collective, op: Option<ReduceOp>, root: Option<u32>, count: usize| {
            call.collective = c;
            call.op = op;
            call.root = root;
            call.count = count as u64;
        };
        match kind {
            TypedCollective::AllReduce(op) => {
                if input != output {
                    *local = Err(self.buffer("output", output, input));
                }
                set(Collective::AllReduce, Some(op), None, input);
            }
            TypedCollective::AllReduceInPlace(op) => {
                set(Collective::AllReduce, Some(op), None, output);
                shape.input = InputAt::InOutput(0..output);
            }
            TypedCollective::Reduce(root, op) => {
                *local = self.root_ok(root);
                let is_root = root as usize == me;
                if local.is_ok() && is_root && output != input {
                    *local = Err(self.buffer("output", output, input));
                }
                set(Collective::Reduce, Some(op), Some(root), input);
                shape.output_used = is_root;
            }
            TypedCollective::Broadcast(root) => {
                *local = self.root_ok(root);
                set(Collective::Broadcast, None, Some(root), output);
                let mine = if root as usize == me { output } else { 0 };
                shape.input = InputAt::InOutput(0..mine);
            }
            TypedCollective::AllGather => {
                let needs = input.saturating_mul(n);
                if output != needs {
                    *local = Err(self.buffer("output", output, needs));
                }
                set(Collective::AllGather, None, None, input);
            }
            TypedCollective::AllGatherInPlace => {
                let (c, l) = self.blocks(output);
                *local = l;
                set(Collective::AllGather, None, None, c);
                shape.input = InputAt::InOutput(me * c..(me + 1) * c);
            }
            TypedCollective::AllGatherV(counts) => {
                *local = self.v_counts(counts, input, output);
                set(Collective::AllGatherV, None, None, input);
                call.counts = counts.iter().map(|c| *c as u64).collect();
            }
            TypedCollective::AllGatherVInPlace(counts) => {
                let mine = counts.get(me).copied().unwrap_or(0);
                *local = self.v_counts(counts, mine, output);
                // `v_counts` passed: the counts sum to `output`, so no prefix overflows.
                let range = if local.is_ok() {
                    let at: usize = counts.iter().take(me).sum();
                    at..at + mine
                } else {
                    0..0
                };
                set(Collective::AllGatherV, None, None, mine);
                call.counts = counts.iter().map(|c| *c as u64).collect();
                shape.input = InputAt::InOutput(range);
            }
            TypedCollective::ReduceScatter(op) => {
                let needs = output.saturating_mul(n);
                if input != needs {
                    *local = Err(self.buffer("input", input, needs));
                }
                set(Collective::ReduceScatter, Some(op), None, output);
            }
            TypedCollective::AllToAll => {
                let (c, l) = self.blocks(input);
                *local = l;
                if local.is_ok() && output != input {
                    *local = Err(self.buffer("output", output, input));
                }
                set(Collective::AllToAll, None, None, c);
            }
            TypedCollective::AllToAllV(send_counts, recv_counts) => {
                *local = if send_counts.len() != n || recv_counts.len() != n {
                    Err(MpiError::CountMismatch(format!(
                        "rank {me}: {} send and {} receive counts for {n} ranks",
                        send_counts.len(),
                        recv_counts.len()
                    )))
                } else {
                    match (total(send_counts), total(recv_counts)) {
                        (Some(s), _) if s != input => Err(self.buffer("input", input, s)),
                        (_, Some(r)) if r != output => Err(self.buffer("output", output, r)),
                        (Some(_), Some(_)) => Ok(()),
                        _ => Err(self.counts_overflow()),
                    }
                };
                set(Collective::AllToAllV, None, None, 0);
                if local.is_ok() {
                    call.counts = send_counts
                        .iter()
                        .chain(recv_counts)
                        .map(|c| *c as u64)
                        .collect();
                }
            }
            TypedCollective::Gather(root) => {
                *local = self.root_ok(root);
                let is_root = root as usize == me;
                let needs = input.saturating_mul(n);
                if local.is_ok() && is_root && output != needs {
                    *local = Err(self.buffer("output", output, needs));
                }
                set(Collective::Gather, None, Some(root), input);
                shape.output_used = is_root;
            }
            TypedCollective::Scatter(root) => {
                *local = self.root_ok(root);
                let is_root = root as usize == me;
                let needs = output.saturating_mul(n);
                if local.is_ok() && is_root && input != needs {
                    *local = Err(self.buffer("input", input, needs));
                }
                set(Collective::Scatter, None, Some(root), output);
                shape.input_used = is_root;
            }
        }
        shape
    }

    /// Run a checked call on host slices (`input` is ignored in place).
    fn host<T: Element>(&self, s: CheckedCall, input: &[T], output: &mut [T]) -> MpiResult<()> {
        let inp = match s.input {
            InputAt::Separate if s.input_used => Input::Slice(input),
            InputAt::Separate => Input::Slice(&[]),
            InputAt::InOutput(r) => Input::InOutput(r),
        };
        let out = if s.output_used { output } else { &mut [] };
        self.collective(s.call, s.local, inp, out)
    }

    /// `output = op(input of every rank)` on every rank (`MPI_Allreduce`). `input` and
    /// `output` hold the same number of elements.
    ///
    /// Collective. Errors: see [`MpiCommunicator::all_reduce_in_place`].
    pub fn all_reduce<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::AllReduce(op), input.len(), output.len());
        self.host(s, input, output)
    }

    /// [`Self::all_reduce`] in place: `buf` is this rank's input and receives the result.
    ///
    /// Collective. Errors, on every rank before any data moves: a count, element type, op or
    /// collective that differs between ranks ([`MpiError::CountMismatch`],
    /// [`MpiError::ElementMismatch`], [`MpiError::CallMismatch`]), `Avg` on an integer type
    /// ([`MpiError::Unsupported`] there, [`MpiError::Peer`] elsewhere), a peer that does not
    /// take part within the timeout ([`MpiError::Absent`] naming it and the call, which fails
    /// the communicator); during the run, an MPI error or a timeout, which fail the
    /// communicator.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::AllReduceInPlace(op), buf.len(), buf.len());
        self.host(s, &[], buf)
    }

    /// `output = op(input of every rank)` on rank `root` (`MPI_Reduce`). Ranks other than
    /// the root may pass an empty `output`; theirs is not touched. Collective; errors as
    /// [`Self::all_reduce_in_place`], and a root that is not a rank.
    pub fn reduce<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        root: u32,
        op: ReduceOp,
    ) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::Reduce(root, op), input.len(), output.len());
        self.host(s, input, output)
    }

    /// Rank `root`'s `buf` to every rank's `buf` (`MPI_Bcast`, in place). Collective; errors
    /// as [`Self::all_reduce_in_place`], and a root that is not a rank.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: u32) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::Broadcast(root), buf.len(), buf.len());
        self.host(s, &[], buf)
    }

    /// Every rank's `input`, concatenated in rank order, to every rank's `output`
    /// (`MPI_Allgather`); `output` holds `ranks x input.len()` elements. Collective; errors
    /// as [`Self::all_reduce_in_place`].
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::AllGather, input.len(), output.len());
        self.host(s, input, output)
    }

    /// [`Self::all_gather`] in place: this rank's contribution is its block (block `rank` of
    /// `buf.len() / ranks` elements) of `buf`. Collective; a `buf` that does not split into
    /// equal blocks is an error.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::AllGatherInPlace, buf.len(), buf.len());
        self.host(s, &[], buf)
    }

    /// As [`Self::all_gather`] with per-rank counts (`MPI_Allgatherv`, packed): `counts[r]`
    /// elements from rank `r`, the same list on every rank; `input` holds `counts[rank]`
    /// elements and `output` their sum. Collective; ranks with other lists give
    /// [`MpiError::CountMismatch`] on every rank.
    pub fn all_gather_v<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
    ) -> MpiResult<()> {
        let s = self.shape::<T>(
            TypedCollective::AllGatherV(counts),
            input.len(),
            output.len(),
        );
        self.host(s, input, output)
    }

    /// [`Self::all_gather_v`] in place: this rank's contribution sits at its place in `buf`
    /// (after the counts of lower ranks). Collective.
    pub fn all_gather_v_in_place<T: Element>(
        &self,
        buf: &mut [T],
        counts: &[usize],
    ) -> MpiResult<()> {
        let s = self.shape::<T>(
            TypedCollective::AllGatherVInPlace(counts),
            buf.len(),
            buf.len(),
        );
        self.host(s, &[], buf)
    }

    /// Block `rank` (of `input.len() / ranks` elements) of the reduction of every rank's
    /// `input` to `output` (`MPI_Reduce_scatter_block`). Collective; errors as
    /// [`Self::all_reduce_in_place`].
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> MpiResult<()> {
        let s = self.shape::<T>(
            TypedCollective::ReduceScatter(op),
            input.len(),
            output.len(),
        );
        self.host(s, input, output)
    }

    /// Block `d` of this rank's `input` to block `rank` of rank `d`'s `output`
    /// (`MPI_Alltoall`); both hold `ranks` equal blocks. Collective.
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::AllToAll, input.len(), output.len());
        self.host(s, input, output)
    }

    /// `send_counts[d]` elements of `input` to rank `d`, `recv_counts[s]` elements from
    /// rank `s` into `output`, both packed in rank order (`MPI_Alltoallv`). Collective; what
    /// one rank sends that another does not expect is [`MpiError::CountMismatch`] on every
    /// rank.
    pub fn all_to_all_v<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> MpiResult<()> {
        let kind = TypedCollective::AllToAllV(send_counts, recv_counts);
        let s = self.shape::<T>(kind, input.len(), output.len());
        self.host(s, input, output)
    }

    /// Every rank's `input`, concatenated in rank order, to `output` on rank `root`
    /// (`MPI_Gather`); other ranks may pass an empty `output`. Collective.
    pub fn gather<T: Element>(&self, input: &[T], output: &mut [T], root: u32) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::Gather(root), input.len(), output.len());
        self.host(s, input, output)
    }

    /// Block `r` (of `output.len()` elements) of `input` on rank `root` to rank `r`'s
    /// `output` (`MPI_Scatter`); other ranks may pass an empty `input`. Collective.
    pub fn scatter<T: Element>(&self, input: &[T], output: &mut [T], root: u32) -> MpiResult<()> {
        let s = self.shape::<T>(TypedCollective::Scatter(root), input.len(), output.len());
        self.host(s, input, output)
    }

    /// The algorithm of the plan the last collective call ran (`rank-space direct`,
    /// `rank-space Standard`, ...), or `None` before the first.
    pub fn last_algorithm(&self) -> Option<String> {
        let last = self.last_algorithm.borrow();
        (!last.is_empty()).then(|| last.clone())
    }

    /// Shapes the typed collectives keep planned (at most
    /// [`MpiCommunicator::plan_cache_limits`]' `max_plans`).
    pub fn cached_calls(&self) -> usize {
        self.calls.borrow().len()
    }

    /// Send/recv shapes kept planned (at most [`MpiCommunicator::plan_cache_limits`]'
    /// `max_plans`).
    pub fn cached_pairs(&self) -> usize {
        self.p2p_plans.borrow().len()
    }

    fn call(
        &self,
        dtype: DType,
        collective: Collective,
        op: Option<ReduceOp>,
        root: Option<u32>,
        count: u64,
    ) -> TypedCall {
        TypedCall {
            collective,
            dtype,
            esize: dtype.size(),
            op,
            root,
            count,
            counts: Vec::new(),
            tag: 0,
        }
    }

    fn buffer(&self, side: &'static str, got: usize, needs: usize) -> MpiError {
        MpiError::Buffer { side, got, needs }
    }

    fn root_ok(&self, root: u32) -> MpiResult<()> {
        if root < self.size() {
            Ok(())
        } else {
            Err(MpiError::Unsupported(format!(
                "rank {}: root {root} is not a rank (0..{})",
                self.rank(),
                self.size()
            )))
        }
    }

    /// The block size of a buffer of `len` elements in `ranks` equal blocks.
    fn blocks(&self, len: usize) -> (usize, MpiResult<()>) {
        let n = self.size() as usize;
        if len.is_multiple_of(n) {
            (len / n, Ok(()))
        } else {
            let e = MpiError::Unsupported(format!(
                "rank {}: {len} elements do not split into {n} equal blocks",
                self.rank()
            ));
            (0, Err(e))
        }
    }

    fn v_counts(&self, counts: &[usize], input: usize, output: usize) -> MpiResult<()> {
        let n = self.size() as usize;
        let me = self.rank() as usize;
        if counts.len() != n {
            return Err(MpiError::CountMismatch(format!(
                "rank {me}: {} counts for {n} ranks",
                counts.len()
            )));
        }
        if input != counts[me] {
            return Err(self.buffer("input", input, counts[me]));
        }
        let Some(total) = total(counts) else {
            return Err(self.counts_overflow());
        };
        if output != total {
            return Err(self.buffer("output", output, total));
        }
        Ok(())
    }

    fn counts_overflow(&self) -> MpiError {
        MpiError::CountMismatch(format!("rank {}: the counts sum past usize", self.rank()))
    }

    /// Steps 1 to 4 of the module docs for one call.
    fn collective<T: Element>(
        &self,
        mut call: TypedCall,
        local: MpiResult<()>,
        input: Input<'_, T>,
        output: &mut [T],
    ) -> MpiResult<()> {
        self.health.check()?;
        let (seq, local) = self.next_call(&call, local);
        let (key, all) = self.agreed(&mut call, local, seq)?;
        self.run_cached(&call, key, &all, input, output)
    }

    /// Step 2 of the module docs for a call whose local checks gave `local`: every rank's
    /// descriptor all-gathered and judged alike. Returns the cache key (the descriptors
    /// without flags and sequence numbers) and the gathered descriptors.
    pub(super) fn agreed(
        &self,
        call: &mut TypedCall,
        local: MpiResult<()>,
        seq: u64,
    ) -> MpiResult<(Vec<i64>, Vec<i64>)> {
        if local.is_err() {
            call.counts.clear();
        }
        let desc = descriptor(call, seq, local.is_err());
        let at = WaitPoint::call(AGREE, call.collective, seq);
        let all = agree::collective(self, at, AgreementCollective::AllGather, desc.to_vec())?;
        let key = verdict(&all, local)?;
        Ok((key, all))
    }

    /// The next sequence number of a typed collective on this communicator, and the local
    /// verdict with `avg` refused on integer types.
    pub(super) fn next_call(
        &self,
        call: &TypedCall,
        mut local: MpiResult<()>,
    ) -> (u64, MpiResult<()>) {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        if local.is_ok()
            && call.collective.reduces()
            && call.op == Some(ReduceOp::Avg)
            && !call.dtype.is_float()
        {
            local = Err(MpiError::Unsupported(format!(
                "rank {}: avg is defined for floating types, not {}",
                self.rank(),
                call.dtype
            )));
        }
        (seq, local)
    }

    /// Remember the algorithm of the plan a call ran, for [`Self::last_algorithm`].
    pub(super) fn set_last_algorithm(&self, algorithm: &str) {
        let mut last = self.last_algorithm.borrow_mut();
        if *last != algorithm {
            algorithm.clone_into(&mut last);
        }
    }

    /// Plan on a miss (all ranks miss together), then run.
    fn run_cached<T: Element>(
        &self,
        call: &TypedCall,
        key: Vec<i64>,
        all: &[i64],
        input: Input<'_, T>,
        output: &mut [T],
    ) -> MpiResult<()> {
        let mut cache = self.calls.borrow_mut();
        if !cache.touch(&key) {
            // Every rank misses here (the ranks' caches hold the same shapes), so every rank
            // takes the same steps: room for one more shape before allocating, the request
            // and plan (the same on every rank, so are their errors), this rank's part
            // agreed with its bytes, then room for the agreed weight.
            let limits = self.plan_cache_limits();
            drop(cache.evict_to_fit(limits, 1, 0));
            let req = self.request(call, all)?;
            let made = self.prepare_request(&req, self.comm.as_raw()).map(|p| {
                let bytes = p.weight;
                (p, bytes)
            });
            let seq = all.get(SEQ).map_or(0, |s| *s as u64);
            let at = WaitPoint::call("prepare a collective call", call.collective, seq);
            let (mut p, weight) = super::agree_weighed(self, made, at)?;
            p.weight = weight;
            drop(cache.evict_to_fit(limits, 1, weight));
            cache.insert(key.clone(), p);
        }
        let Some(p) = cache.peek_mut(&key) else {
            return Err(MpiError::Unsupported("a prepared shape vanished".into()));
        };
        self.set_last_algorithm(&p.algorithm);
        let out: &mut [u8] = bytemuck::cast_slice_mut(output);
        let esize = std::mem::size_of::<T>();
        let borrowed = self.zero_copy && !p.schedule.writes_input();
        let timeout = self.timeout.get();
        let shm = self.shm.as_ref();
        let ran = (|| {
            if out.len() != p.schedule.output_len {
                return Err(self.buffer("output", out.len(), p.schedule.output_len));
            }
            let src: &[u8] = match &input {
                Input::Slice(s) => bytemuck::cast_slice(s),
                Input::InOutput(r) => {
                    let bytes = r.start * esize..r.end * esize;
                    let inb = p.bufs.input_bytes(&p.schedule)?;
                    let src = out.get(bytes).ok_or(MpiError::Buffer {
                        side: "input",
                        got: out.len(),
                        needs: r.end * esize,
                    })?;
                    if src.len() != inb.len() {
                        return Err(self.buffer("input", src.len(), inb.len()));
                    }
                    // In place: the input is copied first, as the output overwrites it.
                    inb.copy_from_slice(src);
                    &[]
                }
            };
            let in_place = matches!(input, Input::InOutput(_));
            if !in_place && src.len() != p.schedule.input_len {
                return Err(self.buffer("input", src.len(), p.schedule.input_len));
            }
            if !borrowed {
                if !in_place {
                    p.bufs.input_bytes(&p.schedule)?.copy_from_slice(src);
                }
                p.schedule.run_in(&mut p.reqs, &mut p.bufs, timeout, shm)?;
                out.copy_from_slice(p.bufs.output_bytes(&p.schedule)?);
                return Ok(());
            }
            // Zero copy: messages read the caller's input and write its output.
            let in_ptr = if in_place {
                p.bufs.input_bytes(&p.schedule)?.as_mut_ptr()
            } else {
                src.as_ptr().cast_mut()
            };
            // SAFETY: `in_ptr` holds `input_len` bytes (checked above, or the run buffer
            // `input_bytes` sized for the schedule), only read (`borrowed` excludes schedules
            // that write their input); `out` holds `output_len` bytes (checked above) and is
            // borrowed mutably for the call, so nothing else touches it; an input slice and
            // `out` cannot overlap (a shared and a mutable borrow), and neither overlaps the
            // run buffers. If the run fails with requests MPI keeps, the process ends below
            // before this function returns, so MPI never touches them after the borrows end;
            // a panic with requests posted ends the process too (below), since unwinding
            // would end the borrows while MPI still holds pointers into them.
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                p.schedule.run_at(
                    &mut p.reqs,
                    in_ptr,
                    out.as_mut_ptr(),
                    &mut p.bufs,
                    timeout,
                    shm,
                )
            }));
            match run {
                Ok(r) => r,
                Err(panic) => {
                    if p.reqs.any_pending() {
                        eprintln!(
                            "relaycc: rank {}: a zero-copy run panicked with MPI requests \
                             into this call's buffers pending: aborting the job",
                            self.rank()
                        );
                        self.abort(70)
                    }
                    std::panic::resume_unwind(panic)
                }
            }
        })();
        if let Err(e) = &ran
            && borrowed
            && let Some(stuck) = p.reqs.take_stuck()
        {
            eprintln!(
                "relaycc: rank {}: {e}; MPI keeps {} requests into this call's buffers (zero \
                 copy), which cannot outlive the call: aborting the job",
                self.rank(),
                stuck.len()
            );
            self.abort(70)
        }
        let bufs = &mut p.bufs;
        self.health
            .settle(ran, &mut p.reqs, || Box::new(std::mem::take(bufs)))
    }

    /// The agreed request in rank space: ranks `0..n` are the processes.
    pub(super) fn request(&self, call: &TypedCall, all: &[i64]) -> MpiResult<Request> {
        let n = self.size() as usize;
        let mut req = Request::new(
            call.collective,
            (0..n as u32).collect(),
            call.count,
            call.dtype,
        )
        .with_op(call.op.unwrap_or(ReduceOp::Sum))
        .with_root(call.root.unwrap_or(0));
        match call.collective {
            Collective::AllGatherV => {
                req.counts = all.chunks(WORDS).map(|d| d[COUNT] as u64).collect();
            }
            Collective::AllToAllV => {
                // Every rank's send and receive counts: the matrix, checked pair by pair.
                let words: Vec<i64> = call.counts.iter().map(|c| *c as i64).collect();
                let seq = all.get(SEQ).map_or(0, |s| *s as u64);
                let at = WaitPoint::call(AGREE, call.collective, seq);
                let got = agree::collective(self, at, AgreementCollective::AllGather, words)?;
                let rows: Vec<&[i64]> = got.chunks(2 * n).collect();
                for (s, row) in rows.iter().enumerate() {
                    for (d, peer) in rows.iter().enumerate() {
                        let (sends, expects) = (row[d], peer[n + s]);
                        if sends != expects {
                            return Err(MpiError::CountMismatch(format!(
                                "rank {s} sends {sends} elements to rank {d}, which expects \
                                 {expects}"
                            )));
                        }
                    }
                }
                req.matrix = rows
                    .iter()
                    .map(|r| r[..n].iter().map(|c| *c as u64).collect())
                    .collect();
            }
            _ => {}
        }
        req.validate()?;
        Ok(req)
    }

    /// Plan, check and schedule `req` for this rank, with requests on `comm`.
    pub(super) fn prepare_request(
        &self,
        req: &Request,
        comm: ffi::MPI_Comm,
    ) -> MpiResult<PreparedShape> {
        let plan = self.plan_request(req)?;
        let schedule = RankSchedule::new(&plan, self.rank(), &|l| match l {
            Location::Gpu(r) => Some(r),
            Location::Host(_) => None,
        })?;
        let shared = self.shm.as_ref().is_some_and(|s| s.maps_shared_buffers());
        let bufs = RunBuffers::new(&schedule, shared);
        let weight = schedule.run_bytes();
        Ok(PreparedShape {
            schedule,
            bufs,
            reqs: Requests::new(comm, self.rank()),
            algorithm: plan.algorithm,
            weight,
        })
    }

    /// The plan of an agreed request in rank space, proved by the checker: exchanges by
    /// [Lockhart-2023]'s model, the others direct (module docs, step 3).
    pub(super) fn plan_request(&self, req: &Request) -> MpiResult<Plan> {
        let plan = relaycc_route::planner::ranks::plan(req, &self.rank_space(), None)?;
        // Proves every output element gets exactly what the request names before a message
        // moves; deterministic, so every rank reaches the same verdict.
        relaycc_route::check(&plan)?;
        Ok(plan)
    }

    /// Send `buf` to rank `dest` (`MPI_Send`), matched by a [`Self::recv`] there of the same
    /// element type and count. The pair first agrees (the receiver answers whether the
    /// descriptor matches), then the data moves as a one-op plan.
    ///
    /// Errors: `dest` is not another rank; [`MpiError::CountMismatch`] or
    /// [`MpiError::ElementMismatch`] on both ranks when the receive differs;
    /// [`MpiError::Timeout`] when the peer does not answer in time (which fails the
    /// communicator).
    pub fn send<T: Element>(&self, buf: &[T], dest: u32) -> MpiResult<()> {
        self.point_to_point::<T>(dest, true, bytemuck::cast_slice(buf), &mut [])
    }

    /// Receive into `buf` from rank `src` (`MPI_Recv`), matched by a [`Self::send`] there.
    /// Errors as [`Self::send`].
    pub fn recv<T: Element>(&self, buf: &mut [T], src: u32) -> MpiResult<()> {
        let len = buf.len();
        let out: &mut [u8] = bytemuck::cast_slice_mut(buf);
        self.point_to_point::<T>(src, false, &[], out)
            .map_err(|e| match e {
                MpiError::Buffer { .. } => MpiError::CountMismatch(format!(
                    "rank {} receives {len} elements from rank {src}, which sends another count",
                    self.rank()
                )),
                e => e,
            })
    }

    fn point_to_point<T: Element>(
        &self,
        peer: u32,
        sending: bool,
        input: &[u8],
        output: &mut [u8],
    ) -> MpiResult<()> {
        let esize = std::mem::size_of::<T>() as u64;
        let count = (input.len().max(output.len()) as u64) / esize.max(1);
        // Preparing a pair's shape is local here, so the two ranks' caches need not agree.
        let (src, dst, _) = self.p2p_agree(peer, sending, count, T::DTYPE, false)?;
        let key = (src, dst, count, T::DTYPE);
        let mut plans = self.p2p_plans.borrow_mut();
        if !plans.touch(&key) {
            let req = self.p2p_request(src, dst, count, T::DTYPE);
            let p = self.prepare_request(&req, self.p2p.as_raw())?;
            drop(plans.evict_to_fit(self.plan_cache_limits(), 1, p.weight));
            plans.insert(key, p);
        }
        let Some(p) = plans.peek_mut(&key) else {
            return Err(MpiError::Unsupported(
                "a prepared send/recv vanished".into(),
            ));
        };
        let ran = p
            .schedule
            .run(&mut p.reqs, input, output, &mut p.bufs, self.timeout.get());
        let bufs = &mut p.bufs;
        self.health
            .settle(ran, &mut p.reqs, || Box::new(std::mem::take(bufs)))
    }

    /// The pairwise agreement of a send (`sending`) or a receive of `count` elements of
    /// `dtype` with `peer`, on the pair communicator within the timeout. `fresh`: this rank
    /// must prepare the pair's shape (it is not in its cache). Returns the pair as (source,
    /// destination) and whether either rank must prepare, the same answer on both, so that
    /// both take the same steps whatever each one's cache kept.
    ///
    /// Errors: `peer` is not another rank; [`MpiError::CountMismatch`],
    /// [`MpiError::ElementMismatch`] or [`MpiError::CallMismatch`] on both ranks when the
    /// two calls differ; [`MpiError::Timeout`] (which fails the communicator).
    pub(super) fn p2p_agree(
        &self,
        peer: u32,
        sending: bool,
        count: u64,
        dtype: DType,
        fresh: bool,
    ) -> MpiResult<(u32, u32, bool)> {
        self.health.check()?;
        let me = self.rank();
        if peer >= self.size() || peer == me {
            return Err(MpiError::Unsupported(format!(
                "rank {me}: peer {peer} is not another rank (0..{})",
                self.size()
            )));
        }
        let seq = {
            let mut s = self.p2p_seq.borrow_mut();
            let slot = s.entry((peer, sending)).or_insert(0);
            *slot += 1;
            *slot
        };
        let mine = [
            count as i64,
            dtype as i64,
            dtype.size() as i64,
            seq as i64,
            i64::from(fresh),
        ];
        let (verdict, prepare) = self.handshake(peer, sending, mine)?;
        if verdict != 0 {
            let what = match verdict {
                2 => MpiError::ElementMismatch(format!(
                    "ranks {me} and {peer} pass different element types to a send/recv pair"
                )),
                3 => MpiError::CallMismatch(format!(
                    "ranks {me} and {peer} are at different send/recv calls of their pair"
                )),
                _ => MpiError::CountMismatch(format!(
                    "ranks {me} and {peer} pass different counts to a send/recv pair"
                )),
            };
            return Err(what);
        }
        let (src, dst) = if sending { (me, peer) } else { (peer, me) };
        Ok((src, dst, prepare))
    }

    /// The request of one send/recv pair in rank space.
    pub(super) fn p2p_request(&self, src: u32, dst: u32, count: u64, dtype: DType) -> Request {
        let n = self.size();
        let mut req = Request::new(Collective::SendRecv, (0..n).collect(), count, dtype);
        req.transfers = vec![Transfer { src, dst, count }];
        req
    }

    /// The pair communicator of send/recv (a private duplicate of its own).
    #[cfg(feature = "cuda")]
    pub(super) fn p2p_raw(&self) -> ffi::MPI_Comm {
        self.p2p.as_raw()
    }

    /// The pairwise agreement: the sender sends its descriptor (count, element type and
    /// size, sequence number of the pair, whether it must prepare) and waits for the answer;
    /// the receiver compares it with its own and answers the verdict, 0 (match), 1 (count),
    /// 2 (element) or 3 (sequence), and whether either side must prepare. Both return the
    /// answer. Bounded by the timeout (a timeout fails the communicator; requests MPI keeps
    /// are buried with their buffers).
    fn handshake(&self, peer: u32, sending: bool, mine: [i64; 5]) -> MpiResult<(i64, bool)> {
        let mut reqs = Requests::new(self.p2p.as_raw(), self.rank());
        let mut desc = Box::new(mine);
        let mut ack = Box::new([0i64; 2]);
        let p = peer as c_int;
        let (desc_bytes, ack_bytes) = (8 * mine.len(), 16);
        let posted = (|| {
            if sending {
                // SAFETY: both boxes live until the requests complete: on success `wait`
                // returned, and on failure the boxes are buried with the stuck requests.
                unsafe {
                    reqs.irecv(ack.as_mut_ptr().cast(), ack_bytes, p, TAG_ACK)?;
                    reqs.isend(desc.as_ptr().cast(), desc_bytes, p, TAG_DESC)?;
                }
                reqs.wait(0, Instant::now() + self.timeout.get(), self.timeout.get())?;
                Ok((ack[0], ack[1] != 0))
            } else {
                // SAFETY: as above.
                unsafe { reqs.irecv(desc.as_mut_ptr().cast(), desc_bytes, p, TAG_DESC)? };
                reqs.wait(0, Instant::now() + self.timeout.get(), self.timeout.get())?;
                ack[0] = if desc[1] != mine[1] || desc[2] != mine[2] {
                    2
                } else if desc[0] != mine[0] {
                    1
                } else if desc[3] != mine[3] {
                    3
                } else {
                    0
                };
                ack[1] = i64::from(desc[4] != 0 || mine[4] != 0);
                reqs.clear();
                // SAFETY: as above.
                unsafe { reqs.isend(ack.as_ptr().cast(), ack_bytes, p, TAG_ACK)? };
                reqs.wait(0, Instant::now() + self.timeout.get(), self.timeout.get())?;
                Ok((ack[0], ack[1] != 0))
            }
        })();
        match posted {
            Ok(v) => Ok(v),
            Err(e) => {
                let e = match e {
                    MpiError::Timeout {
                        rank,
                        level,
                        pending,
                        after,
                        ..
                    } => MpiError::Timeout {
                        rank,
                        step: HANDSHAKE,
                        level,
                        pending,
                        after,
                    },
                    e => e,
                };
                let r = self
                    .health
                    .settle(Err(e), &mut reqs, || Box::new((desc, ack)));
                r.map(|()| (0, false))
            }
        }
    }
}

/// This rank's descriptor words.
fn descriptor(call: &TypedCall, seq: u64, failed: bool) -> [i64; WORDS] {
    let mut d = [0i64; WORDS];
    d[FAILED] = i64::from(failed);
    d[SEQ] = seq as i64;
    d[COLL] = call.collective as i64;
    d[DTYPE] = call.dtype as i64;
    d[ESIZE] = call.esize as i64;
    d[OP] = call.op.map_or(-1, |o| o as i64);
    d[ROOT] = call.root.map_or(-1, i64::from);
    d[COUNT] = call.count as i64;
    d[VHASH] = hash(&call.counts);
    d[TAG] = call.tag as i64;
    d
}

/// The verdict on every rank's descriptor, the same on every rank: this rank's local error,
/// [`MpiError::Peer`] for another rank's, or the first field that differs between ranks.
/// Returns the cache key: the descriptors without the failure flag and sequence numbers.
fn verdict(all: &[i64], local: MpiResult<()>) -> MpiResult<Vec<i64>> {
    let rows: Vec<&[i64]> = all.chunks(WORDS).collect();
    local?;
    if let Some(r) = rows.iter().position(|d| d[FAILED] != 0) {
        return Err(MpiError::Peer {
            rank: r as u32,
            step: "pass its local checks of a collective call",
        });
    }
    let first = rows.first().copied().unwrap_or(&[0; WORDS]);
    let differs = |f: usize| rows.iter().position(|d| d[f] != first[f]);
    let name = |c: i64| {
        Collective::ALL
            .iter()
            .find(|x| **x as i64 == c)
            .map_or("?", |x| x.name())
    };
    if let Some(r) = differs(SEQ) {
        return Err(MpiError::CallMismatch(format!(
            "rank {r} is at collective call #{} of this communicator, rank 0 at #{}: ranks \
             call collectives in different orders",
            rows[r][SEQ], first[SEQ]
        )));
    }
    if let Some(r) = differs(TAG) {
        return Err(MpiError::CallMismatch(format!(
            "rank {r} tags call #{} with {}, rank 0 with {}: a rank skipped or added a call",
            first[SEQ], rows[r][TAG] as u64, first[TAG] as u64
        )));
    }
    if let Some(r) = differs(COLL) {
        return Err(MpiError::CallMismatch(format!(
            "rank {r} calls {}, rank 0 calls {} (call #{})",
            name(rows[r][COLL]),
            name(first[COLL]),
            first[SEQ]
        )));
    }
    if let Some(r) = differs(ESIZE).or_else(|| differs(DTYPE)) {
        return Err(MpiError::ElementMismatch(format!(
            "rank {r} passes {}-byte elements of type code {}, rank 0 {}-byte elements of type \
             code {} ({} #{})",
            rows[r][ESIZE],
            rows[r][DTYPE],
            first[ESIZE],
            first[DTYPE],
            name(first[COLL]),
            first[SEQ]
        )));
    }
    if let Some(r) = differs(OP) {
        let op = |v: i64| {
            [
                ReduceOp::Sum,
                ReduceOp::Prod,
                ReduceOp::Min,
                ReduceOp::Max,
                ReduceOp::Avg,
            ]
            .into_iter()
            .find(|o| *o as i64 == v)
            .map_or("?", |o| o.name())
        };
        return Err(MpiError::CallMismatch(format!(
            "rank {r} reduces with {}, rank 0 with {} ({} #{})",
            op(rows[r][OP]),
            op(first[OP]),
            name(first[COLL]),
            first[SEQ]
        )));
    }
    if let Some(r) = differs(ROOT) {
        return Err(MpiError::CallMismatch(format!(
            "rank {r} names root {}, rank 0 root {} ({} #{})",
            rows[r][ROOT],
            first[ROOT],
            name(first[COLL]),
            first[SEQ]
        )));
    }
    let coll = name(first[COLL]);
    if first[COLL] == Collective::AllGatherV as i64 {
        let counts: Vec<u64> = rows.iter().map(|d| d[COUNT] as u64).collect();
        if let Some(r) = rows.iter().position(|d| d[VHASH] != hash(&counts)) {
            return Err(MpiError::CountMismatch(format!(
                "rank {r} passes counts that are not the ranks' contributions {counts:?} \
                 ({coll} #{})",
                first[SEQ]
            )));
        }
    } else if first[COLL] != Collective::AllToAllV as i64
        && let Some(r) = differs(COUNT)
    {
        return Err(MpiError::CountMismatch(format!(
            "rank {r} passes {} elements, rank 0 {} ({coll} #{})",
            rows[r][COUNT], first[COUNT], first[SEQ]
        )));
    }
    Ok(rows
        .iter()
        .flat_map(|d| d[COLL..TAG].iter().copied())
        .collect())
}
