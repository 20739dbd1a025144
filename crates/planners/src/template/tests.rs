//! Tests of the fold on a two-node cluster: a symmetric plan folds into a template the
//! checkers tell apart from a full plan; a plan that differs between hosts is refused; a
//! template expands into the plan built in full, op for op, the expansion is proved, and
//! the sampled execution of the template agrees.

use std::collections::{BTreeMap, HashMap};

use super::{build_template, expand};
use crate::BaselineOptions;
use relaycc_plan::DType;
use relaycc_plan::RouteError;
use relaycc_plan::path::RelayPolicy;
use relaycc_plan::{BufferRef, Location, OpKind, Plan, Region};
use relaycc_plan::{Collective, Request};
use relaycc_plan::{check, check_template};

#[test]
fn a_template_is_refused_by_check_and_accepted_by_check_template() {
    let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
    let sym = topo.host_symmetry();
    let req = Request::new(
        Collective::AllGather,
        (0..16).collect(),
        1 << 16,
        DType::F32,
    );
    let chunked = BaselineOptions {
        chunk_elems: Some(1 << 14),
        ..Default::default()
    };
    let t = BaselineOptions {
        template: Some(&sym),
        ..chunked
    }
    .plan(&topo, &req)
    .unwrap();
    let info = t.template.as_ref().unwrap();
    assert_eq!((info.period, info.periods, info.hosts), (1, 2, 2));
    assert_eq!(info.full_ops, 2 * t.ops.len() as u64);
    check_template(&t).unwrap();
    let e = check(&t).unwrap_err().to_string();
    assert!(e.contains("template"), "{e}");
    let full = chunked.plan(&topo, &req).unwrap();
    assert!(check_template(&full).is_err());
    check(&full).unwrap();
}

#[test]
fn uneven_blocks_do_not_fold() {
    let topo = relaycc_topo::preset("cluster:2xdgx-h100:ib-ndr").unwrap();
    let sym = topo.host_symmetry();
    // 8 channels of 1,001 elements split over 16 ranks: the first ranks' blocks are longer.
    let req = Request::new(
        Collective::AllReduce,
        (0..16).collect(),
        8 * 1001,
        DType::F32,
    );
    let ring_template = BaselineOptions {
        algo: Some(crate::baseline_net::tuner::Algo::Ring),
        template: Some(&sym),
        ..Default::default()
    };
    let r = ring_template.plan(&topo, &req);
    assert!(matches!(r, Err(RouteError::NotSymmetric(_))), "{r:?}");
    // Even blocks fold.
    let req = Request::new(
        Collective::AllReduce,
        (0..16).collect(),
        8 * 1024,
        DType::F32,
    );
    ring_template.plan(&topo, &req).unwrap();
}

/// A lane named by its memory and what its first op does (lanes are made in an order that
/// may differ between periods, so their ordinals name nothing).
type LaneName = (Location, String);

/// A plan's ops keyed by (lane name, position on the lane), each described with its staging
/// buffers (memory, ordinal there, length), dependencies and NVLS groups named by such keys,
/// so two plans that differ only in numbering describe alike.
fn canon(p: &Plan) -> BTreeMap<(LaneName, u32), String> {
    let mut scratch_ord = Vec::with_capacity(p.scratch.len());
    let mut per: HashMap<Location, u32> = HashMap::new();
    for s in &p.scratch {
        let c = per.entry(s.location).or_default();
        scratch_ord.push((s.location, *c, s.len));
        *c += 1;
    }
    let region = |r: &Region| match r.buffer {
        BufferRef::Scratch(s) => format!("{:?}[{}+{}]", scratch_ord[s as usize], r.offset, r.len),
        b => format!("{b:?}[{}+{}]", r.offset, r.len),
    };
    let kind = |o: &relaycc_plan::Op| match &o.kind {
        OpKind::Copy { src, dst } => format!("copy {} -> {}", region(src), region(dst)),
        OpKind::Reduce {
            srcs,
            dst,
            finalize,
        } => format!(
            "reduce {:?} -> {} {finalize}",
            srcs.iter().map(region).collect::<Vec<_>>(),
            region(dst)
        ),
    };
    let mut lane_name: Vec<Option<LaneName>> = vec![None; p.lanes.len()];
    for o in &p.ops {
        let l = o.lane as usize;
        if lane_name[l].is_none() {
            lane_name[l] = Some((p.lanes[l].location, kind(o)));
        }
    }
    let mut pos = vec![0u32; p.lanes.len()];
    let keys: Vec<(LaneName, u32)> = p
        .ops
        .iter()
        .map(|o| {
            let l = o.lane as usize;
            let k = (lane_name[l].clone().unwrap(), pos[l]);
            pos[l] += 1;
            k
        })
        .collect();
    let mut group_first: HashMap<u32, (LaneName, u32)> = HashMap::new();
    for (o, k) in p.ops.iter().zip(&keys) {
        if let Some(n) = o.nvls {
            let e = group_first.entry(n.group).or_insert_with(|| k.clone());
            if *k < *e {
                *e = k.clone();
            }
        }
    }
    p.ops
        .iter()
        .zip(&keys)
        .map(|(o, k)| {
            let mut deps: Vec<_> = o.deps.iter().map(|&d| &keys[d as usize]).collect();
            deps.sort_unstable();
            deps.dedup();
            let nvls = o.nvls.map(|n| (&group_first[&n.group], n.shared_edge));
            (
                k.clone(),
                format!(
                    "{} edges {:?} deps {deps:?} nvls {nvls:?}",
                    kind(o),
                    o.edges
                ),
            )
        })
        .collect()
}

