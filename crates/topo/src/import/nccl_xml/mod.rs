//! NCCL topology XML: the files `NCCL_TOPO_FILE` reads and `NCCL_TOPO_DUMP_FILE` writes.
//!
//! ```text
//! <system version="1">
//!   <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="106">
//!     <pci busid="0000:0c:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
//!       <pci busid="0000:13:00.0" class="0x030200" link_speed="16 GT/s" link_width="16">
//!         <gpu dev="0" sm="80" rank="0"><nvlink target="0000:c3:00.0" count="2" tclass="0x068000"/></gpu>
//!       </pci>
//!       <pci busid="0000:1a:00.0" class="0x020000"><nic><net name="mlx5_0" dev="0" speed="200000"/></nic></pci>
//!     </pci>
//!   </cpu>
//! </system>
//! ```
//!
//! | element | becomes |
//! |---|---|
//! | `cpu` | a CPU socket, NUMA id `numaid`, family from `arch`/`vendor`/`familyid`/`modelid`; several sockets are joined pairwise by inter-socket links |
//! | `pci` of class `0x0604xx` (bridge) | a PCIe switch; the XML nesting is the PCIe tree, so [`crate::Topology::classify`] gives PIX/PXB/PHB/SYS as NCCL does |
//! | `pci` of class `0x03xxxx`, with or without a `gpu` child | a GPU; index = `dev`, else order of appearance; compute capability from `sm` |
//! | `net` inside `nic` | a NIC named `name`, `speed` Mb/s / 8000 = GB/s; the ports of one multi-port card hang from a PCIe switch standing for the card, so they share its link |
//! | `pci` of class `0x02xxxx` | a NIC named `nic<k>` (k in order of appearance), only where the file has no `net` element at all (hand-written files such as Azure's) |
//! | `nvlink` in a `gpu` | NVLink lanes (`count`) to the GPU, NVSwitch or CPU at `target` |
//! | `c2c` in a `gpu` | NVLink-C2C to the enclosing CPU (Grace), `bw` MB/s x `count` |
//!
//! Each device's PCIe link to its parent has the device's own `link_speed` (`8 GT/s`,
//! `16.0 GT/s PCIe`, ...; absent, empty or `Unknown` reads as gen 3, NCCL's fallback) and
//! `link_width` (absent or 0 reads as x16, as in NCCL).
//!
//! Quirks, each decided on purpose:
//! - `nvlink tclass`: `0x03xxxx` is a GPU, which must be in the file; `0x068001` is the CPU (the
//!   POWER9 NVLink bridge), joined to the enclosing socket; `0x068000` and every other class are
//!   treated as an NVSwitch, as NCCL does (older POWER9 dumps print other `0x0680xx` classes for
//!   their bridges). One NVSwitch node is made per distinct target bus id (NCCL merges them all
//!   into one node; separate chips keep each GPU's lanes per chip, and
//!   [`crate::Topology::nvlink_lanes`] still joins them into one fabric). Without `tclass` a
//!   target that is a GPU of the file is a GPU, any other is refused.
//! - An `nvlink` whose target is the GPU's own bus id (topology files shipped with some cloud VM
//!   images hold one) is ignored, as NCCL loads such files; [`crate::Topology::warnings`]
//!   names its line.
//! - A GPU pair usually lists its bond on both sides; the two counts are the same bond, not two.
//!   Counts that disagree are refused.
//! - NVLink generation from the GPUs' `sm` (the older of the pair); NVLink 2 where `sm` is unknown.
//! - `arch="ppc64"` is POWER9; `arm64`/`aarch64` is Grace where the socket holds a `c2c` link or
//!   a GPU of sm 9.0 or newer, else unknown; x86 from vendor, family and model.
//! - `numaid` absent or `-1` (NCCL writes that on machines without NUMA information): the
//!   lowest id no other `cpu` claims.
//! - A `pci` of another class (`0x080100` data-direct, NVMe, ...) with `pci` children is a
//!   switch, as NCCL treats it; without children it is not part of the model and is skipped,
//!   like a `nic` without `net` elements.
//! - Broadcom Gen4/Gen5 switches print two levels; NCCL flattens them, relaycc keeps the file's
//!   tree (PXB where NCCL may say PIX).
//! - Unknown elements and attributes are skipped (newer NCCL versions add some).
//!
//! Refused, with the line: text that is not XML (roxmltree's error), a DTD, a root that is not
//! `<system>`, `pci` outside a `cpu`, `gpu` outside a `pci`, `nvlink`/`c2c` outside a `gpu`,
//! `net` outside a `nic`, two `gpu` elements in one `pci` (MIG/MLOPart partitions), `pci`
//! nested more than [`MAX_PCI_DEPTH`] deep, attributes that are not numbers or out of range,
//! duplicate GPU `dev` ids or bus ids, `dev` ids with gaps, duplicate `numaid`s or NIC names,
//! NVLinks to a bus id that is no GPU of the file yet claims to be one, a file without GPUs.

