//! The one runner of a rank's program ([`super::lower::RankProgram`]): local segments on the
//! rank's memory ([`RankMemory`]: a backend, or host memory run inline), cross-rank steps on a
//! [`Transport`] (threads of one process, MPI, NCCL). See `README.md` beside this file for the
//! protocol and why it cannot deadlock.

use relaycc_route::{DType, ReduceOp};

use super::lower::{Message, RankProgram, Segment};
use crate::backend::{AddressSpace, Command, Program, RawRegion, Slot, host_reduce};
use crate::error::{CollectivesError, Result};

/// How a rank's cross-rank steps reach its peers. A transport moves bytes between addresses
/// it is given; staging through host memory, where the transport cannot reach a memory, is
/// the runner's.
///
/// A stage's requests are posted without blocking (receives, then sends); [`Transport::wait`]
/// returns once all of them completed, or fails. Requests of one pair and tag complete in the
/// order they were posted.
pub trait Transport {
    /// The error a failed step gives; the runner's local errors convert into it.
    type Error: From<CollectivesError>;
    /// True when the transport can read and write memory of `space` in place.
    fn reaches(&self, space: AddressSpace) -> bool;
    /// Start stage `stage` (no request of an earlier stage is pending).
    fn begin(&mut self, stage: usize);
    /// Post a receive of `bytes` bytes from `peer` with `tag` into `dst`.
    ///
    /// # Safety
    /// `dst` points to `bytes` writable bytes of a space the transport [`reaches`], that
    /// nothing else touches and that stay allocated until [`Transport::wait`] returns, or, if
    /// it fails, for as long as the transport's owner is told the requests may live.
    ///
    /// [`reaches`]: Transport::reaches
    unsafe fn recv(
        &mut self,
        peer: u32,
        tag: u32,
        dst: *mut u8,
        bytes: usize,
    ) -> std::result::Result<(), Self::Error>;
    /// Post a send of `bytes` bytes at `src` to `peer` with `tag`.
    ///
    /// # Safety
    /// As for [`Transport::recv`], except that others may read `src` meanwhile.
    unsafe fn send(
        &mut self,
        peer: u32,
        tag: u32,
        src: *const u8,
        bytes: usize,
    ) -> std::result::Result<(), Self::Error>;
    /// Wait until every request of stage `stage` completed.
    fn wait(&mut self, stage: usize) -> std::result::Result<(), Self::Error>;
}

