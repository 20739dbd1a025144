//! The CUDA half of per-rank calls over the flag transport (`flag_calls.rs`): a rank's part
//! enqueued on the caller's stream. Its lane moves to that stream first (waiting there for
//! its previous stream, so its steps stay in order), the caller's buffers are lent to the
//! communicator's CUDA backend for the call, an in-place call's input is copied aside on the
//! stream, and the one runner enqueues the part: local segments as launches ordered within
//! the stream (`CudaBackend::submit_on`), messages as the lane's waits, copies and signals on
//! the stream. Nothing waits on the host: the call returns once everything is enqueued, and
//! work the caller enqueues after it sees the result.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use relaycc_route::Location;

use super::Lender;
use super::flag_calls::{CallSpans, FlagPart};
use crate::backend::sealed::{Loan, Private, Trusted};
use crate::backend::{Backend, ByteRegion, DeviceMem, Launch, Program};
use crate::communicator::Communicator;
use crate::cuda::CudaBackend;
use crate::cuda::flags::CudaFlagLane;
use crate::error::{CollectivesError, Result};
use crate::exec::flag_transport::FlagTransport;
use crate::exec::run::run;
use crate::exec::run_memory::{HostBuf, Launcher, RunBindings, RunMemory, one_copy};

/// What a part keeps for its runs on a CUDA stream: the backend, the copy of an in-place
/// call's input and the program that makes it, the run's bindings, and the staging buffers
/// (never filled: a CUDA lane reaches every binding in place).
#[derive(Debug)]
pub(super) struct PartOnStream {
    backend: Arc<dyn Backend>,
    aside: Option<(DeviceMem, Program)>,
    run: RunBindings,
    send_stage: HostBuf,
    recv_stage: HostBuf,
}

impl Drop for PartOnStream {
    fn drop(&mut self) {
        // The part's lane waited for its stream before the part goes (`flag_calls.rs`).
        if let Some((mem, _)) = self.aside.take() {
            self.backend.free(mem);
        }
        for s in [&mut self.send_stage, &mut self.recv_stage] {
            if let HostBuf::Backend { mem, .. } = std::mem::replace(s, HostBuf::None) {
                self.backend.free(mem);
            }
        }
    }
}

/// Launches ordered within the caller's stream; nothing waits on the host.
struct StreamLauncher<'a> {
    cuda: &'a CudaBackend,
    stream: &'a CudaStream,
}

impl Launcher for StreamLauncher<'_> {
    fn backend(&self) -> &dyn Backend {
        self.cuda
    }

    unsafe fn submit(&self, launches: &[Launch<'_>]) -> Result<()> {
        // SAFETY: the caller's contract, which is `Backend::submit`'s; the launches are
        // ordered within the caller's stream, after the lane's steps enqueued there before.
        unsafe { self.cuda.submit_on(launches, &[self.stream]) }
    }

    fn wait(&self) -> Result<()> {
        Ok(())
    }
}

/// The caller's buffers lent for one call, taken back when dropped (the CUDA backend does
/// not wait: the caller's stream orders the memory's reuse after the call's work).
struct Lent<'a> {
    cuda: &'a CudaBackend,
    /// The input's and the output's handles.
    mems: [Option<DeviceMem>; 2],
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        for m in self.mems.iter_mut().filter_map(Option::take) {
            self.cuda.unlend(m, Private);
        }
    }
}

fn whole(mem: DeviceMem, bytes: u64) -> ByteRegion {
    ByteRegion {
        mem,
        offset: 0,
        bytes,
    }
}

