//! Where a ledger's bytes live: the [`LedgerStorage`] seam and the file
//! beside the lock file ([`FileLedger`]); the simulator plugs in its own.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use super::hold::{self, AppendHold};
use super::MAX_LEDGER_BYTES;
use crate::error::{Error, Result};
use crate::lockfile::leftovers::{is_random_part, leftovers, remove_leftovers, LEFTOVER_AGE};
use crate::lockfile::{open_options, open_regular_file, Create};

/// Why a ledger could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// Larger than [`MAX_LEDGER_BYTES`]; not read.
    #[error("the work ledger is larger than {MAX_LEDGER_BYTES} bytes")]
    Oversized,
    /// An I/O error, or something other than a regular file at the path.
    #[error("the work ledger cannot be read: {0}")]
    Unreadable(String),
    /// Shorter than what was read of it before: it was rewritten
    /// (compacted) since, and must be read whole again.
    #[error("the work ledger was rewritten")]
    Rewritten,
}

/// Where a ledger's bytes live. [`FileLedger`] is the file beside the
/// lock file; the simulator plugs in its own, with faults.
pub trait LedgerStorage: Send + std::fmt::Debug {
    /// The whole ledger (a missing one is empty), capped at
    /// [`MAX_LEDGER_BYTES`].
    fn read(&mut self) -> std::result::Result<Vec<u8>, LedgerError>;
    /// What was appended since the first `offset` bytes, capped as
    /// [`LedgerStorage::read`]; [`LedgerError::Rewritten`] when the ledger
    /// is shorter than that.
    fn read_from(&mut self, offset: u64) -> std::result::Result<Vec<u8>, LedgerError> {
        let all = self.read()?;
        let from = usize::try_from(offset).map_err(|_| LedgerError::Rewritten)?;
        all.get(from..)
            .map(<[u8]>::to_vec)
            .ok_or(LedgerError::Rewritten)
    }
    /// The whole lines within the last `max` bytes of a ledger (all of
    /// it, if it is no longer than [`MAX_LEDGER_BYTES`]): what a holder
    /// rewrites a ledger too large to read from ([`super::Ledger::recover`]).
    /// None by default.
    fn read_tail(&mut self, max: u64) -> std::result::Result<Vec<u8>, LedgerError> {
        let _ = max;
        Err(LedgerError::Oversized)
    }
    /// Appends lines (one write on a descriptor opened for appending),
    /// synced before it returns when `durable` (a done or give-back: one
    /// lost to a power cut would be answered again or never; see
    /// [`super::Ledger::append`]). Lines written whole whose sync fails are
    /// written (every process reads them) but not durable: the answer is
    /// [`Error::NotDurable`], so that the caller says so instead of
    /// promising what a power cut may undo.
    fn append(&mut self, line: &[u8], durable: bool) -> Result<()>;
    /// Replaces the whole ledger with `body` (compaction).
    fn replace(&mut self, body: &[u8]) -> Result<()>;
    /// Holds off every process's appends until the hold is dropped: a
    /// rewrite's last read and its replace happen under it, and a take's
    /// read, verdict and append. None is needed where appends and replaces
    /// cannot interleave.
    fn hold_appends(&mut self) -> Result<AppendHold> {
        Ok(AppendHold::none())
    }
    /// The sizes a ledger kept here keeps to (the simulator's may be
    /// smaller, so that a run passes the rewrite budget).
    fn limits(&self) -> super::Limits {
        super::Limits::default()
    }
    /// Removes the temporary files crashed rewrites of this ledger left,
    /// never one a live rewrite is writing; returns how many. None by
    /// default.
    fn remove_leftovers(&mut self) -> usize {
        0
    }
    /// [`LedgerStorage::append`] while the caller holds the append hold
    /// exclusively ([`LedgerStorage::hold_appends`]).
    fn append_held(&mut self, line: &[u8], durable: bool) -> Result<()> {
        self.append(line, durable)
    }
}

