//! Executor tests: lowering (events, waits) and refusal of wrong plans.

use relaycc_route::{BufferRef, Collective, DType, Location, Plan, Region, Request};

use super::*;
use crate::backend::Command;

fn two_rank_broadcast() -> Plan {
    let req = Request::new(Collective::Broadcast, vec![0, 1], 8, DType::F32);
    let mut p = Plan::new(req, "test: relay through scratch on another lane");
    let l0 = p.add_lane(Location::Gpu(0), "a");
    let l1 = p.add_lane(Location::Gpu(1), "b");
    let s = p.add_scratch(Location::Gpu(1), 8);
    let a = p.copy(
        l0,
        Region::new(BufferRef::Input(0), 0, 8),
        Region::new(BufferRef::Output(0), 0, 8),
        vec![],
        vec![],
    );
    let b = p.copy(
        l0,
        Region::new(BufferRef::Input(0), 0, 8),
        Region::new(s, 0, 8),
        vec![],
        vec![a],
    );
    p.copy(
        l1,
        Region::new(s, 0, 8),
        Region::new(BufferRef::Output(1), 0, 8),
        vec![],
        vec![b, a],
    );
    p
}

#[test]
fn cross_lane_deps_become_record_then_wait() {
    let e = compile(check(two_rank_broadcast(), false).unwrap()).unwrap();
    let c = &e.program().commands;
    let rec = c
        .iter()
        .position(|c| matches!(c, Command::Record { lane: 0, .. }))
        .unwrap();
    let wait = c
        .iter()
        .position(|c| matches!(c, Command::Wait { lane: 1, .. }))
        .unwrap();
    assert!(rec < wait);
    // Both deps are on lane 0; waiting for op 1 implies op 0, so one wait suffices.
    let waits = c
        .iter()
        .filter(|c| matches!(c, Command::Wait { .. }))
        .count();
    assert_eq!(waits, 1);
    assert_eq!(e.program().bindings, 2 * 2 + 1);
    assert_eq!(e.scratch(), &[(Location::Gpu(1), 32)]);
}

#[test]
fn wrong_plans_are_refused_before_running() {
    // A missing dependency is a race: the checker names the op.
    let mut p = two_rank_broadcast();
    p.ops[2].deps.clear();
    let err = check(p, false).unwrap_err();
    assert!(
        matches!(err, CollectivesError::InvalidPlan { op: Some(2), .. }),
        "{err}"
    );
    // A plan that leaves an output unwritten.
    let mut p = two_rank_broadcast();
    p.ops.truncate(2);
    let err = check(p, false).unwrap_err();
    assert!(matches!(err, CollectivesError::InvalidPlan { .. }), "{err}");
    // A whole-plan problem names no op, and the message says so rather than printing a
    // sentinel index.
    let mut p = two_rank_broadcast();
    p.dtype = DType::F64;
    let err = check(p, false).unwrap_err();
    assert!(
        matches!(err, CollectivesError::InvalidPlan { op: None, .. }),
        "{err}"
    );
    assert!(!err.to_string().contains(&usize::MAX.to_string()), "{err}");
}

#[test]
fn a_plan_that_writes_an_input_is_refused_unless_in_place() {
    // Rank 0 uses its own input as scratch: a copy back into `Input(0)` after the broadcast.
    let mut p = two_rank_broadcast();
    assert_eq!(input_write(&p), None);
    let l0 = p.ops[0].lane;
    let last = p.ops.len() as u32 - 1;
    p.copy(
        l0,
        Region::new(BufferRef::Output(0), 0, 8),
        Region::new(BufferRef::Input(0), 0, 8),
        vec![],
        vec![last],
    );
    let k = p.ops.len() - 1;
    assert_eq!(input_write(&p), Some((k, 0)));
    let err = check(p, false).unwrap_err();
    assert!(
        matches!(&err, CollectivesError::InvalidPlan { op: Some(o), message }
            if *o == k && message.contains("input")),
        "{err}"
    );
}

pub(super) mod per_rank {
    //! Per-rank lowering: every op lands on exactly one rank, messages pair up, and the plan
    //! run per rank over threads (in-process transport) equals the whole plan on the host
    //! backend byte for byte.

