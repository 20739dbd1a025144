//! One test per class of bad argument: each is an error, and no buffer changed.

use relaycc_collectives::{CollectivesError, Communicator, DeviceBuffer, ReduceOp};

const SENTINEL: f32 = 7.0;

fn setup(n: u32, len: usize) -> (Communicator, Vec<DeviceBuffer<f32>>, Vec<DeviceBuffer<f32>>) {
    let comm = Communicator::host(n).unwrap_or_else(|e| panic!("{e}"));
    let ins = (0..n as usize)
        .map(|r| {
            comm.from_slice(r, &vec![r as f32; len])
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let outs = (0..n as usize)
        .map(|r| {
            comm.from_slice(r, &vec![SENTINEL; len])
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    (comm, ins, outs)
}

fn unchanged(ins: &[DeviceBuffer<f32>], outs: &[DeviceBuffer<f32>]) {
    for (r, b) in ins.iter().enumerate() {
        assert!(
            b.to_vec()
                .unwrap_or_default()
                .iter()
                .all(|v| *v == r as f32)
        );
    }
    for b in outs {
        assert!(
            b.to_vec()
                .unwrap_or_default()
                .iter()
                .all(|v| *v == SENTINEL)
        );
    }
}

#[test]
fn mismatched_counts() {
    let (comm, ins, outs) = setup(3, 8);
    let short = comm.alloc::<f32>(2, 5).unwrap_or_else(|e| panic!("{e}"));
    let o = [outs[0].view(), outs[1].view(), short.view()];
    let err = comm.all_reduce(&ins, &o, ReduceOp::Sum).err();
    assert!(
        matches!(err, Some(CollectivesError::CountMismatch { rank: 2, .. })),
        "{err:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn mismatched_rank_count() {
    let (comm, ins, outs) = setup(3, 8);
    let err = comm.all_gather(&ins[..2], &outs).err();
    assert!(
        matches!(err, Some(CollectivesError::RankCount { .. })),
        "{err:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn a_count_matrix_of_the_wrong_shape_says_what_is_short() {
    let (comm, ins, outs) = setup(3, 3);
    let rows = comm.all_to_all_v(&ins, &outs, &[vec![1, 1, 1]]).err();
    assert!(
        matches!(
            &rows,
            Some(CollectivesError::RankCount {
                side: "count matrix rows",
                expected: 3,
                got: 1,
                ..
            })
        ),
        "{rows:?}"
    );
    let short = [vec![1, 1, 1], vec![1, 2], vec![1, 1, 1]];
    let row = comm.all_to_all_v(&ins, &outs, &short).err();
    assert!(
        matches!(
            &row,
            Some(CollectivesError::RankCount {
                side: "counts in a count matrix row",
                got: 2,
                ..
            })
        ),
        "{row:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn mismatched_types_in_a_send_recv_pair() {
    let (comm, ins, outs) = setup(2, 8);
    let wrong = comm.alloc::<i32>(1, 8).unwrap_or_else(|e| panic!("{e}"));
    let mut g = comm.group();
    g.send(&ins[0], 0, 1).unwrap_or_else(|e| panic!("{e}"));
    g.recv(&wrong, 1, 0).unwrap_or_else(|e| panic!("{e}"));
    let err = g.launch().err();
    assert!(
        matches!(err, Some(CollectivesError::TypeMismatch { .. })),
        "{err:?}"
    );
    unchanged(&ins, &outs);
    assert!(wrong.to_vec().unwrap_or_default().iter().all(|v| *v == 0));
}

#[test]
fn unmatched_send() {
    let (comm, ins, outs) = setup(2, 8);
    let mut g = comm.group();
    g.send(&ins[0], 0, 1).unwrap_or_else(|e| panic!("{e}"));
    let err = g.launch().err();
    assert!(
        matches!(err, Some(CollectivesError::Unmatched(_))),
        "{err:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn bad_root() {
    let (comm, ins, outs) = setup(3, 8);
    let err = comm.broadcast(&ins[0], &outs, 3).err();
    assert!(
        matches!(err, Some(CollectivesError::BadRank { rank: 3, .. })),
        "{err:?}"
    );
    // A root whose buffer lives on another rank.
    let err = comm.broadcast(&ins[0], &outs, 1).err();
    assert!(
        matches!(err, Some(CollectivesError::WrongRank { .. })),
        "{err:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn buffer_from_another_communicator() {
    let (comm, ins, outs) = setup(2, 8);
    let other = Communicator::host(2).unwrap_or_else(|e| panic!("{e}"));
    let foreign = other.alloc::<f32>(1, 8).unwrap_or_else(|e| panic!("{e}"));
    let o = [outs[0].view(), foreign.view()];
    let err = comm.all_reduce(&ins, &o, ReduceOp::Sum).err();
    assert!(
        matches!(err, Some(CollectivesError::ForeignBuffer { rank: 1, .. })),
        "{err:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn buffer_of_another_rank() {
    let (comm, ins, outs) = setup(2, 8);
    let swapped = [&outs[1], &outs[0]];
    let err = comm.all_reduce(&ins, &swapped, ReduceOp::Sum).err();
    assert!(
        matches!(
            err,
            Some(CollectivesError::WrongRank {
                rank: 0,
                owner: 1,
                ..
            })
        ),
        "{err:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn overlapping_input_and_output() {
    let (comm, ins, outs) = setup(2, 8);
    // Out of place, but the output overlaps the input by two elements.
    let i: Vec<_> = ins
        .iter()
        .map(|b| b.slice(0..4).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let o: Vec<_> = ins
        .iter()
        .map(|b| b.slice(2..6).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let err = comm.all_reduce(&i, &o, ReduceOp::Sum).err();
    assert!(
        matches!(err, Some(CollectivesError::Overlap { .. })),
        "{err:?}"
    );
    // all_to_all has no in-place form.
    let err = comm.all_to_all(&ins, &ins).err();
    assert!(
        matches!(err, Some(CollectivesError::Overlap { .. })),
        "{err:?}"
    );
    // Two operations of one group writing the same memory.
    let mut g = comm.group();
    g.all_reduce(&ins, &outs, ReduceOp::Sum)
        .unwrap_or_else(|e| panic!("{e}"));
    g.broadcast(&ins[0], &outs, 0)
        .unwrap_or_else(|e| panic!("{e}"));
    let err = g.launch().err();
    assert!(
        matches!(err, Some(CollectivesError::Overlap { .. })),
        "{err:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn counts_that_overflow() {
    let (comm, ins, outs) = setup(2, 8);
    let m = vec![vec![u64::MAX, 1], vec![1, 1]];
    let err = comm.all_to_all_v(&ins, &outs, &m).err();
    assert!(
        matches!(err, Some(CollectivesError::Overflow { .. })),
        "{err:?}"
    );
    let err = comm.alloc::<u64>(0, usize::MAX).err();
    assert!(
        matches!(err, Some(CollectivesError::Overflow { .. })),
        "{err:?}"
    );
    unchanged(&ins, &outs);
}

#[test]
fn avg_on_integers() {
    let comm = Communicator::host(2).unwrap_or_else(|e| panic!("{e}"));
    let b: Vec<DeviceBuffer<i32>> = (0..2)
        .map(|r| {
            comm.from_slice(r, &[5, 6])
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let err = comm.all_reduce(&b, &b, ReduceOp::Avg).err();
    assert!(
        matches!(err, Some(CollectivesError::UnsupportedOp { .. })),
        "{err:?}"
    );
    assert_eq!(b[1].to_vec().unwrap_or_default(), vec![5, 6]);
}

#[test]
fn bad_communicators() {
    let topo = relaycc_collectives::host_topology(2).unwrap_or_else(|e| panic!("{e}"));
    let be = std::sync::Arc::new(relaycc_collectives::HostBackend::new());
    for devices in [&[][..], &[0, 0], &[0, 5]] {
        assert!(Communicator::new(topo.clone(), devices, &[], be.clone()).is_err());
    }
    assert!(Communicator::from_spec("no-such-machine", &[0], &[], be).is_err());
}
