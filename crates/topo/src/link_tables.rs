//! What routing reads of every link at every step, computed once per topology and mask: whether
//! the mask leaves the link usable, and the rate it carries for routing (an NVSwitch port
//! link's whole port). A widest-path search through a GB200 NVL72 rack reads the 18 port links
//! of each of 72 GPUs at every switch it leaves; recomputing a port's rate per read cost 90% of
//! a 64-GPU plan's connection search.

use std::sync::OnceLock;

use petgraph::Direction;
use petgraph::visit::EdgeRef;

use crate::graph::{LinkId, NodeKind, Topology};

/// Per link (by index): usable under the mask, and the rate for routing.
#[derive(Debug, Clone, Default)]
pub(crate) struct LinkTables {
    usable: Vec<bool>,
    striped_gbps: Vec<f64>,
}

/// The tables of a topology, made on first use; a topology that changes its mask or a rate
/// starts a new one.
#[derive(Debug, Clone, Default)]
pub(crate) struct LinkTablesCell(OnceLock<LinkTables>);

impl Topology {
    /// The link tables, made on first use.
    fn link_tables(&self) -> &LinkTables {
        self.link_tables.0.get_or_init(|| {
            let usable: Vec<bool> = (0..self.graph.edge_count())
                .map(|e| self.link_usable_under_mask(LinkId::new(e)))
                .collect();
            let mut striped_gbps: Vec<f64> = self.graph.edge_weights().map(|l| l.gbps).collect();
            // Each GPU's port, each way: the sum over its usable NVLink links to switch planes,
            // added in the graph's order of the GPU's links, given to every one of them.
            for &gpu in &self.gpus {
                for dir in [Direction::Outgoing, Direction::Incoming] {
                    let port: Vec<_> = self
                        .graph
                        .edges_directed(gpu, dir)
                        .filter(|e| {
                            let far = if dir == Direction::Outgoing {
                                e.target()
                            } else {
                                e.source()
                            };
                            e.weight().kind.is_nvlink()
                                && matches!(self.graph[far].kind, NodeKind::NvSwitch)
                        })
                        .collect();
                    let sum: f64 = port
                        .iter()
                        .filter(|e| usable[e.id().index()])
                        .map(|e| e.weight().gbps)
                        .sum();
                    for e in port {
                        striped_gbps[e.id().index()] = sum;
                    }
                }
            }
            LinkTables {
                usable,
                striped_gbps,
            }
        })
    }
    /// Forget the link tables: the mask or a rate changed.
    pub(crate) fn forget_link_tables(&mut self) {
        self.link_tables = LinkTablesCell::default();
    }
    /// True when the mask leaves a link usable: not down, and neither end an absent GPU.
    pub fn link_usable(&self, id: LinkId) -> bool {
        self.link_tables()
            .usable
            .get(id.index())
            .copied()
            .unwrap_or(false)
    }
    /// The rate a link carries for routing: its own, or for an NVSwitch port link the whole
    /// port's (the sum over the GPU's usable links to switch planes in that direction).
    pub fn striped_gbps(&self, id: LinkId) -> f64 {
        self.link_tables()
            .striped_gbps
            .get(id.index())
            .copied()
            .unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::Mask;

    /// An NVSwitch port link's rate as the sum over the GPU's usable port links that way,
    /// computed per read: what the tables must give.
    fn striped_per_read(t: &Topology, id: LinkId) -> f64 {
        let own = t.graph.edge_weight(id).map_or(0.0, |l| l.gbps);
        let Some((gpu, out)) = t.nvswitch_port(id) else {
            return own;
        };
        let dir = if out {
            Direction::Outgoing
        } else {
            Direction::Incoming
        };
        t.graph
            .edges_directed(gpu, dir)
            .filter(|e| {
                let far = if out { e.target() } else { e.source() };
                t.link_usable_under_mask(e.id())
                    && matches!(t.graph[far].kind, NodeKind::NvSwitch)
                    && e.weight().kind.is_nvlink()
            })
            .map(|e| e.weight().gbps)
            .sum()
    }

    /// Under no mask, an absent GPU and a link down, on NVSwitch machines and a PCIe one, every
    /// link's usability and routing rate are what the mask and the port give, and a new mask
    /// gives new tables.
    #[test]
    fn tables_match_the_mask_and_the_ports() {
        for preset in ["dgx-h100", "dgx1-v100", "gb200-nvl72", "dgx-a100"] {
            let topo = crate::preset(preset).unwrap();
            let gpu1 = topo.node(topo.gpu(1).unwrap()).name.clone();
            let (_, far, _) = topo.links_from(topo.gpu(1).unwrap()).next().unwrap();
            let far = topo.node(far).name.clone();
            let mut down = Mask::default();
            down.link_down(&gpu1, &far);
            down.absent_gpus.insert(2);
            // The unmasked tables are made first: the masked copy must not keep them.
            assert!(topo.link_usable(LinkId::new(0)));
            for t in [topo.clone(), topo.with_mask(down).unwrap()] {
                for e in 0..t.graph.edge_count() {
                    let id = LinkId::new(e);
                    assert_eq!(t.link_usable(id), t.link_usable_under_mask(id), "{preset}");
                    assert_eq!(t.striped_gbps(id), striped_per_read(&t, id), "{preset}");
                }
                assert!(!t.link_usable(LinkId::new(t.graph.edge_count())));
            }
        }
    }
}
