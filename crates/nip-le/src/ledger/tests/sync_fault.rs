//! A failing `fdatasync`, injected for the files under the directories a
//! test names: the unit-test binary defines the symbol itself, so the
//! standard library's `File::sync_data` calls this one (the linker takes
//! a definition in the executable over the C library's). Every other file
//! is synced as usual, so tests running beside it see no fault.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::*;

/// The directories whose files fail to sync.
static FAILING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// The directory whose files' `fsync` ends the process (a crash there).
static CRASHING: Mutex<Option<PathBuf>> = Mutex::new(None);

/// From now on, an `fsync` of a file under `dir` aborts the process: a
/// crash between a rewrite's write and its rename (for a child process a
/// test starts).
pub(crate) fn crash_at_fsync_under(dir: &Path) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    *CRASHING.lock().unwrap() = Some(dir);
}

/// `fsync(2)`, aborting the process for a file under the crashing
/// directory.
#[no_mangle]
pub extern "C" fn fsync(fd: libc::c_int) -> libc::c_int {
    let crashing = CRASHING.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(dir) = crashing {
        if std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|p| p.starts_with(&dir)) {
            std::process::abort();
        }
    }
    // SAFETY: the system call with the caller's descriptor, as libc's own.
    unsafe { libc::syscall(libc::SYS_fsync, fd) as libc::c_int }
}

/// While the returned guard lives, syncing a file under `dir` fails (EIO).
pub(crate) fn fail_syncs_under(dir: &Path) -> impl Drop {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    FAILING.lock().unwrap().push(dir.clone());
    Unfail(dir)
}

struct Unfail(PathBuf);

impl Drop for Unfail {
    fn drop(&mut self) {
        FAILING.lock().unwrap().retain(|d| d != &self.0);
    }
}

/// `fdatasync(2)`, failing with EIO for a file under a failing directory.
#[no_mangle]
pub extern "C" fn fdatasync(fd: libc::c_int) -> libc::c_int {
    let fails = std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|p| {
        let failing = FAILING.lock().unwrap_or_else(|e| e.into_inner());
        failing.iter().any(|d| p.starts_with(d))
    });
    if fails {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::EIO };
        return -1;
    }
    // SAFETY: the system call with the caller's descriptor, as libc's own.
    unsafe { libc::syscall(libc::SYS_fdatasync, fd) as libc::c_int }
}

/// The interposer is the one the standard library calls.
#[test]
fn a_sync_under_a_failing_directory_fails_and_elsewhere_succeeds() {
    let (bad, good) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let _fail = fail_syncs_under(bad.path());
    let f = std::fs::File::create(bad.path().join("f")).unwrap();
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    let g = std::fs::File::create(good.path().join("g")).unwrap();
    g.sync_data().unwrap();
}

/// A `done` or give-back whose sync fails is in the file (every process
/// reads it, and it stays applied here) but its caller hears that it is
/// not durable, and the ledger says so until a later line is synced.
#[test]
fn a_settle_whose_sync_fails_is_written_applied_and_reported_not_durable() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("k.work");
    let mut l = Ledger::load(path.clone(), 0, HOUR).unwrap();
    l.append_now(&take_by("a", 1, "7-aaaa")).unwrap();
    l.append_now(&take_by("b", 1, "7-aaaa")).unwrap();
    let failing = fail_syncs_under(tmp.path());
    let e = l.append(&done("a", 1, 2)).unwrap_err();
    assert!(matches!(e, Error::NotDurable { .. }), "{e}");
    assert!(l.degraded().is_some());
    let e = l.append(&give_back("b", 1, 3)).unwrap_err();
    assert!(matches!(e, Error::NotDurable { .. }), "{e}");
    // Written and applied, nothing kept to be written again.
    assert!(!l.has_pending());
    let reread = Index::parse(&std::fs::read(&path).unwrap(), 0, HOUR);
    assert_eq!(reread.verdict("a", 1), Verdict::Done);
    assert_eq!(reread.verdict("b", 1), Verdict::Owed);
    // A take needs no sync of its own: granted, the ledger still degraded.
    l.append_now(&take_by("c", 1, "7-aaaa")).unwrap();
    assert!(l.degraded().is_some());
    drop(failing);
    l.append(&done("c", 1, 4)).unwrap();
    assert_eq!(l.degraded(), None, "a synced line ends it");
}
