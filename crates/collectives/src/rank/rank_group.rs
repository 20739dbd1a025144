//! [`RankCalls`]: what each collective lends and describes (its descriptor, this rank's input
//! and output views), written once for every surface: the single calls
//! ([`super::Collectives`]), [`RankGroup`] (a runner's calls collected to run as one launch)
//! and the all-ranks [`crate::Group`], which adds each rank's part through it.
//!
//! A rank's own argument errors (an in-place buffer whose length is not a multiple of the
//! rank count, a count list too short) travel to the rendezvous with the call, so they fail
//! the call on every rank instead of leaving the others to time out.

use std::marker::PhantomData;

use relaycc_route::{Collective, DType, ReduceOp};

use crate::buffer::RawView;
use crate::element::Element;
use crate::error::{CollectivesError, Result};

#[cfg(doc)]
use super::Collectives;
use super::Departure;
use super::buffers::{Lender, RecvBuf, SendBuf};
use super::collectives::sealed::{Runner, RunnerToken};
use super::op::{Desc, P2pOp, RankCallOp, View};

/// Calls of one rank collected to run as one launch (`ncclGroupStart` / `ncclGroupEnd`):
/// collectives, sends and receives, on buffers borrowed until [`RankGroup::launch`]. Made by
/// [`Collectives::group`] on any surface (threads, CUDA streams, MPI processes). Its calls
/// are [`RankCalls`]'s, reached through `Deref`.
///
/// A group with a collective is a call every rank makes (an empty group where a rank has
/// nothing to add): the ranks' collectives must match in order. A group of only sends and
/// receives involves only the peers it names; sends pair with receives in posting order per
/// (sender, receiver), and an empty group is done at once. The operations of a group run
/// concurrently on threads; MPI processes run its collectives one after another, run a
/// group of sends and receives at once (GPU ranks over MPI: one at a time), and refuse a
/// group that mixes the two. Argument errors found while adding are kept and returned by
/// `launch`, on every rank the group involves.
#[must_use = "a group does nothing until launched"]
pub struct RankGroup<'r, 'b> {
    comm: &'r mut dyn Runner,
    calls: RankCalls<'b>,
}

/// One rank's calls as a group collects them: each collective's descriptor and this rank's
/// views of the memory it lends. This is the one place a collective's per-rank meaning is
/// written (which buffer is its input and output, where its count comes from, what an
/// in-place call lends); every surface reaches it, the per-rank ones through [`RankGroup`]
/// and the all-ranks [`crate::Group`] once per rank.
pub struct RankCalls<'b> {
    me: usize,
    n: usize,
    /// The caller's tag of this call ([`Collectives::tag_next`]), 0 for none.
    tag: u64,
    pub(super) lender: Lender<'b>,
    pub(super) ops: Vec<RankCallOp>,
    _borrows: PhantomData<&'b mut [u8]>,
}

/// One rank's collective on held buffers, as [`RankCalls::take_held`] gives it.
pub(crate) struct HeldCall {
    pub desc: Desc,
    pub input: Option<RawView>,
    pub output: Option<RawView>,
}

impl std::fmt::Debug for RankGroup<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.calls.fmt(f)
    }
}

impl std::fmt::Debug for RankCalls<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankCalls")
            .field("rank", &self.me)
            .field("ops", &self.ops)
            .finish_non_exhaustive()
    }
}

impl<'r, 'b> RankGroup<'r, 'b> {
    /// A group of `comm`'s next call, lending through `lender`.
    pub(crate) fn new(comm: &'r mut dyn Runner, lender: Lender<'b>) -> Self {
        let calls = RankCalls::new(comm.me(), comm.n(), comm.tag(), lender);
        RankGroup { comm, calls }
    }
}

impl<'b> std::ops::Deref for RankGroup<'_, 'b> {
    type Target = RankCalls<'b>;
    fn deref(&self) -> &RankCalls<'b> {
        &self.calls
    }
}

impl<'b> std::ops::DerefMut for RankGroup<'_, 'b> {
    fn deref_mut(&mut self) -> &mut RankCalls<'b> {
        &mut self.calls
    }
}