mod attr;
mod build;
#[cfg(test)]
mod tests;

pub(crate) use attr::BusId;

use roxmltree::{Document, Node, ParsingOptions};

use crate::error::{Result, TopoError};
use crate::graph::Topology;
use crate::rates::NvLinkGen;

/// Deepest `pci` nesting accepted (NCCL's own XML reader stops at 256 levels of elements,
/// `NCCL_TOPO_XML_DEPTH_MAX`; real trees are under 10). Bounds the recursion on hostile input.
pub const MAX_PCI_DEPTH: usize = 64;
/// Most XML nodes accepted: far above any machine (the A100 dump has about 400) and low enough
/// that junk cannot make the parser allocate without bound.
const MAX_XML_NODES: u32 = 1_000_000;
/// Most NVLink lanes accepted in one `nvlink` element (18 per GPU on H100; NVLink 5 has 18).
const MAX_NVLINK_COUNT: u32 = 64;
/// Most lanes summed over the elements joining one pair (a bound against junk input).
const MAX_NVLINK_LANES: u32 = 255;
/// PCI class of an NVIDIA NVLink bridge that NCCL maps to the CPU (POWER9 NPU), `kvDictPciClass`
/// in NCCL src/graph/topo.cc.
const CLASS_NVLINK_CPU: u32 = 0x068001;
/// NVLink generation assumed where a GPU's `sm` is absent or predates NVLink: NVLink 2, the
/// generation of the V100 machines most hand-written files describe.
const DEFAULT_NVLINK_GEN: NvLinkGen = NvLinkGen::V2;

/// Parse NCCL topology XML. `source_name` labels errors and names the topology.
///
/// # Errors
/// [`TopoError::Parse`] naming the line and the problem; see the module docs for what is
/// refused. Never panics.
///
/// # Example
/// ```
/// let xml = r#"<system version="1">
///   <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
///     <pci busid="0000:01:00.0" class="0x030200" link_speed="8 GT/s" link_width="16"/>
///     <pci busid="0000:02:00.0" class="0x030200" link_speed="8 GT/s" link_width="16"/>
///   </cpu>
/// </system>"#;
/// let topo = relaycc_topo::import::nccl_xml::parse(xml, "two.xml").unwrap();
/// let (g0, g1) = (topo.gpu(0).unwrap(), topo.gpu(1).unwrap());
/// assert_eq!(topo.classify(g0, g1).to_string(), "PHB");
/// ```
pub fn parse(text: &str, source_name: &str) -> Result<Topology> {
    if text.trim().is_empty() {
        return Err(TopoError::parse(
            source_name,
            0,
            "empty file: no <system> element",
        ));
    }
    let options = ParsingOptions {
        allow_dtd: false,
        nodes_limit: MAX_XML_NODES,
        ..ParsingOptions::default()
    };
    let doc = Document::parse_with_options(text, options).map_err(|e| {
        use roxmltree::Error as X;
        let line = match e {
            // These carry no position; the problem is where the text ends.
            X::UnclosedRootNode | X::UnexpectedEndOfStream => text.lines().count(),
            X::NodesLimitReached | X::NoRootNode => 0,
            _ => e.pos().row as usize,
        };
        TopoError::parse(source_name, line, format!("not well-formed XML: {e}"))
    })?;
    let reader = Reader {
        doc: &doc,
        source_name,
        file: File::default(),
    };
    build::build(&reader.read()?, source_name)
}

/// Where a device hangs: a socket or a switch (indices into [`File`]'s lists).
#[derive(Debug, Clone, Copy)]
enum Parent {
    Cpu(usize),
    Switch(usize),
}

/// A device's PCIe link up to its parent.
#[derive(Debug, Clone, Copy)]
struct Uplink {
    parent: Parent,
    generation: u8,
    width: u32,
}

