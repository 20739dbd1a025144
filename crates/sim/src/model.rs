//! Lowering a plan onto the simulator's resources: which directed edges and memories each op
//! loads (and how many times its bytes cross each), its fixed latency, and the plan's
//! dependency graph ([`Plan::dependency_graph`]). Every check a plan or topology can fail
//! happens here, once, so the event loop never meets a bad index; a dependency cycle shows as
//! ops that never run, named by [`relaycc_plan::DepGraph::cycle_error`].

use relaycc_topo::rates::StepClass;
use relaycc_topo::{NodeId, Topology};

use relaycc_plan::DepGraph;
use relaycc_plan::{Location, OpKind, Plan};
use relaycc_plan::{Result, RouteError};

use super::config::{BYTES_PER_US_PER_GBPS, SimConfig};
use launches::OpLaunch;
pub use memories::DEVICE_WRITE_SHARE;
use memories::Memories;

/// Marks "no op" in index vectors (an op with no active flow).
pub(super) const NONE: u32 = u32::MAX;

/// The resources an op's flow loads, as a compressed-row table over ops.
#[derive(Debug, Default)]
pub(super) struct Uses {
    start: Vec<u32>,
    res: Vec<u32>,
    coef: Vec<f64>,
}

impl Uses {
    /// Resources of op `op` and the bytes each carries per byte of the op.
    pub(super) fn of(&self, op: u32) -> (&[u32], &[f64]) {
        let (a, b) = (
            self.start[op as usize] as usize,
            self.start[op as usize + 1] as usize,
        );
        (&self.res[a..b], &self.coef[a..b])
    }

    /// The table of the first `ops` ops with only the resources `keep` accepts.
    pub(super) fn filtered(&self, ops: usize, keep: impl Fn(u32) -> bool) -> Uses {
        let mut u = Uses::default();
        u.start.reserve(ops + 1);
        u.start.push(0);
        for op in 0..ops as u32 {
            let (res, coef) = self.of(op);
            for (&r, &c) in res.iter().zip(coef) {
                if keep(r) {
                    u.res.push(r);
                    u.coef.push(c);
                }
            }
            u.start.push(u.res.len() as u32);
        }
        u
    }

    /// A table from explicit rows of `(resource, coefficient)`, for tests.
    #[cfg(test)]
    pub(super) fn from_rows(rows: &[&[(u32, f64)]]) -> Uses {
        let mut u = Uses::default();
        u.start.push(0);
        for row in rows {
            for &(r, c) in *row {
                u.res.push(r);
                u.coef.push(c);
            }
            u.start.push(u.res.len() as u32);
        }
        u
    }
}

/// A plan lowered for simulation.
#[derive(Debug)]
pub(super) struct Model {
    /// Capacity of each resource some op uses, in bytes per microsecond, in the order of
    /// `res_orig`.
    pub caps: Vec<f64>,
    /// Each resource's place among all the topology's: an edge index below `n_edges`, else
    /// memory `mem_loc[place - n_edges]`; ascending ([`Model::keep_used_resources`]).
    pub res_orig: Vec<u32>,
    /// Number of the topology's edges.
    pub n_edges: usize,
    /// The location of each memory resource.
    pub mem_loc: Vec<Location>,
    /// The location of each device memory's writes' resource, placed after the memories.
    pub write_loc: Vec<Location>,
    /// Fixed latency of each op (its mechanism's launch or step cost, plus for relaycc's copies
    /// its edges' latencies), microseconds.
    pub latency_us: Vec<f64>,
    /// When the first ops may start, microseconds: an NCCL-like plan's launch latency (its
    /// protocol's, or NVLS's); 0 for relaycc's plans, whose ops pay their own launches.
    pub start_us: f64,
    /// Host time to issue one launch ([`SimConfig::issue_us`]).
    pub issue_us: f64,
    /// Each op's launch in issue order: ops that join the launch before them on their lane
    /// ([`launches::launches`]) are issued with it.
    pub issue_order: Vec<u32>,
    /// Bytes of each op's flow.
    pub bytes: Vec<f64>,
    /// Resources of each op.
    pub uses: Uses,
    /// The plan's dependency order: which ops wait for each op, and how many finishes each
    /// op waits for.
    pub deps: DepGraph,
}

/// An error at op `op`.
fn check(op: usize, message: String) -> RouteError {
    RouteError::PlanCheck { op, message }
}

