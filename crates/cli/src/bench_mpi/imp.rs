//! The MPI benchmark itself (feature `mpi`): arguments agreed, buffers, relaycc's and the
//! MPI library's calls, timing, the report.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use relaycc_collectives::Element;
use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{MpiCommunicator, SharedHostBuffer};
use relaycc_route::{Collective, DType, ReduceOp, Request};
use rsmpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use rsmpi::datatype::{Equivalence, Partition, PartitionMut};
use rsmpi::topology::{Communicator, SimpleCommunicator};
use serde::Serialize;

use crate::args::{BenchArgs, usage};
use crate::bench_cmd::{Column, table_head, table_row, write_report};
use crate::bench_reference::value;

use super::gpu;

/// One row of results.
#[derive(Debug, Serialize)]
struct Row {
    size: u64,
    count: u64,
    time_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    /// Elements (over all ranks) where relaycc's output differs from the MPI
    /// collective's; `None` (N/A) without `--check`.
    wrong: Option<u64>,
    /// The MPI collective's time on the same buffers (`--vs-mpi`), microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    mpi_time_us: Option<f64>,
    /// The MPI collective's busbw, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    mpi_busbw_gbps: Option<f64>,
    /// MPI's time over relaycc's (above 1: relaycc is faster).
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_mpi: Option<f64>,
    /// The algorithm of relaycc's plan at this size (the report's `algorithm` is the
    /// largest size's).
    #[serde(skip)]
    algorithm: Option<String>,
}

/// The JSON document.
#[derive(Debug, Serialize)]
struct Report {
    collective: String,
    backend: String,
    ranks: u32,
    nodes: u32,
    dtype: String,
    op: String,
    root: u32,
    iters: u32,
    warmup: u32,
    /// The algorithm of relaycc's plan at the largest size.
    algorithm: Option<String>,
    /// The MPI library (`MPI_Get_library_version`, first line).
    mpi_library: String,
    /// Whether relaycc ran in the caller's buffers (`RELAYCC_MPI_ZERO_COPY=1`) or in
    /// its own, copying the input in and the output out (host buffers only).
    zero_copy: bool,
    /// Whether the buffers were `SharedHostBuffer`s (`--shared-buffers`).
    shared_buffers: bool,
    /// How host messages move between the processes
    /// (`MpiCommunicator::host_transport`).
    transport: String,
    /// On GPUs: rank 0's device and the transport (`cuda:0, transport nccl`); absent on
    /// host memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<String>,
    results: Vec<Row>,
}

/// The arguments every rank must share, by the names the command line gives them.
fn settings(args: &BenchArgs) -> Vec<(&'static str, i64)> {
    let flag = |b: bool| i64::from(b);
    // A list as one value: its length and elements folded (FNV-1a).
    let list = |v: &[u32]| {
        v.iter()
            .fold(0xcbf2_9ce4_8422_2325u64 ^ v.len() as u64, |h, x| {
                (h ^ u64::from(*x)).wrapping_mul(0x0000_0100_0000_01b3)
            }) as i64
    };
    vec![
        ("the collective", args.collective as i64),
        ("--dtype", args.element.dtype as i64),
        ("--op", args.element.op as i64),
        ("--root", i64::from(args.root)),
        ("-b", args.min_bytes as i64),
        ("-e", args.max_bytes as i64),
        ("-f", args.factor as i64),
        ("-n", i64::from(args.iters)),
        ("-w", i64::from(args.warmup)),
        ("--check", flag(args.check)),
        ("--vs-mpi", flag(args.vs_mpi)),
        ("--shared-buffers", flag(args.shared_buffers)),
        ("--ranks", args.ranks.map_or(-1, i64::from)),
        ("--gpus", list(&args.gpus)),
        ("--transport", args.transport.map_or(-1, |t| t as i64)),
    ]
}

