//! What a host has seen of etcd, kept beside the lock files: the highest
//! store revision and the cluster id. A window that first reaches etcd
//! after it lost data (restored from an old snapshot, or recreated) would
//! otherwise see nothing wrong, take a free key at once and act beside a
//! window whose permit a forgotten lease still backs (the simulator with
//! data loss: `every_window_notices_a_data_loss_its_host_saw_the_store_before_across_300_seeds`).
//! Every window of the host starts
//! from what any of them saw.
//!
//! The file is a hint, not a record: it is written without a sync, merged
//! by the highest value, and anything hostile in it (not ours, too long,
//! numbers past `i64::MAX`) reads as nothing seen.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::lockfile::{open_regular_file, Create};

/// The file, in the lock directory.
pub const SEEN_FILE: &str = "etcd-seen";

/// The most the file may hold.
const MAX_LEN: u64 = 256;

/// What a host has seen of etcd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Seen {
    /// The cluster id etcd answered with (0: none).
    pub cluster: u64,
    /// The highest store revision it showed since the last loss.
    pub revision: u64,
    /// How many data losses (or new clusters) were noticed: after one the
    /// revisions start low again, and a window that noticed it must be
    /// able to lower what the host keeps.
    #[serde(default)]
    pub losses: u64,
}

impl Seen {
    /// The later of two: the one after more losses, else the higher
    /// revision.
    pub(crate) fn merge(self, other: Seen) -> Seen {
        if (other.losses, other.revision) > (self.losses, self.revision) {
            other
        } else {
            self
        }
    }
}

/// Where a lock directory keeps it.
pub(crate) fn path_in(lock_dir: &Path) -> PathBuf {
    lock_dir.join(SEEN_FILE)
}

/// What `path` keeps (nothing, when it is missing, unreadable or hostile).
pub(crate) fn read(path: &Path) -> Seen {
    let Ok(f) = open_regular_file(path, Create::No) else {
        return Seen::default();
    };
    let mut bytes = Vec::new();
    if f.take(MAX_LEN + 1).read_to_end(&mut bytes).is_err() || bytes.len() as u64 > MAX_LEN {
        return Seen::default();
    }
    serde_json::from_slice::<Seen>(&bytes)
        .ok()
        .filter(|s| i64::try_from(s.revision).is_ok() && s.losses < u64::MAX / 2)
        .unwrap_or_default()
}

/// Keeps `seen` in `path`, merged with what is there (another window of
/// the host may have seen more). Written beside and renamed into place, so
/// a reader never sees half of it.
pub(crate) fn keep(path: &Path, seen: Seen) -> std::io::Result<()> {
    let merged = read(path).merge(seen);
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{SEEN_FILE}.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let written = open_regular_file(&tmp, Create::New)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, &serde_json::to_vec(&merged).unwrap_or_default())
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_merged_by_the_highest_and_hostile_content_is_nothing_seen() {
        let dir = tempfile::tempdir().unwrap();
        let p = path_in(dir.path());
        assert_eq!(read(&p), Seen::default());
        let seen = |cluster, revision, losses| Seen {
            cluster,
            revision,
            losses,
        };
        keep(&p, seen(7, 40, 0)).unwrap();
        keep(&p, seen(7, 30, 0)).unwrap();
        assert_eq!(read(&p), seen(7, 40, 0), "the higher kept");
        keep(&p, seen(9, 3, 1)).unwrap();
        assert_eq!(read(&p), seen(9, 3, 1), "a noticed loss lowers it");
        keep(&p, seen(7, 50, 0)).unwrap();
        assert_eq!(read(&p), seen(9, 3, 1), "one from before the loss does not");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left");
        for bad in [
            &b"not json"[..],
            br#"{"cluster":1,"revision":18446744073709551615}"#,
            &[b' '; 300],
            br#"{"cluster":-1,"revision":2}"#,
        ] {
            std::fs::write(&p, bad).unwrap();
            assert_eq!(
                read(&p),
                Seen::default(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        #[cfg(unix)]
        {
            std::fs::remove_file(&p).unwrap();
            std::os::unix::fs::symlink("/etc/hostname", &p).unwrap();
            assert_eq!(read(&p), Seen::default(), "a symlink is not followed");
        }
    }
}
