//! The fidelity table's data: published measurements, each with the bibliography key of its
//! source, the request that reproduces it on a preset, and what is compared.
//!
//! A published figure is copied as its source prints it and never tuned to fit the model. Where
//! the measured machine differs from the preset (another CPU, another card of the same PCIe
//! generation), [`Row::note`] says how. A row the model cannot meet carries its reason in
//! [`Row::gap`]; it stays in the table.

use relaycc_plan::Collective;

/// Which GPUs of a preset take part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpus {
    /// Every GPU of the preset.
    All,
    /// These GPUs, in rank order.
    List(&'static [u32]),
}

/// How a point-to-point copy is routed for the prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMethod {
    /// The NCCL-like baseline's route (direct NVLink, else PCIe peer-to-peer, else host memory).
    Baseline,
    /// One route relayed through this GPU, as [Ranganath-2019] does.
    RelayThrough(u32),
}

/// What is measured, on which GPUs, at which size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// A copy of `bytes` from GPU `from` to GPU `to`; the figure is GB/s.
    Copy {
        /// Sending GPU.
        from: u32,
        /// Receiving GPU.
        to: u32,
        /// Bytes copied.
        bytes: u64,
        /// How the prediction routes it.
        method: CopyMethod,
    },
    /// Copies of `bytes` each way between GPUs `a` and `b` at once, as a bidirectional
    /// bandwidth test runs them; the figure is the bytes of both over the time, GB/s.
    CopyBothWays {
        /// One GPU.
        a: u32,
        /// The other.
        b: u32,
        /// Bytes each way.
        bytes: u64,
    },
    /// nccl-tests' bus bandwidth of the NCCL-like baseline, GB/s.
    BusBw {
        /// The collective.
        collective: Collective,
        /// Its GPUs.
        gpus: Gpus,
        /// nccl-tests' `size`, bytes (f32 elements).
        bytes: u64,
    },
    /// nccl-tests' time of the NCCL-like baseline, microseconds.
    Time {
        /// The collective.
        collective: Collective,
        /// Its GPUs.
        gpus: Gpus,
        /// nccl-tests' `size`, bytes (f32 elements).
        bytes: u64,
    },
    /// relaycc's point-to-point plan (every route kind, max-flow split included) over the direct
    /// hop alone: a ratio, as [Temucin-2021] reports it.
    MultipathGain {
        /// Sending GPU.
        from: u32,
        /// Receiving GPU.
        to: u32,
        /// Bytes copied.
        bytes: u64,
    },
    /// relaycc's collective plan over the NCCL-like baseline, by time: a ratio, as [Temucin-2021]
    /// reports it.
    SpeedupOverBaseline {
        /// The collective.
        collective: Collective,
        /// Its GPUs.
        gpus: Gpus,
        /// nccl-tests' `size`, bytes (f32 elements).
        bytes: u64,
    },
}

impl Measure {
    /// The unit of the figure.
    pub fn unit(&self) -> &'static str {
        match self {
            Measure::Copy { .. } | Measure::CopyBothWays { .. } | Measure::BusBw { .. } => "GB/s",
            Measure::Time { .. } => "us",
            Measure::MultipathGain { .. } | Measure::SpeedupOverBaseline { .. } => "x",
        }
    }
}

