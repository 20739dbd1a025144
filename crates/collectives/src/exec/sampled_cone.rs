//! Sampled ranks' programs run on real bytes: the op cone of a few ranks' outputs
//! ([`relaycc_route::template::extract_cone`], cut from a template or from a full plan too
//! large to prove) lowered per rank by the executor's one lowering ([`super::lower::lower`])
//! and run by its one runner ([`super::run::run`]), every rank that holds memory of the cone
//! on a thread of its own, local segments inline on host memory, messages over the in-process
//! transport. The sampled ranks' outputs are then compared, element for element, with the
//! request's reference computed from the same inputs.
//!
//! This is how plans above the checker's 64 ranks are executed in tests and by
//! `relaycc plan --verify`: the proof of a full plan needs vector clocks over every op, the
//! cone needs only the ops the sampled outputs depend on. Each rank's memory is its own
//! vectors, touched by its own thread only, and messages are copied through the mailboxes, so
//! a wrong plan gives a wrong value or an error here, never a data race.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use relaycc_route::template::OpCone;
use relaycc_route::{BufferRef, Collective, DType, Location, Plan, ReduceOp};
use relaycc_topo::{NodeId, Topology};

use super::invalid;
use super::lower::{Lanes, PlanOrder, RankLayout, RankProgram, lower_ops};
use super::run::{reduce_bytes, run_on_host_vectors};
use super::thread_transport::InProcess;
use crate::error::{CollectivesError, Result};

/// What a cone execution runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConeOptions {
    /// Seed of the input values.
    pub seed: u64,
    /// How long a rank waits for one message before the run fails.
    pub timeout: Duration,
}

impl Default for ConeOptions {
    fn default() -> Self {
        ConeOptions {
            seed: 1,
            timeout: Duration::from_secs(120),
        }
    }
}

/// What a cone execution ran and compared.
#[derive(Debug, Clone, PartialEq)]
pub struct ConeReport {
    /// The sampled ranks, whose outputs were compared.
    pub ranks: Vec<u32>,
    /// Ranks that ran a part of the cone (one thread each).
    pub ranks_run: usize,
    /// Ops of the cone.
    pub ops: usize,
    /// Ops of the full plan.
    pub full_ops: u64,
    /// Messages the ranks sent.
    pub messages: usize,
    /// Output elements compared with the reference (all equal).
    pub elements: u64,
    /// Bytes of the ranks' buffers (inputs, outputs, staging).
    pub bytes: u64,
    /// Wall time of lowering and running.
    pub elapsed: Duration,
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Rank `rank`'s input of `elems` elements: small integers, so that sums, maxima and averages
/// of every rank's values are exact in every element type whatever the order of reduction
/// (half types get -1, 0 or 1, products of floats get -1 or 1), and integers wrap the same in
/// any order.
fn input_bytes(dtype: DType, op: ReduceOp, seed: u64, rank: u32, elems: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity((elems * dtype.size()) as usize);
    for x in 0..elems {
        let h = mix(seed ^ mix((u64::from(rank) << 40) ^ x));
        let small = match (dtype, op) {
            (DType::F16 | DType::Bf16, _) | (DType::F32 | DType::F64, ReduceOp::Prod) => {
                (h % 3) as i64 - 1
            }
            _ => (h % 41) as i64 - 20,
        };
        let v = if small == 0 && op == ReduceOp::Prod && dtype.is_float() {
            1
        } else {
            small
        };
        match dtype {
            DType::I8 => out.push(v as i8 as u8),
            DType::U8 => out.push((h % 251) as u8),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&((h % 251) as u32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::U64 => out.extend_from_slice(&(h % 251).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v as f64).to_le_bytes()),
            DType::Bf16 => out.extend_from_slice(&half::bf16::from_f64(v as f64).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&(v as f64).to_le_bytes()),
        }
    }
    out
}

/// Which rank holds each memory: a GPU's rank, or for host memory (and a GPU outside the
/// request) the lowest rank of the same machine, as the process driving it would. Built once
/// per run: the lowering asks it for every region of every rank's ops.
struct Owners<'a> {
    plan: &'a Plan,
    topo: &'a Topology,
    /// Rank of each GPU of the request, by GPU index.
    gpu: HashMap<u32, u32>,
    /// Lowest rank of each host (machine) that has one.
    host: HashMap<u32, u32>,
}

impl<'a> Owners<'a> {
    fn new(plan: &'a Plan, topo: &'a Topology) -> Self {
        let mut gpu = HashMap::new();
        let mut host = HashMap::new();
        for (r, &g) in plan.request.gpus.iter().enumerate() {
            gpu.entry(g).or_insert(r as u32);
            if let Ok(id) = topo.gpu(g) {
                host.entry(topo.node(id).host).or_insert(r as u32);
            }
        }
        Owners {
            plan,
            topo,
            gpu,
            host,
        }
    }

