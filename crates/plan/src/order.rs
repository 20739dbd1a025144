//! The dependency order of a plan's ops: an op waits for its `deps` and for the previous op of
//! its lane. The checker, the simulator, the executor and the MPI schedule all read the order
//! from here, so they agree on what a plan's dependencies are and on how a bad one is named.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Result, RouteError};
use crate::plan::Plan;

/// Marks "no op" (an op first on its lane has no lane predecessor).
const NONE: u32 = u32::MAX;

/// The dependency graph of a plan's ops (explicit deps plus lane order), with successor lists
/// in compressed rows. Built once per plan in O(ops + deps), four vectors in all, so that the
/// simulator can build one for every candidate it ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepGraph {
    /// The previous op of each op's lane, or [`NONE`].
    lane_prev: Vec<u32>,
    /// Each op's 1-based position on its lane.
    lane_pos: Vec<u32>,
    /// Row starts of `succ` (one entry per op plus one).
    succ_start: Vec<u32>,
    /// Ops that wait for each op, an op repeated once per dep that names it.
    succ: Vec<u32>,
    /// How many finishes each op waits for: deps counted with repeats, plus its lane
    /// predecessor.
    in_degree: Vec<u32>,
}

fn fail(op: usize, message: String) -> RouteError {
    RouteError::PlanCheck { op, message }
}

impl Plan {
    /// The dependency graph of the plan's ops.
    ///
    /// Errors (`RouteError::PlanCheck` at the op): an op on a lane the plan lacks, or a dep on
    /// an op the plan lacks. A cycle is not an error here; [`DepGraph::topological_order`]
    /// finds it.
    ///
    /// Complexity: O(ops + deps).
    pub fn dependency_graph(&self) -> Result<DepGraph> {
        DepGraph::new(self)
    }

    /// The ops in an order that runs every op after its deps and after the earlier ops of its
    /// lane; among the ops ready at once the lowest id comes first, so the order is
    /// deterministic. Errors as [`Plan::dependency_graph`], and on a cycle.
    pub fn topological_order(&self) -> Result<Vec<u32>> {
        self.dependency_graph()?.topological_order()
    }

    /// Each op's dependency level: 0 without predecessors, else one more than the deepest of
    /// its deps and of the previous op of its lane. Ops of one level never wait for each
    /// other. Errors as [`Plan::topological_order`].
    pub fn dependency_levels(&self) -> Result<Vec<u32>> {
        self.dependency_graph()?.levels()
    }
}

impl DepGraph {
    fn new(plan: &Plan) -> Result<DepGraph> {
        if plan.rounds.is_some() {
            // Its ops are its body's and tail's, one round after another: an order of the
            // plan's own (empty) op list would run nothing.
            return Err(fail(
                usize::MAX,
                format!(
                    "{} is a plan of rounds: order its expansion (rounds::expand) or its body \
                     and tail",
                    plan.algorithm
                ),
            ));
        }
        let n = plan.ops.len();
        let lanes = plan.lanes.len();
        let mut lane_prev = vec![NONE; n];
        let mut lane_pos = vec![0u32; n];
        let mut last = vec![NONE; lanes];
        let mut lane_len = vec![0u32; lanes];
        // `succ_start` counts successors first, then becomes the row starts.
        let mut succ_start = vec![0u32; n + 1];
        let mut in_degree = vec![0u32; n];
        for (i, op) in plan.ops.iter().enumerate() {
            let l = op.lane as usize;
            if l >= lanes {
                return Err(fail(
                    i,
                    format!("runs on lane {l}, which does not exist (the plan has {lanes} lanes)"),
                ));
            }
            for &d in &op.deps {
                if d as usize >= n {
                    return Err(fail(
                        i,
                        format!("depends on op {d}, which does not exist (the plan has {n} ops)"),
                    ));
                }
                succ_start[d as usize] += 1;
            }
            lane_prev[i] = last[l];
            if last[l] != NONE {
                succ_start[last[l] as usize] += 1;
            }
            last[l] = i as u32;
            lane_len[l] += 1;
            lane_pos[i] = lane_len[l];
            in_degree[i] = op.deps.len() as u32 + u32::from(lane_prev[i] != NONE);
        }
        let mut acc = 0u32;
        for s in &mut succ_start {
            let c = *s;
            *s = acc;
            acc += c;
        }
        let mut succ = vec![0u32; acc as usize];
        let mut fill = succ_start.clone();
        for (i, op) in plan.ops.iter().enumerate() {
            let prev = lane_prev[i];
            for &d in op.deps.iter().chain((prev != NONE).then_some(&prev)) {
                succ[fill[d as usize] as usize] = i as u32;
                fill[d as usize] += 1;
            }
        }
        Ok(DepGraph {
            lane_prev,
            lane_pos,
            succ_start,
            succ,
            in_degree,
        })
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.in_degree.len()
    }

