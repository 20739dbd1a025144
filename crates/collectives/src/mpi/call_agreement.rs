//! The agreement of a typed collective call (step 2 of [`super::typed`]'s module docs): this
//! rank's call descriptor ([`CallDesc`]) as a fixed number of words (its per-rank counts
//! hashed into one, so the all-gather stays the same size at any rank count), all-gathered
//! within the timeout and judged alike on every rank, so a mismatch is the same error
//! everywhere and the agreed words key the plan cache.

use relaycc_route::{Collective, DType, ReduceOp};

use super::agree::{self, AgreementCollective};
use super::roll_call::WaitPoint;
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::call::{CallDesc, Field};

/// The step name of the agreement, in errors.
pub(super) const AGREE: &str = "agree on a collective call";

/// Words of one rank's call descriptor.
pub(super) const WORDS: usize = 11;
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
/// The caller's tag: the plan's key is the words from `COLL` up to it.
const TAG: usize = 9;
/// The largest of this rank's per-rank counts (a v-collective's capacity is the largest
/// over the ranks), after the key: counts that differ from call to call leave it unchanged.
pub(super) const LARGEST: usize = 10;

/// Communicators of at most this many ranks carry all_to_all_v's send and receive counts in
/// every descriptor, so a call's count matrix needs no second all-gather: `2 x ranks` more
/// words per rank and call (at most 32), where a count matrix that changes every call would
/// otherwise cost one more round trip per call.
pub(super) const INLINE_COUNTS_MAX_RANKS: usize = 16;

/// Words of one rank's agreed descriptor on a communicator of `ranks`: [`WORDS`], then, up to
/// [`INLINE_COUNTS_MAX_RANKS`], its all_to_all_v send counts and receive counts.
pub(super) fn row_words(ranks: usize) -> usize {
    if ranks <= INLINE_COUNTS_MAX_RANKS {
        WORDS + 2 * ranks
    } else {
        WORDS
    }
}

impl MpiCommunicator {
    /// Step 2 of the module docs for a call whose local checks gave `local`: every rank's
    /// descriptor all-gathered and judged alike. Returns the cache key (the descriptors
    /// without flags and sequence numbers) and the gathered descriptors.
    pub(super) fn agreed(
        &self,
        call: &mut CallDesc,
        local: MpiResult<()>,
        seq: u64,
    ) -> MpiResult<(Vec<i64>, Vec<i64>)> {
        if local.is_err() {
            call.counts.clear();
            call.recv_counts.clear();
        }
        let n = self.size as usize;
        let mut words = descriptor(call, seq, local.is_err()).to_vec();
        if row_words(n) > WORDS {
            // all_to_all_v's counts inline (zeros for the other collectives): the matrix
            // then comes with the agreement, in its one round trip.
            let a2av = call.collective == Collective::AllToAllV;
            for list in [&call.counts, &call.recv_counts] {
                words.extend((0..n).map(|i| match list.get(i) {
                    Some(c) if a2av => i64::try_from(*c).unwrap_or(i64::MAX),
                    _ => 0,
                }));
            }
        }
        let at = WaitPoint::call(AGREE, call.collective, seq);
        let all = agree::collective(self, at, AgreementCollective::AllGather, words)?;
        let key = verdict(&all, row_words(n), local)?;
        Ok((key, all))
    }
}

/// [`agree::fnv62`] of words' little-endian bytes, as [`CallDesc::counts_hash`] hashes a
/// call's counts.
fn hash<'a>(words: impl IntoIterator<Item = &'a u64>) -> i64 {
    agree::fnv62(words.into_iter().flat_map(|w| w.to_le_bytes()))
}

/// This rank's descriptor words: the op and root as -1 where the collective has none, the
/// counts (all_gather_v, reduce_scatter_v: every rank's; all_to_all_v: this rank's send
/// counts, then its
/// receive counts) as their hash and their largest.
fn descriptor(call: &CallDesc, seq: u64, failed: bool) -> [i64; WORDS] {
    let mut d = [0i64; WORDS];
    d[FAILED] = i64::from(failed);
    d[SEQ] = seq as i64;
    d[COLL] = call.collective as i64;
    d[DTYPE] = call.dtype as i64;
    d[ESIZE] = call.dtype.size() as i64;
    d[OP] = if call.collective.reduces() {
        call.op as i64
    } else {
        -1
    };
    d[ROOT] = if call.collective.rooted() {
        call.root as i64
    } else {
        -1
    };
    d[COUNT] = call.count as i64;
    d[VHASH] = call.counts_hash();
    d[TAG] = call.tag as i64;
    d[LARGEST] = call
        .counts
        .iter()
        .chain(&call.recv_counts)
        .copied()
        .max()
        .map_or(0, |c| i64::try_from(c).unwrap_or(i64::MAX));
    d
}