impl Model {
    /// When the host has issued op `op`: launches are issued one after another in op order,
    /// an op that joins a launch with it.
    pub(super) fn issued_at_us(&self, op: u32) -> f64 {
        if self.issue_us == 0.0 {
            return 0.0;
        }
        let k = self.issue_order.get(op as usize).copied().unwrap_or(op);
        (f64::from(k) + 1.0) * self.issue_us
    }

    /// Check `plan` against `topo` and lower it, in passes: the settings
    /// ([`check_settings`]), the resources ([`EdgeResources`], [`memory_resources`]), the
    /// protocol's costs ([`ProtocolCosts`]), then each op's loads and latency
    /// ([`OpLowering::lower`]).
    pub(super) fn build(topo: &Topology, plan: &Plan, cfg: &SimConfig) -> Result<Model> {
        let (overhead, issue_us) = check_settings(plan, cfg)?;
        let (edges, mut caps) = EdgeResources::new(topo, plan)?;
        let (places, mems) = memories::memory_resources(topo, &mut caps);
        let n = plan.ops.len();
        let deps = plan.dependency_graph()?;
        let protocol = ProtocolCosts::new(topo, plan)?;
        let launches = launches::launches(topo, plan);
        // Read only when the host's issue costs time (`issued_at_us`).
        let issue_order = if issue_us > 0.0 {
            launches::issue_order(plan, &launches)
        } else {
            Vec::new()
        };
        let mut m = Model {
            caps,
            res_orig: Vec::new(),
            n_edges: edges.usable.len(),
            mem_loc: places.mem_loc,
            write_loc: places.write_loc,
            start_us: protocol.start_us,
            issue_us,
            issue_order,
            latency_us: Vec::with_capacity(n),
            bytes: Vec::with_capacity(n),
            uses: Uses::default(),
            deps,
        };
        m.uses.start.reserve(n + 1);
        m.uses.start.push(0);
        let lowering = OpLowering {
            topo,
            plan,
            edges: &edges,
            mems: &mems,
            protocol: &protocol,
            launches: &launches,
            overhead,
        };
        let elem = plan.dtype.size() as f64;
        for (i, op) in plan.ops.iter().enumerate() {
            let latency = lowering.lower(&mut m, i, op)?;
            m.uses.start.push(m.uses.res.len() as u32);
            m.latency_us.push(latency);
            m.bytes.push(op.len() as f64 * elem);
        }
        if plan.protocol.is_none() {
            m.fuse_fan_outs(&launches::fan_out_heads(plan, &launches));
        }
        m.keep_used_resources();
        Ok(m)
    }

    /// Move each op that joins a fan-out (`heads[op]`: the launch it joins) into its head's
    /// flow: the executor's kernel writes every destination as it reads the source, so the
    /// head carries the joined ops' loads (per byte of its own) and they carry no bytes of
    /// their own, ending once it does.
    fn fuse_fan_outs(&mut self, heads: &[Option<u32>]) {
        let n = self.bytes.len();
        // Each head's joined ops in op order, as a chain: `first[h]`, then `next[j]`.
        let (mut first, mut next, mut last) = (vec![NONE; n], vec![NONE; n], vec![NONE; n]);
        let mut joined = vec![false; n];
        for (j, h) in heads.iter().enumerate() {
            let Some(h) = h.map(|h| h as usize).filter(|&h| self.bytes[h] > 0.0) else {
                continue;
            };
            match last[h] {
                NONE => first[h] = j as u32,
                l => next[l as usize] = j as u32,
            }
            last[h] = j as u32;
            joined[j] = true;
        }
        if !joined.contains(&true) {
            return;
        }
        let old = std::mem::take(&mut self.uses);
        self.uses.start.reserve(n + 1);
        self.uses.res.reserve(old.res.len());
        self.uses.coef.reserve(old.coef.len());
        self.uses.start.push(0);
        for op in 0..n {
            let row = self.uses.res.len();
            if !joined[op] {
                let (res, coef) = old.of(op as u32);
                self.uses.res.extend_from_slice(res);
                self.uses.coef.extend_from_slice(coef);
                let mut j = first[op];
                while j != NONE {
                    let scale = self.bytes[j as usize] / self.bytes[op];
                    let (res, coef) = old.of(j);
                    for (&r, &c) in res.iter().zip(coef) {
                        self.push_use(row, r, c * scale);
                    }
                    j = next[j as usize];
                }
            }
            self.uses.start.push(self.uses.res.len() as u32);
        }
        for (b, _) in self.bytes.iter_mut().zip(&joined).filter(|(_, j)| **j) {
            *b = 0.0;
        }
    }

