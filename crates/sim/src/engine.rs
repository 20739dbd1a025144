//! The event loop: ops wait for their dependencies and their lane, spend their latency, then
//! run as fluid flows at max-min fair rates until their bytes are through.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

use relaycc_topo::Topology;
use relaycc_topo::rates::{CostModel, Protocol};

use relaycc_plan::Plan;
use relaycc_plan::{Result, RouteError};

use super::config::SimConfig;
use super::dominance::binding_uses;
use super::fairshare::FairShare;
use super::model::{Model, NONE, Uses};
use super::result::{EdgeUse, MemUse, OpSpan, SimResult, combine_results, extrapolate_results};

/// Events closer than this (relative to the clock, and at least this many us) are handled
/// together, so flows that end "at once" up to rounding change the rates only once.
const SAME_TIME: f64 = 1e-10;

/// A latency wake-up: op `op`'s bytes start to flow at `time_us`. The heap pops the earliest
/// (ties: lowest op id, for determinism).
#[derive(Debug, Clone, Copy)]
struct Wake {
    time_us: f64,
    op: u32,
}

impl PartialEq for Wake {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Wake {}
impl PartialOrd for Wake {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Wake {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and we want the earliest wake-up.
        other
            .time_us
            .total_cmp(&self.time_us)
            .then(other.op.cmp(&self.op))
    }
}

/// A flow's progress: `remaining` bytes at time `since_us`, moving at `rate` bytes/us, so
/// ending at `end_us` unless its rate changes.
#[derive(Debug, Clone, Copy, Default)]
struct Flow {
    remaining: f64,
    since_us: f64,
    rate: f64,
    end_us: f64,
}

/// Simulate `plan` on `topo`: when each op starts, when its bytes start to flow, when it ends,
/// and how busy each edge and memory was.
///
/// An op becomes ready when its dependencies and every earlier op of its lane have finished.
/// It then waits a fixed latency (its mechanism's cost from the topology's cost model: a
/// copy-engine launch plus its edges' latencies for relaycc's copies, a kernel launch for its
/// reductions, a protocol step for an NCCL-like plan's copies; plus `cfg.op_overhead_us`) and
/// becomes a fluid flow of its bytes (elements x dtype size); an NCCL-like plan starts after
/// its protocol's launch latency. Flows share every resource
/// they cross max-min fairly; rates are recomputed whenever the set of flows changes. A copy
/// loads its edges once per byte and each end in host memory once; a copy inside one memory
/// loads it twice; a reduction loads its device's memory `srcs + 1` times.
///
/// # Arguments
/// * `topo`: the (masked) topology; edge capacities are `link.gbps`, memories come from the GPU
///   rates table and each CPU's `host_mem_gbps`.
/// * `plan`: the plan; op `edges` index the topology's directed links.
/// * `cfg`: settings; [`SimConfig::default`] adds nothing to the cost model's per-op costs.
///
/// # Returns
/// A [`SimResult`]: the makespan, a span per op, and the edges and memories that carried bytes.
/// An error ([`RouteError::PlanCheck`] naming the op) when an op names a lane, dependency,
/// edge, buffer or location that does not exist, uses a masked edge, copies between two
/// memories over no edge, or waits on a dependency cycle.
///
/// # Complexity
/// `O((n + d) log n + sum over batches of (a + |C| * k + b * |R|))` for `n` ops and `d`
/// dependencies, where a batch is the set of events at one instant, `a` the flows active then
/// (scanned for the next end), `C` the flows that share resources (transitively) with a flow
/// that started or ended, `k` their resources each, `R` those resources and `b` the number of
/// distinct bottleneck levels among them. Memory `O(n + d + r)` for `r` resources; the event
/// loop allocates nothing once its buffers reach the plan's peak concurrency.
/// `benches/simulator.rs` times a 100k-op chunked ring on dgx1-v100.
///
/// # Example
/// ```
/// use relaycc_plan::{BufferRef, Location, Plan, Region, Request};
/// use relaycc_sim::{SimConfig, simulate};
/// let topo = relaycc_topo::preset("dgx1-v100").unwrap();
/// let (g0, g1) = (topo.gpu(0).unwrap(), topo.gpu(1).unwrap());
/// let edge = topo.link_between(g0, g1).unwrap().index() as u32; // NV1, 24.2 GB/s
/// let bytes = 1u64 << 20;
/// let mut plan = Plan::new(Request::point_to_point(0, 1, bytes), "direct");
/// let lane = plan.add_lane(Location::Gpu(0), "GPU0 send");
/// let src = Region::new(BufferRef::Input(0), 0, bytes);
/// let dst = Region::new(BufferRef::Output(1), 0, bytes);
/// plan.copy(lane, src, dst, vec![edge], vec![]);
/// let sim = simulate(&topo, &plan, &SimConfig::default()).unwrap();
/// // Below 8 MiB, to an NVLink peer: the executor's forward kernel, one launch.
/// let launch = topo.costs().kernel_launch_us; // 3 us
/// let expected = launch + 0.6 + bytes as f64 / 24.2e3; // launch + NVLink latency + transfer
/// assert!((sim.time_us - expected).abs() < 1e-9 * expected);
/// ```
///
/// Source: the fluid max-min model of flow-level network simulators (Bertsekas and Gallager,
/// *Data Networks*, 6.5.2, progressive filling).
///
/// A plan of rounds ([`Plan::rounds`]) is timed as its segments one after another: `R` times
/// its body's makespan and its tail's ([`relaycc_plan::rounds`]); its result has no op spans (the
/// plan holds no op of its own), and its edges' and memories' loads are the segments' summed.
/// A step-sampled plan ([`Plan::step_samples`]) is timed by extrapolating its samples'
/// makespans along the steps ([`relaycc_plan::step_samples`]); its result has no op spans either.
pub fn simulate(topo: &Topology, plan: &Plan, cfg: &SimConfig) -> Result<SimResult> {
    if let Some(s) = &plan.step_samples {
        relaycc_plan::step_samples::check_step_samples(plan)?;
        let short = simulate(topo, &s.short, cfg)?;
        let long = simulate(topo, &s.long, cfg)?;
        let (time_us, more) =
            relaycc_plan::step_samples::extrapolate_us(s, short.time_us, long.time_us);
        return Ok(extrapolate_results(time_us, &short, &long, more));
    }
    if let Some(r) = &plan.rounds {
        let body = simulate(topo, &r.body, cfg)?;
        let tail = r
            .tail
            .as_ref()
            .map(|t| simulate(topo, t, cfg))
            .transpose()?;
        return Ok(combine_results(r.count, &body, tail.as_ref()));
    }
    simulate_model(topo, &Model::build(topo, plan, cfg)?)
}

/// A lower bound on [`simulate`]'s makespan, microseconds, at a fraction of its cost: the
/// busiest resource's bytes over its capacity, and the longest single op. Planners use it to
/// skip simulating candidates that cannot beat the best one found.
///
/// Complexity: O(ops x resources per op) after building the model.
pub fn lower_bound_us(topo: &Topology, plan: &Plan, cfg: &SimConfig) -> Result<f64> {
    Ok(PreparedSim::new(topo, plan, cfg)?.lower_bound_us())
}

/// A plan checked against a topology and lowered for the simulator once, so that its lower
/// bound and then, if the bound is promising, its simulation share the work (the orchestrator
/// does both for most candidates).
#[derive(Debug)]
pub struct PreparedSim {
    model: Model,
}

impl PreparedSim {
    /// Check `plan` against `topo` and lower it; the errors are [`simulate`]'s.
    pub fn new(topo: &Topology, plan: &Plan, cfg: &SimConfig) -> Result<PreparedSim> {
        Ok(PreparedSim {
            model: Model::build(topo, plan, cfg)?,
        })
    }
    /// As [`lower_bound_us`].
    pub fn lower_bound_us(&self) -> f64 {
        let (busiest, longest) = self.bounds();
        // The last op cannot end before the host has issued every op (a plan of none: 0).
        let issued = match self.model.bytes.len() {
            0 => 0.0,
            n => self.model.issued_at_us((n - 1) as u32),
        };
        busiest.max(longest).max(issued)
    }
    /// The busiest resource's bytes over its capacity, microseconds: a lower bound on the
    /// makespan that depends only on how many bytes cross each resource, so it is the same for
    /// every chunking of one algorithm (unlike the longest-op term of
    /// [`PreparedSim::lower_bound_us`]).
    pub fn load_bound_us(&self) -> f64 {
        self.bounds().0
    }
    /// A lower bound on the makespan of the same plan run with NCCL protocol `to`, where this
    /// was prepared with the plan's protocol `from` and the plan has no NVLS copies: `to`'s
    /// launch latency plus the busiest resource, whose link bytes are rescaled by the two
    /// protocols' wire overheads (memories carry the same bytes under every protocol). It
    /// never exceeds [`PreparedSim::lower_bound_us`] of the plan prepared with `to`, and spares
    /// the tuner lowering a plan of millions of ops again (about a second) only to find that
    /// a protocol cannot win.
    pub fn protocol_load_bound_us(&self, costs: &CostModel, from: Protocol, to: Protocol) -> f64 {
        let model = &self.model;
        let scale = costs.bw_fraction(from) / costs.bw_fraction(to);
        if !(scale.is_finite() && scale > 0.0) {
            return 0.0;
        }
        let (load, _) = self.loads_and_longest();
        let busiest = load
            .iter()
            .zip(&model.caps)
            .enumerate()
            .map(|(r, (l, c))| {
                let l = if model.edge_of(r).is_some() {
                    l * scale
                } else {
                    *l
                };
                l / c
            })
            .fold(0.0f64, f64::max);
        // Rounding slack: the rescaled sums may differ from a fresh lowering's in the last bit.
        (costs.base_latency_us(to) + busiest) * (1.0 - 1e-9)
    }
    /// Bytes each resource carries over the whole plan, and the longest op alone on its
    /// resources (microseconds, after the plan's start).
    fn loads_and_longest(&self) -> (Vec<f64>, f64) {
        let model = &self.model;
        let mut load = vec![0.0f64; model.caps.len()];
        let mut longest = 0.0f64;
        for op in 0..model.bytes.len() {
            let (res, coef) = model.uses.of(op as u32);
            let mut t = model.latency_us[op];
            for (&r, &c) in res.iter().zip(coef) {
                let bytes = model.bytes[op] * c;
                load[r as usize] += bytes;
                t = t.max(model.latency_us[op] + bytes / model.caps[r as usize]);
            }
            longest = longest.max(t);
        }
        (load, longest)
    }
    /// (busiest resource, longest op), microseconds.
    fn bounds(&self) -> (f64, f64) {
        let model = &self.model;
        let (load, longest) = self.loads_and_longest();
        let busiest = load
            .iter()
            .zip(&model.caps)
            .map(|(l, c)| l / c)
            .fold(0.0f64, f64::max);
        (model.start_us + busiest, model.start_us + longest)
    }
    /// As [`simulate`], for the plan and topology this was prepared from.
    pub fn simulate(&self, topo: &Topology) -> Result<SimResult> {
        simulate_model(topo, &self.model)
    }
    /// As [`PreparedSim::simulate`], given up once `deadline` passes: `Ok(None)` then. The clock
    /// is read once every [`DEADLINE_CHECK_BATCHES`] batches of events, or sooner once they
    /// shared [`DEADLINE_CHECK_WORK`] active flows among them, so the check costs nothing
    /// measurable and a run stops within a few milliseconds of the deadline (a few tenths of
    /// a second where hundreds of thousands of flows share one component).
    pub fn simulate_until(
        &self,
        topo: &Topology,
        deadline: Option<Instant>,
    ) -> Result<Option<SimResult>> {
        self.simulate_while(topo, &|| deadline.is_none_or(|d| Instant::now() < d))
    }
    /// As [`PreparedSim::simulate_until`], going on while `go_on` says so (asked as often as
    /// the clock is read there): for a deadline that moves while the
    /// simulation runs.
    pub fn simulate_while(
        &self,
        topo: &Topology,
        go_on: &dyn Fn() -> bool,
    ) -> Result<Option<SimResult>> {
        Ok(self.simulate_or_cut(topo, go_on)?.ok())
    }
    /// As [`PreparedSim::simulate_while`], saying how far a run that gave up got: `Err(cut)`
    /// then, whose [`SimCut::reached_us`] is a lower bound on the makespan.
    pub fn simulate_or_cut(
        &self,
        topo: &Topology,
        go_on: &dyn Fn() -> bool,
    ) -> Result<std::result::Result<SimResult, SimCut>> {
        self.simulate_watched(topo, &|_| go_on())
    }
    /// As [`PreparedSim::simulate_or_cut`], with `go_on` shown how far the run got each time it
    /// is asked: so a caller can give up a run that cannot end in time, judged by its progress.
    pub fn simulate_watched(
        &self,
        topo: &Topology,
        go_on: &dyn Fn(&SimCut) -> bool,
    ) -> Result<std::result::Result<SimResult, SimCut>> {
        let mut engine = Engine::new(&self.model);
        engine.go_on = Some(go_on);
        engine.run();
        if engine.gave_up {
            return Ok(Err(SimCut {
                reached_us: engine.now_us,
                ops_done: engine.done,
                ops: engine.spans.len(),
            }));
        }
        engine.finish(topo).map(Ok)
    }
}

/// How far a simulation got: where it gave up at its deadline, or so far, as shown to the
/// caller's check ([`PreparedSim::simulate_watched`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimCut {
    /// Simulated time reached, microseconds: every op not finished ends later, so the
    /// makespan is at least this.
    pub reached_us: f64,
    /// Ops finished.
    pub ops_done: usize,
    /// Ops of the plan.
    pub ops: usize,
}

