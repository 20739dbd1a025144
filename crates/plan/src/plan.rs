//! The Plan IR: a DAG of single-hop copies and local reductions on regions of device or pinned
//! host memory. Plans are plain data: the simulator times them, the host backend executes them
//! to prove them correct, the CUDA and MPI backends run them.
//!
//! Conventions, so that anyone can recompute a plan's figures from its JSON and the topology
//! JSON (`relaycc topo show --format json`):
//! - a [`Location::Gpu`] names a GPU index; a [`Location::Host`] names a CPU socket by its index
//!   in the topology JSON's `nodes` array (the petgraph node index);
//! - an op's `edges` are indices into the topology JSON's `links` array (petgraph edge indices),
//!   in path order;
//! - regions count elements of the plan's `dtype`, not bytes.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::request::Request;

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Location {
    /// Device memory of a GPU (by GPU index).
    Gpu(u32),
    /// Pinned host memory of a CPU socket (by topology node index).
    Host(u32),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Gpu(g) => write!(f, "GPU{g}"),
            Location::Host(n) => write!(f, "host{n}"),
        }
    }
}

/// A buffer a plan reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferRef {
    /// The user's input buffer of a rank (on the rank's GPU).
    Input(u32),
    /// The user's output buffer of a rank (on the rank's GPU).
    Output(u32),
    /// A staging buffer the plan allocates (`Plan::scratch[i]`).
    Scratch(u32),
}

/// A contiguous range of elements of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Region {
    /// The buffer.
    pub buffer: BufferRef,
    /// First element.
    pub offset: u64,
    /// Number of elements.
    pub len: u64,
}

impl Region {
    /// `len` elements of `buffer` from `offset`.
    pub const fn new(buffer: BufferRef, offset: u64, len: u64) -> Self {
        Region {
            buffer,
            offset,
            len,
        }
    }
    /// One past the last element.
    pub const fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A staging buffer: where it lives and how many elements it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scratch {
    /// Where the buffer is allocated.
    pub location: Location,
    /// Elements.
    pub len: u64,
}

/// What an op does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpKind {
    /// Copy `src` to `dst` (same length) over the op's `edges`; one hop between two memories
    /// that the hardware connects, through switches but never through another memory.
    Copy {
        /// Source region.
        src: Region,
        /// Destination region.
        dst: Region,
    },
    /// `dst = op(srcs...)` elementwise with the plan's reduce op, on the device holding `dst`;
    /// every source lives in that same memory (reductions are local; remote data is copied in
    /// first). With `finalize` and the `Avg` op, the result is divided by the number of ranks.
    Reduce {
        /// Source regions, all of `dst`'s length (one or more; `dst` may be one of them).
        srcs: Vec<Region>,
        /// Destination region.
        dst: Region,
        /// Apply the `Avg` division here (ignored for other ops).
        #[serde(default)]
        finalize: bool,
    },
}

/// One operation of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// What it does.
    #[serde(flatten)]
    pub kind: OpKind,
    /// The lane (stream) that runs it; ops of one lane run in order.
    pub lane: u32,
    /// Ops (indices) that must finish first, besides earlier ops of the same lane.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<u32>,
    /// Directed topology links a copy occupies, in path order (empty for reductions and for
    /// copies inside one memory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edges: Vec<u32>,
    /// For a copy that an NVSwitch combines with others (NVLS, NVLink SHARP): its group and
    /// the edge the group crosses once. Absent for every other op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvls: Option<NvlsShare>,
}

/// A copy's part in an NVLS group: copies of equal length through one NVSwitch that the switch
/// combines, so the group crosses one of its edges once instead of once per copy.
///
/// - A **multicast** group has one source region: the source GPU sends the bytes to the switch
///   once (the shared edge is the first) and the switch writes every destination.
/// - A **reduction** group has one destination GPU: the switch reads every source, reduces, and
///   sends the destination one result (the shared edge is the last). The plan still delivers
///   each source to its own staging region and reduces them locally, so that the host backend
///   runs it byte for byte; the simulator charges the shared edge once.
///
/// The checker proves the group's shape ([`crate::check`]) and that the switch can combine
/// ([`crate::check_routes`]: an NVSwitch whose GPUs are sm90 or later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NvlsShare {
    /// Group id, unique within the plan.
    pub group: u32,
    /// The directed edge (an index into the op's `edges`' topology) the group crosses once.
    pub shared_edge: u32,
}

