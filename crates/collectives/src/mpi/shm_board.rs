//! The agreement board: the collective steps of a communicator whose ranks share one host's
//! memory (a typed call's descriptors, the agreement on a plan, count exchanges) move through
//! the shared window instead of an MPI collective. Each rank posts its words for a step in
//! its own part of the window, and every rank reads every post of that step: an all-gather
//! in shared memory, one write and `ranks` reads of a cache line or a few per rank and step,
//! with no MPI progress, where `MPI_Iallgather` across 8 processes takes several rounds of
//! messages.
//!
//! Protocol: steps are numbered per communicator, and every rank takes the same steps in the
//! same order (as MPI's collectives must be called). Rank `r` posts step `k` in its post
//! `k mod 2`: the words, their number and the step's kind, then the header's step word set
//! to `k + 1` with a release store, which orders the words before it. A reader that loads
//! `k + 1` there (acquire) reads the words. Two posts suffice: a rank overwrites post
//! `k mod 2` at step `k + 2` only after it completed step `k + 1`, which needed every rank's
//! post of `k + 1`, which each rank makes only after it has read every post of step `k`.
//!
//! A rank at another step of the same number (another kind, or another number of words)
//! called the communicator's collectives in another order; the reader reports it instead of
//! reading words laid out for something else. Waiting, timeouts and the roll call that names
//! missing ranks are the caller's (`agree.rs`), as for an MPI collective step.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::shm_window::{BOARD_POST_BYTES, BOARD_WORDS_MAX, LINE_BYTES, board_offset};

/// Header word holding the step a post is for, plus one (0: no post yet).
const STEP: usize = 0;
/// Header word holding the step's kind (the caller's code).
const KIND: usize = 1;
/// Header word holding the number of words posted.
const LEN: usize = 2;

/// This process's view of the communicator's boards: every rank's, in the shared window.
#[derive(Debug)]
pub(crate) struct ShmBoard {
    /// Each rank's board (its two posts) in this process's mapping of the window.
    boards: Vec<usize>,
    rank: usize,
    /// Steps this rank has posted on this communicator.
    posted: Cell<u64>,
}

/// A step this rank has posted: what every other rank's post of it must match.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BoardStep {
    step: u64,
    kind: u64,
    words: usize,
}

/// A rank posted another kind of step, or another number of words, at this step's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OtherStep {
    /// The rank.
    pub(crate) rank: usize,
    /// Its step's kind.
    pub(crate) kind: u64,
    /// Its number of words.
    pub(crate) words: usize,
}

impl ShmBoard {
    /// The boards of a window whose ranks' parts start at `bases` (in this process), seen
    /// by `rank`.
    pub(super) fn new(bases: &[usize], rank: u32) -> Self {
        let offset = board_offset(bases.len());
        ShmBoard {
            boards: bases.iter().map(|b| b + offset).collect(),
            rank: rank as usize,
            posted: Cell::new(0),
        }
    }

    /// Whether a step of `words` words per rank fits in a post. The answer depends on the
    /// number alone, which every rank's step has alike, so all ranks take the board or all
    /// take MPI.
    pub(crate) fn fits(words: usize) -> bool {
        words <= BOARD_WORDS_MAX
    }

    /// Header word `i` of `rank`'s post for `step`.
    fn header(&self, rank: usize, step: u64, i: usize) -> &AtomicU64 {
        let post = self.boards[rank] + (step % 2) as usize * BOARD_POST_BYTES;
        // SAFETY: the post's header line lies in the rank's board inside the window, which
        // lives as long as this view (it is never freed); it is 8-byte aligned (page-aligned
        // parts, line multiples), and every process reaches it through atomics only.
        unsafe { &*((post + 8 * i) as *const AtomicU64) }
    }

    /// Word `i` of `rank`'s post for `step` (after the header line).
    fn word(&self, rank: usize, step: u64, i: usize) -> &AtomicU64 {
        let post = self.boards[rank] + (step % 2) as usize * BOARD_POST_BYTES;
        // SAFETY: as in `header`; `i < BOARD_WORDS_MAX` (callers hold `fits`), so the word
        // lies inside the post.
        unsafe { &*((post + LINE_BYTES + 8 * i) as *const AtomicU64) }
    }

