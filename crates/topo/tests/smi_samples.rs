//! The real `nvidia-smi topo -m` samples in tests/data: what each one holds, that the
//! imported graph gives back every cell of the file, and that export then import changes
//! nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;

use relaycc_topo::{NodeId, PathClass, Topology, export, import};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

fn sample_paths() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(DATA)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .ends_with(".nvidia-smi-topo.txt")
        })
        .collect();
    v.sort();
    v
}

fn load(file: &str) -> (String, Topology) {
    let path = PathBuf::from(DATA).join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let topo = import::smi::parse(&text, file).unwrap_or_else(|e| panic!("{e}"));
    (text, topo)
}

/// A deliberately naive reader of the well-formed samples, independent of the importer: device
/// labels from the header, then each row's label and cells. NIC labels go through the NIC Legend.
fn naive_cells(text: &str) -> (Vec<String>, Vec<Vec<PathClass>>) {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .filter(|t| t.ends_with(|c: char| c.is_ascii_digit()))
        .collect();
    let legend: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.trim().split_once(": "))
        .filter(|(k, _)| k.starts_with("NIC"))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect();
    let names = header
        .iter()
        .map(|l| legend.get(*l).cloned().unwrap_or(l.to_string()))
        .collect();
    let rows = (0..header.len())
        .map(|_| {
            let l = lines.next().unwrap();
            l.split_whitespace()
                .skip(1)
                .take(header.len())
                .map(|c| PathClass::parse(c).unwrap())
                .collect()
        })
        .collect();
    (names, rows)
}

fn node(t: &Topology, name: &str) -> NodeId {
    t.node_by_name(name).unwrap()
}

fn nic_names(t: &Topology) -> Vec<String> {
    let mut v: Vec<String> = t.nics().map(|(_, n)| n.name.clone()).collect();
    v.sort();
    v
}

fn lanes(t: &Topology, a: u32, b: u32) -> u32 {
    t.nvlink_lanes(t.gpu(a).unwrap(), t.gpu(b).unwrap())
}

fn numa(t: &Topology) -> Vec<u32> {
    (0..t.gpu_count())
        .map(|i| t.gpu_numa(i).unwrap().unwrap())
        .collect()
}

#[test]
fn every_sample_is_reproduced_cell_for_cell() {
    let paths = sample_paths();
    assert_eq!(paths.len(), 5, "{paths:?}");
    for p in paths {
        let file = p.file_name().unwrap().to_string_lossy().into_owned();
        let (text, topo) = load(&file);
        let (names, cells) = naive_cells(&text);
        for (a, na) in names.iter().enumerate() {
            for (b, nb) in names.iter().enumerate() {
                let got = topo.classify(node(&topo, na), node(&topo, nb));
                assert_eq!(got, cells[a][b], "{file}: cell ({na}, {nb})");
            }
        }
    }
}

#[test]
fn every_sample_survives_export_and_reimport() {
    for p in sample_paths() {
        let file = p.file_name().unwrap().to_string_lossy().into_owned();
        let (_, first) = load(&file);
        let text = export::to_smi(&first);
        let second = import::smi::parse(&text, "re-exported").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first.gpu_count(), second.gpu_count(), "{file}");
        assert_eq!(nic_names(&first), nic_names(&second), "{file}");
        let mut devices: Vec<String> = (0..first.gpu_count()).map(|i| format!("GPU{i}")).collect();
        devices.extend(nic_names(&first));
        for a in &devices {
            for b in &devices {
                assert_eq!(
                    first.classify(node(&first, a), node(&first, b)),
                    second.classify(node(&second, a), node(&second, b)),
                    "{file}: cell ({a}, {b})"
                );
            }
        }
        assert_eq!(numa(&first), numa(&second), "{file}");
    }
}

#[test]
fn dgx1_v100() {
    let (_, t) = load("dgx1-v100-4nic-microway.nvidia-smi-topo.txt");
    assert_eq!(t.gpu_count(), 8);
    assert_eq!(t.nics().count(), 4);
    assert_eq!([lanes(&t, 0, 1), lanes(&t, 0, 2)], [1, 1]);
    assert_eq!([lanes(&t, 0, 3), lanes(&t, 0, 4)], [2, 2]);
    assert_eq!(
        [lanes(&t, 0, 5), lanes(&t, 0, 6), lanes(&t, 0, 7)],
        [0, 0, 0]
    );
    let total: u32 = (1..8).map(|j| lanes(&t, 0, j)).sum();
    assert_eq!(total, 6);
    assert_eq!(numa(&t), [0, 0, 0, 0, 1, 1, 1, 1]);
    assert!(t.nvlink_lanes(t.gpu(0).unwrap(), t.gpu(1).unwrap()) > 0);
    assert!(!t.behind_nvswitch(t.gpu(0).unwrap()));
    let cpu0 = t.node_by_name("CPU0").unwrap();
    let affinity = t.node(cpu0).cpu().unwrap().affinity.clone();
    assert_eq!(affinity.as_deref(), Some("0-19,40-59"));
}

