//! The shared window of the shared-memory transport ([`super::shm_transport`]) and the
//! agreement board ([`super::shm_board`]): its layout (each rank's part of the window holds
//! its channels of slots, one per receiving rank, then its two board posts), its collective
//! creation over the `MPI_COMM_TYPE_SHARED` split, and the setup
//! probes: single copies with `process_vm_readv` ([`read_peer`]) and mapping peers'
//! [`SharedHostBuffer`]s.

use std::os::raw::{c_int, c_void};

use ::mpi::collective::SystemOperation;
use ::mpi::ffi;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;

use super::shared_buffer::{PeerMappings, SharedHostBuffer};

/// Bytes of one slot: a chunk of a message. Each chunk costs a handshake (two cache lines
/// crossing cores) and, with more ranks than cores, often a context switch while the sender
/// waits for a descheduled receiver, so chunks are large: 1 MiB slots beat 128 KiB ones on
/// all_to_all_v across 8 processes (`docs/MEASUREMENTS.md`).
pub(super) const SLOT_BYTES: usize = 1024 * 1024;
/// Slots per channel: a sender runs up to this many chunks ahead of its receiver.
pub(super) const SLOTS: usize = 4;
/// A cache line: counters and slot headers each get their own, so the sender's and the
/// receiver's writes never share a line.
pub(super) const LINE_BYTES: usize = 64;
/// Alignment of every rank's channels in the window.
const PAGE_BYTES: usize = 4096;
/// Largest communicator given a window: each rank holds one channel per rank.
const MAX_RANKS: i32 = 64;

/// Bytes of one channel: `head`, `tail`, one header line per slot, the slots.
pub(super) const fn channel_bytes() -> usize {
    2 * LINE_BYTES + SLOTS * LINE_BYTES + SLOTS * SLOT_BYTES
}

/// Words one board post carries: a step's words per rank (a typed call's descriptor with its
/// all_to_all_v counts inline is at most 43; an all-to-all of counts on 64 ranks is 64, the
/// all_to_all_v matrix beyond 16 ranks `2 x ranks`). Longer steps go through MPI.
pub(super) const BOARD_WORDS_MAX: usize = 128;
/// Bytes of one board post: a header line (the step it is for, the kind of step, its length
/// in words), then the words.
pub(super) const BOARD_POST_BYTES: usize = LINE_BYTES + BOARD_WORDS_MAX * 8;
/// Bytes of a rank's board: two posts, for even and odd steps.
const BOARD_BYTES: usize = 2 * BOARD_POST_BYTES;

/// Offset of the board in a rank's part of the window on a communicator of `ranks`: after
/// the rank's channels.
pub(super) const fn board_offset(ranks: usize) -> usize {
    ranks * channel_bytes()
}

/// A window made by [`ShmWindow::open`], with what setup probed.
pub(super) struct ShmWindow {
    /// The shared-memory split the window lives on (kept alive with the window).
    pub(super) local: SimpleCommunicator,
    /// Base address of every rank's part of the window in this process.
    pub(super) bases: Vec<usize>,
    pub(super) rank: u32,
    /// Each rank's process id, where every rank may read every other's memory with
    /// `process_vm_readv` (`RELAYCC_MPI_SINGLE_COPY=0` turns it off).
    pub(super) single_copy: Option<Vec<libc::pid_t>>,
    /// Whether every rank may map every other's [`SharedHostBuffer`]s (with single copies
    /// only).
    pub(super) shared_buffers: bool,
}

/// Whether this process may use the shared-memory transport: `RELAYCC_MPI_SHM=0` turns it
/// off (every rank must agree; [`ShmSegment::new`] takes the smallest answer).
fn wanted() -> bool {
    std::env::var("RELAYCC_MPI_SHM").map_or(true, |v| v.trim() != "0")
}

