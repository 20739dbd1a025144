//! Group calls: several operations checked together and run as one launch; send/recv pairs.
//!
//! Every operation of a communicator goes through here (a single call is a group of one):
//! each operation's buffers are checked when it is added, the group's cross-operation rules
//! (send/recv pairing, no two operations writing the same memory) when it is launched, and
//! only then are plans fetched and the launch submitted. An error at any step leaves every
//! buffer unchanged.

use std::sync::Arc;

use relaycc_route::{Collective, DType, ReduceOp, Request, Transfer};

use crate::backend::ByteRegion;
use crate::backend::Program;
use crate::buffer::{AsView, RawView};
use crate::call::CallDesc;
use crate::communicator::Communicator;
use crate::element::Element;
use crate::error::{CollectivesError, Result};
use crate::exec;
use crate::exec::counts::{CallCounts, CountLayout};
use crate::plan_cache::Cached;
use crate::rank::{HeldView, Lender, RankCalls};

/// One checked operation of a group: its request and its per-rank buffers.
#[derive(Debug)]
pub(crate) struct Checked {
    pub call: &'static str,
    /// What is planned: the call's request, or a v-collective's capacity request.
    pub request: Request,
    pub in_place: bool,
    pub inputs: Vec<Option<RawView>>,
    pub outputs: Vec<Option<RawView>>,
    /// A v-collective's counts, bound to its capacity plan at launch.
    pub counts: Option<Counted>,
}

/// A v-collective call's counts: the layout its capacity plan serves, the counts in the
/// plan's elements, and the exact request (planned instead when the capacity plan cannot be
/// bound).
#[derive(Debug)]
pub(crate) struct Counted {
    pub layout: CountLayout,
    pub counts: Vec<u64>,
    pub exact: Request,
}

/// A posted send or receive, waiting for its partner.
#[derive(Debug)]
struct P2p {
    /// Sending rank, receiving rank.
    src: usize,
    dst: usize,
    view: RawView,
    dtype: DType,
}

/// Operations collected to run as one launch (NCCL's `ncclGroupStart`/`ncclGroupEnd`).
///
/// Add operations with the same methods as [`Communicator`]'s (each returns an error at once
/// if its own buffers are wrong), post sends and receives, then [`Group::launch`]. Sends and
/// receives pair in posting order per (sender, receiver), as NCCL pairs them. The operations
/// of a group run concurrently, so none may write memory another one touches.
#[derive(Debug)]
#[must_use = "a group does nothing until launched"]
pub struct Group<'c> {
    comm: &'c Communicator,
    ops: Vec<Checked>,
    sends: Vec<P2p>,
    recvs: Vec<P2p>,
}

/// A launched operation or group; [`Pending::wait`] blocks until it is done.
///
/// Dropping it without waiting is safe: later host access to any buffer waits first, and an
/// error is reported by the next `wait` on the communicator's backend.
#[derive(Debug)]
#[must_use = "call wait() to learn whether the operation succeeded"]
pub struct Pending<'c> {
    comm: &'c Communicator,
}

impl Pending<'_> {
    /// Wait for the operation and return its error, if any.
    pub fn wait(self) -> Result<()> {
        self.comm.backend().synchronize()
    }
}

/// Every rank's view of `views` (one per rank, else the error naming `side`), as each rank's
/// calls lend it.
fn held_all<T: Element, V: AsView<T>>(
    call: &'static str,
    side: &'static str,
    n: usize,
    views: &[V],
) -> Result<Vec<Option<HeldView<T>>>> {
    if views.len() != n {
        return Err(CollectivesError::RankCount {
            call,
            side,
            expected: n,
            got: views.len(),
        });
    }
    Ok(views.iter().map(|v| Some(held(v))).collect())
}

/// `view` at rank `at` only (a root's one input or output).
fn held_at<T: Element, V: AsView<T>>(n: usize, at: usize, view: &V) -> Vec<Option<HeldView<T>>> {
    (0..n).map(|r| (r == at).then(|| held(view))).collect()
}

fn held<T: Element, V: AsView<T>>(view: &V) -> HeldView<T> {
    HeldView {
        view: view.as_view().raw(),
        _t: std::marker::PhantomData,
    }
}

