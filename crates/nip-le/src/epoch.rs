//! Extension: the fencing epoch's high-water mark, so that epochs never go
//! backwards for a key.
//!
//! The epoch lives in the lock file's record, and the NIP empties that file
//! on release; the harness writes records without one. Either way the next
//! holder would count again from zero, and a work ledger entry taken at an
//! old epoch could then read as taken by the new holder. So every holder
//! that issues an epoch first raises `<lock dir>/<pubkey>.epoch` to it, and
//! every taker that finds no epoch in the file (emptied, or a record
//! without one) reads it, both under the lock file's `flock`: the file only
//! ever grows, whatever happens to the record. While the file holds a
//! record with an epoch, that epoch is the latest any record carried (a
//! mark above it can only be an epoch issued by a holder that died before
//! writing it, which nothing was ever stamped with), so a refresh reads no
//! second file.
//!
//! The content is the epoch as 20 zero-padded decimal digits and a newline,
//! then `h` or `r` and a newline: whether the holder of that epoch released
//! it (so observers tell its release from a truncation by its harness
//! child, see `elector::machine::same_id`). It is always written whole at
//! offset 0 with one positioned write, so the file never needs truncating
//! and no reader sees a shorter number; a file of the digits alone (an
//! earlier version) reads as not released. Anything else (absent, a
//! symlink, not a regular file, malformed) reads as 0: the record's own
//! epoch still applies, so a hostile file can never lower an epoch, only
//! fail to raise it. Spec mode never opens it.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::lockfile::{self, Create};
use crate::pubkey::AgentPubkey;

/// Width of the stored number: `u64::MAX` has 20 digits.
const DIGITS: usize = 20;

/// What the mark says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mark {
    /// The highest epoch issued for the key (0: none, or unreadable).
    pub epoch: u64,
    /// Its holder released it (truncated the lock file itself).
    pub released: bool,
}

impl Mark {
    /// The mark once `epoch` is issued: it only grows.
    pub fn raised(self, epoch: u64) -> Self {
        if epoch > self.epoch {
            Self {
                epoch,
                released: false,
            }
        } else {
            self
        }
    }

    /// The mark once the holder of `epoch` released it: a later epoch
    /// issued meanwhile stays, not released.
    pub fn released_at(self, epoch: u64) -> Self {
        if epoch >= self.epoch {
            Self {
                epoch,
                released: true,
            }
        } else {
            self
        }
    }
}

/// `<lock dir>/<pubkey>.epoch`.
pub fn epoch_path(dir: &Path, pubkey: &AgentPubkey) -> PathBuf {
    dir.join(format!("{}.epoch", pubkey.as_str()))
}

/// The highest epoch issued for the key, 0 when none can be read.
pub fn read_floor(path: &Path) -> u64 {
    read_mark(path).epoch
}

/// The mark, [`Mark::default`] when none can be read.
pub fn read_mark(path: &Path) -> Mark {
    let Ok(f) = lockfile::open_regular_file(path, Create::No) else {
        return Mark::default();
    };
    parse(&f).unwrap_or_default()
}

fn parse(f: &File) -> Option<Mark> {
    let mut buf = [0u8; DIGITS + 3];
    let n = lockfile::read_prefix(f, &mut buf).ok()?;
    let (digits, flag) = match &buf[..n] {
        [d @ .., b'\n', f, b'\n'] if d.len() == DIGITS => (d, Some(*f)),
        [d @ .., b'\n'] if d.len() == DIGITS => (d, None),
        _ => return None,
    };
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let released = match flag {
        None | Some(b'h') => false,
        Some(b'r') => true,
        Some(_) => return None,
    };
    let epoch = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(Mark { epoch, released })
}

fn write(f: &File, mark: Mark) -> std::io::Result<()> {
    let flag = if mark.released { 'r' } else { 'h' };
    let body = format!("{:0DIGITS$}\n{flag}\n", mark.epoch);
    // On disk before the record that carries the epoch is written: after a
    // power cut the mark must not have gone back under an epoch issued.
    lockfile::write_all_at(f, body.as_bytes(), 0).and_then(|()| f.sync_data())
}

