//! Extension: whether this process runs an agent for a key, so that a
//! step-down for another window's claim (or a release) stops it before the
//! lock moves, and the successor's agent finds the agent's instance lease
//! free (see `machine::drain`). The runner of a key writes it, the writer
//! reads it: one atomic per key, no lock on either path.
//!
//! The two sides meet like Dekker's: the runner marks the agent running
//! and then reads the leader flag; the writer clears the leader flag and
//! then reads the mark. With a sequentially consistent fence between each
//! side's store and load, at least one of them sees the other: either the
//! writer waits for the agent, or the runner does not start it.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::pubkey::AgentPubkey;

use super::wake::{Mailbox, Msg};
use super::Command;

/// Every key's mark, created on first use.
#[derive(Debug, Default)]
pub(crate) struct AgentHolds {
    marks: Mutex<HashMap<AgentPubkey, Arc<AtomicBool>>>,
}

impl AgentHolds {
    /// The mark of `pubkey` (the same one for every caller).
    pub(crate) fn mark(&self, pubkey: &AgentPubkey) -> Arc<AtomicBool> {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(marks.entry(*pubkey).or_default())
    }

    /// The writer's side, called after it cleared the key's leader flag:
    /// whether an agent of ours still runs (or is starting) for `pubkey`.
    pub(crate) fn running_after_clearing(&self, pubkey: &AgentPubkey) -> bool {
        fence(Ordering::SeqCst);
        let marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        marks.get(pubkey).is_some_and(|m| m.load(Ordering::SeqCst))
    }

    /// Whether an agent of ours runs for `pubkey` now.
    pub(crate) fn running(&self, pubkey: &AgentPubkey) -> bool {
        let marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        marks.get(pubkey).is_some_and(|m| m.load(Ordering::SeqCst))
    }
}

/// The runner's side of one key's mark.
#[derive(Debug, Clone)]
pub(crate) struct AgentHold {
    pubkey: AgentPubkey,
    mark: Arc<AtomicBool>,
    mailbox: Mailbox<Command>,
}

impl AgentHold {
    pub(crate) fn new(
        pubkey: AgentPubkey,
        mark: Arc<AtomicBool>,
        mailbox: Mailbox<Command>,
    ) -> Self {
        Self {
            pubkey,
            mark,
            mailbox,
        }
    }

    /// Marks the agent as starting, then asks `may_act`: if we may not act
    /// after all, the mark is cleared again and `false` returned (do not
    /// start it).
    pub(crate) fn begin(&self, may_act: impl FnOnce() -> bool) -> bool {
        self.mark.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if may_act() {
            return true;
        }
        self.end();
        false
    }

    /// The agent is gone (stopped, exited, or never started): a step-down
    /// waiting for it completes now.
    pub(crate) fn end(&self) {
        if self.mark.swap(false, Ordering::SeqCst) {
            let _ = self.mailbox.send(Msg::Key(self.pubkey));
        }
    }
}
