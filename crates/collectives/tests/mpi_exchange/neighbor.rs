//! Neighbour exchanges (`NeighborExchange`, by counts and by index lists) against MPI's own
//! `MPI_Alltoallv` and `MPI_Allgatherv`, for every strategy and the model's choice.

use relaycc_collectives::Collectives;
use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{MpiCommunicator, NeighborExchange};
use rsmpi::datatype::{Partition, PartitionMut};
use rsmpi::traits::*;

use crate::mpi_common::Report;
use crate::{choices, displs, rng};

pub(crate) fn correctness(comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank(), comm.ranks());
    let world = comm.comm();
    let k = comm.node_ranks().len();
    for seed in 0..3u64 {
        // Sparse send counts: about a third of the pairs, some explicitly empty, and the last
        // rank sends nothing at all.
        let mut next = rng(seed * 1000 + me as u64 + 1);
        let send: Vec<u64> = (0..n)
            .map(|_| {
                if me == n - 1 || !next().is_multiple_of(3) {
                    0
                } else {
                    next() % 60
                }
            })
            .collect();
        let mut recv = vec![0u64; n];
        world.all_to_all_into(&send[..], &mut recv[..]);
        let input: Vec<u64> = (0..send.iter().sum::<u64>())
            .map(|i| ((me as u64) << 40) | (seed << 32) | i)
            .collect();
        let sc: Vec<i32> = send.iter().map(|c| *c as i32).collect();
        let rc: Vec<i32> = recv.iter().map(|c| *c as i32).collect();
        let total: u64 = recv.iter().sum();
        let mut expect = vec![0u64; total as usize];
        {
            let sd = displs(&sc);
            let rd = displs(&rc);
            let sp = Partition::new(&input[..], &sc[..], &sd[..]);
            let mut rp = PartitionMut::new(&mut expect[..], &rc[..], &rd[..]);
            world.all_to_all_varcount_into(&sp, &mut rp);
        }
        for (name, choice) in choices() {
            let label = format!("alltoallv n={n} k={k} seed={seed} {name}");
            let ok = match NeighborExchange::all_to_all_v(comm, &send, &recv, 8, choice) {
                Ok(mut ex) => (0..2).all(|_| {
                    let mut out = vec![u64::MAX; total as usize];
                    ex.run(&input, &mut out).is_ok() && out == expect
                }),
                Err(e) => {
                    eprintln!("rank {me}: {label}: {e}");
                    false
                }
            };
            rep.check(&label, ok);
        }
        // all_gather_v against MPI_Allgatherv.
        let mine = if me == n - 1 { 0 } else { next() % 25 };
        let data: Vec<u64> = (0..mine).map(|i| ((me as u64) << 40) | i).collect();
        let mut counts = vec![0i32; n];
        world.all_gather_into(&(mine as i32), &mut counts[..]);
        let total: i32 = counts.iter().sum();
        let mut expect = vec![0u64; total as usize];
        {
            let d = displs(&counts);
            let mut rp = PartitionMut::new(&mut expect[..], &counts[..], &d[..]);
            world.all_gather_varcount_into(&data[..], &mut rp);
        }
        for (name, choice) in choices() {
            let label = format!("allgatherv n={n} k={k} seed={seed} {name}");
            let ok = match NeighborExchange::all_gather_v(comm, mine, 8, choice) {
                Ok(mut ex) => {
                    let mut out = vec![u64::MAX; total as usize];
                    ex.run(&data, &mut out).is_ok() && out == expect
                }
                Err(e) => {
                    eprintln!("rank {me}: {label}: {e}");
                    false
                }
            };
            rep.check(&label, ok);
        }
    }
}

/// Index-list exchanges (`NeighborExchange::from_indices`) against `MPI_Alltoallv` of the
/// hand-packed buffers, for every strategy: random sparse patterns with empty lists and
/// repeated indices, and a last rank with no neighbours at all (it sends and receives
/// nothing); packed and with a random placement; two runs per build.
pub(crate) fn index_lists(comm: &MpiCommunicator, rep: &mut Report) {
    let (me, n) = (comm.rank(), comm.ranks());
    let world = comm.comm();
    let k = comm.node_ranks().len();
    for seed in 0..3u64 {
        let mut next = rng(seed * 7919 + me as u64 + 11);
        let len = 40 + (me * 13) % 17;
        let x: Vec<u64> = (0..len as u64)
            .map(|i| ((me as u64) << 40) | (seed << 32) | i)
            .collect();
        let lists: Vec<Vec<usize>> = (0..n)
            .map(|d| {
                if me == n - 1 || d == n - 1 || !next().is_multiple_of(3) {
                    return Vec::new();
                }
                // Drawn with replacement (repeats), sometimes empty; plus one sure repeat.
                let mut l: Vec<usize> = (0..next() % 20).map(|_| (next() as usize) % len).collect();
                if let Some(&first) = l.first() {
                    l.push(first);
                }
                l
            })
            .collect();
        let packed: Vec<u64> = lists.iter().flatten().map(|i| x[*i]).collect();
        let sc: Vec<i32> = lists.iter().map(|l| l.len() as i32).collect();
        let mut rc = vec![0i32; n];
        world.all_to_all_into(&sc[..], &mut rc[..]);
        let total = rc.iter().sum::<i32>() as usize;
        let mut expect = vec![0u64; total];
        {
            let (sd, rd) = (displs(&sc), displs(&rc));
            let sp = Partition::new(&packed[..], &sc[..], &sd[..]);
            let mut rp = PartitionMut::new(&mut expect[..], &rc[..], &rd[..]);
            world.all_to_all_varcount_into(&sp, &mut rp);
        }
        // A placement: a random permutation of 0..total + 3, cut per source.
        let mut perm: Vec<usize> = (0..total + 3).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, (next() as usize) % (i + 1));
        }
        let mut places: Vec<Vec<usize>> = Vec::with_capacity(n);
        let mut at = 0;
        for c in &rc {
            places.push(perm[at..at + *c as usize].to_vec());
            at += *c as usize;
        }
        let mut placed = vec![u64::MAX; total + 3];
        for (p, v) in places.iter().flatten().zip(&expect) {
            placed[*p] = *v;
        }
        for (name, choice) in choices() {
            let label = format!("indexed n={n} k={k} seed={seed} {name}");
            let ok = match NeighborExchange::from_indices(comm, &lists, None, 8, choice) {
                Ok(mut ex) => (0..2).all(|_| {
                    let mut out = vec![u64::MAX; ex.received()];
                    ex.run(&x, &mut out).is_ok() && out == expect
                }),
                Err(e) => {
                    eprintln!("rank {me}: {label}: {e}");
                    false
                }
            };
            rep.check(&label, ok);
            let label = format!("indexed+placed n={n} k={k} seed={seed} {name}");
            let ok = match NeighborExchange::from_indices(comm, &lists, Some(&places), 8, choice) {
                Ok(mut ex) => (0..2).all(|_| {
                    let mut out = vec![u64::MAX; total + 3];
                    ex.run(&x, &mut out).is_ok() && out == placed
                }),
                Err(e) => {
                    eprintln!("rank {me}: {label}: {e}");
                    false
                }
            };
            rep.check(&label, ok);
        }
    }
}
