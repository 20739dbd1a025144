//! The plan cache: bounded by count and by scratch bytes, least recently used out first, and
//! cleared on request, with its scratch freed on the backend.

use std::sync::Arc;

use relaycc_collectives::{
    Collectives, Communicator, HostBackend, PlanCacheLimits, RankComm, RankGroup, ReduceOp,
};
use relaycc_route::Location;

/// Bytes the backend holds on every GPU of the DGX-1 and in every host memory (a small
/// all_reduce's fastest plan may stage through the CPUs: NCCL's LL ring over host memory).
fn held(b: &HostBackend) -> u64 {
    let gpus = (0..8).map(|g| b.bytes_in_use(Location::Gpu(g)));
    // Host memories are named by topology node index; the DGX-1 has well under 64 nodes.
    let hosts = (0..64).map(|n| b.bytes_in_use(Location::Host(n)));
    gpus.chain(hosts).sum()
}

#[test]
fn the_cache_is_bounded_and_clears_its_scratch() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap_or_else(|e| panic!("{e}"));
    let backend = Arc::new(HostBackend::new());
    // Members 0, 2, 5, 7 of the DGX-1 relay through 1, 3, 4 and 6: every plan has scratch.
    let comm = Communicator::new(topo, &[0, 2, 5, 7], &[1, 3, 4, 6], backend.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    comm.set_plan_cache_limits(PlanCacheLimits {
        max_plans: 2,
        max_scratch_bytes: u64::MAX,
    });
    let sizes = [1000usize, 2000, 3000, 4000];
    let bufs: Vec<_> = sizes
        .iter()
        .map(|&len| {
            let ins: Vec<_> = (0..4)
                .map(|r| comm.from_slice(r, &vec![1.0f32 + r as f32; len]))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("{e}"));
            let outs: Vec<_> = (0..4)
                .map(|r| comm.alloc::<f32>(r, len))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("{e}"));
            (ins, outs)
        })
        .collect();
    let user = held(&backend);
    for (ins, outs) in &bufs {
        comm.all_reduce(ins, outs, ReduceOp::Sum)
            .and_then(|p| p.wait())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(comm.cached_plans() <= 2, "{}", comm.cached_plans());
        assert!(
            outs[3]
                .to_vec()
                .unwrap_or_default()
                .iter()
                .all(|v| *v == 10.0)
        );
    }
    assert_eq!(comm.cached_plans(), 2);
    // What the backend holds beyond the user's buffers is the cache's scratch, no more.
    assert!(comm.cached_scratch_bytes() > 0);
    assert_eq!(held(&backend) - user, comm.cached_scratch_bytes());
    // A byte limit below one plan's scratch keeps only the plan just made.
    comm.set_plan_cache_limits(PlanCacheLimits {
        max_plans: 8,
        max_scratch_bytes: 1,
    });
    assert_eq!(comm.cached_plans(), 0);
    let (ins, outs) = &bufs[0];
    comm.all_reduce(ins, outs, ReduceOp::Sum)
        .and_then(|p| p.wait())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(comm.cached_plans(), 1);
    comm.clear_plan_cache();
    assert_eq!(comm.cached_plans(), 0);
    assert_eq!(comm.cached_scratch_bytes(), 0);
    assert_eq!(held(&backend), user);
}

#[test]
fn a_budget_too_small_for_any_plan_is_an_error_before_anything_is_allocated() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap_or_else(|e| panic!("{e}"));
    let backend = Arc::new(HostBackend::new());
    let mut comm = Communicator::new(topo, &[0, 2, 5, 7], &[1, 3, 4, 6], backend.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    comm.set_staging_budget(1024);
    let len = 1 << 20;
    let ins: Vec<_> = (0..4)
        .map(|r| comm.from_slice(r, &vec![1.0f32; len]))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}"));
    let outs: Vec<_> = (0..4)
        .map(|r| comm.alloc::<f32>(r, len))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}"));
    let user = held(&backend);
    let err = comm
        .all_reduce(&ins, &outs, ReduceOp::Sum)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("staging") && err.contains("GPU") && err.contains("1024 bytes"),
        "{err}"
    );
    assert_eq!(held(&backend), user);
    assert_eq!(comm.cached_plans(), 0);
}

#[test]
fn relays_are_the_listed_gpus_and_idle_ones_nvml_reports() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap_or_else(|e| panic!("{e}"));
    let backend = HostBackend::new();
    let members = [0, 2, 5, 7];
    let allowed = Communicator::allowed_relays(&topo, &members, &[3], &backend);
    assert!(allowed.contains(&3), "{allowed:?}");
    assert!(allowed.iter().all(|g| !members.contains(g)), "{allowed:?}");
    // Any GPU beyond the listed one is one NVML reports idle; without NVML there is none.
    let idle = relaycc_topo::import::nvml::idle_gpus().unwrap_or_default();
    assert!(
        allowed.iter().all(|g| *g == 3 || idle.contains(g)),
        "{allowed:?} vs idle {idle:?}"
    );
    let comm = Communicator::with_idle_relays(topo, &members, &[3], Arc::new(backend))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(comm.relays(), allowed.as_slice());
}

