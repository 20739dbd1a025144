//! Host buffers that the ranks of one machine can map: the MPI analogue of `ncclMemAlloc`
//! with local registration (nccl-tests' `-R 1`), or of `MPI_Win_allocate_shared`.
//!
//! A single-copy message from an ordinary buffer is read by the receiver with
//! `process_vm_readv`, a kernel copy that pins the sender's pages first, slower per byte than
//! a user-space copy with streaming stores (`docs/MEASUREMENTS.md` has the rates).
//! When the sender's bytes lie in a [`SharedHostBuffer`], the receiver maps that buffer
//! instead (once; mappings are cached) and copies from it in user space. The typed
//! collectives' own run buffers of single-copy size are `SharedHostBuffer<u128>`s too, so
//! messages from them take that path whatever memory the caller passes.
//!
//! How a receiver finds the memory: each buffer is a memfd named after a serial number unique
//! in its process (`relaycc-shared-<serial>`); a send from it publishes the serial, the fd
//! number and the offset. The receiver opens `/proc/<pid>/fd/<fd>` (the kernel allows it
//! where it would allow reading the process's memory), checks that the file it opened has
//! that name and carries the seals that fix its size (so reading the mapping can never fault
//! past its end), and maps it read-only. The sender's file stays open while the send is
//! outstanding, since the caller's borrow of the buffer outlives the call and the send
//! completes only after the receiver's copy; a serial is never reused, so a cached mapping
//! never stands for another buffer. A mapping of a buffer its owner since freed keeps that
//! memory until the receiver evicts it (after [`MAX_PEER_MAPPINGS`] newer ones) or drops its
//! communicator: it is never read again.

use std::ffi::CString;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::MpiError;

/// Serial numbers of this process's shared buffers (0 means "none" in a message header).
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// This process's live shared buffers: `(first byte, bytes, serial, fd)`.
static REGISTERED: Mutex<Vec<(usize, usize, u64, i32)>> = Mutex::new(Vec::new());

/// The page size where the system does not say (pages are mapped whole).
const PAGE_BYTES: usize = 4096;

/// The seals every shared buffer's file carries: its size never changes, so a peer that
/// checked them reads its mapping without ever faulting past the end.
const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Peer mappings a communicator keeps before it unmaps the oldest.
pub(crate) const MAX_PEER_MAPPINGS: usize = 64;

/// A host buffer of `T` that the other ranks of this machine read without a kernel copy when
/// it is the source of a message of the MPI backend's shared-memory transport.
///
/// Use it as a slice (it dereferences to `[T]`); a collective call that sends from it needs
/// nothing else. Allocation is local (not collective): any rank allocates, frees and reuses its
/// own buffers as it likes. Memory starts zeroed. Linux only (memfd and `/proc`). Unlike a
/// `Vec`'s memory, a child made by `fork` shares it with the parent instead of copying it.
/// `T` is any plain-old-data type (the collectives take their element types; the
/// communicator's own run buffers are `u128` words).
///
/// The elements are aligned for `T` whatever its alignment: a mapping starts on a page
/// boundary, which serves every type aligned to a page or less, and a type aligned above the
/// page size (`#[repr(align(65536))]`, say) gets its mapping placed at a multiple of its
/// alignment inside a larger reservation of address space, so its slice is never misaligned
/// (Rust caps alignment at 2^29 bytes, so the reservation is bounded).
///
/// ```no_run
/// # fn main() -> Result<(), relaycc_collectives::mpi::MpiError> {
/// use relaycc_collectives::mpi::SharedHostBuffer;
/// let mut grads = SharedHostBuffer::<f32>::zeroed(1 << 20)?;
/// grads[0] = 1.0;
/// assert_eq!(grads.len(), 1 << 20);
/// # Ok(()) }
/// ```
pub struct SharedHostBuffer<T: bytemuck::Pod> {
    map: SharedMapping,
    len: usize,
    _elements: PhantomData<T>,
}

impl<T: bytemuck::Pod> std::fmt::Debug for SharedHostBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedHostBuffer")
            .field("len", &self.len)
            .field("serial", &self.map.serial)
            .finish()
    }
}

/// Zeroed bytes in a registered memfd mapping, page-aligned, of a size sealed for good (so a
/// peer's mapping of it can never fault past its end): the memory of a [`SharedHostBuffer`].
struct SharedMapping {
    ptr: NonNull<u8>,
    /// Bytes mapped (at least one page).
    mapped: usize,
    serial: u64,
    fd: OwnedFd,
}

// SAFETY: the mapping is owned as a `Vec` owns its heap block; peers only read it while a
// send from it is outstanding, and this process reaches it only through its owner.
unsafe impl Send for SharedMapping {}
// SAFETY: a shared `&SharedMapping` gives only a const pointer.
unsafe impl Sync for SharedMapping {}

