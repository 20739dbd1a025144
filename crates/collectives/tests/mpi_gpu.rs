//! MPI tests of GPU ranks (`MpiGpu`: the typed collectives on cudarc buffers, one process per
//! rank); run under mpirun by `scripts/test-mpi`:
//!
//! ```text
//! mpirun -n 4 mpi_gpu [mpi|nccl]
//! ```
//!
//! - Always: the GPU ranks' protocol on the host backend (`MpiGpu::host`: buffers lent to a
//!   backend, mirrors, staging, the runner's synchronization points) in both transfer modes,
//!   every collective and send/recv on host slices compared with the exact result, plan
//!   reuse, a count mismatch on every rank and on a send/recv pair; a send whose first-use
//!   allocation fails on the sender only (`HostBackend::with_allocation_limit`) is an error on
//!   both ranks of the pair, and the communicator still runs.
//! - Without a CUDA driver: making a GPU rank with either transport returns
//!   `CudaError::NoDriver` on every rank (no panic, no hang), and the communicator's host
//!   collectives still run afterwards.
//! - With GPUs (each process on CUDA device `local rank % visible`, so several ranks share a
//!   GPU when there are fewer GPUs than ranks; NCCL needs one rank per GPU): every collective
//!   on `CudaSlice` buffers, out of place and in place, compared element for element with the
//!   exact result; an all_reduce followed at once (no host synchronization) by a kernel on the
//!   caller's stream that doubles the result, which must see the sum; a repeated call reuses
//!   its plan; a rank passing another count gives `CountMismatch` on every rank and a correct
//!   call then still runs; host memory passed by one rank is its error and `Peer` elsewhere.
//!
//! Rank 0 prints `PASS <name>` / `FAIL <name>` per check and `<N> passed, <F> failed`; the
//! exit status is 1 when a check failed.

use std::sync::Arc;

mod mpi_common;

use mpi_common::{Report, fill as input, value};

use relaycc_collectives::cuda::{self, CudaError};
use relaycc_collectives::cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use relaycc_collectives::mpi::rsmpi;
use relaycc_collectives::mpi::{GpuTransport, MpiCommunicator, MpiError, MpiGpu, TransferMode};
use relaycc_collectives::{Collectives, CollectivesError, Element, HostBackend, ReduceOp};

/// The MPI error behind a call's error, if it is one.
fn mpi_error(r: &Result<(), CollectivesError>) -> Option<&MpiError> {
    match r {
        Err(CollectivesError::Mpi(e)) => Some(e),
        _ => None,
    }
}
use rsmpi::topology::SimpleCommunicator;
use rsmpi::traits::*;

fn no_driver(mut comm: &MpiCommunicator, rep: &mut Report<'_>) {
    for t in [GpuTransport::Mpi, GpuTransport::Nccl] {
        let got = MpiGpu::new(comm, 0, t);
        let ok = matches!(
            got,
            Err(MpiError::Backend(CollectivesError::Cuda(
                CudaError::NoDriver { .. }
            )))
        );
        if !ok {
            eprintln!("rank {}: {:?}", comm.rank(), got.err());
        }
        rep.check(
            &format!("no driver: GPU rank over {} is NoDriver", t.name()),
            ok,
        );
    }
    let mut x = vec![comm.rank() as f32; 17];
    let ran = comm.all_reduce_in_place(&mut x, ReduceOp::Sum);
    let n = (comm.ranks() as u32) as f32;
    let want = n * (n - 1.0) / 2.0;
    rep.check(
        "no driver: host collectives still run",
        ran.is_ok() && x.iter().all(|v| *v == want),
    );
}