    /// Keep only the resources some op uses, in their order (so every tie broken by resource
    /// id breaks alike): a simulation's per-resource state is then sized by the plan, not by
    /// the topology (2.4M resources on 1,024 GB200 racks, re-made per simulation).
    fn keep_used_resources(&mut self) {
        let mut dense = vec![u32::MAX; self.caps.len()];
        for &r in &self.uses.res {
            dense[r as usize] = 0;
        }
        self.res_orig.clear();
        for (r, d) in dense.iter_mut().enumerate().filter(|(_, d)| **d == 0) {
            *d = self.res_orig.len() as u32;
            self.res_orig.push(r as u32);
        }
        for r in &mut self.uses.res {
            *r = dense[*r as usize];
        }
        self.caps = self
            .res_orig
            .iter()
            .map(|&r| self.caps[r as usize])
            .collect();
    }

    /// The topology edge resource `r` stands for, if it is an edge.
    pub(super) fn edge_of(&self, r: usize) -> Option<u32> {
        self.res_orig
            .get(r)
            .copied()
            .filter(|&e| (e as usize) < self.n_edges)
    }

    /// The memory resource `r` stands for, if it is a memory.
    pub(super) fn memory_of(&self, r: usize) -> Option<Location> {
        let place = *self.res_orig.get(r)? as usize;
        self.mem_loc.get(place.checked_sub(self.n_edges)?).copied()
    }

    /// Add `coef` bytes per op byte on resource `r` to the row that starts at `row`, merging
    /// repeats (a path naming an edge twice loads it twice).
    fn push_use(&mut self, row: usize, r: u32, coef: f64) {
        if let Some(k) = self.uses.res[row..].iter().position(|&x| x == r) {
            self.uses.coef[row + k] += coef;
        } else {
            self.uses.res.push(r);
            self.uses.coef.push(coef);
        }
    }

    /// A resource's name for messages: `edge 5 (GPU0 -> GPU1)`, `GPU0 memory`.
    pub(super) fn resource_name(&self, topo: &Topology, r: u32) -> String {
        let r = r as usize;
        if let Some(e) = self.edge_of(r) {
            let (a, b) = topo.link_ends(relaycc_topo::LinkId::new(e as usize));
            format!("edge {e} ({} -> {})", name(topo, a), name(topo, b))
        } else {
            let place = self.res_orig.get(r).map_or(usize::MAX, |&p| p as usize);
            let writes = place
                .checked_sub(self.n_edges + self.mem_loc.len())
                .and_then(|k| self.write_loc.get(k))
                .map(|&loc| format!("{} memory writes", location_name(topo, loc)));
            match (self.memory_of(r), writes) {
                (Some(loc), _) => format!("{} memory", location_name(topo, loc)),
                (None, Some(name)) => name,
                (None, None) => format!("resource {r}"),
            }
        }
    }
}

/// The simulator settings a plan is timed with, checked: a plan of rounds is timed round by
/// round and a step-sampled plan from its samples, never here, and the op overhead and issue time are finite and not negative.
/// Returns them.
fn check_settings(plan: &Plan, cfg: &SimConfig) -> Result<(f64, f64)> {
    if plan.step_samples.is_some() {
        return Err(check(
            usize::MAX,
            format!(
                "{} is step-sampled: simulate() times it from its samples",
                plan.algorithm
            ),
        ));
    }
    if plan.rounds.is_some() {
        return Err(check(
            usize::MAX,
            format!(
                "{} is a plan of rounds: simulate() times it round by round",
                plan.algorithm
            ),
        ));
    }
    let overhead = cfg.op_overhead_us;
    if !(overhead.is_finite() && overhead >= 0.0) {
        return Err(check(
            usize::MAX,
            format!("simulator op overhead must be finite and >= 0 us, not {overhead}"),
        ));
    }
    let issue_us = cfg.issue_us;
    if !(issue_us.is_finite() && issue_us >= 0.0) {
        return Err(check(
            usize::MAX,
            format!("simulator issue time must be finite and >= 0 us, not {issue_us}"),
        ));
    }
    Ok((overhead, issue_us))
}

