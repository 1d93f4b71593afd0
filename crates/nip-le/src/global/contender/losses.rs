//! What the task knows of etcd's history: the highest revision and the
//! cluster id it answered with, and the data losses they reveal (a store
//! whose revisions went back, a new cluster). A host keeps what its
//! windows saw beside its lock files ([`crate::global::seen`]), so a window
//! that first reaches etcd after a loss notices it too.

use std::time::Instant;

use super::entry::Holding;
use super::task::{PermitState, Task, KEEP_EVERY};
use crate::elector::ChangeReason;
use crate::global::seen::Seen;

impl Task {
    /// Starts from what this host's windows saw of etcd (kept beside the
    /// lock files): a store below it lost data.
    pub(crate) fn remember(&mut self, seen: Seen) {
        self.known_cluster = seen.cluster;
        self.known_revision = seen.revision;
        self.losses = seen.losses;
        self.kept = (seen, None);
    }

    /// What this task has seen of etcd.
    pub(crate) fn seen(&self) -> Seen {
        Seen {
            cluster: self.known_cluster,
            revision: self.known_revision,
            losses: self.losses,
        }
    }

    /// What the shell should keep now: what was seen since it last kept
    /// anything, at most every [`KEEP_EVERY`] (a revision grows with every
    /// work record).
    pub(crate) fn seen_to_keep(&mut self) -> Option<Seen> {
        let now = self.clock.now();
        let seen = self.seen();
        let due = self.kept.1.is_none_or(|t| now >= t + KEEP_EVERY);
        (seen != self.kept.0 && due).then(|| {
            self.kept = (seen, Some(now));
            seen
        })
    }

    /// When [`Task::seen_to_keep`] has something again.
    pub(super) fn keep_due(&self) -> Option<Instant> {
        (self.seen() != self.kept.0)
            .then(|| self.kept.1.map_or(self.clock.now(), |t| t + KEEP_EVERY))
    }

    /// A store revision etcd answered with: below one it showed before,
    /// etcd lost data (restored empty or from an old snapshot).
    pub(super) fn store_at(&mut self, revision: u64) {
        if revision < self.known_revision {
            self.rewound(revision);
        }
        self.known_revision = self.known_revision.max(revision);
    }

    /// Whether etcd still answers as the cluster it did: a new cluster id
    /// is a data loss even when the new store's revisions have already
    /// climbed past what we saw (the work records write two per mention).
    pub(super) fn same_cluster(&mut self, id: u64) -> bool {
        if id == 0 || id == self.known_cluster {
            return true;
        }
        let was = std::mem::replace(&mut self.known_cluster, id);
        if was != 0 {
            tracing::warn!(was, now = id, "etcd answers as another cluster");
            self.rewound(0);
            return false;
        }
        true
    }

    /// etcd lost data: what we knew of its revisions means nothing now,
    /// every key is looked at again, and nobody takes one for a TTL. A
    /// lease etcd forgot was renewed last before the loss, so any permit it
    /// backed ends within 0.9 TTL of now (see [`deadline`](super::renewer::deadline)).
    pub(super) fn rewound(&mut self, revision: u64) {
        tracing::warn!(
            known = self.known_revision,
            now = revision,
            "etcd's revisions went back: it lost data; no key is taken for a TTL"
        );
        self.known_revision = revision;
        self.losses = self.losses.saturating_add(1);
        self.rewound_until = Some(self.clock.now() + self.cfg.ttl);
        let mut held = Vec::new();
        for (pk, e) in &mut self.entries {
            e.seen = 0;
            e.verify = true;
            e.retry_at = None;
            e.claim_lease = None;
            // Our lease is gone with the data: stop acting now, not at the
            // permit's deadline (a renewal that just failed would leave it
            // open until then, while a window that first reached etcd after
            // the loss takes the key). A hand-over goes with it, and with
            // that a fall-back beside it: etcd answers again. A fall-back
            // alone holds nothing etcd lost, and ends when etcd's answers
            // are seen (`Task::check_unreachable`).
            match std::mem::take(&mut e.holding) {
                Holding::Nothing => {}
                Holding::FallingBack => e.holding = Holding::FallingBack,
                Holding::Key(_) | Holding::HandingOver { .. } => {
                    e.swap_at = None;
                    e.grant(PermitState::NotHeld, 0);
                    held.push(*pk);
                }
            }
        }
        for pk in held {
            self.tell(pk, Some(ChangeReason::Lost));
        }
    }
}
