//! The driver calls of one call of a rank's part over CUDA flag lanes (`rank/flag_calls.rs`,
//! `rank/flag_streams.rs`), counted without a GPU: each segment of the rank's lowered part
//! launched within the caller's stream (`calls::driver_calls_within_stream`), and the flag
//! steps of its stages, one driver call each (`cuStreamWaitValue32`, `cuMemcpyAsync` or
//! `cuMemcpyPeerAsync`, `cuStreamWriteValue32`), with a context bind per stage.

use std::time::Duration;

use relaycc_route::{Collective, DType, ReduceOp, Request};

use super::super::calls::driver_calls_within_stream;
use super::super::{CallCountSetup, DriverCalls};
use crate::backend::AddressSpace;
use crate::error::CollectivesError;
use crate::exec::call_book::CallBook;
use crate::exec::flag_transport::{FlagLane, FlagShape, FlagStep, FlagTransport, GroupAbort};
use crate::exec::run::Transport;

/// A lane that counts the steps it is given, one driver call each, and a context bind per
/// stage that has any.
struct Counting {
    calls: u32,
    book: CallBook,
    abort: GroupAbort,
}

// SAFETY: it runs nothing.
unsafe impl FlagLane for Counting {
    fn reaches(&self, space: AddressSpace) -> bool {
        space == AddressSpace::Device
    }
    unsafe fn run(&mut self, steps: &[FlagStep], _: usize) -> Result<(), CollectivesError> {
        self.calls += steps.len() as u32 + u32::from(!steps.is_empty());
        Ok(())
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn set_timeout(&mut self, _: Duration) {}
    fn calls(&self) -> &CallBook {
        &self.book
    }
    fn abort(&self, why: String) {
        self.abort.abort(why);
    }
    fn group_abort(&self) -> &GroupAbort {
        &self.abort
    }
}

fn plus(a: DriverCalls, b: DriverCalls) -> DriverCalls {
    DriverCalls {
        copies: a.copies + b.copies,
        sm_copies: a.sm_copies + b.sm_copies,
        reduce_kernels: a.reduce_kernels + b.reduce_kernels,
        event_records: a.event_records + b.event_records,
        stream_waits: a.stream_waits + b.stream_waits,
        context_binds: a.context_binds + b.context_binds,
        graph_launches: a.graph_launches + b.graph_launches,
    }
}

/// Per rank of an out-of-place all_reduce of `bytes` of f32 on every GPU of `topo` (rank `r`
/// on CUDA device `map[r]`), as the flag path plans it (the communicator's plan for CUDA
/// ranks): the driver calls of its launches, and those of its flag steps on rings of `shape`.
fn part_calls(topo: &str, map: &[usize], bytes: u64, shape: FlagShape) -> Vec<(DriverCalls, u32)> {
    let t = relaycc_topo::load(topo).unwrap_or_else(|e| panic!("{e}"));
    let n = t.gpu_count();
    let req = Request::new(
        Collective::AllReduce,
        (0..n).collect(),
        bytes / 4,
        DType::F32,
    )
    .with_op(ReduceOp::Sum);
    let plan = crate::plan_cache::make_plan(
        &t,
        &req,
        &[],
        false,
        relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES,
        super::super::CUDA_OP_ISSUE_US,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let devices: Vec<u32> = (0..n).collect();
    (0..n)
        .map(|me| {
            let (program, held) = crate::rank::lower_part(&plan, &devices, me as usize)
                .unwrap_or_else(|e| panic!("{e}"));
            let at = relaycc_route::Location::Gpu(me);
            let bindings = vec![at; 2 + held.len()];
            let setup = CallCountSetup {
                device_map: map,
                bindings: &bindings,
                sm_copy_below: relaycc_topo::rates::SM_COPY_BELOW_BYTES,
            };
            let mut launches = DriverCalls::default();
            let segments = program
                .stages
                .iter()
                .flat_map(|s| [&s.before, &s.during])
                .chain([&program.tail]);
            for seg in segments.filter(|s| !s.program.commands.is_empty()) {
                let c = driver_calls_within_stream(&seg.program, &setup, me)
                    .unwrap_or_else(|e| panic!("{e}"));
                launches = plus(launches, c);
            }
            let lane = Counting {
                calls: 0,
                book: CallBook::new(n),
                abort: GroupAbort::default(),
            };
            let mut t = FlagTransport::new(me, n, shape, lane);
            for (k, stage) in program.stages.iter().enumerate() {
                t.begin(k);
                for m in &stage.recvs {
                    // SAFETY: the counting lane never touches the addresses.
                    unsafe { t.recv(m.peer, m.tag, std::ptr::null_mut(), m.slot.bytes as usize) }
                        .unwrap_or_else(|e| panic!("{e}"));
                }
                for m in &stage.sends {
                    // SAFETY: as above.
                    unsafe { t.send(m.peer, m.tag, std::ptr::null(), m.slot.bytes as usize) }
                        .unwrap_or_else(|e| panic!("{e}"));
                }
                t.wait(k).unwrap_or_else(|e| panic!("{e}"));
            }
            (launches, t.lane().calls)
        })
        .collect()
}

/// The driver calls of rank 0's part of a 64 MiB all_reduce per call, recorded; a change that
/// raises them fails here. Rings of 2 slots of 4 MiB: on `dgx-h100` (8 GPUs) and on 4 ranks
/// sharing one GPU (`nvswitch-4` on device 0), beside the all-ranks launch's figures in
/// `schedule_tests.rs` (which one rank's thread makes for every rank).
#[test]
fn driver_calls_of_a_rank_part_over_flag_lanes_stay_within_the_recorded_figures() {
    let shape = FlagShape::new(2, 4 << 20).expect("shape");
    let eight: Vec<usize> = (0..8).collect();
    for (topo, map, most_launches, most_flags) in [
        (
            "dgx-h100",
            &eight[..],
            RECORDED_DGX_LAUNCHES,
            RECORDED_DGX_FLAGS,
        ),
        (
            "nvswitch-4",
            &[0, 0, 0, 0][..],
            RECORDED_SHARED_LAUNCHES,
            RECORDED_SHARED_FLAGS,
        ),
    ] {
        let parts = part_calls(topo, map, 64 << 20, shape);
        let (launches, flags) = parts[0];
        eprintln!(
            "{topo}: rank 0 of {}: launches {launches}; flag steps {flags} ({} calls per rank \
             and call in all)",
            parts.len(),
            launches.total() + flags
        );
        assert!(launches.total() <= most_launches, "{topo}: {launches}");
        assert!(flags <= most_flags, "{topo}: {flags} flag calls");
        assert!(flags > 0, "{topo}: a part with no message");
        // What the ring's shape costs: a chunk is 3 calls a side.
        for slot in [1usize << 20, 16 << 20] {
            let other = FlagShape::new(2, slot).expect("shape");
            let (_, f) = part_calls(topo, map, 64 << 20, other)[0];
            eprintln!(
                "{topo}: rank 0, 2 slots of {} MiB: flag steps {f}",
                slot >> 20
            );
        }
    }
}

/// Recorded by `driver_calls_of_a_rank_part_over_flag_lanes_stay_within_the_recorded_figures`.
/// `dgx-h100`: 7 reduce kernels (the ring's reduce-scatter steps; the all-gather's chunks are
/// taken out straight into the output), each with its caller's fork and join, 14 calls each
/// way of framing, and 7 context binds.
const RECORDED_DGX_LAUNCHES: u32 = 42;
/// `dgx-h100`: the ring's messages each way in chunks of 4 MiB: a wait, a copy and a signal
/// per chunk and side, a wait for a free slot once a ring wraps, a context bind per stage.
const RECORDED_DGX_FLAGS: u32 = 180;
/// `nvswitch-4` on one GPU: 3 reduce kernels.
const RECORDED_SHARED_LAUNCHES: u32 = 18;
/// `nvswitch-4` on one GPU: as for `dgx-h100`.
const RECORDED_SHARED_FLAGS: u32 = 184;
