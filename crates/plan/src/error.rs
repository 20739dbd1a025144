//! The one error type of relaycc-route.

/// What can go wrong while planning, checking or simulating.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// A plan built for one domain of hosts does not fold into a template: it is not the same
    /// on every period of hosts, or its window did not settle (`relaycc_planners::template`).
    #[error("plan does not fold into a template of one domain: {0}")]
    NotSymmetric(String),
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
    #[error("plan check failed{}: {message}", at_op(*op))]
    PlanCheck {
        /// The op index where the problem shows; `usize::MAX` for whole-plan problems, which
        /// the message leaves out.
        op: usize,
        /// What is wrong.
        message: String,
    },
    /// A plan's predicted bandwidth exceeds the bound for its request: the simulation or the
    /// plan is wrong, so the figure is not reported as a result.
    #[error(
        "{algorithm} is predicted at {predicted_gbps:.3} GB/s algbw, above the bound of \
         {bound_gbps:.3} GB/s for {request}"
    )]
    AboveBound {
        /// The plan's algorithm name.
        algorithm: String,
        /// What the request is, e.g. `all_reduce of 64 MiB on GPU0,GPU1`.
        request: String,
        /// The predicted algorithm bandwidth, GB/s.
        predicted_gbps: f64,
        /// The bound's algorithm bandwidth, GB/s.
        bound_gbps: f64,
    },
    /// A plan needs more staging memory on a device than the staging budget allows, even with
    /// its smallest pipelining chunk: the chunk floor of the budget's fitting, or the chunk
    /// below which the plan would exceed the op cap (`ops_needed` says which).
    #[error(
        "{algorithm} needs {} of staging on {device}, above the staging budget of {} per \
         device{}",
        describe_bytes(*needed_bytes),
        describe_bytes(*budget_bytes),
        describe_op_cap(*ops_needed, *op_cap)
    )]
    StagingBudget {
        /// The plan's algorithm name.
        algorithm: String,
        /// The device (`GPU3`, `host12`).
        device: String,
        /// Staging bytes the plan needs there.
        needed_bytes: u64,
        /// The budget per device, bytes.
        budget_bytes: u64,
        /// None when the chunk reached its floor with the budget still exceeded; the ops the
        /// plan would need at a chunk that fits when the op cap
        /// (`relaycc_planners::staging::MAX_FITTED_OPS`) stopped the shrinking first.
        ops_needed: Option<u64>,
        /// The most ops a fitted plan may hold (the op cap in force).
        op_cap: u64,
    },
    /// A request or a plan passes one of the limits that keep planning and running bounded
    /// in time and memory; nothing past it was built.
    #[error("{what}: above {limit}")]
    OverLimit {
        /// What passed the limit, with its size.
        what: String,
        /// The limit, with its value.
        limit: String,
    },
    /// A plan's JSON could not be read.
    #[error("cannot read plan: {0}")]
    PlanJson(String),
    /// A topology error surfaced while planning.
    #[error(transparent)]
    Topo(#[from] relaycc_topo::TopoError),
}

/// ` at op N`, or nothing for the whole-plan sentinel `usize::MAX`.
fn at_op(op: usize) -> String {
    if op == usize::MAX {
        String::new()
    } else {
        format!(" at op {op}")
    }
}

/// The result type of relaycc-route.
pub type Result<T, E = RouteError> = std::result::Result<T, E>;

/// The tail of a [`RouteError::StagingBudget`] message: empty when the budget stopped the
/// fitting, else the op cap and the ops a chunk that fits would need.
fn describe_op_cap(ops_needed: Option<u64>, op_cap: u64) -> String {
    match ops_needed {
        None => String::new(),
        Some(ops) => format!(
            " at the smallest chunk the op cap allows: a chunk that fits needs about {ops} ops, \
             above the cap of {op_cap} ops per plan"
        ),
    }
}

/// Bytes with a binary unit for messages: `402653184 bytes (384 MiB)`.
pub fn describe_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ];
    let (u, d) = UNITS
        .iter()
        .copied()
        .find(|(_, d)| b >= *d)
        .unwrap_or(("B", 1));
    if d == 1 {
        format!("{b} bytes")
    } else {
        format!("{b} bytes ({:.1} {u})", b as f64 / d as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_plan_failures_print_no_op_index() {
        let whole = RouteError::PlanCheck {
            op: usize::MAX,
            message: "output buffer missing".into(),
        };
        assert_eq!(
            whole.to_string(),
            "plan check failed: output buffer missing"
        );
        let one = RouteError::PlanCheck {
            op: 17,
            message: "buffer missing".into(),
        };
        assert_eq!(
            one.to_string(),
            "plan check failed at op 17: buffer missing"
        );
    }

    #[test]
    fn above_bound_names_both_figures() {
        let e = RouteError::AboveBound {
            algorithm: "ring x0".into(),
            request: "all_gather of 4 bytes on 4 GPUs".into(),
            predicted_gbps: 1753.0,
            bound_gbps: 13.0,
        };
        let m = e.to_string();
        assert!(m.contains("1753.000") && m.contains("13.000"), "{m}");
        assert!(m.starts_with("ring x0 is predicted"), "{m}");
    }
}
