//! A request cut into rounds ([`Split`]: the body's request, run `count` times, and the
//! tail's), its pieces, the map of a segment's regions onto the full buffers
//! ([`RegionMap`]), the plan of rounds assembled from the segments' plans, and the time of
//! `count` rounds. The checker, the expansion, the selector and the simulator build on it.

use std::collections::HashMap;

use crate::error::{Result, RouteError};
use crate::plan::{BufferRef, Plan, Region, Rounds};
use crate::request::{Collective, Request};

/// Largest slice of one piece a round moves, bytes, when the caller names none: 2 GiB, so
/// every round of a plan of rounds moves more than 1 GiB per piece (its bandwidth at least
/// that of one plan of 1 GiB), while one round's plan stays small enough to plan within the
/// default budget.
pub const DEFAULT_ROUND_BYTES: u64 = 2 << 30;

/// How a request divides into rounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Rounds (at least 2).
    pub count: u64,
    /// The request of one round: every piece `floor(len / count)`.
    pub body: Request,
    /// The request of the remainders (`len mod count` per piece), absent when every
    /// remainder is zero.
    pub tail: Option<Request>,
}

/// The request with every piece length (count, counts, matrix entries, transfer counts)
/// replaced by `f` of it.
fn scaled(req: &Request, f: impl Fn(u64) -> u64) -> Request {
    let mut r = req.clone();
    r.count = f(r.count);
    for c in &mut r.counts {
        *c = f(*c);
    }
    for row in &mut r.matrix {
        for c in row {
            *c = f(*c);
        }
    }
    for t in &mut r.transfers {
        t.count = f(t.count);
    }
    r
}

/// The split of `req` into `count` rounds ([`Split`]); `count` of 2 or more.
pub fn split_into(req: &Request, count: u64) -> Split {
    let count = count.max(2);
    let body = scaled(req, |len| len / count);
    let tail = scaled(req, |len| len % count);
    let any_tail = (0..req.nranks() as u32)
        .any(|r| tail.input_len(r).is_ok_and(|l| l > 0) || tail.output_len(r).is_ok_and(|l| l > 0));
    Split {
        count,
        body,
        tail: any_tail.then_some(tail),
    }
}

/// The longest piece of `req`, elements.
fn longest_piece(req: &Request) -> u64 {
    match req.collective {
        Collective::AllGatherV | Collective::ReduceScatterV => {
            req.counts.iter().copied().max().unwrap_or(0)
        }
        Collective::AllToAllV => req.matrix.iter().flatten().copied().max().unwrap_or(0),
        Collective::SendRecv => req.transfers.iter().map(|t| t.count).max().unwrap_or(0),
        _ => req.count,
    }
}

/// How `req` divides into rounds of at most `round_bytes` per piece: `None` when its longest
/// piece fits one round (or `round_bytes` is [`u64::MAX`]).
///
/// Errors: a malformed request.
pub fn split(req: &Request, round_bytes: u64) -> Result<Option<Split>> {
    req.validate()?;
    if round_bytes == u64::MAX {
        return Ok(None);
    }
    let per_round = (round_bytes / req.dtype.size().max(1)).max(1);
    let rounds = longest_piece(req).div_ceil(per_round);
    Ok((rounds >= 2).then(|| split_into(req, rounds)))
}

/// The pieces of buffer `b` of `req` in order, elements (see the module docs). Scratch
/// buffers have none.
///
/// Errors: a rank outside the request.
pub fn pieces(req: &Request, b: BufferRef) -> Result<Vec<u64>> {
    let n = req.nranks();
    let (r, input) = match b {
        BufferRef::Input(r) => (r, true),
        BufferRef::Output(r) => (r, false),
        BufferRef::Scratch(_) => return Ok(Vec::new()),
    };
    if r as usize >= n {
        return Err(RouteError::BadRequest(format!(
            "rank {r} outside the request's {n} ranks"
        )));
    }
    let c = req.count;
    let root = r == req.root;
    Ok(match (req.collective, input) {
        (Collective::Broadcast, true) | (Collective::Reduce, false) => {
            if root {
                vec![c]
            } else {
                Vec::new()
            }
        }
        (Collective::Gather, false) | (Collective::Scatter, true) => {
            if root {
                vec![c; n]
            } else {
                Vec::new()
            }
        }
        (Collective::AllGather, false)
        | (Collective::ReduceScatter, true)
        | (Collective::AllToAll, _) => vec![c; n],
        (Collective::AllGatherV, true) => vec![req.counts.get(r as usize).copied().unwrap_or(0)],
        (Collective::AllGatherV, false) | (Collective::ReduceScatterV, true) => req.counts.clone(),
        (Collective::ReduceScatterV, false) => {
            vec![req.counts.get(r as usize).copied().unwrap_or(0)]
        }
        (Collective::AllToAllV, true) => req.matrix.get(r as usize).cloned().unwrap_or_default(),
        (Collective::AllToAllV, false) => req
            .matrix
            .iter()
            .map(|row| row.get(r as usize).copied().unwrap_or(0))
            .collect(),
        (Collective::SendRecv, _) => req
            .transfers
            .iter()
            .filter(|t| if input { t.src == r } else { t.dst == r })
            .map(|t| t.count)
            .collect(),
        _ => vec![c],
    })
}

/// Which segment of a plan of rounds a region belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundSegment {
    /// Round `k` of the body.
    Round(u64),
    /// The tail.
    Tail,
}

