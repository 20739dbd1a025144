//! A rank's memory on a backend as the runner sees it during one run ([`RunMemory`]: the
//! run's bindings, the addresses a transport may use in place, host staging), launching
//! through a [`Launcher`]: the backend's own launches waited for on the host (MPI's
//! `DevicePlan`), or launches ordered within a caller's CUDA stream that nothing waits for
//! (GPU ranks over MPI or NCCL, and ranks over the flag transport).

use relaycc_route::{DType, Location, ReduceOp};

use super::run::RankMemory;
use crate::backend::sealed::Private;
use crate::backend::{
    AddressSpace, Backend, ByteRegion, Command, DeviceMem, Launch, Program, RawRegion, Slot,
};
use crate::error::{CollectivesError, Result};

/// Host memory for the messages of one level, allocated on first need and reused by every
/// level and run.
#[derive(Debug)]
pub(crate) enum HostBuf {
    /// Not allocated yet.
    None,
    /// The backend's host memory (pinned on CUDA) at this address.
    Backend { mem: DeviceMem, addr: usize },
    /// A plain vector, for backends that give no address of their host memory.
    Owned(Vec<u8>),
}

impl HostBuf {
    /// Make sure `bytes` are there (a smaller buffer of either kind is replaced); returns the
    /// base address.
    fn ensure(&mut self, backend: &dyn Backend, at: Location, bytes: usize) -> Result<*mut u8> {
        if bytes == 0 {
            return Ok(std::ptr::null_mut());
        }
        match self {
            HostBuf::Backend { mem, addr } if mem.bytes() >= bytes as u64 => {
                return Ok(*addr as *mut u8);
            }
            HostBuf::Owned(v) if v.len() >= bytes => return Ok(v.as_mut_ptr()),
            _ => {}
        }
        if let HostBuf::Backend { mem, .. } = std::mem::replace(self, HostBuf::None) {
            backend.free(mem);
        }
        let mem = backend.allocate(at, bytes as u64)?;
        Ok(match backend.raw_region(whole(mem), Private) {
            Ok(Some(r)) if r.space == AddressSpace::Host => {
                *self = HostBuf::Backend { mem, addr: r.addr };
                r.addr as *mut u8
            }
            _ => {
                backend.free(mem);
                let mut v = vec![0u8; bytes];
                let p = v.as_mut_ptr();
                *self = HostBuf::Owned(v);
                p
            }
        })
    }
}

/// A program of one copy of `bytes` bytes from binding 0 to binding 1 on `lane` (a mirror's
/// or an in-place input's copy), carrying the call's element type, op and divisor.
pub(crate) fn one_copy(
    lane: Location,
    (dtype, op, divisor): (DType, ReduceOp, u32),
    bytes: u64,
) -> Program {
    let slot = |binding| Slot {
        binding,
        offset: 0,
        bytes,
    };
    Program {
        lanes: vec![lane],
        events: 0,
        dtype,
        op,
        divisor,
        bindings: 2,
        commands: vec![Command::Copy {
            lane: 0,
            src: slot(0),
            dst: slot(1),
        }],
        srcs: Vec::new(),
    }
}

/// The whole of an allocation, as a region.
pub(crate) fn whole(mem: DeviceMem) -> ByteRegion {
    ByteRegion {
        mem,
        offset: 0,
        bytes: mem.bytes(),
    }
}

/// The bindings of the current run (input, output, then scratch) and, per binding, the
/// address a transport may use in place (`None`: its messages are staged). Kept by the
/// prepared plan so that binding a run allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct RunBindings {
    pub(crate) bindings: Vec<ByteRegion>,
    pub(crate) direct: Vec<Option<RawRegion>>,
}

impl RunBindings {
    /// Room for `n` bindings.
    pub(crate) fn with_capacity(n: usize) -> Self {
        RunBindings {
            bindings: Vec::with_capacity(n),
            direct: Vec::with_capacity(n),
        }
    }

    /// Bind a run: `io` (the input and output regions the run uses, the caller's or the
    /// mirrors standing in for them), then each of `scratch` whole; with `addresses`, each
    /// binding's address as `backend` gives it (none for one it gives no address for).
    pub(crate) fn bind(
        &mut self,
        backend: &dyn Backend,
        io: [ByteRegion; 2],
        scratch: &[DeviceMem],
        addresses: bool,
    ) -> Result<()> {
        self.bindings.clear();
        self.bindings.extend(io);
        self.bindings.extend(scratch.iter().map(|m| whole(*m)));
        self.direct.clear();
        for r in &self.bindings {
            let raw = if addresses {
                backend.raw_region(*r, Private)?
            } else {
                None
            };
            self.direct.push(raw);
        }
        Ok(())
    }
}

