//! Lowering: turn routes into plan ops. A transfer split over several routes becomes, per
//! route, a pipeline of chunks; every relay stages chunks in a small ring of slots, so a chunk
//! moves on while the next arrives, and a slot is reused only after its chunk left (the
//! write-after-read dependency is explicit). The rings belong to the plan's [`LaneMap`], not
//! to one transfer: every transfer through a relay on a channel reuses the same slots, so
//! relay staging is [`STAGING_SLOTS`] slots per relay and channel whatever the message size.

use std::collections::BTreeMap;

use relaycc_plan::path::Route;
use relaycc_plan::{BufferRef, LaneKey, Location, Plan, Region};

/// Slots in each relay's staging ring: two keep both hops busy (one chunk arriving while the
/// one before leaves), as double buffering does; more only add staging (the simulated
/// DGX-1 {0,2,5,7} all_reduce of 256 MiB is as fast with two as with four).
pub const STAGING_SLOTS: u64 = 2;

/// Queues per hop and channel that chunks alternate between. One: with two, fair sharing makes
/// both queues finish their chunks together and pay their start costs together, so nothing is
/// hidden (measured on the DGX-1 0 -> 7 split: 89.2% of the bound either way), while the first
/// chunk reaches the relay later.
pub const QUEUES_PER_HOP: u32 = 1;

/// Lanes of a plan by (sending memory, receiving memory, channel, queue), created on first use,
/// so each directed hop of each channel has [`QUEUES_PER_HOP`] in-order queues, like DMA engines;
/// and the staging rings of the relays those lanes pass through, one per (relay, incoming
/// memory, outgoing memory, channel), created on first use and reused by every later transfer
/// through that relay on that channel, so a plan's relay staging does not grow with the bytes
/// it relays.
#[derive(Debug, Default, Clone)]
pub struct LaneMap {
    lanes: BTreeMap<(Location, Location, u32, u32), u32>,
    local: BTreeMap<(Location, u32), u32>,
    rings: BTreeMap<(Location, Location, Location, u32), SlotRing>,
}

/// A relay's staging ring: [`STAGING_SLOTS`] slots of `slot` elements in one scratch buffer,
/// used round robin; each slot remembers the op that last forwarded out of it, which the next
/// chunk written into the slot waits for (write after read; the forward itself waited for the
/// write before it, so writes are ordered too).
#[derive(Debug, Clone)]
struct SlotRing {
    buffer: BufferRef,
    slot: u64,
    next: u64,
    forwarded: [Option<u32>; STAGING_SLOTS as usize],
}

impl SlotRing {
    /// The next slot: its index and the op its previous occupant was forwarded by.
    fn take(&mut self, plan: &mut Plan) -> (u64, Option<u32>) {
        let i = self.next % STAGING_SLOTS;
        self.next += 1;
        if let BufferRef::Scratch(s) = self.buffer
            && let Some(sc) = plan.scratch.get_mut(s as usize)
        {
            // The buffer grows to the slots in use (at most STAGING_SLOTS).
            sc.len = sc.len.max((i + 1) * self.slot);
        }
        (i, self.forwarded[i as usize])
    }
}

impl LaneMap {
    /// The key of each of the plan's `lanes` lanes, by lane index; `None` for a lane this map
    /// did not make.
    pub fn keys(&self, lanes: usize) -> Vec<Option<LaneKey>> {
        let mut keys = vec![None; lanes];
        for (&(from, to, channel, queue), &l) in &self.lanes {
            if let Some(k) = keys.get_mut(l as usize) {
                *k = Some(LaneKey::Hop {
                    from,
                    to,
                    channel,
                    queue,
                });
            }
        }
        for (&(at, channel), &l) in &self.local {
            if let Some(k) = keys.get_mut(l as usize) {
                *k = Some(LaneKey::Local { at, channel });
            }
        }
        keys
    }
    /// The lane for copies `from -> to` on `channel` (its first queue).
    pub fn hop(&mut self, plan: &mut Plan, from: Location, to: Location, channel: u32) -> u32 {
        self.hop_queue(plan, from, to, channel, 0)
    }
    /// The lane of queue `queue` for copies `from -> to` on `channel`.
    pub fn hop_queue(
        &mut self,
        plan: &mut Plan,
        from: Location,
        to: Location,
        channel: u32,
        queue: u32,
    ) -> u32 {
        *self
            .lanes
            .entry((from, to, channel, queue))
            .or_insert_with(|| {
                let label = format!("{} -> {} ch{channel} q{queue}", short(from), short(to));
                plan.add_lane(from, label)
            })
    }
    /// The lane for local work (reductions, local copies) on `at`, `channel`.
    pub fn local(&mut self, plan: &mut Plan, at: Location, channel: u32) -> u32 {
        *self.local.entry((at, channel)).or_insert_with(|| {
            let label = format!("{} compute ch{channel}", short(at));
            plan.add_lane(at, label)
        })
    }
    /// The staging ring at relay `at` between `from` and `to` on `channel`; a new one has slots
    /// of `slot` elements.
    fn ring(
        &mut self,
        plan: &mut Plan,
        at: Location,
        from: Location,
        to: Location,
        channel: u32,
        slot: u64,
    ) -> &mut SlotRing {
        self.rings
            .entry((at, from, to, channel))
            .or_insert_with(|| SlotRing {
                buffer: plan.add_scratch(at, 0),
                slot: slot.max(1),
                next: 0,
                forwarded: [None; STAGING_SLOTS as usize],
            })
    }
}