/// The ledger file `<lock dir>/<pubkey>.work`.
#[derive(Debug)]
pub struct FileLedger {
    path: PathBuf,
    /// The file last read ([`file_identity`]): a rewrite renames another
    /// file over it, which may be longer than what we read of the old one,
    /// so its length alone cannot tell.
    seen: Option<(u64, u64)>,
}

impl FileLedger {
    /// The ledger file at `path` (opened for each read and append).
    pub fn new(path: PathBuf) -> Self {
        Self { path, seen: None }
    }
}

impl LedgerStorage for FileLedger {
    fn read(&mut self) -> std::result::Result<Vec<u8>, LedgerError> {
        match open_regular_file(&self.path, Create::No) {
            Ok(f) => {
                self.seen = file_identity(&f);
                read_capped(f)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.seen = None;
                Ok(Vec::new())
            }
            Err(e) => Err(LedgerError::Unreadable(e.to_string())),
        }
    }

    fn read_from(&mut self, offset: u64) -> std::result::Result<Vec<u8>, LedgerError> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = match open_regular_file(&self.path, Create::No) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && offset == 0 => {
                return Ok(Vec::new())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(LedgerError::Rewritten)
            }
            Err(e) => return Err(LedgerError::Unreadable(e.to_string())),
        };
        let unreadable = |e: std::io::Error| LedgerError::Unreadable(e.to_string());
        let len = f.metadata().map_err(unreadable)?.len();
        let id = file_identity(&f);
        if len < offset || (self.seen.is_some() && id != self.seen) {
            return Err(LedgerError::Rewritten);
        }
        self.seen = id;
        if len > MAX_LEDGER_BYTES {
            return Err(LedgerError::Oversized);
        }
        f.seek(SeekFrom::Start(offset)).map_err(unreadable)?;
        let mut buf = Vec::new();
        f.take(MAX_LEDGER_BYTES.saturating_sub(offset))
            .read_to_end(&mut buf)
            .map_err(unreadable)?;
        Ok(buf)
    }

    fn read_tail(&mut self, max: u64) -> std::result::Result<Vec<u8>, LedgerError> {
        use std::io::{Read, Seek, SeekFrom};
        let unreadable = |e: std::io::Error| LedgerError::Unreadable(e.to_string());
        let mut f = match open_regular_file(&self.path, Create::No) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(unreadable(e)),
        };
        self.seen = file_identity(&f);
        let len = f.metadata().map_err(unreadable)?.len();
        if len <= MAX_LEDGER_BYTES {
            return read_capped(f);
        }
        f.seek(SeekFrom::Start(len - max)).map_err(unreadable)?;
        let mut buf = Vec::new();
        f.take(max).read_to_end(&mut buf).map_err(unreadable)?;
        Ok(after_first_newline(buf))
    }

    fn append(&mut self, line: &[u8], durable: bool) -> Result<()> {
        // Opened for each append: a handle kept across appends would write
        // into the old file after another process's compaction renamed a
        // new one over it (a kept `done` of a former holder, lost). An
        // open costs microseconds; the sync of a `done`, a tenth of a ms.
        // Under the shared hold, no rewrite renames between the open and
        // the write.
        let _hold = AppendHold::take(&self.path, false, hold::HOLD_WAIT)?;
        self.append_held(line, durable)
    }

    fn append_held(&mut self, line: &[u8], durable: bool) -> Result<()> {
        let mut o = open_options(Create::IfMissing);
        o.append(true);
        let mut f = o.open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        if !f
            .metadata()
            .map_err(|e| Error::io(&self.path, e))?
            .is_file()
        {
            return Err(Error::io(
                &self.path,
                std::io::Error::other("not a regular file"),
            ));
        }
        f.write_all(line).map_err(|e| Error::io(&self.path, e))?;
        // Written whole, the lines are what every process reads (a take
        // among them is granted: nobody, ourselves included, may grant it
        // again); only a power cut can still lose them, which the caller
        // hears of.
        if durable {
            if let Err(e) = f.sync_data() {
                if mutated!(SyncFailureHidden) {
                    return Ok(());
                }
                return Err(Error::NotDurable {
                    why: format!("{}: written, not synced: {e}", self.path.display()),
                });
            }
        }
        Ok(())
    }

    /// A new file renamed over the old one.
    fn replace(&mut self, body: &[u8]) -> Result<()> {
        let tmp = self
            .path
            .with_extension(format!("work.{}", uuid::Uuid::new_v4().simple()));
        // A power cut must leave the old ledger or the new one, never an
        // empty file in its place.
        crate::lockfile::replace_whole_synced(&tmp, &self.path, body)
            .map_err(|e| Error::io(&self.path, e))?;
        // Ours: read on from it (the hold keeps others' rewrites out).
        self.seen = open_regular_file(&self.path, Create::No)
            .ok()
            .and_then(|f| file_identity(&f));
        Ok(())
    }

    fn hold_appends(&mut self) -> Result<AppendHold> {
        AppendHold::take(&self.path, true, hold::HOLD_WAIT)
    }

    /// `<pubkey>.work.<random>` beside the ledger, unmodified for
    /// [`LEFTOVER_AGE`], removed under the exclusive append hold: a
    /// rewrite holds it from its read to its rename, so none is being
    /// written (one stopped mid-rewrite keeps the hold, and its file).
    fn remove_leftovers(&mut self) -> usize {
        let (Some(dir), Some(name)) = (
            self.path.parent(),
            self.path.file_name().and_then(|n| n.to_str()),
        ) else {
            return 0;
        };
        let prefix = format!("{name}.");
        let left = |n: &str| n.strip_prefix(&prefix).is_some_and(is_random_part);
        let now = std::time::SystemTime::now();
        if leftovers(dir, &left, LEFTOVER_AGE, now).is_empty() {
            return 0;
        }
        match AppendHold::take(&self.path, true, hold::HOLD_WAIT) {
            Ok(_hold) => remove_leftovers(dir, &left, LEFTOVER_AGE, now),
            Err(_) => 0,
        }
    }
}

