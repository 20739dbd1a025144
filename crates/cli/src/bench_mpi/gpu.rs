//! GPU buffers and calls of `bench --backend mpi` (feature `cuda`: `MpiGpu` on `CudaSlice`
//! buffers), and without CUDA the types that say no GPU run starts.

/// GPU buffers and calls (feature `cuda`).
#[cfg(feature = "cuda")]
mod with_cuda {
    use std::sync::Arc;

    use anyhow::{Context, Result, bail};
    use relaycc_collectives::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
    use relaycc_collectives::mpi::rsmpi::topology::{Communicator, SimpleCommunicator};
    use relaycc_collectives::mpi::{GpuTransport, MpiCommunicator, MpiGpu};
    use relaycc_collectives::{Collectives, Element};
    use relaycc_route::Collective;

    use crate::args::{BenchArgs, TransportKind};

    /// Element types a `CudaSlice` holds.
    pub(in crate::bench_mpi) trait Dev: DeviceRepr {}
    impl<T: DeviceRepr> Dev for T {}

    /// This process's GPU rank and the stream its calls are enqueued on.
    pub(in crate::bench_mpi) struct Gpu<'c> {
        rank: MpiGpu<'c>,
        stream: Arc<CudaStream>,
    }

    /// This process's GPU rank (collective: every process makes its own, so a process
    /// without a driver or a device makes every process report the error).
    pub(in crate::bench_mpi) fn open<'c>(
        comm: &'c MpiCommunicator,
        world: &SimpleCommunicator,
        args: &BenchArgs,
    ) -> Result<Gpu<'c>> {
        let local = world.split_shared(world.rank()).rank() as usize;
        let ordinal = if args.gpus.is_empty() {
            // No device count without a driver: device 0, and the GPU rank says why.
            let visible = relaycc_collectives::cuda::devices().map_or(1, |d| d.len().max(1));
            local % visible
        } else {
            args.gpus[local % args.gpus.len()] as usize
        };
        let transport = match args.transport {
            Some(TransportKind::Nccl) => GpuTransport::Nccl,
            Some(TransportKind::Mpi) | None => GpuTransport::Mpi,
        };
        let rank = MpiGpu::new(comm, ordinal, transport)
            .with_context(|| format!("rank {}: GPU rank on CUDA device {ordinal}", comm.rank()))?;
        let stream = CudaContext::new(ordinal)
            .and_then(|c| c.new_stream())
            .map_err(|e| anyhow::anyhow!("CUDA device {ordinal}: a stream: {e:?}"))?;
        Ok(Gpu { rank, stream })
    }

    /// Rank 0's device and transport, for the header and the JSON.
    pub(in crate::bench_mpi) fn describe(g: &Gpu<'_>) -> String {
        let how = match g.rank.transport() {
            GpuTransport::Mpi => format!("mpi {:?}", g.rank.mode()).to_lowercase(),
            GpuTransport::Nccl => "nccl".to_owned(),
        };
        format!("cuda:{}, transport {how}", g.rank.ordinal())
    }

    /// One size's device buffers (at least one element each, so that no allocation is
    /// empty; calls take views of the lengths).
    pub(in crate::bench_mpi) struct DevBufs<T> {
        input: CudaSlice<T>,
        output: CudaSlice<T>,
        in_len: usize,
        out_len: usize,
    }

    /// The host buffers' contents on the device.
    pub(in crate::bench_mpi) fn upload<T: Element + Dev>(
        g: &Gpu<'_>,
        host_input: &[T],
        host_output: &[T],
    ) -> Result<DevBufs<T>> {
        let pad = |v: &[T]| {
            if v.is_empty() {
                vec![T::from_i64(0)]
            } else {
                v.to_vec()
            }
        };
        let input = g
            .stream
            .clone_htod(&pad(host_input))
            .map_err(|e| anyhow::anyhow!("upload: {e:?}"))?;
        let output = g
            .stream
            .clone_htod(&pad(host_output))
            .map_err(|e| anyhow::anyhow!("upload: {e:?}"))?;
        Ok(DevBufs {
            input,
            output,
            in_len: host_input.len(),
            out_len: host_output.len(),
        })
    }

    /// The device output into `out`.
    pub(in crate::bench_mpi) fn download<T: Element + Dev>(
        g: &Gpu<'_>,
        d: &DevBufs<T>,
        out: &mut [T],
    ) -> Result<()> {
        let view = d.output.slice(0..d.out_len);
        g.stream
            .memcpy_dtoh(&view, out)
            .and_then(|()| g.stream.synchronize())
            .map_err(|e| anyhow::anyhow!("download: {e:?}"))
    }

    /// One call of the GPU rank's collective, waited for on its stream.
    pub(in crate::bench_mpi) fn call<T: Element + Dev>(
        g: &mut Gpu<'_>,
        args: &BenchArgs,
        d: &mut DevBufs<T>,
        counts: &[usize],
        me: u32,
    ) -> Result<()> {
        let (op, root) = (args.element.op, args.root);
        let i = d.input.slice(0..d.in_len);
        let mut o = d.output.slice_mut(0..d.out_len);
        if args.collective == Collective::Broadcast && me == root {
            g.stream
                .memcpy_dtod(&i, &mut o)
                .map_err(|e| anyhow::anyhow!("broadcast input: {e:?}"))?;
        }
        let stream = Arc::clone(&g.stream);
        let mut on = g.rank.on(&stream);
        match args.collective {
            Collective::AllReduce => on.all_reduce(&i, &mut o, op)?,
            Collective::Reduce => on.reduce(&i, Some(&mut o), root as usize, op)?,
            Collective::Broadcast => on.broadcast_in_place(&mut o, root as usize)?,
            Collective::AllGather => on.all_gather(&i, &mut o)?,
            Collective::AllGatherV => on.all_gather_v(&i, &mut o, counts)?,
            Collective::ReduceScatter => on.reduce_scatter(&i, &mut o, op)?,
            Collective::ReduceScatterV => on.reduce_scatter_v(&i, &mut o, counts, op)?,
            Collective::AllToAll => on.all_to_all(&i, &mut o)?,
            Collective::AllToAllV => on.all_to_all_v(&i, counts, &mut o, counts)?,
            Collective::Gather => on.gather(&i, Some(&mut o), root as usize)?,
            Collective::Scatter => on.scatter(Some(&i), &mut o, root as usize)?,
            Collective::SendRecv => bail!("send_recv is not timed over MPI"),
        }
        stream
            .synchronize()
            .map_err(|e| anyhow::anyhow!("stream: {e:?}"))
    }
}

