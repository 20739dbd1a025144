//! Rings: all_reduce (reduce-scatter then all-gather), all_gather(_v), reduce_scatter(_v), and the
//! pipelined chains of broadcast and reduce along the ring, over several rings at once.
//!
//! The ring order ([`super::ring_order`]) maximises the slowest ring connection (then the sum
//! of their rates), where a connection is whatever [`super::connect()`] gives the pair: a direct hop, a relay through
//! another GPU, host staging, or a multi-path split, so a ring link the machine lacks is
//! relayed. Channel c carries the c-th share of the data; odd channels run the ring backwards,
//! so a ring and its reverse use both directions of every link (DGX-1 {0,2,5,7}). Steps are
//! emitted step by step, each block in chunks, so chunk k of step s+1 leaves as soon as chunk k
//! of step s arrived and was reduced: the ring pipelines.

use relaycc_topo::Topology;

use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::builder::PlanBuilder;
use std::sync::Arc;

use crate::route_pipeline::split_shares;

use super::connect::Connection;
use super::ring_order::ring_order;
use super::{
    PACKED_RINGS, PlannerContext, chunks, direct, links_and_chunk, name, pipelined_tree, ring_pack,
    split_even,
};

/// The order of channel `c`: odd channels run backwards.
fn channel_order(order: &[u32], c: u32) -> Vec<u32> {
    let mut o = order.to_vec();
    if c % 2 == 1 {
        o[1..].reverse();
    }
    o
}

/// Where a ring pass finds a block: called with block `q`, ring position `p`, an offset `rel`
/// within the block and a length `len`, it returns that region (of the input, the partials or
/// the result).
pub(super) type BlockRegionFn<'a> = &'a dyn Fn(usize, usize, u64, u64) -> Region;

/// Chunks of each block that one loop of a ring pass carries: a channel's range is cut into
/// loops of `n` blocks of this many chunks, and the staging of the reduce-scatter (a two-step
/// ring of block-sized slots per position) holds one loop, so it is bounded by the chunk, not
/// the message (NCCL's rings likewise loop over `nranks x chunk` pieces, [NCCL-src]). Two: a
/// plan at the pipelining chunk ([`super::CHUNKS_PER_BLOCK`] per block) on two channels still
/// runs in one loop, and within a staging budget the chunk can be twice as large as with four
/// (simulated 2 x DGX H100 all_reduce of 1 GiB within 256 MiB: 185.5 GB/s busbw with two,
/// 183.8 with four, 205.5 unbounded).
pub const LOOP_CHUNKS: u64 = 2;

/// The reduce-scatter's staging on each ring position: received partials (`recv`) and, without
/// an accumulator in the output, the partials being built (`own`), each two steps of `most`
/// elements, reused by every loop (the builder orders each reuse after the reads before it).
pub(super) struct RsStaging {
    recv: Vec<BufferRef>,
    own: Vec<BufferRef>,
    most: u64,
}

impl RsStaging {
    /// Staging for blocks of at most `most` elements on the positions of `ord`.
    pub(super) fn new(b: &mut PlanBuilder, ord: &[u32], most: u64, own: bool) -> Self {
        if most == 0 {
            return RsStaging {
                recv: Vec::new(),
                own: Vec::new(),
                most,
            };
        }
        let recv = ord.iter().map(|&r| b.scratch(r, 2 * most)).collect();
        let own = if own {
            ord.iter().map(|&r| b.scratch(r, 2 * most)).collect()
        } else {
            Vec::new()
        };
        RsStaging { recv, own, most }
    }
}

/// `len` elements in loops of at most `per` elements: `(offset, len)` pairs.
fn loops(len: u64, per: u64) -> impl Iterator<Item = (u64, u64)> {
    chunks(len, per.max(1))
}

