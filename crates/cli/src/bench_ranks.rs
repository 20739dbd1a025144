//! `relaycc bench --backend host` through the per-rank API: each rank has its own host
//! vectors and calls the collective on its [`RankComm`] as an engine's rank would (out of
//! place; send_recv is a ring in one group), directly on the other ranks' memory or, with
//! `--flags`, over the flag transport (each rank its own part, messages through rings). The ranks run on a bounded pool of threads, one
//! per core and at most one per rank, each driving its share of the ranks as one thread
//! drives several GPUs in NCCL: it adds every rank's call to that rank's group and launches
//! them together ([`RankGroup::launch_all`]), so 1,024 ranks need no 1,024 threads. A thread
//! that cannot be started is an error: its ranks' handles are dropped, so the other ranks'
//! calls fail at once instead of waiting for them.
//!
//! Each iteration starts on a barrier of the threads and each thread times its ranks' call;
//! the row reports the slowest thread's mean. The plain-copy figure is each rank copying its
//! `size` bytes to itself in a group of one send and one receive: the same lane threads and
//! executor, all ranks at once, alternating with the collective so that drift hits both
//! alike.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use relaycc_collectives::{Collectives, Communicator, Element, RankComm, RankGroup, bf16, f16};
use relaycc_route::{Collective, DType, Request};

use crate::args::BenchArgs;
use crate::bench_driver::{BenchDriver, Call, Measurement, Setting};
use crate::bench_reference::{RefElement, count_wrong_in, value};

/// The host backend's driver: one handle per rank of a host communicator.
pub struct RanksDriver {
    ranks: Vec<RankComm>,
    devices: Vec<u32>,
    backend: String,
    /// Why `--vs-nccl` times nothing here.
    nccl_unavailable: Option<String>,
}

/// The driver of `--backend host`: ranks on logical devices of this host's memory
/// (`--gpus LIST` or `--ranks N` for devices 0..N), after checking that the largest size's
/// buffers fit ([`crate::bench_checks::check_memory`]).
pub fn open(args: &BenchArgs, sizes: &[u64]) -> Result<RanksDriver> {
    let devices: Vec<u32> = match (&args.gpus, args.ranks) {
        (g, _) if !g.is_empty() => g.clone(),
        (_, Some(n)) if n > 0 => (0..n).collect(),
        _ => bail!("give --ranks N or --gpus LIST"),
    };
    let arenas = devices.iter().max().map_or(0, |m| m + 1);
    let topo = relaycc_collectives::host_topology(arenas)?;
    let backend = std::sync::Arc::new(relaycc_collectives::HostBackend::new());
    // `host-N` tells the planner the ranks share this host's memory.
    let comm = Communicator::new(topo, &devices, &[], backend)?;
    let max = sizes.last().copied().unwrap_or(0);
    crate::bench_checks::check_memory(&comm, args, &[], max)?;
    let nccl_unavailable = args
        .vs_nccl
        .then(|| "NCCL runs on GPUs: use --backend cuda".to_owned());
    let (backend, ranks) = match args.flags {
        Some(shape) => (
            format!(
                "{}, ranks over flags ({} slots of {} bytes per pair)",
                comm.backend().name(),
                shape.slots(),
                shape.slot_bytes()
            ),
            comm.into_flag_ranks(shape)?,
        ),
        None => (comm.backend().name().into(), comm.into_ranks()),
    };
    Ok(RanksDriver {
        backend,
        ranks,
        devices,
        nccl_unavailable,
    })
}

impl BenchDriver for RanksDriver {
    fn devices(&self) -> Vec<u32> {
        self.devices.clone()
    }

    fn measure(&mut self, call: &Call) -> Result<Measurement> {
        let ranks = &mut self.ranks;
        match call.request.dtype {
            DType::F32 => measure::<f32>(ranks, call),
            DType::F64 => measure::<f64>(ranks, call),
            DType::F16 => measure::<f16>(ranks, call),
            DType::Bf16 => measure::<bf16>(ranks, call),
            DType::I8 => measure::<i8>(ranks, call),
            DType::U8 => measure::<u8>(ranks, call),
            DType::I32 => measure::<i32>(ranks, call),
            DType::U32 => measure::<u32>(ranks, call),
            DType::I64 => measure::<i64>(ranks, call),
            DType::U64 => measure::<u64>(ranks, call),
        }
    }

