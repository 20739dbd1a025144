//! The host backend's lanes: a launch's resolved commands per lane ([`Task`]), run by a
//! bounded pool of worker threads ([`LanePool`]).
//!
//! A launch may have thousands of lanes (one per rank of a 1,024-rank communicator), and a
//! lane is only an in-order list of commands, so lanes do not get threads of their own: the
//! pool has at most one worker per core ([`LanePool::new`]), started on demand and kept
//! between launches. A worker takes a ready lane and runs its commands until the lane ends
//! or reaches a `Wait` on an event not yet recorded; there the lane *parks* (its position is
//! kept beside the event) and the worker takes another ready lane. The `Record` of the event
//! puts its parked lanes back in the ready queue. A waiting lane therefore never holds a
//! thread, which is what makes a bounded pool safe: the argument of `exec/README.md` (follow
//! any waiting lane to the op it waits for; the chain ends at a lane that can run) needs
//! only that a lane that can run gets a worker, and every worker not running a lane takes
//! one from the queue.
//!
//! A panic in a lane fails the launch: the parked lanes are finished at once (nobody will
//! record their events), the running and queued ones stop at their next command, and the
//! launch ends with the error once every lane has stopped.
//!
//! `unsafe`: the copies and reductions of [`LaunchState::run_lane`] write through addresses
//! `submit` resolved and checked (see its safety comments).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use relaycc_route::{DType, ReduceOp};

use super::host::{STREAM_MIN_BYTES, store_fence, stream_copy};
use super::host_reduce;

/// Lock a mutex, ignoring poisoning: the data behind every lock here stays consistent even if
/// a holder panicked (each critical section is a single update).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One resolved command of a lane.
#[derive(Debug, Clone, Copy)]
pub(super) enum Task {
    /// Copy `bytes` bytes from `src` to `dst`.
    Copy {
        src: usize,
        dst: usize,
        bytes: usize,
        /// Write with non-temporal stores ([`stream_copy`]): the destination is a caller's
        /// lent memory, which the launch does not read back soon.
        stream: bool,
    },
    /// `dst = op(srcs...)` over `len` elements.
    Reduce {
        /// Source addresses: `LaunchState::srcs[first..first + count]`.
        first: usize,
        count: usize,
        dst: usize,
        len: usize,
        dtype: DType,
        op: ReduceOp,
        divisor: Option<u32>,
        /// Further destinations written with the result, block by block
        /// (`LaunchState::outs[outs..outs + fan]`, see `host_peephole::fuse_fan_out`);
        /// 0: none.
        outs: usize,
        fan: usize,
    },
    /// Set event `e` once the lane's earlier commands are done.
    Record(usize),
    /// Hold the lane's later commands until event `e` is set.
    Wait(usize),
}

/// Whether a fused reduction of `len` elements streams its own destination: it is a rank's
/// output (the shared-memory plans reduce a slice into its owner's output and copy it out),
/// which the launch does not read again soon, except through the fused copies.
pub(super) fn fan_stream(len: usize, dtype: DType) -> bool {
    len as u64 * dtype.size() >= STREAM_MIN_BYTES
}

/// Events of a launch and the lanes parked on them, behind one lock: a lane decides to park
/// and a `Record` sets its event under this lock, so no wake-up is lost.
#[derive(Debug)]
struct Events {
    set: Vec<bool>,
    /// Per event, the lanes parked on it and the task each resumes at.
    parked: Vec<Vec<(usize, usize)>>,
    /// The launch failed: nothing parks any more, and what was parked is finished.
    failed: bool,
}

/// How a stretch of a lane ended.
enum LaneEnd {
    /// Every command ran, or the launch failed: the lane is finished.
    Done,
    /// The lane waits for an event; its `Record` puts it back in the queue.
    Parked,
}

/// A launch in flight, shared by the workers that run its lanes.
#[derive(Debug)]
pub(super) struct LaunchState {
    lanes: Vec<Vec<Task>>,
    srcs: Vec<usize>,
    /// Destinations of fused reductions: address and whether to stream the stores.
    outs: Vec<(usize, bool)>,
    events: Mutex<Events>,
    /// Set with `Events::failed`, read without the lock before each command.
    failed: AtomicBool,
    /// Lanes not yet finished, and the first error.
    status: Mutex<(usize, Option<String>)>,
    cv: Condvar,
}

