//! NVLS all_reduce: the NVSwitch reduces and multicasts (NVLink SHARP), as NCCL's NVLS
//! algorithm does on H100 and later.
//!
//! Each rank owns one shard of the vector. Per shard and pipelining chunk:
//! 1. **Reduce in the switch.** Every rank's input chunk crosses to the switch, which reduces
//!    them and sends the owner one result: an NVLS reduction group (shared edge: switch ->
//!    owner). The plan delivers each source into its own staging region on the owner and
//!    reduces them there, so that it runs byte for byte on the host backend; the simulator
//!    charges the owner's inbound edge once for the whole group.
//! 2. **Multicast from the switch.** The owner sends the reduced chunk to the switch once and
//!    the switch writes it to every other rank: an NVLS multicast group (shared edge: owner ->
//!    switch).
//!
//! Per GPU this sends (n+1)/n of the vector and receives one vector, where a ring sends and
//! receives 2(n-1)/n of it; the switch's share of the port rate for NVLS traffic is the cost
//! model's `nvls_sm90_efficiency` / `nvls_sm100_efficiency`. Source: [NCCL-src], the NVLS
//! algorithm (`src/device/all_reduce.h`, `multimem.ld_reduce` then `multimem.st`) and its
//! tuning (`src/graph/tuning.cc`).

use crate::plan_writer::PlanWriter;
use relaycc_topo::{LinkId, NodeId, Topology};

pub use relaycc_plan::nvls_support::{nvls_reduces, nvls_switch, nvls_switch_for};
use relaycc_plan::{BufferRef, Location, NvlsShare, Plan, Region};
use relaycc_plan::{Collective, Request};
use relaycc_plan::{Result, RouteError};

use super::{chunks, split_even};

/// The largest pipelining chunk of an NVLS plan, bytes. NCCL moves NVLS data in 128 KiB chunks
/// (`NCCL_NVLS_CHUNKSIZE`, [NCCL-src]); relaycc caps its chunk at 1 MiB, which keeps a 1 GiB
/// plan near 16k ops while the pipeline's fill and drain stay within 2% of the makespan
/// (4 chunks per shard, the collective default, lose 8% on dgx-h100 at 1 GiB).
pub const NVLS_MAX_CHUNK_BYTES: u64 = 1 << 20;

/// Staging slots per source on each shard's owner: chunk c of a shard lands in slot c mod
/// `NVLS_STAGING_SLOTS`, after the reduction of chunk c - `NVLS_STAGING_SLOTS` read that slot,
/// so an owner stages n x slots x chunk bytes whatever the message size (144 MiB on the 72
/// GPUs of an NVL72 with 1 MiB chunks; double buffering, since the switch reduces as chunks
/// arrive), where the switch itself
/// stages nothing: the slots exist so the host backend can run the plan byte for byte.
pub const NVLS_STAGING_SLOTS: u64 = 2;

/// The chunk (elements) the baseline's NVLS plan pipelines with for `req`.
pub fn nvls_chunk_elems(req: &Request) -> u64 {
    let esize = req.dtype.size().max(1);
    super::pipeline_chunk_elems(req)
        .min(NVLS_MAX_CHUNK_BYTES / esize)
        .max(1)
}

/// The directed edge a -> b as a plan names it.
fn edge(topo: &Topology, a: NodeId, b: NodeId) -> Result<u32> {
    topo.link_between(a, b)
        .map(|l: LinkId| l.index() as u32)
        .ok_or_else(|| RouteError::BadRequest("NVLS: a member lost its NVSwitch link".into()))
}

