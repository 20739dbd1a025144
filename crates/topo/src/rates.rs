//! The one table of link rates and latencies.
//!
//! Every figure relaycc predicts starts here. Each constant has its unit in its name and its
//! source beside it. Rates are GB/s (10^9 bytes per second) **per direction**: a full-duplex
//! link is two directed edges of this rate. Where a measured effective rate is published the
//! table uses it, because the simulator predicts what a copy achieves, not what a datasheet
//! promises; nominal values stay beside them for reference. A calibration file
//! ([`crate::Calibration`]) overrides any of these with rates measured on the machine at hand.

use serde::{Deserialize, Serialize};

/// NVLink 1 (P100, sm60), effective GB/s per link and direction.
/// Source: [Measured-Rates], about 18.4 per link (nominal 20, [NVIDIA-P100]).
pub const NVLINK1_LANE_GBPS: f64 = 18.4;
/// NVLink 2 (V100, sm70), effective GB/s per link and direction.
/// Source: [Measured-Rates], about 24.2 per link (48.5 both ways over NV1, 96.9 over NV2 on a
/// DGX-1 V100; nominal 25, [NVIDIA-V100]).
pub const NVLINK2_LANE_GBPS: f64 = 24.2;
/// NVLink 3 (A100, sm80), achievable GB/s per link and direction: NCCL's model value
/// ([NCCL-src], src/graph/topo.h `SM80_NVLINK_BW`), 80% of the nominal
/// [`NVLINK3_LANE_NOMINAL_GBPS`]. NCCL's tuner also caps sm80 bus bandwidth at 235 GB/s
/// (src/graph/tuning.cc), which 12 links of this rate (240) meet; nccl-tests reports about 230
/// GB/s all_reduce bus bandwidth on a DGX A100 ([NCCL-tests]).
pub const NVLINK3_LANE_GBPS: f64 = 20.0;
/// NVLink 3 nominal GB/s per link and direction. Source: [NVIDIA-A100], 12 links = 300.
pub const NVLINK3_LANE_NOMINAL_GBPS: f64 = 25.0;
/// NVLink 4 (H100/H200, sm90), achievable GB/s per link and direction: NCCL's model value
/// ([NCCL-src], src/graph/topo.h `SM90_NVLINK_BW`), 82% of the nominal
/// [`NVLINK4_LANE_NOMINAL_GBPS`].
pub const NVLINK4_LANE_GBPS: f64 = 20.6;
/// NVLink 4 nominal GB/s per link and direction. Source: [NVIDIA-H100], 18 links = 450.
pub const NVLINK4_LANE_NOMINAL_GBPS: f64 = 25.0;
/// NVLink 5 (B200, sm100), achievable GB/s per link and direction: NCCL's model value
/// ([NCCL-src], src/graph/topo.h `SM100_NVLINK_BW`), 80% of the nominal
/// [`NVLINK5_LANE_NOMINAL_GBPS`].
pub const NVLINK5_LANE_GBPS: f64 = 40.1;
/// NVLink 5 nominal GB/s per link and direction. Source: [NVIDIA-B200], 18 links = 900.
pub const NVLINK5_LANE_NOMINAL_GBPS: f64 = 50.0;
/// NCCL's own model value for one sm70 NVLink, GB/s ([NCCL-src], src/graph/topo.h
/// `SM70_NVLINK_BW`).
/// Kept for comparison with NCCL's tuner; not used for prediction.
pub const NCCL_SM70_NVLINK_MODEL_GBPS: f64 = 20.0;

/// PCIe Gen3 x16, effective GB/s per direction for GPU-to-GPU traffic.
/// Source: [Measured-Rates], GPU to GPU across a switch or the CPU 9-11 (nominal 15.75,
/// [PCIe-Base]); the middle of that range.
pub const PCIE_GEN3_X16_GBPS: f64 = 10.0;
/// PCIe Gen4 x16, effective GB/s per direction. Source: [Measured-Rates], host to GPU about 26
/// (nominal 31.5, [PCIe-Base]).
pub const PCIE_GEN4_X16_GBPS: f64 = 26.0;
/// PCIe Gen5 x16, effective GB/s per direction. Source: [Measured-Rates], host to GPU 51-52
/// (nominal 63, [PCIe-Base]).
pub const PCIE_GEN5_X16_GBPS: f64 = 51.5;
/// PCIe Gen3 x16 nominal GB/s per direction (8 GT/s, 128b/130b). Source: [PCIe-Base].
pub const PCIE_GEN3_X16_NOMINAL_GBPS: f64 = 15.75;

