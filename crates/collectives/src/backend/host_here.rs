//! One rank's part of a program run on the calling thread: the per-rank calls of ranks that
//! share one host memory (`rank/direct.rs`) cut the commands of their own lanes out of a
//! cached plan's program, resolve them here against the memory every rank lent for the call,
//! and run them on their own thread instead of on the backend's pool. The checks
//! (`validate::resolve`), the lane tasks, the peepholes and the copy and reduction loops are
//! the host backend's own.

use super::Program;
use super::host::task_of;
use super::host_lanes::{Task, run_here};
use super::host_peephole::{forward_copies, fuse_fan_out};
use super::validate::{self, Bound};
use crate::error::{CollectivesError, Result};

/// A program's commands resolved to lane tasks for one set of bound addresses, kept so that a
/// call with the same addresses runs them again without resolving.
#[derive(Debug)]
pub(crate) struct HereTasks {
    lanes: Vec<Vec<Task>>,
    srcs: Vec<usize>,
    outs: Vec<(usize, bool)>,
    events: Vec<bool>,
}

impl HereTasks {
    /// Check and resolve every command of `program` against `bound` (one region per binding:
    /// slots inside their bindings, copies of equal lengths, reductions aligned, events
    /// recorded before they are waited for), then apply the host backend's peepholes per lane.
    /// `lent(b)`: binding `b` is a caller's memory, so large copies into it stream their
    /// stores.
    ///
    /// Errors: the first broken rule, naming the command; nothing has run then.
    pub(crate) fn resolve(
        program: &Program,
        bound: &[Bound],
        lent: impl Fn(usize) -> bool,
    ) -> Result<Self> {
        let resolved = validate::resolve("host", 0, program, bound)?;
        let mut lanes: Vec<Vec<Task>> = vec![Vec::new(); program.lanes.len()];
        let mut srcs: Vec<usize> = resolved.srcs.iter().map(|&a| a as usize).collect();
        for c in resolved.commands {
            let (lane, task) = task_of(c, program, (0, 0), &lent);
            lanes[lane].push(task);
        }
        let mut outs = Vec::new();
        for lane in &mut lanes {
            forward_copies(lane, &mut srcs);
            fuse_fan_out(lane, &srcs, &mut outs);
        }
        lanes.retain(|l| !l.is_empty());
        Ok(HereTasks {
            lanes,
            srcs,
            outs,
            events: vec![false; program.events as usize],
        })
    }

    /// Run every lane to its end on this thread.
    ///
    /// Errors: lanes left waiting for events none of them records (a program whose events
    /// cross to lanes it does not hold).
    ///
    /// # Safety
    /// The memory `resolve` was given is live for the whole run, and nothing else touches a
    /// byte this program writes, or writes a byte it reads, until the run returns.
    pub(crate) unsafe fn run(&mut self) -> Result<()> {
        self.events.fill(false);
        // SAFETY: `resolve` checked every address against the bound regions, which the
        // caller keeps live and to this run alone where it writes.
        unsafe { run_here(&self.lanes, &self.srcs, &self.outs, &mut self.events) }.map_err(
            |message| CollectivesError::Backend {
                backend: "host",
                message,
            },
        )
    }
}
