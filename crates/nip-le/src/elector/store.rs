//! Where a key's record lives, behind a seam in the spirit of client-go's
//! resource lock: an unguarded read (the NIP's read side) and a
//! read-decide-write under the store's mutual exclusion (acquire, refresh,
//! release, handoff). The store knows no election state: the writer passes
//! the decision in. [`FileStore`] is the NIP's lock file; a cross-host
//! backend plugs in here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::epoch::{self, Mark};
use crate::error::Result;
use crate::lockfile::{self, LockedFile};
use crate::pubkey::AgentPubkey;
use crate::record::LockContent;

use super::machine::Write;

/// What an update did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Updated {
    /// What the store holds afterwards.
    pub content: LockContent,
    /// Whether the decision wrote (or cleared) the record.
    pub wrote: bool,
}

/// Makes the store of a newly joined key.
pub(crate) type StoreFactory = Box<dyn Fn(&AgentPubkey) -> Box<dyn LockStore> + Send>;

/// One key's record in some store.
pub(crate) trait LockStore: Send {
    /// The read side: takes no lock, so it may see a torn write (which
    /// parses as malformed). An error means "unreadable".
    fn read(&self) -> Result<LockContent>;

    /// Shows the current content to `decide` under the store's exclusion,
    /// with the store's epoch mark (the highest fencing epoch it has issued
    /// for the key, 0 when it keeps none, and whether its holder released
    /// it), and carries out what it returns. The exclusion
    /// is waited for at most the configured lock wait; on timeout nothing
    /// changes.
    fn update(&mut self, decide: &mut dyn FnMut(&LockContent, Mark) -> Write) -> Result<Updated>;
}

/// The NIP's lock file, `<lock dir>/<pubkey>.lock`: the exclusive `flock` is
/// taken on the file itself (never renamed, never unlinked), writes are in
/// place, reads are capped and never follow a symlink (see
/// [`crate::lockfile`]). Extension: the epoch's high-water mark beside it
/// ([`crate::epoch`]), read and raised under the same `flock`.
#[derive(Debug)]
pub(crate) struct FileStore {
    dir: PathBuf,
    path: PathBuf,
    wait: Duration,
    /// `<pubkey>.epoch`, in extended mode.
    floor: Option<PathBuf>,
}

impl FileStore {
    /// The lock file at `path` in `dir`; `floor` is the epoch mark's path
    /// (extended mode) or `None` (spec mode: nothing but the lock file).
    pub(crate) fn new(dir: &Path, path: PathBuf, wait: Duration, floor: Option<PathBuf>) -> Self {
        Self {
            dir: dir.to_owned(),
            path,
            wait,
            floor,
        }
    }
}

impl LockStore for FileStore {
    fn read(&self) -> Result<LockContent> {
        lockfile::read_unguarded(&self.path)
    }

    fn update(&mut self, decide: &mut dyn FnMut(&LockContent, Mark) -> Write) -> Result<Updated> {
        lockfile::ensure_dir(&self.dir)?;
        let mut f = LockedFile::open_and_lock(&self.path, self.wait)?;
        let content = f.read()?;
        // The mark matters only when the file carries no epoch (emptied,
        // or written by the harness or a spec instance): otherwise the
        // record's own epoch is the latest that any record ever carried,
        // and a refresh reads no second file.
        let current = content.record().and_then(|r| r.epoch);
        let floor = match current {
            Some(_) => Mark::default(),
            None => self
                .floor
                .as_deref()
                .map_or(Mark::default(), epoch::read_mark),
        };
        Ok(match decide(&content, floor) {
            Write::Keep => Updated {
                content,
                wrote: false,
            },
            Write::Put(bytes, record) => {
                let issued = record.epoch;
                let known = current.unwrap_or(0).max(floor.epoch);
                if let (Some(path), Some(e)) = (&self.floor, issued.filter(|e| *e > known)) {
                    // First the mark, then the record: a crash in between
                    // leaves a gap in the epochs, never a repeat. A mark we
                    // cannot write must not silence the agent.
                    if let Err(err) = epoch::raise_floor(path, e) {
                        tracing::warn!("cannot raise the epoch mark {}: {err}", path.display());
                    }
                }
                f.write(&bytes)?;
                Updated {
                    content: LockContent::Record(record),
                    wrote: true,
                }
            }
            Write::Clear(mark) => {
                if let (Some(path), Some(e)) = (&self.floor, mark) {
                    if let Err(err) = epoch::mark_released(path, e) {
                        tracing::warn!("cannot raise the epoch mark {}: {err}", path.display());
                    }
                }
                f.truncate()?;
                Updated {
                    content: LockContent::Empty,
                    wrote: true,
                }
            }
        })
    }
}
