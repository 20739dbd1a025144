//! Hierarchical plans for clusters of like machines: an intra-node phase over NVLink, an
//! inter-node phase per rail (the GPU at local position j of every node, each behind its own
//! NIC), and a second intra-node phase. Every phase is a pipelined ring, so each byte crosses
//! the network once per rail instead of once per GPU, and the planner touches only ring
//! neighbours: g + N connections per rail instead of the n^2 a flat ring search reads.
//!
//! | collective | intra-node | inter-node, rail j | intra-node |
//! |---|---|---|---|
//! | all_reduce | reduce-scatter into g node partials | all_reduce of block j | all_gather |
//! | reduce_scatter | reduce-scatter, per destination node | reduce-scatter of block j | |
//! | all_gather | | all_gather of rank j's blocks | all_gather, per source node |
//!
//! From [`HALVING_MIN_NODES`] nodes the all_reduce's rail phase runs by distance halving
//! (`halving.rs`): log2 N dependent steps instead of 2 (N-1). all_to_all gets the node-aware
//! 2-step plan of [`all_to_all()`].
//!
//! Op counts: all_reduce is O(n (g + N)) copies; reduce_scatter and all_gather move n blocks
//! into (or out of) every rank, O(n^2 / g + n g) copies.
//!
//! Every rail hop is pinned to a rail-aligned connection: out through the sender's home NIC,
//! in through the receiver's NIC of the same rail (the baseline's `NetLinks`), so each of a
//! node's NICs carries one rail in both directions. The all_reduce runs each rail's ring as two
//! channels in opposite directions (one channel's start costs overlap the other's transfers)
//! and cuts the vector into loops whose phases overlap: two node-partial slots per rank let
//! loop k+1's intra-node reduce-scatter (NVLink) run while loop k's rail ring (NICs) reads the
//! partials of loop k and loop k-1's all_gather finishes. The loop count is a candidate
//! parameter ([`PIPELINE_LOOPS`]): fewer loops pay a longer fill and drain, more pay more
//! per-step start costs on the rails.

use relaycc_topo::Topology;

use relaycc_plan::Result;
use relaycc_plan::{BufferRef, Plan, Region};
use relaycc_plan::{Collective, Request};

use super::builder::PlanBuilder;
use super::ring;
use super::{CHUNKS_PER_BLOCK, PlannerContext, direct};

mod all_reduce;
mod all_to_all;
mod halving;
mod phases;
mod shape;

pub use all_reduce::{HALVING_MIN_NODES, PIPELINE_LOOPS, all_reduce, all_reduce_loops};
pub use all_to_all::all_to_all;
use phases::{
    CH_BACK, CH_INTRA, CH_LOCAL, CH_RAIL, LOOP_CHUNKS, even_pieces, label, phase_chunk, pin_rails,
    ring_staging,
};
pub use shape::ClusterShape;

