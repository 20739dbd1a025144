//! The shared-memory transport of the executor's runner ([`crate::exec::run::Transport`]) for
//! the typed collectives of a communicator whose ranks all share one host's memory: every
//! ordered pair of ranks has a channel, a ring of slots in an MPI-3 shared window
//! (`MPI_Win_allocate_shared` over the `MPI_COMM_TYPE_SHARED` split), and a message moves in
//! one of two ways:
//! - **Slots** (messages under [`SINGLE_COPY_MIN_BYTES`], or every message where single
//!   copies are off): in slot-sized chunks, the sender copies a chunk into a free slot and
//!   publishes it, the receiver copies it out and frees the slot. Both copies run in user
//!   space with non-temporal stores (the receiver's for large messages only).
//! - **Single copy** (cross-memory attach, as Open MPI's shared-memory transport moves large
//!   messages [OpenMPI-vader]): the sender publishes only the message's address in a slot
//!   header; the receiver copies the bytes straight from the sender's memory into its
//!   destination with `process_vm_readv`, then frees the slot, and the sender's send
//!   completes only then. Setup probes it (a read of the next rank's window) and every rank
//!   must succeed, since a container's seccomp policy or Yama's ptrace scope may forbid it;
//!   `RELAYCC_MPI_SINGLE_COPY=0` turns it off.
//! - **Single copy in user space** (from a [`SharedHostBuffer`](super::SharedHostBuffer),
//!   relaycc's `ncclMemAlloc`): when a single-copy message's bytes lie in one, the header
//!   names the buffer (its serial, its file descriptor in the sender, the offset) instead of
//!   an address; the receiver maps
//!   the buffer read-only (once, cached) and copies with streaming stores, faster per byte
//!   than the kernel's copy. Setup probes it too (a rank maps the next rank's probe buffer),
//!   and every buffer's size is sealed, so a mapping never faults past its end.
//!
//! A kernel copy is slower per byte than a user-space copy with streaming stores, but a slot
//! moves every byte twice, so single copies win from 1 MiB messages; `docs/MEASUREMENTS.md`
//! ("MPI host transport on one machine") has `relaycc bench --backend mpi --vs-mpi` on 8
//! processes for slots, single copies and shared buffers.
//!
//! Protocol per channel (sender `s`, receiver `d`, in `s`'s part of the window): `head`
//! counts the chunks `s` published, `tail` the chunks `d` consumed; slot `k mod SLOTS` holds
//! chunk `k` with its tag, message length and offset. `s` writes a chunk only while
//! `head - tail < SLOTS`, then stores `head + 1` (release); `d` reads `head` (acquire), copies
//! the chunk out, then stores `tail + 1` (release), which orders its reads before the slot's
//! reuse. Chunks of a pair arrive in the order they were sent; both sides post a pair's
//! messages of a stage in op-id order (the runner's rule), and every rank makes the same
//! typed collective calls in the same order (agreed before each call), so the `n`-th message
//! a rank receives from a peer is the `n`-th that peer sends it. The tag and length travel
//! with every chunk and are checked: a mismatch is an error, never silent corruption.
//!
//! Why it cannot deadlock: a send completes once its last chunk is in the ring, a receive once
//! it copied its last chunk. In a stage a rank advances all of its sends and receives in one
//! loop, so it never blocks on one message while another could move. A pair's ring holds only
//! chunks the receiver consumes at its current or a later stage, in order; by induction on
//! stages (the executor's argument) every receiver reaches the stage of every chunk in its
//! rings, so every full ring drains.
//!
//! A single-copy send waits for its receiver, as MPI's own large messages do (rendezvous). It
//! still cannot deadlock: the sender and the receiver of a message post it at the same level
//! (the executor's README, "Why the stages cannot deadlock"), so by the same induction the
//! receiver is in that stage too, and within a stage a rank advances all of its sends and
//! receives in one loop.
//!
//! Failures: a wait that passes the run's deadline returns [`MpiError::Timeout`], which fails
//! the communicator (the rings' state is then unknown). Peers only ever write the shared
//! window, never this process's buffers; with single copies they read this process's
//! sources, but only until the send completes: a rank whose run fails with single-copy sends
//! still unread sets its channels' abandon flags first, and a receiver that finds the flag set
//! after its copy fails instead of returning bytes the caller may since have reused. So when a
//! run returns nothing can change the caller's memory any more, and nothing read from it
//! afterwards is used: unlike MPI requests, nothing is left to bury. The window is
//! never freed: `MPI_Win_free` is collective, and a communicator dropped after a peer stopped
//! would wait for it forever; the memory goes with the process: `ranks` channels of 4 MiB
//! per rank, of which a page per channel is touched at setup and the slots as messages use
//! them. The window's layout, its creation and the setup probes are in
//! [`super::shm_window`].

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ::mpi::topology::SimpleCommunicator;

