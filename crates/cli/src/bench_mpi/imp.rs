//! The MPI benchmark itself (feature `mpi`): arguments agreed, then the MPI driver of
//! `bench_report.rs`'s pipeline: buffers, relaycc's and the MPI library's calls, timing.

use std::time::Instant;

use anyhow::{Context, Result};
use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{MpiCommunicator, SharedHostBuffer};
use relaycc_collectives::{Collectives, Element};
use relaycc_route::{Collective, DType, ReduceOp, Request};
use rsmpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use rsmpi::datatype::{Equivalence, Partition, PartitionMut};
use rsmpi::topology::{Communicator, SimpleCommunicator};

use crate::args::{BenchArgs, usage};
use crate::bench_driver::{BenchDriver, Call, Measurement, MpiSetting, Setting};
use crate::bench_reference::value;

use super::gpu;

/// The arguments every rank must share, by the names the command line gives them.
fn settings(args: &BenchArgs) -> Vec<(&'static str, i64)> {
    let flag = |b: bool| i64::from(b);
    // A list as one value: its length and elements folded (FNV-1a).
    let list = |v: &[u32]| {
        v.iter()
            .fold(0xcbf2_9ce4_8422_2325u64 ^ v.len() as u64, |h, x| {
                (h ^ u64::from(*x)).wrapping_mul(0x0000_0100_0000_01b3)
            }) as i64
    };
    vec![
        ("the collective", args.collective as i64),
        ("--dtype", args.element.dtype as i64),
        ("--op", args.element.op as i64),
        ("--root", i64::from(args.root)),
        ("-b", args.min_bytes as i64),
        ("-e", args.max_bytes as i64),
        ("-f", args.factor as i64),
        ("-n", i64::from(args.iters)),
        ("-w", i64::from(args.warmup)),
        ("--check", flag(args.check)),
        ("--vs-mpi", flag(args.vs_mpi)),
        ("--shared-buffers", flag(args.shared_buffers)),
        ("--ranks", args.ranks.map_or(-1, i64::from)),
        ("--gpus", list(&args.gpus)),
        ("--transport", args.transport.map_or(-1, |t| t as i64)),
    ]
}

/// Run `relaycc bench --backend mpi` at `sizes` (collective over the processes of `mpirun`).
pub fn run(args: &BenchArgs, sizes: &[u64], out: &mut Vec<u8>) -> Result<()> {
    let universe = rsmpi::initialize().context("MPI cannot be initialized")?;
    let world = universe.world();
    let me = world.rank() as u32;
    let mut comm = MpiCommunicator::from_mpi(&world, me, None)?;
    // Before anything depends on them: ranks with other arguments would make other calls.
    // Printed here, then a barrier (bounded by the timeout; every rank failed the same
    // agreement), so that every rank's line is out before the first rank to exit makes
    // mpirun stop the rest.
    if let Err(e) = comm
        .agree_settings(&settings(args))
        .context("the ranks were started with different arguments")
    {
        crate::args::print_error(&crate::args::error_line(&e));
        let _ = comm.barrier();
        return Err(crate::args::Reported.into());
    }
    let on_gpus = !args.gpus.is_empty() || args.transport.is_some();
    if on_gpus && cfg!(not(feature = "cuda")) {
        return Err(usage(
            "--backend mpi with --gpus or --transport runs on GPUs: this relaycc is built \
             without CUDA (build relaycc-cli with --features cuda,mpi)",
        ));
    }
    if on_gpus && args.shared_buffers {
        return Err(usage(
            "--shared-buffers allocates host buffers; with --gpus the buffers are on GPUs",
        ));
    }
    if on_gpus && args.collective == Collective::SendRecv {
        return Err(usage(
            "GPU ranks over MPI run sends and receives one at a time: send_recv (a ring of \
             them in one group per rank) is timed on host ranks only",
        ));
    }
    let n = world.size() as u32;
    if let Some(r) = args.ranks
        && r != n
    {
        return Err(usage(format!(
            "--ranks {r}, but mpirun started {n} processes"
        )));
    }
    if args.root >= n {
        return Err(usage(format!("root {} is not a rank (0..{n})", args.root)));
    }
    // The benchmark times the fast path an engine uses: the caller's buffers handed to
    // MPI. `RELAYCC_MPI_ZERO_COPY=0` times the communicator's own buffers instead.
    comm.set_zero_copy(std::env::var("RELAYCC_MPI_ZERO_COPY").map_or(true, |v| v.trim() != "0"));
    let dev = if on_gpus {
        Some(gpu::open(&comm, &world, args)?)
    } else {
        None
    };
    let mut driver = MpiDriver {
        comm: &comm,
        world: &world,
        args,
        dev,
    };
    crate::bench_report::run(&mut driver, args, sizes, out)
}

