//! The call descriptor: what every rank of a collective call must agree on, made by every
//! surface (the per-rank calls on threads and GPUs, and the MPI processes' typed calls), and
//! the in-process judgement of the ranks' descriptors ([`judge`], the meeting of ranks on
//! threads).
//!
//! Descriptors are compared before any byte moves, so a collective, element type, count, op,
//! root, tag or call order that differs between ranks is the same error on every rank, never
//! a wrong result. MPI processes exchange a descriptor as a fixed number of words and judge
//! those (`mpi/call_agreement.rs`).

use std::fmt::Write as _;

use relaycc_route::{Collective, DType, ReduceOp, Request};

/// What every rank of one collective must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDesc {
    /// The call's name in messages (`all_reduce`).
    pub call: &'static str,
    pub collective: Collective,
    pub dtype: DType,
    pub op: ReduceOp,
    pub root: usize,
    /// Elements per rank (the request's count); unused by the `v` collectives.
    pub count: u64,
    /// all_gather_v and reduce_scatter_v: every rank's count (the same list on every rank).
    /// all_to_all_v: this rank's send counts, per destination.
    pub counts: Vec<u64>,
    /// all_to_all_v: this rank's receive counts, per source.
    pub recv_counts: Vec<u64>,
    /// The caller's tag of this call, 0 for none ([`crate::RankComm::tag_next`]): equal on
    /// every rank, so a rank that skipped a call is caught even where the next call has the
    /// same shape.
    pub tag: u64,
}

impl CallDesc {
    /// A descriptor of `collective` named after it, with no counts, tag 0.
    pub fn new(
        collective: Collective,
        dtype: DType,
        count: u64,
        op: ReduceOp,
        root: usize,
    ) -> Self {
        CallDesc {
            call: collective.name(),
            collective,
            dtype,
            op,
            root,
            count,
            counts: Vec::new(),
            recv_counts: Vec::new(),
            tag: 0,
        }
    }

    /// The call as a rank made it, for messages: `all_gather of f32, count 4` (its name
    /// appears here only).
    pub fn show(&self) -> String {
        let mut s = format!("{} of {}", self.call, self.dtype);
        if self.collective.reduces() {
            let _ = write!(s, ", op {}", self.op);
        }
        if self.collective.rooted() {
            let _ = write!(s, ", root {}", self.root);
        }
        match self.collective {
            // A descriptor MPI ranks decode from words carries no counts (only their hash).
            c if c.counts_per_rank() && self.counts.is_empty() => {}
            c if c.counts_per_rank() => {
                let _ = write!(s, ", counts {:?}", self.counts);
            }
            Collective::AllToAllV => {}
            _ => {
                let _ = write!(s, ", count {}", self.count);
            }
        }
        if self.tag != 0 {
            let _ = write!(s, ", tag {}", self.tag);
        }
        s
    }

    /// The request the ranks agreed on, over `gpus` (request rank r is `gpus[r]`), with
    /// all_to_all_v's `matrix` of every rank's send counts ([`matrix`]; empty for the
    /// others). Not validated: a root past the ranks, say, is [`Request::validate`]'s to
    /// refuse.
    pub(crate) fn request(&self, gpus: Vec<u32>, matrix: Vec<Vec<u64>>) -> Request {
        let mut r = Request::new(self.collective, gpus, self.count, self.dtype)
            .with_op(self.op)
            .with_root(u32::try_from(self.root).unwrap_or(u32::MAX));
        match self.collective {
            c if c.counts_per_rank() => {
                r.count = 0;
                r.counts = self.counts.clone();
            }
            Collective::AllToAllV => {
                r.count = 0;
                r.matrix = matrix;
            }
            _ => {}
        }
        r
    }

