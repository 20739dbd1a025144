//! The collective steps before a run or a build: agreement on every rank's local result and
//! on values that must be equal on all ranks (element size, element type, a plan's hash), and
//! the exchanges of counts. Each is one nonblocking MPI collective, or on a communicator whose
//! ranks share one host's memory one step of the shared window's board (`shm_board.rs`: an
//! all-gather in shared memory, with the minimum or the all-to-all's blocks taken from it
//! here), polled against the communicator's timeout, so a peer that stopped or hangs before
//! the step makes it fail instead of hanging: with [`MpiError::Absent`] naming the ranks
//! that did not come and where they wait instead, found by a roll call (`roll_call.rs`), or
//! [`MpiError::Timeout`] when every rank came. A collective request cannot be cancelled: on a timeout it goes, with its
//! buffers, to the communicator's graveyard, and the communicator is failed.

use std::os::raw::c_int;
use std::time::{Duration, Instant};

use ::mpi::ffi;
use ::mpi::traits::AsRaw;

use super::requests::SPINS_BEFORE_YIELD;
use super::roll_call::{self, WaitPoint};
use super::shm_board::ShmBoard;
use super::{MpiCommunicator, MpiError, MpiResult};

/// The nonblocking collective of [`collective`].
#[derive(Debug, Clone, Copy)]
pub(super) enum AgreementCollective {
    /// `MPI_Iallreduce` with `MPI_MIN`: elementwise minimum over the ranks.
    Min,
    /// `MPI_Ialltoall`: `send` holds one equal block per rank; block s of the result is rank
    /// s's block for this rank.
    AllToAll,
    /// `MPI_Iallgather`: the result is every rank's `send`, in rank order.
    AllGather,
}

impl AgreementCollective {
    const ALL: [AgreementCollective; 3] = [
        AgreementCollective::Min,
        AgreementCollective::AllToAll,
        AgreementCollective::AllGather,
    ];

    fn call(self) -> &'static str {
        match self {
            AgreementCollective::Min => "MPI_Iallreduce",
            AgreementCollective::AllToAll => "MPI_Ialltoall",
            AgreementCollective::AllGather => "MPI_Iallgather",
        }
    }

    /// The step's kind on the board.
    fn code(self) -> u64 {
        match self {
            AgreementCollective::Min => 1,
            AgreementCollective::AllToAll => 2,
            AgreementCollective::AllGather => 3,
        }
    }

    /// What the step computes, in errors.
    fn what(self) -> &'static str {
        match self {
            AgreementCollective::Min => "a minimum",
            AgreementCollective::AllToAll => "an all-to-all",
            AgreementCollective::AllGather => "an all-gather",
        }
    }
}

/// Run `op` over the communicator's ranks with this rank's `send` (signed 64-bit words;
/// unsigned counts travel as their bit patterns) and wait for it until the communicator's
/// timeout. `at` names what the collective is for (a step, or a step of a typed call), in
/// errors and in the roll call.
///
/// Errors: [`MpiError::Absent`] when peers do not all take part in time (naming them), or
/// [`MpiError::Timeout`] when they all came but the step did not complete, an MPI error, or
/// a `send` MPI cannot count; all but the last fail the communicator (peers may be stuck in
/// the collective), and a request still pending is buried with its buffers.
pub(super) fn collective(
    comm: &MpiCommunicator,
    at: impl Into<WaitPoint>,
    op: AgreementCollective,
    send: Vec<i64>,
) -> MpiResult<Vec<i64>> {
    let at = at.into();
    let step = at.step;
    let n = comm.size as usize;
    let (count, recv_len) = match op {
        AgreementCollective::Min => (send.len(), send.len()),
        AgreementCollective::AllToAll if send.len().is_multiple_of(n.max(1)) => {
            (send.len() / n.max(1), send.len())
        }
        AgreementCollective::AllToAll => {
            return Err(MpiError::Unsupported(format!(
                "{step}: {} words do not split into {n} equal blocks",
                send.len()
            )));
        }
        AgreementCollective::AllGather => (send.len(), send.len().saturating_mul(n)),
    };
    if let Some(seg) = comm.shm.as_ref().filter(|_| ShmBoard::fits(send.len())) {
        return on_board(comm, seg.board(), &at, op, &send, count);
    }
    let count = c_int::try_from(count).map_err(|_| {
        MpiError::Unsupported(format!("{step}: {count} words, over MPI's int count"))
    })?;
    let mut recv = vec![0i64; recv_len];
    let raw = comm.comm().as_raw();
    // SAFETY: reading MPI constants initialised by the library.
    let (mut req, word, min) =
        unsafe { (ffi::RSMPI_REQUEST_NULL, ffi::RSMPI_INT64_T, ffi::RSMPI_MIN) };
    let (sp, rp) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
    // SAFETY: `send` holds `count` words (per rank for all-to-all) and `recv` the result's
    // `recv_len`, both on the heap, so they stay put when the vectors move. Neither is read or
    // written by this rank until the request completes: `wait` returns `Ok` only then, and
    // otherwise a pending request is buried with both vectors, which are then never freed
    // while MPI may use them.
    let rc = unsafe {
        match op {
            AgreementCollective::Min => {
                ffi::MPI_Iallreduce(sp, rp, count, word, min, raw, &mut req)
            }
            AgreementCollective::AllToAll => {
                ffi::MPI_Ialltoall(sp, count, word, rp, count, word, raw, &mut req)
            }
            AgreementCollective::AllGather => {
                ffi::MPI_Iallgather(sp, count, word, rp, count, word, raw, &mut req)
            }
        }
    };
    match wait_at(comm, &at, op.call(), rc, &mut req) {
        Ok(()) => Ok(recv),
        Err(e) => {
            let health = comm.health();
            health.fail(&e);
            // SAFETY: reading an MPI constant initialised by the library.
            if req != unsafe { ffi::RSMPI_REQUEST_NULL } {
                health.bury(vec![req], Box::new((send, recv)));
            }
            Err(e)
        }
    }
}

