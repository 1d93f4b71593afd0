//! [`Hand`]: the takes this window was granted and has not settled. A
//! take in hand is never granted to this window again while its turn runs,
//! whatever the ledger can show (the simulator: a fail-safe leader, its
//! ledger refused by EIO, granted one mention twice and answered it
//! twice; and one whose take line carried no presence token). The hand is
//! bounded by refusing a take past [`MAX_OPEN_TAKES`], never by forgetting
//! one: a forgotten grant could be granted again while its turn runs.

use std::collections::BTreeMap;

use crate::ledger::{self, Index};

/// Most takes a window holds of one key without settling them (each a
/// turn in flight: an app has a handful); past it a take is refused
/// (`TakeOutcome::TooManyOpen`), so a flood of takes never settled
/// cannot grow the ledger without bound.
pub(crate) const MAX_OPEN_TAKES: usize = 1024;

/// The grants of one key not settled yet (see the module).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(super) struct Hand {
    /// Each grant, with the epoch its take line is in the ledger at, if it
    /// is.
    grants: BTreeMap<String, Option<u64>>,
}

impl Hand {
    /// `id` was granted, its line in the ledger at `recorded_at`.
    pub(super) fn grant(&mut self, id: &str, recorded_at: Option<u64>) {
        self.grants.insert(id.to_owned(), recorded_at);
    }

    /// Whether our turn on `id` may still run: granted and not settled,
    /// unless the ledger, readable, no longer shows our recorded take (a
    /// takeover from us while we hung gave it back on our behalf, and
    /// perhaps another holder took it since: we woke fenced, and the turn
    /// sends nothing; kept in hand, the event was never owed to us again
    /// once we led again: the model check, paths of 8).
    pub(super) fn holds(&self, id: &str, index: Option<&Index>) -> bool {
        self.grants.get(id).is_some_and(|r| match (r, index) {
            (Some(epoch), Some(ix)) => ix.state(id) == Some(ledger::State::Taken(*epoch)),
            _ => true,
        })
    }

    /// Whether one more take fits: fewer than [`MAX_OPEN_TAKES`] in hand,
    /// counting none that [`Hand::holds`] no longer (those are dropped).
    pub(super) fn has_room(&mut self, index: Option<&Index>) -> bool {
        if self.grants.len() < MAX_OPEN_TAKES || mutated!(FloodOfTakes) {
            return true;
        }
        let gone: Vec<String> = (self.grants.keys())
            .filter(|id| !self.holds(id, index))
            .cloned()
            .collect();
        for id in gone {
            self.grants.remove(&id);
        }
        self.grants.len() < MAX_OPEN_TAKES
    }

    /// The turn on `id` ended; whether it was in hand.
    pub(super) fn settle(&mut self, id: &str) -> bool {
        self.grants.remove(id).is_some()
    }

    /// How many grants are in hand.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.grants.len()
    }
}