    /// The first field in which `other` does not match `self`, if any: the op and root only
    /// where the collective reduces or has a root, the counts of all_gather_v and
    /// reduce_scatter_v, the count of the others but all_to_all_v (whose counts pair up across
    /// ranks instead, [`matrix`]).
    pub(crate) fn first_difference(&self, other: &CallDesc) -> Option<Field> {
        Some(
            if self.collective != other.collective || self.call != other.call {
                Field::Collective
            } else if self.tag != other.tag {
                Field::Tag
            } else if self.dtype != other.dtype {
                Field::ElementType
            } else if self.collective.reduces() && self.op != other.op {
                Field::Op
            } else if self.collective.rooted() && self.root != other.root {
                Field::Root
            } else if self.collective.counts_per_rank() && self.counts != other.counts {
                Field::Counts
            } else if !self.collective.counts_per_rank()
                && self.collective != Collective::AllToAllV
                && self.count != other.count
            {
                Field::Count
            } else {
                return None;
            },
        )
    }

    /// `other` is a call of this one's shape: every field but the tag is equal (a plan, and
    /// a rank's checks of its buffers' lengths, depend on these fields only).
    pub(crate) fn same_shape(&self, other: &CallDesc) -> bool {
        // Destructured whole, so a new field is a decision here, not a silent omission.
        let CallDesc {
            call,
            collective,
            dtype,
            op,
            root,
            count,
            counts,
            recv_counts,
            tag: _,
        } = self;
        *call == other.call
            && *collective == other.collective
            && *dtype == other.dtype
            && *op == other.op
            && *root == other.root
            && *count == other.count
            && *counts == other.counts
            && *recv_counts == other.recv_counts
    }

    /// [`fnv62`] of the counts' little-endian bytes, send counts then receive counts: what
    /// words that cannot hold the counts carry of them.
    pub(crate) fn counts_hash(&self) -> i64 {
        fnv62(
            self.counts
                .iter()
                .chain(&self.recv_counts)
                .flat_map(|w| w.to_le_bytes()),
        )
    }

    /// Why `other` (of rank `b`) does not match `self` (of rank `a`), if it does not.
    pub fn differs(&self, a: usize, other: &CallDesc, b: usize) -> Option<String> {
        let field = self.first_difference(other)?;
        Some(format!(
            "{} differs: rank {a} calls {}, rank {b} calls {}",
            field.name(),
            self.show(),
            other.show()
        ))
    }
}

/// The one hash of what ranks compare as words (MPI's agreement words, a flag transport's
/// call records): a 62-bit FNV-1a hash of `bytes`, the same on every rank for the same bytes,
/// and non-negative, so it negates and compares as `i64`.
pub(crate) fn fnv62(bytes: impl IntoIterator<Item = u8>) -> i64 {
    let h = bytes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (h >> 2) as i64
}

/// A field of a call descriptor that ranks can disagree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Collective,
    Tag,
    ElementType,
    Op,
    Root,
    Counts,
    Count,
}

impl Field {
    /// The field in messages (`the element type`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Field::Collective => "the collective",
            Field::Tag => "the tag",
            Field::ElementType => "the element type",
            Field::Op => "the op",
            Field::Root => "the root",
            Field::Counts => "the counts",
            Field::Count => "the count",
        }
    }
}

/// One rank's part in a judgement: its rank and its descriptors in call order (a group has
/// several), or `None` when its own argument checks failed (the others then fail too).
pub(crate) type RankDescs<'a> = (usize, Option<Vec<&'a CallDesc>>);

