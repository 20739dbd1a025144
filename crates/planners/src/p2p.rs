//! Point-to-point candidates: direct, relayed through GPUs, staged through host memory, and the
//! multi-path split over every route of a max-flow decomposition at once.
//!
//! Each candidate is a complete [`Plan`]; the orchestrator (`relaycc_route::plan()`) times them with the
//! simulator and keeps the fastest, so small messages go direct and large ones split.

use relaycc_topo::Topology;
use serde::{Deserialize, Serialize};

use crate::plan_writer::PlanWriter;
use crate::route_pipeline::{Chunks, LaneMap, split_shares};
use relaycc_plan::path::{
    RelayPolicy, Route, direct_route, host_staged_routes, max_flow_routes, relay_routes,
};
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};
use relaycc_plan::{Result, RouteError};

/// Which kinds of point-to-point route the planner may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum P2pStrategy {
    /// Every kind; the simulator picks. The default.
    #[default]
    Auto,
    /// The direct hop only.
    Direct,
    /// One route relayed through a GPU.
    Relay,
    /// One route staged through host memory.
    Host,
    /// The max-flow split over several routes at once.
    Multipath,
}

impl std::str::FromStr for P2pStrategy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "auto" => P2pStrategy::Auto,
            "direct" => P2pStrategy::Direct,
            "relay" => P2pStrategy::Relay,
            "host" => P2pStrategy::Host,
            "multipath" => P2pStrategy::Multipath,
            _ => {
                return Err(format!(
                    "unknown strategy {s:?} (auto, direct, relay, host, multipath)"
                ));
            }
        })
    }
}

/// A route with the elements it carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteShare {
    /// The route.
    pub route: Route,
    /// Elements it carries.
    pub elements: u64,
}

/// One point-to-point candidate: its plan and, per transfer, the routes and shares it uses.
#[derive(Debug, Clone)]
pub struct P2pCandidate {
    /// The plan.
    pub plan: Plan,
    /// Routes of the first transfer (what `relaycc route` prints).
    pub routes: Vec<RouteShare>,
}

/// Chunk sizes tried for pipelined routes, bytes: NCCL's step (512 KiB) and its neighbours.
pub const P2P_CHUNK_BYTES: [u64; 3] = [256 << 10, 1 << 20, 4 << 20];
/// Relay routes tried one at a time (the best few by bottleneck rate): a named search budget.
pub const MAX_SINGLE_RELAYS: usize = 3;

/// Shares (elements) that make pipelined routes finish together: route i with rate r_i,
/// latency l_i, h_i hops and chunk c gets s_i = r_i (T - l_i) - (h_i - 1) c, with T chosen so
/// the shares sum to `len`; routes whose share would be negative are dropped and T solved
/// again. Rates in elements per microsecond.
pub fn balanced_shares(len: u64, routes: &[Route], elem_bytes: u64, chunk: u64) -> Vec<u64> {
    let n = routes.len();
    let rate: Vec<f64> = routes
        .iter()
        .map(|r| r.gbps() * 1e3 / elem_bytes as f64)
        .collect();
    let lat: Vec<f64> = routes.iter().map(|r| r.latency_us()).collect();
    let fill: Vec<f64> = routes
        .iter()
        .map(|r| (r.hops.len().saturating_sub(1) as u64 * chunk) as f64)
        .collect();
    let mut on = vec![true; n];
    loop {
        let sum_r: f64 = (0..n).filter(|i| on[*i]).map(|i| rate[i]).sum();
        if sum_r <= 0.0 {
            return split_shares(len, &vec![1.0; n.max(1)]);
        }
        let t = (len as f64
            + (0..n)
                .filter(|i| on[*i])
                .map(|i| rate[i] * lat[i] + fill[i])
                .sum::<f64>())
            / sum_r;
        let w: Vec<f64> = (0..n)
            .map(|i| {
                if on[i] {
                    rate[i] * (t - lat[i]) - fill[i]
                } else {
                    0.0
                }
            })
            .collect();
        match (0..n)
            .filter(|i| on[*i] && w[*i] <= 0.0)
            .min_by(|a, b| w[*a].total_cmp(&w[*b]))
        {
            Some(worst) => on[worst] = false,
            None => return split_shares(len, &w),
        }
    }
}

