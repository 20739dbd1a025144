//! Plans over a [`Backend`]'s memory: one rank's part of a plan with its buffers in device (or
//! host backend) memory. Local copies and reductions are backend launches; messages between
//! processes either hand MPI the backend's raw addresses ([`TransferMode::Direct`], what
//! CUDA-aware MPI allows) or go through host staging buffers ([`TransferMode::Staged`]):
//! download, `MPI_Isend`; `MPI_Irecv`, upload. Protocol and deadlock argument: `README.md`.

use std::sync::Arc;
use std::time::Instant;

use ::mpi::traits::AsRaw;
use relaycc_route::{DType, Location, Plan, ReduceOp};

use super::requests::Requests;
use super::schedule::RankSchedule;
use super::transport::MpiTransport;
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::backend::sealed::Private;
use crate::backend::{
    AddressSpace, Backend, ByteRegion, Command, DeviceMem, Launch, Program, RawRegion, Slot,
};
use crate::exec::lower::Lanes;
use crate::exec::run::{self, RankMemory};

/// How messages between processes reach device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferMode {
    /// Every message goes through host staging memory: the sender downloads the region into
    /// a staging buffer and sends that; the receiver receives into a staging buffer and
    /// uploads it once the level's messages are complete. Staging memory comes from the
    /// backend's host memory (pinned on CUDA) where the backend gives its address, else from
    /// a plain vector the plan owns. The default without `RELAYCC_MPI_CUDA_AWARE=1`.
    Staged,
    /// MPI reads and writes the backend's memory through the addresses the backend gives;
    /// device addresses are only sound with a CUDA-aware MPI. Every backend is this crate's
    /// ([`Backend`] is sealed), so the addresses are known to be right; buffers a backend
    /// gives no address for are staged as above. The default with
    /// `RELAYCC_MPI_CUDA_AWARE=1`.
    Direct,
}

/// Host memory for the messages of one level, allocated on first need and reused by every
/// level and run.
#[derive(Debug)]
pub(super) enum HostBuf {
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
    pub(super) fn ensure(
        &mut self,
        backend: &dyn Backend,
        at: Location,
        bytes: usize,
    ) -> crate::error::Result<*mut u8> {
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
        let whole = ByteRegion {
            mem,
            offset: 0,
            bytes: mem.bytes(),
        };
        Ok(match backend.raw_region(whole, Private) {
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

/// The backend memory MPI may read or write during a run: scratch, mirrors and staging,
/// with a share of the backend that owns it. Dropping it frees the allocations; after a
/// failure that left requests with MPI it moves to the communicator's graveyard, whose
/// share of the backend keeps the memory allocated for as long as MPI may use it.
#[derive(Debug)]
pub(super) struct PlanMemory {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) scratch: Vec<DeviceMem>,
    /// Direct mode: backend memory of this plan standing in for the caller's input and
    /// output (copied in before the first level, out after the last), so that no request MPI
    /// keeps after a failure points into the caller's regions. `None` when staged or empty.
    /// GPU ranks (`gpu.rs`) also stand their input mirror in for an in-place call's input.
    pub(super) mirrors: [Option<DeviceMem>; 2],
    pub(super) send_stage: HostBuf,
    pub(super) recv_stage: HostBuf,
}

impl PlanMemory {
    pub(super) fn new(backend: Arc<dyn Backend>) -> Self {
        PlanMemory {
            backend,
            scratch: Vec::new(),
            mirrors: [None, None],
            send_stage: HostBuf::None,
            recv_stage: HostBuf::None,
        }
    }
}

impl Drop for PlanMemory {
    fn drop(&mut self) {
        for m in self
            .scratch
            .drain(..)
            .chain(self.mirrors.iter_mut().filter_map(Option::take))
        {
            self.backend.free(m);
        }
        for s in [&mut self.send_stage, &mut self.recv_stage] {
            if let HostBuf::Backend { mem, .. } = std::mem::replace(s, HostBuf::None) {
                self.backend.free(mem);
            }
        }
    }
}

/// One rank's part of a plan bound to a backend: scratch allocated at the plan's locations,
/// the executor's per-rank lowering of it (local work as backend programs on one lane at this
/// process's device), staging buffers; built once by [`MpiCommunicator::prepare`], run many
/// times by the executor's runner. It holds a share of the backend, so the backend outlives
/// its memory; dropping the plan frees its allocations, except after a failed run that left
/// requests with MPI (then the communicator's graveyard keeps them, and the backend, until
/// MPI is done with them).
pub struct DevicePlan<'a> {
    comm: &'a MpiCommunicator,
    schedule: RankSchedule,
    mode: TransferMode,
    mem: PlanMemory,
    /// Where staging memory is allocated.
    staging_at: Location,
    /// Programs copying the caller's input into its mirror, and the output mirror out.
    copy_in: Program,
    copy_out: Program,
    /// Bindings of the current run: input, output, then scratch (kept to avoid allocating).
    bindings: Vec<ByteRegion>,
    /// Per binding, MPI's address of its first byte, or `None` when its messages are staged.
    direct: Vec<Option<RawRegion>>,
}

impl std::fmt::Debug for DevicePlan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePlan")
            .field("backend", &self.mem.backend.name())
            .field("mode", &self.mode)
            .field("messages", &self.schedule.messages())
            .field("stages", &self.schedule.depth())
            .finish()
    }
}

