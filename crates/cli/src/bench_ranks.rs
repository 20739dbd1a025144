//! `relaycc bench --backend host` through the per-rank API: one thread per rank, each with
//! its own host vectors, calling the collective on its [`RankComm`] as an engine's rank
//! would (out of place; send_recv is a ring in one group).
//!
//! Each iteration starts on a barrier and each rank times its own call; the row reports the
//! slowest rank's mean. The plain-copy figure is each rank copying its `size` bytes to
//! itself in a group of one send and one receive: the same lane threads and executor, all
//! ranks at once, alternating with the collective so that drift hits both alike.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use anyhow::{Result, anyhow};
use relaycc_collectives::{Communicator, Element, RankComm, bf16, f16};
use relaycc_route::{Collective, DType, ReduceOp, Request};

use crate::args::BenchArgs;
use crate::bench_cmd::{Row, request};
use crate::bench_reference::{RefElement, count_wrong_in, value};

/// One handle per rank of a communicator like `comm` (same topology and devices), on a host
/// backend of their own.
pub fn ranks(comm: &Communicator) -> Result<Vec<RankComm>> {
    let backend = std::sync::Arc::new(relaycc_collectives::HostBackend::new());
    let c = Communicator::new(comm.topology().clone(), comm.devices(), &[], backend)?;
    Ok(c.into_ranks())
}

/// The row for `size` bytes of the collective, element type `dtype`.
pub fn row(
    ranks: &mut Vec<RankComm>,
    comm: &Communicator,
    args: &BenchArgs,
    c: Collective,
    dtype: DType,
    op: ReduceOp,
    size: u64,
) -> Result<Row> {
    match dtype {
        DType::F32 => typed_row::<f32>(ranks, comm, args, c, op, size),
        DType::F64 => typed_row::<f64>(ranks, comm, args, c, op, size),
        DType::F16 => typed_row::<f16>(ranks, comm, args, c, op, size),
        DType::Bf16 => typed_row::<bf16>(ranks, comm, args, c, op, size),
        DType::I8 => typed_row::<i8>(ranks, comm, args, c, op, size),
        DType::U8 => typed_row::<u8>(ranks, comm, args, c, op, size),
        DType::I32 => typed_row::<i32>(ranks, comm, args, c, op, size),
        DType::U32 => typed_row::<u32>(ranks, comm, args, c, op, size),
        DType::I64 => typed_row::<i64>(ranks, comm, args, c, op, size),
        DType::U64 => typed_row::<u64>(ranks, comm, args, c, op, size),
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

/// Rank `rank`'s part of the collective of `req`, on its vectors.
fn call<T: Element>(
    rank: &mut RankComm,
    req: &Request,
    input: &[T],
    output: &mut [T],
) -> Result<()> {
    let r = rank.rank();
    let n = rank.ranks();
    let root = req.root as usize;
    let is_root = r == root;
    let as_usize = |v: &[u64]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
    match req.collective {
        Collective::AllReduce => rank.all_reduce(input, output, req.op)?,
        Collective::Reduce => rank.reduce(input, is_root.then_some(output), root, req.op)?,
        Collective::Broadcast => rank.broadcast(is_root.then_some(input), output, root)?,
        Collective::AllGather => rank.all_gather(input, output)?,
        Collective::AllGatherV => rank.all_gather_v(input, output, &as_usize(&req.counts))?,
        Collective::ReduceScatter => rank.reduce_scatter(input, output, req.op)?,
        Collective::AllToAll => rank.all_to_all(input, output)?,
        Collective::AllToAllV => {
            let row = as_usize(&req.matrix[r]);
            let col: Vec<usize> = req.matrix.iter().map(|m| m[r] as usize).collect();
            rank.all_to_all_v(input, &row, output, &col)?
        }
        Collective::Gather => rank.gather(input, is_root.then_some(output), root)?,
        Collective::Scatter => rank.scatter(is_root.then_some(input), output, root)?,
        Collective::SendRecv => {
            let mut g = rank.group();
            g.send(input, (r + 1) % n).recv(output, (r + n - 1) % n);
            g.launch()?
        }
    }
    Ok(())
}

/// What one rank's thread reports: seconds in the collective and in the copies, and its
/// output.
type RankTimes<T> = (RankComm, f64, f64, Vec<T>);

fn typed_row<T: RefElement>(
    ranks: &mut Vec<RankComm>,
    comm: &Communicator,
    args: &BenchArgs,
    c: Collective,
    op: ReduceOp,
    size: u64,
) -> Result<Row> {
    let req = request(comm, c, T::DTYPE, op, args.root, size);
    let bytes = req.size_bytes();
    let n = ranks.len();
    let iters = args.iters.max(1);
    let barrier = Gate::new(n);
    let run_rank = |mut rank: RankComm| -> Result<RankTimes<T>> {
        let r = rank.rank() as u32;
        let input = host_vec(r, req.input_len(r)?, "input", |i| T::from_i64(value(r, i)))?;
        let mut output = host_vec(r, req.output_len(r)?, "output", |_| T::from_i64(0))?;
        let src = host_vec(r, bytes, "copy source", |_| 0u8)?;
        let mut dst = host_vec(r, bytes, "copy destination", |_| 0u8)?;
        let me = rank.rank();
        let mut copy = |rank: &mut RankComm| -> Result<()> {
            let mut g = rank.group();
            g.send(&src, me).recv(&mut dst, me);
            Ok(g.launch()?)
        };
        for _ in 0..args.warmup {
            call(&mut rank, &req, &input, &mut output)?;
            copy(&mut rank)?;
        }
        let (mut t_coll, mut t_copy) = (0.0, 0.0);
        for _ in 0..iters {
            barrier.wait()?;
            let t = Instant::now();
            call(&mut rank, &req, &input, &mut output)?;
            t_coll += t.elapsed().as_secs_f64();
            barrier.wait()?;
            let t = Instant::now();
            copy(&mut rank)?;
            t_copy += t.elapsed().as_secs_f64();
        }
        Ok((rank, t_coll, t_copy, output))
    };
    let results: Vec<Result<RankTimes<T>>> = std::thread::scope(|s| {
        let handles: Vec<_> = std::mem::take(ranks)
            .into_iter()
            .map(|rank| {
                s.spawn(|| {
                    let res = run_rank(rank);
                    if res.is_err() {
                        barrier.break_it();
                    }
                    res
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a rank thread panicked")))
            })
            .collect()
    });
    let (mut t_coll, mut t_copy) = (0.0f64, 0.0f64);
    let mut outs = Vec::with_capacity(n);
    let mut first_err = None;
    for res in results {
        match res {
            Ok((rank, tc, tp, out)) => {
                ranks.push(rank);
                t_coll = t_coll.max(tc);
                t_copy = t_copy.max(tp);
                outs.push(out);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let wrong = if args.check {
        Some(count_wrong_in(&req, &outs)?)
    } else {
        None
    };
    let per = |t: f64| t / f64::from(iters);
    Ok(Row::timed(&req, n, per(t_coll), per(t_copy), wrong))
}
