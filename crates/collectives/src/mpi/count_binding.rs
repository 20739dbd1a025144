//! Count binding for the typed v-collectives of an [`MpiCommunicator`] (all_gather_v,
//! all_to_all_v), on host memory (`typed.rs`) and on its GPU ranks (`gpu.rs`, their
//! mirrors' copies resized to the bound buffers): one plan per communicator and
//! *capacity*, planned, proved and cut into this rank's schedule once, with each call's
//! counts bound into that schedule when the call is made ([`crate::exec::counts`] has the rules and why the bound schedule
//! keeps the capacity plan's proof). A count matrix that changes every call neither re-plans
//! nor grows the plan cache.
//!
//! The capacity comes from the agreement (every rank's descriptor carries its largest
//! count). Every rank binds the same counts: all_gather_v's list is every rank's own,
//! checked against the contributions by the agreement; all_to_all_v's matrix is all-gathered
//! (each rank's send and receive counts, paired up as on a miss of an exact plan): they come
//! with the agreement's words up to [`super::call_agreement::INLINE_COUNTS_MAX_RANKS`] ranks,
//! beyond in one more `MPI_Iallgather` of `2 x ranks` words per rank. Both ends of a
//! message cut it alike from the same counts, so messages still pair in order. A call whose
//! descriptors (counts hashed) equal those of the call the schedule was last bound for runs
//! that schedule as it is: no gather, no binding, as an exact plan is reused on the same
//! hashes.

use relaycc_route::Plan;

use super::call_agreement::{COUNT, LARGEST, WORDS, row_words};
use super::schedule::RankSchedule;
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::call::CallDesc;
use crate::exec::counts::{CallCounts, CountLayout, CountPieces, VCollective};

/// First word of a capacity plan's cache key: exact keys start with a collective's code
/// (never negative), so the two kinds of key never meet.
const CAPACITY_KEY: i64 = -1;

/// An agreed v-collective call's capacity layout, from the agreement alone (every rank's
/// largest count is a word of its descriptor).
#[derive(Debug, Clone, Copy)]
pub(super) struct VShape {
    /// The capacity layout that serves the call's counts.
    pub(super) layout: CountLayout,
}

impl VShape {
    /// The plan cache's key of the capacity plan: the collective, the element type and the
    /// capacity; no count.
    pub(super) fn key(&self, call: &CallDesc) -> Vec<i64> {
        vec![
            CAPACITY_KEY,
            call.collective as i64,
            call.dtype as i64,
            call.dtype.size() as i64,
            self.layout.capacity as i64,
        ]
    }
}

/// An agreed v-collective call's counts, the same on every rank.
#[derive(Debug, Default)]
pub(super) struct VCounts {
    /// In the layout's order: all_gather_v's contribution of each rank, all_to_all_v's
    /// matrix row by row (`s x ranks + d` from `s` to `d`).
    counts: Vec<u64>,
    /// Elements of this rank's packed input and output.
    input_elems: u64,
    output_elems: u64,
}

/// A capacity plan cut for count binding, with this rank's schedule bound to the last call's
/// counts (its memory reused from call to call).
#[derive(Debug)]
pub(super) struct CountBinding {
    plan: Plan,
    /// The capacity layout in the plan's elements.
    layout: CountLayout,
    /// Plan elements per element of the call.
    scale: u64,
    /// Bytes per element of the call.
    call_esize: u64,
    pieces: CountPieces,
    /// The call's counts ([`MpiCommunicator::call_counts`] fills them; memory kept from call
    /// to call).
    call: VCounts,
    /// The call's counts in the plan's elements (memory kept from call to call).
    scaled: Vec<u64>,
    /// The exact key (every rank's descriptor, its counts hashed) of the call `bound` serves;
    /// empty while it serves none.
    bound_for: Vec<i64>,
    counts: CallCounts,
    bound: RankSchedule,
}

