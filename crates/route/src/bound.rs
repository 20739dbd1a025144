//! Bounds on collective performance, as algbw (GB/s): no plan on the masked machine can beat
//! them, so every prediction is reported beside its bound.
//!
//! The point-to-point bound is the max-flow ([`crate::p2p::p2p_bound_gbps`]). For collectives
//! the standard per-GPU ingress/egress bound: the bytes rank r must receive cannot arrive
//! faster than `in_r`, the sum of the rates of the usable links into its GPU from nodes the job
//! may use (switches, sockets, member GPUs, GPUs the relay policy admits), and what it must
//! send cannot leave faster than `out_r`. With S the nccl-tests size (`Request::size_bytes`),
//! c the per-rank count in bytes and n ranks, the time T is at least:
//!
//! | collective | T >= |
//! |---|---|
//! | all_reduce | 2(n-1)/n x S / min_r in_r; (n-1)/n x S / min_r in_r where the members' NVSwitch reduces (NVLS) |
//! | all_gather, reduce_scatter | (n-1)/n x S / min_r in_r, and c / min_r out_r |
//! | all_gather_v | max_r (total - c_r) / in_r, and max_r c_r / out_r |
//! | broadcast | S / min_{r != root} in_r, S / out_root, S / min_r maxflow(root, r) |
//! | reduce | S / min_{r != root} out_r, S / in_root, S / min_r maxflow(r, root) |
//! | all_to_all(_v) | max_r max(recv_r / in_r, send_r / out_r) ((n-1)/n x S / min(in, out) when regular) |
//! | gather / scatter | (n-1)c / in_root (out_root), c / out_r (in_r) |
//! | send_recv | max_r max(recv_r / in_r, send_r / out_r), max over transfers of bytes / maxflow |
//!
//! The bound is S / T. Rates are exactly the directed links `relaycc topo show --format json`
//! prints, so anyone can recompute it.

use relaycc_topo::{NodeKind, Topology};

use crate::error::Result;
use crate::path::{RelayPolicy, max_flow_routes};
use crate::request::{Collective, Request};

/// Rates into (`inbound`) or out of a GPU over usable links to nodes the job may use, GB/s.
fn port_gbps(
    topo: &Topology,
    members: &[u32],
    relay: &RelayPolicy,
    g: u32,
    inbound: bool,
) -> Result<f64> {
    let me = topo.gpu(g)?;
    let ok = |n: relaycc_topo::NodeId| match &topo.node(n).kind {
        NodeKind::Gpu(info) => {
            members.contains(&info.index) || relay.allows(topo, members, info.index)
        }
        _ => true,
    };
    Ok(topo
        .links()
        .filter(|(id, x, y, _)| {
            topo.link_usable(*id)
                && if inbound {
                    *y == me && ok(*x)
                } else {
                    *x == me && ok(*y)
                }
        })
        .map(|(_, _, _, l)| l.gbps)
        .sum())
}