/// Run a copy or reduction task (a `Record` or `Wait` does nothing here): the data half of a
/// lane, shared by the pool's lanes and by [`run_here`].
///
/// # Safety
/// The task's addresses (and its sources in `srcs`, its fused destinations in `outs`) were
/// resolved and checked by `validate::resolve` against live memory that nothing else touches
/// while the task runs: both copy ranges inside live blocks (a streamed copy only where they
/// do not overlap); reduction operands inside live blocks, aligned for the type, the
/// destination equal to or apart from each source; fused destinations apart from every
/// source, from the destination and from each other (`fuse_fan_out`).
unsafe fn run_data_task(task: &Task, srcs: &[usize], outs: &[(usize, bool)]) {
    match *task {
        Task::Copy {
            src,
            dst,
            bytes,
            stream,
        } => {
            // SAFETY: the caller's contract; `copy` allows overlap.
            unsafe {
                if stream {
                    stream_copy(src as *const u8, dst as *mut u8, bytes);
                } else {
                    std::ptr::copy(src as *const u8, dst as *mut u8, bytes);
                }
            }
        }
        Task::Reduce {
            first,
            count,
            dst,
            len,
            dtype,
            op,
            divisor,
            outs: at,
            fan,
        } => {
            let srcs = &srcs[first..first + count];
            // SAFETY: `usize` and `*const u8` have the same layout; the addresses were
            // produced from pointers into live blocks.
            let ptrs: &[*const u8] = unsafe {
                std::slice::from_raw_parts(srcs.as_ptr() as *const *const u8, srcs.len())
            };
            if fan == 0 {
                // SAFETY: the caller's contract.
                unsafe { host_reduce::reduce(dtype, op, ptrs, dst as *mut u8, len, divisor) };
            } else {
                // SAFETY: the caller's contract, fused destinations included.
                unsafe {
                    host_reduce::reduce_fan_out(
                        dtype,
                        op,
                        ptrs,
                        (dst, fan_stream(len, dtype)),
                        &outs[at..at + fan],
                        len,
                        divisor,
                    )
                };
            }
        }
        Task::Record(_) | Task::Wait(_) => {}
    }
}

/// Run `lanes` to their end on the calling thread, lane by lane: a lane runs until it ends
/// or reaches a `Wait` on an event not yet recorded, then the next lane with work runs. This
/// is how one rank runs its own lanes in a per-rank call (`rank/direct.rs`), on its own
/// thread instead of the pool. Every event waited for must be recorded by one of `lanes`;
/// where none can go on, the run stops with an error instead of waiting forever.
///
/// # Safety
/// As [`run_data_task`], for every task of `lanes`.
pub(super) unsafe fn run_here(
    lanes: &[Vec<Task>],
    srcs: &[usize],
    outs: &[(usize, bool)],
    events: &mut [bool],
) -> Result<(), String> {
    let mut at = vec![0usize; lanes.len()];
    loop {
        let mut moved = false;
        for (l, tasks) in lanes.iter().enumerate() {
            while let Some(task) = tasks.get(at[l]) {
                match *task {
                    Task::Record(e) => {
                        store_fence();
                        if let Some(s) = events.get_mut(e) {
                            *s = true;
                        }
                    }
                    Task::Wait(e) if !events.get(e).copied().unwrap_or(false) => break,
                    Task::Wait(_) => {}
                    // SAFETY: the caller's contract.
                    _ => unsafe { run_data_task(task, srcs, outs) },
                }
                at[l] += 1;
                moved = true;
            }
        }
        if at.iter().zip(lanes).all(|(a, t)| *a == t.len()) {
            return Ok(());
        }
        if !moved {
            return Err("every lane left waits for an event none of them records".into());
        }
    }
}

impl LaunchState {
    /// A launch of `lanes` (tasks resolved by `submit`) with `events` events; `busy` lanes
    /// have tasks.
    pub(super) fn new(
        lanes: Vec<Vec<Task>>,
        srcs: Vec<usize>,
        outs: Vec<(usize, bool)>,
        events: usize,
        busy: usize,
    ) -> Self {
        LaunchState {
            lanes,
            srcs,
            outs,
            events: Mutex::new(Events {
                set: vec![false; events],
                parked: vec![Vec::new(); events],
                failed: false,
            }),
            failed: AtomicBool::new(false),
            status: Mutex::new((busy, None)),
            cv: Condvar::new(),
        }
    }