    fn of_location(&self, loc: Location) -> Option<u32> {
        let host = match loc {
            Location::Gpu(g) => {
                if let Some(&r) = self.gpu.get(&g) {
                    return Some(r);
                }
                self.topo.node(self.topo.gpu(g).ok()?).host
            }
            Location::Host(n) => {
                if n as usize >= self.topo.graph().node_count() {
                    return None;
                }
                self.topo.node(NodeId::new(n as usize)).host
            }
        };
        self.host.get(&host).copied()
    }

    fn of(&self, b: BufferRef) -> Option<u32> {
        self.plan.location(b).and_then(|l| self.of_location(l))
    }
}

/// The ops touching each rank's memory, in op id order (`None`: a rank with no part in the
/// cone; the sampled ranks always have one).
fn rank_ops(cone: &OpCone, owners: &Owners<'_>) -> Result<Vec<Option<Vec<u32>>>> {
    let plan = &cone.plan;
    let n = plan.request.nranks() as u32;
    let mut active: Vec<Option<Vec<u32>>> = vec![None; n as usize];
    for r in &cone.ranks {
        if *r >= n {
            return Err(invalid(None, format!("sampled rank {r} of {n}")));
        }
        active[*r as usize] = Some(Vec::new());
    }
    for (id, op) in plan.ops.iter().enumerate() {
        let regions: Vec<&relaycc_route::Region> = match &op.kind {
            relaycc_route::OpKind::Copy { src, dst } => vec![src, dst],
            relaycc_route::OpKind::Reduce { srcs, dst, .. } => srcs.iter().chain([dst]).collect(),
        };
        for r in regions {
            let o = owners
                .of(r.buffer)
                .ok_or_else(|| invalid(Some(id), format!("no rank holds {:?}", r.buffer)))?;
            let list = active[o as usize].get_or_insert_with(Vec::new);
            if list.last() != Some(&(id as u32)) {
                list.push(id as u32);
            }
        }
    }
    Ok(active)
}

/// Bytes of host memory [`execute_cone`] allocates for `cone`: the inputs and outputs of the
/// ranks that run a part of it, and every staging buffer of the cone.
///
/// # Errors
/// [`CollectivesError::InvalidPlan`] when a memory of the cone has no rank, or a size
/// overflows.
pub fn cone_bytes(cone: &OpCone, topo: &Topology) -> Result<u64> {
    let plan = &cone.plan;
    let req = &plan.request;
    let esize = plan.dtype.size();
    let active = rank_ops(cone, &Owners::new(plan, topo))?;
    let mut elems = 0u64;
    for (r, a) in active.iter().enumerate() {
        if a.is_some() {
            let r = r as u32;
            elems = elems
                .saturating_add(req.input_len(r).map_err(super::from_route)?)
                .saturating_add(req.output_len(r).map_err(super::from_route)?);
        }
    }
    for s in &plan.scratch {
        elems = elems.saturating_add(s.len);
    }
    Ok(elems.saturating_mul(esize))
}

/// One rank's lowering of the cone: input binding 0, output 1, then the staging it holds.
fn lower_rank(
    plan: &Plan,
    order: &PlanOrder,
    ops: &[u32],
    me: u32,
    owner: &dyn Fn(BufferRef) -> Option<u32>,
) -> Result<RankProgram> {
    let esize = plan.dtype.size();
    let bytes_of = |elems: u64| {
        elems
            .checked_mul(esize)
            .ok_or_else(|| invalid(None, format!("{elems} elements overflow in bytes")))
    };
    let req = &plan.request;
    let mut bytes = vec![
        bytes_of(req.input_len(me).map_err(super::from_route)?)?,
        bytes_of(req.output_len(me).map_err(super::from_route)?)?,
    ];
    let mut scratch = vec![None; plan.scratch.len()];
    for (i, s) in plan.scratch.iter().enumerate() {
        if owner(BufferRef::Scratch(i as u32)) == Some(me) {
            scratch[i] = Some(bytes.len() as u32);
            bytes.push(bytes_of(s.len)?);
        }
    }
    let layout = RankLayout {
        me,
        owner,
        binding: &|b| match b {
            BufferRef::Input(r) if r == me => Some(0),
            BufferRef::Output(r) if r == me => Some(1),
            BufferRef::Scratch(i) => scratch.get(i as usize).copied().flatten(),
            _ => None,
        },
        binding_bytes: bytes,
        lanes: Lanes::Fold {
            count: 1,
            at: Location::Host(0),
        },
    };
    lower_ops(plan, order, &layout, ops)
}

