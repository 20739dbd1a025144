//! `relaycc bench`'s one pipeline after the driver is open: every size as a [`Call`] sized by
//! [`crate::sizing::bench_request`], measured by the [`BenchDriver`], and the measurements
//! written as nccl-tests' table (size, count, type, redop, root, time, algbw, busbw, #wrong,
//! then the driver's comparison columns) or as JSON.
//!
//! algbw is the size over the time; busbw is algbw times the collective's bus factor on the
//! ranks (nccl-tests' rule). In one process the extra columns are the plain-copy rate
//! (`memcpy`: every rank copying the size's bytes, so `efficiency = algbw x ranks / memcpy`)
//! and, with `--vs-nccl`, a second table of NCCL's figures; under MPI they are the MPI
//! library's time, busbw and its time over relaycc's.

use std::io::Write;

use anyhow::Result;
use relaycc_route::Request;
use serde::Serialize;

use crate::args::{BenchArgs, BenchFormat};
use crate::bench_driver::{BenchDriver, Call, Measurement, Setting};

/// Time every size of `sizes` with `driver` and write the report of `args` into `out` (on the
/// processes that print).
pub fn run(
    driver: &mut dyn BenchDriver,
    args: &BenchArgs,
    sizes: &[u64],
    out: &mut Vec<u8>,
) -> Result<()> {
    let devices = driver.devices();
    let how = (
        args.collective,
        args.element.dtype,
        args.element.op,
        args.root,
    );
    let mut rows = Vec::with_capacity(sizes.len());
    for &size in sizes {
        let call = Call {
            request: crate::sizing::bench_request(&devices, how, size)?,
            warmup: args.warmup,
            iters: args.iters.max(1),
            check: args.check,
        };
        let m = driver.measure(&call)?;
        rows.push((call.request, m));
    }
    if !driver.prints() {
        return Ok(());
    }
    let setting = driver.setting();
    let mpi = matches!(setting, Setting::Mpi(_));
    let results: Vec<Row> = rows.iter().map(|(req, m)| Row::of(req, m, mpi)).collect();
    let algorithm = rows.last().and_then(|(_, m)| m.algorithm.clone());
    let extra = match setting {
        Setting::InProcess {
            backend,
            nccl,
            nccl_unavailable,
        } => Extra::InProcess {
            backend,
            memcpy_gbps: results.last().and_then(|r| r.memcpy_gbps),
            nccl,
            nccl_unavailable,
        },
        Setting::Mpi(s) => Extra::Mpi {
            algorithm,
            mpi_library: s.mpi_library,
            zero_copy: s.zero_copy,
            shared_buffers: s.shared_buffers,
            transport: s.transport,
            gpu: s.gpu,
            nodes: s.nodes,
        },
    };
    let report = Report {
        collective: args.collective.name().into(),
        backend: match &extra {
            Extra::InProcess { backend, .. } => backend.clone(),
            Extra::Mpi { .. } => "mpi".into(),
        },
        ranks: devices.len(),
        nodes: match &extra {
            Extra::Mpi { nodes, .. } => Some(*nodes),
            Extra::InProcess { .. } => None,
        },
        dtype: args.element.dtype.nccl_name().into(),
        op: args.element.op.name().into(),
        root: args.root,
        iters: args.iters,
        warmup: args.warmup,
        extra,
        results,
    };
    match args.format {
        BenchFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
            Ok(())
        }
        BenchFormat::Table => match &report.extra {
            Extra::InProcess { .. } => in_process_table(&report, out),
            Extra::Mpi { .. } => mpi_table(&report, out),
        },
    }
}

