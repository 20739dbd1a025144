//! `split(color, key)` (`ncclCommSplit`, `MPI_Comm_split`): ranks of one color form a new
//! communicator, ordered by key and then by parent rank; ranks without a color opt out.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::host::HostBackend;
use crate::backend::sealed::{Lending, Private};
use crate::communicator::Communicator;

use super::Shared;
use super::op::{Failure, Outcome, Payload, RankArrival, RankCallOp};

/// Build the new communicators of a split meeting (every arrival is one `RankCallOp::Split`).
pub(crate) fn run(parent: &Shared, arrivals: &[RankArrival]) -> Outcome {
    let mut colors: BTreeMap<u32, Vec<(i64, usize)>> = BTreeMap::new();
    for a in arrivals {
        if let Ok(
            [
                RankCallOp::Split {
                    color: Some(c),
                    key,
                },
            ],
        ) = a.ops.as_deref()
        {
            colors.entry(*c).or_default().push((*key, a.rank));
        }
    }
    let comm = &parent.comm;
    let host = comm.backend().lending(Private) == Lending::HostSlices;
    let mut out: Vec<Option<(Arc<Shared>, usize)>> = vec![None; comm.ranks()];
    for members in colors.values_mut() {
        members.sort_unstable();
        let devices: Vec<u32> = members.iter().map(|&(_, r)| comm.devices()[r]).collect();
        // Buffers are lent per call, so a sub-communicator needs no memory of the parent's
        // backend: a backend of its own keeps its launches apart from the parent's and its
        // siblings', so sub-communicators run concurrently, each ordered only by its callers'
        // (host calls: threads; CUDA: streams).
        let backend = own_backend(comm, host).map_err(|e| Failure::Failed(Arc::new(e)))?;
        let mut child =
            Communicator::new(comm.topology().clone(), &devices, comm.relays(), backend)
                .map_err(|e| Failure::Failed(Arc::new(e)))?;
        // The parent's settings carry over: its relays (with the idle GPUs it was given, if
        // it was made `with_idle_relays`), its staging budget and its plan-cache limits.
        child.set_staging_budget(comm.staging_budget());
        child.set_plan_cache_limits(comm.plan_cache_limits());
        let shared = Arc::new(match &parent.flags {
            Some(f) => {
                Shared::with_flags(child, f.shape()).map_err(|e| Failure::Failed(Arc::new(e)))?
            }
            None => Shared::new(child),
        });
        for (i, &(_, r)) in members.iter().enumerate() {
            out[r] = Some((shared.clone(), i));
        }
    }
    Ok(Payload::Split(out))
}

/// A backend for a sub-communicator of `comm`: a host backend of its own for host slices, a
/// sibling of the parent's CUDA backend (the same devices, streams and launch order of its
/// own) for CUDA ranks, the parent's own otherwise.
fn own_backend(
    comm: &Communicator,
    host: bool,
) -> crate::error::Result<Arc<dyn crate::backend::Backend>> {
    if host {
        return Ok(Arc::new(HostBackend::new()));
    }
    #[cfg(feature = "cuda")]
    if let Some(cuda) = comm.backend().as_cuda(Private) {
        return Ok(Arc::new(cuda.sibling()?));
    }
    Ok(comm.backend_arc())
}