/// [`collective`] on the shared window's board: this rank's `send` posted, every rank's
/// gathered once all posted (polled as an MPI step is, with the roll call), then reduced to
/// `op`'s result; `count`: words per all-to-all block. Errors fail the communicator (peers may
/// wait at this step for ever, as in an MPI collective); nothing is left to bury.
fn on_board(
    comm: &MpiCommunicator,
    board: &ShmBoard,
    at: &WaitPoint,
    op: AgreementCollective,
    send: &[i64],
    count: usize,
) -> MpiResult<Vec<i64>> {
    let n = comm.size as usize;
    let posted = board.post(op.code(), send);
    let mut all = vec![0i64; send.len() * n];
    let gathered = wait_polling(comm, at, || {
        board.gather(&posted, &mut all).map_err(|other| {
            let theirs = AgreementCollective::ALL
                .into_iter()
                .find(|c| c.code() == other.kind)
                .map_or("another step", AgreementCollective::what);
            MpiError::CallMismatch(format!(
                "{}: rank {} takes {theirs} of {} words where rank {} takes {} of {} words: \
                 ranks call this communicator's collectives in different orders",
                at.step,
                other.rank,
                other.words,
                comm.rank,
                op.what(),
                send.len()
            ))
        })
    });
    if let Err(e) = gathered {
        comm.health().fail(&e);
        return Err(e);
    }
    Ok(match op {
        AgreementCollective::AllGather => all,
        AgreementCollective::Min => {
            let mut least = send.to_vec();
            for row in all.chunks(send.len().max(1)) {
                for (l, v) in least.iter_mut().zip(row) {
                    *l = (*l).min(*v);
                }
            }
            least
        }
        AgreementCollective::AllToAll => {
            // Block `me` of every rank's words, in rank order.
            let me = comm.rank as usize;
            all.chunks(send.len().max(1))
                .flat_map(|row| row.iter().skip(me * count).take(count).copied())
                .collect()
        }
    })
}

use super::requests::call_error as mpi_err;

