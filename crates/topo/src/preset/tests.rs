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
        "cluster:2xdgx-h100:ib-ndr:mesh",
        "cluster:2xdgx-h100:ib-ndr:rail=1:2",
        "cluster:2xdgx-h100:ib-ndr:fat-tree=0:1",
        "cluster:2xdgx-h100:ib-ndr:fat-tree=2",
        "cluster:2xdgx-h100:ib-ndr:fat-tree=99:1",
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

#[test]
fn nvswitch_presets_are_gpus_on_one_switch() {
    let t = preset("nvswitch-5").unwrap();
    assert_eq!(t.name(), "nvswitch-5");
    assert_eq!(t.gpu_count(), 5);
    assert_eq!(t.cpus().count(), 1);
    assert!(!t.shares_host_memory(&[0, 1, 2]), "GPUs, not host arenas");
    // Every pair is joined through the one switch, 18 links wide.
    let switches = t
        .nodes()
        .filter(|(_, n)| matches!(n.kind, crate::NodeKind::NvSwitch))
        .count();
    assert_eq!(switches, 1);
    for (a, b) in [(0, 1), (0, 4), (2, 3)] {
        let lanes = t.nvlink_lanes(t.gpu(a).unwrap(), t.gpu(b).unwrap());
        assert_eq!(lanes, 18, "GPU{a}-GPU{b}");
    }
    for bad in [
        "nvswitch-0",
        "nvswitch-",
        "nvswitch-x",
        "nvswitch-07",
        "nvswitch-1025",
    ] {
        let e = preset(bad).unwrap_err().to_string();
        assert!(e.contains("nvswitch-<N>"), "{bad}: {e}");
    }
    assert!(is_preset("nvswitch-1024"));
    assert!(list().iter().any(|(name, _)| name == "nvswitch-<N>"));
}

/// (preset, GPUs, NVLink lanes per GPU, NVSwitch chips, NICs, CPU sockets), each from the
/// preset's sources: [NVIDIA-DGXB200], [NVIDIA-H200], [NVIDIA-GB200NVL72],
/// [JSC-Jupiter], [NVIDIA-EnterpriseRA], [NCCL-Issue1127].
const CURRENT: [(&str, u32, u32, usize, usize, usize); 7] = [
    ("dgx-b200", 8, 18, 2, 8, 2),
    ("hgx-h200", 8, 18, 4, 8, 2),
    ("gb200-nvl72", 72, 18, 18, 72, 36),
    ("gh200-quad", 4, 18, 0, 4, 4),
    ("l40s-8gpu", 8, 0, 0, 4, 2),
    ("rtx4090-8gpu", 8, 0, 0, 2, 2),
    ("rtx5090-8gpu", 8, 0, 0, 2, 2),
];

/// NVLink lanes leaving a GPU, to peers and to switch chips alike.
fn gpu_nvlink_lanes(t: &Topology, g: u32) -> u32 {
    t.links_from(t.gpu(g).unwrap())
        .map(|(_, _, l)| match l.kind {
            crate::LinkKind::Nvlink { lanes, .. } => lanes,
            _ => 0,
        })
        .sum()
}

fn nvswitches(t: &Topology) -> usize {
    t.nodes()
        .filter(|(_, n)| matches!(n.kind, NodeKind::NvSwitch))
        .count()
}

#[test]
fn current_presets_match_their_sources() {
    for (name, gpus, lanes, switches, nics, cpus) in CURRENT {
        let t = preset(name).unwrap();
        assert_eq!(t.gpu_count(), gpus, "{name} GPUs");
        for g in 0..gpus {
            assert_eq!(gpu_nvlink_lanes(&t, g), lanes, "{name} GPU{g} NVLink lanes");
        }
        assert_eq!(nvswitches(&t), switches, "{name} NVSwitch chips");
        assert_eq!(t.nics().count(), nics, "{name} NICs");
        assert_eq!(t.cpus().count(), cpus, "{name} CPU sockets");
    }
}