/// The one table of all-ranks collectives: each entry names a [`Group`] method (written below)
/// and its arguments, with the docs of the one-shot call. `$m!` receives the table:
/// [`Communicator`] makes its one-shot calls from it, so a new collective is its entry here
/// and its method below.
macro_rules! all_rank_collectives {
    ($m:ident) => {
        $m! {
            /// `outputs[r] = op(inputs[0..n])` on every rank (`ncclAllReduce`, `MPI_Allreduce`).
            /// In place when `inputs[r]` and `outputs[r]` are the same memory.
            all_reduce(inputs: &[I], outputs: &[O], op: ReduceOp);
            /// `output = op(inputs[0..n])` on rank `root` (`ncclReduce`, `MPI_Reduce`).
            reduce(inputs: &[I], output: &O, root: usize, op: ReduceOp);
            /// Rank `root`'s `input` to every rank's output (`ncclBroadcast`, `MPI_Bcast`).
            broadcast(input: &I, outputs: &[O], root: usize);
            /// Every rank's input, concatenated in rank order, to every rank (`ncclAllGather`,
            /// `MPI_Allgather`). In place when `inputs[r]` is block `r` of `outputs[r]`.
            all_gather(inputs: &[I], outputs: &[O]);
            /// As all_gather with per-rank counts, taken from the inputs' lengths (`MPI_Allgatherv`;
            /// NCCL has none).
            all_gather_v(inputs: &[I], outputs: &[O]);
            /// Block `r` of the reduction to rank `r` (`ncclReduceScatter`,
            /// `MPI_Reduce_scatter_block`). In place when `outputs[r]` is block `r` of `inputs[r]`.
            reduce_scatter(inputs: &[I], outputs: &[O], op: ReduceOp);
            /// As reduce_scatter with per-rank counts, taken from the outputs' lengths: block `r`
            /// of the inputs (at the sum of the counts before it) to rank `r`
            /// (`MPI_Reduce_scatter`; NCCL has none). In place when `outputs[r]` is block `r` of
            /// `inputs[r]`.
            reduce_scatter_v(inputs: &[I], outputs: &[O], op: ReduceOp);
            /// Block `d` of rank `s`'s input to block `s` of rank `d`'s output (`MPI_Alltoall`; NCCL
            /// users write it as grouped send/recv). Out of place only.
            all_to_all(inputs: &[I], outputs: &[O]);
            /// As all_to_all with `matrix[s][d]` elements from rank `s` to rank `d` (`MPI_Alltoallv`).
            all_to_all_v(inputs: &[I], outputs: &[O], matrix: &[Vec<u64>]);
            /// Every rank's input, concatenated in rank order, to `output` on rank `root`
            /// (`MPI_Gather`). In place when `inputs[root]` is block `root` of `output`.
            gather(inputs: &[I], output: &O, root: usize);
            /// Block `r` of `input` on rank `root` to rank `r` (`MPI_Scatter`). In place when
            /// `outputs[root]` is block `root` of `input`.
            scatter(input: &I, outputs: &[O], root: usize);
        }
    };
}
pub(crate) use all_rank_collectives;

impl<'c> Group<'c> {
    pub(crate) fn new(comm: &'c Communicator) -> Self {
        Group {
            comm,
            ops: Vec::new(),
            sends: Vec::new(),
            recvs: Vec::new(),
        }
    }

    /// Add an operation checked elsewhere (`Communicator::launch_request`).
    pub(crate) fn push_checked(&mut self, c: Checked) {
        self.ops.push(c);
    }

    fn n(&self) -> usize {
        self.comm.ranks()
    }

    fn rank_ok(&self, call: &'static str, rank: usize) -> Result<u32> {
        if rank < self.n() {
            Ok(rank as u32)
        } else {
            Err(CollectivesError::BadRank {
                call,
                rank,
                ranks: self.n(),
            })
        }
    }

