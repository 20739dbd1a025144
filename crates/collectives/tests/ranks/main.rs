//! The per-rank API ([`RankComm`]) with one thread per rank on the host backend: every
//! collective x element type x op x in place or not against a reference written here
//! (property-tested, exact for integers), send/recv, every kind of mismatch failing on every
//! rank, a missing rank timing out, ranks arriving at successive calls in random order after
//! random delays, groups of sends and receives and mixed groups (`pairs.rs`), and split
//! (`split.rs`).

use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use relaycc_collectives::{Collectives, CollectivesError, Element, RankComm, ReduceOp, bf16, f16};
use relaycc_route::{Collective, DType};

mod direct;
mod flags;
mod pairs;
mod split;

/// Run `f` on every rank, one thread each; the results in rank order.
fn on_ranks<R: Send>(ranks: Vec<RankComm>, f: impl Fn(RankComm) -> R + Sync) -> Vec<R> {
    thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|r| {
                let f = &f;
                s.spawn(move || f(r))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// One collective call as every rank makes it.
#[derive(Debug, Clone)]
struct Case {
    coll: Collective,
    dtype: DType,
    op: ReduceOp,
    in_place: bool,
    n: usize,
    count: usize,
    root: usize,
    /// all_gather_v and reduce_scatter_v counts; all_to_all_v matrix (row = sender).
    counts: Vec<usize>,
    matrix: Vec<Vec<usize>>,
}

fn unsigned(d: DType) -> bool {
    matches!(d, DType::U8 | DType::U32 | DType::U64)
}

/// Input element `i` of rank `r`: -3..=3 (0..=6 for unsigned types), so sums and products of
/// up to five ranks are exact even in bf16, and min/max order the same in i64 and in `T`.
fn value(c: &Case, r: usize, i: usize) -> i64 {
    let v = ((r * 3 + i * 5 + 1) % 7) as i64;
    if unsigned(c.dtype) { v } else { v - 3 }
}

fn input_len(c: &Case, r: usize) -> usize {
    let (n, k) = (c.n, c.count);
    match c.coll {
        Collective::AllReduce | Collective::Reduce | Collective::AllGather | Collective::Gather => {
            k
        }
        Collective::Broadcast => k,
        Collective::AllGatherV => c.counts[r],
        Collective::ReduceScatterV => c.counts.iter().sum(),
        Collective::ReduceScatter | Collective::AllToAll | Collective::Scatter => n * k,
        Collective::AllToAllV => c.matrix[r].iter().sum(),
        Collective::SendRecv => k,
    }
}

fn output_len(c: &Case, r: usize) -> usize {
    let (n, k) = (c.n, c.count);
    match c.coll {
        Collective::AllReduce | Collective::Reduce | Collective::Broadcast => k,
        Collective::ReduceScatter | Collective::Scatter => k,
        Collective::ReduceScatterV => c.counts[r],
        Collective::AllGather | Collective::AllToAll | Collective::Gather => n * k,
        Collective::AllGatherV => c.counts.iter().sum(),
        Collective::AllToAllV => c.matrix.iter().map(|row| row[r]).sum(),
        Collective::SendRecv => k,
    }
}

/// What an output element must hold: an exact integer (wrapped into `T`) or, for `avg`, a
/// real number.
#[derive(Debug, Clone, Copy)]
enum Want {
    Exact(i64),
    Real(f64),
}

fn fold(c: &Case, vals: &[i64]) -> Want {
    match c.op {
        ReduceOp::Sum => Want::Exact(vals.iter().fold(0i64, |a, b| a.wrapping_add(*b))),
        ReduceOp::Prod => Want::Exact(vals.iter().fold(1i64, |a, b| a.wrapping_mul(*b))),
        ReduceOp::Min => Want::Exact(vals.iter().copied().min().unwrap_or(0)),
        ReduceOp::Max => Want::Exact(vals.iter().copied().max().unwrap_or(0)),
        ReduceOp::Avg => Want::Real(vals.iter().sum::<i64>() as f64 / vals.len() as f64),
    }
}

/// The reference: what rank `r`'s output must hold (`None`: the rank has no output).
fn reference(c: &Case, r: usize) -> Option<Vec<Want>> {
    let (n, k) = (c.n, c.count);
    let x = |s: usize, i: usize| value(c, s, i);
    let all = |i: &dyn Fn(usize) -> usize| fold(c, &(0..n).map(|s| x(s, i(s))).collect::<Vec<_>>());
    let e = Want::Exact;
    Some(match c.coll {
        Collective::AllReduce => (0..k).map(|i| all(&|_| i)).collect(),
        Collective::Reduce if r == c.root => (0..k).map(|i| all(&|_| i)).collect(),
        Collective::Reduce => return None,
        Collective::Gather if r == c.root => (0..n * k)
            .map(|j| e(x(j / k.max(1), j % k.max(1))))
            .collect(),
        Collective::Gather => return None,
        Collective::Broadcast => (0..k).map(|i| e(x(c.root, i))).collect(),
        Collective::AllGather => (0..n * k)
            .map(|j| e(x(j / k.max(1), j % k.max(1))))
            .collect(),
        Collective::AllGatherV => (0..n)
            .flat_map(|s| (0..c.counts[s]).map(move |i| (s, i)))
            .map(|(s, i)| e(x(s, i)))
            .collect(),
        Collective::ReduceScatter => (0..k).map(|i| all(&|_| r * k + i)).collect(),
        Collective::ReduceScatterV => {
            let displ: usize = c.counts[..r].iter().sum();
            (0..c.counts[r]).map(|i| all(&|_| displ + i)).collect()
        }
        Collective::AllToAll => (0..n * k)
            .map(|j| e(x(j / k.max(1), r * k + j % k.max(1))))
            .collect(),
        Collective::AllToAllV => (0..n)
            .flat_map(|s| {
                let displ: usize = c.matrix[s][..r].iter().sum();
                (0..c.matrix[s][r]).map(move |i| (s, displ + i))
            })
            .map(|(s, i)| e(x(s, i)))
            .collect(),
        Collective::Scatter => (0..k).map(|i| e(x(c.root, r * k + i))).collect(),
        Collective::SendRecv => (0..k).map(|i| e(x((r + n - 1) % n, i))).collect(),
    })
}

const SENTINEL: i64 = 5;

/// Rank `r`'s part of case `c` on `rank`: its output, if any.
fn rank_call<T: Element>(
    c: &Case,
    rank: &mut RankComm,
) -> Result<Option<Vec<T>>, CollectivesError> {
    let r = rank.rank();
    let (n, k) = (c.n, c.count);
    let input: Vec<T> = (0..input_len(c, r))
        .map(|i| T::from_i64(value(c, r, i)))
        .collect();
    let mut out: Vec<T> = vec![T::from_i64(SENTINEL); output_len(c, r)];
    let root = r == c.root;
    let counts = &c.counts;
    if c.in_place {
        let mut buf = input.clone();
        return Ok(match c.coll {
            Collective::AllReduce => {
                rank.all_reduce_in_place(&mut buf, c.op)?;
                Some(buf)
            }
            Collective::Reduce => {
                rank.reduce_in_place(&mut buf, c.root, c.op)?;
                root.then_some(buf)
            }
            Collective::Broadcast => {
                if !root {
                    buf = out;
                }
                rank.broadcast_in_place(&mut buf, c.root)?;
                Some(buf)
            }
            Collective::AllGather => {
                out[r * k..(r + 1) * k].copy_from_slice(&input);
                rank.all_gather_in_place(&mut out)?;
                Some(out)
            }
            Collective::AllGatherV => {
                let d: usize = counts[..r].iter().sum();
                out[d..d + counts[r]].copy_from_slice(&input);
                rank.all_gather_v_in_place(&mut out, counts)?;
                Some(out)
            }
            Collective::ReduceScatter => {
                rank.reduce_scatter_in_place(&mut buf, c.op)?;
                Some(buf[r * k..(r + 1) * k].to_vec())
            }
            Collective::ReduceScatterV => {
                let d: usize = counts[..r].iter().sum();
                rank.reduce_scatter_v_in_place(&mut buf, counts, c.op)?;
                Some(buf[d..d + counts[r]].to_vec())
            }
            Collective::Gather => {
                if root {
                    out[r * k..(r + 1) * k].copy_from_slice(&input);
                    rank.gather_in_place(&mut out, c.root)?;
                    Some(out)
                } else {
                    rank.gather_in_place(&mut buf, c.root)?;
                    None
                }
            }
            Collective::Scatter => {
                if root {
                    rank.scatter_in_place(&mut buf, c.root)?;
                    Some(buf[r * k..(r + 1) * k].to_vec())
                } else {
                    rank.scatter_in_place(&mut out, c.root)?;
                    Some(out)
                }
            }
            _ => unreachable!("no in-place form"),
        });
    }
    match c.coll {
        Collective::AllReduce => rank.all_reduce(&input, &mut out, c.op)?,
        Collective::Reduce => {
            rank.reduce(&input, root.then_some(&mut out[..]), c.root, c.op)?;
            if !root {
                return Ok(None);
            }
        }
        Collective::Broadcast => rank.broadcast(root.then_some(&input[..]), &mut out, c.root)?,
        Collective::AllGather => rank.all_gather(&input, &mut out)?,
        Collective::AllGatherV => rank.all_gather_v(&input, &mut out, counts)?,
        Collective::ReduceScatter => rank.reduce_scatter(&input, &mut out, c.op)?,
        Collective::ReduceScatterV => rank.reduce_scatter_v(&input, &mut out, counts, c.op)?,
        Collective::AllToAll => rank.all_to_all(&input, &mut out)?,
        Collective::AllToAllV => {
            let col: Vec<usize> = c.matrix.iter().map(|row| row[r]).collect();
            rank.all_to_all_v(&input, &c.matrix[r], &mut out, &col)?
        }
        Collective::Gather => {
            rank.gather(&input, root.then_some(&mut out[..]), c.root)?;
            if !root {
                return Ok(None);
            }
        }
        Collective::Scatter => rank.scatter(root.then_some(&input[..]), &mut out, c.root)?,
        Collective::SendRecv => {
            // A ring in one group: send to the next rank, receive from the previous one.
            let mut g = rank.group();
            g.send(&input, (r + 1) % n).recv(&mut out, (r + n - 1) % n);
            g.launch()?;
        }
    }
    Ok(Some(out))
}

fn compare<T: Element>(c: &Case, r: usize, got: &Option<Vec<T>>) -> Result<(), String> {
    let want = reference(c, r);
    match (got, want) {
        (None, None) => Ok(()),
        (Some(g), Some(w)) => {
            if g.len() != w.len() {
                return Err(format!("rank {r}: {} elements, want {}", g.len(), w.len()));
            }
            for (i, (g, w)) in g.iter().zip(&w).enumerate() {
                let ok = match *w {
                    Want::Exact(v) => *g == T::from_i64(v),
                    Want::Real(v) => (g.to_f64() - v).abs() <= 1e-2 * v.abs().max(1.0),
                };
                if !ok {
                    return Err(format!("rank {r} element {i}: got {g:?}, want {w:?}"));
                }
            }
            Ok(())
        }
        (g, w) => Err(format!(
            "rank {r}: output {:?}, reference {:?}",
            g.is_some(),
            w.is_some()
        )),
    }
}

/// Run case `c` on fresh ranks, one thread each, and compare every rank's output.
fn run_case(c: &Case, ranks: Vec<RankComm>) -> Result<Vec<RankComm>, String> {
    let results = on_ranks(ranks, |mut rank| {
        let checked = call_and_compare(c, &mut rank);
        (rank, checked)
    });
    let mut back = Vec::new();
    for (rank, checked) in results {
        checked?;
        back.push(rank);
    }
    Ok(back)
}

const COLLECTIVES: [Collective; 12] = Collective::ALL;
const DTYPES: [DType; 10] = DType::ALL;
const OPS: [ReduceOp; 5] = ReduceOp::ALL;

fn has_in_place(c: Collective) -> bool {
    !matches!(
        c,
        Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv
    )
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (1usize..=5).prop_flat_map(case_on)
}

/// A case on `n` ranks.
fn case_on(n: usize) -> impl Strategy<Value = Case> {
    (
        0..COLLECTIVES.len(),
        0..DTYPES.len(),
        0..OPS.len(),
        any::<bool>(),
        0usize..24,
        any::<u64>(),
    )
        .prop_map(move |(ci, di, oi, in_place, count, seed)| {
            let coll = COLLECTIVES[ci];
            let dtype = DTYPES[di];
            let mut op = OPS[oi];
            if op == ReduceOp::Avg && !dtype.is_float() {
                op = ReduceOp::Sum;
            }
            let pick = |i: u64| ((seed >> (i % 60)) % 7) as usize;
            Case {
                coll,
                dtype,
                op,
                in_place: in_place && has_in_place(coll),
                n,
                count,
                root: (seed % n as u64) as usize,
                counts: (0..n as u64).map(pick).collect(),
                matrix: (0..n as u64)
                    .map(|s| (0..n as u64).map(|d| pick(s * 5 + d * 3 + 1)).collect())
                    .collect(),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any collective, element type, op, rank count and in-place choice: every rank's output
    /// equals the reference.
    #[test]
    fn per_rank_calls_match_the_reference(c in case_strategy()) {
        let ranks = RankComm::host(c.n as u32).expect("host ranks");
        if let Err(e) = run_case(&c, ranks) {
            prop_assert!(false, "{c:?}: {e}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Three calls in a row on the same ranks, each rank arriving at each call after a delay
    /// of its own (0 to 2 ms, so ranks arrive in every order): every output is exact.
    #[test]
    fn ranks_arriving_in_random_order_get_exact_results(
        (calls, delays) in (2usize..=5).prop_flat_map(|n| {
            (
                proptest::collection::vec(case_on(n), 3),
                proptest::collection::vec(0u64..2000, 3 * n),
            )
        })
    ) {
        let n = calls[0].n;
        let ranks = RankComm::host(n as u32).expect("host ranks");
        let errors: Vec<String> = on_ranks(ranks, |mut rank| {
            let r = rank.rank();
            for (k, c) in calls.iter().enumerate() {
                thread::sleep(Duration::from_micros(delays[k * n + r]));
                if let Err(e) = call_and_compare(c, &mut rank) {
                    return Some(format!("call {k} ({c:?}): {e}"));
                }
            }
            None
        })
        .into_iter()
        .flatten()
        .collect();
        prop_assert!(errors.is_empty(), "{errors:?}");
    }
}

/// One rank's call of `c` in `c`'s element type, its output compared with the reference.
fn call_and_compare(c: &Case, rank: &mut RankComm) -> Result<(), String> {
    fn typed<T: Element>(c: &Case, rank: &mut RankComm) -> Result<(), String> {
        let r = rank.rank();
        let got = rank_call::<T>(c, rank).map_err(|e| format!("rank {r}: {e}"))?;
        compare(c, r, &got)
    }
    match c.dtype {
        DType::F32 => typed::<f32>(c, rank),
        DType::F64 => typed::<f64>(c, rank),
        DType::F16 => typed::<f16>(c, rank),
        DType::Bf16 => typed::<bf16>(c, rank),
        DType::I8 => typed::<i8>(c, rank),
        DType::U8 => typed::<u8>(c, rank),
        DType::I32 => typed::<i32>(c, rank),
        DType::U32 => typed::<u32>(c, rank),
        DType::I64 => typed::<i64>(c, rank),
        DType::U64 => typed::<u64>(c, rank),
    }
}

/// Every collective x element type x op x in place or not, one after another on the same
/// three ranks (so sequence numbers and cached plans carry across calls).
#[test]
fn every_collective_type_and_op_on_one_communicator() {
    let mut ranks = RankComm::host(3).expect("host ranks");
    let mut calls = 0;
    for coll in COLLECTIVES {
        for dtype in DTYPES {
            for op in OPS {
                if !coll.reduces() && op != ReduceOp::Sum {
                    continue;
                }
                if op == ReduceOp::Avg && !dtype.is_float() {
                    continue;
                }
                for in_place in [false, true] {
                    if in_place && !has_in_place(coll) {
                        continue;
                    }
                    let c = Case {
                        coll,
                        dtype,
                        op,
                        in_place,
                        n: 3,
                        count: 5,
                        root: 2,
                        counts: vec![2, 0, 3],
                        matrix: vec![vec![1, 2, 0], vec![0, 3, 1], vec![2, 2, 2]],
                    };
                    ranks = run_case(&c, ranks).unwrap_or_else(|e| panic!("{c:?}: {e}"));
                    calls += 1;
                }
            }
        }
    }
    assert!(calls > 300, "{calls} calls");
}

/// Standalone send/recv: only the two ranks take part, the others stay out.
#[test]
fn send_and_recv_between_two_ranks() {
    let ranks = RankComm::host(3).expect("host ranks");
    let got = on_ranks(ranks, |mut rank| match rank.rank() {
        0 => rank.send(&[1u32, 2, 3], 2).map(|()| Vec::new()),
        2 => {
            let mut b = [0u32; 3];
            rank.recv(&mut b, 0).map(|()| b.to_vec())
        }
        _ => Ok(Vec::new()),
    });
    assert_eq!(got[2].as_ref().expect("recv"), &vec![1, 2, 3]);
    assert!(got[0].is_ok());
}

/// Every rank's error from `f` run on every rank of a fresh `n`-rank communicator with
/// timeout `t`. A rank whose own part needed nothing from the ranks that called otherwise
/// may finish its call (ranks in one host memory run their collectives without a
/// rendezvous); the abort then reaches it at its next call, which is made here.
fn errors(
    n: u32,
    t: Duration,
    f: impl Fn(&mut RankComm) -> Result<(), CollectivesError> + Sync,
) -> Vec<CollectivesError> {
    let mut ranks = RankComm::host(n).expect("host ranks");
    for r in &mut ranks {
        r.set_timeout(t);
    }
    on_ranks(ranks, |mut rank| match f(&mut rank) {
        Err(e) => Some(e),
        Ok(()) => rank
            .all_reduce_in_place(&mut [0u8; 1][..], ReduceOp::Sum)
            .err(),
    })
    .into_iter()
    .enumerate()
    .map(|(r, e)| e.unwrap_or_else(|| panic!("rank {r} succeeded twice")))
    .collect()
}

/// Every rank failed with a mismatch saying `what`, in the call or, aborted by it, in the
/// next.
fn assert_mismatch(errs: &[CollectivesError], what: &str) {
    for (r, e) in errs.iter().enumerate() {
        let e = match e {
            CollectivesError::Aborted { cause, .. } => &**cause,
            e => e,
        };
        match e {
            CollectivesError::RankMismatch { message, .. } => {
                assert!(message.contains(what), "rank {r}: {message}")
            }
            other => panic!("rank {r}: {other}"),
        }
    }
}

#[test]
fn mismatches_fail_on_every_rank() {
    let long = Duration::from_secs(30);
    // count
    let errs = errors(4, long, |rank| {
        let n = if rank.rank() == 2 { 7 } else { 8 };
        let mut b = vec![1.0f32; n];
        rank.all_reduce_in_place(&mut b, ReduceOp::Sum)
    });
    assert_mismatch(&errs, "count differs");
    // element type
    let errs = errors(3, long, |rank| {
        if rank.rank() == 1 {
            rank.all_reduce_in_place(&mut [1i32; 4], ReduceOp::Sum)
        } else {
            rank.all_reduce_in_place(&mut [1u32; 4], ReduceOp::Sum)
        }
    });
    assert_mismatch(&errs, "element type differs");
    // op
    let errs = errors(3, long, |rank| {
        let op = if rank.rank() == 0 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        rank.all_reduce_in_place(&mut [1i64; 4], op)
    });
    assert_mismatch(&errs, "op differs");
    // root
    let errs = errors(3, long, |rank| {
        let root = if rank.rank() == 2 { 1 } else { 0 };
        rank.broadcast_in_place(&mut [1u8; 4], root)
    });
    assert_mismatch(&errs, "root differs");
    // collective order: rank 1 calls broadcast first, the others all_reduce first.
    let errs = errors(3, long, |rank| {
        let mut b = [1.0f64; 4];
        if rank.rank() == 1 {
            rank.broadcast_in_place(&mut b, 0)?;
            rank.all_reduce_in_place(&mut b, ReduceOp::Sum)
        } else {
            rank.all_reduce_in_place(&mut b, ReduceOp::Sum)?;
            rank.broadcast_in_place(&mut b, 0)
        }
    });
    assert_mismatch(&errs, "collective differs");
    // all_to_all_v counts that do not agree between sender and receiver
    let errs = errors(2, long, |rank| {
        let recv_counts = if rank.rank() == 1 { [1, 2] } else { [1, 1] };
        let mut out = vec![0u32; recv_counts.iter().sum()];
        rank.all_to_all_v(&[1u32, 2], &[1, 1], &mut out, &recv_counts)
    });
    assert_mismatch(&errs, "counts differ");
}

/// A rank that skips a call whose successor has the same shape meets the others' earlier
/// call: nothing tells the calls apart but a tag, and with tags every rank fails instead.
#[test]
fn a_skipped_call_is_caught_by_its_tag() {
    let long = Duration::from_secs(30);
    // Layers 0 and 1 both all_reduce 4 floats; rank 2 skips layer 0.
    let layers = |rank: &mut RankComm, tagged: bool| {
        let mut last = [0.0f32; 4];
        for layer in 0..2u64 {
            if rank.rank() == 2 && layer == 0 {
                continue;
            }
            if tagged {
                rank.tag_next(layer + 1);
            }
            let mut b = [layer as f32 + 1.0; 4];
            rank.all_reduce_in_place(&mut b, ReduceOp::Sum)?;
            last = b;
        }
        Ok(last)
    };
    let errs = errors(3, long, |rank| layers(rank, true).map(|_| ()));
    assert_mismatch(&errs, "tag differs");
    // Untagged, the others' layer 0 pairs with rank 2's layer 1: no error, a wrong sum on
    // rank 2 (1 + 1 + 2 = 4, not 2 + 2 + 2 = 6), and the others wait for a second call.
    let mut ranks = RankComm::host(3).expect("host ranks");
    for r in &mut ranks {
        r.set_timeout(Duration::from_millis(300));
    }
    let got = on_ranks(ranks, |mut rank| layers(&mut rank, false));
    assert_eq!(got[2].as_ref().expect("rank 2 runs"), &[4.0; 4]);
    assert!(got[0].is_err() && got[1].is_err());
}

/// A rank's buffer of the wrong length fails the call on every rank with the same source.
#[test]
fn a_wrong_buffer_on_one_rank_fails_every_rank() {
    let errs = errors(3, Duration::from_secs(30), |rank| {
        let out_len = if rank.rank() == 1 { 3 } else { 4 };
        let mut out = vec![0i32; out_len];
        rank.all_reduce(&[1i32; 4], &mut out, ReduceOp::Sum)
    });
    for (r, e) in errs.iter().enumerate() {
        match e {
            CollectivesError::RankFailed { source, .. } => assert!(
                matches!(**source, CollectivesError::CountMismatch { rank: 1, .. }),
                "rank {r}: {source}"
            ),
            other => panic!("rank {r}: {other}"),
        }
    }
    // An in-place all_gather buffer that is no multiple of the rank count, on one rank.
    let errs = errors(3, Duration::from_secs(30), |rank| {
        let len = if rank.rank() == 0 { 7 } else { 6 };
        rank.all_gather_in_place(&mut vec![0u8; len])
    });
    assert!(
        errs.iter()
            .all(|e| matches!(e, CollectivesError::RankFailed { .. })),
        "{errs:?}"
    );
}

/// A rank that never calls makes the others fail within their timeout, not hang; the
/// late rank then fails too instead of running alone, and the communicator goes on.
#[test]
fn a_missing_rank_times_out_and_aborts_the_communicator() {
    let mut ranks = RankComm::host(3).expect("host ranks");
    for r in &mut ranks {
        r.set_timeout(Duration::from_millis(300));
    }
    let started = Instant::now();
    let res = on_ranks(ranks, |mut rank| {
        if rank.rank() == 2 {
            // Late for the first call, by more than the others' timeout.
            thread::sleep(Duration::from_millis(900));
        }
        let first = rank.all_reduce_in_place(&mut [1u64; 16], ReduceOp::Sum);
        // The second call would wait long enough for the late rank, but the communicator
        // was aborted by the first.
        rank.set_timeout(Duration::from_secs(30));
        let mut b = [rank.rank() as u64; 16];
        let second = rank
            .all_reduce_in_place(&mut b, ReduceOp::Sum)
            .map(|()| b[0]);
        (first, second)
    });
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_rank_2_timed_out(&res, "all_reduce");
}

/// A rank's first and second call.
type TwoCalls<T> = (Result<(), CollectivesError>, Result<T, CollectivesError>);

/// Every rank's first call of `res` (`call`, number 0) timed out naming rank 2 as missing,
/// and its second call was aborted by that timeout.
fn assert_rank_2_timed_out<T: std::fmt::Debug>(res: &[TwoCalls<T>], call: &str) {
    for (r, (first, second)) in res.iter().enumerate() {
        match first {
            Err(CollectivesError::RankTimeout {
                missing,
                seq: 0,
                call: c,
                ..
            }) if *c == call => assert_eq!(missing, &vec![2], "rank {r}"),
            other => panic!("rank {r}: {other:?}"),
        }
        match second {
            Err(CollectivesError::Aborted { seq: 0, cause, .. }) => assert!(
                matches!(**cause, CollectivesError::RankTimeout { .. }),
                "rank {r}: {cause}"
            ),
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

/// A rank whose handle is dropped releases the others at once.
#[test]
fn a_dropped_rank_fails_the_others_at_once() {
    let ranks = RankComm::host(2).expect("host ranks");
    let started = Instant::now();
    let res = on_ranks(ranks, |mut rank| {
        rank.set_timeout(Duration::from_secs(60));
        if rank.rank() == 1 {
            drop(rank);
            return Ok(());
        }
        rank.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum)
    });
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        matches!(
            res[0],
            Err(CollectivesError::RankTimeout { gone: true, .. })
        ),
        "{:?}",
        res[0]
    );
}

/// The all-ranks API gets the in-place plan for an in-place broadcast on `host-N` (the
/// out-of-place plan copies the root's input onto its own output, a race in place).
#[test]
fn all_ranks_in_place_broadcast_on_the_host() {
    let comm = relaycc_collectives::Communicator::host(3).expect("host communicator");
    let bufs: Vec<_> = (0..3)
        .map(|r| comm.from_slice(r, &[r as i32 + 1; 6]).expect("buffer"))
        .collect();
    comm.broadcast(&bufs[1], &bufs, 1)
        .and_then(|p| p.wait())
        .expect("in-place broadcast");
    for b in &bufs {
        assert_eq!(b.to_vec().expect("read back"), vec![2; 6]);
    }
}

/// all_gather_v counts whose sum does not fit fail the call on every rank (no overflow
/// panic, no wrapped offset).
#[test]
fn all_gather_v_counts_that_overflow_fail_every_rank() {
    let res = on_ranks(RankComm::host(3).expect("host ranks"), |mut rank| {
        let mut buf = [0u32; 4];
        rank.all_gather_v_in_place(&mut buf[..], &[usize::MAX, usize::MAX, 1])
    });
    for (r, got) in res.into_iter().enumerate() {
        let e = got.expect_err("overflowing counts");
        assert!(e.to_string().contains("overflow"), "rank {r}: {e}");
    }
}