/// Run `relaycc bench --backend mpi` (collective over the processes of `mpirun`).
pub fn run(args: &BenchArgs, out: &mut Vec<u8>) -> Result<()> {
    let universe = rsmpi::initialize().context("MPI cannot be initialized")?;
    let world = universe.world();
    let me = world.rank() as u32;
    let mut comm = MpiCommunicator::from_mpi(&world, me, None)?;
    // Before anything depends on them: ranks with other arguments would make other calls.
    comm.agree_settings(&settings(args))
        .context("the ranks were started with different arguments")?;
    let on_gpus = !args.gpus.is_empty() || args.transport.is_some();
    if on_gpus && cfg!(not(feature = "cuda")) {
        return Err(usage(
            "--backend mpi with --gpus or --transport runs on GPUs: this relaycc is built \
             without CUDA (build relaycc-cli with --features cuda,mpi)",
        ));
    }
    if on_gpus && args.shared_buffers {
        return Err(usage(
            "--shared-buffers allocates host buffers; with --gpus the buffers are on GPUs",
        ));
    }
    if args.collective == Collective::SendRecv {
        return Err(usage(
            "--backend mpi times collectives; send_recv is not among them",
        ));
    }
    let sizes = crate::bench_checks::bench_sizes(args)?;
    let n = world.size() as u32;
    if let Some(r) = args.ranks
        && r != n
    {
        return Err(usage(format!(
            "--ranks {r}, but mpirun started {n} processes"
        )));
    }
    if args.root >= n {
        return Err(usage(format!("root {} is not a rank (0..{n})", args.root)));
    }
    // The benchmark times the fast path an engine uses: the caller's buffers handed to
    // MPI. `RELAYCC_MPI_ZERO_COPY=0` times the communicator's own buffers instead.
    comm.set_zero_copy(std::env::var("RELAYCC_MPI_ZERO_COPY").map_or(true, |v| v.trim() != "0"));
    let mut dev = if on_gpus {
        Some(gpu::open(&comm, &world, args)?)
    } else {
        None
    };
    let mut rows = Vec::new();
    let mut algorithm = None;
    for size in sizes {
        let d = dev.as_mut();
        let row = match args.element.dtype {
            DType::F32 => size_row::<f32>(&comm, &world, args, size, d)?,
            DType::F64 => size_row::<f64>(&comm, &world, args, size, d)?,
            DType::I8 => size_row::<i8>(&comm, &world, args, size, d)?,
            DType::U8 => size_row::<u8>(&comm, &world, args, size, d)?,
            DType::I32 => size_row::<i32>(&comm, &world, args, size, d)?,
            DType::U32 => size_row::<u32>(&comm, &world, args, size, d)?,
            DType::I64 => size_row::<i64>(&comm, &world, args, size, d)?,
            DType::U64 => size_row::<u64>(&comm, &world, args, size, d)?,
            DType::F16 | DType::Bf16 => {
                return Err(usage(
                    "--backend mpi times types MPI has (f32, f64, i8, u8, i32, u32, i64, \
                     u64); MPI has no half-precision type",
                ));
            }
        };
        algorithm = row.algorithm.clone();
        rows.push(row);
    }
    if me != 0 {
        return Ok(());
    }
    let library: String = rsmpi::environment::library_version()
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .collect::<String>()
        .trim()
        .to_owned();
    let report = Report {
        collective: args.collective.name().into(),
        backend: "mpi".into(),
        ranks: n,
        nodes: comm.nodes(),
        dtype: args.element.dtype.nccl_name().into(),
        op: args.element.op.name().into(),
        root: args.root,
        iters: args.iters,
        warmup: args.warmup,
        algorithm,
        mpi_library: library,
        zero_copy: comm.zero_copy() && dev.is_none(),
        shared_buffers: args.shared_buffers,
        transport: comm.host_transport(),
        gpu: dev.as_ref().map(gpu::describe),
        results: rows,
    };
    write_report(&report, args.format, out, table)
}

