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
use crate::exec::counts::{CallCounts, CountLayout};
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
    /// A failure aborts the communicator (the others may wait for this rank's post).
    pub(super) fn begin(self) -> Result<Running> {
        let call = self.desc.call;
        let board = &self.shared.board;
        if let Some(e) = board.aborted(call, self.seq) {
            return Err(e);
        }
        let kept = lock(&self.shared.kept[self.me]).take_shape(&self.desc, self.in_place);
        let k = match kept {
            Some(k) => match self.check_slices(&k.shape) {
                Ok(()) => Ok(k),
                Err(e) => {
                    lock(&self.shared.kept[self.me]).put(k);
                    Err(e)
                }
            },
            None => self.checked_plan().and_then(|(cached, shape, counts)| {
                let mut k =
                    lock(&self.shared.kept[self.me]).take(&self.shared, &cached, self.me, shape)?;
                match counts.map(|c| bind_part(&mut k, c)) {
                    // Not kept: its shape names counts its program does not hold.
                    Some(Err(e)) => Err(e),
                    _ => Ok(k),
                }
            }),
        };
        let k = match k {
            Ok(k) => k,
            Err(e) => {
                let e = Arc::new(e);
                board.fail(self.seq, call, e.clone());
                self.shared.poke_meetings();
                return Err(CollectivesError::RankFailed { call, source: e });
            }
        };
        self.post(k)
    }

    /// Post this call and this rank's slices (step 1), and lay out the bindings its part
    /// runs on: its own slices and scratch now, the others' once taken.
    fn post(self, mut k: KeptPart) -> Result<Running> {
        let board = &self.shared.board;
        let (me, seq) = (self.me, self.seq);
        let n = self.shared.comm.ranks();
        let mine = (bound_of(self.input), bound_of(self.output));
        {
            let mut st = lock(&board.state);
            if let Some(a) = st.abort_at(seq) {
                let e = Board::error_of(a, self.desc.call, seq);
                drop(st);
                lock(&self.shared.kept[me]).put(k);
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
        let mut bound = std::mem::take(&mut k.bindings);
        bound.clear();
        bound.resize(k.program().bindings as usize, bound_of(None));
        let mut fill = |b: usize, v: Bound| {
            if let Some(x) = bound.get_mut(b) {
                *x = v;
            }
        };
        fill(me, mine.0);
        fill(n + me, mine.1);
        for (i, s) in k.scratch.iter().enumerate() {
            fill(2 * n + i, *s);
        }
        Ok(Running::new(self, k, bound))
    }

    /// The checks of the call's shape (op and type, root, the request's rules) and of this
    /// rank's slices, then the communicator's cached plan of the call: for all_gather_v and
    /// reduce_scatter_v their capacity plan, with the layout and the call's counts to bind
    /// into it (`None` where the plan is of the exact counts: the capacity plan cannot be
    /// bound, or the collective has fixed counts).
    fn checked_plan(&self) -> Result<(Arc<Cached>, CallShape, Option<CountsToBind>)> {
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
        let request = d.request(comm.devices().to_vec(), Vec::new());
        let lens = call_checks::check_request(d.call, &request)?;
        let shape = CallShape {
            desc: d.clone(),
            in_place: self.in_place,
            needs: lens.get(self.me).copied().unwrap_or((0, 0)),
            layout: request.in_place(self.me as u32),
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
