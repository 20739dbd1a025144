//! Per-rank calls without a rendezvous, for ranks that share one host memory (`host-N` on
//! the host backend): each rank runs its own part of the cached plan on its own thread, and
//! waits for another rank only where it needs that rank's memory or that rank needs its own.
//!
//! The shared-memory plans give every op the lane of one rank and order nothing across
//! lanes, so a rank's part is the commands of its lanes ([`DirectPart`], cut once per plan
//! and rank). What crosses ranks is memory: a rank's commands read other ranks' inputs and
//! write their outputs in place. The protocol, on one [`Board`] per communicator (a lock
//! and a condition variable; the host's counterpart of flags in device memory):
//!
//! 1. **Post.** Rank `r` at call `k` posts its call (descriptor, in place or not) and the
//!    addresses of its input and output, and waits for nobody.
//! 2. **Take.** For each rank `p` whose memory its part touches (`reads`), it waits until `p`
//!    has posted call `k`, compares the calls (a different descriptor, in-place choice or
//!    call number is a mismatch) and counts itself among `p`'s users. Then it runs its part
//!    on the posted addresses.
//! 3. **Give back.** It marks itself done with call `k` and leaves the users of the ranks
//!    it took. It returns once no rank uses its memory and every rank whose part touches it
//!    (`touched_by`) is done with call `k`; then it withdraws its post, so nothing reaches
//!    its memory after the call returns.
//!
//! all_to_all_v adds a step between 1 and 2, since each rank holds only its own row (send
//! counts) and column (receive counts) of the count matrix, and its plan and binding need
//! the whole: it posts after checking its slices against its own counts, then **agrees**:
//! it waits for every rank's post of call `k`, compares the descriptors and checks that the
//! counts pair up (`call::matrix`: every rank judges the same posts, so a mismatch is the
//! same verdict everywhere), and only then plans, cuts and binds its part. Its part takes
//! and is touched by every other rank, so no rank leaves the call (and posts its next)
//! before every other has read its post. Every rank binds the same agreed matrix, whose
//! row and column each rank checked its own slices against, so the bound parts keep the
//! checker's proof as the other v-collectives' do.
//!
//! Why it is sound: a rank's memory is touched only by ranks counted as its users, counted
//! under the board's lock while its post stands, and the post is withdrawn under the same
//! lock only once the count is zero, so no rank reaches memory its owner has given back.
//! Every rank's own scratch is touched by its own lanes only (checked when the part is cut),
//! one call after another. Why it ends: a rank waits for posts (made without waiting) and
//! for parts of ranks that already took its memory (bounded work); every wait that depends
//! on another rank arriving has the rank's timeout.
//!
//! A failure (a mismatch, a rank missing past the timeout or gone, a failed check or run)
//! aborts the communicator: ranks in the same call return the same error (`RankMismatch`,
//! `RankTimeout` naming the missing rank and the call, or `RankFailed`), and every later
//! call of every rank returns [`CollectivesError::Aborted`] with that cause. A rank whose
//! part needed nothing from the failed one may already have returned with a valid result,
//! and ranks still in an earlier call finish it.

use std::sync::Arc;
use std::time::Duration;

use relaycc_route::{Collective, MAX_ELEMENTS};

use super::Shared;
use super::board::{Board, Post, Posted, lock};
use super::direct_drive::Running;
use super::direct_part::{CallShape, KeptPart};
use super::op::Desc;
use crate::backend::sealed::{Lending, Private};
use crate::backend::validate::Bound;
use crate::call_checks;
use crate::communicator::Communicator;
use crate::error::{CollectivesError, Result};
use crate::exec::counts::{CallCounts, CountLayout, VCollective};
use crate::plan_cache::Cached;

/// Address of a zero-byte binding: any address aligned for every element type serves.
const EMPTY_ADDR: u64 = 256;

/// Whether the ranks of `comm` run their calls directly: host slices on the host backend,
/// every rank on a device of its own, the devices arenas of one host memory.
pub(crate) fn eligible(comm: &Communicator) -> bool {
    let devices = comm.devices();
    let distinct = devices
        .iter()
        .enumerate()
        .all(|(i, d)| !devices[..i].contains(d));
    matches!(comm.backend().lending(Private), Lending::HostSlices)
        && distinct
        && comm.topology().shares_host_memory(devices)
}

