//! Index lists for [`NeighborExchange`]: a halo given as the indices of the local vector each
//! rank sends to each neighbour (gather) and, optionally, where each received element goes
//! (scatter). Packing happens in the exchange's run buffers, so runs allocate nothing.
//!
//! Layout without a placement: the received elements are contiguous per source, sources in
//! rank order, each source's elements in the order it listed their indices for this rank
//! (`MPI_Alltoallv`'s packed layout); [`NeighborExchange::received`] elements in all.

use super::agree::{self, AgreementCollective};
use super::exchange::{BUILD, agree, counts, words};
use super::{Choice, MpiCommunicator, MpiError, MpiResult, NeighborExchange};

/// The gather and scatter lists of an exchange.
#[derive(Debug)]
pub(super) struct Indexed {
    /// Send indices, destination after destination (the plan's input order).
    gather: Vec<usize>,
    /// Length a local vector needs for every send index (largest + 1, or 0).
    gather_len: usize,
    /// Position of each received element, source after source (the plan's output order).
    scatter: Option<Vec<usize>>,
    /// Length a receive vector needs for every position (largest + 1, or 0).
    scatter_len: usize,
}

/// Largest index + 1 (0 for none).
fn needed_len<'a>(lists: impl Iterator<Item = &'a usize>) -> usize {
    lists.map(|i| i.saturating_add(1)).max().unwrap_or(0)
}

impl NeighborExchange {
    /// An exchange from index lists (a sparse matrix's halo): this rank sends
    /// `x[send_indices[d][k]]` for `k = 0..` to rank d (an empty list: no message; indices may
    /// repeat). What each rank receives follows from the others' lists (one nonblocking
    /// `MPI_Ialltoall` of counts). With `recv_places`, element k received from rank s lands at
    /// `recv[recv_places[s][k]]` (sources in rank order, later ones overwriting earlier ones
    /// at a repeated position); without, `recv` is packed as the module docs describe.
    ///
    /// Collective. A list count other than the number of ranks, or a placement whose length
    /// differs from what its source sends, is an error on every rank
    /// ([`MpiError::CountMismatch`]). Then as [`NeighborExchange::all_to_all_v`].
    ///
    /// # Arguments
    /// `elem_size`: bytes per element; `choice`: the strategy, or the model's.
    pub fn from_indices(
        comm: &MpiCommunicator,
        send_indices: &[Vec<usize>],
        recv_places: Option<&[Vec<usize>]>,
        elem_size: usize,
        choice: Choice,
    ) -> MpiResult<Self> {
        comm.check_health()?;
        let n = comm.size as usize;
        let me = comm.rank;
        let mut local = None;
        if send_indices.len() != n {
            local = Some(format!(
                "rank {me}: {} send index lists for {n} ranks",
                send_indices.len()
            ));
        }
        if let Some(p) = recv_places
            && p.len() != n
        {
            local.get_or_insert(format!(
                "rank {me}: {} placement lists for {n} ranks",
                p.len()
            ));
        }
        let send_counts: Vec<u64> = if local.is_none() {
            send_indices.iter().map(|l| l.len() as u64).collect()
        } else {
            vec![0; n]
        };
        let recv_counts = counts(&agree::collective(
            comm,
            BUILD,
            AgreementCollective::AllToAll,
            words(&send_counts),
        )?);
        if let (None, Some(p)) = (&local, recv_places)
            && let Some(s) = (0..n).find(|s| p[*s].len() as u64 != recv_counts[*s])
        {
            local = Some(format!(
                "rank {me} places {} elements from rank {s}, which sends {}",
                p[s].len(),
                recv_counts[s]
            ));
        }
        agree(comm, local, elem_size)?;
        let mut ex = Self::all_to_all_v(comm, &send_counts, &recv_counts, elem_size, choice)?;
        let scatter: Option<Vec<usize>> = recv_places.map(|p| p.concat());
        ex.indexed = Some(Indexed {
            gather_len: needed_len(send_indices.iter().flatten()),
            gather: send_indices.concat(),
            scatter_len: scatter.as_ref().map_or(0, |s| needed_len(s.iter())),
            scatter,
        });
        Ok(ex)
    }

    /// Gather, run, and scatter (see [`NeighborExchange::run`]).
    pub(super) fn run_indexed<T: bytemuck::Pod>(
        &mut self,
        send: &[T],
        recv: &mut [T],
    ) -> MpiResult<()> {
        let Some(ix) = self.indexed.as_ref() else {
            return Err(MpiError::Unsupported(
                "the exchange was not built from index lists".into(),
            ));
        };
        let e = self.elem;
        if send.len() < ix.gather_len {
            return Err(MpiError::Buffer {
                side: "input",
                got: send.len() * e,
                needs: ix.gather_len * e,
            });
        }
        let recv_ok = match &ix.scatter {
            Some(_) => recv.len() >= ix.scatter_len,
            None => recv.len() == self.received,
        };
        if !recv_ok {
            let needs = if ix.scatter.is_some() {
                ix.scatter_len
            } else {
                self.received
            };
            return Err(MpiError::Buffer {
                side: "output",
                got: recv.len() * e,
                needs: needs * e,
            });
        }
        let align = |_| {
            MpiError::Unsupported(format!(
                "{}-byte alignment is over the run buffers' 16",
                std::mem::align_of::<T>()
            ))
        };
        {
            let bytes = self.bufs.input_bytes(&self.schedule)?;
            let packed: &mut [T] = bytemuck::try_cast_slice_mut(bytes).map_err(align)?;
            // Every index is below `gather_len <= send.len()` (checked), so indexing is in
            // bounds.
            for (p, &i) in packed.iter_mut().zip(&ix.gather) {
                *p = send[i];
            }
        }
        self.schedule
            .run_in(&mut self.reqs, &mut self.bufs, self.timeout, None)?;
        let out = self.bufs.output_bytes(&self.schedule)?;
        let got: &[T] = bytemuck::try_cast_slice(&out[..]).map_err(align)?;
        match &ix.scatter {
            None => recv.copy_from_slice(got),
            // Every position is below `scatter_len <= recv.len()` (checked).
            Some(places) => {
                for (&p, v) in places.iter().zip(got) {
                    recv[p] = *v;
                }
            }
        }
        Ok(())
    }
}
