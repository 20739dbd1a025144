//! The one place ops enter a plan: every planner, node-aware strategy and rank-space plan
//! writes its copies, reductions and pipelined transfers through a [`PlanWriter`], which
//! derives their data dependencies and charges them to the call's limit.
//!
//! The writer tracks, per memory, which op last wrote each run of elements and which ops read
//! it since, and gives each new op the dependencies that order it after the writes it reads
//! (read-after-write) and after the reads and writes of what it overwrites (write-after-read,
//! write-after-write), so the checker's race rule holds by construction. Inputs and outputs
//! are tracked as they alias in NCCL's in-place calls (the layout
//! [`relaycc_plan::CheckOptions::in_place`] describes), so a plan written here is ordered for
//! both the in-place and the out-of-place call; a planner that writes a plan for the
//! out-of-place call only (its ops would be wrong in place) asks for separate memories
//! instead ([`PlanWriter::out_of_place`]).
//!
//! A planner may also order an op after others for reasons other than data (a round of
//! staging slots after the round that last used them, pacing): it names those ops, and the
//! writer adds them to what it derived. A relay's staging ring inside a transfer is ordered
//! by the pipeline that lays it out (`route_pipeline`), which knows each slot's occupant.
//!
//! One planner orders every op itself and has the writer derive nothing
//! ([`PlanWriter::ordered`]): NVLS, the model of NCCL's NVLink SHARP algorithm, whose plan is
//! timed, not run, and whose tracking on 72 GPUs costs more than the rest of its planning
//! (`docs/MEASUREMENTS.md`). The checker proves its ordering as it proves every plan's.

use relaycc_plan::path::Route;
use relaycc_plan::{BufferRef, Location, Mem, NvlsShare, Plan, Region, Result, RouteError, mem_of};

use crate::access::AccessTrack;
use crate::limits::Limit;
use crate::route_pipeline::{ArrivedPiece, Chunks, LaneMap, emit_transfer};

/// Marks a lane with no op since the last fence.
const NO_OP: u32 = u32::MAX;

/// Access tracks of every memory a plan touches, indexed directly (plans have thousands of
/// scratch buffers, so a map lookup per access shows up in planning time).
#[derive(Debug, Default)]
pub(crate) struct Mems {
    rank: Vec<AccessTrack>,
    rank_out: Vec<AccessTrack>,
    scratch: Vec<AccessTrack>,
}

impl Mems {
    fn track(&mut self, m: Mem) -> &mut AccessTrack {
        let (v, i) = match m {
            Mem::Rank(i) => (&mut self.rank, i),
            Mem::RankOut(i) => (&mut self.rank_out, i),
            Mem::Scratch(i) => (&mut self.scratch, i),
        };
        let i = i as usize;
        if v.len() <= i {
            v.resize_with(i + 1, AccessTrack::default);
        }
        &mut v[i]
    }
}

/// How a writer tracks accesses to derive data dependencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracking {
    /// Inputs and outputs as they alias in the in-place call (a plan for both calls).
    InPlaceLayout,
    /// Inputs and outputs as separate memories (a plan for the out-of-place call only).
    Separate,
    /// Nothing derived: the planner orders every op itself ([`PlanWriter::ordered`]).
    Off,
}

/// Writes ops into a plan, deriving their data dependencies (see the module docs).
#[derive(Debug)]
pub(crate) struct PlanWriter<'t> {
    /// The plan being written.
    pub plan: Plan,
    pub(crate) mems: Mems,
    /// Ops every lane's first op after the last fence waits for.
    fence: Vec<u32>,
    /// Per lane: whether its first op since the last fence has been given the fence.
    fenced: Vec<bool>,
    /// Per lane: its last op since the last fence, or `NO_OP`.
    lane_last: Vec<u32>,
    /// The limit every op written is charged to (`PlannerContext::limit`).
    limit: Option<&'t Limit>,
    /// How accesses are tracked.
    tracking: Tracking,
}

impl<'t> PlanWriter<'t> {
    /// A writer of `plan` whose ops are charged to `limit`.
    pub fn new(plan: Plan, limit: Option<&'t Limit>) -> Self {
        PlanWriter {
            plan,
            mems: Mems::default(),
            fence: Vec::new(),
            fenced: Vec::new(),
            lane_last: Vec::new(),
            limit,
            tracking: Tracking::InPlaceLayout,
        }
    }

    /// A writer that derives nothing: every op waits only on the ops its planner names
    /// (`after`). For a planner whose explicit order is complete and whose tracking would cost
    /// more than its planning (see the module docs); the checker still proves the order.
    pub fn ordered(plan: Plan, limit: Option<&'t Limit>) -> Self {
        PlanWriter {
            tracking: Tracking::Off,
            ..PlanWriter::new(plan, limit)
        }
    }

    /// A writer of a plan for the out-of-place call only: every rank's input and output are
    /// separate memories, so ops that would clash only in place are not ordered.
    pub fn out_of_place(plan: Plan, limit: Option<&'t Limit>) -> Self {
        PlanWriter {
            tracking: Tracking::Separate,
            ..PlanWriter::new(plan, limit)
        }
    }

    /// The memory buffer `b` lies in and its base offset there, in the layout tracked.
    fn mem_at(&self, b: BufferRef) -> (Mem, u64) {
        match (self.tracking, b) {
            (Tracking::Separate, BufferRef::Input(r)) => (Mem::Rank(r), 0),
            (Tracking::Separate, BufferRef::Output(r)) => (Mem::RankOut(r), 0),
            _ => mem_of(&self.plan.request, b),
        }
    }

