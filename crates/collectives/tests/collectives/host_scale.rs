//! Host ranks at scale: a bounded pool of lane threads runs launches of any number of lanes,
//! and a few threads drive any number of per-rank handles (`RankGroup::launch_all`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use relaycc_collectives::{
    Collectives, CollectivesError, Communicator, HostBackend, RankComm, RankGroup, ReduceOp,
    host_topology,
};

/// `n` host ranks on a backend of at most `threads` lane threads, and that backend.
fn host_ranks(n: u32, threads: usize) -> (Vec<RankComm>, Arc<HostBackend>) {
    let backend = Arc::new(HostBackend::with_lane_threads(threads));
    let devices: Vec<u32> = (0..n).collect();
    let topo = host_topology(n).unwrap_or_else(|e| panic!("{e}"));
    let comm =
        Communicator::new(topo, &devices, &[], backend.clone()).unwrap_or_else(|e| panic!("{e}"));
    (comm.into_ranks(), backend)
}

/// Every rank of `mine` all_reduces its `bufs` entry in place, launched together.
fn all_reduce_together(
    mine: &mut [RankComm],
    bufs: &mut [Vec<u32>],
) -> Result<(), CollectivesError> {
    let groups = mine.iter_mut().zip(bufs.iter_mut()).map(|(r, b)| {
        let mut g = r.group();
        g.all_reduce_in_place(b, ReduceOp::Sum);
        g
    });
    RankGroup::launch_all(groups)
}

/// 1,024 ranks, driven by two threads, with a copy to itself on every rank's lane and an
/// all_reduce over all of them, on a backend of two lane threads: the results are right and
/// the backend never starts more than its two workers.
#[test]
fn a_thousand_ranks_run_on_two_driving_threads_and_two_lane_threads() {
    let n = 1024u32;
    let (mut ranks, backend) = host_ranks(n, 2);
    let right = ranks.split_off(n as usize / 2);
    let drive = |mut mine: Vec<RankComm>| {
        std::thread::spawn(move || {
            let mut bufs: Vec<Vec<u32>> = mine.iter().map(|r| vec![r.rank() as u32; 64]).collect();
            let mut copies: Vec<Vec<u32>> = vec![vec![0; 64]; mine.len()];
            all_reduce_together(&mut mine, &mut bufs)?;
            // Every rank's send to itself: 512 lanes in one launch.
            let groups =
                mine.iter_mut()
                    .zip(bufs.iter())
                    .zip(copies.iter_mut())
                    .map(|((r, b), c)| {
                        let me = r.rank();
                        let mut g = r.group();
                        g.send(&b[..], me).recv(&mut c[..], me);
                        g
                    });
            RankGroup::launch_all(groups)?;
            Ok::<_, CollectivesError>(copies)
        })
    };
    let (a, b) = (drive(ranks), drive(right));
    let want = n * (n - 1) / 2;
    for h in [a, b] {
        let copies = h
            .join()
            .expect("driving thread")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(copies.iter().flatten().all(|&v| v == want));
    }
    assert!(backend.worker_count() <= 2, "{}", backend.worker_count());
    assert_eq!(backend.max_workers(), 2);
}

/// A share of ranks whose thread never runs (its handles dropped, as when the thread cannot
/// be started) fails the other ranks' launch at once, not at their timeout.
#[test]
fn ranks_whose_driver_is_gone_fail_the_others_at_once() {
    let (mut ranks, _backend) = host_ranks(8, 2);
    for r in &mut ranks {
        r.set_timeout(Duration::from_secs(30));
    }
    let gone = ranks.split_off(4);
    drop(gone);
    let mut bufs = vec![vec![1u32; 16]; 4];
    let t = Instant::now();
    let e = all_reduce_together(&mut ranks, &mut bufs).expect_err("ranks 4..8 are gone");
    assert!(matches!(e, CollectivesError::RankTimeout { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(bufs.iter().flatten().all(|&v| v == 1), "nothing ran");
}

/// Plans with waits across lanes (a DGX-1's all_reduce: rings and relays on many lanes, each
/// waiting for others' events) run on one lane thread: a waiting lane parks and gives the
/// thread back.
#[test]
fn one_lane_thread_runs_plans_whose_lanes_wait_for_each_other() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap_or_else(|e| panic!("{e}"));
    // The plans do wait across lanes: some op depends on an op of another lane.
    for len in [1000u64, 300_000] {
        let req = relaycc_route::Request::new(
            relaycc_route::Collective::AllReduce,
            (0..8).collect(),
            len,
            relaycc_route::DType::F32,
        );
        let opts = relaycc_route::PlanOptions {
            relay: relaycc_route::path::RelayPolicy::List(Vec::new()),
            ..relaycc_route::PlanOptions::default()
        };
        let plan = relaycc_route::plan(&topo, &req, &opts)
            .unwrap_or_else(|e| panic!("{e}"))
            .plan;
        let across = plan
            .ops
            .iter()
            .any(|o| o.deps.iter().any(|&d| plan.ops[d as usize].lane != o.lane));
        assert!(across, "{len}: {}", plan.algorithm);
    }
    let backend = Arc::new(HostBackend::with_lane_threads(1));
    let comm = Communicator::new(topo, &[0, 1, 2, 3, 4, 5, 6, 7], &[], backend.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    for len in [1000usize, 300_000] {
        let ins: Vec<_> = (0..8)
            .map(|r| comm.from_slice(r, &vec![r as f32 + 1.0; len]))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
        let outs: Vec<_> = (0..8)
            .map(|r| comm.alloc::<f32>(r, len))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
        comm.all_reduce(&ins, &outs, ReduceOp::Sum)
            .and_then(|p| p.wait())
            .unwrap_or_else(|e| panic!("{len}: {e}"));
        for o in &outs {
            assert!(
                o.to_vec().unwrap_or_default().iter().all(|&v| v == 36.0),
                "{len}"
            );
        }
    }
    assert_eq!(backend.worker_count(), 1);
}
