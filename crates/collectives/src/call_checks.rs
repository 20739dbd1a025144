//! The checks every operation passes before any byte moves: rank counts, ownership, element
//! counts and their overflow, reduce ops per type, and the overlap of input and output.

use relaycc_route::{Collective, InPlace, MAX_ELEMENTS, ReduceOp, Request, RouteError};

use crate::backend::ByteRegion;
use crate::buffer::RawView;
use crate::communicator::Communicator;
use crate::error::{CollectivesError, Result};
use crate::exec::counts::CountLayout;
use crate::group::{Checked, Counted};

/// Check `request` and its per-rank buffers. `ranks[r]` is the communicator rank of request
/// rank `r` (identity when `None`; point-to-point requests cover two ranks).
pub(crate) fn check(
    comm: &Communicator,
    call: &'static str,
    request: Request,
    inputs: Vec<Option<RawView>>,
    outputs: Vec<Option<RawView>>,
    ranks: Option<&[usize]>,
) -> Result<Checked> {
    let n = request.nranks();
    for (side, got) in [
        ("input buffers", inputs.len()),
        ("output buffers", outputs.len()),
    ] {
        if got != n {
            return Err(CollectivesError::RankCount {
                call,
                side,
                expected: n,
                got,
            });
        }
    }
    let lens = check_request(call, &request)?;
    for r in 0..n {
        let rank = ranks.and_then(|m| m.get(r).copied()).unwrap_or(r);
        for (side, view, needs) in [
            ("input", &inputs[r], lens[r].0),
            ("output", &outputs[r], lens[r].1),
        ] {
            if let Some(v) = view {
                comm.owns(call, rank, side, v)?;
            }
            check_len(call, rank, side, view.as_ref().map(|v| v.len), needs)?;
        }
    }
    let in_place = in_place_mode(call, &request, &inputs, &outputs)?;
    // A v-collective runs its capacity plan with this call's counts bound to it.
    let (request, counts) = match CountLayout::of_request(&request) {
        Some((layout, counts)) => (
            layout.capacity_request(&request),
            Some(Counted {
                layout,
                counts,
                exact: request,
            }),
        ),
        None => (request, None),
    };
    Ok(Checked {
        call,
        request,
        in_place,
        inputs,
        outputs,
        counts,
    })
}

/// The checks of a request on its own, before any rank's buffers: the op for the type, the
/// count matrix's shape, every rank's lengths (no overflow, at most [`MAX_ELEMENTS`]), and
/// the request's own rules. Returns each rank's input and output lengths, in elements.
pub(crate) fn check_request(call: &'static str, request: &Request) -> Result<Vec<(u64, u64)>> {
    let n = request.nranks();
    let coll = request.collective;
    if coll.reduces() && request.op == ReduceOp::Avg && !request.dtype.is_float() {
        return Err(CollectivesError::UnsupportedOp {
            call,
            op: request.op,
            dtype: request.dtype,
        });
    }
    if coll == Collective::AllToAllV {
        let bad = if request.matrix.len() != n {
            Some(("count matrix rows", request.matrix.len()))
        } else {
            let short = request.matrix.iter().find(|row| row.len() != n);
            short.map(|row| ("counts in a count matrix row", row.len()))
        };
        if let Some((side, got)) = bad {
            return Err(CollectivesError::RankCount {
                call,
                side,
                expected: n,
                got,
            });
        }
    }
    let mut lens = Vec::with_capacity(n);
    for r in 0..n as u32 {
        let overflow = |e: RouteError| CollectivesError::Overflow {
            call,
            what: e.to_string(),
        };
        let i = request.input_len(r).map_err(overflow)?;
        let o = request.output_len(r).map_err(overflow)?;
        if i > MAX_ELEMENTS || o > MAX_ELEMENTS {
            return Err(CollectivesError::Overflow {
                call,
                what: format!("rank {r} needs more than {MAX_ELEMENTS} elements"),
            });
        }
        lens.push((i, o));
    }
    request
        .validate()
        .map_err(|source| CollectivesError::Plan { call, source })?;
    Ok(lens)
}

/// Rank `rank`'s `side` buffer holds `got` elements (`None`: it gave none) where the call
/// needs `needs`.
pub(crate) fn check_len(
    call: &'static str,
    rank: usize,
    side: &'static str,
    got: Option<u64>,
    needs: u64,
) -> Result<()> {
    if got.unwrap_or(0) == needs {
        return Ok(());
    }
    Err(CollectivesError::CountMismatch {
        call,
        rank,
        side,
        got: got.unwrap_or(0),
        needs,
    })
}

/// Where rank `r`'s input must start for an in-place call whose output starts at
/// `output_at` (an offset or an address, in bytes): both in the one buffer as the request's
/// in-place layout places them ([`Request::in_place`]). `None` when the rank has no in-place
/// form.
pub(crate) fn in_place_input_at(req: &Request, r: u32, output_at: u64) -> Option<u64> {
    input_start(req.in_place(r)?, req.dtype.size(), output_at)
}

/// [`in_place_input_at`] for a rank's layout `at`, in elements of `esize` bytes.
pub(crate) fn input_start(at: InPlace, esize: u64, output_at: u64) -> Option<u64> {
    // The buffer's start, from where the output lies in it.
    let start = output_at.checked_sub(at.output_at.checked_mul(esize)?)?;
    start.checked_add(at.input_at.checked_mul(esize)?)
}

/// Where rank `r`'s input must sit for an in-place call, given its output
/// ([`in_place_input_at`]).
fn in_place_input(req: &Request, r: u32, output: &ByteRegion) -> Option<ByteRegion> {
    Some(ByteRegion {
        mem: output.mem,
        offset: in_place_input_at(req, r, output.offset)?,
        bytes: req.input_len(r).ok()?.checked_mul(req.dtype.size())?,
    })
}

/// Decide whether the call is in place: every rank whose input and output share memory must
/// have them exactly in the in-place layout, and either all such ranks are in place or none.
fn in_place_mode(
    call: &'static str,
    req: &Request,
    inputs: &[Option<RawView>],
    outputs: &[Option<RawView>],
) -> Result<bool> {
    let (mut inplace, mut apart) = (0usize, 0usize);
    for (r, (i, o)) in inputs.iter().zip(outputs).enumerate() {
        let (Some(i), Some(o)) = (i, o) else { continue };
        if i.region.bytes == 0 || o.region.bytes == 0 {
            continue;
        }
        if !i.region.overlaps(&o.region) {
            apart += 1;
            continue;
        }
        if in_place_input(req, r as u32, &o.region) != Some(i.region) {
            return Err(CollectivesError::Overlap {
                call,
                what: format!(
                    "input and output of rank {r} overlap{}",
                    if req.in_place(r as u32).is_some() {
                        " but are not in the in-place layout"
                    } else {
                        " and the call has no in-place form on this rank"
                    }
                ),
            });
        }
        inplace += 1;
    }
    if inplace > 0 && apart > 0 {
        return Err(CollectivesError::Overlap {
            call,
            what: "some ranks are in place and others not".into(),
        });
    }
    Ok(inplace > 0)
}