/// What one rank's thread gives back: its output (for a sampled rank), messages sent, bytes
/// held.
type RankResult = Result<(Option<Vec<u8>>, usize, u64)>;

/// Run `cone` (cut from a plan on `topo`) on host memory, every rank that holds a buffer of
/// its ops on a thread of its own, and compare the sampled ranks' outputs with the reference.
///
/// # Errors
/// [`CollectivesError::InvalidPlan`] when a memory has no rank, the lowering refuses the cone,
/// a sampled output differs from the reference (naming the rank and the first element that
/// differs) or a rank fails (a message missing within `opts.timeout`, sizes that disagree).
pub fn execute_cone(cone: &OpCone, topo: &Topology, opts: &ConeOptions) -> Result<ConeReport> {
    let start = Instant::now();
    let plan = &cone.plan;
    let req = &plan.request;
    let n = req.nranks() as u32;
    let owners = Owners::new(plan, topo);
    let owner = |b: BufferRef| owners.of(b);
    let mut active = rank_ops(cone, &owners)?;
    let order = PlanOrder::new(plan)?;
    for ops in active.iter_mut().flatten() {
        order.sort(ops);
    }
    let ends = InProcess::group(n, opts.timeout);
    let results: Vec<(u32, RankResult)> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (me, mut end) in ends.into_iter().enumerate() {
            let me = me as u32;
            let Some(ops) = active[me as usize].as_deref() else {
                continue;
            };
            let (owner, order) = (&owner, &order);
            let sampled = cone.ranks.binary_search(&me).is_ok();
            let spawned = std::thread::Builder::new()
                .name(format!("cone rank {me}"))
                .stack_size(512 << 10)
                .spawn_scoped(s, move || -> RankResult {
                    let prog = lower_rank(plan, order, ops, me, owner)?;
                    let held: u64 = prog.binding_bytes.iter().sum();
                    let input = input_bytes(
                        plan.dtype,
                        req.op,
                        opts.seed,
                        me,
                        req.input_len(me).map_err(super::from_route)?,
                    );
                    let output = run_on_host_vectors(&prog, &input, &mut end)?;
                    let out = sampled.then_some(output);
                    Ok((out, prog.messages().0, held))
                });
            // Without its thread the rank's peers time out; its own error says why.
            handles.push((me, spawned.map_err(|e| e.to_string())));
        }
        handles
            .into_iter()
            .map(|(me, h)| {
                let r = match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(invalid(None, format!("cone rank {me}'s thread panicked")))
                    }),
                    Err(e) => Err(invalid(None, format!("cone rank {me} got no thread: {e}"))),
                };
                (me, r)
            })
            .collect()
    });
    let mut outputs = Vec::new();
    let (mut messages, mut bytes, mut ranks_run) = (0, 0u64, 0usize);
    let mut errors: Vec<CollectivesError> = Vec::new();
    for (me, r) in results {
        match r {
            Ok((out, m, b)) => {
                ranks_run += 1;
                messages += m;
                bytes += b;
                if let Some(o) = out {
                    outputs.push((me, o));
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        // The first rank to fail for a reason of its own is the cause; its peers then time
        // out waiting for it.
        let cause = errors
            .iter()
            .position(|e| !e.to_string().contains("no message from"))
            .unwrap_or(0);
        return Err(errors.swap_remove(cause));
    }
    let elements = compare_outputs(plan, &outputs, opts.seed)?;
    Ok(ConeReport {
        ranks: cone.ranks.clone(),
        ranks_run,
        ops: plan.ops.len(),
        full_ops: cone.full_ops,
        messages,
        elements,
        bytes,
        elapsed: start.elapsed(),
    })
}

/// Compare each `(rank, output bytes)` with the request's reference; returns the elements
/// compared.
fn compare_outputs(plan: &Plan, outputs: &[(u32, Vec<u8>)], seed: u64) -> Result<u64> {
    let req = &plan.request;
    let dtype = plan.dtype;
    let esize = dtype.size() as usize;
    let n = req.nranks() as u32;
    let pieces = req.expected().map_err(super::from_route)?;
    let mut inputs: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut compared = 0u64;
    let reduces = matches!(
        req.collective,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    );
    for (rank, got) in outputs {
        let mut want = vec![0u8; got.len()];
        // Bytes the request defines: a plan may use the rest (a non-root's output of a
        // reduce) as it likes.
        let mut defined = vec![false; got.len()];
        for p in pieces.iter().filter(|p| p.rank == *rank) {
            for (src, _) in &p.terms {
                if !inputs.contains_key(src) {
                    let len = req.input_len(*src).map_err(super::from_route)?;
                    inputs.insert(*src, input_bytes(dtype, req.op, seed, *src, len));
                }
            }
            let bytes = p.len as usize * esize;
            let at = p.out_offset as usize * esize;
            let srcs: Vec<*const u8> = p
                .terms
                .iter()
                .map(|(src, off)| {
                    let inp = &inputs[src];
                    let from = *off as usize * esize;
                    if from + bytes > inp.len() {
                        Err(invalid(
                            None,
                            format!("the reference reads past rank {src}'s input"),
                        ))
                    } else {
                        Ok(inp[from..].as_ptr())
                    }
                })
                .collect::<Result<_>>()?;
            if at + bytes > want.len() {
                return Err(invalid(
                    None,
                    format!("the reference writes past rank {rank}'s output"),
                ));
            }
            let divisor = (reduces && req.op == ReduceOp::Avg).then_some(n);
            // SAFETY: every source is `bytes` bytes inside an input vector (just checked), the
            // destination `bytes` bytes inside `want` (just checked), a vector of its own.
            unsafe {
                reduce_bytes(
                    dtype,
                    req.op,
                    &srcs,
                    want[at..].as_mut_ptr(),
                    bytes,
                    divisor,
                )
            };
            defined[at..at + bytes].fill(true);
            compared += p.len;
        }
        let differs = got
            .iter()
            .zip(&want)
            .zip(&defined)
            .position(|((a, b), d)| *d && a != b);
        if let Some(x) = differs {
            let e = x / esize;
            return Err(invalid(
                None,
                format!(
                    "the cone's run left rank {rank}'s output element {e} as {:?} where the \
                     request's reference holds {:?}",
                    &got[e * esize..(e + 1) * esize],
                    &want[e * esize..(e + 1) * esize]
                ),
            ));
        }
    }
    Ok(compared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_route::template::extract_cone;
    use relaycc_route::{PlanOptions, Request, plan as plan_request};

    #[test]
    fn every_collective_runs_its_cone_on_a_dgx_h100() {
        let topo = relaycc_topo::preset("dgx-h100").unwrap();
        for c in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            for (t, op) in [
                (DType::I32, ReduceOp::Sum),
                (DType::F32, ReduceOp::Avg),
                (DType::Bf16, ReduceOp::Max),
            ] {
                let req = Request::new(c, (0..8).collect(), 1 << 10, t)
                    .with_op(op)
                    .with_root(3);
                let planned = plan_request(&topo, &req, &PlanOptions::default()).unwrap();
                for p in [&planned.plan, &planned.baseline_plan] {
                    for ranks in [vec![3u32], vec![0, 5, 7]] {
                        let cone = extract_cone(p, &topo, &ranks, usize::MAX).unwrap().unwrap();
                        let r = execute_cone(&cone, &topo, &ConeOptions::default())
                            .unwrap_or_else(|e| panic!("{c} {t} {op} {}: {e}", p.algorithm));
                        assert_eq!(r.ranks, ranks);
                        let want: u64 = req
                            .expected()
                            .unwrap()
                            .iter()
                            .filter(|p| ranks.contains(&p.rank))
                            .map(|p| p.len)
                            .sum();
                        assert_eq!(r.elements, want, "{c} {}", p.algorithm);
                    }
                }
            }
        }
    }

    #[test]
    fn a_cone_missing_an_op_is_caught() {
        let topo = relaycc_topo::preset("dgx-h100").unwrap();
        let req = Request::new(Collective::AllReduce, (0..8).collect(), 1 << 10, DType::I64);
        let planned = plan_request(&topo, &req, &PlanOptions::default()).unwrap();
        let mut cone = extract_cone(&planned.plan, &topo, &[2], usize::MAX)
            .unwrap()
            .unwrap();
        // Drop the first op that nothing depends on earlier than the last: the sampled output
        // loses what it carried. Dependencies past it are renumbered.
        let victim = cone
            .plan
            .ops
            .iter()
            .position(|o| matches!(o.kind, relaycc_route::OpKind::Reduce { .. }))
            .unwrap() as u32;
        cone.plan.ops.remove(victim as usize);
        for op in &mut cone.plan.ops {
            op.deps.retain(|d| *d != victim);
            for d in &mut op.deps {
                if *d > victim {
                    *d -= 1;
                }
            }
        }
        let err = execute_cone(&cone, &topo, &ConeOptions::default()).unwrap_err();
        assert!(err.to_string().contains("rank 2's output element"), "{err}");
    }
}