/// Reduce-scatter pass: at step s position p sends its partial of block p-s-1 to p+1, which
/// adds its input; after n-1 steps position q holds block q complete in `fin`, finalized
/// when `finalize` (false where a later phase adds more contributions, as the cluster plans'
/// intra-node phase does, so `Avg` divides once). Partials live in `acc` when given, else in
/// `st.own`; blocks are at most `st.most` long. A pass sends in its `chunk`s: the builder cuts its copies in them
/// from here on (a cluster plan's phases each pipeline at a chunk of their own).
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_scatter_steps(
    b: &mut PlanBuilder,
    ord: &[u32],
    ch: u32,
    lens: &[u64],
    chunk: u64,
    st: &RsStaging,
    input: BlockRegionFn,
    acc: Option<BlockRegionFn>,
    fin: BlockRegionFn,
    finalize: bool,
) -> Result<()> {
    b.set_chunk_elems(chunk);
    let n = ord.len();
    let most = st.most;
    if n < 2 || lens.iter().all(|l| *l == 0) {
        return Ok(());
    }
    let partial = |p: usize, q: usize, s: usize, rel: u64, l: u64| match acc {
        Some(f) => f(p, q, rel, l),
        None => Region::new(st.own[p], (s as u64 % 2) * most + rel, l),
    };
    // Under a window only the hops touching it are walked (a pass touches the buffers of a
    // hop's two ranks and their hosts' relays), so a template's build costs its own ops.
    let hops = live_hops(b, ord);
    // A step sample builds the last steps only (`PlannerContext::sample_steps`).
    let first = n - 1 - b.sample_steps(n - 1);
    for s in first..n - 1 {
        let last = s == n - 2;
        for &p in &hops {
            let q = (p + 2 * n - s - 1) % n;
            let d = (p + 1) % n;
            for (rel, l) in chunks(lens[q], chunk) {
                let src = if s == first {
                    input(p, q, rel, l)
                } else {
                    partial(p, q, s - 1, rel, l)
                };
                let rv = Region::new(st.recv[d], (s as u64 % 2) * most + rel, l);
                b.send(src, rv, ch)?;
                let dst = if last {
                    fin(d, q, rel, l)
                } else {
                    partial(d, q, s, rel, l)
                };
                b.reduce(vec![input(d, q, rel, l), rv], dst, last && finalize, ch)?;
            }
        }
    }
    Ok(())
}

/// The ring positions `p` whose hop to `p + 1` may touch the builder's window (every
/// position without one).
fn live_hops(b: &PlanBuilder, ord: &[u32]) -> Vec<usize> {
    let n = ord.len();
    (0..n)
        .filter(|&p| b.may_touch(&[ord[p], ord[(p + 1) % n]]))
        .collect()
}

/// All-gather pass: position q starts with block q in `out` (or sends it from `first`); at
/// step t position p forwards block p-t to p+1, in `chunk`s (as [`reduce_scatter_steps`]).
pub(super) fn all_gather_pass(
    b: &mut PlanBuilder,
    ord: &[u32],
    ch: u32,
    lens: &[u64],
    chunk: u64,
    first: Option<BlockRegionFn>,
    out: BlockRegionFn,
) -> Result<()> {
    b.set_chunk_elems(chunk);
    let n = ord.len();
    let hops = live_hops(b, ord);
    // A step sample builds the first steps only (`PlannerContext::sample_steps`).
    for t in 0..b.sample_steps(n.saturating_sub(1)) {
        for &p in &hops {
            let q = (p + n - t) % n;
            for (rel, l) in chunks(lens[q], chunk) {
                let src = match first {
                    Some(f) if t == 0 => f(p, q, rel, l),
                    _ => out(p, q, rel, l),
                };
                b.send(src, out((p + 1) % n, q, rel, l), ch)?;
            }
        }
    }
    Ok(())
}

fn prepare(req: &Request, ctx: &PlannerContext) -> Result<(Vec<u32>, u32, u64)> {
    let channels = ctx.channels.max(1);
    Ok((
        ring_order(ctx, req, channels > 1)?,
        channels,
        ctx.chunk_elems.max(1),
    ))
}

/// One ring of a ring plan: its order (rank positions) and, for packed rings, its weight and
/// the connections its hops use.
struct Channel {
    order: Vec<u32>,
    weight: f64,
    pinned: Option<Vec<Arc<Connection>>>,
}

