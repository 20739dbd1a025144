//! The in-process transport: ranks of one process on threads of their own, each running its
//! [`super::lower::RankProgram`] with [`super::run::run`], messages handed over through shared
//! mailboxes. (Ranks that share one backend need no transport at all: their lowering on one
//! rank has no message, and its events order the lanes, [`super::compile`].)

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::run::Transport;
use crate::backend::AddressSpace;
use crate::error::CollectivesError;

/// The messages of one (source, destination, tag), in the order they were sent.
type Queues = HashMap<(u32, u32, u32), VecDeque<Vec<u8>>>;

/// Messages in flight between the ranks of one process, per (source, destination, tag) in the
/// order they were sent.
#[derive(Debug, Default)]
pub struct Mailboxes {
    boxes: Mutex<Queues>,
    arrived: Condvar,
}

/// One rank's end of the [`Mailboxes`]: a send copies its bytes into the destination's
/// mailbox at once (so sends never block), a receive is completed by [`Transport::wait`] from
/// the mailbox, in order per source and tag, within the timeout.
#[derive(Debug)]
pub struct InProcess {
    me: u32,
    boxes: Arc<Mailboxes>,
    timeout: Duration,
    /// The stage's receives: (source, tag, destination, bytes).
    pending: Vec<(u32, u32, *mut u8, usize)>,
}

impl InProcess {
    /// Ends for ranks `0..ranks`, sharing one set of mailboxes; a receive fails after waiting
    /// `timeout` for its message.
    pub fn group(ranks: u32, timeout: Duration) -> Vec<InProcess> {
        let boxes = Arc::new(Mailboxes::default());
        (0..ranks)
            .map(|me| InProcess {
                me,
                boxes: Arc::clone(&boxes),
                timeout,
                pending: Vec::new(),
            })
            .collect()
    }
}

// SAFETY: the raw destinations are only written by `wait`, on the thread that owns this value;
// the runner's contract keeps them valid and untouched until then.
unsafe impl Send for InProcess {}

fn error(message: String) -> CollectivesError {
    CollectivesError::Backend {
        backend: "in-process transport",
        message,
    }
}

impl Transport for InProcess {
    type Error = CollectivesError;

    fn reaches(&self, space: AddressSpace) -> bool {
        space == AddressSpace::Host
    }

    fn begin(&mut self, _stage: usize) {
        self.pending.clear();
    }

    unsafe fn recv(
        &mut self,
        peer: u32,
        tag: u32,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<(), CollectivesError> {
        self.pending.push((peer, tag, dst, bytes));
        Ok(())
    }

    unsafe fn send(
        &mut self,
        peer: u32,
        tag: u32,
        src: *const u8,
        bytes: usize,
    ) -> Result<(), CollectivesError> {
        // SAFETY: the caller gives `bytes` readable bytes at `src`.
        let data = unsafe { std::slice::from_raw_parts(src, bytes) }.to_vec();
        let mut boxes = self
            .boxes
            .boxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        boxes
            .entry((self.me, peer, tag))
            .or_default()
            .push_back(data);
        drop(boxes);
        self.boxes.arrived.notify_all();
        Ok(())
    }

    fn wait(&mut self, stage: usize) -> Result<(), CollectivesError> {
        let deadline = Instant::now() + self.timeout;
        let mut boxes = self
            .boxes
            .boxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for &(peer, tag, dst, bytes) in &self.pending {
            let data = loop {
                if let Some(d) = boxes
                    .get_mut(&(peer, self.me, tag))
                    .and_then(VecDeque::pop_front)
                {
                    break d;
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(error(format!(
                        "rank {}: stage {stage}: no message from rank {peer} with tag {tag} \
                         within {:?}",
                        self.me, self.timeout
                    )));
                }
                boxes = self
                    .boxes
                    .arrived
                    .wait_timeout(boxes, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            };
            if data.len() != bytes {
                return Err(error(format!(
                    "rank {}: stage {stage}: rank {peer} sent {} bytes with tag {tag}, the \
                     receive expects {bytes}",
                    self.me,
                    data.len()
                )));
            }
            // SAFETY: the runner gave `bytes` writable bytes at `dst`, untouched until now.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, bytes) };
        }
        self.pending.clear();
        Ok(())
    }
}
