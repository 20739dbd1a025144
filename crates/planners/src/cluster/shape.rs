//! A request's ranks grouped by node ([`ClusterShape`]): the nodes and rails every cluster
//! planner (the hierarchical rings, distance halving, the node-aware all_to_all) walks.

use relaycc_topo::Topology;

use relaycc_plan::Request;
use relaycc_plan::Result;

/// A request's ranks grouped by the node (host) their GPU sits in: `hosts[h][j]` is the rank at
/// local position j (GPUs in index order) of the h-th node, nodes in order of their first
/// rank. Rail j is `hosts[*][j]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterShape {
    /// Ranks per node, each in GPU index order.
    pub hosts: Vec<Vec<u32>>,
}

impl ClusterShape {
    /// The shape of `req` on `topo` when its ranks span two or more nodes with the same number
    /// of ranks each; `None` for one node or uneven nodes (a masked cluster), which the flat
    /// planners serve. An error when a rank names a GPU the topology lacks.
    pub fn of(topo: &Topology, req: &Request) -> Result<Option<ClusterShape>> {
        let mut keys: Vec<u32> = Vec::new();
        let mut hosts: Vec<Vec<u32>> = Vec::new();
        for (r, &g) in req.gpus.iter().enumerate() {
            let host = topo.node(topo.gpu(g)?).host;
            match keys.iter().position(|k| *k == host) {
                Some(i) => hosts[i].push(r as u32),
                None => {
                    keys.push(host);
                    hosts.push(vec![r as u32]);
                }
            }
        }
        if hosts.len() < 2 || hosts.iter().any(|h| h.len() != hosts[0].len()) {
            return Ok(None);
        }
        for h in &mut hosts {
            h.sort_by_key(|&r| req.gpus[r as usize]);
        }
        Ok(Some(ClusterShape { hosts }))
    }
    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.hosts.len()
    }
    /// Ranks per node.
    pub fn per_node(&self) -> usize {
        self.hosts[0].len()
    }
    /// The ranks of rail `j`, node by node.
    pub fn rail(&self, j: usize) -> Vec<u32> {
        self.hosts.iter().map(|h| h[j]).collect()
    }
}
