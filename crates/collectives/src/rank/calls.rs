//! The typed per-rank calls on borrowed host slices, and [`RankGroup`], the calls of one
//! rank collected to run as one launch.
//!
//! A rank's own argument errors (an in-place buffer whose length is not a multiple of the
//! rank count, a count list too short) travel to the meeting with the call, so they fail
//! the call on every rank instead of leaving the others to time out.

use std::marker::PhantomData;
#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use cudarc::driver::CudaStream;

use relaycc_route::{Collective, DType, ReduceOp};

use crate::element::Element;
use crate::error::{CollectivesError, Result};

use super::op::{Desc, Op, Span, View};
use super::{Departure, RankComm};

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
    lender: Lender<'b>,
    ops: Vec<Op>,
    _borrows: PhantomData<&'b mut [u8]>,
}

/// What a rank's buffers lend to its call: their spans, the caller's stream for device
/// buffers, and the cudarc guards that record the buffers' events when the call ends.
#[derive(Debug, Default)]
pub struct Lender<'b> {
    blocks: Vec<Span>,
    error: Option<CollectivesError>,
    #[cfg(feature = "cuda")]
    stream: Option<&'b Arc<CudaStream>>,
    #[cfg(feature = "cuda")]
    guards: Vec<cudarc::driver::SyncOnDrop<'b>>,
    #[cfg(not(feature = "cuda"))]
    _b: PhantomData<&'b ()>,
}

impl<'b> Lender<'b> {
    /// A lender for calls on the caller's CUDA stream outside this module (the GPU ranks
    /// of `mpi::gpu`): cudarc buffers lend their device pointers on `stream`.
    #[cfg(all(feature = "cuda", feature = "mpi"))]
    pub(crate) fn on_stream(stream: &'b Arc<CudaStream>) -> Self {
        Lender {
            stream: Some(stream),
            ..Lender::default()
        }
    }

    /// Lend `buf` for reading; the view of the whole buffer.
    #[cfg(all(feature = "cuda", feature = "mpi"))]
    pub(crate) fn lend<T: Element, S: SendBuf<T> + ?Sized>(&mut self, buf: &'b S) -> View {
        buf.lend(self)
    }

    /// Lend `buf` for writing; the view of the whole buffer.
    #[cfg(all(feature = "cuda", feature = "mpi"))]
    pub(crate) fn lend_mut<T: Element, R: RecvBuf<T> + ?Sized>(&mut self, buf: &'b mut R) -> View {
        buf.lend_mut(self)
    }

    /// The lent spans, by block.
    #[cfg(all(feature = "cuda", feature = "mpi"))]
    pub(crate) fn spans(&self) -> &[Span] {
        &self.blocks
    }

    /// The first error met while lending (a buffer of another device, no stream).
    #[cfg(all(feature = "cuda", feature = "mpi"))]
    pub(crate) fn take_error(&mut self) -> Option<CollectivesError> {
        self.error.take()
    }
}

impl Lender<'_> {
    fn push(&mut self, span: Span, len: usize) -> View {
        self.blocks.push(span);
        View {
            block: self.blocks.len() - 1,
            offset: 0,
            len: len as u64,
        }
    }
}

mod sealed {
    use super::{Lender, View};

    /// How a buffer lends itself for reading.
    pub trait Lend<T> {
        /// Lend for one call; the view of the whole buffer.
        fn lend<'b>(&'b self, l: &mut Lender<'b>) -> View;
        /// Elements.
        fn elems(&self) -> usize;
    }
    /// How a buffer lends itself for writing.
    pub trait LendMut<T> {
        /// Lend for one call; the view of the whole buffer.
        fn lend_mut<'b>(&'b mut self, l: &mut Lender<'b>) -> View;
        /// Elements.
        fn elems(&self) -> usize;
    }
}

/// A buffer a per-rank call reads: host memory (`[T]`, `Vec<T>`, `[T; N]`) or, with feature
/// `cuda`, device memory (cudarc's `CudaSlice<T>`, `CudaView`, `CudaViewMut`, which a call
/// takes on the caller's stream: `RankComm::on`).
pub trait SendBuf<T: Element>: sealed::Lend<T> {
    /// Elements in the buffer.
    fn elems(&self) -> usize {
        sealed::Lend::elems(self)
    }
}
/// A buffer a per-rank call writes: host memory (`[T]`, `Vec<T>`, `[T; N]`) or, with feature
/// `cuda`, device memory (cudarc's `CudaSlice<T>`, `CudaViewMut`).
pub trait RecvBuf<T: Element>: sealed::LendMut<T> {
    /// Elements in the buffer.
    fn elems(&self) -> usize {
        sealed::LendMut::elems(self)
    }
}

