//! Embedded presets: real machines wired as their vendors document them, and clusters built
//! from a node preset and a fabric.
//!
//! | name | machine |
//! |---|---|
//! | `dgx1-p100` | NVIDIA DGX-1, 8x P100, hybrid cube-mesh of NVLink 1 (4 links per GPU) |
//! | `dgx1-v100` | NVIDIA DGX-1, 8x V100, hybrid cube-mesh NV1/NV2 (6 links per GPU), 4 EDR NICs |
//! | `dgx2` | NVIDIA DGX-2, 16x V100, 12 NVSwitches on two baseboards, 8 EDR NICs |
//! | `dgx-a100` | NVIDIA DGX A100, 8x A100, 6 NVSwitches, 12 links per GPU, 8 HDR NICs |
//! | `dgx-h100` | NVIDIA DGX H100, 8x H100, 4 NVSwitches, 18 links per GPU, 8 NDR NICs |
//! | `ac922` | IBM Power System AC922, 4x V100 on two POWER9 sockets, NVLink to the CPUs |
//! | `summit-node` | ORNL Summit node, 6x V100, 3 per POWER9 socket, 2-brick links |
//! | `pcie-4gpu` | one socket, 4 PCIe GPUs in pairs under two PCIe switches, no NVLink |
//! | `pcie-8gpu` | two sockets, 8 PCIe GPUs under nested PCIe switches, no NVLink |
//! | `dgx-b200` | NVIDIA DGX B200, 8x B200, 2 NVSwitches, 18 NVLink 5 links per GPU, 8 NDR NICs |
//! | `hgx-h200` | HGX H200 as in DGX H200, 8x H200, 4 NVSwitches, 18 links per GPU, 8 NDR NICs |
//! | `gb200-nvl72` | GB200 NVL72 rack, 72 B200 on 36 Grace (C2C), 18 NVSwitch chips, 72 NICs |
//! | `gh200-quad` | 4 GH200 superchips: GPUs all-to-all NV6, C2C to each Grace, 4 NDR200 NICs |
//! | `l40s-8gpu` | 8x L40S, PCIe Gen4, 2 GPUs and a NIC per PCIe switch, no NVLink |
//! | `rtx4090-8gpu` | 8x RTX 4090 on CPU root ports, no NVLink, no PCIe peer-to-peer |
//! | `rtx5090-8gpu` | 8x RTX 5090 on CPU root ports (Gen5), no NVLink, no PCIe peer-to-peer |
//! | `host-<N>` | one socket and N logical devices, each an arena of its memory ([`host_topology`]) |
//! | `shared-gpu-<N>` | N ranks on one GPU, each an arena of its device memory ([`shared_gpu_topology`]) |
//! | `nvswitch-<N>` | N GPUs on one NVSwitch and one socket: the flat machine of CUDA communicators given none ([`nvswitch_topology`]) |
//!
//! Clusters: `cluster:<N>x<node preset>:<fabric>[:<layout>]`, e.g. `cluster:4xdgx1-v100:ib-edr`
//! or `cluster:128xdgx-h100:ib-ndr:rail`. Fabrics (the link type, the NIC port rate):
//! `ib-edr` (12.5 GB/s), `ib-hdr` (25), `ib-ndr` (50), `roce-100g` (12.5), `eth-25g` (3.125),
//! each with [`crate::rates::NETWORK_HOP_LATENCY_US`] per hop. Layouts ([`fabric`]): `switch`
//! (every NIC on one non-blocking switch, the default), `rail[=D:U]` (rail-optimized leaves
//! under a spine layer), `fat-tree[=D:U]` (two-level fat-tree with the leaves' down:up
//! oversubscription). A node preset that is itself a rack (`gb200-nvl72`) makes a cluster of
//! NVLink domains joined by the network. GPU indices run on across nodes (node 1 of a DGX-1
//! cluster holds GPUs 8..15); other node names get a `node<h>/` prefix.

mod dgx;
pub use dgx::DGX1_V100_NVLINKS;
pub mod fabric;
mod host;
pub use host::{MAX_HOST_ARENAS, host_topology};
mod grace;
mod nvswitch;
mod shared_gpu;
pub use nvswitch::{MAX_NVSWITCH_GPUS, nvswitch_topology};
pub use shared_gpu::{MAX_SHARED_GPU_RANKS, flat_topology_for_devices, shared_gpu_topology};
mod pcie;
mod power;

use crate::error::{Result, TopoError};
use crate::graph::{ComputeCapability, GpuInfo, NodeId, Topology};
use crate::rates::Fabric;
use crate::topology_builder::TopologyBuilder;

/// Adds one machine's nodes and links to a builder; GPU indices start at the second argument.
/// Returns the machine's NICs so that clusters can wire them to a fabric.
type NodeBuilder = fn(&mut TopologyBuilder, u32) -> Vec<NodeId>;

/// A named preset.
struct Preset {
    name: &'static str,
    description: &'static str,
    build: NodeBuilder,
}