impl Op {
    /// Elements the op moves or produces.
    pub fn len(&self) -> u64 {
        match &self.kind {
            OpKind::Copy { dst, .. } | OpKind::Reduce { dst, .. } => dst.len,
        }
    }
    /// True when the op moves nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A lane: an in-order queue of ops run by one device (a CUDA stream, a host thread).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lane {
    /// The device that drives the lane (the copy engine's or kernel's owner).
    pub location: Location,
    /// A label for traces (`GPU0 ch1 send`).
    pub label: String,
}

/// A complete plan for one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The request the plan serves.
    pub request: Request,
    /// Which algorithm made it (`direct`, `relay via GPU3`, `ring x2 + relay`, ...).
    pub algorithm: String,
    /// Element type (the request's).
    pub dtype: DType,
    /// Staging buffers.
    #[serde(default)]
    pub scratch: Vec<Scratch>,
    /// Lanes.
    pub lanes: Vec<Lane>,
    /// Operations; an op's index is its id.
    pub ops: Vec<Op>,
    /// The NCCL protocol the plan's steps use, for a plan that models NCCL's kernels (the
    /// baseline); absent for relaycc's own plans, whose copies run on copy engines and whose
    /// reductions are kernels. The simulator charges each its costs
    /// ([`relaycc_topo::rates::CostModel`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<relaycc_topo::rates::Protocol>,
    /// Present when the plan is a template (`relaycc_planners::template`): the ops of one fundamental
    /// domain of hosts, standing for the full plan on a topology whose hosts repeat. The
    /// simulator times the full plan from it; the data-proof checker refuses it and the
    /// executor never runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
    /// Present when the plan is a plan of rounds ([`crate::rounds`]): the plan itself holds no
    /// op, lane or staging buffer; one round's plan runs [`Rounds::count`] times over
    /// successive slices of every buffer's pieces, then the tail's plan over what the rounds
    /// leave, each after the one before has finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<Box<Rounds>>,
    /// Present when the plan is step-sampled ([`crate::step_samples`]): the plan itself holds
    /// no op; it stands for a plan too large to build, timed from two builds of its first
    /// steps. No proof is made of it and no executor runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_samples: Option<Box<StepSamples>>,
    /// True when every GPU of the plan is an arena of one device's memory (ranks sharing one
    /// GPU, `Topology::shared_device`): a reduction may then read sources on any of them, as
    /// one kernel on that GPU reads them all. Only the shared-memory planner sets it; in JSON
    /// only when set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub one_device_memory: bool,
}

/// What a step-sampled plan stands for ([`Plan::step_samples`], [`crate::step_samples`]): a
/// plan whose steps repeat [`StepSamples::full`] times (a ring's steps per phase), held as two
/// plans of the same request that build only the first [`StepSamples::short_kept`] and
/// [`StepSamples::long_kept`] of them, every rank taking part in each step as in the full
/// plan. The simulator times the full plan by extrapolating their makespans along the steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSamples {
    /// What repeats (`ring steps per phase`).
    pub what: String,
    /// Repetitions in the full plan.
    pub full: u64,
    /// Repetitions the short sample builds (at least 1).
    pub short_kept: u64,
    /// Repetitions the long sample builds (more than the short's, fewer than `full`).
    pub long_kept: u64,
    /// The short sample.
    pub short: Plan,
    /// The long sample.
    pub long: Plan,
}

impl StepSamples {
    /// Ops of the full plan these samples stand for, extrapolated from theirs as its makespan
    /// is (saturating).
    pub fn full_ops(&self) -> u64 {
        let (short, long) = (self.short.full_ops(), self.long.full_ops());
        let between = self.long_kept.saturating_sub(self.short_kept).max(1);
        let per_step = long.saturating_sub(short).div_ceil(between);
        long.saturating_add(per_step.saturating_mul(self.full.saturating_sub(self.long_kept)))
    }
}

