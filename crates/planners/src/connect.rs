//! Rank-to-rank connections: for an ordered GPU pair, the set of routes a planner sends over and
//! the weight (GB/s) each route gets, under one of three link rules (NCCL's, relaycc's best
//! single route, relaycc's max-flow split). Connections are cached per pair inside one planning
//! call, so a ring search and the lowering that follows it ask the topology once per pair.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use relaycc_topo::{LinkId, Topology};

use crate::route_pipeline::split_shares;
use relaycc_plan::Location;
use relaycc_plan::path::{
    Hop, RelayPolicy, Route, direct_route, hop, host_staged_routes, max_flow_routes, nearest_host,
    relay_routes_with,
};
use relaycc_plan::{Result, RouteError};

/// Which routes a connection may use, from most restricted to least.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkMode {
    /// NCCL's rules ([NCCL-src]): direct NVLink; else NVLink through one
    /// member GPU (NVB); else PCIe peer-to-peer inside a socket; else host memory of the
    /// sender's socket. One route, never a split.
    Nccl,
    /// relaycc's best single route: the widest of the direct hop, a relay through one GPU the
    /// relay policy admits, and the host-staged routes.
    Single,
    /// relaycc's max-rate connection: the max-flow split over every route at once (shares in
    /// proportion to each route's flow), unless one single route is at least as fast.
    Multipath,
}

/// The routes one ordered GPU pair uses, with their weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    /// Routes, heaviest first.
    pub routes: Vec<Route>,
    /// Weight of each route (its rate, GB/s); shares are split in proportion.
    pub weights: Vec<f64>,
}

impl Connection {
    /// The connection's rate: the sum of route weights, GB/s.
    pub fn gbps(&self) -> f64 {
        self.weights.iter().sum()
    }
    /// Elements each route carries when the connection moves `len` elements.
    pub fn shares(&self, len: u64) -> Vec<u64> {
        split_shares(len, &self.weights)
    }
    /// A connection over one route.
    pub(crate) fn single(r: Route) -> Self {
        let w = r.gbps();
        Connection {
            routes: vec![r],
            weights: vec![w],
        }
    }
}

fn all_nvlink(topo: &Topology, r: &Route) -> bool {
    r.hops.iter().all(|h| {
        h.edges
            .iter()
            .all(|e| topo.link(LinkId::new(*e as usize)).kind.is_nvlink())
    })
}

/// Better single route: higher rate, then fewer hops, then lower latency (first wins ties).
fn better(a: &Route, b: &Route) -> bool {
    a.gbps() > b.gbps()
        || (a.gbps() == b.gbps()
            && (a.hops.len() < b.hops.len()
                || (a.hops.len() == b.hops.len() && a.latency_us() < b.latency_us())))
}

/// The connection from GPU `a` to GPU `b` of a job over `members`.
///
/// # Arguments
/// - `topo`: the masked topology;
/// - `members`: the job's GPUs (NVB relays and member relays come from them);
/// - `relay`: which GPUs may relay ([`LinkMode::Single`] and [`LinkMode::Multipath`] only);
/// - `mode`: the link rule;
/// - `a`, `b`: source and destination GPU (distinct).
///
/// # Returns
/// The routes and their weights, or [`RouteError::NoRoute`] when no route exists.
///
/// # Complexity
/// A few widest-path searches, O(G E log V) for G GPUs; Dinic's max-flow, O(V^2 E), in
/// [`LinkMode::Multipath`].
///
/// Source: [Ranganath-2019] (relays through idle GPUs) and [Temucin-2021] (split over NVLink
/// and host-staged paths at once); NCCL's rules from [NCCL-src].
pub fn connect(
    topo: &Topology,
    members: &[u32],
    relay: &RelayPolicy,
    mode: LinkMode,
    a: u32,
    b: u32,
) -> Result<Connection> {
    connect_with(topo, members, relay, mode, a, b, &|x, y| {
        hop(topo, Location::Gpu(x), Location::Gpu(y))
    })
}