/// The rings of a ring plan: `ctx.channels` copies of the best ring (odd ones reversed), equal
/// shares; or with [`PACKED_RINGS`], the packed set ([`ring_pack::packed_rings`]), shares in
/// proportion to each ring's bandwidth. Also the plan's name.
fn channels(req: &Request, ctx: &PlannerContext, algo: &str) -> Result<(Vec<Channel>, String)> {
    if ctx.channels == PACKED_RINGS {
        let rings = ring_pack::packed_rings(ctx, req)?;
        let label = format!("{algo} x{} packed {}", rings.len(), links_and_chunk(ctx));
        let chans = rings
            .into_iter()
            .map(|r| Channel {
                order: r.order,
                weight: r.gbps,
                pinned: Some(r.hops),
            })
            .collect();
        return Ok((chans, label));
    }
    let (order, k, _) = prepare(req, ctx)?;
    let chans = (0..k)
        .map(|c| Channel {
            order: channel_order(&order, c),
            weight: 1.0,
            pinned: None,
        })
        .collect();
    Ok((chans, name(algo, ctx)))
}

/// `len` elements split over `chans` by weight, contiguous: `(offset, len)` per channel
/// (equal weights split as [`split_even`] does).
fn split_channels(len: u64, chans: &[Channel]) -> Vec<(u64, u64)> {
    if chans.iter().all(|c| c.weight == chans[0].weight) {
        return split_even(len, chans.len() as u64);
    }
    let weights: Vec<f64> = chans.iter().map(|c| c.weight).collect();
    let mut off = 0;
    split_shares(len, &weights)
        .into_iter()
        .map(|l| {
            let p = (off, l);
            off += l;
            p
        })
        .collect()
}