impl ShmWindow {
    /// Collective (blocking, as communicator setup is) over `comm`: a window with one channel
    /// per ordered pair of ranks when every rank of `comm` shares memory with every other,
    /// there are 2 to 64 of them, every rank wants it (`RELAYCC_MPI_SHM` is not `0`) and
    /// every allocation succeeds; `None` otherwise (the typed collectives then use MPI
    /// messages).
    pub(super) fn open(comm: &SimpleCommunicator) -> Option<Self> {
        let size = comm.size();
        let rank = comm.rank();
        let shared = comm.split_shared(rank);
        let ok = wanted() && shared.size() == size && (2..=MAX_RANKS).contains(&size);
        if !all(comm, ok) {
            return None;
        }
        let mine = board_offset(size as usize) + BOARD_BYTES;
        // MPI aligns a rank's part to 8 bytes only: ask for a page more and start at the next
        // page boundary, which every process computes alike from the part's address.
        let asked = mine + PAGE_BYTES;
        let mut base: *mut u8 = std::ptr::null_mut();
        // SAFETY: reading an MPI constant initialised by the library.
        let mut win = unsafe { ffi::RSMPI_WIN_NULL };
        // SAFETY: `base` and `win` are out-parameters of the right types; the info object is
        // MPI's null constant; `shared` is a live communicator.
        let rc = unsafe {
            ffi::MPI_Win_allocate_shared(
                asked as ffi::MPI_Aint,
                1,
                ffi::RSMPI_INFO_NULL,
                shared.as_raw(),
                (&raw mut base).cast::<c_void>(),
                &mut win,
            )
        };
        let mut bases = Vec::with_capacity(size as usize);
        let mut ok = rc == ffi::MPI_SUCCESS as c_int && !base.is_null();
        for r in 0..size {
            if !ok {
                break;
            }
            let mut bytes: ffi::MPI_Aint = 0;
            let mut unit: c_int = 0;
            let mut at: *mut u8 = std::ptr::null_mut();
            // SAFETY: `win` is the window just made on `shared`, `r` a rank of it; the
            // out-parameters have the types MPI writes.
            let rc = unsafe {
                ffi::MPI_Win_shared_query(win, r, &mut bytes, &mut unit, (&raw mut at).cast())
            };
            ok = rc == ffi::MPI_SUCCESS as c_int && !at.is_null() && bytes as usize >= asked;
            bases.push((at as usize).next_multiple_of(PAGE_BYTES));
        }
        if ok {
            // Counters start at zero; every rank clears its own part before anyone uses it.
            let part = (base as usize).next_multiple_of(PAGE_BYTES);
            for d in 0..size as usize {
                let ch = part + d * channel_bytes();
                // SAFETY: `ch..ch + 2 * LINE_BYTES` lies inside this rank's part (`mine` bytes).
                unsafe { std::ptr::write_bytes(ch as *mut u8, 0, 2 * LINE_BYTES) };
            }
            // SAFETY: the board is the last `BOARD_BYTES` of this rank's part.
            unsafe {
                std::ptr::write_bytes(
                    (part + board_offset(size as usize)) as *mut u8,
                    0,
                    BOARD_BYTES,
                );
            }
        }
        // Every rank learns whether all succeeded, and no rank uses the window before all
        // cleared their counters (the reduction is that barrier). A window some rank could
        // not set up is left unused (never freed, see the module docs).
        if !all(comm, ok) {
            return None;
        }
        let single_copy = single_copy_peers(comm, bases[rank as usize]);
        let shared_buffers = single_copy
            .as_ref()
            .is_some_and(|pids| shared_buffers_mappable(comm, pids));
        Some(ShmWindow {
            local: shared,
            bases,
            rank: rank as u32,
            single_copy,
            shared_buffers,
        })
    }
}