/// Batches of events between two reads of the clock in [`PreparedSim::simulate_until`].
pub const DEADLINE_CHECK_BATCHES: u32 = 256;

/// Active flows, summed over batches, after which the clock is read whatever the batches: a
/// batch whose flows all share a component (an all_to_all of 512 ranks starting 262,144 sends
/// at once) can take tens of milliseconds, and 256 of them outran a deadline by 9 s.
pub const DEADLINE_CHECK_WORK: usize = 1 << 20;

fn simulate_model(topo: &Topology, model: &Model) -> Result<SimResult> {
    let mut engine = Engine::new(model);
    engine.run();
    engine.finish(topo)
}

/// The simulation state.
struct Engine<'m> {
    m: &'m Model,
    /// Latency wake-ups.
    heap: BinaryHeap<Wake>,
    /// Predicted flow ends, pushed whenever a flow's rate changes; an entry whose flow has
    /// ended or whose end moved since is stale and skipped (`is_current`). Thousands of flows
    /// may be active while a batch re-rates a few, so scanning them all per batch would cost
    /// more than the fair sharing itself.
    ends: BinaryHeap<Wake>,
    fair: FairShare,
    /// The resources fair sharing reads: the model's, less those another always dominates
    /// ([`super::dominance`]).
    binding: Uses,
    /// Active flows on each resource, for its busy time.
    res_active: Vec<u32>,
    flows: Vec<Flow>,
    /// Ops whose bytes are flowing, and each op's index in that list.
    active: Vec<u32>,
    active_pos: Vec<u32>,
    /// Flows ending in the current batch (reused).
    ending: Vec<u32>,
    spans: Vec<OpSpan>,
    pending: Vec<u32>,
    done: usize,
    now_us: f64,
    /// Per resource: bytes carried (op bytes times coefficient), busy time so far, and since
    /// when it has been busy.
    res_bytes: Vec<f64>,
    res_busy_us: Vec<f64>,
    res_since_us: Vec<f64>,
    /// Whether to go on (planning budget), and whether the run gave up.
    go_on: Option<&'m dyn Fn(&SimCut) -> bool>,
    gave_up: bool,
}

