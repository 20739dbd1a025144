//! [`Collectives`]: the one set of per-rank collective calls, the same on every surface
//! (ranks on threads with host slices, [`RankComm`]; ranks on threads with cudarc buffers on
//! the caller's stream, `OnStream`; one rank per MPI process on host slices,
//! `mpi::MpiCommunicator`, or on cudarc buffers, `mpi::MpiOnStream`), written once as the trait's provided methods over
//! [`super::RankGroup`]. What differs between surfaces is how a rank's call meets the
//! others' and runs, behind the crate-private `Runner` seam.

use std::time::Duration;

#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use cudarc::driver::CudaStream;
use relaycc_route::ReduceOp;

use crate::element::Element;
use crate::error::Result;

use super::buffers::{Lender, RecvBuf, SendBuf};
use super::op::RankCallOp;
use super::{Departure, RankComm, RankGroup};
use sealed::RunnerToken;

pub(crate) mod sealed {
    use super::super::Departure;
    use super::super::buffers::Lender;
    use super::super::op::RankCallOp;
    use crate::error::Result;

    /// A token only this crate makes: methods that take it cannot be called from outside,
    /// although a `Collectives` bound lets outside code see the supertrait's methods.
    #[derive(Debug, Clone, Copy)]
    pub struct RunnerToken(());

    impl RunnerToken {
        /// The token.
        pub(crate) fn new() -> Self {
            RunnerToken(())
        }
    }

    /// How a rank's calls meet the other ranks' and run: the in-process meeting of ranks on
    /// threads, or MPI's agreement between processes. Crate-private: the library relies on
    /// it to run calls only on memory the call lends.
    pub trait Runner {
        /// This rank.
        fn me(&self) -> usize;
        /// Ranks of the communicator.
        fn n(&self) -> usize;
        /// The tag of the next call ([`super::Collectives::tag_next`]).
        fn tag(&self) -> u64;
        /// Forget the tag once a call took it.
        fn clear_tag(&mut self, _: RunnerToken);
        /// Leave a group's operations (or the error its arguments gave) with the other
        /// ranks' and return a departure that waits for the outcome; a runner that cannot
        /// leave a call behind runs it before it returns.
        fn depart<'b>(
            &mut self,
            lender: Lender<'b>,
            ops: Vec<RankCallOp>,
            _: RunnerToken,
        ) -> Departure<'b>;
        /// Run one send or receive (`op`, a `RankCallOp::P2p`) with its one peer only.
        fn point_to_point(
            &mut self,
            call: &'static str,
            lender: Lender<'_>,
            op: RankCallOp,
            _: RunnerToken,
        ) -> Result<()>;
    }
}

