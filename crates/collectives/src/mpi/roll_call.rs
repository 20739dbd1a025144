//! The roll call: who is missing when a collective step of a communicator times out, and
//! where they wait instead.
//!
//! A nonblocking MPI collective that does not complete says nothing about who has not
//! joined it. So every collective step of [`agree`](super::agree) knows where it is (a
//! [`WaitPoint`]: the step, and for a typed call its collective and sequence number), and:
//!
//! 1. **Serves**: a wait that has lasted [`SERVE_AFTER`] (never a step that completes at
//!    once) also looks for queries on the communicator's roll communicator (a private
//!    duplicate of its own, tags [`TAG_QUERY`] and [`TAG_ANSWER`]), and answers each with
//!    where it waits. A query about its own place means a peer gave up on this very step,
//!    which then cannot complete for anyone: the wait calls the roll itself at once.
//! 2. **Calls the roll** once it has waited the timeout less the roll call's grace
//!    ([`grace`]: a quarter of the timeout, at most [`ROLL_CALL_GRACE_MAX`]): it gives the
//!    step up, asks every other rank where it waits (one small message each) and collects the
//!    answers for the grace, answering others' queries meanwhile. Ranks that answered with
//!    this place, or asked about it, are here; ranks that answered another place wait
//!    elsewhere; the rest did not arrive.
//!
//! Every rank at the step learns of the roll call from the first query and calls its own, so
//! all of them return [`MpiError::Absent`] naming the same missing ranks, the first within
//! the timeout and the others within one grace after it (within their own timeouts, since
//! they came later). The step's collective request goes to the graveyard as for any timeout
//! (`agree.rs`), and the communicator is failed. Roll calls happen at most once per rank and
//! communicator (a failed communicator makes no more collective steps), so the queries and
//! answers a rank leaves behind are bounded by the communicator's size: a query to a rank
//! that never reads it stays in MPI's unexpected queue; an answer's send that has not
//! completed goes to the graveyard with its words.

use std::os::raw::c_int;
use std::time::{Duration, Instant};

use ::mpi::ffi;
use ::mpi::traits::AsRaw;
use relaycc_route::Collective;

use super::requests::SPINS_BEFORE_YIELD;
use super::{MpiCommunicator, MpiError, MpiResult};

/// Tag of a query on the roll communicator: "where do you wait?".
pub(super) const TAG_QUERY: c_int = 1;
/// Tag of an answer: this rank's place.
pub(super) const TAG_ANSWER: c_int = 2;

/// A wait looks for queries once it has lasted this long, so steps that complete in time
/// pay nothing for the roll call.
pub(super) const SERVE_AFTER: Duration = Duration::from_millis(1);

/// The longest a roll call waits for answers: ranks at a step poll while they wait and answer
/// within milliseconds, also with more ranks than cores.
pub(super) const ROLL_CALL_GRACE_MAX: Duration = Duration::from_millis(500);

/// The roll call's grace within a step's `timeout`: a quarter of it, at most
/// [`ROLL_CALL_GRACE_MAX`]. The step waits for its peers for the rest.
pub(super) fn grace(timeout: Duration) -> Duration {
    (timeout / 4).min(ROLL_CALL_GRACE_MAX)
}

/// Bytes of a step's name carried in a place's words (longer names are cut).
const NAME_BYTES: usize = 64;
/// Words of a place: sequence number, collective code (-1: none), the step's name hash, then
/// the step's name.
const WORDS: usize = 3 + NAME_BYTES / 8;

/// Where a rank waits: a collective step of its communicator and, for a typed call, the
/// collective and the call's sequence number.
#[derive(Debug, Clone, Copy)]
pub(super) struct WaitPoint {
    /// The step (`agree on a collective call`, `meet at a barrier`, `prepare a plan`).
    pub step: &'static str,
    /// The typed call the step belongs to: its collective and sequence number.
    pub call: Option<(Collective, u64)>,
}

impl WaitPoint {
    /// A step of the typed call `seq`, a `collective`.
    pub(super) fn call(step: &'static str, collective: Collective, seq: u64) -> Self {
        WaitPoint {
            step,
            call: Some((collective, seq)),
        }
    }

    /// The words of this place on `comm`: a step outside a typed call counts the typed calls
    /// made so far, so two ranks at one barrier after the same calls are at one place.
    fn words(&self, comm: &MpiCommunicator) -> [i64; WORDS] {
        let mut w = [0i64; WORDS];
        let (coll, seq) = match self.call {
            Some((c, s)) => (c as i64, s),
            None => (-1, comm.calls_made()),
        };
        w[0] = seq as i64;
        w[1] = coll;
        w[2] = super::agree::text_hash(std::iter::once(self.step));
        let mut name = [0u8; NAME_BYTES];
        let len = self.step.len().min(NAME_BYTES);
        name[..len].copy_from_slice(&self.step.as_bytes()[..len]);
        for (k, chunk) in name.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w[3 + k] = i64::from_le_bytes(b);
        }
        w
    }
}