impl<'b> RankCalls<'b> {
    /// Rank `me` of `n` ranks' calls, tagged `tag`, lending through `lender`.
    pub(crate) fn new(me: usize, n: usize, tag: u64, lender: Lender<'b>) -> Self {
        RankCalls {
            me,
            n,
            tag,
            lender,
            ops: Vec::new(),
            _borrows: PhantomData,
        }
    }

    /// What was added: the operations in order, what they lend, and the first argument
    /// error met while adding, if any.
    pub(crate) fn into_parts(self) -> (Vec<RankCallOp>, Lender<'b>) {
        (self.ops, self.lender)
    }

    /// The collective added last, with its input and output as the views of held buffers
    /// they were lent from (`HeldView`), or the first argument error met; then start over
    /// as rank `next`'s calls, keeping the lists' memory. The all-ranks calls add every
    /// rank's part through one `RankCalls` this way.
    pub(crate) fn take_held(&mut self, next: usize) -> Result<Option<HeldCall>> {
        let op = self.ops.pop();
        self.ops.clear();
        self.me = next;
        let error = self.lender.take_error();
        let spans = &self.lender.blocks;
        let call = match op {
            Some(RankCallOp::Coll {
                desc,
                input,
                output,
                ..
            }) => Some(HeldCall {
                input: input.and_then(|v| v.held_in(spans, desc.dtype)),
                output: output.and_then(|v| v.held_in(spans, desc.dtype)),
                desc,
            }),
            _ => None,
        };
        self.lender.blocks.clear();
        match error {
            Some(e) => Err(e),
            None => Ok(call),
        }
    }
}

/// The one table of per-rank collectives: each entry names a [`RankCalls`] method (written
/// below), the call it runs as, its buffers (`io`: a send and a receive buffer; `buf`: one
/// buffer, in place) and its other arguments, with the docs of the single call. `$m!`
/// receives the table: the [`Collectives`] trait makes its single calls from it, so a new
/// collective is its entry here and its method below.
macro_rules! rank_collectives {
    ($m:ident) => {
        $m! {
            /// `recv = op(every rank's send)` (`ncclAllReduce`, `MPI_Allreduce`).
            all_reduce "all_reduce" io (send: &S, recv: &mut R, op: ReduceOp);
            /// `buf = op(every rank's buf)`, in place.
            all_reduce_in_place "all_reduce" buf (buf: &mut R, op: ReduceOp);
            /// `recv = op(every rank's send)` on rank `root` (`ncclReduce`, `MPI_Reduce`); `recv`
            /// is used only on the root, which must give it.
            reduce "reduce" io (send: &S, recv: Option<&mut R>, root: usize, op: ReduceOp);
            /// As `reduce`, in place: the root's `buf` is its input and the result; the others'
            /// `buf` is their input.
            reduce_in_place "reduce" buf (buf: &mut R, root: usize, op: ReduceOp);
            /// The root's `send` to every rank's `recv` (`ncclBroadcast`, `MPI_Bcast`); `send` is
            /// used only on the root, which must give it.
            broadcast "broadcast" io (send: Option<&S>, recv: &mut R, root: usize);
            /// The root's `buf` to every rank's `buf`, in place.
            broadcast_in_place "broadcast" buf (buf: &mut R, root: usize);
            /// Every rank's `send`, concatenated in rank order, into `recv` (`ncclAllGather`,
            /// `MPI_Allgather`).
            all_gather "all_gather" io (send: &S, recv: &mut R);
            /// As `all_gather`, in place: this rank's input is block `rank` of `buf` (its length a
            /// multiple of the rank count).
            all_gather_in_place "all_gather" buf (buf: &mut R);
            /// As `all_gather` with rank `r` giving `counts[r]` elements (`MPI_Allgatherv`); every
            /// rank gives the same `counts`.
            all_gather_v "all_gather_v" io (send: &S, recv: &mut R, counts: &[usize]);
            /// As `all_gather_v`, in place: this rank's input is its block of `buf`.
            all_gather_v_in_place "all_gather_v" buf (buf: &mut R, counts: &[usize]);
            /// Block `rank` of `op(every rank's send)` into `recv` (`ncclReduceScatter`,
            /// `MPI_Reduce_scatter_block`).
            reduce_scatter "reduce_scatter" io (send: &S, recv: &mut R, op: ReduceOp);
            /// As `reduce_scatter`, in place: the result lands in block `rank` of `buf`.
            reduce_scatter_in_place "reduce_scatter" buf (buf: &mut R, op: ReduceOp);
            /// As `reduce_scatter` with block `r` of `counts[r]` elements, the blocks in rank
            /// order (`MPI_Reduce_scatter`): `recv` takes block `rank`; every rank gives the
            /// same `counts`.
            reduce_scatter_v "reduce_scatter_v" io
                (send: &S, recv: &mut R, counts: &[usize], op: ReduceOp);
            /// As `reduce_scatter_v`, in place: the result lands in this rank's block of `buf`.
            reduce_scatter_v_in_place "reduce_scatter_v" buf
                (buf: &mut R, counts: &[usize], op: ReduceOp);
            /// Block `d` of `send` to block `rank` of rank `d`'s `recv` (`MPI_Alltoall`).
            all_to_all "all_to_all" io (send: &S, recv: &mut R);
            /// `send_counts[d]` elements to rank `d` (blocks in rank order), `recv_counts[s]` from
            /// rank `s` (`MPI_Alltoallv`); the counts must agree across ranks.
            all_to_all_v "all_to_all_v" io
                (send: &S, send_counts: &[usize], recv: &mut R, recv_counts: &[usize]);
            /// Every rank's `send`, concatenated in rank order, into `recv` on rank `root`
            /// (`MPI_Gather`); `recv` is used only on the root, which must give it.
            gather "gather" io (send: &S, recv: Option<&mut R>, root: usize);
            /// As `gather`, in place: the root's `buf` is the whole output with its own input as
            /// block `root`; the others' `buf` is their input.
            gather_in_place "gather" buf (buf: &mut R, root: usize);
            /// Block `rank` of the root's `send` into `recv` (`MPI_Scatter`); `send` is used only
            /// on the root, which must give it.
            scatter "scatter" io (send: Option<&S>, recv: &mut R, root: usize);
            /// As `scatter`, in place: the root's `buf` is the whole input and keeps block `root`
            /// as its output; the others' `buf` is their output.
            scatter_in_place "scatter" buf (buf: &mut R, root: usize);
        }
    };
}
pub(crate) use rank_collectives;

