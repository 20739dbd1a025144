//! The persistent node-aware irregular exchange: built once from every rank's counts (a sparse
//! matrix's halo), run many times with one of [Lockhart-2023]'s strategies.

use std::rc::Rc;
use std::time::Duration;

use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use relaycc_route::nodeaware::{ModelParams, Strategy, rank_space_plan};
use relaycc_route::planner::ranks::{PROCESS_STRATEGIES, modelled_strategies};
use relaycc_route::{Collective, DType, Location, Request};

use super::agree::{self, AgreementCollective};
use super::indexed::Indexed;
use super::requests::{Health, Requests};
use super::schedule::{RankSchedule, RunBuffers};
use super::{MpiCommunicator, MpiError, MpiResult, private_dup};

/// Split+MD's message cap in bytes: Lassen's rendezvous threshold ([Lockhart-2023, Table 2]), unless
/// `RELAYCC_SPLIT_CAP_BYTES` gives one.
pub(super) fn default_split_cap() -> u64 {
    std::env::var("RELAYCC_SPLIT_CAP_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ModelParams::LASSEN.split_cap_bytes)
}

/// How an exchange picks its strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The fastest by [Lockhart-2023]'s max-rate model with Lassen's parameters.
    Model,
    /// This one (Standard, 3-Step, 2-Step or Split+MD).
    Forced(Strategy),
}

/// A persistent irregular exchange: the plan, this rank's schedule, its message buffers and
/// a private communicator, built once; [`NeighborExchange::run`] many times.
///
/// A failed run (a timeout, an MPI error, a wrong buffer) fails the exchange and the
/// communicator it was built from: later runs and builds return [`MpiError::Failed`] at once.
pub struct NeighborExchange {
    /// The private communicator the requests are posted on, owned so that it lives as long
    /// as the exchange.
    _comm: SimpleCommunicator,
    pub(super) schedule: RankSchedule,
    /// Input, output and scratch of the plan: every message reads or writes these, never
    /// the caller's slices, so requests MPI keeps after a failure hold no caller memory.
    pub(super) bufs: RunBuffers,
    pub(super) reqs: Requests,
    pub(super) health: Rc<Health>,
    strategy: Strategy,
    modelled: Vec<(Strategy, f64)>,
    pub(super) elem: usize,
    pub(super) timeout: Duration,
    /// Elements this rank receives per run.
    pub(super) received: usize,
    /// Index lists ([`NeighborExchange::from_indices`]); they pack into `bufs`.
    pub(super) indexed: Option<Indexed>,
}

impl std::fmt::Debug for NeighborExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeighborExchange")
            .field("strategy", &self.strategy)
            .field("messages", &self.schedule.messages())
            .finish()
    }
}

/// The collective step of an exchange build, in errors.
pub(super) const BUILD: &str = "build an exchange";

/// Collective agreement on a local failure and on the element size ([`agree::agree`]): every
/// rank learns whether any rank failed (and the lowest such rank) and the smallest and
/// largest element size, so a local error or a rank with another element size becomes an
/// error on all ranks, not a hang or wrong data; a peer that does not take part in time
/// gives [`MpiError::Timeout`].
pub(super) fn agree(
    comm: &MpiCommunicator,
    local: Option<String>,
    elem_size: usize,
) -> MpiResult<()> {
    let e = i64::try_from(elem_size).unwrap_or(i64::MAX);
    let got = agree::agree(comm, BUILD, local.is_some(), &[e])?;
    match (local, got.failed) {
        (Some(why), _) => return Err(MpiError::CountMismatch(why)),
        (None, None) => {}
        (None, Some(r)) => {
            return Err(MpiError::CountMismatch(format!(
                "rank {r} reported mismatched counts"
            )));
        }
    }
    if let [(least, most)] = got.ranges.as_slice()
        && least != most
    {
        return Err(MpiError::ElementMismatch(format!(
            "rank {} builds with {elem_size}-byte elements, but element sizes range from \
                 {least} to {most} bytes over the ranks",
            comm.rank
        )));
    }
    Ok(())
}