/// The topology's directed edges as resources: which resource each edge loads, and whether
/// the mask leaves it usable.
struct EdgeResources {
    /// The resource each edge loads: its own, or its NVSwitch port's first link's.
    edge_res: Vec<u32>,
    /// Whether each edge is usable (mask lookups compare node names: done once per edge,
    /// not once per op).
    usable: Vec<bool>,
}

impl EdgeResources {
    /// The edges of `topo` as resources for `plan`: a GPU stripes its NVSwitch traffic over
    /// every switch plane, so the links of one NVSwitch port share one resource with the
    /// port's whole rate; a template's representative edges get their orbit's share of their
    /// rate ([`crate::template`]). Returns them and their capacities, bytes per microsecond.
    fn new(topo: &Topology, plan: &Plan) -> Result<(Self, Vec<f64>)> {
        let g = topo.graph();
        let n_edges = g.edge_count();
        let usable: Vec<bool> = (0..n_edges)
            .map(|e| topo.link_usable(relaycc_topo::LinkId::new(e)))
            .collect();
        let mut caps: Vec<f64> = g
            .edge_weights()
            .map(|l| l.gbps * BYTES_PER_US_PER_GBPS)
            .collect();
        let mut edge_res: Vec<u32> = (0..n_edges as u32).collect();
        let mut port_rep: std::collections::HashMap<(relaycc_topo::NodeId, bool), u32> =
            std::collections::HashMap::new();
        for e in 0..n_edges {
            let id = relaycc_topo::LinkId::new(e);
            if let Some(port) = topo.nvswitch_port(id) {
                let rep = *port_rep.entry(port).or_insert(e as u32);
                edge_res[e] = rep;
                if rep as usize == e {
                    caps[e] = topo.striped_gbps(id) * BYTES_PER_US_PER_GBPS;
                }
            }
        }
        if let Some(t) = &plan.template {
            let mut scaled = vec![false; n_edges];
            for s in &t.capacity_scale {
                let Some(&r) = edge_res.get(s.edge as usize) else {
                    return Err(check(
                        usize::MAX,
                        format!(
                            "template scales edge {}; the topology has {n_edges}",
                            s.edge
                        ),
                    ));
                };
                if !(s.scale.is_finite() && s.scale > 0.0) {
                    return Err(check(
                        usize::MAX,
                        format!("template scales edge {} by {}", s.edge, s.scale),
                    ));
                }
                if !std::mem::replace(&mut scaled[r as usize], true) {
                    caps[r as usize] *= s.scale;
                }
            }
        }
        Ok((EdgeResources { edge_res, usable }, caps))
    }
}

/// What an NCCL-like plan's protocol costs: when its first ops may start, its bytes on the
/// wire per data byte, and its NVLS groups' sizes.
struct ProtocolCosts {
    /// The protocol's (or NVLS's) launch latency; 0 for relaycc's plans.
    start_us: f64,
    /// Bytes on the wire per data byte: LL and LL128 spend part of each line on flags.
    wire: f64,
    /// The number of copies in each NVLS group.
    nvls_sizes: std::collections::HashMap<u32, u32>,
}

impl ProtocolCosts {
    /// The costs of `plan`'s protocol on `topo`'s cost model.
    fn new(topo: &Topology, plan: &Plan) -> Result<Self> {
        let costs = topo.costs();
        let nvls_sizes = nvls_group_sizes(plan);
        let start_us = match plan.protocol {
            Some(_) if !nvls_sizes.is_empty() => costs.nvls_latency_us,
            Some(p) => costs.base_latency_us(p),
            None => 0.0,
        };
        let wire = plan.protocol.map_or(1.0, |p| 1.0 / costs.bw_fraction(p));
        // A share at or near zero (a cost model built past `CostModel::set`'s floor) puts
        // unbounded bytes on the wire: no time would be finite, so say why here.
        if !(wire.is_finite() && wire >= 1.0) {
            return Err(check(
                usize::MAX,
                format!(
                    "cannot time a plan with protocol {:?}: the cost model's share of a link \
                     it carries as data is {}, which puts {wire} bytes on the wire per byte",
                    plan.protocol,
                    plan.protocol.map_or(1.0, |p| costs.bw_fraction(p))
                ),
            ));
        }
        Ok(ProtocolCosts {
            start_us,
            wire,
            nvls_sizes,
        })
    }
}