#[test]
fn nvlink5_machines_give_every_pair_18_links_of_50_gbps() {
    for name in ["dgx-b200", "gb200-nvl72"] {
        let t = preset(name).unwrap();
        let n = t.gpu_count();
        for (a, b) in [(0, 1), (0, n - 1), (n / 2, 3)] {
            assert_eq!(class(&t, a, b), "NV18", "{name} {a}-{b}");
        }
        let g0 = t.gpu(0).unwrap();
        let port: f64 = t
            .links_from(g0)
            .filter(|(_, _, l)| l.kind.is_nvlink())
            .map(|(_, _, l)| l.gbps)
            .sum();
        // 18 links x 50 GB/s = 900 GB/s per direction nominal, 1.8 TB/s bidirectional; the
        // model carries NCCL's achievable rate per link.
        assert!((port - 18.0 * crate::rates::NVLINK5_LANE_GBPS).abs() < 1e-9);
        assert!((18.0 * crate::rates::NVLINK5_LANE_NOMINAL_GBPS - 900.0).abs() < 1e-9);
    }
}

#[test]
fn grace_machines_join_gpus_to_grace_by_c2c() {
    let t = preset("gb200-nvl72").unwrap();
    // Two GPUs per Grace, each with half the superchip's C2C.
    let g0 = t.gpu(0).unwrap();
    let g1 = t.gpu(1).unwrap();
    let cpu = t.attached_cpu(g0).unwrap();
    assert_eq!(t.attached_cpu(g1), Some(cpu));
    assert_ne!(t.attached_cpu(t.gpu(2).unwrap()), Some(cpu));
    let c2c = t.link(t.link_between(g0, cpu).unwrap());
    assert_eq!(c2c.kind, crate::LinkKind::C2c);
    assert_eq!(c2c.gbps, crate::rates::NVLINK_C2C_GB200_PER_GPU_GBPS);
    assert_eq!(t.classify(g0, t.gpu(71).unwrap()).to_string(), "NV18");

    let t = preset("gh200-quad").unwrap();
    for a in 0..4 {
        let ga = t.gpu(a).unwrap();
        let grace = t.attached_cpu(ga).unwrap();
        let l = t.link(t.link_between(ga, grace).unwrap());
        assert_eq!(l.kind, crate::LinkKind::C2c);
        assert_eq!(l.gbps, crate::rates::NVLINK_C2C_GBPS);
        for b in 0..4 {
            if a != b {
                assert_eq!(class(&t, a, b), "NV6", "{a}-{b}");
                let other = t.attached_cpu(t.gpu(b).unwrap()).unwrap();
                let x = t.link(t.link_between(grace, other).unwrap());
                assert_eq!(x.gbps, crate::rates::GRACE_CNVLINK_GBPS);
            }
        }
    }
}

#[test]
fn geforce_boxes_refuse_peer_to_peer_and_l40s_grants_it() {
    for name in ["rtx4090-8gpu", "rtx5090-8gpu"] {
        let t = preset(name).unwrap();
        assert!(t.links().all(|(_, _, _, l)| !l.kind.is_nvlink()), "{name}");
        for a in 0..8 {
            assert!(!t.gpu_info(a).unwrap().pcie_p2p, "{name} GPU{a}");
            let ga = t.gpu(a).unwrap();
            assert!(!t.pcie_peer_ok(ga, t.gpu((a + 1) % 8).unwrap()));
            // Host memory is still reachable: staging goes through it.
            assert!(t.pcie_peer_ok(ga, t.attached_cpu(ga).unwrap()));
        }
        assert_eq!(class(&t, 0, 1), "PHB", "{name}");
        assert_eq!(class(&t, 0, 4), "SYS", "{name}");
    }
    let uplink = |name: &str| {
        let t = preset(name).unwrap();
        let g0 = t.gpu(0).unwrap();
        let up = t.link(t.link_between(g0, t.pcie_parent(g0).unwrap()).unwrap());
        match up.kind {
            crate::LinkKind::Pcie { generation, width } => (generation, width),
            other => panic!("{name}: GPU0 uplink is {other:?}"),
        }
    };
    assert_eq!(uplink("rtx4090-8gpu"), (4, 16));
    assert_eq!(uplink("rtx5090-8gpu"), (5, 16));
    assert_eq!(uplink("l40s-8gpu"), (4, 16));
    let t = preset("l40s-8gpu").unwrap();
    assert!(
        t.gpu_nodes()
            .iter()
            .all(|g| t.node(*g).gpu().unwrap().pcie_p2p)
    );
    assert_eq!(class(&t, 0, 1), "PIX");
    assert_eq!(class(&t, 0, 2), "PHB");
    assert_eq!(class(&t, 0, 4), "SYS");
}

