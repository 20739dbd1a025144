//! The NCCL transport of the executor's runner: a stage's receives and sends are
//! `ncclRecv`/`ncclSend` in one NCCL group on the rank's CUDA stream, so a GPU rank's messages
//! go device to device over NCCL's channels (NVLink, PCIe peer-to-peer, InfiniBand/RoCE with
//! GPUDirect) and the host never waits for them: the stream orders every stage after the
//! previous one. Communicators come from `ncclCommInitRank` with an id every rank shares (over
//! MPI: `crate::mpi::MpiGpu`) or, in one process, from `ncclCommInitAll`.
//!
//! NCCL matches point-to-point messages by posting order per pair, with no tags; the lowering
//! posts one pair's messages in op-id order on both sides, so the order matches whatever the
//! tags. NCCL has no deadline: a peer that never posts leaves the stream waiting (NCCL's own
//! behaviour), so callers agree on every call before it runs.

use std::ffi::{c_int, c_void};

use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{result as nc, sys as ns};

use super::run::Transport;
use crate::backend::AddressSpace;
use crate::cuda::nccl::{driver_error, nccl, nccl_error, single_process_ranks};
use crate::cuda::{self, CudaError};
use crate::error::CollectivesError;

/// The id every rank of one NCCL communicator starts from (`ncclUniqueId`, 128 bytes): made by
/// one rank ([`NcclId::new`]) and handed to the others (over MPI, say).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId(pub [u8; 128]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`). Errors: no driver or no NCCL (probed first, nothing
    /// panics), an NCCL status.
    pub fn new() -> Result<NcclId, CudaError> {
        cuda::driver()?;
        nccl()?;
        let id = nc::get_uniqueid().map_err(nccl_error("ncclGetUniqueId"))?;
        let mut out = [0u8; 128];
        for (o, c) in out.iter_mut().zip(id.internal.iter()) {
            *o = *c as u8;
        }
        Ok(NcclId(out))
    }

    fn raw(&self) -> ns::ncclUniqueId {
        let mut internal = [0 as std::ffi::c_char; 128];
        for (o, b) in internal.iter_mut().zip(self.0) {
            *o = b as std::ffi::c_char;
        }
        ns::ncclUniqueId { internal }
    }
}

/// Messages move as bytes: the runner's transfers are untyped.
const BYTES: ns::ncclDataType_t = ns::ncclDataType_t::ncclUint8;

/// One rank's NCCL communicator on one CUDA device, destroyed when dropped.
pub struct NcclComm {
    comm: ns::ncclComm_t,
    rank: u32,
    ranks: u32,
    ordinal: usize,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; every use goes
// through `&mut` transports or `Drop`, and the handle is never shared between values.
unsafe impl Send for NcclComm {}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // Best effort: a destructor has nowhere to report a failed destroy.
        // SAFETY: `comm` came from an init call and is destroyed once, here.
        let _ = unsafe { nc::comm_destroy(self.comm) };
    }
}

impl NcclComm {
    /// Rank `rank` of `ranks` on CUDA device `ordinal`, from the id every rank shares
    /// (`ncclCommInitRank`; collective: it returns once every rank has called it).
    ///
    /// Errors: no driver or no NCCL ([`CudaError::NoDriver`], [`CudaError::NoNccl`], probed
    /// first), a rank out of range or a device that does not exist
    /// ([`CudaError::NcclUnsupported`]), an NCCL or driver status.
    pub fn init_rank(
        id: &NcclId,
        ranks: u32,
        rank: u32,
        ordinal: usize,
    ) -> Result<NcclComm, CudaError> {
        cuda::driver()?;
        nccl()?;
        if rank >= ranks {
            return Err(CudaError::NcclUnsupported(format!(
                "rank {rank} is not among {ranks} ranks"
            )));
        }
        let visible = cuda::devices()?.len();
        if ordinal >= visible {
            return Err(CudaError::NcclUnsupported(format!(
                "CUDA device {ordinal} does not exist ({visible} visible)"
            )));
        }
        let n = c_int::try_from(ranks)
            .map_err(|_| CudaError::NcclUnsupported("too many ranks".into()))?;
        // NCCL takes the device from the thread's current context.
        let ctx = CudaContext::new(ordinal).map_err(driver_error("cuDevicePrimaryCtxRetain"))?;
        ctx.bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        let mut comm: ns::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid place for the handle; the id is 128 bytes as NCCL made it;
        // the probe found libnccl with ncclCommInitRank.
        unsafe { nc::comm_init_rank(&mut comm, n, id.raw(), rank as c_int) }
            .map_err(nccl_error("ncclCommInitRank"))?;
        Ok(NcclComm {
            comm,
            rank,
            ranks,
            ordinal,
        })
    }