/// [`connect`] with GPU-to-GPU hops from `hop_between` (the connection cache's memo).
fn connect_with(
    topo: &Topology,
    members: &[u32],
    relay: &RelayPolicy,
    mode: LinkMode,
    a: u32,
    b: u32,
    hop_between: &dyn Fn(u32, u32) -> Option<Hop>,
) -> Result<Connection> {
    let none = || RouteError::NoRoute {
        what: format!("GPU{a} -> GPU{b}"),
        why: format!("no route under {mode:?} links with relay policy {relay:?}"),
    };
    let direct = direct_route(topo, a, b);
    if mode == LinkMode::Nccl {
        let nvlink = direct.as_ref().filter(|r| all_nvlink(topo, r));
        if let Some(r) = nvlink {
            return Ok(Connection::single(r.clone()));
        }
        // NVB: a relay that NVLink joins to both ends (a cheap test before any path search).
        let nvlink = |x: u32, y: u32| match (topo.gpu(x), topo.gpu(y)) {
            (Ok(p), Ok(q)) => topo.nvlink_lanes(p, q) > 0,
            _ => false,
        };
        let member = |g: u32| nvlink(a, g) && nvlink(g, b) && members.contains(&g);
        if let Some(r) = relay_routes_with(topo, a, b, &member, hop_between)
            .into_iter()
            .find(|r| all_nvlink(topo, r))
        {
            return Ok(Connection::single(r));
        }
        if let Some(r) = direct {
            return Ok(Connection::single(r));
        }
        let home = nearest_host(topo, a);
        let staged = host_staged_routes(topo, a, b);
        let pick = staged
            .iter()
            .find(|r| r.hops.first().map(|h| h.to) == home)
            .or(staged.first());
        return pick.cloned().map(Connection::single).ok_or_else(none);
    }
    let allowed = |g: u32| g != a && g != b && relay.allows(topo, members, g);
    // No single route is faster than the widest link leaving `a`; a direct hop that fast (an
    // NVSwitch port, say) needs no search for relays or host staging.
    let widest_out = topo
        .gpu(a)
        .map(|ga| {
            topo.links_from(ga)
                .filter(|(e, _, _)| topo.link_usable(*e))
                .map(|(e, _, _)| topo.striped_gbps(e))
                .fold(0.0, f64::max)
        })
        .unwrap_or(0.0);
    let saturated = direct.as_ref().is_some_and(|d| d.gbps() >= widest_out);
    let mut best: Option<Route> = direct;
    let more: Vec<Route> = if saturated {
        Vec::new()
    } else {
        relay_routes_with(topo, a, b, &allowed, hop_between)
            .into_iter()
            .take(1)
            .chain(host_staged_routes(topo, a, b))
            .collect()
    };
    for r in more {
        if best.as_ref().is_none_or(|x| better(&r, x)) {
            best = Some(r);
        }
    }
    if mode == LinkMode::Multipath {
        let (total, flows) = max_flow_routes(topo, a, b, &allowed)?;
        let single = best.as_ref().map_or(0.0, Route::gbps);
        if flows.len() > 1 && total > single {
            let (routes, weights) = flows.into_iter().unzip();
            return Ok(Connection { routes, weights });
        }
    }
    best.map(Connection::single).ok_or_else(none)
}

/// A connection as a relaying planner sends over it: whole, or cut at the GPU that relays it
/// (its first hops up to that GPU, and that GPU's hop onward).
#[derive(Debug, Clone)]
pub(crate) enum Legs {
    /// Sent over the whole connection.
    Whole(Arc<Connection>),
    /// Relayed through GPU `via`: `first` up to it, `last` from it.
    Relayed {
        first: Arc<Connection>,
        last: Arc<Connection>,
        via: u32,
    },
}

/// Keys of [`ConnCache::legs`]: sender and receiver GPU, and two numbers the caller's rule
/// derives the connection from (a rail and a salt).
pub(crate) type LegsKey = (u32, u32, u32, u64);

/// The map behind `m`; a panic elsewhere while it was held cannot leave a half-written entry
/// (entries are inserted whole), so a poisoned lock is still good to read.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Connections of one planning call, cached per (mode, source, destination). Shared by the
/// candidates of one call, which are built in parallel.
#[derive(Debug)]
pub struct ConnCache<'t> {
    topo: &'t Topology,
    members: Vec<u32>,
    relay: RelayPolicy,
    map: Mutex<BTreeMap<(LinkMode, u32, u32), Arc<Connection>>>,
    /// Ring orders of the members by (mode, both directions scored): every ring, tree and
    /// baseline candidate of one call asks for the same few, and each is a search over up to
    /// 7! orders.
    ring_orders: Mutex<BTreeMap<(LinkMode, bool), Vec<u32>>>,
    /// Direct hops between GPUs: relayed connections of every pair reuse them (a widest-path
    /// search each), so n^2 pairs cost n^2 searches rather than n^3.
    hops: Mutex<HashMap<(u32, u32), Option<Hop>>>,
    /// Connections that planners build from the fabric's structure rather than search (the
    /// baseline's rail-aligned PXN sends), by [`LegsKey`]: a windowed build makes them again
    /// on every pass, and each is several tree walks and allocations.
    legs: Mutex<HashMap<LegsKey, Legs>>,
}

/// Cached connections past which a [`ConnCache`] is freed off the planning thread: a cache
/// over 512 GPUs holds hundreds of thousands.
const CONNECTIONS_FREED_OFF_THREAD: usize = 10_000;

impl Drop for ConnCache<'_> {
    fn drop(&mut self) {
        let held = locked(&self.map).len() + locked(&self.hops).len() + locked(&self.legs).len();
        if held >= CONNECTIONS_FREED_OFF_THREAD {
            let maps = (
                taken(&mut self.map),
                taken(&mut self.hops),
                taken(&mut self.legs),
            );
            crate::limits::drop_off_thread(maps);
        }
    }
}

/// What `m` holds, left empty (a poisoned lock's contents too: nothing reads them after).
fn taken<T: Default>(m: &mut Mutex<T>) -> T {
    std::mem::take(m.get_mut().unwrap_or_else(|p| p.into_inner()))
}

