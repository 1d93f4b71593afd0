//! Presence backend for platforms without OFD locks: per elector, a lock
//! file `<lock dir>/<token>.live` with an exclusive lock held as long as the
//! elector runs, and its body in `<token>.info`. Dropping it removes both
//! (the removal tells watchers the elector left).
//!
//! * The body lives in a file of its own because on Windows a locked range
//!   cannot be read by anyone else: with the body under the lock, no
//!   sibling could be found to hand the lock to. `.info` is never locked and
//!   is replaced whole (written beside it, then renamed over it).
//! * A `.live` file is locked from birth: it is created and locked under a
//!   temporary name (`.<token>.new`) and renamed into place. So a `.live`
//!   file nobody holds belongs to a process that died, and is removed
//!   (with its `.info`) by the next elector that starts in the directory,
//!   never racing a creator.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::{fresh_token, listed, valid_token, Body, HolderPresence, Sibling};
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

/// `<dir>/<token>.info`: the body.
pub fn info_path(dir: &Path, token: &str) -> PathBuf {
    dir.join(format!("{token}.info"))
}

/// `<dir>/.<token>.new`: a lock file being born.
fn newborn_path(dir: &Path, token: &str) -> PathBuf {
    dir.join(format!(".{token}.new"))
}

/// How old a file must be before a sweep looks at it: far longer than a
/// creator takes between its steps.
const SWEEP_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// The token of a presence file name, if it is one.
pub fn token_of_name(name: &str) -> Option<&str> {
    name.strip_suffix(".live").filter(|t| valid_token(t))
}

/// Our presence: the lock file and its exclusive lock, and the body.
/// Dropping it unlinks both (while still holding the lock) and releases the
/// lock.
#[derive(Debug)]
pub struct Presence {
    token: String,
    dir: PathBuf,
    path: PathBuf,
    /// Held open: the lock lives as long as this file handle.
    _lock: File,
    instance_id: String,
    pid: u32,
    keys: Vec<AgentPubkey>,
}

impl Presence {
    /// Creates and locks a fresh presence file for `instance_id`, listing
    /// no key yet. Its token is random and appears in no record before the
    /// file is locked, so no probe can find it unlocked while we live.
    pub fn create(dir: &Path, instance_id: &str) -> Result<Self> {
        Self::create_listing(dir, instance_id, [])
    }

    /// [`Presence::create`], listing `keys` from the start: one write of
    /// the body instead of two. Every write is four changes in the
    /// directory that every elector's watch sees (on macOS and Windows,
    /// as in the portable backend), and electors start in crowds.
    pub fn create_listing(
        dir: &Path,
        instance_id: &str,
        keys: impl IntoIterator<Item = AgentPubkey>,
    ) -> Result<Self> {
        sweep(dir);
        let pid = std::process::id();
        let token = fresh_token(pid);
        let newborn = newborn_path(dir, &token);
        let file = open_regular_file(&newborn, Create::New).map_err(|e| Error::io(&newborn, e))?;
        let born = match fs4::FileExt::try_lock(&file) {
            Ok(()) => Ok(()),
            Err(fs4::TryLockError::WouldBlock) => {
                Err(std::io::Error::other("presence file already locked"))
            }
            Err(fs4::TryLockError::Error(e)) => Err(e),
        };
        if let Err(e) = born {
            let _ = std::fs::remove_file(&newborn);
            return Err(Error::io(&newborn, e));
        }
        let mut p = Self {
            path: newborn.clone(),
            token,
            dir: dir.to_owned(),
            _lock: file,
            instance_id: instance_id.to_owned(),
            pid,
            keys: listed(keys),
        };
        // The body first, then the lock file under its real name: a probe
        // that finds the `.live` file finds its body. On failure, dropping
        // `p` removes what exists.
        p.write_body()?;
        let path = presence_path(dir, &p.token);
        std::fs::rename(&newborn, &path).map_err(|e| Error::io(&path, e))?;
        p.path = path;
        Ok(p)
    }

    /// Replaces the body whole: written beside it, renamed over it (a
    /// rename never follows a symlink at its destination).
    fn write_body(&mut self) -> Result<()> {
        let body = serde_json::to_vec(&Body {
            token: self.token.clone(),
            instance_id: self.instance_id.clone(),
            pid: self.pid,
            keys: self.keys.clone(),
        })
        .expect("strings and integers always serialise");
        let info = info_path(&self.dir, &self.token);
        let next = self.dir.join(format!(".{}.info.new", self.token));
        let _ = std::fs::remove_file(&next);
        crate::lockfile::replace_whole(&next, &info, &body).map_err(|e| Error::io(&info, e))
    }

