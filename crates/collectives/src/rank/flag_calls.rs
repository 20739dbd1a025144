//! Per-rank collective calls over the flag transport ([`crate::exec::flag_transport`]): each
//! rank runs only its own part of the cached plan, lowered for it once per call shape, with
//! its messages through the rings of its flag channels, and waits for another rank only for
//! a chunk it takes or a slot it fills. No rank meets the others and none runs another's part.
//!
//! A call: this rank's part of the shape's plan (kept, or cut from the communicator's cached
//! plan: the plan lowered for this rank with its scratch), then the call's descriptor posted
//! in the group's book of calls (`begin_call`: the rank that begins a call second finds a
//! mismatch, without waiting), then this rank's own checks of its slices, then the part run
//! on its slices and scratch over its end of the transport. Any failure aborts the group, so
//! a peer's later waits stop with the same words and every later call fails; a rank that
//! stops calling is named with its last call within the timeout.
//!
//! What takes this path: collectives with fixed counts. The v-collectives (whose plans bind
//! each call's counts, and all_to_all_v's need every rank's counts first), sends and
//! receives, splits, groups that mix them, and plans a rank cannot run alone (a relay through
//! a GPU no rank holds) meet as on every communicator (`meeting.rs`). In-place calls run on
//! the out-of-place plan with the input copied aside first, so the part's memory is two
//! disjoint buffers, as the runner's memory promises.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use relaycc_route::{BufferRef, Collective, InPlace, Location, Plan};

use super::board::lock;
use super::op::{Desc, RankCallOp, View};
use super::{Lender, RankComm, Shared};
use crate::backend::ByteRegion;
use crate::backend::sealed::{Lending, Private};
use crate::call_checks;
use crate::communicator::Communicator;
use crate::error::{CollectivesError, Result};
use crate::exec::flag_host::{HostFlagChannels, HostFlagLane};
use crate::exec::flag_transport::{FlagLane, FlagShape, FlagTransport};
use crate::exec::lower::{Lanes, RankLayout, RankProgram, lower};
use crate::exec::run::{HostMemory, run};
use crate::plan_cache::Cached;

/// Call shapes a rank keeps its part of; a call of another shape cuts its part again.
const KEPT_PARTS: usize = 8;

/// The flag transport of a communicator's ranks: one end per rank, each used by its own
/// rank's handle only (the lock is never contended).
#[derive(Debug)]
pub(crate) struct FlagRanks {
    shape: FlagShape,
    ranks: Box<[Mutex<FlagRank>]>,
    /// The group's channels, to abort it without a rank's lock (which its rank holds for
    /// the whole of a call).
    channels: Option<Arc<HostFlagChannels>>,
}

/// One rank's end of the transport, its kept parts and its staging memory.
#[derive(Debug)]
struct FlagRank {
    end: FlagTransport<HostFlagLane>,
    /// Least recently used first.
    parts: Vec<FlagPart>,
    staging: Vec<u128>,
}

/// A rank's part of one call shape's plan: the plan lowered for the rank (input binding 0,
/// output 1, then the scratch it holds), the scratch's addresses, and the input's copy for
/// in-place calls.
#[derive(Debug)]
struct FlagPart {
    desc: Desc,
    in_place: bool,
    /// Elements of this rank's input and output.
    needs: (u64, u64),
    /// Where an in-place call's input and output lie in their one buffer.
    layout: Option<InPlace>,
    program: RankProgram,
    /// Address and bytes of each scratch binding, in the cached plan's scratch (held by
    /// `cached`).
    scratch: Vec<(usize, usize)>,
    _cached: Arc<Cached>,
    /// The input of an in-place call, copied here before the run.
    aside: Vec<u128>,
}

impl FlagRanks {
    /// Host lanes for the ranks of `comm`, whose channels have `shape`.
    pub(crate) fn host(comm: &Communicator, shape: FlagShape, timeout: Duration) -> FlagRanks {
        let ends = HostFlagChannels::group(comm.ranks() as u32, shape, timeout);
        FlagRanks {
            shape,
            channels: ends.first().map(|e| Arc::clone(e.lane().channels())),
            ranks: ends
                .into_iter()
                .map(|end| {
                    Mutex::new(FlagRank {
                        end,
                        parts: Vec::new(),
                        staging: Vec::new(),
                    })
                })
                .collect(),
        }
    }

    /// The channels' shape.
    pub(crate) fn shape(&self) -> FlagShape {
        self.shape
    }

