//! The route checker: a plan's copies against the topology's links and mask.

use relaycc_topo::{LinkId, NodeId, NodeKind, Topology};

use super::symbolic::fail;
use crate::error::Result;
use crate::plan::{Location, Op, OpKind, Plan};

/// Check that every copy of `plan` follows real links of `topo`: its edges form a path from
/// the source memory to the destination memory, through switches and sockets but no other
/// GPU, every edge usable under the mask, and over PCIe only between GPUs the driver grants
/// peer-to-peer access ([`Topology::pcie_peer_ok`]); and that every GPU the plan touches is
/// present and not busy, unless it is a member.
///
/// Two passes: `check_placement` (members present, scratch on usable GPUs), then
/// `check_path` for every copy.
pub fn check_routes(plan: &Plan, topo: &Topology) -> Result<()> {
    if let Some(s) = &plan.step_samples {
        check_routes(&s.short, topo)?;
        return check_routes(&s.long, topo);
    }
    if let Some(r) = &plan.rounds {
        check_routes(&r.body, topo)?;
        return r.tail.as_ref().map_or(Ok(()), |t| check_routes(t, topo));
    }
    let gpus = Gpus::new(topo, &plan.request.gpus);
    check_placement(plan, &gpus)?;
    for (id, op) in plan.ops.iter().enumerate() {
        if let OpKind::Copy { src, dst } = &op.kind {
            let (Some(from), Some(to)) = (plan.location(src.buffer), plan.location(dst.buffer))
            else {
                return Err(fail(id, "copy names a missing buffer"));
            };
            check_path(topo, id, op, from, to)?;
            for loc in [from, to] {
                if let Location::Gpu(g) = loc {
                    gpus.usable(g, id)?;
                }
            }
        }
    }
    Ok(())
}

/// Which GPUs a plan may touch: present ones, and among those the free ones or members.
struct Gpus<'a> {
    topo: &'a Topology,
    /// Whether each GPU index is a member: one lookup per copy end, where searching the
    /// member list cost a scan of 8,192 GPUs per copy on a 1,024-node cluster.
    member: Vec<bool>,
}

impl<'a> Gpus<'a> {
    fn new(topo: &'a Topology, members: &[u32]) -> Self {
        let size = members
            .iter()
            .map(|&g| g as usize + 1)
            .max()
            .unwrap_or(0)
            .max(topo.gpu_count() as usize);
        let mut member = vec![false; size];
        for &g in members {
            member[g as usize] = true;
        }
        Gpus { topo, member }
    }

    fn usable(&self, g: u32, id: usize) -> Result<()> {
        if !self.topo.gpu_present(g) {
            return Err(fail(id, format!("GPU{g} is absent")));
        }
        let member = self.member.get(g as usize).copied().unwrap_or(false);
        if !member && !self.topo.gpu_free(g) {
            return Err(fail(id, format!("GPU{g} is busy and may not relay")));
        }
        Ok(())
    }
}

/// An NVLS copy's shared edge joins a GPU to an NVSwitch chip, and its source GPU's switch
/// reduces and multicasts (sm90 or later).
fn check_nvls_switch(topo: &Topology, id: usize, src: NodeId, edge: u32) -> Result<()> {
    if edge as usize >= topo.graph().edge_count() {
        return Err(fail(id, format!("NVLS shared edge {edge} does not exist")));
    }
    let (x, y) = topo.link_ends(LinkId::new(edge as usize));
    let switch = [x, y]
        .into_iter()
        .any(|n| matches!(topo.node(n).kind, NodeKind::NvSwitch));
    if !switch {
        return Err(fail(
            id,
            format!("NVLS shared edge {edge} does not touch an NVSwitch"),
        ));
    }
    let sm = topo
        .node(src)
        .gpu()
        .and_then(|g| g.compute_capability)
        .map(|c| c.sm());
    if sm.and_then(|sm| topo.costs().nvls_efficiency(sm)).is_none() {
        return Err(fail(
            id,
            format!(
                "NVLS copy from {}: its NVSwitch does not reduce or multicast (needs sm90 or later)",
                topo.node(src).name
            ),
        ));
    }
    Ok(())
}