/// The MPI driver: this process's rank, on host memory or its GPU.
struct MpiDriver<'c> {
    comm: &'c MpiCommunicator,
    world: &'c SimpleCommunicator,
    args: &'c BenchArgs,
    /// This process's GPU rank, on GPUs.
    dev: Option<gpu::Gpu<'c>>,
}

impl BenchDriver for MpiDriver<'_> {
    fn devices(&self) -> Vec<u32> {
        (0..self.world.size() as u32).collect()
    }

    fn measure(&mut self, call: &Call) -> Result<Measurement> {
        match call.request.dtype {
            DType::F32 => measure::<f32>(self, call),
            DType::F64 => measure::<f64>(self, call),
            DType::I8 => measure::<i8>(self, call),
            DType::U8 => measure::<u8>(self, call),
            DType::I32 => measure::<i32>(self, call),
            DType::U32 => measure::<u32>(self, call),
            DType::I64 => measure::<i64>(self, call),
            DType::U64 => measure::<u64>(self, call),
            DType::F16 | DType::Bf16 => Err(usage(
                "--backend mpi times types MPI has (f32, f64, i8, u8, i32, u32, i64, \
                 u64); MPI has no half-precision type",
            )),
        }
    }

    fn prints(&self) -> bool {
        self.comm.rank() == 0
    }

    fn setting(&self) -> Setting {
        let library: String = rsmpi::environment::library_version()
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .filter(|c| !c.is_control())
            .collect::<String>()
            .trim()
            .to_owned();
        Setting::Mpi(MpiSetting {
            nodes: self.comm.nodes(),
            mpi_library: library,
            zero_copy: self.comm.zero_copy() && self.dev.is_none(),
            shared_buffers: self.args.shared_buffers,
            transport: self.comm.host_transport(),
            gpu: self.dev.as_ref().map(gpu::describe),
        })
    }
}

/// A host buffer of the benchmark: on the heap, or shared with the other local ranks
/// (`--shared-buffers`).
enum HostBuf<T: Element> {
    Heap(Vec<T>),
    Shared(SharedHostBuffer<T>),
}

impl<T: Element> HostBuf<T> {
    /// `len` elements, each `fill(i)`.
    fn new(shared: bool, len: usize, me: u32, fill: impl Fn(u64) -> T) -> Result<Self> {
        if shared {
            let mut b = SharedHostBuffer::zeroed(len)?;
            for (i, x) in b.iter_mut().enumerate() {
                *x = fill(i as u64);
            }
            return Ok(HostBuf::Shared(b));
        }
        let mut v: Vec<T> = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| anyhow::anyhow!("rank {me}: out of host memory for {len} elements"))?;
        v.extend((0..len as u64).map(fill));
        Ok(HostBuf::Heap(v))
    }
}

impl<T: Element> std::ops::Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Shared(b) => b,
        }
    }
}

impl<T: Element> std::ops::DerefMut for HostBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Shared(b) => b,
        }
    }
}

/// This rank's buffers and counts for one size.
struct Bufs<T: Element> {
    input: HostBuf<T>,
    output: HostBuf<T>,
    /// Per-rank counts (all equal) of the `v` collectives, as MPI takes them.
    counts: Vec<usize>,
    displs: Vec<i32>,
}

