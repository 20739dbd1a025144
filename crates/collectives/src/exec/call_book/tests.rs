//! The book of calls: a mismatch found by whichever rank posts second, records kept past the
//! window until every peer has posted, a missing rank named with its last call.

use std::sync::Arc;
use std::time::Duration;

use relaycc_route::{Collective, DType, ReduceOp};

use super::*;

/// The posts' timeout, where a test does not wait for a missing rank.
const T: Duration = Duration::from_secs(20);

fn desc(op: ReduceOp, count: u64) -> CallDesc {
    CallDesc::new(Collective::AllReduce, DType::F32, count, op, 0)
}

fn never() -> bool {
    false
}

/// Whichever of two ranks posts a call second finds the mismatch, and names the call, both
/// ranks and the field.
#[test]
fn the_later_rank_finds_a_mismatch_in_either_order() {
    for first in [0u32, 1] {
        let book = CallBook::new(2);
        for seq in 0..3 {
            for r in [first, 1 - first] {
                book.post(r, CallRecord::new(seq, &desc(ReduceOp::Sum, 96)), T, &never)
                    .expect("matching calls");
            }
        }
        let second = 1 - first;
        book.post(
            first,
            CallRecord::new(3, &desc(ReduceOp::Sum, 96)),
            T,
            &never,
        )
        .expect("the first rank has nothing to compare with");
        let refused = book
            .post(
                second,
                CallRecord::new(3, &desc(ReduceOp::Max, 96)),
                T,
                &never,
            )
            .expect_err("a different op");
        let PostRefused::Mismatch(words) = refused else {
            panic!("not a mismatch: {refused:?}");
        };
        assert!(words.starts_with("call #3: the op differs"), "{words}");
        assert!(words.contains(&format!("rank {first} calls all_reduce of f32, op sum")));
        assert!(words.contains(&format!("rank {second} calls all_reduce of f32, op max")));
    }
}

/// Counts the record keeps only as a hash still differ; all_to_all_v's send counts, which
/// differ by design, do not.
#[test]
fn counts_are_compared_by_hash_except_all_to_all_v() {
    let book = CallBook::new(2);
    let v = |counts: Vec<u64>| {
        let mut d = CallDesc::new(Collective::AllGatherV, DType::F32, 0, ReduceOp::Sum, 0);
        d.counts = counts;
        d
    };
    book.post(0, CallRecord::new(0, &v(vec![3, 4])), T, &never)
        .unwrap();
    let refused = book.post(1, CallRecord::new(0, &v(vec![4, 3])), T, &never);
    assert!(
        matches!(&refused, Err(PostRefused::Mismatch(w)) if w.contains("different counts")),
        "{refused:?}"
    );
    let book = CallBook::new(2);
    let a2av = |counts: Vec<u64>| {
        let mut d = CallDesc::new(Collective::AllToAllV, DType::F32, 0, ReduceOp::Sum, 0);
        d.counts = counts;
        d
    };
    book.post(0, CallRecord::new(0, &a2av(vec![1, 2])), T, &never)
        .unwrap();
    book.post(1, CallRecord::new(0, &a2av(vec![5, 6])), T, &never)
        .expect("all_to_all_v's send counts differ by design");
}

/// Two ranks post thousands of calls each from their own threads, in no set order: every
/// record is compared (a mismatch near the end, many windows in, is found), and the rows
/// stay at their window.
#[test]
fn records_outlive_the_window_until_every_peer_has_posted() {
    const CALLS: u64 = 20 * CALL_WINDOW as u64;
    let book = Arc::new(CallBook::new(3));
    let results: Vec<Result<(), PostRefused>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3u32)
            .map(|r| {
                let book = Arc::clone(&book);
                s.spawn(move || {
                    for seq in 0..CALLS {
                        let count = if r == 2 && seq == CALLS - 7 { 95 } else { 96 };
                        book.post(
                            r,
                            CallRecord::new(seq, &desc(ReduceOp::Sum, count)),
                            T,
                            &never,
                        )?;
                        if seq % 97 == r as u64 {
                            std::thread::yield_now();
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let found: Vec<&String> = results
        .iter()
        .filter_map(|r| match r {
            Err(PostRefused::Mismatch(w)) => Some(w),
            _ => None,
        })
        .collect();
    assert!(!found.is_empty(), "{results:?}");
    let call = format!("call #{}: the count differs", CALLS - 7);
    assert!(found.iter().all(|w| w.starts_with(&call)), "{found:?}");
}

/// A rank a window ahead of a peer that never posts waits for it, then names it and its last
/// call; an abort ends the wait at once.
#[test]
fn a_rank_a_window_ahead_names_the_missing_peer() {
    let book = CallBook::new(3);
    // Rank 2 stops after 4 calls; ranks 0 and 1 go on to the last call the window allows.
    let ahead_by = CALL_WINDOW as u64 + 4;
    for seq in 0..ahead_by {
        if seq < 4 {
            book.post(2, CallRecord::new(seq, &desc(ReduceOp::Sum, 8)), T, &never)
                .unwrap();
        }
        book.post(1, CallRecord::new(seq, &desc(ReduceOp::Sum, 8)), T, &never)
            .unwrap();
        book.post(0, CallRecord::new(seq, &desc(ReduceOp::Sum, 8)), T, &never)
            .unwrap();
    }
    let ahead = CallRecord::new(ahead_by, &desc(ReduceOp::Sum, 8));
    let refused = book.post(0, ahead, Duration::from_millis(150), &never);
    let Err(PostRefused::Missing(words)) = &refused else {
        panic!("{refused:?}");
    };
    assert!(words.contains("rank 2 is the one missing"), "{words}");
    assert!(
        words.contains("(rank 2's last call is call #3 (all_reduce of f32, op sum, count 8); rank 2 is the one missing)"),
        "{words}"
    );
    assert_eq!(book.post(0, ahead, T, &|| true), Err(PostRefused::Aborted));
    assert_eq!(book.last_call(2).map(|r| r.seq), Some(3));
    assert_eq!(
        book.last_call_words(1).replace("rank 1", "rank 0"),
        book.last_call_words(0)
    );
}

/// A post out of order, or by a rank the book does not hold, is refused.
#[test]
fn posts_out_of_order_are_refused() {
    let book = CallBook::new(2);
    let d = desc(ReduceOp::Sum, 1);
    assert!(matches!(
        book.post(0, CallRecord::new(1, &d), T, &never),
        Err(PostRefused::Mismatch(_))
    ));
    assert!(matches!(
        book.post(2, CallRecord::new(0, &d), T, &never),
        Err(PostRefused::Mismatch(_))
    ));
    assert_eq!(book.last_call_words(0), "rank 0 has begun no call");
}
