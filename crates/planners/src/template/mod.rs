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
//!   all images share, gets `1 / periods` of it: [`relaycc_plan::Template::capacity_scale`]);
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
//! ([`relaycc_plan::RouteError::NotSymmetric`]), never a wrong template.
//!
//! A template is no proof of delivery: [`relaycc_plan::check()`] refuses it and no
//! [`relaycc_plan::CheckedPlan`] is ever made of one; [`relaycc_plan::check_template`] checks its structure.

pub mod cone;
pub mod expand;
pub(crate) mod fold;
pub mod sample;
mod shift;
pub(crate) mod window;

pub use cone::{OpCone, extract_cone};
pub use expand::{Expansion, expand};
pub use sample::{SampleOptions, SampleReport, check_elements, check_sampled};
pub use shift::{HostShift, ranks_invariant};
pub use window::Window;

use relaycc_topo::Topology;

use relaycc_plan::{Location, Plan};
use relaycc_plan::{Result, RouteError};

/// Passes of a windowed build before the window must have settled.
pub const MAX_PASSES: usize = 6;

/// Build a template of the plan `build` makes (a planner that writes through the builder),
/// folded by `shift`: `build` runs with a window (module docs), which it passes to its
/// builders in [`crate::PlannerContext::window`], until the window settles. `build` charges its
/// ops to `limit` (the build's, [`crate::Limit`]); each window's build gives its ops back
/// once folded, the template charges its own, and the fold stops at the limit's deadline.
///
/// # Errors
/// [`RouteError::NotSymmetric`] when the plan is not the same on every period of hosts or the
/// window does not settle within [`MAX_PASSES`]; `build`'s errors.
pub fn build_template(
    topo: &Topology,
    shift: &dyn HostShift,
    limit: Option<&crate::limits::Limit>,
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
        relaycc_plan::check_routes(&plan, topo)?;
        // The window's build gives way to the template (or the next pass) in the call's ops.
        let window_ops = plan.ops.len() as u64;
        let folded = fold::fold(topo, plan, shift, &w, limit);
        crate::limits::refund(limit, window_ops);
        match folded? {
            fold::Folded::Template(t) => {
                crate::limits::charge(limit, t.ops.len() as u64)?;
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
