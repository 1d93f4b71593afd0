//! Lock file I/O, treating every byte and every path as hostile.
//!
//! * The lock file itself is the `flock` target (like the harness): never
//!   renamed, never unlinked, written in place.
//! * Opens never follow a symlink (`O_NOFOLLOW`) and never block on a fifo
//!   (`O_NONBLOCK`); anything but a regular file is refused.
//! * Reads are capped at [`MAX_RECORD_BYTES`] + 1 bytes.
//! * The exclusive lock is polled with a deadline, so a peer that hangs while
//!   holding it cannot hang us.
//! * The directory is created `0700` and files `0600`.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::pubkey::AgentPubkey;
use crate::record::{LockContent, MAX_RECORD_BYTES};

pub(crate) mod leftovers;
pub(crate) mod os_lock;
mod ownership;

pub(crate) use ownership::written_by_us;

/// `<dir>/<pubkey>.lock`. The pubkey is validated hex, so this cannot leave
/// `dir`.
pub fn lock_path(dir: &Path, pubkey: &AgentPubkey) -> PathBuf {
    dir.join(pubkey.lock_file_name())
}

/// Creates the lock directory (mode `0700`) if missing; errors if the path is
/// something other than a directory, or one that is not ours
/// ([`Error::UnsafeLockDir`]: owned by another user, or writable by others).
pub fn ensure_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => return ownership::check_dir(dir, &m),
        Ok(_) => return Err(Error::NotADirectory { path: dir.into() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(dir, e)),
    }
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir).map_err(|e| Error::io(dir, e))?;
    // Someone may have made it first, as theirs.
    let m = std::fs::metadata(dir).map_err(|e| Error::io(dir, e))?;
    ownership::check_dir(dir, &m)
}

/// Makes `dir`, a subdirectory of the lock directory (which must exist),
/// if it is missing: `0700`, and like the lock directory refused if it is
/// not ours or others may write in it. Never through a symlink: a link
/// planted there would take our files elsewhere.
pub(crate) fn ensure_subdir(dir: &Path) -> Result<()> {
    let m = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = std::fs::DirBuilder::new();
            // Not recursive: the lock directory itself must be there.
            b.recursive(false);
            #[cfg(unix)]
            {
                use std::os::unix::fs::DirBuilderExt;
                b.mode(0o700);
            }
            match b.create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io(dir, e)),
            }
            std::fs::symlink_metadata(dir)
        }
        m => m,
    }
    .map_err(|e| Error::io(dir, e))?;
    if !m.is_dir() {
        return Err(Error::NotADirectory { path: dir.into() });
    }
    ownership::check_dir(dir, &m)
}

/// How an open may create the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Create {
    /// Read only; the file must exist.
    No,
    /// Read-write, created (`0600`) if missing, never truncated.
    IfMissing,
    /// Read-write, and the file must not exist yet.
    New,
}

/// The one set of open options for every file we touch in the lock
/// directory: never follow a symlink at the path, never block on a fifo,
/// close on exec; files we create are `0600`.
pub(crate) fn open_options(create: Create) -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true);
    match create {
        Create::No => {}
        Create::IfMissing => {
            o.write(true).create(true);
        }
        Create::New => {
            o.write(true).create_new(true);
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
        if create != Create::No {
            o.mode(0o600);
        }
    }
    o
}

/// Replaces `path` whole: `bytes` written to `tmp` (a fresh name beside
/// it, created exclusively, never through a symlink), then renamed over
/// `path` (a rename never follows a symlink at its destination). `tmp` is
/// removed if anything fails. Not synced: for files a power cut may take.
pub(crate) fn replace_whole(tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let written = open_regular_file(tmp, Create::New)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    written
}

/// [`replace_whole`], durably: the new file's bytes on disk before the
/// rename, and the rename itself after it, so a power cut leaves the old
/// file or the new one, never an empty file in its place.
pub(crate) fn replace_whole_synced(tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let written = open_regular_file(tmp, Create::New)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(tmp, path))
        .and_then(|()| sync_dir(path));
    if written.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    written
}

