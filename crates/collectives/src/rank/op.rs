//! What a rank brings to a meeting: its calls' descriptors and the memory they lend, and
//! what comes back: the outcome, shared by every rank of the call.
//!
//! Descriptors are compared before anything runs, so a count, element type, op, root or
//! call order that differs between ranks is an error on every rank, never a wrong result.

use std::fmt::Write as _;
use std::sync::Arc;

use relaycc_route::{Collective, DType, ReduceOp};

use crate::error::CollectivesError;

use super::Shared;

/// What every rank of one collective must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desc {
    pub call: &'static str,
    pub collective: Collective,
    pub dtype: DType,
    pub op: ReduceOp,
    pub root: usize,
    /// Elements per rank (the request's count); unused by the `v` collectives.
    pub count: u64,
    /// all_gather_v: every rank's count (the same list on every rank). all_to_all_v: this
    /// rank's send counts, per destination.
    pub counts: Vec<u64>,
    /// all_to_all_v: this rank's receive counts, per source.
    pub recv_counts: Vec<u64>,
}

fn rooted(c: Collective) -> bool {
    matches!(
        c,
        Collective::Reduce | Collective::Broadcast | Collective::Gather | Collective::Scatter
    )
}

impl Desc {
    fn show(&self) -> String {
        let mut s = format!("{} of {}", self.call, self.dtype);
        if self.collective.reduces() {
            let _ = write!(s, ", op {}", self.op);
        }
        if rooted(self.collective) {
            let _ = write!(s, ", root {}", self.root);
        }
        match self.collective {
            Collective::AllGatherV => {
                let _ = write!(s, ", counts {:?}", self.counts);
            }
            Collective::AllToAllV => {}
            _ => {
                let _ = write!(s, ", count {}", self.count);
            }
        }
        s
    }

    /// Why `other` (of rank `b`) does not match `self` (of rank `a`), if it does not.
    pub fn differs(&self, a: usize, other: &Desc, b: usize) -> Option<String> {
        let field = if self.collective != other.collective || self.call != other.call {
            "call"
        } else if self.dtype != other.dtype {
            "element type"
        } else if self.collective.reduces() && self.op != other.op {
            "op"
        } else if rooted(self.collective) && self.root != other.root {
            "root"
        } else if self.collective == Collective::AllGatherV && self.counts != other.counts {
            "counts"
        } else if !matches!(
            self.collective,
            Collective::AllGatherV | Collective::AllToAllV
        ) && self.count != other.count
        {
            "count"
        } else {
            return None;
        };
        Some(format!(
            "{field} differs: rank {a} calls {}, rank {b} calls {}",
            self.show(),
            other.show()
        ))
    }
}

/// A slice a rank lends for the duration of its call: its address and size, and for device
/// memory the CUDA device it lives on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub addr: usize,
    pub bytes: u64,
    pub device: Option<usize>,
}

/// Elements `offset..offset + len` (in elements of the call's type) of lent block `block`.
#[derive(Debug, Clone, Copy)]
pub struct View {
    pub(crate) block: usize,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// One operation of a rank's call.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// A collective, with the rank's input and output (`None` where the rank has none).
    Coll {
        desc: Desc,
        input: Option<View>,
        output: Option<View>,
    },
    /// A send to `peer`, or a receive from it.
    P2p {
        send: bool,
        peer: usize,
        view: View,
        dtype: DType,
    },
    /// `split(color, key)`.
    Split { color: Option<u32>, key: i64 },
}

/// A rank's arrival at a meeting: its communicator rank, the slices it lends, its operations
/// in order, or the error its own checks found (the others then fail too).
#[derive(Debug)]
pub(crate) struct Arrival {
    pub rank: usize,
    pub blocks: Vec<Span>,
    pub ops: Result<Vec<Op>, CollectivesError>,
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
