//! MPI tests of the bounded plan caches of `MpiCommunicator` and its GPU ranks; run under
//! mpirun by `scripts/test-mpi`:
//!
//! ```text
//! mpirun -n 4 -x RELAYCC_RANKS_PER_NODE=2 mpi_cache
//! ```
//!
//! - Typed collectives under a limit of 4 shapes: 40 all_to_all_v calls, each with a new
//!   random count matrix (the same on every rank), between all_reduce calls cycling through
//!   12 sizes (so evicted shapes come back and are planned again): after every call the
//!   cache holds at most 4 shapes, and every result is exact.
//! - Count binding: 40 all_to_all_v calls and 40 all_gather_v calls (out of place and in
//!   place), each with new random counts, run on capacity plans: the cache grows by at most
//!   one shape per power-of-two capacity the counts reach (two or three), where one plan per
//!   count matrix would add 40, and every result is exact.
//! - reduce_scatter_v: 30 calls with new counts on the typed host calls and on a GPU rank
//!   over the host backend: exact sums, at most one shape per capacity on each; counts that
//!   differ on rank 0 fail on every rank.
//! - A byte limit of 1 byte: every new shape evicts the others, the one a call needs stays,
//!   results stay exact.
//! - Limits that differ on one rank: `CallMismatch` on every rank, the limits unchanged.
//! - The GPU ranks' protocol over the host backend (`MpiGpu::host`): collective shapes and
//!   send/recv shapes bounded (a pair whose sender's cache evicted the pair's shape while the
//!   receiver's kept it still moves the right bytes: the pair agrees on who must prepare),
//!   results exact; and count binding there: 40
//!   all_to_all_v and 40 all_gather_v calls with new counts add at most one shape per
//!   capacity and collective, every result exact.
//!
//! Rank 0 prints `PASS <name>` / `FAIL <name>` per check and `<N> passed, <F> failed`.

mod mpi_common;

use mpi_common::{Report, mpi_err};

use relaycc_collectives::mpi::{MpiCommunicator, MpiError, MpiGpu};
use relaycc_collectives::{Collectives, CollectivesError, PlanCacheLimits, ReduceOp};

/// A xorshift generator: every rank draws the same numbers from the same seed.
struct Draw(u64);

impl Draw {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below.max(1)
    }
}

/// Element `i` of what rank `s` sends: its rank and index, exact in u32.
fn sent(s: usize, i: usize) -> u32 {
    (s as u32) << 24 | i as u32
}

/// A new count matrix (row: sender) of counts below 300.
fn matrix(draw: &mut Draw, n: usize) -> Vec<Vec<usize>> {
    (0..n)
        .map(|_| (0..n).map(|_| draw.next(300) as usize).collect())
        .collect()
}

/// Run all_to_all_v of `m` through `call` on rank `me` and compare with the exact result.
fn all_to_all_v_exact(
    me: usize,
    m: &[Vec<usize>],
    call: impl FnOnce(&[u32], &[usize], &mut [u32], &[usize]) -> bool,
) -> bool {
    let n = m.len();
    let sends = &m[me];
    let recvs: Vec<usize> = (0..n).map(|s| m[s][me]).collect();
    let input: Vec<u32> = (0..sends.iter().sum()).map(|i| sent(me, i)).collect();
    let mut output = vec![0u32; recvs.iter().sum()];
    let ran = call(&input, sends, &mut output, &recvs);
    let want: Vec<u32> = (0..n)
        .flat_map(|s| {
            let at: usize = m[s][..me].iter().sum();
            (at..at + m[s][me]).map(move |i| sent(s, i))
        })
        .collect();
    ran && output == want
}

/// The exact all_reduce sum of `len` elements over `n` ranks whose rank `r` holds `r + i`.
fn all_reduce_exact(
    me: usize,
    n: usize,
    len: usize,
    call: impl FnOnce(&[i64], &mut [i64]) -> bool,
) -> bool {
    let input: Vec<i64> = (0..len).map(|i| (me + i) as i64).collect();
    let mut output = vec![0i64; len];
    let ran = call(&input, &mut output);
    let ranks = n as i64;
    ran && output
        .iter()
        .enumerate()
        .all(|(i, v)| *v == ranks * i as i64 + ranks * (ranks - 1) / 2)
}