/// Counts as the words [`agree::collective`] moves (bit patterns, so every `u64` survives).
pub(super) fn words(counts: &[u64]) -> Vec<i64> {
    counts.iter().map(|c| *c as i64).collect()
}

/// The counts [`words`] sent.
pub(super) fn counts(words: &[i64]) -> Vec<u64> {
    words.iter().map(|w| *w as u64).collect()
}

impl NeighborExchange {
    /// An all_to_all_v (`MPI_Alltoallv` with packed displacements): this rank sends
    /// `send_counts[d]` elements to rank d (its input is their concatenation in rank order)
    /// and receives `recv_counts[s]` from rank s (likewise). Zero counts mean no message; a
    /// rank may have no neighbours at all.
    ///
    /// Collective. Every rank checks that what each peer sends it is what it expects; a
    /// mismatch anywhere is an error on every rank. Counts are all-gathered (O(n^2) memory,
    /// fine up to thousands of ranks).
    ///
    /// # Arguments
    /// `elem_size`: bytes per element; `choice`: the strategy, or the model's.
    pub fn all_to_all_v(
        comm: &MpiCommunicator,
        send_counts: &[u64],
        recv_counts: &[u64],
        elem_size: usize,
        choice: Choice,
    ) -> MpiResult<Self> {
        comm.check_health()?;
        let n = comm.size as usize;
        let mut local = None;
        if send_counts.len() != n || recv_counts.len() != n {
            local = Some(format!(
                "rank {}: {} send and {} receive counts for {n} ranks",
                comm.rank,
                send_counts.len(),
                recv_counts.len()
            ));
        }
        let mut mine = vec![0u64; n];
        if local.is_none() {
            mine.copy_from_slice(send_counts);
        }
        let incoming = counts(&agree::collective(
            comm,
            BUILD,
            AgreementCollective::AllToAll,
            words(&mine),
        )?);
        if local.is_none()
            && let Some(s) = (0..n).find(|s| incoming[*s] != recv_counts[*s])
        {
            local = Some(format!(
                "rank {} expects {} elements from rank {s}, which sends {}",
                comm.rank, recv_counts[s], incoming[s]
            ));
        }
        agree(comm, local, elem_size)?;
        let all = counts(&agree::collective(
            comm,
            BUILD,
            AgreementCollective::AllGather,
            words(&mine),
        )?);
        let e = elem_size as u64;
        let mut req = Request::new(Collective::AllToAllV, (0..n as u32).collect(), 0, DType::U8);
        req.matrix = all
            .chunks(n)
            .map(|row| row.iter().map(|c| c.saturating_mul(e)).collect())
            .collect();
        Self::build(comm, req, elem_size, choice)
    }

    /// An all_gather_v (`MPI_Allgatherv` with packed displacements): this rank contributes
    /// `count` elements; every rank receives all contributions in rank order.
    pub fn all_gather_v(
        comm: &MpiCommunicator,
        count: u64,
        elem_size: usize,
        choice: Choice,
    ) -> MpiResult<Self> {
        comm.check_health()?;
        let n = comm.size as usize;
        agree(comm, None, elem_size)?;
        let counts = counts(&agree::collective(
            comm,
            BUILD,
            AgreementCollective::AllGather,
            words(&[count]),
        )?);
        let mut req = Request::new(
            Collective::AllGatherV,
            (0..n as u32).collect(),
            0,
            DType::U8,
        );
        req.counts = counts
            .iter()
            .map(|c| c.saturating_mul(elem_size as u64))
            .collect();
        Self::build(comm, req, elem_size, choice)
    }