use super::MpiError;
use super::requests::SPINS_BEFORE_YIELD;
use super::shared_buffer::{self, PeerMappings};
use super::shm_board::ShmBoard;
use super::shm_window::{LINE_BYTES, SLOT_BYTES, SLOTS, ShmWindow, channel_bytes, read_peer};
use crate::backend::AddressSpace;
use crate::exec::run::Transport;

/// Smallest message copied out with non-temporal stores: the receiver's memory of a large
/// message is not read again soon, so its lines go to memory without first being read
/// ([Intel-Opt]); small messages stay in the cache for the ops that read them next. Slots
/// are always written with streaming stores: a receiver reads a chunk after other ranks ran
/// on the core, when the cache holds it only rarely.
const STREAM_MIN_BYTES: usize = 256 * 1024;

/// Smallest message moved by a single copy (cross-memory attach, `process_vm_readv`) where the
/// ranks may read each other's memory: the sender publishes only the message's address, the
/// receiver copies it straight into its destination, and the sender's send completes once the
/// receiver says it is done. Below it, the copy in and out of a slot costs less than the system
/// call and the wait for the receiver (module docs: 64 KiB served 128 KiB messages better than
/// slots did).
pub(crate) const SINGLE_COPY_MIN_BYTES: usize = 64 * 1024;
/// Offset of a channel's abandon flag in its `head` line: a sender whose run fails with
/// single-copy sends unread sets it ([`ShmTransport::abandon_single_copies`]).
const ABANDON_FLAG: usize = 8;

/// The shared window of a communicator whose ranks share one host's memory, and the lists a
/// run's transport reuses.
pub(crate) struct ShmSegment {
    /// The shared-memory split the window lives on (kept alive with the window).
    _local: SimpleCommunicator,
    /// Base address of every rank's part of the window in this process.
    bases: Vec<usize>,
    rank: u32,
    /// Each rank's process id, where every rank may read every other's memory with
    /// `process_vm_readv` (probed at setup; `RELAYCC_MPI_SINGLE_COPY=0` turns it off): large
    /// messages then move by a single copy.
    single_copy: Option<Vec<libc::pid_t>>,
    /// Whether every rank may map every other's shared buffers
    /// ([`SharedHostBuffer`](super::SharedHostBuffer); probed at setup, with single copies
    /// only): a single-copy message from one is then copied in user space.
    shared_buffers: bool,
    /// Peers' shared buffers mapped here.
    peer_mappings: RefCell<PeerMappings>,
    lists: RefCell<Lists>,
    /// The agreement board in the same window.
    board: ShmBoard,
}

impl std::fmt::Debug for ShmSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmSegment")
            .field("rank", &self.rank)
            .field("ranks", &self.bases.len())
            .finish()
    }
}

/// A posted message of the current stage.
#[derive(Debug, Clone, Copy)]
struct Msg {
    peer: u32,
    tag: u32,
    addr: usize,
    bytes: usize,
    /// Chunks moved so far, and how many the message has (at least one). A single-copy send
    /// has two steps: its address published, then the receiver's acknowledgement.
    moved: usize,
    chunks: usize,
    /// Moved by a single copy ([`SINGLE_COPY_MIN_BYTES`]).
    single: bool,
    /// A single-copy send: the `tail` its receiver reaches once it has copied it.
    acked_at: u64,
}

impl Msg {
    fn finished(&self) -> bool {
        self.moved == self.chunks
    }
}

/// The stage's sends and receives, and which peers already have an earlier unfinished
/// message in this pass (a pair's messages move in order).
#[derive(Debug, Default)]
struct Lists {
    sends: Vec<Msg>,
    recvs: Vec<Msg>,
    busy: Vec<bool>,
}

