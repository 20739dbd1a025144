//! Requests: which collective, over which GPUs, of what size, and the buffer layouts that define
//! what a correct plan must deliver.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::dtype::{DType, ReduceOp};
use crate::error::{Result, RouteError};

/// A collective operation (NCCL's and MPI's set, plus the `v` variants NCCL lacks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// Point-to-point transfers paired in one group (`transfers`).
    SendRecv,
    /// The root's input to every rank's output.
    Broadcast,
    /// The reduction of every rank's input to the root's output.
    Reduce,
    /// The reduction of every rank's input to every rank's output.
    AllReduce,
    /// Every rank's `count` elements, concatenated in rank order, to every rank.
    AllGather,
    /// Every rank's `counts[r]` elements, concatenated in rank order, to every rank.
    AllGatherV,
    /// Block r (of `count` elements) of the reduction to rank r.
    ReduceScatter,
    /// Block r (of `counts[r]` elements, blocks in rank order) of the reduction to rank r.
    ReduceScatterV,
    /// Block d of rank s's input to block s of rank d's output (`count` per block).
    AllToAll,
    /// As all_to_all, with `matrix[s][d]` elements from s to d.
    AllToAllV,
    /// Every rank's input, concatenated in rank order, to the root.
    Gather,
    /// Block r of the root's input to rank r.
    Scatter,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 12] = [
        Collective::SendRecv,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllReduce,
        Collective::AllGather,
        Collective::AllGatherV,
        Collective::ReduceScatter,
        Collective::ReduceScatterV,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::Gather,
        Collective::Scatter,
    ];
    /// The snake_case name (`all_reduce`).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::SendRecv => "send_recv",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::AllGatherV => "all_gather_v",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::ReduceScatterV => "reduce_scatter_v",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_all_v",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
        }
    }
    /// True when the collective combines values with a reduce op.
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Collective::Reduce
                | Collective::AllReduce
                | Collective::ReduceScatter
                | Collective::ReduceScatterV
        )
    }
    /// True when every rank's call gives the list of every rank's count
    /// ([`Request::counts`]: all_gather_v, reduce_scatter_v).
    pub const fn counts_per_rank(self) -> bool {
        matches!(self, Collective::AllGatherV | Collective::ReduceScatterV)
    }
    /// True when a root rank matters.
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }
    /// nccl-tests' bus-bandwidth factor for `n` ranks: all_reduce 2(n-1)/n; reduce_scatter,
    /// all_gather, all_to_all (n-1)/n; the rest 1.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather
            | Collective::AllGatherV
            | Collective::ReduceScatter
            | Collective::ReduceScatterV
            | Collective::AllToAll
            | Collective::AllToAllV => (n - 1.0) / n,
            _ => 1.0,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let norm = s.replace('-', "_").to_ascii_lowercase();
        let norm = match norm.as_str() {
            "allreduce" => "all_reduce".to_string(),
            "allgather" => "all_gather".to_string(),
            "allgatherv" => "all_gather_v".to_string(),
            "reducescatter" => "reduce_scatter".to_string(),
            "reducescatterv" => "reduce_scatter_v".to_string(),
            "alltoall" => "all_to_all".to_string(),
            "alltoallv" => "all_to_all_v".to_string(),
            "sendrecv" => "send_recv".to_string(),
            other => other.to_string(),
        };
        Collective::ALL
            .iter()
            .copied()
            .find(|c| c.name() == norm)
            .ok_or_else(|| {
                let names: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
                format!("unknown collective {s:?} (known: {})", names.join(", "))
            })
    }
}

/// One point-to-point transfer of a `SendRecv` request, between rank positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Transfer {
    /// Sending rank.
    pub src: u32,
    /// Receiving rank.
    pub dst: u32,
    /// Elements moved.
    pub count: u64,
}