/// How a run's local work reaches its backend: where launches are submitted and what the
/// runner's synchronization points wait for.
pub(crate) trait Launcher {
    /// The backend the bindings and the staging memory are on.
    fn backend(&self) -> &dyn Backend;
    /// Submit `launches`.
    ///
    /// # Safety
    /// As [`Backend::submit`].
    unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()>;
    /// What the runner's synchronization points wait for.
    fn wait(&self) -> Result<()>;
}

/// A backend's own launches, waited for on the host ([`super::DevicePlan`]).
impl Launcher for &dyn Backend {
    fn backend(&self) -> &dyn Backend {
        *self
    }

    unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()> {
        // SAFETY: the caller's contract, which is `Backend::submit`'s.
        unsafe { Backend::submit(*self, launches) }
    }

    fn wait(&self) -> Result<()> {
        self.synchronize()
    }
}

/// The executor's view of a prepared rank's memory during one run: its bindings on the
/// launcher's backend, the addresses a transport may use in place, and the staging buffers.
pub(crate) struct RunMemory<'m, L> {
    launcher: L,
    run: &'m RunBindings,
    send_stage: &'m mut HostBuf,
    recv_stage: &'m mut HostBuf,
    /// Where staging memory is allocated.
    staging_at: Location,
}

impl<'m, L: Launcher> RunMemory<'m, L> {
    /// The memory of runs of one rank's schedule on `run`'s bindings, staging through
    /// `stages` (send, receive) allocated at `staging_at`.
    ///
    /// # Safety
    /// The runs are of the schedule `run` was bound for, lowered onto one lane, so every slot
    /// lies within its binding; the bindings are regions of `launcher`'s backend, pairwise
    /// disjoint; each `Some` in `run.direct` is the address that backend gave (the sealed
    /// `Trusted::raw_region`) for the binding of the same index. That memory and the staging
    /// buffers are touched by nothing but the runs, their transport and this value's methods,
    /// and stay allocated, while the value lives and, after a run whose transport left
    /// requests pending, for as long as the transport may use them.
    pub(crate) unsafe fn new(
        launcher: L,
        run: &'m RunBindings,
        stages: (&'m mut HostBuf, &'m mut HostBuf),
        staging_at: Location,
    ) -> Self {
        RunMemory {
            launcher,
            run,
            send_stage: stages.0,
            recv_stage: stages.1,
            staging_at,
        }
    }

    /// A slot's bytes within its binding's region on the backend.
    fn region(&self, s: &Slot) -> ByteRegion {
        let b = self.run.bindings[s.binding as usize];
        ByteRegion {
            mem: b.mem,
            offset: b.offset + s.offset,
            bytes: s.bytes,
        }
    }
}

// SAFETY: `address` gives the slot's bytes (within its binding, `new`'s contract) of an address
// the backend gave for that binding, and `staging` two host buffers of at least the asked
// sizes, each an allocation of its own held by the `HostBuf`s lent to `new` (the backend's host
// memory or a plain vector), so apart from each other and from every binding; `new`'s contract
// keeps all of them allocated and untouched by anything else for as long as the runner or its
// transport may use them.
unsafe impl<L: Launcher> RankMemory for RunMemory<'_, L> {
    fn address(&self, slot: &Slot) -> Option<RawRegion> {
        self.run.direct[slot.binding as usize].map(|r| RawRegion {
            addr: r.addr + slot.offset as usize,
            bytes: slot.bytes,
            space: r.space,
        })
    }

    unsafe fn launch(&mut self, program: &Program) -> Result<()> {
        if program.lanes.len() != 1 {
            return Err(CollectivesError::InvalidPlan {
                op: None,
                message: format!(
                    "a rank's local work over MPI runs on one lane, this program has {}",
                    program.lanes.len()
                ),
            });
        }
        let launch = Launch {
            program,
            bindings: &self.run.bindings,
        };
        // SAFETY: the program has one lane (checked above), so its commands never race each
        // other; its bindings are disjoint (`new`'s contract); pending transfers use ranges the
        // checker proved disjoint from the segment's ops (the runner's contract on `launch`).
        unsafe { self.launcher.submit(&[launch]) }
    }

    fn synchronize(&mut self) -> Result<()> {
        self.launcher.wait()
    }

    fn download(&mut self, slot: &Slot, dst: &mut [u8]) -> Result<()> {
        self.launcher.backend().download(self.region(slot), dst)
    }

    fn upload(&mut self, slot: &Slot, src: &[u8]) -> Result<()> {
        self.launcher.backend().upload(self.region(slot), src)
    }

    fn staging(&mut self, send: usize, recv: usize) -> Result<(*mut u8, *mut u8)> {
        let backend = self.launcher.backend();
        let s = self.send_stage.ensure(backend, self.staging_at, send)?;
        let r = self.recv_stage.ensure(backend, self.staging_at, recv)?;
        Ok((s, r))
    }
}
