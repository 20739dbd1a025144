//! Sampled execution of a template: the values some output elements of some ranks end up
//! holding, computed over the lazily expanded plan and compared with the request's reference.
//!
//! For each sampled output element the backward data cone is followed: the op that last writes
//! the element, the elements that op reads, the ops that last wrote those before it, and so
//! on down to the inputs. Only the cone's (op, element) pairs are evaluated; a copy maps
//! offsets one to one and a reduction is elementwise, so each pair reads one element per
//! source. The ops are never materialised: the writer index lists which template ops write
//! which ranges of which buffer class (a rank modulo the ranks per period, or a staging buffer
//! of the template), and the period of each writer of a given buffer follows from it.
//!
//! Which write a read sees is decided by one legal schedule of the full plan: ops in order of
//! their dependency level, ties by global id. Levels are those of the template's folded
//! graph: every path of the full plan projects onto a path of the folded graph and every path
//! of the folded graph lifts to one on every period, so the longest paths agree and the level
//! of an op is its template op's on every period. A writer at the reader's own level, or two
//! last writers of an element at one level, are unordered: that is a race, and an error.
//!
//! Values are exact: integers in `i128` wrapped to the element type; floating-point inputs
//! are small integers whose sums stay exactly representable (an error otherwise), and `Avg`
//! keeps its division symbolic. Integer `Avg` is not a valid request.

use std::collections::HashMap;

use relaycc_topo::Topology;

use super::expand::Expansion;
use relaycc_plan::{BufferRef, OpKind, Plan, Region};
use relaycc_plan::{DType, ReduceOp};
use relaycc_plan::{Result, RouteError};

fn bad(op: usize, message: String) -> RouteError {
    RouteError::PlanCheck { op, message }
}

/// What to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleOptions {
    /// Ranks whose outputs are sampled.
    pub ranks: usize,
    /// Output elements per sampled rank (its first and last among them).
    pub elements: usize,
    /// Seed of the choice of ranks, elements and input values.
    pub seed: u64,
}

impl Default for SampleOptions {
    fn default() -> Self {
        SampleOptions {
            ranks: 3,
            elements: 8,
            seed: 1,
        }
    }
}

/// What a sampled execution evaluated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleReport {
    /// The sampled (rank, output element) pairs, each found equal to its reference.
    pub targets: Vec<(u32, u64)>,
    /// Distinct ops of the full plan in the cones.
    pub cone_ops: usize,
    /// (op, element) pairs evaluated.
    pub cone_values: usize,
    /// Ops of the full plan.
    pub full_ops: u64,
}

/// A value: an exact integer, divided by the rank count once `avg` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Value {
    v: i128,
    avg: bool,
}

/// A buffer class of the writer index: (0 input, 1 output, 2 staging) and the rank modulo the
/// ranks per period, or the template's staging buffer.
type Class = (u8, u32);

/// A template op's write: the op, the period of its buffer's class relative to the op's, and
/// the range.
#[derive(Debug, Clone, Copy)]
struct Write {
    op: u32,
    base: u32,
    offset: u64,
    end: u64,
    rotate: (u64, u64),
}

/// An op's place in the schedule the cones follow: (dependency level, global id).
type Key = (u32, u64);

/// The writes to one buffer of the full plan, sorted by offset, and the longest's length.
struct Writes {
    list: Vec<(u64, u64, u32, u64)>,
    longest: u64,
}

