//! The plan builder the collective planners write through: it sends regions over cached
//! connections and reduces locally, and writes every op through the one [`PlanWriter`],
//! which derives every dependency.
//!
//! Planners describe only data movement. Under a window ([`crate::template`]) the builder
//! emits only the ops that touch a window memory and skips every other `send` and `reduce`
//! before tracking anything: dependencies on window memories stay complete, and a lane of a
//! window device gets all its ops in order.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::connect::Connection;

use crate::plan_writer::PlanWriter;
use crate::route_pipeline::{Chunks, LaneMap};
use crate::template::window::{UserMem, Window};
use relaycc_plan::Request;
use relaycc_plan::{BufferRef, Location, Plan, Region, mem_of};
use relaycc_plan::{Result, RouteError};

use super::PlannerContext;

/// Lane channels reserved per planner channel: each route of a split connection gets its own
/// lanes (`channel * CH_STRIDE + route`), more than [`relaycc_plan::path::MAX_FLOW_PATHS`] routes.
pub const CH_STRIDE: u32 = 64;

/// Writes a plan through cached connections, deriving dependencies (see the module docs).
pub(crate) struct PlanBuilder<'a, 't> {
    /// The plan being built, with the writer that derives its dependencies.
    pub w: PlanWriter<'t>,
    ctx: &'a PlannerContext<'t>,
    lanes: LaneMap,
    /// Connections chosen by the planner for (channel, from GPU, to GPU), used instead of the
    /// cache's (packed rings pick their own per ring).
    pinned: BTreeMap<(u32, u32, u32), Arc<Connection>>,
    /// Chunk (elements) copies are cut into, where a planner's phase sets its own instead of
    /// the context's.
    chunk: Option<u64>,
    /// The window of a windowed build ([`crate::template`]); `None` emits every op.
    window: Option<&'t Window>,
}

/// Ops past which a builder's plan and dependency tracks are freed off the planning thread
/// ([`crate::limits::drop_off_thread`]): a build of millions of ops stopped at its deadline
/// would otherwise spend a second past it freeing them.
const OPS_FREED_OFF_THREAD: usize = 100_000;

impl Drop for PlanBuilder<'_, '_> {
    fn drop(&mut self) {
        if self.w.plan.ops.len() >= OPS_FREED_OFF_THREAD {
            let held = (
                std::mem::take(&mut self.w.plan.ops),
                std::mem::take(&mut self.w.mems),
                std::mem::take(&mut self.lanes),
                std::mem::take(&mut self.pinned),
            );
            crate::limits::drop_off_thread(held);
        }
    }
}