impl<'m> Engine<'m> {
    fn new(m: &'m Model) -> Self {
        let n = m.bytes.len();
        let r = m.caps.len();
        Engine {
            m,
            heap: BinaryHeap::with_capacity(n.min(1 << 16)),
            ends: BinaryHeap::with_capacity(n.min(1 << 16)),
            fair: FairShare::new(r, n),
            binding: binding_uses(&m.uses, &m.caps, n),
            res_active: vec![0; r],
            flows: vec![Flow::default(); n],
            active: Vec::new(),
            active_pos: vec![NONE; n],
            ending: Vec::new(),
            spans: vec![
                OpSpan {
                    start_us: f64::NAN,
                    flow_start_us: f64::NAN,
                    end_us: f64::NAN,
                };
                n
            ],
            pending: m.deps.in_degrees().to_vec(),
            done: 0,
            now_us: m.start_us,
            res_bytes: vec![0.0; r],
            res_busy_us: vec![0.0; r],
            res_since_us: vec![0.0; r],
            go_on: None,
            gave_up: false,
        }
    }

    /// Whether heap entry `w` still predicts its flow's end.
    fn is_current(&self, w: &Wake) -> bool {
        self.active_pos[w.op as usize] != NONE && self.flows[w.op as usize].end_us == w.time_us
    }