/// What a plan of rounds stands for ([`Plan::rounds`], [`crate::rounds`]): a request whose
/// buffers are pieces (blocks of `count` elements, or the pieces a `v` collective or a
/// send_recv names) cut into [`Rounds::count`] equal slices per piece and a remainder.
///
/// Round `k` is [`Rounds::body`], a plan of the request whose every piece has
/// `floor(len / count)` elements, run on elements `[k x s, (k + 1) x s)` of each piece of
/// length `len` (`s` being that piece's length in the body's request); the tail, a plan of the
/// request of the remainders `len - count x s`, runs on the elements the rounds leave. Each
/// round starts once the one before has finished, and the tail once the last round has, so
/// the rounds reuse one set of staging buffers: the plan's staging on a device is the larger
/// of the body's and the tail's there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rounds {
    /// Rounds the body runs (at least 2).
    pub count: u64,
    /// The plan of one round, for the request of the rounds' slices.
    pub body: Plan,
    /// The plan of the remainders, absent when every piece divides into the rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<Plan>,
}

/// What a template plan stands for: the full plan is the template's ops repeated on every
/// period of hosts (`periods` shifts of `period` hosts each).
///
/// Op `i` of period `k` is the template's op `i` with its memories and edges shifted `k`
/// periods on, its user buffers' ranks shifted `k x m` (`m` ranks per period), and each
/// dependency, staging buffer and edge that lay in another period of the domain's op shifted
/// by that period's offset too ([`Template::offsets`]); `relaycc_planners::template::expand()` builds it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Template {
    /// Hosts of the topology.
    pub hosts: u32,
    /// Hosts per period (the domain is hosts `0..period`).
    pub period: u32,
    /// Periods (the full plan is `periods` images of the domain's ops).
    pub periods: u32,
    /// Ops of the full plan (the domain's times `periods`).
    pub full_ops: u64,
    /// Lanes of the full plan (the domain's times `periods`).
    pub full_lanes: u64,
    /// Capacity scale of the representative edges the template's ops name, where it is not 1:
    /// an edge every shift fixes carries the images' traffic of all periods, so the template's
    /// share of it is `orbit size / periods` of its rate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_scale: Vec<EdgeScale>,
    /// True when the fold recorded [`Template::offsets`] and [`Template::shifts`] and found
    /// every period's ops expressed by them, so the template expands exactly into the full
    /// plan; false for a template whose data layout moves otherwise between periods, and for
    /// one read from JSON written without them.
    #[serde(default)]
    pub exact: bool,
    /// Why a template the fold made is not exact: the first region whose image on another
    /// period [`Template::offsets`] and [`Template::shifts`] cannot express.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inexact: Option<String>,
    /// The period offsets the fold dropped: every reference of a template op (a dependency,
    /// a staging buffer of a region, an edge, an NVLS group's shared edge) that named memory or
    /// an op of period `p` other than the domain's, as `p`; sorted by op. A reference not
    /// listed lies in the op's own period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offsets: Vec<PeriodOffset>,
    /// How far each region's offset moves per period, where it moves: data blocks follow
    /// their ranks, so the image of a copy of rank 0's block moves rank `m`'s; sorted by op.
    /// A region not listed keeps its offset on every period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shifts: Vec<RegionShift>,
    /// While a windowed build waits for its fold: the key of every lane, by lane index.
    #[serde(skip)]
    pub window_lanes: Vec<Option<LaneKey>>,
}

/// What a lane is for: a hop's queue or a device's local work, as the lowering's
/// `relaycc_planners::route_pipeline::LaneMap` keys the lanes it makes. Under a shift of hosts a lane's image is
/// the lane of the shifted key (`relaycc_planners::template`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LaneKey {
    /// Copies `from -> to` on `channel`, queue `queue`.
    Hop {
        /// Sending memory.
        from: Location,
        /// Receiving memory.
        to: Location,
        /// Lane channel.
        channel: u32,
        /// Queue of the hop.
        queue: u32,
    },
    /// Local work (reductions, local copies) on `at`.
    Local {
        /// The device.
        at: Location,
        /// Lane channel.
        channel: u32,
    },
}

/// A reference of a template op that lies `periods` periods after the op's own
/// ([`Template::offsets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodOffset {
    /// The template op.
    pub op: u32,
    /// Which of its references.
    pub at: OffsetAt,
    /// Periods on from the op's own (below [`Template::periods`]).
    pub periods: u32,
}

