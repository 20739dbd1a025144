//! One operation of a call before agreement (step 1 of [`super::typed`]'s module docs): the
//! descriptor the front door made ([`CallDesc`], the one every surface agrees on) and the
//! views this rank lent, checked against this rank's part of the collective's layout
//! (route's `Request::input_len` and `output_len`, which every surface checks against), in a
//! [`CheckedCall`]. Nothing here is written per collective: the layout is the request's, and
//! where the input sits in place is where the front door lent it.

use std::ops::Range;

use relaycc_route::{Collective, DType, ReduceOp};

use super::{MpiCommunicator, MpiError, MpiResult};
use crate::call::CallDesc;
use crate::error::CollectivesError;
use crate::rank::View;

/// Where a call's input is, by elements.
#[derive(Debug, Clone)]
pub(super) enum InputAt {
    /// A buffer of its own.
    Separate,
    /// These elements of the output buffer (in place).
    InOutput(Range<usize>),
}

/// A call after its local checks: the descriptor to agree on (with the caller's tag, agreed
/// with the rest but not part of the plan's key), this rank's local verdict, where its input
/// is, and whether this rank's input and output take part (a non-root's output of
/// `reduce`/`gather`, a non-root's input of `scatter` and `broadcast`, do not).
#[derive(Debug)]
pub(super) struct CheckedCall {
    pub(super) call: CallDesc,
    pub(super) local: MpiResult<()>,
    pub(super) input: InputAt,
    pub(super) input_used: bool,
    pub(super) output_used: bool,
}

impl CheckedCall {
    /// A call that moves nothing, to agree on a failure found before any operation was
    /// described (the lender's), so the other ranks fail too instead of waiting.
    pub(super) fn nothing() -> Self {
        CheckedCall {
            call: CallDesc::new(Collective::AllReduce, DType::U8, 0, ReduceOp::Sum, 0),
            local: Ok(()),
            input: InputAt::Separate,
            input_used: false,
            output_used: false,
        }
    }
}

/// An operation's checked call and the views it runs on (`vin` a separate input; `vout` the
/// output, holding the input when in place).
pub(super) struct Mapped {
    pub(super) shape: CheckedCall,
    pub(super) vin: Option<View>,
    pub(super) vout: Option<View>,
}

impl MpiCommunicator {
    /// The local checks of one operation: `desc` as the front door described it, with the
    /// views this rank lent. In place (both views in one buffer) the input lies inside the
    /// output, where the front door put it; the forms with the output inside the input
    /// (`reduce_scatter_in_place`, `scatter_in_place` on the root) are refused, and the
    /// refusal is agreed like any local error, so ranks whose own views look like an ordinary
    /// call (a scatter's non-roots) fail with it instead of waiting.
    pub(super) fn check_op(
        &self,
        mut call: CallDesc,
        input: Option<View>,
        output: Option<View>,
    ) -> Mapped {
        let me = self.rank as usize;
        if call.collective.counts_per_rank() {
            // The agreement carries each rank's own count beside the list's hash.
            call.count = call.counts.get(me).copied().unwrap_or(0);
        }
        let (ilen, olen) = (input.map_or(0, |v| v.len), output.map_or(0, |v| v.len));
        let mut local = self.layout_check(&call, ilen, olen);
        let mut m = Mapped {
            shape: CheckedCall {
                call,
                local: Ok(()),
                input: InputAt::Separate,
                input_used: input.is_some(),
                output_used: output.is_some(),
            },
            vin: input,
            vout: output,
        };
        if let (Some(i), Some(o)) = (input, output)
            && i.block == o.block
        {
            let inside = i.offset >= o.offset && i.offset + i.len <= o.offset + o.len;
            if inside {
                let at = (i.offset - o.offset) as usize;
                m.shape.input = InputAt::InOutput(at..at + i.len as usize);
            } else if local.is_ok() {
                local = Err(MpiError::Unsupported(format!(
                    "{}: the in-place form is not supported on MPI ranks (the output would \
                     lie inside the input buffer); pass separate send and receive buffers",
                    m.shape.call.call
                )));
            }
            m.vin = None;
        }
        m.shape.local = local;
        m
    }

    /// This rank's buffers (`input` and `output` elements) against its part of `call`'s
    /// layout, with the argument checks that need only this rank's descriptor: one count
    /// per rank, a root that is a rank. The errors are those of every surface
    /// ([`CollectivesError`], inside [`MpiError::Backend`]).
    fn layout_check(&self, call: &CallDesc, input: u64, output: u64) -> MpiResult<()> {
        let (me, n) = (self.rank as usize, self.size as usize);
        let name = call.call;
        let all_to_all_v = call.collective == Collective::AllToAllV;
        let lists: &[&[u64]] = match call.collective {
            Collective::AllGatherV | Collective::ReduceScatterV => &[&call.counts],
            Collective::AllToAllV => &[&call.counts, &call.recv_counts],
            _ => &[],
        };
        if let Some(list) = lists.iter().find(|l| l.len() != n) {
            return Err(MpiError::Backend(CollectivesError::RankCount {
                call: name,
                side: "counts",
                expected: n,
                got: list.len(),
            }));
        }
        if call.collective.rooted() && call.root >= n {
            return Err(MpiError::Backend(CollectivesError::BadRank {
                call: name,
                rank: call.root,
                ranks: n,
            }));
        }
        if all_to_all_v && call.counts[me] != call.recv_counts[me] {
            return Err(MpiError::CountMismatch(format!(
                "rank {me} sends itself {} elements and expects {}",
                call.counts[me], call.recv_counts[me]
            )));
        }
        // The call's layout in a request this communicator keeps, so a call allocates nothing
        // once the request has grown to its shape. An all_to_all_v rank knows its own row and
        // column of the matrix, which is all its lengths read.
        let mut req = self.layout_request.borrow_mut();
        req.collective = call.collective;
        req.dtype = call.dtype;
        req.count = call.count;
        req.root = u32::try_from(call.root).unwrap_or(u32::MAX);
        req.counts.clear();
        req.matrix.iter_mut().for_each(Vec::clear);
        if call.collective.counts_per_rank() {
            req.count = 0;
            req.counts.extend_from_slice(&call.counts);
        } else if all_to_all_v {
            req.count = 0;
            req.matrix.resize_with(n, Vec::new);
            for (s, row) in req.matrix.iter_mut().enumerate() {
                row.resize(n, 0);
                row[me] = call.recv_counts[s];
            }
            req.matrix[me].copy_from_slice(&call.counts);
        }
        let lens = req
            .input_len(me as u32)
            .and_then(|i| Ok((i, req.output_len(me as u32)?)));
        let (needs_in, needs_out) = lens.map_err(|e| {
            MpiError::Backend(CollectivesError::Overflow {
                call: name,
                what: e.to_string(),
            })
        })?;
        for (side, got, needs) in [("input", input, needs_in), ("output", output, needs_out)] {
            if got != needs {
                return Err(MpiError::Backend(CollectivesError::CountMismatch {
                    call: name,
                    rank: me,
                    side,
                    got,
                    needs,
                }));
            }
        }
        Ok(())
    }

    /// The next sequence number of a collective call on this communicator, and the local
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
            local = Err(MpiError::Backend(CollectivesError::UnsupportedOp {
                call: call.call,
                op: call.op,
                dtype: call.dtype,
            }));
        }
        (seq, local)
    }
}