fn limits(max_plans: usize, max_scratch_bytes: u64) -> PlanCacheLimits {
    PlanCacheLimits {
        max_plans,
        max_scratch_bytes,
    }
}

/// The 12 all_reduce sizes the tests cycle through.
const SIZES: [usize; 12] = [
    17, 100, 333, 1000, 1024, 2047, 4096, 5000, 9999, 12_345, 40_000, 70_001,
];

fn typed_count_limit(mut comm: &MpiCommunicator, rep: &mut Report<'_>) {
    let (me, n) = (comm.rank(), comm.ranks());
    let set = comm.set_plan_cache_limits(limits(4, u64::MAX));
    rep.check(
        "limits agreed",
        set.is_ok() && comm.plan_cache_limits().max_plans == 4,
    );
    let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
    let (mut exact, mut bounded) = (true, true);
    for call in 0..40 {
        let m = matrix(&mut draw, n);
        exact &= all_to_all_v_exact(me, &m, |i, s, o, r| {
            let got = comm.all_to_all_v(i, s, o, r);
            if let Err(e) = &got {
                eprintln!("rank {me}: all_to_all_v {call}: {e}");
            }
            got.is_ok()
        });
        bounded &= comm.cached_calls() <= 4;
        let len = SIZES[call % SIZES.len()];
        exact &= all_reduce_exact(me, n, len, |i, o| {
            comm.all_reduce(i, o, ReduceOp::Sum).is_ok()
        });
        bounded &= comm.cached_calls() <= 4;
    }
    rep.check(
        "typed: 40 new count matrices and 12 sizes give exact results",
        exact,
    );
    rep.check(
        "typed: the cache stays within 4 shapes",
        bounded && comm.cached_calls() == 4,
    );
}

fn typed_count_binding(mut comm: &MpiCommunicator, rep: &mut Report<'_>) {
    let (me, n) = (comm.rank(), comm.ranks());
    let set = comm.set_plan_cache_limits(limits(64, u64::MAX));
    let mut draw = Draw(0x2545_f491_4f6c_dd1d);
    let before = comm.cached_calls();
    let mut exact = set.is_ok();
    // The power-of-two capacities the calls' largest counts reach: one plan each.
    let capacity = |largest: usize| largest.max(1).next_power_of_two();
    let (mut a2av_caps, mut agv_caps) = (Vec::new(), Vec::new());
    for call in 0..40 {
        let m = matrix(&mut draw, n);
        a2av_caps.push(capacity(m.iter().flatten().copied().max().unwrap_or(0)));
        exact &= all_to_all_v_exact(me, &m, |i, s, o, r| {
            let got = comm.all_to_all_v(i, s, o, r);
            if let Err(e) = &got {
                eprintln!("rank {me}: bound all_to_all_v {call}: {e}");
            }
            got.is_ok()
        });
    }
    let after_a2av = comm.cached_calls();
    for call in 0..40 {
        let counts: Vec<usize> = (0..n).map(|_| draw.next(300) as usize).collect();
        agv_caps.push(capacity(counts.iter().copied().max().unwrap_or(0)));
        let want: Vec<u32> = (0..n)
            .flat_map(|s| (0..counts[s]).map(move |i| sent(s, i)))
            .collect();
        let mine: Vec<u32> = (0..counts[me]).map(|i| sent(me, i)).collect();
        let mut out = vec![0u32; want.len()];
        let r = comm.all_gather_v(&mine, &mut out, &counts);
        let mut in_place = vec![0u32; want.len()];
        let at: usize = counts[..me].iter().sum();
        in_place[at..at + mine.len()].copy_from_slice(&mine);
        let r2 = comm.all_gather_v_in_place(&mut in_place, &counts);
        if let (Err(e), _) | (_, Err(e)) = (&r, &r2) {
            eprintln!("rank {me}: bound all_gather_v {call}: {e}");
        }
        exact &= r.is_ok() && r2.is_ok() && out == want && in_place == want;
    }
    let after = comm.cached_calls();
    rep.check(
        "typed: 40 new count matrices and 40 new count lists give exact results",
        exact,
    );
    for caps in [&mut a2av_caps, &mut agv_caps] {
        caps.sort_unstable();
        caps.dedup();
    }
    rep.check(
        &format!(
            "typed: new counts reuse capacity plans (shapes {before} -> {after_a2av} -> {after}, \
             capacities {a2av_caps:?} and {agv_caps:?})"
        ),
        after_a2av <= before + a2av_caps.len() && after <= after_a2av + agv_caps.len(),
    );
}