/// all_to_all_v and all_gather_v whose counts change every call run a plan made for their
/// capacity (the largest count, rounded up to a power of two) with the counts bound per call:
/// 40 random matrices of counts up to 1,000 leave at most the two capacities 512 and 1,024
/// cached per collective, and every result is exact.
#[test]
fn v_collectives_with_new_counts_every_call_reuse_their_capacity_plans() {
    let n = 4usize;
    let comm = Communicator::host(n as u32).unwrap_or_else(|e| panic!("{e}"));
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |hi: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % (hi + 1)
    };
    for call in 0..40 {
        // One count per pair up to 1,000, one pair at 600..=1,000 so the capacity is 512 or
        // 1,024.
        let mut m: Vec<Vec<u64>> = (0..n)
            .map(|_| (0..n).map(|_| next(1000)).collect())
            .collect();
        m[call % n][(call + 1) % n] = 600 + next(400);
        let ins: Vec<_> = (0..n)
            .map(|s| {
                let v: Vec<u32> = (0..m[s].iter().sum::<u64>())
                    .map(|i| (s as u32) << 24 | i as u32)
                    .collect();
                comm.from_slice(s, &v)
            })
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
        let outs: Vec<_> = (0..n)
            .map(|d| comm.alloc::<u32>(d, m.iter().map(|r| r[d]).sum::<u64>() as usize))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
        comm.all_to_all_v(&ins, &outs, &m)
            .and_then(|p| p.wait())
            .unwrap_or_else(|e| panic!("call {call}: {e}"));
        for (d, out) in outs.iter().enumerate() {
            let want: Vec<u32> = (0..n)
                .flat_map(|s| {
                    let at: u64 = m[s][..d].iter().sum();
                    (at..at + m[s][d]).map(move |i| (s as u32) << 24 | i as u32)
                })
                .collect();
            assert_eq!(
                out.to_vec().unwrap_or_default(),
                want,
                "call {call} rank {d}"
            );
        }
        let counts: Vec<usize> = (0..n).map(|r| m[r][r] as usize).collect();
        let gathered: Vec<_> = (0..n)
            .map(|r| comm.alloc::<u32>(r, counts.iter().sum()))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
        let mine: Vec<_> = (0..n)
            .map(|r| ins[r].slice(0..counts[r]))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
        comm.all_gather_v(&mine, &gathered)
            .and_then(|p| p.wait())
            .unwrap_or_else(|e| panic!("call {call}: {e}"));
        let want: Vec<u32> = (0..n)
            .flat_map(|s| (0..counts[s] as u32).map(move |i| (s as u32) << 24 | i))
            .collect();
        assert_eq!(
            gathered[n - 1].to_vec().unwrap_or_default(),
            want,
            "call {call}"
        );
        assert!(
            comm.cached_plans() <= 4,
            "call {call}: {} plans",
            comm.cached_plans()
        );
    }
}

/// A count matrix for `n` ranks (row: sender) of counts up to 1,024 with one pair at
/// 513..=1,024, so its capacity is 1,024 whatever the draw.
fn capacity_1024_matrix(
    next: &mut impl FnMut(u64) -> u64,
    n: usize,
    call: usize,
) -> Vec<Vec<usize>> {
    let mut m: Vec<Vec<usize>> = (0..n)
        .map(|_| (0..n).map(|_| next(1024) as usize).collect())
        .collect();
    m[call % n][(call + 3) % n] = 513 + next(511) as usize;
    m
}

/// Count binding's target shape: eight per-rank handles (`RankComm`, host backend) driven from one
/// thread run all_to_all_v with a new random count matrix every call. The first call plans
/// the capacity; the 50 after it leave the communicator's plan cache as it was (counts are
/// bound per call, never planned), and every result is exact.
#[test]
fn per_rank_all_to_all_v_with_fresh_matrices_keeps_the_plan_cache() {
    let n = 8usize;
    let mut ranks = RankComm::host(n as u32).unwrap_or_else(|e| panic!("{e}"));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |hi: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % (hi + 1)
    };
    let mut planned = None;
    for call in 0..51 {
        let m = capacity_1024_matrix(&mut next, n, call);
        let sends: Vec<Vec<u32>> = (0..n)
            .map(|s| {
                (0..m[s].iter().sum::<usize>())
                    .map(|i| (s << 24 | i) as u32)
                    .collect()
            })
            .collect();
        let cols: Vec<Vec<usize>> = (0..n).map(|d| (0..n).map(|s| m[s][d]).collect()).collect();
        let mut recvs: Vec<Vec<u32>> = cols.iter().map(|c| vec![0; c.iter().sum()]).collect();
        let groups = ranks
            .iter_mut()
            .zip(sends.iter().zip(recvs.iter_mut()))
            .enumerate()
            .map(|(r, (rank, (send, recv)))| {
                let mut g = rank.group();
                g.all_to_all_v(&send[..], &m[r], &mut recv[..], &cols[r]);
                g
            });
        RankGroup::launch_all(groups).unwrap_or_else(|e| panic!("call {call}: {e}"));
        for (d, recv) in recvs.iter().enumerate() {
            let want: Vec<u32> = (0..n)
                .flat_map(|s| {
                    let at: usize = m[s][..d].iter().sum();
                    (at..at + m[s][d]).map(move |i| (s << 24 | i) as u32)
                })
                .collect();
            assert_eq!(recv, &want, "call {call} rank {d}");
        }
        let plans = ranks[0].communicator().cached_plans();
        assert_eq!(
            *planned.get_or_insert(plans),
            plans,
            "call {call}: the cache grew"
        );
    }
}
