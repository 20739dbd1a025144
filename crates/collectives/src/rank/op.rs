//! What a rank brings to a meeting: its calls' descriptors and the memory they lend, and
//! what comes back: the outcome, shared by every rank of the call.
//!
//! Descriptors ([`crate::call::CallDesc`]) are compared before anything runs, so a count,
//! element type, op, root, tag or call order that differs between ranks is an error on every
//! rank, never a wrong result.

use std::sync::Arc;

use relaycc_route::DType;

pub(crate) use crate::call::CallDesc as Desc;
use crate::error::CollectivesError;

use super::Shared;

/// A slice a rank lends for the duration of its call: its address and size, and for device
/// memory the CUDA device it lives on; or, for the all-ranks [`crate::Group`]'s calls only,
/// a buffer the communicator's backend already holds (`held`; `addr` is unused then).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub addr: usize,
    pub bytes: u64,
    pub device: Option<usize>,
    pub held: Option<crate::buffer::RawView>,
}

/// Elements `offset..offset + len` (in elements of the call's type) of lent block `block`.
#[derive(Debug, Clone, Copy)]
pub struct View {
    pub(crate) block: usize,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl View {
    /// The address and bytes of this view of elements of `esize` bytes in its block of
    /// `spans` (lent addresses, by block); `None` where the block is not there or the
    /// address overflows.
    pub(crate) fn address_in(self, spans: &[Span], esize: u64) -> Option<(usize, u64)> {
        let b = spans.get(self.block)?;
        let at = usize::try_from(self.offset.checked_mul(esize)?).ok()?;
        Some((b.addr.checked_add(at)?, self.len.checked_mul(esize)?))
    }

    /// The view as a buffer the backend holds, where its block is one (`spans`, by block:
    /// the all-ranks calls' lending); `None` for a block of lent addresses.
    pub(crate) fn held_in(self, spans: &[Span], dtype: DType) -> Option<crate::buffer::RawView> {
        let whole = spans.get(self.block)?.held?;
        let esize = dtype.size();
        Some(crate::buffer::RawView {
            region: crate::backend::ByteRegion {
                offset: whole.region.offset + self.offset * esize,
                bytes: self.len * esize,
                ..whole.region
            },
            len: self.len,
            ..whole
        })
    }
}

/// One operation of a rank's call, as the rank brings it to a meeting: a collective with its
/// descriptor and the views of its input and output, a send or receive with its peer, or a
/// split.
#[derive(Debug, Clone)]
pub enum RankCallOp {
    /// A collective, with the rank's input and output (`None` where the rank has none).
    Coll {
        desc: Desc,
        input: Option<View>,
        output: Option<View>,
        /// Made by an `_in_place` call (the same on every rank, which a rank without both
        /// buffers cannot tell from its views).
        in_place: bool,
    },
    /// A send to `peer`, or a receive from it.
    P2p(P2pOp),
    /// `split(color, key)`.
    Split { color: Option<u32>, key: i64 },
}

/// A send of `view` (elements of `dtype`) to rank `peer`, or a receive into it from `peer`:
/// one operation of a group, as every surface (threads, CUDA streams, MPI ranks) runs it.
#[derive(Clone, Copy, Debug)]
pub struct P2pOp {
    /// A send (else a receive).
    pub send: bool,
    /// The other rank, as the caller named it.
    pub peer: usize,
    /// The lent buffer's view.
    pub view: View,
    /// The element type.
    pub dtype: DType,
}

/// A rank's arrival at a meeting: its communicator rank, the slices it lends, its operations
/// in order, or the error its own checks found (the others then fail too).
#[derive(Debug)]
pub(crate) struct RankArrival {
    pub rank: usize,
    pub blocks: Vec<Span>,
    pub ops: Result<Vec<RankCallOp>, CollectivesError>,
    /// The caller's stream, for calls on device memory.
    #[cfg(feature = "cuda")]
    pub stream: Option<std::sync::Arc<cudarc::driver::CudaStream>>,
}

/// What a meeting gives back to every rank.
#[derive(Debug)]
pub(crate) enum Payload {
    /// The operation ran.
    Done,
    /// Per rank of the parent (in rank order): its new communicator and its rank there, or
    /// `None` where it opted out.
    Split(Vec<Option<(Arc<Shared>, usize)>>),
}

/// Why a meeting failed, for every rank.
#[derive(Debug)]
pub(crate) enum Failure {
    Mismatch(String),
    Timeout {
        seq: u64,
        missing: Vec<usize>,
        waited_ms: u64,
        gone: bool,
    },
    Failed(Arc<CollectivesError>),
    Internal(String),
}

pub(crate) type Outcome = Result<Payload, Failure>;

impl Failure {
    /// The error a rank's call `call` returns.
    pub fn to_error(&self, call: &'static str) -> CollectivesError {
        match self {
            Failure::Mismatch(m) => CollectivesError::RankMismatch {
                call,
                message: m.clone(),
            },
            Failure::Timeout {
                seq,
                missing,
                waited_ms,
                gone,
            } => CollectivesError::RankTimeout {
                call,
                seq: *seq,
                missing: missing.clone(),
                waited_ms: *waited_ms,
                gone: *gone,
            },
            Failure::Failed(e) => CollectivesError::RankFailed {
                call,
                source: e.clone(),
            },
            Failure::Internal(m) => CollectivesError::RankFailed {
                call,
                source: Arc::new(CollectivesError::Backend {
                    backend: "ranks",
                    message: m.clone(),
                }),
            },
        }
    }
}
