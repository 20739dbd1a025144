//! The one error type of relaycc-route.

/// What can go wrong while planning, checking or simulating.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The request is malformed (ranks, root, counts, types).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The topology cannot carry the request (no usable path, masked GPUs).
    #[error("cannot plan {what}: {why}")]
    NoRoute {
        /// What was being planned, e.g. `GPU0 -> GPU7`.
        what: String,
        /// Why no plan exists.
        why: String,
    },
    /// A plan breaks a rule of the IR or does not deliver its request.
    #[error("plan check failed{}: {message}", at_op(*.op))]
    PlanCheck {
        /// The op index where the problem shows (`usize::MAX` for whole-plan problems).
        op: usize,
        /// What is wrong.
        message: String,
    },
    /// A plan's JSON could not be read.
    #[error("cannot read plan: {0}")]
    PlanJson(String),
    /// A topology error surfaced while planning.
    #[error(transparent)]
    Topo(#[from] relaycc_topo::TopoError),
}

/// The result type of relaycc-route.
pub type Result<T, E = RouteError> = std::result::Result<T, E>;

/// Where a check failure shows: ` at op N`, or nothing for a whole-plan problem (`usize::MAX`).
fn at_op(op: usize) -> String {
    if op == usize::MAX {
        String::new()
    } else {
        format!(" at op {op}")
    }
}