fn short(l: Location) -> String {
    match l {
        Location::Gpu(g) => format!("GPU{g}"),
        Location::Host(n) => format!("host{n}"),
    }
}

/// A piece of a transfer that has arrived: the destination sub-region and the op that wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrivedPiece {
    /// Destination elements written.
    pub dst: Region,
    /// The op whose completion makes them readable.
    pub op: u32,
}

/// Split `len` elements over routes in proportion to `weights`, in whole elements, larger shares
/// first; routes whose share rounds to zero get none.
pub fn split_shares(len: u64, weights: &[f64]) -> Vec<u64> {
    let total: f64 = weights.iter().filter(|w| w.is_finite() && **w > 0.0).sum();
    if weights.is_empty() {
        return Vec::new();
    }
    if total <= 0.0 {
        let mut v = vec![0; weights.len()];
        v[0] = len;
        return v;
    }
    let mut shares: Vec<u64> = weights
        .iter()
        .map(|w| {
            if w.is_finite() && *w > 0.0 {
                ((len as f64) * w / total).floor() as u64
            } else {
                0
            }
        })
        .collect();
    let assigned: u64 = shares.iter().sum();
    let mut rest = len.saturating_sub(assigned);
    // Hand the rounding remainder to the heaviest routes.
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|a, b| weights[*b].total_cmp(&weights[*a]));
    let mut i = 0;
    while rest > 0 {
        shares[order[i % order.len()]] += 1;
        rest -= 1;
        i += 1;
    }
    shares
}

/// The chunk sizes (elements) of a transfer's routes: one for all, or one per route (a
/// route past the list's end moves its share in one chunk).
#[derive(Debug, Clone, Copy)]
pub enum Chunks<'a> {
    /// Every route in chunks of this many elements.
    Each(u64),
    /// Route `i` in chunks of `[i]` elements.
    PerRoute(&'a [u64]),
}

impl Chunks<'_> {
    /// The chunk of route `ri`, whose share is `share` elements (at least 1).
    fn of(self, ri: usize, share: u64) -> u64 {
        match self {
            Chunks::Each(c) => c,
            Chunks::PerRoute(cs) => cs.get(ri).copied().unwrap_or(share),
        }
        .max(1)
    }
}

