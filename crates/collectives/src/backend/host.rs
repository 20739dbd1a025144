//! The host backend: every logical device is an arena of host memory, every lane an
//! in-order list of commands run by a bounded pool of worker threads, every copy a real
//! `memcpy`, every reduction real arithmetic.
//!
//! It is the correctness oracle of relaycc (plans run here byte for byte) and a CPU fallback.
//!
//! - Memory: each allocation is a 64-byte aligned, zeroed block from the system allocator,
//!   accounted to its [`Location`]'s arena ([`HostBackend::bytes_in_use`]).
//! - Lanes: run by at most one worker thread per core (`host_lanes.rs`), started on demand
//!   and kept between launches, however many lanes a launch has (a 1,024-rank communicator
//!   has 1,024): a lane that reaches a `Wait` on an event not yet recorded parks and gives
//!   its worker back, and the `Record` queues it again, so a waiting lane never holds a
//!   thread another lane needs. A launch with work on one lane only (a send and its
//!   receive, one rank's copy) runs on the submitting thread instead, under the gate: handing
//!   it to a worker and waiting for it back costs two thread switches, more than a small
//!   copy.
//! - Copies into lent memory (a rank's own slices) of a page or more use non-temporal stores
//!   (`stream_copy`), and a copy into memory that only a reduction of the same lane reads
//!   before the lane overwrites it is dropped, the reduction reading the copy's source
//!   (`forward_copies`): every arena is one address space. A reduction directly followed by
//!   copies of its whole result writes each result block to every destination while it is
//!   in the L1 cache (`fuse_fan_out`), streaming into a rank's memory. Both peepholes live
//!   in `host_peephole.rs`.
//! - Events: one flag per event of a launch, set under the launch's event lock after the
//!   lane's earlier commands (and a store fence); a lane waiting for it parks beside it.
//! - Launches run one after another: one lock (the gate) is held while [`Backend::submit`]
//!   waits for the previous launch and starts the next, and while `free`, `upload` and
//!   `download` wait and then touch memory, so none of them can come between.
//!
//! The host backend's `unsafe` (raw arenas, pointer copies, calls into the reduction loops of
//! `host_reduce.rs`) lives in this file and in `host_lanes.rs`, which runs the commands
//! `submit` resolved here; the crate docs list every other module with `unsafe`.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use relaycc_route::Location;

use super::host_lanes::{LanePool, LaunchState, Task, run_here};
use super::host_peephole::{forward_copies, fuse_fan_out};
use super::sealed::{Lending, Loan, Private, Trusted};
use super::validate::{self, Bound, Resolved};
use super::{AddressSpace, Backend, ByteRegion, DeviceMem, Launch, RawRegion};
use crate::error::{CollectivesError, Result};

/// Alignment of every arena block: a cache line, enough for every element type and for
/// vector loads.
const ARENA_ALIGN: usize = 64;

/// Smallest copy into lent memory written with non-temporal stores: below a page the
/// write-allocate reads that streaming saves cost less than bypassing the cache for data a
/// later op may read. Streaming stores write whole lines without reading them first
/// ([Intel-Opt]); `docs/MEASUREMENTS.md` gives a 64 MiB copy into a rank's memory streamed and
/// through libc's `memmove` (`relaycc bench all_reduce --backend host --ranks 8`).
pub(super) const STREAM_MIN_BYTES: u64 = 4096;

/// Copy `bytes` bytes from `src` to `dst` with non-temporal stores where the CPU has them
/// (SSE2 on x86-64, which every x86-64 CPU has): the destination lines go to memory without
/// first being read into the cache, so a copy out of cache into memory that is not read
/// again soon moves half the memory traffic of a plain copy. Elsewhere a plain copy.
///
/// # Safety
/// `src..src + bytes` is readable, `dst..dst + bytes` writable, the two do not overlap, and
/// nothing else touches `dst..dst + bytes` until [`store_fence`] has run on this thread.
pub(crate) unsafe fn stream_copy(src: *const u8, dst: *mut u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        // Bytes up to the first 16-byte aligned destination address, copied plainly.
        let head = dst.align_offset(16).min(bytes);
        // SAFETY: inside both ranges (the caller's contract); `head <= bytes`.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let body = (bytes - head) / 64 * 64;
        let mut i = head;
        while i < head + body {
            // SAFETY: `i + 64 <= bytes`; `dst + i` is 16-byte aligned (`head` aligned it and
            // `i - head` is a multiple of 64).
            unsafe { stream_line_aligned(src.add(i), dst.add(i)) };
            i += 64;
        }
        // SAFETY: the tail `i..bytes` lies inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), bytes - i) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from this function's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, bytes)
    };
}