/// Blocks of `counts` packed in rank order: each block's displacement, and its share
/// `(offset in the block, length)` on each of `chans`.
fn blocks_by_channel(counts: &[u64], chans: &[Channel]) -> (Vec<u64>, Vec<Vec<(u64, u64)>>) {
    let displ = counts
        .iter()
        .scan(0u64, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect();
    let parts = counts.iter().map(|c| split_channels(*c, chans)).collect();
    (displ, parts)
}

/// Pin channel `c`'s hop connections in the builder (packed rings choose their own).
fn pin(b: &mut PlanBuilder, req: &Request, c: u32, chan: &Channel) {
    if let Some(hops) = &chan.pinned {
        pin_hops(b, &req.gpus, c, &chan.order, hops);
    }
}

/// Pin ring channel `ch`'s hops in the builder: hop `i` runs from the GPU of rank `order[i]`
/// (`gpus` maps ranks to GPUs) to that of `order[i + 1]` over `hops[i]`, the last closing
/// the ring.
pub(super) fn pin_hops(
    b: &mut PlanBuilder,
    gpus: &[u32],
    ch: u32,
    order: &[u32],
    hops: &[Arc<Connection>],
) {
    let n = order.len();
    for (i, conn) in hops.iter().enumerate() {
        let from = gpus[order[i] as usize];
        let to = gpus[order[(i + 1) % n] as usize];
        b.pin(ch, from, to, Arc::clone(conn));
    }
}

/// One channel of a ring all_reduce: elements `lo..lo + len` of every rank's buffer,
/// reduce-scattered then all-gathered around `ord` on lane channel `ch`, in loops of
/// [`LOOP_CHUNKS`] chunks per block whose partials stay in the output and whose received
/// partials go to staging of the channel's own.
pub(super) fn all_reduce_channel(
    b: &mut PlanBuilder,
    ord: &[u32],
    ch: u32,
    (lo, len): (u64, u64),
    chunk: u64,
) -> Result<()> {
    let n = ord.len();
    let per = (n as u64).saturating_mul(LOOP_CHUNKS.saturating_mul(chunk));
    let most = len.min(per).div_ceil(n as u64);
    let st = RsStaging::new(b, ord, most, false);
    for (base, piece) in loops(len, per) {
        let blocks = split_even(piece, n as u64);
        let lens: Vec<u64> = blocks.iter().map(|x| x.1).collect();
        let at = |out: bool| {
            let blocks = &blocks;
            move |p: usize, q: usize, rel: u64, l: u64| {
                let r = ord[p];
                let buf = if out {
                    BufferRef::Output(r)
                } else {
                    BufferRef::Input(r)
                };
                Region::new(buf, lo + base + blocks[q].0 + rel, l)
            }
        };
        let (inp, outp) = (at(false), at(true));
        reduce_scatter_steps(
            b,
            ord,
            ch,
            &lens,
            chunk,
            &st,
            &inp,
            Some(&outp),
            &outp,
            true,
        )?;
        all_gather_pass(b, ord, ch, &lens, chunk, None, &outp)?;
    }
    Ok(())
}

/// One channel of a ring reduce_scatter: elements `lo..lo + len` of every block (`count`
/// elements each), reduced around `ord` on lane channel `ch` in loops of [`LOOP_CHUNKS`]
/// chunks, the partials in staging of the channel's own; block r completes at rank r.
pub(super) fn reduce_scatter_channel(
    b: &mut PlanBuilder,
    ord: &[u32],
    ch: u32,
    (lo, len): (u64, u64),
    count: u64,
    chunk: u64,
) -> Result<()> {
    let n = ord.len();
    let per = LOOP_CHUNKS.saturating_mul(chunk);
    let st = RsStaging::new(b, ord, len.min(per), true);
    for (base, piece) in loops(len, per) {
        let lens = vec![piece; n];
        let start = lo + base;
        let inp = move |p: usize, q: usize, rel: u64, l: u64| {
            Region::new(
                BufferRef::Input(ord[p]),
                u64::from(ord[q]) * count + start + rel,
                l,
            )
        };
        let fin = move |p: usize, _q: usize, rel: u64, l: u64| {
            Region::new(BufferRef::Output(ord[p]), start + rel, l)
        };
        reduce_scatter_steps(b, ord, ch, &lens, chunk, &st, &inp, None, &fin, true)?;
    }
    Ok(())
}

/// One channel of a ring all_gather: rank r's share of its own block, `(input offset, output
/// offset, length)` as `share(r)` says, sent from its input and forwarded n-1 steps around
/// `ord` on lane channel `ch` into every rank's output.
pub(super) fn all_gather_channel(
    b: &mut PlanBuilder,
    ord: &[u32],
    ch: u32,
    chunk: u64,
    share: &dyn Fn(u32) -> (u64, u64, u64),
) -> Result<()> {
    let lens: Vec<u64> = ord.iter().map(|&r| share(r).2).collect();
    let inp = move |p: usize, _q: usize, rel: u64, l: u64| {
        let r = ord[p];
        Region::new(BufferRef::Input(r), share(r).0 + rel, l)
    };
    let out = move |p: usize, q: usize, rel: u64, l: u64| {
        Region::new(BufferRef::Output(ord[p]), share(ord[q]).1 + rel, l)
    };
    all_gather_pass(b, ord, ch, &lens, chunk, Some(&inp), &out)
}

/// Ring all_reduce: reduce-scatter then all-gather, pipelined in chunks, over `ctx.channels`
/// rings. Arguments, returns and complexity as [`direct::plan`]; 2(n-1) steps, each moving
/// S/n per rank. Source: NCCL's ring all_reduce; relayed ring links from [Ranganath-2019].
pub fn all_reduce(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let n = req.nranks();
    if n < 2 {
        return direct::plan(topo, req, ctx);
    }
    let chunk = ctx.chunk_elems.max(1);
    let (chans, label) = channels(req, ctx, "ring")?;
    let mut b = PlanBuilder::new(req, ctx, label);
    for (c, share) in split_channels(req.count, &chans).into_iter().enumerate() {
        pin(&mut b, req, c as u32, &chans[c]);
        all_reduce_channel(&mut b, &chans[c].order, c as u32, share, chunk)?;
    }
    Ok(b.finish())
}

/// Ring all_gather and all_gather_v (irregular counts, zeros included): each rank copies its
/// input into its output block and the blocks travel n-1 steps around the rings.
/// Source: NCCL's ring all_gather; all_gather_v as [Rolinger-2017] asks.
pub fn all_gather(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let n = req.nranks();
    if n < 2
        || !matches!(
            req.collective,
            Collective::AllGather | Collective::AllGatherV
        )
    {
        return direct::plan(topo, req, ctx);
    }
    let chunk = ctx.chunk_elems.max(1);
    let (chans, label) = channels(req, ctx, "ring")?;
    let counts: Vec<u64> = match req.collective {
        Collective::AllGatherV => req.counts.clone(),
        _ => vec![req.count; n],
    };
    let (displ, parts) = blocks_by_channel(&counts, &chans);
    let mut b = PlanBuilder::new(req, ctx, label);
    for r in 0..n as u32 {
        let c = counts[r as usize];
        b.send(
            Region::new(BufferRef::Input(r), 0, c),
            Region::new(BufferRef::Output(r), displ[r as usize], c),
            CH_LOCAL,
        )?;
    }
    for (c, chan) in chans.iter().enumerate() {
        pin(&mut b, req, c as u32, chan);
        let share = |r: u32| {
            let (off, len) = parts[r as usize][c];
            (off, displ[r as usize] + off, len)
        };
        all_gather_channel(&mut b, &chan.order, c as u32, chunk, &share)?;
    }
    Ok(b.finish())
}

/// Lane channel of the initial local copies, apart from every ring channel.
pub(super) const CH_LOCAL: u32 = 1 << 16;

/// Ring reduce_scatter and reduce_scatter_v (irregular counts, zeros included): n-1 reduce
/// steps around the rings; block r completes at rank r.
/// Source: NCCL's ring reduce_scatter; reduce_scatter_v as the mirror of all_gather_v's ring.
pub fn reduce_scatter(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let n = req.nranks();
    if n < 2
        || !matches!(
            req.collective,
            Collective::ReduceScatter | Collective::ReduceScatterV
        )
    {
        return direct::plan(topo, req, ctx);
    }
    let chunk = ctx.chunk_elems.max(1);
    let (chans, label) = channels(req, ctx, "ring")?;
    let mut b = PlanBuilder::new(req, ctx, label);
    if req.collective == Collective::ReduceScatter {
        for (c, share) in split_channels(req.count, &chans).into_iter().enumerate() {
            pin(&mut b, req, c as u32, &chans[c]);
            reduce_scatter_channel(&mut b, &chans[c].order, c as u32, share, req.count, chunk)?;
        }
        return Ok(b.finish());
    }
    let (displ, parts) = blocks_by_channel(&req.counts, &chans);
    for (c, chan) in chans.iter().enumerate() {
        pin(&mut b, req, c as u32, chan);
        let share = |r: u32| {
            let (off, len) = parts[r as usize][c];
            (displ[r as usize] + off, off, len)
        };
        reduce_scatter_v_channel(&mut b, &chan.order, c as u32, chunk, &share)?;
    }
    Ok(b.finish())
}

/// One channel of a ring reduce_scatter_v: block r's share on this channel, `(input offset,
/// output offset, length)` as `share(r)` says, reduced n-1 steps around `ord` on lane channel
/// `ch` into rank r's output, in loops of at most [`LOOP_CHUNKS`] chunks of each block (as
/// [`reduce_scatter_channel`], so the staging is bounded by the chunk, not the counts).
fn reduce_scatter_v_channel(
    b: &mut PlanBuilder,
    ord: &[u32],
    ch: u32,
    chunk: u64,
    share: &dyn Fn(u32) -> (u64, u64, u64),
) -> Result<()> {
    let whole: Vec<u64> = ord.iter().map(|&r| share(r).2).collect();
    let most = whole.iter().copied().max().unwrap_or(0);
    let per = LOOP_CHUNKS.saturating_mul(chunk);
    let st = RsStaging::new(b, ord, most.min(per), true);
    for (base, piece) in loops(most, per) {
        let lens: Vec<u64> = whole
            .iter()
            .map(|l| l.saturating_sub(base).min(piece))
            .collect();
        let inp = move |p: usize, q: usize, rel: u64, l: u64| {
            Region::new(BufferRef::Input(ord[p]), share(ord[q]).0 + base + rel, l)
        };
        let fin = move |p: usize, q: usize, rel: u64, l: u64| {
            Region::new(BufferRef::Output(ord[p]), share(ord[q]).1 + base + rel, l)
        };
        reduce_scatter_steps(b, ord, ch, &lens, chunk, &st, &inp, None, &fin, true)?;
    }
    Ok(())
}

/// The ring order rotated to start at the root.
fn rooted(order: &[u32], root: u32) -> Vec<u32> {
    let at = order.iter().position(|r| *r == root).unwrap_or(0);
    order[at..].iter().chain(&order[..at]).copied().collect()
}

/// Broadcast as a pipelined chain along the ring from the root (NCCL's ring broadcast).
pub fn broadcast(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let (order, _, _) = prepare(req, ctx)?;
    pipelined_tree::chain_plan(topo, req, ctx, &rooted(&order, req.root), "ring chain")
}

/// Reduce as a pipelined chain along the ring into the root (NCCL's ring reduce).
pub fn reduce(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let (order, _, _) = prepare(req, ctx)?;
    pipelined_tree::chain_plan(topo, req, ctx, &rooted(&order, req.root), "ring chain")
}