    /// Lists `keys` as the elections we take part in (rewritten in place
    /// only when they changed).
    pub fn set_keys(&mut self, keys: impl IntoIterator<Item = AgentPubkey>) -> Result<()> {
        let keys = listed(keys);
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
        // peer's before it is gone. The body first, so no body outlives
        // its lock file.
        let _ = std::fs::remove_file(info_path(&self.dir, &self.token));
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes what electors that died left in `dir`, once it is older than
/// ten seconds (`SWEEP_AFTER`): `.live` files nobody holds (and their
/// bodies), and newborns or bodies without a lock file. A `.live` file is
/// locked from birth, so one that can be locked is a dead elector's, and it
/// is removed while we hold its lock: never a live or starting elector's.
pub fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // From the listing (free on Windows, where listing a directory returns
    // each file's times; one `statx` on Linux).
    let old = |e: &std::fs::DirEntry| {
        e.metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > SWEEP_AFTER)
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(token) = token_of_name(name) {
            // A young lock file is left: when electors start in a crowd,
            // each is a newborn's, and trying every one of their locks made
            // each start cost a file call per elector running (under Wine
            // each is a round trip to the wineserver). A young one whose
            // elector died goes at a later sweep, or when a probe finds it.
            if !old(&e) {
                continue;
            }
            let path = presence_path(dir, token);
            let Ok(f) = open_existing(&path) else {
                continue;
            };
            if fs4::FileExt::try_lock(&f).is_ok() {
                let _ = std::fs::remove_file(info_path(dir, token));
                let _ = std::fs::remove_file(&path);
            }
        } else if let Some(token) = name.strip_suffix(".info").filter(|t| valid_token(t)) {
            if old(&e) && !presence_path(dir, token).exists() {
                let _ = std::fs::remove_file(e.path());
            }
        } else if let Some(hidden) = name.strip_prefix('.') {
            let path = e.path();
            if let Some(t) = hidden.strip_suffix(".info.new") {
                // A body being written: never locked.
                if valid_token(t) && old(&e) {
                    let _ = std::fs::remove_file(&path);
                }
            } else if let Some(t) = hidden.strip_suffix(".new") {
                // A lock file being born: locked at once by its creator. Its
                // age first, so we never take the lock of a young one (its
                // creator's own attempt would then fail).
                if valid_token(t)
                    && old(&e)
                    && open_existing(&path).is_ok_and(|f| fs4::FileExt::try_lock(&f).is_ok())
                {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
}

fn open_existing(path: &Path) -> std::io::Result<File> {
    open_regular_file(path, Create::No)
}

/// The body of `token`'s presence, if it parses.
fn body_of(dir: &Path, token: &str) -> Option<Body> {
    read_body(&mut open_existing(&info_path(dir, token)).ok()?)
}

/// The body in `f`, if it parses (one positioned read for a body of up to
/// 4 KiB).
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

/// Probes the holder of `token` without blocking. A presence file found
/// unlocked is removed (we take its exclusive lock first, so its owner is
/// dead).
pub fn probe_holder(dir: &Path, token: &str) -> HolderPresence {
    if !valid_token(token) {
        return HolderPresence::Unknown;
    }
    let path = presence_path(dir, token);
    let f = match open_existing(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HolderPresence::Gone,
        Err(_) => return HolderPresence::Unknown,
    };
    match fs4::FileExt::try_lock(&f) {
        Ok(()) => {
            let _ = std::fs::remove_file(info_path(dir, token));
            let _ = std::fs::remove_file(&path);
            HolderPresence::Gone
        }
        Err(fs4::TryLockError::WouldBlock) => {
            HolderPresence::Alive(body_of(dir, token).map(|b| b.keys))
        }
        Err(fs4::TryLockError::Error(_)) => HolderPresence::Unknown,
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
        let Ok(f) = open_existing(&presence_path(dir, token)) else {
            continue;
        };
        if !matches!(
            fs4::FileExt::try_lock_shared(&f),
            Err(fs4::TryLockError::WouldBlock)
        ) {
            let _ = fs4::FileExt::unlock(&f);
            continue; // not held: gone
        }
        if let Some(b) = body_of(dir, token).filter(|b| b.keys.contains(key)) {
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
        let mut names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                format!("{}.info", sib.token()),
                format!("{}.live", sib.token())
            ]
        );
    }

    /// An elector that starts with its keys writes its body once: the
    /// writer's `set_keys` that follows finds them listed and writes
    /// nothing (each write is four changes every watcher sees).
    #[test]
    fn created_listing_its_keys_writes_the_body_once() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let mut p =
            Presence::create_listing(tmp.path(), "me", [pk('f'), pk('e'), pk('f')]).unwrap();
        assert_eq!(probe(tmp.path(), p.token(), &pk('e')), PeerPresence::Alive);
        assert_eq!(probe(tmp.path(), p.token(), &pk('f')), PeerPresence::Alive);
        let info = info_path(tmp.path(), p.token());
        let inode = std::fs::metadata(&info).unwrap().ino();
        p.set_keys([pk('e'), pk('f')]).unwrap();
        assert_eq!(std::fs::metadata(&info).unwrap().ino(), inode, "rewritten");
        p.set_keys([pk('e')]).unwrap();
        assert_ne!(
            std::fs::metadata(&info).unwrap().ino(),
            inode,
            "not rewritten"
        );
        assert_eq!(probe(tmp.path(), p.token(), &pk('f')), PeerPresence::Gone);
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

    /// Sets a file's modification time `secs` into the past.
    fn age(path: &Path, secs: u64) {
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(secs))
            .unwrap();
    }

    #[test]
    fn what_dead_electors_left_is_swept_and_a_live_ones_never() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut live = Presence::create(dir, "live").unwrap();
        live.set_keys([pk('e')]).unwrap();
        // The body is readable without the lock (Windows locks are
        // mandatory): the lock file holds nothing, the body is beside it.
        assert_eq!(
            std::fs::read(presence_path(dir, live.token())).unwrap(),
            b""
        );
        assert!(std::fs::read_to_string(info_path(dir, live.token()))
            .unwrap()
            .contains("\"live\""));
        // A crashed elector's lock file and body, a newborn whose creator
        // died, a body whose lock file is gone, a body being written.
        let dead = "7-00000000000000aa";
        std::fs::write(presence_path(dir, dead), b"").unwrap();
        age(&presence_path(dir, dead), 60);
        std::fs::write(
            info_path(dir, dead),
            br#"{"token":"7-00000000000000aa","instance_id":"d","pid":7,"keys":[]}"#,
        )
        .unwrap();
        let newborn = newborn_path(dir, "8-00000000000000bb");
        std::fs::write(&newborn, b"").unwrap();
        age(&newborn, 60);
        let orphan = info_path(dir, "9-00000000000000cc");
        std::fs::write(&orphan, b"{}").unwrap();
        age(&orphan, 60);
        let half = dir.join(".6-00000000000000dd.info.new");
        std::fs::write(&half, b"{").unwrap();
        age(&half, 60);
        // A young newborn may belong to a creator about to lock it: kept.
        let young = newborn_path(dir, "5-00000000000000ee");
        std::fs::write(&young, b"").unwrap();
        // A young lock file is not even tried (in a crowd start each is a
        // newborn's); this one's elector died, and a probe removes it.
        let young_dead = "4-00000000000000ff";
        std::fs::write(presence_path(dir, young_dead), b"").unwrap();
        let next = Presence::create(dir, "next").unwrap();
        assert!(presence_path(dir, young_dead).exists());
        assert_eq!(probe(dir, young_dead, &pk('e')), PeerPresence::Gone);
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let mut expected = vec![
            ".5-00000000000000ee.new".to_owned(),
            format!("{}.info", live.token()),
            format!("{}.live", live.token()),
            format!("{}.info", next.token()),
            format!("{}.live", next.token()),
        ];
        expected.sort();
        assert_eq!(names, expected);
        assert_eq!(probe(dir, live.token(), &pk('e')), PeerPresence::Alive);
    }

    #[test]
    fn sweeping_never_removes_a_starting_or_running_elector() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    for round in 0..150 {
                        // Each creation sweeps: every other thread's
                        // presence is starting, running or leaving.
                        let mut p = Presence::create(&dir, &format!("t{i}")).unwrap();
                        p.set_keys([pk('e')]).unwrap();
                        assert!(
                            presence_path(&dir, p.token()).exists(),
                            "thread {i} round {round}: swept while running"
                        );
                        assert_eq!(
                            probe_holder(&dir, p.token()).in_election(&pk('e')),
                            PeerPresence::Alive,
                            "thread {i} round {round}"
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Everyone left: nothing remains.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
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
        std::fs::write(info_path(tmp.path(), p.token()), b"{garbage").unwrap();
        assert_eq!(probe(tmp.path(), p.token(), &pk('e')), PeerPresence::Alive);
    }
}
