//! Typed buffers in a rank's device memory, and views of parts of them.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use crate::backend::{Backend, ByteRegion, DeviceMem};
use crate::element::Element;
use crate::error::{CollectivesError, Result};

/// `len` elements of `T` in the memory of one rank's device, allocated by a
/// [`Communicator`](crate::Communicator) ([`alloc`](crate::Communicator::alloc),
/// [`from_slice`](crate::Communicator::from_slice)).
///
/// A buffer is a handle, as a device pointer is: collectives read and write it through shared
/// references, and the host sees its contents only through [`DeviceBuffer::to_vec`] and
/// [`DeviceBuffer::copy_from`], which wait for the collectives in flight first. Dropping it
/// frees the memory once the collectives in flight are done.
#[derive(Debug)]
pub struct DeviceBuffer<T: Element> {
    backend: Arc<dyn Backend>,
    comm: u64,
    rank: usize,
    mem: DeviceMem,
    len: usize,
    /// Set once the memory was handed out ([`DeviceBuffer::into_cuda_slice`]): drop frees
    /// nothing then.
    released: bool,
    _t: PhantomData<T>,
}

impl<T: Element> DeviceBuffer<T> {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        comm: u64,
        rank: usize,
        mem: DeviceMem,
        len: usize,
    ) -> Self {
        DeviceBuffer {
            backend,
            comm,
            rank,
            mem,
            len,
            released: false,
            _t: PhantomData,
        }
    }
    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The rank whose device holds the buffer.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// A view of the whole buffer.
    pub fn view(&self) -> BufferView<'_, T> {
        BufferView {
            buf: self,
            offset: 0,
            len: self.len,
        }
    }
    /// A view of elements `range`; an error when the range is not inside the buffer.
    pub fn slice(&self, range: Range<usize>) -> Result<BufferView<'_, T>> {
        self.view().slice(range)
    }
    /// The contents, copied to the host (after the collectives in flight).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.view().to_vec()
    }
    /// Overwrite the contents from a host slice of the same length.
    pub fn copy_from(&self, src: &[T]) -> Result<()> {
        self.view().copy_from(src)
    }
}

#[cfg(feature = "cuda")]
impl<T: Element> DeviceBuffer<T> {
    /// The memory as a cudarc `CudaSlice<T>`, without copying, after the collectives in flight
    /// (CUDA backend only). A buffer made by
    /// [`Communicator::wrap_cuda_slice`](crate::Communicator::wrap_cuda_slice) gives back the
    /// very slice it was given; one allocated by the communicator becomes a slice on the
    /// backend's stream of that GPU, freed when the slice drops.
    ///
    /// On error (another backend, a zero-length buffer) the buffer is kept alive and dropped
    /// normally.
    pub fn into_cuda_slice(mut self) -> Result<cudarc::driver::CudaSlice<T>> {
        use crate::backend::sealed::Private;
        let cuda = self
            .backend
            .as_cuda(Private)
            .ok_or_else(|| CollectivesError::Backend {
                backend: self.backend.name(),
                message: "into_cuda_slice needs the CUDA backend".into(),
            })?;
        let slice = cuda.release::<T>(self.mem, self.len)?;
        self.released = true;
        Ok(slice)
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Never fails: a backend keeps a free error for its next synchronize.
        self.backend.free(self.mem);
    }
}

/// Elements `offset..offset + len` of a [`DeviceBuffer`]: what collectives take per rank.
#[derive(Debug)]
pub struct BufferView<'a, T: Element> {
    buf: &'a DeviceBuffer<T>,
    offset: usize,
    len: usize,
}

impl<T: Element> Clone for BufferView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Element> Copy for BufferView<'_, T> {}

/// The raw, type-erased form of a view that the checks and the executor use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawView {
    pub comm: u64,
    pub rank: usize,
    pub region: ByteRegion,
    pub len: u64,
}

impl<'a, T: Element> BufferView<'a, T> {
    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The rank whose device holds the view.
    pub fn rank(&self) -> usize {
        self.buf.rank
    }
    /// A view of elements `range` of this view.
    pub fn slice(&self, range: Range<usize>) -> Result<BufferView<'a, T>> {
        if range.start > range.end || range.end > self.len {
            return Err(CollectivesError::CountMismatch {
                call: "slice",
                rank: self.buf.rank,
                side: "view",
                got: self.len as u64,
                needs: range.end as u64,
            });
        }
        Ok(BufferView {
            buf: self.buf,
            offset: self.offset + range.start,
            len: range.end - range.start,
        })
    }
    /// Split into `[0, mid)` and `[mid, len)`.
    pub fn split_at(&self, mid: usize) -> Result<(BufferView<'a, T>, BufferView<'a, T>)> {
        Ok((self.slice(0..mid)?, self.slice(mid..self.len)?))
    }
    fn region(&self) -> ByteRegion {
        let size = std::mem::size_of::<T>() as u64;
        ByteRegion {
            mem: self.buf.mem,
            offset: self.offset as u64 * size,
            bytes: self.len as u64 * size,
        }
    }
    pub(crate) fn raw(&self) -> RawView {
        RawView {
            comm: self.buf.comm,
            rank: self.buf.rank,
            region: self.region(),
            len: self.len as u64,
        }
    }
    /// The contents, copied to the host (after the collectives in flight).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len];
        self.buf
            .backend
            .download(self.region(), bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }
    /// Overwrite the contents from a host slice of the same length.
    pub fn copy_from(&self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(CollectivesError::CountMismatch {
                call: "copy_from",
                rank: self.buf.rank,
                side: "host",
                got: src.len() as u64,
                needs: self.len as u64,
            });
        }
        self.buf
            .backend
            .upload(self.region(), bytemuck::cast_slice(src))
    }
}

/// Anything a collective accepts as one rank's buffer: a [`DeviceBuffer`] (all of it), a
/// [`BufferView`], or a reference to either.
pub trait AsView<T: Element> {
    /// The view.
    fn as_view(&self) -> BufferView<'_, T>;
}

impl<T: Element> AsView<T> for DeviceBuffer<T> {
    fn as_view(&self) -> BufferView<'_, T> {
        self.view()
    }
}

impl<T: Element> AsView<T> for BufferView<'_, T> {
    fn as_view(&self) -> BufferView<'_, T> {
        *self
    }
}

impl<T: Element, V: AsView<T> + ?Sized> AsView<T> for &V {
    fn as_view(&self) -> BufferView<'_, T> {
        (**self).as_view()
    }
}
