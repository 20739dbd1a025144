//! An exchange as the node-aware plans see it, whatever they build with: the request's pieces,
//! cut into rounds of one chunk each, the ranks of every node, and the inter-node messages of
//! 3-Step, 2-Step and Split ([Lockhart-2023 §2.3]): who sends each to whom, carrying which
//! pieces, and how large Split's messages are. The plans on a cluster topology
//! (`generate.rs`) and in rank space (`rank_space.rs`) both read these.

use std::collections::BTreeMap;

use relaycc_plan::Result;

/// One piece of data to deliver: `len` elements of rank `src`'s input at `src_off` to rank
/// `dst`'s output at `dst_off` (from [`relaycc_plan::Request::expected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    pub src: u32,
    pub src_off: u64,
    pub dst: u32,
    pub dst_off: u64,
    pub len: u64,
}

/// The pieces of `req`, one per expected output range (each moves one input range).
pub(super) fn pieces(req: &relaycc_plan::Request) -> Result<Vec<Piece>> {
    Ok(req
        .expected()?
        .into_iter()
        .map(|p| {
            let (src, src_off) = p.terms.first().copied().unwrap_or((p.rank, 0));
            Piece {
                src,
                src_off,
                dst: p.rank,
                dst_off: p.out_offset,
                len: p.len,
            }
        })
        .collect())
}

/// The rounds of `all`: round `k` moves elements `[k * chunk, (k + 1) * chunk)` of every piece
/// longer than `k * chunk`, as pieces of their own; at least `at_least` rounds (an empty one
/// where no piece reaches them).
pub(super) fn rounds(
    all: &[Piece],
    chunk: u64,
    at_least: u64,
) -> impl Iterator<Item = (u64, Vec<Piece>)> {
    let chunk = chunk.max(1);
    let longest = all.iter().map(|p| p.len).max().unwrap_or(0);
    (0..longest.div_ceil(chunk).max(at_least)).map(move |k| {
        let lo = k * chunk;
        let slice = all
            .iter()
            .filter(|p| p.len > lo)
            .map(|p| Piece {
                src_off: p.src_off + lo,
                dst_off: p.dst_off + lo,
                len: (p.len - lo).min(chunk),
                ..*p
            })
            .collect();
        (k, slice)
    })
}

/// The ranks on each node, in rank order, for ranks on nodes `node_of`.
pub(super) fn ranks_of_nodes(node_of: &[u32]) -> BTreeMap<u32, Vec<u32>> {
    let mut m: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (r, n) in node_of.iter().enumerate() {
        m.entry(*n).or_default().push(r as u32);
    }
    m
}

/// The rank of node `node` paired with index `k` (round-robin over the node's ranks), so that
/// every rank of a node stays busy ([Lockhart-2023 §2.3.1]'s pairing).
pub(super) fn pick(ranks: &BTreeMap<u32, Vec<u32>>, node: u32, k: u32) -> u32 {
    ranks
        .get(&node)
        .filter(|v| !v.is_empty())
        .map(|v| v[k as usize % v.len()])
        .unwrap_or(0)
}

/// Pieces grouped by `key`, groups in key order, pieces in request order.
pub(super) fn group_by<K: Ord>(
    pieces: &[Piece],
    key: impl Fn(&Piece) -> K,
) -> BTreeMap<K, Vec<Piece>> {
    let mut m: BTreeMap<K, Vec<Piece>> = BTreeMap::new();
    for p in pieces {
        m.entry(key(p)).or_default().push(*p);
    }
    m
}

/// One aggregated inter-node message of 3-Step or 2-Step: `sender` packs `pieces` (in order)
/// and sends them to `receiver`, which unpacks them to their destinations.
pub(super) struct Aggregate {
    pub sender: u32,
    pub receiver: u32,
    pub pieces: Vec<Piece>,
}

/// The inter-node messages of 3-Step (`by_source` false: one per node pair, between the
/// ranks [`pick`] pairs with the other node) or 2-Step (`by_source`: one per source rank and
/// destination node, to the rank at the source's local index there), for the inter-node
/// pieces `remote` of ranks on nodes `node_of` (`ranks`: [`ranks_of_nodes`] of it), in key
/// order ([Lockhart-2023 §2.3.1, §2.3.2]).
pub(super) fn aggregates(
    remote: &[Piece],
    node_of: &[u32],
    ranks: &BTreeMap<u32, Vec<u32>>,
    by_source: bool,
) -> Vec<Aggregate> {
    let node = |r: u32| node_of[r as usize];
    if !by_source {
        return group_by(remote, |p| (node(p.src), node(p.dst)))
            .into_iter()
            .map(|((na, nb), pieces)| Aggregate {
                sender: pick(ranks, na, nb),
                receiver: pick(ranks, nb, na),
                pieces,
            })
            .collect();
    }
    group_by(remote, |p| (p.src, node(p.dst)))
        .into_iter()
        .map(|((src, nb), pieces)| {
            let local = ranks
                .get(&node(src))
                .and_then(|v| v.iter().position(|r| *r == src))
                .unwrap_or(0) as u32;
            Aggregate {
                sender: src,
                receiver: pick(ranks, nb, local),
                pieces,
            }
        })
        .collect()
}

/// Split+MD's message size for `total` elements between one node pair ([Lockhart-2023], Algorithm 1):
/// at most `cap`, raised to the sending node's volume `vol` / its `ppn` processes when that
/// many messages would outnumber them; at most `ppn` messages, at least one element each.
pub(super) fn split_chunk(total: u64, vol: u64, cap: u64, ppn: u64) -> u64 {
    let ppn = ppn.max(1);
    let msg_cap = if vol.div_ceil(cap.max(1)) > ppn {
        vol.div_ceil(ppn)
    } else {
        cap.max(1)
    };
    let k = total.div_ceil(msg_cap.max(1)).clamp(1, ppn);
    total.div_ceil(k).max(1)
}