/// `MPI_Test` the live request `req` once: whether it completed (MPI then nulls it).
fn test(rank: u32, req: &mut ffi::MPI_Request) -> MpiResult<bool> {
    let mut flag: c_int = 0;
    // SAFETY: `req` is a live request its caller posted; the status is ignored.
    let rc = unsafe { ffi::MPI_Test(req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return Err(mpi_err(rank, "MPI_Test", rc));
    }
    Ok(flag != 0)
}

/// Check the return code `rc` of the call posting `req` on `comm`, then poll `MPI_Test`
/// until it completes (MPI then nulls it), as [`wait_polling`] waits.
fn wait_at(
    comm: &MpiCommunicator,
    at: &WaitPoint,
    call: &'static str,
    rc: c_int,
    req: &mut ffi::MPI_Request,
) -> MpiResult<()> {
    let rank = comm.rank;
    if rc != ffi::MPI_SUCCESS as c_int {
        return Err(mpi_err(rank, call, rc));
    }
    wait_polling(comm, at, || test(rank, req))
}

/// Poll `done` until it says the step at `at` completed. A wait that lasts serves roll calls
/// (`roll_call.rs`); at the communicator's timeout less the roll call's grace, or once a peer
/// gave up on this very place, it calls the roll and returns what that found, within the
/// timeout.
fn wait_polling(
    comm: &MpiCommunicator,
    at: &WaitPoint,
    mut done: impl FnMut() -> MpiResult<bool>,
) -> MpiResult<()> {
    let timeout = comm.timeout.get();
    let patience = timeout.saturating_sub(roll_call::grace(timeout));
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if done()? {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= roll_call::SERVE_AFTER {
            let asked = roll_call::serve(comm, at)?;
            if !asked.is_empty() {
                return Err(roll_call::call_roll(comm, at, asked, timeout));
            }
        }
        if waited > patience {
            return Err(roll_call::call_roll(comm, at, Vec::new(), timeout));
        }
        spins += 1;
        if spins > SPINS_BEFORE_YIELD {
            std::thread::yield_now();
        }
    }
}

/// Check the return code `rc` of the call posting `req` (on rank `rank`), then poll
/// `MPI_Test` until it completes (MPI then nulls it) or `timeout` passes: for steps before a
/// communicator exists (creation), which no roll call can serve.
pub(super) fn wait(
    rank: u32,
    timeout: Duration,
    step: &'static str,
    call: &'static str,
    rc: c_int,
    req: &mut ffi::MPI_Request,
) -> MpiResult<()> {
    if rc != ffi::MPI_SUCCESS as c_int {
        return Err(mpi_err(rank, call, rc));
    }
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    loop {
        if test(rank, req)? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(MpiError::Timeout {
                rank,
                step,
                level: 0,
                pending: 1,
                after: timeout,
            });
        }
        // Oversubscribed runs (more ranks than cores) need the core back: with CMA the
        // receiving process copies, so a rank spinning here delays its peers' copies.
        spins += 1;
        if spins > SPINS_BEFORE_YIELD {
            std::thread::yield_now();
        }
    }
}

/// What [`agree`] learned from all ranks.
#[derive(Debug)]
pub(super) struct Agreed {
    /// The lowest rank whose local step failed, if any.
    pub(super) failed: Option<u32>,
    /// Per value passed, its smallest and largest value over the ranks.
    pub(super) ranges: Vec<(i64, i64)>,
}

/// Collective agreement, in one nonblocking `MPI_Iallreduce`, on whether any rank failed its
/// local step (and the lowest such rank) and on the range of each of `values` over the
/// ranks: each value is sent as itself and negated, so one `MIN` gives its minimum and
/// maximum. Errors as [`collective`].
pub(super) fn agree(
    comm: &MpiCommunicator,
    step: impl Into<WaitPoint>,
    failed: bool,
    values: &[i64],
) -> MpiResult<Agreed> {
    let mut send = Vec::with_capacity(1 + 2 * values.len());
    send.push(if failed {
        i64::from(comm.rank)
    } else {
        i64::MAX
    });
    for v in values {
        // `i64::MIN` has no negation; it is never an agreed value here (sizes, type codes and
        // 62-bit hashes are small), and saturating keeps the reduction well defined anyway.
        send.extend([*v, v.saturating_neg()]);
    }
    let got = collective(comm, step, AgreementCollective::Min, send)?;
    let failed = match got.first() {
        Some(&r) if r != i64::MAX => Some(r as u32),
        _ => None,
    };
    let ranges = got
        .get(1..)
        .unwrap_or(&[])
        .chunks(2)
        .map(|c| (c[0], c[1].saturating_neg()))
        .collect();
    Ok(Agreed { failed, ranges })
}

/// `MPI_Ibarrier` over the communicator, polled against its timeout. A timeout (named
/// ranks missing, as [`collective`]) fails the communicator and buries the request (a
/// collective one cannot be cancelled).
pub(super) fn barrier(comm: &MpiCommunicator, step: &'static str) -> MpiResult<()> {
    // SAFETY: reading an MPI constant initialised by the library.
    let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: the communicator is live and `req` an out-parameter of the right type.
    let rc = unsafe { ffi::MPI_Ibarrier(comm.comm().as_raw(), &mut req) };
    match wait_at(comm, &WaitPoint::from(step), "MPI_Ibarrier", rc, &mut req) {
        Ok(()) => Ok(()),
        Err(e) => {
            let health = comm.health();
            health.fail(&e);
            // SAFETY: reading an MPI constant initialised by the library.
            if req != unsafe { ffi::RSMPI_REQUEST_NULL } {
                health.bury(vec![req], Box::new(()));
            }
            Err(e)
        }
    }
}