/// Intel Broadwell-EP inter-socket link (two QPI links at 9.6 GT/s, 2 bytes per transfer
/// each), GB/s per direction. Source: [Intel-E5v4]. NCCL models it as 6 ([NCCL-src]), a tuning
/// value rather than a measurement.
pub const QPI_BROADWELL_GBPS: f64 = 38.4;
/// Intel Skylake-SP inter-socket link (two UPI links at 10.4 GT/s), GB/s per direction.
/// Source: [Intel-Xeon]; NCCL's model value is 10 ([NCCL-src]).
pub const UPI_SKYLAKE_GBPS: f64 = 41.6;
/// Intel Sapphire Rapids inter-socket link, GB/s per direction: NCCL's model value
/// ([NCCL-src], src/graph/topo.h).
pub const UPI_SAPPHIRE_RAPIDS_GBPS: f64 = 22.0;
/// Intel Emerald Rapids inter-socket link, GB/s per direction: NCCL's model value ([NCCL-src]).
pub const UPI_EMERALD_RAPIDS_GBPS: f64 = 40.0;
/// AMD inter-socket Infinity Fabric, GB/s per direction: NCCL's model value ([NCCL-src]).
pub const AMD_INFINITY_FABRIC_GBPS: f64 = 16.0;
/// IBM POWER9 X-Bus between sockets, GB/s per direction (64 both ways). Source: [IBM-AC922].
pub const POWER9_XBUS_GBPS: f64 = 32.0;
/// Inter-socket link of an unidentified CPU, GB/s per direction: the smallest model value NCCL
/// uses for a current CPU (Skylake, 10; [NCCL-src]), so an unknown machine is not flattered.
pub const UNKNOWN_INTER_SOCKET_GBPS: f64 = 10.0;
/// NVLink-C2C between a Grace CPU and a Hopper GPU, GB/s per direction (900 both ways). Source:
/// [NVIDIA-GH200].
pub const NVLINK_C2C_GBPS: f64 = 450.0;
/// NVLink-C2C share of one Blackwell GPU of a GB200 superchip, GB/s per direction: the Grace
/// CPU's one 900 GB/s (bidirectional) C2C link serves both of its GPUs, so each gets half of
/// 450. Source: NVIDIA GB200 NVL72 datasheet [NVIDIA-GB200NVL72].
pub const NVLINK_C2C_GB200_PER_GPU_GBPS: f64 = 225.0;
/// Grace-to-Grace coherent NVLink (cNVLink) between the superchips of a 4x GH200 node, GB/s per
/// direction. Source: JSC JUPITER Booster node design [JSC-Jupiter], "pairs connected with
/// 100 GB/s per direction".
pub const GRACE_CNVLINK_GBPS: f64 = 100.0;

/// Host memory bandwidth of one Broadwell-EP socket (4 channels DDR4-2400), GB/s. Source:
/// [Intel-E5v4].
pub const HOST_MEM_BROADWELL_GBPS: f64 = 76.8;
/// Host memory bandwidth of one POWER9 socket (8 channels DDR4-2666), GB/s. Source: [IBM-AC922]
/// (170 GB/s per socket).
pub const HOST_MEM_POWER9_GBPS: f64 = 170.0;
/// Host memory bandwidth of one Skylake/Cascade Lake socket (6 channels DDR4-2933), GB/s.
/// Source: [Intel-Xeon].
pub const HOST_MEM_SKYLAKE_GBPS: f64 = 140.0;
/// Host memory bandwidth of one AMD Rome/Milan socket (8 channels DDR4-3200), GB/s. Source:
/// [AMD-EPYC].
pub const HOST_MEM_AMD_GBPS: f64 = 204.8;
/// Host memory bandwidth of one Sapphire/Emerald Rapids socket (8 channels DDR5-4800), GB/s.
/// Source: [Intel-Xeon4].
pub const HOST_MEM_SAPPHIRE_RAPIDS_GBPS: f64 = 307.2;
/// Host memory bandwidth of one Grace CPU (LPDDR5X-8532), GB/s. Source: JSC JUPITER Booster
/// node design [JSC-Jupiter], "120 GB LPDDR5X memory at 512 GB/s".
pub const HOST_MEM_GRACE_GBPS: f64 = 512.0;
/// Host memory bandwidth assumed for an unidentified socket, GB/s: the smallest of the values
/// above (Broadwell), so staging through an unknown host is not flattered.
pub const HOST_MEM_UNKNOWN_GBPS: f64 = 76.8;

/// P100 HBM2 device memory bandwidth, GB/s. Source: [NVIDIA-P100] (732).
pub const HBM_P100_GBPS: f64 = 732.0;
/// V100 HBM2 device memory bandwidth, GB/s. Source: [NVIDIA-V100] (900).
pub const HBM_V100_GBPS: f64 = 900.0;
/// A100 80GB HBM2e device memory bandwidth, GB/s. Source: [NVIDIA-A100] (2039).
pub const HBM_A100_GBPS: f64 = 2039.0;
/// H100 SXM HBM3 device memory bandwidth, GB/s. Source: [NVIDIA-H100] (3350).
pub const HBM_H100_GBPS: f64 = 3350.0;
/// B200 HBM3e device memory bandwidth, GB/s. Source: [NVIDIA-B200] (8000).
pub const HBM_B200_GBPS: f64 = 8000.0;
/// Device memory bandwidth assumed for a GPU of unknown generation, GB/s: a mid-range GDDR6
/// card ([NVIDIA-RTXA6000], 768).
pub const GPU_MEM_UNKNOWN_GBPS: f64 = 768.0;

/// Device memory bandwidth of a GPU of compute capability `sm` (70 for V100), GB/s.
pub fn gpu_mem_gbps(sm: Option<u32>) -> f64 {
    match sm {
        Some(60) => HBM_P100_GBPS,
        Some(70) => HBM_V100_GBPS,
        Some(80) => HBM_A100_GBPS,
        Some(90) => HBM_H100_GBPS,
        Some(100) => HBM_B200_GBPS,
        _ => GPU_MEM_UNKNOWN_GBPS,
    }
}

