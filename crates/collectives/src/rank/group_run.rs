//! The run of one meeting, on the thread of the last rank to arrive: compare the ranks'
//! descriptors, lend their slices to the backend, build one checked group on the
//! communicator (the same checks, plan cache and executor as the all-ranks API), launch it,
//! wait, and give the slices back.

use std::sync::Arc;

use relaycc_route::{Collective, Location};

use crate::backend::sealed::{Lending, Loan, Private};
use crate::backend::{ByteRegion, DeviceMem};
use crate::buffer::RawView;
use crate::communicator::Communicator;
use crate::error::{CollectivesError, Result};
use crate::group::Group;

use super::Shared;
use super::op::{Desc, Failure, Outcome, P2pOp, Payload, RankArrival, RankCallOp, View};

/// Lent slices, given back (taken out of the backend's table, `Trusted::unlend`) when dropped,
/// also while unwinding. The host backend's `unlend` waits for the launches in flight, so no
/// rank returns while its memory is in use; the CUDA backend's does not wait, since each
/// rank's stream orders its memory's reuse after the launch.
struct Lent<'a> {
    give_back: &'a dyn Fn(DeviceMem),
    /// Per arrival, the handles of its blocks.
    mems: Vec<Vec<DeviceMem>>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        for m in self.mems.iter().flatten() {
            (self.give_back)(*m);
        }
    }
}

fn failed(e: CollectivesError) -> Failure {
    Failure::Failed(Arc::new(e))
}

/// Run the ranks' operations (a collective, a group, a point-to-point pair or a split).
pub(crate) fn run(shared: &Shared, mut arrivals: Vec<RankArrival>) -> Outcome {
    // A rank whose own checks failed fails the call everywhere.
    for a in &mut arrivals {
        if let Err(e) = &mut a.ops {
            let e = std::mem::replace(e, CollectivesError::Unmatched(String::new()));
            return Err(failed(e));
        }
    }
    let ops: Vec<&[RankCallOp]> = arrivals
        .iter()
        .map(|a| a.ops.as_deref().unwrap_or(&[]))
        .collect();
    let splits = ops
        .iter()
        .filter(|o| matches!(o, [RankCallOp::Split { .. }]))
        .count();
    if splits == arrivals.len() {
        return super::split::run(shared, &arrivals);
    }
    if splits > 0 {
        let (a, b) = (
            arrivals
                .iter()
                .position(|a| matches!(a.ops.as_deref(), Ok([RankCallOp::Split { .. }]))),
            arrivals
                .iter()
                .position(|a| !matches!(a.ops.as_deref(), Ok([RankCallOp::Split { .. }]))),
        );
        return Err(Failure::Mismatch(format!(
            "call differs: rank {} calls split, rank {} does not",
            a.map_or(0, |i| arrivals[i].rank),
            b.map_or(0, |i| arrivals[i].rank)
        )));
    }
    let descs: Vec<Vec<&Desc>> = ops
        .iter()
        .map(|o| {
            o.iter()
                .filter_map(|op| match op {
                    RankCallOp::Coll { desc, .. } => Some(desc),
                    _ => None,
                })
                .collect()
        })
        .collect();
    agree(&arrivals, &descs)?;
    execute(shared, &arrivals, &descs).map(|()| Payload::Done)
}

/// Every rank calls the same collectives in the same order with matching descriptors, and
/// all_to_all_v counts pair up ([`crate::call::judge`]).
fn agree(arrivals: &[RankArrival], descs: &[Vec<&Desc>]) -> Result<(), Failure> {
    let rows: Vec<crate::call::RankDescs<'_>> = arrivals
        .iter()
        .zip(descs)
        .map(|(a, d)| (a.rank, Some(d.clone())))
        .collect();
    crate::call::judge(&rows).map_err(Failure::Mismatch)
}

/// The all_to_all_v matrix of operation `k` (`agree` checked that the counts pair up).
fn matrix(
    arrivals: &[RankArrival],
    descs: &[Vec<&Desc>],
    k: usize,
) -> Result<Vec<Vec<u64>>, Failure> {
    let rows: Vec<crate::call::RankDesc<'_>> = arrivals
        .iter()
        .zip(descs)
        .map(|(a, d)| (a.rank, d.get(k).copied()))
        .collect();
    let mut m = crate::call::matrix(&rows).map_err(Failure::Mismatch)?;
    // Rows in rank order (arrivals come in rank order already; this keeps it so).
    let mut order: Vec<usize> = (0..arrivals.len()).collect();
    order.sort_by_key(|&i| arrivals[i].rank);
    if order.iter().enumerate().any(|(i, &j)| i != j) {
        m = order.iter().map(|&i| m[i].clone()).collect();
    }
    Ok(m)
}

fn backend_error(comm: &Communicator, message: String) -> Failure {
    failed(CollectivesError::Backend {
        backend: comm.backend().name(),
        message,
    })
}