/// The executor's view of a [`DevicePlan`]'s memory during one run: its bindings on the
/// backend, MPI's addresses of those it may use in place, and the staging buffers.
struct BackendMemory<'m> {
    backend: &'m dyn Backend,
    bindings: &'m [ByteRegion],
    direct: &'m [Option<RawRegion>],
    send_stage: &'m mut HostBuf,
    recv_stage: &'m mut HostBuf,
    staging_at: Location,
}

impl BackendMemory<'_> {
    fn region(&self, s: &Slot) -> ByteRegion {
        slot_region(self.bindings, s)
    }
}

/// A one-copy program on `lane`, from binding 0 to binding 1, `bytes` long: a mirror's copy
/// in or out. `(dtype, op, divisor)` are the plan's, which every program carries.
pub(super) fn copy_program(
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

/// A slot's bytes within its binding's region on the backend.
pub(super) fn slot_region(bindings: &[ByteRegion], s: &Slot) -> ByteRegion {
    let b = bindings[s.binding as usize];
    ByteRegion {
        mem: b.mem,
        offset: b.offset + s.offset,
        bytes: s.bytes,
    }
}

/// A slot's raw address, where MPI may use its binding in place (`direct`).
pub(super) fn slot_address(direct: &[Option<RawRegion>], s: &Slot) -> Option<RawRegion> {
    direct[s.binding as usize].map(|r| RawRegion {
        addr: r.addr + s.offset as usize,
        bytes: s.bytes,
        space: r.space,
    })
}

// SAFETY: `address` gives the slot's bytes of an address the backend gave for its binding
// (the sealed `Trusted::raw_region`, trusted because only this crate's backends implement
// it), a region of this plan's scratch or mirrors, which the plan (or, after a failure, the
// communicator's graveyard) keeps allocated while MPI may use it, and which nothing outside
// the run touches; `staging` gives two host buffers of at least the asked sizes owned by the
// plan (the backend's host memory or plain vectors), kept the same way and apart from every
// binding.
unsafe impl RankMemory for BackendMemory<'_> {
    fn address(&self, slot: &Slot) -> Option<RawRegion> {
        slot_address(self.direct, slot)
    }

    unsafe fn launch(&mut self, program: &Program) -> crate::error::Result<()> {
        let launch = Launch {
            program,
            bindings: self.bindings,
        };
        // SAFETY: the program has one lane, so its commands never race each other; its
        // bindings are disjoint (`run` refuses overlapping input and output, scratch is this
        // plan's own); pending MPI requests use ranges the checker proved disjoint from the
        // segment's ops (the runner's contract).
        unsafe { self.backend.submit(&[launch]) }
    }

    fn synchronize(&mut self) -> crate::error::Result<()> {
        self.backend.synchronize()
    }

    fn download(&mut self, slot: &Slot, dst: &mut [u8]) -> crate::error::Result<()> {
        self.backend.download(self.region(slot), dst)
    }

    fn upload(&mut self, slot: &Slot, src: &[u8]) -> crate::error::Result<()> {
        self.backend.upload(self.region(slot), src)
    }

    fn staging(&mut self, send: usize, recv: usize) -> crate::error::Result<(*mut u8, *mut u8)> {
        let s = self
            .send_stage
            .ensure(self.backend, self.staging_at, send)?;
        let r = self
            .recv_stage
            .ensure(self.backend, self.staging_at, recv)?;
        Ok((s, r))
    }
}