/// Single calls, each a group of one operation, from the table of collectives
/// (`rank_group.rs`, `rank_collectives!`): `name "call" io (arguments);` makes
/// `fn name<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(&mut self,
/// arguments) -> Result<()>` (`buf` in place of `io`: only `R: RecvBuf<T> + ?Sized`), which
/// adds [`RankCalls`](super::RankCalls)'s `name` with the arguments and runs it as call `call`.
macro_rules! single {
    () => {};
    ($(#[$doc:meta])* $name:ident $call:literal io ($($a:ident: $t:ty),*); $($rest:tt)*) => {
        single!(@fn [$(#[$doc])*] $name $call [S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized]
            ($($a: $t),*));
        single!($($rest)*);
    };
    ($(#[$doc:meta])* $name:ident $call:literal buf ($($a:ident: $t:ty),*); $($rest:tt)*) => {
        single!(@fn [$(#[$doc])*] $name $call [R: RecvBuf<T> + ?Sized] ($($a: $t),*));
        single!($($rest)*);
    };
    (@fn [$($doc:tt)*] $name:ident $call:literal [$($gen:tt)*] ($($a:ident: $t:ty),*)) => {
        $($doc)*
        fn $name<T: Element, $($gen)*>(&mut self, $($a: $t),*) -> Result<()> {
            let mut g = self.group();
            g.$name($($a),*);
            g.finish($call)
        }
    };
}

/// The per-rank collective calls, the same on every surface: [`RankComm`] (ranks on threads,
/// host slices), `OnStream` (feature `cuda`: cudarc buffers on the caller's stream),
/// `mpi::MpiCommunicator` (feature `mpi`: one rank per process on host slices; also through
/// `&MpiCommunicator`), `mpi::MpiOnStream` (features `mpi` and `cuda`: one rank per process,
/// from `MpiGpu::on(&stream)` on cudarc buffers or `MpiGpu::on_host()` on host slices
/// through a backend). On MPI processes a group runs its collectives one after another, or
/// its sends and receives at once (GPU ranks: alone), not both kinds in one group, and
/// `scatter_in_place` / `reduce_scatter_in_place` are refused on every rank. Each rank
/// calls the same collectives in the same order, each on its own buffers; a call returns
/// when the operation is done on this rank (or, on a stream, enqueued there).
///
/// Errors are the same on every rank: a call whose ranks disagree (collective, element type,
/// count, op, root, tag, order) is [`crate::CollectivesError::RankMismatch`], a rank missing
/// for longer than the timeout is [`crate::CollectivesError::RankTimeout`], naming it and the
/// call (on MPI processes the same facts come as `CollectivesError::Mpi` holding
/// `MpiError::Absent`). Ranks in one host memory run collectives without a
/// rendezvous ([`RankComm`]): there a rank whose own part needed nothing from the ranks that failed may
/// finish its call, and gets the error, as [`crate::CollectivesError::Aborted`], at its next.
///
/// An engine writes its step once, generic over the surface:
///
/// ```
/// use relaycc_collectives::{Collectives, RankComm, RecvBuf, ReduceOp};
///
/// fn average_gradients<C: Collectives, B: RecvBuf<f32> + ?Sized>(comm: &mut C, grads: &mut B) {
///     comm.all_reduce_in_place(grads, ReduceOp::Avg).expect("all_reduce");
/// }
///
/// let ranks = RankComm::host(2)?;
/// let threads: Vec<_> = ranks
///     .into_iter()
///     .map(|mut rank| {
///         std::thread::spawn(move || {
///             let mut grads = vec![rank.rank() as f32; 8];
///             average_gradients(&mut rank, &mut grads[..]);
///             grads[0]
///         })
///     })
///     .collect();
/// for t in threads {
///     assert_eq!(t.join().expect("rank"), 0.5);
/// }
/// # Ok::<(), relaycc_collectives::CollectivesError>(())
/// ```
pub trait Collectives: sealed::Runner {
    /// This rank.
    fn rank(&self) -> usize {
        self.me()
    }
    /// Number of ranks of the communicator.
    fn ranks(&self) -> usize {
        self.n()
    }
    /// How long a call waits for the other ranks before it fails with
    /// [`crate::CollectivesError::RankTimeout`].
    fn timeout(&self) -> Duration;
    /// Wait at most `timeout` for the other ranks in every later call of this rank
    /// ([`crate::DEFAULT_RANK_TIMEOUT`] unless set).
    fn set_timeout(&mut self, timeout: Duration);
    /// Tag this rank's next call (a single call or a group) with `tag`; 0 (the default) tags
    /// nothing. Ranks' calls are matched by their order, so a rank that skips a call meets
    /// the others' next one: where that has another shape the call fails, but where it has
    /// the same shape (the next layer's all_reduce of the same size, say) it pairs silently
    /// with the wrong call and returns wrong results. Tags catch that: every rank's call must
    /// carry the same tag (a step or layer number, say), else every rank gets
    /// [`crate::CollectivesError::RankMismatch`] (ranks that run directly: before they touch
    /// another rank's memory). The tag applies to one call.
    fn tag_next(&mut self, tag: u64);
    /// Start a group of this rank's calls ([`RankGroup`]): `ncclGroupStart`.
    fn group<'b>(&'b mut self) -> RankGroup<'b, 'b>;

    super::rank_group::rank_collectives!(single);

    /// Send `buf` to rank `peer` (`ncclSend`, `MPI_Send`), meeting its `recv`; only the two
    /// ranks take part.
    fn send<T: Element, S: SendBuf<T> + ?Sized>(&mut self, buf: &S, peer: usize) -> Result<()> {
        let mut g = self.group();
        g.send(buf, peer);
        g.finish_point_to_point("send")
    }

    /// Receive into `buf` from rank `peer` (`ncclRecv`, `MPI_Recv`), meeting its `send`.
    fn recv<T: Element, R: RecvBuf<T> + ?Sized>(&mut self, buf: &mut R, peer: usize) -> Result<()> {
        let mut g = self.group();
        g.recv(buf, peer);
        g.finish_point_to_point("recv")
    }
}

impl sealed::Runner for RankComm {
    fn me(&self) -> usize {
        self.rank
    }
    fn n(&self) -> usize {
        self.shared.comm.ranks()
    }
    fn tag(&self) -> u64 {
        self.next_tag
    }
    fn clear_tag(&mut self, _: RunnerToken) {
        self.next_tag = 0;
    }
    fn depart<'b>(
        &mut self,
        lender: Lender<'b>,
        ops: Vec<RankCallOp>,
        _: RunnerToken,
    ) -> Departure<'b> {
        self.depart_rank(lender, ops)
    }
    fn point_to_point(
        &mut self,
        call: &'static str,
        lender: Lender<'_>,
        op: RankCallOp,
        _: RunnerToken,
    ) -> Result<()> {
        self.meet_point_to_point(call, lender, op)
    }
}

impl Collectives for RankComm {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }
    fn tag_next(&mut self, tag: u64) {
        self.next_tag = tag;
    }
    fn group<'b>(&'b mut self) -> RankGroup<'b, 'b> {
        RankGroup::new(self, Lender::default())
    }
}

/// A rank's handle with the caller's CUDA stream ([`RankComm::on`]): the same calls as
/// [`RankComm`]'s ([`Collectives`]), on cudarc device buffers (`CudaSlice<T>`, `CudaView`,
/// `CudaViewMut`), enqueued on the stream without host synchronization. The plan's streams
/// wait for an event recorded on each rank's stream, and each rank's stream waits for the
/// plan's end, so a kernel enqueued on the stream after the call sees the result, and
/// synchronizing the stream waits for this call only. The call returns once every rank's
/// part is enqueued.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub struct OnStream<'s> {
    comm: &'s mut RankComm,
    stream: &'s Arc<CudaStream>,
}

#[cfg(feature = "cuda")]
impl sealed::Runner for OnStream<'_> {
    fn me(&self) -> usize {
        self.comm.me()
    }
    fn n(&self) -> usize {
        self.comm.n()
    }
    fn tag(&self) -> u64 {
        self.comm.tag()
    }
    fn clear_tag(&mut self, p: RunnerToken) {
        self.comm.clear_tag(p);
    }
    fn depart<'b>(
        &mut self,
        lender: Lender<'b>,
        ops: Vec<RankCallOp>,
        p: RunnerToken,
    ) -> Departure<'b> {
        self.comm.depart(lender, ops, p)
    }
    fn point_to_point(
        &mut self,
        call: &'static str,
        lender: Lender<'_>,
        op: RankCallOp,
        p: RunnerToken,
    ) -> Result<()> {
        self.comm.point_to_point(call, lender, op, p)
    }
}

#[cfg(feature = "cuda")]
impl Collectives for OnStream<'_> {
    fn timeout(&self) -> Duration {
        self.comm.timeout
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.comm.timeout = timeout;
    }
    fn tag_next(&mut self, tag: u64) {
        self.comm.next_tag = tag;
    }
    fn group<'b>(&'b mut self) -> RankGroup<'b, 'b> {
        let lender = Lender {
            stream: Some(self.stream),
            ..Lender::default()
        };
        RankGroup::new(self, lender)
    }
}

#[cfg(feature = "cuda")]
impl RankComm {
    /// This rank's calls on the caller's CUDA stream `stream` (`ncclAllReduce(..., comm,
    /// stream)`): see [`OnStream`]. Needs a communicator on the CUDA backend; elsewhere every
    /// call returns an error.
    pub fn on<'s>(&'s mut self, stream: &'s Arc<CudaStream>) -> OnStream<'s> {
        OnStream { comm: self, stream }
    }
}
