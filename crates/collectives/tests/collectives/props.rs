//! Property tests: results equal the naive reference (bitwise for integers; exact for floats,
//! whose inputs keep every reduction exact in every order, see `common::input`).

use std::sync::Arc;

use proptest::prelude::*;
use relaycc_collectives::{
    BufferView, Communicator, DeviceBuffer, HostBackend, ReduceOp, bf16, f16,
};
use relaycc_route::{Collective, DType, Request};
use relaycc_topo::Mask;

use crate::common::{TestElem, input, verify};

const PRESETS: [&str; 8] = [
    "dgx1-v100",
    "dgx-a100",
    "ac922",
    "pcie-4gpu",
    "summit-node",
    "pcie-8gpu",
    // The flat machine of CUDA ranks given no topology.
    "nvswitch-6",
    // Ranks sharing one GPU: reductions read every input where it lies.
    "shared-gpu-6",
];
const SIZES: [u64; 10] = [0, 1, 2, 3, 7, 13, 97, 1009, 2053, 4099];

/// One random case.
#[derive(Debug, Clone)]
struct Case {
    preset: usize,
    gpus: Vec<u32>,
    mask_other: bool,
    count: u64,
    counts: Vec<u64>,
    dtype: DType,
    op: ReduceOp,
    collective: Collective,
    in_place: bool,
    root: usize,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..PRESETS.len(),
        any::<u64>(),
        1usize..=8,
        any::<bool>(),
        0..SIZES.len(),
        prop::sample::select(DType::ALL.to_vec()),
        prop::sample::select(ReduceOp::ALL.to_vec()),
        prop::sample::select(Collective::ALL.to_vec()),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(preset, pick, k, mask_other, s, dtype, op, collective, in_place, seed)| {
                let topo = relaycc_topo::preset(PRESETS[preset]).unwrap_or_else(|e| panic!("{e}"));
                // A random ordered subset of the GPUs: rank order need not be GPU order.
                let mut all: Vec<u32> = (0..topo.gpu_count()).collect();
                let mut h = pick;
                for i in (1..all.len()).rev() {
                    h = h
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    all.swap(i, (h >> 33) as usize % (i + 1));
                }
                let k = k.min(all.len());
                all.truncate(k);
                let op = if op == ReduceOp::Avg && !dtype.is_float() {
                    ReduceOp::Sum
                } else {
                    op
                };
                let counts = (0..k).map(|r| SIZES[(s + r * 3) % SIZES.len()]).collect();
                Case {
                    preset,
                    gpus: all,
                    mask_other,
                    count: SIZES[s],
                    counts,
                    dtype,
                    op,
                    collective,
                    in_place,
                    root: (seed % k as u64) as usize,
                    seed,
                }
            },
        )
}