    fn setting(&self) -> Setting {
        Setting::InProcess {
            backend: self.backend.clone(),
            nccl: None,
            nccl_unavailable: self.nccl_unavailable.clone(),
        }
    }
}

/// A barrier that a failing rank breaks, so the others return instead of waiting for it.
struct Gate {
    /// Ranks waiting, generation, broken.
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
    n: usize,
}

impl Gate {
    fn new(n: usize) -> Self {
        Gate {
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
            n,
        }
    }
    fn wait(&self) -> Result<()> {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if g.2 {
            return Err(anyhow!("another rank failed"));
        }
        g.0 += 1;
        if g.0 == self.n {
            g.0 = 0;
            g.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let generation = g.1;
        while g.1 == generation && !g.2 {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        if g.1 == generation {
            return Err(anyhow!("another rank failed"));
        }
        Ok(())
    }
    fn break_it(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).2 = true;
        self.cv.notify_all();
    }
}

/// A vector of `len` elements, or an error naming the rank and what it was for.
fn host_vec<T: Element>(r: u32, len: u64, what: &str, fill: impl Fn(u64) -> T) -> Result<Vec<T>> {
    let n = usize::try_from(len).map_err(|_| anyhow!("rank {r}: {len} elements do not fit"))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| anyhow!("rank {r}: out of host memory for {len} elements of {what}"))?;
    v.extend((0..len).map(fill));
    Ok(v)
}

/// Add rank `rank`'s part of the collective of `req`, on its vectors, to its group `g`.
fn add_call<'b, T: Element>(
    g: &mut RankGroup<'_, 'b>,
    (r, n): (usize, usize),
    req: &Request,
    input: &'b [T],
    output: &'b mut [T],
) {
    let root = req.root as usize;
    let is_root = r == root;
    let as_usize = |v: &[u64]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
    match req.collective {
        Collective::AllReduce => g.all_reduce(input, output, req.op),
        Collective::Reduce => g.reduce(input, is_root.then_some(output), root, req.op),
        Collective::Broadcast => g.broadcast(is_root.then_some(input), output, root),
        Collective::AllGather => g.all_gather(input, output),
        Collective::AllGatherV => g.all_gather_v(input, output, &as_usize(&req.counts)),
        Collective::ReduceScatter => g.reduce_scatter(input, output, req.op),
        Collective::ReduceScatterV => {
            g.reduce_scatter_v(input, output, &as_usize(&req.counts), req.op)
        }
        Collective::AllToAll => g.all_to_all(input, output),
        Collective::AllToAllV => {
            let row = as_usize(&req.matrix[r]);
            let col: Vec<usize> = req.matrix.iter().map(|m| m[r] as usize).collect();
            g.all_to_all_v(input, &row, output, &col)
        }
        Collective::Gather => g.gather(input, is_root.then_some(output), root),
        Collective::Scatter => g.scatter(is_root.then_some(input), output, root),
        Collective::SendRecv => g.send(input, (r + 1) % n).recv(output, (r + n - 1) % n),
    };
}

