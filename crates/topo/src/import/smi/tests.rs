//! Unit tests of the nvidia-smi importer: one per quirk of the format, one per refusal.

use super::matrix::{self, Matrix};
use super::parse;
use crate::classify::PathClass;
use crate::graph::{NodeId, Topology};

/// The node of a matrix device in the imported graph.
fn node_of(t: &Topology, m: &Matrix, d: usize) -> NodeId {
    let dev = &m.devices[d];
    match dev.gpu {
        Some(i) => t.gpu(i).unwrap(),
        None => t.node_by_name(&dev.nic_name).unwrap(),
    }
}

/// Parse `text` and check the graph gives back every cell; returns the graph.
fn check(text: &str) -> Topology {
    let m = matrix::read(text, "t").unwrap_or_else(|e| panic!("{e}"));
    let t = parse(text, "t").unwrap_or_else(|e| panic!("{e}"));
    for a in 0..m.devices.len() {
        for b in 0..m.devices.len() {
            let got = t.classify(node_of(&t, &m, a), node_of(&t, &m, b));
            assert_eq!(
                got, m.cells[a][b],
                "cell ({}, {})",
                m.devices[a].label, m.devices[b].label
            );
        }
    }
    let again = parse(&crate::export::to_smi(&t), "again").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.gpu_count(), t.gpu_count());
    assert_eq!(again.nics().count(), t.nics().count());
    for a in 0..m.devices.len() {
        for b in 0..m.devices.len() {
            let (x, y) = (node_of(&t, &m, a), node_of(&t, &m, b));
            let (p, q) = (node_of(&again, &m, a), node_of(&again, &m, b));
            assert_eq!(t.classify(x, y), again.classify(p, q));
        }
    }
    t
}

/// Parse `text`, expect a parse error on `line` whose message contains `what`.
fn refuse(text: &str, line: usize, what: &str) {
    let err = parse(text, "bad.txt").expect_err("should be refused");
    let msg = err.to_string();
    assert!(msg.starts_with(&format!("bad.txt:{line}: ")), "{msg}");
    assert!(msg.contains(what), "{msg}");
}

fn lanes(t: &Topology, a: u32, b: u32) -> u32 {
    t.nvlink_lanes(t.gpu(a).unwrap(), t.gpu(b).unwrap())
}

const PAIR: &str = "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\n\
GPU0\t X \tNV2\tPIX\t0-7\t0\n\
GPU1\tNV2\t X \tPHB\t0-7\t0\n\
mlx5_0\tPIX\tPHB\t X \n";

#[test]
fn tab_separated_with_nic_and_affinity() {
    let t = check(PAIR);
    assert_eq!(lanes(&t, 0, 1), 2);
    assert_eq!(t.gpu_numa(1).unwrap(), Some(0));
    let cpu = t.node_by_name("CPU0").unwrap();
    assert_eq!(t.node(cpu).cpu().unwrap().affinity.as_deref(), Some("0-7"));
}

#[test]
fn glued_header_labels() {
    let t = check(
        "      GPU0GPU1GPU2mlx5_0mlx5_1CPU Affinity\n\
         GPU0   X  PIX  SYS  PIX  SYS  0-7\n\
         GPU1  PIX   X  SYS  PIX  SYS  0-7\n\
         GPU2  SYS  SYS   X  SYS  PIX  8-15\n\
         mlx5_0 PIX  PIX  SYS  X  SYS\n\
         mlx5_1 SYS  SYS  PIX  SYS  X\n",
    );
    assert_eq!(t.gpu_count(), 3);
    assert!(t.node_by_name("mlx5_1").is_ok());
    let m = matrix::read(
        "\tGPU0GPU1\tGPU2\nGPU0 X PIX PIX\nGPU1 PIX X PIX\nGPU2 PIX PIX X\n",
        "t",
    )
    .unwrap();
    let labels: Vec<&str> = m.devices.iter().map(|d| d.label.as_str()).collect();
    assert_eq!(labels, ["GPU0", "GPU1", "GPU2"]);
}

