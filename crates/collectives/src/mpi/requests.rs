//! The nonblocking MPI requests of one level: posted, polled against a deadline, and on any
//! failure cancelled. The executor's runner posts through this one type, by way of the MPI
//! transport ([`super::transport::MpiTransport`]), over host memory
//! ([`super::schedule::RankSchedule::run`]) and over a backend's memory ([`super::DevicePlan::run`]).
//!
//! A failure never aborts the job. Requests that MPI does not give back after `MPI_Cancel`
//! (Open MPI cannot cancel a send whose peer never posts the receive) are left in the
//! [`Requests`] value; the runner's owner then moves them, with every buffer MPI may still
//! read or write, into the communicator's [`Health`] graveyard, so nothing MPI uses is freed
//! or reused.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::time::{Duration, Instant};

use ::mpi::ffi;

use super::MpiError;

/// Polls of a pending request before each further poll yields the core (`yield_now` returns
/// at once when no other thread waits for it, so idle cores lose nothing).
pub(super) const SPINS_BEFORE_YIELD: u32 = 4;

/// How long cancelled requests get to complete before they count as stuck.
const GRACE: Duration = Duration::from_secs(1);

/// One level's requests on one communicator.
#[derive(Debug)]
pub(crate) struct Requests {
    comm: ffi::MPI_Comm,
    rank: u32,
    reqs: Vec<ffi::MPI_Request>,
    statuses: Vec<ffi::MPI_Status>,
    /// Set by a failure that left requests pending after cancellation.
    stuck: bool,
}

