//! What a request needs of a (masked) topology before any planner runs: its GPUs exist and are
//! free, the relay list names GPUs that exist, and every member pair the request moves data
//! between is joined by some usable path. Planners assume all three; checking them once here
//! turns a machine that cannot carry the request into an error naming the GPU or the pair,
//! instead of a planner finding an empty ring deep inside.

use std::collections::VecDeque;

use petgraph::Direction;
use petgraph::visit::EdgeRef;
use relaycc_topo::Topology;

use relaycc_plan::Request;
use relaycc_plan::path::RelayPolicy;
use relaycc_plan::{Result, RouteError};

/// Check that `req` can be planned on `topo` under `relay` before planning it.
///
/// # Errors
/// - [`RouteError::Topo`] when a member GPU does not exist;
/// - [`RouteError::BadRequest`] when the relay list names a GPU the topology lacks, or the
///   request is malformed;
/// - [`RouteError::NoRoute`] when a member is masked busy or absent, or when some member must
///   send data to another (by [`Request::expected`]) and no path of usable links joins them,
///   passing only through switches, CPUs, NICs, member GPUs and the GPUs `relay` admits (the
///   first such pair, in rank order, is named).
///
/// # Complexity
/// One breadth-first search over the topology graph per sending member, O(n (V + E)), and one
/// pass over the request's expected pieces, O(n^2) for the dense collectives.
pub fn require_reachable(topo: &Topology, req: &Request, relay: &RelayPolicy) -> Result<()> {
    req.validate()?;
    require_relays_exist(topo, relay)?;
    let what = || format!("{} on {}", req.collective, gpu_list(&req.gpus));
    for &g in &req.gpus {
        topo.gpu(g)?;
        if !topo.gpu_present(g) {
            return Err(RouteError::NoRoute {
                what: what(),
                why: format!("member GPU{g} is masked absent"),
            });
        }
        if !topo.gpu_free(g) {
            return Err(RouteError::NoRoute {
                what: what(),
                why: format!("member GPU{g} is masked busy (running other work)"),
            });
        }
    }
    // Which GPUs data may pass through, by GPU index: members, and the relays the policy
    // admits (a lookup per visited GPU instead of a scan of the members).
    // Membership is looked up, not searched for: a scan of 73,728 members per GPU took a
    // second of a planning call on 1,024 GB200 racks.
    let mut member = vec![false; topo.gpu_count() as usize];
    for &g in &req.gpus {
        if let Some(m) = member.get_mut(g as usize) {
            *m = true;
        }
    }
    let forwards: Vec<bool> = (0..topo.gpu_count())
        .map(|g| {
            let m = member.get(g as usize).copied().unwrap_or(false);
            relay.allows_known(topo, g, m) || m
        })
        .collect();
    // Every member reaching one member that reaches every member is every pair reaching each
    // other through it (a member forwards): two searches instead of one per sender.
    if let Some(&hub) = req.gpus.first() {
        let to = search(topo, &forwards, hub, Direction::Outgoing)?;
        let from = search(topo, &forwards, hub, Direction::Incoming)?;
        let mut all = true;
        for &g in &req.gpus {
            let i = topo.gpu(g)?.index();
            all &= to.get(i).copied().unwrap_or(false) && from.get(i).copied().unwrap_or(false);
        }
        if all {
            return Ok(());
        }
    }
    let mut pairs = Vec::new();
    for piece in req.expected()? {
        for &(src, _) in &piece.terms {
            if src != piece.rank {
                pairs.push((src, piece.rank));
            }
        }
    }
    pairs.sort_unstable();
    pairs.dedup();
    let mut from: Option<(u32, Vec<bool>)> = None;
    for (src, dst) in pairs {
        let (a, b) = (req.gpus[src as usize], req.gpus[dst as usize]);
        if from.as_ref().is_none_or(|(s, _)| *s != src) {
            from = Some((src, search(topo, &forwards, a, Direction::Outgoing)?));
        }
        let seen = from.as_ref().map(|(_, s)| s.as_slice()).unwrap_or(&[]);
        let node = topo.gpu(b)?.index();
        if !seen.get(node).copied().unwrap_or(false) {
            return Err(RouteError::NoRoute {
                what: what(),
                why: format!(
                    "GPU{a} cannot reach GPU{b}: no path of usable links (down links and \
                     absent GPUs masked) through switches, CPUs, member GPUs or GPUs the relay \
                     policy {relay:?} admits"
                ),
            });
        }
    }
    Ok(())
}

/// An error when `relay` lists a GPU that `topo` does not have, or one its mask marks absent.
pub fn require_relays_exist(topo: &Topology, relay: &RelayPolicy) -> Result<()> {
    if let RelayPolicy::List(list) = relay {
        for &g in list {
            if g >= topo.gpu_count() || !topo.gpu_present(g) {
                return Err(RouteError::BadRequest(format!(
                    "relay GPU {g} does not exist in topology {} ({} GPUs)",
                    topo.name(),
                    topo.gpu_count()
                )));
            }
        }
    }
    Ok(())
}

