//! Command-line arguments shared by the subcommands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The most ranks `bench` runs, and one past the highest device index it takes: more than any
/// one node has GPUs, and enough for host runs of many logical devices; the limit keeps a typo
/// such as `--ranks 4294967295` from building billions of devices before anything runs.
pub const MAX_RANKS: u32 = 1024;

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
    /// Plan a point-to-point copy: the routes, their shares, the prediction, baseline and bound.
    Route(RouteArgs),
    /// Plan one collective and show (or save) the plan.
    Plan(PlanArgs),
    /// Simulate a collective over a range of sizes, nccl-tests style, beside baseline and bound.
    Simulate(SimulateArgs),
    /// Advise which free GPUs to give a k-GPU job.
    Advise(AdviseArgs),
    /// Measure GPU pairs' peer bandwidth and latency and each GPU's host link; write a
    /// calibration file for `--calibration`.
    Calibrate(CalibrateArgs),
    /// Compare the model with published measurements (the fidelity table of docs/FIDELITY.md).
    Validate(ValidateArgs),
}

/// `relaycc validate`
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Apply this calibration file to every row's preset first (what a real machine measured).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ValidateFormat::Text)]
    pub format: ValidateFormat,
    /// Evaluate only these rows (ids as the table prints them, comma separated).
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
}

/// Output formats of `validate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ValidateFormat {
    /// Aligned text.
    Text,
    /// JSON.
    Json,
    /// Markdown, as docs/FIDELITY.md holds it.
    Markdown,
}

/// `relaycc calibrate`
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// CUDA devices to measure, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub gpus: Vec<u32>,
    /// Write the calibration JSON here (default: stdout).
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// The topology whose node names the file uses (preset, file, `auto`).
    #[arg(long, default_value = "auto")]
    pub topology: String,
    /// Bytes per bandwidth copy.
    #[arg(long, value_parser = parse_size, default_value = "256MiB")]
    pub bytes: u64,
    /// Timed copies per figure.
    #[arg(long, default_value_t = 5)]
    pub reps: u32,
}

/// Which GPUs may relay: `none`, `members`, `any` or a GPU list.
fn parse_relay(s: &str) -> Result<relaycc_route::path::RelayPolicy, String> {
    relaycc_route::path::RelayPolicy::parse(s)
}

/// A staging budget per device: a size (`64MiB`) or `unbounded`.
fn parse_staging_budget(s: &str) -> Result<u64, String> {
    if s.eq_ignore_ascii_case("unbounded") {
        return Ok(relaycc_route::staging::UNBOUNDED_STAGING);
    }
    crate::size::parse_size(s)
}

fn parse_size(s: &str) -> Result<u64, String> {
    crate::size::parse_size(s)
}

/// A flag transport's rings as people write them: `SLOTSxSIZE` (`4x1MiB`, `2x256K`).
fn parse_flag_shape(
    s: &str,
) -> Result<relaycc_collectives::exec::flag_transport::FlagShape, String> {
    let (slots, size) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("`{s}`: give SLOTSxSIZE, as 4x1MiB"))?;
    let slots: u32 = slots
        .trim()
        .parse()
        .map_err(|e| format!("`{s}`: slots: {e}"))?;
    let bytes = usize::try_from(crate::size::parse_size(size.trim())?)
        .map_err(|_| format!("`{s}`: a slot larger than this machine addresses"))?;
    relaycc_collectives::exec::flag_transport::FlagShape::new(slots, bytes)
        .map_err(|e| format!("`{s}`: {e}"))
}

