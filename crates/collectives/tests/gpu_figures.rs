//! GPU figures of the executor that `scripts/gpu-check` tabulates, each also checked for
//! exact results: a copy relayed through a two-slot staging ring against a direct copy of the
//! same bytes, and two sub-communicators of `split` running concurrently. Ignored by default;
//! on a GPU machine: `cargo test --release -p relaycc-collectives --test gpu_figures --
//! --ignored --show-output`. Each test prints one `gpu-check:` line; its targets are the
//! benchmark's (`scripts/gpu-check`), not the test's, which fails only on a wrong result or a
//! measurement it cannot make.
#![cfg(feature = "cuda")]

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Instant;

use relaycc_collectives::cudarc::driver::sys::CUevent_flags;
use relaycc_collectives::cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use relaycc_collectives::{
    Backend, ByteRegion, Collectives, Communicator, CudaBackend, RankComm, ReduceOp, exec,
    shared_gpu_topology,
};
use relaycc_route::BufferRef::{Input, Output};
use relaycc_route::path::{Route, hop, relay_routes};
use relaycc_route::route_pipeline::{Chunks, LaneMap, emit_transfer};
use relaycc_route::{Location, Plan, Region, Request};

/// Bytes moved by the relay figure: large enough that launches are a small part of it.
const RELAY_BYTES: u64 = 256 << 20;

/// A plan moving `RELAY_BYTES` from GPU `src` to GPU `dst` of `topo` over `route` in chunks
/// of `chunk` bytes (the relays' staging rings have two slots of `chunk` bytes each).
fn transfer_plan(src: u32, dst: u32, route: &Route, chunk: u64) -> Plan {
    let req = Request::point_to_point(src, dst, RELAY_BYTES);
    let mut plan = Plan::new(req, "gpu-figure transfer");
    let mut lanes = LaneMap::default();
    emit_transfer(
        &mut plan,
        &mut lanes,
        Region::new(Input(0), 0, RELAY_BYTES),
        Region::new(Output(1), 0, RELAY_BYTES),
        std::slice::from_ref(route),
        &[RELAY_BYTES],
        Chunks::Each(chunk),
        0,
        &[],
    );
    plan
}

/// Memory for `exe`'s buffers on `backend`: the input filled with a pattern, the output and
/// the staging zeroed; returns the regions (in binding order) and the input's bytes.
fn bind(
    backend: &CudaBackend,
    req: &Request,
    exe: &exec::Executable,
) -> (Vec<ByteRegion>, Vec<u8>) {
    let mut regions = Vec::new();
    let mut alloc = |loc: Location, bytes: u64| {
        let bytes = bytes.max(1);
        let mem = backend
            .allocate(loc, bytes)
            .unwrap_or_else(|e| panic!("{e}"));
        let region = ByteRegion {
            mem,
            offset: 0,
            bytes,
        };
        regions.push(region);
        region
    };
    let ranks = req.gpus.len() as u32;
    let mut input = Vec::new();
    let mut inputs = Vec::new();
    for r in 0..ranks {
        let bytes = req.input_len(r).unwrap_or_else(|e| panic!("{e}"));
        inputs.push((r, alloc(Location::Gpu(req.gpus[r as usize]), bytes)));
    }
    for r in 0..ranks {
        let bytes = req.output_len(r).unwrap_or_else(|e| panic!("{e}"));
        alloc(Location::Gpu(req.gpus[r as usize]), bytes);
    }
    for &(loc, bytes) in exe.scratch() {
        alloc(loc, bytes);
    }
    for (r, region) in inputs {
        let data: Vec<u8> = (0..region.bytes)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(r as u8 * 7 + 1))
            .collect();
        backend
            .upload(region, &data)
            .unwrap_or_else(|e| panic!("{e}"));
        if r == 0 {
            input = data;
        }
    }
    (regions, input)
}

