//! The typed per-rank calls on borrowed host slices, and [`RankGroup`], the calls of one
//! rank collected to run as one launch.
//!
//! A rank's own argument errors (an in-place buffer whose length is not a multiple of the
//! rank count, a count list too short) travel to the meeting with the call, so they fail
//! the call on every rank instead of leaving the others to time out.

use std::marker::PhantomData;

use relaycc_route::{Collective, DType, ReduceOp};

use crate::element::Element;
use crate::error::{CollectivesError, Result};

use super::RankComm;
use super::op::{Desc, Op, Span, View};

/// Calls of one rank collected to run as one launch (`ncclGroupStart` / `ncclGroupEnd`):
/// collectives, sends and receives, on slices borrowed until [`RankGroup::launch`].
///
/// Launching a group is a call every rank makes (an empty group where a rank has nothing to
/// add): the ranks' collectives must match in order, and sends pair with receives in posting
/// order per (sender, receiver). The operations of a group run concurrently. Argument errors
/// found while adding are kept and returned by `launch`, on every rank.
#[derive(Debug)]
#[must_use = "a group does nothing until launched"]
pub struct RankGroup<'r, 'b> {
    comm: &'r mut RankComm,
    blocks: Vec<Span>,
    ops: Vec<Op>,
    error: Option<CollectivesError>,
    _borrows: PhantomData<&'b mut [u8]>,
}

fn counts_u64(c: &[usize]) -> Vec<u64> {
    c.iter().map(|&x| x as u64).collect()
}