impl ShmSegment {
    /// Collective (blocking, as communicator setup is) over `comm`: the shared window
    /// ([`ShmWindow::open`]) when every rank of `comm` shares memory with every other, there
    /// are 2 to 64 of them, every rank wants it (`RELAYCC_MPI_SHM` is not `0`) and every
    /// allocation succeeds; `None` otherwise (the typed collectives then use MPI messages).
    pub(crate) fn new(comm: &SimpleCommunicator) -> Option<Self> {
        let w = ShmWindow::open(comm)?;
        Some(ShmSegment {
            board: ShmBoard::new(&w.bases, w.rank),
            _local: w.local,
            bases: w.bases,
            rank: w.rank,
            single_copy: w.single_copy,
            shared_buffers: w.shared_buffers,
            peer_mappings: RefCell::default(),
            lists: RefCell::default(),
        })
    }

    /// The communicator's agreement board, in the same window.
    pub(crate) fn board(&self) -> &ShmBoard {
        &self.board
    }

    /// Whether peers may map this rank's shared buffers: run buffers are worth making
    /// shared.
    pub(crate) fn maps_shared_buffers(&self) -> bool {
        self.shared_buffers
    }

    /// How messages move ([`super::MpiCommunicator::host_transport`]).
    pub(crate) fn describe(&self) -> String {
        if self.single_copy.is_none() {
            return "shared memory".to_string();
        }
        let single = format!(
            "shared memory, single copy from {} KiB",
            SINGLE_COPY_MIN_BYTES / 1024
        );
        if self.shared_buffers {
            format!("{single} (in user space from shared buffers)")
        } else {
            single
        }
    }

    /// The channel from `s` to `d`: its first byte, in `s`'s part of the window.
    fn channel(&self, s: u32, d: u32) -> usize {
        self.bases[s as usize] + d as usize * channel_bytes()
    }

    /// A transport over this window for one run, whose stages must each complete before
    /// `deadline` (`timeout` after the run began, for the error).
    pub(crate) fn transport(&self, deadline: Instant, timeout: Duration) -> ShmTransport<'_> {
        ShmTransport {
            seg: self,
            deadline,
            timeout,
        }
    }
}
/// Copy `len` bytes of a received message of `message_bytes` from `src` to its destination
/// `dst`: with streaming stores from [`STREAM_MIN_BYTES`], whose destination is not read again
/// soon, plainly below, where it stays in the cache for the ops that read it next.
///
/// # Safety
/// `src` holds `len` readable bytes and `dst` `len` writable ones that nothing else touches
/// during the call, not overlapping.
unsafe fn copy_out(src: *const u8, dst: *mut u8, len: usize, message_bytes: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if message_bytes >= STREAM_MIN_BYTES {
            crate::backend::host::stream_copy(src, dst, len);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, len);
        }
    }
}
/// A channel's counter at `addr`.
///
/// # Safety
/// `addr` is an 8-byte aligned counter line of a live window.
unsafe fn counter<'a>(addr: usize) -> &'a AtomicU64 {
    // SAFETY: the caller's contract; the window lives as long as the segment, and every
    // access to the counter goes through atomics, from any process.
    unsafe { &*(addr as *const AtomicU64) }
}

/// A slot's header: the message's tag and length and the chunk's offset and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
struct Header {
    tag: u64,
    total: u64,
    offset: u64,
    len: u64,
    /// A single-copy message: its address in the sender's memory (0 otherwise), or its
    /// offset in the sender's shared buffer.
    remote: u64,
    /// A single-copy message from a shared buffer: the buffer's serial (0 otherwise).
    region: u64,
    /// The shared buffer's file descriptor in the sender.
    region_fd: u64,
}

// A header is one cache line.
const _: () = assert!(std::mem::size_of::<Header>() <= LINE_BYTES);

/// The runner's transport over a [`ShmSegment`] for one run.
#[derive(Debug)]
pub(crate) struct ShmTransport<'s> {
    seg: &'s ShmSegment,
    deadline: Instant,
    timeout: Duration,
}