/// Assert that the template `t` expands into `full`, op for op, and that the expansion is
/// proved by the checkers.
fn assert_expands_to(topo: &relaycc_topo::Topology, t: &Plan, full: &Plan, what: &str) {
    let x = expand(t, topo).unwrap();
    assert_eq!(x.ops.len(), full.ops.len(), "{what}: op count");
    assert_eq!(x.lanes.len(), full.lanes.len(), "{what}: lane count");
    assert_eq!(x.scratch.len(), full.scratch.len(), "{what}: staging count");
    let (a, b) = (canon(&x), canon(full));
    if a != b {
        let diff = b.iter().find(|(k, v)| a.get(k) != Some(v));
        panic!(
            "{what}: the expansion differs from the full plan at {:?}: expanded {:?}",
            diff,
            diff.and_then(|(k, _)| a.get(k))
        );
    }
    check(&x).unwrap_or_else(|e| panic!("{what}: the expansion is not proved: {e}"));
    relaycc_plan::check_routes(&x, topo).unwrap();
    // The sampled execution agrees with the proof on the template.
    super::check_sampled(t, topo, &super::SampleOptions::default())
        .unwrap_or_else(|e| panic!("{what}: sampled execution: {e}"));
}

#[test]
fn templates_expand_into_the_plans_built_in_full() {
    let collectives = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Broadcast,
    ];
    let mut compared = 0;
    let mut refused = Vec::new();
    let mut inexact = Vec::new();
    for name in [
        "cluster:2xdgx-h100:ib-ndr",
        "cluster:2xdgx-h100:ib-ndr:rail",
        "cluster:4xdgx-h100:ib-ndr",
        "cluster:4xdgx-h100:ib-ndr:rail",
        "cluster:8xdgx-h100:ib-ndr",
    ] {
        let topo = relaycc_topo::preset(name).unwrap();
        let sym = topo.host_symmetry();
        let n = topo.gpu_count();
        for c in collectives {
            let req = Request::new(c, (0..n).collect(), 1 << 12, DType::I32);
            let chunk = 1 << 9;
            // The baseline.
            let chunked = BaselineOptions {
                chunk_elems: Some(chunk),
                ..Default::default()
            };
            let template = BaselineOptions {
                template: Some(&sym),
                ..chunked
            };
            match template.plan(&topo, &req) {
                Ok(t) if !t.template.as_ref().unwrap().exact => inexact.push(format!(
                    "{name} {c} baseline: {:?}",
                    t.template.as_ref().unwrap().inexact
                )),
                Ok(t) => {
                    let full = chunked.plan(&topo, &req).unwrap();
                    assert_expands_to(&topo, &t, &full, &format!("{name} {c} baseline"));
                    compared += 1;
                }
                Err(RouteError::NotSymmetric(why)) => refused.push(format!("{name} {c}: {why}")),
                Err(e) => panic!("{name} {c}: {e}"),
            }
            // relaycc's candidates.
            let set = crate::Candidates::new(&topo, &req, &RelayPolicy::default()).unwrap();
            for i in 0..set.len() {
                let t = match build_template(&topo, &sym, None, |w| {
                    set.build_in(i, chunk, Some(w), None)
                }) {
                    Ok(t) => t,
                    Err(RouteError::NotSymmetric(why)) => {
                        refused.push(format!("{name} {c} candidate {i}: {why}"));
                        continue;
                    }
                    Err(RouteError::NoRoute { .. }) => continue,
                    Err(e) => panic!("{name} {c} candidate {i}: {e}"),
                };
                let full = set.build_unfitted(i, chunk, None).unwrap();
                let what = format!("{name} {c} {}", full.algorithm);
                let info = t.template.as_ref().unwrap();
                if !info.exact {
                    inexact.push(format!("{what}: {:?}", info.inexact));
                    continue;
                }
                assert_expands_to(&topo, &t, &full, &what);
                compared += 1;
            }
        }
    }
    eprintln!(
        "{compared} templates expanded exactly; not exact: {inexact:#?}; refused: {refused:#?}"
    );
    assert!(compared >= 20, "only {compared} templates compared");
}