/// Shares and per-route chunk sizes (elements) that make pipelined routes finish together,
/// counting each copy's fixed start cost `op_us` (launch overhead plus hop latency).
///
/// A route of rate r and h hops moving s bytes in chunks of c takes about
/// `s / r + (s / c) o + (h - 1)(c / r + o)`: small chunks pay the start cost often, large ones
/// fill the pipeline slowly. The best chunk is `sqrt(s o r / (h - 1))` (one chunk for a single
/// hop). Shares and chunks are refined together a few times from shares proportional to rate.
pub fn tuned_shares(
    len: u64,
    routes: &[Route],
    elem_bytes: u64,
    op_us: f64,
) -> (Vec<u64>, Vec<u64>) {
    let n = routes.len();
    let eb = elem_bytes.max(1) as f64;
    let rate: Vec<f64> = routes.iter().map(|r| r.gbps() * 1e3).collect(); // bytes per us
    let hops: Vec<f64> = routes.iter().map(|r| r.hops.len() as f64).collect();
    let lat: Vec<f64> = routes.iter().map(|r| r.latency_us()).collect();
    let total = len as f64 * eb;
    let sum_r: f64 = rate.iter().sum();
    let mut share: Vec<f64> = rate
        .iter()
        .map(|r| {
            if sum_r > 0.0 {
                total * r / sum_r
            } else {
                total / n.max(1) as f64
            }
        })
        .collect();
    let mut chunk = vec![0.0f64; n];
    for _ in 0..TUNING_ROUNDS {
        for i in 0..n {
            let per_hop_op = op_us + lat[i] / hops[i].max(1.0);
            chunk[i] = if hops[i] <= 1.0 {
                share[i].max(1.0)
            } else {
                (share[i] * per_hop_op * rate[i] / (hops[i] - 1.0))
                    .sqrt()
                    .clamp(MIN_TUNED_CHUNK_BYTES, share[i].max(MIN_TUNED_CHUNK_BYTES))
            };
        }
        let eff: Vec<f64> = (0..n)
            .map(|i| rate[i] / (1.0 + (op_us + lat[i] / hops[i].max(1.0)) * rate[i] / chunk[i]))
            .collect();
        let fill: Vec<f64> = (0..n)
            .map(|i| op_us + lat[i] + (hops[i] - 1.0) * (chunk[i] / rate[i] + op_us))
            .collect();
        let mut on = vec![true; n];
        loop {
            let sr: f64 = (0..n).filter(|i| on[*i]).map(|i| eff[i]).sum();
            if sr <= 0.0 {
                break;
            }
            let t = (total
                + (0..n)
                    .filter(|i| on[*i])
                    .map(|i| eff[i] * fill[i])
                    .sum::<f64>())
                / sr;
            let w: Vec<f64> = (0..n)
                .map(|i| if on[i] { eff[i] * (t - fill[i]) } else { 0.0 })
                .collect();
            match (0..n)
                .filter(|i| on[*i] && w[*i] <= 0.0)
                .min_by(|a, b| w[*a].total_cmp(&w[*b]))
            {
                Some(worst) => on[worst] = false,
                None => {
                    share = w;
                    break;
                }
            }
        }
    }
    let shares = split_shares(len, &share);
    let chunks = chunk
        .iter()
        .map(|c| ((c / eb).round() as u64).max(1))
        .collect();
    (shares, chunks)
}

/// Refinement rounds of [`tuned_shares`]: shares settle in two or three.
const TUNING_ROUNDS: usize = 4;
/// Smallest chunk [`tuned_shares`] picks, bytes: below this a copy is mostly start cost.
const MIN_TUNED_CHUNK_BYTES: f64 = 64.0 * 1024.0;

fn single_transfer(req: &Request) -> Result<(u32, u32, u64)> {
    if req.collective != Collective::SendRecv || req.transfers.len() != 1 {
        return Err(RouteError::BadRequest(
            "point-to-point planning takes one send_recv transfer".into(),
        ));
    }
    let t = req.transfers[0];
    let (a, b) = (req.gpus[t.src as usize], req.gpus[t.dst as usize]);
    Ok((a, b, t.count))
}

/// Build the plan of one transfer over `routes` with `shares`, in `chunks`.
fn build(
    req: &Request,
    name: String,
    routes: Vec<Route>,
    shares: Vec<u64>,
    chunks: Chunks<'_>,
) -> Result<P2pCandidate> {
    let t = req.transfers[0];
    let mut w = PlanWriter::new(Plan::new(req.clone(), name), None);
    let mut lanes = LaneMap::default();
    w.transfer(
        &mut lanes,
        Region::new(BufferRef::Input(t.src), 0, t.count),
        Region::new(BufferRef::Output(t.dst), 0, t.count),
        &routes,
        &shares,
        chunks,
        0,
        &[],
    )?;
    let plan = w.plan;
    let routes = routes
        .into_iter()
        .zip(shares)
        .filter(|(_, s)| *s > 0 || t.count == 0)
        .map(|(route, elements)| RouteShare { route, elements })
        .collect();
    Ok(P2pCandidate { plan, routes })
}