fn host_span<T>(addr: usize, s: &[T]) -> Span {
    Span {
        addr,
        bytes: std::mem::size_of_val(s) as u64,
        device: None,
    }
}

impl<T: Element> sealed::Lend<T> for [T] {
    fn lend<'b>(&'b self, l: &mut Lender<'b>) -> View {
        l.push(host_span(self.as_ptr() as usize, self), self.len())
    }
    fn elems(&self) -> usize {
        self.len()
    }
}
impl<T: Element> sealed::LendMut<T> for [T] {
    fn lend_mut<'b>(&'b mut self, l: &mut Lender<'b>) -> View {
        // The address comes from the unique borrow: the backend writes through it.
        let span = host_span(self.as_mut_ptr() as usize, self);
        l.push(span, self.len())
    }
    fn elems(&self) -> usize {
        self.len()
    }
}
impl<T: Element> SendBuf<T> for [T] {}
impl<T: Element> RecvBuf<T> for [T] {}

macro_rules! host_container {
    ([$($gen:tt)*] $ty:ty) => {
        impl<T: Element $($gen)*> sealed::Lend<T> for $ty {
            fn lend<'b>(&'b self, l: &mut Lender<'b>) -> View {
                self[..].lend(l)
            }
            fn elems(&self) -> usize {
                self.len()
            }
        }
        impl<T: Element $($gen)*> sealed::LendMut<T> for $ty {
            fn lend_mut<'b>(&'b mut self, l: &mut Lender<'b>) -> View {
                self[..].lend_mut(l)
            }
            fn elems(&self) -> usize {
                self.len()
            }
        }
        impl<T: Element $($gen)*> SendBuf<T> for $ty {}
        impl<T: Element $($gen)*> RecvBuf<T> for $ty {}
    };
}
host_container!([] Vec<T>);
host_container!([, const N: usize] [T; N]);

