//! Packed rings: several rings at once, each searched over what the rings before it left of
//! the links, the way NCCL fills its channels (`src/graph/search.cc` searches a ring at a
//! bandwidth and takes that bandwidth off every link the ring crosses, then searches the next).
//!
//! One ring and its reverse use one link per GPU each way; a DGX-1 V100 gives every GPU six
//! NVLink lanes to four peers, so all eight GPUs carry two NV2 rings and two NV1 rings (one
//! each way) at once, about three times one ring's bandwidth. Each ring carries a share of the
//! data in proportion to the bandwidth it was found at.
//!
//! Capacity is kept per directed link, except that the links of one GPU's NVSwitch port count
//! as one resource at the port's striped rate (as the simulator models them). A connection
//! split over several routes loads each link in proportion to its routes' weights.

use std::collections::BTreeMap;
use std::sync::Arc;

use relaycc_topo::{LinkId, NodeId, Topology};

use relaycc_plan::Request;
use relaycc_plan::{Result, RouteError};

use relaycc_plan::path::direct_route;

use super::connect::Connection;
use super::ring_order::best_order;
use super::{LinkMode, PlannerContext};

/// Rings searched at most (NCCL allows 32 channels; past a handful the shares are small and
/// each ring only adds ops and latency).
pub const MAX_PACKED_RINGS: usize = 8;

/// A ring slower than this fraction of the first one is not added: its share would be small
/// and its fixed costs the same.
pub const MIN_RING_FRACTION: f64 = 0.2;

/// A capacity the rings share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Resource {
    /// A directed link (topology edge index).
    Link(u32),
    /// A GPU's NVSwitch port: (GPU node, outbound).
    Port(NodeId, bool),
}

/// The resource a link belongs to and its rate, GB/s.
fn resource(topo: &Topology, e: u32) -> (Resource, f64) {
    let id = LinkId::new(e as usize);
    match topo.nvswitch_port(id) {
        Some((gpu, out)) => (Resource::Port(gpu, out), topo.striped_gbps(id)),
        None => (
            Resource::Link(e),
            topo.graph().edge_weight(id).map_or(0.0, |l| l.gbps),
        ),
    }
}

/// GB/s each resource carries per GB/s the connection moves, with the resource's capacity.
fn connection_load(topo: &Topology, conn: &Connection) -> Vec<(Resource, f64, f64)> {
    let total: f64 = conn.weights.iter().sum();
    let mut load: BTreeMap<Resource, (f64, f64)> = BTreeMap::new();
    for (route, w) in conn.routes.iter().zip(&conn.weights) {
        let share = if total > 0.0 {
            w / total
        } else {
            1.0 / conn.routes.len() as f64
        };
        for hop in &route.hops {
            for &e in &hop.edges {
                let (r, cap) = resource(topo, e);
                load.entry(r).or_insert((0.0, cap)).0 += share;
            }
        }
    }
    load.into_iter().map(|(r, (u, cap))| (r, u, cap)).collect()
}

/// A member pair's connection and its load per GB/s on each resource (with the resource's
/// capacity).
type Pair = (Arc<Connection>, Vec<(Resource, f64, f64)>);

/// What a connection or a whole ring can still carry, GB/s: `own` (its rate), capped by what
/// is left of each resource it loads (`load`: resource, GB/s per GB/s carried).
fn carry(
    remaining: &BTreeMap<Resource, f64>,
    load: impl Iterator<Item = (Resource, f64)>,
    own: f64,
) -> f64 {
    load.filter(|(_, u)| *u > 0.0)
        .map(|(r, u)| remaining.get(&r).copied().unwrap_or(0.0) / u)
        .fold(own, f64::min)
        .max(0.0)
}

/// One ring of a packed set.
#[derive(Debug, Clone)]
pub struct PackedRing {
    /// Rank positions in ring order, starting with rank 0.
    pub order: Vec<u32>,
    /// The bandwidth the ring was found at, GB/s: its share of the data is in proportion.
    pub gbps: f64,
    /// `hops[i]`: the connection from `order[i]` to `order[i + 1]` (wrapping).
    pub hops: Vec<Arc<Connection>>,
}

