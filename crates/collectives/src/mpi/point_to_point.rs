//! Point to point between two ranks of an [`MpiCommunicator`] (`send`, `recv`): the pair
//! agrees pairwise on a communicator of its own (the receiver answers whether the sender's
//! descriptor matches), then the data moves as a one-op plan, prepared once per pair shape.

use std::os::raw::c_int;
use std::time::Instant;

#[cfg(feature = "cuda")]
use ::mpi::ffi;
use ::mpi::traits::AsRaw;
use relaycc_route::{Collective, DType, Request, Transfer};

use super::requests::Requests;
use super::typed::{host_bytes, lent, lent_mut};
use super::{MpiCommunicator, MpiError, MpiResult};
use crate::rank::{Lender, View};

/// The step name of the point-to-point handshake, in errors.
const HANDSHAKE: &str = "agree on a send/recv pair";

/// Point-to-point tags on the pair communicator: the descriptor and the answer. The data
/// message is op 0 of its plan, tag 0.
const TAG_DESC: c_int = 1;
const TAG_ACK: c_int = 2;

impl MpiCommunicator {
    /// One send (`sending`) or receive of `view` (elements of `dtype`, host memory lent by
    /// `lender`) with `peer`: a call of [`crate::Collectives::send`] or `recv` on this
    /// communicator. A buffer that is not host memory fails on this rank and is agreed as an
    /// impossible count, so the peer fails with [`MpiError::CountMismatch`] instead of
    /// waiting.
    pub(super) fn host_point_to_point(
        &self,
        lender: &mut Lender<'_>,
        view: View,
        sending: bool,
        peer: u32,
        dtype: DType,
    ) -> MpiResult<()> {
        let esize = dtype.size() as usize;
        let local = match lender.take_error() {
            Some(e) => Err(MpiError::Backend(e)),
            None => host_bytes(lender, view, esize, self.rank),
        };
        let (addr, bytes) = match local {
            Ok(at) => at,
            Err(e) => {
                // The peer sees a count it cannot match and fails too.
                let _ = self.p2p_agree(peer, sending, i64::MAX as u64, dtype, false);
                return Err(e);
            }
        };
        let count = view.len;
        let (input, output): (&[u8], &mut [u8]) = if sending {
            // SAFETY: a host span the caller lent for this call (`host_bytes` checked the
            // view against it), borrowed by the call, shared, for longer than this runs.
            let input = unsafe { lent((addr, bytes)) };
            (input, &mut [])
        } else {
            // SAFETY: as above, borrowed uniquely (a receive's buffer).
            let output = unsafe { lent_mut((addr, bytes)) };
            (&[], output)
        };
        self.point_to_point(peer, sending, (count, dtype), input, output)
            .map_err(|e| match e {
                MpiError::Buffer { .. } if !sending => MpiError::CountMismatch(format!(
                    "rank {} receives {count} elements from rank {peer}, which sends another \
                     count",
                    self.rank
                )),
                e => e,
            })
    }

    fn point_to_point(
        &self,
        peer: u32,
        sending: bool,
        (count, dtype): (u64, DType),
        input: &[u8],
        output: &mut [u8],
    ) -> MpiResult<()> {
        // Preparing a pair's shape is local here, so the two ranks' caches need not agree.
        let (src, dst, _) = self.p2p_agree(peer, sending, count, dtype, false)?;
        let key = (src, dst, count, dtype);
        let mut plans = self.p2p_plans.borrow_mut();
        if !plans.touch(&key) {
            let req = self.p2p_request(src, dst, count, dtype);
            let p = self.prepare_request(&req, self.p2p.as_raw())?;
            drop(plans.evict_to_fit(self.plan_cache_limits(), 1, p.weight));
            plans.insert(key, p);
        }
        let Some(p) = plans.peek_mut(&key) else {
            return Err(MpiError::Unsupported(
                "a prepared send/recv vanished".into(),
            ));
        };
        let ran = p
            .schedule
            .run(&mut p.reqs, input, output, &mut p.bufs, self.timeout.get());
        let bufs = &mut p.bufs;
        self.health
            .settle(ran, &mut p.reqs, || Box::new(std::mem::take(bufs)))
    }

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
            let what = match verdict {
                2 => MpiError::ElementMismatch(format!(
                    "ranks {me} and {peer} pass different element types to a send/recv pair"
                )),
                3 => MpiError::CallMismatch(format!(
                    "ranks {me} and {peer} are at different send/recv calls of their pair"
                )),
                _ => MpiError::CountMismatch(format!(
                    "ranks {me} and {peer} pass different counts to a send/recv pair"
                )),
            };
            return Err(what);
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
                ack[0] = if desc[1] != mine[1] || desc[2] != mine[2] {
                    2
                } else if desc[0] != mine[0] {
                    1
                } else if desc[3] != mine[3] {
                    3
                } else {
                    0
                };
                ack[1] = i64::from(desc[4] != 0 || mine[4] != 0);
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
                let e = match e {
                    MpiError::Timeout {
                        rank,
                        level,
                        pending,
                        after,
                        ..
                    } => MpiError::Timeout {
                        rank,
                        step: HANDSHAKE,
                        level,
                        pending,
                        after,
                    },
                    e => e,
                };
                let r = self
                    .health
                    .settle(Err(e), &mut reqs, || Box::new((desc, ack)));
                r.map(|()| (0, false))
            }
        }
    }
}
