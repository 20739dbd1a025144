//! What every planner takes and shares: the context of a planning call ([`PlannerContext`]: connections,
//! link mode, chunk, channels), the planner signature, the pipelining chunk, and the chunking
//! and naming helpers. The planners build on it, and so does `lib.rs`, which gathers
//! the planners and re-exports these.

use relaycc_topo::Topology;

use relaycc_plan::Plan;
use relaycc_plan::Request;
use relaycc_plan::Result;

use super::connect::{ConnCache, LinkMode};

/// Chunk size used when the caller gives none, bytes (NCCL Simple protocol's step, 512 KiB).
pub const DEFAULT_CHUNK_BYTES: u64 = 512 << 10;

/// Staging slots per receive ring: chunks that may be in flight into one receiver before the
/// first is consumed (write-after-read dependencies make reuse safe).
pub const RECV_SLOTS: u64 = 4;

/// What a candidate planner needs besides the topology and the request.
#[derive(Debug, Clone, Copy)]
pub struct PlannerContext<'c> {
    /// Connections of this planning call (carries the topology, members and relay policy).
    pub cache: &'c ConnCache<'c>,
    /// Which routes connections use.
    pub mode: LinkMode,
    /// Pipelining chunk, elements (at least 1).
    pub chunk_elems: u64,
    /// Channels (rings or trees at once, each carrying a share of the data; the odd ones run
    /// in the reverse order), at least 1; or [`PACKED_RINGS`] for ring planners: as many rings
    /// as [`super::ring_pack::packed_rings`] finds room for.
    pub channels: u32,
    /// The window of a windowed build ([`crate::template::build_template`]): the builders
    /// emit only the ops that touch it. `None` (every build outside a template) emits every
    /// op.
    pub window: Option<&'c crate::template::Window>,
    /// The ops and deadline the build runs under ([`crate::Limit`]): its builders charge
    /// every op they write to it and stop once it is passed. `None` builds without a limit.
    pub limit: Option<&'c crate::limits::Limit>,
    /// Build only `k` of the steps that repeat, a step sample of an NCCL-like baseline too
    /// large to build ([`relaycc_plan::step_samples`]): of each ring phase, the reduce-scatter's last
    /// `k` steps (so it still finishes each rank's block, which the all-gather waits for) and
    /// the all-gather's first `k`; of each double binary tree channel, its first `k` chunks;
    /// of a grouped send/recv all_to_all, its first `k` rounds. `None` (every build but the
    /// baseline's samples) builds every step.
    pub sample_steps: Option<u64>,
}

impl<'c> PlannerContext<'c> {
    /// A context of `cache`'s connections in `mode`, pipelined in chunks of `chunk_elems`
    /// (at least 1) over `channels`: every op built (no window), no limit, every ring step.
    pub fn new(cache: &'c ConnCache<'c>, mode: LinkMode, chunk_elems: u64, channels: u32) -> Self {
        PlannerContext {
            cache,
            mode,
            chunk_elems: chunk_elems.max(1),
            channels,
            window: None,
            limit: None,
            sample_steps: None,
        }
    }
}

/// `PlannerContext::channels` asking ring planners for packed rings ([`super::ring_pack`]).
pub const PACKED_RINGS: u32 = 0;

/// A candidate planner.
pub type PlannerFn = fn(&Topology, &Request, &PlannerContext) -> Result<Plan>;

/// `len` elements in chunks of `chunk`: `(offset, len)` pairs.
pub(crate) fn chunks(len: u64, chunk: u64) -> impl Iterator<Item = (u64, u64)> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk)).map(move |k| (k * chunk, chunk.min(len - k * chunk)))
}

/// `len` split into `parts` contiguous `(offset, len)` pieces, the first ones one larger.
pub(crate) fn split_even(len: u64, parts: u64) -> Vec<(u64, u64)> {
    let parts = parts.max(1);
    let (q, r) = (len / parts, len % parts);
    let mut off = 0;
    (0..parts)
        .map(|i| {
            let l = q + u64::from(i < r);
            let p = (off, l);
            off += l;
            p
        })
        .collect()
}

/// A display name: `ring x2 multipath chunk 131072`.
pub(crate) fn name(algo: &str, ctx: &PlannerContext) -> String {
    format!("{algo} x{} {}", ctx.channels, links_and_chunk(ctx))
}

/// The link mode and chunk part of a display name: `multipath chunk 131072`.
pub(crate) fn links_and_chunk(ctx: &PlannerContext) -> String {
    let mode = match ctx.mode {
        LinkMode::Nccl => "nccl-links",
        LinkMode::Single => "single",
        LinkMode::Multipath => "multipath",
    };
    format!("{mode} chunk {}", ctx.chunk_elems)
}

/// Chunks per rank's block that pipelined plans split it into: enough to overlap the steps of
/// a ring or tree, few enough that a plan's op count (and so planning time) does not grow with
/// the message size.
pub const CHUNKS_PER_BLOCK: u64 = 4;

/// The pipelining chunk (elements) for `req`: one rank's block split into [`CHUNKS_PER_BLOCK`],
/// never below NCCL's 512 KiB step. The baseline uses the same chunk as relaycc's candidates,
/// so comparisons measure routes and algorithms rather than the per-op cost (NCCL's persistent
/// kernels do not pay a launch per step, which a fixed 512 KiB chunk would charge them).
pub fn pipeline_chunk_elems(req: &Request) -> u64 {
    let esize = req.dtype.size().max(1);
    let block = req.size_bytes() / (req.nranks().max(1) as u64);
    (block / CHUNKS_PER_BLOCK).max(DEFAULT_CHUNK_BYTES) / esize
}
