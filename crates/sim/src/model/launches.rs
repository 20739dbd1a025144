//! What launches each op of one of relaycc's own plans costs on the CUDA executor: which
//! copies run on a copy engine, which on the lane GPU's SMs, and which of those start a
//! kernel launch of their own, so the simulator charges each op what the executor pays.
//!
//! The rules follow the CUDA backend's lowering (`relaycc-collectives`' `cuda/schedule.rs`,
//! `copy_batch.rs`, `fan_out.rs`):
//! - A copy may run on SMs when the lane's GPU reaches both of its memories with its own
//!   loads and stores: its own memory, another arena of the same device, or, when the lane's
//!   GPU is one end of the copy, the other end's over the copy's path where that path is
//!   NVLink, or PCIe between GPUs that have peer-to-peer access. Host memory never.
//! - Such a copy smaller than [`rates::SM_COPY_BELOW_BYTES`] runs on SMs; a larger one runs
//!   on SMs only at the head of a fan-out (the next op of its lane, waiting for nothing, is a
//!   reachable copy of the same source), and otherwise on a copy engine.
//! - A reachable copy that waits for no other lane joins the launch of the op before it on
//!   its lane: a reduction whose destination is its source (its result written onward by
//!   the same kernel) or a copy of the same source (a fan-out), both up to
//!   [`rates::REDUCE_KERNEL_DSTS_MAX`] destinations per launch, or a small copy on SMs (a
//!   batch, up to [`rates::SM_COPY_BATCH_MAX`] copies per launch).
//!
//! Not modelled: the executor's checks of each launch's addresses (a copy overlapping another
//! of its batch starts a launch of its own there), and several ops of a plan fused into one
//! by the host backend.

use relaycc_plan::{Location, OpKind, Plan, Region};
use relaycc_topo::{LinkKind, NodeKind, Topology, rates};

/// How the executor runs one op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpLaunch {
    /// A copy on a copy engine: one copy-engine launch.
    CopyEngine,
    /// A reduction, or a copy on SMs that starts a kernel: one kernel launch.
    Kernel,
    /// A copy on SMs inside the launch of the op before it on its lane (a batch of small
    /// copies, each reading its own source): no launch of its own.
    Joined,
    /// A copy of the source that the launch before it on its lane already reads (a
    /// reduction's result, or a fan-out's source) inside that launch: no launch of its own,
    /// and no read of its own (the kernel writes the bytes it holds once more).
    JoinedFanOut,
}

/// What the launch of a lane's last op can still take in.
#[derive(Debug, Clone, Copy)]
enum Open {
    /// Nothing.
    Closed,
    /// Copies of exactly `src` (a reduction's result, or a fan-out's source), `left` more.
    CopiesOf { src: Region, left: usize },
    /// Small copies on SMs (a batch), `left` more.
    Batch { left: usize },
}

