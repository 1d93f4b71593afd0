//! The portable watch on a holder's death: a thread that probes the
//! holder's presence lock every `interval` and reports when it is gone.
//!
//! A blocking wait on the presence lock would learn of a death at once,
//! but no platform lets another thread interrupt a blocked `flock`: such a
//! thread would outlive the key it watched (a thousand join/leave cycles
//! next to one live leader, a thousand threads). A poll is stopped at once:
//! stopping disconnects its channel, wakes it and joins it. A holder that
//! leaves gracefully removes its presence file, which the directory watch
//! reports without waiting for the poll; the poll bounds only a crash.

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Mailbox, Msg};
use crate::presence::{self, HolderPresence};

/// A running poll of one holder.
pub(super) struct HolderPoll {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl HolderPoll {
    /// Starts polling the holder of `token` in `dir`; `None` if no thread
    /// can be started (the refresh tick then remains the bound).
    pub(super) fn start<C: Send + 'static>(
        dir: PathBuf,
        token: String,
        interval: Duration,
        mailbox: Mailbox<C>,
    ) -> Option<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("nip-le-holder".into())
            .spawn(move || loop {
                if presence::probe_holder(&dir, &token) == HolderPresence::Gone {
                    let _ = mailbox.send(Msg::PresenceGone(token));
                    return;
                }
                match stopped.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    // Stopped (the sender is dropped), or told to stop.
                    _ => return,
                }
            })
            .ok()?;
        Some(Self { stop, thread })
    }

    /// Stops the poll and waits for its thread (at most one probe): no
    /// thread outlives the watch.
    pub(super) fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}