    /// The earliest predicted flow end (stale entries dropped on the way).
    fn next_end(&mut self) -> f64 {
        while let Some(w) = self.ends.peek() {
            if self.is_current(w) {
                return w.time_us;
            }
            self.ends.pop();
        }
        f64::INFINITY
    }

    /// Collect into `self.ending` the flows predicted to end by `horizon`, in op order.
    fn collect_ending(&mut self, horizon: f64) {
        self.ending.clear();
        while let Some(&w) = self.ends.peek() {
            if !self.is_current(&w) {
                self.ends.pop();
                continue;
            }
            if w.time_us > horizon {
                break;
            }
            self.ends.pop();
            self.ending.push(w.op);
        }
        // A flow re-rated to the same end has two current entries.
        self.ending.sort_unstable();
        self.ending.dedup();
    }

    /// Rebuild the end heap from the active flows once stale entries outnumber them, so it
    /// stays within a few times the active flows.
    fn compact_ends(&mut self) {
        if self.ends.len() <= 4 * self.active.len() + 1024 {
            return;
        }
        let mut v = std::mem::take(&mut self.ends).into_vec();
        v.clear();
        for &f in &self.active {
            let end_us = self.flows[f as usize].end_us;
            if end_us.is_finite() {
                v.push(Wake {
                    time_us: end_us,
                    op: f,
                });
            }
        }
        self.ends = BinaryHeap::from(v);
    }