    /// Model, plan, check and schedule `req` (bytes over ranks `0..n`).
    fn build(
        comm: &MpiCommunicator,
        req: Request,
        elem_size: usize,
        choice: Choice,
    ) -> MpiResult<Self> {
        req.validate()?;
        let modelled = modelled_strategies(&req, &comm.rank_space())?;
        let strategy = match choice {
            Choice::Forced(s) if PROCESS_STRATEGIES.contains(&s) => s,
            Choice::Forced(s) => {
                return Err(MpiError::Unsupported(format!(
                    "{s} is not available between processes (use one of Standard, 3-Step, \
                     2-Step, Split+MD)"
                )));
            }
            Choice::Model => modelled
                .iter()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(Strategy::Standard, |m| m.0),
        };
        let plan = rank_space_plan(
            &req,
            comm.node_of(),
            strategy,
            default_split_cap(),
            relaycc_route::staging::DEFAULT_STAGING_BUDGET_BYTES,
        )?;
        // Proves every output byte gets exactly its input byte before a message moves;
        // deterministic, so every rank reaches the same verdict.
        relaycc_route::check(&plan)?;
        let schedule = RankSchedule::new(&plan, comm.rank, &|l| match l {
            Location::Gpu(r) => Some(r),
            Location::Host(_) => None,
        })?;
        // Exchanges send over MPI, which gains nothing from shared memory.
        let bufs = RunBuffers::new(&schedule, false);
        let received = schedule.output_len / elem_size.max(1);
        let own = private_dup(comm.comm());
        let reqs = Requests::new(own.as_raw(), comm.rank);
        Ok(NeighborExchange {
            _comm: own,
            schedule,
            bufs,
            reqs,
            health: Rc::clone(comm.health()),
            strategy,
            modelled,
            elem: elem_size.max(1),
            timeout: comm.timeout.get(),
            received,
            indexed: None,
        })
    }

    /// Run the exchange.
    ///
    /// Built from counts: `send` is this rank's packed input (elements for rank 0, then rank
    /// 1, ...), `recv` its packed output (elements from rank 0, then rank 1, ...). Built from
    /// index lists ([`NeighborExchange::from_indices`]): `send` is the local vector the send
    /// indices point into, gathered into the exchange's input buffer first; `recv` receives
    /// as above, or, with a placement, is the vector the placement points into. Messages use
    /// the exchange's own buffers; `send` is copied in before and `recv` written after.
    ///
    /// Collective over the exchange's ranks. Errors: wrong buffer sizes or element size
    /// (before any message), an MPI error (named by MPI), or [`MpiError::Timeout`] when peers
    /// do not answer in time; each fails the exchange and its communicator
    /// ([`MpiError::Failed`] from then on).
    pub fn run<T: bytemuck::Pod>(&mut self, send: &[T], recv: &mut [T]) -> MpiResult<()> {
        self.health.check()?;
        let ran = if std::mem::size_of::<T>() != self.elem {
            Err(MpiError::Unsupported(format!(
                "built for {}-byte elements, run with {}-byte ones",
                self.elem,
                std::mem::size_of::<T>()
            )))
        } else if self.indexed.is_some() {
            self.run_indexed(send, recv)
        } else {
            let input: &[u8] = bytemuck::cast_slice(send);
            let output: &mut [u8] = bytemuck::cast_slice_mut(recv);
            self.schedule
                .run(&mut self.reqs, input, output, &mut self.bufs, self.timeout)
        };
        // Even an error found before any message fails the exchange: the peers went ahead
        // and will time out waiting for this rank.
        let bufs = &mut self.bufs;
        self.health
            .settle(ran, &mut self.reqs, || Box::new(std::mem::take(bufs)))
    }

    /// The strategy it runs.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }
    /// The model's time (seconds, Lassen parameters) of every available strategy.
    pub fn modelled(&self) -> &[(Strategy, f64)] {
        &self.modelled
    }
    /// The model's time of the strategy it runs.
    pub fn predicted_seconds(&self) -> f64 {
        self.modelled
            .iter()
            .find(|m| m.0 == self.strategy)
            .map_or(f64::NAN, |m| m.1)
    }
    /// Messages this rank sends and receives per run.
    pub fn messages(&self) -> (usize, usize) {
        self.schedule.messages()
    }
    /// Elements this rank receives per run (the length of a packed `recv`).
    pub fn received(&self) -> usize {
        self.received
    }
    /// Dependency levels this rank takes part in.
    pub fn levels(&self) -> usize {
        self.schedule.depth()
    }
    /// Change the timeout.
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }
}