#[test]
fn row_label_glued_to_its_first_cell() {
    let t = check(
        "GPU0 mlx5_10\n\
         GPU0    X   PIX\n\
         mlx5_10PIX   X\n",
    );
    assert!(t.node_by_name("mlx5_10").is_ok());
}

#[test]
fn old_soc_cells_read_as_sys() {
    let t = check(
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n\
         GPU0\t X \tPHB\tSOC\tSOC\t0-9\n\
         GPU1\tPHB\t X \tSOC\tSOC\t0-9\n\
         GPU2\tSOC\tSOC\t X \tPHB\t10-19\n\
         GPU3\tSOC\tSOC\tPHB\t X \t10-19\n\
         \n\
         Legend:\n\n  X   = Self\n  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)\n\
           PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n\
           PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)\n\
           PIX  = Connection traversing a single PCIe switch\n",
    );
    let (g0, g2) = (t.gpu(0).unwrap(), t.gpu(2).unwrap());
    assert_eq!(t.classify(g0, g2), PathClass::Sys);
    assert_eq!(t.gpu_numa(2).unwrap(), Some(1));
    assert!(crate::export::to_smi(&t).contains("SYS"));
}

#[test]
fn space_aligned_with_multiword_columns() {
    let t = check(
        "        GPU0    GPU1    mlx5_0  CPU Affinity    NUMA Affinity\n\
         GPU0     X      PXB     NODE    0-15    0\n\
         GPU1    PXB      X      NODE    0-15    0\n\
         mlx5_0  NODE    NODE     X\n",
    );
    assert_eq!(t.gpu_numa(0).unwrap(), Some(0));
}

#[test]
fn indented_blocks_crlf_and_bom() {
    let indented: String = PAIR.lines().map(|l| format!("    {l}\n")).collect();
    check(&indented);
    let tabbed: String = PAIR.lines().map(|l| format!("\t{l}\n")).collect();
    check(&tabbed);
    let crlf = format!("\u{feff}\r\n{}", PAIR.replace('\n', "\r\n"));
    let t = check(&crlf);
    assert_eq!(lanes(&t, 0, 1), 2);
}

#[test]
fn nic_legend_names_the_nics() {
    let t = check(
        "\tGPU0\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
         GPU0\t X \tPXB\tNODE\t0-55\t0\t\tN/A\n\
         NIC0\tPXB\t X \tNODE\n\
         NIC1\tNODE\tNODE\t X \n\
         \nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_bond_1\n",
    );
    assert!(t.node_by_name("mlx5_0").is_ok() && t.node_by_name("mlx5_bond_1").is_ok());
    assert!(t.node_by_name("NIC0").is_err());
}

#[test]
fn empty_missing_and_extra_affinity_cells() {
    // Empty and N/A cells, a row with no trailing cells, a row with more than the header names.
    let t = check(
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n\
         GPU0\t X \tSYS\tSYS\t\t\n\
         GPU1\tSYS\t X \tNODE\tN/A\tN/A\n\
         GPU2\tSYS\tNODE\t X \t8-15\t1\t\tN/A\t3\n",
    );
    assert_eq!(t.gpu_numa(2).unwrap(), Some(1));
    assert_eq!(t.gpu_numa(1).unwrap(), Some(1));
    assert_eq!(t.gpu_numa(0).unwrap(), Some(0));
    check("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n");
}

#[test]
fn matrix_wins_over_numa_affinity() {
    // GPU1 claims NUMA 1 but is PIX to GPU0 on NUMA 0: one socket, NUMA 0.
    let t = check(
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n\
         GPU0\t X \tPIX\tSYS\t0-7\t0\n\
         GPU1\tPIX\t X \tSYS\t0-7\t1\n\
         GPU2\tSYS\tSYS\t X \t8-15\t0\n",
    );
    assert_eq!(t.gpu_numa(1).unwrap(), Some(0));
    // NUMA 0 is taken by the first socket, so the second gets the first free id.
    assert_eq!(t.gpu_numa(2).unwrap(), Some(1));
}

