//! The building blocks of the node-aware plan generators: where each rank lives, its staging
//! buffers in host memory, and moves between memories (local copies, single hops, host-staged
//! fallbacks, and network hops pinned to a chosen NIC pair), every op written through the one
//! `PlanWriter`, which derives its data dependencies.

use std::collections::BTreeMap;

use relaycc_topo::{NodeId, Topology};

use crate::plan_writer::PlanWriter;
use crate::route_pipeline::{Chunks, LaneMap};
pub(super) use crate::staging::Slots;
use relaycc_plan::path::{Hop, Route, hop, host_staged_routes, location_node, nearest_host};
use relaycc_plan::{BufferRef, Location, Plan, Region};
use relaycc_plan::{Result, RouteError};

/// Where a region sits and which ops must finish before it may be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Side {
    pub loc: Location,
    pub region: Region,
    pub deps: Vec<u32>,
}

/// Per-rank staging in host memory for one round: which input runs were copied out (input
/// offset, elements, offset in the send slot, ops), which output runs were filled (output
/// offset, offset in the receive slot, elements, ops).
#[derive(Debug, Default)]
struct Stage {
    send: Option<BufferRef>,
    send_runs: Vec<(u64, u64, u64, Vec<u32>)>,
    recv: Option<BufferRef>,
    recv_used: u64,
    recv_parts: Vec<(u64, u64, u64, Vec<u32>)>,
}

/// A plan under construction with the cluster facts every generator needs.
pub(super) struct NodeAwarePlanBuilder<'a> {
    pub topo: &'a Topology,
    /// The plan under construction, written through the one writer.
    pub w: PlanWriter<'static>,
    pub lanes: LaneMap,
    /// Node (host) of each rank.
    pub node: Vec<u32>,
    /// Host memory of each rank's GPU (its socket).
    pub host: Vec<Location>,
    /// NICs of each node, by node index.
    pub nics: BTreeMap<u32, Vec<NodeId>>,
    stages: Vec<Stage>,
    nic_routes: BTreeMap<(Location, NodeId, NodeId, Location), Route>,
    slots: Slots,
}

impl<'a> NodeAwarePlanBuilder<'a> {
    /// A builder for `plan` on `topo`; fails when a rank's GPU is missing or has no host.
    pub fn new(topo: &'a Topology, plan: Plan) -> Result<Self> {
        let mut node = Vec::new();
        let mut host = Vec::new();
        for &g in &plan.request.gpus {
            node.push(topo.node(topo.gpu(g)?).host);
            host.push(nearest_host(topo, g).ok_or_else(|| RouteError::NoRoute {
                what: format!("GPU{g}"),
                why: "it attaches to no CPU socket, so it cannot stage through host".into(),
            })?);
        }
        let mut nics: BTreeMap<u32, Vec<NodeId>> = BTreeMap::new();
        for (id, _) in topo.nics() {
            nics.entry(topo.node(id).host).or_default().push(id);
        }
        let stages = (0..node.len()).map(|_| Stage::default()).collect();
        Ok(NodeAwarePlanBuilder {
            topo,
            w: PlanWriter::new(plan, None),
            lanes: LaneMap::default(),
            node,
            host,
            nics,
            stages,
            nic_routes: BTreeMap::new(),
            slots: Slots::default(),
        })
    }

    /// Start round `k`: fresh per-rank staging, the slot set of parity `k % 2`.
    pub fn begin_round(&mut self, k: u64) {
        self.slots.begin(&self.w.plan, k);
        for st in &mut self.stages {
            *st = Stage::default();
        }
    }

    /// A staging slot of at least `len` elements in `loc` for this round ([`Slots::slot`]).
    pub fn slot(&mut self, loc: Location, len: u64) -> BufferRef {
        self.slots.slot(&mut self.w.plan, loc, len)
    }

    /// End the round: copy the received staging to the GPU outputs, then note the ops that
    /// end it, which round `k + 2` waits on ([`Slots::end`]).
    pub fn end_round(&mut self) -> Result<()> {
        self.flush_received()?;
        self.slots.end(&self.w.plan);
        Ok(())
    }

    /// The GPU memory of rank `r`.
    pub fn gpu(&self, r: u32) -> Location {
        Location::Gpu(self.w.plan.request.gpus[r as usize])
    }