impl CountBinding {
    /// `plan`, the capacity plan of `layout` (in the call's elements, of `call_esize`
    /// bytes) whose part for this rank is `schedule`, cut for binding; `None` when a plan
    /// cannot be bound ([`CountPieces::new`] says why; its calls then run plans of their
    /// exact counts).
    pub(super) fn new(
        plan: Plan,
        layout: CountLayout,
        call_esize: u64,
        schedule: &RankSchedule,
    ) -> Option<Self> {
        // The rank-space planner plans exchanges in bytes: the layout and the counts are
        // bound in the plan's elements.
        let plan_esize = plan.dtype.size();
        if plan_esize == 0 || !call_esize.is_multiple_of(plan_esize) {
            return None;
        }
        let scale = call_esize / plan_esize;
        let layout = CountLayout {
            capacity: layout.capacity.checked_mul(scale)?,
            ..layout
        };
        let pieces = CountPieces::new(&plan, layout).ok()?;
        Some(CountBinding {
            plan,
            layout,
            scale,
            call_esize,
            pieces,
            call: VCounts::default(),
            scaled: Vec::new(),
            bound_for: Vec::new(),
            counts: CallCounts::default(),
            bound: schedule.clone(),
        })
    }

    /// True when the bound schedule serves the call of `exact_key` (the same counts as the
    /// call it was bound for: their hashes are part of the key, as they are of an exact
    /// plan's).
    pub(super) fn serves(&self, exact_key: &[i64]) -> bool {
        !self.bound_for.is_empty() && self.bound_for == exact_key
    }

    /// The schedule bound by the last [`CountBinding::bind`].
    pub(super) fn bound(&self) -> &RankSchedule {
        &self.bound
    }

    /// The counts the next [`CountBinding::bind`] binds, for
    /// [`MpiCommunicator::call_counts`] to fill.
    pub(super) fn counts_mut(&mut self) -> &mut VCounts {
        &mut self.call
    }

    /// `capacity` (this rank's part of the capacity plan) bound to the counts of
    /// [`CountBinding::counts_mut`], for the call of `exact_key`: its messages and local ops cut to the live elements, its input
    /// and output the packed buffers of the call.
    ///
    /// Errors: counts of another layout, or packed buffers past `usize` (before any data
    /// moves, the same on every rank).
    pub(super) fn bind(
        &mut self,
        capacity: &RankSchedule,
        exact_key: &[i64],
    ) -> MpiResult<&RankSchedule> {
        self.bound_for.clear();
        let scale = self.scale;
        self.scaled.clear();
        for c in &self.call.counts {
            let Some(c) = c.checked_mul(scale) else {
                return Err(MpiError::CountMismatch(format!(
                    "a count of {c} elements is past 2^64 bytes"
                )));
            };
            self.scaled.push(c);
        }
        self.counts.set(&self.layout, &self.scaled)?;
        self.pieces.bind_rank_program(
            &self.plan,
            &capacity.program,
            &self.counts,
            &mut self.bound.program,
        )?;
        let esize = self.call_esize;
        let bytes = |elems: u64| {
            elems
                .checked_mul(esize)
                .and_then(|b| usize::try_from(b).ok())
                .ok_or_else(|| {
                    MpiError::Unsupported(format!(
                        "{elems} elements of {esize} bytes do not fit this machine's memory"
                    ))
                })
        };
        let (input, output) = (
            bytes(self.call.input_elems)?,
            bytes(self.call.output_elems)?,
        );
        self.bound.input_len = input;
        self.bound.output_len = output;
        if let [i, o, ..] = self.bound.program.binding_bytes.as_mut_slice() {
            (*i, *o) = (input as u64, output as u64);
        }
        self.bound_for.extend_from_slice(exact_key);
        Ok(&self.bound)
    }
}

impl MpiCommunicator {
    /// The capacity layout of an agreed all_gather_v, reduce_scatter_v or all_to_all_v call
    /// (`all`: every rank's descriptor), the same on every rank; `None` for any other
    /// collective.
    pub(super) fn agreed_shape(&self, call: &CallDesc, all: &[i64]) -> Option<VShape> {
        let collective = VCollective::of(call.collective)?;
        let largest = all
            .chunks(row_words(self.size as usize))
            .map(|d| u64::try_from(d[LARGEST]).unwrap_or(0))
            .max()
            .unwrap_or(0);
        Some(VShape {
            layout: CountLayout {
                collective,
                ranks: self.size,
                capacity: CountLayout::capacity_for(largest),
            },
        })
    }