    fn run(&mut self) {
        for op in 0..self.pending.len() {
            if self.pending[op] == 0 {
                self.start(op as u32);
            }
        }
        let mut batches = 0u32;
        // Active flows summed over the batches since the clock was last read: a batch's fair
        // sharing can cost as much as the flows it shares among.
        let mut work = 0usize;
        loop {
            batches = batches.wrapping_add(1);
            work = work.saturating_add(self.active.len());
            if batches.is_multiple_of(DEADLINE_CHECK_BATCHES) || work >= DEADLINE_CHECK_WORK {
                work = 0;
                let progress = SimCut {
                    reached_us: self.now_us,
                    ops_done: self.done,
                    ops: self.spans.len(),
                };
                if self.go_on.is_some_and(|go_on| !go_on(&progress)) {
                    self.gave_up = true;
                    return;
                }
            }
            let wake = self.heap.peek().map_or(f64::INFINITY, |w| w.time_us);
            let next = wake.min(self.next_end());
            if !next.is_finite() {
                // Nothing queued and nothing flowing (or only flows stalled at rate 0, which
                // fair sharing never produces): done, or stuck on a cycle.
                break;
            }
            self.now_us = self.now_us.max(next);
            let horizon = self.now_us + SAME_TIME * self.now_us.max(1.0);
            // Ends first, then wake-ups, until neither is due: an end may release ops whose
            // latency is zero. New flows have no rate yet, so no end appears mid-batch.
            loop {
                self.collect_ending(horizon);
                let mut ending = std::mem::take(&mut self.ending);
                for &f in &ending {
                    self.flow_end(f);
                }
                let ended = !ending.is_empty();
                ending.clear();
                self.ending = ending;
                let mut woke = false;
                while let Some(w) = self.heap.peek().copied()
                    && w.time_us <= horizon
                {
                    self.heap.pop();
                    self.flow_start(w.op);
                    woke = true;
                }
                if !ended && !woke {
                    break;
                }
            }
            self.rebalance();
        }
    }

    /// Op `op` is ready: it starts once the host has issued it, and its bytes flow after its
    /// latency.
    fn start(&mut self, op: u32) {
        let start = self.now_us.max(self.m.issued_at_us(op));
        self.spans[op as usize].start_us = start;
        self.heap.push(Wake {
            time_us: start + self.m.latency_us[op as usize],
            op,
        });
    }

