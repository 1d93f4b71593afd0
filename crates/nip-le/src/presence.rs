//! Extension: presence files, the liveness lock of each participant.
//!
//! In extended mode every process taking part in an agent's election holds
//! an exclusive `flock` on its own file `<pubkey>.<token>.live` beside the lock
//! file, for as long as it takes part. The kernel drops that lock the instant
//! the process dies, so:
//! * a survivor learns of a leader's death in milliseconds: it waits on a
//!   *shared* lock of the leader's presence file, which it gets when the
//!   leader is gone;
//! * a leader whose presence lock is held is alive, however old its
//!   `claimed_at` (laptop sleep), and is only replaced when its record stops
//!   changing for longer than the stale bound by the observer's monotonic
//!   clock (a hung process);
//! * a leader leaving gracefully can hand the lock straight to a live
//!   sibling named by its presence file, so no moment exists where the file
//!   is empty and everyone reads "leader".
//!
//! The token (`<pid>-<16 hex>`) is written into our lock records as the extra
//! field `live`; records without it (the harness, spec mode) keep the NIP's
//! dead-pid and stale rules. Presence files are never the `flock` target of
//! the NIP: only we read them. Hostile content is handled like the lock
//! file's: no symlinks, regular files only, capped reads.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lockfile::{open_regular_file, Create};
use crate::pubkey::AgentPubkey;

/// Whether `t` is a well-formed presence token: `<1-10 digits>-<16 hex>`.
/// Anything else in a record is ignored (it becomes part of a file name).
pub fn valid_token(t: &str) -> bool {
    let Some((pid, rand)) = t.split_once('-') else {
        return false;
    };
    (1..=10).contains(&pid.len())
        && pid.bytes().all(|b| b.is_ascii_digit())
        && rand.len() == 16
        && rand.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `<dir>/<pubkey>.<token>.live`.
pub fn presence_path(dir: &Path, pubkey: &AgentPubkey, token: &str) -> PathBuf {
    dir.join(format!("{}.{token}.live", pubkey.as_str()))
}

#[derive(Serialize, Deserialize)]
struct Body {
    instance_id: String,
    pid: u32,
}

fn open_no_follow(path: &Path, create: bool) -> std::io::Result<File> {
    let how = if create { Create::New } else { Create::No };
    open_regular_file(path, how)
}

/// Our presence in one election: the file and its exclusive lock. Dropping
/// it unlinks the file (while still holding the lock) and releases the lock.
#[derive(Debug)]
pub struct Presence {
    token: String,
    path: PathBuf,
    _file: File,
}

impl Presence {
    /// Creates and locks a fresh presence file for `instance_id`.
    pub fn create(dir: &Path, pubkey: &AgentPubkey, instance_id: &str) -> Result<Self> {
        let rand = (uuid::Uuid::new_v4().as_u128() as u64) | 1;
        let token = format!("{}-{rand:016x}", std::process::id());
        let path = presence_path(dir, pubkey, &token);
        let mut file = open_no_follow(&path, true).map_err(|e| Error::io(&path, e))?;
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => {
                return Err(Error::io(
                    &path,
                    std::io::Error::other("presence file already locked"),
                ))
            }
            Err(fs4::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
        }
        let body = serde_json::to_vec(&Body {
            instance_id: instance_id.to_owned(),
            pid: std::process::id(),
        })
        .expect("a string and an integer always serialise");
        file.write_all(&body).map_err(|e| Error::io(&path, e))?;
        Ok(Self {
            token,
            path,
            _file: file,
        })
    }

    /// The token written into our records.
    pub fn token(&self) -> &str {
        &self.token
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        // Still holding the lock: nobody can mistake the file for a dead
        // peer's before it is gone.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a presence probe says about a record's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerPresence {
    /// Its presence lock is held: the process lives.
    Alive,
    /// No presence file, or its lock is free: the holder is gone.
    Gone,
    /// Something we cannot judge (a hostile entry, an I/O error): fall back
    /// to the NIP's rules.
    Unknown,
}

/// Probes the holder of `token` without blocking. A presence file found
/// unlocked is removed (we take its exclusive lock first, so it is dead).
pub fn probe(dir: &Path, pubkey: &AgentPubkey, token: &str) -> PeerPresence {
    if !valid_token(token) {
        return PeerPresence::Unknown;
    }
    let path = presence_path(dir, pubkey, token);
    let f = match open_no_follow(&path, false) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return PeerPresence::Gone,
        Err(_) => return PeerPresence::Unknown,
    };
    match fs4::FileExt::try_lock(&f) {
        Ok(()) => {
            let _ = std::fs::remove_file(&path);
            PeerPresence::Gone
        }
        Err(fs4::TryLockError::WouldBlock) => PeerPresence::Alive,
        Err(fs4::TryLockError::Error(_)) => PeerPresence::Unknown,
    }
}

/// Blocks until the holder of `token` is gone (its presence lock is
/// released), or returns at once if there is no such file. Run it on a
/// thread of its own: it is the instant failover signal.
pub fn wait_gone(dir: &Path, pubkey: &AgentPubkey, token: &str) {
    if !valid_token(token) {
        return;
    }
    let Ok(f) = open_no_follow(&presence_path(dir, pubkey, token), false) else {
        return;
    };
    if fs4::FileExt::lock_shared(&f).is_ok() {
        let _ = fs4::FileExt::unlock(&f);
    }
}

/// A live participant of an election, as its presence file names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sibling {
    /// Its presence token.
    pub token: String,
    /// Its election id.
    pub instance_id: String,
    /// Its pid.
    pub pid: u32,
}