    /// Move `src` (in `from`) to `dst` (in `to`) after its data and `deps` (where `deps` is
    /// empty, after the round's gate, [`Slots::gated`]): a local copy when both are the same
    /// memory, else one hop, else (GPU to GPU) through host memory. Returns the ops whose
    /// completion makes `dst` readable (`deps` when there is nothing to move).
    pub fn mv(
        &mut self,
        from: Location,
        src: Region,
        to: Location,
        dst: Region,
        deps: &[u32],
        channel: u32,
    ) -> Result<Vec<u32>> {
        if src.len == 0 {
            return Ok(deps.to_vec());
        }
        if from == to {
            let lane = self.lanes.local(&mut self.w.plan, from, channel);
            let after = self.slots.gated(deps);
            return Ok(vec![self.w.copy(lane, src, dst, Vec::new(), &after)?]);
        }
        let route = self.route(from, to)?;
        self.send(&route, src, dst, deps, channel)
    }

    /// One message over `route` (a single chunk per hop, as MPI sends one message), after its
    /// data and `deps` (or the round's gate, as [`NodeAwarePlanBuilder::mv`]).
    pub fn send(
        &mut self,
        route: &Route,
        src: Region,
        dst: Region,
        deps: &[u32],
        channel: u32,
    ) -> Result<Vec<u32>> {
        let len = src.len;
        let after = self.slots.gated(deps);
        let arrivals = self.w.transfer(
            &mut self.lanes,
            src,
            dst,
            std::slice::from_ref(route),
            &[len],
            Chunks::Each(len),
            channel,
            &after,
        )?;
        Ok(arrivals.iter().map(|a| a.op).collect())
    }

    /// A route between two memories: one hop, or for two GPUs without one, through host.
    fn route(&self, from: Location, to: Location) -> Result<Route> {
        if let Some(h) = hop(self.topo, from, to) {
            return Ok(Route { hops: vec![h] });
        }
        if let (Location::Gpu(a), Location::Gpu(b)) = (from, to)
            && let Some(r) = host_staged_routes(self.topo, a, b).into_iter().next()
        {
            return Ok(r);
        }
        Err(RouteError::NoRoute {
            what: format!("{from:?} -> {to:?}"),
            why: "no hop and no host-staged route joins them".into(),
        })
    }

    /// A network hop from host memory `from` out of NIC `nic_a`, into NIC `nic_b`, to host
    /// memory `to` (the split strategies spread their messages over the nodes' NICs).
    pub fn nic_route(
        &mut self,
        from: Location,
        nic_a: NodeId,
        nic_b: NodeId,
        to: Location,
    ) -> Result<Route> {
        let key = (from, nic_a, nic_b, to);
        if let Some(r) = self.nic_routes.get(&key) {
            return Ok(r.clone());
        }
        let no = || RouteError::NoRoute {
            what: format!("{from:?} -> {to:?}"),
            why: "no path through the chosen NICs".into(),
        };
        let (a, b) = (
            location_node(self.topo, from)?,
            location_node(self.topo, to)?,
        );
        let mut edges = Vec::new();
        for (x, y) in [(a, nic_a), (nic_a, nic_b), (nic_b, b)] {
            edges.extend(widest_edges(self.topo, x, y).ok_or_else(no)?);
        }
        let links = edges
            .iter()
            .map(|e| self.topo.link(relaycc_topo::LinkId::new(*e as usize)));
        let (gbps, latency_us) = links.fold((f64::INFINITY, 0.0), |(g, l), k| {
            (g.min(k.gbps), l + k.latency_us)
        });
        let route = Route {
            hops: vec![Hop {
                from,
                to,
                edges,
                gbps,
                latency_us,
            }],
        };
        self.nic_routes.insert(key, route.clone());
        Ok(route)
    }

    /// Copy the input runs of rank `r` that `needed` lists (offset, len) to its host staging
    /// buffer (one device-to-host copy per merged run, [Lockhart-2023, Eq. 4.5]'s initial copy).
    pub fn stage_out(&mut self, r: u32, needed: &[(u64, u64)]) -> Result<()> {
        let runs = merge(needed);
        if runs.is_empty() {
            return Ok(());
        }
        let len = runs.iter().map(|r| r.1).sum();
        let buf = self.slot(self.host[r as usize], len);
        self.stages[r as usize].send = Some(buf);
        let mut at = 0;
        for (off, n) in runs {
            let (g, h) = (self.gpu(r), self.host[r as usize]);
            let ops = self.mv(
                g,
                Region::new(BufferRef::Input(r), off, n),
                h,
                Region::new(buf, at, n),
                &[],
                0,
            )?;
            self.stages[r as usize].send_runs.push((off, n, at, ops));
            at += n;
        }
        Ok(())
    }

    /// The host-staged copy of `len` input elements of rank `r` from `off` (after
    /// [`NodeAwarePlanBuilder::stage_out`] covered them), or the GPU input itself when none was staged.
    pub fn send_side(&self, r: u32, off: u64, len: u64) -> Side {
        let st = &self.stages[r as usize];
        let run = st
            .send_runs
            .iter()
            .find(|run| run.0 <= off && off + len <= run.0 + run.1);
        match (st.send, run) {
            (Some(buf), Some(run)) => Side {
                loc: self.host[r as usize],
                region: Region::new(buf, run.2 + off - run.0, len),
                deps: run.3.clone(),
            },
            _ => Side {
                loc: self.gpu(r),
                region: Region::new(BufferRef::Input(r), off, len),
                deps: Vec::new(),
            },
        }
    }