    /// Op `op`'s latency is over: its bytes join the flows (or, with none, it ends).
    fn flow_start(&mut self, op: u32) {
        self.spans[op as usize].flow_start_us = self.now_us;
        let bytes = self.m.bytes[op as usize];
        if bytes <= 0.0 {
            self.end(op);
            return;
        }
        let (res, coef) = self.m.uses.of(op);
        for (&r, &c) in res.iter().zip(coef) {
            self.res_bytes[r as usize] += bytes * c;
            if self.res_active[r as usize] == 0 {
                self.res_since_us[r as usize] = self.now_us;
            }
            self.res_active[r as usize] += 1;
        }
        self.fair.add(op, self.binding.of(op));
        self.flows[op as usize] = Flow {
            remaining: bytes,
            since_us: self.now_us,
            rate: 0.0,
            end_us: f64::INFINITY,
        };
        self.active_pos[op as usize] = self.active.len() as u32;
        self.active.push(op);
    }

    /// Op `op`'s last byte has arrived.
    fn flow_end(&mut self, op: u32) {
        let k = self.active_pos[op as usize] as usize;
        self.active.swap_remove(k);
        if let Some(&moved) = self.active.get(k) {
            self.active_pos[moved as usize] = k as u32;
        }
        self.active_pos[op as usize] = NONE;
        self.fair.remove(op);
        for &r in self.m.uses.of(op).0 {
            self.res_active[r as usize] -= 1;
            if self.res_active[r as usize] == 0 {
                self.res_busy_us[r as usize] += self.now_us - self.res_since_us[r as usize];
            }
        }
        self.end(op);
    }

    /// Op `op` is finished: release the ops that waited only for it.
    fn end(&mut self, op: u32) {
        self.spans[op as usize].end_us = self.now_us;
        self.done += 1;
        let m = self.m;
        for &s in m.deps.successors(op) {
            let p = &mut self.pending[s as usize];
            *p -= 1;
            if *p == 0 {
                self.start(s);
            }
        }
    }

    /// New fair rates for the flows whose sharing changed, and their new end times.
    fn rebalance(&mut self) {
        let now = self.now_us;
        let flows = &mut self.flows;
        let ends = &mut self.ends;
        self.fair.solve(&self.m.caps, |op, rate| {
            let f = &mut flows[op as usize];
            if rate == f.rate {
                return;
            }
            f.remaining = (f.remaining - f.rate * (now - f.since_us)).max(0.0);
            f.since_us = now;
            f.rate = rate;
            f.end_us = if rate > 0.0 {
                now + f.remaining / rate
            } else {
                f64::INFINITY
            };
            if f.end_us.is_finite() {
                ends.push(Wake {
                    time_us: f.end_us,
                    op,
                });
            }
        });
        self.compact_ends();
    }

    /// The result, or the error that kept some op from running.
    fn finish(self, topo: &Topology) -> Result<SimResult> {
        let n = self.spans.len();
        if self.done < n {
            return Err(self.stuck_error());
        }
        let time_us = self.spans.iter().map(|s| s.end_us).fold(0.0, f64::max);
        let util = |bytes: f64, cap: f64| {
            if time_us > 0.0 {
                bytes / (cap * time_us)
            } else {
                0.0
            }
        };
        let m = self.m;
        let mut edges = Vec::new();
        let mut memories = Vec::new();
        for (r, &bytes) in self.res_bytes.iter().enumerate() {
            if bytes <= 0.0 {
                continue;
            }
            let (busy_us, utilisation) = (self.res_busy_us[r], util(bytes, m.caps[r]));
            if let Some(edge) = m.edge_of(r) {
                edges.push(EdgeUse {
                    edge,
                    bytes,
                    busy_us,
                    utilisation,
                });
            } else if let Some(location) = m.memory_of(r) {
                memories.push(MemUse {
                    location,
                    name: super::model::location_name(topo, location),
                    bytes,
                    busy_us,
                    utilisation,
                });
            }
        }
        Ok(SimResult {
            time_us,
            ops: self.spans,
            edges,
            memories,
        })
    }

    /// Name an op on a dependency cycle among the ops that never ran.
    fn stuck_error(&self) -> RouteError {
        self.m.deps.cycle_error(|i| self.spans[i].end_us.is_nan())
    }
}