#[cfg(feature = "cuda")]
mod device {
    use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice};

    use super::{Element, Lender, RecvBuf, SendBuf, Span, View, sealed};
    use crate::error::CollectivesError;

    fn no_stream(l: &mut Lender<'_>) -> View {
        l.error.get_or_insert(CollectivesError::Backend {
            backend: "ranks",
            message: "a CUDA buffer is taken on the caller's stream: call through RankComm::on(&stream), RankComm::group_on or MpiGpu::on".into(),
        });
        View {
            block: 0,
            offset: 0,
            len: 0,
        }
    }

    /// The device of a buffer, from the context it was allocated in, checked against the
    /// caller's stream: a buffer of another GPU taken on this stream would be dereferenced as
    /// memory of the stream's GPU by the plan's copies and kernels.
    fn buffer_device(
        l: &mut Lender<'_>,
        buf: &std::sync::Arc<cudarc::driver::CudaStream>,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> Option<usize> {
        let (own, caller) = (buf.context().ordinal(), stream.context().ordinal());
        if own == caller {
            return Some(own);
        }
        l.error.get_or_insert(CollectivesError::Backend {
            backend: "ranks",
            message: format!(
                "a CUDA buffer allocated on device {own} is passed on a stream of device \
                 {caller}: call with a stream of the buffer's device"
            ),
        });
        None
    }

    macro_rules! device_send {
        ($($ty:tt)*) => {
            impl<T: Element> sealed::Lend<T> for $($ty)* {
                fn lend<'b>(&'b self, l: &mut Lender<'b>) -> View {
                    let Some(stream) = l.stream else { return no_stream(l) };
                    let Some(device) = buffer_device(l, DeviceSlice::stream(self), stream)
                    else {
                        return no_stream(l);
                    };
                    let (ptr, guard) = self.device_ptr(stream);
                    l.guards.push(guard);
                    let span = Span {
                        addr: ptr as usize,
                        bytes: self.num_bytes() as u64,
                        device: Some(device),
                    };
                    l.push(span, self.len())
                }
                fn elems(&self) -> usize {
                    self.len()
                }
            }
            impl<T: Element> SendBuf<T> for $($ty)* {}
        };
    }
    macro_rules! device_recv {
        ($($ty:tt)*) => {
            impl<T: Element> sealed::LendMut<T> for $($ty)* {
                fn lend_mut<'b>(&'b mut self, l: &mut Lender<'b>) -> View {
                    let Some(stream) = l.stream else { return no_stream(l) };
                    let Some(device) = buffer_device(l, DeviceSlice::stream(self), stream)
                    else {
                        return no_stream(l);
                    };
                    let (len, bytes) = (self.len(), self.num_bytes() as u64);
                    let (ptr, guard) = self.device_ptr_mut(stream);
                    l.guards.push(guard);
                    let span = Span {
                        addr: ptr as usize,
                        bytes,
                        device: Some(device),
                    };
                    l.push(span, len)
                }
                fn elems(&self) -> usize {
                    self.len()
                }
            }
            impl<T: Element> RecvBuf<T> for $($ty)* {}
        };
    }
    device_send!(CudaSlice<T>);
    device_send!(CudaView<'_, T>);
    device_send!(CudaViewMut<'_, T>);
    device_recv!(CudaSlice<T>);
    device_recv!(CudaViewMut<'_, T>);
}

fn counts_u64(c: &[usize]) -> Vec<u64> {
    c.iter().map(|&x| x as u64).collect()
}

impl<'r, 'b> RankGroup<'r, 'b> {
    fn me(&self) -> usize {
        self.comm.rank
    }
    fn n(&self) -> usize {
        self.comm.ranks()
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
    fn push(&mut self, mut desc: Desc, input: Option<View>, output: Option<View>) -> &mut Self {
        desc.tag = self.comm.next_tag;
        self.ops.push(Op::Coll {
            desc,
            input,
            output,
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
        self.push(desc, i, o)
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
        self.push(d, input.then_some(v), output.then_some(v))
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
            self.push(d, Some(block), Some(whole))
        } else {
            self.push(d, Some(whole), Some(block))
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

    /// Add [`RankComm::all_reduce`].
    pub fn all_reduce<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
        op: ReduceOp,
    ) -> &mut Self {
        let d = Self::desc::<T>(Collective::AllReduce, SendBuf::<T>::elems(send), op, 0);
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`RankComm::all_reduce_in_place`].
    pub fn all_reduce_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        op: ReduceOp,
    ) -> &mut Self {
        self.whole(Collective::AllReduce, buf, (op, 0), (true, true))
    }

    /// Add [`RankComm::reduce`].
    pub fn reduce<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: Option<&'b mut R>,
        root: usize,
        op: ReduceOp,
    ) -> &mut Self {
        self.root_receives::<T, S, R>(Collective::Reduce, send, recv, (op, root))
    }

    /// Add [`RankComm::reduce_in_place`].
    pub fn reduce_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        root: usize,
        op: ReduceOp,
    ) -> &mut Self {
        let is_root = self.me() == root;
        self.whole(Collective::Reduce, buf, (op, root), (true, is_root))
    }

    /// Add [`RankComm::broadcast`].
    pub fn broadcast<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: Option<&'b S>,
        recv: &'b mut R,
        root: usize,
    ) -> &mut Self {
        self.root_sends::<T, S, R>(Collective::Broadcast, send, recv, root)
    }

    /// Add [`RankComm::broadcast_in_place`].
    pub fn broadcast_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        root: usize,
    ) -> &mut Self {
        let is_root = self.me() == root;
        let how = (ReduceOp::Sum, root);
        self.whole(Collective::Broadcast, buf, how, (is_root, true))
    }

    /// Add [`RankComm::all_gather`].
    pub fn all_gather<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
    ) -> &mut Self {
        let c = SendBuf::<T>::elems(send);
        let d = Self::desc::<T>(Collective::AllGather, c, ReduceOp::Sum, 0);
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`RankComm::all_gather_in_place`].
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

    /// Add [`RankComm::all_gather_v`].
    pub fn all_gather_v<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
        counts: &[usize],
    ) -> &mut Self {
        let d = Self::desc_v(Collective::AllGatherV, T::DTYPE, counts_u64(counts));
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`RankComm::all_gather_v_in_place`].
    pub fn all_gather_v_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
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
        let Some(offset) = counts[..me]
            .iter()
            .try_fold(0u64, |a, &c| a.checked_add(c as u64))
        else {
            let e = CollectivesError::Overflow {
                call: "all_gather_v",
                what: format!("the counts of ranks 0..{me} sum past u64"),
            };
            return self.fail(e);
        };
        let o = self.lend_mut(buf);
        let i = View {
            offset,
            len: mine as u64,
            ..o
        };
        let d = Self::desc_v(Collective::AllGatherV, T::DTYPE, counts_u64(counts));
        self.push(d, Some(i), Some(o))
    }

    /// Add [`RankComm::reduce_scatter`].
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

    /// Add [`RankComm::reduce_scatter_in_place`].
    pub fn reduce_scatter_in_place<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        op: ReduceOp,
    ) -> &mut Self {
        let how = (op, 0, self.me());
        self.blocks(Collective::ReduceScatter, buf, how, false)
    }

    /// Add [`RankComm::all_to_all`].
    pub fn all_to_all<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: &'b mut R,
    ) -> &mut Self {
        let c = SendBuf::<T>::elems(send) / self.n();
        let d = Self::desc::<T>(Collective::AllToAll, c, ReduceOp::Sum, 0);
        self.separate(d, Some(send), Some(recv))
    }

    /// Add [`RankComm::all_to_all_v`].
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

    /// Add [`RankComm::gather`].
    pub fn gather<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: &'b S,
        recv: Option<&'b mut R>,
        root: usize,
    ) -> &mut Self {
        let how = (ReduceOp::Sum, root);
        self.root_receives::<T, S, R>(Collective::Gather, send, recv, how)
    }

    /// Add [`RankComm::gather_in_place`].
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

    /// Add [`RankComm::scatter`].
    pub fn scatter<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(
        &mut self,
        send: Option<&'b S>,
        recv: &'b mut R,
        root: usize,
    ) -> &mut Self {
        self.root_sends::<T, S, R>(Collective::Scatter, send, recv, root)
    }

    /// Add [`RankComm::scatter_in_place`].
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
        self.ops.push(Op::P2p {
            send: true,
            peer,
            view,
            dtype: T::DTYPE,
        });
        self
    }

    /// Post a receive into `buf` from rank `peer` (`ncclRecv`).
    pub fn recv<T: Element, R: RecvBuf<T> + ?Sized>(
        &mut self,
        buf: &'b mut R,
        peer: usize,
    ) -> &mut Self {
        let view = self.lend_mut(buf);
        self.ops.push(Op::P2p {
            send: false,
            peer,
            view,
            dtype: T::DTYPE,
        });
        self
    }

    /// Leave the group at its rank's meeting without waiting for the other ranks.
    pub(super) fn depart(self) -> Departure<'b> {
        // The tag is this call's only.
        self.comm.next_tag = 0;
        let Lender {
            blocks,
            error,
            #[cfg(feature = "cuda")]
            stream,
            #[cfg(feature = "cuda")]
            guards,
            ..
        } = self.lender;
        let ops = match error {
            Some(e) => Err(e),
            None => Ok(self.ops),
        };
        #[cfg(feature = "cuda")]
        let ticket = self.comm.arrive(blocks, ops, stream.cloned());
        #[cfg(not(feature = "cuda"))]
        let ticket = self.comm.arrive(blocks, ops);
        Departure {
            ticket,
            #[cfg(feature = "cuda")]
            _guards: guards,
            #[cfg(not(feature = "cuda"))]
            _guards: PhantomData,
        }
    }

    fn finish(self, call: &'static str) -> Result<()> {
        let d = self.depart();
        let outcome = d.ticket.wait();
        // The buffers' cudarc events are recorded on the caller's stream now (the guards
        // drop with `d`), after the operation was enqueued there, so later users of a buffer
        // (its free included) wait for the operation.
        RankComm::result(call, outcome).map(|_| ())
    }

    /// Run the group with the other ranks' groups; returns when it is done on every rank.
    pub fn launch(self) -> Result<()> {
        self.finish("group")
    }
}