/// InfiniBand EDR (100 Gb/s), GB/s per direction. Source: [IBTA-Roadmap].
pub const IB_EDR_GBPS: f64 = 12.5;
/// InfiniBand HDR (200 Gb/s), GB/s per direction. Source: [IBTA-Roadmap].
pub const IB_HDR_GBPS: f64 = 25.0;
/// InfiniBand NDR (400 Gb/s), GB/s per direction. Source: [IBTA-Roadmap].
pub const IB_NDR_GBPS: f64 = 50.0;
/// InfiniBand NDR200 (one 200 Gb/s port of an NDR card), GB/s per direction. Source: JSC
/// JUPITER Booster node design [JSC-Jupiter], "4x InfiniBand NDR200 (ConnectX-7)".
pub const IB_NDR200_GBPS: f64 = 25.0;
/// 100 Gb/s Ethernet (RoCE), GB/s per direction. Source: [IEEE-8023bj].
pub const ETH_100G_GBPS: f64 = 12.5;
/// 25 Gb/s Ethernet, GB/s per direction. Source: [IEEE-8023by].
pub const ETH_25G_GBPS: f64 = 3.125;

/// One NVLink hop, microseconds. Source: [NCCL-src], src/graph/tuning.cc `hwLat` NVLink (LL
/// protocol).
pub const NVLINK_LATENCY_US: f64 = 0.6;
/// One PCIe hop (device to switch, switch to root), microseconds. Source: [NCCL-src],
/// src/graph/tuning.cc `hwLat` PCI (LL protocol, 1.0 for a whole PCI path), split over the two
/// hops a path has at least.
pub const PCIE_HOP_LATENCY_US: f64 = 0.5;
/// Crossing the inter-socket link, microseconds. Source: [NCCL-src], tuning.cc charges a
/// host-memory path roughly twice a PCI path; the difference, 1.0, is charged here.
pub const INTER_SOCKET_LATENCY_US: f64 = 1.0;
/// NVLink-C2C hop, microseconds: the NVLink value (same protocol family, [NCCL-src]).
pub const C2C_LATENCY_US: f64 = 0.6;
/// A network hop (NIC to switch or switch to NIC), microseconds. Source: [NCCL-src], tuning.cc
/// `hwLat`
/// NET (LL protocol, 5.0 for a whole network path) split over its two hops.
pub const NETWORK_HOP_LATENCY_US: f64 = 2.5;
/// Inside a switch chip (PCIe or NVSwitch), microseconds: counted in the hop latencies above.
pub const SWITCH_LATENCY_US: f64 = 0.0;

/// An NCCL protocol: how a collective kernel hands a step's data to the next GPU.
///
/// - **LL** (low latency): 8-byte stores of 4 data bytes and a 4-byte flag, so a step needs no
///   separate synchronisation but carries half the link's rate.
/// - **LL128**: 128-byte lines of 120 data bytes and an 8-byte flag, enabled by NCCL on NVLink.
/// - **Simple**: whole chunks followed by a memory fence and a flag: full rate, the longest step.
///
/// Source: [NCCL-src], src/graph/tuning.cc and src/include/device.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Low latency: 8-byte flag+data stores.
    Ll,
    /// 128-byte lines with a flag per line.
    Ll128,
    /// Chunks with a fence and a flag per step.
    Simple,
}

impl Protocol {
    /// All protocols, in NCCL's order.
    pub const ALL: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];
    /// NCCL's name (`LL`, `LL128`, `Simple`).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
            Protocol::Simple => "Simple",
        }
    }
    /// The key that names this protocol in a calibration file's `costs` (`ll`, `ll128`,
    /// `simple`).
    pub fn key(self) -> &'static str {
        match self {
            Protocol::Ll => "ll",
            Protocol::Ll128 => "ll128",
            Protocol::Simple => "simple",
        }
    }
}