#[test]
fn current_presets_form_two_node_clusters() {
    for (name, gpus, _, switches, nics, _) in CURRENT {
        let spec = format!("cluster:2x{name}:ib-ndr");
        let t = preset(&spec).unwrap();
        assert_eq!(t.gpu_count(), 2 * gpus, "{spec}");
        assert_eq!(t.host_count(), 2, "{spec}");
        assert_eq!(t.nics().count(), 2 * nics, "{spec}");
        assert_eq!(nvswitches(&t), 2 * switches, "{spec}");
        assert_eq!(t.node(t.gpu(gpus).unwrap()).host, 1, "{spec}");
    }
}

#[test]
fn pcie_p2p_survives_json_and_defaults_to_granted() {
    let t = preset("rtx4090-8gpu").unwrap();
    let json = crate::export::to_json(&t);
    assert!(
        json.contains("\"pcie_p2p\": false"),
        "refusal is written out"
    );
    let back = crate::import::json::parse(&json, "rtx").unwrap();
    assert!(!back.gpu_info(3).unwrap().pcie_p2p);
    let json = crate::export::to_json(&preset("dgx-h100").unwrap());
    assert!(
        !json.contains("pcie_p2p"),
        "granted is the default and not written"
    );
    let back = crate::import::json::parse(&json, "dgx").unwrap();
    assert!(back.gpu_info(0).unwrap().pcie_p2p);
}

/// Switches named `prefix<i>`, and the links from NICs to them.
fn switches_named(t: &Topology, prefix: &str) -> Vec<NodeId> {
    t.nodes()
        .filter(|(_, n)| matches!(n.kind, NodeKind::NetSwitch) && n.name.starts_with(prefix))
        .map(|(id, _)| id)
        .collect()
}

/// The switch NIC `name` is cabled to, and the link's rate.
fn nic_switch(t: &Topology, name: &str) -> (String, f64) {
    let nic = t.node_by_name(name).unwrap();
    let (_, to, l) = t
        .links_from(nic)
        .find(|(_, to, _)| matches!(t.node(*to).kind, NodeKind::NetSwitch))
        .unwrap();
    (t.node(to).name.clone(), l.gbps)
}

/// Links between two switches of the fabric: (count of directed links, their rates).
fn switch_links(t: &Topology) -> Vec<f64> {
    t.links()
        .filter(|(_, a, b, _)| {
            matches!(t.node(*a).kind, NodeKind::NetSwitch)
                && matches!(t.node(*b).kind, NodeKind::NetSwitch)
        })
        .map(|(_, _, _, l)| l.gbps)
        .collect()
}

#[test]
fn default_layout_is_one_switch() {
    for spec in [
        "cluster:2xdgx-h100:ib-ndr",
        "cluster:2xdgx-h100:ib-ndr:switch",
    ] {
        let t = preset(spec).unwrap();
        assert_eq!(switches_named(&t, "NetSwitch").len(), 1, "{spec}");
        assert_eq!(
            nic_switch(&t, "node1/mlx5_5"),
            ("NetSwitch0".to_string(), 50.0)
        );
        assert!(switch_links(&t).is_empty());
    }
}