    /// True for a plan without ops.
    pub fn is_empty(&self) -> bool {
        self.in_degree.is_empty()
    }

    /// Ops that wait for op `op`, each once per dep naming `op` (plus once for lane order).
    pub fn successors(&self, op: u32) -> &[u32] {
        let (a, b) = (
            self.succ_start[op as usize] as usize,
            self.succ_start[op as usize + 1] as usize,
        );
        &self.succ[a..b]
    }

    /// The previous op of op `op`'s lane, if any.
    pub fn lane_predecessor(&self, op: u32) -> Option<u32> {
        Some(self.lane_prev[op as usize]).filter(|&p| p != NONE)
    }

    /// Op `op`'s 1-based position on its lane.
    pub fn lane_position(&self, op: u32) -> u32 {
        self.lane_pos[op as usize]
    }

    /// How many finishes each op waits for (deps counted with repeats, plus the lane
    /// predecessor): the starting counters of a run that releases an op when its count
    /// reaches zero.
    pub fn in_degrees(&self) -> &[u32] {
        &self.in_degree
    }

    /// See [`Plan::topological_order`].
    pub fn topological_order(&self) -> Result<Vec<u32>> {
        let n = self.len();
        let mut pending = self.in_degree.clone();
        let mut ready: BinaryHeap<Reverse<u32>> = (0..n as u32)
            .filter(|&i| pending[i as usize] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse(i)) = ready.pop() {
            order.push(i);
            for &s in self.successors(i) {
                pending[s as usize] -= 1;
                if pending[s as usize] == 0 {
                    ready.push(Reverse(s));
                }
            }
        }
        if order.len() != n {
            return Err(self.cycle_error(|op| pending[op] > 0));
        }
        Ok(order)
    }

    /// See [`Plan::dependency_levels`].
    pub fn levels(&self) -> Result<Vec<u32>> {
        let mut level = vec![0u32; self.len()];
        for i in self.topological_order()? {
            let next = level[i as usize] + 1;
            for &s in self.successors(i) {
                level[s as usize] = level[s as usize].max(next);
            }
        }
        Ok(level)
    }

