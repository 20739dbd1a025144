//! The host calls of an [`MpiCommunicator`], its [`crate::Collectives`] (the typed
//! collectives): each process passes its own host buffers (`&[T]`, `&mut [T]`, `Vec<T>`,
//! [`super::SharedHostBuffer`]), as with `MPI_Allreduce` or `ncclAllReduce`. The front door
//! (`runner.rs`) maps each operation of a group onto a checked call; this file runs it on the
//! lent host memory.
//!
//! A call goes through four steps:
//! 1. **Local checks**, the single-process API's: buffer lengths against the collective's
//!    layout, a root that is a rank, `Avg` only on floating types, counts per rank, host
//!    memory (a device buffer is this rank's local error).
//! 2. **Agreement** before any data moves: every rank's call descriptor (collective, element
//!    type and size, op, root, count, a hash of its per-rank counts, its sequence number, and
//!    whether its local checks passed) is all-gathered in one nonblocking `MPI_Iallgather`
//!    bounded by the communicator's timeout ([`super::agree`]). Every rank then holds the
//!    same descriptors and reaches the same verdict: a mismatch is the same error on every
//!    rank, a local failure is that rank's error there and [`MpiError::Peer`] elsewhere, a
//!    peer that does not take part is [`MpiError::Absent`], naming it and the call (its
//!    collective and sequence number). Mismatches move no data and leave the communicator
//!    usable.
//! 3. **Plan once per shape**: the agreed descriptors key a cache (all_gather_v and
//!    all_to_all_v: their capacity, with each call's counts bound into the capacity plan's
//!    schedule, [`super::count_binding`]). On a miss the request is
//!    built in rank space (ranks `0..n` are the processes), planned by route's rank-space
//!    planner, proved by `relaycc_route::check`, and cut into this rank's [`RankSchedule`] with
//!    its run buffers; the ranks agree on the outcome and the shape's weight (the largest
//!    run memory of any rank's part). The cache is bounded by the crate's one eviction rule
//!    ([`crate::plan_cache::lru::Lru`]) under limits set collectively, so with agreed keys and
//!    weights every rank keeps the same shapes: all ranks miss, and evict, together.
//! 4. **Run** through the one per-rank executor ([`RankSchedule::run_at`]): cross-rank copies are
//!    MPI messages, local copies and reductions run here. With owned buffers (the default)
//!    the input is copied into the cached run buffers and the output copied out; zero copy
//!    ([`MpiCommunicator::set_zero_copy`]) runs in the caller's slices. A failed run fails
//!    the communicator, as `execute` does.
//!
//! Point to point (`send`, `recv`) agrees pairwise instead: the sender's descriptor (count,
//! element type, sequence number of the pair) goes to the receiver, which answers whether it
//! matches, on a communicator of their own, before the data message.
//!
//! The call and its local checks are in [`super::typed_call`], the agreement in
//! [`super::call_agreement`], point to point in [`super::point_to_point`].

use std::ops::Range;

use ::mpi::ffi;
use ::mpi::traits::AsRaw;
use relaycc_route::{Collective, Location, Plan, Request};

use super::agree::{self, AgreementCollective};
use super::call_agreement::{AGREE, SEQ, WORDS, row_words};
use super::count_binding::{CountBinding, VShape, contributions};
use super::requests::Requests;
use super::roll_call::WaitPoint;
use super::schedule::{RankSchedule, RunBuffers};
use super::typed_call::{CheckedCall, InputAt};
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::call::{CallDesc, RankDesc};
use crate::plan_cache::lru::{Held, Lru};
use crate::rank::{Lender, View};

/// One cached shape: this rank's schedule, its run buffers and requests.
#[derive(Debug)]
pub(super) struct PreparedShape {
    pub(super) schedule: RankSchedule,
    pub(super) bufs: RunBuffers,
    pub(super) reqs: Requests,
    /// The plan's algorithm, for [`MpiCommunicator::last_algorithm`].
    pub(super) algorithm: String,
    /// What the shape counts against the plan cache's byte limit: the largest run memory of
    /// any rank's part (agreed), or this rank's own for a send/recv pair.
    pub(super) weight: u64,
    /// A v-collective's capacity plan, cut for count binding; `None` for every other shape.
    pub(super) binding: Option<Box<CountBinding>>,
}

