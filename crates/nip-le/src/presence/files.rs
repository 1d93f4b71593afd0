//! Presence backend for platforms without OFD locks: one file per elector,
//! `<lock dir>/<token>.live`, with an exclusive `flock` held as long as the
//! elector runs. Dropping it removes the file (its removal tells watchers
//! the elector left).

use std::fs::File;
use std::path::{Path, PathBuf};

use super::{fresh_token, valid_token, Body, HolderPresence, Sibling};
use crate::error::{Error, Result};
use crate::lockfile::{open_regular_file, Create};
use crate::pubkey::AgentPubkey;

/// Largest presence file we read: a body lists every key of one elector
/// (about 67 bytes a key).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// `<dir>/<token>.live`.
pub fn presence_path(dir: &Path, token: &str) -> PathBuf {
    dir.join(format!("{token}.live"))
}

/// The token of a presence file name, if it is one.
pub fn token_of_name(name: &str) -> Option<&str> {
    name.strip_suffix(".live").filter(|t| valid_token(t))
}

/// Our presence: the file and its exclusive lock. Dropping it unlinks the
/// file (while still holding the lock) and releases the lock.
#[derive(Debug)]
pub struct Presence {
    token: String,
    path: PathBuf,
    file: File,
    instance_id: String,
    pid: u32,
    keys: Vec<AgentPubkey>,
    /// Length of the body on disk, so that a rewrite truncates only when
    /// the body shrank.
    len: u64,
}

impl Presence {
    /// Creates and locks a fresh presence file for `instance_id`, listing
    /// no key yet. Its token is random and appears in no record before the
    /// file is locked, so no probe can find it unlocked while we live.
    pub fn create(dir: &Path, instance_id: &str) -> Result<Self> {
        let pid = std::process::id();
        let token = fresh_token(pid);
        let path = presence_path(dir, &token);
        let file = open_regular_file(&path, Create::New).map_err(|e| Error::io(&path, e))?;
        let mut p = Self {
            token,
            path,
            file,
            instance_id: instance_id.to_owned(),
            pid,
            keys: Vec::new(),
            len: 0,
        };
        // On failure, dropping `p` removes the file.
        p.lock_and_write()?;
        Ok(p)
    }

    fn lock_and_write(&mut self) -> Result<()> {
        match fs4::FileExt::try_lock(&self.file) {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => {
                return Err(Error::io(
                    &self.path,
                    std::io::Error::other("presence file already locked"),
                ))
            }
            Err(fs4::TryLockError::Error(e)) => return Err(Error::io(&self.path, e)),
        }
        self.write_body()
    }

    /// Rewrites the body in place: one positioned write, and a truncation
    /// only when it shrank.
    fn write_body(&mut self) -> Result<()> {
        let body = serde_json::to_vec(&Body {
            token: self.token.clone(),
            instance_id: self.instance_id.clone(),
            pid: self.pid,
            keys: self.keys.clone(),
        })
        .expect("strings and integers always serialise");
        let new_len = body.len() as u64;
        let r = (|| {
            write_all_at(&self.file, &body)?;
            if new_len < self.len {
                self.file.set_len(new_len)?;
            }
            Ok(())
        })();
        self.len = new_len;
        r.map_err(|e| Error::io(&self.path, e))
    }

    /// Lists `keys` as the elections we take part in (rewritten in place
    /// only when they changed).
    pub fn set_keys(&mut self, keys: impl IntoIterator<Item = AgentPubkey>) -> Result<()> {
        let mut keys: Vec<AgentPubkey> = keys.into_iter().collect();
        keys.sort();
        keys.dedup();
        if keys == self.keys {
            return Ok(());
        }
        self.keys = keys;
        self.write_body()
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

fn open_existing(path: &Path) -> std::io::Result<File> {
    open_regular_file(path, Create::No)
}

/// The body of a presence file, if it parses (one positioned read for a
/// body of up to 4 KiB).
fn read_body(f: &mut File) -> Option<Body> {
    let mut small = [0u8; 4096];
    let n = crate::lockfile::read_prefix(f, &mut small).ok()?;
    if n < small.len() {
        return serde_json::from_slice(&small[..n]).ok();
    }
    let mut big = vec![0u8; MAX_BODY_BYTES];
    let n = crate::lockfile::read_prefix(f, &mut big).ok()?;
    serde_json::from_slice(&big[..n]).ok()
}

#[cfg(unix)]
fn write_all_at(f: &File, buf: &[u8]) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(f, buf, 0)
}

#[cfg(windows)]
fn write_all_at(f: &File, mut buf: &[u8]) -> std::io::Result<()> {
    let mut offset = 0u64;
    while !buf.is_empty() {
        let n = std::os::windows::fs::FileExt::seek_write(f, buf, offset)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n..];
        offset += n as u64;
    }
    Ok(())
}

/// Probes the holder of `token` without blocking. A presence file found
/// unlocked is removed (we take its exclusive lock first, so its owner is
/// dead).
pub fn probe_holder(dir: &Path, token: &str) -> HolderPresence {
    if !valid_token(token) {
        return HolderPresence::Unknown;
    }
    let path = presence_path(dir, token);
    let mut f = match open_existing(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HolderPresence::Gone,
        Err(_) => return HolderPresence::Unknown,
    };
    match fs4::FileExt::try_lock(&f) {
        Ok(()) => {
            let _ = std::fs::remove_file(&path);
            HolderPresence::Gone
        }
        Err(fs4::TryLockError::WouldBlock) => {
            HolderPresence::Alive(read_body(&mut f).map(|b| b.keys))
        }
        Err(fs4::TryLockError::Error(_)) => HolderPresence::Unknown,
    }
}