/// Every live participant of `pubkey`'s election except `except_token`.
pub fn live_siblings(dir: &Path, pubkey: &AgentPubkey, except_token: &str) -> Vec<Sibling> {
    let prefix = format!("{}.", pubkey.as_str());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let Some(token) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(".live"))
        else {
            continue;
        };
        if token == except_token || !valid_token(token) {
            continue;
        }
        let path = presence_path(dir, pubkey, token);
        let Ok(mut f) = open_no_follow(&path, false) else {
            continue;
        };
        if !matches!(
            fs4::FileExt::try_lock_shared(&f),
            Err(fs4::TryLockError::WouldBlock)
        ) {
            let _ = fs4::FileExt::unlock(&f);
            continue; // not held: gone
        }
        let mut buf = Vec::new();
        if (&mut f).take(1024).read_to_end(&mut buf).is_err() {
            continue;
        }
        if let Ok(b) = serde_json::from_slice::<Body>(&buf) {
            out.push(Sibling {
                token: token.to_owned(),
                instance_id: b.instance_id,
                pid: b.pid,
            });
        }
    }
    out.sort_by(|a, b| a.token.cmp(&b.token));
    out
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn pk() -> AgentPubkey {
        AgentPubkey::parse(&"e".repeat(64)).unwrap()
    }

    #[test]
    fn tokens_are_validated() {
        assert!(valid_token("1234-0123456789abcdef"));
        for bad in [
            "",
            "1234",
            "-0123456789abcdef",
            "12a-0123456789abcdef",
            "1-0123456789ABCDEF",
            "1-0123",
            "../x",
            "1-0123456789abcdef/",
        ] {
            assert!(!valid_token(bad), "{bad}");
        }
    }

    #[test]
    fn presence_is_alive_while_held_and_gone_after_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let p = Presence::create(tmp.path(), &pk(), "me").unwrap();
        assert!(valid_token(p.token()));
        assert_eq!(probe(tmp.path(), &pk(), p.token()), PeerPresence::Alive);
        let sib = Presence::create(tmp.path(), &pk(), "sib").unwrap();
        let sibs = live_siblings(tmp.path(), &pk(), p.token());
        assert_eq!(sibs.len(), 1);
        assert_eq!(
            (sibs[0].instance_id.as_str(), sibs[0].token.as_str()),
            ("sib", sib.token())
        );
        let token = p.token().to_owned();
        drop(p);
        assert_eq!(probe(tmp.path(), &pk(), &token), PeerPresence::Gone);
        wait_gone(tmp.path(), &pk(), &token); // returns at once
    }

    #[test]
    fn wait_gone_returns_when_the_holder_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let p = Presence::create(tmp.path(), &pk(), "me").unwrap();
        let token = p.token().to_owned();
        let dir = tmp.path().to_owned();
        let waiter = std::thread::spawn(move || wait_gone(&dir, &pk(), &token));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished());
        drop(p);
        waiter.join().unwrap();
    }

    #[test]
    fn hostile_entries_are_unknown_not_dead() {
        let tmp = tempfile::tempdir().unwrap();
        let t = "1-0123456789abcdef";
        std::fs::create_dir(presence_path(tmp.path(), &pk(), t)).unwrap();
        assert_eq!(probe(tmp.path(), &pk(), t), PeerPresence::Unknown);
        let t2 = "2-0123456789abcdef";
        std::os::unix::fs::symlink("/etc/passwd", presence_path(tmp.path(), &pk(), t2)).unwrap();
        assert_eq!(probe(tmp.path(), &pk(), t2), PeerPresence::Unknown);
        assert_eq!(probe(tmp.path(), &pk(), "../../x"), PeerPresence::Unknown);
        assert!(live_siblings(tmp.path(), &pk(), "").is_empty());
    }
}
