//! The buffers a per-rank call takes and how they lend themselves to it: host memory
//! (`[T]`, `Vec<T>`, `[T; N]`) and, with feature `cuda`, cudarc device buffers on the
//! caller's stream. [`Lender`] collects what one call's buffers lend: their spans, the
//! caller's stream, and the cudarc guards that record the buffers' events when the call ends.

#[cfg(not(feature = "cuda"))]
use std::marker::PhantomData;
#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use cudarc::driver::CudaStream;

use crate::element::Element;
use crate::error::CollectivesError;

use super::op::{Span, View};

/// What a rank's buffers lend to its call: their spans, the caller's stream for device
/// buffers, and the cudarc guards that record the buffers' events when the call ends.
#[derive(Debug, Default)]
pub struct Lender<'b> {
    pub(super) blocks: Vec<Span>,
    pub(super) error: Option<CollectivesError>,
    #[cfg(feature = "cuda")]
    pub(super) stream: Option<&'b Arc<CudaStream>>,
    #[cfg(feature = "cuda")]
    pub(super) guards: Vec<cudarc::driver::SyncOnDrop<'b>>,
    #[cfg(not(feature = "cuda"))]
    pub(super) _b: PhantomData<&'b ()>,
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

    /// The lent spans, by block.
    #[cfg(feature = "mpi")]
    pub(crate) fn spans(&self) -> &[Span] {
        &self.blocks
    }

    /// Whether lending met an error ([`Self::take_error`] takes it).
    #[cfg(feature = "mpi")]
    pub(crate) fn has_error(&self) -> bool {
        self.error.is_some()
    }

    /// The first error met while lending (a buffer of another device, no stream).
    pub(crate) fn take_error(&mut self) -> Option<CollectivesError> {
        self.error.take()
    }
}

impl Lender<'_> {
    pub(super) fn push(&mut self, span: Span, len: usize) -> View {
        self.blocks.push(span);
        View {
            block: self.blocks.len() - 1,
            offset: 0,
            len: len as u64,
        }
    }
}

pub(super) mod sealed {
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

/// A buffer a per-rank call reads: host memory (`[T]`, `Vec<T>`, `[T; N]`, and with feature
/// `mpi` `SharedHostBuffer<T>`) or, with feature
/// `cuda`, device memory (cudarc's `CudaSlice<T>`, `CudaView`, `CudaViewMut`, which a call
/// takes on the caller's stream: `RankComm::on`).
pub trait SendBuf<T: Element>: sealed::Lend<T> {
    /// Elements in the buffer.
    fn elems(&self) -> usize {
        sealed::Lend::elems(self)
    }
}
/// A buffer a per-rank call writes: host memory (`[T]`, `Vec<T>`, `[T; N]`, and with feature
/// `mpi` `SharedHostBuffer<T>`) or, with feature
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
        held: None,
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

/// A view of a buffer the communicator's backend holds ([`crate::DeviceBuffer`]), as the
/// all-ranks [`crate::Group`] lends it to each rank's [`super::RankCalls`]. Crate-private:
/// only `Group` makes one, and its calls never reach a meeting, the direct path or MPI,
/// which take addresses.
#[derive(Debug)]
pub(crate) struct HeldView<T> {
    pub view: crate::buffer::RawView,
    pub _t: std::marker::PhantomData<T>,
}

impl<T: Element> HeldView<T> {
    fn span(&self) -> Span {
        Span {
            addr: 0,
            bytes: self.view.region.bytes,
            device: None,
            held: Some(self.view),
        }
    }
}

impl<T: Element> sealed::Lend<T> for HeldView<T> {
    fn lend<'b>(&'b self, l: &mut Lender<'b>) -> View {
        l.push(self.span(), self.view.len as usize)
    }
    fn elems(&self) -> usize {
        self.view.len as usize
    }
}
impl<T: Element> sealed::LendMut<T> for HeldView<T> {
    fn lend_mut<'b>(&'b mut self, l: &mut Lender<'b>) -> View {
        l.push(self.span(), self.view.len as usize)
    }
    fn elems(&self) -> usize {
        self.view.len as usize
    }
}
impl<T: Element> SendBuf<T> for HeldView<T> {}
impl<T: Element> RecvBuf<T> for HeldView<T> {}

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
// Host memory other processes of this host may map: the MPI ranks' single-copy transport
// reads it in place.
#[cfg(feature = "mpi")]
host_container!([] crate::mpi::SharedHostBuffer<T>);

#[cfg(feature = "cuda")]
mod device {
    use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice};

    use super::{Element, Lender, RecvBuf, SendBuf, Span, View, sealed};
    use crate::error::CollectivesError;

    fn no_stream(l: &mut Lender<'_>) -> View {
        l.error.get_or_insert(CollectivesError::Backend {
            backend: "ranks",
            message: "a CUDA buffer is taken on the caller's stream: call through RankComm::on(&stream) (and its group()) or MpiGpu::on".into(),
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
                        held: None,
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
                        held: None,
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