    /// Block until every lane has finished; the launch's error, if any.
    pub(super) fn wait_done(&self) -> Option<String> {
        let mut g = lock(&self.status);
        while g.0 > 0 {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.1.take()
    }

    /// Run lane `lane` from task `from` until it ends or parks.
    fn run_lane(self: &Arc<Self>, lane: usize, from: usize, pool: &PoolShared) -> LaneEnd {
        let tasks = &self.lanes[lane];
        for (at, task) in tasks.iter().enumerate().skip(from) {
            if self.failed.load(Ordering::Acquire) {
                return LaneEnd::Done;
            }
            match *task {
                Task::Copy { .. } | Task::Reduce { .. } => {
                    // SAFETY: `submit` resolved and checked every address of the launch (see
                    // `run_data_task`), and its caller promised no other lane touches them
                    // concurrently.
                    unsafe { run_data_task(task, &self.srcs, &self.outs) }
                }
                Task::Record(e) => {
                    // The lane's streamed stores are visible to whoever sees the event.
                    store_fence();
                    let woken = {
                        let mut ev = lock(&self.events);
                        ev.set[e] = true;
                        std::mem::take(&mut ev.parked[e])
                    };
                    if !woken.is_empty() {
                        pool.push(woken.into_iter().map(|(l, at)| (self.clone(), l, at)));
                    }
                }
                Task::Wait(e) => {
                    let mut ev = lock(&self.events);
                    if ev.failed {
                        return LaneEnd::Done;
                    }
                    if !ev.set[e] {
                        ev.parked[e].push((lane, at + 1));
                        return LaneEnd::Parked;
                    }
                }
            }
        }
        LaneEnd::Done
    }

    /// Lane finished; with `panic`, the launch fails: the parked lanes finish with it.
    fn finish_lane(&self, panic: Option<String>) {
        // The lane's streamed stores are visible before its end is.
        store_fence();
        let mut ended = 1;
        if panic.is_some() {
            let mut ev = lock(&self.events);
            ev.failed = true;
            self.failed.store(true, Ordering::Release);
            for p in &mut ev.parked {
                ended += p.len();
                p.clear();
            }
        }
        let mut g = lock(&self.status);
        if let Some(p) = panic {
            g.1.get_or_insert(p);
        }
        g.0 = g.0.saturating_sub(ended);
        self.cv.notify_all();
    }
}

/// A lane to run: its launch, the lane, the task it starts at.
type Job = (Arc<LaunchState>, usize, usize);

/// The queue the workers share.
#[derive(Debug, Default)]
struct Queue {
    ready: VecDeque<Job>,
    shutdown: bool,
}

/// What the workers hold: the queue and its condition variable.
#[derive(Debug, Default)]
struct PoolShared {
    queue: Mutex<Queue>,
    cv: Condvar,
}

impl PoolShared {
    fn push(&self, jobs: impl IntoIterator<Item = Job>) {
        let mut q = lock(&self.queue);
        let before = q.ready.len();
        q.ready.extend(jobs);
        let added = q.ready.len() - before;
        drop(q);
        if added == 1 {
            self.cv.notify_one();
        } else if added > 1 {
            self.cv.notify_all();
        }
    }

