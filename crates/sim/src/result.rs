//! What a simulation reports: the makespan, each op's timeline, the load on each edge and
//! memory, and the nccl-tests bandwidth figures derived from the makespan; and the result of a
//! plan of rounds combined from its segments' (`combine_results`) and of a step-sampled plan
//! extrapolated from its samples' (`extrapolate_results`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use relaycc_plan::Location;
use relaycc_plan::Request;
use relaycc_plan::rounds::rounds_us;

use super::config::BYTES_PER_US_PER_GBPS;

/// When one op ran.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpSpan {
    /// When the op became ready and began its fixed latency, us.
    pub start_us: f64,
    /// When its latency was over and its bytes began to flow, us.
    pub flow_start_us: f64,
    /// When its last byte arrived, us.
    pub end_us: f64,
}

impl OpSpan {
    /// Time from start to end, us.
    pub fn duration_us(&self) -> f64 {
        self.end_us - self.start_us
    }
}

/// The load one directed topology edge carried.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EdgeUse {
    /// The edge (petgraph edge index, as ops name it).
    pub edge: u32,
    /// Bytes it carried.
    pub bytes: f64,
    /// Time during which at least one flow crossed it, us.
    pub busy_us: f64,
    /// `bytes / (capacity x makespan)`: 1 means full for the whole plan.
    pub utilisation: f64,
}

/// The load one memory (a GPU's device memory, a socket's host memory) carried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemUse {
    /// The memory.
    pub location: Location,
    /// Its name for reports: `GPU0`, `CPU1`.
    pub name: String,
    /// Bytes read and written: a copy inside the memory counts its bytes twice, a reduction
    /// `srcs + 1` times, a copy crossing links once per end in this memory.
    pub bytes: f64,
    /// Time during which at least one flow used it, us.
    pub busy_us: f64,
    /// `bytes / (bandwidth x makespan)`.
    pub utilisation: f64,
}

/// The outcome of [`simulate`](crate::simulate).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimResult {
    /// Makespan: when the last op ended, us (0 for an empty plan).
    pub time_us: f64,
    /// One span per op, by op id.
    pub ops: Vec<OpSpan>,
    /// Edges that carried bytes, by edge index.
    pub edges: Vec<EdgeUse>,
    /// Memories that carried bytes, GPUs first, then host memories.
    pub memories: Vec<MemUse>,
}

/// Bandwidth figures as nccl-tests prints them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Perf {
    /// Makespan, us.
    pub time_us: f64,
    /// Algorithm bandwidth: the request's size (nccl-tests' `size`) over the time, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth: `algbw` times the collective's factor (all_reduce `2(n-1)/n`), GB/s.
    pub busbw_gbps: f64,
}

impl Perf {
    /// nccl-tests' figures for `request` taking `time_us`: `algbw = size / time`,
    /// `busbw = algbw x factor(n)`; both 0 when the time is 0 or not finite.
    pub fn from_time(request: &Request, time_us: f64) -> Perf {
        let algbw_gbps = if time_us > 0.0 && time_us.is_finite() {
            request.size_bytes() as f64 / time_us / BYTES_PER_US_PER_GBPS
        } else {
            0.0
        };
        Perf {
            time_us,
            algbw_gbps,
            busbw_gbps: algbw_gbps * request.collective.busbw_factor(request.nranks()),
        }
    }
}

impl SimResult {
    /// nccl-tests' figures for `request` at this makespan: `algbw = size / time`,
    /// `busbw = algbw x factor(n)` ([`Request::size_bytes`],
    /// [`Collective::busbw_factor`](relaycc_plan::Collective::busbw_factor)). Both are 0 when the
    /// time is 0, rather than infinite.
    pub fn perf(&self, request: &Request) -> Perf {
        Perf::from_time(request, self.time_us)
    }

    /// The use of edge `edge`, if it carried bytes.
    pub fn edge(&self, edge: u32) -> Option<&EdgeUse> {
        self.edges
            .binary_search_by_key(&edge, |e| e.edge)
            .ok()
            .map(|k| &self.edges[k])
    }

    /// The use of memory `location`, if it carried bytes.
    pub fn memory(&self, location: Location) -> Option<&MemUse> {
        self.memories.iter().find(|m| m.location == location)
    }
}

