//! The NCCL topology XML samples in tests/data, read end to end.

use relaycc_topo::import::nccl_xml;
use relaycc_topo::{PathClass, Topology};

const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

fn load(file: &str) -> Topology {
    let path = format!("{SAMPLES}/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    nccl_xml::parse(&text, file).unwrap()
}

fn class(t: &Topology, a: &str, b: &str) -> PathClass {
    t.classify(t.node_by_name(a).unwrap(), t.node_by_name(b).unwrap())
}

#[test]
fn azure_ndv2_v100() {
    let t = load("azure-ndv2-v100.nccl-topo.xml");
    assert_eq!(t.gpu_count(), 8);
    assert_eq!(t.name(), "azure-ndv2-v100.nccl-topo.xml");
    // No nvlink elements: no NVLink at all.
    assert!(t.links().all(|(_, _, _, l)| !l.kind.is_nvlink()));
    let nics: Vec<_> = t.nics().collect();
    assert_eq!(nics.len(), 1);
    assert_eq!(nics[0].1.name, "nic0");
    assert_eq!(nics[0].1.pci_bus_id.as_deref(), Some("0101:00:00.0"));
    assert_eq!(nics[0].1.numa, Some(0));
    for i in 0..8 {
        let want = if i < 4 { 0 } else { 1 };
        assert_eq!(t.gpu_numa(i).unwrap(), Some(want), "GPU{i}");
        let info = t.gpu_info(i).unwrap();
        assert_eq!(info.compute_capability, None);
        assert_eq!(
            info.pci_bus_id.as_deref(),
            Some(format!("000{}:00:00.0", i + 1).as_str())
        );
    }
    assert_eq!(t.cpus().count(), 2);
    // GPUs hang directly from their socket's root ports.
    assert_eq!(class(&t, "GPU0", "GPU3"), PathClass::Phb);
    assert_eq!(class(&t, "GPU4", "GPU7"), PathClass::Phb);
    assert_eq!(class(&t, "GPU0", "GPU4"), PathClass::Sys);
    assert_eq!(class(&t, "GPU0", "nic0"), PathClass::Phb);
    assert_eq!(class(&t, "GPU5", "nic0"), PathClass::Sys);
    // 16 GT/s x16 is PCIe 4.
    let g0 = t.gpu(0).unwrap();
    let up = t.link_between(g0, t.pcie_parent(g0).unwrap()).unwrap();
    assert_eq!(t.link(up).kind.label(), "PCIe4 x16");
}

#[test]
fn hgx_a100_nvswitch_dump() {
    let t = load("hgx-a100-80gb-nvswitch-5bondnic.nccl-topo-dump.xml");
    assert_eq!(t.gpu_count(), 8);
    for a in 0..8 {
        let info = t.gpu_info(a).unwrap();
        assert_eq!(info.compute_capability.map(|c| c.sm()), Some(80));
        // GPUs 0-3 sit in the first <cpu numaid="0">, 4-7 in the second.
        assert_eq!(
            t.gpu_numa(a).unwrap(),
            Some(if a < 4 { 0 } else { 1 }),
            "GPU{a}"
        );
        for b in 0..8 {
            if a != b {
                let (x, y) = (t.gpu(a).unwrap(), t.gpu(b).unwrap());
                assert_eq!(t.nvlink_lanes(x, y), 12, "GPU{a}-GPU{b}");
                assert_eq!(t.classify(x, y), PathClass::NvLink(12));
            }
        }
        assert!(t.behind_nvswitch(t.gpu(a).unwrap()));
    }
    let switches = t
        .nodes()
        .filter(|(_, n)| matches!(n.kind, relaycc_topo::NodeKind::NvSwitch))
        .count();
    assert_eq!(switches, 6);
    let g0 = t.gpu(0).unwrap();
    let nvl = t
        .links_from(g0)
        .find(|(_, _, l)| l.kind.is_nvlink())
        .map(|(_, _, l)| l.kind.label());
    assert_eq!(nvl.as_deref(), Some("NVLink3 x2"));

    let mut names: Vec<_> = t.nics().map(|(_, n)| n.name.clone()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "mlx5_bond_0",
            "mlx5_bond_1",
            "mlx5_bond_2",
            "mlx5_bond_3",
            "mlx5_bond_4"
        ]
    );
    let nic = t.nics().find(|(_, n)| n.name == "mlx5_bond_1").unwrap().1;
    assert_eq!(nic.gbps, 25.0);
    assert_eq!(nic.numa, Some(0));
    assert_eq!(nic.pci_bus_id.as_deref(), Some("0000:1a:00.0"));

    // GPU0 shares the top switch 0c with mlx5_bond_1 (several switches between: PXB); bond_0
    // hangs from the root port of the same socket (PHB); the other socket's NICs are SYS.
    assert_eq!(class(&t, "GPU0", "mlx5_bond_1"), PathClass::Pxb);
    assert_eq!(class(&t, "GPU1", "mlx5_bond_1"), PathClass::Pxb);
    assert_eq!(class(&t, "GPU0", "mlx5_bond_0"), PathClass::Phb);
    assert_eq!(class(&t, "GPU0", "mlx5_bond_3"), PathClass::Sys);
    assert_eq!(class(&t, "GPU6", "mlx5_bond_4"), PathClass::Pxb);
    assert_eq!(class(&t, "mlx5_bond_1", "mlx5_bond_2"), PathClass::Phb);
    // Nested switches: GPU0 -> 11 -> 0e -> 0c -> CPU0.
    let mut depth = 0;
    let mut cur = g0;
    while let Some(p) = t.pcie_parent(cur) {
        depth += 1;
        cur = p;
    }
    assert_eq!(depth, 4);
    assert_eq!(t.node(cur).name, "CPU0");
}