#[test]
fn rail_fabric_of_four_scalable_units_matches_the_superpod() {
    // [NVIDIA-SuperPOD]: 4 SUs, 128 DGX nodes: 32 leaves, 16 spines, 1,024 node-leaf and
    // 1,024 leaf-spine cables.
    let t = preset("cluster:128xdgx-h100:ib-ndr:rail").unwrap();
    assert_eq!(t.host_count(), 128);
    assert_eq!(t.gpu_count(), 1024);
    assert_eq!(t.nics().count(), 1024);
    assert_eq!(switches_named(&t, "Leaf").len(), 32);
    assert_eq!(switches_named(&t, "Spine").len(), 16);
    // Every leaf reaches every spine over two NDR ports (100 GB/s), both directions.
    let up = switch_links(&t);
    assert_eq!(up.len(), 2 * 32 * 16);
    assert!(up.iter().all(|g| (g - 100.0).abs() < 1e-9), "{up:?}");
    let cables: f64 = up.iter().sum::<f64>() / 2.0 / 50.0;
    assert!((cables - 1024.0).abs() < 1e-9);
    // NIC i of every node of a unit is on the unit's leaf i.
    assert_eq!(nic_switch(&t, "node0/mlx5_3"), ("Leaf3".to_string(), 50.0));
    assert_eq!(nic_switch(&t, "node31/mlx5_3").0, "Leaf3");
    assert_eq!(nic_switch(&t, "node32/mlx5_3").0, "Leaf11");
    assert_eq!(nic_switch(&t, "node127/mlx5_7").0, "Leaf31");
    assert!((t.nics().next().unwrap().1.gbps - 50.0).abs() < 1e-9);
}

#[test]
fn oversubscribed_fat_tree_thins_the_up_links() {
    // QM9700, 64 ports; 2:1 leaves take 42 NICs and 21 ports' worth of up-links.
    let t = preset("cluster:16xdgx-h100:ib-ndr:fat-tree=2:1").unwrap();
    assert_eq!(t.nics().count(), 128);
    assert_eq!(switches_named(&t, "Leaf").len(), 4);
    assert_eq!(switches_named(&t, "Spine").len(), 2);
    let up = switch_links(&t);
    assert_eq!(up.len(), 2 * 4 * 2);
    assert!(
        up.iter().all(|g| (g - 21.0 * 50.0 / 2.0).abs() < 1e-9),
        "{up:?}"
    );
    // NICs fill leaves in node order: node 5's NICs are numbers 40..47, on leaves 0 and 1.
    assert_eq!(nic_switch(&t, "node5/mlx5_1").0, "Leaf0");
    assert_eq!(nic_switch(&t, "node5/mlx5_2").0, "Leaf1");
    // Non-blocking: 32 NICs a leaf, up-links as wide as down-links.
    let t = preset("cluster:16xdgx-h100:ib-ndr:fat-tree").unwrap();
    assert_eq!(switches_named(&t, "Leaf").len(), 4);
    assert_eq!(switches_named(&t, "Spine").len(), 2);
    let per_leaf: f64 = switch_links(&t).iter().sum::<f64>() / 2.0 / 4.0;
    assert!((per_leaf - 32.0 * 50.0).abs() < 1e-9);
    // HDR leaves have 40 ports; 4:1 gives 32 down and 8 up.
    let t = preset("cluster:8xdgx-a100:ib-hdr:fat-tree=4:1").unwrap();
    assert_eq!(switches_named(&t, "Leaf").len(), 2);
    let per_leaf: f64 = switch_links(&t).iter().sum::<f64>() / 2.0 / 2.0;
    assert!((per_leaf - 8.0 * 25.0).abs() < 1e-9);
}