/// Blocks until the holder of `token` is gone (its presence lock is
/// released), or returns at once if there is no such file. For platforms
/// without a process handle to poll: run it on a thread of its own.
pub fn wait_gone(dir: &Path, token: &str) {
    if !valid_token(token) {
        return;
    }
    let Ok(f) = open_existing(&presence_path(dir, token)) else {
        return;
    };
    if fs4::FileExt::lock_shared(&f).is_ok() {
        let _ = fs4::FileExt::unlock(&f);
    }
}

/// Every live participant of `key`'s election except `except_token`,
/// ordered by token. A file caught mid-rewrite is skipped (the caller then
/// falls back to the NIP's release).
pub fn live_siblings(dir: &Path, key: &AgentPubkey, except_token: &str) -> Vec<Sibling> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let Some(token) = name.to_str().and_then(token_of_name) else {
            continue;
        };
        if token == except_token {
            continue;
        }
        let Ok(mut f) = open_existing(&presence_path(dir, token)) else {
            continue;
        };
        if !matches!(
            fs4::FileExt::try_lock_shared(&f),
            Err(fs4::TryLockError::WouldBlock)
        ) {
            let _ = fs4::FileExt::unlock(&f);
            continue; // not held: gone
        }
        if let Some(b) = read_body(&mut f).filter(|b| b.keys.contains(key)) {
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
    use crate::presence::PeerPresence;

    /// This backend's probe (on Linux the crate's `probe` is the slots').
    fn probe(dir: &Path, token: &str, key: &AgentPubkey) -> PeerPresence {
        probe_holder(dir, token).in_election(key)
    }

    fn pk(c: char) -> AgentPubkey {
        AgentPubkey::parse(&c.to_string().repeat(64)).unwrap()
    }

    #[test]
    fn presence_file_names() {
        assert_eq!(
            token_of_name("12-0123456789abcdef.live"),
            Some("12-0123456789abcdef")
        );
        assert_eq!(token_of_name("x.live"), None);
    }

    #[test]
    fn presence_is_alive_while_held_and_listing_the_key_and_gone_after() {
        let tmp = tempfile::tempdir().unwrap();
        let mut p = Presence::create(tmp.path(), "me").unwrap();
        assert!(valid_token(p.token()));
        // Listed no key yet: not alive in any election.
        assert_eq!(probe(tmp.path(), p.token(), &pk('e')), PeerPresence::Gone);
        p.set_keys([pk('e'), pk('f')]).unwrap();
        assert_eq!(probe(tmp.path(), p.token(), &pk('e')), PeerPresence::Alive);
        let mut sib = Presence::create(tmp.path(), "sib").unwrap();
        sib.set_keys([pk('e')]).unwrap();
        let sibs = live_siblings(tmp.path(), &pk('e'), p.token());
        assert_eq!(sibs.len(), 1);
        assert_eq!(
            (sibs[0].instance_id.as_str(), sibs[0].token.as_str()),
            ("sib", sib.token())
        );
        assert!(live_siblings(tmp.path(), &pk('f'), p.token()).is_empty());
        // Leaving a key is visible to probes of that key only.
        p.set_keys([pk('f')]).unwrap();
        assert_eq!(probe(tmp.path(), p.token(), &pk('e')), PeerPresence::Gone);
        assert_eq!(probe(tmp.path(), p.token(), &pk('f')), PeerPresence::Alive);
        let token = p.token().to_owned();
        drop(p);
        assert_eq!(probe(tmp.path(), &token, &pk('f')), PeerPresence::Gone);
        wait_gone(tmp.path(), &token); // returns at once
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![format!("{}.live", sib.token())]);
    }

    #[test]
    fn an_unlocked_presence_file_is_a_dead_peers_and_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let t = "1-0123456789abcdef";
        std::fs::write(
            presence_path(tmp.path(), t),
            br#"{"instance_id":"x","pid":1,"keys":[]}"#,
        )
        .unwrap();
        assert_eq!(probe(tmp.path(), t, &pk('e')), PeerPresence::Gone);
        assert!(!presence_path(tmp.path(), t).exists());
    }

    #[test]
    fn wait_gone_returns_when_the_holder_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let p = Presence::create(tmp.path(), "me").unwrap();
        let token = p.token().to_owned();
        let dir = tmp.path().to_owned();
        let waiter = std::thread::spawn(move || wait_gone(&dir, &token));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished());
        drop(p);
        waiter.join().unwrap();
    }

    #[test]
    fn hostile_entries_are_unknown_or_alive_never_dead() {
        let tmp = tempfile::tempdir().unwrap();
        let t = "1-0123456789abcdef";
        std::fs::create_dir(presence_path(tmp.path(), t)).unwrap();
        assert_eq!(probe(tmp.path(), t, &pk('e')), PeerPresence::Unknown);
        let t2 = "2-0123456789abcdef";
        std::os::unix::fs::symlink("/etc/passwd", presence_path(tmp.path(), t2)).unwrap();
        assert_eq!(probe(tmp.path(), t2, &pk('e')), PeerPresence::Unknown);
        assert_eq!(
            probe(tmp.path(), "../../x", &pk('e')),
            PeerPresence::Unknown
        );
        assert!(live_siblings(tmp.path(), &pk('e'), "").is_empty());
        // A held file whose body is garbage: alive (the hang rule bounds it).
        let mut p = Presence::create(tmp.path(), "me").unwrap();
        p.set_keys([pk('e')]).unwrap();
        std::fs::write(presence_path(tmp.path(), p.token()), b"{garbage").unwrap();
        assert_eq!(probe(tmp.path(), p.token(), &pk('e')), PeerPresence::Alive);
    }
}