/// A topology file of the kind cloud VM images ship, whose GPU0 lists an `<nvlink>` to its own
/// bus id. NCCL loads it; so does relaycc, without the self link and with a warning naming
/// the line. The other NVLinks are the DGX-1 (V100) hybrid cube-mesh.
#[test]
fn nvlink_to_the_gpus_own_bus_id_is_ignored_with_a_warning() {
    let t = load("azure-ndv2-v100.nvlink-self-link.nccl-topo.xml");
    assert_eq!(t.gpu_count(), 8);
    assert_eq!(t.warnings().len(), 1, "{:?}", t.warnings());
    let w = &t.warnings()[0];
    assert!(
        w.contains("azure-ndv2-v100.nvlink-self-link.nccl-topo.xml:5:")
            && w.contains("GPU0")
            && w.contains("own bus id 0001:00:00.0")
            && w.contains("ignored"),
        "{w}"
    );
    let dgx1 = relaycc_topo::preset("dgx1-v100").unwrap();
    for a in 0..8 {
        for b in 0..8 {
            let (x, y) = (t.gpu(a).unwrap(), t.gpu(b).unwrap());
            let (p, q) = (dgx1.gpu(a).unwrap(), dgx1.gpu(b).unwrap());
            assert_eq!(
                t.nvlink_lanes(x, y),
                if a == b { 0 } else { dgx1.nvlink_lanes(p, q) },
                "GPU{a}-GPU{b}"
            );
        }
    }
    // GPU0's lanes: 6, the V100's count, with nothing added for the self link.
    let g0 = t.gpu(0).unwrap();
    let lanes: u32 = (1..8).map(|b| t.nvlink_lanes(g0, t.gpu(b).unwrap())).sum();
    assert_eq!(lanes, 6);
    // The samples without such a link carry no warning.
    assert!(load("azure-ndv2-v100.nccl-topo.xml").warnings().is_empty());
    assert!(
        load("hgx-a100-80gb-nvswitch-5bondnic.nccl-topo-dump.xml")
            .warnings()
            .is_empty()
    );
}