/// A planning budget as people write it: `5` or `5s` (seconds), `500ms`, `2m`, `1.5s`.
pub fn parse_budget(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(v) = t.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1.0)
    } else if let Some(v) = t.strip_suffix('m') {
        (v, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("budget {s:?} is not a duration (5s, 500ms, 2m)"))?;
    let secs = v * scale;
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(format!("budget {s:?} must be between 0 and 24 hours"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// When the command started ([`mark_start`]): the planning budget counts from there, so the
/// time spent reading or building a topology (seconds for tens of thousands of GPUs) is taken
/// from it and the command answers within its budget.
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Start the command's clock (first thing in `main`).
pub fn mark_start() {
    let _ = command_start();
}

/// When the command started (now, where [`mark_start`] was not called).
pub fn command_start() -> std::time::Instant {
    *STARTED.get_or_init(std::time::Instant::now)
}

/// The planning budget flag the planning commands share.
#[derive(Debug, Clone, Args)]
pub struct BudgetArgs {
    /// Planning time allowed per request (`5s`, `500ms`): once spent, the best plan found so
    /// far is returned and marked as such. The time the command took to read or build the
    /// topology before planning is taken from it.
    #[arg(long, value_parser = parse_budget, default_value = "5s")]
    pub budget: std::time::Duration,
}

/// The element type and reduce operator, spelled alike in every subcommand that takes them.
#[derive(Debug, Clone, Args)]
pub struct ElementArgs {
    /// Element type: f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64 (nccl-tests' names such
    /// as float, half, int32 work too).
    #[arg(long, short = 'd', default_value = "f32")]
    pub dtype: relaycc_route::DType,
    /// Reduce operator: sum, prod, min, max, avg.
    #[arg(long, short = 'o', default_value = "sum")]
    pub op: relaycc_route::ReduceOp,
}

/// Output formats of `route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RouteFormat {
    /// Human-readable table.
    Table,
    /// JSON.
    Json,
    /// Graphviz DOT of the topology with the route drawn on it.
    Dot,
}

/// Output formats of `plan`, `simulate`, `advise`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TableFormat {
    /// Human-readable table.
    Table,
    /// JSON.
    Json,
}

/// `relaycc route`
#[derive(Debug, Args)]
pub struct RouteArgs {
    /// The topology.
    #[command(flatten)]
    pub topology: TopologyArgs,
    /// Source GPU.
    #[arg(long)]
    pub from: u32,
    /// Destination GPU.
    #[arg(long)]
    pub to: u32,
    /// Bytes to copy (`256MiB`, `4K`, `1000`).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Which GPUs may relay: none, members, any, or a list such as 3,4.
    #[arg(long, value_parser = parse_relay, default_value = "any")]
    pub relay: relaycc_route::path::RelayPolicy,
    /// Route kinds to consider.
    #[arg(long, default_value = "auto")]
    pub strategy: relaycc_route::p2p::P2pStrategy,
    /// Planning budget.
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Staging memory a plan may allocate on each device (GPU or host socket): a size such
    /// as `64MiB`, or `unbounded` (default: 256 MiB, NCCL's 4 MiB buffers for its 32 channels
    /// with two connections each).
    #[arg(long, value_parser = parse_staging_budget, default_value = "256MiB")]
    pub staging_budget: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = RouteFormat::Table)]
    pub format: RouteFormat,
}

/// A collective request from the command line.
#[derive(Debug, Clone, Args)]
pub struct CollectiveArgs {
    /// The collective: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all,
    /// gather, scatter, all_gather_v, reduce_scatter_v, all_to_all_v.
    pub collective: relaycc_route::Collective,
    /// The topology.
    #[command(flatten)]
    pub topology: TopologyArgs,
    /// The job's GPUs in rank order, comma separated (default: every GPU).
    #[arg(long, value_delimiter = ',')]
    pub gpus: Vec<u32>,
    /// Element type and reduce operator.
    #[command(flatten)]
    pub element: ElementArgs,
    /// Root rank of rooted collectives.
    #[arg(long, short = 'r', default_value_t = 0)]
    pub root: u32,
    /// Which GPUs may relay: none, members, any, or a list such as 3,4.
    #[arg(long, value_parser = parse_relay, default_value = "any")]
    pub relay: relaycc_route::path::RelayPolicy,
    /// Planning budget.
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Staging memory a plan may allocate on each device (GPU or host socket): a size such
    /// as `64MiB`, or `unbounded` (default: 256 MiB, NCCL's 4 MiB buffers for its 32 channels
    /// with two connections each).
    #[arg(long, value_parser = parse_staging_budget, default_value = "256MiB")]
    pub staging_budget: u64,
    /// Host time to enqueue each op, microseconds, paid one op after another (the
    /// simulator's `issue_us`): 0 (the default) times plans as the hardware runs them;
    /// relaycc's CUDA executor pays about 5 per op, so `--issue-us 5` ranks candidates as a
    /// CUDA communicator does.
    #[arg(long, value_parser = parse_issue_us, default_value_t = 0.0)]
    pub issue_us: f64,
}

/// A non-negative, finite number of microseconds.
fn parse_issue_us(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a time in microseconds (a number >= 0)"
        )),
    }
}

/// `relaycc plan`
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The request.
    #[command(flatten)]
    pub request: CollectiveArgs,
    /// Operation size in bytes, as nccl-tests counts it (`256MiB`).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = TableFormat::Table)]
    pub format: TableFormat,
    /// Write the simulated timeline as Chrome trace JSON (open in Perfetto); for a plan of
    /// rounds, one round's.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the plan as JSON.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Check a plan above 64 ranks (a template, or a plan built in full): the data cones of
    /// sampled output elements (3 ranks, 8 elements each) evaluated over its lazily expanded
    /// plan, then the op cone of those ranks' outputs lowered per rank and run on the host by
    /// the executor, their outputs compared with the reference (left out, and said so, above 4
    /// GiB of buffers); a plan of up to 64 ranks is proved by the checker already.
    #[arg(long)]
    pub verify: bool,
}