/// Candidate plans for a one-transfer send_recv request.
///
/// Arguments: the masked topology; the request (one transfer); which GPUs may relay; which
/// kinds of route to consider. Returns every candidate (at least one, else an error saying
/// why no route exists). Complexity: one max-flow (Dinic's) and a few widest-path searches on
/// the topology, plus lowering each candidate (ops = chunks x hops).
/// Source: [Ranganath-2019] (relays through idle GPUs) and [Temucin-2021] (split a copy
/// over NVLink and host-staged paths at once).
pub fn p2p_candidates(
    topo: &Topology,
    req: &Request,
    relay: &RelayPolicy,
    strategy: P2pStrategy,
) -> Result<Vec<P2pCandidate>> {
    p2p_candidates_until(topo, req, relay, strategy, None).map(|(c, _)| c)
}

/// [`p2p_candidates`] whose search for relays stops at `until` (a planning call's deadline):
/// each relay costs two widest-path searches, over the whole fabric where they cross the
/// network (on 1,024 GB200 racks of a 2:1 fat-tree, 142 relays and 2M network links). The
/// relays searched by then compete; the other kinds of route are found first, in full. Also
/// returns whether `until` cut the search.
pub fn p2p_candidates_until(
    topo: &Topology,
    req: &Request,
    relay: &RelayPolicy,
    strategy: P2pStrategy,
    until: Option<std::time::Instant>,
) -> Result<(Vec<P2pCandidate>, bool)> {
    crate::reach::require_reachable(topo, req, relay)?;
    let (a, b, count) = single_transfer(req)?;
    let esize = req.dtype.size();
    let allowed = |g: u32| relay.allows(topo, &req.gpus, g) && g != a && g != b;
    let chunks: Vec<u64> = P2P_CHUNK_BYTES.iter().map(|c| (c / esize).max(1)).collect();
    let want = |s: P2pStrategy| strategy == P2pStrategy::Auto || strategy == s;
    // One route's candidates, one per chunk size (host-staged and relayed routes).
    let per_chunk = |name: String, r: &Route, out: &mut Vec<P2pCandidate>| -> Result<()> {
        for &c in &chunks {
            out.push(build(
                req,
                name.clone(),
                vec![r.clone()],
                vec![count],
                Chunks::Each(c),
            )?);
        }
        Ok(())
    };
    let mut direct = Vec::new();
    if want(P2pStrategy::Direct)
        && let Some(r) = direct_route(topo, a, b)
    {
        direct.push(build(
            req,
            "direct".into(),
            vec![r],
            vec![count],
            Chunks::Each(count),
        )?);
    }
    let mut host = Vec::new();
    if want(P2pStrategy::Host) {
        for r in host_staged_routes(topo, a, b) {
            per_chunk(
                format!("host-staged via {}", r.names(topo)[1]),
                &r,
                &mut host,
            )?;
        }
    }
    // The multi-path split before the relays, whose search may stop at `until`.
    let mut multipath = Vec::new();
    if want(P2pStrategy::Multipath) {
        let (_, flows) = max_flow_routes(topo, a, b, &allowed)?;
        let routes: Vec<Route> = flows.into_iter().map(|(r, _)| r).collect();
        if routes.len() > 1 {
            let (shares, per_route) =
                tuned_shares(count, &routes, esize, topo.costs().copy_engine_launch_us);
            multipath.push(build(
                req,
                format!("multipath x{} (tuned chunks)", routes.len()),
                routes.clone(),
                shares,
                Chunks::PerRoute(&per_route),
            )?);
            for &c in &chunks {
                let shares = balanced_shares(count, &routes, esize, c);
                multipath.push(build(
                    req,
                    format!("multipath x{}", routes.len()),
                    routes.clone(),
                    shares,
                    Chunks::Each(c),
                )?);
            }
        }
    }
    let mut relayed = Vec::new();
    let cut = std::cell::Cell::new(false);
    if want(P2pStrategy::Relay) {
        let in_time = || {
            let on = until.is_none_or(|u| std::time::Instant::now() < u);
            cut.set(cut.get() || !on);
            on
        };
        let searched = |g: u32| allowed(g) && in_time();
        for r in relay_routes(topo, a, b, &searched)
            .into_iter()
            .take(MAX_SINGLE_RELAYS)
        {
            per_chunk(format!("relay via {}", r.names(topo)[1]), &r, &mut relayed)?;
        }
    }
    let out: Vec<P2pCandidate> = [direct, host, relayed, multipath]
        .into_iter()
        .flatten()
        .collect();
    if out.is_empty() {
        return Err(RouteError::NoRoute {
            what: format!("GPU{a} -> GPU{b}"),
            why: format!("no {strategy:?} route over usable links with relay policy {relay:?}"),
        });
    }
    Ok((out, cut.get()))
}