/// The GPU ranks' protocol on the host backend (`MpiGpu::host`): every collective on host
/// slices, compared with the exact result, in the communicator's transfer mode `label`.
fn host_checks(comm: &MpiCommunicator, label: &str, rep: &mut Report<'_>) {
    let me = comm.rank() as u32;
    let n = comm.ranks() as u32;
    let nu = n as usize;
    let mut gpu = match MpiGpu::host(comm) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("rank {me}: host-backed rank: {e}");
            rep.check(&format!("{label}: host-backed rank made"), false);
            return;
        }
    };
    let sum = |len: usize| -> Vec<i64> {
        (0..len)
            .map(|i| (0..n).map(|r| value(r, i)).sum())
            .collect()
    };
    for len in [1003usize, (1 << 18) + 5] {
        let send = input::<f32>(me, len);
        let mut recv = vec![0f32; len];
        let ran = gpu.on_host().all_reduce(&send, &mut recv, ReduceOp::Sum);
        let want: Vec<f32> = sum(len).iter().map(|s| *s as f32).collect();
        if let Err(e) = &ran {
            eprintln!("rank {me}: all_reduce: {e}");
        }
        rep.check(
            &format!("{label}: all_reduce f32 x{len}"),
            ran.is_ok() && recv == want,
        );
    }
    let shapes = gpu.cached_calls();
    let mut recv = vec![0f32; 1003];
    let ran = gpu
        .on_host()
        .all_reduce(&input::<f32>(me, 1003), &mut recv, ReduceOp::Sum);
    rep.check(
        &format!("{label}: a repeated all_reduce reuses its plan"),
        ran.is_ok() && gpu.cached_calls() == shapes,
    );
    let mut buf = input::<i32>(me, 4097);
    let ran = gpu.on_host().all_reduce_in_place(&mut buf, ReduceOp::Max);
    let want: Vec<i32> = (0..4097)
        .map(|i| (0..n).map(|r| value(r, i)).max().unwrap_or(0) as i32)
        .collect();
    rep.check(
        &format!("{label}: all_reduce_in_place i32 max"),
        ran.is_ok() && buf == want,
    );
    let root = n - 1;
    let mut out = vec![0f64; 999];
    let ran = gpu.on_host().reduce(
        &input::<f64>(me, 999),
        (me == root).then_some(&mut out[..]),
        root as usize,
        ReduceOp::Sum,
    );
    let ok = me != root || out == sum(999).iter().map(|s| *s as f64).collect::<Vec<_>>();
    rep.check(
        &format!("{label}: reduce f64 to the last rank"),
        ran.is_ok() && ok,
    );
    let broot = 1 % n;
    let mut buf = if me == broot {
        input::<u8>(broot, 70_001)
    } else {
        vec![0u8; 70_001]
    };
    let ran = gpu.on_host().broadcast_in_place(&mut buf, broot as usize);
    rep.check(
        &format!("{label}: broadcast u8"),
        ran.is_ok() && buf == input::<u8>(broot, 70_001),
    );
    let c = 513;
    let want: Vec<f32> = (0..n).flat_map(|r| input::<f32>(r, c)).collect();
    let mut recv = vec![0f32; c * nu];
    let ran = gpu.on_host().all_gather(&input::<f32>(me, c), &mut recv);
    rep.check(
        &format!("{label}: all_gather f32"),
        ran.is_ok() && recv == want,
    );
    let mut buf = vec![0f32; c * nu];
    buf[me as usize * c..(me as usize + 1) * c].copy_from_slice(&input::<f32>(me, c));
    let ran = gpu.on_host().all_gather_in_place(&mut buf);
    rep.check(
        &format!("{label}: all_gather_in_place f32"),
        ran.is_ok() && buf == want,
    );
    let counts: Vec<usize> = (0..nu).map(|r| r + 1).collect();
    let total: usize = counts.iter().sum();
    let want: Vec<i64> = (0..n)
        .flat_map(|r| input::<i64>(r, r as usize + 1))
        .collect();
    let mut recv = vec![0i64; total];
    let ran = gpu
        .on_host()
        .all_gather_v(&input::<i64>(me, me as usize + 1), &mut recv, &counts);
    rep.check(
        &format!("{label}: all_gather_v i64"),
        ran.is_ok() && recv == want,
    );
    let c = 777;
    let mut recv = vec![0f32; c];
    let ran = gpu
        .on_host()
        .reduce_scatter(&input::<f32>(me, c * nu), &mut recv, ReduceOp::Sum);
    let want: Vec<f32> = sum(c * nu)[me as usize * c..(me as usize + 1) * c]
        .iter()
        .map(|s| *s as f32)
        .collect();
    rep.check(
        &format!("{label}: reduce_scatter f32"),
        ran.is_ok() && recv == want,
    );
    let c = 301;
    let mut recv = vec![0i32; c * nu];
    let ran = gpu
        .on_host()
        .all_to_all(&input::<i32>(me, c * nu), &mut recv);
    let want: Vec<i32> = (0..n)
        .flat_map(|s| input::<i32>(s, c * nu)[me as usize * c..(me as usize + 1) * c].to_vec())
        .collect();
    rep.check(
        &format!("{label}: all_to_all i32"),
        ran.is_ok() && recv == want,
    );
    let c = 259;
    let mut recv = vec![0u32; c * nu];
    let ran = gpu
        .on_host()
        .gather(&input::<u32>(me, c), (me == 0).then_some(&mut recv[..]), 0);
    let want: Vec<u32> = (0..n).flat_map(|r| input::<u32>(r, c)).collect();
    rep.check(
        &format!("{label}: gather u32"),
        ran.is_ok() && (me != 0 || recv == want),
    );
    let whole = input::<u32>(0, c * nu);
    let mut part = vec![0u32; c];
    let ran = gpu
        .on_host()
        .scatter((me == 0).then_some(&whole[..]), &mut part, 0);
    rep.check(
        &format!("{label}: scatter u32"),
        ran.is_ok() && part == whole[me as usize * c..(me as usize + 1) * c],
    );
    front_door_forms(&mut gpu, label, rep);
    // send/recv in pairs (2k to 2k+1), then a pair whose counts differ.
    let partner = me ^ 1;
    let pair = if partner < n {
        let ran = if me.is_multiple_of(2) {
            gpu.on_host()
                .send(&input::<f64>(me, 5000), partner as usize)
        } else {
            let mut got = vec![0f64; 5000];
            let r = gpu.on_host().recv(&mut got, partner as usize);
            r.and_then(|()| {
                if got == input::<f64>(partner, 5000) {
                    Ok(())
                } else {
                    Err(CollectivesError::Setup("wrong data".into()))
                }
            })
        };
        if let Err(e) = &ran {
            eprintln!("rank {me}: send/recv: {e}");
        }
        let got = if me.is_multiple_of(2) {
            gpu.on_host().send(&[1u32; 10][..], partner as usize)
        } else {
            gpu.on_host().recv(&mut [0u32; 11][..], partner as usize)
        };
        (
            ran.is_ok(),
            matches!(mpi_error(&got), Some(MpiError::CountMismatch(_))),
        )
    } else {
        (true, true)
    };
    rep.check(&format!("{label}: send/recv pairs f64"), pair.0);
    rep.check(
        &format!("{label}: a send/recv pair with other counts is CountMismatch on both"),
        pair.1,
    );
    let len = if me == 0 { 101 } else { 100 };
    let mut recv = vec![0f32; len];
    let got = gpu
        .on_host()
        .all_reduce(&vec![1f32; len], &mut recv, ReduceOp::Sum);
    rep.check(
        &format!("{label}: another count on rank 0 is CountMismatch on every rank"),
        matches!(mpi_error(&got), Some(MpiError::CountMismatch(_))),
    );
    let mut recv = vec![0f32; 100];
    let ran = gpu
        .on_host()
        .all_reduce(&vec![1f32; 100], &mut recv, ReduceOp::Sum);
    rep.check(
        &format!("{label}: a correct call after the mismatch"),
        ran.is_ok() && recv == vec![n as f32; 100],
    );
}

