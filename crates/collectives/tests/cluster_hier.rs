//! relaycc's own rail-hierarchical cluster plans (rail-aligned NICs, two rail channels in
//! opposite directions, loops overlapped through two node-partial slots) are proved by the
//! checker and run on the host backend to exactly the reference, over cluster presets, counts
//! (uneven ones included), chunk sizes, element types and reduce ops.

#[path = "collectives/common.rs"]
mod common;

use common::{TestElem, input, verify};
use proptest::prelude::*;
use relaycc_collectives::{Backend, ByteRegion, HostBackend, Launch, bf16, exec};
use relaycc_route::path::RelayPolicy;
use relaycc_route::planner::{ConnCache, LinkMode, PlannerContext, PlannerFn, cluster};
use relaycc_route::{Collective, Location, Plan, ReduceOp, Request};

const PRESETS: [&str; 3] = [
    "cluster:2xdgx-h100:ib-ndr",
    "cluster:4xpcie-4gpu:ib-hdr",
    "cluster:3xdgx1-v100:ib-edr",
];

/// The cluster plan of `req` on `spec` with pipelining chunks of `chunk` elements, proved.
fn plan(spec: &str, req: &Request, chunk: u64) -> Plan {
    let topo = relaycc_topo::preset(spec).unwrap();
    let cache = ConnCache::new(&topo, &req.gpus, &RelayPolicy::Any);
    let ctx = PlannerContext::new(&cache, LinkMode::Single, chunk, 1);
    let planner: PlannerFn = match req.collective {
        Collective::AllReduce => cluster::all_reduce,
        Collective::ReduceScatter => cluster::reduce_scatter,
        _ => cluster::all_gather,
    };
    let p = planner(&topo, req, &ctx).unwrap();
    assert!(p.algorithm.starts_with("rail-hier"), "{}", p.algorithm);
    relaycc_route::check(&p).unwrap();
    relaycc_route::check_routes(&p, &topo).unwrap();
    p
}

/// Run `plan` on the host backend with inputs from [`input`]; each rank's output.
fn run<T: TestElem>(plan: Plan, seed: u64) -> Result<Vec<Vec<T>>, String> {
    let req = plan.request.clone();
    let e = |e: relaycc_collectives::CollectivesError| e.to_string();
    let exe = exec::compile(exec::check(plan, false).map_err(e)?).map_err(e)?;
    let backend = HostBackend::new();
    let n = req.nranks() as u32;
    let esize = std::mem::size_of::<T>() as u64;
    let mut regions = Vec::new();
    let mut lens = Vec::new();
    for r in 0..n {
        lens.push((
            Location::Gpu(req.gpus[r as usize]),
            req.input_len(r).unwrap() * esize,
        ));
    }
    for r in 0..n {
        lens.push((
            Location::Gpu(req.gpus[r as usize]),
            req.output_len(r).unwrap() * esize,
        ));
    }
    lens.extend(exe.scratch().iter().copied());
    for (loc, bytes) in lens {
        let bytes = bytes.max(esize);
        let mem = backend.allocate(loc, bytes).map_err(e)?;
        regions.push(ByteRegion {
            mem,
            offset: 0,
            bytes,
        });
    }
    for r in 0..n {
        let data: Vec<T> = (0..req.input_len(r).unwrap())
            .map(|i| T::from_i64(input::<T>(req.op, seed, r, i)))
            .collect();
        let bytes: &[u8] = bytemuck::cast_slice(&data);
        let dst = ByteRegion {
            bytes: bytes.len() as u64,
            ..regions[r as usize]
        };
        backend.upload(dst, bytes).map_err(e)?;
    }
    let launch = Launch {
        program: exe.program(),
        bindings: &regions,
    };
    // SAFETY: the checker proved the plan race-free, and these allocations are used by
    // nothing else.
    unsafe { backend.submit(&[launch]) }.map_err(e)?;
    backend.synchronize().map_err(e)?;
    (0..n)
        .map(|r| {
            let len = req.output_len(r).unwrap();
            let mut got = vec![T::from_i64(0); len as usize];
            let src = ByteRegion {
                bytes: len * esize,
                ..regions[(n + r) as usize]
            };
            backend
                .download(src, bytemuck::cast_slice_mut(&mut got))
                .map_err(e)?;
            Ok(got)
        })
        .collect()
}

/// Plan, prove, run and compare one request of element type `T`.
fn exact<T: TestElem>(
    spec: &str,
    c: Collective,
    gpus: &[u32],
    count: u64,
    op: ReduceOp,
    chunk: u64,
) {
    let req = Request::new(c, gpus.to_vec(), count, T::DTYPE).with_op(op);
    let p = plan(spec, &req, chunk);
    let seed = count ^ chunk.rotate_left(17);
    let outs = run::<T>(p, seed).unwrap_or_else(|e| panic!("{spec} {c} {count}: {e}"));
    verify(&req, seed, &outs).unwrap_or_else(|e| panic!("{spec} {c} {count} {op:?}: {e}"));
}

/// Every GPU of `spec`, and the first two of each node (a rail subset).
fn members(spec: &str, pairs: bool) -> Vec<u32> {
    let topo = relaycc_topo::preset(spec).unwrap();
    let all: Vec<u32> = (0..topo.gpu_count()).collect();
    if !pairs {
        return all;
    }
    let per = all
        .iter()
        .filter(|&&g| topo.node(topo.gpu(g).unwrap()).host == 0)
        .count() as u32;
    all.into_iter().filter(|g| g % per < 2).collect()
}

#[test]
fn all_reduce_runs_exactly_on_a_two_node_dgx_h100() {
    // Counts that cut into several overlapped loops and uneven blocks, with Avg on f32.
    let gpus = members("cluster:2xdgx-h100:ib-ndr", false);
    for (count, chunk) in [(1, 1), (515, 3), (4099, 16)] {
        exact::<f32>(
            "cluster:2xdgx-h100:ib-ndr",
            Collective::AllReduce,
            &gpus,
            count,
            ReduceOp::Avg,
            chunk,
        );
        exact::<i32>(
            "cluster:2xdgx-h100:ib-ndr",
            Collective::AllReduce,
            &gpus,
            count,
            ReduceOp::Max,
            chunk,
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn cluster_plans_match_the_reference(
        spec in 0..PRESETS.len(),
        pairs in any::<bool>(),
        coll in 0..3usize,
        count in 1u64..700,
        chunk in 1u64..40,
        ty in 0..4usize,
        op in 0..4usize,
    ) {
        let spec = PRESETS[spec];
        let gpus = members(spec, pairs);
        let c = [Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather][coll];
        let op = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max][op];
        // Avg is defined for floating types only (f32 and bf16 here).
        let op = if ty >= 2 && op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        match ty {
            0 => exact::<f32>(spec, c, &gpus, count, op, chunk),
            1 => exact::<bf16>(spec, c, &gpus, count, op, chunk),
            2 => exact::<u32>(spec, c, &gpus, count, op, chunk),
            _ => exact::<i64>(spec, c, &gpus, count, op, chunk),
        }
    }
}