#[derive(Debug)]
struct XCpu {
    line: usize,
    numa: Option<u32>,
    arch: String,
    vendor: String,
    family_id: u32,
    model_id: u32,
    affinity: Option<String>,
    /// Set when a GPU inside has a `c2c` link or sm >= 90 (decides Grace for arm64).
    grace_hint: bool,
}

#[derive(Debug)]
struct XGpu {
    line: usize,
    dev: Option<u32>,
    sm: Option<u32>,
    bus_text: Option<String>,
    bus: Option<BusId>,
    cpu: usize,
    up: Uplink,
    nvlinks: Vec<XNvLink>,
    c2c: Vec<XC2c>,
}

#[derive(Debug)]
struct XNvLink {
    line: usize,
    target_text: String,
    target: BusId,
    count: u32,
    tclass: Option<u32>,
}

#[derive(Debug)]
struct XC2c {
    count: u32,
    bw_mbps: u32,
}

#[derive(Debug)]
struct XNic {
    line: usize,
    /// The `net` name; `None` for a NIC known only by its PCI class.
    name: Option<String>,
    gbps: f64,
    bus_text: Option<String>,
    cpu: usize,
    up: Uplink,
}

/// Everything read from the file, before any node is made.
#[derive(Debug, Default)]
struct File {
    cpus: Vec<XCpu>,
    switches: Vec<Uplink>,
    gpus: Vec<XGpu>,
    nets: Vec<XNic>,
    /// NICs known only by a network class; used where the file has no `net` element.
    class_nics: Vec<XNic>,
}

struct Reader<'a, 'input> {
    doc: &'a Document<'input>,
    source_name: &'a str,
    file: File,
}

impl<'a, 'input> Reader<'a, 'input> {
    fn line_at(&self, pos: usize) -> usize {
        self.doc.text_pos_at(pos).row as usize
    }
    fn err(&self, node: Node<'_, '_>, message: impl Into<String>) -> TopoError {
        TopoError::parse(self.source_name, self.line_at(node.range().start), message)
    }
    /// An attribute error at the attribute's own line.
    fn attr_err(&self, node: Node<'_, '_>, name: &str, message: String) -> TopoError {
        TopoError::parse(
            self.source_name,
            self.line_at(attr::pos(node, name)),
            format!("<{}> {message}", node.tag_name().name()),
        )
    }
    fn uint(&self, node: Node<'_, '_>, name: &str, min: u32, max: u32) -> Result<Option<u32>> {
        attr::uint(node, name, min, max).map_err(|m| self.attr_err(node, name, m))
    }
    fn line(&self, node: Node<'_, '_>) -> usize {
        self.line_at(node.range().start)
    }

    fn read(mut self) -> Result<File> {
        let root = self.doc.root_element();
        if root.tag_name().name() != "system" {
            return Err(self.err(
                root,
                format!(
                    "the root element is <{}>, expected <system>",
                    root.tag_name().name()
                ),
            ));
        }
        self.uint(root, "version", 0, u32::MAX)?;
        for child in root.children().filter(Node::is_element) {
            match child.tag_name().name() {
                "cpu" => self.read_cpu(child)?,
                name @ ("pci" | "gpu" | "nic" | "net" | "nvlink" | "c2c") => {
                    return Err(self.err(child, format!("<{name}> outside a <cpu> element")));
                }
                // Unknown elements: skipped, newer NCCL versions add some.
                _ => {}
            }
        }
        if self.file.gpus.is_empty() {
            return Err(TopoError::parse(
                self.source_name,
                0,
                "no GPU in the file (no <gpu> element and no <pci> of a display class 0x03xxxx)",
            ));
        }
        Ok(self.file)
    }