#[test]
fn nvlink_only_groups_join_by_numa_then_by_absence_of_sys() {
    let four = |numa: [&str; 4]| {
        let mut s = String::from("\tGPU0\tGPU1\tGPU2\tGPU3\tNUMA Affinity\n");
        for (i, n) in numa.iter().enumerate() {
            s.push_str(&format!("GPU{i}"));
            for j in 0..4 {
                s.push_str(if i == j { "\t X " } else { "\tNV12" });
            }
            s.push_str(&format!("\t{n}\n"));
        }
        s
    };
    let t = check(&four(["0", "1", "0", "1"]));
    let numa: Vec<_> = (0..4).map(|i| t.gpu_numa(i).unwrap().unwrap()).collect();
    assert_eq!(numa, [0, 1, 0, 1]);
    // 3 peers x 12 links is more than a GPU has: an NVSwitch.
    assert!(t.behind_nvswitch(t.gpu(0).unwrap()));
    assert_eq!(lanes(&t, 1, 3), 12);
    let t = check(&four(["N/A"; 4]));
    assert_eq!(t.cpus().count(), 1);
}

#[test]
fn small_all_to_all_nvlink_stays_direct() {
    let t = check(
        "\tGPU0\tGPU1\tGPU2\n\
         GPU0\t X \tNV2\tNV2\n\
         GPU1\tNV2\t X \tNV2\n\
         GPU2\tNV2\tNV2\t X \n",
    );
    assert!(!t.behind_nvswitch(t.gpu(0).unwrap()));
    assert_eq!(lanes(&t, 0, 2), 2);
}

#[test]
fn nested_switches_and_host_bridges() {
    check(
        "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tmlx5_0\n\
         GPU0\t X \tPIX\tPXB\tPHB\tNODE\tPXB\n\
         GPU1\tPIX\t X \tPXB\tPHB\tNODE\tPXB\n\
         GPU2\tPXB\tPXB\t X \tPHB\tNODE\tPXB\n\
         GPU3\tPHB\tPHB\tPHB\t X \tNODE\tPHB\n\
         GPU4\tNODE\tNODE\tNODE\tNODE\t X \tNODE\n\
         mlx5_0\tPXB\tPXB\tPXB\tPHB\tNODE\t X \n",
    );
}

#[test]
fn refuses_empty_and_junk() {
    refuse("", 0, "empty input");
    refuse(" \n\t\n", 0, "empty input");
    refuse(
        "\u{0}\u{1}\u{7f}\u{fffd}garbage\n\u{2}\n",
        1,
        "no GPU column",
    );
    refuse("\tmlx5_0\tmlx5_1\n", 1, "no GPU column");
    refuse("GPU0\t X \tNV1\nGPU1\tNV1\t X \n", 1, "is a matrix cell");
}

#[test]
fn refuses_bad_headers() {
    refuse("\tGPU0\tGPU2\n", 1, "GPU2 is out of range");
    refuse("\tGPU0\tGPU99999999999\n", 1, "out of range");
    refuse("\tGPU0\tGPU0\n", 1, "appears twice");
    refuse(
        "\tGPU0\tCPU Affinity\tmlx5_0\n",
        1,
        "after the affinity columns",
    );
}

#[test]
fn refuses_truncated_missing_and_long_rows() {
    refuse("\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV1\n", 3, "truncated");
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\n",
        2,
        "the row of GPU1 is missing",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\n\nLegend:\n",
        4,
        "row label `Legend:` matches no column",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\tSYS\nGPU1\tNV1\t X \n",
        2,
        "more cells than the header",
    );
}

#[test]
fn refuses_unknown_cells() {
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNV1\t X \n",
        2,
        "unknown cell `NVX`",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV0\nGPU1\tNV0\t X \n",
        2,
        "unknown cell",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n",
        2,
        "unknown cell",
    );
}

