//! The etcd calls the contender makes, behind a trait: etcd's gRPC API
//! ([`super::grpc::Grpc`]) in an app, an in-memory etcd
//! ([`super::memory::MemoryEtcd`]) in tests. The contender never names
//! which.

use std::time::Duration;

/// Why a call failed: etcd could not be reached, or it answered no.
///
/// Only [`ErrorKind::Unreachable`] may count towards the fall-back (a host
/// acting alone while etcd is out of reach): an answer etcd gives (a wrong
/// password, a role without access, a request it rejects) says etcd is
/// there, and acting alone on it would turn a misconfiguration into one
/// leader per host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EtcdError {
    pub kind: ErrorKind,
    pub message: String,
}

/// See [`EtcdError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// No answer: no connection, a TLS handshake that never ended, a
    /// timeout, a connection lost mid-call, or a member that cannot serve
    /// (no leader: the cluster is out of reach from here).
    Unreachable,
    /// etcd's answer: authentication failed, permission denied, a request
    /// it rejects, an answer we cannot use.
    Refused,
}

impl EtcdError {
    /// etcd could not be reached.
    pub(crate) fn unreachable(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Unreachable,
            message: message.into(),
        }
    }

    /// etcd answered no.
    pub(crate) fn refused(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Refused,
            message: message.into(),
        }
    }

    /// The same kind, with `context` before the message.
    pub(crate) fn context(self, context: impl std::fmt::Display) -> Self {
        Self {
            message: format!("{context}: {}", self.message),
            ..self
        }
    }
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What an etcd call returns.
pub(crate) type Result<T> = std::result::Result<T, EtcdError>;

/// One key-value pair as etcd returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: u64,
    /// The lease the key is bound to (0: none).
    pub lease: i64,
}

/// A transaction's verdict: it ran its success branch (at this revision),
/// or the comparison failed and this is what the key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Txn {
    Done(u64),
    Failed(Option<Kv>),
}

/// One change seen by a watch: `kv` is `None` when the key was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub key: String,
    /// The revision of the change (of the deletion, for a delete).
    pub revision: u64,
    pub kv: Option<Kv>,
}

/// What one message of a watch said.
#[derive(Debug, Default)]
pub(crate) struct WatchMessage {
    /// The revision etcd was at.
    pub revision: u64,
    pub created: bool,
    /// The watch cannot go on (compacted, cancelled).
    pub ended: bool,
    pub changes: Vec<Change>,
}

/// The contender's view of etcd.
pub(crate) trait Etcd: Send + Sync {
    /// The key's current value and the store's revision.
    fn get_at(&self, key: &str) -> Result<(Option<Kv>, u64)>;
    /// Creates `key` bound to `lease` only if it does not exist.
    fn create(&self, key: &str, value: &[u8], lease: i64) -> Result<Txn>;
    /// Rewrites `key` (bound to `lease`) only if it was last written at
    /// `mod_revision`; deletes `also_delete` in the same transaction, which
    /// runs only if that key, too, was last written at the revision given
    /// (a newer value there is never deleted unseen).
    fn swap(
        &self,
        key: &str,
        mod_revision: u64,
        value: &[u8],
        lease: i64,
        also_delete: Option<(&str, u64)>,
    ) -> Result<Txn>;
    /// Puts `key` unconditionally, bound to `lease`.
    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<()>;
    /// Creates `key` (bound to `lease`) only if it does not exist and
    /// `guard` was last written at `guard_revision`: a write fenced by our
    /// hold on another key. On failure, what `guard` holds.
    fn create_if(
        &self,
        guard: &str,
        guard_revision: u64,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Txn>;
    /// Deletes `key` only if it was last written at `mod_revision`;
    /// whether it did.
    fn delete_if(&self, key: &str, mod_revision: u64) -> Result<bool>;
    /// Every key under `prefix`, in key order, at most `limit` of them
    /// (more: an error, never a part taken for the whole).
    fn range(&self, prefix: &str, limit: usize) -> Result<Vec<Kv>>;
    /// A new lease of `ttl`: its id and granted TTL.
    fn grant(&self, ttl: Duration) -> Result<(i64, Duration)>;
    /// Renews `lease`: the TTL it has from now on, zero when it expired.
    fn keep_alive(&self, lease: i64) -> Result<Duration>;
    /// Revokes `lease` (deleting every key bound to it).
    fn revoke(&self, lease: i64) -> Result<()>;
    /// Opens a watch on `key` (every key under it, when `prefix`), from
    /// `start` (0: now); a silent stream ends after `read_timeout`.
    fn watch(
        &self,
        key: &str,
        prefix: bool,
        start: u64,
        read_timeout: Duration,
    ) -> Result<Box<dyn Watch>>;

    /// The id of the cluster that sent the last answer (0: not known). A
    /// new one means a new cluster: an etcd recreated, or restored from a
    /// snapshot as a new cluster, whose revisions say nothing of the old.
    /// (A member id tells only which member answered, which changes with
    /// every failover between endpoints, and a raft term is per cluster:
    /// neither says that data was lost.)
    fn cluster_id(&self) -> u64 {
        0
    }

    /// The key's current value, if any.
    fn get(&self, key: &str) -> Result<Option<Kv>> {
        self.get_at(key).map(|(kv, _)| kv)
    }
}

/// A watch's stream of messages.
pub(crate) trait Watch: Send {
    /// The next message; an error ends the stream.
    fn next_message(&mut self) -> Result<WatchMessage>;
}