impl<'a, 't> PlanBuilder<'a, 't> {
    /// A builder for `req`, named `algorithm`.
    pub fn new(req: &Request, ctx: &'a PlannerContext<'t>, algorithm: impl Into<String>) -> Self {
        PlanBuilder {
            w: PlanWriter::new(Plan::new(req.clone(), algorithm), ctx.limit),
            ctx,
            lanes: LaneMap::default(),
            pinned: BTreeMap::new(),
            chunk: None,
            window: ctx.window,
        }
    }
    /// How many of `steps` repeating steps (a ring phase's steps, a tree channel's chunks, an
    /// all_to_all's rounds) to build: all of them, or the context's step sample
    /// ([`PlannerContext::sample_steps`]) where it is fewer.
    pub fn sample_steps(&self, steps: usize) -> usize {
        self.ctx.sample_steps.map_or(steps, |k| {
            steps.min(usize::try_from(k).unwrap_or(usize::MAX))
        })
    }
    /// The GPU of rank `r`.
    pub fn gpu(&self, r: u32) -> u32 {
        self.w
            .plan
            .request
            .gpus
            .get(r as usize)
            .copied()
            .unwrap_or(0)
    }
    /// A staging buffer of `len` elements on rank `r`'s GPU.
    pub fn scratch(&mut self, r: u32, len: u64) -> BufferRef {
        let g = self.gpu(r);
        self.w.plan.add_scratch(Location::Gpu(g), len)
    }
    /// Order everything emitted after this call after everything emitted before it (one
    /// collective call after another on one stream).
    pub fn fence(&mut self) {
        self.w.fence();
    }
    /// Cut the copies sent from now on into chunks of `elems` elements instead of the
    /// context's chunk (hierarchical plans pipeline each phase at its own block size).
    pub fn set_chunk_elems(&mut self, elems: u64) {
        self.chunk = Some(elems.max(1));
    }
    /// Send from GPU `from` to GPU `to` on channel `ch` over `conn` from now on, instead of
    /// the cache's connection.
    pub fn pin(&mut self, ch: u32, from: u32, to: u32, conn: Arc<Connection>) {
        self.pinned.insert((ch, from, to), conn);
    }
    /// False only when the build is windowed and every op between the memories of `ranks`
    /// (their buffers, their GPUs' scratch, relays on their hosts) would be skipped, so a
    /// planner may leave out the loop iterations that touch nothing else; always true for a
    /// build without a window.
    pub fn may_touch(&self, ranks: &[u32]) -> bool {
        match &self.window {
            None => true,
            Some(w) => ranks
                .iter()
                .any(|&r| !w.rank_cold(r, Location::Gpu(self.gpu(r)))),
        }
    }
    /// False only when the build is windowed and a send of `src` to `dst` between the GPUs of
    /// ranks `ends`, relayed (if at all) through GPUs of their hosts, would be skipped
    /// entirely: neither end's host holds a window device and neither region overlaps a
    /// window range. A planner may then leave the send out before looking up its connection.
    pub fn may_send(&self, src: Region, dst: Region, ends: [u32; 2]) -> bool {
        match &self.window {
            None => true,
            Some(w) => {
                ends.iter().any(|&r| w.hot(Location::Gpu(self.gpu(r))))
                    || self.region_in_window(w, src)
                    || self.region_in_window(w, dst)
            }
        }
    }
    /// True when `r` overlaps a window range of a user buffer.
    fn region_in_window(&self, w: &Window, r: Region) -> bool {
        let (m, base) = mem_of(&self.w.plan.request, r.buffer);
        UserMem::of(m).is_some_and(|u| w.overlaps(u, base + r.offset, base + r.offset + r.len))
    }
    /// The connection a send from GPU `a` to GPU `b` on channel `ch` takes.
    fn connection(&self, ch: u32, a: u32, b: u32) -> Result<Arc<Connection>> {
        match self.pinned.get(&(ch, a, b)) {
            Some(c) => Ok(Arc::clone(c)),
            None => self.ctx.cache.get(self.ctx.mode, a, b),
        }
    }
    /// True when a send of `src` (on `from`) to `dst` (on `to`) touches the window: either
    /// end, a window range, or a relay on a window device (relays sit on the ends' hosts, so
    /// the connection is looked up only where one of those hosts has a window device).
    #[allow(clippy::too_many_arguments)] // the send's parts, as `send_with` has them
    fn send_in_window(
        &self,
        w: &Window,
        src: Region,
        dst: Region,
        from: Location,
        to: Location,
        ch: u32,
        over: Option<&Arc<Connection>>,
    ) -> Result<bool> {
        if w.has(from)
            || w.has(to)
            || self.region_in_window(w, src)
            || self.region_in_window(w, dst)
        {
            return Ok(true);
        }
        if from == to || !(w.hot(from) || w.hot(to)) {
            return Ok(false);
        }
        let (Location::Gpu(a), Location::Gpu(b)) = (from, to) else {
            return Ok(false);
        };
        let conn = match over {
            Some(c) => Arc::clone(c),
            None => self.connection(ch, a, b)?,
        };
        Ok(conn
            .routes
            .iter()
            .any(|r| r.hops.iter().any(|h| w.has(h.from) || w.has(h.to))))
    }
    /// Move `src` to `dst` (same length): a local copy, or chunks over the connection between
    /// the two GPUs, on planner channel `ch`.
    pub fn send(&mut self, src: Region, dst: Region, ch: u32) -> Result<()> {
        self.send_with(src, dst, ch, None)
    }
    /// [`PlanBuilder::send`] over `conn` instead of the pinned or cached connection between the
    /// two GPUs (a planner choosing each send's connection itself pins nothing).
    pub fn send_over(
        &mut self,
        src: Region,
        dst: Region,
        ch: u32,
        conn: &Arc<Connection>,
    ) -> Result<()> {
        self.send_with(src, dst, ch, Some(conn))
    }
    fn send_with(
        &mut self,
        src: Region,
        dst: Region,
        ch: u32,
        over: Option<&Arc<Connection>>,
    ) -> Result<()> {
        if src.len != dst.len {
            return Err(RouteError::BadRequest(format!(
                "planner sends {} elements into {}",
                src.len, dst.len
            )));
        }
        if src.len == 0 {
            return Ok(());
        }
        let (from, to) = (self.w.location(src.buffer)?, self.w.location(dst.buffer)?);
        if let Some(w) = &self.window
            && !self.send_in_window(w, src, dst, from, to, ch, over)?
        {
            return Ok(());
        }
        if from == to {
            let lane = self.lanes.local(&mut self.w.plan, from, ch);
            self.w.copy(lane, src, dst, Vec::new(), &[])?;
            return Ok(());
        }
        let (Location::Gpu(a), Location::Gpu(b)) = (from, to) else {
            return Err(RouteError::BadRequest(
                "planners send between GPU buffers only".into(),
            ));
        };
        let conn = match over {
            Some(c) => Arc::clone(c),
            None => self.connection(ch, a, b)?,
        };
        let shares = conn.shares(src.len);
        let chunk = self.chunk.unwrap_or(self.ctx.chunk_elems);
        self.w.transfer(
            &mut self.lanes,
            src,
            dst,
            &conn.routes,
            &shares,
            Chunks::Each(chunk),
            ch * CH_STRIDE,
            &[],
        )?;
        Ok(())
    }
    /// `dst = op(srcs...)` on `dst`'s device, lane channel `ch`; `finalize` applies the Avg
    /// division (only passed on when the request's op is Avg).
    pub fn reduce(
        &mut self,
        srcs: Vec<Region>,
        dst: Region,
        finalize: bool,
        ch: u32,
    ) -> Result<()> {
        if dst.len == 0 {
            return Ok(());
        }
        let at = self.w.location(dst.buffer)?;
        if let Some(w) = &self.window
            && !w.has(at)
            && !srcs
                .iter()
                .chain([&dst])
                .any(|r| self.region_in_window(w, *r))
        {
            return Ok(());
        }
        let lane = self.lanes.local(&mut self.w.plan, at, ch);
        let fin = finalize && self.w.plan.request.op == relaycc_plan::ReduceOp::Avg;
        self.w.reduce(lane, srcs, dst, fin, &[])?;
        Ok(())
    }
    /// The finished plan.
    pub fn finish(mut self) -> Plan {
        // An empty plan in its place: what the builder frees when it drops.
        let empty = Plan::new(
            Request::new(
                self.w.plan.request.collective,
                Vec::new(),
                0,
                self.w.plan.dtype,
            ),
            String::new(),
        );
        let mut plan = std::mem::replace(&mut self.w.plan, empty);
        if self.window.is_some() {
            // The fold maps lanes to their images by these keys.
            plan.template = Some(relaycc_plan::Template {
                window_lanes: self.lanes.keys(plan.lanes.len()),
                ..Default::default()
            });
        }
        plan
    }
}