/// What the caller asks for. Counts are in elements of `dtype`.
///
/// Buffer layouts (element offsets) follow NCCL and MPI:
/// - broadcast: root input `[0, count)` -> every output `[0, count)`;
/// - reduce / all_reduce: inputs `[0, count)` reduced into the root's / every output;
/// - all_gather: input `[0, count)` of rank k -> every output `[k*count, (k+1)*count)`;
/// - all_gather_v: input `[0, counts[k])` of rank k -> every output at `sum(counts[..k])`;
/// - reduce_scatter: inputs `[r*count, (r+1)*count)` reduced into rank r's output `[0, count)`;
/// - reduce_scatter_v: inputs `[sum(counts[..r]), sum(counts[..=r]))` reduced into rank r's
///   output `[0, counts[r])`;
/// - all_to_all: input block d of rank s -> output block s of rank d (`count` per block);
/// - all_to_all_v: `matrix[s][d]` elements; rank s sends its blocks in order of d, rank d
///   receives its blocks in order of s;
/// - gather: input of rank k -> root output `[k*count, (k+1)*count)`;
/// - scatter: root input `[r*count, (r+1)*count)` -> rank r output `[0, count)`;
/// - send_recv: each rank's input is its sends, each rank's output its receives, both
///   concatenated in the order `transfers` lists them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Request {
    /// The collective.
    pub collective: Collective,
    /// The GPUs taking part, in rank order (rank r runs on GPU `gpus[r]`).
    pub gpus: Vec<u32>,
    /// Elements per rank (per block for all_to_all, reduce_scatter, gather, scatter).
    pub count: u64,
    /// Per-rank counts for all_gather_v and reduce_scatter_v.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counts: Vec<u64>,
    /// Per-pair counts for all_to_all_v: `matrix[src][dst]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matrix: Vec<Vec<u64>>,
    /// Transfers of a send_recv request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<Transfer>,
    /// Element type.
    pub dtype: DType,
    /// Reduce op (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Root rank for rooted collectives.
    pub root: u32,
}

/// Largest element count accepted in one buffer: keeps byte sizes within u64 for every type
/// and offsets exact in the f64 arithmetic of the simulator (2^50 elements, 8 PiB of u64).
pub const MAX_ELEMENTS: u64 = 1 << 50;

/// Where a rank's input and output lie in its one buffer when a call runs in place
/// ([`Request::in_place`]), in elements from the buffer's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InPlace {
    /// The input's first element.
    pub input_at: u64,
    /// The output's first element.
    pub output_at: u64,
}

