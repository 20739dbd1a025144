//! The `host-<N>` preset: logical devices that all live in one host's memory.

use crate::error::Result;
use crate::graph::{GpuInfo, LinkKind, Topology};
use crate::rates::{CpuFamily, HOST_MEM_UNKNOWN_GBPS};
use crate::topology_builder::TopologyBuilder;

/// The most logical devices a `host-<N>` topology has; keeps a typo from allocating millions
/// of nodes.
pub const MAX_HOST_ARENAS: u32 = 1024;

/// The topology `host-<n>`: one CPU socket (`CPU0`) and `n` logical devices `GPU0..GPU<n-1>`,
/// each an arena of that socket's memory ([`GpuInfo::host_arena`]), joined to the socket by a
/// link at the socket's memory rate ([`HOST_MEM_UNKNOWN_GBPS`], a conservative DDR4 figure).
///
/// The devices are modelled as GPU nodes because plans name ranks by GPU index; their
/// product name and `host_arena` say what they are. Every copy between two of them is one hop
/// through `CPU0`, so a planner sees a star on shared memory, not a GPU ring, and picks its
/// shared-memory algorithms for ranks on them. This is the topology the host backend's
/// communicators (`relaycc bench --backend host --ranks N`) run on.
///
/// Errors: `n` outside `1..=`[`MAX_HOST_ARENAS`].
///
/// # Example
/// ```
/// let topo = relaycc_topo::host_topology(4).unwrap();
/// assert_eq!(topo.gpu_count(), 4);
/// assert_eq!(topo.name(), "host-4");
/// assert!(topo.shares_host_memory(&[0, 1, 2, 3]));
/// assert_eq!(relaycc_topo::preset("host-4").unwrap().gpu_count(), 4);
/// ```
pub fn host_topology(n: u32) -> Result<Topology> {
    let name = super::sized_name("host", n, MAX_HOST_ARENAS)?;
    let mut b = TopologyBuilder::new(name);
    let cpu = b.add_cpu(0, CpuFamily::Unknown);
    for i in 0..n {
        let mut info = GpuInfo::new(i);
        info.name = format!("host logical device {i}");
        info.numa = Some(0);
        info.host_arena = true;
        let g = b.add_gpu(info);
        b.connect_with(cpu, g, LinkKind::C2c, HOST_MEM_UNKNOWN_GBPS, 0.0);
    }
    b.build()
}
