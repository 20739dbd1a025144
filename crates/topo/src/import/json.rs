//! Import relaycc's own JSON (see [`crate::export::TopologyJson`]).

use crate::error::{Result, TopoError};
use crate::export::json::{FORMAT, TopologyJson, VERSION};
use crate::graph::{Topology, TopologyBuilder};

/// Parse relaycc JSON. The derived views (`gpus`, `nics`, `nvlinks`) are ignored: `nodes`,
/// `links` and `mask` are the source of truth.
pub fn parse(text: &str, source_name: &str) -> Result<Topology> {
    let doc: TopologyJson = serde_json::from_str(text)
        .map_err(|e| TopoError::parse(source_name, e.line(), e.to_string()))?;
    if doc.format != FORMAT {
        return Err(TopoError::parse(
            source_name,
            0,
            format!("format is {:?}, expected {FORMAT:?}", doc.format),
        ));
    }
    if doc.version != VERSION {
        return Err(TopoError::parse(
            source_name,
            0,
            format!(
                "version {} is not supported (expected {VERSION})",
                doc.version
            ),
        ));
    }
    let mut b = TopologyBuilder::new(doc.name);
    let mut ids = std::collections::BTreeMap::new();
    for node in doc.nodes {
        let name = node.name.clone();
        let host = node.host;
        let id = b.add_node(name.clone(), node.kind);
        if let Some(n) = b.node_mut(id) {
            n.host = host;
        }
        ids.insert(name, id);
    }
    for (i, l) in doc.links.iter().enumerate() {
        let find = |name: &str| {
            ids.get(name).copied().ok_or_else(|| {
                TopoError::parse(
                    source_name,
                    0,
                    format!("links[{i}] names node {name:?}, which is not in nodes"),
                )
            })
        };
        let (from, to) = (find(&l.from)?, find(&l.to)?);
        b.add_directed(from, to, l.link);
    }
    let topo = b
        .build()
        .map_err(|e| TopoError::parse(source_name, 0, e.to_string()))?;
    topo.with_mask(doc.mask)
}