impl Request {
    /// A collective of `count` elements per rank over `gpus`.
    pub fn new(collective: Collective, gpus: Vec<u32>, count: u64, dtype: DType) -> Self {
        Request {
            collective,
            gpus,
            count,
            counts: Vec::new(),
            matrix: Vec::new(),
            transfers: Vec::new(),
            dtype,
            op: ReduceOp::Sum,
            root: 0,
        }
    }
    /// A point-to-point copy of `bytes` bytes from GPU `from` to GPU `to`.
    pub fn point_to_point(from: u32, to: u32, bytes: u64) -> Self {
        let mut r = Request::new(Collective::SendRecv, vec![from, to], bytes, DType::U8);
        r.transfers = vec![Transfer {
            src: 0,
            dst: 1,
            count: bytes,
        }];
        r
    }
    /// With reduce op `op`.
    pub fn with_op(mut self, op: ReduceOp) -> Self {
        self.op = op;
        self
    }
    /// With root rank `root`.
    pub fn with_root(mut self, root: u32) -> Self {
        self.root = root;
        self
    }
    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.gpus.len()
    }

    /// Check the request is well formed: ranks exist and are distinct, root and per-rank
    /// counts fit, Avg only on floating types, sizes within [`MAX_ELEMENTS`].
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(RouteError::BadRequest(m));
        let n = self.gpus.len();
        if n == 0 {
            return bad("no GPUs given".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &self.gpus {
            if !seen.insert(*g) {
                return bad(format!("GPU {g} is listed twice"));
            }
        }
        if self.collective.rooted() && self.root as usize >= n {
            return bad(format!("root {} is not a rank (0..{n})", self.root));
        }
        if self.collective.reduces() && self.op == ReduceOp::Avg && !self.dtype.is_float() {
            return bad(format!(
                "avg is defined for floating types, not {}",
                self.dtype
            ));
        }
        match self.collective {
            Collective::AllGatherV | Collective::ReduceScatterV if self.counts.len() != n => {
                return bad(format!(
                    "{} needs {n} counts, got {}",
                    self.collective,
                    self.counts.len()
                ));
            }
            Collective::AllToAllV
                if self.matrix.len() != n || self.matrix.iter().any(|row| row.len() != n) =>
            {
                return bad(format!("all_to_all_v needs a {n}x{n} count matrix"));
            }
            Collective::SendRecv => {
                for t in &self.transfers {
                    if t.src as usize >= n || t.dst as usize >= n {
                        return bad(format!(
                            "transfer {} -> {} names a rank outside 0..{n}",
                            t.src, t.dst
                        ));
                    }
                }
            }
            _ => {}
        }
        for r in 0..n as u32 {
            let (i, o) = (self.input_len(r)?, self.output_len(r)?);
            if i > MAX_ELEMENTS || o > MAX_ELEMENTS {
                return bad(format!("rank {r} buffers exceed {MAX_ELEMENTS} elements"));
            }
        }
        Ok(())
    }

    fn checked(&self, what: &str, v: Option<u64>) -> Result<u64> {
        v.ok_or_else(|| RouteError::BadRequest(format!("{what} overflows")))
    }

    /// The sum of `counts`, an error naming `what` where it overflows.
    fn counts_total(&self, what: &str) -> Result<u64> {
        self.checked(
            what,
            self.counts.iter().try_fold(0u64, |a, b| a.checked_add(*b)),
        )
    }

    /// Where rank `r`'s input and output lie in its one buffer when the call runs in place;
    /// `None` where the rank has no in-place form (its input and output are buffers of their
    /// own), or where the offset overflows. The one home of the in-place layout: the
    /// builder's and the checker's memories and the front door's overlap checks read it.
    pub fn in_place(&self, r: u32) -> Option<InPlace> {
        let block = || self.count.checked_mul(u64::from(r));
        let before = || {
            let counts = self.counts.get(..r as usize)?;
            counts.iter().try_fold(0u64, |a, c| a.checked_add(*c))
        };
        let root = r == self.root;
        let (input_at, output_at) = match self.collective {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (0, 0),
            // The input is the rank's block of the output.
            Collective::AllGather => (block()?, 0),
            Collective::AllGatherV => (before()?, 0),
            Collective::Gather if root => (block()?, 0),
            // The output is the rank's block of the input.
            Collective::ReduceScatter => (0, block()?),
            Collective::ReduceScatterV => (0, before()?),
            Collective::Scatter if root => (0, block()?),
            _ => return None,
        };
        Some(InPlace {
            input_at,
            output_at,
        })
    }

    /// Elements in rank `r`'s input buffer.
    pub fn input_len(&self, r: u32) -> Result<u64> {
        let n = self.gpus.len() as u64;
        let c = self.count;
        Ok(match self.collective {
            Collective::Broadcast | Collective::Scatter => {
                if r == self.root {
                    if self.collective == Collective::Scatter {
                        self.checked("scatter input", c.checked_mul(n))?
                    } else {
                        c
                    }
                } else {
                    0
                }
            }
            Collective::Reduce
            | Collective::AllReduce
            | Collective::AllGather
            | Collective::Gather => c,
            Collective::AllGatherV => self.counts.get(r as usize).copied().unwrap_or(0),
            Collective::ReduceScatterV => self.counts_total("reduce_scatter_v total")?,
            Collective::ReduceScatter | Collective::AllToAll => {
                self.checked("input size", c.checked_mul(n))?
            }
            Collective::AllToAllV => {
                let row = self
                    .matrix
                    .get(r as usize)
                    .map(|v| v.as_slice())
                    .unwrap_or(&[]);
                self.checked(
                    "all_to_all_v row",
                    row.iter().try_fold(0u64, |a, b| a.checked_add(*b)),
                )?
            }
            Collective::SendRecv => self.checked(
                "sends",
                self.transfers
                    .iter()
                    .filter(|t| t.src == r)
                    .try_fold(0u64, |a, t| a.checked_add(t.count)),
            )?,
        })
    }

    /// Elements in rank `r`'s output buffer.
    pub fn output_len(&self, r: u32) -> Result<u64> {
        let n = self.gpus.len() as u64;
        let c = self.count;
        Ok(match self.collective {
            Collective::Broadcast
            | Collective::AllReduce
            | Collective::Scatter
            | Collective::ReduceScatter => c,
            Collective::ReduceScatterV => self.counts.get(r as usize).copied().unwrap_or(0),
            Collective::Reduce => {
                if r == self.root {
                    c
                } else {
                    0
                }
            }
            Collective::Gather => {
                if r == self.root {
                    self.checked("gather output", c.checked_mul(n))?
                } else {
                    0
                }
            }
            Collective::AllGather | Collective::AllToAll => {
                self.checked("output size", c.checked_mul(n))?
            }
            Collective::AllGatherV => self.counts_total("all_gather_v total")?,
            Collective::AllToAllV => self.checked(
                "all_to_all_v column",
                self.matrix.iter().try_fold(0u64, |a, row| {
                    a.checked_add(row.get(r as usize).copied().unwrap_or(0))
                }),
            )?,
            Collective::SendRecv => self.checked(
                "receives",
                self.transfers
                    .iter()
                    .filter(|t| t.dst == r)
                    .try_fold(0u64, |a, t| a.checked_add(t.count)),
            )?,
        })
    }

    /// The bytes nccl-tests counts as the operation's size (`size` column): the larger of one
    /// rank's input and output, maximised over ranks (all_reduce: count x size; all_gather:
    /// n x count x size).
    pub fn size_bytes(&self) -> u64 {
        let n = self.gpus.len() as u32;
        let per =
            |f: &dyn Fn(u32) -> Result<u64>| (0..n).filter_map(|r| f(r).ok()).max().unwrap_or(0);
        let elems = match self.collective {
            Collective::SendRecv => self.transfers.iter().map(|t| t.count).max().unwrap_or(0),
            _ => per(&|r| self.input_len(r)).max(per(&|r| self.output_len(r))),
        };
        elems.saturating_mul(self.dtype.size())
    }

    /// What every output element must hold: a list of pieces `(rank, out_offset, len, terms)`,
    /// each meaning output element `out_offset + i` of `rank` equals the op-combination of
    /// input element `(src_rank, src_offset + i)` over `terms`. Pieces of zero length are
    /// omitted.
    pub fn expected(&self) -> Result<Vec<ExpectedPiece>> {
        self.validate()?;
        let n = self.gpus.len() as u32;
        let c = self.count;
        let mut v = Vec::new();
        let mut push = |rank: u32, out: u64, len: u64, terms: Vec<(u32, u64)>| {
            if len > 0 {
                v.push(ExpectedPiece {
                    rank,
                    out_offset: out,
                    len,
                    terms,
                });
            }
        };
        let all = |off: u64| (0..n).map(|k| (k, off)).collect::<Vec<_>>();
        match self.collective {
            Collective::Broadcast => {
                for r in 0..n {
                    push(r, 0, c, vec![(self.root, 0)]);
                }
            }
            Collective::Reduce => push(self.root, 0, c, all(0)),
            Collective::AllReduce => {
                for r in 0..n {
                    push(r, 0, c, all(0));
                }
            }
            Collective::AllGather => {
                for r in 0..n {
                    for k in 0..n {
                        push(r, u64::from(k) * c, c, vec![(k, 0)]);
                    }
                }
            }
            Collective::AllGatherV => {
                for r in 0..n {
                    let mut off = 0;
                    for k in 0..n {
                        let len = self.counts[k as usize];
                        push(r, off, len, vec![(k, 0)]);
                        off += len;
                    }
                }
            }
            Collective::ReduceScatter => {
                for r in 0..n {
                    push(r, 0, c, all(u64::from(r) * c));
                }
            }
            Collective::ReduceScatterV => {
                let mut off = 0;
                for r in 0..n {
                    let len = self.counts[r as usize];
                    push(r, 0, len, all(off));
                    off += len;
                }
            }
            Collective::AllToAll => {
                for d in 0..n {
                    for s in 0..n {
                        push(d, u64::from(s) * c, c, vec![(s, u64::from(d) * c)]);
                    }
                }
            }
            Collective::AllToAllV => {
                for d in 0..n {
                    let mut roff = 0;
                    for s in 0..n {
                        let soff: u64 = self.matrix[s as usize][..d as usize].iter().sum();
                        let len = self.matrix[s as usize][d as usize];
                        push(d, roff, len, vec![(s, soff)]);
                        roff += len;
                    }
                }
            }
            Collective::Gather => {
                for k in 0..n {
                    push(self.root, u64::from(k) * c, c, vec![(k, 0)]);
                }
            }
            Collective::Scatter => {
                for r in 0..n {
                    push(r, 0, c, vec![(self.root, u64::from(r) * c)]);
                }
            }
            Collective::SendRecv => {
                let mut send_off = vec![0u64; n as usize];
                let mut recv_off = vec![0u64; n as usize];
                for t in &self.transfers {
                    let (s, d) = (t.src as usize, t.dst as usize);
                    push(t.dst, recv_off[d], t.count, vec![(t.src, send_off[s])]);
                    send_off[s] += t.count;
                    recv_off[d] += t.count;
                }
            }
        }
        Ok(v)
    }
}