/// `GPU0,GPU2,GPU5`.
fn gpu_list(gpus: &[u32]) -> String {
    gpus.iter()
        .map(|g| format!("GPU{g}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Which topology nodes (by index) data leaving GPU `gpu` can reach (`Outgoing`), or can send
/// data to it (`Incoming`), over usable links of nonzero rate, passing through any node but GPUs
/// that are neither members nor relays: data may arrive at (or leave) such a GPU, but goes no
/// further through it.
fn search(topo: &Topology, forwards: &[bool], gpu: u32, dir: Direction) -> Result<Vec<bool>> {
    let start = topo.gpu(gpu)?;
    let mut seen = vec![false; topo.graph().node_count()];
    let mut queue = VecDeque::from([start]);
    seen[start.index()] = true;
    while let Some(at) = queue.pop_front() {
        let passes = at == start
            || topo
                .node(at)
                .gpu()
                .is_none_or(|info| forwards.get(info.index as usize).copied().unwrap_or(false));
        if !passes {
            continue;
        }
        for e in topo.graph().edges_directed(at, dir) {
            let next = match dir {
                Direction::Outgoing => e.target(),
                Direction::Incoming => e.source(),
            };
            if e.weight().gbps > 0.0 && topo.link_usable(e.id()) && !seen[next.index()] {
                seen[next.index()] = true;
                queue.push_back(next);
            }
        }
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::Collective;
    use relaycc_plan::DType;
    use relaycc_topo::Mask;

    fn split_pcie() -> Topology {
        let t = relaycc_topo::preset("pcie-4gpu").unwrap();
        let mut m = Mask::default();
        m.link_down("CPU0", "PCIe1");
        t.with_mask(m).unwrap()
    }

    #[test]
    fn a_split_machine_names_the_pair_that_cannot_reach() {
        let t = split_pcie();
        let req = Request::new(Collective::AllReduce, vec![0, 1, 2, 3], 64, DType::F32);
        let e = require_reachable(&t, &req, &RelayPolicy::Any).unwrap_err();
        assert!(e.to_string().contains("GPU0 cannot reach GPU2"), "{e}");
        // Each half on its own is fine.
        let half = Request::new(Collective::AllReduce, vec![2, 3], 64, DType::F32);
        require_reachable(&t, &half, &RelayPolicy::Any).unwrap();
    }

    #[test]
    fn only_pairs_that_move_data_are_required() {
        let t = split_pcie();
        // Broadcast from GPU 2 needs 2 -> 0; a gather into GPU 0 needs 3 -> 0.
        let b = Request::new(Collective::Broadcast, vec![2, 0], 64, DType::F32);
        let e = require_reachable(&t, &b, &RelayPolicy::Any).unwrap_err();
        assert!(e.to_string().contains("GPU2 cannot reach GPU0"), "{e}");
        // One rank moves nothing between GPUs.
        let one = Request::new(Collective::AllReduce, vec![3], 64, DType::F32);
        require_reachable(&t, &one, &RelayPolicy::None).unwrap();
    }

    #[test]
    fn relays_are_the_only_gpus_data_passes_through() {
        // DGX-1: GPU 0's NVLinks lead to 1, 2, 3 and 4; with every PCIe link from GPU 0's
        // switch down, GPU 0 reaches GPU 7 only through another GPU.
        let t = relaycc_topo::preset("dgx1-v100").unwrap();
        let sw = t
            .links_from(t.gpu(0).unwrap())
            .map(|(_, to, _)| to)
            .find(|n| t.node(*n).gpu().is_none())
            .unwrap();
        let mut m = Mask::default();
        m.link_down("GPU0", &t.node(sw).name);
        let t = t.with_mask(m).unwrap();
        let req = Request::new(Collective::Gather, vec![7, 0], 64, DType::F32);
        let e = require_reachable(&t, &req, &RelayPolicy::None).unwrap_err();
        assert!(e.to_string().contains("GPU0 cannot reach GPU7"), "{e}");
        require_reachable(&t, &req, &RelayPolicy::List(vec![4])).unwrap();
        require_reachable(&t, &req, &RelayPolicy::Any).unwrap();
    }

    #[test]
    fn busy_members_and_unknown_relays_are_errors() {
        let t = relaycc_topo::preset("pcie-4gpu").unwrap();
        let req = Request::new(Collective::AllReduce, vec![0, 1], 64, DType::F32);
        let busy = t.with_mask(Mask::busy([1])).unwrap();
        let e = require_reachable(&busy, &req, &RelayPolicy::Any).unwrap_err();
        assert!(e.to_string().contains("GPU1 is masked busy"), "{e}");
        let e = require_reachable(&t, &req, &RelayPolicy::List(vec![99])).unwrap_err();
        assert!(matches!(e, RouteError::BadRequest(_)), "{e}");
        assert!(e.to_string().contains("relay GPU 99 does not exist"), "{e}");
    }
}
