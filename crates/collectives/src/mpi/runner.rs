//! MPI ranks behind the one front door: the [`MpiCommunicator`] itself (host slices) and
//! the GPU ranks' [`MpiOnStream`] (feature `cuda`) implement [`Collectives`] through the
//! crate-private `Runner` seam, so an engine's step written against the trait runs unchanged
//! on threads ([`crate::RankComm`]) and on MPI processes.
//!
//! A group's operations arrive here as the same descriptors and lent views every surface
//! makes ([`crate::rank::RankGroup`]); each collective is mapped onto the MPI call shape
//! (its local checks, then the agreement every rank takes part in) and run before the next,
//! in order, so every rank runs the same sequence. A group's sends and receives run together
//! with the peers they name (`p2p_group.rs` on host ranks; GPU ranks take one at a time),
//! after its collectives when it has both: every rank of a group with collectives calls it
//! (as on threads, where such a group meets every rank), so each meets its peers' sends and
//! receives once every rank is past the collectives, and a collective that fails fails on
//! every rank, none of which then posts its sends and receives.

use std::time::Duration;

#[cfg(feature = "cuda")]
use super::gpu::MpiOnStream;
use super::typed_call::{CheckedCall, Mapped};
use super::{MpiCommunicator, MpiResult};
use crate::error::{CollectivesError, Result};
use crate::rank::collectives::sealed::{Runner, RunnerToken};
use crate::rank::{Collectives, Departure, Lender, P2pOp, RankCallOp, RankGroup, View};

/// An MPI rank that runs a group's collectives one at a time, or its sends and receives at
/// once: this process's host rank (the
/// [`MpiCommunicator`], on host slices) or a GPU rank ([`MpiOnStream`]).
pub(super) trait MpiRank {
    /// The communicator.
    fn communicator(&self) -> &MpiCommunicator;
    /// The tag of this rank's next call ([`Collectives::tag_next`]).
    fn next_tag(&self) -> u64;
    /// Set (or, with 0, clear) the tag of this rank's next call.
    fn set_next_tag(&mut self, tag: u64);
    /// One collective: the local checks' verdict `shape` on what `lender` lent (`vin`: a
    /// separate input; `vout`: the output, holding the input when in place).
    fn run_call(
        &mut self,
        shape: CheckedCall,
        lender: &mut Lender<'_>,
        vin: Option<View>,
        vout: Option<View>,
    ) -> MpiResult<()>;
    /// A group of sends and receives, `ops`, whose buffers `lender` lent.
    fn run_pairs(&mut self, lender: &mut Lender<'_>, ops: &[P2pOp]) -> MpiResult<()>;
}

/// A send or receive (`None` for another operation).
fn pair_op(op: &RankCallOp) -> Option<P2pOp> {
    match op {
        RankCallOp::P2p(p) => Some(*p),
        _ => None,
    }
}

/// Run a group's collectives in order, then its sends and receives together (module docs);
/// the first error stops the group.
fn run_group<R: MpiRank>(
    rank: &mut R,
    lender: &mut Lender<'_>,
    mut ops: Vec<RankCallOp>,
) -> Result<()> {
    let mut pairs: Vec<P2pOp> = Vec::new();
    ops.retain(|op| match pair_op(op) {
        Some(p) => {
            pairs.push(p);
            false
        }
        None => true,
    });
    // An empty group still goes to `run_collectives`, which agrees an argument error.
    if pairs.is_empty() || !ops.is_empty() {
        run_collectives(rank, lender, ops)?;
    }
    if !pairs.is_empty() {
        rank.run_pairs(lender, &pairs)?;
    }
    Ok(())
}

/// A group's collectives (no send or receive among `ops`), in order.
fn run_collectives<R: MpiRank>(
    rank: &mut R,
    lender: &mut Lender<'_>,
    ops: Vec<RankCallOp>,
) -> Result<()> {
    if ops.is_empty() {
        // An argument error found while adding (nothing was added): agree it as a failed
        // call, so the other ranks fail too instead of waiting.
        if lender.has_error() {
            return Ok(rank.run_call(CheckedCall::nothing(), lender, None, None)?);
        }
        return Ok(());
    }
    for op in ops {
        match op {
            RankCallOp::Coll {
                desc,
                input,
                output,
                ..
            } => {
                let Mapped { shape, vin, vout } = rank.communicator().check_op(desc, input, output);
                rank.run_call(shape, lender, vin, vout)?;
            }
            RankCallOp::P2p(_) => {
                return Err(CollectivesError::Unmatched(
                    "a send or receive among a group's collectives".into(),
                ));
            }
            RankCallOp::Split { .. } => {
                return Err(CollectivesError::Setup(
                    "split: MPI ranks split their communicator with MpiCommunicator::split".into(),
                ));
            }
        }
    }
    Ok(())
}

/// One send or receive alone (`op`, a `RankCallOp::P2p`) with its peer.
fn run_point_to_point<R: MpiRank>(
    rank: &mut R,
    mut lender: Lender<'_>,
    op: RankCallOp,
) -> Result<()> {
    let Some(op) = pair_op(&op) else {
        return Err(CollectivesError::Unmatched(
            "a point-to-point call holds one send or receive".into(),
        ));
    };
    let r = rank.run_pairs(&mut lender, &[op]);
    drop(lender);
    Ok(r?)
}

/// Every MPI rank meets the others the same way: each operation of a group runs in order,
/// before the call returns.
impl<R: MpiRank> Runner for R {
    fn me(&self) -> usize {
        self.communicator().rank as usize
    }
    fn n(&self) -> usize {
        self.communicator().size as usize
    }
    fn tag(&self) -> u64 {
        self.next_tag()
    }
    fn clear_tag(&mut self, _: RunnerToken) {
        self.set_next_tag(0);
    }
    fn depart<'b>(
        &mut self,
        mut lender: Lender<'b>,
        ops: Vec<RankCallOp>,
        _: RunnerToken,
    ) -> Departure<'b> {
        let outcome = run_group(self, &mut lender, ops);
        // The lender's guards drop with the departure, after what the call enqueued.
        Departure::ran(outcome, lender)
    }
    fn point_to_point(
        &mut self,
        _call: &'static str,
        lender: Lender<'_>,
        op: RankCallOp,
        _: RunnerToken,
    ) -> Result<()> {
        run_point_to_point(self, lender, op)
    }
}

