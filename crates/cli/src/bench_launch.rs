//! `relaycc bench --backend cuda`: every rank's part of the collective launched at once on a
//! [`Communicator`] (`launch_request` on each rank's device buffers), and with `--vs-nccl`
//! NCCL timed on the same GPUs right after relaycc at each size.
//!
//! Each iteration is launched and waited for; collective and copy iterations alternate, so
//! that drift in the machine's speed (other tenants, frequency) hits both figures alike. The
//! plain-copy figure is each rank copying the size's bytes within its own memory, one send
//! and one receive per rank in one group.

use std::time::Instant;

use anyhow::{Context, Result};
use relaycc_collectives::{BufferView, Communicator, DeviceBuffer, Element, bf16, f16};
use relaycc_route::{DType, Request};

use crate::args::BenchArgs;
use crate::bench_cuda::Nccl;
use crate::bench_driver::{BenchDriver, Call, Measurement, Setting};
use crate::bench_reference::{RefElement, count_wrong_in, value};
use crate::size::format_size;

/// The CUDA backend's driver: a communicator on the ranks' GPUs, and NCCL beside it.
pub struct LaunchDriver<'a> {
    comm: Communicator,
    args: &'a BenchArgs,
    /// NCCL on the same GPUs (`--vs-nccl`), when it could start.
    nccl: Option<Nccl>,
    /// Why `--vs-nccl` times nothing.
    nccl_unavailable: Option<String>,
}

/// The driver of `--backend cuda` ([`crate::bench_cuda::communicator`]), after checking that
/// the largest size's buffers fit in each device's memory; with `--vs-nccl`, NCCL with buffers
/// for the largest size, or why not.
pub fn open<'a>(args: &'a BenchArgs, sizes: &[u64]) -> Result<LaunchDriver<'a>> {
    let (comm, devices, ordinals) = crate::bench_cuda::communicator(args)?;
    let max = sizes.last().copied().unwrap_or(0);
    crate::bench_checks::check_memory(&comm, args, &ordinals, max)?;
    let (mut nccl, mut nccl_unavailable) = (None, None);
    if args.vs_nccl {
        let (c, dtype) = (args.collective, args.element.dtype);
        let count = crate::sizing::element_count(c, dtype, max, devices.len() as u64)?;
        match crate::bench_cuda::nccl_baseline(&ordinals, count, c, dtype) {
            Ok(n) => nccl = Some(n),
            Err(why) => nccl_unavailable = Some(why),
        }
    }
    Ok(LaunchDriver {
        comm,
        args,
        nccl,
        nccl_unavailable,
    })
}

impl BenchDriver for LaunchDriver<'_> {
    fn devices(&self) -> Vec<u32> {
        self.comm.devices().to_vec()
    }

    fn measure(&mut self, call: &Call) -> Result<Measurement> {
        let comm = &self.comm;
        let mut m = match call.request.dtype {
            DType::F32 => measure::<f32>(comm, call)?,
            DType::F64 => measure::<f64>(comm, call)?,
            DType::F16 => measure::<f16>(comm, call)?,
            DType::Bf16 => measure::<bf16>(comm, call)?,
            DType::I8 => measure::<i8>(comm, call)?,
            DType::U8 => measure::<u8>(comm, call)?,
            DType::I32 => measure::<i32>(comm, call)?,
            DType::U32 => measure::<u32>(comm, call)?,
            DType::I64 => measure::<i64>(comm, call)?,
            DType::U64 => measure::<u64>(comm, call)?,
        };
        if let Some(nc) = &self.nccl {
            let r = &call.request;
            let us = crate::bench_cuda::nccl_time_us(
                nc,
                r.collective,
                r.count,
                r.dtype,
                r.op,
                self.args,
            )?;
            m.beside_secs = Some(us * 1e-6);
        }
        Ok(m)
    }

    fn setting(&self) -> Setting {
        Setting::InProcess {
            backend: self.comm.backend().name().into(),
            nccl: self
                .nccl
                .as_ref()
                .and_then(|_| crate::bench_cuda::nccl_library()),
            nccl_unavailable: self.nccl_unavailable.clone(),
        }
    }
}

/// Every rank's input (filled with [`value`]) or output (zeros) of `req`.
fn buffers<T: Element>(
    comm: &Communicator,
    req: &Request,
    input: bool,
) -> Result<Vec<DeviceBuffer<T>>> {
    (0..comm.ranks() as u32)
        .map(|r| {
            let len = if input {
                req.input_len(r)?
            } else {
                req.output_len(r)?
            };
            let len_usize = usize::try_from(len)
                .with_context(|| format!("rank {r}: {len} elements do not fit in memory"))?;
            let mut data: Vec<T> = Vec::new();
            data.try_reserve_exact(len_usize).map_err(|_| {
                anyhow::anyhow!(
                    "rank {r}: out of host memory for {} of {} data",
                    format_size(len.saturating_mul(T::DTYPE.size())),
                    if input { "input" } else { "output" }
                )
            })?;
            data.extend((0..len).map(|i| T::from_i64(if input { value(r, i) } else { 0 })));
            Ok(comm.from_slice(r as usize, &data)?)
        })
        .collect()
}

fn views<T: Element>(bufs: &[DeviceBuffer<T>]) -> Vec<Option<BufferView<'_, T>>> {
    bufs.iter()
        .map(|b| (!b.is_empty()).then(|| b.view()))
        .collect()
}

/// The collective of `call` and the plain copy, timed in alternation as the module says.
fn measure<T: RefElement>(comm: &Communicator, call: &Call) -> Result<Measurement> {
    let req = &call.request;
    let ins = buffers::<T>(comm, req, true)?;
    let outs = buffers::<T>(comm, req, false)?;
    let (iv, ov) = (views(&ins), views(&outs));
    let bytes = req.size_bytes();
    let n = comm.ranks();
    let copy_len = usize::try_from(bytes).context("the size does not fit in memory")?;
    let src: Vec<DeviceBuffer<u8>> = (0..n)
        .map(|r| comm.alloc(r, copy_len))
        .collect::<Result<_, _>>()?;
    let dst: Vec<DeviceBuffer<u8>> = (0..n)
        .map(|r| comm.alloc(r, copy_len))
        .collect::<Result<_, _>>()?;
    let collective = || -> Result<()> { Ok(comm.launch_request(req, &iv, &ov)?.wait()?) };
    let memcpy = || -> Result<()> {
        let mut g = comm.group();
        for r in 0..n {
            g.send(&src[r], r, r)?;
            g.recv(&dst[r], r, r)?;
        }
        Ok(g.launch()?.wait()?)
    };
    for _ in 0..call.warmup {
        collective()?;
        memcpy()?;
    }
    let (mut t_coll, mut t_copy) = (0.0, 0.0);
    for _ in 0..call.iters {
        let t = Instant::now();
        collective()?;
        t_coll += t.elapsed().as_secs_f64();
        let t = Instant::now();
        memcpy()?;
        t_copy += t.elapsed().as_secs_f64();
    }
    let wrong = if call.check {
        let outs: Vec<Vec<T>> = outs.iter().map(|b| b.to_vec()).collect::<Result<_, _>>()?;
        Some(count_wrong_in(req, &outs)?)
    } else {
        None
    };
    let per = |t: f64| t / f64::from(call.iters);
    Ok(Measurement {
        secs: per(t_coll),
        wrong,
        copy_secs: Some(per(t_copy)),
        ..Measurement::default()
    })
}