fn read_capped(f: File) -> std::result::Result<Vec<u8>, LedgerError> {
    use std::io::Read;
    let len = f
        .metadata()
        .map_err(|e| LedgerError::Unreadable(e.to_string()))?
        .len();
    if len > MAX_LEDGER_BYTES {
        return Err(LedgerError::Oversized);
    }
    let mut buf = Vec::with_capacity(len as usize);
    f.take(MAX_LEDGER_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| LedgerError::Unreadable(e.to_string()))?;
    if buf.len() as u64 > MAX_LEDGER_BYTES {
        return Err(LedgerError::Oversized);
    }
    Ok(buf)
}

/// What follows the first newline of `buf`: the whole lines of a tail
/// read from the middle of a line (nothing without a newline).
pub(crate) fn after_first_newline(mut buf: Vec<u8>) -> Vec<u8> {
    let start = buf
        .iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |i| i + 1);
    buf.drain(..start);
    buf
}

/// Which file `f` is (device and file number; Windows: volume serial and
/// file index), to tell a file renamed over the ledger from the one read.
#[cfg(unix)]
fn file_identity(f: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata().ok()?;
    Some((m.dev(), m.ino()))
}

#[cfg(windows)]
fn file_identity(f: &File) -> Option<(u64, u64)> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{
        GetFileInformationByHandle, BY_HANDLE_FILE_INFORMATION,
    };
    // SAFETY: a valid handle owned by `f`; the struct is plain data.
    unsafe {
        let mut info: BY_HANDLE_FILE_INFORMATION = std::mem::zeroed();
        if GetFileInformationByHandle(f.as_raw_handle(), &mut info) == 0 {
            return None;
        }
        let index = (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow);
        Some((u64::from(info.dwVolumeSerialNumber), index))
    }
}

#[cfg(not(any(unix, windows)))]
fn file_identity(_: &File) -> Option<(u64, u64)> {
    None
}
