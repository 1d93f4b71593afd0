//! How a watch stream becomes the task's inputs. [`Cursor`] is the rule
//! (where to resume, when the task must look at every key again); it does
//! no I/O, so the simulator feeds it the messages of its own etcd.
//! [`follow`] is the app's loop around it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::super::etcd::{Etcd, WatchMessage};
use super::super::EtcdConfig;
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
            // lost data. Its old revisions mean nothing now.
            self.next = m.revision.saturating_add(1);
            return vec![Inbox::Rewound];
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

/// Follows every key under the prefix, from where it left off, handing
/// each input to `send` (false: nobody listens any more).
pub(crate) fn follow(
    cfg: &EtcdConfig,
    gw: &dyn Etcd,
    stop: &AtomicBool,
    mut send: impl FnMut(Inbox) -> bool,
) {
    let prefix = format!("{}/", cfg.prefix);
    let mut cursor = Cursor::default();
    while !stop.load(Ordering::Acquire) {
        let mut stream = match gw.watch(&prefix, true, cursor.start(), Duration::from_secs(5)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("etcd watch: {e}");
                cursor.lost();
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        loop {
            match stream.next_message() {
                Ok(m) => {
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
