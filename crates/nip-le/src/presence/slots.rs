//! Presence backend for Linux: one shared file per lock directory,
//! `presence.live`, created once and never removed. Each elector takes a
//! slot: it holds an OFD write lock (`F_OFD_SETLK`, owned by its open file
//! description, dropped by the kernel when the process dies) on one byte
//! far beyond the data, and writes its body in the slot's own region. A
//! slot freed by a dead elector is taken by the next one, which writes a new
//! token there, so a probe of the old token reads a different body: gone.
//!
//! Joining costs no inode: 64 windows starting together lock 64 slots of an
//! existing file instead of creating 64 files.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{fresh_token, listed, Body, HolderPresence, Sibling};
use crate::error::{Error, Result};
use crate::lockfile::{open_regular_file, Create};
use crate::pubkey::AgentPubkey;
use crate::token::parse_token;

/// The shared file's name.
pub const FILE_NAME: &str = "presence.live";
/// Bytes of a slot's body region (a body lists every key of one elector,
/// about 67 bytes a key); the file is sparse.
const SLOT_BYTES: u64 = 16 * 1024;
/// Slots are locked one byte each, from here on: far beyond any body, so a
/// lock never covers data.
const LOCK_BASE: i64 = 1 << 40;
/// More electors than this in one lock directory at once fall back to the
/// NIP's rules.
const MAX_SLOTS: u32 = 4096;
/// Electors start looking for a free slot at `pid % HINT_SLOTS`.
const HINT_SLOTS: u32 = 256;

/// `<dir>/presence.live`.
pub fn presence_path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// An OFD lock request on slot `slot`'s lock byte.
fn flock_of(slot: u32, kind: libc::c_short) -> libc::flock {
    libc::flock {
        l_type: kind,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: LOCK_BASE + i64::from(slot),
        l_len: 1,
        l_pid: 0,
    }
}