    /// Add a collective described by `desc` (the ranks' agreed descriptor) on the ranks'
    /// `inputs` and `outputs` (`None` where a rank has none), with all_to_all_v's `matrix` of
    /// every rank's send counts (empty for the others): the one path from descriptors to a
    /// checked operation, for the per-rank meeting and the all-ranks calls alike.
    pub(crate) fn push_desc(
        &mut self,
        desc: &CallDesc,
        matrix: Vec<Vec<u64>>,
        inputs: Vec<Option<RawView>>,
        outputs: Vec<Option<RawView>>,
    ) -> Result<()> {
        let n = self.n();
        if desc.root >= n {
            return Err(CollectivesError::BadRank {
                call: desc.call,
                rank: desc.root,
                ranks: n,
            });
        }
        let request = desc.request(self.comm.devices().to_vec(), matrix);
        let checked = self.comm.check(desc.call, request, inputs, outputs, None)?;
        self.ops.push(checked);
        Ok(())
    }

    /// Add one collective as every rank calls it: `add(calls, input, output)` adds each rank's
    /// call with its views of `inputs` and `outputs` through [`RankCalls`], the one
    /// place a collective's per-rank meaning is written. Rank 0's descriptor is the request
    /// (every rank's is derived from the same arguments), and the checks then hold every
    /// rank's buffers to it, so a rank's wrong length is that rank's error. `matrix` is
    /// all_to_all_v's as the caller gave it (the checks hold its shape), empty for the others.
    fn each_rank<T: Element>(
        &mut self,
        matrix: Vec<Vec<u64>>,
        inputs: Vec<Option<HeldView<T>>>,
        mut outputs: Vec<Option<HeldView<T>>>,
        add: impl for<'b> Fn(&mut RankCalls<'b>, Option<&'b HeldView<T>>, Option<&'b mut HeldView<T>>),
    ) -> Result<&mut Self> {
        let n = self.n();
        let mut desc = None;
        let (mut ins, mut outs) = (vec![None; n], vec![None; n]);
        let mut calls = RankCalls::new(0, n, 0, Lender::default());
        for (rank, (input, output)) in inputs.iter().zip(outputs.iter_mut()).enumerate() {
            add(&mut calls, input.as_ref(), output.as_mut());
            let Some(call) = calls.take_held(rank + 1)? else {
                return Err(CollectivesError::Backend {
                    backend: "group",
                    message: format!("rank {rank} added no collective"),
                });
            };
            ins[rank] = call.input;
            outs[rank] = call.output;
            desc.get_or_insert(call.desc);
        }
        let Some(desc) = desc else {
            return Err(CollectivesError::Setup("a communicator of no ranks".into()));
        };
        self.push_desc(&desc, matrix, ins, outs)?;
        Ok(self)
    }

    /// [`Self::each_rank`] for a collective in which every rank has an input and an output
    /// (`inputs[r]` and `outputs[r]`, one per rank, else the error naming the side).
    fn every_rank<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        call: &'static str,
        (inputs, outputs): (&[I], &[O]),
        add: impl for<'b> Fn(&mut RankCalls<'b>, &'b HeldView<T>, &'b mut HeldView<T>),
    ) -> Result<&mut Self> {
        let n = self.n();
        let ins = held_all(call, "input buffers", n, inputs)?;
        let outs = held_all(call, "output buffers", n, outputs)?;
        self.each_rank(Vec::new(), ins, outs, |c, i, o| {
            if let (Some(i), Some(o)) = (i, o) {
                add(c, i, o);
            }
        })
    }

    /// Add [`Communicator::all_reduce`].
    pub fn all_reduce<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        outputs: &[O],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        self.every_rank("all_reduce", (inputs, outputs), |c, i, o| {
            c.all_reduce(i, o, op);
        })
    }

    /// Add [`Communicator::reduce`].
    pub fn reduce<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        output: &O,
        root: usize,
        op: ReduceOp,
    ) -> Result<&mut Self> {
        let n = self.n();
        let ins = held_all("reduce", "input buffers", n, inputs)?;
        self.each_rank(Vec::new(), ins, held_at(n, root, output), |c, i, o| {
            if let Some(i) = i {
                c.reduce(i, o, root, op);
            }
        })
    }

    /// Add [`Communicator::broadcast`].
    pub fn broadcast<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        input: &I,
        outputs: &[O],
        root: usize,
    ) -> Result<&mut Self> {
        let n = self.n();
        let outs = held_all("broadcast", "output buffers", n, outputs)?;
        self.each_rank(Vec::new(), held_at(n, root, input), outs, |c, i, o| {
            if let Some(o) = o {
                c.broadcast(i, o, root);
            }
        })
    }

    /// Add [`Communicator::all_gather`].
    pub fn all_gather<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        outputs: &[O],
    ) -> Result<&mut Self> {
        self.every_rank("all_gather", (inputs, outputs), |c, i, o| {
            c.all_gather(i, o);
        })
    }

    /// Add [`Communicator::all_gather_v`].
    pub fn all_gather_v<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        outputs: &[O],
    ) -> Result<&mut Self> {
        let counts: Vec<usize> = inputs.iter().map(|v| v.as_view().len()).collect();
        self.every_rank("all_gather_v", (inputs, outputs), |c, i, o| {
            c.all_gather_v(i, o, &counts);
        })
    }

    /// Add [`Communicator::reduce_scatter`].
    pub fn reduce_scatter<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        outputs: &[O],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        self.every_rank("reduce_scatter", (inputs, outputs), |c, i, o| {
            c.reduce_scatter(i, o, op);
        })
    }

    /// Add [`Communicator::reduce_scatter_v`].
    pub fn reduce_scatter_v<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        outputs: &[O],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        let counts: Vec<usize> = outputs.iter().map(|v| v.as_view().len()).collect();
        self.every_rank("reduce_scatter_v", (inputs, outputs), |c, i, o| {
            c.reduce_scatter_v(i, o, &counts, op);
        })
    }

    /// Add [`Communicator::all_to_all`].
    pub fn all_to_all<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        outputs: &[O],
    ) -> Result<&mut Self> {
        self.every_rank("all_to_all", (inputs, outputs), |c, i, o| {
            c.all_to_all(i, o);
        })
    }

    /// Add [`Communicator::all_to_all_v`].
    pub fn all_to_all_v<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        outputs: &[O],
        matrix: &[Vec<u64>],
    ) -> Result<&mut Self> {
        let n = self.n();
        let ins = held_all("all_to_all_v", "input buffers", n, inputs)?;
        let outs = held_all("all_to_all_v", "output buffers", n, outputs)?;
        // The request carries the caller's whole matrix (the checks hold its shape), so the
        // per-rank send and receive counts, which ranks that meet pair up, stay empty here.
        self.each_rank(matrix.to_vec(), ins, outs, |c, i, o| {
            if let (Some(i), Some(o)) = (i, o) {
                c.all_to_all_v(i, &[], o, &[]);
            }
        })
    }

    /// Add [`Communicator::gather`].
    pub fn gather<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        inputs: &[I],
        output: &O,
        root: usize,
    ) -> Result<&mut Self> {
        let n = self.n();
        let ins = held_all("gather", "input buffers", n, inputs)?;
        self.each_rank(Vec::new(), ins, held_at(n, root, output), |c, i, o| {
            if let Some(i) = i {
                c.gather(i, o, root);
            }
        })
    }

    /// Add [`Communicator::scatter`].
    pub fn scatter<T: Element, I: AsView<T>, O: AsView<T>>(
        &mut self,
        input: &I,
        outputs: &[O],
        root: usize,
    ) -> Result<&mut Self> {
        let n = self.n();
        let outs = held_all("scatter", "output buffers", n, outputs)?;
        self.each_rank(Vec::new(), held_at(n, root, input), outs, |c, i, o| {
            if let Some(o) = o {
                c.scatter(i, o, root);
            }
        })
    }

    /// Post a send of `buf` (on rank `from`'s device) to rank `to` (`ncclSend` on `from`).
    pub fn send<T: Element, V: AsView<T>>(
        &mut self,
        buf: &V,
        from: usize,
        to: usize,
    ) -> Result<&mut Self> {
        self.rank_ok("send", from)?;
        self.rank_ok("send", to)?;
        let view = buf.as_view().raw();
        self.comm.owns("send", from, "input", &view)?;
        self.sends.push(P2p {
            src: from,
            dst: to,
            view,
            dtype: T::DTYPE,
        });
        Ok(self)
    }

    /// Post a receive into `buf` (on rank `at`'s device) from rank `from` (`ncclRecv` on `at`).
    pub fn recv<T: Element, V: AsView<T>>(
        &mut self,
        buf: &V,
        at: usize,
        from: usize,
    ) -> Result<&mut Self> {
        self.rank_ok("recv", at)?;
        self.rank_ok("recv", from)?;
        let view = buf.as_view().raw();
        self.comm.owns("recv", at, "output", &view)?;
        self.recvs.push(P2p {
            src: from,
            dst: at,
            view,
            dtype: T::DTYPE,
        });
        Ok(self)
    }

    /// Post a send or a receive of memory the caller checked belongs to rank `at` (the
    /// per-rank API's lent slices): `send` from `at` to `peer`, or a receive at `at` from
    /// `peer`.
    pub(crate) fn post_raw(
        &mut self,
        send: bool,
        view: RawView,
        dtype: DType,
        at: usize,
        peer: usize,
    ) -> Result<()> {
        let call = if send { "send" } else { "recv" };
        self.rank_ok(call, at)?;
        self.rank_ok(call, peer)?;
        self.comm
            .owns(call, at, if send { "input" } else { "output" }, &view)?;
        if send {
            self.sends.push(P2p {
                src: at,
                dst: peer,
                view,
                dtype,
            });
        } else {
            self.recvs.push(P2p {
                src: peer,
                dst: at,
                view,
                dtype,
            });
        }
        Ok(())
    }

    /// Pair sends with receives: one point-to-point operation per pair.
    fn pair(&mut self) -> Result<()> {
        let mut recvs: Vec<Option<P2p>> = std::mem::take(&mut self.recvs)
            .into_iter()
            .map(Some)
            .collect();
        for s in std::mem::take(&mut self.sends) {
            let found = recvs
                .iter_mut()
                .find(|r| r.as_ref().is_some_and(|r| r.src == s.src && r.dst == s.dst))
                .and_then(Option::take);
            let Some(r) = found else {
                return Err(CollectivesError::Unmatched(format!(
                    "send from rank {} to rank {} has no matching recv",
                    s.src, s.dst
                )));
            };
            if s.dtype != r.dtype {
                return Err(CollectivesError::TypeMismatch {
                    call: "send/recv",
                    a: s.dtype,
                    b: r.dtype,
                });
            }
            if s.view.len != r.view.len {
                return Err(CollectivesError::CountMismatch {
                    call: "send/recv",
                    rank: r.dst,
                    side: "recv",
                    got: r.view.len,
                    needs: s.view.len,
                });
            }
            let devs = self.comm.devices();
            let (gpus, ins, outs, dst) = if s.src == s.dst {
                (vec![devs[s.src]], vec![Some(s.view)], vec![Some(r.view)], 0)
            } else {
                (
                    vec![devs[s.src], devs[s.dst]],
                    vec![Some(s.view), None],
                    vec![None, Some(r.view)],
                    1,
                )
            };
            let mut request = Request::new(Collective::SendRecv, gpus, s.view.len, s.dtype);
            request.transfers = vec![Transfer {
                src: 0,
                dst,
                count: s.view.len,
            }];
            let ranks = [s.src, s.dst];
            let checked = self
                .comm
                .check("send/recv", request, ins, outs, Some(&ranks))?;
            self.ops.push(checked);
        }
        if let Some(r) = recvs.into_iter().flatten().next() {
            return Err(CollectivesError::Unmatched(format!(
                "recv at rank {} from rank {} has no matching send",
                r.dst, r.src
            )));
        }
        Ok(())
    }

    /// Check the group as a whole, plan every operation (cached) and launch them together.
    pub fn launch(self) -> Result<Pending<'c>> {
        let comm = self.comm;
        // SAFETY: `Backend::submit` is the submit `exec::launch_via` asks for.
        self.launch_via(|l| unsafe { comm.backend().submit(l) })?;
        Ok(Pending { comm })
    }

    /// As [`Group::launch`], enqueued on the communicator's backend ordered within the
    /// `callers`' streams (`Trusted::submit_on_streams`), without host synchronization; an
    /// error on a backend other than CUDA.
    #[cfg(feature = "cuda")]
    pub(crate) fn launch_on_streams(self, callers: &[&cudarc::driver::CudaStream]) -> Result<()> {
        use crate::backend::sealed::Private;
        let comm = self.comm;
        // SAFETY: `submit_on_streams` has `Backend::submit`'s contract and guarantees.
        self.launch_via(|l| unsafe { comm.backend().submit_on_streams(l, callers, Private) })
    }

    fn launch_via(
        mut self,
        submit: impl FnOnce(&[crate::backend::Launch<'_>]) -> Result<()>,
    ) -> Result<()> {
        self.pair()?;
        // Operations of one group run concurrently: none may write what another touches.
        let touched: Vec<(usize, ByteRegion, bool)> = self
            .ops
            .iter()
            .enumerate()
            .flat_map(|(i, op)| {
                let ins = op
                    .inputs
                    .iter()
                    .flatten()
                    .map(move |v| (i, v.region, false));
                let outs = op
                    .outputs
                    .iter()
                    .flatten()
                    .map(move |v| (i, v.region, true));
                ins.chain(outs)
            })
            .collect();
        for (k, a) in touched.iter().enumerate() {
            for b in &touched[k + 1..] {
                if a.0 != b.0 && (a.2 || b.2) && a.1.overlaps(&b.1) {
                    return Err(CollectivesError::Overlap {
                        call: "group",
                        what: format!(
                            "operations {} ({}) and {} ({}) touch the same memory and one writes it",
                            a.0, self.ops[a.0].call, b.0, self.ops[b.0].call
                        ),
                    });
                }
            }
        }
        let mut plans: Vec<Arc<Cached>> = Vec::with_capacity(self.ops.len());
        let mut bindings: Vec<Vec<ByteRegion>> = Vec::with_capacity(self.ops.len());
        // Per operation, its program bound to the call's counts (v-collectives).
        let mut bound: Vec<Option<Program>> = Vec::with_capacity(self.ops.len());
        let mut call_counts = CallCounts::default();
        for op in &self.ops {
            let mut cached = self.comm.plan_for(op.call, &op.request, op.in_place)?;
            let mut program = None;
            if let Some(c) = &op.counts {
                match cached.count_pieces(c.layout) {
                    Some(pieces) => {
                        call_counts.set(&c.layout, &c.counts)?;
                        let mut p = cached.take_bound();
                        cached.exec.bind_counts(pieces, &call_counts, &mut p)?;
                        program = Some(p);
                    }
                    // A capacity plan that cannot be bound: plan the exact counts.
                    None => cached = self.comm.plan_for(op.call, &c.exact, op.in_place)?,
                }
            }
            // Operations of one shape in one group run concurrently: each binds its own
            // scratch set.
            let use_index = plans.iter().filter(|p| Arc::ptr_eq(p, &cached)).count();
            let scratch = cached.scratch_set(use_index, self.comm.backend())?;
            let null = self.comm.null_region();
            let mut b: Vec<ByteRegion> = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .map(|v| v.map_or(null, |v| v.region))
                .collect();
            b.extend(scratch.iter().map(|m| ByteRegion {
                mem: *m,
                offset: 0,
                bytes: m.bytes(),
            }));
            plans.push(cached);
            bindings.push(b);
            bound.push(program);
        }
        let work: Vec<(&Program, &str, &[ByteRegion])> = plans
            .iter()
            .zip(&bindings)
            .zip(&bound)
            .map(|((p, b), bp)| {
                let program = bp.as_ref().unwrap_or_else(|| p.exec.program());
                (program, p.exec.plan().algorithm.as_str(), b.as_slice())
            })
            .collect();
        let launched = if work.is_empty() {
            Ok(())
        } else {
            // SAFETY: every plan passed the checker as the call it serves (`Checked::in_place`
            // is what `CheckedPlan` was checked with); `call_checks` proved each operation's
            // inputs and outputs are its ranks' own buffers of the plan's sizes (a bound
            // program's: its call's packed sizes, `exec::counts` gives why the bound program
            // keeps the proof), disjoint except in the in-place layout; the loop above proved
            // operations of the group disjoint where one writes; scratch sets are private to
            // one use in the launch; and the safe API hands out no raw addresses.
            unsafe { exec::launch_via(&work, submit) }
        };
        drop(work);
        for (p, b) in plans.iter().zip(bound) {
            if let Some(b) = b {
                p.give_bound(b);
            }
        }
        launched?;
        Ok(())
    }
}