    fn read_cpu(&mut self, node: Node<'_, '_>) -> Result<()> {
        // NCCL writes numaid="-1" where the OS reports no NUMA node: treated as absent.
        let numa = match attr::int(node, "numaid", -1, 65535) {
            Ok(v) => v.and_then(|v| u32::try_from(v).ok()),
            Err(m) => return Err(self.attr_err(node, "numaid", m)),
        };
        let family_id = self.uint(node, "familyid", 0, u32::MAX)?.unwrap_or(0);
        let model_id = self.uint(node, "modelid", 0, u32::MAX)?.unwrap_or(0);
        let cpu = self.file.cpus.len();
        self.file.cpus.push(XCpu {
            line: self.line(node),
            numa,
            arch: attr::text(node, "arch").unwrap_or("").to_ascii_lowercase(),
            vendor: attr::text(node, "vendor").unwrap_or("").to_string(),
            family_id,
            model_id,
            affinity: attr::text(node, "affinity")
                .filter(|a| !a.is_empty())
                .map(str::to_string),
            grace_hint: false,
        });
        let up = Uplink {
            parent: Parent::Cpu(cpu),
            generation: attr::DEFAULT_PCIE_GEN,
            width: attr::DEFAULT_PCIE_WIDTH,
        };
        for child in node.children().filter(Node::is_element) {
            match child.tag_name().name() {
                "pci" => self.read_pci(child, cpu, Parent::Cpu(cpu), 1)?,
                // NCCL lets a <nic> sit directly in a <cpu> (NICs without a bus id).
                "nic" => self.read_nic(child, cpu, up, None)?,
                name @ ("gpu" | "nvlink" | "c2c") => {
                    return Err(self.err(child, format!("<{name}> outside a <pci> element")));
                }
                "net" => return Err(self.err(child, "<net> outside a <nic> element")),
                _ => {}
            }
        }
        Ok(())
    }

    fn read_pci(
        &mut self,
        node: Node<'_, '_>,
        cpu: usize,
        parent: Parent,
        depth: usize,
    ) -> Result<()> {
        if depth > MAX_PCI_DEPTH {
            return Err(self.err(
                node,
                format!("<pci> elements nested deeper than {MAX_PCI_DEPTH} levels"),
            ));
        }
        let bus = attr::bus_id(node, "busid").map_err(|m| self.attr_err(node, "busid", m))?;
        let bus_text = bus.and(attr::text(node, "busid")).map(str::to_string);
        let class = attr::class(node, "class").map_err(|m| self.attr_err(node, "class", m))?;
        let generation = attr::link_gen(node).map_err(|m| self.attr_err(node, "link_speed", m))?;
        let width = attr::link_width(node).map_err(|m| self.attr_err(node, "link_width", m))?;
        let up = Uplink {
            parent,
            generation,
            width,
        };
        let children: Vec<Node<'_, '_>> = node.children().filter(Node::is_element).collect();
        let named = |n: &'static str| children.iter().filter(move |c| c.tag_name().name() == n);
        for c in &children {
            match c.tag_name().name() {
                "nvlink" | "c2c" => {
                    return Err(self.err(
                        *c,
                        format!("<{}> outside a <gpu> element", c.tag_name().name()),
                    ));
                }
                "net" => return Err(self.err(*c, "<net> outside a <nic> element")),
                _ => {}
            }
        }
        let gpus: Vec<_> = named("gpu").collect();
        let nics: Vec<_> = named("nic").collect();
        let class_major = class.map(|c| c >> 16);
        let is_gpu = !gpus.is_empty() || class_major == Some(0x03);
        let is_nic = !nics.is_empty() || class_major == Some(0x02);
        if (is_gpu || is_nic)
            && let Some(inner) = named("pci").next()
        {
            return Err(self.err(
                *inner,
                "<pci> inside the <pci> of a GPU or NIC (only bridges hold devices)",
            ));
        }
        if is_gpu {
            if gpus.len() > 1 {
                return Err(self.err(
                    *gpus[1],
                    "two <gpu> elements in one <pci> (MIG/MLOPart partitions are not supported)",
                ));
            }
            return self.read_gpu(node, gpus.first().map(|g| **g), bus, bus_text, cpu, up);
        }
        if is_nic {
            if nics.is_empty() {
                let line = self.line(node);
                self.file.class_nics.push(XNic {
                    line,
                    name: None,
                    gbps: 0.0,
                    bus_text: bus_text.clone(),
                    cpu,
                    up,
                });
            }
            let ports = nics
                .iter()
                .flat_map(|n| n.children())
                .filter(|c| c.tag_name().name() == "net")
                .count();
            // Ports of one card share its PCIe link: a switch stands for the card, so their
            // traffic meets on one uplink (NCCL merges them into one NIC node for that reason).
            let up = if ports > 1 {
                let card = self.file.switches.len();
                self.file.switches.push(up);
                Uplink {
                    parent: Parent::Switch(card),
                    ..up
                }
            } else {
                up
            };
            for nic in nics {
                self.read_nic(*nic, cpu, up, bus_text.clone())?;
            }
            return Ok(());
        }
        let has_pci = named("pci").next().is_some();
        let is_bridge = class.is_some_and(|c| c >> 8 == 0x0604);
        if !is_bridge && !has_pci {
            // A leaf of another class (NVMe, an NVSwitch's management function): not modelled.
            return Ok(());
        }
        let switch = self.file.switches.len();
        self.file.switches.push(up);
        for c in children.iter().filter(|c| c.tag_name().name() == "pci") {
            self.read_pci(*c, cpu, Parent::Switch(switch), depth + 1)?;
        }
        Ok(())
    }