const PRESETS: &[Preset] = &[
    Preset {
        name: "dgx1-p100",
        description: "NVIDIA DGX-1: 8x P100, hybrid cube-mesh NVLink 1, 2 Broadwell sockets, 4 EDR NICs",
        build: dgx::dgx1_p100,
    },
    Preset {
        name: "dgx1-v100",
        description: "NVIDIA DGX-1: 8x V100, hybrid cube-mesh NV1/NV2, 2 Broadwell sockets, 4 EDR NICs",
        build: dgx::dgx1_v100,
    },
    Preset {
        name: "dgx2",
        description: "NVIDIA DGX-2: 16x V100, 12 NVSwitches on two baseboards, 8 EDR NICs",
        build: dgx::dgx2,
    },
    Preset {
        name: "dgx-a100",
        description: "NVIDIA DGX A100: 8x A100, 6 NVSwitches (12 links per GPU), 8 HDR NICs",
        build: dgx::dgx_a100,
    },
    Preset {
        name: "dgx-h100",
        description: "NVIDIA DGX H100: 8x H100, 4 NVSwitches (18 links per GPU), 8 NDR NICs",
        build: dgx::dgx_h100,
    },
    Preset {
        name: "ac922",
        description: "IBM AC922: 4x V100 on 2 POWER9 sockets, NV3 GPU-GPU and GPU-CPU, X-Bus",
        build: power::ac922,
    },
    Preset {
        name: "summit-node",
        description: "ORNL Summit node: 6x V100, 3 per POWER9 socket, 2-brick NVLink, X-Bus",
        build: power::summit_node,
    },
    Preset {
        name: "pcie-4gpu",
        description: "PCIe box: 1 socket, 4 V100-PCIe in pairs under 2 PCIe Gen3 switches, no NVLink",
        build: pcie::pcie_4gpu,
    },
    Preset {
        name: "pcie-8gpu",
        description: "PCIe box: 2 sockets, 8 V100-PCIe under nested PCIe Gen3 switches, no NVLink",
        build: pcie::pcie_8gpu,
    },
    Preset {
        name: "dgx-b200",
        description: "NVIDIA DGX B200: 8x B200, 2 NVSwitches (18 NVLink 5 links per GPU), 8 NDR NICs",
        build: dgx::dgx_b200,
    },
    Preset {
        name: "hgx-h200",
        description: "NVIDIA HGX H200 (DGX H200): 8x H200, 4 NVSwitches (18 links per GPU), 8 NDR NICs",
        build: dgx::hgx_h200,
    },
    Preset {
        name: "gb200-nvl72",
        description: "NVIDIA GB200 NVL72: 72 B200 and 36 Grace (C2C), 18 NVSwitch chips, 72 NDR NICs",
        build: grace::gb200_nvl72,
    },
    Preset {
        name: "gh200-quad",
        description: "4x GH200: GPUs all-to-all NVLink 4 (NV6), C2C to each Grace, 4 NDR200 NICs",
        build: grace::gh200_quad,
    },
    Preset {
        name: "l40s-8gpu",
        description: "PCIe box: 2 sockets, 8x L40S, 2 GPUs and a NIC per PCIe switch, no NVLink",
        build: pcie::l40s_8gpu,
    },
    Preset {
        name: "rtx4090-8gpu",
        description: "GeForce box: 2 sockets, 8x RTX 4090 on root ports, no peer-to-peer (host-staged)",
        build: pcie::rtx4090_8gpu,
    },
    Preset {
        name: "rtx5090-8gpu",
        description: "GeForce box: 2 sockets, 8x RTX 5090 on Gen5 root ports, no peer-to-peer (host-staged)",
        build: pcie::rtx5090_8gpu,
    },
];

/// Names and one-line descriptions of every preset, plus the cluster form.
pub fn list() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = PRESETS
        .iter()
        .map(|p| (p.name.to_string(), p.description.to_string()))
        .collect();
    v.push((
        "host-<N>".to_string(),
        format!(
            "N logical devices (1..={MAX_HOST_ARENAS}) in one socket's memory: the host backend's ranks"
        ),
    ));
    let fabrics: Vec<&str> = Fabric::ALL.iter().map(|(n, _)| *n).collect();
    v.push((
        "nvswitch-<N>".to_string(),
        format!(
            "N GPUs (1..={MAX_NVSWITCH_GPUS}) on one NVSwitch (NV18) and one socket: CUDA ranks given no topology"
        ),
    ));
    v.push((
        "shared-gpu-<N>".to_string(),
        format!(
            "N ranks (1..={MAX_SHARED_GPU_RANKS}) on one GPU, each an arena of its device memory"
        ),
    ));
    v.push((
        "cluster:<N>x<preset>:<fabric>[:<layout>]".to_string(),
        format!(
            "N machines of a preset on a network; fabrics: {}; layouts: {} \
             (D:U = leaf down:up bandwidth, e.g. cluster:16xdgx-h100:ib-ndr:fat-tree=2:1)",
            fabrics.join(", "),
            fabric::LAYOUTS
        ),
    ));
    v
}

fn known_names() -> String {
    let mut names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
    names.push("host-<N>");
    names.push("nvswitch-<N>");
    names.push("shared-gpu-<N>");
    names.push("cluster:<N>x<preset>:<fabric>[:<layout>]");
    names.join(", ")
}