pub(super) use crate::call::fnv62;

/// [`fnv62`] of `words`' bytes, each word ended by a zero byte.
pub(super) fn text_hash<'a>(words: impl Iterator<Item = &'a str>) -> i64 {
    fnv62(words.flat_map(|w| w.bytes().chain([0])))
}

/// Every rank passes the same `settings` (name, value): first one `MPI_Iallreduce` agrees
/// that every rank names the same settings, then one `MPI_Iallgather` brings every rank's
/// values, both within the timeout. Every rank sees the same values, so every rank returns
/// the same verdict: for each setting where ranks differ, the ranks whose value is not the
/// most common one (ties: rank 0's), with their values and the common one.
///
/// Errors: [`MpiError::CallMismatch`] naming the ranks and settings that differ;
/// [`MpiError::Timeout`] when a rank does not take part in time; an MPI error.
pub(super) fn same_settings(
    comm: &MpiCommunicator,
    step: &'static str,
    settings: &[(&str, i64)],
) -> MpiResult<()> {
    let names = text_hash(settings.iter().map(|(name, _)| *name));
    let got = agree(comm, step, false, &[settings.len() as i64, names])?;
    if got.ranges.iter().any(|(lo, hi)| lo != hi) {
        let list: Vec<&str> = settings.iter().map(|(name, _)| *name).collect();
        return Err(MpiError::CallMismatch(format!(
            "{step}: rank {} compares the settings {list:?}; another rank compares other ones",
            comm.rank
        )));
    }
    if settings.is_empty() {
        return Ok(());
    }
    let all = collective(
        comm,
        step,
        AgreementCollective::AllGather,
        settings.iter().map(|s| s.1).collect(),
    )?;
    let names: Vec<&str> = settings.iter().map(|(name, _)| *name).collect();
    let differ = differences(&names, &all);
    if differ.is_empty() {
        Ok(())
    } else {
        Err(MpiError::CallMismatch(format!(
            "{step}: ranks differ in {}",
            differ.join("; ")
        )))
    }
}

/// For each setting of `names` whose values differ in `all` (every rank's values, rank
/// after rank), which ranks pass what: the ranks whose value is not the most common one
/// (among equally common values, the lowest rank's), with their values and the common one.
fn differences(names: &[&str], all: &[i64]) -> Vec<String> {
    let k = names.len();
    if k == 0 {
        return Vec::new();
    }
    let n = all.len() / k;
    let mut differ = Vec::new();
    for (j, name) in names.iter().enumerate() {
        let col: Vec<i64> = (0..n).map(|r| all[r * k + j]).collect();
        let mut counts: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
        for &v in &col {
            *counts.entry(v).or_default() += 1;
        }
        let mut common = col[0];
        for &v in &col {
            if counts[&v] > counts[&common] {
                common = v;
            }
        }
        let odd: Vec<String> = (0..n)
            .filter(|&r| col[r] != common)
            .map(|r| format!("rank {r} passes {}", col[r]))
            .collect();
        if !odd.is_empty() {
            let rest = n - odd.len();
            differ.push(format!(
                "{name}: {} where {rest} rank(s) pass {common}",
                odd.join(", ")
            ));
        }
    }
    differ
}

#[cfg(test)]
mod tests {
    use super::differences;

    /// The odd ranks are named against the most common value, whichever rank holds it; equal
    /// settings name nobody.
    #[test]
    fn differences_name_the_ranks_off_the_common_value() {
        // Three ranks, settings (-n, -b): rank 0 is the odd one in -n.
        let all = [5, 1024, 20, 1024, 20, 1024];
        assert_eq!(
            differences(&["-n", "-b"], &all),
            vec!["-n: rank 0 passes 5 where 2 rank(s) pass 20".to_string()]
        );
        assert!(differences(&["-n", "-b"], &[20, 1024, 20, 1024]).is_empty());
        // A tie: rank 0's value is the common one.
        assert_eq!(
            differences(&["-w"], &[1, 2]),
            vec!["-w: rank 1 passes 2 where 1 rank(s) pass 1".to_string()]
        );
        assert!(differences(&[], &[]).is_empty());
    }
}