impl Held for PreparedShape {
    fn held_bytes(&self) -> u64 {
        self.weight
    }
}

/// Where a call's input is.
enum Input<'a> {
    /// A buffer of its own.
    Slice(&'a [u8]),
    /// Elements of the output buffer (in place).
    InOutput(Range<usize>),
}

/// The host memory of `view` (elements of `esize` bytes) in what `lender` lent, as an
/// address and a length in bytes; an error for device memory or a view outside its block.
pub(super) fn host_bytes(
    lender: &Lender<'_>,
    view: View,
    esize: usize,
    rank: u32,
) -> MpiResult<(usize, usize)> {
    let bad = |why: &str| MpiError::Unsupported(format!("rank {rank}: {why}"));
    let span = lender
        .spans()
        .get(view.block)
        .ok_or_else(|| bad("a view of a buffer the call did not lend"))?;
    if span.device.is_some() {
        return Err(bad(
            "a device buffer in a host call: make a GPU rank (MpiGpu::new) and call \
             through MpiGpu::on(&stream)",
        ));
    }
    let esize = esize as u64;
    let start = view.offset.checked_mul(esize);
    let bytes = view.len.checked_mul(esize);
    match (start, bytes) {
        (Some(start), Some(bytes)) if start.checked_add(bytes).is_some_and(|e| e <= span.bytes) => {
            Ok((span.addr + start as usize, bytes as usize))
        }
        _ => Err(bad("a view past the end of its buffer")),
    }
}

/// The bytes at `(addr, len)` (from [`host_bytes`]); empty for none.
///
/// # Safety
/// `(addr, len)` is host memory lent to the running call and borrowed by it, shared, for at
/// least `'a`; nothing writes it meanwhile.
pub(super) unsafe fn lent<'a>((addr, len): (usize, usize)) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// The bytes at `(addr, len)` (from [`host_bytes`]), writable; empty for none.
///
/// # Safety
/// `(addr, len)` is host memory lent to the running call and borrowed by it uniquely for at
/// least `'a`; nothing else reads or writes it meanwhile.
pub(super) unsafe fn lent_mut<'a>((addr, len): (usize, usize)) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

impl MpiCommunicator {
    /// One collective on host memory (a call of [`crate::Collectives`] on this communicator):
    /// the local checks' verdict `shape` with what `lender` lent (`vin`: a separate input;
    /// `vout`: the output, holding the input when in place), through steps 2 to 4 of the
    /// module docs. A lent buffer that is not host memory is this rank's local error, agreed
    /// like any other.
    pub(super) fn host_call(
        &self,
        shape: CheckedCall,
        lender: &mut Lender<'_>,
        vin: Option<View>,
        vout: Option<View>,
    ) -> MpiResult<()> {
        let CheckedCall {
            call,
            mut local,
            input,
            input_used,
            output_used,
        } = shape;
        if local.is_ok()
            && let Some(e) = lender.take_error()
        {
            local = Err(MpiError::Backend(e));
        }
        let esize = call.dtype.size() as usize;
        let mut resolve = |v: Option<View>, used: bool| -> (usize, usize) {
            match v
                .filter(|_| used)
                .map(|v| host_bytes(lender, v, esize, self.rank))
            {
                Some(Ok(at)) => at,
                Some(Err(e)) => {
                    if local.is_ok() {
                        local = Err(e);
                    }
                    (0, 0)
                }
                None => (0, 0),
            }
        };
        let separate = matches!(input, InputAt::Separate);
        let (in_addr, in_len) = resolve(vin, separate && input_used);
        let (out_addr, out_len) = resolve(vout, output_used);
        // SAFETY: each is a host span the caller lent for this call (`host_bytes` checked
        // the view against its span), borrowed by the call's group for longer than this
        // function runs: the input shared, the output unique. They cannot overlap: a
        // separate input and the output are different buffers, which Rust's borrows keep
        // apart; in place there is no separate input.
        let (src, out) = unsafe { (lent((in_addr, in_len)), lent_mut((out_addr, out_len))) };
        let inp = match input {
            InputAt::Separate => Input::Slice(src),
            InputAt::InOutput(r) => Input::InOutput(r),
        };
        self.collective(call, local, inp, out, esize)
    }