/// One piece of a request's expected result (see [`Request::expected`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedPiece {
    /// The rank whose output this is.
    pub rank: u32,
    /// First output element.
    pub out_offset: u64,
    /// Elements in the piece.
    pub len: u64,
    /// `(src_rank, src_offset)` of each input that the op combines (one for data movement).
    pub terms: Vec<(u32, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-place layout: the input is the rank's block of the output (gathers), the
    /// output the rank's block of the input (scatters), and each lies inside the buffer.
    #[test]
    fn in_place_layouts_keep_each_side_inside_the_buffer() {
        let at = |input_at, output_at| {
            Some(InPlace {
                input_at,
                output_at,
            })
        };
        let req = |c: Collective| Request::new(c, vec![0, 1, 2], 5, DType::F32).with_root(2);
        assert_eq!(req(Collective::AllReduce).in_place(1), at(0, 0));
        assert_eq!(req(Collective::AllGather).in_place(1), at(5, 0));
        assert_eq!(req(Collective::ReduceScatter).in_place(2), at(0, 10));
        assert_eq!(req(Collective::Gather).in_place(2), at(10, 0));
        assert_eq!(req(Collective::Gather).in_place(1), None);
        assert_eq!(req(Collective::Scatter).in_place(2), at(0, 10));
        assert_eq!(req(Collective::AllToAll).in_place(0), None);
        let mut v = req(Collective::AllGatherV);
        v.counts = vec![3, 0, 4];
        assert_eq!(v.in_place(2), at(3, 0));
        v.collective = Collective::ReduceScatterV;
        assert_eq!(v.in_place(2), at(0, 3));
        for c in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::AllGatherV,
            Collective::ReduceScatter,
            Collective::ReduceScatterV,
            Collective::Gather,
            Collective::Scatter,
        ] {
            let mut r = req(c);
            r.counts = vec![3, 0, 4];
            let at = r.in_place(2).expect("an in-place form on the root");
            let (i, o) = (r.input_len(2).unwrap(), r.output_len(2).unwrap());
            let buffer = (at.input_at + i).max(at.output_at + o);
            assert_eq!(buffer, i.max(o), "{c:?}: one side lies past the buffer");
        }
        let mut big = req(Collective::AllGather);
        big.count = u64::MAX;
        assert_eq!(big.in_place(2), None, "an offset past u64");
    }

    #[test]
    fn layouts_follow_nccl() {
        let r = Request::new(Collective::AllGather, vec![0, 1, 2], 5, DType::F32);
        assert_eq!(r.input_len(1).unwrap(), 5);
        assert_eq!(r.output_len(1).unwrap(), 15);
        assert_eq!(r.size_bytes(), 60);
        let e = r.expected().unwrap();
        assert_eq!(e.len(), 9);
        let mut v = Request::new(Collective::AllToAllV, vec![0, 1], 0, DType::U8);
        v.matrix = vec![vec![1, 2], vec![3, 4]];
        assert_eq!(v.input_len(0).unwrap(), 3);
        assert_eq!(v.output_len(1).unwrap(), 6);
        let e = v.expected().unwrap();
        // rank 1 receives 2 from rank 0 (rank 0's offset 1) then 4 from itself (offset 3).
        assert!(e.contains(&ExpectedPiece {
            rank: 1,
            out_offset: 0,
            len: 2,
            terms: vec![(0, 1)]
        }));
        assert!(e.contains(&ExpectedPiece {
            rank: 1,
            out_offset: 2,
            len: 4,
            terms: vec![(1, 3)]
        }));
    }

    #[test]
    fn bad_requests_are_errors() {
        let mut r = Request::new(Collective::Broadcast, vec![0, 0], 5, DType::F32);
        assert!(r.validate().is_err());
        r.gpus = vec![0, 1];
        r.root = 2;
        assert!(r.validate().is_err());
        let r =
            Request::new(Collective::AllReduce, vec![0, 1], 5, DType::I32).with_op(ReduceOp::Avg);
        assert!(r.validate().is_err());
        let r = Request::new(Collective::AllGather, vec![0, 1], u64::MAX, DType::F32);
        assert!(r.validate().is_err());
        assert!("allreduce".parse::<Collective>().is_ok());
        assert!("all-gather-v".parse::<Collective>().is_ok());
        assert!("bogus".parse::<Collective>().is_err());
    }
}
