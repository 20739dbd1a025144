//! `relaycc validate`: the fidelity table, published measurements beside the model's
//! predictions ([`relaycc_route::fidelity`]); `--format markdown` prints `docs/FIDELITY.md`.

use std::fmt::Write as _;

use anyhow::Result;
use relaycc_route::fidelity::{self, Evaluated, NOT_COVERED, ROWS, Row, Table};
use relaycc_topo::Calibration;
use serde_json::json;

use crate::args::{UsageError, ValidateArgs, ValidateFormat};

/// The rows `ids` names, in the table's order; all rows when `ids` is empty.
fn selected(ids: &[String]) -> Result<Vec<Row>> {
    if let Some(bad) = ids
        .iter()
        .find(|id| !ROWS.iter().any(|r| r.id == id.as_str()))
    {
        let known: Vec<&str> = ROWS.iter().map(|r| r.id).collect();
        return Err(UsageError(format!(
            "validate: no row {bad:?} (rows: {})",
            known.join(", ")
        ))
        .into());
    }
    Ok(ROWS
        .iter()
        .filter(|r| ids.is_empty() || ids.iter().any(|id| id == r.id))
        .copied()
        .collect())
}

/// Run `relaycc validate`.
pub fn run(args: &ValidateArgs) -> Result<String> {
    let rows = selected(&args.rows)?;
    let calibration = match &args.calibration {
        Some(path) => Some(Calibration::from_path(path)?),
        None => None,
    };
    let table = fidelity::evaluate_rows(&rows, calibration.as_ref())?;
    Ok(match args.format {
        ValidateFormat::Text => text(&table),
        ValidateFormat::Markdown => markdown(&table),
        ValidateFormat::Json => serde_json::to_string_pretty(&json_of(&table))? + "\n",
    })
}

fn figure(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn predicted(r: &Evaluated) -> String {
    match &r.predicted {
        Ok(v) => figure(*v),
        Err(_) => "-".into(),
    }
}

fn error(r: &Evaluated) -> String {
    r.error
        .map(|e| format!("{:+.1}%", 100.0 * e))
        .unwrap_or_else(|| "-".into())
}

fn median(t: &Table) -> String {
    t.median_abs_error
        .map(|m| format!("{:.1}%", 100.0 * m))
        .unwrap_or_else(|| "-".into())
}

fn summary(t: &Table) -> String {
    let count = |v: &str| t.rows.iter().filter(|r| r.verdict() == v).count();
    format!(
        "{} rows: {} within {:.0}%, {} outside with a stated reason, {} outside without one, {} \
         without a prediction; median |error| {} (bound {:.0}%): {}",
        t.rows.len(),
        count("ok"),
        100.0 * t.row_tolerance,
        count("gap"),
        count("over"),
        count("n/a"),
        median(t),
        100.0 * t.median_tolerance,
        if t.passes() { "pass" } else { "FAIL" }
    )
}

fn text(t: &Table) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# relaycc validate: published measurements vs the model ({})",
        t.rates
    );
    let _ = writeln!(
        s,
        "# {:<30} {:<13} {:>10} {:>10} {:>8}  {:<4} {:<7} source",
        "row", "preset", "published", "predicted", "error", "unit", "verdict"
    );
    for r in &t.rows {
        let _ = writeln!(
            s,
            "  {:<30} {:<13} {:>10} {:>10} {:>8}  {:<4} {:<7} {}",
            r.id,
            r.preset,
            figure(r.published),
            predicted(r),
            error(r),
            r.unit,
            r.verdict(),
            r.source
        );
    }
    for r in &t.rows {
        if let Err(e) = &r.predicted {
            let _ = writeln!(s, "# {}: {e}", r.id);
        }
    }
    let _ = writeln!(s, "# {}", summary(t));
    s
}

fn markdown(t: &Table) -> String {
    let mut s = String::new();
    s.push_str(
        "# Fidelity: the model against published measurements\n\n\
         This file is the output of `relaycc validate --format markdown` (a test checks that it\n\
         is). Each row is a published measurement of a real machine, with its source in\n\
         [REFERENCES.md](REFERENCES.md), reproduced on the preset of that machine. The prediction\n\
         is the in-model NCCL-like baseline's (what NCCL does there), or, for the figures of\n\
         [Ranganath-2019] and [Temucin-2021], relaycc's plan of the paper's method. The error is\n\
         `(predicted - published) / published`. A row passes within the row tolerance; a row\n\
         outside it says why below (`gap`), and one outside it without a reason fails the\n\
         table and its test (`over`). `relaycc validate --calibration FILE` gives the same\n\
         table with a calibration file's measured rates applied to every preset.\n\n",
    );
    let _ = writeln!(s, "Rates: {}.\n", t.rates);
    s.push_str(
        "| row | preset | measured | published | predicted | error | verdict | source |\n\
         |---|---|---|---:|---:|---:|---|---|\n",
    );
    for r in &t.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} {} | {} | {} | {} | {} |",
            r.id,
            r.preset,
            r.what,
            figure(r.published),
            r.unit,
            predicted(r),
            error(r),
            r.verdict(),
            r.source
        );
    }
    let _ = writeln!(s, "\n{}.\n", summary(t));
    s.push_str("## What each row measured\n\n");
    for r in &t.rows {
        let _ = writeln!(s, "- `{}`: {}.", r.id, r.note);
    }
    s.push_str("\n## Rows the model does not meet, and why\n\n");
    let mut any = false;
    for r in &t.rows {
        if let Some(gap) = r.gap {
            any = true;
            let _ = writeln!(s, "- `{}` ({}): {}.", r.id, error(r), gap);
        }
        if let Err(e) = &r.predicted {
            any = true;
            let _ = writeln!(s, "- `{}`: no prediction: {e}.", r.id);
        }
    }
    if !any {
        s.push_str("None.\n");
    }
    s.push_str(
        "\n## Not covered\n\nNo published figure was found for these, in the sources searched \
         (the nccl-tests and NCCL trackers, NVIDIA's documents and blogs, vendor reports, the \
         papers of relaycc's routes):\n\n",
    );
    for (preset, what) in NOT_COVERED {
        let _ = writeln!(s, "- {preset}: {what}.");
    }
    s
}

fn json_of(t: &Table) -> serde_json::Value {
    let rows: Vec<_> = t
        .rows
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "preset": r.preset,
                "measured": r.what,
                "unit": r.unit,
                "published": r.published,
                "predicted": r.predicted.as_ref().ok(),
                "why_no_prediction": r.predicted.as_ref().err(),
                "error": r.error,
                "verdict": r.verdict(),
                "source": r.source,
                "note": r.note,
                "gap": r.gap,
            })
        })
        .collect();
    json!({
        "rates": t.rates,
        "row_tolerance": t.row_tolerance,
        "median_tolerance": t.median_tolerance,
        "median_abs_error": t.median_abs_error,
        "passes": t.passes(),
        "rows": rows,
        "not_covered": NOT_COVERED.iter().map(|(p, w)| json!({"preset": p, "missing": w})).collect::<Vec<_>>(),
    })
}
