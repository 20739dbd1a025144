//! Unit tests of the NCCL XML importer: one per quirk and per class of bad input.

use super::parse;
use crate::error::TopoError;
use crate::graph::{NodeKind, Topology};
use crate::rates::{CpuFamily, NvLinkGen};
use crate::{LinkKind, PathClass};

fn ok(xml: &str) -> Topology {
    parse(xml, "t.xml").unwrap_or_else(|e| panic!("{e}"))
}

/// The error's line and message; fails unless it is a parse error of `t.xml`.
fn err(xml: &str) -> (usize, String) {
    match parse(xml, "t.xml") {
        Err(TopoError::Parse {
            source_name,
            line,
            message,
        }) => {
            assert_eq!(source_name, "t.xml");
            (line, message)
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

/// Asserts an error on `line` whose message contains `needle`.
fn check_err(xml: &str, line: usize, needle: &str) {
    let (l, m) = err(xml);
    assert_eq!(l, line, "{m}");
    assert!(m.contains(needle), "{m:?} lacks {needle:?}");
}

fn class(t: &Topology, a: &str, b: &str) -> PathClass {
    t.classify(t.node_by_name(a).unwrap(), t.node_by_name(b).unwrap())
}

fn cpu(body: &str) -> String {
    format!(
        "<system version=\"1\">\n<cpu numaid=\"0\" arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"85\">\n{body}\n</cpu>\n</system>\n"
    )
}

const GPU_PCI: &str =
    r#"<pci busid="0000:01:00.0" class="0x030200" link_speed="8 GT/s" link_width="16"/>"#;

// ---- quirks ----

#[test]
fn link_speed_spellings_and_defaults() {
    let t = ok(&cpu(r#"
<pci busid="0000:01:00.0" class="0x030200" link_speed="8 GT/s" link_width="16"/>
<pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="8"/>
<pci busid="0000:03:00.0" class="0x030200" link_speed="2.5 GT/s"/>
<pci busid="0000:04:00.0" class="0x030200" link_speed="" link_width="0"/>
<pci busid="0000:05:00.0" class="0x030200"/>
<pci busid="0000:06:00.0" class="0x030000" link_speed="Unknown speed" link_width="4"/>"#));
    let labels: Vec<String> = (0..6)
        .map(|i| {
            let g = t.gpu(i).unwrap();
            let l = t.link_between(t.pcie_parent(g).unwrap(), g).unwrap();
            t.link(l).kind.label()
        })
        .collect();
    assert_eq!(
        labels,
        [
            "PCIe3 x16",
            "PCIe4 x8",
            "PCIe1 x16",
            "PCIe3 x16",
            "PCIe3 x16",
            "PCIe3 x4"
        ]
    );
}

#[test]
fn gpu_index_is_dev_else_order_and_bus_id_and_sm_are_kept() {
    let t = ok(&cpu(r#"
<pci busid="0000:01:00.0" class="0x030200"><gpu dev="1" sm="70" rank="1"/></pci>
<pci busid="0000:02:00.0" class="0x030200"/>
<pci busid="0000:03:00.0" class="0x030200"><gpu dev="0" sm="86"/></pci>"#));
    let bus = |i| t.gpu_info(i).unwrap().pci_bus_id.clone().unwrap();
    assert_eq!(bus(0), "0000:03:00.0");
    assert_eq!(bus(1), "0000:01:00.0");
    assert_eq!(bus(2), "0000:02:00.0");
    assert_eq!(
        t.gpu_info(0)
            .unwrap()
            .compute_capability
            .unwrap()
            .to_string(),
        "8.6"
    );
    assert_eq!(t.gpu_info(2).unwrap().compute_capability, None);
    assert_eq!(t.gpu_info(2).unwrap().numa, Some(0));
}

#[test]
fn comments_unknown_elements_and_missing_optional_attributes() {
    let t = ok(r#"<?xml version="1.0"?>
<!-- written by hand -->
<system>
  <future thing="1"/>
  <cpu>
    <!-- a GPU -->
    <pci class="0x030200"><gpu/></pci>
    <pci busid="0000:09:00.0" class="0x010802"/>
  </cpu>
</system>"#);
    assert_eq!(t.gpu_count(), 1);
    let (_, c) = t.cpus().next().unwrap();
    assert_eq!((c.numa, c.family), (0, CpuFamily::Unknown));
    // The NVMe leaf is not part of the model.
    assert_eq!(t.nodes().count(), 2);
}

#[test]
fn bridges_become_switches_and_nesting_gives_pix_pxb_phb_sys() {
    let xml = r#"<system version="1">
<cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
  <pci busid="0000:10:00.0" class="0x060400" link_speed="8 GT/s" link_width="16">
    <pci busid="0000:11:00.0" class="0x060400" link_speed="8 GT/s" link_width="16">
      <pci busid="0000:12:00.0" class="0x030200"><gpu dev="0" sm="70"/></pci>
      <pci busid="0000:13:00.0" class="0x030200"><gpu dev="1" sm="70"/></pci>
    </pci>
    <pci busid="0000:14:00.0" class="0x060400">
      <pci busid="0000:15:00.0" class="0x030200"><gpu dev="2" sm="70"/></pci>
      <pci busid="0000:16:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0" speed="100000"/></nic></pci>
    </pci>
  </pci>
  <pci busid="0000:20:00.0" class="0x030200"><gpu dev="3" sm="70"/></pci>
</cpu>
<cpu numaid="1" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
  <pci busid="0000:80:00.0" class="0x030200"><gpu dev="4" sm="70"/></pci>
</cpu>
</system>"#;
    let t = ok(xml);
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Pix);
    assert_eq!(class(&t, "GPU2", "mlx5_0"), PathClass::Pix);
    assert_eq!(class(&t, "GPU0", "GPU2"), PathClass::Pxb);
    assert_eq!(class(&t, "GPU0", "mlx5_0"), PathClass::Pxb);
    assert_eq!(class(&t, "GPU0", "GPU3"), PathClass::Phb);
    assert_eq!(class(&t, "GPU0", "GPU4"), PathClass::Sys);
    assert_eq!(t.gpu_numa(4).unwrap(), Some(1));
    let nic = t.nics().next().unwrap().1;
    assert_eq!((nic.gbps, nic.numa), (12.5, Some(0)));
    // The inter-socket link carries the sockets' family.
    let (c0, c1) = (
        t.node_by_name("CPU0").unwrap(),
        t.node_by_name("CPU1").unwrap(),
    );
    let l = t.link_between(c0, c1).unwrap();
    assert_eq!(
        t.link(l).kind,
        LinkKind::InterSocket {
            family: CpuFamily::IntelSkylake
        }
    );
}

#[test]
fn unknown_class_with_children_is_a_switch_like_nccl() {
    let t = ok(&cpu(r#"
<pci busid="0000:10:00.0" class="0x080100">
  <pci busid="0000:12:00.0" class="0x030200"/>
  <pci busid="0000:13:00.0" class="0x030200"/>
</pci>"#));
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::Pix);
}

#[test]
fn nvlink_gpu_bond_counts_once_when_both_sides_list_it() {
    let t = ok(&cpu(r#"
<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="70"><nvlink target="0000:02:00.0" count="2" tclass="0x030200"/></gpu></pci>
<pci busid="0000:02:00.0" class="0x030200"><gpu dev="1" sm="70"><nvlink target="0000:01:00.0" count="2" tclass="0x030200"/></gpu></pci>
<pci busid="0000:03:00.0" class="0x030200"><gpu dev="2" sm="70"><nvlink target="0000:01:00.0" count="1"/></gpu></pci>"#));
    let g = |i| t.gpu(i).unwrap();
    assert_eq!(t.nvlink_lanes(g(0), g(1)), 2);
    // One side only, no tclass: the target is a GPU of the file, so it is a GPU.
    assert_eq!(t.nvlink_lanes(g(0), g(2)), 1);
    assert_eq!(t.nvlink_lanes(g(2), g(0)), 1);
    assert_eq!(t.classify(g(1), g(2)), PathClass::Phb);
    let l = t.link_between(g(0), g(1)).unwrap();
    assert_eq!(
        t.link(l).kind,
        LinkKind::Nvlink {
            generation: NvLinkGen::V2,
            lanes: 2
        }
    );
}

#[test]
fn nvlink_generation_follows_sm_and_defaults_to_v2() {
    let t = ok(&cpu(r#"
<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="90"><nvlink target="0000:0c:00.0" count="18" tclass="0x068000"/></gpu></pci>
<pci busid="0000:02:00.0" class="0x030200"><gpu dev="1"><nvlink target="0000:0c:00.0" count="4" tclass="0x068000"/></gpu></pci>"#));
    let sw = t.node_by_name("NVSwitch0").unwrap();
    let kind = |i| t.link(t.link_between(t.gpu(i).unwrap(), sw).unwrap()).kind;
    assert_eq!(
        kind(0),
        LinkKind::Nvlink {
            generation: NvLinkGen::V4,
            lanes: 18
        }
    );
    assert_eq!(
        kind(1),
        LinkKind::Nvlink {
            generation: NvLinkGen::V2,
            lanes: 4
        }
    );
    // Through the switch: the smaller side's lanes.
    assert_eq!(t.nvlink_lanes(t.gpu(0).unwrap(), t.gpu(1).unwrap()), 4);
}

#[test]
fn one_nvswitch_per_target_bus_id_and_unknown_classes_are_switches() {
    let t = ok(&cpu(r#"
<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="80">
  <nvlink target="0000:c0:00.0" count="2" tclass="0x068000"/>
  <nvlink target="0000:C1:00.0" count="2" tclass="0x068000"/>
  <nvlink target="0000:c2:00.0" count="2" tclass="0x068003"/>
</gpu></pci>
<pci busid="0000:02:00.0" class="0x030200"><gpu dev="1" sm="80">
  <nvlink target="0000:c1:00.0" count="2" tclass="0x068000"/>
  <nvlink target="0000:c0:00.0" count="1" tclass="0x068000"/>
  <nvlink target="0000:c0:00.0" count="1" tclass="0x068000"/>
  <nvlink target="0000:c2:00.0" count="2" tclass="0x068003"/>
</gpu></pci>"#));
    let switches = t
        .nodes()
        .filter(|(_, n)| matches!(n.kind, NodeKind::NvSwitch))
        .count();
    assert_eq!(switches, 3);
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::NvLink(6));
}

#[test]
fn power9_nvlink_to_cpu_and_cpu_families() {
    let t = ok(r#"<system version="1">
<cpu numaid="0" arch="ppc64" affinity="0-79">
  <pci busid="0004:04:00.0" class="0x030200"><gpu dev="0" sm="70">
    <nvlink target="0007:00:00.0" count="3" tclass="0x068001"/>
    <nvlink target="0004:05:00.0" count="3" tclass="0x030200"/>
  </gpu></pci>
  <pci busid="0004:05:00.0" class="0x030200"><gpu dev="1" sm="70">
    <nvlink target="0007:00:00.1" count="3" tclass="0x068001"/>
    <nvlink target="0004:04:00.0" count="3" tclass="0x030200"/>
  </gpu></pci>
</cpu>
<cpu numaid="8" arch="ppc64"/>
</system>"#);
    let cpu0 = t.node_by_name("CPU0").unwrap();
    assert_eq!(t.node(cpu0).cpu().unwrap().family, CpuFamily::Power9);
    assert_eq!(
        t.node(cpu0).cpu().unwrap().affinity.as_deref(),
        Some("0-79")
    );
    let g0 = t.gpu(0).unwrap();
    let l = t.link_between(g0, cpu0).unwrap();
    assert_eq!(
        t.link(l).kind,
        LinkKind::Nvlink {
            generation: NvLinkGen::V2,
            lanes: 3
        }
    );
    assert_eq!(class(&t, "GPU0", "GPU1"), PathClass::NvLink(3));
    assert!(t.node_by_name("CPU8").is_ok());
    let x = t
        .link_between(cpu0, t.node_by_name("CPU8").unwrap())
        .unwrap();
    assert_eq!(t.link(x).kind.label(), "X-Bus");
}

#[test]
fn grace_c2c_and_arm_without_hint() {
    let t = ok(r#"<system version="1">
<cpu numaid="0" arch="arm64">
  <pci busid="0009:01:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
    <gpu dev="0" sm="90" rank="0"><c2c bw="40000" count="10"/></gpu>
  </pci>
</cpu>
<cpu numaid="1" arch="arm64"/>
</system>"#);
    let cpu0 = t.node_by_name("CPU0").unwrap();
    assert_eq!(t.node(cpu0).cpu().unwrap().family, CpuFamily::Grace);
    let cpu1 = t.node_by_name("CPU1").unwrap();
    assert_eq!(t.node(cpu1).cpu().unwrap().family, CpuFamily::Unknown);
    let g0 = t.gpu(0).unwrap();
    let c2c = t
        .links_from(g0)
        .find(|(_, _, l)| l.kind == LinkKind::C2c)
        .map(|(_, _, l)| l.gbps);
    assert_eq!(c2c, Some(400.0));
}

#[test]
fn numaid_minus_one_or_absent_takes_a_free_id() {
    let t = ok(
        r#"<system><cpu numaid="-1"><pci class="0x030200"/></cpu><cpu numaid="0"/><cpu/></system>"#,
    );
    let mut numas: Vec<u32> = t.cpus().map(|(_, c)| c.numa).collect();
    numas.sort();
    assert_eq!(numas, [0, 1, 2]);
    assert_eq!(t.gpu_numa(0).unwrap(), Some(1));
}

#[test]
fn nics_from_net_elements_multi_port_and_under_cpu() {
    let t = ok(&cpu(r#"
<pci busid="0000:01:00.0" class="0x030200"/>
<pci busid="0000:40:00.0" class="0x020700" link_speed="16 GT/s" link_width="16">
  <nic>
    <net name="mlx5_0" dev="0" speed="200000" port="1" gdr="1"/>
    <net name="mlx5_1" dev="1" speed="-1" port="2"/>
  </nic>
</pci>
<pci busid="0000:41:00.0" class="0x020000"/>
<nic><net name="eth0" dev="2" speed="25000"/></nic>"#));
    let mut nics: Vec<(String, f64)> = t.nics().map(|(_, n)| (n.name.clone(), n.gbps)).collect();
    nics.sort_by(|a, b| a.0.cmp(&b.0));
    // The class-only NIC at 41:00.0 is ignored: the file names its NICs with <net>.
    assert_eq!(
        nics,
        [
            ("eth0".to_string(), 3.125),
            ("mlx5_0".into(), 25.0),
            ("mlx5_1".into(), 0.0)
        ]
    );
    // The two ports share their card's PCIe link: a switch stands for the card.
    assert_eq!(class(&t, "mlx5_0", "mlx5_1"), PathClass::Pix);
    assert_eq!(class(&t, "GPU0", "eth0"), PathClass::Phb);
}

#[test]
fn class_nics_are_numbered_when_no_net_element_exists() {
    let t = ok(&cpu(r#"
<pci busid="0000:01:00.0" class="0x030200"/>
<pci busid="0000:40:00.0" class="0x020700"/>
<pci busid="0000:41:00.0" class="0x020000"/>"#));
    let mut names: Vec<String> = t.nics().map(|(_, n)| n.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["nic0", "nic1"]);
}

// ---- bad input ----

#[test]
fn empty_and_blank_files() {
    check_err("", 0, "empty file");
    check_err("  \n\t\n", 0, "empty file");
}

#[test]
fn broken_xml_names_the_line() {
    check_err(
        "<system>\n<cpu numaid=\"0\">\n<pci class=\"0x030200\">\n</cpu>\n</system>",
        4,
        "not well-formed XML",
    );
    check_err(
        "<system>\n<cpu numaid=\"0\" numaid=\"1\"/>\n</system>",
        2,
        "not well-formed XML",
    );
    check_err("<system>\n\n<cpu", 3, "not well-formed XML");
}

#[test]
fn binary_junk_and_dtd_are_refused() {
    let (_, m) = err("\u{0}\u{1}\u{fffd}PK\u{3}\u{4}garbage");
    assert!(m.contains("not well-formed XML"), "{m}");
    let (_, m) = err("<?xml version=\"1.0\"?>\n<!DOCTYPE system [<!ENTITY a \"b\">]>\n<system/>");
    assert!(m.contains("DTD") || m.contains("not well-formed"), "{m}");
}

#[test]
fn root_must_be_system() {
    check_err(
        "<!-- c -->\n<topology>\n<cpu/>\n</topology>",
        2,
        "expected <system>",
    );
}

#[test]
fn no_gpu_is_an_error() {
    check_err("<system>\n<cpu numaid=\"0\"/>\n</system>", 0, "no GPU");
}

#[test]
fn elements_in_the_wrong_place() {
    check_err(
        "<system>\n<pci class=\"0x030200\"/>\n</system>",
        2,
        "<pci> outside a <cpu>",
    );
    check_err(&cpu("<gpu dev=\"0\"/>"), 3, "<gpu> outside a <pci>");
    check_err(
        &cpu("<pci class=\"0x030200\">\n<nvlink target=\"0000:01:00.0\" count=\"1\"/></pci>"),
        4,
        "<nvlink> outside a <gpu>",
    );
    check_err(
        &cpu("<pci class=\"0x020000\"><nic/>\n<net name=\"x\"/></pci>"),
        4,
        "<net> outside a <nic>",
    );
    check_err(
        &cpu("<pci class=\"0x030200\">\n<pci class=\"0x030200\"/></pci>"),
        4,
        "inside the <pci> of a GPU",
    );
    check_err(
        &cpu("<pci class=\"0x030200\"><gpu dev=\"0\"/>\n<gpu dev=\"1\"/></pci>"),
        4,
        "two <gpu> elements",
    );
}

#[test]
fn bad_attribute_values_name_their_line() {
    check_err(
        &cpu("<pci busid=\"0000:01:00.0\"\n class=\"0x030200\" link_width=\"sixteen\"/>"),
        4,
        "link_width=\"sixteen\" is not a number",
    );
    check_err(
        &cpu("<pci class=\"0x030200\" link_width=\"64\"/>"),
        3,
        "out of range",
    );
    check_err(
        &cpu("<pci class=\"0x030200\" link_speed=\"fast\"/>"),
        3,
        "link_speed=\"fast\"",
    );
    check_err(
        &cpu("<pci class=\"0x030200\" link_speed=\"-8 GT/s\"/>"),
        3,
        "out of range",
    );
    check_err(&cpu("<pci class=\"0xZZ\"/>"), 3, "not a hex PCI class");
    check_err(&cpu("<pci class=\"0x0302000000\"/>"), 3, "24 bits");
    check_err(
        &cpu("<pci busid=\"bogus\" class=\"0x030200\"/>"),
        3,
        "busid=\"bogus\"",
    );
    check_err(
        &cpu("<pci class=\"0x030200\"><gpu dev=\"-1\"/></pci>"),
        3,
        "dev=\"-1\" is out of range",
    );
    check_err(
        &cpu("<pci class=\"0x030200\"><gpu sm=\"7.0\"/></pci>"),
        3,
        "sm=\"7.0\" is not a number",
    );
    check_err(
        &cpu("<pci class=\"0x030200\"><gpu sm=\"700\"/></pci>"),
        3,
        "out of range",
    );
    check_err(
        "<system>\n<cpu numaid=\"zero\"/>\n</system>",
        2,
        "numaid=\"zero\"",
    );
    check_err("<system version=\"one\">\n</system>", 1, "version");
    check_err(
        &cpu(&format!(
            "{GPU_PCI}\n<pci class=\"0x020000\"><nic><net name=\"a\" speed=\"1e5\"/></nic></pci>"
        )),
        4,
        "speed=\"1e5\"",
    );
}

#[test]
fn duplicate_gpu_devs_bus_ids_numaids_and_nic_names() {
    check_err(
        &cpu(
            "<pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu dev=\"0\"/></pci>\n<pci busid=\"0000:02:00.0\" class=\"0x030200\"><gpu dev=\"0\"/></pci>",
        ),
        4,
        "two GPUs have dev 0 (lines 3 and 4)",
    );
    check_err(
        &cpu(
            "<pci busid=\"0000:01:00.0\" class=\"0x030200\"/>\n<pci busid=\"0000:01:00.0\" class=\"0x030200\"/>",
        ),
        4,
        "two GPUs have bus id",
    );
    check_err(
        &cpu("<pci class=\"0x030200\"><gpu dev=\"5\"/></pci>"),
        3,
        "leaves a gap",
    );
    check_err(
        "<system>\n<cpu numaid=\"0\"><pci class=\"0x030200\"/></cpu>\n<cpu numaid=\"0\"/>\n</system>",
        3,
        "two <cpu> elements have numaid 0",
    );
    check_err(
        &cpu(&format!(
            "{GPU_PCI}\n<nic><net name=\"a\"/>\n<net name=\"a\"/></nic>"
        )),
        5,
        "two NICs are named \"a\"",
    );
    check_err(
        &cpu(&format!("{GPU_PCI}\n<nic><net name=\"GPU0\"/></nic>")),
        4,
        "clashes",
    );
}

#[test]
fn nvlink_problems_name_their_line() {
    let gpu = |extra: &str| {
        cpu(&format!(
            "<pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu dev=\"0\" sm=\"70\">\n{extra}\n</gpu></pci>\n<pci busid=\"0000:02:00.0\" class=\"0x030200\"><gpu dev=\"1\" sm=\"70\"/></pci>"
        ))
    };
    check_err(
        &gpu("<nvlink target=\"0000:09:00.0\" count=\"2\" tclass=\"0x030200\"/>"),
        4,
        "target 0000:09:00.0 is not a GPU of this file",
    );
    check_err(
        &gpu("<nvlink target=\"0000:09:00.0\" count=\"2\"/>"),
        4,
        "has no tclass",
    );
    check_err(
        &gpu("<nvlink target=\"0000:02:00.0\" count=\"2\" tclass=\"0x068000\"/>"),
        4,
        "is a GPU of this file but tclass",
    );
    check_err(&gpu("<nvlink count=\"2\"/>"), 4, "no target");
    check_err(
        &gpu("<nvlink target=\"nvswitch\" count=\"2\"/>"),
        4,
        "target=\"nvswitch\"",
    );
    check_err(&gpu("<nvlink target=\"0000:02:00.0\"/>"), 4, "no count");
    check_err(
        &gpu("<nvlink target=\"0000:02:00.0\" count=\"0\"/>"),
        4,
        "out of range",
    );
    check_err(
        &gpu("<nvlink target=\"0000:02:00.0\" count=\"x\"/>"),
        4,
        "not a number",
    );
    check_err(
        &gpu("<nvlink target=\"0000:02:00.0\" count=\"2\" tclass=\"gpu\"/>"),
        4,
        "tclass=\"gpu\"",
    );
    let many = "<nvlink target=\"0000:c0:00.0\" count=\"64\" tclass=\"0x068000\"/>\n".repeat(5);
    // The fourth element (line 7) takes the sum past 255.
    check_err(&gpu(&many), 7, "more than 255");
    let disagree = cpu(
        "<pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu dev=\"0\">\n<nvlink target=\"0000:02:00.0\" count=\"2\"/></gpu></pci>\n<pci busid=\"0000:02:00.0\" class=\"0x030200\"><gpu dev=\"1\">\n<nvlink target=\"0000:01:00.0\" count=\"1\"/></gpu></pci>",
    );
    check_err(&disagree, 6, "NVLink counts disagree");
}

#[test]
fn deep_nesting_is_bounded() {
    let depth = super::MAX_PCI_DEPTH + 5;
    let xml = cpu(&format!(
        "{}<pci class=\"0x030200\"/>{}",
        "<pci class=\"0x060400\">\n".repeat(depth),
        "</pci>".repeat(depth)
    ));
    let (line, m) = err(&xml);
    assert!(m.contains("nested deeper"), "{m}");
    assert_eq!(line, 3 + super::MAX_PCI_DEPTH);
}

#[test]
fn self_links_are_ignored_with_a_warning() {
    // A GPU listing its own bus id, with or without a tclass, beside a real bond to GPU1.
    for tclass in ["", " tclass=\"0x030200\"", " tclass=\"0x068000\""] {
        let t = ok(&cpu(&format!(
            "<pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu dev=\"0\" sm=\"70\">\n<nvlink target=\"0000:01:00.0\" count=\"6\"{tclass}/>\n<nvlink target=\"0000:02:00.0\" count=\"2\"/>\n</gpu></pci>\n<pci busid=\"0000:02:00.0\" class=\"0x030200\"><gpu dev=\"1\" sm=\"70\"/></pci>"
        )));
        assert_eq!(t.nvlink_lanes(t.gpu(0).unwrap(), t.gpu(1).unwrap()), 2);
        let switch = |(_, n): &(_, &crate::graph::Node)| matches!(n.kind, NodeKind::NvSwitch);
        assert_eq!(t.nodes().filter(switch).count(), 0, "{tclass}");
        let [w] = t.warnings() else {
            panic!("{tclass}: {:?}", t.warnings())
        };
        assert!(
            w.contains(":4:") && w.contains("GPU0 targets its own bus id 0000:01:00.0"),
            "{w}"
        );
    }
    assert!(ok(&cpu(GPU_PCI)).warnings().is_empty());
}