/// LL's share of a link's rate that carries data: 4 data bytes per 8-byte store. Source:
/// [NCCL-src], src/graph/tuning.cc (`busBw * 0.5` for ring LL).
pub const LL_BW_FRACTION: f64 = 0.5;
/// LL128's share of a link's rate that carries data: NCCL's tuner uses 0.92 (120 of 128 bytes
/// is 0.9375, less the flag checks). Source: [NCCL-src], src/graph/tuning.cc.
pub const LL128_BW_FRACTION: f64 = 0.92;
/// Simple's share of a link's rate that carries data. Source: [NCCL-src], src/graph/tuning.cc
/// (no reduction for Simple).
pub const SIMPLE_BW_FRACTION: f64 = 1.0;
/// The smallest share of a link's rate a calibration may give a protocol or NVLS
/// ([`CostModel::set`]), and of a device memory's rate its writes alone
/// (`crate::MemoryRate::write_share`): a tenth of LL's, the lowest share any NCCL protocol is
/// designed for ([NCCL-src], LL's 4 data bytes per 8-byte store). A measured share below it is
/// a failed measurement; towards zero, the bytes a plan puts on the wire (data over the share)
/// or a memory's writes take and so every predicted time grow without bound, until they
/// overflow to infinity and no plan can be timed.
pub const MIN_CALIBRATED_FRACTION: f64 = LL_BW_FRACTION / 10.0;
/// Launch latency of an NCCL ring collective with LL, microseconds: `baseLat` Ring/LL.
/// Source: [NCCL-src], src/graph/tuning.cc (2.19 and later).
pub const LL_BASE_LATENCY_US: f64 = 6.6;
/// Launch latency of an NCCL ring collective with LL128, microseconds: `baseLat` Ring/LL128.
/// Source: [NCCL-src], src/graph/tuning.cc.
pub const LL128_BASE_LATENCY_US: f64 = 14.0;
/// Launch latency of an NCCL ring collective with Simple, microseconds: `baseLat` Ring/Simple.
/// Source: [NCCL-src], src/graph/tuning.cc.
pub const SIMPLE_BASE_LATENCY_US: f64 = 8.4;
/// One LL step over NVLink (or NVLink-C2C), microseconds: `hwLat` NVLink Ring/LL. Source:
/// [NCCL-src], src/graph/tuning.cc.
pub const LL_NVLINK_STEP_US: f64 = 0.6;
/// One LL128 step over NVLink, microseconds: `hwLat` NVLink Ring/LL128. Source: [NCCL-src].
pub const LL128_NVLINK_STEP_US: f64 = 1.9;
/// One Simple step over NVLink, microseconds: `hwLat` NVLink Ring/Simple. Source: [NCCL-src].
pub const SIMPLE_NVLINK_STEP_US: f64 = 3.4;
/// One LL step over PCIe (or through host memory), microseconds: `hwLat` PCI Ring/LL. Source:
/// [NCCL-src].
pub const LL_PCIE_STEP_US: f64 = 1.0;
/// One LL128 step over PCIe, microseconds: `hwLat` PCI Ring/LL128. Source: [NCCL-src].
pub const LL128_PCIE_STEP_US: f64 = 2.5;
/// One Simple step over PCIe, microseconds: `hwLat` PCI Ring/Simple. Source: [NCCL-src].
pub const SIMPLE_PCIE_STEP_US: f64 = 5.7;
/// One LL step over the network, microseconds: `hwLat` NET Ring/LL. Source: [NCCL-src].
pub const LL_NETWORK_STEP_US: f64 = 2.7;
/// One LL128 step over the network, microseconds: `hwLat` NET Ring/LL128. Source: [NCCL-src].
pub const LL128_NETWORK_STEP_US: f64 = 4.0;
/// One Simple step over the network, microseconds: `hwLat` NET Ring/Simple. Source:
/// [NCCL-src].
pub const SIMPLE_NETWORK_STEP_US: f64 = 14.0;

/// Latency of an NVLS (NVLink SHARP) collective inside one node, microseconds: `hwLat` NVLink
/// NVLS/Simple, with a `baseLat` of 0. Source: [NCCL-src], src/graph/tuning.cc.
pub const NVLS_LATENCY_US: f64 = 25.0;
/// Share of the NVSwitch port rate that NVLS traffic (multimem loads that the switch reduces,
/// multimem stores that it multicasts) achieves on Hopper (sm90): NCCL's `nvlsEfficiency`.
/// Source: [NCCL-src], src/graph/tuning.cc.
pub const NVLS_SM90_PORT_FRACTION: f64 = 0.85;
/// The same share on Blackwell (sm100): NCCL's `nvlsEfficiency`. Source: [NCCL-src].
pub const NVLS_SM100_PORT_FRACTION: f64 = 0.74;
/// The first compute capability whose NVSwitch reduces and multicasts (third-generation
/// NVSwitch with NVLink SHARP, H100). Source: [NVIDIA-H100].
pub const NVLS_MIN_SM: u32 = 90;

/// Issuing one copy-engine copy (`cudaMemcpyAsync`), microseconds: the fixed cost each of
/// relaycc's copies pays before its bytes flow. Measured 5-7 us per call for small copies
/// ([Wu-2026], section 5.2); the low end, since relaycc enqueues a lane's copies ahead.
pub const COPY_ENGINE_LAUNCH_US: f64 = 5.0;
/// Launching one kernel (a relaycc reduction or forwarding kernel), microseconds: a null
/// kernel's launch overhead on current GPUs and drivers, about 3 us ([NVForum-Launch]).
pub const KERNEL_LAUNCH_US: f64 = 3.0;
/// Copies below this many bytes run on a GPU's SMs (a copy kernel), larger ones on its copy
/// engines: the threshold of the CUDA backend's copies between device memories a GPU reaches
/// (`CudaBackend::set_sm_copy_below`). NCCL moves all_gather data with SM kernels up to 8 MiB
/// and with copy engines above it, where the engines keep pace and leave the SMs to the
/// application (`NCCL_SYM_CE_THRESHOLD`, [NCCL-CE]). Within one GPU a copy engine reaches
/// about two thirds of the memory bandwidth ([CCCL-Issue1672]: `cudaMemcpy` device to device
/// at 67% of H200's), which a copy kernel exceeds, so a job whose SMs are idle during its
/// collectives may set the threshold higher; `relaycc calibrate` measures both rates.
pub const SM_COPY_BELOW_BYTES: u64 = 8 << 20;
/// Most copies one launch of the CUDA backend's batched forward kernel makes, as the
/// simulator charges them (`RELAYCC_MAX_COPIES` in `kernels/forward.cu`).
pub const SM_COPY_BATCH_MAX: usize = 16;
/// Most destinations one reduce-kernel launch writes: a reduction's own and the copies of its
/// result or of one fan-out's source (`RELAYCC_MAX_DSTS` in `kernels/reduce.cu`).
pub const REDUCE_KERNEL_DSTS_MAX: usize = 8;
/// Streaming multiprocessors a relay takes from the GPU that hosts it when it forwards with a
/// kernel: one thread block per channel, as NCCL's forwarding runs ([NCCL-src],
/// src/enqueue.cc, one block per channel). A copy-engine relay takes none.
pub const FORWARDING_KERNEL_SMS: u32 = 1;