impl ShmTransport<'_> {
    /// Move every chunk of `m` (a send) that the ring has room for; true if any moved.
    fn push(&self, m: &mut Msg) -> bool {
        let ch = self.seg.channel(self.seg.rank, m.peer);
        // SAFETY: the channel's first two lines are its counters (`channel`, page-aligned
        // bases and line multiples).
        let (head, tail) = unsafe { (counter(ch), counter(ch + LINE_BYTES)) };
        if m.single {
            return self.push_single(m, ch, head, tail);
        }
        let mut moved = false;
        while !m.finished() {
            let h = head.load(Ordering::Relaxed);
            if h.wrapping_sub(tail.load(Ordering::Acquire)) >= SLOTS as u64 {
                break;
            }
            let k = (h % SLOTS as u64) as usize;
            let offset = m.moved * SLOT_BYTES;
            let len = (m.bytes - offset).min(SLOT_BYTES);
            let header = Header {
                tag: u64::from(m.tag),
                total: m.bytes as u64,
                offset: offset as u64,
                len: len as u64,
                remote: 0,
                region: 0,
                region_fd: 0,
            };
            let at = ch + 2 * LINE_BYTES;
            // SAFETY: slot `k` and its header line are inside the channel; the receiver
            // freed them (`tail` acquired above) and reads them only after `head` moves;
            // the source holds `m.bytes` readable bytes (the runner's contract).
            unsafe {
                std::ptr::write_volatile((at + k * LINE_BYTES) as *mut Header, header);
                let slot = at + SLOTS * LINE_BYTES + k * SLOT_BYTES;
                crate::backend::host::stream_copy(
                    (m.addr + offset) as *const u8,
                    slot as *mut u8,
                    len,
                );
            }
            crate::backend::host::store_fence();
            head.store(h.wrapping_add(1), Ordering::Release);
            m.moved += 1;
            moved = true;
        }
        moved
    }

    /// A single-copy send: publish the message's address in a slot header, then wait for the
    /// receiver's `tail` to pass it (it has copied the bytes); true if either step happened.
    fn push_single(&self, m: &mut Msg, ch: usize, head: &AtomicU64, tail: &AtomicU64) -> bool {
        if m.moved == 0 {
            let h = head.load(Ordering::Relaxed);
            if h.wrapping_sub(tail.load(Ordering::Acquire)) >= SLOTS as u64 {
                return false;
            }
            let k = (h % SLOTS as u64) as usize;
            let shared = self
                .seg
                .shared_buffers
                .then(|| shared_buffer::find_registered(m.addr, m.bytes))
                .flatten();
            let (remote, region, region_fd) = match shared {
                Some((serial, fd, offset)) => (offset as u64, serial, fd as u64),
                None => (m.addr as u64, 0, 0),
            };
            let header = Header {
                tag: u64::from(m.tag),
                total: m.bytes as u64,
                offset: 0,
                len: m.bytes as u64,
                remote,
                region,
                region_fd,
            };
            // SAFETY: as in `push`: the header line is free and read only after `head` moves.
            unsafe {
                std::ptr::write_volatile(
                    (ch + 2 * LINE_BYTES + k * LINE_BYTES) as *mut Header,
                    header,
                )
            };
            head.store(h.wrapping_add(1), Ordering::Release);
            m.acked_at = h.wrapping_add(1);
            m.moved = 1;
            return true;
        }
        // `tail` at or past `acked_at` (counters wrap): the receiver's copy is over, and its
        // release store orders it before this load.
        if tail.load(Ordering::Acquire).wrapping_sub(m.acked_at) < 1 << 63 {
            m.moved = 2;
            return true;
        }
        false
    }

    /// Mark every single-copy send of this rank still waiting for its receiver as given up, so
    /// that a receiver copying it fails instead of returning bytes the caller may already
    /// have reused (this rank's run is failing).
    fn abandon_single_copies(&self, sends: &[Msg]) {
        for m in sends.iter().filter(|m| m.single && m.moved == 1) {
            let ch = self.seg.channel(self.seg.rank, m.peer);
            // SAFETY: `ABANDON_FLAG` is an aligned word of the channel's head line.
            unsafe { counter(ch + ABANDON_FLAG) }.store(1, Ordering::Release);
        }
    }

    /// Copy out every chunk of `m` (a receive) that has arrived; true if any moved.
    fn pull(&self, m: &mut Msg) -> Result<bool, MpiError> {
        let ch = self.seg.channel(m.peer, self.seg.rank);
        // SAFETY: as in `push`.
        let (head, tail) = unsafe { (counter(ch), counter(ch + LINE_BYTES)) };
        let mut moved = false;
        while !m.finished() {
            let t = tail.load(Ordering::Relaxed);
            if head.load(Ordering::Acquire) == t {
                break;
            }
            let k = (t % SLOTS as u64) as usize;
            let at = ch + 2 * LINE_BYTES;
            // SAFETY: the sender wrote this header before publishing `head` (acquired).
            let got = unsafe { std::ptr::read_volatile((at + k * LINE_BYTES) as *const Header) };
            let offset = m.moved * SLOT_BYTES;
            let want = Header {
                tag: u64::from(m.tag),
                total: m.bytes as u64,
                offset: offset as u64,
                len: if m.single {
                    m.bytes as u64
                } else {
                    (m.bytes - offset).min(SLOT_BYTES) as u64
                },
                // Compared apart: only a single copy carries an address or a buffer.
                remote: got.remote,
                region: got.region,
                region_fd: got.region_fd,
            };
            if got != want {
                return Err(MpiError::PlanMismatch(format!(
                    "rank {} expected bytes {}..{} of a {}-byte message with tag {} from rank \
                     {}, which sent bytes {}..{} of a {}-byte message with tag {}",
                    self.seg.rank,
                    want.offset,
                    want.offset + want.len,
                    want.total,
                    want.tag,
                    m.peer,
                    got.offset,
                    got.offset + got.len,
                    got.total,
                    got.tag
                )));
            }
            if m.single != (got.remote != 0 || got.region != 0) {
                return Err(MpiError::PlanMismatch(format!(
                    "rank {} expected a {}-byte message with tag {} from rank {} by {}, which \
                     sent it by {}",
                    self.seg.rank,
                    want.total,
                    want.tag,
                    m.peer,
                    if m.single { "a single copy" } else { "slots" },
                    if m.single { "slots" } else { "a single copy" },
                )));
            }
            let dst = (m.addr + offset) as *mut u8;
            let len = want.len as usize;
            if m.single {
                self.pull_single(m, ch, dst, &got)?;
                tail.store(t.wrapping_add(1), Ordering::Release);
                m.moved = m.chunks;
                moved = true;
                continue;
            }
            let slot = at + SLOTS * LINE_BYTES + k * SLOT_BYTES;
            // SAFETY: the slot holds the chunk (published, not reused before `tail` moves);
            // the destination holds `m.bytes` writable bytes that nothing else touches (the
            // runner's contract), and `offset + len <= m.bytes`.
            unsafe { copy_out(slot as *const u8, dst, len, m.bytes) };
            tail.store(t.wrapping_add(1), Ordering::Release);
            m.moved += 1;
            moved = true;
        }
        Ok(moved)
    }

    /// Copy a single-copy message of `m.bytes` (at `got.remote` in the sender's memory, or in
    /// its shared buffer `got.region`) to `dst`, then check that the sender did not give it up
    /// meanwhile.
    fn pull_single(&self, m: &Msg, ch: usize, dst: *mut u8, got: &Header) -> Result<(), MpiError> {
        let rank = self.seg.rank;
        let pid = self
            .seg
            .single_copy
            .as_ref()
            .and_then(|p| p.get(m.peer as usize).copied())
            .ok_or_else(|| MpiError::Transport {
                rank,
                why: format!("no process id for rank {}", m.peer),
            })?;
        if got.region != 0 {
            let fd = i32::try_from(got.region_fd).map_err(|_| MpiError::Transport {
                rank,
                why: format!("rank {} sent a bad descriptor {}", m.peer, got.region_fd),
            })?;
            let src = self
                .seg
                .peer_mappings
                .borrow_mut()
                .locate(m.peer, pid, got.region, fd, got.remote as usize, m.bytes)
                .map_err(|why| MpiError::Transport { rank, why })?;
            // SAFETY: `src` is `m.bytes` readable bytes of the sender's buffer, mapped here
            // (`locate` checked the range) and kept alive by the mapping; the sender writes it
            // again only after `tail` passes this message, or sets the abandon flag checked
            // below. The destination as for `read_peer`.
            unsafe { copy_out(src as *const u8, dst, m.bytes, m.bytes) };
        } else {
            // SAFETY: the destination holds `m.bytes` writable bytes that nothing else
            // touches (the runner's contract); the sender keeps its source alive until `tail`
            // passes this message, or sets the abandon flag checked below.
            unsafe { read_peer(pid, dst, got.remote as usize, m.bytes) }.map_err(|e| {
                MpiError::Transport {
                    rank,
                    why: format!(
                        "process_vm_readv of {} bytes from rank {} (pid {pid}): {e}",
                        m.bytes, m.peer
                    ),
                }
            })?;
        }
        // SAFETY: `ABANDON_FLAG` is an aligned word of the channel's head line. A sender that
        // gave up set it before its caller could reuse the source, so a read that overlapped
        // such reuse sees it here.
        if unsafe { counter(ch + ABANDON_FLAG) }.load(Ordering::Acquire) != 0 {
            return Err(MpiError::Transport {
                rank,
                why: format!("rank {} gave up its message while it was copied", m.peer),
            });
        }
        Ok(())
    }

    fn post(&mut self, send: bool, peer: u32, tag: u32, addr: usize, bytes: usize) {
        let single = self.seg.single_copy.is_some() && bytes >= SINGLE_COPY_MIN_BYTES;
        let m = Msg {
            peer,
            tag,
            addr,
            bytes,
            moved: 0,
            chunks: match (single, send) {
                (true, true) => 2,
                (true, false) => 1,
                (false, _) => bytes.div_ceil(SLOT_BYTES).max(1),
            },
            single,
            acked_at: 0,
        };
        let mut l = self.seg.lists.borrow_mut();
        if send {
            l.sends.push(m);
        } else {
            l.recvs.push(m);
        }
    }
}

