//! The one lock primitive for the files we lock in the lock directory (lock
//! files, the work ledger's append hold): `flock` on Unix, `LockFileEx` on
//! one byte far past any data on Windows.
//!
//! Windows' byte-range locks are mandatory: while a handle holds a range,
//! every other handle's `ReadFile` over it fails with
//! `ERROR_LOCK_VIOLATION`. A lock over the record (what `fs4` and std's
//! `File::lock` take: the whole file) would make every lock-free reader
//! (ours, and any harness's read side) fail while a write is under way, and
//! the NIP's read side leads on an unreadable file. The byte at
//! [`LOCK_OFFSET`] is never read or written by anyone, and a lock on it
//! still excludes every other locker of the file: a whole-file lock covers
//! it.
//!
//! In tests, `mandatory` emulates Windows' rule on any platform (Wine
//! does not enforce it), so a test can show that our own lock never reaches
//! a reader.

use std::fs::File;

/// Where Windows' lock sits: far past the largest file we write (a record
/// is capped at a few KiB, the ledger at MiBs) and below 2^63, since the
/// kernel takes the offset as a signed 64-bit integer.
#[cfg_attr(not(any(windows, test)), allow(dead_code))]
pub(crate) const LOCK_OFFSET: u64 = 1 << 62;
/// How many bytes Windows' lock covers.
#[cfg_attr(not(any(windows, test)), allow(dead_code))]
pub(crate) const LOCK_LEN: u64 = 1;

/// Why a lock was not taken.
#[derive(Debug)]
pub(crate) enum TryLockError {
    /// Another handle holds a conflicting lock.
    WouldBlock,
    /// The lock call failed.
    Error(std::io::Error),
}

/// A lock taken by [`try_lock`]. The OS drops it when the file is closed;
/// keep this beside the file and drop them together. (Under the test
/// emulation, dropping it is what releases the emulated range.)
#[derive(Debug)]
pub(crate) struct Held {
    #[cfg(test)]
    _emulated: Option<mandatory::Registration>,
}

/// Takes `file`'s lock, exclusive or shared, without waiting.
pub(crate) fn try_lock(
    file: &File,
    path: &std::path::Path,
    exclusive: bool,
) -> Result<Held, TryLockError> {
    #[cfg(test)]
    let emulated = match mandatory::lock(path, exclusive) {
        Ok(r) => r,
        Err(()) => return Err(TryLockError::WouldBlock),
    };
    let _ = path;
    os_try_lock(file, exclusive)?;
    Ok(Held {
        #[cfg(test)]
        _emulated: emulated,
    })
}

#[cfg(unix)]
fn os_try_lock(file: &File, exclusive: bool) -> Result<(), TryLockError> {
    let got = if exclusive {
        fs4::FileExt::try_lock(file)
    } else {
        fs4::FileExt::try_lock_shared(file)
    };
    got.map_err(|e| match e {
        fs4::TryLockError::WouldBlock => TryLockError::WouldBlock,
        fs4::TryLockError::Error(e) => TryLockError::Error(e),
    })
}

#[cfg(windows)]
fn os_try_lock(file: &File, exclusive: bool) -> Result<(), TryLockError> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Foundation::{ERROR_IO_PENDING, ERROR_LOCK_VIOLATION};
    use windows_sys::Win32::Storage::FileSystem::{
        LockFileEx, LOCKFILE_EXCLUSIVE_LOCK, LOCKFILE_FAIL_IMMEDIATELY,
    };
    use windows_sys::Win32::System::IO::OVERLAPPED;

    let mut flags = LOCKFILE_FAIL_IMMEDIATELY;
    if exclusive {
        flags |= LOCKFILE_EXCLUSIVE_LOCK;
    }
    // SAFETY: a zeroed OVERLAPPED is valid; its offset fields say where the
    // range starts.
    let mut ov: OVERLAPPED = unsafe { std::mem::zeroed() };
    ov.Anonymous.Anonymous.Offset = LOCK_OFFSET as u32;
    ov.Anonymous.Anonymous.OffsetHigh = (LOCK_OFFSET >> 32) as u32;
    // SAFETY: the handle is the open file's; `ov` outlives the call, which
    // does not pend (the file is not opened for overlapped I/O, and
    // LOCKFILE_FAIL_IMMEDIATELY never waits).
    let ok = unsafe {
        LockFileEx(
            file.as_raw_handle() as _,
            flags,
            0,
            LOCK_LEN as u32,
            (LOCK_LEN >> 32) as u32,
            &mut ov,
        )
    };
    if ok != 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(c) if c == ERROR_LOCK_VIOLATION as i32 || c == ERROR_IO_PENDING as i32 => {
            Err(TryLockError::WouldBlock)
        }
        _ => Err(TryLockError::Error(e)),
    }
}

