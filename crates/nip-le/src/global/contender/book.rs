//! What this window owes etcd of the agent's work (see [`super::work`]):
//! the leases its records are bound to, its open takes, and the records
//! etcd refused, to be sent again.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::pubkey::AgentPubkey;

/// This window's records in etcd.
#[derive(Debug, Default)]
pub(crate) struct WorkBook {
    /// The lease our take records are bound to, and when to renew it.
    pub(super) take_lease: Option<(i64, Instant)>,
    /// The lease done records are bound to, and when it was granted.
    pub(super) done_lease: Option<(i64, Instant)>,
    /// Our open takes in etcd: the revision of each record.
    pub(super) mine: BTreeMap<(AgentPubkey, String), u64>,
    /// Done records etcd has not taken yet, oldest first.
    pub(super) unsent: VecDeque<(AgentPubkey, String)>,
    /// Take records etcd has not taken yet (a failed call), oldest first.
    pub(super) untaken: VecDeque<(AgentPubkey, String)>,
    /// Give-backs etcd has not taken yet: our record and its revision.
    pub(super) ungiven: VecDeque<(AgentPubkey, String, u64)>,
    /// Don't send again before (after a failure).
    pub(super) retry_at: Option<Instant>,
}
