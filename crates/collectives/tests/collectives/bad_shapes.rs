//! Property test of argument shapes: the all-ranks calls, given buffers of random lengths
//! and numbers, roots in and out of range and count matrices of any shape, never panic; each
//! either runs to its end or returns an error with every buffer unchanged.

use proptest::prelude::*;
use relaycc_collectives::{Communicator, DeviceBuffer, ReduceOp};

const SENTINEL: i32 = -7;

/// One call's arguments: the collective (index into `CALLS`), every buffer's length per
/// side, how many buffers each side gets, the root and the matrix.
#[derive(Debug, Clone)]
struct Shape {
    ranks: u32,
    call: usize,
    in_lens: Vec<usize>,
    out_lens: Vec<usize>,
    root: usize,
    matrix: Vec<Vec<u64>>,
}

const CALLS: [&str; 11] = [
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_v",
    "reduce_scatter",
    "reduce_scatter_v",
    "all_to_all",
    "all_to_all_v",
    "gather",
    "scatter",
];

/// Lengths of `count` buffers of `c * m` elements each, one of them changed to `odd` where
/// given: shapes near the right ones, so that many calls run and the rest fail by a little.
fn lens(count: usize, c: usize, m: usize, odd: Option<(usize, usize)>) -> Vec<usize> {
    let mut v = vec![c * m; count];
    if let Some((at, len)) = odd
        && let Some(slot) = v.get_mut(at % count.max(1))
    {
        *slot = len;
    }
    v
}

fn shape() -> impl Strategy<Value = Shape> {
    (1u32..=4)
        .prop_flat_map(|n| {
            let k = n as usize;
            let count = prop::sample::select(vec![k, k, k, k.saturating_sub(1).max(1), k + 1]);
            let odd = prop::option::weighted(0.3, (0..=k, 0..=3 * k));
            let matrix = prop_oneof![
                (0u64..=2).prop_map(move |c| vec![vec![c; k]; k]),
                prop::collection::vec(prop::collection::vec(0u64..=2, 0..=k + 1), 0..=k + 1),
            ];
            (
                Just(n),
                0..CALLS.len(),
                0usize..=2,
                (
                    prop::sample::select(vec![1, k]),
                    prop::sample::select(vec![1, k]),
                ),
                (count.clone(), count),
                (odd.clone(), odd),
                0..=k,
                matrix,
            )
        })
        .prop_map(
            |(ranks, call, c, (mi, mo), (ni, no), (oi, oo), root, matrix)| Shape {
                ranks,
                call,
                in_lens: lens(ni, c, mi, oi),
                out_lens: lens(no, c, mo, oo),
                root,
                matrix,
            },
        )
}

/// Buffer `b` of one side on rank `b mod n`, `lens[b]` elements of `fill(b)`.
fn side(
    comm: &Communicator,
    lens: &[usize],
    fill: impl Fn(usize) -> i32,
) -> Vec<DeviceBuffer<i32>> {
    lens.iter()
        .enumerate()
        .map(|(b, &len)| {
            comm.from_slice(b % comm.ranks(), &vec![fill(b); len])
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

fn run(comm: &Communicator, s: &Shape, ins: &[DeviceBuffer<i32>], outs: &[DeviceBuffer<i32>]) {
    // A rooted call's one buffer: the one on the root's rank where there is one.
    let at = |side: &[DeviceBuffer<i32>]| s.root.min(side.len().saturating_sub(1));
    let (i0, o0) = (&ins[at(ins)], &outs[at(outs)]);
    let op = ReduceOp::Sum;
    let result = match CALLS[s.call] {
        "all_reduce" => comm.all_reduce(ins, outs, op),
        "reduce" => comm.reduce(ins, o0, s.root, op),
        "broadcast" => comm.broadcast(i0, outs, s.root),
        "all_gather" => comm.all_gather(ins, outs),
        "all_gather_v" => comm.all_gather_v(ins, outs),
        "reduce_scatter" => comm.reduce_scatter(ins, outs, op),
        "reduce_scatter_v" => comm.reduce_scatter_v(ins, outs, op),
        "all_to_all" => comm.all_to_all(ins, outs),
        "all_to_all_v" => comm.all_to_all_v(ins, outs, &s.matrix),
        "gather" => comm.gather(ins, o0, s.root),
        _ => comm.scatter(i0, outs, s.root),
    };
    match result {
        Ok(pending) => pending.wait().unwrap_or_else(|e| panic!("{e}")),
        Err(_) => {
            for (b, buf) in ins.iter().enumerate() {
                let v = buf.to_vec().unwrap_or_else(|e| panic!("{e}"));
                assert!(v.iter().all(|&x| x == b as i32), "input {b} changed");
            }
            for (b, buf) in outs.iter().enumerate() {
                let v = buf.to_vec().unwrap_or_else(|e| panic!("{e}"));
                assert!(v.iter().all(|&x| x == SENTINEL), "output {b} changed");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn any_shape_of_arguments_runs_or_is_an_error_that_changes_nothing(s in shape()) {
        let comm = Communicator::host(s.ranks).unwrap_or_else(|e| panic!("{e}"));
        let ins = side(&comm, &s.in_lens, |b| b as i32);
        let outs = side(&comm, &s.out_lens, |_| SENTINEL);
        run(&comm, &s, &ins, &outs);
    }
}
