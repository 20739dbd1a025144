//! Collectives on [`SharedHostBuffer`]s: the single-copy transport reads the senders'
//! buffers in place; each result equals the MPI library's on the same buffers.

use relaycc_collectives::mpi::{MpiCommunicator, SharedHostBuffer};
use relaycc_collectives::{Collectives, ReduceOp};
use rsmpi::collective::SystemOperation;
use rsmpi::datatype::PartitionMut;
use rsmpi::traits::*;

use crate::mpi_common::{Report, fill};
use crate::{bytes, displs, rsmpi, zeros};

/// `len` elements of [`fill`]`(rank, len)` in a [`SharedHostBuffer`].
fn shared_fill(rank: u32, len: usize) -> SharedHostBuffer<f32> {
    let mut b = SharedHostBuffer::zeroed(len).expect("memfd");
    b.copy_from_slice(&fill::<f32>(rank, len));
    b
}

/// Collectives whose messages come from [`SharedHostBuffer`]s (zero-copy `comm`): receivers
/// map the senders' buffers and copy in user space where the transport says so. Each result
/// equals MPI's on the same buffers; 70 rounds of all_to_all from new buffers each time pass
/// the receivers' cache of mappings (64), so evicted and unmapped buffers are never read.
pub(crate) fn shared_buffers(mut comm: &MpiCommunicator, rep: &mut Report) {
    let world = comm.comm();
    let (me, n) = (comm.rank() as u32, comm.ranks());
    if me == 0 {
        println!("transport (shared buffers): {}", comm.host_transport());
    }
    // 65,644-byte blocks: single-copy messages.
    let c = 16_411;
    let mut all_ok = true;
    for round in 0..70u32 {
        let src = shared_fill(me + round, c * n);
        let mut got = SharedHostBuffer::<f32>::zeroed(c * n).expect("memfd");
        let mut want = zeros::<f32>(c * n);
        world.all_to_all_into(&src[..], &mut want[..]);
        let r = comm.all_to_all(&src, &mut got);
        all_ok &= r.is_ok() && bytes(&got) == bytes(&want);
    }
    rep.check("shared buffers: 70 rounds of all_to_all", all_ok);
    let c = 262_147;
    let input = shared_fill(me, c);
    let mut want = zeros::<f32>(c);
    world.all_reduce_into(&input[..], &mut want[..], SystemOperation::sum());
    let mut got = SharedHostBuffer::<f32>::zeroed(c).expect("memfd");
    let r = comm.all_reduce(&input, &mut got, ReduceOp::Sum);
    rep.check(
        "shared buffers: all_reduce",
        r.is_ok() && bytes(&got) == bytes(&want),
    );
    let counts: Vec<usize> = (0..n).map(|r| c - r * 1000).collect();
    let counts_i: Vec<i32> = counts.iter().map(|x| *x as i32).collect();
    let d = displs(&counts_i);
    let total: usize = counts.iter().sum();
    let mine = shared_fill(me, counts[me as usize]);
    let mut want = zeros::<f32>(total);
    {
        let mut part = PartitionMut::new(&mut want[..], &counts_i[..], &d[..]);
        world.all_gather_varcount_into(&mine[..], &mut part);
    }
    let mut got = SharedHostBuffer::<f32>::zeroed(total).expect("memfd");
    let r = comm.all_gather_v(&mine, &mut got, &counts);
    rep.check(
        "shared buffers: all_gather_v",
        r.is_ok() && bytes(&got) == bytes(&want),
    );
    // A message from the middle of a shared buffer.
    let next = (me + 1) % n as u32;
    let prev = (me + n as u32 - 1) % n as u32;
    let mut got = zeros::<f32>(c / 2);
    let r = if me % 2 == 0 {
        comm.send(&input[c / 3..c / 3 + c / 2], next as usize)
            .and_then(|()| comm.recv(&mut got, prev as usize))
    } else {
        comm.recv(&mut got, prev as usize)
            .and_then(|()| comm.send(&input[c / 3..c / 3 + c / 2], next as usize))
    };
    let want = fill::<f32>(prev, c);
    rep.check(
        "shared buffers: send/recv of a slice",
        r.is_ok() && bytes(&got) == bytes(&want[c / 3..c / 3 + c / 2]),
    );
}