/// Lowering one op onto the resources: what every op's lowering reads.
struct OpLowering<'a> {
    topo: &'a Topology,
    plan: &'a Plan,
    edges: &'a EdgeResources,
    mems: &'a Memories,
    protocol: &'a ProtocolCosts,
    /// How the executor runs each op ([`launches::launches`]).
    launches: &'a [OpLaunch],
    /// Fixed cost of every op, microseconds ([`SimConfig::op_overhead_us`]).
    overhead: f64,
}

impl OpLowering<'_> {
    /// Lower op `i` into `m`'s next row of uses: the edges it crosses (at its bytes on the
    /// wire per byte, [`OpLowering::wire_coef`]), the memories it reads and writes
    /// (`Memories::loads`, `model/memories.rs`), every resource checked to have a capacity.
    /// Returns its fixed latency ([`OpLowering::latency`]).
    fn lower(&self, m: &mut Model, i: usize, op: &relaycc_plan::Op) -> Result<f64> {
        let row = m.uses.res.len();
        let (coef, shared) = self.wire_coef(i, op)?;
        let mut class = None;
        let mut link_latency = 0.0;
        let n_edges = self.edges.usable.len();
        // A copy between arenas of one device loads that memory, not the links of its path.
        let arenas = self.mems.between_arenas(self.plan, i, op)?;
        for &e in &op.edges {
            let Some(link) = self
                .topo
                .graph()
                .edge_weight(relaycc_topo::LinkId::new(e as usize))
            else {
                return Err(check(
                    i,
                    format!("uses edge {e}; the topology has {n_edges}"),
                ));
            };
            if !self.edges.usable[e as usize] {
                let (a, b) = self.topo.link_ends(relaycc_topo::LinkId::new(e as usize));
                return Err(check(
                    i,
                    format!(
                        "uses edge {e} ({} -> {}), which is masked",
                        name(self.topo, a),
                        name(self.topo, b)
                    ),
                ));
            }
            link_latency += link.latency_us;
            class = class.max(Some(step_class(&link.kind)));
            let c = match shared {
                Some((se, size)) if se == e => coef / size,
                _ => coef,
            };
            if !arenas {
                m.push_use(row, self.edges.edge_res[e as usize], c);
            }
        }
        let latency = self.overhead + self.latency(i, op, class, link_latency);
        let launch = self.launches.get(i).copied();
        let (topo, plan) = (self.topo, self.plan);
        self.mems
            .loads(topo, plan, (i, op, launch, arenas), |r, c| {
                m.push_use(row, r, c)
            })?;
        for (&r, _) in m.uses.res[row..].iter().zip(&m.uses.coef[row..]) {
            let cap = m.caps[r as usize];
            if !(cap.is_finite() && cap > 0.0) {
                return Err(check(
                    i,
                    format!(
                        "loads {} of capacity {cap} B/us",
                        m.resource_name(self.topo, r)
                    ),
                ));
            }
        }
        if !latency.is_finite() {
            return Err(check(
                i,
                format!("has a latency of {latency} us (the cost model's or a link's)"),
            ));
        }
        Ok(latency)
    }

    /// Bytes op `i` puts on each edge per byte, and its NVLS group's shared edge with the
    /// group's size: NVLS copies move at the switch's share of the port rate, and the group
    /// crosses its shared edge once, so each of its `size` copies carries 1/size of it.
    fn wire_coef(&self, i: usize, op: &relaycc_plan::Op) -> Result<(f64, Option<(u32, f64)>)> {
        let (coef, shared) = match op.nvls {
            Some(share) => {
                let eff = nvls_efficiency(self.topo, self.plan, op).ok_or_else(|| {
                    check(
                        i,
                        "is an NVLS copy, but its source GPU's NVSwitch does not reduce or \
                         multicast (NVLS needs sm90 or later)"
                            .to_string(),
                    )
                })?;
                let size = self
                    .protocol
                    .nvls_sizes
                    .get(&share.group)
                    .copied()
                    .unwrap_or(1);
                if !(eff > 0.0 && (1.0 / eff).is_finite()) {
                    return Err(check(
                        i,
                        format!(
                            "is an NVLS copy, and the cost model's NVLS share of a port is \
                             {eff}: its bytes on the wire are not finite"
                        ),
                    ));
                }
                (1.0 / eff, Some((share.shared_edge, size as f64)))
            }
            None => (1.0, None),
        };
        Ok((coef * self.protocol.wire, shared))
    }

    /// The fixed latency of op `i` beyond the overhead, whose links' slowest step class is
    /// `class` and whose links' latencies sum to `link_latency`: NCCL's steps pay one step
    /// latency per copy (a chunk handed to the next GPU), reductions fused into the step,
    /// NVLS latency paid once at the start; relaycc's copy crosses its links after the launch
    /// the executor makes for it ([`launches::launches`]: a copy engine's, a kernel's, or none
    /// inside the launch before it), its reduction is a kernel.
    fn latency(
        &self,
        i: usize,
        op: &relaycc_plan::Op,
        class: Option<StepClass>,
        link_latency: f64,
    ) -> f64 {
        let costs = self.topo.costs();
        let is_copy = matches!(op.kind, OpKind::Copy { .. });
        let launch = self
            .launches
            .get(i)
            .copied()
            .unwrap_or(OpLaunch::CopyEngine);
        match (self.plan.protocol, is_copy, launch) {
            (Some(_), true, _) if op.nvls.is_some() => 0.0,
            (Some(p), true, _) => class.map_or(0.0, |c| costs.step_us(p, c)),
            (Some(_), false, _) => 0.0,
            (None, true, OpLaunch::CopyEngine) => costs.copy_engine_launch_us + link_latency,
            (None, true, OpLaunch::Kernel) => costs.kernel_launch_us + link_latency,
            (None, true, OpLaunch::Joined | OpLaunch::JoinedFanOut) => link_latency,
            (None, false, _) => costs.kernel_launch_us,
        }
    }
}

