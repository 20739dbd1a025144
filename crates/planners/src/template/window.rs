//! The window of a windowed build: the memories whose every op the builder emits. Every other
//! op is skipped at the cost of a few lookups, so a plan over a thousand GPUs is built for one
//! domain of hosts in time proportional to the domain's ops.
//!
//! A window holds whole devices (GPUs and host sockets: every op touching their memory is
//! emitted, so their lanes get all their ops in order) and regions of ranks' user buffers
//! (every op touching them is emitted, so the dependencies of an op on them are complete).

use relaycc_topo::Topology;

use relaycc_plan::{Location, Mem};

/// Which memory a region of a rank's buffers lives in, as the builder lays buffers out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum UserMem {
    /// Rank `r`'s input (and, for collectives with an in-place form, its output).
    Rank(u32),
    /// Rank `r`'s separate output.
    RankOut(u32),
}

impl UserMem {
    /// The user buffer memory `m` is, for a rank's memory (none for a staging buffer).
    pub(crate) fn of(m: Mem) -> Option<UserMem> {
        match m {
            Mem::Rank(r) => Some(UserMem::Rank(r)),
            Mem::RankOut(r) => Some(UserMem::RankOut(r)),
            Mem::Scratch(_) => None,
        }
    }
}

/// Sorted, disjoint element ranges of one memory.
type Ranges = Vec<(u64, u64)>;

/// The window of one windowed build (see the module docs): made by
/// [`crate::template::build_template`] for each pass and handed to the planner, which passes
/// it to its builders through [`crate::PlannerContext::window`].
#[derive(Debug, Clone)]
pub struct Window {
    gpu: Vec<bool>,
    node: Vec<bool>,
    gpu_host: Vec<u32>,
    node_host: Vec<u32>,
    /// Hosts with a window device: relays of a send between two memories sit on their hosts.
    hot_host: Vec<bool>,
    rank: Vec<Ranges>,
    rank_out: Vec<Ranges>,
}

impl Window {
    /// A window of the devices `devs` and the user-buffer ranges `ranges` on `topo`.
    pub(crate) fn new(
        topo: &Topology,
        devs: &[Location],
        ranges: &[(UserMem, u64, u64)],
    ) -> Window {
        let g = topo.graph();
        let gpu_host: Vec<u32> = topo
            .gpu_nodes()
            .iter()
            .map(|&id| topo.node(id).host)
            .collect();
        let node_host: Vec<u32> = g.node_weights().map(|n| n.host).collect();
        let hosts = node_host
            .iter()
            .copied()
            .max()
            .map_or(0, |h| h as usize + 1);
        let mut w = Window {
            gpu: vec![false; gpu_host.len()],
            node: vec![false; node_host.len()],
            gpu_host,
            node_host,
            hot_host: vec![false; hosts],
            rank: Vec::new(),
            rank_out: Vec::new(),
        };
        for &d in devs {
            let (set, i) = match d {
                Location::Gpu(i) => (&mut w.gpu, i),
                Location::Host(i) => (&mut w.node, i),
            };
            if let Some(x) = set.get_mut(i as usize) {
                *x = true;
            }
            if let Some(h) = w.host(d)
                && let Some(x) = w.hot_host.get_mut(h as usize)
            {
                *x = true;
            }
        }
        for &(m, a, b) in ranges {
            let (v, i) = match m {
                UserMem::Rank(i) => (&mut w.rank, i),
                UserMem::RankOut(i) => (&mut w.rank_out, i),
            };
            if v.len() <= i as usize {
                v.resize_with(i as usize + 1, Vec::new);
            }
            v[i as usize].push((a, b));
        }
        for v in w.rank.iter_mut().chain(w.rank_out.iter_mut()) {
            v.sort_unstable();
            let mut merged: Ranges = Vec::with_capacity(v.len());
            for &(a, b) in v.iter() {
                match merged.last_mut() {
                    Some(last) if a <= last.1 => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            *v = merged;
        }
        w
    }
    fn host(&self, loc: Location) -> Option<u32> {
        match loc {
            Location::Gpu(i) => self.gpu_host.get(i as usize).copied(),
            Location::Host(i) => self.node_host.get(i as usize).copied(),
        }
    }
    /// True when `loc` is a window device.
    #[inline]
    pub(crate) fn has(&self, loc: Location) -> bool {
        match loc {
            Location::Gpu(i) => self.gpu.get(i as usize).copied().unwrap_or(false),
            Location::Host(i) => self.node.get(i as usize).copied().unwrap_or(false),
        }
    }
    /// True when `loc`'s host holds a window device.
    #[inline]
    pub(crate) fn hot(&self, loc: Location) -> bool {
        self.host(loc)
            .and_then(|h| self.hot_host.get(h as usize).copied())
            .unwrap_or(false)
    }
    /// True when no op touching only rank `r`'s memory on `loc` (its buffers, its device's
    /// scratch, a relay on its host) can be in the window: its host holds no window device
    /// and none of its user buffers has a window range.
    #[inline]
    pub(crate) fn rank_cold(&self, r: u32, loc: Location) -> bool {
        !self.hot(loc)
            && self.ranges(UserMem::Rank(r)).is_empty()
            && self.ranges(UserMem::RankOut(r)).is_empty()
    }
    fn ranges(&self, m: UserMem) -> &[(u64, u64)] {
        let (v, i) = match m {
            UserMem::Rank(i) => (&self.rank, i),
            UserMem::RankOut(i) => (&self.rank_out, i),
        };
        v.get(i as usize).map_or(&[], |r| r.as_slice())
    }
    /// True when elements `[a, b)` of `m` overlap a window range.
    #[inline]
    pub(crate) fn overlaps(&self, m: UserMem, a: u64, b: u64) -> bool {
        let r = self.ranges(m);
        if r.is_empty() || a >= b {
            return false;
        }
        let i = r.partition_point(|&(_, e)| e <= a);
        r.get(i).is_some_and(|&(s, _)| s < b)
    }
    /// True when elements `[a, b)` of `m` lie inside window ranges.
    pub(crate) fn covers(&self, m: UserMem, a: u64, b: u64) -> bool {
        if a >= b {
            return true;
        }
        let r = self.ranges(m);
        let i = r.partition_point(|&(_, e)| e <= a);
        r.get(i).is_some_and(|&(s, e)| s <= a && b <= e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_answer_overlap_and_cover() {
        let topo = relaycc_topo::preset("dgx-h100").unwrap();
        let w = Window::new(
            &topo,
            &[Location::Gpu(1)],
            &[
                (UserMem::Rank(2), 10, 20),
                (UserMem::Rank(2), 20, 30),
                (UserMem::Rank(2), 50, 60),
            ],
        );
        assert!(w.has(Location::Gpu(1)) && !w.has(Location::Gpu(2)));
        assert!(w.hot(Location::Gpu(7)));
        assert!(w.overlaps(UserMem::Rank(2), 25, 55));
        assert!(!w.overlaps(UserMem::Rank(2), 30, 50));
        assert!(!w.overlaps(UserMem::RankOut(2), 0, 100));
        assert!(w.covers(UserMem::Rank(2), 12, 30));
        assert!(!w.covers(UserMem::Rank(2), 12, 51));
    }
}