impl<'a> DevicePlan<'a> {
    /// See [`MpiCommunicator::prepare`].
    pub(super) fn new(
        comm: &'a MpiCommunicator,
        backend: Arc<dyn Backend>,
        plan: &Plan,
    ) -> MpiResult<Self> {
        // Raw addresses go to MPI while launches run: only the checker's proof that unordered
        // ops touch disjoint bytes makes that sound, so unchecked plans are refused.
        relaycc_route::check(plan)?;
        let device = Location::Gpu(comm.device());
        // One lane at this process's device: the plan names memories by the topology's GPUs,
        // and this process's backend knows its own device only.
        let lanes = Lanes::Fold {
            count: 1,
            at: device,
        };
        let schedule =
            RankSchedule::with_lanes(plan, comm.rank(), &|l| comm.owner(plan, l), lanes)?;
        let local = |l: Location| match l {
            Location::Gpu(_) => device,
            host => host,
        };
        let staging_at = schedule
            .scratch_at
            .iter()
            .copied()
            .find(|l| matches!(l, Location::Host(_)))
            .unwrap_or(Location::Host(0));
        let divisor = plan.request.nranks() as u32;
        let copy = |bytes: usize| {
            copy_program(device, (plan.dtype, plan.request.op, divisor), bytes as u64)
        };
        let (copy_in, copy_out) = (copy(schedule.input_len), copy(schedule.output_len));
        let mut dp = DevicePlan {
            comm,
            mode: comm.transfer(),
            mem: PlanMemory::new(backend),
            staging_at,
            copy_in,
            copy_out,
            bindings: Vec::with_capacity(2 + schedule.scratch.len()),
            direct: Vec::with_capacity(2 + schedule.scratch.len()),
            schedule,
        };
        // On an error here `dp.mem`'s drop frees what was allocated so far.
        let mem = &mut dp.mem;
        for (bytes, at) in dp.schedule.scratch.iter().zip(&dp.schedule.scratch_at) {
            let m = mem.backend.allocate(local(*at), *bytes as u64)?;
            mem.scratch.push(m);
        }
        if dp.mode == TransferMode::Direct {
            let lens = [dp.schedule.input_len, dp.schedule.output_len];
            for (m, len) in mem.mirrors.iter_mut().zip(lens) {
                if len > 0 {
                    *m = Some(mem.backend.allocate(device, len as u64)?);
                }
            }
        }
        Ok(dp)
    }

    /// Bytes of this rank's input region.
    pub fn input_bytes(&self) -> u64 {
        self.schedule.input_len as u64
    }
    /// Bytes of this rank's output region.
    pub fn output_bytes(&self) -> u64 {
        self.schedule.output_len as u64
    }
    /// Messages this rank sends and receives per run (zero-byte ones are never sent).
    pub fn messages(&self) -> (usize, usize) {
        self.schedule.messages()
    }
    /// Stages of this rank: dependency levels at which it sends or receives.
    pub fn levels(&self) -> usize {
        self.schedule.depth()
    }
    /// How messages reach the backend's memory (the communicator's mode when prepared).
    pub fn mode(&self) -> TransferMode {
        self.mode
    }

    /// Run this rank's part with `input` and `output` (regions of this backend's memory of
    /// [`Self::input_bytes`] and [`Self::output_bytes`]; a zero-byte region where the rank has
    /// none). Collective over the plan's ranks, run by the executor's runner
    /// ([`crate::exec::run::run`]): per stage, the local work since the previous stage, then
    /// post receives, post sends (downloading staged ones first), launch the level's local
    /// work, wait for the messages and the launch, upload staged receives; then the local
    /// work after the last stage. In `Direct` mode the input is first copied
    /// into this plan's mirror of it, and the output mirror copied out at the end, so MPI is
    /// never handed the caller's regions.
    ///
    /// Errors: [`MpiError::Failed`] when a run on the communicator failed before; wrong or
    /// overlapping regions (before any message), a backend failure (this rank then finishes
    /// the level's posted messages and returns it; its peers time out on later levels), an
    /// MPI error or [`MpiError::Timeout`] (as [`MpiCommunicator::execute`]). Any error fails
    /// the communicator.
    pub fn run(&mut self, input: ByteRegion, output: ByteRegion) -> MpiResult<()> {
        self.comm.check_health()?;
        let mut reqs = Requests::new(self.comm.comm().as_raw(), self.comm.rank());
        let ran = self.run_levels(&mut reqs, input, output);
        if let Err(e) = &ran {
            // Peers went ahead (or wait for this rank): the communicator is failed.
            let health = self.comm.health();
            health.fail(e);
            if let Some(stuck) = reqs.take_stuck() {
                // MPI may still read or write the staging buffers, the scratch and the
                // mirrors (never the caller's regions): the graveyard keeps them all with a
                // share of the backend, so neither is freed while MPI may use them. The plan
                // keeps empty memory; it never runs again (the communicator is failed).
                let backend = Arc::clone(&self.mem.backend);
                let kept = std::mem::replace(&mut self.mem, PlanMemory::new(backend));
                health.bury(stuck, Box::new(kept));
            }
        }
        ran
    }

