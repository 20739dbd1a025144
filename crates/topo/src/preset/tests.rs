//! Presets against the wiring facts of [NVIDIA-DGX1], [IBM-AC922] and the vendors' documents.

use super::*;
use crate::PathClass;
use crate::graph::NodeKind;

fn class(t: &Topology, a: u32, b: u32) -> String {
    t.classify(t.gpu(a).unwrap(), t.gpu(b).unwrap()).to_string()
}

fn lanes_of(t: &Topology, g: u32) -> u32 {
    (0..t.gpu_count())
        .map(|o| t.nvlink_lanes(t.gpu(g).unwrap(), t.gpu(o).unwrap()))
        .sum()
}

#[test]
fn every_preset_builds() {
    for p in PRESETS {
        let t = preset(p.name).unwrap();
        assert!(t.gpu_count() >= 4, "{}", p.name);
        assert_eq!(t.name(), p.name);
    }
}

#[test]
fn dgx1_v100_matches_reference_wiring() {
    let t = preset("dgx1-v100").unwrap();
    assert_eq!(t.gpu_count(), 8);
    assert_eq!(class(&t, 0, 1), "NV1");
    assert_eq!(class(&t, 0, 2), "NV1");
    assert_eq!(class(&t, 0, 3), "NV2");
    assert_eq!(class(&t, 0, 4), "NV2");
    for b in [5, 6, 7] {
        assert!(!class(&t, 0, b).starts_with("NV"), "0-{b}");
    }
    assert_eq!(class(&t, 0, 7), "SYS");
    assert_eq!(class(&t, 0, 5), "SYS");
    assert_eq!(class(&t, 2, 7), "SYS");
    // GPUs in pairs under PCIe switches, two switches per socket.
    assert_eq!(class(&t, 0, 1), "NV1");
    let g0 = t.gpu(0).unwrap();
    let g1 = t.gpu(1).unwrap();
    assert_eq!(t.pcie_parent(g0), t.pcie_parent(g1));
    for g in 0..8 {
        assert_eq!(lanes_of(&t, g), 6, "GPU{g} has 6 NVLink lanes");
        assert_eq!(t.gpu_numa(g).unwrap(), Some(g / 4));
    }
    assert_eq!(t.nics().count(), 4);
    assert_eq!(t.cpus().count(), 2);
    let nic0 = t.node_by_name("mlx5_0").unwrap();
    let nic1 = t.node_by_name("mlx5_1").unwrap();
    assert_eq!(t.classify(g0, nic0), PathClass::Pix);
    assert_eq!(t.classify(g0, nic1), PathClass::Phb);
}

#[test]
fn dgx1_p100_has_four_nvlink1_per_gpu() {
    let t = preset("dgx1-p100").unwrap();
    for g in 0..8 {
        assert_eq!(lanes_of(&t, g), 4);
    }
    assert_eq!(class(&t, 0, 4), "NV1");
    assert_eq!(class(&t, 0, 5), "SYS");
}

#[test]
fn nvswitch_machines_join_every_pair() {
    for (name, gpus, lanes) in [("dgx2", 16, 6), ("dgx-a100", 8, 12), ("dgx-h100", 8, 18)] {
        let t = preset(name).unwrap();
        assert_eq!(t.gpu_count(), gpus, "{name}");
        for a in 0..gpus {
            assert!(t.behind_nvswitch(t.gpu(a).unwrap()));
            for b in 0..gpus {
                if a != b {
                    assert_eq!(class(&t, a, b), format!("NV{lanes}"), "{name} {a}-{b}");
                }
            }
        }
    }
    let t = preset("dgx-h100").unwrap();
    let g0 = t.gpu(0).unwrap();
    assert_eq!(
        t.classify(g0, t.node_by_name("mlx5_0").unwrap()),
        PathClass::Pxb
    );
    assert_eq!(
        t.classify(g0, t.node_by_name("mlx5_1").unwrap()),
        PathClass::Pxb
    );
    assert_eq!(
        t.classify(g0, t.node_by_name("mlx5_2").unwrap()),
        PathClass::Node
    );
    assert_eq!(
        t.classify(g0, t.node_by_name("mlx5_4").unwrap()),
        PathClass::Sys
    );
}

