//! Templates: a plan on a topology whose hosts repeat, held as the ops of one fundamental
//! domain of hosts.
//!
//! When the topology and the plan are both invariant under a shift of `period` hosts (every op
//! of host `h + period` is the image of an op of host `h`), the fluid simulation is invariant
//! too: an op and its images start and finish together. So the simulator needs only the
//! domain's ops, with
//! - each dependency on an op outside the domain replaced by one on its image inside (the op
//!   at the same position of the image lane);
//! - each edge replaced by its orbit's representative, whose capacity is scaled by
//!   `orbit size / periods` (a link of one host keeps its rate; a link every shift fixes, which
//!   all images share, gets `1 / periods` of it: [`crate::Template::capacity_scale`]);
//! - each staging buffer outside the domain replaced by its image.
//!
//! [`build_template`] builds a candidate in a *window* (`window.rs`): the builder emits only the
//! ops touching the domain's devices, the devices whose lanes the domain's ops wait on, and the
//! user-buffer ranges the domain's ops touch elsewhere; it skips every other op before any
//! tracking. Dependencies on window memories are then complete, and a window device's lanes get
//! all their ops in order, so "(lane, position in lane)" names an op on every period. The fold
//! (`fold/`) finds which devices and ranges a window lacks, and the build runs again with them
//! until the window settles (two to four passes). The window always holds the next period's
//! devices too, so every op of period 1 is built and compared with its image in the domain
//! (kind, length, representative edges, shifted ends, and the images of its dependencies): a
//! planner whose order differs between periods is caught there. A plan that is not the same on every period
//! (an op's image is missing, a staging buffer differs from its image) is an error
//! ([`crate::RouteError::NotSymmetric`]), never a wrong template.
//!
//! A template is no proof of delivery: [`crate::check()`] refuses it and no
//! [`crate::CheckedPlan`] is ever made of one; [`crate::check_template`] checks its structure.

pub mod cone;
pub mod expand;
pub(crate) mod fold;
pub mod sample;
pub(crate) mod window;

pub use cone::{OpCone, extract_cone};
pub use expand::{Expansion, expand};
pub use sample::{SampleOptions, SampleReport, check_elements, check_sampled};
pub use window::Window;

use relaycc_topo::{HostSymmetry, LinkId, Topology};

use crate::error::{Result, RouteError};
use crate::plan::{Location, Plan};

/// The shift of hosts a template folds by: what [`build_template`] needs to know of the
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

/// Passes of a windowed build before the window must have settled.
pub const MAX_PASSES: usize = 6;

/// Build a template of the plan `build` makes (a planner that writes through the builder),
/// folded by `shift`: `build` runs with a window (module docs), which it passes to its
/// builders in [`crate::planner::Ctx::window`], until the window settles.
///
/// # Errors
/// [`RouteError::NotSymmetric`] when the plan is not the same on every period of hosts or the
/// window does not settle within [`MAX_PASSES`]; `build`'s errors.
pub fn build_template(
    topo: &Topology,
    shift: &dyn HostShift,
    mut build: impl FnMut(&Window) -> Result<Plan>,
) -> Result<Plan> {
    let mut devs: Vec<Location> = (0..topo.gpu_count())
        .map(Location::Gpu)
        .chain(topo.cpus().map(|(id, _)| Location::Host(id.index() as u32)))
        .filter(|&l| matches!(shift.period_of(l), Some(0 | 1)))
        .collect();
    let mut ranges = Vec::new();
    for _ in 0..MAX_PASSES {
        let w = Window::new(topo, &devs, &ranges);
        let plan = build(&w)?;
        // The domain's copies follow usable links; their images do by the symmetry.
        crate::check::check_routes(&plan, topo)?;
        // The window's build gives way to the template (or the next pass) in the call's ops.
        let window_ops = plan.ops.len() as u64;
        let folded = fold::fold(topo, plan, shift, &w);
        crate::limits::refund(window_ops);
        match folded? {
            fold::Folded::Template(t) => {
                crate::limits::charge(t.ops.len() as u64)?;
                return Ok(*t);
            }
            fold::Folded::Grow { devs: d, ranges: r } => {
                devs.extend(d);
                devs.sort_unstable();
                devs.dedup();
                ranges.extend(r);
            }
        }
    }
    Err(RouteError::NotSymmetric(format!(
        "the window did not settle within {MAX_PASSES} builds"
    )))
}

#[cfg(test)]
mod tests;