/// Enqueue rank `me`'s part `p` of a call on the caller's stream (`lender`'s), over `end`.
pub(super) fn run_on_stream(
    comm: &Communicator,
    me: usize,
    p: &mut FlagPart,
    end: &mut FlagTransport<CudaFlagLane>,
    lender: &Lender<'_>,
    spans: CallSpans,
) -> Result<()> {
    let cuda = comm.backend().as_cuda(Private).ok_or_else(|| {
        CollectivesError::Setup("a CUDA flag lane on a communicator without CUDA".into())
    })?;
    let stream = lender.stream.ok_or_else(|| {
        CollectivesError::Setup(format!(
            "rank {me} calls without a CUDA stream: call through RankComm::on(&stream)"
        ))
    })?;
    end.lane_mut().use_stream(stream)?;
    let at = Location::Gpu(comm.devices().get(me).copied().unwrap_or(0));
    let ordinal = stream.context().ordinal();
    let mut lent = Lent {
        cuda,
        mems: [None, None],
    };
    let mut handles = [None, None];
    for (k, (addr, bytes)) in [spans.input, spans.output].into_iter().enumerate() {
        let loan = Loan::Device {
            ordinal,
            ptr: addr as u64,
            bytes: bytes as u64,
        };
        // SAFETY: a cudarc buffer of the caller's, borrowed for the call and taken on its
        // stream (the lender's guards record its events there once the call's work is
        // enqueued), or zero bytes; checked to be on the stream's device by the backend.
        let mem = unsafe { cuda.lend(at, loan, Private) }?;
        (lent.mems[k], handles[k]) = (Some(mem), Some(mem));
    }
    let [Some(input_mem), Some(output_mem)] = handles else {
        return Err(CollectivesError::Unmatched(
            "a call's buffers just lent".into(),
        ));
    };
    let FlagPart {
        desc: p_desc,
        program,
        scratch,
        device,
        ..
    } = p;
    let dev = device.get_or_insert_with(|| {
        Box::new(PartOnStream {
            backend: comm.backend_arc(),
            aside: None,
            run: RunBindings::with_capacity(2 + scratch.len()),
            send_stage: HostBuf::None,
            recv_stage: HostBuf::None,
        })
    });
    let mut input = whole(input_mem, spans.input.1 as u64);
    let output = whole(output_mem, spans.output.1 as u64);
    if spans.aside {
        let bytes = input.bytes;
        if dev.aside.as_ref().is_none_or(|(m, _)| m.bytes() < bytes) {
            if let Some((m, _)) = dev.aside.take() {
                // Earlier calls' steps may still read it on the stream.
                end.lane().synchronize()?;
                cuda.free(m);
            }
            let mem = cuda.allocate(at, bytes)?;
            let call = (p_desc.dtype, p_desc.op, comm.ranks() as u32);
            dev.aside = Some((mem, one_copy(at, call, bytes)));
        }
        let Some((mem, copy)) = &dev.aside else {
            return Err(CollectivesError::Unmatched(
                "an aside buffer just made".into(),
            ));
        };
        let to = whole(*mem, bytes);
        let bindings = [input, to];
        // SAFETY: one copy from the caller's input to this part's own buffer (distinct
        // allocations), ordered within the caller's stream before the run.
        unsafe {
            cuda.submit_on(
                &[Launch {
                    program: copy,
                    bindings: &bindings,
                }],
                &[stream],
            )?
        };
        input = to;
    }
    dev.run.bind(cuda, [input, output], scratch, true)?;
    let launcher = StreamLauncher { cuda, stream };
    // SAFETY: the program was lowered onto one lane (`flag_calls::lower_part`) with the
    // bindings at its sizes: the caller's input (or its copy aside) and output, checked by
    // `check_spans` (lengths, and apart unless copied aside), then this rank's scratch
    // buffers of the cached plan, which the part holds and no other rank's part touches;
    // they are distinct allocations, pairwise disjoint, with the backend's addresses
    // (`bind`). The lane's steps and the launches go on the caller's stream, which orders
    // every later use of the caller's buffers after them, and the part waits for its lane's
    // stream before it goes (`flag_calls.rs`), so the scratch outlives them.
    let mut mem = unsafe {
        RunMemory::new(
            launcher,
            &dev.run,
            (&mut dev.send_stage, &mut dev.recv_stage),
            Location::Host(0),
        )
    };
    run(program, &mut mem, end)?;
    drop(lent);
    Ok(())
}