    /// The body of [`Self::run`], posting on `reqs`.
    fn run_levels(
        &mut self,
        reqs: &mut Requests,
        input: ByteRegion,
        output: ByteRegion,
    ) -> MpiResult<()> {
        let bad = |side: &'static str, got: u64, needs: usize| MpiError::Buffer {
            side,
            got: got as usize,
            needs,
        };
        if input.bytes != self.schedule.input_len as u64 {
            return Err(bad("input", input.bytes, self.schedule.input_len));
        }
        if output.bytes != self.schedule.output_len as u64 {
            return Err(bad("output", output.bytes, self.schedule.output_len));
        }
        if input.overlaps(&output) {
            return Err(MpiError::Unsupported(
                "input and output overlap (in-place runs are not supported here)".into(),
            ));
        }
        // Both are regions of this plan's backend (a handle of another backend, or of freed
        // memory, names nothing there): refused here, before any message, on every rank that
        // passes one, rather than at whichever later step first touches it.
        for r in [input, output] {
            self.mem.backend.raw_region(r, Private)?;
        }
        let whole = |m: DeviceMem| ByteRegion {
            mem: m,
            offset: 0,
            bytes: m.bytes(),
        };
        let mirror = |i: usize, caller: ByteRegion| match self.mem.mirrors[i] {
            Some(m) => ByteRegion {
                bytes: caller.bytes,
                ..whole(m)
            },
            None => caller,
        };
        let (in_at, out_at) = (mirror(0, input), mirror(1, output));
        self.bindings.clear();
        self.bindings.extend([in_at, out_at]);
        self.bindings
            .extend(self.mem.scratch.iter().map(|m| whole(*m)));
        self.direct.clear();
        for r in &self.bindings {
            let raw = match self.mode {
                TransferMode::Staged => None,
                // Direct means MPI may use device addresses too (CUDA-aware); a binding the
                // backend gives no address for is staged.
                TransferMode::Direct => self.mem.backend.raw_region(*r, Private)?,
            };
            self.direct.push(raw);
        }
        if in_at != input {
            self.copy_between(&self.copy_in, input, in_at)?;
        }
        let timeout = self.comm.timeout();
        let PlanMemory {
            backend,
            send_stage,
            recv_stage,
            ..
        } = &mut self.mem;
        let mut mem = BackendMemory {
            backend: &**backend,
            bindings: &self.bindings,
            direct: &self.direct,
            send_stage,
            recv_stage,
            staging_at: self.staging_at,
        };
        // Every address MPI gets is a binding of this plan (scratch, or a mirror of the
        // caller's region in `Direct` mode) or its staging memory, never the caller's region:
        // after a failure that leaves requests with MPI, `run` moves all of them, with a
        // share of the backend, to the graveyard.
        let mut transport = MpiTransport::new(
            reqs,
            Instant::now() + timeout,
            timeout,
            self.mode == TransferMode::Direct,
        );
        run::run(&self.schedule.program, &mut mem, &mut transport)?;
        if out_at != output {
            self.copy_between(&self.copy_out, out_at, output)?;
        }
        Ok(())
    }

    /// Run a one-copy `program` from `src` to `dst` and wait for it.
    fn copy_between(&self, program: &Program, src: ByteRegion, dst: ByteRegion) -> MpiResult<()> {
        let bindings = [src, dst];
        // SAFETY: one copy command on one lane between the caller's region and this plan's own
        // mirror of it (distinct allocations), so no two commands touch a common byte; it runs
        // before the first level posts a message or after the last level's requests completed,
        // so MPI holds no raw address into either region meanwhile; `synchronize` below waits.
        unsafe {
            self.mem.backend.submit(&[Launch {
                program,
                bindings: &bindings,
            }])?;
        }
        self.mem.backend.synchronize()?;
        Ok(())
    }
}