    use std::time::Duration;

    use relaycc_route::{
        BufferRef, Collective, DType, Location, OpKind, Plan, PlanOptions, ReduceOp, Request,
    };

    use super::super::lower::{Lanes, RankLayout, RankProgram, lower};
    use super::super::run::{HostMemory, run, run_on_host_vectors};
    use super::super::thread_transport::InProcess;
    use super::super::{binding_of, check, compile, launch};
    use crate::backend::host::HostBackend;
    use crate::backend::{Backend, ByteRegion};

    /// Rank of a memory: a GPU's request rank; host memory belongs to rank 0 (the lowest rank
    /// of the machine, as across processes).
    pub(in crate::exec) fn owner(plan: &Plan, b: BufferRef) -> Option<u32> {
        match plan.location(b)? {
            Location::Gpu(g) => plan
                .request
                .gpus
                .iter()
                .position(|x| *x == g)
                .map(|r| r as u32),
            Location::Host(_) => Some(0),
        }
    }

    /// Rank `me`'s lowering: input 0, output 1, then the scratch buffers it holds.
    pub(in crate::exec) fn lower_rank(plan: &Plan, me: u32, lanes: Lanes) -> RankProgram {
        let esize = plan.dtype.size();
        let mut scratch = vec![None; plan.scratch.len()];
        let mut bytes = vec![
            plan.request.input_len(me).unwrap() * esize,
            plan.request.output_len(me).unwrap() * esize,
        ];
        for (i, s) in plan.scratch.iter().enumerate() {
            if owner(plan, BufferRef::Scratch(i as u32)) == Some(me) {
                scratch[i] = Some(bytes.len() as u32);
                bytes.push(s.len * esize);
            }
        }
        let layout = RankLayout {
            me,
            owner: &|b| owner(plan, b),
            binding: &|b| match b {
                BufferRef::Input(r) if r == me => Some(0),
                BufferRef::Output(r) if r == me => Some(1),
                BufferRef::Scratch(i) => scratch[i as usize],
                _ => None,
            },
            binding_bytes: bytes,
            lanes,
        };
        lower(plan, &layout).unwrap()
    }

    /// Plans of route's planners (the winner and the NCCL-like baseline) on small presets.
    pub(in crate::exec) fn plans() -> Vec<Plan> {
        let mut out = Vec::new();
        for (preset, n) in [("dgx1-v100", 8u32), ("ac922", 4), ("host-4", 4)] {
            let topo = relaycc_topo::preset(preset).unwrap();
            for c in [
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
                Collective::Broadcast,
                Collective::Reduce,
                Collective::AllToAll,
            ] {
                let mut req = Request::new(c, (0..n).collect(), 96, DType::F32);
                req.op = ReduceOp::Sum;
                let Ok(p) = relaycc_route::plan(&topo, &req, &PlanOptions::default()) else {
                    continue;
                };
                out.push(p.plan);
                out.push(p.baseline_plan);
            }
        }
        assert!(out.len() >= 20, "only {} plans", out.len());
        out
    }

    #[test]
    fn every_op_lands_on_one_rank_and_messages_pair_up() {
        for plan in plans() {
            let n = plan.request.nranks() as u32;
            let progs: Vec<RankProgram> =
                (0..n).map(|r| lower_rank(&plan, r, Lanes::Plan)).collect();
            let mut local = vec![0u32; plan.ops.len()];
            let mut sends = vec![Vec::new(); plan.ops.len()];
            let mut recvs = vec![Vec::new(); plan.ops.len()];
            for (r, p) in progs.iter().enumerate() {
                for seg in p.segments() {
                    for &op in &seg.ops {
                        local[op as usize] += 1;
                    }
                }
                for st in &p.stages {
                    for m in &st.sends {
                        sends[m.op as usize].push((r as u32, *m, st.level));
                    }
                    for m in &st.recvs {
                        recvs[m.op as usize].push((r as u32, *m, st.level));
                    }
                }
            }
            for (id, op) in plan.ops.iter().enumerate() {
                let cross = match &op.kind {
                    OpKind::Copy { src, dst } => {
                        owner(&plan, src.buffer) != owner(&plan, dst.buffer)
                    }
                    OpKind::Reduce { .. } => false,
                };
                let what = format!("{}: op {id}", plan.algorithm);
                if !cross {
                    assert_eq!(local[id], 1, "{what}: local on {} ranks", local[id]);
                    assert!(sends[id].is_empty() && recvs[id].is_empty(), "{what}");
                    continue;
                }
                assert_eq!(local[id], 0, "{what}");
                if op.is_empty() {
                    assert!(sends[id].is_empty() && recvs[id].is_empty(), "{what}");
                    continue;
                }
                let ([(a, s, ls)], [(b, r, lr)]) = (&sends[id][..], &recvs[id][..]) else {
                    panic!(
                        "{what}: {} sends, {} receives",
                        sends[id].len(),
                        recvs[id].len()
                    );
                };
                assert_eq!((s.peer, r.peer), (*b, *a), "{what}");
                assert_eq!(s.tag, r.tag, "{what}");
                assert_eq!(s.slot.bytes, r.slot.bytes, "{what}");
                assert_eq!(ls, lr, "{what}: both sides post at one level");
            }
        }
    }