impl<'b> RankGroup<'_, 'b> {
    fn me(&self) -> usize {
        self.comm.rank
    }
    fn n(&self) -> usize {
        self.comm.ranks()
    }

    fn lend<T: Element>(&mut self, s: &'b [T]) -> View {
        self.blocks.push(Span {
            addr: s.as_ptr() as usize,
            bytes: std::mem::size_of_val(s) as u64,
        });
        View {
            block: self.blocks.len() - 1,
            offset: 0,
            len: s.len() as u64,
        }
    }

    fn lend_mut<T: Element>(&mut self, s: &'b mut [T]) -> View {
        // The address comes from the unique borrow: the backend writes through it.
        self.blocks.push(Span {
            addr: s.as_mut_ptr() as usize,
            bytes: std::mem::size_of_val(s) as u64,
        });
        View {
            block: self.blocks.len() - 1,
            offset: 0,
            len: s.len() as u64,
        }
    }

    fn fail(&mut self, e: CollectivesError) -> &mut Self {
        self.error.get_or_insert(e);
        self
    }

    #[allow(clippy::too_many_arguments)]
    fn coll(
        &mut self,
        call: &'static str,
        collective: Collective,
        dtype: DType,
        count: usize,
        op: ReduceOp,
        root: usize,
        input: Option<View>,
        output: Option<View>,
    ) -> &mut Self {
        let desc = Desc {
            call,
            collective,
            dtype,
            op,
            root,
            count: count as u64,
            counts: Vec::new(),
            recv_counts: Vec::new(),
        };
        self.ops.push(Op::Coll {
            desc,
            input,
            output,
        });
        self
    }

    /// `len / n` elements per block, or the error naming this rank's in-place buffer.
    fn block_of(&self, call: &'static str, len: usize) -> Result<usize> {
        let n = self.n();
        if !len.is_multiple_of(n) {
            return Err(CollectivesError::CountMismatch {
                call,
                rank: self.me(),
                side: "in-place",
                got: len as u64,
                needs: (len / n + 1) as u64 * n as u64,
            });
        }
        Ok(len / n)
    }

    /// Add [`RankComm::all_reduce`].
    pub fn all_reduce<T: Element>(
        &mut self,
        send: &'b [T],
        recv: &'b mut [T],
        op: ReduceOp,
    ) -> &mut Self {
        let (i, o) = (self.lend(send), self.lend_mut(recv));
        let c = send.len();
        self.coll(
            "all_reduce",
            Collective::AllReduce,
            T::DTYPE,
            c,
            op,
            0,
            Some(i),
            Some(o),
        )
    }

    /// Add [`RankComm::all_reduce_in_place`].
    pub fn all_reduce_in_place<T: Element>(&mut self, buf: &'b mut [T], op: ReduceOp) -> &mut Self {
        let c = buf.len();
        let v = self.lend_mut(buf);
        self.coll(
            "all_reduce",
            Collective::AllReduce,
            T::DTYPE,
            c,
            op,
            0,
            Some(v),
            Some(v),
        )
    }

    /// Add [`RankComm::reduce`].
    pub fn reduce<T: Element>(
        &mut self,
        send: &'b [T],
        recv: Option<&'b mut [T]>,
        root: usize,
        op: ReduceOp,
    ) -> &mut Self {
        let c = send.len();
        let i = self.lend(send);
        let o = match recv {
            Some(r) if self.me() == root => Some(self.lend_mut(r)),
            _ => None,
        };
        self.coll(
            "reduce",
            Collective::Reduce,
            T::DTYPE,
            c,
            op,
            root,
            Some(i),
            o,
        )
    }

    /// Add [`RankComm::reduce_in_place`].
    pub fn reduce_in_place<T: Element>(
        &mut self,
        buf: &'b mut [T],
        root: usize,
        op: ReduceOp,
    ) -> &mut Self {
        let c = buf.len();
        let v = self.lend_mut(buf);
        let o = (self.me() == root).then_some(v);
        self.coll(
            "reduce",
            Collective::Reduce,
            T::DTYPE,
            c,
            op,
            root,
            Some(v),
            o,
        )
    }

    /// Add [`RankComm::broadcast`].
    pub fn broadcast<T: Element>(
        &mut self,
        send: Option<&'b [T]>,
        recv: &'b mut [T],
        root: usize,
    ) -> &mut Self {
        let c = recv.len();
        let i = match send {
            Some(s) if self.me() == root => Some(self.lend(s)),
            _ => None,
        };
        let o = self.lend_mut(recv);
        let sum = ReduceOp::Sum;
        self.coll(
            "broadcast",
            Collective::Broadcast,
            T::DTYPE,
            c,
            sum,
            root,
            i,
            Some(o),
        )
    }

    /// Add [`RankComm::broadcast_in_place`].
    pub fn broadcast_in_place<T: Element>(&mut self, buf: &'b mut [T], root: usize) -> &mut Self {
        let c = buf.len();
        let v = self.lend_mut(buf);
        let i = (self.me() == root).then_some(v);
        let sum = ReduceOp::Sum;
        self.coll(
            "broadcast",
            Collective::Broadcast,
            T::DTYPE,
            c,
            sum,
            root,
            i,
            Some(v),
        )
    }

    /// Add [`RankComm::all_gather`].
    pub fn all_gather<T: Element>(&mut self, send: &'b [T], recv: &'b mut [T]) -> &mut Self {
        let c = send.len();
        let (i, o) = (self.lend(send), self.lend_mut(recv));
        let sum = ReduceOp::Sum;
        self.coll(
            "all_gather",
            Collective::AllGather,
            T::DTYPE,
            c,
            sum,
            0,
            Some(i),
            Some(o),
        )
    }

    /// Add [`RankComm::all_gather_in_place`].
    pub fn all_gather_in_place<T: Element>(&mut self, buf: &'b mut [T]) -> &mut Self {
        let c = match self.block_of("all_gather", buf.len()) {
            Ok(c) => c,
            Err(e) => return self.fail(e),
        };
        let o = self.lend_mut(buf);
        let i = View {
            offset: (c * self.me()) as u64,
            len: c as u64,
            ..o
        };
        let sum = ReduceOp::Sum;
        self.coll(
            "all_gather",
            Collective::AllGather,
            T::DTYPE,
            c,
            sum,
            0,
            Some(i),
            Some(o),
        )
    }

    fn push_v(&mut self, desc: Desc, input: View, output: View) -> &mut Self {
        self.ops.push(Op::Coll {
            desc,
            input: Some(input),
            output: Some(output),
        });
        self
    }

    fn desc_v(call: &'static str, c: Collective, dtype: DType, counts: Vec<u64>) -> Desc {
        Desc {
            call,
            collective: c,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            count: 0,
            counts,
            recv_counts: Vec::new(),
        }
    }

    /// Add [`RankComm::all_gather_v`].
    pub fn all_gather_v<T: Element>(
        &mut self,
        send: &'b [T],
        recv: &'b mut [T],
        counts: &[usize],
    ) -> &mut Self {
        let (i, o) = (self.lend(send), self.lend_mut(recv));
        let d = Self::desc_v(
            "all_gather_v",
            Collective::AllGatherV,
            T::DTYPE,
            counts_u64(counts),
        );
        self.push_v(d, i, o)
    }

    /// Add [`RankComm::all_gather_v_in_place`].
    pub fn all_gather_v_in_place<T: Element>(
        &mut self,
        buf: &'b mut [T],
        counts: &[usize],
    ) -> &mut Self {
        let me = self.me();
        let Some(&mine) = counts.get(me) else {
            let e = CollectivesError::RankCount {
                call: "all_gather_v",
                side: "count",
                expected: self.n(),
                got: counts.len(),
            };
            return self.fail(e);
        };
        let o = self.lend_mut(buf);
        let i = View {
            offset: counts[..me].iter().sum::<usize>() as u64,
            len: mine as u64,
            ..o
        };
        let d = Self::desc_v(
            "all_gather_v",
            Collective::AllGatherV,
            T::DTYPE,
            counts_u64(counts),
        );
        self.push_v(d, i, o)
    }

    /// Add [`RankComm::reduce_scatter`].
    pub fn reduce_scatter<T: Element>(
        &mut self,
        send: &'b [T],
        recv: &'b mut [T],
        op: ReduceOp,
    ) -> &mut Self {
        let c = recv.len();
        let (i, o) = (self.lend(send), self.lend_mut(recv));
        let rs = Collective::ReduceScatter;
        self.coll("reduce_scatter", rs, T::DTYPE, c, op, 0, Some(i), Some(o))
    }

    /// Add [`RankComm::reduce_scatter_in_place`].
    pub fn reduce_scatter_in_place<T: Element>(
        &mut self,
        buf: &'b mut [T],
        op: ReduceOp,
    ) -> &mut Self {
        let c = match self.block_of("reduce_scatter", buf.len()) {
            Ok(c) => c,
            Err(e) => return self.fail(e),
        };
        let i = self.lend_mut(buf);
        let o = View {
            offset: (c * self.me()) as u64,
            len: c as u64,
            ..i
        };
        let rs = Collective::ReduceScatter;
        self.coll("reduce_scatter", rs, T::DTYPE, c, op, 0, Some(i), Some(o))
    }

    /// Add [`RankComm::all_to_all`].
    pub fn all_to_all<T: Element>(&mut self, send: &'b [T], recv: &'b mut [T]) -> &mut Self {
        let c = send.len() / self.n();
        let (i, o) = (self.lend(send), self.lend_mut(recv));
        let sum = ReduceOp::Sum;
        self.coll(
            "all_to_all",
            Collective::AllToAll,
            T::DTYPE,
            c,
            sum,
            0,
            Some(i),
            Some(o),
        )
    }

    /// Add [`RankComm::all_to_all_v`].
    pub fn all_to_all_v<T: Element>(
        &mut self,
        send: &'b [T],
        send_counts: &[usize],
        recv: &'b mut [T],
        recv_counts: &[usize],
    ) -> &mut Self {
        let (i, o) = (self.lend(send), self.lend_mut(recv));
        let mut d = Self::desc_v(
            "all_to_all_v",
            Collective::AllToAllV,
            T::DTYPE,
            counts_u64(send_counts),
        );
        d.recv_counts = counts_u64(recv_counts);
        self.push_v(d, i, o)
    }

    /// Add [`RankComm::gather`].
    pub fn gather<T: Element>(
        &mut self,
        send: &'b [T],
        recv: Option<&'b mut [T]>,
        root: usize,
    ) -> &mut Self {
        let c = send.len();
        let i = self.lend(send);
        let o = match recv {
            Some(r) if self.me() == root => Some(self.lend_mut(r)),
            _ => None,
        };
        let sum = ReduceOp::Sum;
        self.coll(
            "gather",
            Collective::Gather,
            T::DTYPE,
            c,
            sum,
            root,
            Some(i),
            o,
        )
    }

    /// Add [`RankComm::gather_in_place`].
    pub fn gather_in_place<T: Element>(&mut self, buf: &'b mut [T], root: usize) -> &mut Self {
        let sum = ReduceOp::Sum;
        if self.me() != root {
            let c = buf.len();
            let i = self.lend(buf);
            return self.coll(
                "gather",
                Collective::Gather,
                T::DTYPE,
                c,
                sum,
                root,
                Some(i),
                None,
            );
        }
        let c = match self.block_of("gather", buf.len()) {
            Ok(c) => c,
            Err(e) => return self.fail(e),
        };
        let o = self.lend_mut(buf);
        let i = View {
            offset: (c * root) as u64,
            len: c as u64,
            ..o
        };
        self.coll(
            "gather",
            Collective::Gather,
            T::DTYPE,
            c,
            sum,
            root,
            Some(i),
            Some(o),
        )
    }

    /// Add [`RankComm::scatter`].
    pub fn scatter<T: Element>(
        &mut self,
        send: Option<&'b [T]>,
        recv: &'b mut [T],
        root: usize,
    ) -> &mut Self {
        let c = recv.len();
        let i = match send {
            Some(s) if self.me() == root => Some(self.lend(s)),
            _ => None,
        };
        let o = self.lend_mut(recv);
        let sum = ReduceOp::Sum;
        self.coll(
            "scatter",
            Collective::Scatter,
            T::DTYPE,
            c,
            sum,
            root,
            i,
            Some(o),
        )
    }

    /// Add [`RankComm::scatter_in_place`].
    pub fn scatter_in_place<T: Element>(&mut self, buf: &'b mut [T], root: usize) -> &mut Self {
        let sum = ReduceOp::Sum;
        if self.me() != root {
            let c = buf.len();
            let o = self.lend_mut(buf);
            return self.coll(
                "scatter",
                Collective::Scatter,
                T::DTYPE,
                c,
                sum,
                root,
                None,
                Some(o),
            );
        }
        let c = match self.block_of("scatter", buf.len()) {
            Ok(c) => c,
            Err(e) => return self.fail(e),
        };
        let i = self.lend_mut(buf);
        let o = View {
            offset: (c * root) as u64,
            len: c as u64,
            ..i
        };
        self.coll(
            "scatter",
            Collective::Scatter,
            T::DTYPE,
            c,
            sum,
            root,
            Some(i),
            Some(o),
        )
    }

    /// Post a send of `buf` to rank `peer` (`ncclSend`).
    pub fn send<T: Element>(&mut self, buf: &'b [T], peer: usize) -> &mut Self {
        let view = self.lend(buf);
        self.ops.push(Op::P2p {
            send: true,
            peer,
            view,
            dtype: T::DTYPE,
        });
        self
    }

    /// Post a receive into `buf` from rank `peer` (`ncclRecv`).
    pub fn recv<T: Element>(&mut self, buf: &'b mut [T], peer: usize) -> &mut Self {
        let view = self.lend_mut(buf);
        self.ops.push(Op::P2p {
            send: false,
            peer,
            view,
            dtype: T::DTYPE,
        });
        self
    }

    fn finish(self, call: &'static str) -> Result<()> {
        let ops = match self.error {
            Some(e) => Err(e),
            None => Ok(self.ops),
        };
        self.comm.meet(call, self.blocks, ops).map(|_| ())
    }

    /// Run the group with the other ranks' groups; returns when it is done on every rank.
    pub fn launch(self) -> Result<()> {
        self.finish("group")
    }
}