impl std::fmt::Debug for SharedMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMapping")
            .field("bytes", &self.mapped)
            .field("serial", &self.serial)
            .finish()
    }
}

/// The last OS error, with what failed.
fn os_error(what: &str) -> MpiError {
    MpiError::SharedMemory(format!("{what}: {}", std::io::Error::last_os_error()))
}

impl<T: bytemuck::Pod> SharedHostBuffer<T> {
    /// `len` zeroed elements in memory other local ranks can map.
    ///
    /// Errors: [`MpiError::SharedMemory`] when the size overflows or the system refuses the
    /// memfd or the mapping (out of memory, a seccomp policy).
    pub fn zeroed(len: usize) -> Result<Self, MpiError> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            MpiError::SharedMemory(format!("{len} elements overflow the address space"))
        })?;
        Ok(SharedHostBuffer {
            map: SharedMapping::zeroed(bytes, std::mem::align_of::<T>())?,
            len,
            _elements: PhantomData,
        })
    }

    /// The buffer's serial and file descriptor, which a message from it names.
    pub(crate) fn identity(&self) -> (u64, i32) {
        (self.map.serial, self.map.fd.as_raw_fd())
    }
}

impl SharedMapping {
    /// At least `bytes` zeroed bytes (whole pages) starting at a multiple of `align` (a power
    /// of two), registered for single copies.
    fn zeroed(bytes: usize, align: usize) -> Result<Self, MpiError> {
        let mapped = bytes
            .max(1)
            .checked_next_multiple_of(page_bytes())
            .ok_or_else(|| {
                MpiError::SharedMemory(format!("{bytes} bytes overflow the address space"))
            })?;
        let serial = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
        let name = CString::new(format!("relaycc-shared-{serial}"))
            .map_err(|e| MpiError::SharedMemory(format!("memfd name: {e}")))?;
        // SAFETY: a valid C string and flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(os_error("memfd_create"));
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(mapped)
            .map_err(|_| MpiError::SharedMemory(format!("{bytes} bytes do not fit off_t")))?;
        // SAFETY: `fd` is a live memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(os_error("ftruncate of a shared buffer"));
        }
        // SAFETY: `fd` is a live memfd made with sealing allowed.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SIZE_SEALS) } != 0 {
            return Err(os_error("sealing a shared buffer's size"));
        }
        let at = map_aligned(&fd, mapped, align)?;
        let ptr = NonNull::new(at.cast::<u8>()).ok_or_else(|| os_error("mmap returned null"))?;
        registry().push((at as usize, mapped, serial, fd.as_raw_fd()));
        Ok(SharedMapping {
            ptr,
            mapped,
            serial,
            fd,
        })
    }

    /// The first byte (aligned as `zeroed` was asked, and at least to a page).
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// The system's page size (what `mmap` aligns a mapping to), 4096 bytes if it cannot say.
fn page_bytes() -> usize {
    // SAFETY: `sysconf` has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(PAGE_BYTES)
}

/// Map all `mapped` bytes of `fd` shared and writable at a multiple of `align` (a power of
/// two). Up to a page, `mmap` aligns by itself. Above it, `mapped + align` bytes of address
/// space are reserved (no access, no memory), the file is mapped over the reservation's first
/// multiple of `align`, and the rest of the reservation is given back, so nothing but the
/// file's mapping remains and `munmap` of it alone frees everything.
fn map_aligned(fd: &OwnedFd, mapped: usize, align: usize) -> Result<*mut libc::c_void, MpiError> {
    let map = |at: *mut libc::c_void, flags: libc::c_int| {
        // SAFETY: a shared mapping of the whole file (at a hint, or over this process's own
        // reservation with `MAP_FIXED`); the result is checked.
        let got = unsafe {
            libc::mmap(
                at,
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | flags,
                fd.as_raw_fd(),
                0,
            )
        };
        if got == libc::MAP_FAILED {
            return Err(os_error("mmap of a shared buffer"));
        }
        Ok(got)
    };
    if align <= page_bytes() {
        return map(std::ptr::null_mut(), 0);
    }
    let reserved = mapped.checked_add(align).ok_or_else(|| {
        MpiError::SharedMemory(format!(
            "{mapped} bytes aligned to {align} overflow the address space"
        ))
    })?;
    // SAFETY: an anonymous reservation with no access; the result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserved,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(os_error(
            "reserving address space for an aligned shared buffer",
        ));
    }
    let start = base as usize;
    let aligned = start.next_multiple_of(align);
    let (head, tail) = (aligned - start, reserved - (aligned - start) - mapped);
    let at = map(aligned as *mut libc::c_void, libc::MAP_FIXED);
    // SAFETY: the head and tail are this function's own reservation, outside the file's
    // mapping (or, after a failed mapping, the whole reservation is): nothing else uses them.
    unsafe {
        match at {
            Ok(_) => {
                if head > 0 {
                    libc::munmap(base, head);
                }
                if tail > 0 {
                    libc::munmap((aligned + mapped) as *mut libc::c_void, tail);
                }
            }
            Err(_) => {
                libc::munmap(base, reserved);
            }
        }
    }
    at
}