fn typed_byte_limit(mut comm: &MpiCommunicator, rep: &mut Report<'_>) {
    let (me, n) = (comm.rank(), comm.ranks());
    let set = comm.set_plan_cache_limits(limits(64, 1));
    let mut ok = set.is_ok() && comm.cached_calls() <= 1;
    for len in SIZES.iter().chain(&SIZES[..4]) {
        ok &= all_reduce_exact(me, n, *len, |i, o| {
            comm.all_reduce(i, o, ReduceOp::Sum).is_ok()
        });
        ok &= comm.cached_calls() == 1;
    }
    rep.check("typed: a 1-byte limit keeps the one shape a call needs", ok);
}

fn typed_limits_mismatch(comm: &MpiCommunicator, rep: &mut Report<'_>) {
    let (me, n) = (comm.rank() as u32, comm.ranks() as u32);
    let before = comm.plan_cache_limits();
    let plans = if me == n - 1 { 9 } else { 8 };
    let got = comm.set_plan_cache_limits(limits(plans, u64::MAX));
    let named =
        matches!(&got, Err(MpiError::CallMismatch(m)) if m.contains(&format!("rank {}", n - 1)));
    if !named {
        eprintln!("rank {me}: mismatched limits: {got:?}");
    }
    rep.check(
        "typed: limits that differ on one rank are CallMismatch everywhere, unchanged",
        named && comm.plan_cache_limits() == before,
    );
}

/// A GPU rank on the host backend (`MpiGpu::host`), or a failed check `what` and `None`.
fn host_gpu<'c>(comm: &'c MpiCommunicator, rep: &mut Report<'_>, what: &str) -> Option<MpiGpu<'c>> {
    match MpiGpu::host(comm) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("rank {}: host-backed rank: {e}", comm.rank());
            rep.check(what, false);
            None
        }
    }
}

fn gpu_ranks(comm: &MpiCommunicator, rep: &mut Report<'_>) {
    let (me, n) = (comm.rank(), comm.ranks());
    let set = comm.set_plan_cache_limits(limits(3, u64::MAX));
    let Some(mut gpu) = host_gpu(comm, rep, "GPU ranks: host-backed rank made") else {
        return;
    };
    let mut draw = Draw(0x2545_f491_4f6c_dd1d);
    let (mut exact, mut bounded) = (set.is_ok(), true);
    for call in 0..24 {
        let m = matrix(&mut draw, n);
        exact &= all_to_all_v_exact(me, &m, |i, s, o, r| {
            gpu.on_host().all_to_all_v(i, s, o, r).is_ok()
        });
        let len = SIZES[call % SIZES.len()];
        exact &= all_reduce_exact(me, n, len, |i, o| {
            gpu.on_host().all_reduce(i, o, ReduceOp::Sum).is_ok()
        });
        bounded &= gpu.cached_calls() <= 3;
    }
    rep.check(
        "GPU ranks: new matrices and sizes give exact results",
        exact,
    );
    rep.check(
        "GPU ranks: the cache stays within 3 shapes",
        bounded && gpu.cached_calls() == 3,
    );
    if n < 3 {
        return;
    }
    let set = comm.set_plan_cache_limits(limits(2, u64::MAX));
    let data = |count: usize| -> Vec<f32> { (0..count).map(|i| i as f32).collect() };
    let mut ok = set.is_ok();
    for (peer, count) in [(1usize, 1000usize), (2, 2000), (2, 3000), (1, 1000)] {
        let ran = match me {
            0 => gpu.on_host().send(&data(count)[..], peer),
            r if r == peer => {
                let mut got = vec![0f32; count];
                gpu.on_host().recv(&mut got[..], 0).and_then(|()| {
                    if got == data(count) {
                        Ok(())
                    } else {
                        Err(CollectivesError::Setup("wrong bytes".into()))
                    }
                })
            }
            _ => Ok(()),
        };
        if let Err(e) = &ran {
            eprintln!("rank {me}: GPU send/recv of {count} from 0 to {peer}: {e}");
        }
        ok &= ran.is_ok() && gpu.cached_pairs() <= 2;
    }
    rep.check(
        "GPU ranks: a pair one side evicted still moves the right bytes",
        ok,
    );
}

