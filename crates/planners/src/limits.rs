//! What one planning call may spend: the ops its builds hold at once ([`MAX_CALL_OPS`], which
//! bounds its memory) and when its builds must stop (the budget's deadline; the budget of a
//! caller that names none, [`DEFAULT_BUDGET`], and the least time builds and simulations get
//! past it, [`LEAST_BUILD_TIME`] and [`LEAST_SIMULATION_GRACE`]). A build charges
//! each op it writes to its call ([`Limit::charge`]) and stops with
//! [`RouteError::OverLimit`] once either limit is passed, so a build is interrupted rather
//! than left to run past the budget or the memory it may take; builds that are thrown away
//! (a staging fit's tries, a template's window once folded) give their ops back
//! ([`refund`]).
//!
//! A build stopped there lets go of what it held on a thread of its own
//! ([`drop_off_thread`]): freeing millions of ops takes longer than the budget leaves.
//!
//! The limit is an argument, as a template's window is: the selection hands each build its
//! [`Limit`], and the build passes it to its builders in [`crate::PlannerContext::limit`] (and to
//! the template's fold and the staging fit), so builds run in parallel ([`crate`]'s
//! channels) share it without any per-thread state. `None` builds without a limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use relaycc_plan::{Result, RouteError};

/// Planning time allowed when the caller names none: a few seconds, so an interactive command
/// answers promptly on any machine while every 8-GPU request plans in full well within it.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(5);

/// Least time a planning call's builds get, whatever the budget: a plan for a few GPUs builds
/// in milliseconds, so a budget of zero still plans them.
pub const LEAST_BUILD_TIME: Duration = Duration::from_secs(1);

/// Least time the simulations that must give a figure (the baseline's, relaycc's most
/// promising candidate's, the tuner's of large baselines) are given once the budget is spent,
/// so that a small budget still returns a plan of relaycc's where one simulates that fast.
pub const LEAST_SIMULATION_GRACE: Duration = Duration::from_secs(1);

/// Most ops the builds of one planning call hold at once: about 400 bytes each at the peak of
/// a call (the plans, their simulator models and proofs: 4.3M ops built for the 64-node
/// rail-optimized all_reduce peaked at 1.73 GB), so 5M ops keep a call under 2 GiB on any
/// topology. Relaycc's candidates hold at most [`CANDIDATE_OPS`] of them, so the baseline,
/// which every call reports, keeps the rest.
pub const MAX_CALL_OPS: u64 = 5_000_000;

/// The share of [`MAX_CALL_OPS`] relaycc's candidates hold at most: NCCL's double binary tree
/// over 512 ranks in full (3.0M ops at 1 GiB) keeps room beside them.
pub const CANDIDATE_OPS: u64 = 1_500_000;

/// Ops between two reads of the clock by a build: a read costs tens of nanoseconds, an op
/// about a microsecond, and a build stops within a few milliseconds of its deadline.
const CLOCK_EVERY_OPS: u64 = 1024;

/// The ops a planning call's builds hold, against [`MAX_CALL_OPS`] (or a smaller cap).
#[derive(Debug)]
pub struct CallOps {
    held: AtomicU64,
    max: u64,
}

impl CallOps {
    /// A call that may hold `max` ops at once.
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(CallOps {
            held: AtomicU64::new(0),
            max,
        })
    }
    /// Ops held now.
    #[cfg(test)]
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

/// The limit one build runs under: its call's ops, and when it must stop.
#[derive(Debug, Clone)]
pub struct Limit {
    /// The call's ops.
    pub ops: Arc<CallOps>,
    /// A share of them this build's kind holds at most (relaycc's candidates'), besides the
    /// call's.
    pub share: Option<Arc<CallOps>>,
    /// When the build stops (`None`: only the ops limit it).
    pub until: Option<Instant>,
    /// What is built, for the error (`the baseline`, `relaycc's candidates`).
    pub what: &'static str,
    /// An earlier stop for a build that grew large ([`LargeBuild`]).
    pub large: Option<LargeBuild>,
}

/// A build that has written `ops` ops or more stops at `at`, before its [`Limit::until`]: a
/// plan of millions of ops finished later could not be proved and simulated within the
/// budget, so the time it would take to finish is spent for nothing.
#[derive(Debug, Clone)]
pub struct LargeBuild {
    /// Ops from which the build counts as large.
    pub ops: u64,
    /// When a large build stops.
    pub at: Instant,
    /// Ops the build has written (every channel of it, charged through clones of one limit).
    pub written: Arc<AtomicU64>,
}