/// The packed ring set for `req` under `ctx`'s connections: at least one ring, or
/// [`RouteError::NoRoute`] naming a hop of the best ring that has no connection (a
/// [`RouteError::BadRequest`] for fewer than two ranks).
///
/// A member pair joined by a link uses it; other pairs use `ctx`'s connection
/// ([`super::ConnCache::get`]: a relay, host staging). Relaying a linked pair through a faster
/// route suits one ring (the unpacked ring candidates do that) but takes the relay's links
/// from every later ring.
/// Rings are searched until one would run below [`MIN_RING_FRACTION`] of the first, or
/// [`MAX_PACKED_RINGS`].
///
/// # Complexity
/// n^2 connections; per ring, one ring search (`best_order`) and O(n^2 x route links).
///
/// Source: NCCL's channel search (`src/graph/search.cc`, `ncclTopoCompute`), which subtracts
/// each ring's bandwidth from the links it uses before searching the next.
pub fn packed_rings(ctx: &PlannerContext, req: &Request) -> Result<Vec<PackedRing>> {
    let n = req.nranks();
    let topo = ctx.cache.topo();
    let g = &req.gpus;
    let conn = |a: usize, b: usize| ctx.cache.get(ctx.mode, g[a], g[b]).ok();
    // The best single ring, or the error of its first hop without a connection.
    let single = || -> Result<Vec<PackedRing>> {
        let order = super::ring_order::ring_order(ctx, req, false)?;
        let hops = (0..order.len())
            .map(|i| {
                let (a, b) = (order[i] as usize, order[(i + 1) % order.len()] as usize);
                ctx.cache.get(ctx.mode, g[a], g[b])
            })
            .collect::<Result<Vec<Arc<Connection>>>>()?;
        Ok(vec![PackedRing {
            order,
            gbps: 1.0,
            hops,
        }])
    };
    if n < 2 {
        return Err(RouteError::BadRequest(format!(
            "a ring needs two ranks or more, {n} given"
        )));
    }
    if n < 3 {
        return single();
    }
    // pairs[a * n + b]: the connection a -> b, its load per GB/s (with capacities), its rate.
    let mut pairs: Vec<Option<Pair>> = vec![None; n * n];
    let mut remaining: BTreeMap<Resource, f64> = BTreeMap::new();
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            // Each pair may search a path (n^2 of them: a million on 1,024 ranks, minutes in
            // all), so the clock is read before each, as the ring order's search does.
            crate::limits::check_deadline_now(ctx.limit, "packed into rings")?;
            // A pair joined by a link uses it, as NCCL's rings do: a relayed route that suits
            // one ring takes its relay's links from every later ring. (NCCL-like connections
            // already follow NCCL's own preference order.)
            let c = match direct_route(topo, g[a], g[b]) {
                Some(d) if ctx.mode == LinkMode::Single => Arc::new(Connection::single(d)),
                _ => match conn(a, b) {
                    Some(c) => c,
                    None => continue,
                },
            };
            let load = connection_load(topo, &c);
            for &(r, _, cap) in &load {
                remaining.entry(r).or_insert(cap);
            }
            pairs[a * n + b] = Some((c, load));
        }
    }
    let mut rings: Vec<PackedRing> = Vec::new();
    for _ in 0..MAX_PACKED_RINGS {
        let link: Vec<f64> = pairs
            .iter()
            .map(|p| {
                p.as_ref().map_or(0.0, |(c, load)| {
                    carry(&remaining, load.iter().map(|x| (x.0, x.1)), c.gbps())
                })
            })
            .collect();
        let order = best_order(&link, n);
        // What the whole ring loads each resource with, per GB/s it carries.
        let mut used: BTreeMap<Resource, f64> = BTreeMap::new();
        let mut own = f64::INFINITY;
        let mut hops = Vec::with_capacity(n);
        for i in 0..n {
            let Some((c, load)) = &pairs[order[i] * n + order[(i + 1) % n]] else {
                own = 0.0;
                break;
            };
            own = own.min(c.gbps());
            for &(r, u, _) in load {
                *used.entry(r).or_default() += u;
            }
            hops.push(Arc::clone(c));
        }
        // A ring over a pair with no connection has `own` 0, so it ends the search here.
        let bw = carry(&remaining, used.iter().map(|(r, u)| (*r, *u)), own);
        let first = rings.first().map_or(bw, |r| r.gbps);
        if !(bw > 0.0 && bw.is_finite()) || bw < MIN_RING_FRACTION * first {
            break;
        }
        for (r, u) in &used {
            if let Some(left) = remaining.get_mut(r) {
                *left = (*left - bw * u).max(0.0);
            }
        }
        rings.push(PackedRing {
            order: order.into_iter().map(|p| p as u32).collect(),
            gbps: bw,
            hops,
        });
    }
    if rings.is_empty() {
        single()
    } else {
        Ok(rings)
    }
}