/// One rank driven by a thread: its handle and vectors.
struct Driven<T> {
    rank: RankComm,
    input: Vec<T>,
    output: Vec<T>,
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl<T: Element> Driven<T> {
    fn new(rank: RankComm, req: &Request, bytes: u64) -> Result<Self> {
        let r = rank.rank() as u32;
        Ok(Driven {
            input: host_vec(r, req.input_len(r)?, "input", |i| T::from_i64(value(r, i)))?,
            output: host_vec(r, req.output_len(r)?, "output", |_| T::from_i64(0))?,
            src: host_vec(r, bytes, "copy source", |_| 0u8)?,
            dst: host_vec(r, bytes, "copy destination", |_| 0u8)?,
            rank,
        })
    }
}

/// The collective on every rank of `mine`, launched together.
fn collective<T: Element>(mine: &mut [Driven<T>], req: &Request) -> Result<()> {
    let groups = mine.iter_mut().map(|d| {
        let (r, n) = (d.rank.rank(), d.rank.ranks());
        let mut g = d.rank.group();
        add_call(&mut g, (r, n), req, &d.input, &mut d.output);
        g
    });
    Ok(RankGroup::launch_all(groups)?)
}

/// Every rank of `mine` copying its source to its destination (a send to itself and the
/// matching receive), launched together.
fn copy<T: Element>(mine: &mut [Driven<T>]) -> Result<()> {
    let groups = mine.iter_mut().map(|d| {
        let me = d.rank.rank();
        let mut g = d.rank.group();
        g.send(&d.src[..], me).recv(&mut d.dst[..], me);
        g
    });
    Ok(RankGroup::launch_all(groups)?)
}

/// What one thread reports: its ranks' handles and outputs, and seconds in the collective
/// and in the copies.
type DriverReport<T> = (Vec<(RankComm, Vec<T>)>, f64, f64);

/// How many threads drive `n` ranks: one per core, at most one per rank.
fn driver_threads(n: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    cores.clamp(1, n.max(1))
}

/// The collective of `call` on every rank, timed as the module says.
fn measure<T: RefElement>(ranks: &mut Vec<RankComm>, call: &Call) -> Result<Measurement> {
    let req = &call.request;
    let bytes = req.size_bytes();
    let n = ranks.len();
    let iters = call.iters;
    let threads = driver_threads(n);
    let barrier = Gate::new(threads);
    let drive = |mine: Vec<RankComm>| -> Result<DriverReport<T>> {
        let mut mine: Vec<Driven<T>> = mine
            .into_iter()
            .map(|rank| Driven::new(rank, req, bytes))
            .collect::<Result<_>>()?;
        for _ in 0..call.warmup {
            collective(&mut mine, req)?;
            copy(&mut mine)?;
        }
        let (mut t_coll, mut t_copy) = (0.0, 0.0);
        for _ in 0..iters {
            barrier.wait()?;
            let t = Instant::now();
            collective(&mut mine, req)?;
            t_coll += t.elapsed().as_secs_f64();
            barrier.wait()?;
            let t = Instant::now();
            copy(&mut mine)?;
            t_copy += t.elapsed().as_secs_f64();
        }
        let back = mine.into_iter().map(|d| (d.rank, d.output)).collect();
        Ok((back, t_coll, t_copy))
    };
    // Thread k drives a contiguous share of the ranks, in rank order.
    let mut shares: Vec<Vec<RankComm>> = Vec::with_capacity(threads);
    let mut left = std::mem::take(ranks);
    for k in 0..threads {
        let take = left.len() / (threads - k);
        let rest = left.split_off(take);
        shares.push(std::mem::replace(&mut left, rest));
    }
    let results: Vec<Result<DriverReport<T>>> = std::thread::scope(|s| {
        let handles: Vec<_> = shares
            .into_iter()
            .enumerate()
            .map(|(k, share)| {
                let first = share.first().map_or(0, RankComm::rank);
                let last = share.last().map_or(0, RankComm::rank);
                let run = || {
                    let res = drive(share);
                    if res.is_err() {
                        barrier.break_it();
                    }
                    res
                };
                let started = std::thread::Builder::new()
                    .name(format!("bench-ranks-{k}"))
                    .spawn_scoped(s, run);
                started.map_err(|e| {
                    // The closure, and with it the share's handles, is dropped: the other
                    // ranks' calls fail at once instead of waiting for these.
                    barrier.break_it();
                    anyhow!("cannot start the thread driving ranks {first}..={last}: {e}")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.and_then(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("a rank thread panicked")))
                })
            })
            .collect()
    });
    let (mut t_coll, mut t_copy) = (0.0f64, 0.0f64);
    let mut outs = Vec::with_capacity(n);
    let mut first_err = None;
    for res in results {
        match res {
            Ok((back, tc, tp)) => {
                for (rank, out) in back {
                    ranks.push(rank);
                    outs.push(out);
                }
                t_coll = t_coll.max(tc);
                t_copy = t_copy.max(tp);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let wrong = if call.check {
        Some(count_wrong_in(req, &outs)?)
    } else {
        None
    };
    let per = |t: f64| t / f64::from(iters);
    Ok(Measurement {
        secs: per(t_coll),
        wrong,
        copy_secs: Some(per(t_copy)),
        ..Measurement::default()
    })
}
