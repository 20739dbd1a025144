//! Exporters: relaycc JSON, Graphviz DOT, and the `nvidia-smi topo -m` matrix.

mod dot;
pub(crate) mod json;
mod smi;

pub use dot::to_dot;
pub use json::{GpuView, LinkView, NicView, NvlinkView, TopologyJson, to_json};
pub use smi::to_smi;