/// Stream the 64 bytes at `src` to `dst` with four 16-byte non-temporal stores.
///
/// # Safety
/// `src` holds 64 readable bytes and `dst` 64 writable ones, 16-byte aligned, that nothing
/// else touches during the call, not overlapping.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn stream_line_aligned(src: *const u8, dst: *mut u8) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let (s, d) = (src as *const __m128i, dst as *mut __m128i);
    // SAFETY: 64 bytes at both (the caller's contract); `d` is 16-byte aligned; unaligned
    // loads have no alignment need.
    unsafe {
        let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
        let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
        _mm_stream_si128(d, a);
        _mm_stream_si128(d.add(1), b);
        _mm_stream_si128(d.add(2), c);
        _mm_stream_si128(d.add(3), e);
    }
}

/// Order this thread's earlier non-temporal stores before its later stores (x86-64's
/// `sfence`; other targets stream nothing). Called before a lane records an event or ends,
/// so a lane or thread that sees either also sees the streamed data.
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

fn err(message: impl Into<String>) -> CollectivesError {
    CollectivesError::Backend {
        backend: "host",
        message: message.into(),
    }
}

/// Lock a mutex, ignoring poisoning: the data behind every lock here stays consistent even if
/// a holder panicked (each critical section is a single update).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One arena block.
#[derive(Debug)]
struct Block {
    /// Address of the first byte (kept as an integer so the table is `Send`).
    addr: usize,
    layout: Option<Layout>,
    location: Location,
    bytes: u64,
    /// Memory lent by a caller (`Trusted::lend`): not counted in the arena, not freed.
    lent: bool,
}

/// The host backend (see the module docs).
#[derive(Debug)]
pub struct HostBackend {
    blocks: Mutex<HashMap<u64, Block>>,
    arenas: Mutex<BTreeMap<Location, u64>>,
    /// The worker threads that run the lanes of launches.
    pool: LanePool,
    /// The gate: the launch in flight, locked by every step that must not overlap one.
    inflight: Mutex<Option<Arc<LaunchState>>>,
    /// An error met where it could not be returned (a failed launch, `free`).
    pending: Mutex<Option<String>>,
    /// Most bytes allocated at once over every arena (`None`: as much as the host gives).
    limit: Option<u64>,
    /// Calls of `upload` and `download` so far ([`HostBackend::transfers`]).
    uploads: AtomicU64,
    downloads: AtomicU64,
    /// Every `download` fails ([`HostBackend::with_failing_downloads`]).
    fail_downloads: bool,
}