/// Hierarchical reduce_scatter: inside each node, a reduce-scatter per destination node leaves
/// rank j with the node's partial of every block its rail delivers; rail j then reduce-scatters
/// those across the nodes, so each byte crosses the network once. Falls back to
/// [`direct::plan`] off a multi-node shape. Arguments and returns as [`all_reduce`].
///
/// # Complexity
/// N (g-1) intra steps of one block per rank and N-1 rail steps: O(n N g) copies.
pub fn reduce_scatter(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let Some(shape) =
        ClusterShape::of(topo, req)?.filter(|_| req.collective == Collective::ReduceScatter)
    else {
        return direct::plan(topo, req, ctx);
    };
    let (nn, g) = (shape.nodes(), shape.per_node());
    let count = req.count;
    let mut b = PlanBuilder::new(req, ctx, label(ctx, &shape));
    pin_rails(&mut b, topo, req, &shape, ctx, CH_RAIL, 0)?;
    let per = LOOP_CHUNKS
        .saturating_mul(CHUNKS_PER_BLOCK)
        .saturating_mul(ctx.chunk_elems.max(1));
    let most = count.min(per);
    // part[r] holds, at h * most, the node partial of the piece of the block rank hosts[h][j]
    // receives.
    let part: Vec<Option<BufferRef>> = (0..req.nranks() as u32)
        .map(|r| (g > 1).then(|| b.scratch(r, nn as u64 * most)))
        .collect();
    let (intra, rails) = ring_staging(&mut b, &shape, most, most);
    // Loops of one length, as the all_reduce's, so every loop reuses the partial slots alike.
    for (base, piece) in even_pieces(count, per.max(1)) {
        let chunk = phase_chunk(ctx, piece);
        if g > 1 {
            let lens = vec![piece; g];
            // One ring per destination node: the N rings pipeline one another, so whole
            // pieces suffice.
            let chunk = piece.max(1);
            for (hh, (ord, st)) in shape.hosts.iter().zip(&intra).enumerate() {
                // Destination nodes in the order the rail ring asks for them: node hh - 1
                // first, its own last; the order relative to the node is the same on every
                // node, so the plan folds into a template.
                for t in 1..=nn {
                    let h = (hh + nn - t) % nn;
                    let dest = &shape.hosts[h];
                    let inp = |p: usize, q: usize, rel: u64, l: u64| {
                        Region::new(
                            BufferRef::Input(ord[p]),
                            u64::from(dest[q]) * count + base + rel,
                            l,
                        )
                    };
                    let fin = |p: usize, _q: usize, rel: u64, l: u64| {
                        let buf = part[ord[p] as usize].unwrap_or(BufferRef::Input(ord[p]));
                        Region::new(buf, h as u64 * most + rel, l)
                    };
                    ring::reduce_scatter_steps(
                        &mut b, ord, CH_INTRA, &lens, chunk, st, &inp, None, &fin, false,
                    )?;
                }
            }
        }
        for (ord, st) in &rails {
            let lens = vec![piece; nn];
            let inp = |p: usize, q: usize, rel: u64, l: u64| match part[ord[p] as usize] {
                Some(buf) => Region::new(buf, q as u64 * most + rel, l),
                None => Region::new(
                    BufferRef::Input(ord[p]),
                    u64::from(ord[q]) * count + base + rel,
                    l,
                ),
            };
            let fin = |p: usize, _q: usize, rel: u64, l: u64| {
                Region::new(BufferRef::Output(ord[p]), base + rel, l)
            };
            ring::reduce_scatter_steps(
                &mut b, ord, CH_RAIL, &lens, chunk, st, &inp, None, &fin, true,
            )?;
        }
    }
    Ok(b.finish())
}

