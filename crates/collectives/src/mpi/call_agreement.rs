//! The agreement of a typed collective call (step 2 of [`super::typed`]'s module docs): this
//! rank's call as descriptor words, all-gathered within the timeout and judged alike on every
//! rank, so a mismatch is the same error everywhere and the agreed words key the plan cache.

use relaycc_route::{Collective, ReduceOp};

use super::agree::{self, AgreementCollective};
use super::roll_call::WaitPoint;
use super::typed_call::TypedCall;
use super::{MpiCommunicator, MpiError, MpiResult};

/// The step name of the agreement, in errors.
pub(super) const AGREE: &str = "agree on a collective call";

/// Words of one rank's call descriptor.
pub(super) const WORDS: usize = 10;
/// Positions in the descriptor.
const FAILED: usize = 0;
pub(super) const SEQ: usize = 1;
const COLL: usize = 2;
const DTYPE: usize = 3;
const ESIZE: usize = 4;
const OP: usize = 5;
const ROOT: usize = 6;
pub(super) const COUNT: usize = 7;
const VHASH: usize = 8;
/// The caller's tag, last: the plan's key is the words from `COLL` up to it.
const TAG: usize = 9;

/// [`agree::fnv62`] of words' little-endian bytes: a call's per-rank counts in one word.
fn hash(words: &[u64]) -> i64 {
    agree::fnv62(words.iter().flat_map(|w| w.to_le_bytes()))
}

impl MpiCommunicator {
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