/// One row of results.
#[derive(Debug, Serialize)]
struct Row {
    size: u64,
    count: u64,
    time_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    /// Output elements that differ from the expected result; `None` (N/A) without `--check`.
    wrong: Option<u64>,
    /// The plain-copy rate: every rank's `size` bytes over the copy's time, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    memcpy_gbps: Option<f64>,
    /// `algbw x ranks / memcpy_gbps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    efficiency: Option<f64>,
    /// NCCL's time for the same collective and size (`--vs-nccl`), microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    nccl_time_us: Option<f64>,
    /// NCCL's busbw, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    nccl_busbw_gbps: Option<f64>,
    /// relaycc's speed over NCCL's: NCCL's time over relaycc's (equal to the busbw ratio; also
    /// defined on one rank, where busbw is 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_nccl: Option<f64>,
    /// The MPI collective's time on the same buffers (`--vs-mpi`), microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    mpi_time_us: Option<f64>,
    /// The MPI collective's busbw, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    mpi_busbw_gbps: Option<f64>,
    /// MPI's time over relaycc's (above 1: relaycc is faster).
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_mpi: Option<f64>,
}

impl Row {
    /// The row of `req` measured as `m`; the other library timed beside relaycc is MPI when
    /// `mpi`, else NCCL.
    fn of(req: &Request, m: &Measurement, mpi: bool) -> Row {
        let n = req.nranks();
        let bytes = req.size_bytes();
        let factor = req.collective.busbw_factor(n);
        let gbps = |secs: f64| bytes as f64 / secs / 1e9;
        let algbw = gbps(m.secs);
        let memcpy_gbps = m
            .copy_secs
            .and_then(|c| (bytes > 0).then(|| (n as u64 * bytes) as f64 / c / 1e9));
        // The other library's time over relaycc's: the busbw ratio wherever busbw is defined,
        // and still a ratio on one rank, whose busbw factor is 0.
        let beside = m.beside_secs.map(|s| {
            let ratio = (m.secs > 0.0).then(|| s / m.secs);
            (s * 1e6, gbps(s) * factor, ratio)
        });
        let (nccl, mpi) = if mpi { (None, beside) } else { (beside, None) };
        Row {
            size: bytes,
            count: req.count,
            time_us: m.secs * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: algbw * factor,
            wrong: m.wrong,
            memcpy_gbps,
            efficiency: memcpy_gbps.map(|c| algbw * n as f64 / c),
            nccl_time_us: nccl.map(|b| b.0),
            nccl_busbw_gbps: nccl.map(|b| b.1),
            vs_nccl: nccl.and_then(|b| b.2),
            mpi_time_us: mpi.map(|b| b.0),
            mpi_busbw_gbps: mpi.map(|b| b.1),
            vs_mpi: mpi.and_then(|b| b.2),
        }
    }
}

/// The JSON document.
#[derive(Debug, Serialize)]
struct Report {
    collective: String,
    backend: String,
    ranks: usize,
    /// Nodes the MPI processes span.
    #[serde(skip_serializing_if = "Option::is_none")]
    nodes: Option<u32>,
    dtype: String,
    op: String,
    root: u32,
    iters: u32,
    warmup: u32,
    #[serde(flatten)]
    extra: Extra,
    results: Vec<Row>,
}

/// The report's fields that depend on where the ranks ran.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Extra {
    InProcess {
        #[serde(skip)]
        backend: String,
        /// The plain-copy rate at the largest size.
        #[serde(skip_serializing_if = "Option::is_none")]
        memcpy_gbps: Option<f64>,
        /// The NCCL timed beside relaycc (`--vs-nccl`): library and version.
        #[serde(skip_serializing_if = "Option::is_none")]
        nccl: Option<String>,
        /// Why `--vs-nccl` could not time NCCL.
        #[serde(skip_serializing_if = "Option::is_none")]
        nccl_unavailable: Option<String>,
    },
    Mpi {
        #[serde(skip)]
        nodes: u32,
        /// The algorithm of relaycc's plan at the largest size.
        algorithm: Option<String>,
        /// [`crate::bench_driver::MpiSetting::mpi_library`].
        mpi_library: String,
        /// [`crate::bench_driver::MpiSetting::zero_copy`].
        zero_copy: bool,
        /// [`crate::bench_driver::MpiSetting::shared_buffers`].
        shared_buffers: bool,
        /// [`crate::bench_driver::MpiSetting::transport`].
        transport: String,
        /// [`crate::bench_driver::MpiSetting::gpu`].
        #[serde(skip_serializing_if = "Option::is_none")]
        gpu: Option<String>,
    },
}

