//! A prepared rank's memory on a backend ([`PlanMemory`]: scratch, mirrors, host staging) and
//! the copies of its mirrors; the executor's view of it during one run is
//! `exec::run_memory::RunMemory`. [`super::DevicePlan`] and the GPU ranks (`gpu_run.rs`) both
//! run through it; they differ only in how launches are submitted and waited for
//! (`Launcher`).

use std::sync::Arc;

use relaycc_route::{Location, Plan};

use super::schedule::RankSchedule;
use crate::backend::{Backend, Command, DeviceMem, Program};
use crate::exec::run_memory::one_copy;
pub(super) use crate::exec::run_memory::{HostBuf, Launcher, RunBindings, RunMemory, whole};

/// The backend memory MPI may read or write during a run: scratch, mirrors and staging,
/// with a share of the backend that owns it. Dropping it frees the allocations; after a
/// failure that left requests with MPI it moves to the communicator's graveyard, whose
/// share of the backend keeps the memory allocated for as long as MPI may use it.
#[derive(Debug)]
pub(super) struct PlanMemory {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) scratch: Vec<DeviceMem>,
    /// Backend memory of this plan standing in for the caller's input and output (copied in
    /// before the first level, out after the last): `DevicePlan` in `Direct` mode, so that no
    /// request MPI keeps after a failure points into the caller's regions; GPU ranks
    /// (`gpu.rs`) also stand their input mirror in for an in-place call's input. `None` where
    /// a plan has none, or for an empty region.
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

/// The one-copy programs of a prepared plan's mirrors, built once with the plan: the input
/// copied into its mirror, and the output mirror copied out, each as long as the schedule's
/// region.
#[derive(Debug)]
pub(super) struct MirrorCopies {
    pub(super) copy_in: Program,
    pub(super) copy_out: Program,
}

impl MirrorCopies {
    /// The copies of `schedule`'s input and output regions on `lane`; `plan` gives the dtype,
    /// operation and divisor every program carries.
    pub(super) fn new(lane: Location, plan: &Plan, schedule: &RankSchedule) -> Self {
        let call = (plan.dtype, plan.request.op, plan.request.nranks() as u32);
        let copy = |bytes: usize| one_copy(lane, call, bytes as u64);
        MirrorCopies {
            copy_in: copy(schedule.input_len),
            copy_out: copy(schedule.output_len),
        }
    }

    /// The copies resized for a schedule whose input and output are `input_len` and
    /// `output_len` bytes (a capacity plan's schedule bound to a call's counts), in place.
    #[cfg(feature = "cuda")]
    pub(super) fn set_lens(&mut self, input_len: usize, output_len: usize) {
        for (program, bytes) in [
            (&mut self.copy_in, input_len),
            (&mut self.copy_out, output_len),
        ] {
            for c in &mut program.commands {
                if let Command::Copy { src, dst, .. } = c {
                    (src.bytes, dst.bytes) = (bytes as u64, bytes as u64);
                }
            }
        }
    }
}