#[test]
fn ac922_has_nvlink_to_cpu_and_xbus() {
    let t = preset("ac922").unwrap();
    assert_eq!(t.gpu_count(), 4);
    assert_eq!(class(&t, 0, 1), "NV3");
    assert_eq!(class(&t, 2, 3), "NV3");
    assert_eq!(class(&t, 0, 2), "SYS");
    let cpu0 = t.node_by_name("CPU0").unwrap();
    let g0 = t.gpu(0).unwrap();
    let l = t.link(t.link_between(g0, cpu0).unwrap());
    assert!(matches!(l.kind, crate::LinkKind::Nvlink { lanes: 3, .. }));
    assert!((l.gbps - 3.0 * crate::rates::NVLINK2_LANE_GBPS).abs() < 1e-9);
    let cpu8 = t.node_by_name("CPU8").unwrap();
    let x = t.link(t.link_between(cpu0, cpu8).unwrap());
    assert_eq!(x.gbps, crate::rates::POWER9_XBUS_GBPS);
    assert_eq!(t.gpu_numa(2).unwrap(), Some(8));
    assert_eq!(
        t.classify(g0, t.node_by_name("mlx5_0").unwrap()),
        PathClass::Node
    );
}

#[test]
fn summit_node_has_two_brick_triads() {
    let t = preset("summit-node").unwrap();
    assert_eq!(t.gpu_count(), 6);
    assert_eq!(class(&t, 0, 2), "NV2");
    assert_eq!(class(&t, 0, 3), "SYS");
}

#[test]
fn pcie_boxes_have_no_nvlink() {
    let t = preset("pcie-4gpu").unwrap();
    assert_eq!(class(&t, 0, 1), "PIX");
    assert_eq!(class(&t, 0, 2), "PHB");
    let t = preset("pcie-8gpu").unwrap();
    assert_eq!(class(&t, 0, 1), "PIX");
    assert_eq!(class(&t, 0, 2), "PXB");
    assert_eq!(class(&t, 0, 4), "SYS");
    assert!(t.links().all(|(_, _, _, l)| !l.kind.is_nvlink()));
}

#[test]
fn clusters_number_gpus_across_nodes() {
    let t = preset("cluster:4xdgx1-v100:ib-edr").unwrap();
    assert_eq!(t.gpu_count(), 32);
    assert_eq!(t.host_count(), 4);
    assert_eq!(t.nics().count(), 16);
    assert_eq!(class(&t, 8, 11), "NV2");
    assert_eq!(class(&t, 0, 8), "SYS");
    assert_eq!(t.node(t.gpu(9).unwrap()).host, 1);
    assert!(t.node_by_name("node1/CPU0").is_ok());
    assert!(
        t.nodes()
            .any(|(_, n)| matches!(n.kind, NodeKind::NetSwitch))
    );
}

#[test]
fn bad_cluster_specs_are_errors() {
    for spec in [
        "cluster:",
        "cluster:4xdgx1-v100",
        "cluster:4xdgx1-v100:warp-drive",
        "cluster:0xdgx1-v100:ib-edr",
        "cluster:99999xdgx1-v100:ib-edr",
        "cluster:axdgx1-v100:ib-edr",
        "cluster:2xnope:ib-edr",
    ] {
        assert!(preset(spec).is_err(), "{spec}");
    }
}

#[test]
fn host_presets_are_arenas_of_one_socket() {
    let t = preset("host-3").unwrap();
    assert_eq!(t.name(), "host-3");
    assert_eq!(t.gpu_count(), 3);
    assert_eq!(t.cpus().count(), 1);
    assert!(t.shares_host_memory(&[0, 1, 2]));
    assert!(t.shares_host_memory(&[2]));
    assert!(!t.shares_host_memory(&[]));
    assert!(!t.shares_host_memory(&[0, 3]), "GPU3 does not exist");
    assert!(!preset("dgx1-v100").unwrap().shares_host_memory(&[0, 1]));
    // The flag survives the JSON round trip; other GPUs' JSON does not name it.
    let back = crate::import::json::parse(&crate::export::to_json(&t), "t").unwrap();
    assert!(back.shares_host_memory(&[0, 1, 2]));
    assert!(!crate::export::to_json(&preset("pcie-4gpu").unwrap()).contains("host_arena"));
    for bad in [
        "host-0",
        "host-",
        "host-x",
        "host-+2",
        "host-02",
        "host-1025",
    ] {
        let e = preset(bad).unwrap_err().to_string();
        assert!(e.contains("host-<N>"), "{bad}: {e}");
    }
    assert!(is_preset("host-1024"));
    assert!(list().iter().any(|(name, _)| name == "host-<N>"));
}