    /// Abort the group with `why`: every rank's later waits and calls fail with it.
    pub(crate) fn abort(&self, why: String) {
        if let Some(c) = &self.channels {
            c.abort(why);
        }
    }

    /// Rank `rank`'s handle is gone: a peer that needs it fails at once, naming it.
    pub(crate) fn leave(&self, rank: usize) {
        if let Some(c) = &self.channels {
            c.leave(rank as u32);
        }
    }
}

impl Shared {
    /// What the ranks of `comm` share, their collectives over host flag lanes of `shape`.
    pub(crate) fn with_flags(comm: Communicator, shape: FlagShape) -> Shared {
        let flags = FlagRanks::host(&comm, shape, super::DEFAULT_RANK_TIMEOUT);
        let mut shared = Shared::new(comm);
        shared.flags = Some(flags);
        shared
    }
}

impl Communicator {
    /// One handle per rank, as [`Communicator::into_ranks`] makes them, whose collectives
    /// run over the flag transport ([`crate::exec::flag_transport`]) with channels of
    /// `shape`: each rank runs only its own part of the plan on its own thread, its messages
    /// through rings of slots ordered by counters, and waits for another rank only for the
    /// data it needs (module docs of `rank/flag_calls.rs`: which calls take this path; the
    /// others meet as on any communicator). Each call's descriptor is posted in the group's
    /// book of calls, so ranks whose calls differ fail without any rank waiting to compare,
    /// and a rank that stops calling is named with its last call within the timeout. Every
    /// failure aborts the group: later calls fail with its words. A split's communicators
    /// run over flags of their own.
    ///
    /// Errors: a communicator whose backend does not lend host slices (the flag lanes here
    /// are host threads).
    ///
    /// ```
    /// use relaycc_collectives::exec::flag_transport::FlagShape;
    /// use relaycc_collectives::{Collectives, Communicator, ReduceOp};
    ///
    /// let ranks = Communicator::host(4)?.into_flag_ranks(FlagShape::new(2, 64 << 10)?)?;
    /// let threads: Vec<_> = ranks
    ///     .into_iter()
    ///     .map(|mut rank| {
    ///         std::thread::spawn(move || {
    ///             let mut grads = vec![rank.rank() as f32; 1000];
    ///             rank.all_reduce_in_place(&mut grads[..], ReduceOp::Sum).map(|()| grads[999])
    ///         })
    ///     })
    ///     .collect();
    /// for t in threads {
    ///     assert_eq!(t.join().expect("rank")?, 6.0);
    /// }
    /// # Ok::<(), relaycc_collectives::CollectivesError>(())
    /// ```
    pub fn into_flag_ranks(self, shape: FlagShape) -> Result<Vec<RankComm>> {
        if self.backend().lending(Private) != Lending::HostSlices {
            return Err(CollectivesError::Setup(format!(
                "per-rank calls over host flag lanes need a communicator on host slices, not \
                 one on the {} backend",
                self.backend().name()
            )));
        }
        Ok(RankComm::handles(Arc::new(Shared::with_flags(self, shape))))
    }
}

/// Whether `ops` run over the flag transport: every one a collective with fixed counts, on
/// host slices.
pub(crate) fn eligible(lender: &Lender<'_>, ops: &[RankCallOp]) -> bool {
    !ops.is_empty()
        && lender
            .blocks
            .iter()
            .all(|b| b.device.is_none() && b.held.is_none())
        && ops.iter().all(|op| match op {
            RankCallOp::Coll { desc, .. } => {
                !desc.collective.counts_per_rank() && desc.collective != Collective::AllToAllV
            }
            _ => false,
        })
}