    /// The capacity plan of an agreed v-collective call of `shape` (the host ranks' and the
    /// GPU ranks'): the call's ranks, element type, op and root, with the capacity for every
    /// count; proved by the checker.
    pub(super) fn capacity_plan(&self, call: &CallDesc, shape: VShape) -> MpiResult<Plan> {
        let call_ranks = call.request((0..self.size).collect(), Vec::new());
        self.plan_request(&shape.layout.capacity_request(&call_ranks))
    }

    /// The counts of an agreed v-collective call of `shape` into `into`, the same on every
    /// rank: all_gather_v's and reduce_scatter_v's from the descriptors (each rank's own
    /// count), all_to_all_v's matrix from the descriptors
    /// on small communicators (paired up here), else all-gathered
    /// ([`MpiCommunicator::gathered_matrix`]).
    ///
    /// Errors: counts that do not pair up (all_to_all_v), or that add up past `u64`; the
    /// same on every rank.
    pub(super) fn call_counts(
        &self,
        call: &CallDesc,
        all: &[i64],
        shape: VShape,
        into: &mut VCounts,
    ) -> MpiResult<()> {
        let (n, me) = (self.size as usize, self.rank as usize);
        let row = row_words(n);
        let counts = &mut into.counts;
        counts.clear();
        let (input, output) = match shape.layout.collective {
            VCollective::AllToAllV => {
                if !(row > WORDS && inline_matrix(all, row, n, counts)) {
                    // Past the inline limit, or counts that do not pair up (the error names
                    // them as the in-process meeting does).
                    counts.clear();
                    counts.extend(self.gathered_matrix(call, all)?.into_iter().flatten());
                }
                let column = (0..n).map(|s| counts.get(s * n + me).copied().unwrap_or(0));
                let mine = counts.get(me * n..(me + 1) * n).unwrap_or(&[]);
                (checked_sum(mine.iter().copied()), checked_sum(column))
            }
            VCollective::AllGatherV | VCollective::ReduceScatterV => {
                counts.extend(contributions(all, n));
                let (own, total) = (counts.get(me).copied(), checked_sum(counts.iter().copied()));
                // all_gather_v gives its own block and takes them all; reduce_scatter_v gives
                // every block and takes its own.
                if shape.layout.collective == VCollective::AllGatherV {
                    (own, total)
                } else {
                    (total, own)
                }
            }
        };
        let (Some(input), Some(output)) = (input, output) else {
            return Err(MpiError::CountMismatch(format!(
                "the counts of {} add up past 2^64 elements",
                call.collective.name()
            )));
        };
        (into.input_elems, into.output_elems) = (input, output);
        Ok(())
    }
}

/// all_to_all_v's matrix, row by row, from the send counts in every rank's descriptor (`all`,
/// `row` words each, [`row_words`]) into `counts`; true when every rank's receive counts
/// there are what the ranks send it.
fn inline_matrix(all: &[i64], row: usize, n: usize, counts: &mut Vec<u64>) -> bool {
    for d in all.chunks(row) {
        match d.get(WORDS..WORDS + n) {
            Some(s) => counts.extend(s.iter().map(|c| *c as u64)),
            None => return false,
        }
    }
    counts.len() == n * n
        && all.chunks(row).enumerate().all(|(r, d)| {
            d.get(WORDS + n..WORDS + 2 * n).is_some_and(|recvs| {
                recvs
                    .iter()
                    .enumerate()
                    .all(|(s, c)| counts.get(s * n + r) == Some(&(*c as u64)))
            })
        })
}

/// Every rank's own count of an agreed all_gather_v or reduce_scatter_v, as its descriptor
/// gave it.
pub(super) fn contributions(all: &[i64], ranks: usize) -> impl Iterator<Item = u64> + '_ {
    all.chunks(row_words(ranks)).map(|d| d[COUNT] as u64)
}

/// The sum of `counts`, `None` past `u64`.
fn checked_sum(mut counts: impl Iterator<Item = u64>) -> Option<u64> {
    counts.try_fold(0u64, |a, c| a.checked_add(c))
}
