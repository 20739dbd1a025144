//! Communicator creation's steps across processes, each bounded by the timeout, so a rank
//! that never calls [`super::MpiCommunicator::from_mpi`] (or fails its own setup) is an error
//! on every other rank naming it, not a hang:
//!
//! 1. **Arrival** ([`arrive`]): every rank sends every other rank one word (whether its own
//!    setup succeeded) and receives theirs, point to point on the caller's communicator with
//!    tag [`ARRIVAL_TAG`]. Point-to-point, not a collective, so that a rank whose word has
//!    not come by the deadline can be named ([`MpiError::Absent`]). It costs `n - 1` tiny
//!    messages each way per rank, once per communicator.
//! 2. **The private duplicate** ([`duplicate`]): `MPI_Comm_idup`, polled against the
//!    timeout. A rank that arrives after the others gave up finds every word waiting, but
//!    the duplicate is a collective nobody else joins: it times out too.
//!
//! After both, every rank is known to be inside creation, and the remaining setup steps
//! (the shared-memory split, the node numbering, the shared window) are MPI's blocking
//! collectives, which every rank reaches unless its process dies (then `mpirun` ends the
//! job).
//!
//! A request MPI does not give back after the timeout (a send to a rank that never came,
//! which Open MPI cannot cancel, is usually complete already: the word travels eagerly) is
//! left to MPI with its buffer, which is leaked: a few bytes per missing rank.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use ::mpi::ffi;
use ::mpi::raw::FromRaw;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::Communicator;

use super::requests::SPINS_BEFORE_YIELD;
use super::{MpiError, MpiResult};

/// The step creation's errors name.
pub(super) const CREATE_STEP: &str = "create the communicator";

/// Tag of the arrival words on the caller's communicator: within the 32,767 tags every MPI
/// allows, and unlikely to be an application's (a receive of any tag posted on the same
/// communicator while it is created could still take one).
pub(super) const ARRIVAL_TAG: c_int = 32_417;

/// How long cancelled arrival requests get to complete before they are left to MPI.
const GRACE: Duration = Duration::from_secs(1);

use super::requests::call_error as mpi_err;

