//! A typed collective call before agreement (step 1 of [`super::typed`]'s module docs): what
//! this rank asks for (a [`TypedCollective`] with its arguments) and the local checks of the
//! single-process API that turn it into the crate's call descriptor ([`CallDesc`], the one
//! every surface agrees on) in a [`CheckedCall`], the same for host slices and device
//! buffers.

use std::ops::Range;

use relaycc_route::{Collective, DType, ReduceOp};

use super::{MpiCommunicator, MpiError, MpiResult};
use crate::call::CallDesc;

/// The sum of user counts, `None` past `usize`.
fn total(counts: &[usize]) -> Option<usize> {
    counts.iter().try_fold(0usize, |a, &c| a.checked_add(c))
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
    /// `reduce_scatter_v` with every rank's count.
    ReduceScatterV(&'a [usize], ReduceOp),
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

/// A call after its local checks: the descriptor to agree on (its tag, 0 for none, is the
/// caller's to set: agreed with the rest, but not part of the plan's key), this rank's local
/// verdict, where its input is, and whether this rank's input and output take part (a
/// non-root's output of `reduce`/`gather`, a non-root's input of `scatter`, do not).
#[derive(Debug)]
pub(super) struct CheckedCall {
    pub(super) call: CallDesc,
    pub(super) local: MpiResult<()>,
    pub(super) input: InputAt,
    pub(super) input_used: bool,
    pub(super) output_used: bool,
}

impl MpiCommunicator {
    /// The local checks of the single-process API for `kind` on buffers of `input` and
    /// `output` elements of `dtype` (in place: both the one buffer's length), as the front
    /// door's calls describe them.
    pub(super) fn shape_of(
        &self,
        dtype: DType,
        kind: TypedCollective<'_>,
        input: usize,
        output: usize,
    ) -> CheckedCall {
        let me = self.rank as usize;
        let n = self.size as usize;
        let mut shape = CheckedCall {
            call: CallDesc::new(Collective::AllReduce, dtype, input as u64, ReduceOp::Sum, 0),
            local: Ok(()),
            input: InputAt::Separate,
            input_used: true,
            output_used: true,
        };
        let (call, local) = (&mut shape.call, &mut shape.local);
        // The descriptor's op and root mean something only where the collective reduces or
        // has a root; elsewhere they keep `CallDesc::new`'s `Sum` and 0, which nothing reads.
        let mut set = |c: Collective, op: Option<ReduceOp>, root: Option<u32>, count: usize| {
            call.call = c.name();
            call.collective = c;
            call.op = op.unwrap_or(ReduceOp::Sum);
            call.root = root.map_or(0, |r| r as usize);
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
                *local = self.v_counts(counts, ("input", input), ("output", output));
                set(Collective::AllGatherV, None, None, input);
                call.counts = counts.iter().map(|c| *c as u64).collect();
            }
            TypedCollective::AllGatherVInPlace(counts) => {
                let mine = counts.get(me).copied().unwrap_or(0);
                *local = self.v_counts(counts, ("input", mine), ("output", output));
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
            TypedCollective::ReduceScatterV(counts, op) => {
                *local = self.v_counts(counts, ("output", output), ("input", input));
                set(Collective::ReduceScatterV, Some(op), None, output);
                call.counts = counts.iter().map(|c| *c as u64).collect();
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
                    call.counts = send_counts.iter().map(|c| *c as u64).collect();
                    call.recv_counts = recv_counts.iter().map(|c| *c as u64).collect();
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
    pub(super) fn buffer(&self, side: &'static str, got: usize, needs: usize) -> MpiError {
        MpiError::Buffer { side, got, needs }
    }

    fn root_ok(&self, root: u32) -> MpiResult<()> {
        if root < self.size {
            Ok(())
        } else {
            Err(MpiError::Unsupported(format!(
                "rank {}: root {root} is not a rank (0..{})",
                self.rank, self.size
            )))
        }
    }

    /// The block size of a buffer of `len` elements in `ranks` equal blocks.
    fn blocks(&self, len: usize) -> (usize, MpiResult<()>) {
        let n = self.size as usize;
        if len.is_multiple_of(n) {
            (len / n, Ok(()))
        } else {
            let e = MpiError::Unsupported(format!(
                "rank {}: {len} elements do not split into {n} equal blocks",
                self.rank
            ));
            (0, Err(e))
        }
    }

    /// The local checks of a v-collective whose `counts` are every rank's: `own` (the buffer
    /// side holding this rank's block, and its length) holds `counts[rank]` elements and
    /// `whole` their sum.
    fn v_counts(
        &self,
        counts: &[usize],
        (own_side, own): (&'static str, usize),
        (whole_side, whole): (&'static str, usize),
    ) -> MpiResult<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        if counts.len() != n {
            return Err(MpiError::CountMismatch(format!(
                "rank {me}: {} counts for {n} ranks",
                counts.len()
            )));
        }
        if own != counts[me] {
            return Err(self.buffer(own_side, own, counts[me]));
        }
        let Some(total) = total(counts) else {
            return Err(self.counts_overflow());
        };
        if whole != total {
            return Err(self.buffer(whole_side, whole, total));
        }
        Ok(())
    }

    fn counts_overflow(&self) -> MpiError {
        MpiError::CountMismatch(format!("rank {}: the counts sum past usize", self.rank))
    }

    /// The next sequence number of a typed collective on this communicator, and the local
    /// verdict with `avg` refused on integer types.
    pub(super) fn next_call(
        &self,
        call: &CallDesc,
        mut local: MpiResult<()>,
    ) -> (u64, MpiResult<()>) {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        if local.is_ok()
            && call.collective.reduces()
            && call.op == ReduceOp::Avg
            && !call.dtype.is_float()
        {
            local = Err(MpiError::Unsupported(format!(
                "rank {}: avg is defined for floating types, not {}",
                self.rank, call.dtype
            )));
        }
        (seq, local)
    }
}
