//! Extension: the work ledger's rules, for both levels, as pure code: what
//! a take is granted, whose settle is accepted and at which epoch, what
//! is owed, what the global level (etcd) has in hand elsewhere,
//! and when each falls back to "published since we led". The file format
//! and the index of what a ledger file says are in [`crate::ledger`]; what
//! a window owes etcd of its records (sent, refused, sent again, the
//! leases they live on) is the contender's outbox machine
//! (`global/contender/outbox.rs`). The writer's work shell
//! (`elector/writer/work.rs`) and the contender's
//! (`global/contender/work.rs`) only carry the decisions out: open, read,
//! append, send.
//!
//! The simulator runs these rules inside every simulated window, and a
//! bounded model check (`model.rs`) runs them over every interleaving of
//! two windows' takes, replies, cancels, crashes, hangs, takeovers and
//! hand-overs on one ledger.

mod first_look;
mod in_hand;
mod ledger_lines;
mod machine;
#[cfg(test)]
mod model;
mod settle_cap;
mod steps;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
#[cfg(feature = "etcd")]
use std::time::Duration;

#[cfg(test)]
pub(crate) use in_hand::MAX_OPEN_TAKES;
pub(crate) use ledger_lines::{epoch_floor, held_line, settle_line};
pub(crate) use machine::WorkMachine;
pub(crate) use steps::{Displaced, Lead, Settle, SettleStep, Spell, TakeStep};

/// The agent's work as the global level records it for every host:
/// events done, and events a window still running has taken.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct SharedWork {
    pub done: BTreeSet<String>,
    pub taken: BTreeSet<String>,
}

/// Most dones sent again in one go (see [`SharedWork::lacks_done`]).
pub(crate) const MAX_DONES_AGAIN: usize = 1024;

impl SharedWork {
    /// The dones our host's ledger shows that these records lack, written
    /// since `since_ms`, newest first, at most [`MAX_DONES_AGAIN`]: a
    /// window whose `done` record etcd did not take before the window died
    /// (etcd paused, then a SIGKILL) left its reply unknown to every other
    /// host, which answered it again once it gained the agent (real-process
    /// chaos across hosts). Whoever leads our host sends them again when it
    /// reads the records. `since_ms` is half the retention ago: an older
    /// record may have gone with its lease, as meant.
    pub(crate) fn lacks_done(&self, index: &crate::ledger::Index, since_ms: u64) -> Vec<String> {
        let mut missing: Vec<(u64, &str)> = (index.dones())
            .filter(|(id, at)| *at >= since_ms && !self.done.contains(*id))
            .map(|(id, at)| (at, id))
            .collect();
        missing.sort_unstable_by(|a, b| b.cmp(a));
        (missing.into_iter().take(MAX_DONES_AGAIN))
            .map(|(_, id)| id.to_owned())
            .collect()
    }
}

/// One record the global level keeps of an event.
#[cfg(feature = "etcd")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordView<'a> {
    pub id: &'a str,
    /// A `done` (else a take).
    pub done: bool,
    /// The window that wrote it.
    pub instance_id: &'a str,
}

#[cfg(feature = "etcd")]
impl SharedWork {
    /// What the records say for the window `our_id`: what is done, what
    /// other windows have taken (our own takes are our ledger's: a record
    /// of one we give back later would keep the event from us), and
    /// whether another window's take is open (then they are read again
    /// soon: its taker may die).
    pub(crate) fn from_records<'a>(
        records: impl IntoIterator<Item = RecordView<'a>>,
        our_id: &str,
    ) -> (Self, bool) {
        let mut work = Self::default();
        let mut others_open = false;
        for r in records {
            if r.done {
                work.done.insert(r.id.to_owned());
            } else if r.instance_id != our_id {
                others_open = true;
                work.taken.insert(r.id.to_owned());
            }
        }
        (work, others_open)
    }
}

/// The records could not be read since `unread_for` ago: past a whole
/// `ttl` (too many records, a hostile one too large to page) the holder
/// stops waiting for them and acts as after a holder whose ledger it
/// cannot read, owing only what is published from then on; before that it
/// owes nothing (what another host answered is unknown).
#[cfg(feature = "etcd")]
pub(crate) fn gives_up_on_records(unread_for: Duration, ttl: Duration) -> bool {
    unread_for >= ttl
}