/// Raises the mark to `epoch` (never lowers it). Called under the lock
/// file's `flock`, before the record carrying `epoch` is written: a crash in
/// between leaves a gap, never a repeat.
pub fn raise_floor(path: &Path, epoch: u64) -> std::io::Result<()> {
    update(path, |m| m.raised(epoch))
}

/// Rewrites the mark as `change` says, if that changes it.
fn update(path: &Path, change: impl FnOnce(Mark) -> Mark) -> std::io::Result<()> {
    let f = lockfile::open_regular_file(path, Create::IfMissing)?;
    let parsed = parse(&f);
    let want = change(parsed.unwrap_or_default());
    if parsed == Some(want) {
        return Ok(());
    }
    write(&f, want)
}

/// Notes that the holder of `epoch` released it (never lowers the mark:
/// a later epoch issued meanwhile stays, not released). Called under the
/// lock file's `flock`, before the truncation.
pub fn mark_released(path: &Path, epoch: u64) -> std::io::Result<()> {
    update(path, |m| m.released_at(epoch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_only_and_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("k.epoch");
        assert_eq!(read_floor(&p), 0);
        raise_floor(&p, 7).unwrap();
        assert_eq!(read_floor(&p), 7);
        raise_floor(&p, 3).unwrap();
        assert_eq!(read_floor(&p), 7, "lowered");
        raise_floor(&p, u64::MAX).unwrap();
        assert_eq!(read_floor(&p), u64::MAX);
        assert_eq!(std::fs::read(&p).unwrap().len(), DIGITS + 3);
    }

    #[test]
    fn a_release_is_marked_until_the_next_epoch_and_never_lowers_it() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("k.epoch");
        raise_floor(&p, 7).unwrap();
        assert!(!read_mark(&p).released);
        mark_released(&p, 7).unwrap();
        assert_eq!(
            read_mark(&p),
            Mark {
                epoch: 7,
                released: true
            }
        );
        mark_released(&p, 5).unwrap();
        assert_eq!(
            read_mark(&p),
            Mark {
                epoch: 7,
                released: true
            }
        );
        raise_floor(&p, 8).unwrap();
        assert_eq!(
            read_mark(&p),
            Mark {
                epoch: 8,
                released: false
            }
        );
        mark_released(&p, 7).unwrap();
        assert_eq!(
            read_mark(&p),
            Mark {
                epoch: 8,
                released: false
            },
            "a later epoch"
        );
        // The digits alone (an earlier version's file): not released.
        std::fs::write(&p, format!("{:020}\n", 9)).unwrap();
        assert_eq!(
            read_mark(&p),
            Mark {
                epoch: 9,
                released: false
            }
        );
    }

    #[test]
    fn hostile_content_reads_as_zero_and_is_repaired() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("k.epoch");
        for bad in [
            &b""[..],
            b"7\n",
            b"-0000000000000000007\n",
            b"0000000000000000007",
            b"99999999999999999999\n", // over u64::MAX
            b"00000000000000000007\nx\n",
            b"00000000000000000007\nr",
            &[0xff; 64],
        ] {
            std::fs::write(&p, bad).unwrap();
            assert_eq!(read_floor(&p), 0, "{bad:?}");
        }
        raise_floor(&p, 5).unwrap();
        assert_eq!(read_floor(&p), 5);
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        assert_eq!(read_floor(&p), 0);
        assert!(raise_floor(&p, 5).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn never_follows_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::write(&target, format!("{:020}\n", 9)).unwrap();
        let p = tmp.path().join("k.epoch");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert_eq!(read_floor(&p), 0);
        assert!(raise_floor(&p, 12).is_err());
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            format!("{:020}\n", 9)
        );
    }
}