fn counts_u64(c: &[usize]) -> Vec<u64> {
    c.iter().map(|&x| x as u64).collect()
}

impl<'b> RankCalls<'b> {
    fn me(&self) -> usize {
        self.me
    }
    fn n(&self) -> usize {
        self.n
    }

    fn lend<T: Element, S: SendBuf<T> + ?Sized>(&mut self, s: &'b S) -> View {
        s.lend(&mut self.lender)
    }

    fn lend_mut<T: Element, R: RecvBuf<T> + ?Sized>(&mut self, s: &'b mut R) -> View {
        s.lend_mut(&mut self.lender)
    }

    fn fail(&mut self, e: CollectivesError) -> &mut Self {
        self.lender.error.get_or_insert(e);
        self
    }

    /// The descriptor of a collective (its call named after it) with one count, op and root.
    fn desc<T: Element>(collective: Collective, count: usize, op: ReduceOp, root: usize) -> Desc {
        Desc::new(collective, T::DTYPE, count as u64, op, root)
    }

    /// The one path every collective of a group ends in: its descriptor and this rank's
    /// input and output views (`None` where the rank has none).
    fn push(
        &mut self,
        mut desc: Desc,
        (input, output): (Option<View>, Option<View>),
        in_place: bool,
    ) -> &mut Self {
        desc.tag = self.tag;
        self.ops.push(RankCallOp::Coll {
            desc,
            input,
            output,
            in_place,
        });
        self
    }