/// The point-to-point bound: the max-flow from `a` to `b` over usable links through GPUs the
/// relay policy admits, GB/s (the same directed links and rates `topo show --format json`
/// prints).
pub fn p2p_bound_gbps(topo: &Topology, req: &Request, relay: &RelayPolicy) -> Result<f64> {
    let (a, b, _) = single_transfer(req)?;
    let allowed = |g: u32| relay.allows(topo, &req.gpus, g) && g != a && g != b;
    Ok(max_flow_routes(topo, a, b, &allowed)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::{check, check_routes};

    #[test]
    fn every_candidate_is_correct() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        for (a, b) in [(0, 7), (0, 1), (2, 5)] {
            for bytes in [0u64, 1, 4096, 10_007, 3 << 20] {
                let req = Request::point_to_point(a, b, bytes);
                let cands =
                    p2p_candidates(&topo, &req, &RelayPolicy::Any, P2pStrategy::Auto).unwrap();
                assert!(cands.len() >= 3);
                for c in &cands {
                    check(&c.plan).unwrap_or_else(|e| panic!("{}: {e}", c.plan.algorithm));
                    check_routes(&c.plan, &topo).unwrap();
                }
            }
        }
    }

    #[test]
    fn balanced_shares_favour_fast_short_routes() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let all = |_| true;
        let (_, flows) = max_flow_routes(&topo, 0, 7, &all).unwrap();
        let routes: Vec<Route> = flows.into_iter().map(|f| f.0).collect();
        let s = balanced_shares(256 << 20, &routes, 1, 1 << 20);
        assert_eq!(s.iter().sum::<u64>(), 256 << 20);
        let (fast, slow) = (
            s[0] as f64 / routes[0].gbps(),
            s[s.len() - 1] as f64 / routes[routes.len() - 1].gbps(),
        );
        assert!(fast > 0.0 && slow >= 0.0);
    }

    #[test]
    fn strategies_filter_and_fail_clearly() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::point_to_point(0, 7, 1 << 20);
        let err = p2p_candidates(&topo, &req, &RelayPolicy::Any, P2pStrategy::Direct)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("GPU0 -> GPU7"), "{err}");
        let relays = p2p_candidates(&topo, &req, &RelayPolicy::Any, P2pStrategy::Relay).unwrap();
        assert!(
            relays
                .iter()
                .all(|c| c.plan.algorithm.starts_with("relay via"))
        );
        assert!(p2p_candidates(&topo, &req, &RelayPolicy::None, P2pStrategy::Relay).is_err());
        let bound = p2p_bound_gbps(&topo, &req, &RelayPolicy::Members).unwrap();
        assert!((bound - 10.0).abs() < 1e-6);
    }

    /// A relay search past its deadline searches no relay and says it was cut; the other
    /// candidates are the ones a search without a deadline finds, in the same order.
    #[test]
    fn a_relay_search_past_its_deadline_keeps_the_other_candidates() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let req = Request::point_to_point(0, 7, 1 << 20);
        let all = |until| {
            p2p_candidates_until(&topo, &req, &RelayPolicy::Any, P2pStrategy::Auto, until).unwrap()
        };
        let names = |c: &[P2pCandidate]| -> Vec<String> {
            c.iter().map(|c| c.plan.algorithm.clone()).collect()
        };
        let (whole, whole_cut) = all(None);
        let (past, past_cut) = all(Some(std::time::Instant::now()));
        assert!(!whole_cut && past_cut);
        assert!(names(&whole).iter().any(|n| n.starts_with("relay via")));
        let kept: Vec<String> = names(&whole)
            .into_iter()
            .filter(|n| !n.starts_with("relay via"))
            .collect();
        assert_eq!(names(&past), kept);
    }
}
