//! Graphviz DOT: one undirected edge per full-duplex link, labelled with kind and rate.

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::graph::{LinkKind, NodeKind, Topology};

fn shape(kind: &NodeKind) -> (&'static str, &'static str) {
    match kind {
        NodeKind::Gpu(_) => ("box", "#c8e6c9"),
        NodeKind::Cpu(_) => ("ellipse", "#bbdefb"),
        NodeKind::PcieSwitch | NodeKind::HostBridge => ("diamond", "#eeeeee"),
        NodeKind::NvSwitch => ("octagon", "#a5d6a7"),
        NodeKind::Nic(_) => ("hexagon", "#ffe0b2"),
        NodeKind::NetSwitch => ("doubleoctagon", "#ffcc80"),
    }
}

fn color(kind: &LinkKind) -> &'static str {
    match kind {
        LinkKind::Nvlink { .. } | LinkKind::C2c => "#2e7d32",
        LinkKind::Pcie { .. } => "#757575",
        LinkKind::InterSocket { .. } => "#1565c0",
        LinkKind::Network { .. } => "#ef6c00",
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn quote(s: &str) -> String {
    format!("\"{}\"", escape(s))
}

/// The topology as a Graphviz graph. NVLink edges are green and thicker with more lanes; masked
/// GPUs are grey and dashed, down links dotted. Nodes of each host sit in a cluster box.
pub fn to_dot(topo: &Topology) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "graph {} {{", quote(topo.name()));
    let _ = writeln!(
        out,
        "  graph [overlap=false, splines=true, fontname=Helvetica, label={}];",
        quote(topo.name())
    );
    let _ = writeln!(out, "  node [fontname=Helvetica, style=filled];");
    let _ = writeln!(out, "  edge [fontname=Helvetica, fontsize=9];");
    for h in 0..topo.host_count() {
        let multi = topo.host_count() > 1;
        if multi {
            let _ = writeln!(out, "  subgraph cluster_host{h} {{ label=\"node{h}\";");
        }
        for (id, node) in topo.nodes().filter(|(_, n)| n.host == h) {
            if multi && matches!(node.kind, NodeKind::NetSwitch) {
                continue;
            }
            let (shape, fill) = shape(&node.kind);
            // Escape each part, then join with DOT's line break so it stays a line break.
            let mut label = escape(&node.name);
            let mut style = "filled";
            let mut fill = fill;
            if let Some(g) = node.gpu() {
                if !g.name.is_empty() {
                    label = format!("{}\\n{}", escape(&node.name), escape(&g.name));
                }
                if !topo.gpu_free(g.index) {
                    fill = "#9e9e9e";
                    style = "filled,dashed";
                }
            }
            let _ = writeln!(
                out,
                "    n{} [label=\"{label}\", shape={shape}, fillcolor=\"{fill}\", style=\"{style}\"];",
                id.index(),
            );
        }
        if multi {
            let _ = writeln!(out, "  }}");
        }
    }
    for (id, node) in topo.nodes() {
        if topo.host_count() > 1 && matches!(node.kind, NodeKind::NetSwitch) {
            let (shape, fill) = shape(&node.kind);
            let _ = writeln!(
                out,
                "  n{} [label={}, shape={shape}, fillcolor=\"{fill}\"];",
                id.index(),
                quote(&node.name)
            );
        }
    }
    let mut seen = BTreeSet::new();
    for (lid, a, b, link) in topo.links() {
        let key = (a.index().min(b.index()), a.index().max(b.index()));
        if !seen.insert(key) {
            continue;
        }
        let width = match link.kind {
            LinkKind::Nvlink { lanes, .. } => 1.0 + f64::from(lanes.min(6)) * 0.5,
            _ => 1.0,
        };
        let style = if topo.link_usable(lid) {
            "solid"
        } else {
            "dotted"
        };
        let _ = writeln!(
            out,
            "  n{} -- n{} [label=\"{}\\n{:.1} GB/s\", color=\"{}\", penwidth={width}, style={style}];",
            key.0,
            key.1,
            link.kind.label(),
            link.gbps,
            color(&link.kind)
        );
    }
    out.push_str("}\n");
    out
}
