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
    /// Time a collective on a backend, in nccl-tests' columns.
    Bench(BenchArgs),
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

/// Backends `relaycc bench` can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Logical devices in this host's memory, lanes on threads.
    Host,
    /// CUDA GPUs (not built yet).
    Cuda,
}

/// Output formats of `bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchFormat {
    /// nccl-tests' table.
    Table,
    /// JSON: `memcpy_gbps` and `results`.
    Json,
}

/// `relaycc bench`
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The collective (`all_reduce`, `all_gather`, `broadcast`, ...).
    pub collective: String,
    /// The backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Host)]
    pub backend: BackendKind,
    /// Number of ranks (devices 0..N).
    #[arg(long, conflicts_with = "gpus")]
    pub ranks: Option<u32>,
    /// Devices, comma separated, in rank order.
    #[arg(long, value_delimiter = ',')]
    pub gpus: Vec<u32>,
    /// Smallest size (bytes; 1K, 64M, 1GiB ...).
    #[arg(short = 'b', long = "minbytes", default_value = "32M")]
    pub min_bytes: String,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    pub max_bytes: String,
    /// Multiply the size by this between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub iters: u32,
    /// Untimed warmup iterations per size.
    #[arg(short = 'w', long, default_value_t = 5)]
    pub warmup: u32,
    /// Check every output element against the expected result (`#wrong`).
    #[arg(long)]
    pub check: bool,
    /// Element type (`float`, `half`, `int32`, ... or `f32`, `f16`, `i32`, ...).
    #[arg(long = "dtype", short = 'd', default_value = "float")]
    pub dtype: String,
    /// Reduce op.
    #[arg(long = "op", short = 'o', default_value = "sum")]
    pub op: String,
    /// Root rank of rooted collectives.
    #[arg(long, short = 'r', default_value_t = 0)]
    pub root: u32,
    /// Output format.
    #[arg(long, value_enum, default_value_t = BenchFormat::Table)]
    pub format: BenchFormat,
}
