//! `relaycc bench`: time collectives on a backend in nccl-tests' format.
//!
//! With `--backend host` the ranks are logical devices of this host's memory
//! ([`relaycc_collectives::host_topology`]), driven through the per-rank API by one thread
//! per core (`bench_ranks.rs`), and every size is also timed as a plain copy of
//! `ranks x size` bytes (one `size`-byte copy per rank, on the same lane threads, through the
//! same executor): an all_reduce must read every input and write every output at least once,
//! the same memory traffic, so `efficiency = algbw x ranks / memcpy_gbps` says how close the
//! collective comes to the machine's limit.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use relaycc_collectives::{BufferView, Communicator, DeviceBuffer, Element, bf16, f16};
use relaycc_route::{Collective, DType, ReduceOp, Request, Transfer};
use serde::Serialize;

use crate::args::{BackendKind, BenchArgs, BenchFormat};
use crate::bench_reference::{RefElement, count_wrong_in, value};
use crate::size::format_size;

/// One row of results.
#[derive(Debug, Serialize)]
pub(crate) struct Row {
    pub size: u64,
    pub count: u64,
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    /// Output elements that differ from the expected result; `None` (N/A) without `--check`.
    pub wrong: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memcpy_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<f64>,
    /// NCCL's time for the same collective and size (`--vs-nccl`), microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_time_us: Option<f64>,
    /// NCCL's busbw, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_busbw_gbps: Option<f64>,
    /// relaycc's speed over NCCL's: NCCL's time over relaycc's (equal to the busbw ratio; also
    /// defined on one rank, where busbw is 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_nccl: Option<f64>,
}

impl Row {
    /// The row of `req` on `n` ranks from the mean seconds of the collective and of the plain
    /// copy of every rank's `size` bytes (the memcpy reference).
    pub(crate) fn timed(
        req: &Request,
        n: usize,
        secs: f64,
        copy_secs: f64,
        wrong: Option<u64>,
    ) -> Row {
        let bytes = req.size_bytes();
        let algbw = bytes as f64 / secs / 1e9;
        let memcpy_gbps = (bytes > 0).then(|| (n as u64 * bytes) as f64 / copy_secs / 1e9);
        Row {
            size: bytes,
            count: req.count,
            time_us: secs * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: algbw * req.collective.busbw_factor(n),
            wrong,
            memcpy_gbps,
            efficiency: memcpy_gbps.map(|m| algbw * n as f64 / m),
            nccl_time_us: None,
            nccl_busbw_gbps: None,
            vs_nccl: None,
        }
    }
}

/// One column after nccl-tests' leading ones: its name, its unit and its width.
pub(crate) type Column = (&'static str, &'static str, usize);