#[test]
fn racks_of_nvlink_domains_join_by_rails() {
    let t = preset("cluster:2xgb200-nvl72:ib-ndr:rail").unwrap();
    assert_eq!(t.gpu_count(), 144);
    assert_eq!(t.host_count(), 2);
    assert_eq!(t.nics().count(), 144);
    // One scalable unit: a leaf per rail (72), half as many spines.
    assert_eq!(switches_named(&t, "Leaf").len(), 72);
    assert_eq!(switches_named(&t, "Spine").len(), 36);
    assert_eq!(nic_switch(&t, "node1/mlx5_70").0, "Leaf70");
    // The rack stays one NVLink domain; racks meet only over the network.
    assert_eq!(class(&t, 72, 143), "NV18");
    assert_eq!(class(&t, 0, 72), "SYS");
}

/// (preset, GPUs, NVLink lanes per GPU, NVSwitch chips, NICs, CPU sockets) for the machines
/// before the current generation, each from its source: [NVIDIA-DGX1] (4 EDR NICs, two
/// sockets, no switch), [NVIDIA-A100] (6 NVSwitches, 12 NVLink 3 lanes), [NVIDIA-H100] (4
/// NVSwitch chips, 18 NVLink 4 lanes), [IBM-AC922] (6 bricks per V100: 3 to the peer GPU, 3
/// to the CPU; Summit's 6-GPU node 2 + 2 + 2; one dual-port EDR card per socket, two NIC ports
/// each, as the AC922 sample in [Topo-Samples] prints), and the DGX-2's 12 NVSwitches and 16 GPUs of
/// two baseboards (the preset's doc).
const EARLIER: [(&str, u32, u32, usize, usize, usize); 7] = [
    ("dgx1-p100", 8, 4, 0, 4, 2),
    ("dgx1-v100", 8, 6, 0, 4, 2),
    ("dgx2", 16, 6, 12, 8, 2),
    ("dgx-a100", 8, 12, 6, 8, 2),
    ("dgx-h100", 8, 18, 4, 8, 2),
    ("ac922", 4, 6, 0, 4, 2),
    ("summit-node", 6, 6, 0, 4, 2),
];

#[test]
fn earlier_presets_match_their_sources() {
    for (name, gpus, lanes, switches, nics, cpus) in EARLIER {
        let t = preset(name).unwrap();
        assert_eq!(t.gpu_count(), gpus, "{name} GPUs");
        for g in 0..gpus {
            assert_eq!(gpu_nvlink_lanes(&t, g), lanes, "{name} GPU{g} NVLink lanes");
        }
        assert_eq!(nvswitches(&t), switches, "{name} NVSwitch chips");
        assert_eq!(t.nics().count(), nics, "{name} NICs");
        assert_eq!(t.cpus().count(), cpus, "{name} CPU sockets");
    }
}