    /// Input bytes of rank `r`: small integers as f32, so every sum is exact.
    pub(in crate::exec) fn input(plan: &Plan, r: u32) -> Vec<u8> {
        let len = plan.request.input_len(r).unwrap() as usize;
        (0..len)
            .flat_map(|i| (((i * 7 + r as usize * 13) % 61) as f32).to_le_bytes())
            .collect()
    }

    /// The whole plan on the host backend: each rank's output bytes.
    pub(in crate::exec) fn whole(plan: &Plan) -> Vec<Vec<u8>> {
        let exe = compile(check(plan.clone(), false).unwrap()).unwrap();
        let backend = HostBackend::new();
        let n = plan.request.nranks() as u32;
        let esize = plan.dtype.size();
        let mut regions = Vec::new();
        for side in 0..2 {
            for r in 0..n {
                let len = if side == 0 {
                    plan.request.input_len(r).unwrap()
                } else {
                    plan.request.output_len(r).unwrap()
                } * esize;
                let at = Location::Gpu(plan.request.gpus[r as usize]);
                let mem = backend.allocate(at, len.max(1)).unwrap();
                regions.push(ByteRegion {
                    mem,
                    offset: 0,
                    bytes: len,
                });
            }
        }
        for (loc, bytes) in exe.scratch() {
            let mem = backend.allocate(*loc, (*bytes).max(1)).unwrap();
            regions.push(ByteRegion {
                mem,
                offset: 0,
                bytes: *bytes,
            });
        }
        for r in 0..n {
            backend
                .upload(regions[r as usize], &input(plan, r))
                .unwrap();
        }
        // SAFETY: every binding is an allocation of its own, of the plan's size.
        unsafe { launch(&backend, &[(&exe, &regions)]).unwrap() };
        backend.synchronize().unwrap();
        (0..n)
            .map(|r| {
                let reg = regions[binding_of(BufferRef::Output(r), n) as usize];
                let mut out = vec![0u8; reg.bytes as usize];
                backend.download(reg, &mut out).unwrap();
                out
            })
            .collect()
    }