/// Emit the ops that move `src` to `dst` (same length) over `routes`, each taking the share
/// `shares[i]` (elements, summing to the length), in chunks of at most `chunks` elements.
/// `channel` numbers the first route's lanes; route i uses `channel + i`. Every first-hop copy
/// waits for `deps`. Returns the arrivals at `dst`, in order of destination offset per route.
/// Planners reach it through `PlanWriter::transfer`, which derives `deps` from the data and
/// tracks what the arrivals read and write; a bare call orders nothing but the relays' slots.
#[allow(clippy::too_many_arguments)]
pub fn emit_transfer(
    plan: &mut Plan,
    lanes: &mut LaneMap,
    src: Region,
    dst: Region,
    routes: &[Route],
    shares: &[u64],
    chunks: Chunks<'_>,
    channel: u32,
    deps: &[u32],
) -> Vec<ArrivedPiece> {
    let mut arrivals = Vec::new();
    let mut offset = 0u64;
    for (ri, (route, &share)) in routes.iter().zip(shares).enumerate() {
        if share == 0 {
            continue;
        }
        let ch = channel + ri as u32;
        let chunk = chunks.of(ri, share);
        let hops = route.hops.len();
        // The relays' staging rings; a chunk moves in pieces no larger than their slots.
        let keys: Vec<(Location, Location, Location)> = (0..hops.saturating_sub(1))
            .map(|j| (route.hops[j].to, route.hops[j].from, route.hops[j + 1].to))
            .collect();
        let mut piece = chunk;
        for &(at, from, to) in &keys {
            piece = piece.min(lanes.ring(plan, at, from, to, ch, chunk).slot);
        }
        // hop_lanes[j * Q + q]: queue q of hop j.
        let q_per_hop = QUEUES_PER_HOP as usize;
        let mut hop_lanes = Vec::with_capacity(hops * q_per_hop);
        for h in &route.hops {
            for q in 0..QUEUES_PER_HOP {
                hop_lanes.push(lanes.hop_queue(plan, h.from, h.to, ch, q));
            }
        }
        let npieces = share.div_ceil(piece);
        // (ring key, slot) each piece landed in at the previous waypoint.
        let mut taken: Vec<u64> = Vec::with_capacity(hops);
        for k in 0..npieces {
            let start = k * piece;
            let len = piece.min(share - start);
            let mut prev: Option<u32> = None;
            taken.clear();
            for j in 0..hops {
                let from = if j == 0 {
                    Region::new(src.buffer, src.offset + offset + start, len)
                } else {
                    let at = taken[j - 1];
                    let (a, f, t) = keys[j - 1];
                    let r = lanes.ring(plan, a, f, t, ch, chunk);
                    Region::new(r.buffer, at * r.slot, len)
                };
                let mut d: Vec<u32> = match prev {
                    None => deps.to_vec(),
                    Some(p) => vec![p],
                };
                let to = if j + 1 == hops {
                    Region::new(dst.buffer, dst.offset + offset + start, len)
                } else {
                    let (a, f, t) = keys[j];
                    let r = lanes.ring(plan, a, f, t, ch, chunk);
                    let (at, occupant) = r.take(plan);
                    let to = Region::new(r.buffer, at * r.slot, len);
                    // The slot is free once its previous chunk was forwarded.
                    d.extend(occupant);
                    taken.push(at);
                    to
                };
                let lane = hop_lanes[j * q_per_hop + (k % u64::from(QUEUES_PER_HOP)) as usize];
                let id = plan.copy(lane, from, to, route.hops[j].edges.clone(), d);
                if j > 0 {
                    let at = taken[j - 1];
                    let (a, f, t) = keys[j - 1];
                    lanes.ring(plan, a, f, t, ch, chunk).forwarded[at as usize] = Some(id);
                }
                prev = Some(id);
            }
            if let Some(last) = prev {
                arrivals.push(ArrivedPiece {
                    dst: Region::new(dst.buffer, dst.offset + offset + start, len),
                    op: last,
                });
            }
        }
        offset += share;
    }
    arrivals
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::BufferRef::{Input, Output};
    use relaycc_plan::Request;
    use relaycc_plan::path::{max_flow_routes, relay_routes};
    use relaycc_plan::{check, check_routes};

    #[test]
    fn shares_sum_to_length() {
        assert_eq!(split_shares(10, &[1.0, 1.0, 1.0]).iter().sum::<u64>(), 10);
        assert_eq!(split_shares(7, &[3.0, 0.0]), vec![7, 0]);
        assert_eq!(split_shares(5, &[0.0, 0.0]), vec![5, 0]);
        assert_eq!(split_shares(0, &[1.0, 2.0]), vec![0, 0]);
    }

    #[test]
    fn relayed_multipath_transfer_is_correct_and_routable() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let all = |_| true;
        for len in [0u64, 1, 7, 1000, 4099] {
            for routes in [
                relay_routes(&topo, 0, 7, &all)[..2].to_vec(),
                max_flow_routes(&topo, 0, 7, &all)
                    .unwrap()
                    .1
                    .into_iter()
                    .map(|r| r.0)
                    .collect(),
            ] {
                let req = Request::point_to_point(0, 7, len);
                let mut plan = Plan::new(req, "t");
                let mut lanes = LaneMap::default();
                let weights: Vec<f64> = routes.iter().map(|r| r.gbps()).collect();
                let shares = split_shares(len, &weights);
                emit_transfer(
                    &mut plan,
                    &mut lanes,
                    Region::new(Input(0), 0, len),
                    Region::new(Output(1), 0, len),
                    &routes,
                    &shares,
                    Chunks::Each(97),
                    0,
                    &[],
                );
                check(&plan).unwrap();
                check_routes(&plan, &topo).unwrap();
            }
        }
    }
}