const TWICE: &str = r#"
extern "C" __global__ void twice(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
"#;

/// The forms of the one front door ([`Collectives`]) that MPI ranks map onto their calls:
/// a broadcast out of place, reduce and gather in place, a group of two collectives, a tag
/// that differs on one rank, and an in-place form MPI refuses on every rank.
fn front_door_forms(gpu: &mut MpiGpu<'_>, label: &str, rep: &mut Report<'_>) {
    let me = gpu.comm().rank();
    let n = gpu.comm().ranks();
    let mut on = gpu.on_host();
    let root = n - 1;
    let send = input::<i32>(root as u32, 1001);
    let mut recv = vec![0i32; 1001];
    let ran = on.broadcast((me == root).then_some(&send[..]), &mut recv[..], root);
    rep.check(
        &format!("{label}: broadcast out of place i32"),
        ran.is_ok() && recv == send,
    );
    let mut buf = input::<f64>(me as u32, 517);
    let ran = on.reduce_in_place(&mut buf[..], 0, ReduceOp::Sum);
    let want: Vec<f64> = (0..517)
        .map(|i| (0..n as u32).map(|r| value(r, i)).sum::<i64>() as f64)
        .collect();
    rep.check(
        &format!("{label}: reduce_in_place f64 to rank 0"),
        ran.is_ok() && (me != 0 || buf == want),
    );
    let c = 33;
    let mut buf = if me == 0 {
        let mut b = vec![0u32; c * n];
        b[..c].copy_from_slice(&input::<u32>(0, c));
        b
    } else {
        input::<u32>(me as u32, c)
    };
    let ran = on.gather_in_place(&mut buf[..], 0);
    let want: Vec<u32> = (0..n as u32).flat_map(|r| input::<u32>(r, c)).collect();
    rep.check(
        &format!("{label}: gather_in_place u32 to rank 0"),
        ran.is_ok() && (me != 0 || buf == want),
    );
    let (mut a, mut b) = (vec![1f32; 64], vec![2f32; 128]);
    let mut g = on.group();
    g.all_reduce_in_place(&mut a[..], ReduceOp::Sum)
        .all_reduce_in_place(&mut b[..], ReduceOp::Max);
    let ran = g.launch();
    rep.check(
        &format!("{label}: a group of two all_reduces runs both"),
        ran.is_ok() && a.iter().all(|x| *x == n as f32) && b.iter().all(|x| *x == 2.0),
    );
    // Rank 0 tags its call 8, the others 7: every rank fails, nothing moves.
    on.tag_next(if me == 0 { 8 } else { 7 });
    let mut buf = vec![1f32; 16];
    let got = on.all_reduce_in_place(&mut buf[..], ReduceOp::Sum);
    rep.check(
        &format!("{label}: a tag that differs on rank 0 is a mismatch on every rank"),
        matches!(mpi_error(&got), Some(MpiError::CallMismatch(_))) && buf == vec![1f32; 16],
    );
    let mut buf = vec![0f32; 4 * n];
    let got = on.scatter_in_place(&mut buf[..], 0);
    rep.check(
        &format!("{label}: scatter_in_place is refused on every rank"),
        got.is_err(),
    );
    let ran = on.all_reduce_in_place(&mut buf[..], ReduceOp::Sum);
    rep.check(
        &format!("{label}: the next call after the refusals runs"),
        ran.is_ok(),
    );
}

/// A device copy of `v` (at least one element, so no allocation is empty).
fn dev<T: Element + DeviceRepr>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    let padded: Vec<T> = if v.is_empty() {
        vec![T::from_i64(0)]
    } else {
        v.to_vec()
    };
    s.clone_htod(&padded).expect("upload")
}