/// The costs a transfer pays besides link bandwidth: NCCL's protocols, NVLS, and relaycc's own
/// mechanisms (copy engines, kernels). Defaults are the constants above; a calibration file's
/// `costs` replaces any of them by name ([`CostModel::set`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Data share of the link rate per protocol (LL, LL128, Simple), 0 < x <= 1.
    pub bw_fraction: [f64; 3],
    /// Launch latency per protocol, microseconds.
    pub base_latency_us: [f64; 3],
    /// Step latency per protocol over NVLink, microseconds.
    pub nvlink_step_us: [f64; 3],
    /// Step latency per protocol over PCIe or host memory, microseconds.
    pub pcie_step_us: [f64; 3],
    /// Step latency per protocol over the network, microseconds.
    pub network_step_us: [f64; 3],
    /// NVLS latency, microseconds.
    pub nvls_latency_us: f64,
    /// NVLS share of the switch port rate on sm90.
    pub nvls_sm90_efficiency: f64,
    /// NVLS share of the switch port rate on sm100 and later.
    pub nvls_sm100_efficiency: f64,
    /// Copy-engine copy launch, microseconds.
    pub copy_engine_launch_us: f64,
    /// Kernel launch, microseconds.
    pub kernel_launch_us: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            bw_fraction: [LL_BW_FRACTION, LL128_BW_FRACTION, SIMPLE_BW_FRACTION],
            base_latency_us: [
                LL_BASE_LATENCY_US,
                LL128_BASE_LATENCY_US,
                SIMPLE_BASE_LATENCY_US,
            ],
            nvlink_step_us: [
                LL_NVLINK_STEP_US,
                LL128_NVLINK_STEP_US,
                SIMPLE_NVLINK_STEP_US,
            ],
            pcie_step_us: [LL_PCIE_STEP_US, LL128_PCIE_STEP_US, SIMPLE_PCIE_STEP_US],
            network_step_us: [
                LL_NETWORK_STEP_US,
                LL128_NETWORK_STEP_US,
                SIMPLE_NETWORK_STEP_US,
            ],
            nvls_latency_us: NVLS_LATENCY_US,
            nvls_sm90_efficiency: NVLS_SM90_PORT_FRACTION,
            nvls_sm100_efficiency: NVLS_SM100_PORT_FRACTION,
            copy_engine_launch_us: COPY_ENGINE_LAUNCH_US,
            kernel_launch_us: KERNEL_LAUNCH_US,
        }
    }
}

/// The class of path an NCCL step crosses, for its step latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StepClass {
    /// NVLink, NVSwitch or NVLink-C2C.
    NvLink,
    /// PCIe, the inter-socket link or host memory.
    Pcie,
    /// A NIC and the network.
    Network,
}

impl CostModel {
    /// The names [`CostModel::set`] accepts, with the unit each is in.
    pub fn names() -> Vec<String> {
        let mut v = Vec::new();
        for p in Protocol::ALL {
            let k = p.key();
            v.push(format!("{k}_bw_fraction"));
            v.push(format!("{k}_base_latency_us"));
            v.push(format!("{k}_nvlink_step_us"));
            v.push(format!("{k}_pcie_step_us"));
            v.push(format!("{k}_network_step_us"));
        }
        for n in [
            "nvls_latency_us",
            "nvls_sm90_efficiency",
            "nvls_sm100_efficiency",
            "copy_engine_launch_us",
            "kernel_launch_us",
        ] {
            v.push(n.to_string());
        }
        v
    }

    /// The cost `name` (one of [`CostModel::names`]), or `None` for an unknown name.
    pub fn get(&self, name: &str) -> Option<f64> {
        for (i, p) in Protocol::ALL.iter().enumerate() {
            let Some(rest) = name.strip_prefix(p.key()).and_then(|r| r.strip_prefix('_')) else {
                continue;
            };
            return match rest {
                "bw_fraction" => Some(self.bw_fraction[i]),
                "base_latency_us" => Some(self.base_latency_us[i]),
                "nvlink_step_us" => Some(self.nvlink_step_us[i]),
                "pcie_step_us" => Some(self.pcie_step_us[i]),
                "network_step_us" => Some(self.network_step_us[i]),
                _ => None,
            };
        }
        match name {
            "nvls_latency_us" => Some(self.nvls_latency_us),
            "nvls_sm90_efficiency" => Some(self.nvls_sm90_efficiency),
            "nvls_sm100_efficiency" => Some(self.nvls_sm100_efficiency),
            "copy_engine_launch_us" => Some(self.copy_engine_launch_us),
            "kernel_launch_us" => Some(self.kernel_launch_us),
            _ => None,
        }
    }

