//! Tests of the CUDA backend's schedules and driver-call counts, without a GPU: real plans
//! lowered by the executor, and hand-built programs for each rule of `schedule.rs`.

use relaycc_route::{Collective, DType, Location, ReduceOp, Request};

use super::calls::{Around, DriverCalls, Walker, walk, walk_replay};
use super::schedule::{self, CopyBy, LaunchPlacement, LaunchSchedule, Step};
use super::{CallCountSetup, driver_calls, replay_driver_calls};
use crate::backend::{Command, Program, Slot};
use crate::exec;

/// The program the communicator runs for `collective` of `bytes` of f32 (per rank, or per
/// block for all_to_all) on the GPUs of `topo`, planned as `CudaBackend` plans it (its issue
/// cost), with the location of each binding.
fn collective_program(
    topo: &str,
    collective: Collective,
    bytes: u64,
    in_place: bool,
) -> (Program, Vec<Location>) {
    let t = relaycc_topo::load(topo).unwrap_or_else(|e| panic!("{e}"));
    let n = t.gpu_count();
    let req =
        Request::new(collective, (0..n).collect(), bytes / 4, DType::F32).with_op(ReduceOp::Sum);
    let plan = crate::plan_cache::make_plan(
        &t,
        &req,
        &[],
        in_place,
        relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES,
        super::CUDA_OP_ISSUE_US,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let exe = exec::compile(exec::check(plan, in_place).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"));
    let gpus = &exe.plan().request.gpus;
    let mut bindings: Vec<Location> = gpus.iter().map(|&g| Location::Gpu(g)).collect();
    bindings.extend(gpus.iter().map(|&g| Location::Gpu(g)));
    bindings.extend(exe.scratch().iter().map(|&(l, _)| l));
    (exe.program().clone(), bindings)
}

/// The driver calls per call of [`collective_program`]'s program, rank `r` on CUDA device
/// `map[r]`, at the default SM-copy threshold.
fn calls(
    topo: &str,
    map: &[usize],
    collective: Collective,
    bytes: u64,
    in_place: bool,
) -> DriverCalls {
    let (program, bindings) = collective_program(topo, collective, bytes, in_place);
    driver_calls(
        &program,
        &CallCountSetup {
            device_map: map,
            bindings: &bindings,
            sm_copy_below: relaycc_topo::rates::SM_COPY_BELOW_BYTES,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The driver calls of a 64 MiB all_reduce in place on `topo`.
fn count(topo: &str, map: &[usize]) -> DriverCalls {
    calls(topo, map, Collective::AllReduce, 64 << 20, true)
}

/// The driver calls of a 64 MiB all_reduce per call, recorded; a change that raises any of
/// them fails here. On `dgx-h100` (8 GPUs, ring, 8 MiB chunks: 112 peer copies, 56 two-input
/// reductions) and on 4 ranks sharing one GPU (`nvswitch-4` on device 0).
#[test]
fn driver_calls_of_a_64_mib_all_reduce_stay_within_the_recorded_figures() {
    let dgx = count("dgx-h100", &[0, 1, 2, 3, 4, 5, 6, 7]);
    let shared = count("nvswitch-4", &[0, 0, 0, 0]);
    let one_gpu = count("shared-gpu-4", &[0, 0, 0, 0]);
    eprintln!("dgx-h100, 8 GPUs: {dgx}");
    eprintln!("nvswitch-4 on one GPU: {shared}");
    eprintln!("shared-gpu-4: {one_gpu}");
    for (name, got, most) in [
        ("dgx-h100", dgx, RECORDED_DGX),
        ("nvswitch-4", shared, RECORDED_SHARED),
        ("shared-gpu-4", one_gpu, RECORDED_ONE_GPU),
    ] {
        assert!(
            got.total() <= most.total(),
            "{name}: {got} (recorded {most})"
        );
        assert!(
            got.context_binds <= most.context_binds,
            "{name}: {got} (recorded {most})"
        );
        assert!(
            got.stream_waits <= most.stream_waits,
            "{name}: {got} (recorded {most})"
        );
        assert!(
            got.event_records <= most.event_records,
            "{name}: {got} (recorded {most})"
        );
        assert!(
            got.reduce_kernels + got.sm_copies + got.copies
                <= most.reduce_kernels + most.sm_copies + most.copies,
            "{name}: {got} (recorded {most})"
        );
    }
}

/// Recorded by `driver_calls_of_a_64_mib_all_reduce_stay_within_the_recorded_figures`.
const RECORDED_DGX: DriverCalls = DriverCalls {
    copies: 112,
    sm_copies: 0,
    reduce_kernels: 56,
    event_records: 169,
    stream_waits: 278,
    context_binds: 120,
    graph_launches: 0,
};
/// Recorded as above, for `shared-gpu-4`: one kernel reads the four inputs and writes the
/// four outputs (the in-place copies of the result fuse into it), one event records its end
/// for the next launch, one context bind: 3 calls, where `nvswitch-4` on one GPU makes 288.
const RECORDED_ONE_GPU: DriverCalls = DriverCalls {
    copies: 0,
    sm_copies: 0,
    reduce_kernels: 1,
    event_records: 1,
    stream_waits: 0,
    context_binds: 1,
    graph_launches: 0,
};
/// Recorded as above, for `nvswitch-4` on one GPU.
const RECORDED_SHARED: DriverCalls = DriverCalls {
    copies: 24,
    sm_copies: 24,
    reduce_kernels: 12,
    event_records: 61,
    stream_waits: 166,
    context_binds: 1,
    graph_launches: 0,
};

/// Replayed as a captured graph (the steady state of a call repeated on the same buffers), a
/// launch on one device is its hub binding its context, one graph launch and the tail it
/// records: the 288 calls of a 64 MiB all_reduce on `nvswitch-4` on one GPU become 3. A
/// launch on several devices is never captured, nor one with a copy above 256 MiB.
#[test]
fn a_replayed_launch_on_one_device_is_one_graph_launch() {
    let replayed = |topo: &str, map: &[usize]| {
        let (program, bindings) = collective_program(topo, Collective::AllReduce, 64 << 20, true);
        let setup = CallCountSetup {
            device_map: map,
            bindings: &bindings,
            sm_copy_below: relaycc_topo::rates::SM_COPY_BELOW_BYTES,
        };
        replay_driver_calls(&program, &setup).unwrap_or_else(|e| panic!("{e}"))
    };
    let want = DriverCalls {
        event_records: 1,
        context_binds: 1,
        graph_launches: 1,
        ..DriverCalls::default()
    };
    for topo in ["nvswitch-4", "shared-gpu-4"] {
        let got = replayed(topo, &[0, 0, 0, 0]);
        eprintln!("{topo} on one GPU, replayed: {got:?}");
        assert_eq!(got, Some(want), "{topo}");
    }
    assert_eq!(replayed("dgx-h100", &[0, 1, 2, 3, 4, 5, 6, 7]), None);
    // One rank's 1 GiB all_reduce out of place is one 1 GiB copy: never captured.
    let (program, bindings) =
        collective_program("shared-gpu-1", Collective::AllReduce, 1 << 30, false);
    let setup = CallCountSetup {
        device_map: &[0],
        bindings: &bindings,
        sm_copy_below: relaycc_topo::rates::SM_COPY_BELOW_BYTES,
    };
    assert_eq!(replay_driver_calls(&program, &setup).ok().flatten(), None);
    let (program, bindings) =
        collective_program("shared-gpu-1", Collective::AllReduce, 256 << 20, false);
    assert!(
        replay_driver_calls(
            &program,
            &CallCountSetup {
                bindings: &bindings,
                ..setup
            }
        )
        .is_ok_and(|c| c.is_some())
    );
    // Several logical GPUs of a DGX on one device: one device, so a graph.
    assert_eq!(replayed("dgx-h100", &[0; 8]), Some(want));
}

/// Ranks on one GPU: a broadcast is one kernel that reads the root's input once and writes
/// every output; an all_gather one such kernel per rank (every other rank's output in place,
/// every output out of place); 64 MiB, so each would otherwise be copy-engine copies.
#[test]
fn copies_of_one_source_on_one_gpu_are_one_kernel_each() {
    for (collective, in_place, kernels, copies) in [
        (Collective::Broadcast, false, 1, 0),
        (Collective::Broadcast, true, 1, 0),
        (Collective::AllGather, false, 4, 0),
        (Collective::AllGather, true, 4, 0),
        (Collective::AllToAll, false, 0, 16),
    ] {
        let calls = calls("shared-gpu-4", &[0; 4], collective, 64 << 20, in_place);
        assert_eq!(
            (calls.reduce_kernels, calls.copies + calls.sm_copies),
            (kernels, copies),
            "{collective} in place {in_place}: {calls}"
        );
    }
}

/// Ranks on one GPU: an all_to_all's small copies are one batched launch per lane (4, not 16);
/// blocks of 64 MiB stay on copy engines.
#[test]
fn small_copies_of_an_all_to_all_on_one_gpu_are_one_launch_per_lane() {
    for (bytes, sm_launches, copies) in [(1u64 << 20, 4, 0), (64 << 20, 0, 16)] {
        let calls = calls("shared-gpu-4", &[0; 4], Collective::AllToAll, bytes, false);
        assert_eq!(
            (calls.sm_copies, calls.copies),
            (sm_launches, copies),
            "{bytes}: {calls}"
        );
    }
}

/// Copies back to back on a lane, each small enough for SMs, are one batched launch while
/// each is independent of the ones before it; a copy that reads what an earlier one wrote
/// ends the batch there, and with every copy on copy engines nothing is batched.
#[test]
fn independent_small_copies_on_a_lane_are_one_launch() {
    let copy = |src, dst| Command::Copy { lane: 0, src, dst };
    let p = program(
        vec![Location::Gpu(0)],
        6,
        vec![
            copy(slot(0, 0, MIB), slot(1, 0, MIB)),
            copy(slot(2, 0, MIB), slot(3, 0, MIB)),
            copy(slot(4, 0, 4096), slot(5, 8, 4096)),
        ],
        Vec::new(),
    );
    let devs = vec![Some(0); 6];
    let s = schedule_of(&p, &devs, &|_, _| true, u64::MAX, &apart);
    assert_eq!(s.steps.len(), 1, "{:?}", s.steps);
    assert!(matches!(
        s.steps[0],
        Step::CopyBatch {
            first: 0,
            count: 3,
            ..
        }
    ));
    assert_eq!(
        s.batched
            .iter()
            .map(|c| (c.0.binding, c.1.binding, c.2))
            .collect::<Vec<_>>(),
        vec![(0, 1, MIB), (2, 3, MIB), (4, 5, 4096)]
    );
    // The second copy reads what the first wrote (binding 2 where binding 1 is): it and the
    // third run as copies of their own.
    let chained = |b: u32| if b == 2 { apart(1) } else { apart(b) };
    let s = schedule_of(&p, &devs, &|_, _| true, u64::MAX, &chained);
    assert_eq!(s.steps.len(), 3, "{:?}", s.steps);
    assert!(
        s.steps
            .iter()
            .all(|st| matches!(st, Step::Copy { by: CopyBy::Sm, .. }))
    );
    let s = schedule_of(&p, &devs, &|_, _| true, 0, &apart);
    assert!(s.steps.iter().all(|st| matches!(
        st,
        Step::Copy {
            by: CopyBy::Engine,
            ..
        }
    )));
}

/// A launch loads its GPU's kernels when a copy may run on SMs: one below the threshold, or
/// copies of one source back to back (a fan-out, a kernel at any size); a lone large copy
/// leaves them unloaded (copy engines need none).
#[test]
fn kernels_load_for_small_copies_and_for_fan_outs_of_any_size() {
    let big = 64 * MIB;
    let copy = |src, dst| Command::Copy { lane: 0, src, dst };
    let lone = program(
        vec![Location::Gpu(0)],
        2,
        vec![copy(slot(0, 0, big), slot(1, 0, big))],
        Vec::new(),
    );
    let fan = program(
        vec![Location::Gpu(0)],
        3,
        vec![
            copy(slot(0, 0, big), slot(1, 0, big)),
            copy(slot(0, 0, big), slot(2, 0, big)),
        ],
        Vec::new(),
    );
    let below = relaycc_topo::rates::SM_COPY_BELOW_BYTES;
    assert!(!super::launch::wants_sm_copies(&[&lone], below));
    assert!(super::launch::wants_sm_copies(&[&lone], u64::MAX));
    assert!(super::launch::wants_sm_copies(&[&fan], below));
}

/// Copies of one source back to back on a lane become one kernel with a destination each,
/// while each destination is apart from the source and the others; the first that is not
/// ends the fan-out there, and a copy of another source is a copy.
#[test]
fn copies_of_one_source_fan_out_while_their_destinations_are_apart() {
    let a = slot(0, 0, MIB);
    let copy = |src, dst| Command::Copy { lane: 0, src, dst };
    let p = program(
        vec![Location::Gpu(0)],
        6,
        vec![
            copy(a, slot(1, 0, MIB)),
            copy(a, slot(2, 0, MIB)),
            copy(a, slot(3, 0, MIB)),
            copy(slot(4, 0, MIB), slot(5, 0, MIB)),
        ],
        Vec::new(),
    );
    let devs = vec![Some(0); 6];
    let s = schedule_of(&p, &devs, &|_, _| true, 0, &apart);
    assert_eq!(s.steps.len(), 2, "{:?}", s.steps);
    let Step::Reduce {
        nsrcs: 1,
        ndsts: 3,
        operands,
        len,
        ..
    } = s.steps[0]
    else {
        panic!("{:?}", s.steps[0])
    };
    assert_eq!(len, MIB);
    let ops = &s.operands[operands as usize..operands as usize + 4];
    assert_eq!(
        ops.iter().map(|o| o.binding).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert!(matches!(
        s.steps[1],
        Step::Copy {
            by: CopyBy::Engine,
            ..
        }
    ));
    // The second copy's destination overlaps the source: no fan-out, four copies (the
    // overlapping one in two chunks).
    let overlapping = |b: u32| if b == 2 { apart(0) + MIB / 2 } else { apart(b) };
    let s = schedule_of(&p, &devs, &|_, _| true, 0, &overlapping);
    assert_eq!(s.steps.len(), 5, "{:?}", s.steps);
    assert!(s.steps.iter().all(|st| matches!(st, Step::Copy { .. })));
    // The third's destination is memory the lane's GPU does not reach: the first two fan out.
    let elsewhere = vec![Some(0), Some(0), Some(0), Some(1), Some(0), Some(0)];
    let s = schedule_of(&p, &elsewhere, &|a, b| a == b, 0, &apart);
    assert!(
        matches!(s.steps[0], Step::Reduce { ndsts: 2, .. }),
        "{:?}",
        s.steps
    );
    assert_eq!(s.steps.len(), 3);
}

fn slot(binding: u32, offset: u64, bytes: u64) -> Slot {
    Slot {
        binding,
        offset,
        bytes,
    }
}

fn program(
    lanes: Vec<Location>,
    bindings: u32,
    commands: Vec<Command>,
    srcs: Vec<Slot>,
) -> Program {
    let events = commands
        .iter()
        .filter(|c| matches!(c, Command::Record { .. }))
        .count() as u32;
    Program {
        lanes,
        events,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        divisor: 4,
        bindings,
        commands,
        srcs,
    }
}

/// The schedule of `p` on one device per logical GPU, every binding `i` at `(i + 1) << 40`
/// unless `addr` says otherwise, bindings on the GPUs `binding_dev` names.
fn schedule_of(
    p: &Program,
    binding_dev: &[Option<usize>],
    reaches: &dyn Fn(usize, usize) -> bool,
    sm_copy_below: u64,
    addr: &dyn Fn(u32) -> u64,
) -> LaunchSchedule {
    let mut facts = Vec::new();
    schedule::facts([p], &[0], addr, &mut |f| {
        facts.push(f);
        true
    });
    let lane_dev = |l: Location| {
        Ok(match l {
            Location::Gpu(g) => g as usize,
            Location::Host(_) => 0,
        })
    };
    let sm_ok = vec![true; 4];
    let place = LaunchPlacement {
        lane_dev: &lane_dev,
        binding_dev,
        reaches,
        sm_ok: &sm_ok,
        sm_copy_below,
        devices: 4,
    };
    schedule::build(&[p], &[0], &place, &facts).unwrap_or_else(|e| panic!("{e}"))
}

fn apart(b: u32) -> u64 {
    u64::from(b + 1) << 40
}

const MIB: u64 = 1 << 20;

#[test]
fn a_reduction_is_one_launch_and_the_copies_of_its_result_fuse_into_it() {
    // Lane 0: x = a + b + c; copy x -> y; copy x -> z; then a copy of something else.
    let x = slot(3, 0, MIB);
    let p = program(
        vec![Location::Gpu(0)],
        6,
        vec![
            Command::Reduce {
                lane: 0,
                first: 0,
                count: 3,
                dst: x,
                divide: false,
            },
            Command::Copy {
                lane: 0,
                src: x,
                dst: slot(4, 0, MIB),
            },
            Command::Copy {
                lane: 0,
                src: x,
                dst: slot(5, 0, MIB),
            },
            Command::Copy {
                lane: 0,
                src: slot(0, 0, MIB),
                dst: slot(5, MIB, MIB),
            },
        ],
        vec![slot(0, 0, MIB), slot(1, 0, MIB), slot(2, 0, MIB)],
    );
    let devs = vec![Some(0); 6];
    let s = schedule_of(&p, &devs, &|_, _| true, 0, &apart);
    assert_eq!(s.steps.len(), 2, "{:?}", s.steps);
    let Step::Reduce {
        nsrcs,
        ndsts,
        operands,
        ..
    } = s.steps[0]
    else {
        panic!("{:?}", s.steps[0])
    };
    assert_eq!((nsrcs, ndsts), (3, 3));
    let ops = &s.operands[operands as usize..operands as usize + 6];
    assert_eq!(
        ops[3..].iter().map(|a| a.binding).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    assert!(matches!(
        s.steps[1],
        Step::Copy {
            by: CopyBy::Engine,
            ..
        }
    ));

    // A copy destination that overlaps a source stops the fusion there; so does memory the
    // lane's GPU does not reach.
    let overlapping = |b: u32| if b == 4 { apart(0) + 8 } else { apart(b) };
    let s = schedule_of(&p, &devs, &|_, _| true, 0, &overlapping);
    assert_eq!(s.steps.len(), 4, "{:?}", s.steps);
    let elsewhere = vec![Some(0), Some(0), Some(0), Some(0), Some(1), Some(0)];
    let s = schedule_of(&p, &elsewhere, &|a, b| a == b, 0, &apart);
    assert!(matches!(s.steps[0], Step::Reduce { ndsts: 1, .. }));
    assert_eq!(s.steps.len(), 4);
}

#[test]
fn an_event_between_a_reduction_and_a_copy_keeps_them_apart() {
    let x = slot(2, 0, MIB);
    let p = program(
        vec![Location::Gpu(0), Location::Gpu(0)],
        4,
        vec![
            Command::Reduce {
                lane: 0,
                first: 0,
                count: 2,
                dst: x,
                divide: true,
            },
            Command::Record { lane: 0, event: 0 },
            Command::Copy {
                lane: 0,
                src: x,
                dst: slot(3, 0, MIB),
            },
            Command::Wait { lane: 1, event: 0 },
            Command::Copy {
                lane: 1,
                src: x,
                dst: slot(0, 0, MIB),
            },
        ],
        vec![slot(0, 0, MIB), slot(1, 0, MIB)],
    );
    let s = schedule_of(&p, &[Some(0); 4], &|_, _| true, u64::MAX, &apart);
    assert!(matches!(
        s.steps[0],
        Step::Reduce {
            ndsts: 1,
            divisor: 0,
            ..
        }
    ));
    assert!(matches!(s.steps[2], Step::Copy { by: CopyBy::Sm, .. }));
    // Lane 1 hears of lane 0 before it touches memory: only lane 0 is framed; lane 0's copy
    // after its record is known to nobody, so both lanes are sinks.
    assert_eq!(s.frame_at, vec![(0, (0, 0))]);
    assert_eq!(s.sinks, vec![(0, 0), (0, 1)]);
}

#[test]
fn sums_average_once_at_the_end_and_long_chains_read_the_destination_first() {
    // 20 sources into the 18th: two launches, the 18th source in the first.
    let srcs: Vec<Slot> = (0..20).map(|i| slot(i, 0, 4096)).collect();
    let mut p = program(
        vec![Location::Gpu(0)],
        20,
        vec![Command::Reduce {
            lane: 0,
            first: 0,
            count: 20,
            dst: slot(17, 0, 4096),
            divide: true,
        }],
        srcs,
    );
    p.op = ReduceOp::Avg;
    let s = schedule_of(&p, &[Some(0); 20], &|_, _| true, 0, &apart);
    let steps: Vec<_> = s
        .steps
        .iter()
        .map(|st| match *st {
            Step::Reduce {
                operands,
                nsrcs,
                ndsts,
                divisor,
                ..
            } => (operands, nsrcs, ndsts, divisor),
            _ => panic!("{st:?}"),
        })
        .collect();
    assert_eq!(steps.len(), 2);
    assert_eq!((steps[0].1, steps[0].2, steps[0].3), (16, 1, 0));
    assert_eq!((steps[1].1, steps[1].2, steps[1].3), (5, 1, 4));
    assert_eq!(s.operands[0].binding, 17, "the destination is read first");
    // The second launch folds the partial result (the destination) with the last 4 sources.
    let second: Vec<u32> = s.operands[steps[1].0 as usize..]
        .iter()
        .map(|a| a.binding)
        .collect();
    assert_eq!(second, vec![17, 15, 16, 18, 19, 17]);
}

#[test]
fn copies_run_on_sms_below_the_threshold_and_overlapping_ones_in_chunks() {
    let p = program(
        vec![Location::Gpu(0)],
        3,
        vec![
            Command::Copy {
                lane: 0,
                src: slot(0, 0, MIB),
                dst: slot(1, 0, MIB),
            },
            Command::Copy {
                lane: 0,
                src: slot(0, 0, 4 * MIB),
                dst: slot(1, 0, 4 * MIB),
            },
            Command::Copy {
                lane: 0,
                src: slot(0, 0, MIB),
                dst: slot(2, 0, MIB),
            },
            Command::Copy {
                lane: 0,
                src: slot(0, 0, MIB),
                dst: slot(0, MIB / 4, MIB),
            },
            Command::Copy {
                lane: 0,
                src: slot(1, 0, MIB),
                dst: slot(1, 0, MIB),
            },
        ],
        Vec::new(),
    );
    let devs = [Some(0), Some(1), None];
    let s = schedule_of(&p, &devs, &|_, _| true, 2 * MIB, &apart);
    let by: Vec<CopyBy> = s
        .steps
        .iter()
        .map(|st| match st {
            Step::Copy { by, .. } => *by,
            other => panic!("{other:?}"),
        })
        .collect();
    // SM below 2 MiB between device memories; a peer copy above; the copy engine with host
    // memory; the overlapping copy in four chunks from its far end; the copy onto itself
    // nothing.
    assert_eq!(
        by,
        vec![
            CopyBy::Sm,
            CopyBy::Peer { src: 0, dst: 1 },
            CopyBy::Engine,
            CopyBy::Engine,
            CopyBy::Engine,
            CopyBy::Engine,
            CopyBy::Engine
        ]
    );
    let Step::Copy { src, dst, .. } = s.steps[3] else {
        panic!()
    };
    assert_eq!((src.offset, dst.offset), (3 * MIB / 4, MIB));
    // Without peer access the copy to the other GPU stays on the copy engine.
    let s = schedule_of(&p, &devs, &|a, b| a == b, 2 * MIB, &apart);
    assert!(matches!(
        s.steps[0],
        Step::Copy {
            by: CopyBy::Peer { .. },
            ..
        }
    ));
}

/// Two independent copies of 1 MiB, within binding 0 on lane 0 (GPU 0) and within binding
/// 1 on lane 1 (`second`).
fn two_independent_copies(second: Location) -> Program {
    let copy = |b: u32| Command::Copy {
        lane: b,
        src: slot(b, 0, MIB),
        dst: slot(b, MIB, MIB),
    };
    program(
        vec![Location::Gpu(0), second],
        2,
        vec![copy(0), copy(1)],
        Vec::new(),
    )
}

#[test]
fn the_walk_frames_once_through_a_hub_and_binds_contexts_on_device_changes() {
    // Two GPUs, a copy each, independent.
    let p = two_independent_copies(Location::Gpu(1));
    let s = schedule_of(&p, &[Some(0), Some(1)], &|_, _| true, 0, &apart);
    assert_eq!(s.sinks.len(), 2);
    let previous = s.sinks.clone();
    let around = Around {
        previous: &previous,
        callers: &[1],
    };
    let kinds = call_kinds(walk, &s, around);
    assert_eq!(
        kinds,
        vec![
            "Bind",
            "RecordFork",
            "Bind",
            "WaitTail",
            "WaitFork",
            "RecordJoin",
            "Step",
            "Bind",
            "WaitJoin",
            "Step",
            "Bind",
            "RecordTail",
            "Bind",
            "RecordTail",
            "CallerWait",
            "CallerWait"
        ]
    );
    assert_eq!(DriverCalls::of(&s, around).total() as usize, kinds.len());
}

/// The kind of each call `walker` makes over `s`, in order.
fn call_kinds<'s>(walker: Walker<'s>, s: &'s LaunchSchedule, around: Around<'_>) -> Vec<String> {
    let mut kinds = Vec::new();
    walker(s, around, &mut |c| {
        let call = format!("{c:?}");
        kinds.push(call.split([' ', '(']).next().unwrap_or_default().to_owned());
        Ok(())
    })
    .unwrap();
    kinds
}

/// A replayed launch (one device, two streams): the caller's fork, the hub's wait for the
/// previous launch's other tail and for the fork, the graph, the hub's tail, the caller's wait
/// for it; one context bind, as every call runs on the one device.
#[test]
fn the_replay_walk_frames_one_graph_launch_on_the_hub() {
    let p = two_independent_copies(Location::Gpu(0));
    let s = schedule_of(&p, &[Some(0), Some(0)], &|_, _| true, 0, &apart);
    assert_eq!(s.sinks.len(), 2);
    let previous = s.sinks.clone();
    let around = Around {
        previous: &previous,
        callers: &[0],
    };
    let kinds = call_kinds(walk_replay, &s, around);
    assert_eq!(
        kinds,
        vec![
            "Bind",
            "RecordFork",
            "WaitTail",
            "WaitFork",
            "GraphLaunch",
            "RecordTail",
            "CallerWait"
        ]
    );
    assert_eq!(
        DriverCalls::of_replay(&s, around).total() as usize,
        kinds.len()
    );
}

mod flag_calls;
mod launch_model;