/// Rank `r`'s descriptor from its words: the op and root that the words leave out (-1) as
/// [`CallDesc::new`] sets them, and no counts (the words hold their hash only, which
/// [`verdict`] checks). A collective or element type this build does not know (another build
/// of the library) is a mismatch.
fn decode(row: &[i64], r: usize) -> MpiResult<CallDesc> {
    let collective = Collective::ALL
        .into_iter()
        .find(|c| *c as i64 == row[COLL])
        .ok_or_else(|| {
            MpiError::CallMismatch(format!(
                "rank {r} calls collective code {}, which this build does not know",
                row[COLL]
            ))
        })?;
    let dtype = DType::ALL
        .into_iter()
        .find(|d| *d as i64 == row[DTYPE] && d.size() as i64 == row[ESIZE])
        .ok_or_else(|| {
            MpiError::ElementMismatch(format!(
                "rank {r} passes {}-byte elements of type code {}, which this build does not \
                 know ({}, call #{} of this communicator)",
                row[ESIZE],
                row[DTYPE],
                collective.name(),
                row[SEQ]
            ))
        })?;
    let op = ReduceOp::ALL
        .into_iter()
        .find(|o| *o as i64 == row[OP])
        .unwrap_or(ReduceOp::Sum);
    let root = usize::try_from(row[ROOT]).unwrap_or(0);
    let mut d = CallDesc::new(collective, dtype, row[COUNT] as u64, op, root);
    d.tag = row[TAG] as u64;
    Ok(d)
}