/// Pass 1: every member GPU is present, and every scratch buffer on a GPU sits on one the
/// plan may use.
fn check_placement(plan: &Plan, gpus: &Gpus) -> Result<()> {
    for &g in &plan.request.gpus {
        if !gpus.topo.gpu_present(g) {
            return Err(fail(usize::MAX, format!("member GPU{g} is absent")));
        }
    }
    for (i, s) in plan.scratch.iter().enumerate() {
        if let Location::Gpu(g) = s.location {
            gpus.usable(g, usize::MAX).map_err(|_| {
                fail(
                    usize::MAX,
                    format!("scratch {i} sits on GPU{g}, which may not be used"),
                )
            })?;
        }
    }
    Ok(())
}

/// The topology node of a plan location (a GPU, or a CPU socket's node for host memory).
fn node_of(topo: &Topology, loc: Location, id: usize) -> Result<NodeId> {
    match loc {
        Location::Gpu(g) => topo.gpu(g).map_err(|e| fail(id, e.to_string())),
        Location::Host(n) => {
            let node = NodeId::new(n as usize);
            match topo.graph().node_weight(node) {
                Some(w) if matches!(w.kind, NodeKind::Cpu(_)) => Ok(node),
                _ => Err(fail(id, format!("host location {n} is not a CPU node"))),
            }
        }
    }
}

/// Pass 2, per copy: op `id` (a copy `from -> to`) occupies a path of usable links from the
/// source memory to the destination memory that passes through no other GPU; a copy inside
/// one memory occupies no link.
fn check_path(topo: &Topology, id: usize, op: &Op, from: Location, to: Location) -> Result<()> {
    let (a, b) = (node_of(topo, from, id)?, node_of(topo, to, id)?);
    if let Some(share) = op.nvls {
        check_nvls_switch(topo, id, a, share.shared_edge)?;
    }
    // An NVLS read of the owner's own data goes to the switch and back (the switch reduces it
    // with the others); any other copy inside one memory occupies no link.
    if a == b && !(op.nvls.is_some() && op.edges.len() == 2) {
        if !op.edges.is_empty() {
            return Err(fail(id, "a copy inside one memory occupies links"));
        }
        return Ok(());
    }
    if op.edges.is_empty() {
        return Err(fail(
            id,
            format!("copy {from:?} -> {to:?} occupies no link"),
        ));
    }
    let nedges = topo.graph().edge_count();
    let mut at = a;
    for (k, &e) in op.edges.iter().enumerate() {
        if e as usize >= nedges {
            return Err(fail(id, format!("edge {e} does not exist")));
        }
        let eid = LinkId::new(e as usize);
        let (x, y) = topo.link_ends(eid);
        if x != at {
            return Err(fail(
                id,
                format!(
                    "edge {e} does not continue the path at {}",
                    topo.node(at).name
                ),
            ));
        }
        if !topo.link_usable(eid) {
            return Err(fail(
                id,
                format!(
                    "edge {e} ({} -> {}) is down",
                    topo.node(x).name,
                    topo.node(y).name
                ),
            ));
        }
        let last = k + 1 == op.edges.len();
        if !last && topo.node(y).gpu().is_some() {
            return Err(fail(
                id,
                format!("path passes through {} without staging", topo.node(y).name),
            ));
        }
        at = y;
    }
    if at != b {
        return Err(fail(
            id,
            format!(
                "path ends at {}, not at the destination",
                topo.node(at).name
            ),
        ));
    }
    let over_pcie = op.edges.iter().any(|&e| {
        matches!(
            topo.link(LinkId::new(e as usize)).kind,
            relaycc_topo::LinkKind::Pcie { .. }
        )
    });
    if over_pcie && !topo.pcie_peer_ok(a, b) {
        return Err(fail(
            id,
            format!(
                "copy {} -> {} crosses PCIe, but the driver refuses them peer-to-peer \
                 access; stage it through host memory",
                topo.node(a).name,
                topo.node(b).name
            ),
        ));
    }
    Ok(())
}