#[test]
fn refuses_inconsistent_matrices() {
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV2\t X \n",
        3,
        "not symmetric",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tX\nGPU1\tX\t X \n",
        2,
        "X off the diagonal",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\tPIX\tPIX\nGPU1\tPIX\t X \n",
        2,
        "diagonal must be X",
    );
    refuse(
        "\tGPU0\tmlx5_0\nGPU0\t X \tNV1\nmlx5_0\tNV1\t X \n",
        2,
        "NVLink joins only GPUs",
    );
    // GPU0 and GPU2 share GPU1's switch, so they cannot be PXB (or SYS) apart.
    refuse(
        "\tGPU0\tGPU1\tGPU2\n\
         GPU0\t X \tPIX\tPXB\n\
         GPU1\tPIX\t X \tPIX\n\
         GPU2\tPXB\tPIX\t X \n",
        2,
        "no PCIe tree",
    );
    refuse(
        "\tGPU0\tGPU1\tGPU2\n\
         GPU0\t X \tNODE\tSYS\n\
         GPU1\tNODE\t X \tNODE\n\
         GPU2\tSYS\tNODE\t X \n",
        2,
        "no PCIe tree",
    );
}

#[test]
fn refuses_bad_row_labels() {
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU0\tNV1\t X \n",
        3,
        "duplicate row GPU0",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU1\tNV1\t X \nGPU0\t X \tNV1\n",
        2,
        "out of order",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU7\tNV1\t X \n",
        3,
        "matches no column",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV1\t X \nGPU1\tNV1\t X \n",
        4,
        "duplicate row GPU1",
    );
    refuse(
        "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV1\t X \nGPU2\tNV1\t X \n",
        4,
        "no column in the header",
    );
}

#[test]
fn refuses_bad_affinity_and_nic_legends() {
    refuse(
        "\tGPU0\tCPU Affinity\nGPU0\t X \tabc\n",
        2,
        "not a CPU list",
    );
    refuse(
        "\tGPU0\tNUMA Affinity\nGPU0\t X \tnode0\n",
        2,
        "not a NUMA id",
    );
    let nic = "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\nNIC Legend:\n\n";
    refuse(&format!("{nic}  NIC1: mlx5_1\n"), 7, "no such column");
    refuse(
        &format!("{nic}  NIC0 mlx5_0\n"),
        7,
        "expected `NIC<n>: <name>`",
    );
    refuse(&format!("{nic}  NIC0: a\n  NIC0: b\n"), 8, "twice");
    refuse(
        "\tGPU0\tNIC0\tmlx5_0\nGPU0\t X \tPIX\tPIX\nNIC0\tPIX\t X \tPIX\nmlx5_0\tPIX\tPIX\t X \nNIC0: mlx5_0\n",
        4,
        "two NICs are named mlx5_0",
    );
}

mod any_tree {
    //! Every machine the graph model can express comes back from its own matrix: random PCIe
    //! trees with random NVLink bonds, exported with `to_smi`, parse to a graph that gives the
    //! same cell for every pair of devices.

    use proptest::prelude::*;

    use super::parse;
    use crate::graph::{GpuInfo, NicInfo, NodeId, NodeKind};
    use crate::rates::{CpuFamily, NvLinkGen};
    use crate::topology_builder::TopologyBuilder;