/// How often a [`HostBackend`]'s host access was called: what a layer above it (the MPI
/// layer's staging, say) copies in and out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostTransfers {
    /// Calls of [`Backend::upload`], failed ones included.
    pub uploads: u64,
    /// Calls of [`Backend::download`], failed ones included.
    pub downloads: u64,
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl HostBackend {
    /// A host backend with no memory and no threads yet; its lanes run on at most one
    /// worker thread per core (`std::thread::available_parallelism`).
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_lane_threads(cores)
    }

    /// A host backend whose lanes run on at most `threads` worker threads (at least 1),
    /// whatever the number of lanes: a lane waiting for another lane's event parks, so one
    /// thread runs any launch.
    pub fn with_lane_threads(threads: usize) -> Self {
        HostBackend {
            blocks: Mutex::new(HashMap::new()),
            arenas: Mutex::new(BTreeMap::new()),
            pool: LanePool::new(threads),
            inflight: Mutex::new(None),
            pending: Mutex::new(None),
            limit: None,
            uploads: AtomicU64::new(0),
            downloads: AtomicU64::new(0),
            fail_downloads: false,
        }
    }

    /// A host backend that refuses an allocation taking its arenas past `bytes` in all, as a
    /// device out of memory refuses it: how tests make one rank's allocation fail while its
    /// peers' succeed.
    pub fn with_allocation_limit(bytes: u64) -> Self {
        let mut b = Self::new();
        b.limit = Some(bytes);
        b
    }

    /// A host backend whose every `download` fails (after counting it), as a device whose
    /// copies to the host fail: how tests make one rank's staged sends fail while its peers'
    /// succeed.
    pub fn with_failing_downloads() -> Self {
        let mut b = Self::new();
        b.fail_downloads = true;
        b
    }

    /// The calls of `upload` and `download` since the backend was made.
    pub fn transfers(&self) -> HostTransfers {
        HostTransfers {
            uploads: self.uploads.load(Ordering::Relaxed),
            downloads: self.downloads.load(Ordering::Relaxed),
        }
    }

    /// Bytes allocated in `location`'s arena.
    pub fn bytes_in_use(&self, location: Location) -> u64 {
        lock(&self.arenas).get(&location).copied().unwrap_or(0)
    }

    /// Worker threads started (kept between launches): at most [`Self::max_workers`], and
    /// at most the most lanes a launch so far has had.
    pub fn worker_count(&self) -> usize {
        self.pool.threads()
    }

    /// The most worker threads this backend starts.
    pub fn max_workers(&self) -> usize {
        self.pool.max_threads()
    }

    /// Take the gate and wait for the launch in flight; keep its error for the next
    /// `synchronize`. Whoever holds the returned guard has the arenas to itself: the launch
    /// in flight has ended and no new one starts until the guard drops. The wait ends:
    /// `submit` refuses programs whose waits could block forever, and a failed lane releases
    /// every waiting one.
    fn quiesce(&self) -> MutexGuard<'_, Option<Arc<LaunchState>>> {
        let mut gate = lock(&self.inflight);
        if let Some(state) = gate.take()
            && let Some(e) = state.wait_done()
        {
            lock(&self.pending).get_or_insert(e);
        }
        gate
    }

    /// Resolve a region of a block to an address, checking bounds.
    fn resolve_region(blocks: &HashMap<u64, Block>, r: &ByteRegion) -> Result<usize> {
        let b = blocks
            .get(&r.mem.id())
            .ok_or_else(|| err(format!("allocation {} is unknown or freed", r.mem.id())))?;
        let end = r.offset.checked_add(r.bytes);
        if end.is_none_or(|e| e > b.bytes) {
            return Err(err(format!(
                "region {}+{} lies outside allocation {} of {} bytes",
                r.offset,
                r.bytes,
                r.mem.id(),
                b.bytes
            )));
        }
        Ok(b.addr + r.offset as usize)
    }
}