impl Transport for ShmTransport<'_> {
    type Error = MpiError;

    fn reaches(&self, space: AddressSpace) -> bool {
        space == AddressSpace::Host
    }

    fn begin(&mut self, _stage: usize) {
        let mut l = self.seg.lists.borrow_mut();
        l.sends.clear();
        l.recvs.clear();
    }

    unsafe fn recv(
        &mut self,
        peer: u32,
        tag: u32,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), MpiError> {
        self.post(false, peer, tag, dst as usize, bytes);
        Ok(())
    }

    unsafe fn send(
        &mut self,
        peer: u32,
        tag: u32,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), MpiError> {
        self.post(true, peer, tag, src as usize, bytes);
        Ok(())
    }

    fn wait(&mut self, stage: usize) -> Result<(), MpiError> {
        let seg = self.seg;
        let mut guard = seg.lists.borrow_mut();
        let lists = &mut *guard;
        let n = seg.bases.len();
        let mut spins = 0u32;
        loop {
            let mut moved = false;
            let mut left = 0usize;
            // Sends, then receives: each pair's messages strictly in posted order.
            lists.busy.clear();
            lists.busy.resize(n, false);
            for m in lists.sends.iter_mut().filter(|m| !m.finished()) {
                if lists.busy[m.peer as usize] {
                    left += 1;
                    continue;
                }
                moved |= self.push(m);
                if !m.finished() {
                    lists.busy[m.peer as usize] = true;
                    left += 1;
                }
            }
            lists.busy.clear();
            lists.busy.resize(n, false);
            for m in lists.recvs.iter_mut().filter(|m| !m.finished()) {
                if lists.busy[m.peer as usize] {
                    left += 1;
                    continue;
                }
                match self.pull(m) {
                    Ok(m) => moved |= m,
                    Err(e) => {
                        self.abandon_single_copies(&lists.sends);
                        return Err(e);
                    }
                }
                if !m.finished() {
                    lists.busy[m.peer as usize] = true;
                    left += 1;
                }
            }
            if left == 0 {
                // Streamed copies are visible before the run's later ops and its caller.
                crate::backend::host::store_fence();
                return Ok(());
            }
            if moved {
                spins = 0;
                continue;
            }
            if Instant::now() > self.deadline {
                self.abandon_single_copies(&lists.sends);
                return Err(MpiError::Timeout {
                    rank: seg.rank,
                    step: "run",
                    level: stage,
                    pending: left,
                    after: self.timeout,
                });
            }
            // Oversubscribed runs (more ranks than cores) need the core back: the peer this
            // rank waits for copies on it.
            spins += 1;
            if spins > SPINS_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    }
}