/// A region of a template op whose offset rotates `elems` elements per period within its
/// aligned block of `block` elements: in period `k` it starts at
/// `base + (offset - base + k x elems) mod block`, `base` being `offset` rounded down to a
/// multiple of `block` ([`Template::shifts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionShift {
    /// The template op.
    pub op: u32,
    /// Its region (a copy's source then destination; a reduction's sources then destination).
    pub region: u32,
    /// Elements per period.
    pub elems: u64,
    /// Elements of the block it rotates in (its buffer, or one ring of blocks, one per period).
    pub block: u64,
}

/// Which reference of an op a [`PeriodOffset`] shifts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffsetAt {
    /// Entry `i` of the op's `deps`.
    Dep(u32),
    /// Region `i` of the op (a copy's source then destination; a reduction's sources then
    /// destination), when it names a staging buffer.
    Region(u32),
    /// Entry `i` of the op's `edges`.
    Edge(u32),
    /// The op's NVLS shared edge.
    Nvls,
}

/// A representative edge's capacity in a template, as a fraction of its rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EdgeScale {
    /// The edge (topology link index).
    pub edge: u32,
    /// Its capacity's factor (orbit size / periods).
    pub scale: f64,
}

impl Plan {
    /// An empty plan for `request`.
    pub fn new(request: Request, algorithm: impl Into<String>) -> Self {
        let dtype = request.dtype;
        Plan {
            request,
            algorithm: algorithm.into(),
            dtype,
            scratch: Vec::new(),
            lanes: Vec::new(),
            ops: Vec::new(),
            protocol: None,
            template: None,
            rounds: None,
            step_samples: None,
            one_device_memory: false,
        }
    }
    /// Where a buffer lives.
    pub fn location(&self, b: BufferRef) -> Option<Location> {
        match b {
            BufferRef::Input(r) | BufferRef::Output(r) => {
                self.request.gpus.get(r as usize).map(|g| Location::Gpu(*g))
            }
            BufferRef::Scratch(i) => self.scratch.get(i as usize).map(|s| s.location),
        }
    }
    /// Add a staging buffer; returns its reference.
    pub fn add_scratch(&mut self, location: Location, len: u64) -> BufferRef {
        self.scratch.push(Scratch { location, len });
        BufferRef::Scratch(self.scratch.len() as u32 - 1)
    }
    /// Add a lane; returns its index.
    pub fn add_lane(&mut self, location: Location, label: impl Into<String>) -> u32 {
        self.lanes.push(Lane {
            location,
            label: label.into(),
        });
        self.lanes.len() as u32 - 1
    }
    /// Add a copy; returns its op id.
    pub fn copy(
        &mut self,
        lane: u32,
        src: Region,
        dst: Region,
        edges: Vec<u32>,
        deps: Vec<u32>,
    ) -> u32 {
        self.ops.push(Op {
            kind: OpKind::Copy { src, dst },
            lane,
            deps,
            edges,
            nvls: None,
        });
        self.ops.len() as u32 - 1
    }
    /// Add a copy that is part of NVLS group `share.group`; returns its op id.
    pub fn nvls_copy(
        &mut self,
        lane: u32,
        src: Region,
        dst: Region,
        edges: Vec<u32>,
        deps: Vec<u32>,
        share: NvlsShare,
    ) -> u32 {
        let id = self.copy(lane, src, dst, edges, deps);
        self.ops[id as usize].nvls = Some(share);
        id
    }
    /// Add a local reduction; returns its op id.
    pub fn reduce(
        &mut self,
        lane: u32,
        srcs: Vec<Region>,
        dst: Region,
        finalize: bool,
        deps: Vec<u32>,
    ) -> u32 {
        self.ops.push(Op {
            kind: OpKind::Reduce {
                srcs,
                dst,
                finalize,
            },
            lane,
            deps,
            edges: Vec::new(),
            nvls: None,
        });
        self.ops.len() as u32 - 1
    }
    /// Bytes of staging memory the plan allocates (for a plan of rounds, the sum over devices
    /// of [`Plan::staging_per_location`]).
    pub fn scratch_bytes(&self) -> u64 {
        if self.rounds.is_some() || self.step_samples.is_some() {
            return self
                .staging_per_location()
                .values()
                .fold(0u64, |a, b| a.saturating_add(*b));
        }
        self.scratch
            .iter()
            .map(|s| s.len.saturating_mul(self.dtype.size()))
            .fold(0u64, u64::saturating_add)
    }
    /// Bytes of staging memory the plan allocates on each memory (GPU or host socket), in
    /// [`Location`] order; memories without staging are left out. A plan of rounds reuses one
    /// set of staging for its rounds and its tail, which run one after another: on each device
    /// the larger of the body's and the tail's. A step-sampled plan's is its long sample's
    /// (the full plan's staging holds a loop's blocks, whatever its steps).
    pub fn staging_per_location(&self) -> std::collections::BTreeMap<Location, u64> {
        let mut per = std::collections::BTreeMap::new();
        for s in &self.scratch {
            let e: &mut u64 = per.entry(s.location).or_default();
            *e = e.saturating_add(s.len.saturating_mul(self.dtype.size()));
        }
        if let Some(r) = &self.rounds {
            for part in std::iter::once(&r.body).chain(&r.tail) {
                for (at, b) in part.staging_per_location() {
                    let e: &mut u64 = per.entry(at).or_default();
                    *e = (*e).max(b);
                }
            }
        }
        if let Some(s) = &self.step_samples {
            for (at, b) in s.long.staging_per_location() {
                let e: &mut u64 = per.entry(at).or_default();
                *e = (*e).max(b);
            }
        }
        per.retain(|_, b| *b > 0);
        per
    }
    /// Ops the plan holds: its own, for a plan of rounds its body's and its tail's, for a
    /// step-sampled plan its samples'.
    pub fn stored_ops(&self) -> u64 {
        let own = self.ops.len() as u64;
        if let Some(s) = &self.step_samples {
            return own + s.short.stored_ops() + s.long.stored_ops();
        }
        self.rounds.as_ref().map_or(own, |r| {
            own + r.body.stored_ops() + r.tail.as_ref().map_or(0, Plan::stored_ops)
        })
    }
    /// Ops of the plan it stands for, run in full: a template's full plan's
    /// ([`Template::full_ops`]), a plan of rounds' body ops once per round and its tail's
    /// (saturating), a step-sampled plan's extrapolated from its samples
    /// ([`crate::step_samples`]), else its own.
    pub fn full_ops(&self) -> u64 {
        if let Some(s) = &self.step_samples {
            return s.full_ops();
        }
        if let Some(r) = &self.rounds {
            return r
                .body
                .full_ops()
                .saturating_mul(r.count)
                .saturating_add(r.tail.as_ref().map_or(0, Plan::full_ops));
        }
        self.template
            .as_ref()
            .map_or(self.ops.len() as u64, |t| t.full_ops)
    }
    /// True when the plan is step-sampled ([`Plan::step_samples`]).
    pub fn is_step_sampled(&self) -> bool {
        self.step_samples.is_some()
    }
    /// True when the plan is a plan of rounds ([`Plan::rounds`]).
    pub fn is_rounds(&self) -> bool {
        self.rounds.is_some()
    }
    /// The plan as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
    /// True when the plan is a template ([`Plan::template`]): it holds one domain's ops only.
    pub fn is_template(&self) -> bool {
        self.template.is_some()
    }
    /// Read a plan from JSON.
    pub fn from_json(text: &str) -> crate::Result<Plan> {
        serde_json::from_str(text).map_err(|e| crate::RouteError::PlanJson(e.to_string()))
    }
}

/// A memory as the in-place call lays it out: a rank's input and output share one memory for
/// collectives with an in-place form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mem {
    /// The rank's memory: its input, and its output where the call is in place.
    Rank(u32),
    /// The rank's separate output, out of place.
    RankOut(u32),
    /// A scratch buffer of the plan.
    Scratch(u32),
}

/// Where a buffer sits in the in-place layout (memory and base offset), as the checker's
/// in-place mode places it.
pub fn mem_of(req: &Request, b: BufferRef) -> (Mem, u64) {
    let (r, out) = match b {
        BufferRef::Scratch(i) => return (Mem::Scratch(i), 0),
        BufferRef::Input(r) => (r, false),
        BufferRef::Output(r) => (r, true),
    };
    match req.in_place(r) {
        Some(at) => (Mem::Rank(r), if out { at.output_at } else { at.input_at }),
        None if out => (Mem::RankOut(r), 0),
        None => (Mem::Rank(r), 0),
    }
}