/// Makes a rename in `path`'s directory durable (Unix: the directory's own
/// `fsync`; elsewhere the file system orders it).
pub(crate) fn sync_dir(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Opens with [`open_options`] and refuses anything but a regular file.
pub(crate) fn open_regular_file(path: &Path, create: Create) -> std::io::Result<File> {
    let f = open_options(create).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

/// Opens `path` without following a symlink and checks it is a regular file.
fn open_regular(path: &Path, write: bool) -> std::io::Result<std::result::Result<File, Error>> {
    let create = if write { Create::IfMissing } else { Create::No };
    match open_options(create).open(path) {
        Ok(f) => {
            let ft = f.metadata()?.file_type();
            if ft.is_file() {
                Ok(Ok(f))
            } else {
                Ok(Err(Error::NotRegularFile {
                    path: path.into(),
                    kind: file_kind(&ft),
                }))
            }
        }
        Err(e) if is_symlink_refusal(&e, path) => Ok(Err(Error::Symlink { path: path.into() })),
        Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => Ok(Err(Error::NotRegularFile {
            path: path.into(),
            kind: "directory",
        })),
        Err(e) => Err(e),
    }
}

fn is_symlink_refusal(e: &std::io::Error, path: &Path) -> bool {
    #[cfg(unix)]
    if e.raw_os_error() == Some(libc::ELOOP) {
        return true;
    }
    let _ = e;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// A short name for a file type, for messages and status.
pub fn file_kind(ft: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "fifo";
        }
        if ft.is_socket() {
            return "socket";
        }
        if ft.is_block_device() || ft.is_char_device() {
            return "device";
        }
    }
    if ft.is_dir() {
        "directory"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_file() {
        "file"
    } else {
        "unknown"
    }
}

fn read_capped(f: &mut File) -> std::io::Result<LockContent> {
    let mut buf = [0u8; MAX_RECORD_BYTES + 1];
    let n = read_prefix(f, &mut buf)?;
    Ok(LockContent::parse(&buf[..n]))
}

/// Reads from offset 0 into `buf` until it is full or the file ends, with
/// positioned reads (no seek): a record is one `pread`, and a regular file
/// returns a short read only at its end.
pub(crate) fn read_prefix(f: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match read_at(f, &mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                // Regular files return short reads only at their end.
                if n < buf.len() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, offset)
}

#[cfg(windows)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, offset)
}

/// Writes all of `buf` at `offset` with positioned writes (no seek).
#[cfg(unix)]
pub(crate) fn write_all_at(f: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(f, buf, offset)
}

/// Writes all of `buf` at `offset` with positioned writes (no seek).
#[cfg(windows)]
pub(crate) fn write_all_at(f: &File, mut buf: &[u8], mut offset: u64) -> std::io::Result<()> {
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

/// The read side: no lock taken, so it may observe a half-written file (which
/// parses as malformed). Errors mean "unreadable"; the caller fails safe.
///
/// On Windows a writer that locks the record's bytes (a harness taking a
/// whole-file lock; ours never does) makes reads fail while it writes: such
/// a read is tried again for up to [`LOCKED_READ_WAIT`] before it counts as
/// unreadable.
pub fn read_unguarded(path: &Path) -> Result<LockContent> {
    let started = Instant::now();
    let mut backoff = Duration::from_micros(200);
    loop {
        match read_once(path) {
            Err(Error::Io { source, .. })
                if os_lock::is_lock_violation(&source) && started.elapsed() < LOCKED_READ_WAIT =>
            {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(5));
            }
            r => return r,
        }
    }
}

/// How long [`read_unguarded`] retries a read refused by another handle's
/// mandatory lock (Windows): a write takes well under a millisecond.
pub const LOCKED_READ_WAIT: Duration = Duration::from_millis(50);

fn read_once(path: &Path) -> Result<LockContent> {
    #[cfg(test)]
    os_lock::mandatory::read(path, MAX_RECORD_BYTES as u64 + 1).map_err(|e| Error::io(path, e))?;
    match open_regular(path, false) {
        Ok(Ok(mut f)) => read_capped(&mut f).map_err(|e| Error::io(path, e)),
        Ok(Err(e)) => Err(e),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LockContent::Absent),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Takes `file`'s lock ([`os_lock`]: `flock`, or a byte far past the data
/// on Windows), exclusive or shared, polling with a backoff for at most
/// `wait`: a peer that hangs holding it cannot hang us. Keep the returned
/// [`os_lock::Held`] beside the file.
pub(crate) fn lock_polled(
    file: &File,
    path: &Path,
    exclusive: bool,
    wait: Duration,
) -> Result<os_lock::Held> {
    let started = Instant::now();
    let mut backoff = Duration::from_micros(200);
    loop {
        match os_lock::try_lock(file, path, exclusive) {
            Ok(held) => return Ok(held),
            Err(os_lock::TryLockError::WouldBlock) => {}
            Err(os_lock::TryLockError::Error(e)) => return Err(Error::io(path, e)),
        }
        let waited = started.elapsed();
        if waited >= wait {
            return Err(Error::LockTimeout {
                path: path.into(),
                waited,
            });
        }
        std::thread::sleep(backoff.min(wait - waited));
        backoff = (backoff * 2).min(Duration::from_millis(10));
    }
}

/// An open lock file holding the exclusive `flock`; unlocked when dropped.
#[derive(Debug)]
pub struct LockedFile {
    file: File,
    path: PathBuf,
    _held: os_lock::Held,
}

impl LockedFile {
    /// Opens (creating `0600` if absent, never truncating) and takes the
    /// exclusive lock, waiting at most `wait`.
    pub fn open_and_lock(path: &Path, wait: Duration) -> Result<Self> {
        let file = match open_regular(path, true) {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(Error::io(path, e)),
        };
        let held = lock_polled(&file, path, true, wait)?;
        Ok(Self {
            file,
            path: path.into(),
            _held: held,
        })
    }

    /// Reads the current content (capped).
    pub fn read(&mut self) -> Result<LockContent> {
        read_capped(&mut self.file).map_err(|e| Error::io(&self.path, e))
    }

    /// Replaces the content in place, never shrinking it: a shorter record
    /// is padded with trailing spaces (which JSON allows) to the old
    /// length. Cutting the length after the write would leave a moment in
    /// which a lock-free reader sees the new record with the old one's tail
    /// after it: malformed, and the NIP's read side leads on malformed.
    /// Only a file longer than any record (hostile junk) is cut.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let r = (|| {
            let old_len = self.file.metadata()?.len();
            let padded;
            let body = match usize::try_from(old_len) {
                Ok(old) if old > bytes.len() && old <= MAX_RECORD_BYTES => {
                    let mut b = Vec::with_capacity(old);
                    b.extend_from_slice(bytes);
                    b.resize(old, b' ');
                    padded = b;
                    &padded[..]
                }
                _ => bytes,
            };
            self.file.seek(SeekFrom::Start(0))?;
            self.file.write_all(body)?;
            if old_len > body.len() as u64 {
                self.file.set_len(body.len() as u64)?;
            }
            self.file.flush()
        })();
        r.map_err(|e| Error::io(&self.path, e))
    }

    /// Truncates to zero bytes (release). The file stays: same inode.
    pub fn truncate(&mut self) -> Result<()> {
        self.file.set_len(0).map_err(|e| Error::io(&self.path, e))
    }

    /// The path this lock guards.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod mandatory_tests;
#[cfg(all(test, unix))]
mod tests;
/// x
pub fn _probe_circle(p: &Path) -> bool {
    crate::election::reads_as_leader(read_unguarded(p).as_ref(), "x")
}