impl Limit {
    /// Charge `ops` new ops to the call: an error once the call holds more than its cap, or,
    /// read every `CLOCK_EVERY_OPS` (1024) ops, once the build's deadline passed.
    ///
    /// # Errors
    /// [`RouteError::OverLimit`] naming which limit was passed.
    pub fn charge(&self, ops: u64) -> Result<()> {
        if ops == 0 {
            return Ok(());
        }
        let before = self.ops.held.fetch_add(ops, Ordering::Relaxed);
        let held = before.saturating_add(ops);
        let over = |pool: &CallOps, held: u64| -> Result<()> {
            if held <= pool.max {
                return Ok(());
            }
            Err(RouteError::OverLimit {
                what: format!(
                    "{} would hold more than {} ops with the rest of this planning call",
                    self.what, pool.max
                ),
                limit: format!(
                    "the {} ops {} may hold in one planning call (of {} in all, about 2 GiB at \
                     most); a smaller request, or fewer GPUs, plans within it",
                    pool.max, self.what, self.ops.max
                ),
            })
        };
        over(&self.ops, held)?;
        if let Some(share) = &self.share {
            let h = share
                .held
                .fetch_add(ops, Ordering::Relaxed)
                .saturating_add(ops);
            over(share, h)?;
        }
        let crossed = before / CLOCK_EVERY_OPS != held / CLOCK_EVERY_OPS;
        if let Some(large) = &self.large {
            let written = large
                .written
                .fetch_add(ops, Ordering::Relaxed)
                .saturating_add(ops);
            if crossed && written >= large.ops && Instant::now() >= large.at {
                return Err(RouteError::OverLimit {
                    what: format!(
                        "{} held {written} ops at the budget's end, too many to prove and time \
                         within it",
                        self.what
                    ),
                    limit: "the planning budget; a larger --budget builds it".into(),
                });
            }
        }
        if crossed && self.until.is_some_and(|u| Instant::now() >= u) {
            return Err(RouteError::OverLimit {
                what: format!(
                    "{} was still being built at its deadline ({held} ops held by the call)",
                    self.what
                ),
                limit: "the planning budget; a larger --budget builds it".into(),
            });
        }
        Ok(())
    }
    /// Give back `ops` this build has let go of (a plan thrown away).
    pub fn refund(&self, ops: u64) {
        for pool in std::iter::once(&self.ops).chain(&self.share) {
            let _ = pool
                .held
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                    Some(h.saturating_sub(ops))
                });
        }
    }
    /// Whether the build may go on at its `i`-th step of a long pass that writes no op (a
    /// template's fold, laying out NCCL's rings over every node of a cluster): an error past
    /// its deadline, the clock read every `CLOCK_EVERY_OPS` (1024) steps, saying the build was
    /// still `doing` (a past participle, "folded") at its deadline.
    ///
    /// # Errors
    /// [`RouteError::OverLimit`] once the build's deadline passed.
    pub fn check_deadline(&self, i: usize, doing: &str) -> Result<()> {
        if !(i as u64).is_multiple_of(CLOCK_EVERY_OPS) {
            return Ok(());
        }
        self.check_deadline_now(doing)
    }
    /// [`Limit::check_deadline`] reading the clock now, for a pass whose steps cost
    /// milliseconds each (a path search through a rack's switches), where a read every
    /// `CLOCK_EVERY_OPS` steps would overrun the deadline by seconds.
    ///
    /// # Errors
    /// [`RouteError::OverLimit`] once the build's deadline passed.
    pub fn check_deadline_now(&self, doing: &str) -> Result<()> {
        if self.until.is_none_or(|u| Instant::now() < u) {
            return Ok(());
        }
        Err(RouteError::OverLimit {
            what: format!("{} was still being {doing} at its deadline", self.what),
            limit: "the planning budget; a larger --budget builds it".into(),
        })
    }
}

/// [`Limit::charge`] where a build has a limit; nothing without one.
///
/// # Errors
/// [`RouteError::OverLimit`] once a limit is passed.
pub fn charge(limit: Option<&Limit>, ops: u64) -> Result<()> {
    limit.map_or(Ok(()), |l| l.charge(ops))
}

/// [`Limit::refund`] where a build has a limit.
pub fn refund(limit: Option<&Limit>, ops: u64) {
    if let Some(l) = limit {
        l.refund(ops);
    }
}

/// [`Limit::check_deadline`] where a build has a limit.
///
/// # Errors
/// [`RouteError::OverLimit`] once the build's deadline passed.
pub fn check_deadline(limit: Option<&Limit>, i: usize, doing: &str) -> Result<()> {
    limit.map_or(Ok(()), |l| l.check_deadline(i, doing))
}

/// [`Limit::check_deadline_now`] where a build has a limit.
///
/// # Errors
/// [`RouteError::OverLimit`] once the build's deadline passed.
pub fn check_deadline_now(limit: Option<&Limit>, doing: &str) -> Result<()> {
    limit.map_or(Ok(()), |l| l.check_deadline_now(doing))
}

