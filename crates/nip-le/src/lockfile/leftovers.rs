//! What crashed writes leave behind: a rewrite's temporary file (a work
//! ledger's compaction, an agent mark) is renamed into place within
//! milliseconds, so one that is still there long after was left by a
//! process that died (or froze) between its write and its rename. The next
//! window that owns such files removes them, so a crash loop cannot fill
//! the disk with synced copies (a ledger's rewrite is up to 8 MiB).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long a temporary file must have gone unmodified before it counts
/// as left behind: a live writer renames its own within milliseconds.
pub(crate) const LEFTOVER_AGE: Duration = Duration::from_secs(60);

/// The regular files directly in `dir` whose names `left` recognises and
/// that were last modified at least `age` before `now` (one in the future
/// is not: a clock stepped back). Symlinks and directories are never
/// candidates; an unreadable directory has none.
pub(crate) fn leftovers(
    dir: &Path,
    left: &dyn Fn(&str) -> bool,
    age: Duration,
    now: SystemTime,
) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    (entries.flatten())
        .filter(|e| e.file_name().to_str().is_some_and(left))
        .filter(|e| {
            e.metadata().is_ok_and(|m| {
                m.file_type().is_file()
                    && m.modified()
                        .is_ok_and(|t| now.duration_since(t).is_ok_and(|d| d >= age))
            })
        })
        .map(|e| e.path())
        .collect()
}

/// Removes [`leftovers`]; returns how many went.
pub(crate) fn remove_leftovers(
    dir: &Path,
    left: &dyn Fn(&str) -> bool,
    age: Duration,
    now: SystemTime,
) -> usize {
    let gone = (leftovers(dir, left, age, now).into_iter())
        .filter(|p| std::fs::remove_file(p).is_ok())
        .count();
    if gone > 0 {
        tracing::info!(dir = %dir.display(), "removed {gone} temporary files that crashed writes left");
    }
    gone
}

/// Whether `s` is a name part our writers draw at random: 32 lowercase
/// hex digits (a simple UUID).
pub(crate) fn is_random_part(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only old regular files whose names match go; a young one, a
    /// symlink, a directory and another name stay.
    #[test]
    fn only_old_matching_regular_files_are_leftovers() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let old = SystemTime::now() - Duration::from_secs(120);
        let make = |name: &str, at: SystemTime| {
            let f = std::fs::File::create(d.join(name)).unwrap();
            f.set_modified(at).unwrap();
        };
        make("x.tmp.old", old);
        make("x.tmp.young", SystemTime::now());
        make("other", old);
        std::fs::create_dir(d.join("x.tmp.dir")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", d.join("x.tmp.link")).unwrap();
        let left = |n: &str| n.starts_with("x.tmp.");
        let now = SystemTime::now();
        assert_eq!(
            leftovers(d, &left, LEFTOVER_AGE, now),
            vec![d.join("x.tmp.old")]
        );
        // A file modified "in the future" (a clock stepped back) stays.
        make("x.tmp.future", now + Duration::from_secs(3600));
        assert_eq!(remove_leftovers(d, &left, LEFTOVER_AGE, now), 1);
        for stays in ["x.tmp.young", "other", "x.tmp.dir", "x.tmp.future"] {
            assert!(d.join(stays).exists(), "{stays} removed");
        }
        #[cfg(unix)]
        {
            assert!(std::fs::symlink_metadata(d.join("x.tmp.link")).is_ok());
            assert!(std::fs::read("/etc/passwd").is_ok());
        }
        assert_eq!(
            remove_leftovers(&d.join("none"), &left, LEFTOVER_AGE, now),
            0
        );
        assert!(is_random_part(&uuid::Uuid::new_v4().simple().to_string()));
        assert!(!is_random_part("../../etc/passwd"));
    }
}
