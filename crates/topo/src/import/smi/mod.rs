//! Import the matrix that `nvidia-smi topo -m` prints.
//!
//! The matrix gives, for every pair of devices (GPUs and NICs), one class: `X` (itself), `NV#`
//! (a bond of # NVLinks, direct or through NVSwitch), `PIX`, `PXB`, `PHB`, `NODE`, `SYS` (older
//! drivers: `SOC`). [`parse`] rebuilds a graph that gives back the same classes: exporting it
//! with [`crate::export::to_smi`] and parsing again yields the same cells (SOC as SYS), the same
//! GPUs and the same NICs.
//!
//! # What is read
//! - Rows `GPU<i>` and NIC rows (`mlx5_0`, or `NIC<j>` with a trailing `NIC Legend:` block
//!   whose names, such as `mlx5_0`, become the NIC node names).
//! - The columns `CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID`, cells empty or `N/A`, rows with
//!   more or fewer trailing cells than the header names (they map by position).
//! - Tab-separated or space-aligned columns, header labels glued together when columns are
//!   narrow (`GPU0GPU1`, `mlx5_0mlx5_1CPU Affinity`), blocks indented as a whole, CRLF line
//!   ends, a UTF-8 BOM, blank lines, and the `Legend:` text after the matrix (ignored).
//! - Terminal escape sequences copied with the text (nvidia-smi underlines the header with
//!   `ESC[4m` ... `ESC[0m`), and their remnants when the escape byte is lost (`[4m` ... `[0m`):
//!   removed before the matrix is read.
//!
//! # What is built, and what is guessed
//! - CPU sockets: devices joined by a cell other than SYS and NV# share a socket; groups only
//!   NV# cells join are merged by NUMA Affinity, then whenever no SYS cell forbids it. A socket's
//!   NUMA id is its devices' NUMA Affinity (where the affinity disagrees with the matrix, the
//!   matrix wins); sockets without one are numbered in order. CPU family: unknown. Every GPU
//!   and NIC records its socket's NUMA id; each CPU keeps the CPU Affinity string.
//! - A PCIe tree per socket: NODE classes each behind a host bridge, PHB classes hanging from
//!   it, PIX classes sharing a switch, several PIX classes under an upper switch (PXB). The
//!   PCIe relation of an NV# pair is hidden, so it is taken as the closest the other cells
//!   allow. Links are x16 of generation 5 with NVLink 4, 4 with NVLink 3, else 3: the matrix
//!   shows no link speeds.
//! - NVLink: a direct bond per NV# cell; or one NVSwitch for a group of GPUs all NV# to each
//!   other whose cells add up to more links than a GPU has (18). The generation is a guess from
//!   the most links one GPU uses: more than 12 is NVLink 4, more than 6 NVLink 3, else NVLink 2.
//! - The topology's name is empty ([`crate::import::from_path`] names it after the file).
//!
//! # What is refused
//! Every refusal is [`TopoError::Parse`](crate::TopoError::Parse) naming the line: empty input, a header without a GPU
//! column (binary junk lands here), duplicate or out-of-range column labels, rows missing,
//! truncated, out of order, duplicated or naming no column, unknown cells, cells beyond the
//! header's columns, X off the diagonal or missing on it, an asymmetric matrix, NV# to a NIC,
//! affinity cells that are not CPU lists or NUMA ids, a malformed NIC Legend, and PCIe cells that
//! no tree can produce (for instance A PIX to B and C but B PXB to C).

mod escapes;
mod matrix;
mod tree;

#[cfg(test)]
mod tests;

use crate::error::Result;
use crate::graph::Topology;

/// Parse `nvidia-smi topo -m` output; `source_name` labels errors.
///
/// # Example
/// ```
/// let text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV2\t0-7\nGPU1\tNV2\t X \t0-7\n";
/// let topo = relaycc_topo::import::smi::parse(text, "example").unwrap();
/// let (g0, g1) = (topo.gpu(0).unwrap(), topo.gpu(1).unwrap());
/// assert_eq!(topo.nvlink_lanes(g0, g1), 2);
/// ```
pub fn parse(text: &str, source_name: &str) -> Result<Topology> {
    let text = escapes::strip(text);
    let m = matrix::read(&text, source_name)?;
    tree::build(&m, source_name)
}
