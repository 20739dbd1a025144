//! The call descriptor: what every rank of a collective call must agree on, and the one
//! judgement of the ranks' descriptors, shared by every rendezvous (the in-process meeting of
//! ranks on threads, the agreement of MPI processes).
//!
//! Descriptors are compared before any byte moves, so a collective, element type, count, op,
//! root, tag or call order that differs between ranks is the same error on every rank, never
//! a wrong result. A descriptor travels between processes as words ([`CallDesc::to_words`]):
//! a fixed header and, for the `v` collectives, the rank's counts.

use std::fmt::Write as _;

use relaycc_route::{Collective, DType, ReduceOp};

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
    /// all_gather_v: every rank's count (the same list on every rank). all_to_all_v: this
    /// rank's send counts, per destination.
    pub counts: Vec<u64>,
    /// all_to_all_v: this rank's receive counts, per source.
    pub recv_counts: Vec<u64>,
    /// The caller's tag of this call, 0 for none ([`crate::RankComm::tag_next`]): equal on
    /// every rank, so a rank that skipped a call is caught even where the next call has the
    /// same shape.
    pub tag: u64,
}

/// Words of a descriptor's fixed header.
#[cfg(any(feature = "mpi", test))]
pub(crate) const HEADER_WORDS: usize = 8;

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
            Collective::AllGatherV => {
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

    /// Why `other` (of rank `b`) does not match `self` (of rank `a`), if it does not.
    pub fn differs(&self, a: usize, other: &CallDesc, b: usize) -> Option<String> {
        let field = if self.collective != other.collective || self.call != other.call {
            "the collective"
        } else if self.tag != other.tag {
            "the tag"
        } else if self.dtype != other.dtype {
            "the element type"
        } else if self.collective.reduces() && self.op != other.op {
            "the op"
        } else if self.collective.rooted() && self.root != other.root {
            "the root"
        } else if self.collective == Collective::AllGatherV && self.counts != other.counts {
            "the counts"
        } else if !matches!(
            self.collective,
            Collective::AllGatherV | Collective::AllToAllV
        ) && self.count != other.count
        {
            "the count"
        } else {
            return None;
        };
        Some(format!(
            "{field} differs: rank {a} calls {}, rank {b} calls {}",
            self.show(),
            other.show()
        ))
    }

    #[cfg(any(feature = "mpi", test))]
    /// This descriptor as `HEADER_WORDS + 2 n` words for `n` ranks (unsigned values as their
    /// bit patterns), appended to `out`: the header, then the `v` collectives' counts (zero
    /// elsewhere).
    pub fn to_words(&self, n: usize, out: &mut Vec<i64>) {
        out.extend([
            self.collective as i64,
            self.dtype as i64,
            self.dtype.size() as i64,
            self.op as i64,
            self.root as i64,
            self.count as i64,
            self.tag as i64,
            self.counts.len() as i64,
        ]);
        let mut counts: Vec<i64> = self
            .counts
            .iter()
            .chain(&self.recv_counts)
            .map(|c| *c as i64)
            .collect();
        counts.resize(2 * n, 0);
        out.extend(counts);
    }

    #[cfg(any(feature = "mpi", test))]
    /// The descriptor `words` ([`CallDesc::to_words`] for `n` ranks) encode, or why they do
    /// not encode one.
    pub fn from_words(words: &[i64], n: usize) -> Result<CallDesc, String> {
        if words.len() != HEADER_WORDS + 2 * n {
            return Err(format!(
                "a descriptor of {} words for {n} ranks",
                words.len()
            ));
        }
        let collective = Collective::ALL
            .into_iter()
            .find(|c| *c as i64 == words[0])
            .ok_or_else(|| format!("collective code {}", words[0]))?;
        let dtype = DType::ALL
            .into_iter()
            .find(|d| *d as i64 == words[1] && d.size() as i64 == words[2])
            .ok_or_else(|| format!("element type code {} of {} bytes", words[1], words[2]))?;
        let op = ReduceOp::ALL
            .into_iter()
            .find(|o| *o as i64 == words[3])
            .ok_or_else(|| format!("op code {}", words[3]))?;
        let sent = usize::try_from(words[7])
            .ok()
            .filter(|k| *k <= n)
            .ok_or("a count list")?;
        let counts: Vec<u64> = words[HEADER_WORDS..HEADER_WORDS + sent]
            .iter()
            .map(|c| *c as u64)
            .collect();
        let recv_counts = if collective == Collective::AllToAllV {
            words[HEADER_WORDS + n..]
                .iter()
                .map(|c| *c as u64)
                .collect()
        } else {
            Vec::new()
        };
        Ok(CallDesc {
            call: collective.name(),
            collective,
            dtype,
            op,
            root: words[4] as usize,
            count: words[5] as u64,
            counts,
            recv_counts,
            tag: words[6] as u64,
        })
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
            matrix(rows, k)?;
        }
    }
    Ok(())
}

/// The all_to_all_v matrix of operation `k` from every rank's send counts (`matrix[s][d]`),
/// checked against every rank's receive counts.
pub(crate) fn matrix<'a>(rows: &[RankDescs<'a>], k: usize) -> Result<Vec<Vec<u64>>, String> {
    let desc = |r: &RankDescs<'a>| -> Option<&'a CallDesc> {
        r.1.as_ref().and_then(|d| d.get(k)).copied()
    };
    let m: Vec<Vec<u64>> = rows
        .iter()
        .map(|r| desc(r).map(|d| d.counts.clone()).unwrap_or_default())
        .collect();
    for row in rows {
        let Some(d) = desc(row) else { continue };
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
    fn descriptors_survive_their_words() {
        let mut v = d(Collective::AllToAllV, 0);
        v.counts = vec![1, 2, 3];
        v.recv_counts = vec![4, 5, 6];
        v.tag = 77;
        let mut g = d(Collective::AllGatherV, 0);
        g.counts = vec![7, 8, 9];
        for x in [
            v,
            g,
            d(Collective::Reduce, 12),
            d(Collective::AllReduce, 1 << 40),
        ] {
            let mut w = Vec::new();
            x.to_words(3, &mut w);
            assert_eq!(CallDesc::from_words(&w, 3), Ok(x));
        }
        assert!(CallDesc::from_words(&[0; 3], 3).is_err());
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
        assert_eq!(matrix(&rows, 0), Ok(vec![vec![1, 2], vec![3, 4]]));
        let bad = mk(vec![3, 4], vec![9, 4]);
        assert!(judge(&[(0, Some(vec![&a])), (1, Some(vec![&bad]))]).is_err());
    }
}