    /// The error for a run that could not finish every op: it names an op on a dependency
    /// cycle. `unfinished(op)` says which ops never ran; where every unfinished op waits for
    /// an unfinished predecessor, walking back through them for `ops` steps ends inside a
    /// cycle. A walk that reaches an unfinished op whose predecessors all finished found no
    /// cycle: that op started and never ended (a simulation whose transfer never ends), and
    /// the error says so. Predecessor lists are built here, on the error path only.
    pub fn cycle_error(&self, unfinished: impl Fn(usize) -> bool) -> RouteError {
        let n = self.len();
        let Some(mut op) = (0..n).find(|&i| unfinished(i)) else {
            return fail(usize::MAX, "the run stopped early without a cycle".into());
        };
        let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
        for i in 0..n as u32 {
            for &s in self.successors(i) {
                preds[s as usize].push(i);
            }
        }
        for _ in 0..n {
            match preds[op].iter().find(|&&p| unfinished(p as usize)) {
                Some(&p) => op = p as usize,
                None => {
                    return fail(
                        op,
                        "never finishes, though every op it waits for did: its time is not \
                         finite"
                            .into(),
                    );
                }
            }
        }
        let lane_note = if self.lane_prev[op] != NONE {
            " (with lane order)"
        } else {
            ""
        };
        fail(
            op,
            format!("never runs: it lies on a dependency cycle{lane_note}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Location, Region};
    use crate::request::Request;

    /// `lanes` lanes and ops on `op_lanes`, each copying one element of scratch 0 to scratch 1.
    fn plan(lanes: u32, op_lanes: &[u32]) -> Plan {
        let mut p = Plan::new(Request::point_to_point(0, 1, 1), "t");
        for _ in 0..lanes {
            p.add_lane(Location::Gpu(0), "l");
        }
        let a = p.add_scratch(Location::Gpu(0), 1);
        let b = p.add_scratch(Location::Gpu(0), 1);
        for &l in op_lanes {
            p.copy(
                l,
                Region::new(a, 0, 1),
                Region::new(b, 0, 1),
                vec![],
                vec![],
            );
        }
        p
    }

    fn message(e: RouteError) -> (usize, String) {
        match e {
            RouteError::PlanCheck { op, message } => (op, message),
            other => panic!("expected a plan check error, got {other:?}"),
        }
    }

    #[test]
    fn lane_order_and_deps_make_successors_levels_and_order() {
        // Lane 0: ops 0, 2; lane 1: ops 1, 3. Op 3 waits for op 0 (twice) and op 2.
        let mut p = plan(2, &[0, 1, 0, 1]);
        p.ops[3].deps = vec![0, 0, 2];
        let g = p.dependency_graph().unwrap();
        assert_eq!(g.successors(0), &[2, 3, 3]);
        assert_eq!(g.successors(1), &[3]);
        assert_eq!(g.successors(2), &[3]);
        assert_eq!(g.in_degrees(), &[0, 0, 1, 4]);
        assert_eq!(g.lane_predecessor(3), Some(1));
        assert_eq!(g.lane_predecessor(0), None);
        assert_eq!(g.lane_position(2), 2);
        assert_eq!(p.topological_order().unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(p.dependency_levels().unwrap(), vec![0, 0, 1, 2]);
    }

    #[test]
    fn ready_ops_come_lowest_id_first() {
        // Op 0 waits for op 2; ops 1 and 2 are ready at once.
        let mut p = plan(3, &[0, 1, 2]);
        p.ops[0].deps = vec![2];
        assert_eq!(p.topological_order().unwrap(), vec![1, 2, 0]);
        assert_eq!(p.dependency_levels().unwrap(), vec![1, 0, 0]);
    }

    #[test]
    fn cycles_name_an_op_on_the_cycle() {
        // Op 0 -> op 1 -> op 2 -> op 1; op 0 is upstream, not on the cycle.
        let mut p = plan(3, &[0, 1, 2]);
        p.ops[1].deps = vec![0, 2];
        p.ops[2].deps = vec![1];
        let (op, msg) = message(p.topological_order().unwrap_err());
        assert!(op == 1 || op == 2, "op {op}");
        assert!(msg.contains("cycle"), "{msg}");
        // A dep on a later op of the same lane is a cycle through lane order.
        let mut p = plan(1, &[0, 0]);
        p.ops[0].deps = vec![1];
        let (op, msg) = message(p.dependency_levels().unwrap_err());
        assert!(op <= 1);
        assert!(msg.contains("cycle"), "{msg}");
        let mut p = plan(1, &[0]);
        p.ops[0].deps = vec![0];
        assert_eq!(message(p.topological_order().unwrap_err()).0, 0);
    }

    /// A run whose op started and never ended (a transfer of infinite bytes) is no
    /// dependency cycle: the error names the op that never finished.
    #[test]
    fn a_stalled_run_is_no_cycle() {
        let mut p = plan(2, &[0, 1, 1]);
        p.ops[1].deps = vec![0];
        let g = p.dependency_graph().unwrap();
        let (op, msg) = message(g.cycle_error(|op| op >= 1));
        assert_eq!(op, 1);
        assert!(
            msg.contains("never finishes") && !msg.contains("cycle"),
            "{msg}"
        );
    }

    #[test]
    fn missing_lanes_and_deps_are_errors() {
        let mut p = plan(1, &[0, 0]);
        p.ops[1].deps = vec![7];
        let (op, msg) = message(p.dependency_graph().unwrap_err());
        assert_eq!(op, 1);
        assert!(msg.contains("op 7"), "{msg}");
        let mut p = plan(1, &[0, 0]);
        p.ops[0].lane = 9;
        let (op, msg) = message(p.dependency_graph().unwrap_err());
        assert_eq!(op, 0);
        assert!(msg.contains("lane 9"), "{msg}");
        let p = Plan::new(Request::point_to_point(0, 1, 1), "empty");
        assert!(p.topological_order().unwrap().is_empty());
    }
}