/// One call of rank `me`: its collective `op` over `lender`'s slices (module docs).
pub(crate) fn call(
    comm: &Communicator,
    flags: &FlagRanks,
    me: usize,
    timeout: Duration,
    lender: &Lender<'_>,
    op: &RankCallOp,
) -> Result<()> {
    let RankCallOp::Coll {
        desc,
        input,
        output,
        in_place,
    } = op
    else {
        return Err(CollectivesError::Unmatched(
            "a flag call of an operation that is not a collective".into(),
        ));
    };
    let Some(rank) = flags.ranks.get(me) else {
        return Err(CollectivesError::BadRank {
            call: desc.call,
            rank: me,
            ranks: flags.ranks.len(),
        });
    };
    let mut rank = lock(rank);
    let FlagRank {
        end,
        parts,
        staging,
    } = &mut *rank;
    end.lane_mut().set_timeout(timeout);
    let part = take_part(parts, desc, *in_place).map_or_else(|| cut(comm, me, desc, *in_place), Ok);
    // Posted whatever the part gave, so that a call that differs from the peers' is named
    // as a mismatch, not as this rank's own error.
    end.begin_call(desc)?;
    let ran = part.and_then(|mut p| {
        let ran = run_part(&mut p, end, staging, lender, (*input, *output), me);
        parts.push(p);
        if parts.len() > KEPT_PARTS {
            parts.remove(0);
        }
        ran
    });
    ran.map_err(|e| {
        let why = format!("rank {me}: {}: {e}", desc.call);
        end.lane().abort(why);
        match e {
            e @ CollectivesError::RankMismatch { .. } => e,
            e => CollectivesError::RankFailed {
                call: desc.call,
                source: Arc::new(e),
            },
        }
    })
}

/// The kept part of a call of `desc`'s shape, taken out.
fn take_part(parts: &mut Vec<FlagPart>, desc: &Desc, in_place: bool) -> Option<FlagPart> {
    let i = parts
        .iter()
        .position(|p| p.in_place == in_place && p.desc.same_shape(desc))?;
    Some(parts.remove(i))
}

/// This rank's part of the call's plan: the request's checks, the communicator's cached plan
/// (out of place: module docs), lowered for rank `me` with its scratch.
fn cut(comm: &Communicator, me: usize, desc: &Desc, in_place: bool) -> Result<FlagPart> {
    let n = comm.ranks();
    if desc.root >= n {
        return Err(CollectivesError::BadRank {
            call: desc.call,
            rank: desc.root,
            ranks: n,
        });
    }
    let request = desc.request(comm.devices().to_vec(), Vec::new());
    let lens = call_checks::check_request(desc.call, &request)?;
    let needs = lens.get(me).copied().unwrap_or((0, 0));
    let layout = request.in_place(me as u32).filter(|_| in_place);
    let cached = comm.plan_for(desc.call, &request, false)?;
    let expanded;
    let mut plan = cached.exec.plan();
    if plan.is_rounds() {
        expanded = relaycc_route::rounds::expand(plan, relaycc_route::rounds::MAX_EXPANDED_OPS)
            .map_err(|e| CollectivesError::InvalidPlan {
                op: None,
                message: e.to_string(),
            })?;
        plan = &expanded;
    }
    let (program, held) = lower_for(plan, comm, me)?;
    let backend = comm.backend();
    let set = cached.scratch_set(0, backend)?;
    let mut scratch = Vec::with_capacity(held.len());
    for i in held {
        let mem = *set.get(i).ok_or_else(|| CollectivesError::InvalidPlan {
            op: None,
            message: format!("scratch buffer {i} of a plan that holds {}", set.len()),
        })?;
        let whole = ByteRegion {
            mem,
            offset: 0,
            bytes: mem.bytes(),
        };
        let raw =
            backend
                .raw_region(whole, Private)?
                .ok_or_else(|| CollectivesError::InvalidPlan {
                    op: None,
                    message: "a scratch buffer without a host address".into(),
                })?;
        scratch.push((raw.addr, raw.bytes as usize));
    }
    Ok(FlagPart {
        desc: desc.clone(),
        in_place,
        needs,
        layout,
        program,
        scratch,
        _cached: cached,
        aside: Vec::new(),
    })
}

/// `plan` lowered for rank `me` of `comm` onto one lane: input binding 0, output 1, then the
/// scratch buffers it holds, whose plan indices come back with the program.
fn lower_for(plan: &Plan, comm: &Communicator, me: usize) -> Result<(RankProgram, Vec<usize>)> {
    let devices = comm.devices();
    let owner = |b: BufferRef| match plan.location(b)? {
        Location::Gpu(g) => devices.iter().position(|d| *d == g).map(|r| r as u32),
        Location::Host(_) => None,
    };
    let esize = plan.dtype.size();
    let me32 = me as u32;
    let mut held = Vec::new();
    let mut binding_of_scratch = vec![None; plan.scratch.len()];
    let mut bytes = vec![
        plan.request.input_len(me32).unwrap_or(0) * esize,
        plan.request.output_len(me32).unwrap_or(0) * esize,
    ];
    for (i, s) in plan.scratch.iter().enumerate() {
        if owner(BufferRef::Scratch(i as u32)) == Some(me32) {
            binding_of_scratch[i] = Some(bytes.len() as u32);
            held.push(i);
            bytes.push(s.len * esize);
        }
    }
    let layout = RankLayout {
        me: me32,
        owner: &owner,
        binding: &|b| match b {
            BufferRef::Input(r) if r == me32 => Some(0),
            BufferRef::Output(r) if r == me32 => Some(1),
            BufferRef::Scratch(i) => binding_of_scratch.get(i as usize).copied().flatten(),
            _ => None,
        },
        binding_bytes: bytes,
        lanes: Lanes::Fold {
            count: 1,
            at: Location::Gpu(devices.get(me).copied().unwrap_or(0)),
        },
    };
    Ok((lower(plan, &layout)?, held))
}