impl MpiRank for &MpiCommunicator {
    fn communicator(&self) -> &MpiCommunicator {
        self
    }
    fn next_tag(&self) -> u64 {
        self.next_tag.get()
    }
    fn set_next_tag(&mut self, tag: u64) {
        self.next_tag.set(tag);
    }
    fn run_call(
        &mut self,
        shape: CheckedCall,
        lender: &mut Lender<'_>,
        vin: Option<View>,
        vout: Option<View>,
    ) -> MpiResult<()> {
        self.host_call(shape, lender, vin, vout)
    }
    fn run_pairs(&mut self, lender: &mut Lender<'_>, ops: &[P2pOp]) -> MpiResult<()> {
        self.host_pairs(lender, ops)
    }
}

impl Runner for MpiCommunicator {
    fn me(&self) -> usize {
        self.rank as usize
    }
    fn n(&self) -> usize {
        self.size as usize
    }
    fn tag(&self) -> u64 {
        self.next_tag.get()
    }
    fn clear_tag(&mut self, token: RunnerToken) {
        (&*self).clear_tag(token);
    }
    fn depart<'b>(
        &mut self,
        lender: Lender<'b>,
        ops: Vec<RankCallOp>,
        token: RunnerToken,
    ) -> Departure<'b> {
        (&*self).depart(lender, ops, token)
    }
    fn point_to_point(
        &mut self,
        call: &'static str,
        lender: Lender<'_>,
        op: RankCallOp,
        token: RunnerToken,
    ) -> Result<()> {
        (&*self).point_to_point(call, lender, op, token)
    }
}

/// `Collectives` for the communicator and for a shared reference to it, alike: the trait's
/// state (the timeout, the next call's tag) lives in cells.
macro_rules! host_collectives {
    ($($(#[$doc:meta])* $ty:ty;)*) => {$(
        $(#[$doc])*
        impl Collectives for $ty {
            fn timeout(&self) -> Duration {
                self.timeout.get()
            }
            fn set_timeout(&mut self, timeout: Duration) {
                self.timeout.set(timeout);
            }
            fn tag_next(&mut self, tag: u64) {
                self.next_tag.set(tag);
            }
            fn group<'b>(&'b mut self) -> RankGroup<'b, 'b> {
                RankGroup::new(self, Lender::default())
            }
        }
    )*};
}
host_collectives! {
    /// This process's rank on host slices (`&[T]`, `&mut [T]`, `Vec<T>`): the calls every
    /// surface makes, run with MPI messages (or this host's shared memory) between the
    /// processes.
    MpiCommunicator;
    /// This process's rank on host slices through a shared reference, as `std` implements
    /// `Write` for `&File`: the calls of a communicator that a GPU rank
    /// ([`super::MpiGpu`]) also holds (`let mut host = &comm; host.all_reduce(..)`). Its
    /// state lives in cells, so a shared reference suffices; the communicator is not `Sync`.
    &MpiCommunicator;
}

#[cfg(feature = "cuda")]
impl MpiRank for MpiOnStream<'_, '_> {
    fn communicator(&self) -> &MpiCommunicator {
        self.gpu().comm()
    }
    fn next_tag(&self) -> u64 {
        self.gpu().next_tag
    }
    fn set_next_tag(&mut self, tag: u64) {
        self.gpu_mut().next_tag = tag;
    }
    fn run_call(
        &mut self,
        shape: CheckedCall,
        lender: &mut Lender<'_>,
        vin: Option<View>,
        vout: Option<View>,
    ) -> MpiResult<()> {
        let stream = self.stream_ref();
        self.gpu_mut().call(shape, lender, vin, vout, stream)
    }
    fn run_pairs(&mut self, lender: &mut Lender<'_>, ops: &[P2pOp]) -> MpiResult<()> {
        let [op] = ops else {
            return Err(super::MpiError::Unsupported(
                "GPU ranks over MPI run sends and receives one at a time: call send/recv on \
                 their own"
                    .into(),
            ));
        };
        let peer = u32::try_from(op.peer).unwrap_or(u32::MAX);
        let stream = self.stream_ref();
        self.gpu_mut().p2p(
            lender,
            op.view,
            op.send,
            peer,
            (op.view.len, op.dtype),
            stream,
        )
    }
}

#[cfg(feature = "cuda")]
impl Collectives for MpiOnStream<'_, '_> {
    fn timeout(&self) -> Duration {
        self.gpu().comm().timeout.get()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.gpu().comm().timeout.set(timeout);
    }
    fn tag_next(&mut self, tag: u64) {
        self.set_next_tag(tag);
    }
    fn group<'b>(&'b mut self) -> RankGroup<'b, 'b> {
        let lender = self.lender();
        RankGroup::new(self, lender)
    }
}