struct Cone<'e, 'p> {
    index: HashMap<(Class, u32), Writes>,
    ex: &'e Expansion<'p>,
    levels: Vec<u32>,
    writers: HashMap<Class, Vec<Write>>,
    memo: HashMap<(u64, u64), Value>,
    dtype: DType,
    op: ReduceOp,
    seed: u64,
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `v` as an element of `t` holds it: integers wrap, floats must be exact.
fn wrap(t: DType, v: i128) -> Result<i128> {
    let exact_bits = match t {
        DType::I8 => return Ok(i128::from(v as i8)),
        DType::U8 => return Ok(i128::from(v as u8)),
        DType::I32 => return Ok(i128::from(v as i32)),
        DType::U32 => return Ok(i128::from(v as u32)),
        DType::I64 => return Ok(i128::from(v as i64)),
        DType::U64 => return Ok(i128::from(v as u64)),
        DType::F16 => 11,
        DType::Bf16 => 8,
        DType::F32 => 24,
        DType::F64 => 53,
    };
    if v.unsigned_abs() > 1u128 << exact_bits {
        return Err(bad(
            usize::MAX,
            format!("the sampled values leave the integers {t} holds exactly"),
        ));
    }
    Ok(v)
}

fn combine(t: DType, op: ReduceOp, a: i128, b: i128) -> Result<i128> {
    let v = match op {
        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
        ReduceOp::Prod => a.wrapping_mul(b),
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
    };
    wrap(t, v)
}

impl Cone<'_, '_> {
    /// Input element `x` of rank `r`.
    fn input(&self, r: u32, x: u64) -> Result<Value> {
        let h = mix(self.seed ^ mix(u64::from(r) << 40 ^ x));
        let v =
            if self.dtype.is_float() || matches!(self.dtype, DType::I8 | DType::I32 | DType::I64) {
                i128::from((h % 41) as i8) - 20
            } else {
                i128::from(h % 251)
            };
        Ok(Value {
            v: wrap(self.dtype, v)?,
            avg: false,
        })
    }
    /// The buffer class of a global buffer and its period.
    fn class(&self, b: BufferRef) -> (Class, u32) {
        let m = self.ex.ranks_per_period();
        let s = self.ex.scratch_per_period().max(1);
        match b {
            BufferRef::Input(r) => ((0, r % m), r / m),
            BufferRef::Output(r) => ((1, r % m), r / m),
            BufferRef::Scratch(g) => ((2, g % s), g / s),
        }
    }
    /// The writes to global buffer `b` (class and period): (offset, end, level, global op),
    /// sorted by offset, and the longest; built once per buffer the cones touch.
    fn writes_to(&mut self, b: BufferRef) -> &Writes {
        let (class, period) = self.class(b);
        let p = self.ex.periods();
        let ops = u64::from(self.ex.ops_per_period());
        let (writers, levels) = (&self.writers, &self.levels);
        self.index.entry((class, period)).or_insert_with(|| {
            let mut v: Vec<(u64, u64, u32, u64)> = writers
                .get(&class)
                .map_or(&[][..], |v| v.as_slice())
                .iter()
                .map(|w| {
                    let k = (period + p - w.base % p) % p;
                    let offset = if w.rotate.0 == 0 || k == 0 {
                        w.offset
                    } else {
                        super::fold::rotate(w.offset, w.rotate.0, w.rotate.1, k)
                    };
                    let gid = u64::from(k) * ops + u64::from(w.op);
                    (
                        offset,
                        offset + (w.end - w.offset),
                        levels[w.op as usize],
                        gid,
                    )
                })
                .collect();
            v.sort_unstable();
            let longest = v.iter().map(|w| w.1 - w.0).max().unwrap_or(0);
            Writes { list: v, longest }
        })
    }
    /// The last write to element `x` of global buffer `b` ordered before `before` (a
    /// (level, global id) pair), as (global op, element of its destination).
    fn last_write(
        &mut self,
        b: BufferRef,
        x: u64,
        before: (u32, u64),
    ) -> Result<Option<(u64, u64)>> {
        let w = self.writes_to(b);
        let lo = w.list.partition_point(|e| e.0 + w.longest <= x);
        let hi = w.list.partition_point(|e| e.0 <= x);
        let mut best: Option<(u32, u64)> = None;
        let mut at_level = 0u32;
        for &(offset, end, level, gid) in &w.list[lo..hi] {
            if x < offset || x >= end {
                continue;
            }
            let key = (level, gid);
            if key >= before {
                if key.0 == before.0 && key.1 != before.1 {
                    return Err(bad(
                        usize::try_from(gid).unwrap_or(usize::MAX),
                        format!(
                            "writes element {x} of {b:?} at the dependency level of op {} that \
                             reads it: the two are unordered",
                            before.1
                        ),
                    ));
                }
                continue;
            }
            match best {
                Some(b) if b.0 > key.0 => {}
                Some(b) if b.0 == key.0 => {
                    at_level += 1;
                    best = Some(b.max(key));
                }
                _ => {
                    at_level = 1;
                    best = Some(key);
                }
            }
        }
        if at_level > 1 {
            return Err(bad(
                usize::MAX,
                format!("two unordered ops last write element {x} of {b:?}"),
            ));
        }
        Ok(best.map(|(_, gid)| (gid, x)))
    }
    /// The reads op `gid` makes to produce element `x` of its destination (in destination
    /// coordinates `x`): each source's buffer and element.
    fn reads(&self, gid: u64, x: u64) -> Result<(Vec<(BufferRef, u64)>, Key)> {
        let ops = u64::from(self.ex.ops_per_period());
        let (k, i) = ((gid / ops) as u32, (gid % ops) as u32);
        let t = &self.ex.template().ops[i as usize];
        let regions: Vec<&Region> = match &t.kind {
            OpKind::Copy { src, dst } => vec![src, dst],
            OpKind::Reduce { srcs, dst, .. } => srcs.iter().chain([dst]).collect(),
        };
        let last = regions.len() - 1;
        let dst = self.ex.region(i, last as u32, *regions[last], k)?;
        let within = x - dst.offset;
        let mut out = Vec::with_capacity(last);
        for (j, r) in regions[..last].iter().enumerate() {
            let s = self.ex.region(i, j as u32, **r, k)?;
            out.push((s.buffer, s.offset + within));
        }
        Ok((out, (self.levels[i as usize], gid)))
    }
    /// The value element `x` of buffer `b` holds before `before`: its last write's, or the
    /// input.
    fn source(
        &mut self,
        b: BufferRef,
        x: u64,
        before: (u32, u64),
    ) -> Result<Result<Value, (u64, u64)>> {
        match self.last_write(b, x, before)? {
            Some(w) => Ok(Err(w)),
            None => match b {
                BufferRef::Input(r) => Ok(Ok(self.input(r, x)?)),
                _ => Err(bad(
                    usize::try_from(before.1).unwrap_or(usize::MAX),
                    format!("reads element {x} of {b:?} before any op writes it"),
                )),
            },
        }
    }
    /// Evaluate (op, element) `root` and its cone, without recursion.
    fn eval(&mut self, root: (u64, u64)) -> Result<Value> {
        let mut stack = vec![root];
        while let Some(&(gid, x)) = stack.last() {
            if self.memo.contains_key(&(gid, x)) {
                stack.pop();
                continue;
            }
            let (reads, me) = self.reads(gid, x)?;
            let mut vals = Vec::with_capacity(reads.len());
            let mut missing = false;
            for (b, y) in reads {
                match self.source(b, y, me)? {
                    Ok(v) => vals.push(v),
                    Err(w) => match self.memo.get(&w) {
                        Some(&v) => vals.push(v),
                        None => {
                            stack.push(w);
                            missing = true;
                        }
                    },
                }
            }
            if missing {
                continue;
            }
            let ops = u64::from(self.ex.ops_per_period());
            let t = &self.ex.template().ops[(gid % ops) as usize];
            let v = match &t.kind {
                OpKind::Copy { .. } => vals[0],
                OpKind::Reduce { finalize, .. } => {
                    let mut acc = vals[0];
                    for v in &vals[1..] {
                        if acc.avg || v.avg {
                            return Err(bad(gid as usize, "reduces an averaged value".into()));
                        }
                        acc.v = combine(self.dtype, self.op, acc.v, v.v)?;
                    }
                    if *finalize && self.op == ReduceOp::Avg {
                        if acc.avg {
                            return Err(bad(gid as usize, "divides an average again".into()));
                        }
                        acc.avg = true;
                    }
                    acc
                }
            };
            self.memo.insert((gid, x), v);
            stack.pop();
        }
        self.memo
            .get(&root)
            .copied()
            .ok_or_else(|| bad(usize::MAX, "the cone's root was not evaluated".into()))
    }
}

/// Execute the cones of output elements `targets` ((rank, element) pairs) of template `plan`
/// on `topo` and compare each with the request's reference; input values follow `seed`.
///
/// # Errors
/// Those of [`Expansion::new`]; [`RouteError::PlanCheck`] when a sampled element differs from
/// its reference, is never written, an op reads an element no op wrote (staging or output), two
/// writes or a write and a read of an element are unordered, or the values leave the element
/// type's exact integers.
pub fn check_elements(
    plan: &Plan,
    topo: &Topology,
    targets: &[(u32, u64)],
    seed: u64,
) -> Result<SampleReport> {
    let ex = Expansion::new(plan, topo)?;
    let levels = plan.dependency_levels()?;
    let mut writers: HashMap<Class, Vec<Write>> = HashMap::new();
    let m = ex.ranks_per_period();
    let s = ex.scratch_per_period().max(1);
    for (i, op) in plan.ops.iter().enumerate() {
        let (dst, j) = match &op.kind {
            OpKind::Copy { dst, .. } => (dst, 1),
            OpKind::Reduce { srcs, dst, .. } => (dst, srcs.len() as u32),
        };
        let off = ex.offset(i as u32, relaycc_plan::OffsetAt::Region(j));
        let (class, base) = match dst.buffer {
            BufferRef::Input(r) => ((0, r % m), r / m),
            BufferRef::Output(r) => ((1, r % m), r / m),
            BufferRef::Scratch(x) => ((2, x % s), off),
        };
        writers.entry(class).or_default().push(Write {
            op: i as u32,
            base,
            offset: dst.offset,
            end: dst.end(),
            rotate: ex.region_shift(i as u32, j),
        });
    }
    let req = &plan.request;
    let mut cone = Cone {
        index: HashMap::new(),
        ex: &ex,
        levels,
        writers,
        memo: HashMap::new(),
        dtype: req.dtype,
        op: req.op,
        seed,
    };
    let expected = req.expected()?;
    let n = req.gpus.len() as u32;
    for &(r, x) in targets {
        let piece = expected
            .iter()
            .find(|p| p.rank == r && p.out_offset <= x && x < p.out_offset + p.len)
            .ok_or_else(|| {
                bad(
                    usize::MAX,
                    format!("rank {r}'s output element {x} is not part of the request"),
                )
            })?;
        let within = x - piece.out_offset;
        let mut want: Option<Value> = None;
        for &(sr, so) in &piece.terms {
            let v = cone.input(sr, so + within)?;
            want = Some(match want {
                None => v,
                Some(a) => Value {
                    v: combine(req.dtype, req.op, a.v, v.v)?,
                    avg: false,
                },
            });
        }
        let mut want = want.ok_or_else(|| bad(usize::MAX, "an empty expected piece".into()))?;
        if piece.terms.len() > 1 && req.op == ReduceOp::Avg {
            want.avg = true;
        }
        let out = BufferRef::Output(r);
        let got = match cone.last_write(out, x, (u32::MAX, u64::MAX))? {
            Some(w) => cone.eval(w)?,
            None => {
                return Err(bad(
                    usize::MAX,
                    format!("no op writes rank {r}'s output element {x}"),
                ));
            }
        };
        // `Avg` over one rank divides by one: the plan may or may not mark it.
        let same = got == want || (n == 1 && got.v == want.v);
        if !same {
            return Err(bad(
                usize::MAX,
                format!(
                    "rank {r}'s output element {x} holds {got:?} where the request asks for \
                     {want:?}"
                ),
            ));
        }
    }
    let mut ops: Vec<u64> = cone.memo.keys().map(|k| k.0).collect();
    ops.sort_unstable();
    ops.dedup();
    Ok(SampleReport {
        targets: targets.to_vec(),
        cone_ops: ops.len(),
        cone_values: cone.memo.len(),
        full_ops: ex.full_ops(),
    })
}

/// [`check_elements`] on `opts.ranks` ranks and `opts.elements` output elements of each
/// (its first and last among them), chosen by `opts.seed`.
///
/// # Errors
/// Those of [`check_elements`].
pub fn check_sampled(plan: &Plan, topo: &Topology, opts: &SampleOptions) -> Result<SampleReport> {
    let req = &plan.request;
    let n = req.gpus.len() as u64;
    let mut ranks: Vec<u32> = Vec::new();
    let mut h = mix(opts.seed);
    while ranks.len() < opts.ranks.min(n as usize) {
        h = mix(h);
        let r = (h % n) as u32;
        if !ranks.contains(&r) {
            ranks.push(r);
        }
    }
    let mut targets = Vec::new();
    for &r in &ranks {
        let len = req.output_len(r)?;
        if len == 0 {
            continue;
        }
        targets.push((r, 0));
        if opts.elements > 1 {
            targets.push((r, len - 1));
        }
        for _ in 2..opts.elements {
            h = mix(h);
            targets.push((r, h % len));
        }
    }
    targets.sort_unstable();
    targets.dedup();
    check_elements(plan, topo, &targets, opts.seed)
}