/// The two heading lines of an nccl-tests table: the leading columns (size, count, type,
/// redop, root, time, algbw, busbw, #wrong), then `extra`.
pub(crate) fn table_head(out: &mut Vec<u8>, extra: &[Column]) -> Result<()> {
    let lead = [
        ("size", "(B)", 11),
        ("count", "(elements)", 12),
        ("type", "", 8),
        ("redop", "", 6),
        ("root", "", 5),
        ("time", "(us)", 10),
        ("algbw", "(GB/s)", 8),
        ("busbw", "(GB/s)", 8),
        ("#wrong", "", 7),
    ];
    for line in [0, 1] {
        write!(out, "#")?;
        for (k, &(name, unit, w)) in lead.iter().chain(extra).enumerate() {
            let sep = if k == 0 { "" } else { " " };
            write!(out, "{sep}{:>w$}", if line == 0 { name } else { unit })?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// One row of an nccl-tests table: the leading columns of `row` (element type `dtype`, op
/// `op`, root `root`), then `extra` cells, each right-aligned to its column's width.
pub(crate) fn table_row(
    out: &mut Vec<u8>,
    (size, count, time_us, algbw, busbw): (u64, u64, f64, f64, f64),
    wrong: Option<u64>,
    (dtype, op, root): (&str, &str, u32),
    extra: &[Column],
    cells: &[String],
) -> Result<()> {
    let wrong = wrong.map_or_else(|| "N/A".to_owned(), |w| w.to_string());
    write!(
        out,
        "{size:>12} {count:>12} {dtype:>8} {op:>6} {root:>5} {time_us:>10.1} {algbw:>8.2} \
         {busbw:>8.2} {wrong:>7}"
    )?;
    for (&(_, _, w), cell) in extra.iter().zip(cells) {
        write!(out, " {cell:>w$}")?;
    }
    writeln!(out)?;
    Ok(())
}

/// The JSON document.
#[derive(Debug, Serialize)]
struct Report {
    collective: String,
    backend: String,
    ranks: usize,
    dtype: String,
    op: String,
    root: u32,
    iters: u32,
    warmup: u32,
    /// The plain-copy rate at the largest size (host backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    memcpy_gbps: Option<f64>,
    /// The NCCL timed beside relaycc (`--vs-nccl`): library and version.
    #[serde(skip_serializing_if = "Option::is_none")]
    nccl: Option<String>,
    /// Why `--vs-nccl` could not time NCCL.
    #[serde(skip_serializing_if = "Option::is_none")]
    nccl_unavailable: Option<String>,
    results: Vec<Row>,
}

/// The element count of a `size`-byte request on `n` ranks, as nccl-tests counts it: the whole
/// buffer, or one rank's block for the gathers, scatters and all-to-alls.
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

/// Run `relaycc bench`.
pub fn run(args: &BenchArgs, out: &mut Vec<u8>) -> Result<()> {
    if args.vs_mpi && args.backend != BackendKind::Mpi {
        return Err(crate::args::usage("--vs-mpi needs --backend mpi"));
    }
    if args.shared_buffers && args.backend != BackendKind::Mpi {
        return Err(crate::args::usage(
            "--shared-buffers needs --backend mpi (buffers other processes map)",
        ));
    }
    if args.transport.is_some() && args.backend != BackendKind::Mpi {
        return Err(crate::args::usage(
            "--transport needs --backend mpi (GPU ranks across processes)",
        ));
    }
    let collective = args.collective;
    let (dtype, op) = (args.element.dtype, args.element.op);
    let sizes = crate::bench_checks::bench_sizes(args)?;
    let (comm, devices, ordinals) = match args.backend {
        BackendKind::Host => {
            let devices: Vec<u32> = match (&args.gpus, args.ranks) {
                (g, _) if !g.is_empty() => g.clone(),
                (_, Some(n)) if n > 0 => (0..n).collect(),
                _ => bail!("give --ranks N or --gpus LIST"),
            };
            let arenas = devices.iter().max().map_or(0, |m| m + 1);
            let topo = relaycc_collectives::host_topology(arenas)?;
            let backend = std::sync::Arc::new(relaycc_collectives::HostBackend::new());
            // `host-N` tells the planner the ranks share this host's memory.
            let comm = Communicator::new(topo, &devices, &[], backend)?;
            (comm, devices, Vec::new())
        }
        BackendKind::Cuda => crate::bench_cuda::communicator(args)?,
        BackendKind::Mpi => return crate::bench_mpi::run(args, out),
    };
    let max = sizes.last().copied().unwrap_or(0);
    crate::bench_checks::check_memory(&comm, args, &ordinals, collective, dtype, op, max)?;
    let mut nccl_note = None;
    let nccl = match (args.vs_nccl, args.backend) {
        (false, _) => None,
        (true, BackendKind::Host | BackendKind::Mpi) => {
            nccl_note = Some("NCCL runs on GPUs: use --backend cuda".to_owned());
            None
        }
        (true, BackendKind::Cuda) => match crate::bench_cuda::nccl_baseline(
            &ordinals,
            element_count(collective, dtype, max, ordinals.len() as u64),
            collective,
            dtype,
        ) {
            Ok(n) => Some(n),
            Err(why) => {
                nccl_note = Some(why);
                None
            }
        },
    };
    // The host backend runs the per-rank API, one thread per core (`bench_ranks.rs`).
    let mut ranks = match args.backend {
        BackendKind::Host => Some(crate::bench_ranks::ranks(&comm)?),
        _ => None,
    };
    let mut rows = Vec::new();
    for size in sizes {
        let row = match (&mut ranks, dtype) {
            (Some(ranks), _) => {
                crate::bench_ranks::row(ranks, &comm, args, collective, dtype, op, size)?
            }
            (None, dtype) => match dtype {
                DType::F32 => size_row::<f32>(&comm, args, collective, op, size)?,
                DType::F64 => size_row::<f64>(&comm, args, collective, op, size)?,
                DType::F16 => size_row::<f16>(&comm, args, collective, op, size)?,
                DType::Bf16 => size_row::<bf16>(&comm, args, collective, op, size)?,
                DType::I8 => size_row::<i8>(&comm, args, collective, op, size)?,
                DType::U8 => size_row::<u8>(&comm, args, collective, op, size)?,
                DType::I32 => size_row::<i32>(&comm, args, collective, op, size)?,
                DType::U32 => size_row::<u32>(&comm, args, collective, op, size)?,
                DType::I64 => size_row::<i64>(&comm, args, collective, op, size)?,
                DType::U64 => size_row::<u64>(&comm, args, collective, op, size)?,
            },
        };
        let row = match &nccl {
            Some(nc) => with_nccl(row, nc, args, collective, dtype, op, devices.len())?,
            None => row,
        };
        rows.push(row);
    }
    let report = Report {
        collective: collective.name().into(),
        backend: comm.backend().name().into(),
        ranks: devices.len(),
        dtype: dtype.nccl_name().into(),
        op: op.name().into(),
        root: args.root,
        iters: args.iters,
        warmup: args.warmup,
        memcpy_gbps: rows.last().and_then(|r| r.memcpy_gbps),
        nccl: nccl
            .as_ref()
            .and_then(|_| crate::bench_cuda::nccl_library()),
        nccl_unavailable: nccl_note,
        results: rows,
    };
    write_report(&report, args.format, out, table)
}

/// Write `report` as JSON, or as a table with `table`.
pub(crate) fn write_report<R: Serialize>(
    report: &R,
    format: BenchFormat,
    out: &mut Vec<u8>,
    table: impl FnOnce(&R, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    match format {
        BenchFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, report)?;
            writeln!(out)?;
            Ok(())
        }
        BenchFormat::Table => table(report, out),
    }
}

fn table(r: &Report, out: &mut Vec<u8>) -> Result<()> {
    writeln!(
        out,
        "# relaycc bench {} on {} ranks, backend {}, {} iters after {} warmup",
        r.collective, r.ranks, r.backend, r.iters, r.warmup
    )?;
    let extra: [Column; 2] = [("memcpy", "(GB/s)", 8), ("efficiency", "", 10)];
    table_head(out, &extra)?;
    for row in &r.results {
        let cells = [
            format!("{:.2}", row.memcpy_gbps.unwrap_or(f64::NAN)),
            format!("{:.3}", row.efficiency.unwrap_or(f64::NAN)),
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
    if let Some(m) = r.memcpy_gbps {
        writeln!(
            out,
            "# memcpy_gbps = {m:.2} (ranks x size bytes copied on the same lane threads); \
             efficiency = algbw x ranks / memcpy_gbps"
        )?;
    }
    if let Some(why) = &r.nccl_unavailable {
        writeln!(out, "# NCCL comparison unavailable: {why}")?;
    }
    if let Some(lib) = &r.nccl {
        writeln!(
            out,
            "# NCCL ({lib}) on the same GPUs and sizes, timed alike (launch + wait per iteration)"
        )?;
        writeln!(
            out,
            "#{:>11} {:>10} {:>8} {:>10} {:>8}",
            "size", "relaycc", "nccl", "nccl", "relaycc/"
        )?;
        writeln!(
            out,
            "#{:>11} {:>10} {:>8} {:>10} {:>8}",
            "(B)", "busbw", "(us)", "busbw", "nccl"
        )?;
        for row in &r.results {
            writeln!(
                out,
                "{:>12} {:>10.2} {:>8.1} {:>10.2} {:>8.2}",
                row.size,
                row.busbw_gbps,
                row.nccl_time_us.unwrap_or(f64::NAN),
                row.nccl_busbw_gbps.unwrap_or(f64::NAN),
                row.vs_nccl.unwrap_or(f64::NAN)
            )?;
        }
    }
    Ok(())
}

/// The request for `size` bytes, sized as nccl-tests sizes it.
pub(crate) fn request(
    comm: &Communicator,
    c: Collective,
    dtype: DType,
    op: ReduceOp,
    root: u32,
    size: u64,
) -> Request {
    let n = comm.ranks() as u64;
    let count = element_count(c, dtype, size, n);
    let mut r = Request::new(c, comm.devices().to_vec(), count, dtype)
        .with_op(op)
        .with_root(root);
    let nr = n as usize;
    r.counts = if c == Collective::AllGatherV {
        vec![count; nr]
    } else {
        Vec::new()
    };
    r.matrix = if c == Collective::AllToAllV {
        vec![vec![count; nr]; nr]
    } else {
        Vec::new()
    };
    if c == Collective::SendRecv {
        r.transfers = (0..n as u32)
            .map(|s| Transfer {
                src: s,
                dst: (s + 1) % n as u32,
                count,
            })
            .collect();
    }
    r
}

fn buffers<T: Element>(
    comm: &Communicator,
    req: &Request,
    input: bool,
) -> Result<Vec<DeviceBuffer<T>>> {
    (0..comm.ranks() as u32)
        .map(|r| {
            let len = if input {
                req.input_len(r)?
            } else {
                req.output_len(r)?
            };
            let len_usize = usize::try_from(len)
                .with_context(|| format!("rank {r}: {len} elements do not fit in memory"))?;
            let mut data: Vec<T> = Vec::new();
            data.try_reserve_exact(len_usize).map_err(|_| {
                anyhow::anyhow!(
                    "rank {r}: out of host memory for {} of {} data",
                    format_size(len.saturating_mul(T::DTYPE.size())),
                    if input { "input" } else { "output" }
                )
            })?;
            data.extend((0..len).map(|i| T::from_i64(if input { value(r, i) } else { 0 })));
            Ok(comm.from_slice(r as usize, &data)?)
        })
        .collect()
}

fn views<T: Element>(bufs: &[DeviceBuffer<T>]) -> Vec<Option<BufferView<'_, T>>> {
    bufs.iter()
        .map(|b| (!b.is_empty()).then(|| b.view()))
        .collect()
}

fn size_row<T: RefElement>(
    comm: &Communicator,
    args: &BenchArgs,
    c: Collective,
    op: ReduceOp,
    size: u64,
) -> Result<Row> {
    let req = request(comm, c, T::DTYPE, op, args.root, size);
    let ins = buffers::<T>(comm, &req, true)?;
    let outs = buffers::<T>(comm, &req, false)?;
    let (iv, ov) = (views(&ins), views(&outs));
    let bytes = req.size_bytes();
    let n = comm.ranks();
    // The same bytes per rank, copied within each rank's arena on the same lane threads.
    // Collective and copy iterations alternate, so that drift in the machine's speed (other
    // tenants, frequency) hits both figures alike.
    let copy_len = if bytes > 0 { bytes as usize } else { 0 };
    let src: Vec<DeviceBuffer<u8>> = (0..n)
        .map(|r| comm.alloc(r, copy_len))
        .collect::<Result<_, _>>()?;
    let dst: Vec<DeviceBuffer<u8>> = (0..n)
        .map(|r| comm.alloc(r, copy_len))
        .collect::<Result<_, _>>()?;
    let collective = || -> Result<()> { Ok(comm.launch_request(&req, &iv, &ov)?.wait()?) };
    let memcpy = || -> Result<()> {
        let mut g = comm.group();
        for r in 0..n {
            g.send(&src[r], r, r)?;
            g.recv(&dst[r], r, r)?;
        }
        Ok(g.launch()?.wait()?)
    };
    for _ in 0..args.warmup {
        collective()?;
        memcpy()?;
    }
    let (mut t_coll, mut t_copy) = (0.0, 0.0);
    let iters = args.iters.max(1);
    for _ in 0..iters {
        let t = Instant::now();
        collective()?;
        t_coll += t.elapsed().as_secs_f64();
        let t = Instant::now();
        memcpy()?;
        t_copy += t.elapsed().as_secs_f64();
    }
    let wrong = if args.check {
        Some(count_wrong(&req, &outs)?)
    } else {
        None
    };
    let per = |t: f64| t / f64::from(iters);
    Ok(Row::timed(&req, n, per(t_coll), per(t_copy), wrong))
}

/// `row` with NCCL's figures for the same collective and size, timed right after relaycc's.
fn with_nccl(
    mut row: Row,
    nc: &crate::bench_cuda::Nccl,
    args: &BenchArgs,
    c: Collective,
    dtype: DType,
    op: ReduceOp,
    ranks: usize,
) -> Result<Row> {
    let us = crate::bench_cuda::nccl_time_us(nc, c, row.count, dtype, op, args)?;
    let busbw = row.size as f64 / (us * 1e3) * c.busbw_factor(ranks);
    row.nccl_time_us = Some(us);
    row.nccl_busbw_gbps = Some(busbw);
    // NCCL's time over relaycc's: the busbw ratio wherever busbw is defined, and still a
    // ratio on one rank, whose busbw factor is 0.
    row.vs_nccl = (row.time_us > 0.0).then(|| us / row.time_us);
    Ok(row)
}

/// Output elements that differ from the request's expected result.
fn count_wrong<T: RefElement>(req: &Request, outs: &[DeviceBuffer<T>]) -> Result<u64> {
    let outs: Vec<Vec<T>> = outs.iter().map(|b| b.to_vec()).collect::<Result<_, _>>()?;
    count_wrong_in(req, &outs)
}