/// The NVLS all_reduce plan of `req`, pipelined in chunks of `chunk_elems`.
///
/// # Errors
/// [`RouteError::BadRequest`] when the request is not an all_reduce or its members share no
/// NVSwitch that reduces ([`nvls_switch`]).
pub fn all_reduce(topo: &Topology, req: &Request, chunk_elems: u64) -> Result<Plan> {
    if req.collective != Collective::AllReduce {
        return Err(RouteError::BadRequest(
            "NVLS plans serve all_reduce only".into(),
        ));
    }
    let sw = nvls_switch_for(topo, req).ok_or_else(|| {
        RouteError::BadRequest(format!(
            "NVLS needs every member on one NVSwitch of sm90 or later GPUs and an op and type \
             the switch reduces (not {} on {})",
            req.op, req.dtype
        ))
    })?;
    let n = req.nranks();
    let count = req.count;
    let nodes: Vec<NodeId> = req
        .gpus
        .iter()
        .map(|&g| topo.gpu(g))
        .collect::<std::result::Result<_, _>>()?;
    let up: Vec<u32> = nodes
        .iter()
        .map(|&g| edge(topo, g, sw))
        .collect::<Result<_>>()?;
    let down: Vec<u32> = nodes
        .iter()
        .map(|&g| edge(topo, sw, g))
        .collect::<Result<_>>()?;
    // Every op names what it waits for (`free`, `arrived`, `reduced`); see
    // `PlanWriter::ordered` for why nothing is derived here.
    let mut w = PlanWriter::ordered(Plan::new(req.clone(), "nvls"), None);
    let shards = split_even(count, n as u64);
    let mut group = 0u32;
    for (k, &(shard_off, shard_len)) in shards.iter().enumerate() {
        let owner = Location::Gpu(req.gpus[k]);
        // One lane per source into the owner and per destination out of it, so that a group's
        // copies run side by side and chunks follow each other on each lane.
        let in_lanes: Vec<u32> = (0..n)
            .map(|j| {
                w.plan
                    .add_lane(owner, format!("nvls shard {k} from rank {j}"))
            })
            .collect();
        let out_lanes: Vec<u32> = (0..n)
            .map(|j| {
                w.plan
                    .add_lane(owner, format!("nvls shard {k} to rank {j}"))
            })
            .collect();
        let reduce_lane = w.plan.add_lane(owner, format!("nvls shard {k} reduce"));
        let chunk = chunk_elems.max(1);
        let slot_elems = chunk.min(shard_len);
        let staging: Vec<BufferRef> = (0..n)
            .map(|_| {
                w.plan
                    .add_scratch(owner, NVLS_STAGING_SLOTS.saturating_mul(slot_elems))
            })
            .collect();
        // The reduction of each chunk, so that the chunk reusing its slot waits for it.
        let mut reductions: Vec<u32> = Vec::new();
        for (c, (rel, len)) in chunks(shard_len, chunk).enumerate() {
            let slot = (c as u64 % NVLS_STAGING_SLOTS) * slot_elems;
            let free: Vec<u32> = (c as u64)
                .checked_sub(NVLS_STAGING_SLOTS)
                .map(|prev| vec![reductions[prev as usize]])
                .unwrap_or_default();
            let at = shard_off + rel;
            let red = NvlsShare {
                group,
                shared_edge: down[k],
            };
            group += 1;
            let mut arrived = Vec::with_capacity(n);
            for j in 0..n {
                arrived.push(w.nvls_copy(
                    in_lanes[j],
                    Region::new(BufferRef::Input(j as u32), at, len),
                    Region::new(staging[j], slot, len),
                    vec![up[j], down[k]],
                    &free,
                    red,
                )?);
            }
            let srcs = staging.iter().map(|&s| Region::new(s, slot, len)).collect();
            let result = Region::new(BufferRef::Output(k as u32), at, len);
            let reduced = w.reduce(reduce_lane, srcs, result, true, &arrived)?;
            reductions.push(reduced);
            let cast = NvlsShare {
                group,
                shared_edge: up[k],
            };
            group += 1;
            for j in (0..n).filter(|&j| j != k) {
                w.nvls_copy(
                    out_lanes[j],
                    result,
                    Region::new(BufferRef::Output(j as u32), at, len),
                    vec![up[k], down[j]],
                    &[reduced],
                    cast,
                )?;
            }
        }
    }
    Ok(w.plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::{DType, ReduceOp};
    use relaycc_plan::{check, check_routes};
    use relaycc_sim::{SimConfig, simulate};

    fn req(n: u32, bytes: u64) -> Request {
        Request::new(
            Collective::AllReduce,
            (0..n).collect(),
            bytes / 4,
            DType::F32,
        )
    }

    #[test]
    fn nvls_serves_only_the_ops_and_types_the_switch_reduces() {
        let t = relaycc_topo::preset("dgx-h100").unwrap();
        let with = |op, dtype| {
            let mut r = req(8, 64 << 20);
            r.op = op;
            r.dtype = dtype;
            r
        };
        assert!(nvls_switch_for(&t, &with(ReduceOp::Sum, DType::F32)).is_some());
        assert!(nvls_switch_for(&t, &with(ReduceOp::Max, DType::Bf16)).is_some());
        for (op, dtype) in [
            (ReduceOp::Prod, DType::F32),
            (ReduceOp::Avg, DType::F16),
            (ReduceOp::Max, DType::F32),
            (ReduceOp::Sum, DType::U8),
        ] {
            let r = with(op, dtype);
            assert!(nvls_switch_for(&t, &r).is_none(), "{op} {dtype}");
            assert!(all_reduce(&t, &r, 1 << 16).is_err(), "{op} {dtype}");
            // Neither the baseline nor the bound counts on the switch reducing.
            let base = crate::baseline_plan(&t, &r).unwrap();
            assert!(!base.algorithm.contains("nvls"), "{}", base.algorithm);
        }
        let bound = |r: &Request| {
            crate::bound_gbps(&t, r, &relaycc_plan::path::RelayPolicy::Members).unwrap()
        };
        let sum = bound(&with(ReduceOp::Sum, DType::F32));
        let prod = bound(&with(ReduceOp::Prod, DType::F32));
        assert!(sum > prod * 1.5, "{sum} vs {prod}");
    }

    #[test]
    fn nvls_needs_a_reducing_switch() {
        for name in ["dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72"] {
            let t = relaycc_topo::preset(name).unwrap();
            assert!(nvls_switch(&t, &[0, 1, 2, 3]).is_some(), "{name}");
        }
        for name in ["dgx-a100", "dgx2", "dgx1-v100", "pcie-8gpu"] {
            let t = relaycc_topo::preset(name).unwrap();
            assert!(nvls_switch(&t, &[0, 1]).is_none(), "{name}");
            assert!(all_reduce(&t, &req(2, 1 << 20), 1 << 16).is_err(), "{name}");
        }
    }

    #[test]
    fn the_plan_is_proved_and_each_gpu_sends_n_plus_1_over_n() {
        let t = relaycc_topo::preset("dgx-h100").unwrap();
        let bytes = 64u64 << 20;
        let p = all_reduce(&t, &req(8, bytes), 1 << 20).unwrap();
        check(&p).unwrap();
        check_routes(&p, &t).unwrap();
        let r = simulate(&t, &p, &SimConfig::default()).unwrap();
        // GPU0's port to the switch carries its 8 shards to the switch once each and its own
        // reduced shard once: 9/8 of the vector.
        let g0 = t.gpu(0).unwrap();
        let up: f64 = r
            .edges
            .iter()
            .filter(|e| t.nvswitch_port(LinkId::new(e.edge as usize)) == Some((g0, true)))
            .map(|e| e.bytes)
            .sum();
        let eff = t.costs().nvls_efficiency(90).unwrap();
        let want = bytes as f64 * 9.0 / 8.0 / eff;
        assert!((up - want).abs() < 1e-6 * want, "{up} vs {want}");
    }
}
