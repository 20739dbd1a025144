//! Masks: GPUs that are busy (running another job) or absent, and links that are down.
//!
//! Planners work on the masked view: a busy GPU is neither a member nor a relay, but its links
//! stay usable as a path through switches is; an absent GPU takes its links with it; a down link
//! is down in both directions.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TopoError};
use crate::graph::Topology;

/// Which GPUs and links a job may not use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mask {
    /// GPUs running other work: not members, not relays.
    #[serde(default)]
    pub busy_gpus: BTreeSet<u32>,
    /// GPUs that are gone (failed, not visible): nothing goes to, from or through them.
    #[serde(default)]
    pub absent_gpus: BTreeSet<u32>,
    /// Links down, as node-name pairs (`["GPU0", "GPU4"]`); each pair takes both directions.
    #[serde(default)]
    pub down_links: BTreeSet<(String, String)>,
}

impl Mask {
    /// A mask with these GPUs busy.
    pub fn busy(gpus: impl IntoIterator<Item = u32>) -> Self {
        Mask {
            busy_gpus: gpus.into_iter().collect(),
            ..Mask::default()
        }
    }
    /// Mark the link between nodes `a` and `b` down (both directions).
    pub fn link_down(&mut self, a: &str, b: &str) {
        let (x, y) = if a <= b { (a, b) } else { (b, a) };
        self.down_links.insert((x.to_string(), y.to_string()));
    }
    /// True when the link between `a` and `b` is marked down.
    pub fn is_link_down(&self, a: &str, b: &str) -> bool {
        if self.down_links.is_empty() {
            return false;
        }
        let (x, y) = if a <= b { (a, b) } else { (b, a) };
        self.down_links
            .iter()
            .any(|(p, q)| p.as_str() == x && q.as_str() == y)
    }
    /// True when nothing is masked.
    pub fn is_empty(&self) -> bool {
        self.busy_gpus.is_empty() && self.absent_gpus.is_empty() && self.down_links.is_empty()
    }
    /// Check that every GPU and link named exists in `topo`.
    pub fn validate(&self, topo: &Topology) -> Result<()> {
        for &g in self.busy_gpus.iter().chain(&self.absent_gpus) {
            topo.gpu(g)?;
        }
        for (a, b) in &self.down_links {
            let (x, y) = (topo.node_by_name(a)?, topo.node_by_name(b)?);
            if topo.link_between(x, y).is_none() {
                return Err(TopoError::Invalid {
                    topology: topo.name().to_string(),
                    message: format!("mask takes down {a} - {b}, but no link joins them"),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_down_is_symmetric() {
        let mut m = Mask::default();
        m.link_down("GPU4", "GPU0");
        assert!(m.is_link_down("GPU0", "GPU4"));
        assert!(m.is_link_down("GPU4", "GPU0"));
        assert!(!m.is_link_down("GPU0", "GPU1"));
    }
}