/// One buffer's pieces as the segments of a plan of rounds see them: where each piece starts
/// in the segment's buffer and in the full one, and the segment's slice of it.
#[derive(Debug, Clone)]
struct PieceMap {
    /// Start of each piece in the segment's buffer, and one past the last.
    seg_start: Vec<u64>,
    /// Start of each piece in the full buffer.
    full_start: Vec<u64>,
    /// Length of each piece in the body's request (its slice in every round).
    body_len: Vec<u64>,
}

/// Maps the regions of a plan of rounds' body and tail onto the full request's buffers
/// ([`region_in_full`]), one buffer's pieces computed on first use.
#[derive(Debug)]
pub struct RegionMap<'a> {
    full: &'a Request,
    rounds: u64,
    segment_tail: bool,
    maps: HashMap<BufferRef, PieceMap>,
}

impl<'a> RegionMap<'a> {
    /// A map of the body's regions (`tail` false) or the tail's onto `full`'s buffers, for
    /// `rounds` rounds.
    pub fn new(full: &'a Request, rounds: u64, tail: bool) -> Self {
        RegionMap {
            full,
            rounds: rounds.max(2),
            segment_tail: tail,
            maps: HashMap::new(),
        }
    }

    fn piece_map(&mut self, b: BufferRef) -> Result<&PieceMap> {
        if !self.maps.contains_key(&b) {
            let full = pieces(self.full, b)?;
            let r = self.rounds;
            let body_len: Vec<u64> = full.iter().map(|l| l / r).collect();
            let seg_len: Vec<u64> = if self.segment_tail {
                full.iter().map(|l| l % r).collect()
            } else {
                body_len.clone()
            };
            let starts = |v: &[u64]| {
                let mut s = Vec::with_capacity(v.len() + 1);
                let mut at = 0u64;
                s.push(0);
                for l in v {
                    at = at.saturating_add(*l);
                    s.push(at);
                }
                s
            };
            self.maps.insert(
                b,
                PieceMap {
                    seg_start: starts(&seg_len),
                    full_start: starts(&full),
                    body_len,
                },
            );
        }
        Ok(&self.maps[&b])
    }

    /// The piece of buffer `b` that `region` (a region of the segment's buffer) lies in, and
    /// its offset inside that piece; `None` when it crosses a piece boundary or lies outside
    /// the buffer. A zero-length region lies in the piece its offset starts or ends.
    pub fn piece_of(&mut self, region: &Region) -> Result<Option<(usize, u64)>> {
        let m = self.piece_map(region.buffer)?;
        let starts = &m.seg_start;
        let pieces = starts.len() - 1;
        // The last piece starting at or before the offset (zero-length pieces skipped by
        // taking the last such start).
        let i = starts[..pieces].partition_point(|s| *s <= region.offset);
        let Some(i) = i.checked_sub(1) else {
            return Ok((region.len == 0 && region.offset == 0).then_some((0, 0)));
        };
        let end = region.offset.checked_add(region.len);
        Ok(end
            .filter(|e| *e <= starts[i + 1])
            .map(|_| (i, region.offset - starts[i])))
    }

    /// `region` of the segment (round `k`, or the tail) as a region of the full buffer; a
    /// staging region as it is.
    ///
    /// Errors: a region that crosses a piece of its segment's buffer or lies outside it.
    pub fn region_in_full(&mut self, region: Region, segment: RoundSegment) -> Result<Region> {
        if matches!(region.buffer, BufferRef::Scratch(_)) {
            return Ok(region);
        }
        let Some((i, within)) = self.piece_of(&region)? else {
            return Err(RouteError::PlanCheck {
                op: usize::MAX,
                message: format!(
                    "region {}+{} of {:?} crosses a piece of its round's buffer",
                    region.offset, region.len, region.buffer
                ),
            });
        };
        let rounds = self.rounds;
        let m = self.piece_map(region.buffer)?;
        if m.seg_start.len() <= 1 {
            // A buffer without pieces holds nothing; only empty regions lie in it.
            return Ok(region);
        }
        let body = m.body_len[i];
        let base = match segment {
            RoundSegment::Round(k) => k.saturating_mul(body),
            RoundSegment::Tail => rounds.saturating_mul(body),
        };
        Ok(Region::new(
            region.buffer,
            m.full_start[i].saturating_add(base).saturating_add(within),
            region.len,
        ))
    }
}

/// `region` of segment `segment` of a plan of rounds over `full` with `rounds` rounds, as a
/// region of the full buffers ([`RegionMap::region_in_full`], for one region).
///
/// Errors: a region that crosses a piece of its segment's buffer.
pub fn region_in_full(
    full: &Request,
    rounds: u64,
    segment: RoundSegment,
    region: Region,
) -> Result<Region> {
    RegionMap::new(full, rounds, segment == RoundSegment::Tail).region_in_full(region, segment)
}

/// The plan of rounds for `full`: `body` run `count` times, then `tail`, named after them.
pub fn assemble(full: &Request, count: u64, body: Plan, tail: Option<Plan>) -> Plan {
    let name = match &tail {
        Some(t) => format!(
            "{count} rounds of [{}] + tail [{}]",
            body.algorithm, t.algorithm
        ),
        None => format!("{count} rounds of [{}]", body.algorithm),
    };
    let mut plan = Plan::new(full.clone(), name);
    plan.rounds = Some(Box::new(Rounds { count, body, tail }));
    plan
}

/// `count` times `body` and `tail` once, microseconds.
pub fn rounds_us(count: u64, body: f64, tail: Option<f64>) -> f64 {
    count as f64 * body + tail.unwrap_or(0.0)
}