/// One rank's collective call, left to run directly (module docs).
#[derive(Debug)]
pub(crate) struct DirectCall {
    pub shared: Arc<Shared>,
    pub me: usize,
    pub seq: u64,
    pub timeout: Duration,
    pub desc: Desc,
    pub in_place: bool,
    /// Address and bytes of the rank's input and output (`None` where it has none).
    pub input: Option<(usize, u64)>,
    pub output: Option<(usize, u64)>,
}

/// The binding of a span (address, bytes); an empty one where there is none.
pub(super) fn bound_of(span: Option<(usize, u64)>) -> Bound {
    match span {
        Some((addr, bytes)) if bytes > 0 => Bound {
            addr: addr as u64,
            bytes,
        },
        _ => Bound {
            addr: EMPTY_ADDR,
            bytes: 0,
        },
    }
}

/// A v-collective call's counts, to bind into its capacity plan's layout.
type CountsToBind = (CountLayout, CallCounts);

/// Bind `k`'s part of a v-collective's capacity plan to a call's `counts` (its own commands
/// only, into the program it keeps for that), for calls of `k`'s shape; the tasks resolved
/// for other counts go.
fn bind_part(k: &mut KeptPart, (layout, counts): CountsToBind) -> Result<()> {
    let Some(pieces) = k.cached.count_pieces(layout) else {
        return Err(CollectivesError::InvalidPlan {
            op: None,
            message: "a capacity plan that could be bound no longer can".into(),
        });
    };
    let out = k.bound.get_or_insert_with(|| k.part.program.clone());
    let plan = k.cached.exec.plan();
    pieces.bind_program(plan, &k.part.program, &k.part.command_ops, &counts, out)?;
    k.tasks = None;
    Ok(())
}

fn overlap(a: Bound, b: Bound) -> bool {
    a.bytes > 0 && b.bytes > 0 && a.addr < b.addr + b.bytes && b.addr < a.addr + a.bytes
}

impl DirectCall {
    /// Step 1 and what comes before it: this rank's checks and plan, its part, its post.
    /// An all_to_all_v posts after its own checks alone: its plan needs every rank's counts,
    /// which it agrees on from the posts (`direct_drive.rs`). A failure aborts the
    /// communicator (the others may wait for this rank's post).
    pub(super) fn begin(self) -> Result<Running> {
        if let Some(e) = self.shared.board.aborted(self.desc.call, self.seq) {
            return Err(e);
        }
        let k = if self.desc.collective == Collective::AllToAllV {
            self.check_own_counts().map(|()| None)
        } else {
            self.part(Vec::new()).map(Some)
        };
        match k {
            Ok(k) => self.post(k),
            Err(e) => {
                let (call, e) = (self.desc.call, Arc::new(e));
                self.shared.board.fail(self.seq, call, e.clone());
                self.shared.poke_meetings();
                Err(CollectivesError::RankFailed { call, source: e })
            }
        }
    }

    /// This rank's part of the call (its checks passed): the one kept for a call of this
    /// shape, else cut from the communicator's cached plan (bound to the call's counts for
    /// a v-collective). `matrix`: all_to_all_v's counts, agreed by every rank; empty for the
    /// other collectives.
    pub(super) fn part(&self, mut matrix: Vec<Vec<u64>>) -> Result<KeptPart> {
        let kept = lock(&self.shared.kept[self.me]).take_shape(&self.desc, self.in_place, &matrix);
        if let Some(k) = kept {
            return match self.check_slices(&k.shape) {
                Ok(()) => Ok(k),
                Err(e) => {
                    lock(&self.shared.kept[self.me]).put(k);
                    Err(e)
                }
            };
        }
        if !matrix.is_empty()
            && let Some(k) = self.rebound(&mut matrix)?
        {
            return Ok(k);
        }
        let (cached, shape, counts) = self.checked_plan(matrix)?;
        let mut k = lock(&self.shared.kept[self.me]).take(&self.shared, &cached, self.me, shape)?;
        match counts.map(|c| bind_part(&mut k, c)) {
            // Not kept: its shape names counts its program does not hold.
            Some(Err(e)) => Err(e),
            _ => Ok(k),
        }
    }