/// `MPI_Test` every live request of `reqs` once; per request, whether it completed now.
/// A request that completed (MPI nulls it) is not tested again.
fn test_all(rank: u32, reqs: &mut [ffi::MPI_Request], done: &mut [bool]) -> MpiResult<()> {
    // SAFETY: reading an MPI constant initialised by the library.
    let null = unsafe { ffi::RSMPI_REQUEST_NULL };
    for (r, d) in reqs.iter_mut().zip(done.iter_mut()) {
        if *r == null {
            continue;
        }
        let mut flag: c_int = 0;
        // SAFETY: `r` is a live request this module posted; the status is ignored.
        let rc = unsafe { ffi::MPI_Test(r, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if rc != ffi::MPI_SUCCESS as c_int {
            return Err(mpi_err(rank, "MPI_Test", rc));
        }
        if flag != 0 {
            *d = true;
            *r = null;
        }
    }
    Ok(())
}

/// Arrival (step 1 of the module docs) of every rank of `world`; `failed`: this rank's own
/// setup failed, which the others learn.
///
/// Errors: [`MpiError::Absent`] naming the ranks whose word did not come within `timeout`;
/// else [`MpiError::Peer`] naming the lowest other rank whose setup failed; an MPI error.
/// This rank's own failure is the caller's to return.
pub(super) fn arrive(world: &impl Communicator, timeout: Duration, failed: bool) -> MpiResult<()> {
    let (me, n) = (world.rank(), world.size());
    let rank = me as u32;
    if n <= 1 {
        return Ok(());
    }
    let raw = world.as_raw();
    // SAFETY: reading MPI constants initialised by the library.
    let (null, word) = unsafe { (ffi::RSMPI_REQUEST_NULL, ffi::RSMPI_INT64_T) };
    // On the heap, reached only through these pointers: freed at the end, or leaked if MPI
    // keeps a request that uses them.
    let send: *mut i64 = Box::into_raw(Box::new(i64::from(failed)));
    let recv: *mut [i64] = Box::into_raw(vec![-1i64; n as usize].into_boxed_slice());
    let (sp, rp) = (send, recv.cast::<i64>());
    let peers: Vec<c_int> = (0..n).filter(|&p| p != me).collect();
    let mut recvs = vec![null; peers.len()];
    let mut sends = vec![null; peers.len()];
    let mut posted = Ok(());
    for (k, &p) in peers.iter().enumerate() {
        // SAFETY: `rp + p` is one word of `recv` (p < n) and `sp` the word of `send`, both
        // live until the requests complete (or forever), and not touched by this rank until
        // then.
        let rc = unsafe {
            let r = ffi::MPI_Irecv(
                rp.add(p as usize).cast::<c_void>(),
                1,
                word,
                p,
                ARRIVAL_TAG,
                raw,
                &mut recvs[k],
            );
            if r != ffi::MPI_SUCCESS as c_int {
                r
            } else {
                ffi::MPI_Isend(
                    sp.cast::<c_void>(),
                    1,
                    word,
                    p,
                    ARRIVAL_TAG,
                    raw,
                    &mut sends[k],
                )
            }
        };
        if rc != ffi::MPI_SUCCESS as c_int {
            posted = Err(mpi_err(rank, "MPI_Irecv/MPI_Isend", rc));
            break;
        }
    }
    let mut heard = vec![false; peers.len()];
    let mut sent = vec![false; peers.len()];
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    let polled = posted.and_then(|()| {
        loop {
            test_all(rank, &mut recvs, &mut heard)?;
            test_all(rank, &mut sends, &mut sent)?;
            if heard.iter().chain(&sent).all(|&d| d) || Instant::now() > deadline {
                break Ok(());
            }
            // Oversubscribed runs need the core back for the peers that are still coming.
            spins += 1;
            if spins > SPINS_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    });
    // Who had not come by the deadline, and who came with a failed setup, before anything
    // is cancelled.
    let missing: Vec<u32> = peers
        .iter()
        .zip(&heard)
        .filter(|(_, h)| !**h)
        .map(|(&p, _)| p as u32)
        .collect();
    let failed_peer = peers
        .iter()
        .zip(&heard)
        // SAFETY: a heard word's receive completed: MPI wrote it and touches it no more.
        .find(|(p, h)| **h && unsafe { *rp.add(**p as usize) } != 0)
        .map(|(&p, _)| p as u32);
    let live = |reqs: &[ffi::MPI_Request]| reqs.iter().any(|r| *r != null);
    if live(&recvs) || live(&sends) {
        for r in recvs
            .iter_mut()
            .chain(sends.iter_mut())
            .filter(|r| **r != null)
        {
            // SAFETY: `r` is a live request posted above.
            unsafe { ffi::MPI_Cancel(r) };
        }
        let grace = Instant::now() + GRACE;
        let (mut a, mut b) = (vec![false; recvs.len()], vec![false; sends.len()]);
        while (live(&recvs) || live(&sends)) && Instant::now() < grace {
            if test_all(rank, &mut recvs, &mut a)
                .and_then(|()| test_all(rank, &mut sends, &mut b))
                .is_err()
            {
                break;
            }
            std::thread::yield_now();
        }
    }
    // MPI may still read `send` or write `recv` while a request lives: then they are leaked.
    if !live(&recvs) && !live(&sends) {
        // SAFETY: both came from `Box::into_raw` above, and no request uses them any more.
        unsafe {
            drop(Box::from_raw(send));
            drop(Box::from_raw(recv));
        }
    }
    polled?;
    if !missing.is_empty() {
        return Err(MpiError::Absent {
            rank,
            step: CREATE_STEP,
            call: None,
            missing,
            elsewhere: Vec::new(),
            after: timeout,
        });
    }
    match failed_peer {
        Some(p) => Err(MpiError::Peer {
            rank: p,
            step: CREATE_STEP,
        }),
        None => Ok(()),
    }
}

/// The private duplicate of `world` (step 2 of the module docs), with errors returned, not
/// fatal: `MPI_Comm_idup` polled until `timeout`.
///
/// Errors: [`MpiError::Timeout`] when not every rank joins in time (the pending request and
/// the handle MPI will write are left to MPI), or an MPI error.
pub(super) fn duplicate(
    world: &impl Communicator,
    timeout: Duration,
) -> MpiResult<SimpleCommunicator> {
    let rank = world.rank() as u32;
    // SAFETY: reading MPI constants initialised by the library.
    let (mut req, comm_null) = unsafe { (ffi::RSMPI_REQUEST_NULL, ffi::RSMPI_COMM_NULL) };
    // MPI writes the new handle when the request completes: on the heap, leaked if it never
    // does within the timeout.
    let mut newcomm: Box<ffi::MPI_Comm> = Box::new(comm_null);
    // SAFETY: `world` is a live communicator; `newcomm` and `req` are out-parameters of the
    // right types, and `newcomm` stays allocated until the request completes (or forever).
    let rc = unsafe { ffi::MPI_Comm_idup(world.as_raw(), &mut *newcomm, &mut req) };
    match super::agree::wait(rank, timeout, CREATE_STEP, "MPI_Comm_idup", rc, &mut req) {
        Ok(()) => {
            let raw = *newcomm;
            // SAFETY: the request completed, so `raw` is the new, live intra-communicator,
            // owned by nothing else; the error handler is a predefined constant.
            unsafe {
                ffi::MPI_Comm_set_errhandler(raw, ffi::RSMPI_ERRORS_RETURN);
                Ok(SimpleCommunicator::from_raw(raw))
            }
        }
        Err(e) => {
            // SAFETY: reading an MPI constant initialised by the library.
            if req != unsafe { ffi::RSMPI_REQUEST_NULL } {
                std::mem::forget(newcomm);
            }
            Err(e)
        }
    }
}