/// The simulation of a plan of rounds from its segments': the makespan `count` times the
/// body's plus the tail's; no op spans (the plan holds no op of its own); each edge's and
/// memory's bytes and busy time summed over the segments, and its utilisation their
/// time-weighted mean over the makespan.
pub(super) fn combine_results(count: u64, body: &SimResult, tail: Option<&SimResult>) -> SimResult {
    let time_us = rounds_us(count, body.time_us, tail.map(|t| t.time_us));
    let segs: Vec<(&SimResult, f64)> = std::iter::once((body, count as f64))
        .chain(tail.map(|t| (t, 1.0)))
        .collect();
    weighted_results(time_us, &segs)
}

/// The simulation of a step-sampled plan from its samples' ([`relaycc_plan::step_samples`]): the
/// makespan `time_us` (their extrapolation), and each edge's and memory's loads extrapolated
/// alike, `long + more x (long - short)` (at least 0), where `more` is the steps the long
/// sample lacks over the steps between the samples.
pub(super) fn extrapolate_results(
    time_us: f64,
    short: &SimResult,
    long: &SimResult,
    more: f64,
) -> SimResult {
    weighted_results(time_us, &[(long, 1.0 + more), (short, -more)])
}

/// A result of makespan `time_us` whose loads are `segs`' weighted sums: bytes and busy time
/// summed with the weights, utilisation their time-weighted mean over the makespan (each at
/// least 0); no op spans.
fn weighted_results(time_us: f64, segs: &[(&SimResult, f64)]) -> SimResult {
    let weight = |seg: &SimResult, w: f64| w * seg.time_us;
    let share = |util_x_time: f64| {
        if time_us > 0.0 {
            util_x_time / time_us
        } else {
            0.0
        }
    };
    let mut edges: BTreeMap<u32, (f64, f64, f64)> = BTreeMap::new();
    let mut mems: BTreeMap<Location, (String, f64, f64, f64)> = BTreeMap::new();
    for &(seg, w) in segs {
        for e in &seg.edges {
            let v = edges.entry(e.edge).or_default();
            v.0 += w * e.bytes;
            v.1 += w * e.busy_us;
            v.2 += e.utilisation * weight(seg, w);
        }
        for m in &seg.memories {
            let v = mems
                .entry(m.location)
                .or_insert_with(|| (m.name.clone(), 0.0, 0.0, 0.0));
            v.1 += w * m.bytes;
            v.2 += w * m.busy_us;
            v.3 += m.utilisation * weight(seg, w);
        }
    }
    SimResult {
        time_us,
        ops: Vec::new(),
        edges: edges
            .into_iter()
            .map(|(edge, (bytes, busy_us, u))| EdgeUse {
                edge,
                bytes: bytes.max(0.0),
                busy_us: busy_us.max(0.0),
                utilisation: share(u).max(0.0),
            })
            .collect(),
        memories: mems
            .into_iter()
            .map(|(location, (name, bytes, busy_us, u))| MemUse {
                location,
                name,
                bytes: bytes.max(0.0),
                busy_us: busy_us.max(0.0),
                utilisation: share(u).max(0.0),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaycc_plan::{Collective, DType};

    #[test]
    fn perf_follows_nccl_tests() {
        let req = Request::new(Collective::AllGather, vec![0, 1, 2, 3], 1 << 20, DType::F32);
        let r = SimResult {
            time_us: 1000.0,
            ops: Vec::new(),
            edges: Vec::new(),
            memories: Vec::new(),
        };
        let p = r.perf(&req);
        // all_gather size is n x count x 4 bytes = 16 MiB; over 1 ms that is 16.777 GB/s.
        let algbw = (4u64 << 22) as f64 / 1000.0 / 1e3;
        assert!((p.algbw_gbps - algbw).abs() < 1e-12);
        assert!((p.busbw_gbps - algbw * 0.75).abs() < 1e-12);
        let zero = SimResult { time_us: 0.0, ..r };
        assert_eq!(zero.perf(&req).algbw_gbps, 0.0);
    }

    #[test]
    fn lookups_find_used_resources() {
        let r = SimResult {
            time_us: 1.0,
            ops: vec![OpSpan {
                start_us: 0.0,
                flow_start_us: 0.25,
                end_us: 1.0,
            }],
            edges: vec![
                EdgeUse {
                    edge: 2,
                    bytes: 1.0,
                    busy_us: 1.0,
                    utilisation: 0.5,
                },
                EdgeUse {
                    edge: 7,
                    bytes: 1.0,
                    busy_us: 1.0,
                    utilisation: 0.5,
                },
            ],
            memories: Vec::new(),
        };
        assert_eq!(r.edge(7).map(|e| e.edge), Some(7));
        assert!(r.edge(3).is_none());
        assert!(r.memory(Location::Gpu(0)).is_none());
        assert_eq!(r.ops[0].duration_us(), 1.0);
    }
}
