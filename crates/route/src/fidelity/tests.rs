//! The fidelity table as a test: every row within its tolerance or with its reason stated, the
//! median within bound, and a row that drifts past its tolerance fails.

use std::sync::OnceLock;

use super::*;

/// The whole table, evaluated once for the tests that read all of it.
fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| evaluate(None).unwrap())
}

#[test]
fn the_table_meets_its_tolerances() {
    let t = table();
    for r in &t.rows {
        println!(
            "{:<32} {:>10.2} {:>10.2} {:>+8.1}% {}",
            r.id,
            r.published,
            r.predicted.clone().unwrap_or(f64::NAN),
            100.0 * r.error.unwrap_or(f64::NAN),
            r.verdict()
        );
    }
    println!("median {:?}", t.median_abs_error);
    for r in &t.rows {
        assert!(r.predicted.is_ok(), "{}: {:?}", r.id, r.predicted);
    }
    let failures: Vec<_> = t.failures().iter().map(|r| r.id).collect();
    assert!(
        failures.is_empty(),
        "rows past tolerance without a reason: {failures:?}"
    );
    assert!(t.passes(), "median {:?}", t.median_abs_error);
}

/// A reason given for a row that the model meets is stale: the table must not excuse a row
/// that passes.
#[test]
fn no_row_gives_a_reason_it_does_not_need() {
    let t = table();
    for r in t.rows.iter().filter(|r| r.gap.is_some()) {
        assert!(
            !r.within(),
            "{} is within {:.0}% ({:+.1}%): remove its gap",
            r.id,
            100.0 * ROW_TOLERANCE,
            100.0 * r.error.unwrap_or(f64::NAN)
        );
    }
}

/// A row whose published figure sat 20% away from the prediction fails the table, in either
/// direction, while the same row at its true figure passes.
#[test]
fn a_row_drifting_past_its_tolerance_fails() {
    let row = *ROWS.iter().find(|r| r.gap.is_none()).unwrap();
    let base = evaluate_rows(&[row], None).unwrap();
    assert!(base.passes(), "{:?}", base.rows[0].error);
    let predicted = base.rows[0].predicted.clone().unwrap();
    for factor in [0.8, 1.25] {
        let drifted = Row {
            published: predicted * factor,
            ..row
        };
        let t = evaluate_rows(&[drifted], None).unwrap();
        assert_eq!(t.rows[0].verdict(), "over", "x{factor}");
        assert_eq!(t.failures().len(), 1);
        assert!(!t.passes());
        // A stated reason keeps the row in the table without failing it.
        let excused = Row {
            gap: Some("a test's reason"),
            ..drifted
        };
        let t = evaluate_rows(&[excused], None).unwrap();
        assert_eq!(t.rows[0].verdict(), "gap");
        assert!(t.failures().is_empty());
    }
}

/// Every row names a source defined in the bibliography and a preset that exists, and ids are
/// unique.
#[test]
fn rows_cite_sources_and_name_presets() {
    let refs = include_str!("../../../../docs/REFERENCES.md");
    let mut ids = std::collections::HashSet::new();
    for r in ROWS {
        assert!(ids.insert(r.id), "duplicate id {}", r.id);
        assert!(relaycc_topo::preset(r.preset).is_ok(), "{}", r.preset);
        let key = r
            .source
            .trim_start_matches('[')
            .split([',', ']', ' '])
            .next()
            .unwrap();
        assert!(
            refs.contains(&format!("**[{key}]**")),
            "{}: {key} is not in docs/REFERENCES.md",
            r.id
        );
        assert!(r.published > 0.0, "{}", r.id);
    }
}

/// A calibration applies to the rows' presets: a kind entry moves the rows on its links, and
/// one that names a link a preset lacks leaves those rows without a prediction, saying why.
#[test]
fn a_calibration_moves_the_rows_it_applies_to() {
    let cal = relaycc_topo::Calibration::parse(
        r#"{"source": "test", "kinds": [{"kind": "nvlink", "generation": 2, "gbps_per_lane": 12.0}]}"#,
        "test",
    )
    .unwrap();
    let rows: Vec<Row> = ROWS
        .iter()
        .filter(|r| ["v100-nvlink2-x2-copy", "p100-nvlink1-copy"].contains(&r.id))
        .copied()
        .collect();
    let plain = evaluate_rows(&rows, None).unwrap();
    let cal_t = evaluate_rows(&rows, Some(&cal)).unwrap();
    assert_eq!(cal_t.rates, "calibration: test");
    let v = |t: &Table, id: &str| {
        t.rows
            .iter()
            .find(|r| r.id == id)
            .unwrap()
            .predicted
            .clone()
            .unwrap()
    };
    assert!(v(&cal_t, "v100-nvlink2-x2-copy") < 0.6 * v(&plain, "v100-nvlink2-x2-copy"));
    assert_eq!(
        v(&cal_t, "p100-nvlink1-copy"),
        v(&plain, "p100-nvlink1-copy")
    );
    let absent = relaycc_topo::Calibration::parse(
        r#"{"links": [{"from": "GPU0", "to": "GPU7", "gbps": 10.0}]}"#,
        "test",
    )
    .unwrap();
    let t = evaluate_rows(&rows, Some(&absent)).unwrap();
    for r in &t.rows {
        let e = r.predicted.clone().unwrap_err();
        assert!(e.contains("calibration does not apply"), "{e}");
        assert_eq!(r.verdict(), "n/a");
    }
    assert_eq!(t.median_abs_error, None);
    assert!(!t.passes());
}