    /// The algorithm of the plan the last collective call ran (`rank-space direct`,
    /// `rank-space Standard`, ...), or `None` before the first.
    pub fn last_algorithm(&self) -> Option<String> {
        let last = self.last_algorithm.borrow();
        (!last.is_empty()).then(|| last.clone())
    }

    /// Shapes the typed collectives keep planned (at most
    /// [`MpiCommunicator::plan_cache_limits`]' `max_plans`).
    pub fn cached_calls(&self) -> usize {
        self.calls.borrow().len()
    }

    /// Steps 1 to 4 of the module docs for one call.
    fn collective(
        &self,
        mut call: CallDesc,
        local: MpiResult<()>,
        input: Input<'_>,
        output: &mut [u8],
        esize: usize,
    ) -> MpiResult<()> {
        self.health.check()?;
        let (seq, local) = self.next_call(&call, local);
        let (key, all) = self.agreed(&mut call, local, seq)?;
        let v = self.agreed_shape(&call, &all);
        self.run_cached(&call, (key, &all, v), input, output, esize)
    }
    /// Remember the algorithm of the plan a call ran, for [`Self::last_algorithm`].
    pub(super) fn set_last_algorithm(&self, algorithm: &str) {
        let mut last = self.last_algorithm.borrow_mut();
        if *last != algorithm {
            algorithm.clone_into(&mut last);
        }
    }

