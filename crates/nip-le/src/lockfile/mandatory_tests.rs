//! Windows' mandatory locks, emulated ([`os_lock::mandatory`]): what a
//! lock-free reader meets while a writer holds the lock file's lock.

use std::time::{Duration, SystemTime};

use super::os_lock::mandatory;
use super::*;
use crate::read_side;
use crate::record::encode_record;

fn key() -> AgentPubkey {
    AgentPubkey::parse(&"cd".repeat(32)).unwrap()
}

/// A lock directory under emulation, and a lock file that names another
/// live window as its fresh leader, held locked by `LockedFile`.
fn held_by_other(dir: &Path) -> LockedFile {
    let mut held =
        LockedFile::open_and_lock(&lock_path(dir, &key()), Duration::from_millis(50)).unwrap();
    held.write(&encode_record(
        "other",
        std::process::id(),
        SystemTime::now(),
        None,
    ))
    .unwrap();
    held
}

#[test]
fn our_lock_never_reaches_a_reader_so_it_never_leads_by_it() {
    let tmp = tempfile::tempdir().unwrap();
    let _on = mandatory::emulate_in(tmp.path());
    let _held = held_by_other(tmp.path());
    // The emulation bites: a second lock of the same file is refused.
    assert!(matches!(
        LockedFile::open_and_lock(&lock_path(tmp.path(), &key()), Duration::from_millis(5)),
        Err(Error::LockTimeout { .. })
    ));
    // Held for the whole read: the reader sees the record, not an error.
    assert!(matches!(
        read_unguarded(&lock_path(tmp.path(), &key())),
        Ok(LockContent::Record(r)) if r.instance_id == "other"
    ));
    assert!(!read_side(tmp.path(), &key(), "me"));
}

#[test]
fn a_lock_over_the_record_would_make_every_reader_lead() {
    // What a whole-file lock (fs4's, std's `File::lock`) does on Windows.
    let tmp = tempfile::tempdir().unwrap();
    let _on = mandatory::emulate_in(tmp.path());
    mandatory::lock_range_in(tmp.path(), 0, u64::MAX);
    let _held = held_by_other(tmp.path());
    let started = std::time::Instant::now();
    let read = read_unguarded(&lock_path(tmp.path(), &key()));
    assert!(
        matches!(&read, Err(Error::Io { source, .. }) if os_lock::is_lock_violation(source)),
        "{read:?}"
    );
    assert!(started.elapsed() >= LOCKED_READ_WAIT);
    // The NIP's read side fails safe to leader: a duplicate.
    assert!(read_side(tmp.path(), &key(), "me"));
}

#[test]
fn a_foreign_whole_file_lock_held_for_a_write_is_waited_out() {
    let tmp = tempfile::tempdir().unwrap();
    let _on = mandatory::emulate_in(tmp.path());
    mandatory::lock_range_in(tmp.path(), 0, u64::MAX);
    let held = held_by_other(tmp.path());
    // Held from before the read starts until 20 ms later, within the
    // reader's wait.
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
    });
    assert!(!read_side(tmp.path(), &key(), "me"));
    writer.join().unwrap();
}