    /// An all_to_all_v's checks that need no other rank: both count lists hold a count per
    /// rank, and this rank's slices hold their sums (the slices are checked before they are
    /// posted: other ranks write to the output the post lends). The rest of the request's
    /// checks wait for the agreed matrix.
    fn check_own_counts(&self) -> Result<()> {
        self.check_slices(&CallShape {
            desc: self.desc.clone(),
            in_place: self.in_place,
            needs: self.own_needs()?,
            layout: None,
            matrix: Vec::new(),
        })
    }

    /// An all_to_all_v's input and output lengths from its own counts: the sums of its send
    /// and receive counts, each list holding a count per rank.
    fn own_needs(&self) -> Result<(u64, u64)> {
        let (d, n) = (&self.desc, self.shared.comm.ranks());
        let mut needs = [0; 2];
        let sides = [
            ("send counts", &d.counts),
            ("receive counts", &d.recv_counts),
        ];
        for (need, (side, list)) in needs.iter_mut().zip(sides) {
            if list.len() != n {
                return Err(CollectivesError::RankCount {
                    call: d.call,
                    side,
                    expected: n,
                    got: list.len(),
                });
            }
            *need = list
                .iter()
                .try_fold(0u64, |a, &c| a.checked_add(c))
                .filter(|&t| t <= MAX_ELEMENTS)
                .ok_or_else(|| CollectivesError::Overflow {
                    call: d.call,
                    what: format!("rank {}'s {side} sum past {MAX_ELEMENTS} elements", self.me),
                })?;
        }
        Ok((needs[0], needs[1]))
    }

    /// An all_to_all_v's kept part of the capacity plan that serves `matrix`, bound to it:
    /// of a call like this one but for the counts, its matrix under the same capacity. The
    /// request's checks are the agreement's, and this rank's slices were checked against its
    /// own counts before it posted (every rank checked its own, and the counts pair up), so
    /// neither the request, the slices nor the plan cache is looked at again. `Ok(None)`
    /// where no kept part serves.
    fn rebound(&self, matrix: &mut Vec<Vec<u64>>) -> Result<Option<KeptPart>> {
        let (n, me) = (self.shared.comm.ranks(), self.me);
        let needs = self.own_needs()?;
        let largest = matrix.iter().flatten().copied().max().unwrap_or(0);
        let layout = CountLayout {
            collective: VCollective::AllToAllV,
            ranks: n as u32,
            capacity: CountLayout::capacity_for(largest),
        };
        let kept = lock(&self.shared.kept[me]).take_rebindable(&self.desc, self.in_place, |m| {
            let most = m.iter().flatten().copied().max().unwrap_or(0);
            CountLayout::capacity_for(most) == layout.capacity
        });
        let Some(mut k) = kept else {
            return Ok(None);
        };
        let flat: Vec<u64> = matrix.iter().flatten().copied().collect();
        let shape = CallShape {
            desc: self.desc.clone(),
            in_place: self.in_place,
            needs,
            layout: None,
            matrix: std::mem::take(matrix),
        };
        // Not kept on failure: its shape would name counts its program does not hold.
        bind_part(&mut k, (layout, CallCounts::new(&layout, &flat)?))?;
        k.shape = shape;
        Ok(Some(k))
    }

    /// Post this call and this rank's slices (step 1); with its part, lay out the bindings
    /// the part runs on: its own slices and scratch now, the others' once taken.
    fn post(self, k: Option<KeptPart>) -> Result<Running> {
        let board = &self.shared.board;
        let (me, seq) = (self.me, self.seq);
        let mine = (bound_of(self.input), bound_of(self.output));
        {
            let mut st = lock(&board.state);
            if let Some(a) = st.abort_at(seq) {
                let e = Board::error_of(a, self.desc.call, seq);
                drop(st);
                if let Some(k) = k {
                    lock(&self.shared.kept[me]).put(k);
                }
                return Err(e);
            }
            let old = &mut st.posts[me];
            let before = match (old.seq, old.call.take()) {
                (Some(s), Some(c)) => Some((s, c.desc, c.in_place)),
                _ => None,
            };
            *old = Post {
                seq: Some(seq),
                call: Some(Posted {
                    desc: self.desc.clone(),
                    in_place: self.in_place,
                    input: mine.0,
                    output: mine.1,
                }),
                open: true,
                before,
                done: false,
                users: 0,
                watchers: std::mem::take(&mut old.watchers),
            };
            board.changed(&mut st, me);
        }
        Ok(Running::new(self, k))
    }