    /// The next lane to run; `None` once the pool shuts down.
    fn next(&self) -> Option<Job> {
        let mut q = lock(&self.queue);
        loop {
            if let Some(j) = q.ready.pop_front() {
                return Some(j);
            }
            if q.shutdown {
                return None;
            }
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn work(&self) {
        while let Some((launch, lane, from)) = self.next() {
            let ran = catch_unwind(AssertUnwindSafe(|| launch.run_lane(lane, from, self)));
            match ran {
                Ok(LaneEnd::Parked) => {}
                Ok(LaneEnd::Done) => launch.finish_lane(None),
                Err(_) => launch.finish_lane(Some(format!("lane {lane} panicked"))),
            }
        }
    }
}

/// The worker threads of a host backend (see the module docs).
#[derive(Debug)]
pub(super) struct LanePool {
    shared: Arc<PoolShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Most workers started.
    max_threads: usize,
}

impl LanePool {
    /// A pool of at most `max_threads` workers (at least 1), none started yet.
    pub(super) fn new(max_threads: usize) -> Self {
        LanePool {
            shared: Arc::default(),
            threads: Mutex::new(Vec::new()),
            max_threads: max_threads.max(1),
        }
    }

    /// Most workers this pool starts.
    pub(super) fn max_threads(&self) -> usize {
        self.max_threads
    }

    /// Workers started.
    pub(super) fn threads(&self) -> usize {
        lock(&self.threads).len()
    }

    /// Start workers until `lanes` lanes can run at once or the pool is full. A worker that
    /// cannot be started is an error only when none runs: the lanes then share fewer.
    pub(super) fn ensure(&self, lanes: usize) -> Result<(), String> {
        let want = lanes.min(self.max_threads);
        let mut threads = lock(&self.threads);
        while threads.len() < want {
            let shared = self.shared.clone();
            let started = std::thread::Builder::new()
                .name(format!("relaycc-lanes-{}", threads.len()))
                .spawn(move || shared.work());
            match started {
                Ok(h) => threads.push(h),
                Err(e) if threads.is_empty() => {
                    return Err(format!("cannot start a lane worker thread: {e}"));
                }
                // Fewer workers than wanted still run every lane.
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// Queue the lanes `busy` of `launch`, each from its first task.
    pub(super) fn start(&self, launch: &Arc<LaunchState>, busy: &[usize]) {
        self.shared
            .push(busy.iter().map(|&l| (launch.clone(), l, 0)));
    }
}

impl Drop for LanePool {
    fn drop(&mut self) {
        lock(&self.shared.queue).shutdown = true;
        self.shared.cv.notify_all();
        for h in std::mem::take(&mut *lock(&self.threads)) {
            // A worker that panicked outside a lane has nothing left to report.
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lanes that each wait for the previous lane's event, queued last lane first, all run
    /// on one worker: every waiting lane parks and gives the thread back, so the chain
    /// completes in order.
    #[test]
    fn one_worker_runs_a_chain_of_waiting_lanes() {
        let n = 64;
        let mut data = vec![0u64; n];
        data[0] = 42;
        let base = data.as_mut_ptr() as usize;
        // Lane l waits for event l - 1, copies element l - 1 into element l, records event l.
        let lanes: Vec<Vec<Task>> = (0..n)
            .map(|l| {
                let copy = |from: usize| Task::Copy {
                    src: base + 8 * from,
                    dst: base + 8 * l,
                    bytes: 8,
                    stream: false,
                };
                if l == 0 {
                    vec![Task::Record(0)]
                } else {
                    vec![Task::Wait(l - 1), copy(l - 1), Task::Record(l)]
                }
            })
            .collect();
        let pool = LanePool::new(1);
        pool.ensure(n).expect("a worker");
        assert_eq!(pool.threads(), 1);
        let launch = Arc::new(LaunchState::new(lanes, Vec::new(), Vec::new(), n, n));
        let busy: Vec<usize> = (0..n).rev().collect();
        pool.start(&launch, &busy);
        assert_eq!(launch.wait_done(), None);
        assert!(data.iter().all(|&v| v == 42), "{data:?}");
    }

    /// A lane that fails ends the launch: the lanes parked on events nobody will record
    /// finish with it, and the error is the launch's.
    #[test]
    fn a_failed_launch_finishes_its_parked_lanes() {
        // Lane 0 waits for event 0, which lane 1 would record after a copy that panics in a
        // reduction of an impossible slice: simulate the panic with a reduction whose source
        // index is out of range (the tasks' own indexing panics, inside the worker).
        let bad = Task::Reduce {
            first: 5,
            count: 1,
            dst: 0,
            len: 0,
            dtype: DType::F32,
            op: ReduceOp::Sum,
            divisor: None,
            outs: 0,
            fan: 0,
        };
        let lanes = vec![vec![Task::Wait(0)], vec![bad, Task::Record(0)]];
        let pool = LanePool::new(2);
        pool.ensure(2).expect("workers");
        let launch = Arc::new(LaunchState::new(lanes, Vec::new(), Vec::new(), 1, 2));
        pool.start(&launch, &[0, 1]);
        let e = launch.wait_done().expect("the launch failed");
        assert!(e.contains("lane 1 panicked"), "{e}");
    }
}