/// True when `name` is a preset or a well-formed cluster spec.
pub fn is_preset(name: &str) -> bool {
    preset(name).is_ok()
}

/// Build the preset (or cluster) called `name`.
pub fn preset(name: &str) -> Result<Topology> {
    if let Some(spec) = name.strip_prefix("cluster:") {
        return cluster(name, spec);
    }
    if let Some(n) = name.strip_prefix("host-") {
        return sized(name, n, "host", MAX_HOST_ARENAS, host_topology);
    }
    if let Some(n) = name.strip_prefix("shared-gpu-") {
        return sized(
            name,
            n,
            "shared-gpu",
            MAX_SHARED_GPU_RANKS,
            shared_gpu_topology,
        );
    }
    if let Some(n) = name.strip_prefix("nvswitch-") {
        return sized(name, n, "nvswitch", MAX_NVSWITCH_GPUS, nvswitch_topology);
    }
    let p = find(name)?;
    let mut b = TopologyBuilder::new(name);
    (p.build)(&mut b, 0);
    b.build()
}

/// The name `<family>-<n>` of a sized preset, or the error for an `n` outside `1..=max`.
fn sized_name(family: &str, n: u32, max: u32) -> Result<String> {
    let name = format!("{family}-{n}");
    if (1..=max).contains(&n) {
        Ok(name)
    } else {
        Err(TopoError::UnknownPreset {
            name,
            known: format!("{family}-<N> takes N in 1..={max}"),
        })
    }
}

/// The sized preset `full` (`<family>-<count>`, e.g. `host-4`), built by `build` from the
/// number after the dash.
fn sized(
    full: &str,
    count: &str,
    family: &str,
    max: u32,
    build: fn(u32) -> Result<Topology>,
) -> Result<Topology> {
    match count.parse::<u32>() {
        // A leading `+` or zero would name the same topology twice.
        Ok(n) if n.to_string() == count => build(n),
        _ => Err(TopoError::UnknownPreset {
            name: full.to_string(),
            known: format!("{family}-<N> takes a number N in 1..={max}, e.g. {family}-4"),
        }),
    }
}

fn find(name: &str) -> Result<&'static Preset> {
    PRESETS
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| TopoError::UnknownPreset {
            name: name.to_string(),
            known: known_names(),
        })
}

/// Maximum machines in a cluster spec; keeps a typo from allocating millions of nodes.
const MAX_CLUSTER_NODES: u32 = 1024;

fn cluster(full: &str, spec: &str) -> Result<Topology> {
    let bad = |why: &str| TopoError::UnknownPreset {
        name: full.to_string(),
        known: format!(
            "{why}; expected cluster:<N>x<preset>:<fabric>[:<layout>], e.g. \
             cluster:4xdgx1-v100:ib-edr or cluster:16xdgx-h100:ib-ndr:rail (layouts: {})",
            fabric::LAYOUTS
        ),
    };
    let (count_and_node, net) = spec.split_once(':').ok_or_else(|| bad("no fabric"))?;
    let net = fabric::parse(net).map_err(|why| bad(&why))?;
    let (count, node) = count_and_node
        .split_once('x')
        .ok_or_else(|| bad("no node count"))?;
    let count: u32 = count
        .parse()
        .map_err(|_| bad(&format!("node count {count:?} is not a number")))?;
    if count == 0 || count > MAX_CLUSTER_NODES {
        return Err(bad(&format!("node count must be 1..={MAX_CLUSTER_NODES}")));
    }
    let p = find(node)?;
    let mut b = TopologyBuilder::new(full);
    let mut base = 0;
    let mut nics = Vec::with_capacity(count as usize);
    for h in 0..count {
        b.begin_host(h);
        let first = b.graph().node_count();
        let node_nics = (p.build)(&mut b, base);
        // Only this node's nodes are scanned, so building N nodes stays linear in N.
        base = b
            .graph()
            .node_weights()
            .skip(first)
            .filter_map(|n| n.gpu().map(|g| g.index + 1))
            .fold(base, u32::max);
        for nic in &node_nics {
            if let Some(n) = b.node_mut(*nic)
                && let crate::graph::NodeKind::Nic(info) = &mut n.kind
            {
                info.gbps = net.link.gbps();
            }
        }
        nics.push(node_nics);
    }
    fabric::wire(&mut b, &nics, net);
    b.build()
}

/// A GPU record for presets.
fn gpu_info(index: u32, name: &str, sm: u32, bus: &str, numa: u32, memory_gib: u64) -> GpuInfo {
    GpuInfo {
        index,
        name: name.to_string(),
        compute_capability: Some(ComputeCapability::from_sm(sm)),
        pci_bus_id: Some(bus.to_string()),
        numa: Some(numa),
        memory_bytes: Some(memory_gib << 30),
        host_arena: false,
        device_arena: None,
        pcie_p2p: true,
        measured_mem_gbps: None,
        measured_reduce_gbps: None,
        measured_sm_copy_gbps: None,
        measured_write_share: None,
    }
}

#[cfg(test)]
mod tests;
