//! Plans of rounds: a request whose pieces are larger than one round
//! (`relaycc_route::PlanOptions::round_bytes`, [`DEFAULT_ROUND_BYTES`] by default) is served by one
//! round's plan, run over successive slices of every piece, and a tail's plan for the
//! remainder ([`crate::Plan::rounds`]).
//! The plan holds the body and the tail once, so its ops, the memory and the time it takes
//! to plan do not grow with the message; the executor expands the rounds ([`expand()`]) on
//! the buffers it runs them on.
//!
//! **Pieces.** Every buffer of a request is a list of pieces ([`pieces`]): the blocks of
//! `count` elements (one for all_reduce, broadcast, reduce; one per rank for the blocked
//! buffers of all_gather, reduce_scatter, all_to_all, gather, scatter), the `counts` of
//! all_gather_v, the `matrix` entries of all_to_all_v, the transfers of a send_recv. Every
//! collective maps element `e` of a piece to element `e` of pieces (its output piece holds the
//! combination of input elements at the same index of their pieces), so slicing every piece
//! alike cuts a request into independent requests.
//!
//! **Rounds.** With `R` rounds ([`split`]), a piece of `len` elements has a slice of
//! `s = floor(len / R)` in each round and a remainder `len - R s` in the tail: round `k` moves
//! its elements `[k s, (k + 1) s)`, the tail its elements `[R s, len)`. The body is an ordinary
//! plan of the request of the slices (every piece `s`), the tail one of the request of the
//! remainders; [`region_in_full`] maps their regions onto the full buffers.
//!
//! **Proof** ([`crate::check_with`] on a plan of rounds). The checker proves the body and the
//! tail as plans of their own requests, that their request are the slices and remainders of
//! the plan's, and that none of their regions crosses a piece (so each maps onto one run of
//! the full buffer). Then: round `k` delivers the slice `[k s, (k + 1) s)` of every output
//! piece exactly (the body proved, every piece's elements mapped alike, and elements of one
//! index depending only on elements of that index); the slices of the rounds and the tail
//! tile every piece; a round or the tail reads staging only where it wrote it before (the
//! body's and tail's proofs), and inputs only in its own slice, which no other segment
//! writes (in place, a segment writes its own slice of the shared buffer only); and every
//! segment starts after the one before has finished, so no two segments race on the staging
//! they share. So the plan delivers its request.
//!
//! **Prediction.** `relaycc_sim::simulate` times a plan of rounds as its segments one after
//! another: `R` times the body's makespan plus the tail's. The executor runs the expanded
//! plan, in which every lane's first op of a segment waits for every lane's last op of the
//! segment before, so the prediction is the time of the plan the executor runs; a runner
//! that started the next round on one lane before every lane finished would be faster, never
//! slower. Each round pays its own pipeline fill and drain: above the round size the
//! predicted bandwidth is about that of one round.

mod expand;
mod split;

pub use expand::{MAX_EXPANDED_OPS, expand};
pub use split::rounds_us;
pub use split::{
    DEFAULT_ROUND_BYTES, RegionMap, RoundSegment, Split, assemble, pieces, region_in_full, split,
    split_into,
};