fn table(r: &Report, out: &mut Vec<u8>) -> Result<()> {
    writeln!(
        out,
        "# relaycc bench {} on {} ranks ({} processes, {} node(s)), backend mpi, plan {}, \
         {}, {} iters after {} warmup",
        r.collective,
        r.ranks,
        r.ranks,
        r.nodes,
        r.algorithm.as_deref().unwrap_or("-"),
        match (&r.gpu, r.zero_copy, r.shared_buffers) {
            (Some(g), ..) => g.as_str(),
            (None, true, true) => "zero copy, shared buffers",
            (None, true, false) => "zero copy",
            (None, false, true) => "own buffers, shared inputs and outputs",
            (None, false, false) => "own buffers",
        },
        r.iters,
        r.warmup
    )?;
    writeln!(
        out,
        "# MPI: {}; relaycc's transport: {}",
        r.mpi_library, r.transport
    )?;
    let extra: [Column; 3] = [
        ("mpi time", "(us)", 10),
        ("mpi bus", "(GB/s)", 8),
        ("vs mpi", "(x)", 7),
    ];
    table_head(out, &extra)?;
    let na = |v: Option<f64>, p: usize| v.map_or_else(|| "N/A".to_owned(), |v| format!("{v:.p$}"));
    for row in &r.results {
        let cells = [
            na(row.mpi_time_us, 1),
            na(row.mpi_busbw_gbps, 2),
            na(row.vs_mpi, 2),
        ];
        let lead = (
            row.size,
            row.count,
            row.time_us,
            row.algbw_gbps,
            row.busbw_gbps,
        );
        let how = (r.dtype.as_str(), r.op.as_str(), r.root);
        table_row(out, lead, row.wrong, how, &extra, &cells)?;
    }
    if r.results.iter().any(|row| row.vs_mpi.is_some()) {
        writeln!(
            out,
            "# vs mpi = MPI's time / relaycc's time on the same buffers (above 1: relaycc \
             is faster)"
        )?;
    }
    Ok(())
}

/// The element count of a `size`-byte request, as nccl-tests counts it.
fn element_count(c: Collective, dtype: DType, size: u64, n: u64) -> u64 {
    let per = size / dtype.size();
    match c {
        Collective::AllGather
        | Collective::AllGatherV
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::AllToAllV
        | Collective::Gather
        | Collective::Scatter => per / n.max(1),
        _ => per,
    }
}

/// A host buffer of the benchmark: on the heap, or shared with the other local ranks
/// (`--shared-buffers`).
pub(super) enum HostBuf<T: Element> {
    Heap(Vec<T>),
    Shared(SharedHostBuffer<T>),
}

impl<T: Element> HostBuf<T> {
    /// `len` elements, each `fill(i)`.
    fn new(shared: bool, len: usize, me: u32, fill: impl Fn(u64) -> T) -> Result<Self> {
        if shared {
            let mut b = SharedHostBuffer::zeroed(len)?;
            for (i, x) in b.iter_mut().enumerate() {
                *x = fill(i as u64);
            }
            return Ok(HostBuf::Shared(b));
        }
        let mut v: Vec<T> = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| anyhow::anyhow!("rank {me}: out of host memory for {len} elements"))?;
        v.extend((0..len as u64).map(fill));
        Ok(HostBuf::Heap(v))
    }
}

impl<T: Element> std::ops::Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Shared(b) => b,
        }
    }
}

impl<T: Element> std::ops::DerefMut for HostBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Shared(b) => b,
        }
    }
}

/// This rank's buffers and counts for one size.
pub(super) struct Bufs<T: Element> {
    pub(super) input: HostBuf<T>,
    pub(super) output: HostBuf<T>,
    /// Per-rank counts (all equal) of the `v` collectives, as MPI takes them.
    counts: Vec<usize>,
    displs: Vec<i32>,
    req: Request,
}

