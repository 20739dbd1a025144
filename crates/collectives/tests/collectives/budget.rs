//! Staging budgets end to end: for random requests and budgets, the plan a communicator proves
//! and runs keeps every device's staging within the budget and its results equal the
//! reference on the host backend; a budget no plan fits is an error before anything is
//! allocated.

use std::sync::Arc;

use proptest::prelude::*;
use relaycc_collectives::{CollectivesError, Communicator, DeviceBuffer, HostBackend, ReduceOp};
use relaycc_route::{Collective, DType, Location, Request, RouteError};

const PRESETS: [&str; 4] = ["dgx1-v100", "dgx-a100", "pcie-4gpu", "ac922"];
const COUNTS: [u64; 4] = [1, 1000, 70_000, 300_000];
const BUDGETS: [u64; 5] = [8 << 10, 256 << 10, 1 << 20, 4 << 20, 64 << 20];
const COLLECTIVES: [Collective; 5] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast,
    Collective::Reduce,
];

/// Bytes the backend holds on any GPU of a topology with `gpus` GPUs.
fn held(b: &HostBackend, gpus: u32) -> u64 {
    (0..gpus).map(|g| b.bytes_in_use(Location::Gpu(g))).sum()
}

/// Input element `i` of rank `r`: small integers, so every f32 sum is exact.
fn value(r: usize, i: u64) -> f32 {
    ((i * 7 + r as u64 * 3) % 17) as f32
}

fn run(
    preset: usize,
    pick: u64,
    k: usize,
    c: usize,
    budget: usize,
    coll: usize,
) -> Result<(), String> {
    let topo = relaycc_topo::preset(PRESETS[preset]).map_err(|e| e.to_string())?;
    let gpu_count = topo.gpu_count();
    let mut all: Vec<u32> = (0..gpu_count).collect();
    let mut h = pick;
    for i in (1..all.len()).rev() {
        h = h
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        all.swap(i, (h >> 33) as usize % (i + 1));
    }
    let k = k.clamp(2, all.len());
    let (gpus, others) = all.split_at(k);
    let (count, budget, collective) = (COUNTS[c], BUDGETS[budget], COLLECTIVES[coll]);
    let backend = Arc::new(HostBackend::new());
    let mut comm =
        Communicator::new(topo, gpus, others, backend.clone()).map_err(|e| e.to_string())?;
    comm.set_staging_budget(budget);
    let n = k;
    let root = (pick % n as u64) as usize;
    let in_len = if collective == Collective::ReduceScatter {
        count * n as u64
    } else {
        count
    };
    let out_len = if collective == Collective::AllGather {
        count * n as u64
    } else {
        count
    };
    let e = |e: CollectivesError| e.to_string();
    let ins: Vec<DeviceBuffer<f32>> = (0..n)
        .map(|r| comm.from_slice(r, &(0..in_len).map(|i| value(r, i)).collect::<Vec<_>>()))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let outs: Vec<DeviceBuffer<f32>> = (0..n)
        .map(|r| comm.alloc::<f32>(r, out_len as usize))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let user = held(&backend, gpu_count);
    let done = match collective {
        Collective::AllReduce => comm.all_reduce(&ins, &outs, ReduceOp::Sum),
        Collective::AllGather => comm.all_gather(&ins, &outs),
        Collective::ReduceScatter => comm.reduce_scatter(&ins, &outs, ReduceOp::Sum),
        Collective::Broadcast => comm.broadcast(&ins[root], &outs, root),
        _ => comm.reduce(&ins, &outs[root], root, ReduceOp::Sum),
    };
    let pending = match done {
        Err(CollectivesError::Plan {
            source:
                RouteError::StagingBudget {
                    device,
                    needed_bytes,
                    budget_bytes,
                    ..
                },
            ..
        }) => {
            // A few MiB fit every planner at its smallest chunk (64 KiB slots): only the
            // budgets below that may be refused.
            prop_assert_or(
                budget < 4 << 20,
                &format!("{budget} bytes refused: {needed_bytes} needed on {device}"),
            )?;
            // Refused before anything was allocated, naming the device and the bytes.
            prop_assert_or(
                needed_bytes > budget_bytes && budget_bytes == budget,
                "figures",
            )?;
            prop_assert_or(
                device.starts_with("GPU") || device.starts_with("host"),
                "device",
            )?;
            prop_assert_or(held(&backend, gpu_count) == user, "allocated on refusal")?;
            return Ok(());
        }
        other => other.map_err(e)?,
    };
    pending.wait().map_err(e)?;
    // The plan that ran is the cached, checked one; its staging fits the budget.
    let mut req = Request::new(collective, gpus.to_vec(), count, DType::F32);
    if matches!(collective, Collective::Broadcast | Collective::Reduce) {
        req = req.with_root(root as u32);
    }
    let plan = comm.plan(&req, false).map_err(e)?;
    prop_assert_or(
        comm.cached_plans() == 1,
        "the plan asked for is not the one that ran",
    )?;
    for (at, bytes) in plan.staging_per_location() {
        prop_assert_or(bytes <= budget, &format!("{at} holds {bytes} > {budget}"))?;
    }
    // What the backend holds on GPUs beyond the user's buffers is the plan's GPU staging.
    let on_gpus: u64 = plan
        .staging_per_location()
        .iter()
        .filter(|(at, _)| matches!(at, Location::Gpu(_)))
        .map(|(_, b)| *b)
        .sum();
    prop_assert_or(
        held(&backend, gpu_count) - user == on_gpus,
        "scratch on the backend differs from the plan's",
    )?;
    // The reference.
    let sum = |i: u64| (0..n).map(|r| value(r, i)).sum::<f32>();
    for (r, o) in outs.iter().enumerate() {
        let got = o.to_vec().map_err(e)?;
        let want: Vec<Option<f32>> = match collective {
            Collective::AllReduce => (0..count).map(|i| Some(sum(i))).collect(),
            Collective::AllGather => (0..out_len)
                .map(|i| Some(value((i / count) as usize, i % count)))
                .collect(),
            Collective::ReduceScatter => (0..count)
                .map(|i| Some(sum(r as u64 * count + i)))
                .collect(),
            Collective::Broadcast => (0..count).map(|i| Some(value(root, i))).collect(),
            _ if r == root => (0..count).map(|i| Some(sum(i))).collect(),
            _ => (0..count).map(|_| None).collect(),
        };
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if let Some(w) = w {
                prop_assert_or(g == w, &format!("rank {r} element {i}: {g} != {w}"))?;
            }
        }
    }
    Ok(())
}

fn prop_assert_or(ok: bool, what: &str) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what.to_string()) }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn plans_fit_the_budget_and_the_proved_plan_runs(
        preset in 0..PRESETS.len(),
        pick in any::<u64>(),
        k in 2usize..=8,
        c in 0..COUNTS.len(),
        budget in 0..BUDGETS.len(),
        coll in 0..COLLECTIVES.len(),
    ) {
        let r = run(preset, pick, k, c, budget, coll);
        prop_assert!(r.is_ok(), "{} {:?}: {}", PRESETS[preset], (pick, k, c, budget, coll), r.err().unwrap_or_default());
    }
}
