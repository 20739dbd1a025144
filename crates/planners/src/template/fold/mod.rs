//! Folding a windowed build into a template: keep the domain's ops, map every dependency on an
//! op outside the domain to the op's image inside it, every edge to its representative, every
//! staging buffer outside the domain to its image; or say which devices and ranges the window
//! lacks, or why the plan is not the same on every period of hosts.
//!
//! [`fold`] runs named passes: `images.rs` numbers the build's lanes, ops and staging buffers
//! and finds images in the domain; `verify.rs` checks the other periods against the domain and
//! reads how regions move; `emit.rs` writes the template's ops.

mod emit;
mod images;
mod verify;

use relaycc_topo::Topology;

use relaycc_plan::Result;
use relaycc_plan::{EdgeScale, Location, Plan, Template};

use super::shift::HostShift;
use super::window::{UserMem, Window};
use emit::Emitted;
use images::{Folding, Numbering, StagingNumbering, asym};

pub(crate) use images::rotate;

/// What a fold found.
pub(super) enum Folded {
    /// The template.
    Template(Box<Plan>),
    /// The window lacks devices whose lanes the domain's ops wait on, or user-buffer ranges
    /// they touch: build again with these added.
    Grow {
        devs: Vec<Location>,
        ranges: Vec<(UserMem, u64, u64)>,
    },
}

/// Fold the windowed build `plan` (made under `window`) into a template of period 0's hosts.
///
/// The fold runs as named passes over the build: number the domain's lanes and ops
/// ([`Numbering`]) and staging buffers ([`StagingNumbering`]); check that every domain lane has an
/// image of as many ops on period 1 ([`Folding::check_lane_counts`]); verify every op the
/// window holds on other periods against its image in the domain
/// ([`Folding::verify_periods`]); read how each moved region rotates per period
/// ([`Folding::region_shifts`]); and emit the domain's ops with their references mapped into
/// the domain ([`Folding::emit`]). Each pass walks the ops once, by index: a build holds
/// millions of them, and stops at `limit`'s deadline.
pub(super) fn fold(
    topo: &Topology,
    mut plan: Plan,
    shift: &dyn HostShift,
    window: &Window,
    limit: Option<&crate::limits::Limit>,
) -> Result<Folded> {
    let _ = topo;
    let keys = plan
        .template
        .take()
        .map(|t| t.window_lanes)
        .ok_or_else(|| asym(format!("{} was not built in a window", plan.algorithm)))?;
    let numbering = Numbering::new(&plan, &keys, shift)?;
    let staging = StagingNumbering::new(&plan, shift);
    let nranks = plan.request.gpus.len() as u64;
    let folding = Folding {
        plan: &plan,
        shift,
        window,
        keys: &keys,
        num: &numbering,
        staging: &staging,
        nranks,
        per_period: nranks / u64::from(shift.periods().max(1)),
        limit,
    };
    folding.check_lane_counts()?;
    let (mut moved, mut inexact) = folding.verify_periods()?;
    let mut region_shift = Vec::new();
    if inexact.is_none() {
        (region_shift, inexact) = folding.region_shifts(&mut moved);
    }
    let Emitted {
        ops,
        scale,
        offsets,
        shifts,
        mut grow_devs,
        grow_ranges,
    } = folding.emit(&region_shift)?;
    if !grow_devs.is_empty() || !grow_ranges.is_empty() {
        grow_devs.sort_unstable();
        grow_devs.dedup();
        return Ok(Folded::Grow {
            devs: grow_devs,
            ranges: grow_ranges,
        });
    }
    let periods = shift.periods().max(1);
    let n_ops = ops.len() as u64;
    let n_lanes = numbering.lanes.len() as u64;
    plan.ops = ops;
    plan.lanes = numbering.lanes;
    plan.scratch = staging.scratch;
    plan.template = Some(Template {
        hosts: shift.hosts(),
        period: shift.period(),
        periods,
        full_ops: n_ops * u64::from(periods),
        full_lanes: n_lanes * u64::from(periods),
        capacity_scale: scale
            .into_iter()
            .enumerate()
            .filter(|&(_, s)| !s.is_nan() && s != 1.0)
            .map(|(edge, scale)| EdgeScale {
                edge: edge as u32,
                scale,
            })
            .collect(),
        exact: inexact.is_none(),
        inexact,
        offsets,
        shifts,
        window_lanes: Vec::new(),
    });
    Ok(Folded::Template(Box::new(plan)))
}