/// How the executor runs each op of `plan` on `topo`. A plan with an NCCL protocol is timed as
/// NCCL's steps, not by these launches; they still say how this executor would run it (its
/// host issue order).
pub(crate) fn launches(topo: &Topology, plan: &Plan) -> Vec<OpLaunch> {
    let ops = &plan.ops;
    let mut open = vec![Open::Closed; plan.lanes.len()];
    // The next op of each op's lane, found walking backwards once.
    let mut next_on_lane = vec![None; ops.len()];
    let mut seen: Vec<Option<usize>> = vec![None; plan.lanes.len()];
    for (i, op) in ops.iter().enumerate().rev() {
        if let Some(s) = seen.get_mut(op.lane as usize) {
            next_on_lane[i] = s.replace(i);
        }
    }
    let elem = plan.dtype.size();
    // Whether each copy's lane GPU reaches both its memories, found once per op.
    let reach: Vec<bool> = (0..ops.len()).map(|i| reachable(topo, plan, i)).collect();
    // A reachable copy that waits for no other lane (a dependency on an op of its own lane
    // is its lane's order, which the executor keeps without a wait).
    let free = |i: usize| {
        let lane = ops[i].lane;
        reach[i]
            && ops[i]
                .deps
                .iter()
                .all(|&d| ops.get(d as usize).is_some_and(|o| o.lane == lane))
    };
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let Some(lane) = open.get_mut(op.lane as usize) else {
            out.push(OpLaunch::CopyEngine);
            continue;
        };
        let src = match &op.kind {
            OpKind::Reduce { dst, .. } => {
                let left = rates::REDUCE_KERNEL_DSTS_MAX - 1;
                *lane = Open::CopiesOf { src: *dst, left };
                out.push(OpLaunch::Kernel);
                continue;
            }
            OpKind::Copy { src, .. } => *src,
        };
        let small = !op.is_empty() && op.len().saturating_mul(elem) < rates::SM_COPY_BELOW_BYTES;
        let ok = free(i);
        let (launch, next) = match *lane {
            Open::CopiesOf { src: s, left } if ok && s == src && left > 0 => (
                OpLaunch::JoinedFanOut,
                Open::CopiesOf {
                    src: s,
                    left: left - 1,
                },
            ),
            Open::Batch { left } if ok && small && left > 0 => {
                (OpLaunch::Joined, Open::Batch { left: left - 1 })
            }
            _ => {
                let reach = reach[i];
                let fans_out = reach
                    && next_on_lane[i].is_some_and(|k| {
                        matches!(ops[k].kind, OpKind::Copy { src: s, .. } if s == src) && free(k)
                    });
                if fans_out {
                    let left = rates::REDUCE_KERNEL_DSTS_MAX - 1;
                    (OpLaunch::Kernel, Open::CopiesOf { src, left })
                } else if reach && small {
                    let left = rates::SM_COPY_BATCH_MAX - 1;
                    (OpLaunch::Kernel, Open::Batch { left })
                } else {
                    (OpLaunch::CopyEngine, Open::Closed)
                }
            }
        };
        *lane = next;
        out.push(launch);
    }
    out
}

/// The op whose launch each op of `plan` joins as [`OpLaunch::JoinedFanOut`]: the kernel
/// before it on its lane (a reduction, or a fan-out's head), whose source it writes once
/// more; `None` for every other op.
pub(crate) fn fan_out_heads(plan: &Plan, launches: &[OpLaunch]) -> Vec<Option<u32>> {
    let mut kernel_on_lane: Vec<Option<u32>> = vec![None; plan.lanes.len()];
    plan.ops
        .iter()
        .zip(launches)
        .enumerate()
        .map(|(i, (op, launch))| {
            let last = kernel_on_lane.get_mut(op.lane as usize)?;
            match launch {
                OpLaunch::JoinedFanOut => *last,
                OpLaunch::Kernel => {
                    *last = Some(i as u32);
                    None
                }
                OpLaunch::CopyEngine | OpLaunch::Joined => {
                    *last = None;
                    None
                }
            }
        })
        .collect()
}

/// Each op's launch in the order the host issues them (launches one after another in op
/// order): an op that joins the launch before it on its lane takes that launch's place.
pub(crate) fn issue_order(plan: &Plan, launches: &[OpLaunch]) -> Vec<u32> {
    let mut last_on_lane = vec![0u32; plan.lanes.len()];
    let mut issued = 0u32;
    plan.ops
        .iter()
        .zip(launches)
        .map(|(op, l)| {
            let lane = last_on_lane.get_mut(op.lane as usize);
            match (l, lane) {
                (OpLaunch::Joined | OpLaunch::JoinedFanOut, Some(at)) => *at,
                (_, lane) => {
                    let at = issued;
                    issued = issued.saturating_add(1);
                    if let Some(last) = lane {
                        *last = at;
                    }
                    at
                }
            }
        })
        .collect()
}

/// Whether copy `i`'s lane GPU reaches both of its memories with its own loads and stores
/// (module docs). The path decides first: a copy whose edges leave NVLink and peer-to-peer
/// PCIe crosses a CPU or the network (in a template, a copy to another period's GPU names
/// the domain's image of that GPU, so its memories alone would look local).
fn reachable(topo: &Topology, plan: &Plan, i: usize) -> bool {
    let op = &plan.ops[i];
    let OpKind::Copy { src, dst } = &op.kind else {
        return false;
    };
    let Some(Location::Gpu(g)) = plan.lanes.get(op.lane as usize).map(|l| l.location) else {
        return false;
    };
    let (Some(Location::Gpu(a)), Some(Location::Gpu(b))) =
        (plan.location(src.buffer), plan.location(dst.buffer))
    else {
        return false;
    };
    if !peer_path(topo, op, a, b) {
        return false;
    }
    let same = |x: u32| x == g || plan.one_device_memory || topo.shared_device(&[g, x]).is_some();
    match (same(a), same(b)) {
        (true, true) => true,
        (true, false) | (false, true) => !op.edges.is_empty(),
        (false, false) => false,
    }
}