/// A rank's memory and lanes as the runner sees them: the bindings of its program, where a
/// transport may reach them, and how local segments run.
///
/// # Safety
///
/// The runner writes and reads through the addresses the safe methods [`RankMemory::address`]
/// and [`RankMemory::staging`] return, and hands them to its transport, which does too, so an
/// implementation promises that:
/// - a `Some` from `address(slot)` is `slot.bytes` bytes of memory of the space it names (the
///   slot's bytes of its binding), and
/// - `staging(send, recv)` returns pointers to at least `send` and `recv` bytes of writable
///   host memory (a pointer to 0 bytes may dangle), disjoint from each other and from every
///   binding,
///
/// which stay allocated, and which nothing but the runner, its transport and this memory's
/// own methods touches, for as long as the value lives and, after a run whose transport
/// reports requests left pending, for as long as its owner is told they may live. A safe
/// implementation, which the runner would follow to any address, does not compile:
///
/// ```compile_fail,E0200
/// use relaycc_collectives::Result;
/// use relaycc_collectives::backend::{Program, RawRegion, Slot};
/// use relaycc_collectives::exec::run::RankMemory;
///
/// struct Anywhere;
///
/// impl RankMemory for Anywhere {
///     fn address(&self, _: &Slot) -> Option<RawRegion> {
///         None
///     }
///     unsafe fn launch(&mut self, _: &Program) -> Result<()> {
///         Ok(())
///     }
///     fn synchronize(&mut self) -> Result<()> {
///         Ok(())
///     }
///     fn download(&mut self, _: &Slot, _: &mut [u8]) -> Result<()> {
///         Ok(())
///     }
///     fn upload(&mut self, _: &Slot, _: &[u8]) -> Result<()> {
///         Ok(())
///     }
///     fn staging(&mut self, _: usize, _: usize) -> Result<(*mut u8, *mut u8)> {
///         // Every staged message of a run would be written here.
///         Ok((8 as *mut u8, 8 as *mut u8))
///     }
/// }
/// ```
pub unsafe trait RankMemory {
    /// The address of `slot` when a transport may use it in place (`None`: stage it).
    fn address(&self, slot: &Slot) -> Option<RawRegion>;
    /// Start `program` on the bindings (it may run asynchronously until
    /// [`RankMemory::synchronize`]).
    ///
    /// # Safety
    /// No byte a command of the program touches, where either side writes it, is touched by a
    /// pending transport request; the runner keeps this for programs lowered from a checked
    /// plan (ops of one level are unordered, hence disjoint where one writes).
    unsafe fn launch(&mut self, program: &Program) -> Result<()>;
    /// Wait for the launched programs.
    fn synchronize(&mut self) -> Result<()>;
    /// Copy `slot` into host bytes (after the launches in flight).
    fn download(&mut self, slot: &Slot, dst: &mut [u8]) -> Result<()>;
    /// Copy host bytes into `slot` (after the launches in flight).
    fn upload(&mut self, slot: &Slot, src: &[u8]) -> Result<()>;
    /// Host staging memory of at least `send` and `recv` bytes, which stays allocated and
    /// untouched by anything else for as long as the memory value lives (and, after a failure,
    /// as long as its owner keeps it).
    fn staging(&mut self, send: usize, recv: usize) -> Result<(*mut u8, *mut u8)>;
}

