//! NCCL's double binary tree all_reduce across nodes.
//!
//! Inside a node the tree is a chain of the node's members (the rail ring's order for the
//! channel, so its head is the member on the channel's rail); across nodes the heads form a
//! binary tree over the node indices, and odd channels use the complementary tree (mirrored
//! for an even node count, shifted by one for an odd count), so every node is a leaf in one
//! tree and an inner node in the other. Per chunk the partial sums flow up each chain to its
//! head and up the tree to the root, which finalises them; the result flows back down the tree
//! and the chains. Heads send and receive through their rail's NIC.
//!
//! Source: [NCCL-src], `src/graph/trees.cc` (`ncclGetBtree`, `ncclGetDtree`),
//! `src/graph/connect.cc` (intra-node chains joined at their heads) and the tree all_reduce
//! kernel (reduce up, broadcast down, pipelined in chunks).

use crate::channels::build_channels;
use crate::{PlannerContext, RECV_SLOTS, chunks, split_even};
use relaycc_plan::Request;
use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};

use super::links::NetLinks;
use super::rings::{RailRing, channel_rails, node_chain};

/// NCCL's binary tree over `n` ranks, as `ncclGetBtree` builds it: rank `r`'s parent and
/// children (ranks alternate leaves and inner nodes; rank 0 is the root).
pub fn btree(n: usize, r: usize) -> (Option<usize>, Vec<usize>) {
    let mut bit = 1;
    while bit < n {
        if bit & r != 0 {
            break;
        }
        bit <<= 1;
    }
    if r == 0 {
        let kids = if n > 1 { vec![bit >> 1] } else { Vec::new() };
        return (None, kids);
    }
    let mut up = (r ^ bit) | (bit << 1);
    if up >= n {
        up = r ^ bit;
    }
    let mut low = bit >> 1;
    let mut kids = Vec::new();
    if low != 0 {
        kids.push(r - low);
        let mut d1 = r + low;
        while d1 >= n && low != 0 {
            low >>= 1;
            d1 = r + low;
        }
        if low != 0 {
            kids.push(d1);
        }
    }
    (Some(up), kids)
}

/// Tree `t` (0 or 1) of NCCL's double binary tree over `n` ranks (`ncclGetDtree`): the
/// binary tree, or its mirror (even `n`) or shift by one (odd `n`).
pub fn dtree(n: usize, r: usize, t: usize) -> (Option<usize>, Vec<usize>) {
    if t == 0 {
        return btree(n, r);
    }
    // Odd counts shift every rank down by one, even counts mirror; both are their own
    // bookkeeping: `to` maps into the first tree's numbering, `back` maps out of it.
    let odd = n % 2 == 1;
    let to = |x: usize| if odd { (x + n - 1) % n } else { n - 1 - x };
    let back = |x: usize| if odd { (x + 1) % n } else { n - 1 - x };
    let (up, kids) = btree(n, to(r));
    (up.map(back), kids.into_iter().map(back).collect())
}

/// Receive slots per rank and channel: one from the chain, two from child heads.
const SOURCES: u64 = 3;