/// The address and bytes of `view` of `lender`'s host slices, `None` where there is none.
fn span_of(lender: &Lender<'_>, view: Option<View>, esize: u64) -> Result<Option<(usize, u64)>> {
    let Some(v) = view else { return Ok(None) };
    let bad = || CollectivesError::Unmatched("a view outside the memory its call lends".into());
    let b = lender.blocks.get(v.block).ok_or_else(bad)?;
    let at = v.offset.checked_mul(esize).ok_or_else(bad)?;
    let addr = b.addr.checked_add(usize::try_from(at).map_err(|_| bad())?);
    Ok(Some((
        addr.ok_or_else(bad)?,
        v.len.checked_mul(esize).ok_or_else(bad)?,
    )))
}

/// Check this rank's slices against `p` and run it over `end`.
fn run_part(
    p: &mut FlagPart,
    end: &mut FlagTransport<HostFlagLane>,
    staging: &mut Vec<u128>,
    lender: &Lender<'_>,
    (input, output): (Option<View>, Option<View>),
    me: usize,
) -> Result<()> {
    let (call, esize) = (p.desc.call, p.desc.dtype.size());
    let input = span_of(lender, input, esize)?;
    let output = span_of(lender, output, esize)?;
    call_checks::check_len(call, me, "input", input.map(|s| s.1 / esize), p.needs.0)?;
    call_checks::check_len(call, me, "output", output.map(|s| s.1 / esize), p.needs.1)?;
    let empty = (
        std::ptr::NonNull::<u128>::dangling().as_ptr().cast::<u8>(),
        0,
    );
    let out = output.map_or(empty, |(a, b)| (a as *mut u8, b as usize));
    let mut inp = input.map_or(empty, |(a, b)| (a as *mut u8, b as usize));
    let overlaps = inp.1 > 0
        && out.1 > 0
        && (inp.0 as usize) < out.0 as usize + out.1
        && (out.0 as usize) < inp.0 as usize + inp.1;
    if overlaps {
        // Only an in-place call's input may lie in its output, and only where the layout
        // puts it; the run then reads a copy of it, as the out-of-place plan expects.
        let laid_out = p
            .layout
            .and_then(|at| call_checks::input_start(at, esize, out.0 as u64))
            == Some(inp.0 as u64);
        if !laid_out {
            return Err(CollectivesError::Overlap {
                call,
                what: format!("input and output of rank {me} overlap outside the in-place layout"),
            });
        }
        let words = inp.1.div_ceil(16);
        if p.aside.len() < words {
            p.aside.resize(words, 0);
        }
        let aside = p.aside.as_mut_ptr().cast::<u8>();
        // SAFETY: the input is `inp.1` readable bytes of the caller's slice; `aside` holds at
        // least as many and is this part's own.
        unsafe { std::ptr::copy_nonoverlapping(inp.0.cast_const(), aside, inp.1) };
        inp.0 = aside;
    }
    let mut bufs: Vec<(*mut u8, usize)> = Vec::with_capacity(2 + p.scratch.len());
    bufs.push(inp);
    bufs.push(out);
    bufs.extend(p.scratch.iter().map(|&(a, b)| (a as *mut u8, b)));
    // SAFETY: the input is the caller's shared slice (or this part's copy of it) and only
    // read (the cached plan was checked out of place, so no op writes an input); the output
    // is the caller's exclusive slice; the scratch buffers are the cached plan's, held by
    // this part, and of them only this rank's (each scratch buffer has one owner, so no
    // other rank's part touches them); all are disjoint (checked above) and stay borrowed
    // until the run returns, which waits for every step of the flag lane (host lanes run
    // their steps on this thread).
    let mut mem = unsafe { HostMemory::new(&p.program, &bufs, staging)? };
    run(&p.program, &mut mem, end)
}