    /// The entries that differ from the defaults, by name: what a topology's JSON carries so
    /// that a calibrated cost model survives export and import.
    pub fn changed(&self) -> std::collections::BTreeMap<String, f64> {
        let base = CostModel::default();
        CostModel::names()
            .into_iter()
            .filter_map(|n| {
                let (v, d) = (self.get(&n)?, base.get(&n)?);
                (v != d).then_some((n, v))
            })
            .collect()
    }

    /// Replace the cost `name` (one of [`CostModel::names`]) by `value`.
    ///
    /// # Errors
    /// A message when the name is unknown, a fraction or efficiency is not in
    /// [[`MIN_CALIBRATED_FRACTION`], 1], or a latency is not in [0, `max_latency_us`].
    pub fn set(&mut self, name: &str, value: f64, max_latency_us: f64) -> Result<(), String> {
        let fraction = |v: f64| {
            if (MIN_CALIBRATED_FRACTION..=1.0).contains(&v) {
                Ok(v)
            } else {
                Err(format!(
                    "{name} must be a fraction from {MIN_CALIBRATED_FRACTION} to 1 (a tenth of \
                     LL's share of the link at least: below it a protocol's bytes on the wire, \
                     and so every predicted time, grow without bound), got {value:?}"
                ))
            }
        };
        let latency = |v: f64| {
            if (0.0..=max_latency_us).contains(&v) {
                Ok(v)
            } else {
                Err(format!(
                    "{name} must be from 0 to {max_latency_us} us, got {value:?}"
                ))
            }
        };
        for (i, p) in Protocol::ALL.iter().enumerate() {
            let Some(rest) = name.strip_prefix(p.key()).and_then(|r| r.strip_prefix('_')) else {
                continue;
            };
            let slot = match rest {
                "bw_fraction" => {
                    self.bw_fraction[i] = fraction(value)?;
                    return Ok(());
                }
                "base_latency_us" => &mut self.base_latency_us[i],
                "nvlink_step_us" => &mut self.nvlink_step_us[i],
                "pcie_step_us" => &mut self.pcie_step_us[i],
                "network_step_us" => &mut self.network_step_us[i],
                _ => continue,
            };
            *slot = latency(value)?;
            return Ok(());
        }
        match name {
            "nvls_latency_us" => self.nvls_latency_us = latency(value)?,
            "nvls_sm90_efficiency" => self.nvls_sm90_efficiency = fraction(value)?,
            "nvls_sm100_efficiency" => self.nvls_sm100_efficiency = fraction(value)?,
            "copy_engine_launch_us" => self.copy_engine_launch_us = latency(value)?,
            "kernel_launch_us" => self.kernel_launch_us = latency(value)?,
            _ => {
                return Err(format!(
                    "unknown cost {name:?}; known: {}",
                    CostModel::names().join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Data share of the link rate that `p` carries.
    pub fn bw_fraction(&self, p: Protocol) -> f64 {
        self.bw_fraction[p as usize]
    }
    /// Launch latency of a collective with protocol `p`, microseconds.
    pub fn base_latency_us(&self, p: Protocol) -> f64 {
        self.base_latency_us[p as usize]
    }
    /// Latency of one step of protocol `p` over a path of class `c`, microseconds.
    pub fn step_us(&self, p: Protocol, c: StepClass) -> f64 {
        let t = match c {
            StepClass::NvLink => &self.nvlink_step_us,
            StepClass::Pcie => &self.pcie_step_us,
            StepClass::Network => &self.network_step_us,
        };
        t[p as usize]
    }
    /// NVLS share of the switch port rate for GPUs of compute capability `sm`; None where the
    /// NVSwitch does not reduce (before sm90).
    pub fn nvls_efficiency(&self, sm: u32) -> Option<f64> {
        match sm {
            s if s < NVLS_MIN_SM => None,
            90..=99 => Some(self.nvls_sm90_efficiency),
            _ => Some(self.nvls_sm100_efficiency),
        }
    }
}

/// NVLink generation, ordered oldest to newest; serialized as its number (1..=5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "u32", try_from = "u32")]
pub enum NvLinkGen {
    /// NVLink 1: P100 (sm60).
    V1 = 1,
    /// NVLink 2: V100 (sm70), POWER9 CPU links.
    V2 = 2,
    /// NVLink 3: A100 (sm80).
    V3 = 3,
    /// NVLink 4: H100, H200 (sm90).
    V4 = 4,
    /// NVLink 5: B200 (sm100).
    V5 = 5,
}

impl From<NvLinkGen> for u32 {
    fn from(g: NvLinkGen) -> u32 {
        g as u32
    }
}

impl TryFrom<u32> for NvLinkGen {
    type Error = String;
    fn try_from(n: u32) -> Result<Self, String> {
        NvLinkGen::from_number(n).ok_or_else(|| format!("NVLink generation {n} is not 1..=5"))
    }
}

impl NvLinkGen {
    /// The generation a GPU of compute capability `sm` (e.g. 70) speaks; None before NVLink.
    pub fn for_sm(sm: u32) -> Option<NvLinkGen> {
        match sm {
            60..=69 => Some(NvLinkGen::V1),
            70..=79 => Some(NvLinkGen::V2),
            80..=89 => Some(NvLinkGen::V3),
            90..=99 => Some(NvLinkGen::V4),
            100.. => Some(NvLinkGen::V5),
            _ => None,
        }
    }
    /// From the generation number 1..=5.
    pub fn from_number(n: u32) -> Option<NvLinkGen> {
        match n {
            1 => Some(NvLinkGen::V1),
            2 => Some(NvLinkGen::V2),
            3 => Some(NvLinkGen::V3),
            4 => Some(NvLinkGen::V4),
            5 => Some(NvLinkGen::V5),
            _ => None,
        }
    }
    /// GB/s of one link (lane) per direction.
    pub fn lane_gbps(self) -> f64 {
        match self {
            NvLinkGen::V1 => NVLINK1_LANE_GBPS,
            NvLinkGen::V2 => NVLINK2_LANE_GBPS,
            NvLinkGen::V3 => NVLINK3_LANE_GBPS,
            NvLinkGen::V4 => NVLINK4_LANE_GBPS,
            NvLinkGen::V5 => NVLINK5_LANE_GBPS,
        }
    }
}

/// GB/s per direction of a PCIe link of generation `gen` (1..=6) and `width` lanes.
///
/// Gen3-5 x16 use the effective values above and scale linearly with width; gen1/2 halve gen3
/// per step and gen6 doubles gen5 (each generation doubles the per-lane transfer rate).
pub fn pcie_gbps(generation: u8, width: u32) -> f64 {
    let x16 = match generation {
        0 | 1 => PCIE_GEN3_X16_GBPS / 4.0,
        2 => PCIE_GEN3_X16_GBPS / 2.0,
        3 => PCIE_GEN3_X16_GBPS,
        4 => PCIE_GEN4_X16_GBPS,
        5 => PCIE_GEN5_X16_GBPS,
        _ => PCIE_GEN5_X16_GBPS * 2.0,
    };
    x16 * f64::from(width.max(1)) / 16.0
}

/// The PCIe generation whose per-lane transfer rate is `gt_per_s` (2.5, 5, 8, 16, 32, 64 GT/s).
pub fn pcie_gen_for_gts(gt_per_s: f64) -> u8 {
    match gt_per_s {
        x if x < 4.0 => 1,
        x if x < 7.0 => 2,
        x if x < 12.0 => 3,
        x if x < 24.0 => 4,
        x if x < 48.0 => 5,
        _ => 6,
    }
}

/// CPU family: decides the inter-socket link and the host-memory bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuFamily {
    /// Intel Broadwell-EP (DGX-1), QPI.
    IntelBroadwell,
    /// Intel Skylake/Cascade Lake-SP, UPI.
    IntelSkylake,
    /// Intel Sapphire Rapids, UPI 2.0.
    IntelSapphireRapids,
    /// Intel Emerald Rapids, UPI 2.0.
    IntelEmeraldRapids,
    /// AMD EPYC (Rome, Milan, Genoa), Infinity Fabric.
    Amd,
    /// IBM POWER9, X-Bus; NVLink to the GPUs.
    Power9,
    /// NVIDIA Grace (Arm), NVLink-C2C to the GPU, coherent NVLink to other Graces.
    Grace,
    /// Not identified; conservative rates.
    Unknown,
}

impl CpuFamily {
    /// GB/s per direction of the link between two sockets of this family.
    pub fn inter_socket_gbps(self) -> f64 {
        match self {
            CpuFamily::IntelBroadwell => QPI_BROADWELL_GBPS,
            CpuFamily::IntelSkylake => UPI_SKYLAKE_GBPS,
            CpuFamily::IntelSapphireRapids => UPI_SAPPHIRE_RAPIDS_GBPS,
            CpuFamily::IntelEmeraldRapids => UPI_EMERALD_RAPIDS_GBPS,
            CpuFamily::Amd => AMD_INFINITY_FABRIC_GBPS,
            CpuFamily::Power9 => POWER9_XBUS_GBPS,
            CpuFamily::Grace => GRACE_CNVLINK_GBPS,
            CpuFamily::Unknown => UNKNOWN_INTER_SOCKET_GBPS,
        }
    }
    /// Host-memory bandwidth of one socket of this family, GB/s.
    pub fn host_mem_gbps(self) -> f64 {
        match self {
            CpuFamily::IntelBroadwell => HOST_MEM_BROADWELL_GBPS,
            CpuFamily::IntelSkylake => HOST_MEM_SKYLAKE_GBPS,
            CpuFamily::IntelSapphireRapids | CpuFamily::IntelEmeraldRapids => {
                HOST_MEM_SAPPHIRE_RAPIDS_GBPS
            }
            CpuFamily::Amd => HOST_MEM_AMD_GBPS,
            CpuFamily::Power9 => HOST_MEM_POWER9_GBPS,
            CpuFamily::Grace => HOST_MEM_GRACE_GBPS,
            CpuFamily::Unknown => HOST_MEM_UNKNOWN_GBPS,
        }
    }
    /// The family of an x86 CPU from its vendor string and family/model numbers (as NCCL's XML
    /// writes them: `vendor="GenuineIntel" familyid="6" modelid="85"`).
    pub fn from_x86(vendor: &str, family: u32, model: u32) -> CpuFamily {
        if vendor.contains("AMD") {
            return CpuFamily::Amd;
        }
        if vendor.contains("Intel") && family == 6 {
            // Model numbers from Intel's SDM, as NCCL's topo.h groups them.
            return match model {
                79 | 86 => CpuFamily::IntelBroadwell,
                85 | 106 | 108 => CpuFamily::IntelSkylake,
                143 => CpuFamily::IntelSapphireRapids,
                207 => CpuFamily::IntelEmeraldRapids,
                _ => CpuFamily::Unknown,
            };
        }
        CpuFamily::Unknown
    }
}

/// Network fabric of a cluster: one NIC port's rate and the hop latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fabric {
    /// InfiniBand EDR, 100 Gb/s (`ib-edr`).
    IbEdr,
    /// InfiniBand HDR, 200 Gb/s (`ib-hdr`).
    IbHdr,
    /// InfiniBand NDR, 400 Gb/s (`ib-ndr`).
    IbNdr,
    /// RoCE over 100 Gb/s Ethernet (`roce-100g`).
    Roce100g,
    /// 25 Gb/s Ethernet, TCP (`eth-25g`).
    Eth25g,
}

impl Fabric {
    /// All fabrics, with the names that `cluster:` specs accept.
    pub const ALL: [(&'static str, Fabric); 5] = [
        ("ib-edr", Fabric::IbEdr),
        ("ib-hdr", Fabric::IbHdr),
        ("ib-ndr", Fabric::IbNdr),
        ("roce-100g", Fabric::Roce100g),
        ("eth-25g", Fabric::Eth25g),
    ];
    /// GB/s per direction of one port.
    pub fn gbps(self) -> f64 {
        match self {
            Fabric::IbEdr => IB_EDR_GBPS,
            Fabric::IbHdr => IB_HDR_GBPS,
            Fabric::IbNdr => IB_NDR_GBPS,
            Fabric::Roce100g => ETH_100G_GBPS,
            Fabric::Eth25g => ETH_25G_GBPS,
        }
    }
    /// The spec name (`ib-edr`, ...).
    pub fn name(self) -> &'static str {
        Fabric::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .unwrap_or("unknown")
    }
    /// Parse a spec name.
    pub fn from_name(name: &str) -> Option<Fabric> {
        Fabric::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| *f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_scales_with_width_and_generation() {
        assert_eq!(pcie_gbps(3, 16), PCIE_GEN3_X16_GBPS);
        assert_eq!(pcie_gbps(3, 8), PCIE_GEN3_X16_GBPS / 2.0);
        assert!(pcie_gbps(4, 16) > pcie_gbps(3, 16));
        assert_eq!(pcie_gen_for_gts(8.0), 3);
        assert_eq!(pcie_gen_for_gts(16.0), 4);
        assert_eq!(pcie_gen_for_gts(32.0), 5);
    }

    #[test]
    fn nvlink_generation_follows_sm() {
        assert_eq!(NvLinkGen::for_sm(70), Some(NvLinkGen::V2));
        assert_eq!(NvLinkGen::for_sm(90), Some(NvLinkGen::V4));
        assert_eq!(NvLinkGen::for_sm(52), None);
    }

    #[test]
    fn every_cost_name_can_be_set_and_bad_values_are_refused() {
        let mut c = CostModel::default();
        for n in CostModel::names() {
            c.set(&n, 0.5, 1000.0).unwrap();
        }
        assert_eq!(c.bw_fraction(Protocol::Ll128), 0.5);
        assert_eq!(c.step_us(Protocol::Simple, StepClass::Network), 0.5);
        assert_eq!(c.copy_engine_launch_us, 0.5);
        assert!(c.set("ll_bw_fraction", 1.5, 1000.0).is_err());
        assert!(c.set("ll_bw_fraction", 0.0, 1000.0).is_err());
        assert!(c.set("simple_bw_fraction", 5e-324, 1000.0).is_err());
        assert!(
            c.set("simple_bw_fraction", MIN_CALIBRATED_FRACTION * 0.99, 1000.0)
                .is_err()
        );
        c.set("simple_bw_fraction", MIN_CALIBRATED_FRACTION, 1000.0)
            .unwrap();
        assert!(c.set("nvls_sm100_efficiency", 0.001, 1000.0).is_err());
        assert!(c.set("simple_nvlink_step_us", -1.0, 1000.0).is_err());
        assert!(c.set("kernel_launch_us", 2000.0, 1000.0).is_err());
        assert!(
            c.set("warp_speed", 1.0, 1000.0)
                .unwrap_err()
                .contains("unknown cost")
        );
    }

    #[test]
    fn protocols_trade_latency_for_bandwidth() {
        let c = CostModel::default();
        let [ll, ll128, simple] = Protocol::ALL;
        assert!(c.bw_fraction(ll) < c.bw_fraction(ll128));
        assert!(c.bw_fraction(ll128) < c.bw_fraction(simple));
        for class in [StepClass::NvLink, StepClass::Pcie, StepClass::Network] {
            assert!(c.step_us(ll, class) < c.step_us(ll128, class));
            assert!(c.step_us(ll128, class) <= c.step_us(simple, class));
        }
        assert_eq!(c.nvls_efficiency(80), None);
        assert_eq!(c.nvls_efficiency(90), Some(NVLS_SM90_PORT_FRACTION));
        assert_eq!(c.nvls_efficiency(100), Some(NVLS_SM100_PORT_FRACTION));
    }

    #[test]
    fn fabric_names_round_trip() {
        for (name, f) in Fabric::ALL {
            assert_eq!(Fabric::from_name(name), Some(f));
            assert_eq!(f.name(), name);
        }
    }
}
