//! Channels built in parallel: a planner whose channels touch disjoint elements of every
//! buffer, on lanes and staging buffers of their own, builds each channel with a builder of
//! its own on its own thread and concatenates them in channel order.
//!
//! The result is the plan one builder would have made channel after channel: ops, lanes and
//! staging buffers appear in the same order (a builder makes a lane or staging buffer at its
//! first use), and an op's dependencies never reach into another channel, since the access
//! tracks of disjoint elements never meet. A planner that touches one element from two
//! channels (a prologue every channel reads) must not use this, or must split that prologue
//! by channel, as the rings' all_gather splits its local copy; `tests` compares both builds
//! of every planner that does. NCCL's tree and rings over 512 ranks are millions of ops,
//! built in about a second per core.

use rayon::prelude::*;

use relaycc_plan::Request;
use relaycc_plan::Result;
use relaycc_plan::{BufferRef, OpKind, Plan, Region};

use super::PlannerContext;
use super::builder::PlanBuilder;

/// Build channels `0..channels` of a plan named `algorithm`, each by `part` with a builder of
/// its own, concatenated in channel order. They are built in parallel where there are two or
/// more, the calling thread's rayon pool has two threads or more (on one, concatenating
/// buys nothing), and the build is not windowed ([`PlannerContext::window`]: a windowed builder's
/// record of the lanes it made is its own, which concatenation would not merge).
pub(crate) fn build_channels(
    req: &Request,
    ctx: &PlannerContext,
    algorithm: &str,
    channels: usize,
    part: impl Fn(&mut PlanBuilder, usize) -> Result<()> + Sync,
) -> Result<Plan> {
    if channels < 2 || ctx.window.is_some() || rayon::current_num_threads() < 2 {
        return build_in_turn(req, ctx, algorithm, channels, part);
    }
    // Every channel's builder charges the call's limit, which `ctx` carries.
    let parts: Vec<Result<Plan>> = (0..channels)
        .into_par_iter()
        .map(|c| {
            let mut b = PlanBuilder::new(req, ctx, algorithm);
            part(&mut b, c)?;
            Ok(b.finish())
        })
        .collect();
    // The plan a builder starts from, before its first op.
    let mut plan = Plan::new(req.clone(), algorithm);
    for p in parts {
        append(&mut plan, p?);
    }
    Ok(plan)
}

/// The same plan built channel after channel by one builder.
fn build_in_turn(
    req: &Request,
    ctx: &PlannerContext,
    algorithm: &str,
    channels: usize,
    part: impl Fn(&mut PlanBuilder, usize) -> Result<()>,
) -> Result<Plan> {
    let mut b = PlanBuilder::new(req, ctx, algorithm);
    for c in 0..channels {
        part(&mut b, c)?;
    }
    Ok(b.finish())
}

/// Append the ops, lanes and staging buffers of `part` (a plan of the same request) to
/// `plan`, renumbered past `plan`'s own.
fn append(plan: &mut Plan, part: Plan) {
    let op_base = plan.ops.len() as u32;
    let lane_base = plan.lanes.len() as u32;
    let scratch_base = plan.scratch.len() as u32;
    // NVLS group ids are the plan's own: the part's go past the plan's (scanned only where
    // the part has any).
    let group_base = if part.ops.iter().any(|o| o.nvls.is_some()) {
        plan.ops
            .iter()
            .filter_map(|o| o.nvls.map(|n| n.group + 1))
            .max()
            .unwrap_or(0)
    } else {
        0
    };
    let shift = |r: &mut Region| {
        if let BufferRef::Scratch(i) = &mut r.buffer {
            *i += scratch_base;
        }
    };
    plan.ops.reserve(part.ops.len());
    for mut op in part.ops {
        op.lane += lane_base;
        for d in &mut op.deps {
            *d += op_base;
        }
        match &mut op.kind {
            OpKind::Copy { src, dst } => {
                shift(src);
                shift(dst);
            }
            OpKind::Reduce { srcs, dst, .. } => {
                srcs.iter_mut().for_each(shift);
                shift(dst);
            }
        }
        if let Some(n) = &mut op.nvls {
            n.group += group_base;
        }
        plan.ops.push(op);
    }
    plan.lanes.extend(part.lanes);
    plan.scratch.extend(part.scratch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baseline_net::tuner::Algo;
    use relaycc_plan::Collective;
    use relaycc_plan::DType;

    /// A named way to build a plan.
    type Case<'a> = (&'static str, Box<dyn Fn() -> Plan + Send + Sync + 'a>);

    /// The plan `make` builds with its channels in parallel (in a pool of two threads) and in
    /// turn (in a pool of one).
    fn both(make: impl Fn() -> Plan + Send + Sync) -> (Plan, Plan) {
        let pool = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
        };
        (pool(2).install(&make), pool(1).install(&make))
    }

    #[test]
    fn channels_built_in_parallel_make_the_plan_built_in_turn() {
        for spec in [
            "cluster:2xdgx-h100:ib-ndr",
            "cluster:3xdgx-h100:ib-ndr:fat-tree=2:1",
            "cluster:2xdgx1-v100:ib-edr",
        ] {
            let topo = relaycc_topo::preset(spec).unwrap();
            let gpus: Vec<u32> = (0..topo.gpu_count()).collect();
            for bytes in [1u64 << 20, 3 << 24] {
                let ar = Request::new(Collective::AllReduce, gpus.clone(), bytes / 4, DType::F32);
                let rs = Request::new(
                    Collective::ReduceScatter,
                    gpus.clone(),
                    bytes / 4 / gpus.len() as u64,
                    DType::F32,
                );
                let ag = Request::new(
                    Collective::AllGather,
                    gpus.clone(),
                    bytes / 4 / gpus.len() as u64,
                    DType::F32,
                );
                let cases: [Case; 4] = [
                    (
                        "tree",
                        Box::new(|| {
                            crate::BaselineOptions {
                                algo: Some(Algo::Tree),
                                ..Default::default()
                            }
                            .plan(&topo, &ar)
                            .unwrap()
                        }),
                    ),
                    (
                        "rings",
                        Box::new(|| {
                            crate::BaselineOptions {
                                algo: Some(Algo::Ring),
                                ..Default::default()
                            }
                            .plan(&topo, &ar)
                            .unwrap()
                        }),
                    ),
                    (
                        "reduce_scatter",
                        Box::new(|| crate::baseline_plan(&topo, &rs).unwrap()),
                    ),
                    (
                        "all_gather",
                        Box::new(|| crate::baseline_plan(&topo, &ag).unwrap()),
                    ),
                ];
                for (what, make) in cases {
                    let (parallel, in_turn) = both(make);
                    assert!(
                        parallel.lanes.len() > 8 && parallel.ops.len() > 100,
                        "{spec} {what}: {} lanes",
                        parallel.lanes.len()
                    );
                    assert!(
                        parallel == in_turn,
                        "{spec} {bytes} B {what}: the builds differ"
                    );
                    relaycc_plan::check(&parallel).unwrap();
                }
            }
        }
    }
}