/// Tries to take slot `slot` (non-blocking). `Ok(false)`: someone holds it.
fn try_take(f: &File, slot: u32) -> std::io::Result<bool> {
    let mut fl = flock_of(slot, libc::F_WRLCK as libc::c_short);
    // SAFETY: fcntl on a valid fd with a flock we own.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Whether someone holds slot `slot`.
fn is_held(f: &File, slot: u32) -> std::io::Result<bool> {
    let mut fl = flock_of(slot, libc::F_WRLCK as libc::c_short);
    // SAFETY: fcntl on a valid fd with a flock we own.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn slot_offset(slot: u32) -> u64 {
    u64::from(slot) * SLOT_BYTES
}

/// The body in slot `slot`: JSON up to the first NUL (a shorter body
/// leaves old bytes after its terminator). One positioned read of 4 KiB
/// covers a body of up to 60 keys; a longer one is read whole.
fn read_body(f: &File, slot: u32) -> Option<Body> {
    let read = |len: usize| -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let mut n = 0;
        while n < len {
            match f.read_at(&mut buf[n..], slot_offset(slot) + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        buf.truncate(n);
        Some(buf)
    };
    let mut buf = read(4096)?;
    if buf.len() == 4096 && !buf.contains(&0) {
        buf = read(SLOT_BYTES as usize)?;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    serde_json::from_slice(&buf[..end]).ok()
}

/// Our presence: a slot of the shared file, locked. Dropping it clears the
/// slot's body, frees the slot and announces the departure (a notice file
/// created and removed, which the directory watches see).
#[derive(Debug)]
pub struct Presence {
    token: String,
    dir: PathBuf,
    file: File,
    slot: u32,
    instance_id: String,
    pid: u32,
    keys: Vec<AgentPubkey>,
}

impl Presence {
    /// Takes a free slot of `<dir>/presence.live` (creating the file if it
    /// is the first) for `instance_id`, listing no key yet.
    pub fn create(dir: &Path, instance_id: &str) -> Result<Self> {
        let path = presence_path(dir);
        let file = open_regular_file(&path, Create::IfMissing).map_err(|e| Error::io(&path, e))?;
        // Start from a slot of our own, so that windows starting together
        // do not all contend for slot 0; slots stay below a few hundred.
        let pid = std::process::id();
        let first = pid % HINT_SLOTS;
        let mut slot = None;
        for s in (first..MAX_SLOTS).chain(0..first) {
            if try_take(&file, s).map_err(|e| Error::io(&path, e))? {
                slot = Some(s);
                break;
            }
        }
        let slot = slot.ok_or_else(|| {
            Error::io(&path, std::io::Error::other("every presence slot is taken"))
        })?;
        let mut p = Self {
            token: format!("{}-s{slot}", fresh_token(pid)),
            dir: dir.to_owned(),
            file,
            slot,
            instance_id: instance_id.to_owned(),
            pid,
            keys: Vec::new(),
        };
        p.write_body()?;
        Ok(p)
    }

    /// Writes the body and its terminator in our slot.
    fn write_body(&mut self) -> Result<()> {
        let mut body = serde_json::to_vec(&Body {
            token: self.token.clone(),
            instance_id: self.instance_id.clone(),
            pid: self.pid,
            keys: self.keys.clone(),
        })
        .expect("strings and integers always serialise");
        if body.len() as u64 >= SLOT_BYTES {
            return Err(Error::io(
                presence_path(&self.dir),
                std::io::Error::other("too many keys for one presence slot"),
            ));
        }
        body.push(0);
        self.file
            .write_all_at(&body, slot_offset(self.slot))
            .map_err(|e| Error::io(presence_path(&self.dir), e))
    }

    /// Lists `keys` as the elections we take part in (rewritten only when
    /// they changed).
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
        // Clear the body while still holding the slot (nobody reads it as
        // another's), free the slot, and only then tell the watchers, so a
        // probe they make finds us gone.
        let _ = self.file.write_all_at(&[0], slot_offset(self.slot));
        let mut fl = flock_of(self.slot, libc::F_UNLCK as libc::c_short);
        // SAFETY: fcntl on our own fd with a flock we own.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        announce_departure(&self.dir, &self.token);
    }
}

/// Creates and removes `.<token>.gone`: the removal wakes the electors
/// watching the directory, which then stop trusting their watch of us (a
/// process handle only reports an exit).
fn announce_departure(dir: &Path, token: &str) {
    let notice = dir.join(format!(".{token}.gone"));
    if open_regular_file(&notice, Create::New).is_ok() {
        let _ = std::fs::remove_file(&notice);
    }
}

/// Probes the holder of `token` without blocking.
pub fn probe_holder(dir: &Path, token: &str) -> HolderPresence {
    let Some((_, Some(slot))) = parse_token(token) else {
        // A token of another backend: we cannot judge it.
        return HolderPresence::Unknown;
    };
    if slot >= MAX_SLOTS {
        return HolderPresence::Unknown;
    }
    let f = match open_regular_file(&presence_path(dir), Create::No) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HolderPresence::Gone,
        Err(_) => return HolderPresence::Unknown,
    };
    match is_held(&f, slot) {
        Ok(false) => HolderPresence::Gone,
        Ok(true) => match read_body(&f, slot) {
            // The slot belongs to someone else now: our holder left it.
            Some(b) if b.token != token => HolderPresence::Gone,
            Some(b) => HolderPresence::Alive(Some(b.keys)),
            None => HolderPresence::Alive(None),
        },
        Err(_) => HolderPresence::Unknown,
    }
}

/// Every live participant of `key`'s election except `except_token`,
/// ordered by token. A body caught mid-rewrite is skipped (the caller then
/// falls back to the NIP's release).
pub fn live_siblings(dir: &Path, key: &AgentPubkey, except_token: &str) -> Vec<Sibling> {
    let Ok(f) = open_regular_file(&presence_path(dir), Create::No) else {
        return Vec::new();
    };
    let slots = f
        .metadata()
        .map(|m| m.len().div_ceil(SLOT_BYTES).min(u64::from(MAX_SLOTS)) as u32)
        .unwrap_or(0);
    let mut out = Vec::new();
    for slot in 0..slots {
        if !is_held(&f, slot).unwrap_or(false) {
            continue;
        }
        if let Some(b) = read_body(&f, slot) {
            if b.token != except_token && b.keys.contains(key) {
                out.push(Sibling {
                    token: b.token,
                    instance_id: b.instance_id,
                    pid: b.pid,
                });
            }
        }
    }
    out.sort_by(|a, b| a.token.cmp(&b.token));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presence::{probe, valid_token, PeerPresence};

    fn pk(c: char) -> AgentPubkey {
        AgentPubkey::parse(&c.to_string().repeat(64)).unwrap()
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
        assert_ne!(sib.slot, p.slot, "one slot each, in one process too");
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
        let (token, slot) = (p.token().to_owned(), p.slot);
        drop(p);
        assert_eq!(probe(tmp.path(), &token, &pk('f')), PeerPresence::Gone);
        // The freed slot is taken again, under a new token: the old one
        // stays gone.
        let mut again = Presence::create(tmp.path(), "again").unwrap();
        assert_eq!(again.slot, slot);
        again.set_keys([pk('f')]).unwrap();
        assert_eq!(probe(tmp.path(), &token, &pk('f')), PeerPresence::Gone);
        // One shared file, and no departure notice left behind.
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![FILE_NAME.to_owned()]);
    }

    #[test]
    fn a_dead_process_frees_its_slot() {
        let tmp = tempfile::tempdir().unwrap();
        // A child takes a slot through its own open file description and
        // dies: the kernel drops its lock.
        let path = presence_path(tmp.path());
        let f = open_regular_file(&path, Create::IfMissing).unwrap();
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: fork in a test; the child only calls open, fcntl and
        // _exit, all async-signal-safe, on data prepared before the fork.
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe {
                // Its own open file description, as another process has.
                let fd = libc::open(c_path.as_ptr(), libc::O_RDWR);
                let mut fl = flock_of(0, libc::F_WRLCK as libc::c_short);
                let ok = fd >= 0 && libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) == 0;
                libc::_exit(if ok { 0 } else { 1 });
            }
        }
        let mut status = 0;
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(libc::WEXITSTATUS(status), 0);
        assert!(!is_held(&f, 0).unwrap(), "the dead child's slot is free");
        assert!(try_take(&f, 0).unwrap());
    }

    #[test]
    fn hostile_entries_are_unknown_or_alive_never_dead() {
        let tmp = tempfile::tempdir().unwrap();
        // Tokens without a slot, or out of range: not ours to judge.
        assert_eq!(
            probe_holder(tmp.path(), "1-0123456789abcdef"),
            HolderPresence::Unknown
        );
        assert_eq!(
            probe_holder(tmp.path(), "1-0123456789abcdef-s99999"),
            HolderPresence::Unknown
        );
        assert_eq!(probe_holder(tmp.path(), "../../x"), HolderPresence::Unknown);
        // A symlink at the shared path is never followed.
        std::os::unix::fs::symlink("/etc/passwd", presence_path(tmp.path())).unwrap();
        assert_eq!(
            probe_holder(tmp.path(), "1-0123456789abcdef-s0"),
            HolderPresence::Unknown
        );
        assert!(Presence::create(tmp.path(), "me").is_err());
        assert!(live_siblings(tmp.path(), &pk('e'), "").is_empty());
        std::fs::remove_file(presence_path(tmp.path())).unwrap();
        // A held slot whose body is garbage: alive (the hang rule bounds it).
        let mut p = Presence::create(tmp.path(), "me").unwrap();
        p.set_keys([pk('e')]).unwrap();
        p.file
            .write_all_at(b"{garbage\0", slot_offset(p.slot))
            .unwrap();
        assert_eq!(probe(tmp.path(), p.token(), &pk('e')), PeerPresence::Alive);
    }
}