    /// Where `len` output elements of rank `d` from `off` are received: the next `len` elements
    /// of its host receive slot (taken on first use in a round) when `staged`, else the GPU
    /// output.
    pub fn recv_side(&mut self, d: u32, off: u64, len: u64, staged: bool) -> Result<Side> {
        if !staged {
            return Ok(Side {
                loc: self.gpu(d),
                region: Region::new(BufferRef::Output(d), off, len),
                deps: Vec::new(),
            });
        }
        let buf = match self.stages[d as usize].recv {
            Some(b) => b,
            None => {
                let b = self.slot(self.host[d as usize], 0);
                self.stages[d as usize].recv = Some(b);
                b
            }
        };
        let st = &mut self.stages[d as usize];
        let at = st.recv_used;
        st.recv_used += len;
        let used = st.recv_used;
        crate::staging::grow(&mut self.w.plan, buf, used);
        Ok(Side {
            loc: self.host[d as usize],
            region: Region::new(buf, at, len),
            deps: Vec::new(),
        })
    }

    /// Record that ops `ops` filled `len` elements of rank `d`'s host receive staging at
    /// `at` (from [`NodeAwarePlanBuilder::recv_side`]), bound for its output at `off`.
    pub fn received(&mut self, d: u32, off: u64, at: u64, len: u64, ops: Vec<u32>) {
        if len > 0 {
            self.stages[d as usize].recv_parts.push((off, at, len, ops));
        }
    }

    /// Copy every filled run of every host receive staging slot to its GPU output (one
    /// host-to-device copy per run contiguous in both, [Lockhart-2023, Eq. 4.5]'s final copy).
    fn flush_received(&mut self) -> Result<()> {
        for d in 0..self.stages.len() as u32 {
            let Some(buf) = self.stages[d as usize].recv else {
                continue;
            };
            let mut parts = std::mem::take(&mut self.stages[d as usize].recv_parts);
            parts.sort_unstable_by_key(|p| p.1);
            let mut runs: Vec<(u64, u64, u64, Vec<u32>)> = Vec::new();
            for (off, at, n, ops) in parts {
                match runs.last_mut() {
                    Some(l) if l.0 + l.2 == off && l.1 + l.2 == at => {
                        l.2 += n;
                        l.3.extend(ops);
                    }
                    _ => runs.push((off, at, n, ops)),
                }
            }
            for (off, at, n, mut deps) in runs {
                deps.sort_unstable();
                deps.dedup();
                let (h, g) = (self.host[d as usize], self.gpu(d));
                self.mv(
                    h,
                    Region::new(buf, at, n),
                    g,
                    Region::new(BufferRef::Output(d), off, n),
                    &deps,
                    0,
                )?;
            }
        }
        Ok(())
    }

    /// The finished plan (after the last [`NodeAwarePlanBuilder::end_round`]).
    pub fn finish(self) -> Plan {
        self.w.plan
    }
}

/// Merge (offset, len) spans into sorted, disjoint, non-adjacent runs; drops empty spans.
fn merge(spans: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = spans.iter().copied().filter(|s| s.1 > 0).collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (off, len) in v {
        match out.last_mut() {
            Some(last) if off <= last.0 + last.1 => {
                last.1 = last.1.max(off + len - last.0);
            }
            _ => out.push((off, len)),
        }
    }
    out
}

/// The widest path of usable links from `a` to `b` passing no GPU, as topology edge indices
/// (network paths between NICs may cross sockets).
fn widest_edges(topo: &Topology, a: NodeId, b: NodeId) -> Option<Vec<u32>> {
    relaycc_plan::path::widest_links(topo, a, b, true).map(|(edges, _, _)| edges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge() {
        assert_eq!(merge(&[(5, 2), (0, 3), (3, 2), (9, 0)]), vec![(0, 7)]);
        assert_eq!(merge(&[(0, 2), (4, 2), (1, 1)]), vec![(0, 2), (4, 2)]);
    }

    #[test]
    fn widest_path_crosses_the_network() {
        let t = relaycc_topo::preset("cluster:2xpcie-4gpu:ib-hdr").unwrap();
        let nics: Vec<NodeId> = t.nics().map(|(id, _)| id).collect();
        let e = widest_edges(&t, nics[0], nics[1]).unwrap();
        assert_eq!(e.len(), 2, "NIC -> switch -> NIC");
    }
}