/// Single calls, each a group of one operation: `name "call" io (arguments);` makes
/// `pub fn name<T: Element, S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized>(&mut self,
/// arguments) -> Result<()>` (`buf` in place of `io`: only `R: RecvBuf<T> + ?Sized`), which
/// adds [`RankGroup`]'s `name` with the arguments and runs it as call `call`.
macro_rules! single {
    () => {};
    ($(#[$doc:meta])* $name:ident $call:literal io ($($a:ident: $t:ty),*); $($rest:tt)*) => {
        single!(@fn [$(#[$doc])*] $name $call [S: SendBuf<T> + ?Sized, R: RecvBuf<T> + ?Sized]
            ($($a: $t),*));
        single!($($rest)*);
    };
    ($(#[$doc:meta])* $name:ident $call:literal buf ($($a:ident: $t:ty),*); $($rest:tt)*) => {
        single!(@fn [$(#[$doc])*] $name $call [R: RecvBuf<T> + ?Sized] ($($a: $t),*));
        single!($($rest)*);
    };
    (@fn [$($doc:tt)*] $name:ident $call:literal [$($gen:tt)*] ($($a:ident: $t:ty),*)) => {
        $($doc)*
        pub fn $name<T: Element, $($gen)*>(&mut self, $($a: $t),*) -> Result<()> {
            let mut g = self.start();
            g.$name($($a),*);
            g.finish($call)
        }
    };
}

// The single calls: each a group of one operation. Expanded for `RankComm` (host slices)
// and `OnStream` (the same calls on the caller's CUDA stream).
macro_rules! single_calls {
    () => {
        single! {
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

        /// Send `buf` to rank `peer` (`ncclSend`), meeting its `recv`; only the two ranks take
        /// part.
        pub fn send<T: Element, S: SendBuf<T> + ?Sized>(
            &mut self,
            buf: &S,
            peer: usize,
        ) -> Result<()> {
            let mut l = self.lender();
            let view = buf.lend(&mut l);
            self.comm().p2p("send", true, peer, l, view, T::DTYPE)
        }

        /// Receive into `buf` from rank `peer` (`ncclRecv`), meeting its `send`.
        pub fn recv<T: Element, R: RecvBuf<T> + ?Sized>(
            &mut self,
            buf: &mut R,
            peer: usize,
        ) -> Result<()> {
            let mut l = self.lender();
            let view = buf.lend_mut(&mut l);
            self.comm().p2p("recv", false, peer, l, view, T::DTYPE)
        }
    };
}

impl RankComm {
    /// Start a group of this rank's calls on host slices ([`RankGroup`]).
    pub fn group<'b>(&mut self) -> RankGroup<'_, 'b> {
        RankGroup {
            comm: self,
            lender: Lender::default(),
            ops: Vec::new(),
            _borrows: PhantomData,
        }
    }

    fn start<'b>(&mut self) -> RankGroup<'_, 'b> {
        self.group()
    }

    fn lender<'b>(&self) -> Lender<'b> {
        Lender::default()
    }

    fn comm(&mut self) -> &mut RankComm {
        self
    }

    /// Run a point-to-point call with what `lender` holds.
    fn p2p(
        &mut self,
        call: &'static str,
        send: bool,
        peer: usize,
        lender: Lender<'_>,
        view: View,
        dtype: DType,
    ) -> Result<()> {
        let Lender {
            blocks,
            error,
            #[cfg(feature = "cuda")]
            stream,
            #[cfg(feature = "cuda")]
            guards,
            ..
        } = lender;
        let ops = match error {
            Some(e) => Err(e),
            None => Ok(vec![Op::P2p {
                send,
                peer,
                view,
                dtype,
            }]),
        };
        #[cfg(feature = "cuda")]
        let r = self.meet_pair(call, peer, blocks, ops, stream.cloned());
        #[cfg(not(feature = "cuda"))]
        let r = self.meet_pair(call, peer, blocks, ops);
        #[cfg(feature = "cuda")]
        drop(guards);
        r
    }

    single_calls!();
}

/// A rank's handle with the caller's CUDA stream ([`RankComm::on`]): the same calls as
/// [`RankComm`]'s, on cudarc device buffers (`CudaSlice<T>`, `CudaView`, `CudaViewMut`),
/// enqueued on the stream without host synchronization. The plan's streams wait for an event
/// recorded on each rank's stream, and each rank's stream waits for the plan's end, so a
/// kernel enqueued on the stream after the call sees the result, and synchronizing the stream
/// waits for this call only. The call returns once every rank's part is enqueued.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub struct OnStream<'s> {
    comm: &'s mut RankComm,
    stream: &'s Arc<CudaStream>,
}

#[cfg(feature = "cuda")]
impl<'s> OnStream<'s> {
    fn start<'b>(&mut self) -> RankGroup<'_, 'b>
    where
        's: 'b,
    {
        let stream = self.stream;
        let mut g = self.comm.group();
        g.lender.stream = Some(stream);
        g
    }

    fn lender<'b>(&self) -> Lender<'b>
    where
        's: 'b,
    {
        Lender {
            stream: Some(self.stream),
            ..Lender::default()
        }
    }

    fn comm(&mut self) -> &mut RankComm {
        self.comm
    }

    single_calls!();
}

#[cfg(feature = "cuda")]
impl RankComm {
    /// This rank's calls on the caller's CUDA stream `stream` (`ncclAllReduce(..., comm,
    /// stream)`): see [`OnStream`]. Needs a communicator on the CUDA backend; elsewhere every
    /// call returns an error.
    pub fn on<'s>(&'s mut self, stream: &'s Arc<CudaStream>) -> OnStream<'s> {
        OnStream { comm: self, stream }
    }

    /// Start a group of this rank's calls on the caller's CUDA stream `stream`.
    pub fn group_on<'b>(&mut self, stream: &'b Arc<CudaStream>) -> RankGroup<'_, 'b> {
        let mut g = self.group();
        g.lender.stream = Some(stream);
        g
    }
}
