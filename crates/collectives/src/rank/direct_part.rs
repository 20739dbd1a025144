//! One rank's part of a cached plan for a direct call (`direct.rs`): the commands of its
//! lanes, cut once per plan and rank, with who touches whose memory, and the parts a rank
//! keeps with their scratch addresses and last resolved tasks.

use std::sync::Arc;

use relaycc_route::{Collective, InPlace, Location};

use super::Shared;
use super::op::Desc;
use crate::backend::Program;
use crate::backend::host_here::HereTasks;
use crate::backend::sealed::Private;
use crate::backend::validate::Bound;
use crate::backend::{ByteRegion, Command};
use crate::error::{CollectivesError, Result};
use crate::plan_cache::Cached;

use super::direct::bound_of;

/// Plans whose parts a rank keeps (most recently used kept, resolved tasks with them).
const KEPT_PARTS: usize = 4;

/// One rank's part of a plan (module docs): the commands of its lanes, the ranks whose
/// memory they touch, and the ranks whose parts touch its memory.
#[derive(Debug)]
pub(super) struct DirectPart {
    pub program: Program,
    /// The plan op of each command of `program` (binding a v-collective's counts reads it).
    pub command_ops: Vec<u32>,
    pub reads: Vec<usize>,
    pub touched_by: Vec<usize>,
}

/// The rank of each lane of `p` (its device's rank), or why the plan cannot be cut per rank.
fn lane_ranks(p: &Program, devices: &[u32]) -> std::result::Result<Vec<usize>, String> {
    p.lanes
        .iter()
        .map(|loc| {
            match loc {
                Location::Gpu(d) => devices.iter().position(|x| x == d),
                Location::Host(_) => None,
            }
            .ok_or_else(|| format!("a lane at {loc:?}, which no rank holds"))
        })
        .collect()
}

/// Cut rank `me`'s part out of `p` (the program of a plan on `devices`): its lanes'
/// commands, and who touches whose memory. Refused where a scratch buffer is touched by
/// two ranks' lanes or an event crosses ranks: such a plan needs an order across ranks that
/// this protocol does not carry.
fn cut_part(
    p: &Program,
    ops: &[u32],
    devices: &[u32],
    me: usize,
) -> std::result::Result<DirectPart, String> {
    let n = devices.len();
    let rank_of_lane = lane_ranks(p, devices)?;
    let lane_of = |c: &Command| match c {
        Command::Copy { lane, .. }
        | Command::Reduce { lane, .. }
        | Command::Record { lane, .. }
        | Command::Wait { lane, .. } => *lane as usize,
    };
    let mut scratch_owner: Vec<Option<usize>> =
        vec![None; (p.bindings as usize).saturating_sub(2 * n)];
    let mut event_owner: Vec<Option<usize>> = vec![None; p.events as usize];
    let (mut reads, mut touched_by) = (vec![false; n], vec![false; n]);
    let mut part = Program {
        lanes: p.lanes.clone(),
        commands: Vec::new(),
        srcs: Vec::new(),
        ..*p
    };
    let mut command_ops = Vec::new();
    for (ci, c) in p.commands.iter().enumerate() {
        let rank = *rank_of_lane
            .get(lane_of(c))
            .ok_or_else(|| "a command on a lane the program lacks".to_string())?;
        let mut touch = |binding: u32| -> std::result::Result<(), String> {
            let b = binding as usize;
            if b < 2 * n {
                let owner = b % n;
                if rank == me && owner != me {
                    reads[owner] = true;
                }
                if owner == me && rank != me {
                    touched_by[rank] = true;
                }
            } else {
                let s = scratch_owner
                    .get_mut(b - 2 * n)
                    .ok_or_else(|| format!("binding {b} past the program's"))?;
                if s.get_or_insert(rank) != &rank {
                    return Err(format!(
                        "scratch binding {b} is touched by two ranks' lanes"
                    ));
                }
            }
            Ok(())
        };
        match c {
            Command::Copy { src, dst, .. } => {
                touch(src.binding)?;
                touch(dst.binding)?;
            }
            Command::Reduce {
                first, count, dst, ..
            } => {
                let srcs = p
                    .srcs
                    .get(*first as usize..(*first + *count) as usize)
                    .ok_or_else(|| "a reduction's sources past the program's".to_string())?;
                for s in srcs {
                    touch(s.binding)?;
                }
                touch(dst.binding)?;
            }
            Command::Record { event, .. } | Command::Wait { event, .. } => {
                let e = event_owner
                    .get_mut(*event as usize)
                    .ok_or_else(|| format!("event {event} past the program's"))?;
                if e.get_or_insert(rank) != &rank {
                    return Err(format!("event {event} orders two ranks' lanes"));
                }
            }
        }
        if rank == me {
            let c = match *c {
                Command::Reduce {
                    lane,
                    first,
                    count,
                    dst,
                    divide,
                } => {
                    let at = part.srcs.len() as u32;
                    part.srcs
                        .extend_from_slice(&p.srcs[first as usize..(first + count) as usize]);
                    Command::Reduce {
                        lane,
                        first: at,
                        count,
                        dst,
                        divide,
                    }
                }
                _ => c.clone(),
            };
            part.commands.push(c);
            command_ops.push(ops.get(ci).copied().unwrap_or(crate::exec::lower::NO_OP));
        }
    }
    let listed = |v: Vec<bool>| {
        v.iter()
            .enumerate()
            .filter(|(_, x)| **x)
            .map(|(r, _)| r)
            .collect()
    };
    Ok(DirectPart {
        program: part,
        command_ops,
        reads: listed(reads),
        touched_by: listed(touched_by),
    })
}