/// `relaycc simulate`
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The request.
    #[command(flatten)]
    pub request: CollectiveArgs,
    /// Smallest size.
    #[arg(short = 'b', long = "minbytes", value_parser = parse_size, default_value = "32M")]
    pub min_bytes: u64,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", value_parser = parse_size, default_value = "32M")]
    pub max_bytes: u64,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub step_factor: u64,
    /// Write a bandwidth-vs-size plot (SVG).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = TableFormat::Table)]
    pub format: TableFormat,
}

/// `relaycc advise`
#[derive(Debug, Args)]
pub struct AdviseArgs {
    /// The topology.
    #[command(flatten)]
    pub topology: TopologyArgs,
    /// GPUs already busy, comma separated (added to `--mask-gpus`).
    #[arg(long, value_delimiter = ',')]
    pub busy: Vec<u32>,
    /// How many GPUs the job needs.
    #[arg(long)]
    pub count: u32,
    /// The collective the job leans on.
    #[arg(long, default_value = "all_reduce")]
    pub collective: relaycc_route::Collective,
    /// Element type and reduce operator.
    #[command(flatten)]
    pub element: ElementArgs,
    /// Its typical size.
    #[arg(long, value_parser = parse_size, default_value = "256MiB")]
    pub size: u64,
    /// Which GPUs may relay.
    #[arg(long, value_parser = parse_relay, default_value = "any")]
    pub relay: relaycc_route::path::RelayPolicy,
    /// Planning budget of the whole search (each placement gets what is left).
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = TableFormat::Table)]
    pub format: TableFormat,
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
    /// A preset (`relaycc topo list`), `cluster:<N>x<preset>:<fabric>[:<layout>]`, a file
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
    /// CUDA GPUs through cudarc (`--gpus` lists CUDA devices; `--ranks N` spreads N ranks
    /// over the visible GPUs round-robin).
    Cuda,
    /// One rank per process under `mpirun -np N`, on host memory (a binary built with feature
    /// `mpi`); rank 0 prints.
    Mpi,
}

/// How `bench --backend mpi` on GPUs carries messages between processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportKind {
    /// MPI: device pointers with a CUDA-aware MPI (`RELAYCC_MPI_CUDA_AWARE=1`), else staged
    /// through pinned host memory.
    Mpi,
    /// NCCL's send/recv on each rank's stream (libnccl.so, one rank per GPU).
    Nccl,
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
    pub collective: relaycc_route::Collective,
    /// The backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Host)]
    pub backend: BackendKind,
    /// Number of ranks (devices 0..N), 1 to 1024.
    #[arg(long, conflicts_with = "gpus", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_RANKS)))]
    pub ranks: Option<u32>,
    /// Devices, comma separated, in rank order (each below 1024).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(0..i64::from(MAX_RANKS)))]
    pub gpus: Vec<u32>,
    /// Smallest size (bytes; 1K, 64M, 1GiB ...).
    #[arg(short = 'b', long = "minbytes", value_parser = parse_size, default_value = "32M")]
    pub min_bytes: u64,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", value_parser = parse_size, default_value = "32M")]
    pub max_bytes: u64,
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
    /// Also time NCCL on the same GPUs and sizes, in the same run, and print its figures and
    /// relaycc's busbw ratio to it (CUDA backend, one rank per GPU, libnccl.so present; says
    /// why when unavailable).
    #[arg(long)]
    pub vs_nccl: bool,
    /// `--backend mpi`: also time the MPI library's own collective on the same buffers, in
    /// the same run, and print its time and the ratio per size.
    #[arg(long)]
    pub vs_mpi: bool,
    /// `--backend mpi`: allocate the host buffers (relaycc's and MPI's, the same ones) as
    /// `SharedHostBuffer`s, memory the other local ranks map, so that relaycc's receivers
    /// copy large messages in user space instead of with `process_vm_readv` (as nccl-tests'
    /// `-R 1` registers buffers with NCCL). MPI runs on the same buffers.
    #[arg(long)]
    pub shared_buffers: bool,
    /// CUDA backend: plan on this topology (a preset, a file, or `auto` for NVML) instead of
    /// `shared-gpu-N` (every rank on one device) or `nvswitch-N` (N GPUs on one switch). `--gpus` then names the topology's GPUs, the other free GPUs may
    /// relay. On this machine's topology (`auto`, or a file of it) topology GPU `g` runs on the
    /// CUDA device at its PCI address, whatever order CUDA numbers devices in; on another
    /// machine's (a preset) on CUDA device `g mod visible` (a `shared-gpu-N` rank on its GPU's),
    /// so a one-GPU machine runs any topology's plans.
    #[arg(long)]
    pub topology: Option<String>,
    /// `--backend mpi` on GPUs: the transport of messages between processes. GPU buffers are
    /// used when this or `--gpus` is given: each process takes the CUDA device `--gpus` names
    /// for its local rank (round robin over the list), else its local rank modulo the visible
    /// GPUs; several processes may share one GPU (MPI transport).
    #[arg(long, value_enum)]
    pub transport: Option<TransportKind>,
    /// `--backend host`: run the ranks' calls over the flag transport, each rank its own part
    /// of the plan, its messages through a ring of SLOTS slots of SIZE bytes per pair of ranks
    /// (`SLOTSxSIZE`, as `4x1MiB`, NCCL's 4 MiB per connection, when given bare).
    #[arg(long, value_parser = parse_flag_shape, num_args = 0..=1, default_missing_value = "4x1MiB")]
    pub flags: Option<relaycc_collectives::exec::flag_transport::FlagShape>,
    /// Element type and reduce operator.
    #[command(flatten)]
    pub element: ElementArgs,
    /// Root rank of rooted collectives.
    #[arg(long, short = 'r', default_value_t = 0)]
    pub root: u32,
    /// Output format.
    #[arg(long, value_enum, default_value_t = BenchFormat::Table)]
    pub format: BenchFormat,
}