/// Count binding on the GPU ranks' protocol over the host backend: all_to_all_v and
/// all_gather_v (out of place and in place) with new counts every call run capacity plans, so
/// the cache grows by at most one shape per power-of-two capacity, and every result is exact.
fn gpu_count_binding(comm: &MpiCommunicator, rep: &mut Report<'_>) {
    let (me, n) = (comm.rank(), comm.ranks());
    let set = comm.set_plan_cache_limits(limits(64, u64::MAX));
    let Some(mut gpu) = host_gpu(
        comm,
        rep,
        "GPU ranks: host-backed rank made for count binding",
    ) else {
        return;
    };
    let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
    let mut exact = set.is_ok();
    let capacity = |largest: usize| largest.max(1).next_power_of_two();
    let mut caps = Vec::new();
    for call in 0..40 {
        let m = matrix(&mut draw, n);
        caps.push(capacity(m.iter().flatten().copied().max().unwrap_or(0)));
        exact &= all_to_all_v_exact(me, &m, |i, s, o, r| {
            let got = gpu.on_host().all_to_all_v(i, s, o, r);
            if let Err(e) = &got {
                eprintln!("rank {me}: GPU rank's bound all_to_all_v {call}: {e}");
            }
            got.is_ok()
        });
    }
    let after_a2av = gpu.cached_calls();
    for call in 0..40 {
        let counts: Vec<usize> = (0..n).map(|_| draw.next(300) as usize).collect();
        caps.push(capacity(counts.iter().copied().max().unwrap_or(0)));
        let want: Vec<u32> = (0..n)
            .flat_map(|s| (0..counts[s]).map(move |i| sent(s, i)))
            .collect();
        let mine: Vec<u32> = (0..counts[me]).map(|i| sent(me, i)).collect();
        let mut out = vec![0u32; want.len()];
        let r = gpu.on_host().all_gather_v(&mine[..], &mut out[..], &counts);
        let mut in_place = vec![0u32; want.len()];
        let at: usize = counts[..me].iter().sum();
        in_place[at..at + mine.len()].copy_from_slice(&mine);
        let r2 = gpu
            .on_host()
            .all_gather_v_in_place(&mut in_place[..], &counts);
        if let (Err(e), _) | (_, Err(e)) = (&r, &r2) {
            eprintln!("rank {me}: GPU rank's bound all_gather_v {call}: {e}");
        }
        exact &= r.is_ok() && r2.is_ok() && out == want && in_place == want;
    }
    let after = gpu.cached_calls();
    caps.sort_unstable();
    caps.dedup();
    rep.check(
        "GPU ranks: 40 new count matrices and 40 new count lists give exact results",
        exact,
    );
    // One all_to_all_v and one all_gather_v shape per capacity at most, where one plan per
    // count matrix would hold 80.
    rep.check(
        &format!(
            "GPU ranks: new counts reuse capacity plans (shapes 0 -> {after_a2av} -> {after}, \
             capacities {caps:?})"
        ),
        after_a2av <= caps.len() && after <= 2 * caps.len(),
    );
}

/// What rank `me` must get from a reduce_scatter_v (sum) of `counts` where rank `s`'s input
/// element `p` is `sent(s, p)`.
fn reduce_scatter_v_want(me: usize, n: usize, counts: &[usize]) -> Vec<u32> {
    let at: usize = counts[..me].iter().sum();
    (0..counts[me])
        .map(|i| (0..n).fold(0u32, |a, s| a.wrapping_add(sent(s, at + i))))
        .collect()
}