fn execute(shared: &Shared, arrivals: &[RankArrival], descs: &[Vec<&Desc>]) -> Result<(), Failure> {
    let comm = &shared.comm;
    let backend = comm.backend();
    let lending = backend.lending(Private);
    for a in arrivals {
        for b in &a.blocks {
            let m = match (lending, b.device) {
                (Lending::HostSlices, Some(_)) => {
                    "CUDA memory to a communicator on the host backend (ranks on GPUs \
                     come from RankComm::cuda)"
                }
                #[cfg(feature = "cuda")]
                (Lending::DeviceBuffers, None) => {
                    "host memory to a communicator on the CUDA backend"
                }
                _ => continue,
            };
            return Err(backend_error(comm, format!("rank {} passes {m}", a.rank)));
        }
    }
    #[cfg(feature = "cuda")]
    let streams = match lending {
        Lending::HostSlices => Vec::new(),
        Lending::DeviceBuffers => {
            let mut streams = Vec::with_capacity(arrivals.len());
            for a in arrivals {
                let Some(s) = a.stream.as_deref() else {
                    let m = format!(
                        "rank {} calls without a CUDA stream on a communicator on the CUDA \
                         backend: call through RankComm::on(&stream)",
                        a.rank
                    );
                    return Err(backend_error(comm, m));
                };
                streams.push(s);
            }
            streams
        }
    };
    let give_back = |m: DeviceMem| backend.unlend(m, Private);
    let mut lent = Lent {
        give_back: &give_back,
        mems: Vec::with_capacity(arrivals.len()),
    };
    for a in arrivals {
        let loc = Location::Gpu(comm.devices()[a.rank]);
        let mut mems = Vec::with_capacity(a.blocks.len());
        for s in &a.blocks {
            let loan = match s.device {
                None => Loan::Host {
                    addr: s.addr,
                    bytes: s.bytes,
                },
                Some(ordinal) => Loan::Device {
                    ordinal,
                    ptr: s.addr as u64,
                    bytes: s.bytes,
                },
            };
            // SAFETY: each span is memory the rank borrowed for its call and keeps borrowed
            // until the meeting's outcome, which is set after `lent` is dropped: a slice
            // (`&[T]` or `&mut [T]`, so nothing else writes it, and nothing else reads a
            // `&mut` one), and the host backend's `unlend` waits for every launch; or a
            // cudarc buffer taken with `device_ptr`/`device_ptr_mut` on the rank's stream,
            // whose guard the rank keeps until the launch is enqueued and whose stream waits
            // for the launch's end, so its later users and its free (ordered by cudarc's
            // events) come after the launch. Shared spans are only ever inputs or sources of
            // sends of calls that are not in place, which no op of a plan writes:
            // `exec::check` refuses such a plan before it is cached.
            match unsafe { backend.lend(loc, loan, Private) } {
                Ok(mem) => mems.push(mem),
                Err(e) => {
                    // What this rank lent so far goes back with the others'.
                    lent.mems.push(mems);
                    return Err(failed(e));
                }
            }
        }
        lent.mems.push(mems);
    }
    let group = build(comm, arrivals, descs, &lent.mems)?;
    match lending {
        Lending::HostSlices => group.launch().and_then(|p| p.wait()),
        #[cfg(feature = "cuda")]
        Lending::DeviceBuffers => group.launch_on_streams(&streams),
    }
    .map_err(failed)?;
    drop(lent);
    Ok(())
}

/// One checked group on the communicator: every collective of the ranks (in order) and
/// every send and receive, on the lent handles `mems`.
fn build<'c>(
    comm: &'c Communicator,
    arrivals: &[RankArrival],
    descs: &[Vec<&Desc>],
    mems: &[Vec<DeviceMem>],
) -> Result<Group<'c>, Failure> {
    let raw = |i: usize, v: View, esize: u64| -> Result<RawView> {
        let mem = mems[i]
            .get(v.block)
            .copied()
            .ok_or_else(|| CollectivesError::Backend {
                backend: "ranks",
                message: format!("rank {} names a block it did not lend", arrivals[i].rank),
            })?;
        Ok(RawView {
            comm: comm.id(),
            rank: arrivals[i].rank,
            region: ByteRegion {
                mem,
                offset: v.offset * esize,
                bytes: v.len * esize,
            },
            len: v.len,
        })
    };
    let n = comm.ranks();
    let mut group = comm.group();
    let ncoll = descs.first().map_or(0, Vec::len);
    for k in 0..ncoll {
        let d = descs[0][k];
        let m = if d.collective == Collective::AllToAllV {
            matrix(arrivals, descs, k)?
        } else {
            Vec::new()
        };
        let esize = d.dtype.size();
        let (mut ins, mut outs) = (vec![None; n], vec![None; n]);
        for (i, a) in arrivals.iter().enumerate() {
            let Some((input, output)) = a
                .ops
                .as_deref()
                .unwrap_or(&[])
                .iter()
                .filter_map(|op| match op {
                    RankCallOp::Coll { input, output, .. } => Some((*input, *output)),
                    _ => None,
                })
                .nth(k)
            else {
                continue;
            };
            ins[a.rank] = input
                .map(|v| raw(i, v, esize))
                .transpose()
                .map_err(failed)?;
            outs[a.rank] = output
                .map(|v| raw(i, v, esize))
                .transpose()
                .map_err(failed)?;
        }
        group.push_desc(d, m, ins, outs).map_err(failed)?;
    }
    for (i, a) in arrivals.iter().enumerate() {
        for op in a.ops.as_deref().unwrap_or(&[]) {
            if let RankCallOp::P2p(P2pOp {
                send,
                peer,
                view,
                dtype,
            }) = *op
            {
                let v = raw(i, view, dtype.size()).map_err(failed)?;
                group
                    .post_raw(send, v, dtype, a.rank, peer)
                    .map_err(failed)?;
            }
        }
    }
    Ok(group)
}