/// Microseconds per run of `exe` on `regions`: the fastest of three rounds of 10 runs back to
/// back (each round's wall time from the first enqueue to the end of the last run).
fn time_us(backend: &CudaBackend, exe: &exec::Executable, regions: &[ByteRegion]) -> f64 {
    let run = || {
        // SAFETY: `regions` are this executable's own allocations of its buffers' sizes, in
        // binding order, disjoint; nothing else touches them.
        unsafe { exec::launch(backend, &[(exe, regions)]) }.unwrap_or_else(|e| panic!("{e}"));
    };
    run();
    backend.synchronize().unwrap_or_else(|e| panic!("{e}"));
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..10 {
                run();
            }
            backend.synchronize().unwrap_or_else(|e| panic!("{e}"));
            t.elapsed().as_secs_f64() * 1e6 / 10.0
        })
        .fold(f64::INFINITY, f64::min)
}

/// Run `plan` on one GPU (every logical GPU of the topology on device 0): its time per run
/// and whether GPU 1's output holds GPU 0's input.
fn timed_transfer(backend: &CudaBackend, plan: Plan) -> f64 {
    let req = plan.request.clone();
    let exe = exec::compile(exec::check(plan, false).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"));
    let (regions, input) = bind(backend, &req, &exe);
    let us = time_us(backend, &exe, &regions);
    // Rank 1's output: after the inputs of both ranks and rank 0's output.
    let output = regions[req.gpus.len() + 1];
    let mut out = vec![0u8; output.bytes as usize];
    backend
        .download(output, &mut out)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out == input,
        "{}: the output differs from the input",
        exe.plan().algorithm
    );
    for r in regions {
        backend.free(r.mem);
    }
    us
}

/// A copy of 256 MiB from GPU 0 to GPU 5 of a DGX-1 (no NVLink between them) relayed through
/// one GPU with NVLink to both, in chunks, through that relay's staging ring of two slots,
/// against one direct copy of the same bytes (GPU 0 to GPU 1, an NVLink hop); every logical
/// GPU on device 0, so each relayed byte crosses the device's memory twice and the ideal is
/// twice the direct copy's time. Prints `gpu-check: relay_staged chunk_mib=.. relayed_us=..
/// direct_us=.. vs_twice_direct=..` per chunk size.
#[test]
#[ignore = "needs a CUDA GPU"]
fn relayed_copy_through_a_two_slot_ring_against_a_direct_copy() {
    let topo = relaycc_topo::preset("dgx1-v100").unwrap_or_else(|e| panic!("{e}"));
    let backend = CudaBackend::new(vec![0; 8]).unwrap_or_else(|e| panic!("{e}"));
    let all = |_| true;
    let relayed = relay_routes(&topo, 0, 5, &all)
        .into_iter()
        .find(|r| r.hops.len() == 2 && matches!(r.hops[0].to, Location::Gpu(_)))
        .expect("DGX-1: a route from GPU 0 to GPU 5 through one GPU");
    let direct = Route {
        hops: vec![
            hop(&topo, Location::Gpu(0), Location::Gpu(1)).expect("DGX-1: GPU 0 reaches GPU 1"),
        ],
    };
    let relay = relayed.hops[0].to;
    for chunk_mib in [4u64, 16, 64] {
        let chunk = chunk_mib << 20;
        // Alternate, so the three see the same machine: the relay replayed as a graph, the
        // relay's calls made one by one, the direct copy.
        let (mut relayed_us, mut unreplayed_us, mut direct_us) =
            (f64::INFINITY, f64::INFINITY, f64::INFINITY);
        for _ in 0..2 {
            backend.set_graph_replay(true);
            relayed_us = relayed_us.min(timed_transfer(
                &backend,
                transfer_plan(0, 5, &relayed, chunk),
            ));
            backend.set_graph_replay(false);
            unreplayed_us = unreplayed_us.min(timed_transfer(
                &backend,
                transfer_plan(0, 5, &relayed, chunk),
            ));
            backend.set_graph_replay(true);
            direct_us = direct_us.min(timed_transfer(
                &backend,
                transfer_plan(0, 1, &direct, RELAY_BYTES),
            ));
        }
        println!(
            "gpu-check: relay_staged chunk_mib={chunk_mib} relay={relay:?} relayed_us={relayed_us:.1} \
             direct_us={direct_us:.1} vs_twice_direct={:.3} without_graphs_us={unreplayed_us:.1} \
             without_graphs_vs_twice_direct={:.3}",
            relayed_us / (2.0 * direct_us),
            unreplayed_us / (2.0 * direct_us)
        );
    }
}