/// Run `program` once on `mem` with `transport`. Per stage: run the `before` segment and wait
/// for it; post every receive (in place, or into the receive staging memory), download each
/// staged send into the send staging memory and post every send; launch the `during` segment;
/// wait for the transport, then for the launch; upload the staged receives. Then the tail.
///
/// A local error (a download or a launch) stops posting; the rank still waits for what it
/// posted, so the transport holds none of its memory, and then returns the local error (its
/// peers, missing the messages it never sent, fail by their transport's deadline). A transport
/// error returns at once; what it left pending is the transport's to report.
pub fn run<M: RankMemory, T: Transport>(
    program: &RankProgram,
    mem: &mut M,
    transport: &mut T,
) -> std::result::Result<(), T::Error> {
    let staged = |s: &Slot| mem.address(s).is_none_or(|r| !transport.reaches(r.space));
    let (send_bytes, recv_bytes) = program.staged_bytes(staged);
    if send_bytes + recv_bytes > 0 && !transport.reaches(AddressSpace::Host) {
        // Staging memory is host memory: a transport that reaches device memory only cannot
        // carry a message this rank's memory does not give it in place.
        return Err(CollectivesError::InvalidPlan {
            op: None,
            message: "a message's memory is out of the transport's reach, and the transport \
             cannot use host staging memory either"
                .into(),
        }
        .into());
    }
    let (send_stage, recv_stage) = if send_bytes + recv_bytes > 0 {
        mem.staging(send_bytes as usize, recv_bytes as usize)?
    } else {
        (std::ptr::null_mut(), std::ptr::null_mut())
    };
    let in_place = |mem: &M, transport: &T, m: &Message| {
        mem.address(&m.slot)
            .filter(|r| transport.reaches(r.space))
            .map(|r| r.addr)
    };
    for (k, stage) in program.stages.iter().enumerate() {
        launch(mem, &stage.before)?;
        if !stage.before.is_empty() {
            mem.synchronize()?;
        }
        transport.begin(k);
        let mut off = 0usize;
        for m in &stage.recvs {
            let bytes = m.slot.bytes as usize;
            let ptr = match in_place(mem, transport, m) {
                Some(addr) => addr as *mut u8,
                None => {
                    // SAFETY: the stage's staged receives take consecutive ranges of the
                    // receive staging memory, which holds the busiest stage's total.
                    let p = unsafe { recv_stage.add(off) };
                    off += bytes;
                    p
                }
            };
            // SAFETY: `ptr` is `bytes` bytes of a binding (the lowering bounded the slot by
            // it) or of private staging memory. No local command touches them until the
            // request completes: the stage's `during` segment is unordered with this op, so
            // the checker proved it disjoint, and later segments start after `wait`.
            unsafe { transport.recv(m.peer, m.tag, ptr, bytes)? };
        }
        let mut local: Option<CollectivesError> = None;
        let mut off = 0usize;
        for m in &stage.sends {
            let bytes = m.slot.bytes as usize;
            let ptr = match in_place(mem, transport, m) {
                Some(addr) => addr as *const u8,
                None => {
                    // SAFETY: as for receives, in the send staging memory.
                    let p = unsafe { send_stage.add(off) };
                    off += bytes;
                    // SAFETY: a private staging range no pending request uses (earlier sends
                    // of the stage use earlier ranges).
                    let dst = unsafe { std::slice::from_raw_parts_mut(p, bytes) };
                    if let Err(e) = mem.download(&m.slot, dst) {
                        local = Some(e);
                        break;
                    }
                    p.cast_const()
                }
            };
            // SAFETY: as for receives; the source is only read, and was written by an earlier
            // segment, which finished (`synchronize`) before this stage began.
            unsafe { transport.send(m.peer, m.tag, ptr, bytes)? };
        }
        if local.is_none()
            && let Err(e) = launch(mem, &stage.during)
        {
            local = Some(e);
        }
        let waited = transport.wait(k);
        if let Err(e) = mem.synchronize() {
            local.get_or_insert(e);
        }
        if let Some(e) = local {
            return Err(e.into());
        }
        waited?;
        let mut off = 0usize;
        for m in &stage.recvs {
            if in_place(mem, transport, m).is_some() {
                continue;
            }
            let bytes = m.slot.bytes as usize;
            // SAFETY: the receive into this staging range completed (`wait`), and nothing
            // else writes staging memory.
            let src = unsafe { std::slice::from_raw_parts(recv_stage.add(off), bytes) };
            off += bytes;
            mem.upload(&m.slot, src)?;
        }
    }
    launch(mem, &program.tail)?;
    mem.synchronize()?;
    Ok(())
}

/// Launch a segment unless it is empty.
fn launch<M: RankMemory>(mem: &mut M, seg: &Segment) -> Result<()> {
    if seg.is_empty() {
        return Ok(());
    }
    // SAFETY: the segment's ops are unordered with every request pending now (the `during`
    // segment of a stage) or start after the stage's requests completed; see `RankMemory`.
    unsafe { mem.launch(&seg.program) }
}

/// Run `program` once on host vectors of its own: every binding zeroed, `input` copied to the
/// start of binding 0 (the rank's input), and binding 1 (its output) returned; local segments
/// inline ([`HostMemory`]), messages over `transport`. The memory is this call's, so no other
/// code can touch it while messages are in flight.
///
/// Errors: `input` longer than binding 0, a program with fewer than two bindings, and
/// [`run`]'s.
pub fn run_on_host_vectors<T: Transport>(
    program: &RankProgram,
    input: &[u8],
    transport: &mut T,
) -> std::result::Result<Vec<u8>, T::Error> {
    let bytes = &program.binding_bytes;
    if bytes.len() < 2 || input.len() as u64 > bytes[0] {
        return Err(CollectivesError::InvalidPlan {
            op: None,
            message: format!(
                "a rank program of {} bindings cannot take an input of {} bytes",
                bytes.len(),
                input.len()
            ),
        }
        .into());
    }
    let mut bufs: Vec<Vec<u128>> = bytes
        .iter()
        .map(|b| vec![0u128; (*b as usize).div_ceil(16)])
        .collect();
    bytemuck::cast_slice_mut::<u128, u8>(&mut bufs[0])[..input.len()].copy_from_slice(input);
    let ptrs: Vec<(*mut u8, usize)> = bufs
        .iter_mut()
        .zip(bytes)
        .map(|(v, b)| (v.as_mut_ptr().cast::<u8>(), *b as usize))
        .collect();
    let mut staging = Vec::new();
    // SAFETY: each pointer is a vector of this call of its binding's bytes (rounded up to
    // whole u128s), disjoint from the others, touched by nothing else until `run` returns;
    // `run` waits for every request it posted before it returns, even on error.
    let mut mem = unsafe { HostMemory::new(program, &ptrs, &mut staging)? };
    run(program, &mut mem, transport)?;
    Ok(bytemuck::cast_slice::<u128, u8>(&bufs[1])[..bytes[1] as usize].to_vec())
}