/// Whether a read failed because another handle holds a lock over the
/// bytes read (Windows' `ERROR_LOCK_VIOLATION`, or the test emulation's).
pub(crate) fn is_lock_violation(e: &std::io::Error) -> bool {
    #[cfg(windows)]
    if e.raw_os_error() == Some(windows_sys::Win32::Foundation::ERROR_LOCK_VIOLATION as i32) {
        return true;
    }
    #[cfg(test)]
    if mandatory::is_emulated_violation(e) {
        return true;
    }
    let _ = e;
    false
}

/// Windows' mandatory byte-range locks, emulated for tests on any platform:
/// under a directory given to [`mandatory::emulate_in`], every lock
/// [`try_lock`] takes registers its range, and a lock-free read of a file
/// fails as `ReadFile` would while another handle holds a range it
/// overlaps.
#[cfg(test)]
pub(crate) mod mandatory {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    /// One emulated lock.
    #[derive(Debug, Clone)]
    struct Range {
        id: u64,
        path: PathBuf,
        start: u64,
        len: u64,
        exclusive: bool,
    }

    #[derive(Default)]
    struct State {
        dirs: Vec<PathBuf>,
        locks: Vec<Range>,
        next: u64,
        /// The range a lock covers, if a test put another one in place of
        /// [`super::LOCK_OFFSET`] (to show what a whole-file lock does).
        range: Option<(PathBuf, u64, u64)>,
    }

    static STATE: Mutex<State> = Mutex::new(State {
        dirs: Vec::new(),
        locks: Vec::new(),
        next: 0,
        range: None,
    });

    fn state() -> std::sync::MutexGuard<'static, State> {
        STATE.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Emulation is on under `dir` until the returned guard drops.
    pub(crate) fn emulate_in(dir: &Path) -> Emulation {
        state().dirs.push(dir.to_owned());
        Emulation {
            dir: dir.to_owned(),
        }
    }

    /// Under `dir`, locks cover `start..start + len` instead of our byte:
    /// a test's way to put the whole-file lock back and watch it fail.
    pub(crate) fn lock_range_in(dir: &Path, start: u64, len: u64) {
        state().range = Some((dir.to_owned(), start, len));
    }

    /// Turns the emulation off for its directory.
    #[derive(Debug)]
    pub(crate) struct Emulation {
        dir: PathBuf,
    }

    impl Drop for Emulation {
        fn drop(&mut self) {
            let mut s = state();
            s.dirs.retain(|d| d != &self.dir);
            s.locks.retain(|l| !l.path.starts_with(&self.dir));
            if s.range.as_ref().is_some_and(|r| r.0 == self.dir) {
                s.range = None;
            }
        }
    }

    /// An emulated lock, released when dropped.
    #[derive(Debug)]
    pub(crate) struct Registration {
        id: u64,
    }

    impl Drop for Registration {
        fn drop(&mut self) {
            state().locks.retain(|l| l.id != self.id);
        }
    }

    /// Registers a lock on `path` if it is under an emulated directory;
    /// `Err` if another emulated lock conflicts.
    pub(super) fn lock(path: &Path, exclusive: bool) -> Result<Option<Registration>, ()> {
        let mut s = state();
        if !s.dirs.iter().any(|d| path.starts_with(d)) {
            return Ok(None);
        }
        let (start, len) = match &s.range {
            Some((d, start, len)) if path.starts_with(d) => (*start, *len),
            _ => (super::LOCK_OFFSET, super::LOCK_LEN),
        };
        let conflict = s.locks.iter().any(|l| {
            l.path == path && (exclusive || l.exclusive) && overlaps(l.start, l.len, start, len)
        });
        if conflict {
            return Err(());
        }
        s.next += 1;
        let id = s.next;
        s.locks.push(Range {
            id,
            path: path.to_owned(),
            start,
            len,
            exclusive,
        });
        Ok(Some(Registration { id }))
    }

    /// What a lock-free read of `len` bytes of `path` from offset 0 meets:
    /// the error `ReadFile` returns if a lock overlaps them.
    pub(crate) fn read(path: &Path, len: u64) -> std::io::Result<()> {
        let s = state();
        if s.locks
            .iter()
            .any(|l| l.path == path && overlaps(l.start, l.len, 0, len))
        {
            return Err(std::io::Error::other(Violation));
        }
        Ok(())
    }

    fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
        a < b.saturating_add(blen) && b < a.saturating_add(alen)
    }

    /// The emulated `ERROR_LOCK_VIOLATION`.
    #[derive(Debug)]
    struct Violation;

    impl std::fmt::Display for Violation {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the process cannot access the file because another process has locked a portion of the file (emulated)")
        }
    }

    impl std::error::Error for Violation {}

    pub(super) fn is_emulated_violation(e: &std::io::Error) -> bool {
        e.get_ref().is_some_and(|r| r.is::<Violation>())
    }
}
