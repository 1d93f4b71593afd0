//! [`WorkMachine::heard_global`]: what the global level (etcd) reports
//! for this key, folded into the machine's state.

use std::sync::Arc;

use super::WorkMachine;
use crate::work::SharedWork;

impl WorkMachine {
    /// News from the global level: what it read of every host's records
    /// (`records`, or `unread` when it could not), whether the gain was
    /// from another host and what it may have answered unknown here (what
    /// was published before `unknown_before_ms`), and whether we gave the
    /// key up (`gave_up`).
    pub(crate) fn heard_global(
        &mut self,
        records: Option<Arc<SharedWork>>,
        unread: bool,
        unknown_before_ms: Option<u64>,
        gave_up: bool,
    ) {
        let read = records.is_some() || unread;
        if let Some(w) = records {
            self.global.shared = Some(w);
        }
        self.global.unread = unread;
        if read {
            // What every host did is recorded in etcd: it decides what is
            // owed, not when we gained (a fall-back before left a start
            // that would skip the backlog).
            self.global.since = None;
        } else if let Some(before) = unknown_before_ms {
            // The other host's work before then is unknown here.
            self.global.since = Some(before);
        } else if gave_up {
            // Given up (a fence that lifts again keeps it: nothing moved).
            // What the records said stays until the next read replaces it:
            // a permit reopened without a gain (a hand-over that failed,
            // then a renewal) must not owe the whole backlog again.
            self.global.since = None;
        }
    }
}
