//! Soundness from safe code ("no trust through safe methods"): memory lent read-only stays
//! unchanged, and nothing safe reaches memory the library borrowed.
//!
//! A safe implementation of `Backend` that shows the library another backend than the one
//! running its launches would let it write into a shared `Arc<Vec<f32>>` input of the
//! per-rank calls (or fault on a `static` one), or hand MPI addresses of freed memory.
//! `Backend` is sealed, so such a forgery does not compile: the compile-fail doctests on
//! `relaycc_collectives::Backend` are the tests of those two (written out in full, they
//! compile without the seal). What safe code can write is tested here: per-rank calls whose
//! inputs are shared, immutable memory, and a handle of another backend aimed at the memory a
//! call lends to the communicator's backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use relaycc_collectives::{
    Backend, ByteRegion, Collectives, Communicator, HostBackend, RankComm, ReduceOp, host_topology,
};
use relaycc_route::Location;

/// Run `f` on every rank, one thread each; the results in rank order.
fn on_ranks<R: Send>(ranks: Vec<RankComm>, f: impl Fn(RankComm) -> R + Sync) -> Vec<R> {
    thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|r| {
                let f = &f;
                s.spawn(move || f(r))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

const N: usize = 1024;

/// Read-only memory of the process image: a write to it faults.
static STATIC_INPUT: [f32; N] = [1.5; N];

/// Every collective with a separate input reads each rank's input from one immutable
/// `Arc<Vec<f32>>` shared by all ranks (lent read-only, several times over), and all_reduce
/// from a `static`: the results are right and the inputs unchanged.
#[test]
fn inputs_lent_read_only_stay_unchanged() {
    let shared: Arc<Vec<f32>> = Arc::new((0..N).map(|i| (i % 7) as f32).collect());
    let before = shared.as_ref().clone();
    let n = 4usize;
    let outs = on_ranks(RankComm::host(n as u32).expect("ranks"), |mut rank| {
        let me = rank.rank();
        let mut sum = vec![0f32; N];
        rank.all_reduce(&shared[..], &mut sum[..], ReduceOp::Sum)?;
        let mut from_static = vec![0f32; N];
        rank.all_reduce(&STATIC_INPUT[..], &mut from_static[..], ReduceOp::Max)?;
        let mut gathered = vec![0f32; N * n];
        rank.all_gather(&shared[..], &mut gathered[..])?;
        let mut block = vec![0f32; N / n];
        rank.reduce_scatter(&shared[..], &mut block[..], ReduceOp::Sum)?;
        let mut swapped = vec![0f32; N];
        rank.all_to_all(&shared[..], &mut swapped[..])?;
        let mut root_copy = vec![0f32; N];
        let send = (me == 0).then_some(&shared[..]);
        rank.broadcast(send, &mut root_copy[..], 0)?;
        Ok::<_, relaycc_collectives::CollectivesError>((
            me,
            sum,
            from_static,
            gathered,
            block,
            swapped,
            root_copy,
        ))
    });
    for out in outs {
        let (me, sum, from_static, gathered, block, swapped, root_copy) = out.expect("call");
        let want_sum: Vec<f32> = before.iter().map(|x| x * n as f32).collect();
        assert_eq!(sum, want_sum, "rank {me}");
        assert_eq!(from_static, vec![1.5; N], "rank {me}");
        assert_eq!(gathered, before.repeat(n), "rank {me}");
        let mine = &want_sum[me * N / n..(me + 1) * N / n];
        assert_eq!(block, mine, "rank {me}");
        // Every rank sends the same blocks: rank `me` receives block `me` from each.
        let b = N / n;
        assert_eq!(swapped, before[me * b..(me + 1) * b].repeat(n), "rank {me}");
        assert_eq!(root_copy, before, "rank {me}");
    }
    assert_eq!(*shared, before, "a read-only input changed");
    assert!(STATIC_INPUT.iter().all(|&x| x == 1.5));
}

/// While ranks all_reduce from a shared immutable input, another thread aims every handle of
/// a second host backend at the communicator's backend (`upload`). With ids per backend,
/// those handles would name the blocks the calls lend, and the uploads would overwrite the
/// read-only input; ids are unique in the process, so every upload is refused as unknown.
#[test]
fn another_backends_handles_never_reach_lent_memory() {
    let backend = Arc::new(HostBackend::new());
    let comm = Communicator::new(host_topology(2).expect("topology"), &[0, 1], &[], {
        let b: Arc<dyn Backend> = backend.clone();
        b
    })
    .expect("communicator");
    let other = HostBackend::new();
    let bytes = (N * 4) as u64;
    let handles: Vec<_> = (0..256)
        .map(|_| other.allocate(Location::Gpu(0), bytes).expect("allocate"))
        .collect();
    let shared: Arc<Vec<f32>> = Arc::new(vec![1.0; N]);
    let done = AtomicBool::new(false);
    let mut refused = 0usize;
    let ranks = comm.into_ranks();
    thread::scope(|s| {
        let attacker = s.spawn(|| {
            let junk = vec![0xAB; bytes as usize];
            let mut refused = 0usize;
            // At least one pass, however soon the ranks finish.
            loop {
                for &mem in &handles {
                    let r = ByteRegion {
                        mem,
                        offset: 0,
                        bytes,
                    };
                    refused += usize::from(backend.upload(r, &junk).is_err());
                }
                if done.load(Ordering::Relaxed) {
                    return refused;
                }
            }
        });
        let results = on_ranks(ranks, |mut rank| {
            let mut out = vec![0f32; N];
            for _ in 0..50 {
                rank.all_reduce(&shared[..], &mut out[..], ReduceOp::Sum)?;
                assert_eq!(out, vec![2.0; N]);
            }
            Ok::<(), relaycc_collectives::CollectivesError>(())
        });
        done.store(true, Ordering::Relaxed);
        refused = attacker.join().expect("attacker");
        for r in results {
            r.expect("all_reduce");
        }
    });
    assert!(refused >= handles.len(), "every upload was refused");
    assert!(
        shared.iter().all(|&x| x == 1.0),
        "a read-only input changed"
    );
    for m in handles {
        other.free(m);
    }
    assert!(other.synchronize().is_ok());
}