/// The double-binary-tree all_reduce over the channels of `rings` (their rails).
pub(super) fn all_reduce(
    req: &Request,
    ctx: &PlannerContext,
    links: &NetLinks,
    rings: &[RailRing],
) -> Result<Plan> {
    let rails = channel_rails(links);
    let nodes = links.nodes.len();
    let chunk = ctx.chunk_elems.max(1);
    let splits = split_even(req.count, rails.len() as u64);
    let name = format!("double binary tree x{}", rings.len());
    // Each channel reduces its own slice of the buffers, in staging of its own.
    build_channels(req, ctx, &name, splits.len(), |b, c| {
        let (lo, len) = splits[c];
        if len == 0 {
            return Ok(());
        }
        let ch = c as u32;
        let rail = rails[c];
        let chains: Vec<Vec<u32>> = (0..nodes)
            .map(|k| {
                crate::limits::check_deadline(ctx.limit, k, "laid out on NCCL's trees")?;
                node_chain(links, k, rail, c)
            })
            .collect::<Result<_>>()?;
        let tree: Vec<(Option<usize>, Vec<usize>)> =
            (0..nodes).map(|k| dtree(nodes, k, c % 2)).collect();
        // Breadth-first from the root: parents before children.
        let root = (0..nodes).find(|&k| tree[k].0.is_none()).unwrap_or(0);
        let mut order = vec![root];
        let mut i = 0;
        while i < order.len() {
            order.extend(tree[order[i]].1.iter().copied());
            i += 1;
        }
        // Connections: chain hops inside nodes, head to head across (both directions).
        for chain in &chains {
            for w in chain.windows(2) {
                for (x, y) in [(w[0], w[1]), (w[1], w[0])] {
                    let conn = links.local(x, y)?;
                    b.pin(ch, links.gpus[x as usize], links.gpus[y as usize], conn);
                }
            }
        }
        for (k, (_, kids)) in tree.iter().enumerate() {
            for &j in kids {
                let (h, hj) = (chains[k][0], chains[j][0]);
                for (x, y, salt) in [(h, hj, c + j), (hj, h, c + k)] {
                    let conn = links.across(x, y, rail, salt)?;
                    b.pin(ch, links.gpus[x as usize], links.gpus[y as usize], conn);
                }
            }
        }
        let slot = chunk.min(len);
        let recv: Vec<BufferRef> = (0..req.nranks() as u32)
            .map(|r| b.scratch(r, SOURCES * RECV_SLOTS * slot))
            .collect();
        let at =
            |r: u32, buf: fn(u32) -> BufferRef, rel: u64, l: u64| Region::new(buf(r), lo + rel, l);
        // A step sample builds the first chunks only (`PlannerContext::sample_steps`): each chunk goes
        // up and down the same trees, so the pipeline's time grows by one chunk's per chunk.
        let kept = b.sample_steps(usize::try_from(len.div_ceil(chunk)).unwrap_or(usize::MAX));
        for (k, (rel, l)) in chunks(len, chunk).take(kept).enumerate() {
            let rv = |r: u32, which: u64| {
                let base = ((k as u64 % RECV_SLOTS) * SOURCES + which) * slot;
                Region::new(recv[r as usize], base, l)
            };
            // Up: chains to their heads, children before parents.
            for &node in order.iter().rev() {
                let chain = &chains[node];
                let m = chain.len() - 1;
                // What each chain member passes on: its input alone at the tail, else the
                // sum so far in its output.
                for i in (1..=m).rev() {
                    let r = chain[i];
                    let src = if i == m {
                        at(r, BufferRef::Input, rel, l)
                    } else {
                        let acc = at(r, BufferRef::Output, rel, l);
                        b.reduce(
                            vec![at(r, BufferRef::Input, rel, l), rv(r, 0)],
                            acc,
                            false,
                            ch,
                        )?;
                        acc
                    };
                    b.send(src, rv(chain[i - 1], 0), ch)?;
                }
                let h = chain[0];
                let mut srcs = vec![at(h, BufferRef::Input, rel, l)];
                if m > 0 {
                    srcs.push(rv(h, 0));
                }
                for w in 0..tree[node].1.len() {
                    srcs.push(rv(h, 1 + w as u64));
                }
                let parent = tree[node].0;
                let up = if srcs.len() == 1 && parent.is_some() {
                    srcs[0]
                } else {
                    let acc = at(h, BufferRef::Output, rel, l);
                    b.reduce(srcs, acc, parent.is_none(), ch)?;
                    acc
                };
                if let Some(p) = parent {
                    let slot_at = tree[p].1.iter().position(|&x| x == node).unwrap_or(0);
                    b.send(up, rv(chains[p][0], 1 + slot_at as u64), ch)?;
                }
            }
            // Down: the root's result to every head, then along every chain.
            for &node in &order {
                let chain = &chains[node];
                if let Some(p) = tree[node].0 {
                    let ph = chains[p][0];
                    b.send(
                        at(ph, BufferRef::Output, rel, l),
                        at(chain[0], BufferRef::Output, rel, l),
                        ch,
                    )?;
                }
                for w in chain.windows(2) {
                    b.send(
                        at(w[0], BufferRef::Output, rel, l),
                        at(w[1], BufferRef::Output, rel, l),
                        ch,
                    )?;
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank but the root has one parent that lists it as a child.
    fn well_formed(n: usize, t: usize) {
        let mut roots = 0;
        for r in 0..n {
            let (up, kids) = dtree(n, r, t);
            match up {
                None => roots += 1,
                Some(p) => assert!(dtree(n, p, t).1.contains(&r), "n {n} t {t} r {r} p {p}"),
            }
            assert!(kids.len() <= 2);
            for k in kids {
                assert_eq!(dtree(n, k, t).0, Some(r), "n {n} t {t}");
            }
        }
        assert_eq!(roots, 1);
    }

    #[test]
    fn double_binary_trees_are_trees_and_complementary() {
        for n in 1..40 {
            well_formed(n, 0);
            well_formed(n, 1);
        }
        // NCCL's 4-rank tree: 0 -> 2 -> {1, 3}; its mirror: 3 -> 1 -> {2, 0}.
        assert_eq!(btree(4, 0), (None, vec![2]));
        assert_eq!(btree(4, 2), (Some(0), vec![1, 3]));
        assert_eq!(dtree(4, 1, 1), (Some(3), vec![2, 0]));
        // With an even count a rank inner in one tree is a leaf in the other.
        for r in 0..8 {
            let inner = |t| !dtree(8, r, t).1.is_empty();
            assert!(!(inner(0) && inner(1)), "rank {r}");
        }
    }
}