    /// One communicator per device of `ordinals` in this process (`ncclCommInitAll`), rank
    /// `i` on `ordinals[i]`: for ranks on threads of one process, each thread running its
    /// rank's program over its own [`NcclTransport`].
    ///
    /// Errors, in this order: an empty list or a device that repeats
    /// ([`CudaError::NcclUnsupported`]: NCCL runs one rank per GPU), no driver or no NCCL, a
    /// device that does not exist, an NCCL status.
    pub fn init_all(ordinals: &[usize]) -> Result<Vec<NcclComm>, CudaError> {
        let n = single_process_ranks(ordinals)?;
        let devlist: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        let mut comms: Vec<ns::ncclComm_t> = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: `comms` and `devlist` hold `n` entries each; the probe found libnccl with
        // ncclCommInitAll, and every device exists.
        unsafe { nc::comm_init_all(comms.as_mut_ptr(), n, devlist.as_ptr()) }
            .map_err(nccl_error("ncclCommInitAll"))?;
        Ok(comms
            .into_iter()
            .zip(ordinals)
            .enumerate()
            .map(|(r, (comm, &ordinal))| NcclComm {
                comm,
                rank: r as u32,
                ranks: n as u32,
                ordinal,
            })
            .collect())
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }
    /// Ranks of the communicator.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }
    /// The CUDA device of this rank.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The transport of one run on `stream` (a stream of this rank's device).
    ///
    /// Errors: a stream of another device, a driver status binding its context.
    pub fn transport<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> Result<NcclTransport<'a>, CudaError> {
        let dev = stream.context().ordinal();
        if dev != self.ordinal {
            return Err(CudaError::NcclUnsupported(format!(
                "the stream belongs to CUDA device {dev}, NCCL rank {} runs on device {}",
                self.rank, self.ordinal
            )));
        }
        stream
            .context()
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        Ok(NcclTransport {
            comm: self,
            stream,
            open: false,
        })
    }
}

/// One run's NCCL transport: each stage's requests form one NCCL group on the stream, ended by
/// [`Transport::wait`], which returns once NCCL enqueued them (the stream, not the host,
/// waits for the data).
#[derive(Debug)]
pub struct NcclTransport<'a> {
    comm: &'a mut NcclComm,
    stream: &'a CudaStream,
    /// An NCCL group is open (a request of the stage was posted).
    open: bool,
}

impl NcclTransport<'_> {
    fn error(&self, e: CudaError) -> CollectivesError {
        CollectivesError::Cuda(e)
    }

    /// Open the stage's group on its first request.
    fn group(&mut self) -> Result<(), CollectivesError> {
        if !self.open {
            nc::group_start()
                .map_err(nccl_error("ncclGroupStart"))
                .map_err(|e| self.error(e))?;
            self.open = true;
        }
        Ok(())
    }

    /// Close an open group after a failed post, so the thread's NCCL state stays usable.
    fn abandon(&mut self, e: CudaError) -> CollectivesError {
        if self.open {
            self.open = false;
            let _ = nc::group_end();
        }
        self.error(e)
    }

    /// Open the group and enqueue one point-to-point call with `peer` on this rank's stream
    /// (`call` names it in errors; a failed call abandons the group).
    fn post<R>(
        &mut self,
        peer: u32,
        call: &'static str,
        enqueue: impl FnOnce(c_int, ns::ncclComm_t, ns::cudaStream_t) -> Result<R, nc::NcclError>,
    ) -> Result<(), CollectivesError> {
        let p = self.peer(peer)?;
        self.group()?;
        let stream = self.stream.cu_stream() as ns::cudaStream_t;
        enqueue(p, self.comm.comm, stream)
            .map(|_| ())
            .map_err(|e| self.abandon(nccl_error(call)(e)))
    }

    fn peer(&self, peer: u32) -> Result<c_int, CollectivesError> {
        if peer >= self.comm.ranks {
            return Err(self.error(CudaError::NcclUnsupported(format!(
                "peer {peer} is not among {} NCCL ranks",
                self.comm.ranks
            ))));
        }
        Ok(peer as c_int)
    }
}

impl Transport for NcclTransport<'_> {
    type Error = CollectivesError;

    /// Device memory only: NCCL reads and writes GPU memory; a message in host memory is
    /// refused by the runner (it cannot be staged either).
    fn reaches(&self, space: AddressSpace) -> bool {
        space == AddressSpace::Device
    }

    fn begin(&mut self, _stage: usize) {
        self.open = false;
    }

    unsafe fn recv(
        &mut self,
        peer: u32,
        _tag: u32,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), CollectivesError> {
        // SAFETY: the runner gives `bytes` writable device bytes of this rank's device, which
        // nothing touches until the stage's requests complete on the stream; the group is
        // open, so NCCL enqueues the receive when the group ends.
        self.post(peer, "ncclRecv", |p, comm, stream| unsafe {
            nc::recv(dst.cast::<c_void>(), bytes, BYTES, p, comm, stream)
        })
    }

    unsafe fn send(
        &mut self,
        peer: u32,
        _tag: u32,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), CollectivesError> {
        // SAFETY: as for `recv`; the bytes are only read.
        self.post(peer, "ncclSend", |p, comm, stream| unsafe {
            nc::send(src.cast::<c_void>(), bytes, BYTES, p, comm, stream)
        })
    }

    fn wait(&mut self, _stage: usize) -> Result<(), CollectivesError> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        nc::group_end()
            .map(|_| ())
            .map_err(nccl_error("ncclGroupEnd"))
            .map_err(|e| self.error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (or NCCL) every entry point returns the probe's error, never panics;
    /// with both, a repeated device is still refused before NCCL is asked.
    #[test]
    fn no_driver_or_nccl_is_an_error() {
        let probe = cuda::driver().map(|_| ()).and_then(|()| nccl().map(|_| ()));
        if let Err(expected) = probe {
            assert_eq!(NcclComm::init_all(&[0]).unwrap_err(), expected);
            assert_eq!(NcclId::new().unwrap_err(), expected);
            let id = NcclId([0; 128]);
            assert_eq!(NcclComm::init_rank(&id, 2, 0, 0).unwrap_err(), expected);
        }
        assert!(matches!(
            NcclComm::init_all(&[0, 0]),
            Err(CudaError::NcclUnsupported(_))
        ));
        assert!(matches!(
            NcclComm::init_all(&[]),
            Err(CudaError::NcclUnsupported(_))
        ));
    }
}
