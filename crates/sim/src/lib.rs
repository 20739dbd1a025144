//! # relaycc-sim: the fluid flow simulator and the bounds
//!
//! What a plan costs on a topology, and the fastest any plan could be. Above the Plan IR
//! (relaycc-plan), below the planners.
//!
//! The model, so that every figure can be recomputed by hand from the plan and topology JSON:
//!
//! - **Readiness.** An op is ready when all its `deps` and every earlier op of its lane have
//!   finished (a lane is an in-order stream, like a CUDA stream).
//! - **Latency.** A ready op first waits a fixed time, its mechanism's cost from the topology's
//!   cost model ([`relaycc_topo::rates::CostModel`], replaceable by a calibration file), plus
//!   [`SimConfig::op_overhead_us`] (default 0):
//!   - relaycc's own plans (no [`relaycc_plan::Plan::protocol`]): each op pays the launch
//!     the CUDA executor makes for it, plus, for a copy, the `latency_us` of each edge it
//!     names. A reduction is a kernel and pays `kernel_launch_us` (3 us). A copy below
//!     [`relaycc_topo::rates::SM_COPY_BELOW_BYTES`] (8 MiB) between memories its lane's GPU
//!     reaches with its own loads and stores (its own, another arena of the same device, a
//!     peer over NVLink or peer-to-peer PCIe) runs on SMs and pays `kernel_launch_us`, or
//!     nothing when it joins the launch before it on its lane (a batch of small copies, the
//!     copies of a reduction's result, a fan-out of one source: `model/launches.rs`); any
//!     other copy runs on a copy engine and pays `copy_engine_launch_us` (5 us). A relay hop
//!     is a copy, so every hop of every chunk pays its launch.
//!   - a plan with an NCCL protocol (the baseline): the plan starts after the protocol's launch
//!     latency (`baseLat`; NVLS's 25 us for an NVLS plan), each copy is one step and pays the
//!     protocol's step latency for the path class it crosses (NVLink, PCIe or host memory,
//!     network: NCCL's `hwLat`), and reductions are fused into the steps (no latency).
//! - **Issue.** With [`SimConfig::issue_us`] set (default 0), the op of launch `k` (ops in
//!   order, an op that joins the launch before it on its lane counted with it) also waits
//!   until the host has issued it, at `(k + 1) x issue_us`: an executor that enqueues a
//!   plan's launches one by one from one thread pays that per launch on a GPU backend.
//! - **Flow.** Then its bytes (elements x dtype size) flow as a fluid. Zero-byte ops end when
//!   their latency does. A copy of relaycc's plans that joins a fan-out (the copies of a
//!   reduction's result, or of a fan-out's source, in that launch's kernel) moves no bytes of
//!   its own: the op whose launch it joins carries its loads, per byte of its own, since the
//!   executor's kernel writes every destination as it reads the source; it ends after that op.
//! - **Resources.** Each directed topology edge is a resource of capacity `link.gbps` (1 GB/s
//!   = 1e3 bytes/us); so is each memory: a GPU's device memory at its calibrated rate
//!   (a calibration file's `memories`, measured by `relaycc calibrate`) or else
//!   [`relaycc_topo::rates::gpu_mem_gbps`] of its compute capability, bytes read plus
//!   written, one resource for all the arenas of one device (ranks sharing a GPU), with a
//!   second of its writes alone at the share of that rate a calibration measured
//!   (`write_share`), or [`DEVICE_WRITE_SHARE`] where none did; a CPU socket's host
//!   memory at its `host_mem_gbps`. A simulation keeps only the resources some op loads, in
//!   the topology's order, so its state is sized by the plan, not by the machine.
//! - **Protocol share.** A plan with a protocol loads each edge `1 / bw_fraction` times per
//!   data byte (LL 2x: half of each 8-byte store is a flag; LL128 1/0.92; Simple 1).
//! - **NVLS.** A copy in an NVLS group ([`relaycc_plan::NvlsShare`]) loads its edges `1 / efficiency`
//!   times per byte (the switch's share of the port rate for multimem traffic: 0.85 on sm90,
//!   0.74 on sm100) and its group's shared edge `1 / (efficiency x group size)` times: the
//!   group crosses it once (one upload the switch multicasts, or one reduced result).
//! - **Loads.** A copy loads each of its edges once per byte, plus the host memory of each end
//!   that lies in host memory (device memory outruns every link, so GPU ends are not charged);
//!   a copy inside one memory (its own, or between two arenas of one device, whose edges it
//!   then does not load) loads that memory twice per byte (read and write; once, a write,
//!   when it joins a fan-out, whose source the launch already reads) and its writes once,
//!   scaled by the memory's rate over the SM copy's where the copy runs on SMs and a
//!   calibration measured the SM copy on the GPU (`memories`' `sm_copy_gbps`). A
//!   reduction loads its destination's memory `srcs + 1` times per byte (read every source,
//!   write the result) and its writes once, scaled by the memory's rate over the reduce kernel's where a
//!   calibration measured that kernel on the GPU (`memories`' `reduce_gbps`), so that alone it
//!   runs at the kernel's rate; edges named by a reduction (a result written onward) load once.
//! - **Sharing.** Concurrent flows share every resource max-min fairly (progressive filling):
//!   a flow's rate is the largest it can have without lowering a flow that is no faster. Rates
//!   are recomputed whenever a flow starts or ends, only for the flows that share resources
//!   with it, directly or through others. A resource whose every flow also crosses a resource
//!   it can never outrun (a NIC's faster PCIe link behind its network port) is left out of the
//!   sharing, which does not change any rate (`dominance.rs`).
//!
//! Host memory is one resource per socket, so several GPUs staging through one socket share its
//! bandwidth; a PCIe switch's uplink is one directed edge, so GPUs behind one switch share it.
//!
//! Not modelled: per-chunk pipelining inside one op, contention for copy engines or SMs, a PCIe
//! switch's internal crossbar limit beyond its links, and device memory traffic of copies over
//! links.
//!
//! | item | what |
//! |---|---|
//! | [`simulate`] | time a plan: makespan, op spans, edge and memory loads |
//! | [`SimConfig`] | settings (per-op overhead) |
//! | [`PreparedSim`], [`lower_bound_us`] | a plan lowered once for a cheap lower bound, then its simulation |
//! | [`SimResult`], [`OpSpan`], [`EdgeUse`], [`MemUse`] | what a simulation reports |
//! | [`Perf`], [`SimResult::perf`] | nccl-tests' algbw and busbw |
//! | [`chrome_trace`] | the timeline as Chrome trace-event JSON (Perfetto) |
//! | [`collective_bound_gbps`] | the bandwidth bound of a collective on a topology |
//! | [`executor_launches`], [`LaunchCounts`] | the launches the simulator charges a plan: the CUDA executor's copy-engine copies and kernels |
//! | [`DEVICE_WRITE_SHARE`] | the share of a device memory's rate its writes alone reach, where no calibration measured it |
//!
//! Invariant: this crate imports nothing from relaycc-planners or relaycc-route; Cargo
//! enforces it.

#![deny(missing_docs)]

mod bound;
mod config;
mod dominance;
mod engine;
mod fairshare;
mod model;
mod result;
mod trace;

pub use bound::collective_bound_gbps;
pub use config::{DEFAULT_OP_OVERHEAD_US, SimConfig};
pub use engine::{
    DEADLINE_CHECK_BATCHES, DEADLINE_CHECK_WORK, PreparedSim, SimCut, lower_bound_us, simulate,
};
pub use model::{DEVICE_WRITE_SHARE, LaunchCounts, executor_launches};
pub use result::{EdgeUse, MemUse, OpSpan, Perf, SimResult};
pub use trace::chrome_trace;
