//! Whose the lock directory and its marks are. Anyone who may write in the
//! lock directory may plant a record that silences us or a mark that names
//! a process for us to stop, so (on Unix, like OpenSSH's `StrictModes`) the
//! directory must belong to us or to root and be writable by no one else,
//! and a mark counts only if we wrote it. On Windows the per-user profile's
//! ACL is the guard (see `docs/platforms.md`).

use std::fs::Metadata;
use std::path::Path;

use crate::error::{Error, Result};

/// Refuses a directory (its `meta`, links followed) that someone other than
/// us or root owns, or that its group or others may write.
pub(crate) fn check_dir(dir: &Path, meta: &Metadata) -> Result<()> {
    match unsafe_because(meta) {
        None => Ok(()),
        Some(why) => Err(Error::UnsafeLockDir {
            path: dir.into(),
            why,
        }),
    }
}

#[cfg(unix)]
fn unsafe_because(meta: &Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let us = euid();
    if meta.uid() != us && meta.uid() != 0 {
        return Some(format!(
            "it is owned by uid {}, not by you (uid {us}) or root",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    (mode & 0o022 != 0).then(|| format!("its mode {mode:o} lets others write in it"))
}

#[cfg(not(unix))]
fn unsafe_because(_: &Metadata) -> Option<String> {
    None
}

/// Whether a file (its `meta`, from the open handle) is ours: a mark
/// written by anyone else names no process for us to stop.
pub(crate) fn written_by_us(meta: &Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        meta.uid() == euid()
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        true
    }
}

#[cfg(unix)]
fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}
