//! The shift of hosts a template folds by ([`HostShift`], implemented by the topology's
//! [`HostSymmetry`]) and whether a request's ranks follow it ([`ranks_invariant`]): what the
//! fold, the expansion, the planners and the selector share of a cluster's symmetry.

use relaycc_topo::{HostSymmetry, LinkId};

use relaycc_plan::Location;

/// The shift of hosts a template folds by: what [`super::build_template`] needs to know of the
/// topology's host symmetry.
pub trait HostShift: Sync {
    /// Hosts of the topology.
    fn hosts(&self) -> u32;
    /// Hosts per period (the domain is period 0).
    fn period(&self) -> u32;
    /// Periods: images of the domain.
    fn periods(&self) -> u32;
    /// The period holding memory `loc`, or `None` for a memory outside every host's period.
    fn period_of(&self, loc: Location) -> Option<u32>;
    /// The image of memory `loc` shifted `k` periods back (towards period 0).
    fn shift_back(&self, loc: Location, k: u32) -> Option<Location>;
    /// The representative of edge `e`'s orbit.
    fn rep_edge(&self, e: u32) -> Option<u32>;
    /// The size of edge `e`'s orbit (1 for an edge every shift fixes, `periods` for an edge of
    /// one host).
    fn edge_orbit(&self, e: u32) -> u32;
    /// `k` such that edge `e` is its representative shifted `k` periods on.
    fn edge_period(&self, e: u32) -> u32;
}

impl HostShift for HostSymmetry {
    fn hosts(&self) -> u32 {
        HostSymmetry::hosts(self)
    }
    fn period(&self) -> u32 {
        HostSymmetry::period(self)
    }
    fn periods(&self) -> u32 {
        HostSymmetry::periods(self)
    }
    fn period_of(&self, loc: Location) -> Option<u32> {
        match loc {
            Location::Gpu(g) => {
                (self.host_of_gpu(g) < HostSymmetry::hosts(self)).then(|| self.periods_of_gpu(g))
            }
            Location::Host(n) => {
                let id = relaycc_topo::NodeId::new(n as usize);
                self.host_of(id).map(|_| self.periods_of_node(id))
            }
        }
    }
    fn shift_back(&self, loc: Location, k: u32) -> Option<Location> {
        let p = HostSymmetry::periods(self).max(1);
        let on = (p - k % p) % p;
        Some(match loc {
            Location::Gpu(g) => Location::Gpu(self.shift_gpu(g, on)),
            Location::Host(n) => Location::Host(
                self.shift_node(relaycc_topo::NodeId::new(n as usize), on)
                    .index() as u32,
            ),
        })
    }
    fn rep_edge(&self, e: u32) -> Option<u32> {
        Some(HostSymmetry::rep_edge(self, LinkId::new(e as usize)).index() as u32)
    }
    fn edge_orbit(&self, e: u32) -> u32 {
        self.edge_orbit_size(LinkId::new(e as usize))
    }
    fn edge_period(&self, e: u32) -> u32 {
        self.periods_of_edge(LinkId::new(e as usize))
    }
}

/// True when `gpus` (ranks in order) map onto themselves under `shift`: the ranks of each
/// period follow those of the one before, GPU for GPU, so a plan over them can be the same on
/// every period.
pub fn ranks_invariant(sym: &HostSymmetry, gpus: &[u32]) -> bool {
    let p = HostSymmetry::periods(sym) as usize;
    let n = gpus.len();
    if p < 2 || !n.is_multiple_of(p) {
        return false;
    }
    let m = n / p;
    (0..n).all(|r| {
        sym.host_of_gpu(gpus[r]) < HostSymmetry::hosts(sym)
            && sym.periods_of_gpu(gpus[r]) as usize == r / m
            && gpus[(r + m) % n] == sym.shift_gpu(gpus[r], 1)
    })
}