/// True when packed rings are a candidate in `mode`: relaycc's single-route connections and the
/// NCCL-like baseline's (multi-path connections already spread one ring over every link).
pub fn packs(mode: LinkMode) -> bool {
    matches!(mode, LinkMode::Single | LinkMode::Nccl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ConnCache;
    use relaycc_plan::Collective;
    use relaycc_plan::DType;
    use relaycc_plan::path::RelayPolicy;

    fn rings(preset: &str, gpus: Vec<u32>, mode: LinkMode) -> Vec<PackedRing> {
        let topo = relaycc_topo::preset(preset).unwrap();
        let req = Request::new(Collective::AllReduce, gpus.clone(), 1 << 20, DType::F32);
        let relay = match mode {
            LinkMode::Nccl => RelayPolicy::Members,
            _ => RelayPolicy::Any,
        };
        let cache = ConnCache::new(&topo, &gpus, &relay);
        let ctx = PlannerContext::new(&cache, mode, 1, 1);
        packed_rings(&ctx, &req).unwrap()
    }

    #[test]
    fn a_full_dgx1_packs_two_nv2_and_two_nv1_rings() {
        for mode in [LinkMode::Nccl, LinkMode::Single] {
            let r = rings("dgx1-v100", (0..8).collect(), mode);
            let total: f64 = r.iter().map(|x| x.gbps).sum();
            // 6 NVLink lanes per GPU each way at 24.2 GB/s.
            assert!((total - 6.0 * 24.2).abs() < 1e-6, "{mode:?}: {r:?}");
            assert_eq!(r.len(), 4, "{mode:?}: {r:?}");
            for ring in &r {
                let order = &ring.order;
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..8).collect::<Vec<u32>>(), "{order:?}");
            }
        }
    }

    #[test]
    fn rings_never_oversubscribe_a_link() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        for gpus in [vec![0, 2, 5, 7], vec![0, 1, 2, 3, 4], (0..8).collect()] {
            let cache = ConnCache::new(&topo, &gpus, &RelayPolicy::Any);
            let ctx = PlannerContext::new(&cache, LinkMode::Single, 1, 1);
            let req = Request::new(Collective::AllReduce, gpus.clone(), 8, DType::F32);
            let mut carried: BTreeMap<Resource, (f64, f64)> = BTreeMap::new();
            for ring in packed_rings(&ctx, &req).unwrap() {
                for conn in &ring.hops {
                    let bw = ring.gbps;
                    for (r, u, cap) in connection_load(&topo, conn) {
                        carried.entry(r).or_insert((0.0, cap)).0 += bw * u;
                    }
                }
            }
            for (r, (load, cap)) in carried {
                assert!(load <= cap * (1.0 + 1e-9), "{gpus:?} {r:?}: {load} > {cap}");
            }
        }
    }

    #[test]
    fn two_ranks_get_one_ring() {
        assert_eq!(rings("dgx1-v100", vec![0, 7], LinkMode::Single).len(), 1);
    }
}
