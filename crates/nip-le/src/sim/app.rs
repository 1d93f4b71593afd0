//! A window's app, as a Tauri app built on the plugin works its queue: it
//! queues every mention the relay brings, keeps a gate from the change
//! events, and while the gate is open takes the first owed mention, runs
//! its turn, and at the turn's end sends the reply (only if it may still
//! act) and records it done. A change with `mustCancelTurn` cancels the
//! turn in flight and gives the mention back. Every reply sent is
//! recorded, so a mention answered twice is seen the moment it happens.

use std::sync::Arc;

use crate::elector::QueuedEvent;

/// A turn in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The mention.
    pub id: String,
    /// When it ends (virtual ns).
    pub ends: u64,
    /// Distinguishes this turn's end event from an older one's.
    pub serial: u64,
}

/// One window's app.
#[derive(Debug, Default)]
pub struct App {
    /// The mentions the relay brought, in order; shared with the writer
    /// for an `owed` call instead of copied (a day-long run's observers
    /// keep thousands).
    pub queue: Arc<Vec<QueuedEvent>>,
    /// What the last change event said.
    pub gate: bool,
    /// The turn in flight.
    pub turn: Option<Turn>,
    /// Turns started so far (serials).
    pub turns: u64,
    /// Every mention ever queued, by a hash of its id (so that a long
    /// run's queue is not searched for each new one, and a day's ids take
    /// 8 bytes each).
    pub known: std::collections::HashSet<u64>,
    /// Its poll timer is set: mentions another window took are still in
    /// flight there, and owed here once that window gives them back or
    /// dies.
    pub poll_pending: bool,
    /// Replies on their way to the relay.
    pub sending: std::collections::HashSet<String>,
}

impl App {
    /// Queues a mention once. With a `cap` (0: none), the oldest queued
    /// mention not in a turn is dropped to make room: its id, if one was.
    pub fn receive(&mut self, id: &str, published_ms: u64, cap: usize) -> Option<String> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        if !self.known.insert(h.hash_one(id)) {
            return None;
        }
        let queue = Arc::make_mut(&mut self.queue);
        queue.push(QueuedEvent {
            id: id.to_owned(),
            published_ms: Some(published_ms),
        });
        if cap == 0 || queue.len() <= cap {
            return None;
        }
        let busy = self.turn.as_ref().map(|t| t.id.as_str());
        let i = (queue.iter()).position(|e| Some(e.id.as_str()) != busy)?;
        Some(queue.remove(i).id)
    }

    /// Drops a mention from the queue (answered, or done elsewhere).
    pub fn drop_mention(&mut self, id: &str) {
        Arc::make_mut(&mut self.queue).retain(|e| e.id != id);
    }

    /// Whether the app would look for work now.
    pub fn idle_with_work(&self) -> bool {
        self.gate && self.turn.is_none() && !self.queue.is_empty()
    }

    /// Starts a turn on `id` ending at `ends`.
    pub fn start(&mut self, id: String, ends: u64) -> u64 {
        self.turns += 1;
        self.turn = Some(Turn {
            id,
            ends,
            serial: self.turns,
        });
        self.turns
    }
}

/// The mention id of number `n` (a 64-hex-digit event id, as Nostr's).
pub fn mention_id(n: u64) -> String {
    format!("{n:064x}")
}