/// This rank's buffers of `req` (on the heap, or shared with `shared`).
fn buffers<T: Element>(shared: bool, req: &Request, me: u32) -> Result<Bufs<T>> {
    let (c, count) = (req.collective, req.count);
    let nr = req.nranks();
    let in_len = usize::try_from(req.input_len(me)?)?;
    let mut out_len = usize::try_from(req.output_len(me)?)?;
    if c == Collective::Broadcast {
        // In place, as MPI_Bcast: every rank's buffer holds the count.
        out_len = usize::try_from(count)?;
    }
    let input = HostBuf::new(shared, in_len, me, |i| T::from_i64(value(me, i)))?;
    let output = HostBuf::new(shared, out_len, me, |_| T::from_i64(0))?;
    let cu = usize::try_from(count)?;
    let counts = vec![cu; nr];
    let displs = (0..nr)
        .map(|r| i32::try_from(r * cu))
        .collect::<Result<Vec<_>, _>>()
        .context("displacements over MPI's int range")?;
    Ok(Bufs {
        input,
        output,
        counts,
        displs,
    })
}

/// One call of relaycc's collective on `b`, through the communicator's host calls
/// ([`Collectives`] on `&MpiCommunicator`).
fn relaycc_call<T: Element>(
    comm: &MpiCommunicator,
    args: &BenchArgs,
    b: &mut Bufs<T>,
) -> Result<()> {
    let mut comm = comm;
    let op = args.element.op;
    let root = args.root as usize;
    let is_root = comm.rank() == root;
    let (i, o) = (&b.input[..], &mut b.output[..]);
    match args.collective {
        Collective::AllReduce => comm.all_reduce(i, o, op)?,
        Collective::Reduce => comm.reduce(i, Some(o).filter(|_| is_root), root, op)?,
        Collective::Broadcast => comm.broadcast(Some(i).filter(|_| is_root), o, root)?,
        Collective::AllGather => comm.all_gather(i, o)?,
        Collective::AllGatherV => comm.all_gather_v(i, o, &b.counts)?,
        Collective::ReduceScatter => comm.reduce_scatter(i, o, op)?,
        Collective::ReduceScatterV => comm.reduce_scatter_v(i, o, &b.counts, op)?,
        Collective::AllToAll => comm.all_to_all(i, o)?,
        Collective::AllToAllV => comm.all_to_all_v(i, &b.counts, o, &b.counts)?,
        Collective::Gather => comm.gather(i, Some(o).filter(|_| is_root), root)?,
        Collective::Scatter => comm.scatter(Some(i).filter(|_| is_root), o, root)?,
        Collective::SendRecv => {
            // nccl-tests' sendrecv: a ring, each rank's send and receive in one group.
            let (me, n) = (comm.rank(), comm.ranks());
            let mut g = comm.group();
            g.send(i, (me + 1) % n).recv(o, (me + n - 1) % n);
            g.launch()?
        }
    }
    Ok(())
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        // MPI has no average: its sum is timed, and `--check` divides it.
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Prod => SystemOperation::product(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

/// One call of the MPI library's collective on `b`'s input, into `out`.
fn mpi_call<T: Element + Equivalence>(
    world: &SimpleCommunicator,
    args: &BenchArgs,
    b: &Bufs<T>,
    out: &mut [T],
) {
    let op = system_op(args.element.op);
    let root = world.process_at_rank(args.root as i32);
    let is_root = world.rank() as u32 == args.root;
    let i = &b.input[..];
    let counts: Vec<i32> = b.counts.iter().map(|c| *c as i32).collect();
    match args.collective {
        Collective::AllReduce => world.all_reduce_into(i, out, op),
        Collective::Reduce if is_root => root.reduce_into_root(i, out, op),
        Collective::Reduce => root.reduce_into(i, op),
        Collective::Broadcast => {
            if is_root {
                out.copy_from_slice(i);
            }
            root.broadcast_into(out)
        }
        Collective::AllGather => world.all_gather_into(i, out),
        Collective::AllGatherV => {
            let mut part = PartitionMut::new(out, &counts[..], &b.displs[..]);
            world.all_gather_varcount_into(i, &mut part)
        }
        // The bench's counts are all equal, where `MPI_Reduce_scatter` is
        // `MPI_Reduce_scatter_block` (the one rsmpi wraps).
        Collective::ReduceScatter | Collective::ReduceScatterV => {
            world.reduce_scatter_block_into(i, out, op)
        }
        Collective::AllToAll => world.all_to_all_into(i, out),
        Collective::AllToAllV => {
            let send = Partition::new(i, &counts[..], &b.displs[..]);
            let mut recv = PartitionMut::new(out, &counts[..], &b.displs[..]);
            world.all_to_all_varcount_into(&send, &mut recv)
        }
        Collective::Gather if is_root => root.gather_into_root(i, out),
        Collective::Gather => root.gather_into(i),
        Collective::Scatter if is_root => root.scatter_into_root(i, out),
        Collective::Scatter => root.scatter_into(out),
        Collective::SendRecv => {
            let n = world.size();
            let me = world.rank();
            let next = world.process_at_rank((me + 1) % n);
            let prev = world.process_at_rank((me + n - 1) % n);
            rsmpi::point_to_point::send_receive_into(i, &next, out, &prev);
        }
    }
}

/// Time relaycc (and with `--vs-mpi` the MPI collective) at `call`'s size; `--check`
/// compares the two outputs.
fn measure<T: Element + Equivalence + gpu::Dev>(
    driver: &mut MpiDriver<'_>,
    call: &Call,
) -> Result<Measurement> {
    let (comm, world, args) = (driver.comm, driver.world, driver.args);
    let mut dev = driver.dev.as_mut();
    let n = world.size() as u32;
    let me = world.rank() as u32;
    let mut b = buffers::<T>(args.shared_buffers, &call.request, me)?;
    let mut mpi_out = HostBuf::new(args.shared_buffers, b.output.len(), me, |_| T::from_i64(0))?;
    let with_mpi = args.vs_mpi;
    let mut d = match dev.as_deref() {
        Some(g) => Some(gpu::upload(g, &b.input, &b.output)?),
        None => None,
    };
    let mut relaycc = |b: &mut Bufs<T>| -> Result<()> {
        match (dev.as_deref_mut(), d.as_mut()) {
            (Some(g), Some(d)) => gpu::call(g, args, d, &b.counts, me),
            _ => relaycc_call(comm, args, b),
        }
    };
    // Every blocking MPI collective below is entered after a bounded barrier: once every
    // rank has passed it, each calls the same collective with the agreed arguments.
    for _ in 0..call.warmup {
        relaycc(&mut b)?;
        if with_mpi {
            comm.barrier()?;
            mpi_call(world, args, &b, &mut mpi_out);
        }
    }
    let (mut t_relay, mut t_mpi) = (0.0f64, 0.0f64);
    let iters = call.iters;
    for _ in 0..iters {
        comm.barrier()?;
        let t = Instant::now();
        relaycc(&mut b)?;
        t_relay += t.elapsed().as_secs_f64();
        if with_mpi {
            comm.barrier()?;
            let t = Instant::now();
            mpi_call(world, args, &b, &mut mpi_out);
            t_mpi += t.elapsed().as_secs_f64();
        }
    }
    let algorithm = comm.last_algorithm();
    let wrong = if call.check {
        b.output.fill(T::from_i64(0));
        mpi_out.fill(T::from_i64(0));
        relaycc(&mut b)?;
        if let (Some(g), Some(d)) = (dev.as_deref(), d.as_ref()) {
            gpu::download(g, d, &mut b.output)?;
        }
        comm.barrier()?;
        mpi_call(world, args, &b, &mut mpi_out);
        let n_f = f64::from(n);
        let avg = args.collective.reduces() && args.element.op == ReduceOp::Avg;
        let bad = b
            .output
            .iter()
            .zip(mpi_out.iter())
            .filter(|(a, m)| {
                if avg {
                    let want = m.to_f64() / n_f;
                    (a.to_f64() - want).abs() > 1e-6 * want.abs().max(1.0)
                } else {
                    a != m
                }
            })
            .count() as u64;
        // The tallies go through relaycc's own all_reduce: bounded by the timeout.
        let mut total = [0u64];
        let mut host = comm;
        host.all_reduce(&[bad], &mut total, ReduceOp::Sum)?;
        Some(total[0])
    } else {
        None
    };
    let mut worst = [0.0f64; 2];
    let mut host = comm;
    host.all_reduce(&[t_relay, t_mpi], &mut worst, ReduceOp::Max)?;
    let per = |t: f64| t / f64::from(iters);
    Ok(Measurement {
        secs: per(worst[0]),
        wrong,
        copy_secs: None,
        beside_secs: with_mpi.then(|| per(worst[1])),
        algorithm,
    })
}
