//! The ledger's append hold: appends and a rewrite never overlap.
//!
//! Every process appends by path (`O_APPEND`), and a rewrite (compaction)
//! renames a new file over the ledger. A line appended between the
//! rewrite's read and its rename went into the file the rename unlinked:
//! lost, and the event it settled read as owed again. So an append holds a
//! shared `flock` on `work/<pubkey>.work.hold` while it opens and writes, and a
//! rewrite holds it exclusively from its last read to its rename. The
//! harness never opens this file; nothing is ever written to it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::lockfile::{lock_polled, open_regular_file, Create};

/// How long an append or a rewrite waits for the hold: a peer that hangs
/// holding it (stopped mid-append) costs a retry, never a hang.
pub const HOLD_WAIT: Duration = Duration::from_millis(200);

/// `<ledger path>.hold`.
pub fn hold_path(ledger: &Path) -> PathBuf {
    let mut p = ledger.as_os_str().to_owned();
    p.push(".hold");
    PathBuf::from(p)
}

/// A held append hold; released when dropped.
#[derive(Debug)]
pub struct AppendHold {
    _file: Option<(File, crate::lockfile::os_lock::Held)>,
}

impl AppendHold {
    /// No hold (a storage whose appends and rewrites cannot overlap).
    pub fn none() -> Self {
        Self { _file: None }
    }

    /// Shared (an append) or exclusive (a rewrite), waiting at most `wait`.
    pub fn take(ledger: &Path, exclusive: bool, wait: Duration) -> Result<Self> {
        let path = hold_path(ledger);
        // Every write holds this first: the ledgers' directory is made if
        // missing, and refused if it is a symlink or not ours, before
        // anything is written in it.
        if let Some(dir) = ledger.parent() {
            crate::lockfile::ensure_subdir(dir)?;
        }
        let file = open_regular_file(&path, Create::IfMissing).map_err(|e| Error::io(&path, e))?;
        let held = lock_polled(&file, &path, exclusive, wait)?;
        Ok(Self {
            _file: Some((file, held)),
        })
    }
}