    /// A collective on separate buffers: lend `send` as the input and `recv` as the output
    /// where given.
    fn separate<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        desc: Desc,
        send: Option<&'b S>,
        recv: Option<&'b mut R>,
    ) -> &mut Self {
        let i = send.map(|s| self.lend(s));
        let o = recv.map(|r| self.lend_mut(r));
        self.push(desc, (i, o), false)
    }

    /// A rooted collective whose input is the root's `send` (ignored elsewhere) and whose
    /// output is every rank's `recv`; the count is `recv`'s length.
    fn root_sends<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        c: Collective,
        send: Option<&'b S>,
        recv: &'b mut R,
        root: usize,
    ) -> &mut Self {
        let d = Self::desc::<T>(c, RecvBuf::<T>::elems(recv), ReduceOp::Sum, root);
        let is_root = self.me() == root;
        self.separate(d, send.filter(|_| is_root), Some(recv))
    }

    /// A rooted collective whose input is every rank's `send` and whose output is the root's
    /// `recv` (ignored elsewhere); the count is `send`'s length.
    fn root_receives<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        c: Collective,
        send: &'b S,
        recv: Option<&'b mut R>,
        (op, root): (ReduceOp, usize),
    ) -> &mut Self {
        let d = Self::desc::<T>(c, SendBuf::<T>::elems(send), op, root);
        let is_root = self.me() == root;
        self.separate(d, Some(send), recv.filter(|_| is_root))
    }

    /// An in-place collective whose buffer is wholly the input and/or wholly the output;
    /// `count` is the buffer's length.
    fn whole<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        c: Collective,
        buf: &'b mut R,
        (op, root): (ReduceOp, usize),
        (input, output): (bool, bool),
    ) -> &mut Self {
        let count = RecvBuf::<T>::elems(buf);
        let v = self.lend_mut(buf);
        let d = Self::desc::<T>(c, count, op, root);
        self.push(d, (input.then_some(v), output.then_some(v)), true)
    }

    /// An in-place collective whose buffer is `n` blocks: block `at` is the input (and the
    /// whole buffer the output) or the output (and the whole buffer the input); the count is
    /// one block. A length that is not a multiple of `n` fails the call.
    fn blocks<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        c: Collective,
        buf: &'b mut R,
        (op, root, at): (ReduceOp, usize, usize),
        block_is_input: bool,
    ) -> &mut Self {
        let count = match self.block_of(c.name(), RecvBuf::<T>::elems(buf)) {
            Ok(count) => count,
            Err(e) => return self.fail(e),
        };
        let whole = self.lend_mut(buf);
        let block = View {
            offset: (count * at) as u64,
            len: count as u64,
            ..whole
        };
        let d = Self::desc::<T>(c, count, op, root);
        if block_is_input {
            self.push(d, (Some(block), Some(whole)), true)
        } else {
            self.push(d, (Some(whole), Some(block)), true)
        }
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

    /// Add [`Collectives::all_reduce`].
    pub fn all_reduce<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
        op: ReduceOp,
    ) -> &mut Self {
        let d = Self::desc::<T>(Collective::AllReduce, SendBuf::<T>::elems(send), op, 0);
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`Collectives::all_reduce_in_place`].
    pub fn all_reduce_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        op: ReduceOp,
    ) -> &mut Self {
        self.whole(Collective::AllReduce, buf, (op, 0), (true, true))
    }

    /// Add [`Collectives::reduce`].
    pub fn reduce<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: Option<&'b mut R>,
        root: usize,
        op: ReduceOp,
    ) -> &mut Self {
        self.root_receives::<T, S, R>(Collective::Reduce, send, recv, (op, root))
    }

    /// Add [`Collectives::reduce_in_place`].
    pub fn reduce_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        root: usize,
        op: ReduceOp,
    ) -> &mut Self {
        let is_root = self.me() == root;
        self.whole(Collective::Reduce, buf, (op, root), (true, is_root))
    }

    /// Add [`Collectives::broadcast`].
    pub fn broadcast<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: Option<&'b S>,
        recv: &'b mut R,
        root: usize,
    ) -> &mut Self {
        self.root_sends::<T, S, R>(Collective::Broadcast, send, recv, root)
    }

    /// Add [`Collectives::broadcast_in_place`].
    pub fn broadcast_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        root: usize,
    ) -> &mut Self {
        let is_root = self.me() == root;
        let how = (ReduceOp::Sum, root);
        self.whole(Collective::Broadcast, buf, how, (is_root, true))
    }

    /// Add [`Collectives::all_gather`].
    pub fn all_gather<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
    ) -> &mut Self {
        let c = SendBuf::<T>::elems(send);
        let d = Self::desc::<T>(Collective::AllGather, c, ReduceOp::Sum, 0);
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`Collectives::all_gather_in_place`].
    pub fn all_gather_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
    ) -> &mut Self {
        let how = (ReduceOp::Sum, 0, self.me());
        self.blocks(Collective::AllGather, buf, how, true)
    }

    fn desc_v(c: Collective, dtype: DType, counts: Vec<u64>) -> Desc {
        Desc {
            counts,
            ..Desc::new(c, dtype, 0, ReduceOp::Sum, 0)
        }
    }

    /// Add [`Collectives::all_gather_v`].
    pub fn all_gather_v<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
        counts: &[usize],
    ) -> &mut Self {
        let d = Self::desc_v(Collective::AllGatherV, T::DTYPE, counts_u64(counts));
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`Collectives::all_gather_v_in_place`].
    pub fn all_gather_v_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        counts: &[usize],
    ) -> &mut Self {
        let (offset, len) = match self.own_block("all_gather_v", counts) {
            Ok(block) => block,
            Err(e) => return self.fail(e),
        };
        let o = self.lend_mut(buf);
        let i = View { offset, len, ..o };
        let d = Self::desc_v(Collective::AllGatherV, T::DTYPE, counts_u64(counts));
        self.push(d, (Some(i), Some(o)), true)
    }

    /// This rank's block of a v-collective's buffer of `counts` in rank order: its offset (the
    /// counts before it) and length, or the error naming the short list or the overflow.
    fn own_block(&self, call: &'static str, counts: &[usize]) -> Result<(u64, u64)> {
        let me = self.me();
        let Some(&mine) = counts.get(me) else {
            return Err(CollectivesError::RankCount {
                call,
                side: "counts",
                expected: self.n(),
                got: counts.len(),
            });
        };
        let offset = counts[..me]
            .iter()
            .try_fold(0u64, |a, &c| a.checked_add(c as u64))
            .ok_or_else(|| CollectivesError::Overflow {
                call,
                what: format!("the counts of ranks 0..{me} sum past u64"),
            })?;
        Ok((offset, mine as u64))
    }

    /// Add [`Collectives::reduce_scatter`].
    pub fn reduce_scatter<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
        op: ReduceOp,
    ) -> &mut Self {
        let c = RecvBuf::<T>::elems(recv);
        let d = Self::desc::<T>(Collective::ReduceScatter, c, op, 0);
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`Collectives::reduce_scatter_in_place`].
    pub fn reduce_scatter_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        op: ReduceOp,
    ) -> &mut Self {
        let how = (op, 0, self.me());
        self.blocks(Collective::ReduceScatter, buf, how, false)
    }

    /// Add [`Collectives::reduce_scatter_v`].
    pub fn reduce_scatter_v<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
        counts: &[usize],
        op: ReduceOp,
    ) -> &mut Self {
        let d = Desc {
            op,
            ..Self::desc_v(Collective::ReduceScatterV, T::DTYPE, counts_u64(counts))
        };
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`Collectives::reduce_scatter_v_in_place`].
    pub fn reduce_scatter_v_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        counts: &[usize],
        op: ReduceOp,
    ) -> &mut Self {
        let (offset, len) = match self.own_block("reduce_scatter_v", counts) {
            Ok(block) => block,
            Err(e) => return self.fail(e),
        };
        let i = self.lend_mut(buf);
        let o = View { offset, len, ..i };
        let d = Desc {
            op,
            ..Self::desc_v(Collective::ReduceScatterV, T::DTYPE, counts_u64(counts))
        };
        self.push(d, (Some(i), Some(o)), true)
    }

    /// Add [`Collectives::all_to_all`].
    pub fn all_to_all<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
    ) -> &mut Self {
        let c = SendBuf::<T>::elems(send) / self.n();
        let d = Self::desc::<T>(Collective::AllToAll, c, ReduceOp::Sum, 0);
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`Collectives::all_to_all_v`].
    pub fn all_to_all_v<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        send_counts: &[usize],
        recv: &'b mut R,
        recv_counts: &[usize],
    ) -> &mut Self {
        let mut d = Self::desc_v(Collective::AllToAllV, T::DTYPE, counts_u64(send_counts));
        d.recv_counts = counts_u64(recv_counts);
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`Collectives::gather`].
    pub fn gather<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: Option<&'b mut R>,
        root: usize,
    ) -> &mut Self {
        let how = (ReduceOp::Sum, root);
        self.root_receives::<T, S, R>(Collective::Gather, send, recv, how)
    }

    /// Add [`Collectives::gather_in_place`].
    pub fn gather_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        root: usize,
    ) -> &mut Self {
        let g = Collective::Gather;
        if self.me() != root {
            return self.whole(g, buf, (ReduceOp::Sum, root), (true, false));
        }
        self.blocks(g, buf, (ReduceOp::Sum, root, root), true)
    }

    /// Add [`Collectives::scatter`].
    pub fn scatter<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: Option<&'b S>,
        recv: &'b mut R,
        root: usize,
    ) -> &mut Self {
        self.root_sends::<T, S, R>(Collective::Scatter, send, recv, root)
    }

    /// Add [`Collectives::scatter_in_place`].
    pub fn scatter_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        root: usize,
    ) -> &mut Self {
        let s = Collective::Scatter;
        if self.me() != root {
            return self.whole(s, buf, (ReduceOp::Sum, root), (false, true));
        }
        self.blocks(s, buf, (ReduceOp::Sum, root, root), false)
    }

    /// Post a send of `buf` to rank `peer` (`ncclSend`).
    pub fn send<T: Element, S: SendBuf<T> + ?Sized>(
        &mut self,
        buf: &'b S,
        peer: usize,
    ) -> &mut Self {
        let view = self.lend(buf);
        self.ops.push(RankCallOp::P2p(P2pOp {
            send: true,
            peer,
            view,
            dtype: T::DTYPE,
        }));
        self
    }

    /// Post a receive into `buf` from rank `peer` (`ncclRecv`).
    pub fn recv<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        peer: usize,
    ) -> &mut Self {
        let view = self.lend_mut(buf);
        self.ops.push(RankCallOp::P2p(P2pOp {
            send: false,
            peer,
            view,
            dtype: T::DTYPE,
        }));
        self
    }
}