/// Large values [`drop_off_thread`] queues for the dropping thread at most; past it, they are
/// dropped where they are (the queue bounds the memory waiting to be freed).
const QUEUED_DROPS: usize = 64;

/// The queue of the thread that drops large values, started on first use; `None` where the
/// thread could not be started.
static DROPS: OnceLock<Option<SyncSender<Box<dyn Send>>>> = OnceLock::new();

/// Drop `value` on a thread of the library's own, so that the call that let go of it
/// returns now. A large build freed where it stops (millions of small allocations: the
/// baseline's dependency tracks and connection cache over 512 GPUs take seconds to free) would
/// spend the time past its deadline that the budget promises the caller. At most
/// `QUEUED_DROPS` values wait; past that, and where the thread cannot be started, `value`
/// is dropped here.
pub fn drop_off_thread<T: Send + 'static>(value: T) {
    let queue = DROPS.get_or_init(|| {
        let (tx, rx) = sync_channel::<Box<dyn Send>>(QUEUED_DROPS);
        std::thread::Builder::new()
            .name("relaycc-drops".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = queue {
        // A full queue or a finished thread hands the value back, dropped here.
        drop(tx.try_send(Box::new(value)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_build_stops_at_its_earlier_deadline_a_small_one_does_not() {
        let large = |ops| {
            Some(LargeBuild {
                ops,
                at: Instant::now(),
                written: Arc::default(),
            })
        };
        let limit = |large| Limit {
            ops: CallOps::new(u64::MAX),
            share: None,
            until: None,
            what: "the baseline",
            large,
        };
        let small = limit(large(1_000_000));
        for _ in 0..100 {
            small.charge(1000).expect("below the large build's ops");
        }
        let big = limit(large(10_000));
        let stopped = (0..100).find_map(|i| big.charge(1000).err().map(|e| (i, e)));
        match stopped {
            Some((i, RouteError::OverLimit { what, .. })) => {
                assert!((9..=11).contains(&i), "stopped after {i} charges");
                assert!(what.contains("at the budget's end"), "{what}");
            }
            other => panic!("a large build past its deadline went on: {other:?}"),
        }
    }

    #[test]
    fn a_value_dropped_off_thread_is_dropped_on_another_thread() {
        struct Tell(std::sync::mpsc::Sender<std::thread::ThreadId>);
        impl Drop for Tell {
            fn drop(&mut self) {
                let _ = self.0.send(std::thread::current().id());
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        drop_off_thread(Tell(tx));
        let dropped_on = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("dropped within 30 s");
        assert_ne!(dropped_on, std::thread::current().id());
    }

    #[test]
    fn a_build_stops_at_the_call_cap_and_refunds_free_ops() {
        let ops = CallOps::new(2000);
        let l = Limit {
            ops: Arc::clone(&ops),
            share: None,
            until: None,
            what: "the test",
            large: None,
        };
        l.charge(1500).unwrap();
        let e = l.charge(600).unwrap_err().to_string();
        assert!(e.contains("more than 2000 ops"), "{e}");
        l.refund(2100);
        assert_eq!(ops.held(), 0);
        l.charge(2000).unwrap();
        // A build without a limit charges nothing.
        charge(None, 1 << 40).unwrap();
        assert_eq!(ops.held(), 2000);
    }

    /// A planner's build runs under its call's cap, in parallel channels too: NCCL's rings
    /// over a 2-node cluster stop once they pass it.
    #[test]
    fn a_planners_build_stops_at_the_call_cap() {
        let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
        let req = relaycc_plan::Request::new(
            relaycc_plan::Collective::AllReduce,
            (0..16).collect(),
            1 << 20,
            relaycc_plan::DType::F32,
        );
        let whole = crate::baseline_plan(&topo, &req).unwrap();
        let cap = whole.ops.len() as u64 / 2;
        let ops = CallOps::new(cap);
        let l = Limit {
            ops: Arc::clone(&ops),
            share: None,
            until: None,
            what: "the baseline",
            large: None,
        };
        let e = crate::BaselineOptions {
            limit: Some(&l),
            ..Default::default()
        }
        .plan(&topo, &req)
        .unwrap_err();
        assert!(matches!(e, RouteError::OverLimit { .. }), "{e}");
        assert!(
            e.to_string().contains(&format!("more than {cap} ops")),
            "{e}"
        );
    }

    #[test]
    fn a_build_stops_at_its_deadline_within_a_thousand_ops() {
        let l = Limit {
            ops: CallOps::new(u64::MAX),
            share: None,
            until: Some(Instant::now()),
            what: "the test",
            large: None,
        };
        let mut written = 0;
        let e = loop {
            match l.charge(1) {
                Ok(()) => written += 1,
                Err(e) => break e.to_string(),
            }
        };
        assert!(written < CLOCK_EVERY_OPS, "{written}");
        assert!(e.contains("deadline") && e.contains("--budget"), "{e}");
    }
}