/// Spins one thread for `ns` nanoseconds of the GPU's global timer: holds a stream (and the
/// streams that wait for it) while the host enqueues work behind it.
const SPIN: &str = r#"
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"#;

/// How long the gate holds the ranks' streams while every call is enqueued.
const GATE_NS: u64 = 50_000_000;
/// Calls per sub-communicator, and elements per call (f32): small all_reduces, each one
/// reduction kernel that does not fill the GPU.
const CALLS: usize = 50;
const ELEMS: usize = 64 << 10;

/// What the four rank threads share: the gate's end event and when it was launched, each
/// rank's last event, and when the last call was enqueued (host time from the gate's launch).
struct Meet {
    barrier: Barrier,
    gate: Mutex<Option<(Arc<CudaEvent>, Instant)>>,
    ends: Mutex<Vec<Option<Arc<CudaEvent>>>>,
    enqueued_us: Mutex<f64>,
}

/// One measurement of [`pair_calls_us`]: GPU microseconds, and whether every call was
/// enqueued while the gate held the streams (else the time includes the host's pace, as in a
/// first call that plans and loads kernels).
struct PairCalls {
    gpu_us: f64,
    behind_gate: bool,
    ranks: Vec<RankComm>,
}

/// GPU microseconds for two pairs of ranks (`pairs[r]` is rank `r`'s pair, 0 or 1) to make
/// `CALLS` all_reduces each: from the gate's end to the last call's end, everything enqueued
/// behind the gate first. `serial`: the second pair's streams wait for the first pair's last
/// calls (one after the other); else the pairs run as they may.
fn pair_calls_us(ranks: Vec<RankComm>, serial: bool, gate: &Gate) -> PairCalls {
    let meet = Meet {
        barrier: Barrier::new(ranks.len()),
        gate: Mutex::new(None),
        ends: Mutex::new(vec![None; ranks.len()]),
        enqueued_us: Mutex::new(0.0),
    };
    let ranks: Vec<RankComm> = thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(r, mut rank)| {
                let meet = &meet;
                s.spawn(move || {
                    let ctx = CudaContext::new(0).expect("context");
                    let stream = ctx.new_stream().expect("stream");
                    let pair = r / 2;
                    let send = stream
                        .clone_htod(&vec![r as f32 + 1.0; ELEMS])
                        .expect("upload");
                    let mut recv = stream.alloc_zeros::<f32>(ELEMS).expect("alloc");
                    // Every thread's setup is done before the gate starts: a first stream of a
                    // cudarc context synchronizes the whole context, which would wait for it.
                    stream.synchronize().expect("synchronize");
                    meet.barrier.wait();
                    if r == 0 {
                        let launched = Instant::now();
                        *meet.gate.lock().expect("gate") = Some((gate.start(), launched));
                    }
                    meet.barrier.wait();
                    let (gate, launched) = meet.gate.lock().expect("gate").clone().expect("gate");
                    stream.wait(&gate).expect("wait for the gate");
                    if serial && pair == 1 {
                        meet.barrier.wait();
                        for end in meet.ends.lock().expect("ends")[..2].iter().flatten() {
                            stream.wait(end).expect("wait for the first pair");
                        }
                    }
                    for _ in 0..CALLS {
                        rank.on(&stream)
                            .all_reduce(&send, &mut recv, ReduceOp::Sum)
                            .expect("all_reduce");
                    }
                    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
                    meet.ends.lock().expect("ends")[r] = Some(Arc::new(end.expect("event")));
                    let mut at = meet.enqueued_us.lock().expect("time");
                    *at = at.max(launched.elapsed().as_secs_f64() * 1e6);
                    drop(at);
                    if serial && pair == 0 {
                        meet.barrier.wait();
                    }
                    stream.synchronize().expect("synchronize");
                    let got = stream.clone_dtoh(&recv).expect("download");
                    let want = if pair == 0 { 3.0 } else { 7.0 };
                    assert!(got.iter().all(|&e| e == want), "rank {r}: {:?}", &got[..2]);
                    rank
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    let enqueued_us = *meet.enqueued_us.lock().expect("time");
    eprintln!("enqueued in {enqueued_us:.0} us (serial: {serial})");
    let (gate, _) = meet.gate.lock().expect("gate").clone().expect("gate");
    let gpu_us = meet
        .ends
        .lock()
        .expect("ends")
        .iter()
        .flatten()
        .map(|e| f64::from(gate.elapsed_ms(e).expect("elapsed")) * 1e3)
        .fold(0.0, f64::max);
    PairCalls {
        gpu_us,
        behind_gate: enqueued_us < GATE_NS as f64 / 1e3,
        ranks,
    }
}

/// The spin kernel, loaded once, and the stream the gate runs on: both outlive every
/// measurement (unloading a module while its kernel runs would wait for it).
struct Gate {
    spin: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Gate {
    fn new() -> Gate {
        let ctx = CudaContext::new(0).expect("context");
        let ptx = relaycc_collectives::cudarc::nvrtc::compile_ptx(SPIN).expect("nvrtc");
        let spin = ctx
            .load_module(ptx)
            .expect("module")
            .load_function("spin")
            .expect("function");
        let stream = ctx.new_stream().expect("stream");
        Gate { spin, stream }
    }

    /// Launch the spin kernel; the event its end records.
    fn start(&self) -> Arc<CudaEvent> {
        let ns = GATE_NS;
        let mut b = self.stream.launch_builder(&self.spin);
        b.arg(&ns);
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `spin` takes one 64-bit integer and touches no memory.
        unsafe { b.launch(one) }.expect("launch");
        Arc::new(
            self.stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .expect("event"),
        )
    }
}

/// Four ranks on one GPU split into two pairs; each pair makes `CALLS` small all_reduces on
/// its ranks' streams, both pairs at once, then one pair after the other (GPU time, calls
/// enqueued behind a gate so the host's pace is not measured). Sub-communicators of `split`
/// have launch orders of their own; the same pairs made as two communicators on one backend
/// (one launch order for both) are measured beside them. Prints `gpu-check: overlap ...`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn sub_communicators_of_split_run_concurrently() {
    let backend = Arc::new(CudaBackend::new(vec![0; 4]).unwrap_or_else(|e| panic!("{e}")));
    let topo = shared_gpu_topology(4).unwrap_or_else(|e| panic!("{e}"));
    let parent = Communicator::new(topo.clone(), &[0, 1, 2, 3], &[], backend.clone())
        .unwrap_or_else(|e| panic!("{e}"))
        .into_ranks();
    let split: Vec<RankComm> = thread::scope(|s| {
        let hs: Vec<_> = parent
            .into_iter()
            .map(|mut rank| {
                s.spawn(move || {
                    let color = rank.rank() as u32 / 2;
                    rank.split(Some(color), 0).expect("split").expect("a color")
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    let pair_topo = shared_gpu_topology(2).unwrap_or_else(|e| panic!("{e}"));
    let one_order: Vec<RankComm> = (0..2)
        .flat_map(|_| {
            Communicator::new(pair_topo.clone(), &[0, 1], &[], backend.clone())
                .unwrap_or_else(|e| panic!("{e}"))
                .into_ranks()
        })
        .collect();
    let gate = Gate::new();
    let mut pairs = [split, one_order];
    // Warm-up: plans, kernels and kept schedules (the host's pace, not measured).
    for serial in [false, true] {
        for p in &mut pairs {
            *p = pair_calls_us(std::mem::take(p), serial, &gate).ranks;
        }
    }
    // best[2 * p + serial]: together and one after the other, per kind of pair, alternating.
    let mut best = [f64::INFINITY; 4];
    for _ in 0..3 {
        for (p, ranks) in pairs.iter_mut().enumerate() {
            for serial in [false, true] {
                let m = pair_calls_us(std::mem::take(ranks), serial, &gate);
                assert!(
                    m.behind_gate,
                    "enqueuing took longer than the gate's {} us: the GPU time would not be \
                     the calls' alone",
                    GATE_NS / 1000
                );
                let i = 2 * p + usize::from(serial);
                best[i] = best[i].min(m.gpu_us);
                *ranks = m.ranks;
            }
        }
    }
    println!(
        "gpu-check: overlap calls={CALLS} bytes={} together_us={:.1} serial_us={:.1} ratio={:.3} \
         one_order_together_us={:.1} one_order_serial_us={:.1} one_order_ratio={:.3}",
        ELEMS * 4,
        best[0],
        best[1],
        best[0] / best[1],
        best[2],
        best[3],
        best[2] / best[3]
    );
}
