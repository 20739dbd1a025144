//! The host backend's peepholes over one lane's resolved commands, run by `submit` before
//! a launch starts: copies a reduction can read through are dropped (`forward_copies`), and
//! a reduction directly followed by copies of its result writes the result to every
//! destination block by block (`fuse_fan_out`). Both rewrite only addresses and the task
//! list; they change nothing any op observes (see each function).

use super::host_lanes::Task;

/// How far [`forward_copies`] looks ahead on a lane for the reduction that reads a copy's
/// destination and for the op that overwrites it: a few chunks' ops of the shared-memory
/// plans (n - 1 copies in, one reduction, n - 1 copies out per chunk), while the cost of a
/// submission stays linear in its ops.
const FORWARD_WINDOW_OPS: usize = 64;

/// Half-open byte ranges `[a, a + la)` and `[b, b + lb)` share a byte.
fn overlaps(a: usize, la: usize, b: usize, lb: usize) -> bool {
    a < b.saturating_add(lb) && b < a.saturating_add(la)
}

/// A byte range: (address, bytes).
type Range = (usize, usize);

/// Fan-out fusion on one lane: a reduction into `R` directly followed on the lane by copies
/// of all of `R` to other memories becomes one task that writes each block of the result to
/// `R` and to every copy's destination while the block is in the L1 cache, instead of
/// writing `R` and reading it back once per copy. The shared-memory plans' all_reduce
/// reduces each chunk of a slice on its owner and copies it to every other rank: fused, main
/// memory sees what `n` plain copies move (every input read once, every output written once
/// with streaming stores).
///
/// It changes nothing any op observes: the copies follow the reduction with nothing between
/// (no event, so no other lane is ordered between them), each copies exactly `R`, and their
/// destinations overlap no source of the reduction, `R`, or each other, so writing them
/// block by block during the reduction leaves every byte as the reduction and then the
/// copies would.
pub(super) fn fuse_fan_out(tasks: &mut Vec<Task>, srcs: &[usize], outs: &mut Vec<(usize, bool)>) {
    let mut drop_task = vec![false; tasks.len()];
    let mut i = 0;
    while i < tasks.len() {
        let Task::Reduce {
            first,
            count,
            dst,
            len,
            dtype,
            fan: 0,
            ..
        } = tasks[i]
        else {
            i += 1;
            continue;
        };
        let bytes = len.saturating_mul(dtype.size() as usize);
        let start = outs.len();
        let mut j = i + 1;
        while let Some(&Task::Copy {
            src,
            dst: to,
            bytes: b,
            stream,
        }) = tasks.get(j)
        {
            let apart = |(a, l): (usize, usize)| !overlaps(a, l, to, bytes);
            let clear = src == dst
                && b == bytes
                && bytes > 0
                && apart((dst, bytes))
                && srcs[first..first + count]
                    .iter()
                    .all(|&s| apart((s, bytes)))
                && outs[start..].iter().all(|&(o, _)| apart((o, bytes)));
            if !clear {
                break;
            }
            outs.push((to, stream));
            drop_task[j] = true;
            j += 1;
        }
        if let Task::Reduce { outs: o, fan, .. } = &mut tasks[i] {
            *o = start;
            *fan = outs.len() - start;
        }
        i = j;
    }
    let mut k = 0;
    tasks.retain(|_| {
        k += 1;
        !drop_task[k - 1]
    });
}

/// The byte ranges a task reads: one range, or `len` bytes at each of some addresses.
#[derive(Clone, Copy)]
struct Reads<'a> {
    one: Option<Range>,
    many: &'a [usize],
    len: usize,
}

impl Reads<'_> {
    /// Every range read (no allocation: the scans below run per copy of a submission).
    fn iter(self) -> impl Iterator<Item = Range> {
        let len = self.len;
        self.one
            .into_iter()
            .chain(self.many.iter().map(move |&a| (a, len)))
    }
}