#[test]
fn hgx_h200_is_an_nvswitch_fabric() {
    let (_, t) = load("hgx-h200-12nic.nvidia-smi-topo.txt");
    assert_eq!(t.gpu_count(), 8);
    for a in 0..8 {
        assert!(t.behind_nvswitch(t.gpu(a).unwrap()));
        for b in 0..8 {
            if a != b {
                assert_eq!(lanes(&t, a, b), 18, "GPU{a}-GPU{b}");
            }
        }
    }
    let names = nic_names(&t);
    assert_eq!(names.len(), 12);
    assert!(names.contains(&"mlx5_0".to_string()) && names.contains(&"mlx5_11".to_string()));
    assert_eq!(numa(&t), [0, 0, 0, 0, 1, 1, 1, 1]);
}

#[test]
fn ibm_ac922() {
    let (_, t) = load("ibm-ac922-power9-4gpu-6nic.nvidia-smi-topo.txt");
    assert_eq!(t.gpu_count(), 4);
    assert_eq!(t.nics().count(), 6);
    assert_eq!([lanes(&t, 0, 1), lanes(&t, 2, 3)], [3, 3]);
    assert_eq!([lanes(&t, 0, 2), lanes(&t, 1, 3)], [0, 0]);
    assert_eq!(numa(&t), [0, 0, 8, 8]);
}

#[test]
fn workstation_rtx_a6000() {
    let (_, t) = load("workstation-3x-rtx-a6000-nvlink-bridge-nv4.nvidia-smi-topo.txt");
    assert_eq!(t.gpu_count(), 3);
    assert_eq!(t.nics().count(), 0);
    assert_eq!(
        [lanes(&t, 0, 1), lanes(&t, 0, 2), lanes(&t, 1, 2)],
        [4, 0, 0]
    );
    assert_eq!(numa(&t), [0, 0, 0]);
}

#[test]
fn savio_space_aligned_pcie() {
    let (_, t) = load("berkeley-savio4-8x-a5000-pcie-pxb-2nic.nvidia-smi-topo.txt");
    assert_eq!(t.gpu_count(), 8);
    assert_eq!(nic_names(&t), ["mlx5_0", "mlx5_1"]);
    assert!(t.links().all(|(_, _, _, l)| !l.kind.is_nvlink()));
    assert_eq!(numa(&t), [0, 0, 0, 0, 1, 1, 1, 1]);
    let (g2, g3) = (t.gpu(2).unwrap(), t.gpu(3).unwrap());
    assert_eq!(t.classify(g2, g3), PathClass::Pix);
}

#[test]
fn load_detects_the_format_and_names_the_topology_after_the_file() {
    let path =
        PathBuf::from(DATA).join("berkeley-savio4-8x-a5000-pcie-pxb-2nic.nvidia-smi-topo.txt");
    let t = relaycc_topo::load(path.to_str().unwrap()).unwrap();
    assert_eq!(
        t.name(),
        "berkeley-savio4-8x-a5000-pcie-pxb-2nic.nvidia-smi-topo.txt"
    );
    assert_eq!(t.gpu_count(), 8);
}

/// Text copied from a terminal: the header underlined with escape sequences
/// (`ESC[4m` ... `ESC[0m`), or with their remnants once the escape byte is lost. Each imports
/// to the same graph as the clean sample it came from.
#[test]
fn terminal_escapes_around_the_header_are_accepted() {
    for (tty, clean) in [
        (
            "dgx1-v100-4nic-microway.ansi-escapes.nvidia-smi-topo-tty.txt",
            "dgx1-v100-4nic-microway.nvidia-smi-topo.txt",
        ),
        (
            "hgx-h200-12nic.escape-remnants.nvidia-smi-topo-tty.txt",
            "hgx-h200-12nic.nvidia-smi-topo.txt",
        ),
    ] {
        let (text, got) = load(tty);
        assert!(
            text.lines().next().is_some_and(|h| h.contains("[4m")),
            "{tty} holds no escape sequence"
        );
        let (_, want) = load(clean);
        assert_eq!(export::to_smi(&got), export::to_smi(&want), "{tty}");
        assert_eq!(export::to_json(&got), export::to_json(&want), "{tty}");
    }
}