/// Collective over `comm`: every rank's process id where every rank wants single copies
/// (`RELAYCC_MPI_SINGLE_COPY` is not `0`) and could read the next rank's window with
/// `process_vm_readv` (a container's seccomp policy or Yama's ptrace scope may forbid it);
/// `None` otherwise. `own` is this rank's part of the window, in its own address space (its
/// peers read it there).
fn single_copy_peers(comm: &SimpleCommunicator, own: usize) -> Option<Vec<libc::pid_t>> {
    let n = comm.size() as usize;
    let me = [u64::from(std::process::id()), own as u64];
    let mut everyone = vec![0u64; 2 * n];
    comm.all_gather_into(&me[..], &mut everyone[..]);
    let pids: Vec<libc::pid_t> = everyone
        .chunks(2)
        .map(|x| libc::pid_t::try_from(x[0]).unwrap_or(0))
        .collect();
    let next = (comm.rank() as usize + 1) % n;
    let wanted = std::env::var("RELAYCC_MPI_SINGLE_COPY").map_or(true, |v| v.trim() != "0");
    let mut word = 0u64;
    // SAFETY: the read goes into `word` (8 writable bytes); the remote range is the first
    // counter of the next rank's window part, which it keeps mapped (the window is never
    // freed), and a failed read is only an error code.
    let ok = wanted
        && pids.iter().all(|&p| p > 0)
        && unsafe {
            read_peer(
                pids[next],
                (&raw mut word).cast(),
                everyone[2 * next + 1] as usize,
                8,
            )
        }
        .is_ok();
    all(comm, ok).then_some(pids)
}

/// Collective over `comm`, whose ranks run as processes `pids`: whether every rank could map
/// the next rank's [`SharedHostBuffer`] and read what that rank wrote in it (`/proc` access
/// may be denied where `process_vm_readv` is not, or the other way round).
fn shared_buffers_mappable(comm: &SimpleCommunicator, pids: &[libc::pid_t]) -> bool {
    let n = comm.size() as usize;
    let rank = comm.rank() as usize;
    let magic = |r: usize| 0x5e1f_0000_0000_0000u64 | r as u64;
    let probe = SharedHostBuffer::<u64>::zeroed(1).ok().map(|mut b| {
        b[0] = magic(rank);
        b
    });
    let me = probe.as_ref().map_or([0, 0], |b| {
        let (serial, fd) = b.identity();
        [serial, fd as u64]
    });
    let mut everyone = vec![0u64; 2 * n];
    comm.all_gather_into(&me[..], &mut everyone[..]);
    let next = (rank + 1) % n;
    let (serial, fd) = (everyone[2 * next], everyone[2 * next + 1]);
    let mut mappings = PeerMappings::default();
    let ok = serial != 0
        && i32::try_from(fd).is_ok_and(|fd| {
            mappings
                .locate(next as u32, pids[next], serial, fd, 0, 8)
                // SAFETY: `at` is 8 readable bytes of the next rank's probe, mapped until
                // `mappings` drops; it wrote them before the gather.
                .is_ok_and(|at| unsafe { std::ptr::read_volatile(at as *const u64) } == magic(next))
        });
    // Nobody drops its probe before every rank has read its neighbour's.
    all(comm, ok)
}

/// Copy `len` bytes at `remote` in process `pid` to `dst` here with `process_vm_readv`, in as
/// many calls as the kernel needs.
///
/// # Safety
/// `dst` holds `len` writable bytes that nothing else touches during the call.
pub(super) unsafe fn read_peer(
    pid: libc::pid_t,
    dst: *mut u8,
    remote: usize,
    len: usize,
) -> Result<(), std::io::Error> {
    let mut done = 0usize;
    while done < len {
        let local = libc::iovec {
            iov_base: dst.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        let far = libc::iovec {
            iov_base: (remote + done) as *mut c_void,
            iov_len: len - done,
        };
        // SAFETY: one local and one remote iovec; the local range is writable (the caller's
        // contract); the kernel checks the remote one and fails the call, never this process.
        let got = unsafe { libc::process_vm_readv(pid, &local, 1, &far, 1, 0) };
        match got {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "process_vm_readv read nothing",
                ));
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// True on every rank when `ok` holds on every rank (a blocking `MPI_Allreduce`).
fn all(comm: &SimpleCommunicator, ok: bool) -> bool {
    let mut least = 0i32;
    comm.all_reduce_into(&i32::from(ok), &mut least, SystemOperation::min());
    least == 1
}
