//! Command-line arguments shared by the subcommands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// relaycc: topology-aware collective communication for GPUs.
#[derive(Debug, Parser)]
#[command(name = "relaycc", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Topology views: presets, the graph of a machine, its link matrix.
    #[command(subcommand)]
    Topo(TopoCommand),
}

/// `relaycc topo ...`
#[derive(Debug, Subcommand)]
pub enum TopoCommand {
    /// List the embedded presets, one per line.
    List,
    /// Show a topology as a table, JSON, Graphviz DOT or the nvidia-smi matrix.
    Show(ShowArgs),
}

/// Where the topology comes from, and how it is masked and calibrated.
#[derive(Debug, Clone, Args)]
pub struct TopologyArgs {
    /// A preset (`relaycc topo list`), `cluster:<N>x<preset>:<fabric>`, a file
    /// (nvidia-smi topo -m text, NCCL topology XML or relaycc JSON), or `auto` (NVML).
    #[arg(long, short = 't', default_value = "dgx1-v100")]
    pub topology: String,
    /// GPUs to mark busy (not members, not relays), comma separated.
    #[arg(long, value_delimiter = ',')]
    pub mask_gpus: Vec<u32>,
    /// Links to mark down, as `A-B` node-name pairs, comma separated (`GPU0-GPU4`).
    #[arg(long, value_delimiter = ',')]
    pub links_down: Vec<String>,
    /// A calibration file of measured rates (JSON) to apply.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
}

/// Output formats of `topo show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    /// Human-readable tables.
    Table,
    /// relaycc JSON (importable again).
    Json,
    /// Graphviz DOT.
    Dot,
    /// The nvidia-smi topo -m matrix.
    Smi,
}

/// `relaycc topo show`
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The topology.
    #[command(flatten)]
    pub topology: TopologyArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ShowFormat::Table)]
    pub format: ShowFormat,
}
