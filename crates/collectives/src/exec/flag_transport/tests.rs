//! The flag transport's steps, and plans run per rank on host threads over it: ranks arriving
//! in random order with random delays before every stage give the whole plan's bytes on the
//! host backend, whatever the rings' shape; a rank that never comes is named.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use relaycc_route::{BufferRef, Collective, DType, Plan, PlanOptions, ReduceOp, Request};

use super::super::call_book::{CallBook, CallRecord};
use super::super::flag_host::HostFlagChannels;
use super::super::lower::Lanes;
use super::super::run::{Transport, run_on_host_vectors};
use super::super::tests::per_rank::{input, lower_rank, owner, plans, whole};
use super::{Counter, FlagLane, FlagRef, FlagShape, FlagStep, FlagTransport, GroupAbort, reached};
use crate::backend::AddressSpace;
use crate::call::CallDesc;
use crate::error::CollectivesError;

/// A lane that keeps the steps it is given.
#[derive(Debug)]
struct Recorder(Vec<Vec<FlagStep>>, CallBook, GroupAbort);

impl Default for Recorder {
    fn default() -> Self {
        Recorder(Vec::new(), CallBook::new(2), GroupAbort::default())
    }
}

// SAFETY: it runs nothing.
unsafe impl FlagLane for Recorder {
    fn reaches(&self, space: AddressSpace) -> bool {
        space == AddressSpace::Host
    }
    unsafe fn run(&mut self, steps: &[FlagStep], _: usize) -> Result<(), CollectivesError> {
        self.0.push(steps.to_vec());
        Ok(())
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn set_timeout(&mut self, _: Duration) {}
    fn calls(&self) -> &CallBook {
        &self.1
    }
    fn abort(&self, why: String) {
        self.2.abort(why);
    }
    fn group_abort(&self) -> &GroupAbort {
        &self.2
    }
}

fn flag(src: u32, dst: u32, counter: Counter) -> FlagRef {
    FlagRef { src, dst, counter }
}

/// What a stage's steps say, without addresses: (kind, peer, slot or value).
fn shape_of(steps: &[FlagStep]) -> Vec<(char, u32, u32)> {
    steps
        .iter()
        .map(|s| match *s {
            FlagStep::Wait { flag, at } => match flag.counter {
                Counter::Posted => ('p', flag.src, at),
                Counter::Freed => ('f', flag.dst, at),
            },
            FlagStep::Put { to, slot, .. } => ('>', to, slot),
            FlagStep::Take { from, slot, .. } => ('<', from, slot),
            FlagStep::Signal { flag, value } => match flag.counter {
                Counter::Posted => ('P', flag.dst, value),
                Counter::Freed => ('F', flag.src, value),
            },
        })
        .collect()
}

#[test]
fn a_stage_puts_each_round_before_it_takes_and_waits_for_empty_slots() {
    let shape = FlagShape::new(2, 4).unwrap();
    let mut t = FlagTransport::new(0, 2, shape, Recorder::default());
    let mut out = [0u8; 8];
    let src = [7u8; 20];
    t.begin(0);
    // SAFETY: the recorder never touches the addresses.
    unsafe {
        t.recv(1, 3, out.as_mut_ptr(), 8).unwrap();
        t.send(1, 3, src.as_ptr(), 20).unwrap();
    }
    t.wait(0).unwrap();
    let want = vec![
        // Round 0: put chunk 0, then take chunk 0.
        ('>', 1, 0),
        ('P', 1, 1),
        ('p', 1, 1),
        ('<', 1, 0),
        ('F', 1, 1),
        // Round 1.
        ('>', 1, 1),
        ('P', 1, 2),
        ('p', 1, 2),
        ('<', 1, 1),
        ('F', 1, 2),
        // Rounds 2 to 4: only the send, each waiting for its slot to be taken out.
        ('f', 1, 1),
        ('>', 1, 0),
        ('P', 1, 3),
        ('f', 1, 2),
        ('>', 1, 1),
        ('P', 1, 4),
        ('f', 1, 3),
        ('>', 1, 0),
        ('P', 1, 5),
    ];
    assert_eq!(shape_of(&t.lane().0[0]), want);
    // The last chunk is the message's remainder, at its offset.
    let FlagStep::Put { src: at, bytes, .. } = t.lane().0[0][17] else {
        panic!("a put");
    };
    assert_eq!((at, bytes), (src.as_ptr().wrapping_add(16), 4));
    // The channel's counts go on from there in the next stage; an empty message is one chunk.
    t.begin(1);
    // SAFETY: as above.
    unsafe { t.send(1, 0, src.as_ptr(), 0).unwrap() };
    t.wait(1).unwrap();
    assert_eq!(
        shape_of(&t.lane().0[1]),
        vec![('f', 1, 4), ('>', 1, 1), ('P', 1, 6)]
    );
    assert!(matches!(
        t.lane().0[1][0],
        FlagStep::Wait { flag: f, .. } if f == flag(0, 1, Counter::Freed)
    ));
    // A message to oneself or past the last rank is refused when posted.
    // SAFETY: as above.
    unsafe {
        assert!(t.send(0, 0, src.as_ptr(), 4).is_err());
        assert!(t.recv(2, 0, out.as_mut_ptr(), 4).is_err());
    }
}

/// Two ranks that each send the other three messages in one stage (the first test failure
/// of the protocol: with one chunk of every message per round, both put two chunks into a
/// one-slot ring before taking any, and each waited for the other).
#[test]
fn several_messages_to_one_peer_in_a_stage_share_its_channel() {
    for (slots, slot_bytes) in [(1, 4), (1, 64), (2, 3)] {
        let shape = FlagShape::new(slots, slot_bytes).unwrap();
        let ends = HostFlagChannels::group(2, shape, Duration::from_secs(20), u64::MAX);
        let sizes = [5usize, 0, 9];
        let got: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
            let handles: Vec<_> = ends
                .into_iter()
                .enumerate()
                .map(|(r, mut t)| {
                    s.spawn(move || {
                        let peer = 1 - r as u32;
                        let srcs: Vec<Vec<u8>> = sizes
                            .iter()
                            .enumerate()
                            .map(|(i, &b)| vec![(r * 16 + i) as u8; b])
                            .collect();
                        let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&b| vec![0; b]).collect();
                        t.begin(0);
                        for (src, dst) in srcs.iter().zip(dsts.iter_mut()) {
                            // SAFETY: live vectors, untouched until `wait` returns.
                            unsafe {
                                t.send(peer, 0, src.as_ptr(), src.len()).unwrap();
                                t.recv(peer, 0, dst.as_mut_ptr(), dst.len()).unwrap();
                            }
                        }
                        t.wait(0).unwrap_or_else(|e| panic!("{shape:?}: {e}"));
                        dsts
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, dsts) in got.iter().enumerate() {
            for (i, d) in dsts.iter().enumerate() {
                assert_eq!(d, &vec![((1 - r) * 16 + i) as u8; sizes[i]], "{shape:?}");
            }
        }
    }
}

#[test]
fn a_chain_of_waits_names_the_rank_it_ends_at_or_the_cycle_it_closes() {
    // Rank 0 waits for 1, which waits for 2, which waits for none.
    let chain = |r: u32| [Some(1), Some(2), None, Some(0)][r as usize];
    // Ranks 0 and 1 began calls #0 and #1, rank 2 only #0.
    let calls = CallBook::new(4);
    let d = CallDesc::new(Collective::AllReduce, DType::F32, 96, ReduceOp::Sum, 0);
    for (r, n) in [(0, 2), (1, 2), (2, 1)] {
        for seq in 0..n {
            calls
                .post(r, CallRecord::new(seq, &d), Duration::from_secs(1), &|| {
                    false
                })
                .unwrap();
        }
    }
    assert_eq!(
        super::wait_chain_words(0, 1, chain, &calls),
        ", which waits for rank 2 (rank 2 is the one missing: rank 0 is in call #1 (all_reduce \
         of f32, op sum, count 96), rank 2's last call is call #0 (all_reduce of f32, op sum, \
         count 96))"
    );
    assert!(super::wait_chain_words(3, 2, chain, &calls).ends_with(
        "rank 3 is in no call, rank 2's last call is call #0 (all_reduce of f32, op sum, count 96))"
    ));
    // Rank 3 waits for 0, 0 for 1, 1 for 2: a chain; 2 waiting for 3 would close a cycle.
    let cycle = |r: u32| [Some(1), Some(2), Some(3), Some(0)][r as usize];
    assert!(
        super::wait_chain_words(3, 0, cycle, &calls)
            .ends_with("rank 3: a cycle of waits (the ranks disagree on their messages)")
    );
}

#[test]
fn counters_compare_cyclically_and_shapes_need_a_slot_of_a_byte() {
    assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
    assert!(reached(2, u32::MAX), "2 is 3 past u32::MAX, modulo 2^32");
    assert!(!reached(u32::MAX, 1));
    assert!(FlagShape::new(0, 8).is_err() && FlagShape::new(2, 0).is_err());
    let d = FlagShape::default();
    assert_eq!(FlagShape::new(d.slots(), d.slot_bytes()).ok(), Some(d));
    assert!(
        FlagShape::new(u32::MAX, usize::MAX / 2).is_err(),
        "a ring past an allocation"
    );
    assert_eq!(d.ring_bytes(), 4 << 20);
    let s = FlagShape::new(3, 10).unwrap();
    assert_eq!(
        (s.chunks(0), s.chunks(10), s.chunks(11), s.ring_bytes()),
        (1, 1, 2, 30)
    );
}

/// A lane that sleeps a while before each stage (a thread scheduled late, a slow stream).
struct Jittered<L> {
    inner: L,
    state: u64,
    max_us: u64,
}

// SAFETY: it runs the inner lane's steps unchanged.
unsafe impl<L: FlagLane> FlagLane for Jittered<L> {
    fn reaches(&self, space: AddressSpace) -> bool {
        self.inner.reaches(space)
    }
    unsafe fn run(&mut self, steps: &[FlagStep], stage: usize) -> Result<(), CollectivesError> {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        std::thread::sleep(Duration::from_micros(self.state % (self.max_us + 1)));
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.run(steps, stage) }
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.inner.set_timeout(timeout);
    }
    fn calls(&self) -> &CallBook {
        self.inner.calls()
    }
    fn abort(&self, why: String) {
        self.inner.abort(why);
    }
    fn group_abort(&self) -> &GroupAbort {
        self.inner.group_abort()
    }
}

/// `plan` per rank on threads over host flags of `shape`, each rank starting after a delay
/// of its own and sleeping up to `max_us` before each stage.
fn over_flags(plan: &Plan, shape: FlagShape, seed: u64, max_us: u64) -> Vec<Vec<u8>> {
    let n = plan.request.nranks() as u32;
    let ends = HostFlagChannels::group(n, shape, Duration::from_secs(20), u64::MAX);
    std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .into_iter()
            .enumerate()
            .map(|(r, end)| {
                let lanes = Lanes::Fold {
                    count: 1 + r as u32 % 2,
                    at: relaycc_route::Location::Host(0),
                };
                s.spawn(move || {
                    let state = (seed ^ (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
                    std::thread::sleep(Duration::from_micros(state % (4 * max_us + 1)));
                    let mut t = FlagTransport::new(
                        r as u32,
                        n,
                        shape,
                        Jittered {
                            inner: end.into_lane(),
                            state,
                            max_us,
                        },
                    );
                    let prog = lower_rank(plan, r as u32, lanes);
                    run_on_host_vectors(&prog, &input(plan, r as u32), &mut t).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn route_plans_per_rank_over_host_flags_equal_the_whole_plan() {
    for (i, plan) in plans().iter().enumerate() {
        let want = whole(plan);
        for (slots, slot_bytes) in [(1, 40), (2, 100), (4, 1 << 20)] {
            let shape = FlagShape::new(slots, slot_bytes).unwrap();
            let got = over_flags(plan, shape, i as u64 * 31 + 7, 50);
            assert_eq!(got, want, "{} with {shape:?}", plan.algorithm);
        }
    }
}

/// Presets and the ranks a property case picks among.
const MACHINES: [(&str, u32); 5] = [
    ("dgx1-v100", 8),
    ("ac922", 4),
    ("host-4", 4),
    ("dgx-a100", 8),
    ("pcie-4gpu", 4),
];

const COLLECTIVES: [Collective; 7] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllToAll,
    Collective::Gather,
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random machines, subsets of their GPUs, collectives, ops, counts and ring shapes: the
    /// winner and the baseline per rank over host flags equal the whole plan byte for byte.
    #[test]
    fn random_plans_over_host_flags_equal_the_whole_plan(
        machine in 0..MACHINES.len(),
        pick in any::<u64>(),
        c in 0..COLLECTIVES.len(),
        op in prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]),
        count in 1u64..600,
        slots in 1u32..4,
        slot_bytes in prop::sample::select(vec![64usize, 1024, 1 << 16]),
        seed in any::<u64>(),
    ) {
        let (name, gpus) = MACHINES[machine];
        let topo = relaycc_topo::preset(name).unwrap();
        let members: Vec<u32> = (0..gpus).filter(|g| pick >> g & 1 == 1).collect();
        prop_assume!(members.len() >= 2);
        let root = ((pick >> 16) % members.len() as u64) as u32;
        let mut req = Request::new(COLLECTIVES[c], members, count, DType::F32).with_root(root);
        req.op = op;
        let planned = relaycc_route::plan(&topo, &req, &PlanOptions::default()).unwrap();
        let shape = FlagShape::new(slots, slot_bytes).unwrap();
        for plan in [planned.plan, planned.baseline_plan] {
            // A relay through a GPU outside the ranks is a one-process plan: no rank holds it.
            if (0..plan.scratch.len()).any(|i| owner(&plan, BufferRef::Scratch(i as u32)).is_none()) {
                continue;
            }
            prop_assert_eq!(over_flags(&plan, shape, seed, 30), whole(&plan), "{}", plan.algorithm);
        }
    }
}

#[test]
fn a_rank_that_never_comes_is_named_and_the_group_aborted() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let req = Request::new(Collective::AllReduce, vec![0, 1, 2, 3], 4096, DType::F32);
    let plan = relaycc_route::plan(&topo, &req, &PlanOptions::default())
        .unwrap()
        .plan;
    let timeout = Duration::from_millis(300);
    let shape = FlagShape::new(2, 1024).unwrap();
    let mut ends = HostFlagChannels::group(4, shape, timeout, u64::MAX);
    let absent = ends.pop().unwrap();
    let channels = std::sync::Arc::clone(absent.lane().channels());
    let start = Instant::now();
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .into_iter()
            .enumerate()
            .map(|(r, mut t)| {
                let prog = lower_rank(&plan, r as u32, Lanes::Plan);
                let plan = &plan;
                s.spawn(move || {
                    run_on_host_vectors(&prog, &input(plan, r as u32), &mut t)
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Each of the three fails within about one timeout: by its own wait, or by the abort.
    assert!(start.elapsed() < 4 * timeout, "{:?}", start.elapsed());
    let first = channels
        .failure()
        .expect("the group is aborted")
        .to_string();
    assert!(first.contains("for rank 3"), "{first}");
    for e in &errors {
        assert!(e.contains("for rank 3") || e.contains("aborted"), "{e}");
    }
}

/// Ranks on threads run `calls` calls of `plan` each over host flags, each call begun with
/// the descriptor `desc(rank, call)` gives (or not begun at all where it gives `None`, and
/// the rank stops there); returns each rank's first error with the call it came at.
fn calls_over_flags(
    plan: &Plan,
    calls: u64,
    timeout: Duration,
    desc: impl Fn(u32, u64) -> Option<CallDesc> + Sync,
) -> Vec<Option<(u64, String)>> {
    let n = plan.request.nranks() as u32;
    let shape = FlagShape::new(2, 256).unwrap();
    let ends = HostFlagChannels::group(n, shape, timeout, u64::MAX);
    let desc = &desc;
    std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .into_iter()
            .enumerate()
            .map(|(r, mut t)| {
                let prog = lower_rank(plan, r as u32, Lanes::Plan);
                s.spawn(move || {
                    for call in 0..calls {
                        let d = desc(r as u32, call)?;
                        let ran = t.begin_call(&d).and_then(|seq| {
                            assert_eq!(seq, call);
                            run_on_host_vectors(&prog, &input(plan, r as u32), &mut t)
                        });
                        if let Err(e) = ran {
                            return Some((call, e.to_string()));
                        }
                    }
                    None
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn ring_all_reduce(ranks: u32) -> Plan {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap();
    let req = Request::new(
        Collective::AllReduce,
        (0..ranks).collect(),
        4096,
        DType::F32,
    );
    relaycc_route::plan(&topo, &req, &PlanOptions::default())
        .unwrap()
        .plan
}

/// A rank whose call differs from its peers' (here its op, with the very same messages, so
/// no byte count gives it away) fails that call on every rank, whichever rank begins it
/// first, and the words name the call, the field and both calls.
#[test]
fn a_mismatched_call_fails_on_every_rank_and_is_named() {
    let plan = ring_all_reduce(3);
    for odd in 0..3u32 {
        let errors = calls_over_flags(&plan, 4, Duration::from_secs(20), |r, call| {
            let op = if r == odd && call == 2 {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            Some(CallDesc::new(
                Collective::AllReduce,
                DType::F32,
                4096,
                op,
                0,
            ))
        });
        for (r, e) in errors.iter().enumerate() {
            let Some((call, words)) = e else {
                panic!("rank {r} saw no error");
            };
            assert_eq!(*call, 2, "rank {r}: {words}");
            assert!(
                words.contains("call #2: the op differs: rank"),
                "rank {r}: {words}"
            );
            assert!(words.contains(&format!("rank {odd} calls all_reduce of f32, op max")));
        }
    }
}

/// A rank that stops calling is named with its last call, and the call every other rank is
/// in, within about one timeout.
#[test]
fn a_rank_that_stops_calling_is_named_with_its_last_call() {
    let plan = ring_all_reduce(4);
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let errors = calls_over_flags(&plan, 3, timeout, |r, call| {
        (r != 3 || call < 1)
            .then(|| CallDesc::new(Collective::AllReduce, DType::F32, 4096, ReduceOp::Sum, 0))
    });
    assert!(start.elapsed() < 4 * timeout, "{:?}", start.elapsed());
    assert!(errors[3].is_none());
    for (r, e) in errors.iter().take(3).enumerate() {
        let Some((call, words)) = e else {
            panic!("rank {r} saw no error");
        };
        assert_eq!(*call, 1, "rank {r}: {words}");
        assert!(
            words.contains("(rank 3 is the one missing: rank "),
            "rank {r}: {words}"
        );
        assert!(
            words.contains(
                " is in call #1 (all_reduce of f32, op sum, count 4096), rank 3's last \
                            call is call #0 (all_reduce of f32, op sum, count 4096))"
            ),
            "rank {r}: {words}"
        );
    }
}

/// A group's rings stay within the budget of each receiver's memory: a ring past it is
/// refused, naming the rank and the budget, and nothing is made; rings to other ranks and
/// rings already made are not affected.
#[test]
fn rings_past_a_receivers_budget_are_refused() {
    let shape = FlagShape::new(2, 100).unwrap();
    let mut table: super::RingTable<u32> = super::RingTable::new(4, shape, 450);
    let mut made = 0;
    for src in [1, 2] {
        table
            .get_or_make(src, 0, || {
                made += 1;
                Ok(src)
            })
            .unwrap();
    }
    let e = table.get_or_make(3, 0, || Ok(3)).unwrap_err().to_string();
    assert!(
        e.contains("rank 0's flag channels would hold 3 rings of 200 bytes"),
        "{e}"
    );
    assert!(e.contains("budget of 450 bytes"), "{e}");
    assert_eq!(*table.get_or_make(2, 0, || Ok(99)).unwrap(), 2);
    assert_eq!(*table.get_or_make(3, 1, || Ok(31)).unwrap(), 31);
    assert!(table.get_or_make(4, 1, || Ok(0)).is_err(), "rank 4 of 4");
    assert_eq!((made, table.rings().count()), (2, 3));
}