impl<'t> ConnCache<'t> {
    /// An empty cache for a job over `members` with relay policy `relay`.
    pub fn new(topo: &'t Topology, members: &[u32], relay: &RelayPolicy) -> Self {
        ConnCache {
            topo,
            members: members.to_vec(),
            relay: relay.clone(),
            map: Mutex::new(BTreeMap::new()),
            ring_orders: Mutex::new(BTreeMap::new()),
            hops: Mutex::new(HashMap::new()),
            legs: Mutex::new(HashMap::new()),
        }
    }
    /// The topology the cache plans on.
    pub fn topo(&self) -> &'t Topology {
        self.topo
    }
    /// The connection `a -> b` under `mode` ([`connect`]), computed once.
    pub fn get(&self, mode: LinkMode, a: u32, b: u32) -> Result<Arc<Connection>> {
        if let Some(c) = locked(&self.map).get(&(mode, a, b)) {
            return Ok(Arc::clone(c));
        }
        // Computed outside the lock (a max-flow each), so candidates built in parallel do not
        // wait on each other; a pair computed twice gives the same connection.
        let hop_between = |x: u32, y: u32| self.hop(x, y);
        let c = Arc::new(connect_with(
            self.topo,
            &self.members,
            &self.relay,
            mode,
            a,
            b,
            &hop_between,
        )?);
        Ok(Arc::clone(
            locked(&self.map).entry((mode, a, b)).or_insert(c),
        ))
    }
    /// The legs `make` gives for `key`, made once per cache: the key must name everything
    /// (beyond the topology and members) that `make` depends on.
    pub(crate) fn legs(&self, key: LegsKey, make: impl FnOnce() -> Result<Legs>) -> Result<Legs> {
        if let Some(l) = locked(&self.legs).get(&key) {
            return Ok(l.clone());
        }
        let l = make()?;
        locked(&self.legs).insert(key, l.clone());
        Ok(l)
    }
    /// The direct hop GPU `x` -> GPU `y` ([`hop`]), searched once.
    fn hop(&self, x: u32, y: u32) -> Option<Hop> {
        if let Some(h) = locked(&self.hops).get(&(x, y)) {
            return h.clone();
        }
        let h = hop(self.topo, Location::Gpu(x), Location::Gpu(y));
        locked(&self.hops).insert((x, y), h.clone());
        h
    }
    /// The members of the job, in rank order.
    pub fn members(&self) -> &[u32] {
        &self.members
    }
    /// The ring order of the members under `mode` (scoring both directions when `both`),
    /// computed by `search` the first time it is asked for.
    pub fn ring_order(
        &self,
        mode: LinkMode,
        both: bool,
        search: impl FnOnce() -> Result<Vec<u32>>,
    ) -> Result<Vec<u32>> {
        if let Some(o) = locked(&self.ring_orders).get(&(mode, both)) {
            return Ok(o.clone());
        }
        // Searched outside the lock: two candidates asking at once both search and find the
        // same order, which is cheaper than serialising every other lookup behind one search.
        // A search its deadline stopped is not remembered.
        let o = search()?;
        locked(&self.ring_orders).insert((mode, both), o.clone());
        Ok(o)
    }
    /// The rate `a -> b` under `mode`, GB/s; 0 when no route exists.
    pub fn gbps(&self, mode: LinkMode, a: u32, b: u32) -> f64 {
        self.get(mode, a, b).map_or(0.0, |c| c.gbps())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_uses_host_memory_where_relaycc_relays() {
        let t = relaycc_topo::preset("dgx1-v100").unwrap();
        let m = [0, 7];
        let nccl = connect(&t, &m, &RelayPolicy::Any, LinkMode::Nccl, 0, 7).unwrap();
        assert_eq!(nccl.routes.len(), 1);
        assert_eq!(nccl.routes[0].names(&t)[1], "CPU0");
        let single = connect(&t, &m, &RelayPolicy::Any, LinkMode::Single, 0, 7).unwrap();
        assert!(single.gbps() > 40.0, "{}", single.gbps());
        let multi = connect(&t, &m, &RelayPolicy::Any, LinkMode::Multipath, 0, 7).unwrap();
        assert!(multi.routes.len() > 1 && multi.gbps() > 150.0);
        let cache = ConnCache::new(&t, &m, &RelayPolicy::None);
        assert!((cache.gbps(LinkMode::Single, 0, 7) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn nccl_uses_nvb_through_members_only() {
        let t = relaycc_topo::preset("dgx1-v100").unwrap();
        // 0 and 5 share no NVLink; 1 and 4 bridge them.
        let c = connect(&t, &[0, 1, 5], &RelayPolicy::None, LinkMode::Nccl, 0, 5).unwrap();
        assert_eq!(c.routes[0].names(&t), ["GPU0", "GPU1", "GPU5"]);
        let c = connect(&t, &[0, 5], &RelayPolicy::Any, LinkMode::Nccl, 0, 5).unwrap();
        assert!(!all_nvlink(&t, &c.routes[0]));
    }
}