    /// Build a random machine: `sockets` CPUs, then one node per step (kind, parent pick), then
    /// NVLink bonds (GPU pick, GPU pick, lanes).
    fn machine(
        sockets: u32,
        steps: &[(u8, usize)],
        bonds: &[(usize, usize, u32)],
    ) -> crate::graph::Topology {
        let mut b = TopologyBuilder::new("random");
        let cpus: Vec<NodeId> = (0..sockets)
            .map(|s| b.add_cpu(s, CpuFamily::Unknown))
            .collect();
        for (i, &x) in cpus.iter().enumerate() {
            for &y in &cpus[..i] {
                b.inter_socket(x, y, CpuFamily::Unknown);
            }
        }
        let mut inner: Vec<NodeId> = cpus.clone();
        let mut gpus = vec![b.add_gpu(GpuInfo::new(0))];
        b.pcie(cpus[0], gpus[0], 3, 16);
        let mut nics = 0;
        for &(kind, pick) in steps {
            let parent = inner[pick % inner.len()];
            let under_cpu = matches!(b.graph()[parent].kind, NodeKind::Cpu(_));
            let child = match kind % 4 {
                0 if under_cpu => {
                    let hb = b.add_host_bridge();
                    inner.push(hb);
                    hb
                }
                0 | 1 => {
                    let sw = b.add_pcie_switch();
                    inner.push(sw);
                    sw
                }
                2 => {
                    let g = b.add_gpu(GpuInfo::new(gpus.len() as u32));
                    gpus.push(g);
                    g
                }
                _ => {
                    nics += 1;
                    b.add_nic(NicInfo {
                        name: format!("nic{nics}"),
                        numa: None,
                        gbps: 0.0,
                        pci_bus_id: None,
                    })
                }
            };
            b.pcie(parent, child, 3, 16);
        }
        for &(x, y, lanes) in bonds {
            let (x, y) = (gpus[x % gpus.len()], gpus[y % gpus.len()]);
            if x != y {
                b.nvlink(x, y, NvLinkGen::V2, lanes);
            }
        }
        b.build().unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn random_trees_come_back_cell_for_cell(
            sockets in 1u32..4,
            steps in proptest::collection::vec((0u8..4, 0usize..64), 0..14),
            bonds in proptest::collection::vec((0usize..16, 0usize..16, 1u32..4), 0..6),
        ) {
            let t = machine(sockets, &steps, &bonds);
            let text = crate::export::to_smi(&t);
            let back = parse(&text, "random").map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
            let devices: Vec<String> = t
                .nodes()
                .filter(|(_, n)| n.gpu().is_some() || n.nic().is_some())
                .map(|(_, n)| n.name.clone())
                .collect();
            for a in &devices {
                for c in &devices {
                    let want = t.classify(t.node_by_name(a).unwrap(), t.node_by_name(c).unwrap());
                    let got = back.classify(back.node_by_name(a).unwrap(), back.node_by_name(c).unwrap());
                    prop_assert_eq!(want, got, "cell ({}, {})\n{}", a, c, text);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Random symmetric matrices: most are refused, but any that parse must come back
        /// exactly (never a silently wrong graph).
        #[test]
        fn random_matrices_are_refused_or_reproduced(
            kinds in proptest::collection::vec(any::<bool>(), 2..7),
            picks in proptest::collection::vec(0usize..9, 21),
        ) {
            const CELLS: [&str; 9] = ["NV1", "NV2", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "SYS"];
            let n = kinds.len();
            let label = |i: usize| {
                if i == 0 || kinds[i] {
                    format!("GPU{}", (0..i).filter(|&j| j == 0 || kinds[j]).count())
                } else {
                    format!("mlx5_{i}")
                }
            };
            let mut cells = vec![vec![String::from("X"); n]; n];
            let pairs: Vec<(usize, usize)> =
                (0..n).flat_map(|a| ((a + 1)..n).map(move |c| (a, c))).collect();
            for (k, (a, c)) in pairs.into_iter().enumerate() {
                let mut cell = CELLS[picks[k % picks.len()]];
                if cell.starts_with("NV")
                    && !(label(a).starts_with("GPU") && label(c).starts_with("GPU"))
                {
                    cell = "SYS";
                }
                cells[a][c] = cell.to_string();
                cells[c][a] = cell.to_string();
            }
            let mut text: String = (0..n).map(|i| format!("\t{}", label(i))).collect();
            text.push('\n');
            for (a, row) in cells.iter().enumerate() {
                text.push_str(&label(a));
                for cell in row {
                    text.push('\t');
                    text.push_str(cell);
                }
                text.push('\n');
            }
            if parse(&text, "random").is_ok() {
                super::check(&text);
            }
        }
    }
}