/// An argument the parser accepts but the command cannot honour (`-b` above `-e`, a size that
/// is not a whole number of elements, a GPU that is both a member and masked): reported like
/// clap's own usage errors, with exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// An error this process has printed already (`relaycc: ...` on stderr), so `main` only
/// exits with status 1: MPI ranks that fail together print theirs and meet at a barrier,
/// so that every rank's line is out before the first rank's exit makes `mpirun` stop the
/// others.
#[derive(Debug)]
pub struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reported above")
    }
}

impl std::error::Error for Reported {}

/// Print `relaycc: LINE` on stderr in one write. `eprintln!` writes its pieces separately
/// (stderr is unbuffered), and `mpirun` forwards the ranks' stderr into one stream, so lines
/// from ranks failing together would interleave mid-line; a write of under `PIPE_BUF` bytes
/// reaches the pipe whole.
pub fn print_error(line: &str) {
    use std::io::Write;
    let whole = format!("relaycc: {line}\n");
    let _ = std::io::stderr().lock().write_all(whole.as_bytes());
}

/// The one line `relaycc: ...` prints for `e`: its causes joined by `: `, a cause already at
/// the end of the line (an error that prints its source) not repeated.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain().map(|c| c.to_string()) {
        if !line.ends_with(&cause) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&cause);
        }
    }
    line.replace('\n', " ")
}

/// A usage error saying `message`, as an [`anyhow::Error`] that `main` maps to exit status 2.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError(message.into()).into()
}

/// The planning options the arguments ask for: the one place the CLI builds a
/// [`relaycc_route::PlanOptions`]; what a command does not take keeps the library's default.
/// The budget is what is left of it since the command started ([`mark_start`]).
fn plan_options(
    relay: &relaycc_route::path::RelayPolicy,
    budget: std::time::Duration,
    staging_budget: u64,
    issue_us: f64,
) -> relaycc_route::PlanOptions {
    let spent = command_start().elapsed();
    relaycc_route::PlanOptions {
        relay: relay.clone(),
        budget: budget.saturating_sub(spent),
        staging_budget,
        sim: relaycc_route::SimConfig {
            issue_us,
            ..relaycc_route::SimConfig::default()
        },
        ..relaycc_route::PlanOptions::default()
    }
}

impl CollectiveArgs {
    /// The options `plan`, `simulate` and `advise` plan this request with.
    pub fn plan_options(&self) -> relaycc_route::PlanOptions {
        plan_options(
            &self.relay,
            self.budget.budget,
            self.staging_budget,
            self.issue_us,
        )
    }
}

impl RouteArgs {
    /// The options `route` plans with: the route kinds asked for, issue time 0.
    pub fn plan_options(&self) -> relaycc_route::PlanOptions {
        relaycc_route::PlanOptions {
            strategy: self.strategy,
            ..plan_options(&self.relay, self.budget.budget, self.staging_budget, 0.0)
        }
    }
}