    /// Post `words` (at most [`BOARD_WORDS_MAX`], [`Self::fits`]) as this rank's part of the
    /// communicator's next step, of `kind`.
    pub(crate) fn post(&self, kind: u64, words: &[i64]) -> BoardStep {
        let step = self.posted.get();
        self.posted.set(step + 1);
        let (me, len) = (self.rank, words.len().min(BOARD_WORDS_MAX));
        for (i, w) in words.iter().take(len).enumerate() {
            self.word(me, step, i).store(*w as u64, Ordering::Relaxed);
        }
        self.header(me, step, KIND).store(kind, Ordering::Relaxed);
        self.header(me, step, LEN)
            .store(len as u64, Ordering::Relaxed);
        // Release: the words and the header's other fields are visible before the step is.
        self.header(me, step, STEP)
            .store(step + 1, Ordering::Release);
        BoardStep {
            step,
            kind,
            words: len,
        }
    }

    /// Whether every rank has posted `step`; when so, every rank's words in rank order in
    /// `into` (`ranks x` the step's words). A rank whose post of this step is of another
    /// kind or length is an [`OtherStep`].
    pub(crate) fn gather(&self, step: &BoardStep, into: &mut [i64]) -> Result<bool, OtherStep> {
        let BoardStep { step, kind, words } = *step;
        for r in 0..self.boards.len() {
            if self.header(r, step, STEP).load(Ordering::Acquire) != step + 1 {
                return Ok(false);
            }
            let (k, w) = (
                self.header(r, step, KIND).load(Ordering::Relaxed),
                self.header(r, step, LEN).load(Ordering::Relaxed) as usize,
            );
            if (k, w) != (kind, words) {
                return Err(OtherStep {
                    rank: r,
                    kind: k,
                    words: w,
                });
            }
        }
        for (r, dst) in into
            .chunks_mut(words.max(1))
            .enumerate()
            .take(self.boards.len())
        {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = self.word(r, step, i).load(Ordering::Relaxed) as i64;
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ranks` ranks' views of one board in this process's memory (a window's parts, each
    /// rank's channels left unused).
    fn boards(ranks: usize) -> (Vec<u64>, Vec<ShmBoard>) {
        let part = board_offset(ranks) + 2 * BOARD_POST_BYTES;
        let mut memory = vec![0u64; ranks * part / 8 + 8];
        let base = (memory.as_mut_ptr() as usize).next_multiple_of(LINE_BYTES);
        let bases: Vec<usize> = (0..ranks).map(|r| base + r * part).collect();
        let views = (0..ranks)
            .map(|r| ShmBoard::new(&bases, r as u32))
            .collect();
        (memory, views)
    }

    /// Steps complete only once every rank posted, bring every rank's words in rank order,
    /// and reuse the two posts step after step.
    #[test]
    fn every_rank_reads_every_post_of_each_step() {
        let (_memory, b) = boards(3);
        for step in 0..5i64 {
            let words = |r: i64| vec![step * 100 + r, -r, step];
            let mut got = vec![0i64; 9];
            let p0 = b[0].post(7, &words(0));
            let p1 = b[1].post(7, &words(1));
            assert_eq!(
                b[0].gather(&p0, &mut got),
                Ok(false),
                "rank 2 has not posted"
            );
            let p2 = b[2].post(7, &words(2));
            let want: Vec<i64> = (0..3).flat_map(words).collect();
            for p in [&p0, &p1, &p2] {
                got.fill(0);
                assert_eq!(b[0].gather(p, &mut got), Ok(true));
                assert_eq!(got, want, "step {step}");
            }
        }
    }

    /// A rank at the same step number with another kind of step, or another number of
    /// words, is named instead of read.
    #[test]
    fn another_step_at_the_same_number_is_named() {
        let (_memory, b) = boards(2);
        let mine = b[0].post(3, &[1, 2]);
        b[1].post(1, &[1, 2]);
        let mut got = [0i64; 4];
        assert_eq!(
            b[0].gather(&mine, &mut got),
            Err(OtherStep {
                rank: 1,
                kind: 1,
                words: 2
            })
        );
        let (_memory, b) = boards(2);
        let mine = b[1].post(3, &[1, 2]);
        b[0].post(3, &[1, 2, 3]);
        assert_eq!(
            b[1].gather(&mine, &mut got),
            Err(OtherStep {
                rank: 0,
                kind: 3,
                words: 3
            })
        );
    }
}
