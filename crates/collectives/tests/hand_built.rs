//! Hand-built programs on the host backend: every rule the shared validation checks is an
//! error at submission, named by program and command, with nothing written; waits that could
//! block forever (never recorded, recorded later in command order, a cycle) are refused, so
//! `synchronize`, `download`, `free` and drop always return.

use relaycc_collectives::{
    Backend, ByteRegion, Command, DeviceMem, HostBackend, Launch, Program, ReduceOp, Slot,
};
use relaycc_route::{DType, Location};

const BYTES: u64 = 64;

fn slot(binding: u32, offset: u64, bytes: u64) -> Slot {
    Slot {
        binding,
        offset,
        bytes,
    }
}

/// A program on `lanes` lanes and `events` events over two bindings of `BYTES` bytes.
fn program(lanes: usize, events: u32, commands: Vec<Command>) -> Program {
    Program {
        lanes: vec![Location::Gpu(0); lanes],
        events,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        divisor: 2,
        bindings: 2,
        commands,
        srcs: vec![slot(0, 0, 16), slot(1, 0, 16)],
    }
}

fn copy(lane: u32, src: Slot, dst: Slot) -> Command {
    Command::Copy { lane, src, dst }
}

struct Fixture {
    backend: HostBackend,
    mems: [DeviceMem; 2],
}

impl Fixture {
    fn new() -> Fixture {
        let backend = HostBackend::new();
        let mems = [0, 1].map(|_| backend.allocate(Location::Gpu(0), BYTES).expect("alloc"));
        let fx = Fixture { backend, mems };
        let ones: Vec<u8> = vec![1; BYTES as usize];
        fx.backend.upload(fx.region(0), &ones).expect("upload");
        fx
    }
    fn region(&self, i: usize) -> ByteRegion {
        ByteRegion {
            mem: self.mems[i],
            offset: 0,
            bytes: BYTES,
        }
    }
    /// Submit `p` over both allocations; every program here is race-free (each touches each
    /// byte from one lane, or orders lanes with record/wait), so the contract holds.
    fn submit(&self, p: &Program) -> Result<(), String> {
        let bindings = [self.region(0), self.region(1)];
        let launch = Launch {
            program: p,
            bindings: &bindings,
        };
        // SAFETY: see above; no raw address of these allocations is in use.
        unsafe { self.backend.submit(&[launch]) }.map_err(|e| e.to_string())
    }
    /// Binding 1's bytes after everything ran.
    fn dst(&self) -> Vec<u8> {
        self.backend.synchronize().expect("nothing pending");
        let mut got = vec![0; BYTES as usize];
        self.backend
            .download(self.region(1), &mut got)
            .expect("download");
        got
    }
}

/// Submit a wrong program: the error names the command and says `what`, nothing is written,
/// and the backend stays usable (synchronize, download, free and drop return).
fn refused(p: Program, command: &str, what: &str) {
    let fx = Fixture::new();
    let e = fx.submit(&p).expect_err("a wrong program is refused");
    assert!(e.contains(command), "{e}");
    assert!(e.contains(what), "{e}");
    assert!(fx.dst().iter().all(|&b| b == 0), "{e}: bytes were written");
    fx.backend.free(fx.mems[0]);
    fx.backend.free(fx.mems[1]);
    fx.backend.synchronize().expect("frees succeed");
}

#[test]
fn a_wait_for_an_event_never_recorded_is_refused() {
    let p = program(
        2,
        1,
        vec![
            Command::Wait { lane: 1, event: 0 },
            copy(1, slot(0, 0, 8), slot(1, 0, 8)),
        ],
    );
    refused(p, "command 0", "before any command records it");
}

#[test]
fn a_wait_before_its_record_in_command_order_is_refused() {
    let p = program(
        2,
        1,
        vec![
            Command::Wait { lane: 1, event: 0 },
            copy(1, slot(0, 0, 8), slot(1, 0, 8)),
            Command::Record { lane: 0, event: 0 },
        ],
    );
    refused(p, "command 0", "before any command records it");
}

#[test]
fn a_wait_cycle_is_refused() {
    // Lane 0 waits for lane 1's record and lane 1 for lane 0's: each record sits behind the
    // other lane's wait, so in any command order one wait comes before its record.
    let p = program(
        2,
        2,
        vec![
            Command::Wait { lane: 0, event: 1 },
            Command::Record { lane: 0, event: 0 },
            Command::Wait { lane: 1, event: 0 },
            Command::Record { lane: 1, event: 1 },
        ],
    );
    refused(p, "command 0", "before any command records it");
}

/// Two records of one event would leave a wait free to pair with either; the host backend and
/// CUDA would order it differently, so the second record is refused.
#[test]
fn an_event_recorded_twice_is_refused() {
    let p = program(
        2,
        1,
        vec![
            Command::Record { lane: 0, event: 0 },
            Command::Record { lane: 1, event: 0 },
            Command::Wait { lane: 1, event: 0 },
            copy(1, slot(0, 0, 8), slot(1, 0, 8)),
        ],
    );
    refused(p, "command 1", "records event 0 a second time");
}

#[test]
fn slots_lanes_events_and_bindings_are_checked() {
    refused(
        program(1, 0, vec![copy(0, slot(0, 60, 8), slot(1, 0, 8))]),
        "command 0",
        "lies outside binding 0 of 64 bytes",
    );
    refused(
        program(1, 0, vec![copy(0, slot(0, 0, 8), slot(1, 0, 4))]),
        "command 0",
        "copy of 8 bytes into a slot of 4",
    );
    refused(
        program(1, 0, vec![copy(3, slot(0, 0, 8), slot(1, 0, 8))]),
        "command 0",
        "lane 3 does not exist",
    );
    refused(
        program(1, 0, vec![copy(0, slot(2, 0, 8), slot(1, 0, 8))]),
        "command 0",
        "binding 2 does not exist",
    );
    refused(
        program(1, 1, vec![Command::Record { lane: 0, event: 5 }]),
        "command 0",
        "event 5 does not exist",
    );
    let misaligned = Command::Reduce {
        lane: 0,
        first: 0,
        count: 1,
        dst: slot(1, 2, 16),
        divide: false,
    };
    refused(
        program(1, 0, vec![misaligned]),
        "command 0",
        "not whole 4-byte elements",
    );
    let no_sources = Command::Reduce {
        lane: 0,
        first: 1,
        count: 5,
        dst: slot(1, 0, 16),
        divide: false,
    };
    refused(
        program(1, 0, vec![no_sources]),
        "command 0",
        "lie outside the program's 2 sources",
    );
    let mut p = program(1, 0, vec![]);
    p.bindings = 3;
    refused(p, "program 0", "needs 3 bindings, the launch gives 2");
}

/// The valid form of the refused programs runs: lane 1 waits for lane 0's record, which
/// comes first in command order.
#[test]
fn a_wait_after_its_record_runs() {
    let fx = Fixture::new();
    let p = program(
        2,
        1,
        vec![
            copy(0, slot(0, 0, 32), slot(1, 0, 32)),
            Command::Record { lane: 0, event: 0 },
            Command::Wait { lane: 1, event: 0 },
            copy(1, slot(1, 0, 32), slot(1, 32, 32)),
        ],
    );
    fx.submit(&p).expect("a valid program runs");
    assert_eq!(fx.dst(), vec![1u8; BYTES as usize]);
}
