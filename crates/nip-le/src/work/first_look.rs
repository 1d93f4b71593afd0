//! [`FirstLook`]: the queue as the app first showed it to us while we
//! lead. What arrives after it arrived after we led, whatever the senders'
//! clocks or ours say; and after a writer without a ledger, what it left
//! out is the floor every later holder keeps.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use crate::elector::types::QueuedEvent;

/// The first queue asked about while we lead (see the module).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(super) struct FirstLook {
    /// Hashes of its event ids.
    queued: BTreeSet<u64>,
    /// After a writer without a ledger: what was published before this
    /// (unix ms, the senders' clocks: ours may have stepped since) was
    /// left out.
    floor: Option<u64>,
}

impl FirstLook {
    /// The look at `queue`, having led since `led_ms` (unix ms);
    /// `after_ledgerless`: a writer without a ledger held before us, so
    /// what was published before we led is left out.
    pub(super) fn new(queue: &[QueuedEvent], led_ms: u64, after_ledgerless: bool) -> Self {
        let skipped = (queue.iter())
            .filter_map(|e| e.published_ms)
            .filter(|&p| p < led_ms);
        Self {
            queued: queue.iter().map(|e| hash(&e.id)).collect(),
            floor: after_ledgerless
                .then(|| skipped.max().map(|p| p + 1))
                .flatten(),
        }
    }

    /// Whether `id` was queued after this look.
    pub(super) fn late(&self, id: &str) -> bool {
        !self.queued.contains(&hash(id))
    }

    /// What was left out: what was published before this (unix ms).
    pub(super) fn floor(&self) -> Option<u64> {
        self.floor
    }
}

fn hash(id: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(id)
}