fn buffers<T: Element>(args: &BenchArgs, n: u32, me: u32, size: u64) -> Result<Bufs<T>> {
    let c = args.collective;
    let dtype = T::DTYPE;
    let count = element_count(c, dtype, size, u64::from(n));
    let mut req = Request::new(c, (0..n).collect(), count, dtype)
        .with_op(args.element.op)
        .with_root(args.root);
    let nr = n as usize;
    if c == Collective::AllGatherV {
        req.counts = vec![count; nr];
    }
    if c == Collective::AllToAllV {
        req.matrix = vec![vec![count; nr]; nr];
    }
    let in_len = usize::try_from(req.input_len(me)?)?;
    let mut out_len = usize::try_from(req.output_len(me)?)?;
    if c == Collective::Broadcast {
        // In place, as MPI_Bcast: every rank's buffer holds the count.
        out_len = count as usize;
    }
    let shared = args.shared_buffers;
    let input = HostBuf::new(shared, in_len, me, |i| T::from_i64(value(me, i)))?;
    let output = HostBuf::new(shared, out_len, me, |_| T::from_i64(0))?;
    let cu = count as usize;
    let counts = vec![cu; nr];
    let displs = (0..nr)
        .map(|r| i32::try_from(r * cu))
        .collect::<Result<Vec<_>, _>>()
        .context("displacements over MPI's int range")?;
    Ok(Bufs {
        input,
        output,
        counts,
        displs,
        req,
    })
}

