//! Extension (cargo feature `etcd`): one prompter per agent across hosts.
//!
//! Two levels. On each host the NIP's file election runs unchanged, so the
//! harness and spec instances on that host keep working and defer to our
//! host leader. The host leader then contends for the agent's key in etcd,
//! `<prefix>/<pubkey>/leader`, bound to an etcd lease: created in a
//! transaction only if absent, kept alive every third of the TTL, its
//! `mod_revision` the cross-host fencing epoch. A window acts only while it
//! leads its host *and* holds the key (see [`crate::Level`]).
//!
//! * A sibling that takes the host lock (a crash, a local claim, a handoff)
//!   continues the same lease: etcd leases are not tied to a connection, so
//!   the agent moves within the host in milliseconds and only the loss of a
//!   whole host costs the TTL.
//! * A window watches its agents' keys: a released key (lease revoked on a
//!   graceful exit) is taken at once; a claim is a put of
//!   `<prefix>/<pubkey>/claim`, and the holder stands down and rewrites the
//!   key for the claimant in one transaction.
//! * A holder that cannot renew fences itself at `sent + TTL - TTL/10`
//!   (sent: before the request left, so etcd's expiry is later; a tenth of
//!   the TTL covers any plausible clock-rate difference), on a clock that
//!   keeps running through suspend.
//! * While etcd cannot be reached, [`WhenUnreachable`] decides.
//!
//! The client speaks etcd's gRPC API (`tonic`, with the protobuf code
//! generated once and kept in the source, so no build needs `protoc`;
//! TLS with [`EtcdTls`] and cargo feature `etcd-tls`, etcd users with
//! [`EtcdAuth`]: see docs/cross-host.md, "Transport security and trust
//! model"). etcd's JSON gateway, which it used before, refuses a client
//! certificate together with users.

pub(crate) mod contender;
pub(crate) mod etcd;
mod grpc;
mod host_id;
mod machine;
#[cfg(any(test, feature = "sim"))]
pub(crate) mod memory;
pub(crate) mod seen;

use std::time::Duration;

pub use crate::config::etcd::{
    EtcdAuth, EtcdConfig, EtcdTls, WhenUnreachable, DEFAULT_PREFIX, DEFAULT_TTL,
};
pub(crate) use contender::Contender;
pub use host_id::{is_hostile as host_id_is_hostile, persisted as persisted_host_id, HOST_ID_FILE};
pub use seen::SEEN_FILE;

use crate::elector::GlobalHolder;
use crate::pubkey::AgentPubkey;
use etcd::Etcd as _;

/// Reads who holds `pubkey`'s etcd key, for status tools (one range call;
/// `config` is validated first: an invalid one is an error).
pub fn read_holder(
    config: &EtcdConfig,
    pubkey: &AgentPubkey,
) -> Result<Option<GlobalHolder>, String> {
    config.validate()?;
    let gw = grpc::Grpc::new(config, Duration::from_secs(2));
    let kv = gw
        .get(&config.leader_key(pubkey))
        .map_err(|e| e.to_string())?;
    Ok(kv.map(|kv| contender::holder_of(&kv)))
}

/// One write of an agent's etcd key, for audits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyWrite {
    /// The revision of the write.
    pub revision: u64,
    /// The holder it named; `None`: the key was deleted (released or its
    /// lease expired).
    pub holder: Option<GlobalHolder>,
}

/// Every write of `pubkey`'s etcd key still in etcd's history (up to its
/// last compaction), oldest first: who held the agent from which revision
/// (`config` is validated first: an invalid one is an error).
pub fn key_history(config: &EtcdConfig, pubkey: &AgentPubkey) -> Result<Vec<KeyWrite>, String> {
    config.validate()?;
    let gw = grpc::Grpc::new(config, Duration::from_secs(2));
    let key = config.leader_key(pubkey);
    let (_, now) = gw.get_at(&key).map_err(|e| e.to_string())?;
    let mut stream = gw
        .watch(&key, false, 1, Duration::from_millis(500))
        .map_err(|e| e.to_string())?;
    let mut writes = Vec::new();
    // History comes first, then the watch waits for news: a short silence
    // (or a write at the store's current revision) ends it.
    loop {
        let m = match stream.next_message() {
            Ok(m) => m,
            Err(_) if !writes.is_empty() || now <= 1 => break,
            Err(e) => return Err(e.to_string()),
        };
        if m.ended {
            return Err("etcd compacted the key's history".into());
        }
        for c in m.changes {
            writes.push(KeyWrite {
                revision: c.revision,
                holder: c.kv.as_ref().map(contender::holder_of),
            });
        }
        if writes.last().is_some_and(|w| w.revision >= now) {
            break;
        }
    }
    Ok(writes)
}

/// One of the agent's work records in etcd (see docs/cross-host.md, "The
/// work ledger across hosts").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRecord {
    /// The event id.
    pub id: String,
    /// `true`: answered; `false`: taken by a window still running.
    pub done: bool,
    /// The host and window that wrote it.
    pub host_id: String,
    /// See [`WorkRecord::host_id`].
    pub instance_id: String,
    /// When, unix ms.
    pub at_ms: u64,
}

/// The agent's work records in etcd, in event id order, for audits and
/// status tools (`config` is validated first; hostile records are skipped).
pub fn work_records(config: &EtcdConfig, pubkey: &AgentPubkey) -> Result<Vec<WorkRecord>, String> {
    config.validate()?;
    let gw = grpc::Grpc::new(config, Duration::from_secs(2));
    contender::work::records(config, &gw, pubkey).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_are_validated() {
        let ok = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()], "laptop");
        ok.validate().unwrap();
        for bad in [
            EtcdConfig::new(vec![], "h"),
            EtcdConfig::new(vec!["https://x:1".into()], "h"),
            EtcdConfig::new(vec!["http://x:1".into()], "a\u{7f}b"),
            EtcdConfig::new(vec!["http://x:1".into()], "a\nb"),
            EtcdConfig {
                ttl: Duration::from_millis(1500),
                ..ok.clone()
            },
            EtcdConfig {
                prefix: "nip-le".into(),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn no_endpoint_is_an_error_not_a_panic() {
        let pk = AgentPubkey::parse(&"0".repeat(64)).unwrap();
        let none = EtcdConfig::new(vec![], "h");
        assert!(read_holder(&none, &pk).unwrap_err().contains("no endpoint"));
        assert!(key_history(&none, &pk).unwrap_err().contains("no endpoint"));
        assert!(work_records(&none, &pk)
            .unwrap_err()
            .contains("no endpoint"));
    }
}