/// The step class of a link kind for NCCL's step latencies.
fn step_class(kind: &relaycc_topo::LinkKind) -> StepClass {
    match kind {
        relaycc_topo::LinkKind::Nvlink { .. } | relaycc_topo::LinkKind::C2c => StepClass::NvLink,
        relaycc_topo::LinkKind::Pcie { .. } | relaycc_topo::LinkKind::InterSocket { .. } => {
            StepClass::Pcie
        }
        relaycc_topo::LinkKind::Network { .. } => StepClass::Network,
    }
}

/// The number of copies in each NVLS group of `plan`.
pub(crate) fn nvls_group_sizes(plan: &Plan) -> std::collections::HashMap<u32, u32> {
    let mut sizes = std::collections::HashMap::new();
    for share in plan.ops.iter().filter_map(|o| o.nvls) {
        *sizes.entry(share.group).or_insert(0) += 1;
    }
    sizes
}

/// The NVLS share of the port rate for an op's source GPU; None where it has no NVLS.
fn nvls_efficiency(topo: &Topology, plan: &Plan, op: &relaycc_plan::Op) -> Option<f64> {
    let OpKind::Copy { src, .. } = &op.kind else {
        return None;
    };
    let Some(Location::Gpu(g)) = plan.location(src.buffer) else {
        return None;
    };
    let sm = topo.gpu_info(g).ok()?.compute_capability?.sm();
    topo.costs().nvls_efficiency(sm)
}

/// A node's name, or its index when the id is not in the graph.
fn name(topo: &Topology, id: NodeId) -> String {
    topo.graph()
        .node_weight(id)
        .map_or_else(|| format!("node {}", id.index()), |n| n.name.clone())
}

/// A location's name: `GPU3`, or the CPU node's name (`CPU1`).
pub(super) fn location_name(topo: &Topology, loc: Location) -> String {
    match loc {
        Location::Gpu(g) => format!("GPU{g}"),
        Location::Host(n) => name(topo, NodeId::new(n as usize)),
    }
}

mod launches;
mod memories;
#[cfg(test)]
mod tests;

/// The launches the simulator charges one of relaycc's plans ([`executor_launches`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaunchCounts {
    /// Copies on a copy engine.
    pub copy_engine: u32,
    /// Kernel launches: reductions, and copies on SMs that start a launch.
    pub kernels: u32,
    /// Copies on SMs inside the launch before them on their lane.
    pub joined: u32,
}

/// How many launches of each kind the CUDA executor makes for `plan` on `topo`, as the
/// simulator charges them (the rules of `model/launches.rs`): what a test of the executor's
/// own lowering compares with, so the map and the territory cannot drift apart unseen.
pub fn executor_launches(topo: &Topology, plan: &Plan) -> LaunchCounts {
    let mut c = LaunchCounts::default();
    for l in launches::launches(topo, plan) {
        match l {
            OpLaunch::CopyEngine => c.copy_engine += 1,
            OpLaunch::Kernel => c.kernels += 1,
            OpLaunch::Joined | OpLaunch::JoinedFanOut => c.joined += 1,
        }
    }
    c
}