/// Without CUDA no GPU run starts (`run` refuses `--gpus` and `--transport` first).
#[cfg(not(feature = "cuda"))]
mod without_cuda {
    use anyhow::{Result, bail};
    use relaycc_collectives::Element;
    use relaycc_collectives::mpi::{MpiCommunicator, rsmpi::topology::SimpleCommunicator};

    use crate::args::BenchArgs;

    /// Every element type.
    pub(in crate::bench_mpi) trait Dev {}
    impl<T> Dev for T {}

    /// No GPU rank without CUDA: the type has no value.
    pub(in crate::bench_mpi) struct Gpu<'c>(
        std::marker::PhantomData<&'c ()>,
        std::convert::Infallible,
    );
    /// Device buffers: none without CUDA.
    pub(in crate::bench_mpi) struct DevBufs<T>(std::marker::PhantomData<T>);

    pub(in crate::bench_mpi) fn open<'c>(
        _: &'c MpiCommunicator,
        _: &SimpleCommunicator,
        _: &BenchArgs,
    ) -> Result<Gpu<'c>> {
        bail!("this relaycc is built without CUDA")
    }
    pub(in crate::bench_mpi) fn describe(g: &Gpu<'_>) -> String {
        match g.1 {}
    }
    pub(in crate::bench_mpi) fn upload<T: Element>(
        g: &Gpu<'_>,
        _: &[T],
        _: &[T],
    ) -> Result<DevBufs<T>> {
        match g.1 {}
    }
    pub(in crate::bench_mpi) fn download<T>(
        g: &Gpu<'_>,
        _: &DevBufs<T>,
        _: &mut [T],
    ) -> Result<()> {
        match g.1 {}
    }
    pub(in crate::bench_mpi) fn call<T>(
        g: &mut Gpu<'_>,
        _: &BenchArgs,
        _: &mut DevBufs<T>,
        _: &[usize],
        _: u32,
    ) -> Result<()> {
        match g.1 {}
    }
}

#[cfg(feature = "cuda")]
pub(super) use with_cuda::*;
#[cfg(not(feature = "cuda"))]
pub(super) use without_cuda::*;
