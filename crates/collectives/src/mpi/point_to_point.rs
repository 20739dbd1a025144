//! The pairwise agreement of point to point between two ranks of an [`MpiCommunicator`]
//! (`send`, `recv`), on a communicator of its own: the sender sends its descriptor, the
//! receiver answers whether it matches its own. GPU ranks then move the data as a one-op
//! plan, prepared once per pair shape (`gpu.rs`); host ranks post the same messages for
//! every operation of a group at once (`p2p_group.rs`).

use std::os::raw::c_int;
use std::time::Instant;

#[cfg(feature = "cuda")]
use ::mpi::ffi;
use ::mpi::traits::AsRaw;
use relaycc_route::{Collective, DType, Request, Transfer};

use super::requests::Requests;
use super::{MpiCommunicator, MpiError, MpiResult};

/// The step name of the point-to-point handshake, in errors.
pub(super) const HANDSHAKE: &str = "agree on a send/recv pair";

/// Point-to-point tags on the pair communicator: the descriptor and the answer. The data
/// message is op 0 of its plan, tag 0.
pub(super) const TAG_DESC: c_int = 1;
pub(super) const TAG_ACK: c_int = 2;

impl MpiCommunicator {
    /// The pairwise agreement of a send (`sending`) or a receive of `count` elements of
    /// `dtype` with `peer`, on the pair communicator within the timeout. `fresh`: this rank
    /// must prepare the pair's shape (it is not in its cache). Returns the pair as (source,
    /// destination) and whether either rank must prepare, the same answer on both, so that
    /// both take the same steps whatever each one's cache kept.
    ///
    /// Errors: `peer` is not another rank; [`MpiError::CountMismatch`],
    /// [`MpiError::ElementMismatch`] or [`MpiError::CallMismatch`] on both ranks when the
    /// two calls differ; [`MpiError::Timeout`] (which fails the communicator).
    pub(super) fn p2p_agree(
        &self,
        peer: u32,
        sending: bool,
        count: u64,
        dtype: DType,
        fresh: bool,
    ) -> MpiResult<(u32, u32, bool)> {
        self.health.check()?;
        let me = self.rank;
        if peer >= self.size || peer == me {
            return Err(MpiError::Unsupported(format!(
                "rank {me}: peer {peer} is not another rank (0..{})",
                self.size
            )));
        }
        let seq = {
            let mut s = self.p2p_seq.borrow_mut();
            let slot = s.entry((peer, sending)).or_insert(0);
            *slot += 1;
            *slot
        };
        let mine = [
            count as i64,
            dtype as i64,
            dtype.size() as i64,
            seq as i64,
            i64::from(fresh),
        ];
        let (verdict, prepare) = self.handshake(peer, sending, mine)?;
        if verdict != 0 {
            return Err(verdict_error(verdict, me, peer));
        }
        let (src, dst) = if sending { (me, peer) } else { (peer, me) };
        Ok((src, dst, prepare))
    }

    /// The request of one send/recv pair in rank space.
    pub(super) fn p2p_request(&self, src: u32, dst: u32, count: u64, dtype: DType) -> Request {
        let n = self.size;
        let mut req = Request::new(Collective::SendRecv, (0..n).collect(), count, dtype);
        req.transfers = vec![Transfer { src, dst, count }];
        req
    }

    /// The pair communicator of send/recv (a private duplicate of its own).
    #[cfg(feature = "cuda")]
    pub(super) fn p2p_raw(&self) -> ffi::MPI_Comm {
        self.p2p.as_raw()
    }

    /// The pairwise agreement: the sender sends its descriptor (count, element type and
    /// size, sequence number of the pair, whether it must prepare) and waits for the answer;
    /// the receiver compares it with its own and answers the verdict, 0 (match), 1 (count),
    /// 2 (element) or 3 (sequence), and whether either side must prepare. Both return the
    /// answer. Bounded by the timeout (a timeout fails the communicator; requests MPI keeps
    /// are buried with their buffers).
    fn handshake(&self, peer: u32, sending: bool, mine: [i64; 5]) -> MpiResult<(i64, bool)> {
        let mut reqs = Requests::new(self.p2p.as_raw(), self.rank);
        let mut desc = Box::new(mine);
        let mut ack = Box::new([0i64; 2]);
        let p = peer as c_int;
        let (desc_bytes, ack_bytes) = (8 * mine.len(), 16);
        let posted = (|| {
            if sending {
                // SAFETY: both boxes live until the requests complete: on success `wait`
                // returned, and on failure the boxes are buried with the stuck requests.
                unsafe {
                    reqs.irecv(ack.as_mut_ptr().cast(), ack_bytes, p, TAG_ACK)?;
                    reqs.isend(desc.as_ptr().cast(), desc_bytes, p, TAG_DESC)?;
                }
                reqs.wait(0, Instant::now() + self.timeout.get(), self.timeout.get())?;
                Ok((ack[0], ack[1] != 0))
            } else {
                // SAFETY: as above.
                unsafe { reqs.irecv(desc.as_mut_ptr().cast(), desc_bytes, p, TAG_DESC)? };
                reqs.wait(0, Instant::now() + self.timeout.get(), self.timeout.get())?;
                *ack = pair_verdict(&desc, &mine);
                reqs.clear();
                // SAFETY: as above.
                unsafe { reqs.isend(ack.as_ptr().cast(), ack_bytes, p, TAG_ACK)? };
                reqs.wait(0, Instant::now() + self.timeout.get(), self.timeout.get())?;
                Ok((ack[0], ack[1] != 0))
            }
        })();
        match posted {
            Ok(v) => Ok(v),
            Err(e) => {
                let r = self
                    .health
                    .settle(Err(at_step(e, HANDSHAKE)), &mut reqs, || {
                        Box::new((desc, ack))
                    });
                r.map(|()| (0, false))
            }
        }
    }
}

/// The receiver's answer to a sender's descriptor `theirs`, given its own `mine`: the
/// verdict, 0 (match), 1 (count), 2 (element) or 3 (sequence), and whether either side must
/// prepare the pair's shape.
pub(super) fn pair_verdict(theirs: &[i64; 5], mine: &[i64; 5]) -> [i64; 2] {
    let verdict = if theirs[1] != mine[1] || theirs[2] != mine[2] {
        2
    } else if theirs[0] != mine[0] {
        1
    } else if theirs[3] != mine[3] {
        3
    } else {
        0
    };
    [verdict, i64::from(theirs[4] != 0 || mine[4] != 0)]
}

/// The error of a failed verdict ([`pair_verdict`]) between ranks `me` and `peer`.
pub(super) fn verdict_error(verdict: i64, me: u32, peer: u32) -> MpiError {
    match verdict {
        2 => MpiError::ElementMismatch(format!(
            "ranks {me} and {peer} pass different element types to a send/recv pair"
        )),
        3 => MpiError::CallMismatch(format!(
            "ranks {me} and {peer} are at different send/recv calls of their pair"
        )),
        _ => MpiError::CountMismatch(format!(
            "ranks {me} and {peer} pass different counts to a send/recv pair"
        )),
    }
}

/// A timeout of the requests' wait, named as the point-to-point step `step` it happened in;
/// other errors as they are.
pub(super) fn at_step(e: MpiError, step: &'static str) -> MpiError {
    match e {
        MpiError::Timeout {
            rank,
            level,
            pending,
            after,
            ..
        } => MpiError::Timeout {
            rank,
            step,
            level,
            pending,
            after,
        },
        e => e,
    }
}