    /// The bindings `k` runs on for this call: this rank's slices and scratch, the others'
    /// empty until taken.
    pub(super) fn bindings(&self, k: &mut KeptPart) -> Vec<Bound> {
        let (me, n) = (self.me, self.shared.comm.ranks());
        let mut bound = std::mem::take(&mut k.bindings);
        bound.clear();
        bound.resize(k.program().bindings as usize, bound_of(None));
        let mut fill = |b: usize, v: Bound| {
            if let Some(x) = bound.get_mut(b) {
                *x = v;
            }
        };
        fill(me, bound_of(self.input));
        fill(n + me, bound_of(self.output));
        for (i, s) in k.scratch.iter().enumerate() {
            fill(2 * n + i, *s);
        }
        bound
    }

    /// The checks of the call's shape (op and type, root, the request's rules) and of this
    /// rank's slices, then the communicator's cached plan of the call: for the v-collectives
    /// their capacity plan, with the layout and the call's counts to bind into it (`None`
    /// where the plan is of the exact counts: the capacity plan cannot be bound, or the
    /// collective has fixed counts). `matrix`: all_to_all_v's counts, empty for the others.
    fn checked_plan(
        &self,
        matrix: Vec<Vec<u64>>,
    ) -> Result<(Arc<Cached>, CallShape, Option<CountsToBind>)> {
        let comm = &self.shared.comm;
        let d = &self.desc;
        let n = comm.ranks();
        if d.root >= n {
            return Err(CollectivesError::BadRank {
                call: d.call,
                rank: d.root,
                ranks: n,
            });
        }
        let request = d.request(comm.devices().to_vec(), matrix);
        let lens = call_checks::check_request(d.call, &request)?;
        let shape = CallShape {
            desc: d.clone(),
            in_place: self.in_place,
            needs: lens.get(self.me).copied().unwrap_or((0, 0)),
            layout: request.in_place(self.me as u32),
            matrix: request.matrix.clone(),
        };
        self.check_slices(&shape)?;
        if let Some((layout, counts)) = CountLayout::of_request(&request) {
            let capacity = layout.capacity_request(&request);
            let cached = comm.plan_for(d.call, &capacity, self.in_place)?;
            if cached.count_pieces(layout).is_some() {
                let counts = CallCounts::new(&layout, &counts)?;
                return Ok((cached, shape, Some((layout, counts))));
            }
        }
        let cached = comm.plan_for(d.call, &request, self.in_place)?;
        Ok((cached, shape, None))
    }

    /// This rank's slices for a call of `shape`: their lengths, and input and output apart
    /// or exactly in the in-place layout.
    fn check_slices(&self, shape: &CallShape) -> Result<()> {
        let call = self.desc.call;
        let esize = self.desc.dtype.size();
        for (side, span, needs) in [
            ("input", self.input, shape.needs.0),
            ("output", self.output, shape.needs.1),
        ] {
            let got = span.map(|(_, b)| b / esize);
            call_checks::check_len(call, self.me, side, got, needs)?;
        }
        let (i, o) = (bound_of(self.input), bound_of(self.output));
        let laid_out = || {
            shape
                .layout
                .and_then(|at| call_checks::input_start(at, esize, o.addr))
                == Some(i.addr)
        };
        if overlap(i, o) && !(self.in_place && laid_out()) {
            return Err(CollectivesError::Overlap {
                call,
                what: format!(
                    "input and output of rank {} overlap outside the in-place layout",
                    self.me
                ),
            });
        }
        Ok(())
    }
}
