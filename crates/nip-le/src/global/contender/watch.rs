//! How a watch stream becomes the task's inputs. [`Cursor`] is the rule
//! (where to resume, when the task must look at every key again); it does
//! no I/O, so the simulator feeds it the messages of its own etcd.
//! [`follow`] is the app's loop around it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::super::etcd::{Etcd, WatchMessage};
use super::Inbox;

/// Where a watch resumes.
#[derive(Debug, Default, Clone)]
pub(crate) struct Cursor {
    /// The next revision to ask for; 0: none known (start from now, and
    /// make the task look at every key).
    next: u64,
}

impl Cursor {
    /// The revision to (re)open the watch from (0: now).
    pub(crate) fn start(&self) -> u64 {
        self.next
    }

    /// The watch could not be opened, or etcd ended it (compacted,
    /// cancelled): the gap cannot be bridged.
    pub(crate) fn lost(&mut self) {
        self.next = 0;
    }

    /// One message: the inputs it makes, in order.
    pub(crate) fn message(&mut self, m: WatchMessage) -> Vec<Inbox> {
        if m.ended {
            self.lost();
            return Vec::new();
        }
        let mut out = Vec::with_capacity(m.changes.len() + 1);
        // A header's revision is the store's, not the watch's progress:
        // etcd sends it with the `created` message of a resumed watch and
        // with every batch of a catch-up, before the events up to it. It
        // counts only for a watch created from now and for a progress
        // notification (no event, not created).
        let progress = m.changes.is_empty() && (!m.created || self.next == 0);
        if m.created && self.next > 0 && m.revision.saturating_add(1) < self.next {
            // Reopened on a store that has not reached what we saw: etcd
            // lost data, or this member lags (its header is not
            // linearizable). Follow it from where it is, and have the task
            // look at every key: its calls are linearizable, and tell the
            // two apart (`Task::store_at`).
            self.next = m.revision.saturating_add(1);
            return vec![Inbox::Synced];
        }
        if m.created && self.next == 0 {
            out.push(Inbox::Synced);
        }
        for c in m.changes {
            self.next = self.next.max(c.revision.saturating_add(1));
            out.push(Inbox::Change(c));
        }
        if progress {
            self.next = self.next.max(m.revision.saturating_add(1));
        }
        out
    }
}

/// How long the watch waits before it opens the stream again: at once
/// after a stream that delivered something (a silent connection timing out
/// is the normal case), then doubling from 50 ms to 2 s while etcd keeps
/// refusing or closing it, so a broken etcd or proxy is not hammered.
#[derive(Debug, Default, Clone)]
pub(crate) struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The first delay after a failure, and the most it grows to.
    const FIRST: Duration = Duration::from_millis(50);
    const MOST: Duration = Duration::from_secs(2);

    /// A stream delivered a message: the next reopen is immediate.
    pub(crate) fn delivered(&mut self) {
        self.failures = 0;
    }

    /// The stream failed (or ended) without a message: how long to wait.
    pub(crate) fn failed(&mut self) -> Duration {
        let d = Self::FIRST.saturating_mul(1 << self.failures.min(6));
        self.failures = self.failures.saturating_add(1);
        d.min(Self::MOST)
    }
}

/// Follows every key under `prefix` (one agent's: `<prefix>/<pubkey>/`),
/// from where it left off, handing each input to `send` (false: nobody
/// listens any more).
pub(crate) fn follow(
    gw: &dyn Etcd,
    prefix: &str,
    stop: &AtomicBool,
    send: impl FnMut(Inbox) -> bool,
) {
    follow_with(gw, prefix, stop, send, pause);
}

/// [`follow`], waiting between failed streams with `wait` (a test counts).
pub(crate) fn follow_with(
    gw: &dyn Etcd,
    prefix: &str,
    stop: &AtomicBool,
    mut send: impl FnMut(Inbox) -> bool,
    mut wait: impl FnMut(&AtomicBool, Duration),
) {
    let mut cursor = Cursor::default();
    let mut backoff = Backoff::default();
    // The first stream opens at once, and so does one after a stream that
    // delivered anything (its `created` message counts) but its own end: a
    // watch etcd refuses (`created` and `canceled` at once: permission
    // denied, a token it no longer knows) backs off like a failed one.
    let mut at_once = true;
    while !stop.load(Ordering::Acquire) {
        if !std::mem::take(&mut at_once) {
            wait(stop, backoff.failed());
        }
        let mut stream = match gw.watch(prefix, true, cursor.start(), Duration::from_secs(5)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("etcd watch: {e}");
                cursor.lost();
                continue;
            }
        };
        loop {
            match stream.next_message() {
                Ok(m) => {
                    if !m.ended {
                        at_once = true;
                        backoff.delivered();
                    }
                    let ended = m.ended;
                    for i in cursor.message(m) {
                        if !send(i) {
                            return;
                        }
                    }
                    if ended {
                        break;
                    }
                }
                Err(e) => {
                    // A silent connection times out and is opened again
                    // from the next revision: nothing is missed.
                    tracing::trace!("etcd watch: {e}");
                    break;
                }
            }
            if stop.load(Ordering::Acquire) {
                return;
            }
        }
    }
}

/// Sleeps `d`, waking early when asked to stop.
fn pause(stop: &AtomicBool, d: Duration) {
    let end = std::time::Instant::now() + d;
    while !stop.load(Ordering::Acquire) {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}