/// One column after nccl-tests' leading ones: its name, its unit and its width.
type Column = (&'static str, &'static str, usize);

/// The two heading lines of an nccl-tests table: the leading columns (size, count, type,
/// redop, root, time, algbw, busbw, #wrong), then `extra`.
fn table_head(out: &mut Vec<u8>, extra: &[Column]) -> Result<()> {
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

/// One row of an nccl-tests table: the leading columns of `row`, then `extra` cells, each
/// right-aligned to its column's width.
fn table_row(
    out: &mut Vec<u8>,
    r: &Report,
    row: &Row,
    extra: &[Column],
    cells: &[String],
) -> Result<()> {
    let wrong = row
        .wrong
        .map_or_else(|| "N/A".to_owned(), |w| w.to_string());
    let (dtype, op, root) = (&r.dtype, &r.op, r.root);
    write!(
        out,
        "{:>12} {:>12} {dtype:>8} {op:>6} {root:>5} {:>10.1} {:>8.2} {:>8.2} {wrong:>7}",
        row.size, row.count, row.time_us, row.algbw_gbps, row.busbw_gbps
    )?;
    for (&(_, _, w), cell) in extra.iter().zip(cells) {
        write!(out, " {cell:>w$}")?;
    }
    writeln!(out)?;
    Ok(())
}

/// The table of a run in one process: the plain-copy columns, then NCCL's figures.
fn in_process_table(r: &Report, out: &mut Vec<u8>) -> Result<()> {
    let Extra::InProcess {
        backend,
        memcpy_gbps,
        nccl,
        nccl_unavailable,
    } = &r.extra
    else {
        return Ok(());
    };
    writeln!(
        out,
        "# relaycc bench {} on {} ranks, backend {backend}, {} iters after {} warmup",
        r.collective, r.ranks, r.iters, r.warmup
    )?;
    let extra: [Column; 2] = [("memcpy", "(GB/s)", 8), ("efficiency", "", 10)];
    table_head(out, &extra)?;
    for row in &r.results {
        let cells = [
            format!("{:.2}", row.memcpy_gbps.unwrap_or(f64::NAN)),
            format!("{:.3}", row.efficiency.unwrap_or(f64::NAN)),
        ];
        table_row(out, r, row, &extra, &cells)?;
    }
    if let Some(m) = memcpy_gbps {
        writeln!(
            out,
            "# memcpy_gbps = {m:.2} (ranks x size bytes copied on the same lane threads); \
             efficiency = algbw x ranks / memcpy_gbps"
        )?;
    }
    if let Some(why) = nccl_unavailable {
        writeln!(out, "# NCCL comparison unavailable: {why}")?;
    }
    if let Some(lib) = nccl {
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

/// The table of a run under MPI: the MPI library's columns.
fn mpi_table(r: &Report, out: &mut Vec<u8>) -> Result<()> {
    let Extra::Mpi {
        nodes,
        algorithm,
        mpi_library,
        zero_copy,
        shared_buffers,
        transport,
        gpu,
    } = &r.extra
    else {
        return Ok(());
    };
    writeln!(
        out,
        "# relaycc bench {} on {} ranks ({} processes, {nodes} node(s)), backend mpi, plan {}, \
         {}, {} iters after {} warmup",
        r.collective,
        r.ranks,
        r.ranks,
        algorithm.as_deref().unwrap_or("-"),
        match (gpu, zero_copy, shared_buffers) {
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
        "# MPI: {mpi_library}; relaycc's transport: {transport}"
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
        table_row(out, r, row, &extra, &cells)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_route::{Collective, DType};

    /// A measurement becomes nccl-tests' figures: algbw the size over the time, busbw times
    /// the collective's factor, the copy rate over every rank's bytes, the other library's
    /// figures in its own columns.
    #[test]
    fn rows_follow_nccl_tests_rules() {
        let req = Request::new(Collective::AllReduce, vec![0, 1, 2, 3], 250, DType::F32);
        let m = Measurement {
            secs: 1e-6,
            wrong: Some(0),
            copy_secs: Some(2e-6),
            beside_secs: Some(2e-6),
            algorithm: None,
        };
        let row = Row::of(&req, &m, false);
        assert_eq!((row.size, row.count), (1000, 250));
        assert!((row.algbw_gbps - 1.0).abs() < 1e-12);
        assert!((row.busbw_gbps - 1.5).abs() < 1e-12, "2 (n-1)/n = 1.5");
        assert!((row.memcpy_gbps.unwrap() - 2.0).abs() < 1e-12);
        assert!((row.efficiency.unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(row.vs_nccl, Some(2.0));
        assert!(row.mpi_time_us.is_none());
        let row = Row::of(&req, &m, true);
        assert!(row.nccl_time_us.is_none());
        assert_eq!(row.vs_mpi, Some(2.0));
        assert!((row.mpi_busbw_gbps.unwrap() - 0.75).abs() < 1e-12);
    }

    /// A driver that returns fixed figures, to see the report whole.
    struct Fixed(Setting);

    impl BenchDriver for Fixed {
        fn devices(&self) -> Vec<u32> {
            vec![0, 1]
        }
        fn measure(&mut self, call: &Call) -> Result<Measurement> {
            assert_eq!((call.iters, call.warmup), (1, 0), "-n 0 still times once");
            Ok(Measurement {
                secs: 1e-6 * call.request.size_bytes() as f64 / 1024.0,
                wrong: call.check.then_some(0),
                beside_secs: Some(2e-6),
                algorithm: Some(format!("ring {}", call.request.count)),
                ..Measurement::default()
            })
        }
        fn setting(&self) -> Setting {
            self.0.clone()
        }
    }

    /// Under MPI the report names the processes, nodes, plan and buffers, and its extra
    /// columns are the MPI library's; in JSON the MPI fields follow the run's.
    #[test]
    fn an_mpi_report_prints_the_mpi_columns() {
        use clap::Parser;
        let line = "relaycc bench all_gather --backend mpi -b 1K -e 2K -n 0 -w 0 --check";
        let cli = crate::args::Cli::try_parse_from(line.split_whitespace()).expect("parses");
        let crate::args::Command::Bench(mut args) = cli.command else {
            panic!("not bench");
        };
        let setting = Setting::Mpi(crate::bench_driver::MpiSetting {
            nodes: 1,
            mpi_library: "Open MPI v4.1".into(),
            zero_copy: true,
            shared_buffers: false,
            transport: "shared memory".into(),
            gpu: None,
        });
        let mut out = Vec::new();
        run(&mut Fixed(setting.clone()), &args, &[1024, 2048], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "# relaycc bench all_gather on 2 ranks (2 processes, 1 node(s)), backend mpi, \
             plan ring 256, zero copy, 0 iters after 0 warmup"
        );
        assert_eq!(
            lines[1],
            "# MPI: Open MPI v4.1; relaycc's transport: shared memory"
        );
        assert!(
            lines[2].ends_with("#wrong   mpi time  mpi bus  vs mpi"),
            "{}",
            lines[2]
        );
        let words: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(
            words,
            [
                "2048", "256", "float", "sum", "0", "2.0", "1.02", "0.51", "0", "2.0", "0.51",
                "1.00"
            ]
        );
        assert!(lines[6].starts_with("# vs mpi = MPI's time"));
        args.format = BenchFormat::Json;
        let mut out = Vec::new();
        run(&mut Fixed(setting), &args, &[1024], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys = [
            "collective",
            "backend",
            "ranks",
            "nodes",
            "dtype",
            "op",
            "root",
            "iters",
            "warmup",
            "algorithm",
            "mpi_library",
            "zero_copy",
            "shared_buffers",
            "transport",
            "results",
        ];
        let at: Vec<usize> = keys
            .iter()
            .map(|k| text.find(&format!("\n  \"{k}\":")).expect(k))
            .collect();
        assert!(at.is_sorted(), "keys out of order: {text}");
        assert_eq!(v.as_object().unwrap().len(), keys.len(), "{text}");
        assert_eq!(v["results"][0]["vs_mpi"], 2.0);
        assert!(v["results"][0].get("memcpy_gbps").is_none());
    }
}