/// reduce_scatter_v with new counts every call, on the typed host calls and on a GPU rank's
/// front door over the host backend: exact sums, at most one shape per power-of-two capacity
/// on each, and counts that differ on one rank a `CountMismatch` on every rank.
fn reduce_scatter_v_binding(mut comm: &MpiCommunicator, rep: &mut Report<'_>) {
    let (me, n) = (comm.rank(), comm.ranks());
    let set = comm.set_plan_cache_limits(limits(64, u64::MAX));
    let Some(mut gpu) = host_gpu(comm, rep, "reduce_scatter_v: host-backed rank made") else {
        return;
    };
    let mut draw = Draw(0x1234_5678_9abc_def1);
    let capacity = |largest: usize| largest.max(1).next_power_of_two();
    let mut caps = Vec::new();
    let (typed_before, gpu_before) = (comm.cached_calls(), gpu.cached_calls());
    let mut exact = set.is_ok();
    for call in 0..30 {
        let counts: Vec<usize> = (0..n).map(|_| draw.next(300) as usize).collect();
        caps.push(capacity(counts.iter().copied().max().unwrap_or(0)));
        let total: usize = counts.iter().sum();
        let input: Vec<u32> = (0..total).map(|p| sent(me, p)).collect();
        let want = reduce_scatter_v_want(me, n, &counts);
        let mut typed = vec![0u32; counts[me]];
        let r = comm.reduce_scatter_v(&input, &mut typed, &counts, ReduceOp::Sum);
        let mut front = vec![0u32; counts[me]];
        let r2 = gpu
            .on_host()
            .reduce_scatter_v(&input[..], &mut front[..], &counts, ReduceOp::Sum);
        if let Err(e) = &r {
            eprintln!("rank {me}: typed reduce_scatter_v {call}: {e}");
        }
        if let Err(e) = &r2 {
            eprintln!("rank {me}: GPU rank's reduce_scatter_v {call}: {e}");
        }
        exact &= r.is_ok() && r2.is_ok() && typed == want && front == want;
    }
    caps.sort_unstable();
    caps.dedup();
    let (typed_after, gpu_after) = (comm.cached_calls(), gpu.cached_calls());
    rep.check(
        "reduce_scatter_v: 30 new count lists give exact sums (typed and GPU ranks)",
        exact,
    );
    rep.check(
        &format!(
            "reduce_scatter_v: new counts reuse capacity plans (typed {typed_before} -> \
             {typed_after}, GPU ranks {gpu_before} -> {gpu_after}, capacities {caps:?})"
        ),
        typed_after <= typed_before + caps.len() && gpu_after <= gpu_before + caps.len(),
    );
    // Rank 0 gives another list: the same error everywhere, and nothing moves.
    let mut counts = vec![3usize; n];
    if me == 0 {
        counts[n - 1] = 4;
    }
    let total: usize = counts.iter().sum();
    let input: Vec<u32> = (0..total).map(|p| sent(me, p)).collect();
    let mut out = vec![7u32; counts[me]];
    let r = comm.reduce_scatter_v(&input, &mut out, &counts, ReduceOp::Sum);
    let r = mpi_err(r);
    let mismatch = matches!(&r, Err(MpiError::CountMismatch(_) | MpiError::Peer { .. }));
    if !mismatch {
        eprintln!("rank {me}: reduce_scatter_v with other counts on rank 0 gave {r:?}");
    }
    rep.check(
        "reduce_scatter_v: counts that differ on rank 0 fail on every rank, nothing moved",
        mismatch && out.iter().all(|x| *x == 7),
    );
}

fn main() {
    let universe = mpi_common::universe();
    let world = universe.world();
    let comm = mpi_common::communicator(&world);
    let mut rep = Report::new(&world);
    typed_count_limit(&comm, &mut rep);
    typed_count_binding(&comm, &mut rep);
    gpu_count_binding(&comm, &mut rep);
    reduce_scatter_v_binding(&comm, &mut rep);
    typed_byte_limit(&comm, &mut rep);
    typed_limits_mismatch(&comm, &mut rep);
    gpu_ranks(&comm, &mut rep);
    rep.summary();
    let failed = rep.failed;
    drop(comm);
    drop(universe);
    if failed > 0 {
        std::process::exit(1);
    }
}
