//! The nonblocking MPI requests of one level: posted, polled against a deadline, and on any
//! failure cancelled (or, when MPI cannot give the buffers back, the job aborted). Both plan
//! runners ([`super::schedule::Schedule::run`] over host slices, [`super::DevicePlan::run`]
//! over a backend's memory) post through this one type.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use ::mpi::ffi;

use super::MpiError;

/// One level's requests on one communicator.
#[derive(Debug)]
pub(crate) struct Requests {
    comm: ffi::MPI_Comm,
    rank: u32,
    reqs: Vec<ffi::MPI_Request>,
}

impl Requests {
    /// No requests yet, on `comm` (this process is `rank` there).
    pub(crate) fn new(comm: ffi::MPI_Comm, rank: u32) -> Self {
        Requests {
            comm,
            rank,
            reqs: Vec::new(),
        }
    }

    /// Forget the completed requests of the previous level (keeps the capacity).
    pub(crate) fn clear(&mut self) {
        self.reqs.clear();
    }

    /// Post `MPI_Irecv` of `len` bytes from `peer` with `tag` into `buf`.
    ///
    /// # Safety
    /// `buf` must point to `len` writable bytes (host memory, or device memory MPI can use)
    /// that nothing else reads or writes, and that stay allocated, until [`Requests::wait`]
    /// returns `Ok` or any method of this value returns `Err` (the requests are then complete
    /// or cancelled; when they cannot be cancelled the job is aborted).
    pub(crate) unsafe fn irecv(
        &mut self,
        buf: *mut u8,
        len: usize,
        peer: c_int,
        tag: c_int,
    ) -> Result<(), MpiError> {
        let comm = self.comm;
        self.post("MPI_Irecv", len, |count, r| {
            // SAFETY: the caller keeps `buf` valid and untouched until the request completes
            // or is cancelled; `count` bytes fit in it.
            unsafe {
                ffi::MPI_Irecv(
                    buf.cast::<c_void>(),
                    count,
                    ffi::RSMPI_UINT8_T,
                    peer,
                    tag,
                    comm,
                    r,
                )
            }
        })
    }

    /// Post `MPI_Isend` of `len` bytes at `buf` to `peer` with `tag`.
    ///
    /// # Safety
    /// As for [`Requests::irecv`], except that others may read `buf` meanwhile.
    pub(crate) unsafe fn isend(
        &mut self,
        buf: *const u8,
        len: usize,
        peer: c_int,
        tag: c_int,
    ) -> Result<(), MpiError> {
        let comm = self.comm;
        self.post("MPI_Isend", len, |count, r| {
            // SAFETY: as in `irecv`; the buffer is only read.
            unsafe {
                ffi::MPI_Isend(
                    buf.cast::<c_void>(),
                    count,
                    ffi::RSMPI_UINT8_T,
                    peer,
                    tag,
                    comm,
                    r,
                )
            }
        })
    }

    /// Post one request with `call` (given the count and the request to fill), keep it, and
    /// turn its return code into an error.
    fn post(
        &mut self,
        name: &'static str,
        len: usize,
        call: impl FnOnce(c_int, &mut ffi::MPI_Request) -> c_int,
    ) -> Result<(), MpiError> {
        let count = self.count(len, name)?;
        // SAFETY: reading an MPI constant initialised by the library.
        let mut r = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = call(count, &mut r);
        self.reqs.push(r);
        self.check(rc, name)
    }

    /// Poll `MPI_Testall` until every request completes, or the deadline passes (then
    /// [`MpiError::Timeout`], after cancelling what is pending).
    pub(crate) fn wait(
        &mut self,
        level: usize,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), MpiError> {
        if self.reqs.is_empty() {
            return Ok(());
        }
        let mut spins = 0u32;
        loop {
            let mut flag: c_int = 0;
            // SAFETY: `reqs` holds requests returned by MPI_Irecv/MPI_Isend (or null); the
            // statuses are ignored.
            let rc = unsafe {
                ffi::MPI_Testall(
                    self.reqs.len() as c_int,
                    self.reqs.as_mut_ptr(),
                    &mut flag,
                    ffi::RSMPI_STATUSES_IGNORE,
                )
            };
            self.check(rc, "MPI_Testall")?;
            if flag != 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                let err = MpiError::Timeout {
                    rank: self.rank,
                    level,
                    pending: pending(&self.reqs),
                    after: timeout,
                };
                return Err(self.fail(err));
            }
            // Oversubscribed runs (more ranks than cores) need the core back.
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            }
        }
    }

    /// Cancel every pending request and give them a second to complete; return `err` when
    /// they did, else print it and abort the job (MPI would keep using the buffers).
    pub(crate) fn fail(&mut self, err: MpiError) -> MpiError {
        cancel_or_abort(self.comm, &mut self.reqs, err)
    }

    /// A message length as MPI's `int` count (plans are checked for this when scheduled).
    fn count(&mut self, len: usize, call: &'static str) -> Result<c_int, MpiError> {
        c_int::try_from(len).map_err(|_| {
            let e = MpiError::Unsupported(format!("{call} of {len} bytes, over MPI's int count"));
            self.fail(e)
        })
    }

    /// Turn an MPI return code into an error (cancelling what is pending).
    fn check(&mut self, rc: c_int, call: &'static str) -> Result<(), MpiError> {
        if rc == ffi::MPI_SUCCESS as c_int {
            return Ok(());
        }
        let err = MpiError::Mpi {
            rank: self.rank,
            call,
            code: rc,
        };
        Err(self.fail(err))
    }
}

/// Requests not yet complete.
fn pending(reqs: &[ffi::MPI_Request]) -> usize {
    // SAFETY: reading an MPI constant initialised by the library.
    let null = unsafe { ffi::RSMPI_REQUEST_NULL };
    reqs.iter().filter(|r| **r != null).count()
}

/// Cancel every pending request and give them a second to complete; return `err` when they
/// did, else print it and abort the job (MPI would keep writing into the caller's buffers).
fn cancel_or_abort(comm: ffi::MPI_Comm, reqs: &mut [ffi::MPI_Request], err: MpiError) -> MpiError {
    // SAFETY: reading an MPI constant initialised by the library.
    let null = unsafe { ffi::RSMPI_REQUEST_NULL };
    for r in reqs.iter_mut().filter(|r| **r != null) {
        // SAFETY: `r` is a live request from MPI_Irecv/MPI_Isend.
        unsafe { ffi::MPI_Cancel(r) };
    }
    let grace = Instant::now() + Duration::from_secs(1);
    while Instant::now() < grace {
        let mut flag: c_int = 0;
        // SAFETY: as in `Requests::wait`.
        let rc = unsafe {
            ffi::MPI_Testall(
                reqs.len() as c_int,
                reqs.as_mut_ptr(),
                &mut flag,
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        if flag != 0 && rc == ffi::MPI_SUCCESS as c_int {
            return err;
        }
        std::thread::yield_now();
    }
    eprintln!(
        "relaycc mpi: {err}; {} requests could not be cancelled, aborting",
        pending(reqs)
    );
    // SAFETY: MPI_Abort on a valid communicator; it does not return in practice.
    unsafe { ffi::MPI_Abort(comm, 124) };
    std::process::abort()
}
