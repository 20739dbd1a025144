//! `relaycc validate`: the fidelity table, its formats, `--calibration`, and docs/FIDELITY.md
//! kept equal to what the command prints.

mod common;

use common::{json, relaycc, stderr, stdout};

/// docs/FIDELITY.md is `relaycc validate --format markdown`, byte for byte, so the document
/// cannot drift from the table and the model.
#[test]
fn fidelity_md_is_what_validate_prints() {
    let o = relaycc(&["validate", "--format", "markdown"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/FIDELITY.md"
    ))
    .expect("docs/FIDELITY.md exists");
    assert!(
        stdout(&o) == doc,
        "docs/FIDELITY.md is stale: regenerate it with \
         `cargo run -p relaycc-cli -- validate --format markdown > docs/FIDELITY.md`"
    );
}

/// Rows that evaluate in milliseconds, for the tests of the command's forms.
const QUICK: &str = "p100-nvlink1-copy,v100-nvlink2-x2-copy,h100-2gpu-allreduce-latency";

/// The text and JSON forms carry each row with its source and verdict; `--rows` picks rows and
/// refuses an unknown id as a usage error naming the known ones.
#[test]
fn validate_prints_rows_with_their_sources() {
    let v = json(&["validate", "--format", "json", "--rows", QUICK]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for r in rows {
        assert!(r["source"].as_str().unwrap().starts_with('['), "{r}");
        assert!(r["published"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["predicted"].as_f64().is_some(), "{r}");
        assert_ne!(r["verdict"], "over", "{r}");
    }
    let o = relaycc(&["validate", "--rows", QUICK]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for r in rows {
        assert!(text.contains(r["id"].as_str().unwrap()));
        assert!(text.contains(r["source"].as_str().unwrap()));
    }
    assert!(text.contains("median |error|"), "{text}");
    let o = relaycc(&["validate", "--rows", "p100-nvlink1-copy,warp-drive"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("warp-drive") && e.contains("v100-nvlink2-x2-copy"),
        "{e}"
    );
}

/// `--calibration` applies the file to every row's preset: halving NVLink 2 moves the V100 row,
/// leaves the P100 row, and names the calibration; a file that cannot be read is an error
/// naming it.
#[test]
fn validate_applies_a_calibration() {
    let dir = std::env::temp_dir().join(format!("relaycc-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cal = dir.join("half.cal.json");
    std::fs::write(
        &cal,
        r#"{"source": "half NVLink 2", "kinds": [{"kind": "nvlink", "generation": 2, "gbps_per_lane": 12.1}]}"#,
    )
    .unwrap();
    let plain = json(&["validate", "--format", "json", "--rows", QUICK]);
    let calibrated = json(&[
        "validate",
        "--format",
        "json",
        "--rows",
        QUICK,
        "--calibration",
        cal.to_str().unwrap(),
    ]);
    assert_eq!(calibrated["rates"], "calibration: half NVLink 2");
    let row = |v: &serde_json::Value, id: &str| {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap()["predicted"]
            .as_f64()
            .unwrap()
    };
    let (a, b) = (
        row(&plain, "v100-nvlink2-x2-copy"),
        row(&calibrated, "v100-nvlink2-x2-copy"),
    );
    assert!(b < 0.6 * a, "{a} -> {b}");
    assert_eq!(
        row(&plain, "p100-nvlink1-copy"),
        row(&calibrated, "p100-nvlink1-copy")
    );
    let missing = dir.join("absent.json");
    let o = relaycc(&["validate", "--calibration", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("absent.json"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}