    fn read_gpu(
        &mut self,
        pci: Node<'_, '_>,
        gpu: Option<Node<'_, '_>>,
        bus: Option<BusId>,
        bus_text: Option<String>,
        cpu: usize,
        up: Uplink,
    ) -> Result<()> {
        let mut x = XGpu {
            line: self.line(gpu.unwrap_or(pci)),
            dev: None,
            sm: None,
            bus_text,
            bus,
            cpu,
            up,
            nvlinks: Vec::new(),
            c2c: Vec::new(),
        };
        if let Some(g) = gpu {
            x.dev = self.uint(g, "dev", 0, 65535)?;
            // sm 1.0 .. 19.9 covers every CUDA architecture with room to spare.
            x.sm = self.uint(g, "sm", 10, 199)?;
            for c in g.children().filter(Node::is_element) {
                match c.tag_name().name() {
                    "nvlink" => {
                        let Some(t) = attr::text(c, "target").filter(|t| !t.is_empty()) else {
                            return Err(self.err(c, "<nvlink> has no target attribute"));
                        };
                        let target = BusId::parse(t).ok_or_else(|| {
                            self.attr_err(
                                c,
                                "target",
                                format!("target=\"{t}\" is not a PCI bus id like 0000:13:00.0"),
                            )
                        })?;
                        let Some(count) = self.uint(c, "count", 1, MAX_NVLINK_COUNT)? else {
                            return Err(self.err(c, "<nvlink> has no count attribute"));
                        };
                        let tclass =
                            attr::class(c, "tclass").map_err(|m| self.attr_err(c, "tclass", m))?;
                        x.nvlinks.push(XNvLink {
                            line: self.line(c),
                            target_text: t.to_string(),
                            target,
                            count,
                            tclass,
                        });
                    }
                    "c2c" => {
                        let count = self.uint(c, "count", 1, MAX_NVLINK_COUNT)?.unwrap_or(1);
                        let bw_mbps = self.uint(c, "bw", 0, 10_000_000)?.unwrap_or(0);
                        x.c2c.push(XC2c { count, bw_mbps });
                    }
                    name @ ("pci" | "gpu" | "nic" | "net") => {
                        return Err(self.err(c, format!("<{name}> inside a <gpu> element")));
                    }
                    _ => {}
                }
            }
        }
        if (!x.c2c.is_empty() || x.sm.is_some_and(|sm| sm >= 90))
            && let Some(c) = self.file.cpus.get_mut(cpu)
        {
            c.grace_hint = true;
        }
        self.file.gpus.push(x);
        Ok(())
    }

    fn read_nic(
        &mut self,
        nic: Node<'_, '_>,
        cpu: usize,
        up: Uplink,
        bus_text: Option<String>,
    ) -> Result<()> {
        for c in nic.children().filter(Node::is_element) {
            match c.tag_name().name() {
                "net" => {
                    // NCCL writes speed="-1" for a port whose rate it could not read: unknown.
                    let mbps = match attr::int(c, "speed", -1, 100_000_000) {
                        Ok(v) => v.filter(|v| *v > 0).unwrap_or(0),
                        Err(m) => return Err(self.attr_err(c, "speed", m)),
                    };
                    let name = attr::text(c, "name")
                        .filter(|n| !n.is_empty())
                        .map(str::to_string);
                    let line = self.line(c);
                    self.file.nets.push(XNic {
                        line,
                        name,
                        gbps: mbps as f64 / 8000.0,
                        bus_text: bus_text.clone(),
                        cpu,
                        up,
                    });
                }
                name @ ("pci" | "gpu" | "nic" | "nvlink" | "c2c") => {
                    return Err(self.err(c, format!("<{name}> inside a <nic> element")));
                }
                _ => {}
            }
        }
        Ok(())
    }
}