    /// The ops a new op reading `reads` and writing `write` must follow for the data.
    fn deps_of(&mut self, reads: &[Region], write: Option<Region>, after: &[u32]) -> Vec<u32> {
        let mut d = after.to_vec();
        if self.tracking != Tracking::Off {
            for (r, w) in reads
                .iter()
                .map(|r| (r, false))
                .chain(write.iter().map(|r| (r, true)))
            {
                let (m, base) = self.mem_at(r.buffer);
                let a = base + r.offset;
                self.mems.track(m).deps(a, a + r.len, w, &mut d);
            }
        }
        d.sort_unstable();
        d.dedup();
        d
    }

    fn record(&mut self, r: Region, op: u32, write: bool) {
        if self.tracking == Tracking::Off {
            return;
        }
        let (m, base) = self.mem_at(r.buffer);
        let a = base + r.offset;
        let t = self.mems.track(m);
        if write {
            t.write(a, a + r.len, op);
        } else {
            t.read(a, a + r.len, op);
        }
    }

    /// Apply the fence to new ops `from..`, note each lane's last op and charge them.
    fn settle(&mut self, from: usize) -> Result<()> {
        let lanes = self.plan.lanes.len();
        if self.lane_last.len() < lanes {
            self.lane_last.resize(lanes, NO_OP);
            self.fenced.resize(lanes, false);
        }
        for id in from..self.plan.ops.len() {
            let lane = self.plan.ops[id].lane as usize;
            if !self.fence.is_empty() && !self.fenced[lane] {
                self.fenced[lane] = true;
                self.plan.ops[id].deps.extend_from_slice(&self.fence);
            }
            self.lane_last[lane] = id as u32;
        }
        crate::limits::charge(self.limit, (self.plan.ops.len() - from) as u64)
    }

    /// Order everything written after this call after everything written before it (one
    /// collective call after another on one stream).
    pub fn fence(&mut self) {
        if self.lane_last.iter().all(|&op| op == NO_OP) {
            return;
        }
        self.fence = self
            .lane_last
            .iter()
            .copied()
            .filter(|&op| op != NO_OP)
            .collect();
        self.lane_last.fill(NO_OP);
        self.fenced.fill(false);
    }

    /// The location of buffer `b`, or an error naming it.
    pub fn location(&self, b: BufferRef) -> Result<Location> {
        self.plan
            .location(b)
            .ok_or_else(|| RouteError::BadRequest(format!("planner named a missing buffer {b:?}")))
    }

    /// Copy `src` to `dst` over topology edges `edges` on `lane`, after the ops the data needs
    /// and after `after`. Returns the op.
    pub fn copy(
        &mut self,
        lane: u32,
        src: Region,
        dst: Region,
        edges: Vec<u32>,
        after: &[u32],
    ) -> Result<u32> {
        self.copy_in(lane, (src, dst), edges, after, None)
    }

    /// [`PlanWriter::copy`] as a member of NVLS group `share` (copies an NVSwitch combines).
    pub fn nvls_copy(
        &mut self,
        lane: u32,
        src: Region,
        dst: Region,
        edges: Vec<u32>,
        after: &[u32],
        share: NvlsShare,
    ) -> Result<u32> {
        self.copy_in(lane, (src, dst), edges, after, Some(share))
    }

    fn copy_in(
        &mut self,
        lane: u32,
        (src, dst): (Region, Region),
        edges: Vec<u32>,
        after: &[u32],
        share: Option<NvlsShare>,
    ) -> Result<u32> {
        let deps = self.deps_of(&[src], Some(dst), after);
        let start = self.plan.ops.len();
        let id = self.plan.copy(lane, src, dst, edges, deps);
        self.plan.ops[id as usize].nvls = share;
        self.record(src, id, false);
        self.record(dst, id, true);
        self.settle(start)?;
        Ok(id)
    }

    /// `dst = op(srcs...)` on `lane`, after the ops the data needs and after `after`;
    /// `finalize` marks the reduction that applies an Avg's division. Returns the op.
    pub fn reduce(
        &mut self,
        lane: u32,
        srcs: Vec<Region>,
        dst: Region,
        finalize: bool,
        after: &[u32],
    ) -> Result<u32> {
        let deps = self.deps_of(&srcs, Some(dst), after);
        let start = self.plan.ops.len();
        let id = self.plan.reduce(lane, srcs.clone(), dst, finalize, deps);
        for s in srcs {
            self.record(s, id, false);
        }
        self.record(dst, id, true);
        self.settle(start)?;
        Ok(id)
    }

    /// Move `src` to `dst` (same length) over `routes` with `shares` of it each, pipelined in
    /// `chunks` through the relays' staging rings (`route_pipeline::emit_transfer`, lanes from
    /// `lanes` at lane channel `channel`), after the ops the data needs and after `after`.
    /// Returns the arrivals at `dst`.
    #[allow(clippy::too_many_arguments)] // the transfer's parts, as `emit_transfer` has them
    pub fn transfer(
        &mut self,
        lanes: &mut LaneMap,
        src: Region,
        dst: Region,
        routes: &[Route],
        shares: &[u64],
        chunks: Chunks<'_>,
        channel: u32,
        after: &[u32],
    ) -> Result<Vec<ArrivedPiece>> {
        let deps = self.deps_of(&[src], Some(dst), after);
        let start = self.plan.ops.len();
        let arrivals = emit_transfer(
            &mut self.plan,
            lanes,
            src,
            dst,
            routes,
            shares,
            chunks,
            channel,
            &deps,
        );
        for arr in &arrivals {
            let rel = arr.dst.offset - dst.offset;
            self.record(
                Region::new(src.buffer, src.offset + rel, arr.dst.len),
                arr.op,
                false,
            );
            self.record(arr.dst, arr.op, true);
        }
        self.settle(start)?;
        Ok(arrivals)
    }
}
