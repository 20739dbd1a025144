//! Where NVLink SHARP serves a collective: the NVSwitch that reduces and multicasts for a set
//! of GPUs, and the ops and types it reduces. The NVLS planner (`planner::nvls`), the NCCL-like
//! baseline's algorithm choice and the bandwidth bound (`bound.rs`) all ask it, so it sits
//! below them.

use relaycc_topo::{NodeId, NodeKind, Topology};

use crate::dtype::{DType, ReduceOp};
use crate::request::{Collective, Request};

/// True when NVLink SHARP reduces `op` on `dtype`: the switch's `multimem.ld_reduce` adds,
/// and takes the minimum and maximum of, 16-bit floats and 32- and 64-bit integers, and adds
/// 32- and 64-bit floats; it does not multiply, average (NCCL's pre-multiplied sum) or
/// reduce 8-bit types, so NCCL offers no NVLS algorithm for those ([NCCL-src]:
/// `ncclNvlsSupported` and the NVLS kernels it generates per type and op).
pub fn nvls_reduces(op: ReduceOp, dtype: DType) -> bool {
    match dtype {
        DType::F16 | DType::Bf16 | DType::I32 | DType::U32 | DType::I64 | DType::U64 => {
            matches!(op, ReduceOp::Sum | ReduceOp::Min | ReduceOp::Max)
        }
        DType::F32 | DType::F64 => op == ReduceOp::Sum,
        DType::I8 | DType::U8 => false,
    }
}

/// The reducing NVSwitch of an all_reduce request, when NVLS serves it: every member on one
/// NVSwitch of sm90 or later ([`nvls_switch`]) and an op and type the switch reduces
/// ([`nvls_reduces`]).
pub fn nvls_switch_for(topo: &Topology, req: &Request) -> Option<NodeId> {
    if req.collective != Collective::AllReduce || !nvls_reduces(req.op, req.dtype) {
        return None;
    }
    nvls_switch(topo, &req.gpus)
}

/// The NVSwitch chip every member GPU reaches by a usable NVLink, when the members' NVSwitch
/// can reduce and multicast (every member sm90 or later, [`relaycc_topo::rates::NVLS_MIN_SM`]).
pub fn nvls_switch(topo: &Topology, gpus: &[u32]) -> Option<NodeId> {
    if gpus.len() < 2 {
        return None;
    }
    let mut nodes = Vec::with_capacity(gpus.len());
    for &g in gpus {
        let sm = topo.gpu_info(g).ok()?.compute_capability?.sm();
        topo.costs().nvls_efficiency(sm)?;
        nodes.push(topo.gpu(g).ok()?);
    }
    let first = nodes[0];
    topo.graph()
        .neighbors(first)
        .filter(|&s| matches!(topo.node(s).kind, NodeKind::NvSwitch))
        .find(|&s| {
            nodes.iter().all(|&g| {
                let up = topo.link_between(g, s);
                let down = topo.link_between(s, g);
                matches!((up, down), (Some(u), Some(d)) if topo.link_usable(u) && topo.link_usable(d))
            })
        })
}
