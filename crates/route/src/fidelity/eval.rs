//! The fidelity table's evaluation: each row's prediction on its preset (optionally
//! calibrated), its error against the published figure, and the verdict against the tolerances.

use relaycc_topo::{Calibration, Topology};
use serde::Serialize;

use super::rows::{CopyMethod, Gpus, Measure, ROWS, Row};
use crate::select::{PlanOptions, plan};
use relaycc_plan::DType;
use relaycc_plan::path::RelayPolicy;
use relaycc_plan::{Request, Transfer};
use relaycc_plan::{Result, RouteError};
use relaycc_planners::p2p::P2pStrategy;
use relaycc_sim::{SimConfig, simulate};

/// Largest relative error one row may have and still pass.
pub const ROW_TOLERANCE: f64 = 0.15;
/// Largest median relative error (absolute values) the table may have.
pub const MEDIAN_TOLERANCE: f64 = 0.10;

/// One row, evaluated.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluated {
    /// The row's id.
    pub id: &'static str,
    /// Its preset.
    pub preset: &'static str,
    /// What is measured, in words.
    pub what: String,
    /// The unit of published and predicted.
    pub unit: &'static str,
    /// The published figure.
    pub published: f64,
    /// The prediction, or why there is none (a calibration that does not apply to the preset).
    pub predicted: std::result::Result<f64, String>,
    /// `(predicted - published) / published`, when there is a prediction.
    pub error: Option<f64>,
    /// The source's bibliography key.
    pub source: &'static str,
    /// How the measured machine relates to the preset.
    pub note: &'static str,
    /// Why the model cannot meet this row, when it cannot.
    pub gap: Option<&'static str>,
}

impl Evaluated {
    /// True when the prediction is within [`ROW_TOLERANCE`] of the published figure.
    pub fn within(&self) -> bool {
        self.error.is_some_and(|e| e.abs() <= ROW_TOLERANCE)
    }
    /// The verdict as the table prints it: `ok`, `over` (outside the tolerance, with no reason
    /// given: a failure), `gap` (outside, with the reason in the table), `n/a` (no prediction).
    pub fn verdict(&self) -> &'static str {
        match (self.error, self.within(), self.gap) {
            (None, _, _) => "n/a",
            (Some(_), true, _) => "ok",
            (Some(_), false, Some(_)) => "gap",
            (Some(_), false, None) => "over",
        }
    }
}

/// The evaluated table.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// Where the rates came from: the presets' table, or a calibration file's `source`.
    pub rates: String,
    /// Every row, in [`ROWS`] order.
    pub rows: Vec<Evaluated>,
    /// Median of the absolute relative errors of the rows with a prediction.
    pub median_abs_error: Option<f64>,
    /// [`ROW_TOLERANCE`].
    pub row_tolerance: f64,
    /// [`MEDIAN_TOLERANCE`].
    pub median_tolerance: f64,
}

impl Table {
    /// Rows outside the tolerance that give no reason: each one is a failure.
    pub fn failures(&self) -> Vec<&Evaluated> {
        self.rows.iter().filter(|r| r.verdict() == "over").collect()
    }
    /// True when every row without a stated gap is within [`ROW_TOLERANCE`] and the median
    /// within [`MEDIAN_TOLERANCE`].
    pub fn passes(&self) -> bool {
        self.failures().is_empty() && self.median_abs_error.is_some_and(|m| m <= MEDIAN_TOLERANCE)
    }
}