/// One call of relaycc's collective on `b`.
fn relaycc_call<T: Element>(
    comm: &MpiCommunicator,
    args: &BenchArgs,
    b: &mut Bufs<T>,
) -> Result<()> {
    let op = args.element.op;
    let root = args.root;
    let (i, o) = (&b.input[..], &mut b.output[..]);
    match args.collective {
        Collective::AllReduce => comm.all_reduce(i, o, op)?,
        Collective::Reduce => comm.reduce(i, o, root, op)?,
        Collective::Broadcast => {
            if comm.rank() == root {
                o.copy_from_slice(i);
            }
            comm.broadcast(o, root)?
        }
        Collective::AllGather => comm.all_gather(i, o)?,
        Collective::AllGatherV => comm.all_gather_v(i, o, &b.counts)?,
        Collective::ReduceScatter => comm.reduce_scatter(i, o, op)?,
        Collective::AllToAll => comm.all_to_all(i, o)?,
        Collective::AllToAllV => comm.all_to_all_v(i, &b.counts, o, &b.counts)?,
        Collective::Gather => comm.gather(i, o, root)?,
        Collective::Scatter => comm.scatter(i, o, root)?,
        Collective::SendRecv => bail!("send_recv is not timed over MPI"),
    }
    Ok(())
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        // MPI has no average: its sum is timed, and `--check` divides it.
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Prod => SystemOperation::product(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

/// One call of the MPI library's collective on `b`'s input, into `out`.
fn mpi_call<T: Element + Equivalence>(
    world: &SimpleCommunicator,
    args: &BenchArgs,
    b: &Bufs<T>,
    out: &mut [T],
) {
    let op = system_op(args.element.op);
    let root = world.process_at_rank(args.root as i32);
    let is_root = world.rank() as u32 == args.root;
    let i = &b.input[..];
    let counts: Vec<i32> = b.counts.iter().map(|c| *c as i32).collect();
    match args.collective {
        Collective::AllReduce => world.all_reduce_into(i, out, op),
        Collective::Reduce if is_root => root.reduce_into_root(i, out, op),
        Collective::Reduce => root.reduce_into(i, op),
        Collective::Broadcast => {
            if is_root {
                out.copy_from_slice(i);
            }
            root.broadcast_into(out)
        }
        Collective::AllGather => world.all_gather_into(i, out),
        Collective::AllGatherV => {
            let mut part = PartitionMut::new(out, &counts[..], &b.displs[..]);
            world.all_gather_varcount_into(i, &mut part)
        }
        Collective::ReduceScatter => world.reduce_scatter_block_into(i, out, op),
        Collective::AllToAll => world.all_to_all_into(i, out),
        Collective::AllToAllV => {
            let send = Partition::new(i, &counts[..], &b.displs[..]);
            let mut recv = PartitionMut::new(out, &counts[..], &b.displs[..]);
            world.all_to_all_varcount_into(&send, &mut recv)
        }
        Collective::Gather if is_root => root.gather_into_root(i, out),
        Collective::Gather => root.gather_into(i),
        Collective::Scatter if is_root => root.scatter_into_root(i, out),
        Collective::Scatter => root.scatter_into(out),
        Collective::SendRecv => {}
    }
}

/// Time relaycc (and with `--vs-mpi` the MPI collective) at one size; `--check`
/// compares the two outputs.
fn size_row<T: Element + Equivalence + gpu::Dev>(
    comm: &MpiCommunicator,
    world: &SimpleCommunicator,
    args: &BenchArgs,
    size: u64,
    mut dev: Option<&mut gpu::Gpu<'_>>,
) -> Result<Row> {
    let n = world.size() as u32;
    let me = world.rank() as u32;
    let mut b = buffers::<T>(args, n, me, size)?;
    let mut mpi_out = HostBuf::new(args.shared_buffers, b.output.len(), me, |_| T::from_i64(0))?;
    let with_mpi = args.vs_mpi;
    let mut d = match dev.as_deref() {
        Some(g) => Some(gpu::upload(g, &b)?),
        None => None,
    };
    let mut call = |b: &mut Bufs<T>| -> Result<()> {
        match (dev.as_deref_mut(), d.as_mut()) {
            (Some(g), Some(d)) => gpu::call(g, args, d, &b.counts, me),
            _ => relaycc_call(comm, args, b),
        }
    };
    // Every blocking MPI collective below is entered after a bounded barrier: once every
    // rank has passed it, each calls the same collective with the agreed arguments.
    for _ in 0..args.warmup {
        call(&mut b)?;
        if with_mpi {
            comm.barrier()?;
            mpi_call(world, args, &b, &mut mpi_out);
        }
    }
    let (mut t_relay, mut t_mpi) = (0.0f64, 0.0f64);
    let iters = args.iters.max(1);
    for _ in 0..iters {
        comm.barrier()?;
        let t = Instant::now();
        call(&mut b)?;
        t_relay += t.elapsed().as_secs_f64();
        if with_mpi {
            comm.barrier()?;
            let t = Instant::now();
            mpi_call(world, args, &b, &mut mpi_out);
            t_mpi += t.elapsed().as_secs_f64();
        }
    }
    let algorithm = comm.last_algorithm();
    let wrong = if args.check {
        b.output.fill(T::from_i64(0));
        mpi_out.fill(T::from_i64(0));
        call(&mut b)?;
        if let (Some(g), Some(d)) = (dev.as_deref(), d.as_ref()) {
            gpu::download(g, d, &mut b.output)?;
        }
        comm.barrier()?;
        mpi_call(world, args, &b, &mut mpi_out);
        let n_f = f64::from(n);
        let avg = args.collective.reduces() && args.element.op == ReduceOp::Avg;
        let bad = b
            .output
            .iter()
            .zip(mpi_out.iter())
            .filter(|(a, m)| {
                if avg {
                    let want = m.to_f64() / n_f;
                    (a.to_f64() - want).abs() > 1e-6 * want.abs().max(1.0)
                } else {
                    a != m
                }
            })
            .count() as u64;
        // The tallies go through relaycc's own all_reduce: bounded by the timeout.
        let mut total = [0u64];
        comm.all_reduce(&[bad], &mut total, ReduceOp::Sum)?;
        Some(total[0])
    } else {
        None
    };
    let mut worst = [0.0f64; 2];
    comm.all_reduce(&[t_relay, t_mpi], &mut worst, ReduceOp::Max)?;
    let bytes = b.req.size_bytes();
    let secs = worst[0] / f64::from(iters);
    let algbw = bytes as f64 / secs / 1e9;
    let factor = args.collective.busbw_factor(n as usize);
    let mpi_secs = with_mpi.then(|| worst[1] / f64::from(iters));
    Ok(Row {
        size: bytes,
        count: b.req.count,
        time_us: secs * 1e6,
        algbw_gbps: algbw,
        busbw_gbps: algbw * factor,
        wrong,
        mpi_time_us: mpi_secs.map(|s| s * 1e6),
        mpi_busbw_gbps: mpi_secs.map(|s| bytes as f64 / s / 1e9 * factor),
        vs_mpi: mpi_secs.map(|s| s / secs),
        algorithm,
    })
}