/// One resolved command as a lane task of a launch whose events start at `event0` and whose
/// reduction sources start at `src0`. A copy streams its stores (non-temporal) where it is
/// large, its ranges do not overlap, and its destination binding is memory a caller lent
/// (`lent`), which the launch does not read back soon. Returns the command's lane too.
pub(super) fn task_of(
    c: Resolved,
    p: &super::Program,
    (event0, src0): (usize, usize),
    lent: impl Fn(usize) -> bool,
) -> (usize, Task) {
    match c {
        Resolved::Copy {
            lane,
            src,
            dst,
            dst_binding,
            bytes,
        } => (
            lane,
            Task::Copy {
                src: src as usize,
                dst: dst as usize,
                bytes: bytes as usize,
                stream: bytes >= STREAM_MIN_BYTES
                    && (src + bytes <= dst || dst + bytes <= src)
                    && lent(dst_binding),
            },
        ),
        Resolved::Reduce {
            lane,
            first,
            count,
            dst,
            len,
            divisor,
        } => (
            lane,
            Task::Reduce {
                first: src0 + first,
                count,
                dst: dst as usize,
                len: len as usize,
                dtype: p.dtype,
                op: p.op,
                divisor,
                outs: 0,
                fan: 0,
            },
        ),
        Resolved::Record { lane, event } => (lane, Task::Record(event0 + event)),
        Resolved::Wait { lane, event } => (lane, Task::Wait(event0 + event)),
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn allocate(&self, location: Location, bytes: u64) -> Result<DeviceMem> {
        let size = usize::try_from(bytes).map_err(|_| err(format!("{bytes} bytes do not fit")))?;
        if let Some(limit) = self.limit {
            let held: u64 = lock(&self.arenas).values().sum();
            if held.saturating_add(bytes) > limit {
                return Err(err(format!(
                    "out of memory: {bytes} bytes more than the {limit}-byte allocation limit \
                     ({held} held)"
                )));
            }
        }
        let (addr, layout) = if size == 0 {
            // A zero-byte block owns no memory; any aligned address serves.
            (ARENA_ALIGN, None)
        } else {
            let layout = Layout::from_size_align(size, ARENA_ALIGN)
                .map_err(|e| err(format!("cannot allocate {bytes} bytes: {e}")))?;
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { alloc_zeroed(layout) };
            if p.is_null() {
                return Err(err(format!("out of host memory allocating {bytes} bytes")));
            }
            (p as usize, Some(layout))
        };
        let mem = DeviceMem::fresh(location, bytes);
        lock(&self.blocks).insert(
            mem.id(),
            Block {
                addr,
                layout,
                location,
                bytes,
                lent: false,
            },
        );
        *lock(&self.arenas).entry(location).or_insert(0) += bytes;
        Ok(mem)
    }

    fn free(&self, mem: DeviceMem) {
        let _gate = self.quiesce();
        let Some(b) = lock(&self.blocks).remove(&mem.id()) else {
            lock(&self.pending).get_or_insert(format!("free of unknown allocation {}", mem.id()));
            return;
        };
        if b.lent {
            // The lender keeps its memory; the block only leaves the table.
            return;
        }
        if let Some(a) = lock(&self.arenas).get_mut(&b.location) {
            *a = a.saturating_sub(b.bytes);
        }
        if let Some(layout) = b.layout {
            // SAFETY: the block came from `alloc_zeroed` with this layout, was removed from the
            // table (so freed once), and no launch is in flight to use it.
            unsafe { dealloc(b.addr as *mut u8, layout) };
        }
    }

    fn upload(&self, dst: ByteRegion, src: &[u8]) -> Result<()> {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        if src.len() as u64 != dst.bytes {
            return Err(err("upload length differs from the region's"));
        }
        let _gate = self.quiesce();
        let blocks = lock(&self.blocks);
        let addr = Self::resolve_region(&blocks, &dst)?;
        // SAFETY: the region lies inside a live block (checked), no launch runs, and the
        // table lock keeps `free` out; `src` is a distinct host slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&self, src: ByteRegion, dst: &mut [u8]) -> Result<()> {
        self.downloads.fetch_add(1, Ordering::Relaxed);
        if self.fail_downloads {
            return Err(err("download failed (with_failing_downloads)"));
        }
        if dst.len() as u64 != src.bytes {
            return Err(err("download length differs from the region's"));
        }
        let _gate = self.quiesce();
        let blocks = lock(&self.blocks);
        let addr = Self::resolve_region(&blocks, &src)?;
        // SAFETY: as in `upload`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()> {
        // One step under the gate: wait for the previous launch, resolve, start this one.
        // Nothing else that touches memory (another submit, `free`, host access) can come
        // between, so launches never overlap and no block leaves while a launch uses it.
        let mut gate = self.quiesce();
        let mut lanes: Vec<Vec<Task>> = Vec::new();
        let mut srcs: Vec<usize> = Vec::new();
        let mut events = 0usize;
        {
            let blocks = lock(&self.blocks);
            for (pi, l) in launches.iter().enumerate() {
                let bound = l
                    .bindings
                    .iter()
                    .map(|r| {
                        Self::resolve_region(&blocks, r).map(|a| Bound {
                            addr: a as u64,
                            bytes: r.bytes,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let resolved = validate::resolve("host", pi, l.program, &bound)?;
                let p = l.program;
                let (lane0, event0, src0) = (lanes.len(), events, srcs.len());
                lanes.resize_with(lane0 + p.lanes.len(), Vec::new);
                events += p.events as usize;
                srcs.extend(resolved.srcs.iter().map(|&a| a as usize));
                for c in resolved.commands {
                    let lent = |b: usize| {
                        l.bindings
                            .get(b)
                            .is_some_and(|r| blocks.get(&r.mem.id()).is_some_and(|b| b.lent))
                    };
                    let (lane, task) = task_of(c, p, (event0, src0), lent);
                    lanes[lane0 + lane].push(task);
                }
            }
        }
        let mut outs = Vec::new();
        for lane in &mut lanes {
            forward_copies(lane, &mut srcs);
            fuse_fan_out(lane, &srcs, &mut outs);
        }
        let busy: Vec<usize> = (0..lanes.len()).filter(|l| !lanes[*l].is_empty()).collect();
        if busy.is_empty() {
            return Ok(());
        }
        if busy.len() == 1 {
            // One lane (a send and its receive, one rank's copy): run it on this thread,
            // under the gate, instead of handing it to a worker and back, two thread
            // switches that cost more than a small copy. Its error waits for `synchronize`
            // as a worker's would.
            let mut set = vec![false; events];
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // SAFETY: every task's ranges lie in blocks resolved above under the gate,
                // which this thread holds until the run ends, so none leaves meanwhile.
                unsafe { run_here(&lanes, &srcs, &outs, &mut set) }
            }));
            store_fence();
            let failed = match ran {
                Ok(r) => r.err(),
                Err(_) => Some("a lane run on the submitting thread panicked".into()),
            };
            if let Some(e) = failed {
                lock(&self.pending).get_or_insert(e);
            }
            return Ok(());
        }
        // No worker at all is an error before anything starts; fewer than wanted share lanes.
        self.pool.ensure(busy.len()).map_err(err)?;
        let state = Arc::new(LaunchState::new(lanes, srcs, outs, events, busy.len()));
        *gate = Some(state.clone());
        self.pool.start(&state, &busy);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        drop(self.quiesce());
        match lock(&self.pending).take() {
            Some(e) => Err(err(e)),
            None => Ok(()),
        }
    }
}

/// The host backend lends host slices: a lent block is the caller's memory, read and written
/// in place by launches (not counted in the arenas, never deallocated here), and taken back by
/// `free`, which waits for the launches in flight.
impl Trusted for HostBackend {
    fn lending(&self, _: Private) -> Lending {
        Lending::HostSlices
    }

    unsafe fn lend(&self, location: Location, loan: Loan, _: Private) -> Result<DeviceMem> {
        let Loan::Host { addr, bytes } = loan else {
            return Err(err("device memory lent to the host backend"));
        };
        // A zero-byte block owns nothing: any aligned address serves (an empty slice's
        // address may be dangling).
        let addr = if bytes == 0 { ARENA_ALIGN } else { addr };
        let mem = DeviceMem::fresh(location, bytes);
        lock(&self.blocks).insert(
            mem.id(),
            Block {
                addr,
                layout: None,
                location,
                bytes,
                lent: true,
            },
        );
        Ok(mem)
    }

    fn unlend(&self, mem: DeviceMem, _: Private) {
        // `free` waits for the launches in flight; a lent block only leaves the table.
        self.free(mem);
    }

    fn raw_region(&self, region: ByteRegion, _: Private) -> Result<Option<RawRegion>> {
        let blocks = lock(&self.blocks);
        let addr = Self::resolve_region(&blocks, &region)?;
        Ok(Some(RawRegion {
            addr,
            bytes: region.bytes,
            space: AddressSpace::Host,
        }))
    }

    #[cfg(feature = "cuda")]
    unsafe fn submit_on_streams(
        &self,
        _launches: &[Launch<'_>],
        _streams: &[&cudarc::driver::CudaStream],
        _: Private,
    ) -> Result<()> {
        Err(err(
            "launches ordered within CUDA streams need the CUDA backend",
        ))
    }

    #[cfg(feature = "cuda")]
    fn as_cuda(&self, _: Private) -> Option<&crate::cuda::CudaBackend> {
        None
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        // The launch in flight ends first; the pool's workers are joined when it drops.
        drop(self.quiesce());
        for (_, b) in lock(&self.blocks).drain() {
            if let Some(layout) = b.layout {
                // SAFETY: every block still in the table came from `alloc_zeroed` with this
                // layout and was not freed; no launch runs any more.
                unsafe { dealloc(b.addr as *mut u8, layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_limit_refuses_what_would_pass_it_and_frees_give_room_back() {
        let b = HostBackend::with_allocation_limit(1000);
        let at = Location::Gpu(0);
        let first = b.allocate(at, 600).unwrap();
        let err = b.allocate(Location::Host(0), 600).unwrap_err().to_string();
        assert!(err.contains("allocation limit"), "{err}");
        let second = b.allocate(at, 400).unwrap();
        b.free(first);
        let third = b.allocate(at, 600).unwrap();
        b.free(second);
        b.free(third);
        assert_eq!(b.bytes_in_use(at), 0);
    }

    /// The raw address is the region's first byte: what `upload` wrote is there, and what is
    /// written there `download` reads; unknown allocations and regions past the end are errors.
    #[test]
    fn raw_region_is_the_memory_upload_and_download_see() {
        let b = HostBackend::new();
        let mem = b.allocate(Location::Gpu(0), 16).expect("allocate");
        let r = ByteRegion {
            mem,
            offset: 4,
            bytes: 8,
        };
        b.upload(r, &[1, 2, 3, 4, 5, 6, 7, 8]).expect("upload");
        let raw = b
            .raw_region(r, Private)
            .expect("known")
            .expect("host memory has an address");
        assert_eq!(raw.space, AddressSpace::Host);
        assert_eq!(raw.bytes, 8);
        // SAFETY: the region is 8 live bytes of `mem`; no launch is in flight.
        let bytes = unsafe { std::slice::from_raw_parts_mut(raw.addr as *mut u8, 8) };
        assert_eq!(bytes, &[1, 2, 3, 4, 5, 6, 7, 8]);
        bytes[0] = 9;
        let mut back = [0u8; 8];
        b.download(r, &mut back).expect("download");
        assert_eq!(back[0], 9);
        let past = ByteRegion { offset: 12, ..r };
        assert!(b.raw_region(past, Private).is_err());
        b.free(mem);
        assert!(b.raw_region(r, Private).is_err());
        assert!(b.synchronize().is_ok());
    }

    /// A handle names one allocation of one backend: another backend's handle, of the same
    /// size and made in the same order, is unknown here (so it reaches neither this backend's
    /// arenas nor memory lent to it), and so is a freed handle, even after new allocations.
    #[test]
    fn a_handle_of_another_backend_or_a_freed_one_names_nothing() {
        let (a, b) = (HostBackend::new(), HostBackend::new());
        let here = Location::Gpu(0);
        let mine = a.allocate(here, 64).expect("allocate");
        let theirs = b.allocate(here, 64).expect("allocate");
        assert_ne!(mine.id(), theirs.id());
        let r = |mem| ByteRegion {
            mem,
            offset: 0,
            bytes: 64,
        };
        assert!(a.upload(r(theirs), &[7; 64]).is_err());
        assert!(a.download(r(theirs), &mut [0; 64]).is_err());
        assert!(a.raw_region(r(theirs), Private).is_err());
        a.free(theirs);
        assert!(
            a.synchronize().is_err(),
            "a free of an unknown handle is reported"
        );
        let mut back = [1u8; 64];
        a.download(r(mine), &mut back).expect("download");
        assert_eq!(back, [0; 64], "another backend's handle wrote nothing here");
        a.free(mine);
        let _next = a.allocate(here, 64).expect("allocate");
        assert!(a.upload(r(mine), &[7; 64]).is_err());
        b.free(theirs);
        assert!(b.synchronize().is_ok());
    }

    /// `transfers` counts every upload and download, failed ones included; a backend made
    /// `with_failing_downloads` refuses each download and leaves the destination as it was.
    #[test]
    fn transfers_are_counted_and_failing_downloads_fail() {
        for failing in [false, true] {
            let b = if failing {
                HostBackend::with_failing_downloads()
            } else {
                HostBackend::new()
            };
            let mem = b.allocate(Location::Gpu(0), 8).expect("allocate");
            let r = ByteRegion {
                mem,
                offset: 0,
                bytes: 8,
            };
            b.upload(r, &[3; 8]).expect("upload");
            assert!(
                b.upload(r, &[3; 4]).is_err(),
                "a length mismatch is refused"
            );
            let mut back = [9u8; 8];
            assert_eq!(b.download(r, &mut back).is_err(), failing);
            assert_eq!(back, if failing { [9; 8] } else { [3; 8] });
            let t = b.transfers();
            assert_eq!((t.uploads, t.downloads), (2, 1));
            b.free(mem);
        }
    }
}
