//! Plans over a [`Backend`]'s memory: one rank's part of a plan with its buffers in device (or
//! host backend) memory. Local copies and reductions are backend launches; messages between
//! processes either hand MPI the backend's raw addresses ([`TransferMode::Direct`], what
//! CUDA-aware MPI allows) or go through host staging buffers ([`TransferMode::Staged`]):
//! download, `MPI_Isend`; `MPI_Irecv`, upload. Protocol and deadlock argument: `README.md`.

use std::sync::Arc;
use std::time::Instant;

use ::mpi::traits::AsRaw;
use relaycc_route::{Location, Plan};

use super::requests::Requests;
use super::run_memory::{MirrorCopies, PlanMemory, RunBindings, RunMemory, whole};
use super::schedule::RankSchedule;
use super::transport::MpiTransport;
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::backend::sealed::Private;
use crate::backend::{Backend, ByteRegion, Launch, Program};
use crate::exec::lower::Lanes;
use crate::exec::run;

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
    copies: MirrorCopies,
    /// Bindings of the current run and MPI's addresses of those it may use in place.
    run: RunBindings,
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
        let schedule = RankSchedule::with_lanes(plan, comm.rank, &|l| comm.owner(plan, l), lanes)?;
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
        let copies = MirrorCopies::new(device, plan, &schedule);
        let mut dp = DevicePlan {
            comm,
            mode: comm.transfer(),
            mem: PlanMemory::new(backend),
            staging_at,
            copies,
            run: RunBindings::with_capacity(2 + schedule.scratch.len()),
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
        let mut reqs = Requests::new(self.comm.comm().as_raw(), self.comm.rank);
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
        let mirror = |i: usize, caller: ByteRegion| match self.mem.mirrors[i] {
            Some(m) => ByteRegion {
                bytes: caller.bytes,
                ..whole(m)
            },
            None => caller,
        };
        let (in_at, out_at) = (mirror(0, input), mirror(1, output));
        // Direct means MPI may use device addresses too (CUDA-aware); a binding the backend
        // gives no address for is staged.
        let addresses = self.mode == TransferMode::Direct;
        let backend = &*self.mem.backend;
        self.run
            .bind(backend, [in_at, out_at], &self.mem.scratch, addresses)?;
        if in_at != input {
            self.copy_between(&self.copies.copy_in, input, in_at)?;
        }
        let timeout = self.comm.timeout.get();
        let PlanMemory {
            backend,
            send_stage,
            recv_stage,
            ..
        } = &mut self.mem;
        // SAFETY: the schedule was lowered onto one lane (`new`) and the bindings are its
        // regions at its sizes: the input and output checked above, the scratch allocated for
        // it. They are disjoint: the input and output were checked apart, mirrors and scratch
        // are this plan's own allocations. Addresses are the backend's, given by `bind`, and
        // only in `Direct` mode, where the caller's regions are bound only when empty (a
        // nonempty one has a mirror). So every byte MPI may use is this plan's scratch, mirrors
        // or staging, which nothing outside the run touches; the plan keeps them allocated,
        // and after a failure that leaves requests with MPI, `run` moves them all, with a
        // share of the backend, to the graveyard.
        let mut mem = unsafe {
            RunMemory::new(
                &**backend,
                &self.run,
                (send_stage, recv_stage),
                self.staging_at,
            )
        };
        let mut transport = MpiTransport::new(
            reqs,
            Instant::now() + timeout,
            timeout,
            self.mode == TransferMode::Direct,
        );
        run::run(&self.schedule.program, &mut mem, &mut transport)?;
        if out_at != output {
            self.copy_between(&self.copies.copy_out, out_at, output)?;
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