impl From<&'static str> for WaitPoint {
    fn from(step: &'static str) -> Self {
        WaitPoint { step, call: None }
    }
}

/// A place's words as an error names it: `all_reduce, call #3`, or the step and the typed
/// calls made before it (`meet at a barrier, after 3 collective calls`).
fn describe(w: &[i64]) -> String {
    if let Some(c) = Collective::ALL.iter().find(|c| **c as i64 == w[1]) {
        return format!("{}, call #{}", c.name(), w[0]);
    }
    let bytes: Vec<u8> = w[3..].iter().flat_map(|v| v.to_le_bytes()).collect();
    let name = String::from_utf8_lossy(&bytes);
    format!(
        "{}, after {} collective calls",
        name.trim_end_matches('\0'),
        w[0]
    )
}

/// What the step names in an error: the collective of a typed call (its name and number go
/// in [`MpiError::Absent`]'s fields), else the step.
fn step_name(at: &WaitPoint) -> &'static str {
    at.call.map_or(at.step, |(c, _)| c.name())
}

/// The MPI error of `call` on this rank.
fn mpi_err(comm: &MpiCommunicator, call: &'static str, code: c_int) -> MpiError {
    super::requests::call_error(comm.rank, call, code)
}

/// Answer every query waiting on `comm`'s roll communicator with `at`'s place. Returns the
/// ranks that asked about this very place (they gave up on it).
pub(super) fn serve(comm: &MpiCommunicator, at: &WaitPoint) -> MpiResult<Vec<u32>> {
    let roll = comm.roll().as_raw();
    let mine = at.words(comm);
    let mut asked = Vec::new();
    loop {
        let mut flag: c_int = 0;
        // SAFETY: `MPI_Status` is a plain C struct of integers; all zeros is a valid value.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: the roll communicator is live; flag and status are out-parameters.
        let rc = unsafe {
            ffi::MPI_Iprobe(
                ffi::RSMPI_ANY_SOURCE,
                TAG_QUERY,
                roll,
                &mut flag,
                &mut status,
            )
        };
        if rc != ffi::MPI_SUCCESS as c_int {
            return Err(mpi_err(comm, "MPI_Iprobe", rc));
        }
        if flag == 0 {
            return Ok(asked);
        }
        let from = status.MPI_SOURCE;
        let mut query = [0i64; WORDS];
        // SAFETY: `query` holds WORDS words; the probed message (WORDS words from `from`) has
        // arrived, so the receive completes at once.
        let rc = unsafe {
            ffi::MPI_Recv(
                query.as_mut_ptr().cast(),
                WORDS as c_int,
                ffi::RSMPI_INT64_T,
                from,
                TAG_QUERY,
                roll,
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        if rc != ffi::MPI_SUCCESS as c_int {
            return Err(mpi_err(comm, "MPI_Recv", rc));
        }
        if query == mine {
            asked.push(from as u32);
        }
        let answer = Box::new(mine);
        // SAFETY: reading an MPI constant initialised by the library.
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `answer` lives on the heap until the send completes: it is dropped below
        // only once MPI reports the send complete, otherwise kept by the graveyard.
        let rc = unsafe {
            ffi::MPI_Isend(
                answer.as_ptr().cast(),
                WORDS as c_int,
                ffi::RSMPI_INT64_T,
                from,
                TAG_ANSWER,
                roll,
                &mut req,
            )
        };
        if rc != ffi::MPI_SUCCESS as c_int {
            return Err(mpi_err(comm, "MPI_Isend", rc));
        }
        let mut reqs = vec![req];
        if super::requests::test_each(&mut reqs) > 0 {
            comm.health().bury(reqs, answer);
        }
    }
}

/// Call the roll (step 2 of the module docs) at `at`, a step whose timeout is `after`;
/// `asked`: ranks already known to be at this place. Returns the step's error:
/// [`MpiError::Absent`] naming the ranks that are not here, or [`MpiError::Timeout`] when
/// every rank is (the step was slower than the timeout), or an MPI error.
pub(super) fn call_roll(
    comm: &MpiCommunicator,
    at: &WaitPoint,
    mut asked: Vec<u32>,
    after: Duration,
) -> MpiError {
    let (me, n) = (comm.rank, comm.size);
    let roll = comm.roll().as_raw();
    let mine = at.words(comm);
    // SAFETY: reading MPI constants initialised by the library.
    let (null, word) = unsafe { (ffi::RSMPI_REQUEST_NULL, ffi::RSMPI_INT64_T) };
    let query = Box::new(mine);
    let mut answers = vec![0i64; WORDS * n as usize].into_boxed_slice();
    let mut recvs = vec![null; n as usize];
    let mut sends = vec![null; n as usize];
    for p in (0..n).filter(|p| *p != me) {
        let at_p = p as usize;
        // SAFETY: each receive writes its own WORDS words of `answers`, each send reads
        // `query`; both boxes stay put on the heap and are kept until the requests complete
        // (below: dropped only when none is pending, else buried with them).
        let rc = unsafe {
            let r = ffi::MPI_Irecv(
                answers.as_mut_ptr().add(at_p * WORDS).cast(),
                WORDS as c_int,
                word,
                p as c_int,
                TAG_ANSWER,
                roll,
                &mut recvs[at_p],
            );
            if r != ffi::MPI_SUCCESS as c_int {
                r
            } else {
                ffi::MPI_Isend(
                    query.as_ptr().cast(),
                    WORDS as c_int,
                    word,
                    p as c_int,
                    TAG_QUERY,
                    roll,
                    &mut sends[at_p],
                )
            }
        };
        if rc != ffi::MPI_SUCCESS as c_int {
            let e = mpi_err(comm, "MPI_Irecv/MPI_Isend", rc);
            keep_until_done(comm, recvs, sends, Box::new((query, answers)));
            return e;
        }
    }
    let deadline = Instant::now() + grace(after);
    let mut heard = vec![false; n as usize];
    let mut spins = 0u32;
    loop {
        for (p, r) in recvs.iter_mut().enumerate() {
            if *r == null {
                continue;
            }
            let mut flag: c_int = 0;
            // SAFETY: a live request posted above; the status is ignored.
            unsafe { ffi::MPI_Test(r, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if flag != 0 {
                heard[p] = true;
                *r = null;
            }
        }
        if let Ok(more) = serve(comm, at) {
            asked.extend(more);
        }
        let all = (0..n).all(|p| p == me || heard[p as usize]);
        if all || Instant::now() > deadline {
            break;
        }
        spins += 1;
        if spins > SPINS_BEFORE_YIELD {
            std::thread::yield_now();
        }
    }
    let mut missing = Vec::new();
    let mut elsewhere = Vec::new();
    for p in (0..n).filter(|p| *p != me) {
        let w = &answers[p as usize * WORDS..(p as usize + 1) * WORDS];
        if asked.contains(&p) || (heard[p as usize] && w == mine) {
            continue;
        }
        missing.push(p);
        if heard[p as usize] {
            elsewhere.push(format!("rank {p} is at: {}", describe(w)));
        }
    }
    for r in recvs.iter_mut().filter(|r| **r != null) {
        // SAFETY: a live receive posted above; a cancelled one completes (tested below).
        unsafe { ffi::MPI_Cancel(r) };
    }
    keep_until_done(comm, recvs, sends, Box::new((query, answers)));
    if missing.is_empty() {
        return MpiError::Timeout {
            rank: me,
            step: at.step,
            level: 0,
            pending: 1,
            after,
        };
    }
    MpiError::Absent {
        rank: me,
        step: step_name(at),
        call: at.call.map(|(_, s)| s),
        missing,
        elsewhere,
        after,
    }
}

/// Keep `keep` (the words the requests use) until the roll call's requests complete: dropped
/// now when none is pending, else buried with them in the communicator's graveyard.
fn keep_until_done(
    comm: &MpiCommunicator,
    recvs: Vec<ffi::MPI_Request>,
    sends: Vec<ffi::MPI_Request>,
    keep: Box<dyn std::any::Any>,
) {
    let mut reqs: Vec<ffi::MPI_Request> = recvs.into_iter().chain(sends).collect();
    if super::requests::test_each(&mut reqs) > 0 {
        comm.health().bury(reqs, keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A place's words name a typed call by its collective and number, and any other step by
    /// its name.
    #[test]
    fn places_are_described_by_call_or_step() {
        let mut w = [0i64; WORDS];
        w[0] = 3;
        w[1] = Collective::AllReduce as i64;
        assert_eq!(describe(&w), "all_reduce, call #3");
        w[1] = -1;
        let name = b"meet at a barrier";
        let mut bytes = [0u8; NAME_BYTES];
        bytes[..name.len()].copy_from_slice(name);
        for (k, c) in bytes.chunks(8).enumerate() {
            w[3 + k] = i64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        }
        assert_eq!(describe(&w), "meet at a barrier, after 3 collective calls");
    }
}
