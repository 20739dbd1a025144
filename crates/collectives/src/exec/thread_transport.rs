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

/// The messages to one rank, per (source, tag), in the order they were sent.
type Queues = HashMap<(u32, u32), VecDeque<Vec<u8>>>;

/// One rank's mailbox: its queues, and the condition its receives wait on, which only sends
/// to this rank signal (so a send wakes its receiver, not every waiting rank).
#[derive(Debug, Default)]
struct Mailbox {
    queues: Mutex<Queues>,
    arrived: Condvar,
}

/// Messages in flight between the ranks of one process, one mailbox per destination rank.
#[derive(Debug)]
pub struct Mailboxes {
    boxes: Vec<Mailbox>,
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
        let boxes = Arc::new(Mailboxes {
            boxes: (0..ranks).map(|_| Mailbox::default()).collect(),
        });
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
        let Some(mailbox) = self.boxes.boxes.get(peer as usize) else {
            return Err(error(format!(
                "rank {}: a send to rank {peer} of {}",
                self.me,
                self.boxes.boxes.len()
            )));
        };
        // SAFETY: the caller gives `bytes` readable bytes at `src`.
        let data = unsafe { std::slice::from_raw_parts(src, bytes) }.to_vec();
        let mut queues = mailbox
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        queues.entry((self.me, tag)).or_default().push_back(data);
        drop(queues);
        mailbox.arrived.notify_all();
        Ok(())
    }

    fn wait(&mut self, stage: usize) -> Result<(), CollectivesError> {
        let deadline = Instant::now() + self.timeout;
        let Some(mailbox) = self.boxes.boxes.get(self.me as usize) else {
            return Err(error(format!("rank {} has no mailbox", self.me)));
        };
        let mut queues = mailbox
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for &(peer, tag, dst, bytes) in &self.pending {
            let data = loop {
                if let Some(d) = queues.get_mut(&(peer, tag)).and_then(VecDeque::pop_front) {
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
                queues = mailbox
                    .arrived
                    .wait_timeout(queues, deadline - now)
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