    /// Plan on a miss (all ranks miss together), then run: a v-collective (`v`, its agreed
    /// counts) on its capacity plan with the counts bound, or on the plan of its exact counts
    /// (`key`) where the capacity plan cannot be bound; any other call on the plan of `key`.
    fn run_cached(
        &self,
        call: &CallDesc,
        (key, all, v): (Vec<i64>, &[i64], Option<VShape>),
        input: Input<'_>,
        out: &mut [u8],
        esize: usize,
    ) -> MpiResult<()> {
        let exact_key = key;
        let key = v.map_or_else(|| exact_key.clone(), |v| v.key(call));
        let mut cache = self.calls.borrow_mut();
        if !cache.touch(&key) {
            self.prepare_missing(&mut cache, &key, call, all, v)?;
        }
        let Some(p) = cache.peek_mut(&key) else {
            return Err(MpiError::Unsupported("a prepared shape vanished".into()));
        };
        if v.is_some() && p.binding.is_none() {
            // A capacity plan that cannot be bound (the same verdict on every rank): the plan
            // of the call's exact counts.
            drop(cache);
            return self.run_cached(call, (exact_key, all, None), input, out, esize);
        }
        let PreparedShape {
            schedule,
            bufs,
            reqs,
            algorithm,
            binding,
            ..
        } = p;
        self.set_last_algorithm(algorithm);
        let schedule: &RankSchedule = match (binding, v) {
            (Some(b), Some(_)) if b.serves(&exact_key) => b.bound(),
            (Some(b), Some(v)) => {
                self.call_counts(call, all, v, b.counts_mut())?;
                b.bind(schedule, &exact_key)?
            }
            _ => schedule,
        };
        let borrowed = self.zero_copy && !schedule.writes_input();
        let timeout = self.timeout.get();
        let shm = self.shm.as_ref();
        let ran = (|| {
            if out.len() != schedule.output_len {
                return Err(MpiError::Buffer {
                    side: "output",
                    got: out.len(),
                    needs: schedule.output_len,
                });
            }
            let src: &[u8] = match &input {
                Input::Slice(s) => s,
                Input::InOutput(r) => {
                    let bytes = r.start * esize..r.end * esize;
                    let inb = bufs.input_bytes(schedule)?;
                    let src = out.get(bytes).ok_or(MpiError::Buffer {
                        side: "input",
                        got: out.len(),
                        needs: r.end * esize,
                    })?;
                    if src.len() != inb.len() {
                        return Err(MpiError::Buffer {
                            side: "input",
                            got: src.len(),
                            needs: inb.len(),
                        });
                    }
                    // In place: the input is copied first, as the output overwrites it.
                    inb.copy_from_slice(src);
                    &[]
                }
            };
            let in_place = matches!(input, Input::InOutput(_));
            if !in_place && src.len() != schedule.input_len {
                return Err(MpiError::Buffer {
                    side: "input",
                    got: src.len(),
                    needs: schedule.input_len,
                });
            }
            if !borrowed {
                if !in_place {
                    bufs.input_bytes(schedule)?.copy_from_slice(src);
                }
                schedule.run_in(reqs, bufs, timeout, shm)?;
                out.copy_from_slice(bufs.output_bytes(schedule)?);
                return Ok(());
            }
            // Zero copy: messages read the caller's input and write its output.
            let in_ptr = if in_place {
                bufs.input_bytes(schedule)?.as_mut_ptr()
            } else {
                src.as_ptr().cast_mut()
            };
            // SAFETY: `in_ptr` holds `input_len` bytes (checked above, or the run buffer
            // `input_bytes` sized for the schedule), only read (`borrowed` excludes schedules
            // that write their input); `out` holds `output_len` bytes (checked above) and is
            // borrowed mutably for the call, so nothing else touches it; an input slice and
            // `out` cannot overlap (a shared and a mutable borrow), and neither overlaps the
            // run buffers. If the run fails with requests MPI keeps, the process ends below
            // before this function returns, so MPI never touches them after the borrows end;
            // a panic with requests posted ends the process too (below), since unwinding
            // would end the borrows while MPI still holds pointers into them.
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                schedule.run_at(reqs, in_ptr, out.as_mut_ptr(), bufs, timeout, shm)
            }));
            match run {
                Ok(r) => r,
                Err(panic) => {
                    if reqs.any_pending() {
                        eprintln!(
                            "relaycc: rank {}: a zero-copy run panicked with MPI requests \
                             into this call's buffers pending: aborting the job",
                            self.rank
                        );
                        self.abort(70)
                    }
                    std::panic::resume_unwind(panic)
                }
            }
        })();
        if let Err(e) = &ran
            && borrowed
            && let Some(stuck) = reqs.take_stuck()
        {
            eprintln!(
                "relaycc: rank {}: {e}; MPI keeps {} requests into this call's buffers (zero \
                 copy), which cannot outlive the call: aborting the job",
                self.rank,
                stuck.len()
            );
            self.abort(70)
        }
        self.health
            .settle(ran, reqs, || Box::new(std::mem::take(bufs)))
    }

    /// A shape every rank misses (the ranks' caches hold the same shapes), prepared and
    /// inserted under `key`: so every rank takes the same steps, room for one more shape
    /// before allocating, the request and plan (the same on every rank, so are their errors),
    /// this rank's part agreed with its bytes, then room for the agreed weight.
    fn prepare_missing(
        &self,
        cache: &mut Lru<Vec<i64>, PreparedShape>,
        key: &[i64],
        call: &CallDesc,
        all: &[i64],
        v: Option<VShape>,
    ) -> MpiResult<()> {
        let limits = self.plan_cache_limits();
        drop(cache.evict_to_fit(limits, 1, 0));
        let made = match v {
            Some(v) => self.prepare_capacity(call, v),
            None => self
                .request(call, all)
                .and_then(|req| self.prepare_request(&req, self.comm.as_raw())),
        }
        .map(|p| {
            let bytes = p.weight;
            (p, bytes)
        });
        let seq = all.get(SEQ).map_or(0, |s| *s as u64);
        let at = WaitPoint::call("prepare a collective call", call.collective, seq);
        let (mut p, weight) = super::agree_weighed(self, made, at)?;
        p.weight = weight;
        drop(cache.evict_to_fit(limits, 1, weight));
        cache.insert(key.to_vec(), p);
        Ok(())
    }

    /// The agreed request in rank space: ranks `0..n` are the processes.
    pub(super) fn request(&self, call: &CallDesc, all: &[i64]) -> MpiResult<Request> {
        let matrix = if call.collective == Collective::AllToAllV {
            self.gathered_matrix(call, all)?
        } else {
            Vec::new()
        };
        self.request_with(call, all, matrix)
    }

    /// An agreed all_to_all_v's matrix (`matrix[s][d]`): every rank's send and receive counts
    /// (inline in the agreed descriptors on small communicators, else all-gathered), paired up by the one check the in-process meeting
    /// makes too, so a rank that expects other counts than it is sent is the same
    /// [`MpiError::CountMismatch`] on every rank.
    pub(super) fn gathered_matrix(&self, call: &CallDesc, all: &[i64]) -> MpiResult<Vec<Vec<u64>>> {
        let n = self.size as usize;
        let row = row_words(n);
        let got: Vec<i64> = if row > WORDS {
            // In every rank's descriptor, after its fixed words.
            all.chunks(row).flat_map(|d| &d[WORDS..]).copied().collect()
        } else {
            let words: Vec<i64> = call
                .counts
                .iter()
                .chain(&call.recv_counts)
                .map(|c| *c as i64)
                .collect();
            let seq = all.get(SEQ).map_or(0, |s| *s as u64);
            let at = WaitPoint::call(AGREE, call.collective, seq);
            agree::collective(self, at, AgreementCollective::AllGather, words)?
        };
        let counts = |r: &[i64]| -> Vec<u64> { r.iter().map(|c| *c as u64).collect() };
        let descs: Vec<CallDesc> = got
            .chunks(2 * n)
            .map(|row| CallDesc {
                counts: counts(&row[..n]),
                recv_counts: counts(&row[n..]),
                ..call.clone()
            })
            .collect();
        let rows: Vec<RankDesc<'_>> = descs
            .iter()
            .enumerate()
            .map(|(r, d)| (r, Some(d)))
            .collect();
        crate::call::matrix(&rows).map_err(MpiError::CountMismatch)
    }

    /// The agreed request with an all_to_all_v's `matrix` (empty for other collectives).
    pub(super) fn request_with(
        &self,
        call: &CallDesc,
        all: &[i64],
        matrix: Vec<Vec<u64>>,
    ) -> MpiResult<Request> {
        let n = self.size as usize;
        let mut req = call.request((0..n as u32).collect(), matrix);
        if call.collective.counts_per_rank() {
            // The own counts as every rank sent them, word for word: each rank's list was
            // compared with them by its hash only.
            req.counts = contributions(all, n).collect();
        }
        req.validate()?;
        Ok(req)
    }

    /// Plan, check and schedule `req` for this rank, with requests on `comm`.
    pub(super) fn prepare_request(
        &self,
        req: &Request,
        comm: ffi::MPI_Comm,
    ) -> MpiResult<PreparedShape> {
        let plan = self.plan_request(req)?;
        self.prepare_plan(&plan, comm)
    }

    /// The capacity plan of an agreed v-collective (`v`, its counts), scheduled for this rank
    /// and cut for count binding ([`CountBinding`]; none where it cannot be bound).
    fn prepare_capacity(&self, call: &CallDesc, v: VShape) -> MpiResult<PreparedShape> {
        let plan = self.capacity_plan(call, v)?;
        let mut p = self.prepare_plan(&plan, self.comm.as_raw())?;
        p.binding = CountBinding::new(plan, v.layout, call.dtype.size(), &p.schedule).map(Box::new);
        if p.binding.is_none() {
            // Never run (its calls run plans of their exact counts): the entry only remembers
            // the verdict, the same on every rank, and holds no memory.
            p.bufs = RunBuffers::default();
            p.weight = 0;
        }
        Ok(p)
    }

    /// Schedule a proved `plan` for this rank, with requests on `comm`.
    pub(super) fn prepare_plan(
        &self,
        plan: &Plan,
        comm: ffi::MPI_Comm,
    ) -> MpiResult<PreparedShape> {
        let schedule = RankSchedule::new(plan, self.rank, &|l| match l {
            Location::Gpu(r) => Some(r),
            Location::Host(_) => None,
        })?;
        let shared = self.shm.as_ref().is_some_and(|s| s.maps_shared_buffers());
        let bufs = RunBuffers::new(&schedule, shared);
        let weight = schedule.run_bytes();
        Ok(PreparedShape {
            schedule,
            bufs,
            reqs: Requests::new(comm, self.rank),
            algorithm: plan.algorithm.clone(),
            weight,
            binding: None,
        })
    }

    /// The plan of an agreed request in rank space, proved by the checker: exchanges by
    /// [Lockhart-2023]'s model, the others direct (module docs, step 3).
    pub(super) fn plan_request(&self, req: &Request) -> MpiResult<Plan> {
        let plan = relaycc_route::planner::ranks::plan(req, &self.rank_space(), None)?;
        // Proves every output element gets exactly what the request names before a message
        // moves; deterministic, so every rank reaches the same verdict.
        relaycc_route::check(&plan)?;
        Ok(plan)
    }
}
