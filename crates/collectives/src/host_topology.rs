//! A topology for logical devices that all live in one host's memory.

use relaycc_topo::rates::{CpuFamily, HOST_MEM_UNKNOWN_GBPS};
use relaycc_topo::{GpuInfo, LinkKind, Topology, TopologyBuilder};

use crate::error::Result;

/// The topology `host-<n>`: one CPU socket (`CPU0`) and `n` logical devices `GPU0..GPU<n-1>`,
/// each an arena of that socket's memory, joined to the socket by a link at the socket's
/// memory rate ([`HOST_MEM_UNKNOWN_GBPS`], a conservative DDR4 figure).
///
/// The devices are modelled as GPU nodes because plans name ranks by GPU index; their
/// `name` says what they are. Every copy between two of them is one hop through `CPU0`, so a
/// planner sees a star on shared memory, not a GPU ring. This is the topology `relaycc bench
/// --backend host --ranks N` runs on.
///
/// # Example
/// ```
/// let topo = relaycc_collectives::host_topology(4).unwrap();
/// assert_eq!(topo.gpu_count(), 4);
/// assert_eq!(topo.name(), "host-4");
/// ```
pub fn host_topology(n: u32) -> Result<Topology> {
    let mut b = TopologyBuilder::new(format!("host-{n}"));
    let cpu = b.add_cpu(0, CpuFamily::Unknown);
    for i in 0..n {
        let mut info = GpuInfo::new(i);
        info.name = format!("host logical device {i}");
        info.numa = Some(0);
        let g = b.add_gpu(info);
        let kind = LinkKind::C2c;
        b.connect_with(cpu, g, kind, HOST_MEM_UNKNOWN_GBPS, 0.0);
    }
    Ok(b.build()?)
}