fn host<T: Element + DeviceRepr>(s: &Arc<CudaStream>, d: &CudaSlice<T>, len: usize) -> Vec<T> {
    let mut out = s.clone_dtoh(d).expect("download");
    out.truncate(len);
    out
}

fn gpu_checks(
    comm: &MpiCommunicator,
    world: &SimpleCommunicator,
    t: GpuTransport,
    rep: &mut Report<'_>,
) {
    let me = comm.rank() as u32;
    let n = comm.ranks() as u32;
    let nu = n as usize;
    let local = world.split_shared(world.rank()).rank() as usize;
    let visible = cuda::devices().map_or(1, |d| d.len().max(1));
    let ordinal = local % visible;
    let mut gpu = match MpiGpu::new(comm, ordinal, t) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("rank {me}: GPU rank: {e}");
            rep.check("GPU rank made", false);
            return;
        }
    };
    rep.check("GPU rank made", true);
    let ctx = CudaContext::new(ordinal).expect("context");
    let stream = ctx.new_stream().expect("stream");
    let sum = |len: usize| -> Vec<i64> {
        (0..len)
            .map(|i| (0..n).map(|r| value(r, i)).sum())
            .collect()
    };

    // all_reduce, then at once a kernel on the same stream: it sees the sum.
    for len in [1003usize, (1 << 20) + 5] {
        let f = ctx
            .load_module(relaycc_collectives::cudarc::nvrtc::compile_ptx(TWICE).expect("nvrtc"))
            .expect("module")
            .load_function("twice")
            .expect("function");
        let send = dev(&stream, &input::<f32>(me, len));
        let mut recv = dev(&stream, &vec![0f32; len]);
        let ran = gpu.on(&stream).all_reduce(&send, &mut recv, ReduceOp::Sum);
        let ni = len as i32;
        let mut b = stream.launch_builder(&f);
        b.arg(&mut recv).arg(&ni);
        // SAFETY: `twice` takes a float pointer and an int, and reads and writes `n` floats.
        unsafe { b.launch(LaunchConfig::for_num_elems(len as u32)) }.expect("launch");
        let got = host(&stream, &recv, len);
        let want: Vec<f32> = sum(len).iter().map(|s| 2.0 * *s as f32).collect();
        if let Err(e) = &ran {
            eprintln!("rank {me}: all_reduce: {e}");
        }
        rep.check(
            &format!("all_reduce f32 x{len}, then a kernel on the stream sees it"),
            ran.is_ok() && got == want,
        );
    }
    let shapes = gpu.cached_calls();
    {
        let send = dev(&stream, &input::<f32>(me, 1003));
        let mut recv = dev(&stream, &vec![0f32; 1003]);
        let ran = gpu.on(&stream).all_reduce(&send, &mut recv, ReduceOp::Sum);
        rep.check(
            "a repeated all_reduce reuses its plan",
            ran.is_ok() && gpu.cached_calls() == shapes,
        );
    }

    // all_reduce in place, max, i32.
    {
        let len = 4097;
        let mut buf = dev(&stream, &input::<i32>(me, len));
        let ran = gpu.on(&stream).all_reduce_in_place(&mut buf, ReduceOp::Max);
        let want: Vec<i32> = (0..len)
            .map(|i| (0..n).map(|r| value(r, i)).max().unwrap_or(0) as i32)
            .collect();
        rep.check(
            "all_reduce_in_place i32 max",
            ran.is_ok() && host(&stream, &buf, len) == want,
        );
    }

    // reduce to the last rank, f64 sum; the others pass no output.
    {
        let len = 999;
        let root = n - 1;
        let send = dev(&stream, &input::<f64>(me, len));
        let mut recv = dev(&stream, &vec![0f64; len]);
        let out = (me == root).then_some(&mut recv);
        let ran = gpu
            .on(&stream)
            .reduce(&send, out, root as usize, ReduceOp::Sum);
        let ok = if me == root {
            host(&stream, &recv, len) == sum(len).iter().map(|s| *s as f64).collect::<Vec<_>>()
        } else {
            true
        };
        rep.check("reduce f64 sum to the last rank", ran.is_ok() && ok);
    }

    // broadcast from rank 1 (mod n), u8.
    {
        let len = 70_001;
        let root = 1 % n;
        let mine: Vec<u8> = if me == root {
            input::<u8>(root, len)
        } else {
            vec![0; len]
        };
        let mut buf = dev(&stream, &mine);
        let ran = gpu.on(&stream).broadcast_in_place(&mut buf, root as usize);
        rep.check(
            "broadcast u8",
            ran.is_ok() && host(&stream, &buf, len) == input::<u8>(root, len),
        );
    }

    // all_gather, out of place and in place.
    {
        let c = 513;
        let want: Vec<f32> = (0..n).flat_map(|r| input::<f32>(r, c)).collect();
        let send = dev(&stream, &input::<f32>(me, c));
        let mut recv = dev(&stream, &vec![0f32; c * nu]);
        let ran = gpu.on(&stream).all_gather(&send, &mut recv);
        rep.check(
            "all_gather f32",
            ran.is_ok() && host(&stream, &recv, c * nu) == want,
        );
        let mut start = vec![0f32; c * nu];
        start[me as usize * c..(me as usize + 1) * c].copy_from_slice(&input::<f32>(me, c));
        let mut buf = dev(&stream, &start);
        let ran = gpu.on(&stream).all_gather_in_place(&mut buf);
        rep.check(
            "all_gather_in_place f32",
            ran.is_ok() && host(&stream, &buf, c * nu) == want,
        );
    }

    // all_gather_v: rank r gives r + 1 elements.
    {
        let counts: Vec<usize> = (0..nu).map(|r| r + 1).collect();
        let total: usize = counts.iter().sum();
        let want: Vec<i64> = (0..n)
            .flat_map(|r| input::<i64>(r, r as usize + 1))
            .collect();
        let send = dev(&stream, &input::<i64>(me, me as usize + 1));
        let mut recv = dev(&stream, &vec![0i64; total]);
        let ran = gpu.on(&stream).all_gather_v(&send, &mut recv, &counts);
        rep.check(
            "all_gather_v i64",
            ran.is_ok() && host(&stream, &recv, total) == want,
        );
    }

    // reduce_scatter, f32 sum.
    {
        let c = 777;
        let send = dev(&stream, &input::<f32>(me, c * nu));
        let mut recv = dev(&stream, &vec![0f32; c]);
        let ran = gpu
            .on(&stream)
            .reduce_scatter(&send, &mut recv, ReduceOp::Sum);
        let full = sum(c * nu);
        let want: Vec<f32> = full[me as usize * c..(me as usize + 1) * c]
            .iter()
            .map(|s| *s as f32)
            .collect();
        rep.check(
            "reduce_scatter f32 sum",
            ran.is_ok() && host(&stream, &recv, c) == want,
        );
    }

    // all_to_all, i32.
    {
        let c = 301;
        let send = dev(&stream, &input::<i32>(me, c * nu));
        let mut recv = dev(&stream, &vec![0i32; c * nu]);
        let ran = gpu.on(&stream).all_to_all(&send, &mut recv);
        let want: Vec<i32> = (0..n)
            .flat_map(|s| input::<i32>(s, c * nu)[me as usize * c..(me as usize + 1) * c].to_vec())
            .collect();
        rep.check(
            "all_to_all i32",
            ran.is_ok() && host(&stream, &recv, c * nu) == want,
        );
    }

    // gather to rank 0 and scatter from rank 0, u32.
    {
        let c = 259;
        let send = dev(&stream, &input::<u32>(me, c));
        let mut recv = dev(&stream, &vec![0u32; c * nu]);
        let out = (me == 0).then_some(&mut recv);
        let ran = gpu.on(&stream).gather(&send, out, 0);
        let want: Vec<u32> = (0..n).flat_map(|r| input::<u32>(r, c)).collect();
        let ok = me != 0 || host(&stream, &recv, c * nu) == want;
        rep.check("gather u32", ran.is_ok() && ok);
        let whole = dev(&stream, &input::<u32>(0, c * nu));
        let mut part = dev(&stream, &vec![0u32; c]);
        let inp = (me == 0).then_some(&whole);
        let ran = gpu.on(&stream).scatter(inp, &mut part, 0);
        let want = input::<u32>(0, c * nu)[me as usize * c..(me as usize + 1) * c].to_vec();
        rep.check(
            "scatter u32",
            ran.is_ok() && host(&stream, &part, c) == want,
        );
    }

    // send/recv in pairs (2k to 2k+1).
    let partner = me ^ 1;
    let pair = if partner < n {
        let ran = if me.is_multiple_of(2) {
            let buf = dev(&stream, &input::<f64>(me, 5000));
            gpu.on(&stream).send(&buf, partner as usize)
        } else {
            let mut buf = dev(&stream, &vec![0f64; 5000]);
            let r = gpu.on(&stream).recv(&mut buf, partner as usize);
            r.and_then(|()| {
                if host(&stream, &buf, 5000) == input::<f64>(partner, 5000) {
                    Ok(())
                } else {
                    Err(CollectivesError::Setup("wrong data".into()))
                }
            })
        };
        let host_send = [1f64; 10];
        let got = if me.is_multiple_of(2) {
            gpu.on(&stream).send(&host_send[..], partner as usize)
        } else {
            let mut buf = dev(&stream, &[0f64; 10]);
            gpu.on(&stream).recv(&mut buf, partner as usize)
        };
        let fault = if me.is_multiple_of(2) {
            matches!(mpi_error(&got), Some(MpiError::Unsupported(_)))
        } else {
            matches!(mpi_error(&got), Some(MpiError::CountMismatch(_)))
        };
        ran.is_ok() && fault
    } else {
        true
    };
    rep.check(
        "send/recv pairs f64; a sender's host memory is its error and a mismatch at the receiver",
        pair,
    );

    // Faults: another count on rank 0; host memory on rank 0.
    {
        let len = if me == 0 { 101 } else { 100 };
        let send = dev(&stream, &vec![1f32; len]);
        let mut recv = dev(&stream, &vec![0f32; len]);
        let got = gpu.on(&stream).all_reduce(&send, &mut recv, ReduceOp::Sum);
        rep.check(
            "another count on rank 0 is CountMismatch on every rank",
            matches!(mpi_error(&got), Some(MpiError::CountMismatch(_))),
        );
        let send = dev(&stream, &vec![1f32; 100]);
        let mut recv = dev(&stream, &vec![0f32; 100]);
        let host_send = vec![1f32; 100];
        let got = if me == 0 {
            gpu.on(&stream)
                .all_reduce(&host_send[..], &mut recv, ReduceOp::Sum)
        } else {
            gpu.on(&stream).all_reduce(&send, &mut recv, ReduceOp::Sum)
        };
        let ok = if me == 0 {
            matches!(mpi_error(&got), Some(MpiError::Unsupported(_)))
        } else {
            matches!(mpi_error(&got), Some(MpiError::Peer { rank: 0, .. }))
        };
        rep.check("host memory on rank 0: its error there, Peer elsewhere", ok);
        let ran = gpu.on(&stream).all_reduce(&send, &mut recv, ReduceOp::Sum);
        rep.check(
            "a correct call after the faults",
            ran.is_ok() && host(&stream, &recv, 100) == vec![n as f32; 100],
        );
    }
}

