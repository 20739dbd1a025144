//! Every preset (and a cluster, and a masked, calibrated topology) survives relaycc JSON exactly.

use relaycc_topo::{Calibration, Mask, export, import, list_presets, preset};

fn roundtrip(t: &relaycc_topo::Topology) {
    let json = export::to_json(t);
    let back =
        import::json::parse(&json, "roundtrip").unwrap_or_else(|e| panic!("{}: {e}", t.name()));
    assert_eq!(export::to_json(&back), json, "{}", t.name());
    assert_eq!(export::to_smi(&back), export::to_smi(t));
}

#[test]
fn presets_roundtrip() {
    for (name, _) in list_presets() {
        // `host-<N>` and `cluster:<N>x...` are forms, not names.
        if name.contains('<') {
            continue;
        }
        roundtrip(&preset(&name).unwrap());
    }
    roundtrip(&preset("host-4").unwrap());
    roundtrip(&preset("cluster:2xdgx-h100:ib-ndr").unwrap());
}

#[test]
fn masked_and_calibrated_roundtrip() {
    let t = preset("dgx1-v100").unwrap();
    let cal = Calibration::parse(
        r#"{"kinds":[{"kind":"pcie","gbps_per_x16":11.3,"latency_us":0.71}]}"#,
        "c",
    )
    .unwrap();
    let mut m = Mask::busy([2]);
    m.link_down("GPU0", "GPU4");
    roundtrip(&cal.apply(&t).unwrap().with_mask(m).unwrap());
}

#[test]
fn broken_json_names_the_line() {
    let t = preset("pcie-4gpu").unwrap();
    let json = export::to_json(&t);
    let cut = &json[..json.len() / 2];
    let err = import::json::parse(cut, "half.json")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("half.json:"), "{err}");
    let bad = json.replacen("\"to\": \"GPU0\"", "\"to\": \"GPU99\"", 1);
    let err = import::json::parse(&bad, "bad.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("GPU99"), "{err}");
    assert!(import::json::parse("{}", "empty.json").is_err());
}
