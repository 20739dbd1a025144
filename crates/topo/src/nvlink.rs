//! NVLink between GPUs: the lanes joining two GPUs, directly or through an NVSwitch fabric,
//! and every NVLink-joined pair of a topology, found from each fabric's members rather than
//! by asking all n^2 pairs (a rack-scale cluster has tens of thousands of GPUs, each joined
//! only to the few dozen in its own fabric).

use std::collections::BTreeMap;

use petgraph::visit::EdgeRef;

use crate::graph::{LinkKind, NodeId, Topology};

/// One GPU's NVLink lanes into each NVSwitch fabric it is wired to, by fabric.
type FabricLanes = BTreeMap<usize, u32>;

impl Topology {
    /// NVLink lanes joining two GPUs: a direct bond, or through an NVSwitch fabric (the smaller
    /// of the two GPUs' lane counts into it). 0 when none.
    pub fn nvlink_lanes(&self, a: NodeId, b: NodeId) -> u32 {
        if a == b {
            return 0;
        }
        let direct = self.direct_nvlink_lanes(a, b);
        if direct > 0 {
            return direct;
        }
        shared_fabric_lanes(&self.fabric_lanes(a), &self.fabric_lanes(b))
    }
    /// Every pair of GPU indices `(a, b)`, `a < b`, that NVLink joins, with its lanes as
    /// [`Topology::nvlink_lanes`] counts them, in increasing order of `(a, b)`. Time is
    /// proportional to the GPUs' links and the pairs found (each fabric's members pair up),
    /// not to every pair of GPUs.
    pub fn nvlink_gpu_pairs(&self) -> Vec<(u32, u32, u32)> {
        let n = self.gpu_count();
        let ids: Vec<Option<NodeId>> = (0..n).map(|a| self.gpu(a).ok()).collect();
        let lanes_into: Vec<FabricLanes> = ids
            .iter()
            .map(|id| id.map(|x| self.fabric_lanes(x)).unwrap_or_default())
            .collect();
        let mut members: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for (a, fabrics) in lanes_into.iter().enumerate() {
            for &f in fabrics.keys() {
                members.entry(f).or_default().push(a as u32);
            }
        }
        let mut pairs = Vec::new();
        let mut peers: Vec<u32> = Vec::new();
        for a in 0..n {
            let Some(x) = ids[a as usize] else {
                continue;
            };
            peers.clear();
            for e in self.graph().edges(x) {
                if let (LinkKind::Nvlink { .. }, Some(g)) =
                    (e.weight().kind, self.node(e.target()).gpu())
                    && g.index > a
                {
                    peers.push(g.index);
                }
            }
            for f in lanes_into[a as usize].keys() {
                let after = members.get(f).map_or(&[][..], |m| m.as_slice());
                peers.extend(after.iter().filter(|&&b| b > a));
            }
            peers.sort_unstable();
            peers.dedup();
            for &b in &peers {
                let Some(y) = ids.get(b as usize).copied().flatten() else {
                    continue;
                };
                let direct = self.direct_nvlink_lanes(x, y);
                let lanes = if direct > 0 {
                    direct
                } else {
                    shared_fabric_lanes(&lanes_into[a as usize], &lanes_into[b as usize])
                };
                if lanes > 0 {
                    pairs.push((a, b, lanes));
                }
            }
        }
        pairs
    }
    /// Lanes of the NVLinks from `a` straight to `b`.
    fn direct_nvlink_lanes(&self, a: NodeId, b: NodeId) -> u32 {
        self.graph()
            .edges_connecting(a, b)
            .filter_map(|e| match e.weight().kind {
                LinkKind::Nvlink { lanes, .. } => Some(lanes),
                _ => None,
            })
            .sum()
    }
    /// GPU `g`'s NVLink lanes into each NVSwitch fabric.
    fn fabric_lanes(&self, g: NodeId) -> FabricLanes {
        let mut m = FabricLanes::new();
        for e in self.graph().edges(g) {
            if let (LinkKind::Nvlink { lanes, .. }, Some(f)) = (
                e.weight().kind,
                self.nvswitch_fabric
                    .get(e.target().index())
                    .copied()
                    .flatten(),
            ) {
                *m.entry(f).or_insert(0) += lanes;
            }
        }
        m
    }
}

/// The most lanes two GPUs share through one fabric: per fabric the smaller of their counts.
fn shared_fabric_lanes(a: &FabricLanes, b: &FabricLanes) -> u32 {
    a.iter()
        .filter_map(|(f, x)| b.get(f).map(|y| (*x).min(*y)))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairs asking every pair of GPUs, as the JSON export once did.
    fn every_pair(t: &Topology) -> Vec<(u32, u32, u32)> {
        let n = t.gpu_count();
        let mut v = Vec::new();
        for a in 0..n {
            for b in (a + 1)..n {
                let (Ok(x), Ok(y)) = (t.gpu(a), t.gpu(b)) else {
                    continue;
                };
                let lanes = t.nvlink_lanes(x, y);
                if lanes > 0 {
                    v.push((a, b, lanes));
                }
            }
        }
        v
    }

    #[test]
    fn pairs_from_fabric_members_are_every_pair_asked() {
        for spec in [
            "dgx1-v100",
            "dgx1-p100",
            "dgx-a100",
            "dgx-h100",
            "dgx2",
            "gb200-nvl72",
            "ac922",
            "pcie-4gpu",
            "cluster:3xdgx-h100:ib-ndr",
            "cluster:2xgb200-nvl72:ib-ndr",
        ] {
            let t = crate::preset(spec).unwrap();
            let got = t.nvlink_gpu_pairs();
            assert!(!spec.starts_with("dgx") || !got.is_empty(), "{spec}");
            assert_eq!(got, every_pair(&t), "{spec}");
            // Masked: GPU 1 busy and the first NVLink of GPU 0 down.
            let mut mask = crate::Mask::busy([1]);
            let g0 = t.gpu(0).unwrap();
            if let Some(e) = t.graph().edges(g0).find(|e| e.weight().kind.is_nvlink()) {
                mask.link_down(&t.node(g0).name, &t.node(e.target()).name);
            }
            let masked = t.with_mask(mask).unwrap();
            assert_eq!(
                masked.nvlink_gpu_pairs(),
                every_pair(&masked),
                "{spec} masked"
            );
        }
    }
}