impl<T: bytemuck::Pod> std::ops::Deref for SharedHostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` initialised (zeroed, `Pod`) elements, at an address
        // aligned for `T` (`SharedMapping::zeroed` was given its alignment).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: bytemuck::Pod> std::ops::DerefMut for SharedHostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`; `&mut self` is the only access from this process, and peers
        // read it only during a call that borrows it shared.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().cast::<T>(), self.len) }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        let at = self.ptr.as_ptr() as usize;
        registry().retain(|&(start, ..)| start != at);
        // SAFETY: the mapping made in `zeroed`, unreferenced from here on (`&mut self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

/// The registry, even if a thread panicked while it held the lock (each update is one push or
/// one `retain`, so the list is never half-written).
fn registry() -> std::sync::MutexGuard<'static, Vec<(usize, usize, u64, i32)>> {
    REGISTERED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where `bytes` bytes at `addr` lie in one of this process's shared buffers: its serial, fd
/// and the offset in it.
pub(crate) fn find_registered(addr: usize, bytes: usize) -> Option<(u64, i32, usize)> {
    registry()
        .iter()
        .find(|&&(start, len, ..)| addr >= start && addr.saturating_add(bytes) <= start + len)
        .map(|&(start, _, serial, fd)| (serial, fd, addr - start))
}

/// A peer's shared buffer mapped read-only here.
#[derive(Debug)]
pub(crate) struct PeerMapping {
    peer: u32,
    serial: u64,
    at: usize,
    len: usize,
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_peer`, referenced by nothing else.
        unsafe { libc::munmap(self.at as *mut libc::c_void, self.len) };
    }
}

/// A communicator's cache of its peers' shared buffers, oldest first.
#[derive(Debug, Default)]
pub(crate) struct PeerMappings(Vec<PeerMapping>);

impl PeerMappings {
    /// The address here of bytes `offset..offset + bytes` of shared buffer `serial` (open as
    /// `fd`) of rank `peer` (process `pid`), mapping it first if needed.
    pub(crate) fn locate(
        &mut self,
        peer: u32,
        pid: libc::pid_t,
        serial: u64,
        fd: i32,
        offset: usize,
        bytes: usize,
    ) -> Result<usize, String> {
        let k = match self
            .0
            .iter()
            .position(|m| m.peer == peer && m.serial == serial)
        {
            Some(k) => k,
            None => {
                if self.0.len() >= MAX_PEER_MAPPINGS {
                    self.0.remove(0);
                }
                self.0.push(map_peer(peer, pid, serial, fd)?);
                self.0.len() - 1
            }
        };
        let m = &self.0[k];
        if offset.checked_add(bytes).is_none_or(|end| end > m.len) {
            return Err(format!(
                "bytes {offset}..{} lie outside rank {peer}'s shared buffer {serial} of {} bytes",
                offset.saturating_add(bytes),
                m.len
            ));
        }
        Ok(m.at + offset)
    }
}

/// Map rank `peer`'s shared buffer `serial`, open in process `pid` as `fd`, read-only.
fn map_peer(peer: u32, pid: libc::pid_t, serial: u64, fd: i32) -> Result<PeerMapping, String> {
    let path = format!("/proc/{pid}/fd/{fd}");
    let file = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
    // The file opened is the one named after the serial (a descriptor number alone could
    // name anything by the time it is opened).
    let name = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| format!("readlink of {path}: {e}"))?;
    let want = format!("/memfd:relaycc-shared-{serial} ");
    if !name.to_string_lossy().starts_with(&want) {
        return Err(format!(
            "{path} is {}, not rank {peer}'s shared buffer {serial}",
            name.display()
        ));
    }
    // SAFETY: `file` is open; the call only reads its seals.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & SIZE_SEALS != SIZE_SEALS {
        return Err(format!(
            "{path} is not sealed against resizing (seals {seals:#x})"
        ));
    }
    let len = usize::try_from(
        file.metadata()
            .map_err(|e| format!("stat of {path}: {e}"))?
            .len(),
    )
    .ok()
    .filter(|&len| len > 0)
    .ok_or_else(|| format!("{path} has no size a shared buffer has"))?;
    // SAFETY: a read-only shared mapping of the whole file, whose size is sealed; the result
    // is checked.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(format!(
            "mmap of {path}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(PeerMapping {
        peer,
        serial,
        at: at as usize,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_registered_and_unregistered() {
        let mut b = SharedHostBuffer::<u32>::zeroed(1000).expect("memfd");
        assert!(b.iter().all(|&x| x == 0));
        b[999] = 7;
        let at = b.as_ptr() as usize;
        let (serial, fd, off) = find_registered(at + 8, 16).expect("registered");
        assert_eq!((serial, fd, off), (b.identity().0, b.identity().1, 8));
        // A range running past the mapping is not in it.
        assert!(find_registered(at, 1 << 20).is_none());
        // This process may map its own buffer as a peer would, and sees its writes.
        let mut peers = PeerMappings::default();
        let pid = std::process::id() as libc::pid_t;
        let far = peers.locate(3, pid, serial, fd, 999 * 4, 4).expect("maps");
        // SAFETY: `far` is 4 readable bytes of the read-only mapping.
        assert_eq!(unsafe { *(far as *const u32) }, 7);
        // A wrong serial for the descriptor is refused, and so is a range past the end.
        assert!(peers.locate(3, pid, serial + 1000, fd, 0, 4).is_err());
        assert!(peers.locate(3, pid, serial, fd, 4096, 1).is_err());
        drop(b);
        // Another test's buffer may take the address; this one's serial is gone.
        assert!(find_registered(at + 8, 16).is_none_or(|(s, ..)| s != serial));
    }

    #[test]
    fn empty_and_huge_buffers() {
        let b = SharedHostBuffer::<f64>::zeroed(0).expect("one page");
        assert!(b.is_empty());
        assert!(matches!(
            SharedHostBuffer::<f64>::zeroed(usize::MAX),
            Err(MpiError::SharedMemory(_))
        ));
        // Bytes that fit but whose pages do not.
        assert!(matches!(
            SharedHostBuffer::<u8>::zeroed(usize::MAX - 1),
            Err(MpiError::SharedMemory(_))
        ));
        // The size is sealed: a peer's mapping cannot fault past its end.
        let b = SharedHostBuffer::<u8>::zeroed(10).expect("memfd");
        let fd = b.identity().1;
        // SAFETY: `fd` is the buffer's open memfd; a refused resize changes nothing.
        assert_ne!(unsafe { libc::ftruncate(fd, 0) }, 0);
    }

    /// A page-sized element aligned to its size, as a `#[repr(align(65536))]` type of a user.
    #[repr(C, align(65536))]
    #[derive(Clone, Copy)]
    struct Aligned64K([u8; 65536]);
    // SAFETY: a byte array with no padding (its size is its alignment); all zeros and every
    // bit pattern are valid.
    unsafe impl bytemuck::Zeroable for Aligned64K {}
    // SAFETY: as above; `Copy`, `'static`, `repr(C)`.
    unsafe impl bytemuck::Pod for Aligned64K {}