/// Per GPU, the NVLink lanes to each switch chip and the port's rate per direction, and each
/// NIC's port rate, as the current machines' sources give them: [NVIDIA-DGXB200] (2 chips x 9
/// lanes of NVLink 5, 900 GB/s; ConnectX-7 at 400 Gb/s), [NVIDIA-H200] (the H100 board: 5, 4,
/// 4, 5 lanes of NVLink 4, 450 GB/s; NDR), [NVIDIA-GB200NVL72] and [NVIDIA-GB200Tuning] (18
/// chips x 1 lane of NVLink 5; ConnectX-7 at 400 Gb/s), [JSC-Jupiter] (6 NVLink 4 lanes to
/// each of 3 peers, 150 GB/s per pair and direction; NDR200), [NVIDIA-EnterpriseRA] (400 Gb/s
/// east-west NICs), and the GeForce boxes' 100 GbE NIC per socket (their modelling choice in
/// docs/REFERENCES.md).
#[test]
fn current_presets_have_their_sources_lanes_per_switch_and_port_rates() {
    use crate::rates::{
        ETH_100G_GBPS, IB_NDR_GBPS, IB_NDR200_GBPS, NVLINK4_LANE_GBPS, NVLINK5_LANE_GBPS,
    };
    let cases: [(&str, &[u32], f64, f64); 7] = [
        ("dgx-b200", &[9, 9], 18.0 * NVLINK5_LANE_GBPS, IB_NDR_GBPS),
        (
            "hgx-h200",
            &[5, 4, 4, 5],
            18.0 * NVLINK4_LANE_GBPS,
            IB_NDR_GBPS,
        ),
        (
            "gb200-nvl72",
            &[1; 18],
            18.0 * NVLINK5_LANE_GBPS,
            IB_NDR_GBPS,
        ),
        ("gh200-quad", &[], 18.0 * NVLINK4_LANE_GBPS, IB_NDR200_GBPS),
        ("l40s-8gpu", &[], 0.0, IB_NDR_GBPS),
        ("rtx4090-8gpu", &[], 0.0, ETH_100G_GBPS),
        ("rtx5090-8gpu", &[], 0.0, ETH_100G_GBPS),
    ];
    for (name, per_switch, port_gbps, nic_gbps) in cases {
        let t = preset(name).unwrap();
        for g in 0..t.gpu_count() {
            let id = t.gpu(g).unwrap();
            let mut to_switches: Vec<u32> = t
                .links_from(id)
                .filter_map(|(_, to, l)| match (l.kind, &t.node(to).kind) {
                    (crate::LinkKind::Nvlink { lanes, .. }, NodeKind::NvSwitch) => Some(lanes),
                    _ => None,
                })
                .collect();
            let mut want = per_switch.to_vec();
            to_switches.sort_unstable();
            want.sort_unstable();
            assert_eq!(to_switches, want, "{name} GPU{g} lanes per switch chip");
            let port: f64 = t
                .links_from(id)
                .filter(|(_, _, l)| l.kind.is_nvlink())
                .map(|(_, _, l)| l.gbps)
                .sum();
            assert!(
                (port - port_gbps).abs() < 1e-9,
                "{name} GPU{g}: {port} GB/s"
            );
        }
        for (_, nic) in t.nics() {
            assert_eq!(nic.gbps, nic_gbps, "{name} {}", nic.name);
        }
    }
    // Four GPUs per GB200 compute tray, two per Grace: 36 Graces for 72 GPUs, each Grace with
    // two GPUs and two of its tray's four NICs ([NVIDIA-GB200Tuning]).
    let t = preset("gb200-nvl72").unwrap();
    for c in 0..36 {
        let a = t.attached_cpu(t.gpu(2 * c).unwrap()).unwrap();
        assert_eq!(
            t.attached_cpu(t.gpu(2 * c + 1).unwrap()),
            Some(a),
            "Grace {c}"
        );
    }
    // Every GH200 pair is joined directly by 6 lanes: 150 GB/s per direction nominal
    // ([JSC-Jupiter]), carried at the table's achievable rate per lane.
    assert!((6.0 * crate::rates::NVLINK4_LANE_NOMINAL_GBPS - 150.0).abs() < 1e-9);
    let t = preset("gh200-quad").unwrap();
    for a in 0..4 {
        for b in 0..4 {
            if a != b {
                let l = t.link(
                    t.link_between(t.gpu(a).unwrap(), t.gpu(b).unwrap())
                        .unwrap(),
                );
                assert!(
                    matches!(l.kind, crate::LinkKind::Nvlink { lanes: 6, .. }),
                    "{a}-{b}: {:?}",
                    l.kind
                );
                assert!(
                    (l.gbps - 6.0 * NVLINK4_LANE_GBPS).abs() < 1e-9,
                    "{a}-{b}: {}",
                    l.gbps
                );
            }
        }
    }
}