/// A kept part: the plan it was cut from (held, so its scratch stays allocated), its
/// scratch's addresses, and the tasks last resolved with the addresses they were resolved for.
#[derive(Debug)]
pub(super) struct KeptPart {
    pub cached: Arc<Cached>,
    pub part: DirectPart,
    pub scratch: Vec<Bound>,
    pub tasks: Option<(Vec<Bound>, HereTasks)>,
    /// The call shape this part was taken for, with its checks' results for this rank: a
    /// call of the same shape skips the request, its checks and the cache's look-up.
    pub shape: CallShape,
    /// The last call's bindings, kept for the next call to fill.
    pub bindings: Vec<Bound>,
    /// A v-collective's part bound to `shape`'s counts (the part of its capacity plan is
    /// `part`); `None` for the other collectives, which run `part` itself.
    pub bound: Option<Program>,
}

impl KeptPart {
    /// The program this rank runs for a call of `shape`.
    pub fn program(&self) -> &Program {
        self.bound.as_ref().unwrap_or(&self.part.program)
    }
}

/// What a rank's checks of a call shape found: the call, in place or not, its buffers'
/// lengths (elements) and, in place, where its input lies in its output's buffer.
#[derive(Debug, Clone)]
pub(super) struct CallShape {
    pub desc: Desc,
    pub in_place: bool,
    pub needs: (u64, u64),
    pub layout: Option<InPlace>,
    /// all_to_all_v's count matrix (its part's binding depends on every rank's counts, the
    /// descriptor holds this rank's only); empty for the other collectives.
    pub matrix: Vec<Vec<u64>>,
}

impl CallShape {
    /// `desc` (in place or not, of all_to_all_v count matrix `matrix`) is a call of this
    /// shape.
    pub fn fits(&self, desc: &Desc, in_place: bool, matrix: &[Vec<u64>]) -> bool {
        self.in_place == in_place && self.desc.same_shape(desc) && self.matrix == matrix
    }
}

/// The parts one rank keeps ([`KEPT_PARTS`], most recently used last); only that rank's
/// calls touch them.
#[derive(Debug, Default)]
pub(crate) struct KeptParts {
    parts: Vec<KeptPart>,
}

impl KeptParts {
    /// Take out the kept part of `cached` for rank `me` (cut on first use), now for calls of
    /// `shape`, to give back with [`KeptParts::put`] once the call is over.
    pub(super) fn take(
        &mut self,
        shared: &Shared,
        cached: &Arc<Cached>,
        me: usize,
        shape: CallShape,
    ) -> Result<KeptPart> {
        if let Some(i) = self
            .parts
            .iter()
            .position(|k| Arc::ptr_eq(&k.cached, cached))
        {
            let mut k = self.parts.remove(i);
            k.shape = shape;
            return Ok(k);
        }
        let comm = &shared.comm;
        let exec = &cached.exec;
        let mut part =
            cut_part(exec.program(), exec.command_ops(), comm.devices(), me).map_err(|m| {
                CollectivesError::InvalidPlan {
                    op: None,
                    message: format!("plan `{}` cannot run per rank: {m}", exec.plan().algorithm),
                }
            })?;
        if shape.desc.collective == Collective::AllToAllV {
            // Every rank read every post to agree on the matrix: no rank may leave the call
            // (and post its next) before every other has read its post, so each waits for
            // all.
            let others: Vec<usize> = (0..comm.ranks()).filter(|&r| r != me).collect();
            part.reads.clone_from(&others);
            part.touched_by = others;
        }
        let backend = comm.backend();
        let mut scratch = Vec::new();
        for m in cached.scratch_set(0, backend)? {
            let region = ByteRegion {
                mem: m,
                offset: 0,
                bytes: m.bytes(),
            };
            let raw = backend.raw_region(region, Private)?;
            scratch.push(bound_of(raw.map(|r| (r.addr, r.bytes))));
        }
        Ok(KeptPart {
            cached: cached.clone(),
            part,
            scratch,
            tasks: None,
            shape,
            bindings: Vec::new(),
            bound: None,
        })
    }

    /// Take out the kept part last taken for a call of `desc`'s shape (and all_to_all_v
    /// count matrix), if there is one.
    pub(super) fn take_shape(
        &mut self,
        desc: &Desc,
        in_place: bool,
        matrix: &[Vec<u64>],
    ) -> Option<KeptPart> {
        let i = self
            .parts
            .iter()
            .rposition(|k| k.shape.fits(desc, in_place, matrix))?;
        Some(self.parts.remove(i))
    }

    /// Take out the kept part last bound to an all_to_all_v's counts for a call like `desc`
    /// but for its counts (the same collective, element type and in-place choice) whose
    /// count matrix `serves` the call (a matrix under the same capacity), if there is one.
    pub(super) fn take_rebindable(
        &mut self,
        desc: &Desc,
        in_place: bool,
        serves: impl Fn(&[Vec<u64>]) -> bool,
    ) -> Option<KeptPart> {
        let i = self.parts.iter().rposition(|k| {
            let d = &k.shape.desc;
            k.bound.is_some()
                && k.shape.in_place == in_place
                && (d.call, d.collective, d.dtype) == (desc.call, desc.collective, desc.dtype)
                && d.collective == Collective::AllToAllV
                && serves(&k.shape.matrix)
        })?;
        Some(self.parts.remove(i))
    }

    /// Keep `k` as the most recently used part, dropping the least recently used past
    /// [`KEPT_PARTS`].
    pub(super) fn put(&mut self, k: KeptPart) {
        if self.parts.len() >= KEPT_PARTS {
            self.parts.remove(0);
        }
        self.parts.push(k);
    }
}