/// A rank's buffers in plain host memory, its local segments run inline on the calling thread
/// (one core, no launch latency): what a process with no backend (the typed MPI collectives,
/// exchanges) and the in-process per-rank tests use. Commands run in the order the lowering
/// emitted them, a topological order, so lanes and events need nothing.
#[derive(Debug)]
pub struct HostMemory<'a> {
    bufs: &'a [(*mut u8, usize)],
    staging: &'a mut Vec<u128>,
}

impl<'a> HostMemory<'a> {
    /// Binding `b` at `bufs[b]` (address and bytes), staging in `staging` (grown on need).
    ///
    /// Errors: fewer buffers than the program binds, or one smaller than its binding.
    ///
    /// # Safety
    /// Each `bufs[b]` is `bufs[b].1` bytes of live host memory, writable where the program
    /// or a message writes it, disjoint from the others, that nothing else touches until the
    /// run returns (and, when a transport reports requests left pending, until they complete).
    pub unsafe fn new(
        program: &RankProgram,
        bufs: &'a [(*mut u8, usize)],
        staging: &'a mut Vec<u128>,
    ) -> Result<Self> {
        let fits = bufs.len() >= program.binding_bytes.len()
            && bufs
                .iter()
                .zip(&program.binding_bytes)
                .all(|(b, n)| b.1 as u64 >= *n);
        if !fits {
            return Err(CollectivesError::InvalidPlan {
                op: None,
                message: format!(
                    "the rank's buffers ({} of them) do not hold its program's {} bindings",
                    bufs.len(),
                    program.binding_bytes.len()
                ),
            });
        }
        Ok(HostMemory { bufs, staging })
    }

    fn at(&self, s: &Slot) -> *mut u8 {
        // SAFETY: the lowering bounded every slot by its binding's bytes, and `new` checked
        // each buffer holds them, so the pointer stays inside the allocation.
        unsafe { self.bufs[s.binding as usize].0.add(s.offset as usize) }
    }
}