/// Whether every edge of copy `op` from GPU `a` to GPU `b` is NVLink, or PCIe between GPUs
/// with peer-to-peer access and no CPU at either end: the path a GPU's loads and stores take
/// to a peer. A copy with no edges stays in one memory.
fn peer_path(topo: &Topology, op: &relaycc_plan::Op, a: u32, b: u32) -> bool {
    let (Ok(na), Ok(nb)) = (topo.gpu(a), topo.gpu(b)) else {
        return false;
    };
    op.edges.iter().all(|&e| {
        let id = relaycc_topo::LinkId::new(e as usize);
        let Some(link) = topo.graph().edge_weight(id) else {
            return false;
        };
        let (x, y) = topo.link_ends(id);
        let no_cpu = |n| !matches!(topo.node(n).kind, NodeKind::Cpu(_));
        match link.kind {
            LinkKind::Nvlink { .. } => true,
            LinkKind::Pcie { .. } => no_cpu(x) && no_cpu(y) && topo.pcie_peer_ok(na, nb),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use relaycc_plan::{Location::Gpu, Request};

    use super::*;

    const SMALL: u64 = 1 << 20;
    const LARGE: u64 = 16 << 20;

    /// A plan of bytes on `topo` with one lane on GPU0.
    fn plan_on_gpu0() -> (Plan, u32) {
        let mut p = Plan::new(Request::point_to_point(0, 1, LARGE), "test");
        let lane = p.add_lane(Gpu(0), "l");
        (p, lane)
    }

    fn scratch(p: &mut Plan, gpu: u32, len: u64) -> Region {
        Region::new(p.add_scratch(Gpu(gpu), len), 0, len)
    }

    /// The edge ids of the path `a -> b -> ...` through the named nodes' links.
    fn edges(topo: &Topology, nodes: &[relaycc_topo::NodeId]) -> Vec<u32> {
        nodes
            .windows(2)
            .map(|w| topo.link_between(w[0], w[1]).expect("adjacent").index() as u32)
            .collect()
    }

    fn nvlink(topo: &Topology, a: u32, b: u32) -> Vec<u32> {
        edges(topo, &[topo.gpu(a).unwrap(), topo.gpu(b).unwrap()])
    }

    /// On a DGX-1, GPU0's NVLink peers: a small copy starts a kernel and the small copies
    /// after it join its batch, up to 16 in one launch; a large copy goes to a copy engine, and
    /// a small copy that waits for another lane starts a launch of its own.
    #[test]
    fn small_copies_to_nvlink_peers_run_on_sms_in_batches() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let (mut p, lane) = plan_on_gpu0();
        let mut want = Vec::new();
        for k in 0..18 {
            let (src, dst) = (scratch(&mut p, 0, SMALL), scratch(&mut p, 1, SMALL));
            p.copy(lane, src, dst, nvlink(&topo, 0, 1), vec![]);
            want.push(if k % 16 == 0 {
                OpLaunch::Kernel
            } else {
                OpLaunch::Joined
            });
        }
        let (src, dst) = (scratch(&mut p, 0, LARGE), scratch(&mut p, 2, LARGE));
        p.copy(lane, src, dst, nvlink(&topo, 0, 2), vec![]);
        want.push(OpLaunch::CopyEngine);
        let other = p.add_lane(Gpu(3), "other");
        let (src, dst) = (scratch(&mut p, 3, SMALL), scratch(&mut p, 0, SMALL));
        let first = p.copy(other, src, dst, nvlink(&topo, 3, 0), vec![]);
        want.push(OpLaunch::Kernel);
        for deps in [vec![], vec![first]] {
            let (src, dst) = (scratch(&mut p, 0, SMALL), scratch(&mut p, 1, SMALL));
            p.copy(lane, src, dst, nvlink(&topo, 0, 1), deps);
        }
        // After the copy-engine copy the first starts a kernel; the next waits for GPU3's.
        want.extend([OpLaunch::Kernel, OpLaunch::Kernel]);
        // A dependency on an op of its own lane is that lane's order: no wait, it joins.
        let (src, dst) = (scratch(&mut p, 0, SMALL), scratch(&mut p, 1, SMALL));
        let last = p.ops.len() as u32 - 1;
        p.copy(lane, src, dst, nvlink(&topo, 0, 1), vec![last]);
        want.push(OpLaunch::Joined);
        assert_eq!(launches(&topo, &p), want);
    }

    /// A reduction's result copied onward right after it joins its kernel (up to the kernel's
    /// eight destinations), large or small; so does a fan-out of one source, whose head runs
    /// on SMs at any size.
    #[test]
    fn copies_of_a_reductions_result_and_fan_outs_join_one_kernel() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let (mut p, lane) = plan_on_gpu0();
        let (a, b) = (scratch(&mut p, 0, LARGE), scratch(&mut p, 0, LARGE));
        let out = scratch(&mut p, 0, LARGE);
        p.reduce(lane, vec![a, b], out, false, vec![]);
        let mut want = vec![OpLaunch::Kernel];
        for k in 0..9 {
            let dst = scratch(&mut p, 1 + k % 4, LARGE);
            p.copy(lane, out, dst, nvlink(&topo, 0, 1 + k % 4), vec![]);
            // Seven join the reduction; the eighth heads a fan-out the ninth joins.
            want.push(match k {
                0..7 => OpLaunch::JoinedFanOut,
                7 => OpLaunch::Kernel,
                _ => OpLaunch::JoinedFanOut,
            });
        }
        // A large copy of another source with no copy of it after: a copy engine.
        let (src, dst) = (scratch(&mut p, 0, LARGE), scratch(&mut p, 1, LARGE));
        p.copy(lane, src, dst, nvlink(&topo, 0, 1), vec![]);
        want.push(OpLaunch::CopyEngine);
        assert_eq!(launches(&topo, &p), want);
    }

    /// Copies a GPU's own loads and stores do not reach run on copy engines: through host
    /// memory, between PCIe GPUs whose driver refuses peer access (GeForce), and from a lane
    /// on a GPU that is neither end. PCIe GPUs with peer access (L40S) run small copies on
    /// SMs; a plan with an NCCL protocol is run alike.
    #[test]
    fn copies_a_gpu_cannot_reach_run_on_copy_engines() {
        let dgx1 = relaycc_topo::preset("dgx1-v100").unwrap();
        let (mut p, lane) = plan_on_gpu0();
        let host = dgx1.attached_cpu(dgx1.gpu(0).unwrap()).unwrap();
        let h = Region::new(
            p.add_scratch(relaycc_plan::Location::Host(host.index() as u32), SMALL),
            0,
            SMALL,
        );
        let src = scratch(&mut p, 0, SMALL);
        p.copy(lane, src, h, vec![], vec![]);
        assert_eq!(launches(&dgx1, &p), [OpLaunch::CopyEngine]);
        for (name, p2p) in [("rtx4090-8gpu", false), ("l40s-8gpu", true)] {
            let topo = relaycc_topo::preset(name).unwrap();
            let (g0, g1) = (topo.gpu(0).unwrap(), topo.gpu(1).unwrap());
            let sw = topo.pcie_parent(g0).unwrap();
            assert_eq!(topo.pcie_parent(g1), Some(sw), "{name}: one switch");
            let (mut p, lane) = plan_on_gpu0();
            let (src, dst) = (scratch(&mut p, 0, SMALL), scratch(&mut p, 1, SMALL));
            p.copy(lane, src, dst, edges(&topo, &[g0, sw, g1]), vec![]);
            let want = if p2p {
                OpLaunch::Kernel
            } else {
                OpLaunch::CopyEngine
            };
            assert_eq!(launches(&topo, &p), [want], "{name}");
            p.protocol = Some(rates::Protocol::Simple);
            assert_eq!(launches(&topo, &p), [want], "{name}: under a protocol");
        }
        let (mut p, _) = plan_on_gpu0();
        let third = p.add_lane(Gpu(2), "third");
        let (src, dst) = (scratch(&mut p, 0, SMALL), scratch(&mut p, 1, SMALL));
        p.copy(third, src, dst, nvlink(&dgx1, 0, 1), vec![]);
        assert_eq!(launches(&dgx1, &p), [OpLaunch::CopyEngine]);
    }
}