impl Requests {
    /// No requests yet, on `comm` (this process is `rank` there).
    pub(crate) fn new(comm: ffi::MPI_Comm, rank: u32) -> Self {
        Requests {
            comm,
            rank,
            reqs: Vec::new(),
            statuses: Vec::new(),
            stuck: false,
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
    /// returns `Ok`, or any method of this value returns `Err` and [`Requests::take_stuck`]
    /// then returns `None`. When it returns requests, the bytes must stay allocated and
    /// untouched until those requests complete (see [`Health::bury`]).
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
        // SAFETY: `MPI_Status` is a plain C struct of integers; all zeros is a valid value.
        let blank: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        self.statuses.clear();
        self.statuses.resize(self.reqs.len(), blank);
        let mut spins = 0u32;
        loop {
            let mut flag: c_int = 0;
            // SAFETY: `reqs` holds requests returned by MPI_Irecv/MPI_Isend (or null), and
            // `statuses` has one entry per request.
            let rc = unsafe {
                ffi::MPI_Testall(
                    self.reqs.len() as c_int,
                    self.reqs.as_mut_ptr(),
                    &mut flag,
                    self.statuses.as_mut_ptr(),
                )
            };
            if rc == ffi::MPI_ERR_IN_STATUS as c_int {
                // The real error is in the status of the request that failed (a truncated
                // receive, for one); report that one.
                let code = self
                    .statuses
                    .iter()
                    .map(|s| s.MPI_ERROR)
                    .find(|e| {
                        *e != ffi::MPI_SUCCESS as c_int && *e != ffi::MPI_ERR_PENDING as c_int
                    })
                    .unwrap_or(rc);
                return self.check(code, "MPI_Testall");
            }
            self.check(rc, "MPI_Testall")?;
            if flag != 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                let err = MpiError::Timeout {
                    rank: self.rank,
                    step: "run",
                    level,
                    pending: pending(&self.reqs),
                    after: timeout,
                };
                return Err(self.fail(err));
            }
            // Oversubscribed runs (more ranks than cores) need the core back: with CMA the
            // receiving process copies, so a rank spinning here delays its peers' copies.
            spins += 1;
            if spins > SPINS_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    }

    /// How many requests were posted since the last [`Requests::clear`] (the index the next
    /// one gets, for [`Requests::done`]).
    pub(crate) fn posted(&self) -> usize {
        self.reqs.len()
    }

    /// `MPI_Test` every pending request once; a completed one becomes null. Returns how many
    /// are still pending. An error in a request (a truncated receive) cancels what is
    /// pending and is returned.
    pub(crate) fn poll(&mut self) -> Result<usize, MpiError> {
        // SAFETY: reading an MPI constant initialised by the library.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut left = 0;
        for k in 0..self.reqs.len() {
            if self.reqs[k] == null {
                continue;
            }
            let mut flag: c_int = 0;
            // SAFETY: a live request from MPI_Irecv/MPI_Isend; the status is ignored.
            let rc =
                unsafe { ffi::MPI_Test(&mut self.reqs[k], &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            self.check(rc, "MPI_Test")?;
            if flag != 0 {
                self.reqs[k] = null;
            } else {
                left += 1;
            }
        }
        Ok(left)
    }

    /// Whether request `i` (counted from the last [`Requests::clear`]) is known complete
    /// (by [`Requests::poll`] or a wait).
    pub(crate) fn done(&self, i: usize) -> bool {
        // SAFETY: reading an MPI constant initialised by the library.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        self.reqs.get(i).is_none_or(|r| *r == null)
    }

    /// The timeout of a poll loop ([`Requests::poll`]) at `level`, after `timeout`: what is
    /// pending is cancelled, as [`Requests::wait`] does past its deadline.
    pub(crate) fn time_out(
        &mut self,
        step: &'static str,
        level: usize,
        timeout: Duration,
    ) -> MpiError {
        let err = MpiError::Timeout {
            rank: self.rank,
            step,
            level,
            pending: pending(&self.reqs),
            after: timeout,
        };
        self.fail(err)
    }

    /// Cancel every pending request and give them a grace second to complete; then return
    /// `err`. Requests still pending after that stay here ([`Requests::take_stuck`]).
    pub(crate) fn fail(&mut self, err: MpiError) -> MpiError {
        // SAFETY: reading an MPI constant initialised by the library.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        for r in self.reqs.iter_mut().filter(|r| **r != null) {
            // SAFETY: `r` is a live request from MPI_Irecv/MPI_Isend.
            unsafe { ffi::MPI_Cancel(r) };
        }
        let grace = Instant::now() + GRACE;
        while test_each(&mut self.reqs) > 0 && Instant::now() < grace {
            std::thread::yield_now();
        }
        self.stuck = pending(&self.reqs) > 0;
        err
    }

    /// Whether some request of this level is not known complete (MPI may still use its
    /// memory): after a panic in a run, which leaves no chance to cancel them.
    pub(crate) fn any_pending(&self) -> bool {
        pending(&self.reqs) > 0
    }

    /// After an error: the requests MPI kept (cancellation did not complete them), or `None`
    /// when MPI holds no memory of this level any more. The memory those requests use must
    /// stay allocated and untouched until they complete ([`Health::bury`]).
    pub(crate) fn take_stuck(&mut self) -> Option<Vec<ffi::MPI_Request>> {
        if !std::mem::take(&mut self.stuck) {
            return None;
        }
        // SAFETY: reading an MPI constant initialised by the library.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        let left: Vec<_> = self.reqs.drain(..).filter(|r| *r != null).collect();
        (!left.is_empty()).then_some(left)
    }

    /// A message length as MPI's `int` count (plans are checked for this when scheduled).
    fn count(&mut self, len: usize, call: &'static str) -> Result<c_int, MpiError> {
        c_int::try_from(len).map_err(|_| {
            let e = MpiError::Unsupported(format!("{call} of {len} bytes, over MPI's int count"));
            self.fail(e)
        })
    }

    /// Turn an MPI return code into an error named by MPI (cancelling what is pending).
    fn check(&mut self, rc: c_int, call: &'static str) -> Result<(), MpiError> {
        if rc == ffi::MPI_SUCCESS as c_int {
            return Ok(());
        }
        let err = call_error(self.rank, call, rc);
        Err(self.fail(err))
    }
}

/// The error MPI's `call` returned with `code` on rank `rank`, named by [`error_name`].
pub(crate) fn call_error(rank: u32, call: &'static str, code: c_int) -> MpiError {
    MpiError::Mpi {
        rank,
        call,
        code,
        name: error_name(code),
    }
}

/// MPI's text for an error code (`MPI_Error_string`), with its class's text when the class
/// differs (`MPI_Error_class`), e.g. `MPI_ERR_TRUNCATE: message truncated` in Open MPI.
/// [`MpiError::Mpi`] carries it.
pub fn error_name(code: c_int) -> String {
    let text = |c: c_int| -> Option<String> {
        let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
        let mut len: c_int = 0;
        // SAFETY: `buf` holds MPI_MAX_ERROR_STRING characters and the terminator, as the call
        // requires; `len` receives the length written.
        let rc = unsafe { ffi::MPI_Error_string(c, buf.as_mut_ptr(), &mut len) };
        if rc != ffi::MPI_SUCCESS as c_int {
            return None;
        }
        let bytes: Vec<u8> = buf[..(len.max(0) as usize).min(buf.len())]
            .iter()
            .map(|c| *c as u8)
            .collect();
        Some(String::from_utf8_lossy(&bytes).trim().to_string())
    };
    let mut class: c_int = code;
    // SAFETY: `class` receives the class of `code`; an unknown code returns an error code.
    let have_class = unsafe { ffi::MPI_Error_class(code, &mut class) } == ffi::MPI_SUCCESS as c_int;
    match (text(code), have_class && class != code) {
        (Some(t), true) => match text(class) {
            Some(c) if c != t => format!("{t} (class {c})"),
            _ => t,
        },
        (Some(t), false) => t,
        (None, _) => "an error code MPI does not know".to_string(),
    }
}

/// Requests not yet complete.
fn pending(reqs: &[ffi::MPI_Request]) -> usize {
    // SAFETY: reading an MPI constant initialised by the library.
    let null = unsafe { ffi::RSMPI_REQUEST_NULL };
    reqs.iter().filter(|r| **r != null).count()
}

/// `MPI_Test` every pending request once (a request that completed, with an error or
/// cancelled, becomes null); returns how many are still pending.
pub(super) fn test_each(reqs: &mut [ffi::MPI_Request]) -> usize {
    // SAFETY: reading an MPI constant initialised by the library.
    let null = unsafe { ffi::RSMPI_REQUEST_NULL };
    for r in reqs.iter_mut().filter(|r| **r != null) {
        let mut flag: c_int = 0;
        // SAFETY: `r` is a live request from MPI_Irecv/MPI_Isend; the status is ignored.
        unsafe { ffi::MPI_Test(r, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if flag != 0 {
            // Complete: MPI freed it (or will not touch it again on an error).
            *r = null;
        }
    }
    pending(reqs)
}

/// What failed runs left behind on one communicator and the exchanges built from it: the
/// first failure (later collective calls return [`MpiError::Failed`] at once, since peers
/// may be gone and MPI's state is unknown), and the graveyard of requests MPI kept with the
/// memory they use.
#[derive(Default)]
pub(crate) struct Health {
    failure: RefCell<Option<String>>,
    graves: RefCell<Vec<Grave>>,
}

/// Stuck requests and the memory they may read or write.
struct Grave {
    reqs: Vec<ffi::MPI_Request>,
    keep: Box<dyn Any>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("failure", &self.failure.borrow())
            .field("graves", &self.graves.borrow().len())
            .finish()
    }
}

impl Health {
    /// `Err(MpiError::Failed)` when a run on this communicator failed before.
    pub(crate) fn check(&self) -> Result<(), MpiError> {
        match &*self.failure.borrow() {
            Some(why) => Err(MpiError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    /// Record a failed run (the first failure is kept).
    pub(crate) fn fail(&self, err: &MpiError) {
        self.failure
            .borrow_mut()
            .get_or_insert_with(|| err.to_string());
    }

    /// After a run: on an error, record the failure and, when MPI kept requests, bury them
    /// with the memory `keep` gives (every buffer they may read or write).
    pub(crate) fn settle(
        &self,
        ran: Result<(), MpiError>,
        reqs: &mut Requests,
        keep: impl FnOnce() -> Box<dyn Any>,
    ) -> Result<(), MpiError> {
        if let Err(e) = &ran {
            self.fail(e);
            if let Some(stuck) = reqs.take_stuck() {
                self.bury(stuck, keep());
            }
        }
        ran
    }

    /// Keep `keep` (every buffer `reqs` may read or write) until `reqs` complete: it is
    /// dropped, when the last holder of this health record goes, only if MPI reports them
    /// complete then; otherwise it is leaked, since MPI may still use it.
    pub(crate) fn bury(&self, reqs: Vec<ffi::MPI_Request>, keep: Box<dyn Any>) {
        self.graves.borrow_mut().push(Grave { reqs, keep });
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        let live = !::mpi::environment::is_finalized();
        for mut g in self.graves.get_mut().drain(..) {
            // After MPI_Finalize no request can be tested; the memory is leaked.
            if live && test_each(&mut g.reqs) == 0 {
                drop(g.keep);
            } else {
                std::mem::forget(g.keep);
            }
        }
    }
}