// SAFETY: `address` gives the slot's bytes of its buffer, which `new`'s contract keeps live
// and untouched by others for the run and any pending requests (the lowering bounds every
// slot by its binding, `new` checked each buffer holds it); `staging` gives disjoint ranges
// of the `staging` vector, which this value borrows mutably for its life, sized to hold
// both, apart from every buffer.
unsafe impl RankMemory for HostMemory<'_> {
    fn address(&self, slot: &Slot) -> Option<RawRegion> {
        Some(RawRegion {
            addr: self.at(slot) as usize,
            bytes: slot.bytes,
            space: AddressSpace::Host,
        })
    }

    unsafe fn launch(&mut self, program: &Program) -> Result<()> {
        for c in &program.commands {
            match c {
                Command::Copy { src, dst, .. } => {
                    // SAFETY: both ranges are inside live buffers (see `at`) and of equal
                    // length (checked copies are length-preserving); `ptr::copy` allows
                    // overlap; ranges of pending receives are disjoint from these (the
                    // caller's contract).
                    unsafe {
                        std::ptr::copy(
                            self.at(src).cast_const(),
                            self.at(dst),
                            src.bytes.min(dst.bytes) as usize,
                        )
                    };
                }
                Command::Reduce {
                    first,
                    count,
                    dst,
                    divide,
                    ..
                } => {
                    let srcs = &program.srcs[*first as usize..(*first + *count) as usize];
                    let ptrs: Vec<*const u8> =
                        srcs.iter().map(|s| self.at(s).cast_const()).collect();
                    let divisor =
                        (*divide && program.op == ReduceOp::Avg).then_some(program.divisor);
                    // SAFETY: every operand is `dst.bytes` bytes inside a live buffer (see
                    // `at`), untouched by pending requests (the caller's contract).
                    unsafe {
                        reduce_bytes(
                            program.dtype,
                            program.op,
                            &ptrs,
                            self.at(dst),
                            dst.bytes as usize,
                            divisor,
                        )
                    };
                }
                Command::Record { .. } | Command::Wait { .. } => {}
            }
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }

    fn download(&mut self, slot: &Slot, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `slot` is inside a live buffer (see `at`); nothing writes it meanwhile.
        let src = unsafe { std::slice::from_raw_parts(self.at(slot), slot.bytes as usize) };
        dst.copy_from_slice(src);
        Ok(())
    }

    fn upload(&mut self, slot: &Slot, src: &[u8]) -> Result<()> {
        // SAFETY: as for `download`, written here only.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.at(slot), src.len()) };
        Ok(())
    }

    fn staging(&mut self, send: usize, recv: usize) -> Result<(*mut u8, *mut u8)> {
        let words = send.div_ceil(16) + recv.div_ceil(16);
        if self.staging.len() < words {
            self.staging.resize(words, 0);
        }
        let base = self.staging.as_mut_ptr().cast::<u8>();
        // SAFETY: the send range's words come first, the receive range after them.
        Ok((base, unsafe { base.add(send.div_ceil(16) * 16) }))
    }
}

/// `dst = op(srcs...)` over `bytes` bytes with the host backend's typed kernels, dividing by
/// `divisor` where given. Buffers here are bytes with no alignment promise, so misaligned or
/// partly overlapping operands go through aligned temporaries.
///
/// # Safety
/// Every source points to `bytes` readable bytes and `dst` to `bytes` writable ones, that
/// nothing else touches during the call; `bytes` is a multiple of the element size.
pub(crate) unsafe fn reduce_bytes(
    dtype: DType,
    op: ReduceOp,
    srcs: &[*const u8],
    dst: *mut u8,
    bytes: usize,
    divisor: Option<u32>,
) {
    let esize = dtype.size() as usize;
    let len = bytes / esize;
    let aligned = |p: *const u8| (p as usize).is_multiple_of(esize);
    let overlaps = |p: *const u8| {
        let (a, b) = (p as usize, dst as usize);
        a != b && a < b + bytes && b < a + bytes
    };
    if srcs.iter().all(|p| aligned(*p) && !overlaps(*p)) && aligned(dst.cast_const()) {
        // SAFETY: every operand is `len` elements (the caller), aligned for the type (just
        // checked); the destination equals a source or overlaps none (just checked).
        unsafe { host_reduce::reduce(dtype, op, srcs, dst, len, divisor) };
        return;
    }
    let words = bytes.div_ceil(8);
    let copies: Vec<Vec<u64>> = srcs
        .iter()
        .map(|p| {
            let mut v = vec![0u64; words];
            // SAFETY: `p` points to `bytes` readable bytes (the caller); `v` has room.
            unsafe { std::ptr::copy_nonoverlapping(*p, v.as_mut_ptr().cast::<u8>(), bytes) };
            v
        })
        .collect();
    let mut out = vec![0u64; words];
    let tmp: Vec<*const u8> = copies.iter().map(|v| v.as_ptr().cast::<u8>()).collect();
    // SAFETY: the temporaries are u64-aligned (enough for every element type), hold `len`
    // elements, and are private to this call.
    unsafe { host_reduce::reduce(dtype, op, &tmp, out.as_mut_ptr().cast::<u8>(), len, divisor) };
    // SAFETY: `dst` has `bytes` writable bytes that nothing else touches now (the caller).
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr().cast::<u8>(), dst, bytes) };
}