    /// Aligned to 1 MiB, several pages apart from any page boundary's luck.
    #[repr(C, align(1048576))]
    #[derive(Clone, Copy)]
    struct Aligned1M([u8; 1048576]);
    // SAFETY: as for `Aligned64K`.
    unsafe impl bytemuck::Zeroable for Aligned1M {}
    // SAFETY: as for `Aligned64K`.
    unsafe impl bytemuck::Pod for Aligned1M {}

    /// Element types aligned above the page size get slices aligned for them (a mapping that
    /// is only page-aligned misses 64 KiB most of the time): every one of 20 allocations, of
    /// 0 to 3 elements, is aligned, writable and registered, and is unmapped whole on drop.
    #[test]
    fn elements_aligned_above_the_page_size_are_aligned() {
        let mut kept = Vec::new();
        for i in 0..20usize {
            let mut b = SharedHostBuffer::<Aligned64K>::zeroed(i % 4).expect("memfd");
            assert_eq!(b.as_ptr() as usize % 65536, 0, "allocation {i} misaligned");
            if let Some(last) = b.last_mut() {
                last.0[65535] = 7;
                let at = last.0.as_ptr() as usize + 65535;
                assert!(find_registered(at, 1).is_some());
            }
            assert!(b.iter().all(|e| e.0[..65535].iter().all(|&x| x == 0)));
            kept.push(b);
        }
        let one = SharedHostBuffer::<Aligned1M>::zeroed(1).expect("memfd");
        assert_eq!(one.as_ptr() as usize % (1 << 20), 0);
        assert_eq!(one[0].0[(1 << 20) - 1], 0);
        let (at, serial) = (one.as_ptr() as usize, one.identity().0);
        assert_eq!(find_registered(at, 1 << 20).map(|(s, ..)| s), Some(serial));
        drop(one);
        assert!(find_registered(at, 1).is_none_or(|(s, ..)| s != serial));
        // Ordinary types keep page-aligned mappings.
        let plain = SharedHostBuffer::<u128>::zeroed(3).expect("memfd");
        assert_eq!(plain.as_ptr() as usize % page_bytes(), 0);
    }
}