/// Rank 1's backend allows no allocation, so its first-use preparation of a send to rank 0
/// fails while rank 0's succeeds: both ranks of the pair get an error (the pair agrees on the
/// preparation's outcome before data moves), within the communicator's timeout, and the
/// communicator still runs a collective afterwards.
fn one_sided_allocation_failure(mut comm: &MpiCommunicator, rep: &mut Report<'_>) {
    let me = comm.rank() as u32;
    let n = comm.ranks() as u32;
    if n < 2 {
        return;
    }
    let backend = if me == 1 {
        HostBackend::with_allocation_limit(0)
    } else {
        HostBackend::new()
    };
    let mut gpu = match MpiGpu::host_on(comm, Arc::new(backend)) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("rank {me}: host-backed rank: {e}");
            rep.check("allocation failure: host-backed ranks made", false);
            return;
        }
    };
    let start = std::time::Instant::now();
    let ran = match me {
        1 => gpu.on_host().send(&input::<f32>(me, 4096)[..], 0),
        0 => gpu.on_host().recv(&mut vec![0f32; 4096][..], 1),
        _ => Err(CollectivesError::Setup("not in the pair".into())),
    };
    if me <= 1 {
        match &ran {
            Err(e) => eprintln!("rank {me}: one-sided allocation failure: {e}"),
            Ok(()) => eprintln!("rank {me}: the send/recv ran although rank 1 cannot allocate"),
        }
    }
    // Rank 1 has its backend's error; rank 0 is told that rank 1 failed its preparation.
    // A backend's error comes back as itself, not wrapped in an MPI error.
    let right = match (me, mpi_error(&ran), &ran) {
        (0, Some(MpiError::Peer { rank: 1, .. }), _) => true,
        (1, None, Err(_)) => true,
        (0 | 1, _, _) => false,
        _ => true,
    };
    rep.check(
        "allocation failure on one side of a send/recv: an error on both, in bounded time",
        right && start.elapsed() < std::time::Duration::from_secs(60),
    );
    let mut x = vec![me as f32; 8];
    let after = comm.all_reduce_in_place(&mut x, ReduceOp::Sum);
    let want = (n * (n - 1) / 2) as f32;
    rep.check(
        "allocation failure on one side of a send/recv: the communicator still runs",
        after.is_ok() && x.iter().all(|v| *v == want),
    );
}

fn main() {
    let universe = mpi_common::universe();
    let world = universe.world();
    let transport = match std::env::args().nth(1).as_deref().unwrap_or("mpi").parse() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut comm = mpi_common::communicator(&world);
    let mut rep = Report::new(&world);
    for mode in [TransferMode::Staged, TransferMode::Direct] {
        comm.set_transfer(mode);
        host_checks(&comm, &format!("host backend, {mode:?}"), &mut rep);
    }
    one_sided_allocation_failure(&comm, &mut rep);
    comm.set_transfer(if comm.cuda_aware() {
        TransferMode::Direct
    } else {
        TransferMode::Staged
    });
    if cuda::driver().is_err() {
        no_driver(&comm, &mut rep);
    } else {
        gpu_checks(&comm, &world, transport, &mut rep);
    }
    rep.summary();
    let failed = rep.failed;
    // MPI finalizes when `universe` drops: the communicator's own communicators go first.
    drop(comm);
    drop(universe);
    if failed > 0 {
        std::process::exit(1);
    }
}
