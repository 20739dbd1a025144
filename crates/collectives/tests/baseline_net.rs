//! NCCL's multi-node baseline plans (rail rings, the double binary tree, PXN all_to_all) run
//! on the host backend across small clusters and give byte-exact results.

use relaycc_collectives::{Backend, ByteRegion, HostBackend, Launch, exec};
use relaycc_route::planner::BaselineOptions;
use relaycc_route::planner::baseline_net::tuner::Algo;
use relaycc_route::{Collective, DType, Location, Request};

/// A deterministic input element of rank `r` at `i`.
fn input(r: u32, i: u64) -> u32 {
    (r.wrapping_mul(2_654_435_761) ^ (i as u32).wrapping_mul(40_503)).wrapping_add(7)
}

/// Run `req`'s baseline plan on the host backend; returns each rank's output.
fn run(spec: &str, req: &Request, algo: Option<Algo>) -> (String, Vec<Vec<u32>>) {
    let topo = relaycc_topo::preset(spec).unwrap();
    let plan = BaselineOptions {
        algo,
        ..Default::default()
    }
    .plan(&topo, req)
    .unwrap();
    run_plan(&topo, req, plan)
}

/// Run `plan` of `req` on the host backend; returns each rank's output.
fn run_plan(
    topo: &relaycc_topo::Topology,
    req: &Request,
    plan: relaycc_route::Plan,
) -> (String, Vec<Vec<u32>>) {
    relaycc_route::check_routes(&plan, topo).unwrap();
    let name = plan.algorithm.clone();
    let exe = exec::compile(exec::check(plan, false).unwrap()).unwrap();
    let backend = HostBackend::new();
    let n = req.nranks() as u32;
    let mut regions = Vec::new();
    let mut alloc = |loc: Location, elems: u64| {
        let bytes = (elems * 4).max(4);
        let mem = backend.allocate(loc, bytes).unwrap();
        regions.push(ByteRegion {
            mem,
            offset: 0,
            bytes,
        });
    };
    for r in 0..n {
        alloc(
            Location::Gpu(req.gpus[r as usize]),
            req.input_len(r).unwrap(),
        );
    }
    for r in 0..n {
        alloc(
            Location::Gpu(req.gpus[r as usize]),
            req.output_len(r).unwrap(),
        );
    }
    for &(loc, bytes) in exe.scratch() {
        alloc(loc, bytes.div_ceil(4));
    }
    for r in 0..n {
        let data: Vec<u8> = (0..req.input_len(r).unwrap())
            .flat_map(|i| input(r, i).to_le_bytes())
            .collect();
        let dst = ByteRegion {
            bytes: data.len() as u64,
            ..regions[r as usize]
        };
        backend.upload(dst, &data).unwrap();
    }
    let launch = Launch {
        program: exe.program(),
        bindings: &regions,
    };
    // SAFETY: the plan was proved race-free by the checker, and no raw address of these
    // allocations is in use elsewhere.
    unsafe { backend.submit(&[launch]) }.unwrap();
    backend.synchronize().unwrap();
    let outs = (0..n)
        .map(|r| {
            let len = req.output_len(r).unwrap();
            let mut got = vec![0u8; (len * 4) as usize];
            let src = ByteRegion {
                bytes: len * 4,
                ..regions[(n + r) as usize]
            };
            backend.download(src, &mut got).unwrap();
            got.chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        })
        .collect();
    (name, outs)
}

/// Every output element holds the (wrapping) sum of the inputs the request names.
fn verify(spec: &str, req: &Request, algo: Option<Algo>) -> String {
    let (name, outs) = run(spec, req, algo);
    compare(spec, req, &name, &outs);
    name
}

/// Assert that `outs` hold what `req` expects.
fn compare(spec: &str, req: &Request, name: &str, outs: &[Vec<u32>]) {
    for p in req.expected().unwrap() {
        for i in 0..p.len {
            let want = p
                .terms
                .iter()
                .fold(0u32, |acc, &(s, off)| acc.wrapping_add(input(s, off + i)));
            let got = outs[p.rank as usize][(p.out_offset + i) as usize];
            assert_eq!(
                got,
                want,
                "{spec} {name}: rank {} element {}",
                p.rank,
                p.out_offset + i
            );
        }
    }
}

#[test]
fn multi_node_baselines_are_byte_exact_on_the_host() {
    for (spec, gpus) in [
        (
            "cluster:2xdgx-h100:ib-ndr:rail",
            (0..16).collect::<Vec<u32>>(),
        ),
        ("cluster:4xpcie-4gpu:ib-edr:fat-tree", (0..16).collect()),
        ("cluster:3xgh200-quad:ib-ndr", vec![0, 2, 5, 6, 7, 9, 11]),
    ] {
        for c in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
            Collective::Gather,
            Collective::Scatter,
        ] {
            for count in [3u64, 4_099] {
                let req = Request::new(c, gpus.clone(), count, DType::U32);
                verify(spec, &req, None);
            }
        }
        // Both all_reduce algorithms, whichever the tuner prefers at this size.
        let req = Request::new(Collective::AllReduce, gpus.clone(), 9_001, DType::U32);
        assert!(verify(spec, &req, Some(Algo::Ring)).contains("ring"));
        assert!(verify(spec, &req, Some(Algo::Tree)).contains("tree"));
    }
}

#[test]
fn pxn_rings_shared_by_every_sender_are_byte_exact_on_the_host() {
    // Chunks of 5 elements through PXN_SLOTS-slot rings that 7 senders share: each proxy's
    // ring wraps dozens of times.
    let spec = "cluster:2xdgx-h100:ib-ndr";
    let topo = relaycc_topo::preset(spec).unwrap();
    for c in [
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
    ] {
        let req = Request::new(c, (0..16).collect(), 23, DType::U32);
        let plan = BaselineOptions {
            chunk_elems: Some(5),
            ..Default::default()
        }
        .plan(&topo, &req)
        .unwrap();
        assert!(plan.algorithm.contains("pxn"), "{}", plan.algorithm);
        let (name, outs) = run_plan(&topo, &req, plan);
        compare(spec, &req, &name, &outs);
    }
}