    /// The plan per rank, one thread each, over the in-process transport.
    fn per_rank(plan: &Plan, lanes: Lanes) -> Vec<Vec<u8>> {
        let n = plan.request.nranks() as u32;
        let ends = InProcess::group(n, Duration::from_secs(30));
        std::thread::scope(|s| {
            let handles: Vec<_> = ends
                .into_iter()
                .enumerate()
                .map(|(r, mut t)| {
                    s.spawn(move || {
                        let prog = lower_rank(plan, r as u32, lanes);
                        run_on_host_vectors(&prog, &input(plan, r as u32), &mut t).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn per_rank_runs_over_threads_equal_the_host_backend() {
        for plan in plans() {
            let want = whole(&plan);
            for lanes in [
                Lanes::Plan,
                Lanes::Fold {
                    count: 1,
                    at: Location::Host(0),
                },
            ] {
                let got = per_rank(&plan, lanes);
                assert_eq!(got, want, "{} with {lanes:?}", plan.algorithm);
            }
        }
    }

    /// What `req` expects of each rank's output for [`input`]'s values (exact f32 sums of
    /// small integers), as bytes.
    pub(in crate::exec) fn reference(plan: &Plan) -> Vec<Vec<u8>> {
        let req = &plan.request;
        let n = req.nranks() as u32;
        let inputs: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                input(plan, r)
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect()
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = (0..n)
            .map(|r| vec![0.0; req.output_len(r).unwrap() as usize])
            .collect();
        for p in req.expected().unwrap() {
            for i in 0..p.len {
                let v = p
                    .terms
                    .iter()
                    .map(|&(s, off)| inputs[s as usize][(off + i) as usize])
                    .sum();
                outs[p.rank as usize][(p.out_offset + i) as usize] = v;
            }
        }
        outs.into_iter()
            .map(|o| o.into_iter().flat_map(f32::to_le_bytes).collect())
            .collect()
    }

    /// Plans of rounds (each round's plan run over slices of the buffers, then a tail) run byte
    /// for byte on the host backend: compiled as their expansion, with their staging in one
    /// arena per device.
    #[test]
    fn plans_of_rounds_run_byte_for_byte_on_the_host() {
        let topo = relaycc_topo::preset("dgx1-v100").unwrap();
        let opts = PlanOptions {
            round_bytes: 1000,
            ..PlanOptions::default()
        };
        let mut ran = 0;
        for c in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::AllToAll,
            Collective::Gather,
            Collective::Scatter,
        ] {
            for count in [1000u64, 1003] {
                let req = Request::new(c, vec![0, 2, 5, 7], count, DType::F32).with_root(2);
                let p = relaycc_route::plan(&topo, &req, &opts).unwrap();
                for plan in [p.plan, p.baseline_plan] {
                    let r = plan.rounds.as_ref().expect("a plan of rounds");
                    assert_eq!(r.tail.is_some(), count % r.count != 0, "{}", plan.algorithm);
                    let exe = compile(check(plan.clone(), false).unwrap()).unwrap();
                    let per_device: std::collections::BTreeMap<Location, u64> =
                        exe.scratch().iter().copied().collect();
                    assert_eq!(
                        per_device,
                        plan.staging_per_location(),
                        "{}",
                        plan.algorithm
                    );
                    assert_eq!(whole(&plan), reference(&plan), "{}", plan.algorithm);
                    ran += 1;
                }
            }
        }
        // A point-to-point copy relayed through staging, in rounds with a tail.
        let mut req = Request::point_to_point(0, 7, 40_003);
        req.dtype = DType::F32;
        let p = relaycc_route::plan(
            &topo,
            &req,
            &PlanOptions {
                round_bytes: 65_536,
                ..opts
            },
        )
        .unwrap();
        assert!(p.plan.rounds.is_some());
        let want: Vec<u8> = input(&p.plan, 0);
        assert_eq!(whole(&p.plan)[1], want);
        assert!(ran >= 28);
    }

    #[test]
    fn a_rank_whose_peer_never_sends_fails_within_the_timeout() {
        let plan = super::two_rank_broadcast();
        let prog = lower_rank(&plan, 1, Lanes::Plan);
        assert_eq!(prog.messages(), (0, 1), "rank 1 receives the relayed copy");
        let mut ends = InProcess::group(2, Duration::from_millis(50));
        let mut t = ends.pop().unwrap();
        let mut bufs: Vec<Vec<u128>> = prog
            .binding_bytes
            .iter()
            .map(|b| vec![0u128; (*b as usize).div_ceil(16)])
            .collect();
        let ptrs: Vec<(*mut u8, usize)> = bufs
            .iter_mut()
            .zip(&prog.binding_bytes)
            .map(|(v, b)| (v.as_mut_ptr().cast::<u8>(), *b as usize))
            .collect();
        let mut staging = Vec::new();
        // SAFETY: each pointer is a live vector of its binding's bytes, used here only.
        let mut mem = unsafe { HostMemory::new(&prog, &ptrs, &mut staging).unwrap() };
        let start = std::time::Instant::now();
        let err = run(&prog, &mut mem, &mut t).unwrap_err();
        assert!(err.to_string().contains("no message from rank 0"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