fn describe(m: &Measure, n: usize) -> String {
    let gpus = |g: &Gpus| match g {
        Gpus::All => format!("{n} GPUs"),
        Gpus::List(l) => format!("GPUs {l:?}"),
    };
    match m {
        Measure::Copy {
            from,
            to,
            bytes,
            method,
        } => match method {
            CopyMethod::Baseline => format!("copy {from}->{to}, {}", size(*bytes)),
            CopyMethod::RelayThrough(r) => {
                format!("copy {from}->{to} relayed by GPU{r}, {}", size(*bytes))
            }
        },
        Measure::CopyBothWays { a, b, bytes } => {
            format!("copy {a}<->{b} both ways, {} each", size(*bytes))
        }
        Measure::BusBw {
            collective,
            gpus: g,
            bytes,
        } => format!("{collective} busbw, {}, {}", gpus(g), size(*bytes)),
        Measure::Time {
            collective,
            gpus: g,
            bytes,
        } => format!("{collective} time, {}, {}", gpus(g), size(*bytes)),
        Measure::MultipathGain { from, to, bytes } => {
            format!("multi-path / direct copy {from}->{to}, {}", size(*bytes))
        }
        Measure::SpeedupOverBaseline {
            collective,
            gpus: g,
            bytes,
        } => format!(
            "relaycc / NCCL-like {collective}, {}, {}",
            gpus(g),
            size(*bytes)
        ),
    }
}

fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes;
    let mut u = 0;
    while u + 1 < UNITS.len() && v >= 1024 && v.is_multiple_of(1024) {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

fn members(topo: &Topology, g: &Gpus) -> Vec<u32> {
    match g {
        Gpus::All => (0..topo.gpu_count()).collect(),
        Gpus::List(l) => l.to_vec(),
    }
}

/// An f32 collective of nccl-tests' `size` (bytes per rank's buffer, as nccl-tests counts it).
fn collective(c: relaycc_plan::Collective, gpus: Vec<u32>, bytes: u64) -> Request {
    let n = gpus.len() as u64;
    // nccl-tests' size is the whole buffer for all_reduce, and n blocks for all_gather; relaycc's
    // count is per rank (per block for all_gather), so the size they print is the same.
    let elements = bytes / DType::F32.size();
    let count = match c {
        relaycc_plan::Collective::AllGather | relaycc_plan::Collective::ReduceScatter => {
            elements / n.max(1)
        }
        _ => elements,
    };
    Request::new(c, gpus, count.max(1), DType::F32)
}

/// The NCCL-like baseline's simulated time of `req`, microseconds.
fn baseline_us(topo: &Topology, req: &Request) -> Result<f64> {
    let p = relaycc_planners::baseline_plan(topo, req)?;
    Ok(simulate(topo, &p, &SimConfig::default())?.time_us)
}

/// The prediction for `row` on `topo`, in the row's unit.
///
/// # Errors
/// Those of planning and simulating the row's request on `topo`.
pub fn predict(row: &Row, topo: &Topology) -> Result<f64> {
    match row.measure {
        Measure::Copy {
            from,
            to,
            bytes,
            method,
        } => {
            let req = Request::point_to_point(from, to, bytes);
            let us = match method {
                CopyMethod::Baseline => baseline_us(topo, &req)?,
                CopyMethod::RelayThrough(r) => {
                    let opts = PlanOptions {
                        relay: RelayPolicy::List(vec![r]),
                        strategy: P2pStrategy::Relay,
                        ..PlanOptions::default()
                    };
                    plan(topo, &req, &opts)?.predicted.time_us
                }
            };
            Ok(gbps(bytes, us))
        }
        Measure::CopyBothWays { a, b, bytes } => {
            let mut req =
                Request::new(relaycc_plan::Collective::SendRecv, vec![a, b], 0, DType::U8);
            req.transfers = vec![
                Transfer {
                    src: 0,
                    dst: 1,
                    count: bytes,
                },
                Transfer {
                    src: 1,
                    dst: 0,
                    count: bytes,
                },
            ];
            Ok(gbps(2 * bytes, baseline_us(topo, &req)?))
        }
        Measure::BusBw {
            collective: c,
            gpus,
            bytes,
        } => {
            let req = collective(c, members(topo, &gpus), bytes);
            let us = baseline_us(topo, &req)?;
            Ok(relaycc_sim::Perf::from_time(&req, us).busbw_gbps)
        }
        Measure::Time {
            collective: c,
            gpus,
            bytes,
        } => baseline_us(topo, &collective(c, members(topo, &gpus), bytes)),
        Measure::MultipathGain { from, to, bytes } => {
            let req = Request::point_to_point(from, to, bytes);
            let best = plan(topo, &req, &PlanOptions::default())?;
            let direct = plan(
                topo,
                &req,
                &PlanOptions {
                    strategy: P2pStrategy::Direct,
                    ..PlanOptions::default()
                },
            )?;
            Ok(direct.predicted.time_us / best.predicted.time_us)
        }
        Measure::SpeedupOverBaseline {
            collective: c,
            gpus,
            bytes,
        } => {
            let req = collective(c, members(topo, &gpus), bytes);
            let p = plan(topo, &req, &PlanOptions::default())?;
            Ok(p.baseline.time_us / p.predicted.time_us)
        }
    }
}

fn gbps(bytes: u64, us: f64) -> f64 {
    if us > 0.0 && us.is_finite() {
        bytes as f64 / us / 1e3
    } else {
        0.0
    }
}

/// Evaluate `row` on `topo`: the prediction and its error.
pub fn evaluate_on(row: &Row, topo: &Topology) -> Evaluated {
    let predicted = predict(row, topo).map_err(|e| e.to_string());
    evaluated(row, topo.gpu_count() as usize, predicted)
}

fn evaluated(row: &Row, gpus: usize, predicted: std::result::Result<f64, String>) -> Evaluated {
    let error = predicted
        .as_ref()
        .ok()
        .map(|p| (p - row.published) / row.published);
    Evaluated {
        id: row.id,
        preset: row.preset,
        what: describe(&row.measure, gpus),
        unit: row.measure.unit(),
        published: row.published,
        predicted,
        error,
        source: row.source,
        note: row.note,
        gap: row.gap,
    }
}

/// Evaluate `rows` on their presets, each with `calibration` applied when given.
///
/// # Errors
/// [`RouteError::BadRequest`] when a row names an unknown preset (a bug in the table). A
/// calibration that does not apply to a row's preset (a per-link entry naming a link that
/// preset lacks) is no error: that row reports why it has no prediction.
pub fn evaluate_rows(rows: &[Row], calibration: Option<&Calibration>) -> Result<Table> {
    use rayon::prelude::*;
    let evaluated: Vec<Result<Evaluated>> = rows
        .par_iter()
        .map(|row| {
            let topo = relaycc_topo::preset(row.preset)
                .map_err(|e| RouteError::BadRequest(format!("fidelity row {}: {e}", row.id)))?;
            Ok(match calibration {
                None => evaluate_on(row, &topo),
                Some(cal) => match cal.apply(&topo) {
                    Ok(t) => evaluate_on(row, &t),
                    Err(e) => evaluated(
                        row,
                        topo.gpu_count() as usize,
                        Err(format!("calibration does not apply: {e}")),
                    ),
                },
            })
        })
        .collect();
    let rows = evaluated.into_iter().collect::<Result<Vec<_>>>()?;
    let mut errs: Vec<f64> = rows.iter().filter_map(|r| r.error.map(f64::abs)).collect();
    errs.sort_by(f64::total_cmp);
    let median_abs_error = match errs.len() {
        0 => None,
        n if n % 2 == 1 => Some(errs[n / 2]),
        n => Some((errs[n / 2 - 1] + errs[n / 2]) / 2.0),
    };
    Ok(Table {
        rates: match calibration {
            None => "preset rates (crates/topo/src/rates.rs)".into(),
            Some(c) if c.source.is_empty() => "a calibration file".into(),
            Some(c) => format!("calibration: {}", c.source),
        },
        rows,
        median_abs_error,
        row_tolerance: ROW_TOLERANCE,
        median_tolerance: MEDIAN_TOLERANCE,
    })
}

/// Evaluate the whole table ([`ROWS`]).
///
/// # Errors
/// Those of [`evaluate_rows`].
pub fn evaluate(calibration: Option<&Calibration>) -> Result<Table> {
    evaluate_rows(ROWS, calibration)
}