fn comm_for(c: &Case) -> Communicator {
    let mut topo = relaycc_topo::preset(PRESETS[c.preset]).unwrap_or_else(|e| panic!("{e}"));
    // Mark one GPU outside the job busy: plans must work on the masked view.
    if c.mask_other
        && let Some(g) = (0..topo.gpu_count()).find(|g| !c.gpus.contains(g))
    {
        topo = topo
            .with_mask(Mask::busy([g]))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    Communicator::new(topo, &c.gpus, &[], Arc::new(HostBackend::new()))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn fill<T: TestElem>(
    comm: &Communicator,
    c: &Case,
    r: usize,
    len: u64,
    from: impl Fn(u64) -> Option<(u32, u64)>,
) -> DeviceBuffer<T> {
    let data: Vec<T> = (0..len)
        .map(|i| match from(i) {
            Some((rank, off)) => T::from_i64(input::<T>(c.op, c.seed, rank, off)),
            None => T::from_i64(0),
        })
        .collect();
    comm.from_slice(r, &data).unwrap_or_else(|e| panic!("{e}"))
}

fn run<T: TestElem>(c: &Case) -> Result<(), String> {
    let comm = comm_for(c);
    let n = c.gpus.len();
    let cnt = c.count;
    let mut req = Request::new(c.collective, c.gpus.clone(), cnt, T::DTYPE)
        .with_op(c.op)
        .with_root(c.root as u32);
    let in_place = c.in_place
        && !matches!(
            c.collective,
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv
        );
    let e = |e: relaycc_collectives::CollectivesError| e.to_string();
    let own = |r: usize| Some((r as u32, 0));
    let ins: Vec<DeviceBuffer<T>>;
    let outs: Vec<DeviceBuffer<T>>;
    let inputs_of = |len: &dyn Fn(usize) -> u64| -> Vec<DeviceBuffer<T>> {
        (0..n)
            .map(|r| fill(&comm, c, r, len(r), |i| Some((r as u32, i))))
            .collect()
    };
    let zeros = |len: &dyn Fn(usize) -> u64| -> Vec<DeviceBuffer<T>> {
        (0..n)
            .map(|r| fill(&comm, c, r, len(r), |_| None))
            .collect()
    };
    let _ = own;
    match c.collective {
        Collective::AllReduce => {
            ins = inputs_of(&|_| cnt);
            outs = if in_place {
                Vec::new()
            } else {
                zeros(&|_| cnt)
            };
            let o = if in_place { &ins } else { &outs };
            comm.all_reduce(&ins, o, c.op)
                .map_err(e)?
                .wait()
                .map_err(e)?;
        }
        Collective::Reduce => {
            ins = inputs_of(&|_| cnt);
            outs = if in_place {
                Vec::new()
            } else {
                zeros(&|r| if r == c.root { cnt } else { 0 })
            };
            let o = if in_place {
                &ins[c.root]
            } else {
                &outs[c.root]
            };
            comm.reduce(&ins, o, c.root, c.op)
                .map_err(e)?
                .wait()
                .map_err(e)?;
        }
        Collective::Broadcast => {
            outs = zeros(&|_| cnt);
            if in_place {
                outs[c.root]
                    .copy_from(
                        &(0..cnt)
                            .map(|i| T::from_i64(input::<T>(c.op, c.seed, c.root as u32, i)))
                            .collect::<Vec<_>>(),
                    )
                    .map_err(e)?;
                ins = Vec::new();
                comm.broadcast(&outs[c.root], &outs, c.root)
                    .map_err(e)?
                    .wait()
                    .map_err(e)?;
            } else {
                ins = vec![fill(&comm, c, c.root, cnt, |i| Some((c.root as u32, i)))];
                comm.broadcast(&ins[0], &outs, c.root)
                    .map_err(e)?
                    .wait()
                    .map_err(e)?;
            }
        }
        Collective::AllGather | Collective::AllGatherV => {
            let v = c.collective == Collective::AllGatherV;
            let len = |r: usize| if v { c.counts[r] } else { cnt };
            let total: u64 = (0..n).map(len).sum();
            let displ = |r: usize| (0..r).map(len).sum::<u64>();
            if v {
                req.counts = c.counts.clone();
            }
            if in_place {
                // Each rank's input already sits at its block of its output.
                outs = (0..n)
                    .map(|r| {
                        fill(&comm, c, r, total, |i| {
                            (i >= displ(r) && i < displ(r) + len(r))
                                .then(|| (r as u32, i - displ(r)))
                        })
                    })
                    .collect();
                let views: Vec<BufferView<T>> = (0..n)
                    .map(|r| {
                        outs[r]
                            .slice(displ(r) as usize..(displ(r) + len(r)) as usize)
                            .unwrap_or_else(|e| panic!("{e}"))
                    })
                    .collect();
                ins = Vec::new();
                if v {
                    comm.all_gather_v(&views, &outs)
                } else {
                    comm.all_gather(&views, &outs)
                }
                .map_err(e)?
                .wait()
                .map_err(e)?;
            } else {
                ins = inputs_of(&len);
                outs = zeros(&|_| total);
                if v {
                    comm.all_gather_v(&ins, &outs)
                } else {
                    comm.all_gather(&ins, &outs)
                }
                .map_err(e)?
                .wait()
                .map_err(e)?;
            }
        }
        Collective::ReduceScatter | Collective::ReduceScatterV => {
            let v = c.collective == Collective::ReduceScatterV;
            let len = |r: usize| if v { c.counts[r] } else { cnt };
            let total: u64 = (0..n).map(len).sum();
            let displ = |r: usize| (0..r).map(len).sum::<u64>();
            if v {
                req.counts = c.counts.clone();
            }
            let run = |ins: &[DeviceBuffer<T>], outs: &[BufferView<T>]| {
                if v {
                    comm.reduce_scatter_v(ins, outs, c.op)
                } else {
                    comm.reduce_scatter(ins, outs, c.op)
                }
            };
            ins = inputs_of(&|_| total);
            if in_place {
                let views: Vec<BufferView<T>> = (0..n)
                    .map(|r| {
                        ins[r]
                            .slice(displ(r) as usize..(displ(r) + len(r)) as usize)
                            .unwrap_or_else(|e| panic!("{e}"))
                    })
                    .collect();
                run(&ins, &views).map_err(e)?.wait().map_err(e)?;
                // Read the results from the blocks inside the inputs.
                let got: Vec<Vec<T>> = views
                    .iter()
                    .map(|v| v.to_vec())
                    .collect::<Result<_, _>>()
                    .map_err(e)?;
                return verify(&req, c.seed, &got);
            }
            outs = zeros(&len);
            let views: Vec<BufferView<T>> = outs
                .iter()
                .map(|o| o.slice(0..o.len()).unwrap_or_else(|e| panic!("{e}")))
                .collect();
            run(&ins, &views).map_err(e)?.wait().map_err(e)?;
        }
        Collective::AllToAll => {
            ins = inputs_of(&|_| cnt * n as u64);
            outs = zeros(&|_| cnt * n as u64);
            comm.all_to_all(&ins, &outs).map_err(e)?.wait().map_err(e)?;
        }
        Collective::AllToAllV => {
            let m: Vec<Vec<u64>> = (0..n)
                .map(|s| {
                    (0..n)
                        .map(|d| SIZES[(s * 7 + d * 3 + c.seed as usize % 5) % 8])
                        .collect()
                })
                .collect();
            req.matrix = m.clone();
            ins = inputs_of(&|s| m[s].iter().sum());
            outs = zeros(&|d| m.iter().map(|row| row[d]).sum());
            comm.all_to_all_v(&ins, &outs, &m)
                .map_err(e)?
                .wait()
                .map_err(e)?;
        }
        Collective::Gather => {
            let total = cnt * n as u64;
            if in_place {
                let root = c.root;
                outs = vec![fill(&comm, c, root, total, |i| {
                    (i / cnt.max(1) == root as u64).then(|| (root as u32, i % cnt.max(1)))
                })];
                let mut views: Vec<BufferView<T>> = Vec::new();
                ins = (0..n)
                    .filter(|r| *r != root)
                    .map(|r| fill(&comm, c, r, cnt, |i| Some((r as u32, i))))
                    .collect();
                let mut others = ins.iter();
                for r in 0..n {
                    if r == root {
                        views.push(
                            outs[0]
                                .slice(r * cnt as usize..(r + 1) * cnt as usize)
                                .unwrap_or_else(|e| panic!("{e}")),
                        );
                    } else if let Some(b) = others.next() {
                        views.push(b.view());
                    }
                }
                comm.gather(&views, &outs[0], root)
                    .map_err(e)?
                    .wait()
                    .map_err(e)?;
            } else {
                ins = inputs_of(&|_| cnt);
                outs = vec![fill(&comm, c, c.root, total, |_| None)];
                comm.gather(&ins, &outs[0], c.root)
                    .map_err(e)?
                    .wait()
                    .map_err(e)?;
            }
            let mut got: Vec<Vec<T>> = vec![Vec::new(); n];
            got[c.root] = outs[0].to_vec().map_err(e)?;
            return verify(&req, c.seed, &got);
        }
        Collective::Scatter => {
            let total = cnt * n as u64;
            ins = vec![fill(&comm, c, c.root, total, |i| Some((c.root as u32, i)))];
            if in_place {
                let root = c.root;
                let others: Vec<DeviceBuffer<T>> = (0..n)
                    .filter(|r| *r != root)
                    .map(|r| fill(&comm, c, r, cnt, |_| None))
                    .collect();
                let mut it = others.iter();
                let views: Vec<BufferView<T>> = (0..n)
                    .map(|r| {
                        if r == root {
                            ins[0]
                                .slice(r * cnt as usize..(r + 1) * cnt as usize)
                                .unwrap_or_else(|e| panic!("{e}"))
                        } else {
                            it.next()
                                .map(|b| b.view())
                                .unwrap_or_else(|| panic!("missing"))
                        }
                    })
                    .collect();
                comm.scatter(&ins[0], &views, root)
                    .map_err(e)?
                    .wait()
                    .map_err(e)?;
                let got: Vec<Vec<T>> = views
                    .iter()
                    .map(|v| v.to_vec())
                    .collect::<Result<_, _>>()
                    .map_err(e)?;
                return verify(&req, c.seed, &got);
            }
            outs = zeros(&|_| cnt);
            comm.scatter(&ins[0], &outs, c.root)
                .map_err(e)?
                .wait()
                .map_err(e)?;
        }
        Collective::SendRecv => {
            // A ring shift plus a self-send, posted as one group.
            ins = inputs_of(&|_| cnt);
            outs = zeros(&|_| cnt);
            let mut g = comm.group();
            req.transfers = (0..n as u32)
                .map(|s| relaycc_route::Transfer {
                    src: s,
                    dst: (s + 1) % n as u32,
                    count: cnt,
                })
                .collect();
            for (s, input) in ins.iter().enumerate() {
                let d = (s + 1) % n;
                g.send(input, s, d).map_err(e)?;
                g.recv(&outs[d], d, s).map_err(e)?;
            }
            g.launch().map_err(e)?.wait().map_err(e)?;
        }
    }
    let bufs = if outs.is_empty() { &ins } else { &outs };
    let got: Vec<Vec<T>> = bufs
        .iter()
        .map(|b| b.to_vec())
        .collect::<Result<_, _>>()
        .map_err(e)?;
    verify(&req, c.seed, &got)
}

fn run_case(c: &Case) -> Result<(), String> {
    match c.dtype {
        DType::F32 => run::<f32>(c),
        DType::F64 => run::<f64>(c),
        DType::F16 => run::<f16>(c),
        DType::Bf16 => run::<bf16>(c),
        DType::I8 => run::<i8>(c),
        DType::U8 => run::<u8>(c),
        DType::I32 => run::<i32>(c),
        DType::U32 => run::<u32>(c),
        DType::I64 => run::<i64>(c),
        DType::U64 => run::<u64>(c),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn collectives_match_the_reference(c in case()) {
        let r = run_case(&c);
        prop_assert!(r.is_ok(), "{:?} on {}: {}", c, PRESETS[c.preset], r.err().unwrap_or_default());
    }
}

#[test]
fn every_collective_type_and_op_once() {
    // A deterministic sweep so that no combination depends on the random draw.
    let mut cases = 0;
    for collective in Collective::ALL {
        for dtype in DType::ALL {
            for op in ReduceOp::ALL {
                if op == ReduceOp::Avg && !dtype.is_float() {
                    continue;
                }
                for in_place in [false, true] {
                    let c = Case {
                        preset: 0,
                        gpus: vec![5, 0, 3],
                        mask_other: true,
                        count: 1009,
                        counts: vec![7, 0, 1009],
                        dtype,
                        op,
                        collective,
                        in_place,
                        root: 2,
                        seed: 42,
                    };
                    run_case(&c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, Collective::ALL.len() * (4 * 5 + 6 * 4) * 2);
}
