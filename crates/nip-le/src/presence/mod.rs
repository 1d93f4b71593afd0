//! Extension: presence, the liveness lock of each elector.
//!
//! In extended mode every elector holds a lock of its own in the lock
//! directory for as long as it runs, next to a small body listing the agent
//! keys it takes part in: `{"token":…,"instance_id":…,"pid":N,"keys":[…]}`.
//! The kernel drops the lock the instant the process dies, so:
//! * a survivor learns of a leader's death in milliseconds (see
//!   `elector::wake`);
//! * a leader whose lock is held, and whose body still lists the key, is
//!   alive however old its `claimed_at` (laptop sleep), and is only replaced
//!   when its record stops changing for longer than the stale bound by the
//!   observer's monotonic clock (a hung process);
//! * a leader leaving gracefully can hand the lock straight to a live
//!   sibling found here, so no moment exists where the file is empty and
//!   everyone reads "leader".
//!
//! The record names the holder's presence by a token in the extra field
//! `live`; records without it (the harness, spec mode) keep the NIP's
//! dead-pid and stale rules. Presence is never the `flock` target of the
//! NIP: only our instances read it. Hostile content is handled like the lock
//! file's: no symlinks, regular files only, capped reads; a body that cannot
//! be read or parsed counts as a live holder (the hang rule still bounds
//! it), never as a dead one.
//!
//! Two backends, one API, and both read everywhere (a probe or a sibling
//! search dispatches on the token, so electors of either backend share one
//! lock directory):
//! * Linux, [`Backend::Native`] ([`slots`]): one shared file per lock
//!   directory, `presence.live`, created once; each elector holds an OFD
//!   byte-range lock on a slot of its own and writes its body in that
//!   slot's region. Creating a file costs an inode allocation (about
//!   0.6 ms on an ext4 root, serialised on the directory): 64 windows
//!   starting together then create nothing, not 64 files. Token:
//!   `<pid>-<16 hex>-s<slot>`.
//! * macOS, Windows, and Linux with [`Backend::Portable`] ([`files`]): one
//!   file per elector, `<token>.live`, with an exclusive `flock` (macOS has
//!   no OFD locks, and a process-wide `fcntl` lock would be dropped by
//!   closing any other descriptor of the file). Token: `<pid>-<16 hex>`.

pub mod files;
#[cfg(target_os = "linux")]
pub mod slots;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::Backend;
use crate::error::Result;
use crate::pubkey::AgentPubkey;
pub use crate::token::{token_pid, valid_token, PeerPresence};

/// Our presence lock, of the backend the configuration chose.
#[derive(Debug)]
pub enum Presence {
    /// One file per elector.
    Files(files::Presence),
    /// A slot of the shared file (Linux).
    #[cfg(target_os = "linux")]
    Slots(slots::Presence),
}

impl Presence {
    /// Creates our presence in `dir` with `backend`'s code, listing no key
    /// yet.
    pub fn create(dir: &Path, instance_id: &str, backend: Backend) -> Result<Self> {
        Self::create_listing(dir, instance_id, backend, [])
    }

    /// [`Presence::create`], listing `keys` from the start where that
    /// saves a write (a presence file's body; the shared file's slot is
    /// written by [`Presence::set_keys`] as before).
    pub fn create_listing(
        dir: &Path,
        instance_id: &str,
        backend: Backend,
        keys: impl IntoIterator<Item = AgentPubkey>,
    ) -> Result<Self> {
        #[cfg(target_os = "linux")]
        if backend.linux_fast_paths() {
            return Ok(Presence::Slots(slots::Presence::create(dir, instance_id)?));
        }
        let _ = backend;
        Ok(Presence::Files(files::Presence::create_listing(
            dir,
            instance_id,
            keys,
        )?))
    }

    /// Lists `keys` as the elections we take part in.
    pub fn set_keys(&mut self, keys: impl IntoIterator<Item = AgentPubkey>) -> Result<()> {
        match self {
            Presence::Files(p) => p.set_keys(keys),
            #[cfg(target_os = "linux")]
            Presence::Slots(p) => p.set_keys(keys),
        }
    }