/// One call of [`RankComm`]: a group of one operation.
macro_rules! one {
    ($self:ident, $call:literal, |$g:ident| $add:expr) => {{
        let mut $g = $self.group();
        $add;
        $g.finish($call)
    }};
}

impl RankComm {
    /// Start a group of this rank's calls ([`RankGroup`]).
    pub fn group<'b>(&mut self) -> RankGroup<'_, 'b> {
        RankGroup {
            comm: self,
            blocks: Vec::new(),
            ops: Vec::new(),
            error: None,
            _borrows: PhantomData,
        }
    }

    /// `recv = op(every rank's send)` (`ncclAllReduce`, `MPI_Allreduce`).
    pub fn all_reduce<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        one!(self, "all_reduce", |g| g.all_reduce(send, recv, op))
    }

    /// `buf = op(every rank's buf)`, in place.
    pub fn all_reduce_in_place<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        one!(self, "all_reduce", |g| g.all_reduce_in_place(buf, op))
    }

    /// `recv = op(every rank's send)` on rank `root` (`ncclReduce`, `MPI_Reduce`); `recv` is
    /// read only on the root, which must give it.
    pub fn reduce<T: Element>(
        &mut self,
        send: &[T],
        recv: Option<&mut [T]>,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        one!(self, "reduce", |g| g.reduce(send, recv, root, op))
    }

    /// As [`RankComm::reduce`], in place: the root's `buf` is its input and the result; the
    /// others' `buf` is their input.
    pub fn reduce_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        one!(self, "reduce", |g| g.reduce_in_place(buf, root, op))
    }

    /// The root's `send` to every rank's `recv` (`ncclBroadcast`, `MPI_Bcast`); `send` is read
    /// only on the root, which must give it.
    pub fn broadcast<T: Element>(
        &mut self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        one!(self, "broadcast", |g| g.broadcast(send, recv, root))
    }

    /// The root's `buf` to every rank's `buf`, in place.
    pub fn broadcast_in_place<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        one!(self, "broadcast", |g| g.broadcast_in_place(buf, root))
    }

    /// Every rank's `send`, concatenated in rank order, into `recv` (`ncclAllGather`,
    /// `MPI_Allgather`).
    pub fn all_gather<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        one!(self, "all_gather", |g| g.all_gather(send, recv))
    }

    /// As [`RankComm::all_gather`], in place: this rank's input is block `rank` of `buf`
    /// (`buf.len()` a multiple of the rank count).
    pub fn all_gather_in_place<T: Element>(&mut self, buf: &mut [T]) -> Result<()> {
        one!(self, "all_gather", |g| g.all_gather_in_place(buf))
    }

    /// As [`RankComm::all_gather`] with rank `r` giving `counts[r]` elements (`MPI_Allgatherv`);
    /// every rank gives the same `counts`.
    pub fn all_gather_v<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        one!(self, "all_gather_v", |g| g.all_gather_v(send, recv, counts))
    }

    /// As [`RankComm::all_gather_v`], in place: this rank's input is its block of `buf`.
    pub fn all_gather_v_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        one!(self, "all_gather_v", |g| g
            .all_gather_v_in_place(buf, counts))
    }

    /// Block `rank` of `op(every rank's send)` into `recv` (`ncclReduceScatter`,
    /// `MPI_Reduce_scatter_block`).
    pub fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        one!(self, "reduce_scatter", |g| g.reduce_scatter(send, recv, op))
    }

    /// As [`RankComm::reduce_scatter`], in place: the result lands in block `rank` of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        one!(self, "reduce_scatter", |g| g
            .reduce_scatter_in_place(buf, op))
    }

    /// Block `d` of `send` to block `rank` of rank `d`'s `recv` (`MPI_Alltoall`).
    pub fn all_to_all<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        one!(self, "all_to_all", |g| g.all_to_all(send, recv))
    }

    /// `send_counts[d]` elements to rank `d` (blocks in rank order), `recv_counts[s]` from
    /// rank `s` (`MPI_Alltoallv`); the counts must agree across ranks.
    pub fn all_to_all_v<T: Element>(
        &mut self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        one!(self, "all_to_all_v", |g| g.all_to_all_v(
            send,
            send_counts,
            recv,
            recv_counts
        ))
    }

    /// Every rank's `send`, concatenated in rank order, into `recv` on rank `root`
    /// (`MPI_Gather`); `recv` is read only on the root, which must give it.
    pub fn gather<T: Element>(
        &mut self,
        send: &[T],
        recv: Option<&mut [T]>,
        root: usize,
    ) -> Result<()> {
        one!(self, "gather", |g| g.gather(send, recv, root))
    }

    /// As [`RankComm::gather`], in place: the root's `buf` is the whole output with its own
    /// input as block `root`; the others' `buf` is their input.
    pub fn gather_in_place<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        one!(self, "gather", |g| g.gather_in_place(buf, root))
    }

    /// Block `rank` of the root's `send` into `recv` (`MPI_Scatter`); `send` is read only on
    /// the root, which must give it.
    pub fn scatter<T: Element>(
        &mut self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        one!(self, "scatter", |g| g.scatter(send, recv, root))
    }

    /// As [`RankComm::scatter`], in place: the root's `buf` is the whole input and keeps
    /// block `root` as its output; the others' `buf` is their output.
    pub fn scatter_in_place<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        one!(self, "scatter", |g| g.scatter_in_place(buf, root))
    }

    /// Send `buf` to rank `peer` (`ncclSend`), meeting its [`RankComm::recv`]; only the two
    /// ranks take part.
    pub fn send<T: Element>(&mut self, buf: &[T], peer: usize) -> Result<()> {
        let span = Span {
            addr: buf.as_ptr() as usize,
            bytes: std::mem::size_of_val(buf) as u64,
        };
        let view = View {
            block: 0,
            offset: 0,
            len: buf.len() as u64,
        };
        let op = Op::P2p {
            send: true,
            peer,
            view,
            dtype: T::DTYPE,
        };
        self.meet_pair("send", peer, vec![span], Ok(vec![op]))
    }

    /// Receive into `buf` from rank `peer` (`ncclRecv`), meeting its [`RankComm::send`].
    pub fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize) -> Result<()> {
        let view = View {
            block: 0,
            offset: 0,
            len: buf.len() as u64,
        };
        let span = Span {
            addr: buf.as_mut_ptr() as usize,
            bytes: std::mem::size_of_val(buf) as u64,
        };
        let op = Op::P2p {
            send: false,
            peer,
            view,
            dtype: T::DTYPE,
        };
        self.meet_pair("recv", peer, vec![span], Ok(vec![op]))
    }
}