/// Hierarchical all_gather: rail j all-gathers the blocks of its ranks across the nodes, then
/// inside each node every rank forwards what its rail brought, one ring per source node. Falls
/// back to [`direct::plan`] off a multi-node shape or for all_gather_v. Arguments and returns
/// as [`all_reduce`].
///
/// # Complexity
/// N-1 rail steps and N (g-1) intra steps of one block per rank: O(n N g) copies.
pub fn all_gather(topo: &Topology, req: &Request, ctx: &PlannerContext) -> Result<Plan> {
    let Some(shape) =
        ClusterShape::of(topo, req)?.filter(|_| req.collective == Collective::AllGather)
    else {
        return direct::plan(topo, req, ctx);
    };
    let (nn, g) = (shape.nodes(), shape.per_node());
    let count = req.count;
    let chunk = phase_chunk(ctx, count);
    let mut b = PlanBuilder::new(req, ctx, label(ctx, &shape));
    pin_rails(&mut b, topo, req, &shape, ctx, CH_RAIL, 0)?;
    for r in 0..req.nranks() as u32 {
        b.send(
            Region::new(BufferRef::Input(r), 0, count),
            Region::new(BufferRef::Output(r), u64::from(r) * count, count),
            CH_LOCAL,
        )?;
    }
    for j in 0..g {
        let ord = shape.rail(j);
        let lens = vec![count; nn];
        let inp =
            |p: usize, _q: usize, rel: u64, l: u64| Region::new(BufferRef::Input(ord[p]), rel, l);
        let out = |p: usize, q: usize, rel: u64, l: u64| {
            Region::new(
                BufferRef::Output(ord[p]),
                u64::from(ord[q]) * count + rel,
                l,
            )
        };
        ring::all_gather_pass(&mut b, &ord, CH_RAIL, &lens, chunk, Some(&inp), &out)?;
    }
    if g > 1 {
        let lens = vec![count; g];
        // One ring per source node: the N rings pipeline one another, so whole blocks suffice.
        let chunk = count.max(1);
        for (hh, ord) in shape.hosts.iter().enumerate() {
            // Source nodes in the order the rail ring brings them: its own first, then node
            // hh - 1, hh - 2, ...; relative to the node, the same on every node.
            for t in 0..nn {
                let src = &shape.hosts[(hh + nn - t) % nn];
                let out = |p: usize, q: usize, rel: u64, l: u64| {
                    Region::new(
                        BufferRef::Output(ord[p]),
                        u64::from(src[q]) * count + rel,
                        l,
                    )
                };
                ring::all_gather_pass(&mut b, ord, CH_BACK, &lens, chunk, None, &out)?;
            }
        }
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConnCache, LinkMode};
    use relaycc_plan::path::RelayPolicy;
    use relaycc_plan::{DType, ReduceOp};
    use relaycc_plan::{check, check_routes};

    fn prove(topo: &Topology, req: &Request, planner: super::super::PlannerFn, chunk: u64) -> Plan {
        let cache = ConnCache::new(topo, &req.gpus, &RelayPolicy::Any);
        let ctx = PlannerContext::new(&cache, LinkMode::Single, chunk, 1);
        let p = planner(topo, req, &ctx).unwrap();
        check(&p).unwrap();
        check_routes(&p, topo).unwrap();
        // Every collective with an in-place form is served in place too.
        relaycc_plan::check_with(&p, relaycc_plan::CheckOptions { in_place: true }).unwrap();
        p
    }

    #[test]
    fn shapes_group_ranks_by_node_and_refuse_uneven_nodes() {
        let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
        let req = Request::new(Collective::AllReduce, vec![9, 0, 8, 1], 10, DType::F32);
        let shape = ClusterShape::of(&topo, &req).unwrap().unwrap();
        // Ranks 0 and 2 sit on node 1 (GPUs 9 and 8), ranks 1 and 3 on node 0 (GPUs 0, 1).
        assert_eq!(shape.hosts, vec![vec![2, 0], vec![1, 3]]);
        assert_eq!(shape.rail(1), vec![0, 3]);
        let uneven = Request::new(Collective::AllReduce, vec![0, 1, 8], 10, DType::F32);
        assert_eq!(ClusterShape::of(&topo, &uneven).unwrap(), None);
        let one = Request::new(Collective::AllReduce, vec![0, 1], 10, DType::F32);
        assert_eq!(ClusterShape::of(&topo, &one).unwrap(), None);
    }

    #[test]
    fn every_hierarchical_plan_is_proved_on_clusters() {
        // Two and three nodes pipeline rail rings in chunks; five nodes in whole sub-blocks;
        // from eight nodes on the all_reduce's rails run by distance halving (nine: a count of
        // nodes that is no power of two).
        for spec in [
            "cluster:2xdgx-h100:ib-ndr",
            "cluster:3xdgx1-v100:ib-edr",
            "cluster:5xdgx-h100:ib-ndr",
            "cluster:8xdgx-h100:ib-ndr",
            "cluster:9xdgx-h100:ib-ndr",
        ] {
            let topo = relaycc_topo::preset(spec).unwrap();
            let all: Vec<u32> = (0..topo.gpu_count()).collect();
            // Whole nodes, two GPUs of each node (a rail subset), odd counts included, and one
            // GPU per node (the rail phase alone).
            let pairs: Vec<u32> = all.iter().copied().filter(|g| g % 8 < 2).collect();
            let singles: Vec<u32> = all.iter().copied().filter(|g| g % 8 == 3).collect();
            let sets = if topo.gpu_count() > 24 {
                vec![pairs, singles]
            } else {
                vec![all.clone(), pairs]
            };
            for gpus in sets {
                for count in [1, 29, 1000] {
                    let ar = Request::new(Collective::AllReduce, gpus.clone(), count, DType::F32)
                        .with_op(ReduceOp::Avg);
                    prove(&topo, &ar, all_reduce, 7);
                    let rs =
                        Request::new(Collective::ReduceScatter, gpus.clone(), count, DType::F32);
                    prove(&topo, &rs, reduce_scatter, 7);
                    let ag = Request::new(Collective::AllGather, gpus.clone(), count, DType::F32);
                    prove(&topo, &ag, all_gather, 7);
                    // A chunk of 7 cuts pieces of 29 and 1,000 elements into loops.
                    let a2a = Request::new(Collective::AllToAll, gpus.clone(), count, DType::F32);
                    prove(&topo, &a2a, all_to_all, 7);
                    prove(&topo, &a2a, all_to_all, 1 << 20);
                }
            }
        }
    }

    #[test]
    fn staging_follows_the_chunk_not_the_message() {
        // Loops of g x N x LOOP_CHUNKS chunks reuse one set of staging: a message four times
        // larger than a loop stages exactly what one loop does, and the plans are proved.
        let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
        let gpus: Vec<u32> = (0..16).collect();
        let chunk = 64;
        let per = 8 * 2 * LOOP_CHUNKS * chunk;
        for (c, planner) in [
            (Collective::AllReduce, all_reduce as super::super::PlannerFn),
            (Collective::ReduceScatter, reduce_scatter),
        ] {
            let staging = |count: u64| {
                let req = Request::new(c, gpus.clone(), count, DType::F32);
                let p = prove(&topo, &req, planner, chunk);
                p.staging_per_location()
                    .values()
                    .copied()
                    .max()
                    .unwrap_or(0)
            };
            let one = staging(per);
            assert!(one > 0, "{c}");
            assert_eq!(staging(4 * per), one, "{c}");
            // An all_reduce cuts a message that is no whole number of loops into more loops of
            // equal length (7 of 1,171 elements here), which stage less than one loop.
            let odd = staging(4 * per + 5);
            assert!(odd > 0 && odd <= one, "{c}: {odd} against {one}");
        }
    }

    #[test]
    fn all_reduce_copies_grow_with_ranks_times_nodes_plus_node_size() {
        let topo = relaycc_topo::preset("cluster:4xdgx-h100:ib-ndr").unwrap();
        let req = Request::new(Collective::AllReduce, (0..32).collect(), 32 * 8, DType::F32);
        let p = prove(&topo, &req, all_reduce, 1 << 20);
        // One chunk per block: per rank 2 (g-1) intra copies and 2 (N-1) rail copies; the
        // rail copies go through the NIC (several ops each), so count the hops' first ops.
        let copies = p
            .ops
            .iter()
            .filter(|o| matches!(o.kind, relaycc_plan::OpKind::Copy { .. }))
            .count();
        assert!(copies <= 32 * (2 * 7 + 2 * 3) * 4, "{copies} copies");
    }
}