/// One published measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// Short stable name, used by tests and `relaycc validate`.
    pub id: &'static str,
    /// The preset the measurement is reproduced on.
    pub preset: &'static str,
    /// What is measured.
    pub measure: Measure,
    /// The published figure, in [`Measure::unit`].
    pub published: f64,
    /// Its source: a bibliography key of `docs/REFERENCES.md`, with a locator.
    pub source: &'static str,
    /// How the measured machine or method relates to the preset.
    pub note: &'static str,
    /// Why the model cannot meet this row, when it cannot.
    pub gap: Option<&'static str>,
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The table. Order: point-to-point copies, collectives' bus bandwidth, small-message latency,
/// the figures of [Ranganath-2019] and [Temucin-2021].
pub const ROWS: &[Row] = &[
    // --- point-to-point copies ---
    Row {
        id: "p100-nvlink1-copy",
        preset: "dgx1-p100",
        measure: Measure::Copy {
            from: 0,
            to: 1,
            bytes: 256 * MIB,
            method: CopyMethod::Baseline,
        },
        published: 18.31,
        source: "[Dell-C4130, Table 3]",
        note: "p2pBandwidthLatencyTest, P100-SXM2 pair joined by one NVLink 1 lane \
               (PowerEdge C4130); every DGX-1 P100 pair is one such lane",
        gap: None,
    },
    Row {
        id: "v100-nvlink2-x1-copy",
        preset: "dgx1-v100",
        measure: Measure::Copy {
            from: 0,
            to: 1,
            bytes: 256 * MIB,
            method: CopyMethod::Baseline,
        },
        published: 22.0,
        source: "[Ranganath-2019]",
        note: "cudaMemcpy over one NVLink 2 lane of a DGX-1 V100 (\"a little over 22 GB/s\")",
        gap: None,
    },
    Row {
        id: "v100-nvlink2-x2-copy",
        preset: "dgx1-v100",
        measure: Measure::Copy {
            from: 0,
            to: 3,
            bytes: 256 * MIB,
            method: CopyMethod::Baseline,
        },
        published: 47.88,
        source: "[Dell-C4130, Table 3]",
        note: "p2pBandwidthLatencyTest, V100-SXM2 pair joined by two NVLink 2 lanes \
               (PowerEdge C4130); DGX-1 V100 GPUs 0 and 3 are such a pair",
        gap: None,
    },
    Row {
        id: "v100-pcie-0to7-copy",
        preset: "dgx1-v100",
        measure: Measure::Copy {
            from: 0,
            to: 7,
            bytes: 256 * MIB,
            method: CopyMethod::Baseline,
        },
        published: 9.0,
        source: "[Ranganath-2019]",
        note: "DGX-1 V100 GPUs 0 and 7 (no NVLink): the copy crosses PCIe and the CPUs",
        gap: None,
    },
    Row {
        id: "pcie4-p2p-copy",
        preset: "l40s-8gpu",
        measure: Measure::Copy {
            from: 0,
            to: 1,
            bytes: 256 * MIB,
            method: CopyMethod::Baseline,
        },
        published: 26.34,
        source: "[NVBandwidth-Issue50]",
        note: "nvbandwidth device_to_device_memcpy_read_ce between two RTX A6000 under one \
               PCIe Gen4 switch; the L40S box's GPUs 0 and 1 share a Gen4 switch the same way",
        gap: None,
    },
    Row {
        id: "h100-nvlink4-bidir-copy",
        preset: "dgx-h100",
        measure: Measure::CopyBothWays {
            a: 0,
            b: 1,
            bytes: 256 * MIB,
        },
        published: 783.0,
        source: "[NCCL-Issue1264]",
        note: "bidirectional GPU-to-GPU copy on an HGX H100 8-GPU board (Supermicro \
               SYS-821GE-TNHR), both directions summed",
        gap: None,
    },
    Row {
        id: "gb200-nvlink5-copy",
        preset: "gb200-nvl72",
        measure: Measure::Copy {
            from: 0,
            to: 4,
            bytes: GIB,
            method: CopyMethod::Baseline,
        },
        published: 770.0,
        source: "[Azure-Issue7]",
        note: "nvbandwidth GPU-to-GPU copy on GB200 (\"about 770GB/s\"); GPUs 0 and 4 sit \
               in different compute trays of the rack",
        gap: None,
    },
    // --- nccl-tests bus bandwidth ---
    Row {
        id: "a100-2gpu-allreduce",
        preset: "dgx-a100",
        measure: Measure::BusBw {
            collective: Collective::AllReduce,
            gpus: Gpus::List(&[0, 1]),
            bytes: 4 * GIB,
        },
        published: 208.0,
        source: "[NCCLTests-Issue178]",
        note: "all_reduce_perf on two A100-SXM4 joined by 12 NVLink 3 lanes (NV12)",
        gap: Some(
            "measured on a board whose GPUs 0 and 1 are bonded directly by 12 lanes, without NVSwitch, with reduce op avg; the model's two-rank ring runs at NCCL's achievable 20 GB/s per NVLink 3 lane, 240 GB/s, where that board reached 208",
        ),
    },
    Row {
        id: "a100-8gpu-allreduce",
        preset: "dgx-a100",
        measure: Measure::BusBw {
            collective: Collective::AllReduce,
            gpus: Gpus::All,
            bytes: 8 * GIB,
        },
        published: 230.0,
        source: "[NCCLTests-Issue149]",
        note: "NVIDIA's expected all_reduce busbw on 8 A100 (NVSwitch) at 8 GB",
        gap: None,
    },
    Row {
        id: "h100-8gpu-allreduce-nvls",
        preset: "dgx-h100",
        measure: Measure::BusBw {
            collective: Collective::AllReduce,
            gpus: Gpus::All,
            bytes: 8 * GIB,
        },
        published: 480.0,
        source: "[NCCLTests-Issue212]",
        note: "NVIDIA's peak all_reduce busbw on 8 H100 with NVLink SHARP (NVLS)",
        gap: None,
    },
    Row {
        id: "h100-8gpu-allgather",
        preset: "dgx-h100",
        measure: Measure::BusBw {
            collective: Collective::AllGather,
            gpus: Gpus::All,
            bytes: 8 * GIB,
        },
        published: 370.0,
        source: "[NCCLTests-Issue212]",
        note: "NVIDIA's effective NVLink 4 bandwidth, the busbw of operations other than \
               all_reduce on 8 H100",
        gap: None,
    },
    Row {
        id: "h200-8gpu-allreduce",
        preset: "hgx-h200",
        measure: Measure::BusBw {
            collective: Collective::AllReduce,
            gpus: Gpus::All,
            bytes: 4 * GIB,
        },
        published: 475.0,
        source: "[NCCLTests-Issue272]",
        note: "all_reduce_perf -b 64k -e 4G on 8 H200 (NCCL 2.20.3), peak busbw",
        gap: None,
    },
    Row {
        id: "gb200-72gpu-allreduce",
        preset: "gb200-nvl72",
        measure: Measure::BusBw {
            collective: Collective::AllReduce,
            gpus: Gpus::All,
            bytes: 8 * GIB,
        },
        published: 834.57,
        source: "[CoreWeave-PR43]",
        note: "all_reduce_perf on a full GB200 NVL72 rack (72 ranks), out-of-place at 8 GiB",
        gap: Some(
            "the model gives the rack's 18 switch chips the NVLS efficiency of an 8-GPU board; across 18 compute trays the published algbw is 425 GB/s where the model's is 521",
        ),
    },
    Row {
        id: "rtx5090-8gpu-allreduce",
        preset: "rtx5090-8gpu",
        measure: Measure::BusBw {
            collective: Collective::AllReduce,
            gpus: Gpus::All,
            bytes: 8 * GIB,
        },
        published: 28.0,
        source: "[NCCL-Issue1639]",
        note: "8 RTX 5090 without peer-to-peer, all_reduce 1-8 GiB, best busbw; measured with \
               two Xeon 8480+ where the preset has two EPYC sockets",
        gap: Some(
            "the measured box is a two-socket Xeon 8480+ server, not the preset's EPYC root ports; it delivered more host-staged bandwidth than the preset's host path (its PCIe layout is not published), and no 8-GPU GeForce figure on an EPYC box was found",
        ),
    },
    Row {
        id: "rtx5090-4gpu-allreduce",
        preset: "rtx5090-8gpu",
        measure: Measure::BusBw {
            collective: Collective::AllReduce,
            gpus: Gpus::List(&[0, 1, 2, 3]),
            bytes: 8 * GIB,
        },
        published: 35.0,
        source: "[NCCL-Issue1639]",
        note: "4 of the same 8 RTX 5090, best busbw; GPUs 0-3 share one socket in the preset",
        gap: Some("as for 8 GPUs: the measured server's host path is faster than the preset's"),
    },
    // --- small-message latency ---
    Row {
        id: "h100-2gpu-allreduce-latency",
        preset: "dgx-h100",
        measure: Measure::Time {
            collective: Collective::AllReduce,
            gpus: Gpus::List(&[0, 1]),
            bytes: 128,
        },
        published: 6.0,
        source: "[NCCL-Issue1259]",
        note: "all_reduce_perf -g 2 on an HGX H100 with CUDA graphs, 128 B (\"approximately 6us\")",
        gap: Some(
            "measured with CUDA graphs (all_reduce_perf -G), which hide the kernel launch the model charges every operation",
        ),
    },
    Row {
        id: "rtx4090-8gpu-allreduce-latency",
        preset: "rtx4090-8gpu",
        measure: Measure::Time {
            collective: Collective::AllReduce,
            gpus: Gpus::All,
            bytes: 8,
        },
        published: 42.14,
        source: "[NCCL-Issue1530]",
        note: "all_reduce_perf -g 8 on 8 RTX 4090 (stock driver: no peer-to-peer), 8 B, \
               out-of-place",
        gap: Some(
            "the model prices each host-staged ring step at NCCL's tuning-table latency; this box took 22% longer per operation, and no second published small-message figure without peer-to-peer was found to tell the box from the model",
        ),
    },
    // --- the figures of [Ranganath-2019] and [Temucin-2021] ---
    Row {
        id: "dgx1-relay-0to7",
        preset: "dgx1-v100",
        measure: Measure::Copy {
            from: 0,
            to: 7,
            bytes: 256 * MIB,
            method: CopyMethod::RelayThrough(3),
        },
        published: 18.0,
        source: "[Ranganath-2019]",
        note: "the re-routing copy 0 -> 3 -> 7 over NVLink, peak (\"near 18 GB/s\")",
        gap: Some(
            "the published figure is WOTIR's forwarding kernel (one warp) inside NCCL's ring; the model times relaycc's relay, whose chunks below 8 MiB run on the forward kernel, at the NVLink 2 rate less a kernel launch per chunk, and a one-warp kernel's throughput is not in the rates table",
        ),
    },
    Row {
        id: "ac922-multipath-gain",
        preset: "ac922",
        measure: Measure::MultipathGain {
            from: 0,
            to: 1,
            bytes: 256 * MIB,
        },
        published: 1.84,
        source: "[Temucin-2021]",
        note: "multi-path copy (direct NVLink and host-staged paths at once) over the direct \
               NVLink copy, IBM AC922 (4 V100)",
        gap: None,
    },
    Row {
        id: "ac922-hier-allreduce-1g",
        preset: "ac922",
        measure: Measure::SpeedupOverBaseline {
            collective: Collective::AllReduce,
            gpus: Gpus::All,
            bytes: GIB,
        },
        published: 1.38,
        source: "[Temucin-2021]",
        note: "hierarchical multi-path all_reduce over NCCL at 1 GB, IBM AC922 (4 V100)",
        gap: None,
    },
];

/// Presets, or figures of a preset, for which no published measurement was found in the sources
/// searched (nccl-tests and NCCL trackers, NVIDIA documents, vendor blogs, [Ranganath-2019] and [Temucin-2021]), with
/// what is missing. They stay listed so the table's reach is plain.
pub const NOT_COVERED: &[(&str, &str)] = &[
    ("dgx1-p100", "nccl-tests all_reduce / all_gather busbw"),
    (
        "dgx1-v100",
        "nccl-tests all_reduce / all_gather busbw on 8 GPUs",
    ),
    ("dgx2", "point-to-point copies and nccl-tests busbw"),
    (
        "dgx-b200",
        "point-to-point copies and single-node nccl-tests busbw",
    ),
    ("gh200-quad", "point-to-point copies and nccl-tests busbw"),
    ("l40s-8gpu", "nccl-tests busbw"),
    (
        "rtx4090-8gpu",
        "large-message nccl-tests busbw without peer-to-peer",
    ),
    (
        "pcie-4gpu, pcie-8gpu, summit-node",
        "point-to-point copies and nccl-tests busbw",
    ),
];