impl<'b> RankGroup<'_, 'b> {
    /// Leave the group with its runner without waiting for the other ranks (the in-process
    /// meeting), or run it (a runner that cannot leave a call behind).
    pub(super) fn depart(self) -> Departure<'b> {
        let RankGroup { comm, calls } = self;
        let (ops, lender) = calls.into_parts();
        // The tag is this call's only.
        comm.clear_tag(RunnerToken::new());
        comm.depart(lender, ops, RunnerToken::new())
    }

    /// Run the group as call `call`; returns when it is done on this rank.
    pub(super) fn finish(self, call: &'static str) -> Result<()> {
        self.depart().wait(call)
    }

    /// Run the group's one send or receive with its peer only (the single calls `send` and
    /// `recv`).
    pub(super) fn finish_point_to_point(self, call: &'static str) -> Result<()> {
        let RankGroup { comm, calls } = self;
        let (mut ops, lender) = calls.into_parts();
        comm.clear_tag(RunnerToken::new());
        match (ops.pop(), ops.is_empty()) {
            (Some(op @ RankCallOp::P2p(_)), true) => {
                comm.point_to_point(call, lender, op, RunnerToken::new())
            }
            _ => Err(CollectivesError::Unmatched(format!(
                "{call}: a point-to-point call carries {} operations",
                ops.len() + 1
            ))),
        }
    }

    /// Run the group with the other ranks' groups (a group of sends and receives alone, with
    /// its peers' only); returns when it is done on every rank it involves.
    pub fn launch(self) -> Result<()> {
        self.finish("group")
    }
}