    /// The token written into our records.
    pub fn token(&self) -> &str {
        match self {
            Presence::Files(p) => p.token(),
            #[cfg(target_os = "linux")]
            Presence::Slots(p) => p.token(),
        }
    }
}

/// Probes the holder of `token` without blocking, with the backend that
/// made the token (a slot names the shared file).
pub fn probe_holder(dir: &Path, token: &str) -> HolderPresence {
    #[cfg(target_os = "linux")]
    if matches!(crate::token::parse_token(token), Some((_, Some(_)))) {
        return slots::probe_holder(dir, token);
    }
    files::probe_holder(dir, token)
}

/// Every live participant of `key`'s election except `except_token`, of
/// either backend, ordered by token.
pub fn live_siblings(dir: &Path, key: &AgentPubkey, except_token: &str) -> Vec<Sibling> {
    #[allow(unused_mut)]
    let mut out = files::live_siblings(dir, key, except_token);
    #[cfg(target_os = "linux")]
    {
        out.extend(slots::live_siblings(dir, key, except_token));
        out.sort_by(|a, b| a.token.cmp(&b.token));
    }
    out
}

/// The token of a file name that announces an elector's departure: a
/// presence file removed (`<token>.live`), or a departure notice removed
/// (`.<token>.gone`).
pub fn departed_token_of_name(name: &str) -> Option<&str> {
    name.strip_suffix(".live")
        .or_else(|| name.strip_prefix('.').and_then(|n| n.strip_suffix(".gone")))
        .filter(|t| valid_token(t))
}

/// A presence body.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Body {
    #[serde(default)]
    pub token: String,
    pub instance_id: String,
    pub pid: u32,
    #[serde(default)]
    pub keys: Vec<AgentPubkey>,
}

/// What a holder's presence says, whatever the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderPresence {
    /// Its lock is held; the keys it lists (`None`: the body could not be
    /// read, e.g. caught mid-rewrite).
    Alive(Option<Vec<AgentPubkey>>),
    /// No presence, or its lock is free: the holder is gone.
    Gone,
    /// Something we cannot judge.
    Unknown,
}

impl HolderPresence {
    /// The verdict for `key`'s election: a live holder that no longer
    /// lists the key has left it; an unreadable body proves nothing, so
    /// the holder counts as alive (the hang rule still bounds it).
    pub fn in_election(&self, key: &AgentPubkey) -> PeerPresence {
        match self {
            HolderPresence::Alive(Some(keys)) if !keys.contains(key) => PeerPresence::Gone,
            HolderPresence::Alive(_) => PeerPresence::Alive,
            HolderPresence::Gone => PeerPresence::Gone,
            HolderPresence::Unknown => PeerPresence::Unknown,
        }
    }
}

/// Probes the holder of `token` in `key`'s election without blocking (see
/// [`probe_holder`] and [`HolderPresence::in_election`]).
pub fn probe(dir: &std::path::Path, token: &str, key: &AgentPubkey) -> PeerPresence {
    probe_holder(dir, token).in_election(key)
}

/// A live participant of an election, as its presence names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sibling {
    /// Its presence token.
    pub token: String,
    /// Its instance id.
    pub instance_id: String,
    /// Its pid.
    pub pid: u32,
}

/// `keys` as a body lists them (either backend's): sorted, each once.
fn listed(keys: impl IntoIterator<Item = AgentPubkey>) -> Vec<AgentPubkey> {
    let mut keys: Vec<AgentPubkey> = keys.into_iter().collect();
    keys.sort();
    keys.dedup();
    keys
}

/// A fresh random part for a token.
pub(crate) fn fresh_token(pid: u32) -> String {
    let rand = (uuid::Uuid::new_v4().as_u128() as u64) | 1;
    format!("{pid}-{rand:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departures_are_told_by_name() {
        assert_eq!(
            departed_token_of_name("12-0123456789abcdef.live"),
            Some("12-0123456789abcdef")
        );
        assert_eq!(
            departed_token_of_name(".12-0123456789abcdef-s3.gone"),
            Some("12-0123456789abcdef-s3")
        );
        for other in [
            "presence.live",
            "x.live",
            ".x.gone",
            "12-0123456789abcdef.gone",
        ] {
            assert_eq!(departed_token_of_name(other), None, "{other}");
        }
    }
}