/// The byte ranges a task reads and writes: (reads, write), for the tasks that touch memory.
fn task_ranges<'a>(t: &Task, srcs: &'a [usize]) -> Option<(Reads<'a>, Range)> {
    match *t {
        Task::Copy {
            src, dst, bytes, ..
        } => Some((
            Reads {
                one: Some((src, bytes)),
                many: &[],
                len: 0,
            },
            (dst, bytes),
        )),
        Task::Reduce {
            first,
            count,
            dst,
            len,
            dtype,
            ..
        } => {
            let b = len.saturating_mul(dtype.size() as usize);
            let reads = Reads {
                one: None,
                many: &srcs[first..first + count],
                len: b,
            };
            Some((reads, (dst, b)))
        }
        Task::Record(_) | Task::Wait(_) => None,
    }
}

/// Copy forwarding on one lane: where a copy `A -> R` is followed on the lane by a reduction
/// that reads exactly `R`, and `R` is then wholly overwritten on the lane before anything else
/// reads it, the reduction reads `A` in place of `R` and the copy is dropped. Every arena of
/// the host backend is one address space, so a reduction may read any rank's memory; the
/// plans stage remote data in scratch because the plan IR keeps reductions local (as GPUs
/// need), and on the host that staging costs a pass over the data for nothing. The
/// shared-memory plans' all_reduce, reduce and reduce_scatter drop all their copies in but
/// the last chunk's.
///
/// It changes nothing any op observes: only a window of copies and reductions is rewritten
/// (no `Record` or `Wait` inside it, so no other lane is ordered between the copy and the
/// overwrite, and a checked plan has no unordered access to `R` or write to `A` on another
/// lane), `A` is not written on the lane between the copy and the reduction, the value the copy
/// put in `R` is never read, and the reduction's contract holds (`A` aligned for its element
/// type, its destination equal to `A` or apart from it).
pub(super) fn forward_copies(tasks: &mut Vec<Task>, srcs: &mut [usize]) {
    let mut drop_task = vec![false; tasks.len()];
    for c in 0..tasks.len() {
        let Task::Copy {
            src: a,
            dst: r,
            bytes,
            ..
        } = tasks[c]
        else {
            continue;
        };
        if bytes == 0 || overlaps(a, bytes, r, bytes) {
            continue;
        }
        // The reduction reading exactly `R`, with nothing on the way touching `R` or writing `A`.
        let mut reader = None;
        for (j, t) in tasks
            .iter()
            .enumerate()
            .skip(c + 1)
            .take(FORWARD_WINDOW_OPS)
        {
            if drop_task[j] {
                continue;
            }
            let Some((reads, (w, wl))) = task_ranges(t, srcs) else {
                break;
            };
            if let Task::Reduce {
                first,
                count,
                dtype,
                ..
            } = *t
            {
                let exact = reads.iter().any(|(s, l)| s == r && l == bytes);
                let others_clear = reads
                    .iter()
                    .all(|(s, l)| (s == r && l == bytes) || !overlaps(s, l, r, bytes));
                let dst_ok = !overlaps(w, wl, r, bytes)
                    && ((w == a && wl == bytes) || !overlaps(w, wl, a, bytes));
                if exact && others_clear && dst_ok && a % dtype.size() as usize == 0 {
                    reader = Some((j, first, count));
                    break;
                }
            }
            if overlaps(w, wl, r, bytes)
                || overlaps(w, wl, a, bytes)
                || reads.iter().any(|(s, l)| overlaps(s, l, r, bytes))
            {
                break;
            }
        }
        let Some((j, first, count)) = reader else {
            continue;
        };
        // The next op touching `R` overwrites all of it without reading it.
        let mut dead = false;
        for (k, t) in tasks
            .iter()
            .enumerate()
            .skip(j + 1)
            .take(FORWARD_WINDOW_OPS)
        {
            if drop_task[k] {
                continue;
            }
            let Some((reads, (w, wl))) = task_ranges(t, srcs) else {
                break;
            };
            if reads.iter().any(|(s, l)| overlaps(s, l, r, bytes)) {
                break;
            }
            if overlaps(w, wl, r, bytes) {
                dead = w <= r && w.saturating_add(wl) >= r + bytes;
                break;
            }
        }
        if dead {
            for s in &mut srcs[first..first + count] {
                if *s == r {
                    *s = a;
                }
            }
            drop_task[c] = true;
        }
    }
    let mut k = 0;
    tasks.retain(|_| {
        k += 1;
        !drop_task[k - 1]
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_route::{DType, ReduceOp};

    fn copy(src: usize, dst: usize, bytes: usize) -> Task {
        Task::Copy {
            src,
            dst,
            bytes,
            stream: false,
        }
    }

    /// A copy into scratch read by the next reduction and then overwritten is dropped and the
    /// reduction reads its source; with an event between, or without the overwrite, or when a
    /// later op reads the scratch, nothing changes.
    #[test]
    fn copies_forward_into_reductions_only_when_their_value_dies() {
        // Addresses only: nothing runs, so any distinct, aligned numbers serve.
        let (a, own, r, out, b) = (0x1000, 0x2000, 0x3000, 0x4000, 0x5000);
        let reduce = |first| Task::Reduce {
            first,
            count: 2,
            dst: out,
            len: 16,
            dtype: DType::F32,
            op: ReduceOp::Sum,
            divisor: None,
            outs: 0,
            fan: 0,
        };
        let mut srcs = vec![own, r];
        let mut tasks = vec![copy(a, r, 64), reduce(0), copy(b, r, 64)];
        forward_copies(&mut tasks, &mut srcs);
        assert_eq!(tasks.len(), 2, "{tasks:?}");
        assert_eq!(srcs, vec![own, a]);
        assert!(matches!(tasks[0], Task::Reduce { .. }));

        let cases: [Vec<Task>; 3] = [
            vec![copy(a, r, 64), reduce(0)],
            vec![copy(a, r, 64), Task::Record(0), reduce(0), copy(b, r, 64)],
            vec![copy(a, r, 64), reduce(0), copy(r, b, 64), copy(b, r, 64)],
        ];
        for mut tasks in cases {
            let mut srcs = vec![own, r];
            let before = tasks.len();
            forward_copies(&mut tasks, &mut srcs);
            assert_eq!(tasks.len(), before, "{tasks:?}");
            assert_eq!(srcs, vec![own, r]);
        }
    }

    /// A reduction followed by copies of its whole result fuses into one task with their
    /// destinations; a copy of part of the result, one whose destination overlaps a source,
    /// or one after an event stays a copy.
    #[test]
    fn copies_of_a_reduction_fuse_into_its_fan_out() {
        let (a, b, r, x, y) = (0x1000, 0x2000, 0x3000, 0x4000, 0x5000);
        let reduce = Task::Reduce {
            first: 0,
            count: 2,
            dst: r,
            len: 16,
            dtype: DType::F32,
            op: ReduceOp::Sum,
            divisor: None,
            outs: 0,
            fan: 0,
        };
        let srcs = vec![a, b];
        let mut outs = Vec::new();
        let mut tasks = vec![reduce, copy(r, x, 64), copy(r, y, 64), copy(r, x, 64)];
        fuse_fan_out(&mut tasks, &srcs, &mut outs);
        // The third copy writes `x` again: it overlaps a fused destination and stays.
        assert_eq!(tasks.len(), 2, "{tasks:?}");
        assert!(matches!(
            tasks[0],
            Task::Reduce {
                outs: 0,
                fan: 2,
                ..
            }
        ));
        assert_eq!(outs, vec![(x, false), (y, false)]);
        let cases: [Vec<Task>; 3] = [
            vec![reduce, copy(r, x, 32)],
            vec![reduce, copy(r, b, 64)],
            vec![reduce, Task::Record(0), copy(r, x, 64)],
        ];
        for mut tasks in cases {
            let before = tasks.len();
            let mut outs = Vec::new();
            fuse_fan_out(&mut tasks, &srcs, &mut outs);
            assert_eq!(tasks.len(), before, "{tasks:?}");
            assert!(outs.is_empty());
        }
    }
}
