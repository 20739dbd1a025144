//! The MPI transport of the executor's runner ([`crate::exec::run::Transport`]): a stage's
//! receives and sends are `MPI_Irecv`/`MPI_Isend` on the communicator of a [`Requests`] value,
//! polled with `MPI_Testall` against the run's deadline; a failure cancels what is pending and
//! leaves what MPI keeps in the [`Requests`] value for its owner to bury.

use std::os::raw::c_int;
use std::time::{Duration, Instant};

use super::MpiError;
use super::requests::Requests;
use crate::backend::AddressSpace;
use crate::exec::run::Transport;

/// Nonblocking MPI on one communicator, with one deadline for a whole run.
#[derive(Debug)]
pub(crate) struct MpiTransport<'r> {
    reqs: &'r mut Requests,
    deadline: Instant,
    timeout: Duration,
    /// MPI may use device addresses (a CUDA-aware MPI, [`super::TransferMode::Direct`]).
    device: bool,
}

impl<'r> MpiTransport<'r> {
    /// Requests on `reqs`, which every stage must complete before `deadline` (`timeout` after
    /// the run began, for the error); `device` when MPI may read and write device memory.
    pub(crate) fn new(
        reqs: &'r mut Requests,
        deadline: Instant,
        timeout: Duration,
        device: bool,
    ) -> Self {
        MpiTransport {
            reqs,
            deadline,
            timeout,
            device,
        }
    }
}

/// A rank or tag as MPI's `int` (ranks of a communicator and folded tags always fit).
fn int(v: u32) -> c_int {
    c_int::try_from(v).unwrap_or(c_int::MAX)
}

impl Transport for MpiTransport<'_> {
    type Error = MpiError;

    fn reaches(&self, space: AddressSpace) -> bool {
        match space {
            AddressSpace::Host => true,
            AddressSpace::Device => self.device,
        }
    }

    fn begin(&mut self, _stage: usize) {
        self.reqs.clear();
    }

    unsafe fn recv(
        &mut self,
        peer: u32,
        tag: u32,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), MpiError> {
        // SAFETY: the runner's contract is `Requests::irecv`'s: `bytes` writable bytes,
        // untouched and allocated until the request completes or is buried.
        unsafe { self.reqs.irecv(dst, bytes, int(peer), int(tag)) }
    }

    unsafe fn send(
        &mut self,
        peer: u32,
        tag: u32,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), MpiError> {
        // SAFETY: as for `recv`; the bytes are only read.
        unsafe { self.reqs.isend(src, bytes, int(peer), int(tag)) }
    }

    fn wait(&mut self, stage: usize) -> Result<(), MpiError> {
        self.reqs.wait(stage, self.deadline, self.timeout)
    }
}