/// The verdict on every rank's descriptor, the same on every rank: this rank's local error,
/// [`MpiError::Peer`] for another rank's, calls at different positions of the communicator's
/// sequence, the first field that differs between rank 0 and another rank (as the
/// in-process judgement names it, [`CallDesc::differs`]), or all_gather_v or reduce_scatter_v
/// counts that are not the ranks' own; `row`: words per rank. Returns the cache key: the descriptors without the failure flag
/// and sequence numbers.
fn verdict(all: &[i64], row: usize, local: MpiResult<()>) -> MpiResult<Vec<i64>> {
    let rows: Vec<&[i64]> = all.chunks(row.max(WORDS)).collect();
    local?;
    if let Some(r) = rows.iter().position(|d| d[FAILED] != 0) {
        return Err(MpiError::Peer {
            rank: r as u32,
            step: "pass its local checks of a collective call",
        });
    }
    let first = rows.first().copied().unwrap_or(&[0; WORDS]);
    if let Some(r) = rows.iter().position(|d| d[SEQ] != first[SEQ]) {
        return Err(MpiError::CallMismatch(format!(
            "rank {r} is at collective call #{} of this communicator, rank 0 at #{}: ranks \
             call collectives in different orders",
            rows[r][SEQ], first[SEQ]
        )));
    }
    let descs = rows
        .iter()
        .enumerate()
        .map(|(r, row)| decode(row, r))
        .collect::<MpiResult<Vec<CallDesc>>>()?;
    let seq = first[SEQ];
    let Some(d0) = descs.first() else {
        return Ok(Vec::new());
    };
    for (r, d) in descs.iter().enumerate().skip(1) {
        let Some(field) = d0.first_difference(d) else {
            continue;
        };
        let why = d0.differs(0, d, r).unwrap_or_default();
        let message = format!("{why} (call #{seq} of this communicator)");
        return Err(match field {
            Field::ElementType => MpiError::ElementMismatch(message),
            Field::Counts | Field::Count => MpiError::CountMismatch(message),
            Field::Collective | Field::Tag | Field::Op | Field::Root => {
                MpiError::CallMismatch(message)
            }
        });
    }
    if d0.collective.counts_per_rank() {
        let contributions: Vec<u64> = rows.iter().map(|d| d[COUNT] as u64).collect();
        let want = hash(&contributions);
        if let Some(r) = rows.iter().position(|d| d[VHASH] != want) {
            return Err(MpiError::CountMismatch(format!(
                "rank {r} passes counts that are not the ranks' own counts {contributions:?} \
                 ({}, call #{seq} of this communicator)",
                d0.collective
            )));
        }
    }
    Ok(rows
        .iter()
        .flat_map(|d| d[COLL..TAG].iter().copied())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank's words for `descs` (rank r's at its position), all at call #3.
    fn gathered(descs: &[CallDesc]) -> Vec<i64> {
        descs.iter().flat_map(|d| descriptor(d, 3, false)).collect()
    }

    fn all_reduce(count: u64) -> CallDesc {
        CallDesc::new(Collective::AllReduce, DType::F32, count, ReduceOp::Sum, 0)
    }

    #[test]
    fn the_first_difference_is_named_with_the_call_once() {
        let same = [all_reduce(4), all_reduce(4), all_reduce(4)];
        let key = verdict(&gathered(&same), WORDS, Ok(())).expect("agreed");
        assert_eq!(key.len(), 3 * (TAG - COLL));
        let mut other = same.clone();
        other[2] = all_reduce(5);
        match verdict(&gathered(&other), WORDS, Ok(())) {
            Err(MpiError::CountMismatch(m)) => {
                assert_eq!(
                    m,
                    "the count differs: rank 0 calls all_reduce of f32, op sum, count 4, rank 2 \
                     calls all_reduce of f32, op sum, count 5 (call #3 of this communicator)"
                );
            }
            e => panic!("expected a count mismatch, got {e:?}"),
        }
        let mut wider = same.clone();
        wider[1].dtype = DType::F64;
        assert!(matches!(
            verdict(&gathered(&wider), WORDS, Ok(())),
            Err(MpiError::ElementMismatch(_))
        ));
        let mut tagged = same.clone();
        tagged[1].tag = 9;
        assert!(matches!(
            verdict(&gathered(&tagged), WORDS, Ok(())),
            Err(MpiError::CallMismatch(m)) if m.starts_with("the tag differs")
        ));
        let mut later = gathered(&same);
        later[WORDS + SEQ] = 4;
        assert!(matches!(
            verdict(&later, WORDS, Ok(())),
            Err(MpiError::CallMismatch(m)) if m.contains("different orders")
        ));
    }

    #[test]
    fn fields_a_collective_has_not_are_not_compared() {
        // A broadcast's op and an all_reduce's root mean nothing: both are -1 on the wire.
        let mut b = CallDesc::new(Collective::Broadcast, DType::I32, 8, ReduceOp::Sum, 1);
        let mut b2 = b.clone();
        b2.op = ReduceOp::Max;
        assert!(verdict(&gathered(&[b.clone(), b2]), WORDS, Ok(())).is_ok());
        b.root = 0;
        assert!(matches!(
            verdict(&gathered(&[b.clone(), b.clone(), CallDesc { root: 2, ..b }]), WORDS, Ok(())),
            Err(MpiError::CallMismatch(m)) if m.starts_with("the root differs")
        ));
    }

    #[test]
    fn all_gather_v_counts_are_checked_against_the_contributions() {
        let v = |mine: u64, counts: Vec<u64>| {
            let mut d = CallDesc::new(Collective::AllGatherV, DType::F32, mine, ReduceOp::Sum, 0);
            d.counts = counts;
            d
        };
        let ok = [v(1, vec![1, 2]), v(2, vec![1, 2])];
        assert!(verdict(&gathered(&ok), WORDS, Ok(())).is_ok());
        let bad = [v(1, vec![1, 2]), v(2, vec![1, 3])];
        assert!(matches!(
            verdict(&gathered(&bad), WORDS, Ok(())),
            Err(MpiError::CountMismatch(m)) if m.starts_with("rank 1 passes counts")
        ));
        let failed: Vec<i64> = ok
            .iter()
            .enumerate()
            .flat_map(|(r, d)| descriptor(d, 0, r == 1))
            .collect();
        assert!(matches!(
            verdict(&failed, WORDS, Ok(())),
            Err(MpiError::Peer { rank: 1, .. })
        ));
    }
}