/// Why the ranks of one call cannot run it, the same message on every rank: a rank whose own
/// checks failed, descriptors that differ (the first difference, between the first rank and
/// another), a group of another length, or all_to_all_v counts that do not pair up.
pub(crate) fn judge(rows: &[RankDescs<'_>]) -> Result<(), String> {
    if let Some((r, _)) = rows.iter().find(|(_, d)| d.is_none()) {
        return Err(format!(
            "rank {r} failed its own checks of the call's arguments"
        ));
    }
    let Some((first, Some(d0))) = rows.first() else {
        return Ok(());
    };
    let first = *first;
    for (r, d) in &rows[1..] {
        let (r, d) = (*r, d.as_deref().unwrap_or(&[]));
        for (k, (x, y)) in d0.iter().zip(d).enumerate() {
            if let Some(why) = x.differs(first, y, r) {
                let at = if d0.len() > 1 || d.len() > 1 {
                    format!(" (operation {k} of the group)")
                } else {
                    String::new()
                };
                return Err(format!("{why}{at}"));
            }
        }
        if d0.len() != d.len() {
            let names = |d: &[&CallDesc]| {
                let v: Vec<&str> = d.iter().map(|d| d.call).collect();
                if v.is_empty() {
                    "none".to_string()
                } else {
                    v.join(", ")
                }
            };
            return Err(format!(
                "rank {first} issues {} collectives ({}), rank {r} issues {} ({})",
                d0.len(),
                names(d0),
                d.len(),
                names(d)
            ));
        }
    }
    for (k, d) in d0.iter().enumerate() {
        if d.collective == Collective::AllToAllV {
            let of_k: Vec<RankDesc<'_>> = rows
                .iter()
                .map(|(r, d)| (*r, d.as_ref().and_then(|d| d.get(k)).copied()))
                .collect();
            matrix(&of_k)?;
        }
    }
    Ok(())
}

/// One rank's descriptor of one operation: its rank, and the descriptor (`None` where its
/// own checks failed).
pub(crate) type RankDesc<'a> = (usize, Option<&'a CallDesc>);

/// The all_to_all_v matrix of one operation from every rank's send counts (`matrix[s][d]`),
/// checked against every rank's receive counts.
pub(crate) fn matrix(rows: &[RankDesc<'_>]) -> Result<Vec<Vec<u64>>, String> {
    let m: Vec<Vec<u64>> = rows
        .iter()
        .map(|r| r.1.map(|d| d.counts.clone()).unwrap_or_default())
        .collect();
    for row in rows {
        let Some(d) = row.1 else { continue };
        let col: Vec<u64> = m
            .iter()
            .map(|s| s.get(row.0).copied().unwrap_or(0))
            .collect();
        if d.recv_counts != col {
            return Err(format!(
                "the counts differ: rank {} expects to receive {:?}, the ranks send it {:?}",
                row.0, d.recv_counts, col
            ));
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: Collective, count: u64) -> CallDesc {
        CallDesc::new(c, DType::F32, count, ReduceOp::Sum, 0)
    }

    #[test]
    fn the_first_difference_is_named_once() {
        let (x, y) = (d(Collective::AllGather, 4), d(Collective::AllGather, 5));
        let (a, b) = (Some(vec![&x]), Some(vec![&y]));
        let e = judge(&[(0, a.clone()), (1, a.clone()), (2, b)]).expect_err("differs");
        assert_eq!(
            e,
            "the count differs: rank 0 calls all_gather of f32, count 4, rank 2 calls all_gather of f32, count 5"
        );
        assert_eq!(e.matches("all_gather").count(), 2);
        let mut t = x.clone();
        t.tag = 9;
        let tagged = judge(&[(0, a.clone()), (1, Some(vec![&t]))]).expect_err("tag");
        assert!(tagged.starts_with("the tag"));
        let own = judge(&[(0, a.clone()), (1, None)]).expect_err("own");
        assert!(own.contains("rank 1"));
        let group = judge(&[(0, a.clone()), (1, Some(Vec::new()))]).expect_err("group");
        assert!(group.contains("issues 1"));
        assert_eq!(judge(&[(0, a.clone()), (1, a)]), Ok(()));
    }

    #[test]
    fn all_to_all_v_counts_must_pair_up() {
        let mk = |send: Vec<u64>, recv: Vec<u64>| {
            let mut x = d(Collective::AllToAllV, 0);
            x.counts = send;
            x.recv_counts = recv;
            x
        };
        let (a, b) = (mk(vec![1, 2], vec![1, 3]), mk(vec![3, 4], vec![2, 4]));
        let rows = [(0, Some(vec![&a])), (1, Some(vec![&b]))];
        assert_eq!(judge(&rows), Ok(()));
        assert_eq!(
            matrix(&[(0, Some(&a)), (1, Some(&b))]),
            Ok(vec![vec![1, 2], vec![3, 4]])
        );
        let bad = mk(vec![3, 4], vec![9, 4]);
        assert!(judge(&[(0, Some(vec![&a])), (1, Some(vec![&bad]))]).is_err());
    }
}