#[cfg(test)]
mod fold_tests {
    use super::*;
    use crate::{Candidates, pipeline_chunk_elems};
    use relaycc_plan::DType;
    use relaycc_plan::path::RelayPolicy;
    use relaycc_sim::SimConfig;

    #[test]
    fn reduce_scatter_and_all_gather_fold_and_time_like_their_expanded_plans() {
        // Each node walks the other nodes in the order its rail ring needs them, relative to
        // itself, so node h's ops wait for what node 0's do, shifted: the templates fold.
        for nodes in [4u32, 5] {
            let topo = relaycc_topo::preset(&format!("cluster:{nodes}xdgx-h100:ib-ndr")).unwrap();
            let sym = topo.host_symmetry();
            let n = topo.gpu_count();
            for c in [
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::AllToAll,
            ] {
                let req = Request::new(c, (0..n).collect(), (64 << 20) / u64::from(n), DType::F32);
                let chunk = pipeline_chunk_elems(&req).max(1);
                let set = Candidates::new(&topo, &req, &RelayPolicy::default()).unwrap();
                let i = (0..set.len())
                    .find(|&i| {
                        set.build_unfitted(i, chunk, None)
                            .is_ok_and(|p| !p.algorithm.starts_with("direct"))
                    })
                    .unwrap();
                let full = set.build(i, chunk, None).unwrap();
                let t = set
                    .build_template(i, chunk, &sym, None)
                    .unwrap_or_else(|e| panic!("{nodes} nodes {c}: {e}"));
                relaycc_plan::check_template(&t).unwrap();
                let cfg = SimConfig::default();
                let a = relaycc_sim::simulate(&topo, &full, &cfg).unwrap().time_us;
                let b = relaycc_sim::simulate(&topo, &t, &cfg).unwrap().time_us;
                assert!(
                    (a - b).abs() < 0.01 * a,
                    "{nodes} nodes {c}: {a} against {b}"
                );
            }
        }
    }
}