/// The bound on a collective's algbw, GB/s (see the module docs for the formulas).
///
/// # Arguments
/// - `topo`: the masked topology;
/// - `req`: the request (any collective);
/// - `relay`: which GPUs may relay (their links count towards a rank's ingress and egress,
///   and max-flows may pass them).
///
/// # Returns
/// The algbw bound in GB/s; infinity when nothing has to move (one rank, zero bytes); 0 when a
/// rank that must receive or send has no usable link.
///
/// # Complexity
/// O(n E) for the port rates, plus up to n max-flows (Dinic's, O(V^2 E)) for broadcast, reduce
/// and send_recv.
///
/// Source: the standard ingress/egress argument (every byte a rank needs crosses its links);
/// the max-flow/min-cut bound for rooted one-to-all traffic as ARCHITECTURE.md asks.
pub fn collective_bound_gbps(topo: &Topology, req: &Request, relay: &RelayPolicy) -> Result<f64> {
    req.validate()?;
    let n = req.nranks();
    let g = &req.gpus;
    let es = req.dtype.size() as f64;
    let size = req.size_bytes() as f64;
    let mut inr = Vec::with_capacity(n);
    let mut outr = Vec::with_capacity(n);
    for &x in g {
        inr.push(port_gbps(topo, g, relay, x, true)?);
        outr.push(port_gbps(topo, g, relay, x, false)?);
    }
    // Time lower bounds in bytes / (GB/s); `need(bytes, rate)` is 0 when nothing moves.
    let need = |bytes: f64, gbps: f64| {
        if bytes <= 0.0 {
            0.0
        } else if gbps <= 0.0 {
            f64::INFINITY
        } else {
            bytes / gbps
        }
    };
    let flow = |a: u32, b: u32| -> Result<f64> {
        let allowed = |x: u32| x != a && x != b && relay.allows(topo, g, x);
        Ok(max_flow_routes(topo, a, b, &allowed)?.0)
    };
    let nf = n as f64;
    let c = req.count as f64 * es;
    let root = req.root as usize;
    let mut t: f64 = 0.0;
    if n > 1 {
        match req.collective {
            Collective::AllReduce => {
                // Without a reducing switch every rank receives the others' shares of its
                // shard and the reduced other shards, 2(n-1)/n of the vector. Where the
                // NVSwitch reduces the request's op and type (NVLS), the sums arrive reduced:
                // (n-1)/n of it.
                let nvls = crate::planner::nvls::nvls_switch_for(topo, req).is_some();
                let share = if nvls { 1.0 } else { 2.0 };
                for x in &inr {
                    t = t.max(need(share * (nf - 1.0) / nf * size, *x));
                }
            }
            Collective::AllGather | Collective::ReduceScatter => {
                for r in 0..n {
                    t = t.max(need((nf - 1.0) / nf * size, inr[r]));
                    t = t.max(need(c, outr[r]));
                }
            }
            Collective::AllGatherV => {
                let total: u64 = req.counts.iter().sum();
                for r in 0..n {
                    let mine = req.counts[r] as f64 * es;
                    t = t.max(need(total as f64 * es - mine, inr[r]));
                    t = t.max(need(mine, outr[r]));
                }
            }
            Collective::Broadcast | Collective::Reduce => {
                let down = req.collective == Collective::Broadcast;
                for r in (0..n).filter(|r| *r != root) {
                    t = t.max(need(size, if down { inr[r] } else { outr[r] }));
                    let f = if down {
                        flow(g[root], g[r])?
                    } else {
                        flow(g[r], g[root])?
                    };
                    t = t.max(need(size, f));
                }
                t = t.max(need(size, if down { outr[root] } else { inr[root] }));
            }
            Collective::Gather | Collective::Scatter => {
                let gather = req.collective == Collective::Gather;
                for r in (0..n).filter(|r| *r != root) {
                    t = t.max(need(c, if gather { outr[r] } else { inr[r] }));
                }
                let at_root = (nf - 1.0) * c;
                t = t.max(need(at_root, if gather { inr[root] } else { outr[root] }));
            }
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => {
                let mut send = vec![0.0f64; n];
                let mut recv = vec![0.0f64; n];
                let mut add = |s: usize, d: usize, elems: u64| {
                    if s != d {
                        send[s] += elems as f64 * es;
                        recv[d] += elems as f64 * es;
                    }
                };
                match req.collective {
                    Collective::AllToAll => {
                        (0..n).for_each(|s| (0..n).for_each(|d| add(s, d, req.count)))
                    }
                    Collective::AllToAllV => {
                        (0..n).for_each(|s| (0..n).for_each(|d| add(s, d, req.matrix[s][d])))
                    }
                    _ => req
                        .transfers
                        .iter()
                        .for_each(|x| add(x.src as usize, x.dst as usize, x.count)),
                }
                for r in 0..n {
                    t = t.max(need(recv[r], inr[r])).max(need(send[r], outr[r]));
                }
                if req.collective == Collective::SendRecv {
                    for x in req
                        .transfers
                        .iter()
                        .filter(|x| x.src != x.dst && x.count > 0)
                    {
                        t = t.max(need(
                            x.count as f64 * es,
                            flow(g[x.src as usize], g[x.dst as usize])?,
                        ));
                    }
                }
            }
        }
    }
    Ok(if t <= 0.0 { f64::INFINITY } else { size / t })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn dgx1_all_reduce_and_broadcast_bounds() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::new(Collective::AllReduce, vec![0, 7], 1 << 20, DType::F32);
        // GPU ingress: 6 NVLink lanes (145.2) + PCIe (10); n = 2 so algbw <= in.
        let b = collective_bound_gbps(&topo, &req, &RelayPolicy::Any).unwrap();
        assert!((b - 155.2).abs() < 1e-6, "{b}");
        // Members only: GPU0's NVLink peers may not be used, only PCIe remains.
        let b = collective_bound_gbps(&topo, &req, &RelayPolicy::Members).unwrap();
        assert!((b - 10.0).abs() < 1e-6, "{b}");
        let bc = Request::new(Collective::Broadcast, vec![0, 7], 1 << 20, DType::F32);
        let b = collective_bound_gbps(&topo, &bc, &RelayPolicy::Any).unwrap();
        assert!((b - 155.2).abs() < 1e-6, "{b}");
        let one = Request::new(Collective::AllReduce, vec![3], 10, DType::F32);
        assert!(
            collective_bound_gbps(&topo, &one, &RelayPolicy::Any)
                .unwrap()
                .is_infinite()
        );
    }
}
