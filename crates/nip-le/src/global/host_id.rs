//! The default host id: a random id kept in the lock directory, so every
//! window of a host (they share the directory) uses the same one, and no
//! two hosts do. The hostname was the default before; two hosts often
//! share one ("ubuntu", "MacBook-Pro"), and a host that sees its own id on
//! the agent's key continues the lease it is bound to, so two such hosts
//! took the key from each other every renewal.
//!
//! A lock directory is meant to be local, but a home on NFS, synced
//! dotfiles or a cloned disk share one between machines, and with it the
//! id. So the id is bound to the machine that made it (a fingerprint of the
//! OS's machine id, [`super::machine`], on the file's second line), and a
//! machine that finds another's fingerprint there derives an id of its own
//! from both, the same for every window of it, without writing anything.
//! A cloned disk whose machine id was not made anew (systemd's
//! `machine-id` is meant to be) stays undetectable.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::lockfile::{open_regular_file, Create};

/// The file, in the lock directory.
pub const HOST_ID_FILE: &str = "etcd-host-id";

/// The most a host id file may hold (a longer one is not ours).
const MAX_LEN: u64 = 128;

/// Whether `id` could be one we wrote: `h-` and 32 hex digits, or any other
/// short run of letters, digits, `-`, `_` and `.` (an id an operator put
/// there by hand).
fn plausible(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn path_in(lock_dir: &Path) -> PathBuf {
    lock_dir.join(HOST_ID_FILE)
}

/// Reads the host id kept in `lock_dir`, writing a new random one first
/// when there is none. Windows that start together agree: the id is
/// written beside and linked into place only if no other window's got
/// there first. Hostile content (a symlink, a fifo, a huge file, bytes
/// that are no id) is an error naming the file, never replaced silently:
/// another host id would let another host's lease be continued.
pub fn persisted(lock_dir: &Path) -> Result<String, String> {
    persisted_on(lock_dir, super::machine::fingerprint().as_deref())
}

/// [`persisted`] on the machine whose fingerprint is `machine` (`None`:
/// the OS keeps no machine id, and the file is trusted as it is).
fn persisted_on(lock_dir: &Path, machine: Option<&str>) -> Result<String, String> {
    let path = path_in(lock_dir);
    match read(&path) {
        Ok(Some(kept)) => return Ok(ours(kept, machine, &path)),
        Ok(None) => {}
        Err(e) => return Err(e),
    }
    crate::lockfile::ensure_dir(lock_dir)
        .map_err(|e| format!("{}: cannot write the host id: {e}", path.display()))?;
    let id = format!("h-{}", uuid::Uuid::new_v4().simple());
    let text = match machine {
        Some(m) => format!("{id}\nmachine {m}\n"),
        None => id.clone(),
    };
    let tmp = lock_dir.join(format!(
        ".{HOST_ID_FILE}.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    // Durable before it is linked into place: a power loss must not leave
    // an empty id (read as "not a host id").
    let written = open_regular_file(&tmp, Create::New)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()).and(f.sync_all()))
        .and_then(|()| std::fs::hard_link(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => Ok(id),
        // Another window wrote its id first: that one is the host's.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let kept =
                read(&path)?.ok_or_else(|| format!("{}: vanished while read", path.display()))?;
            Ok(ours(kept, machine, &path))
        }
        Err(e) => Err(format!("{}: cannot write the host id: {e}", path.display())),
    }
}

/// Whether `e` (from [`persisted`]) says the file holds no host id, as
/// opposed to: it could not be read or written at all.
pub fn is_hostile(e: &str) -> bool {
    e.contains("not a host id")
}

/// A host id as kept: the id, and the fingerprint of the machine that
/// made it (none in a file written by hand or by an older version).
struct Kept {
    id: String,
    machine: Option<String>,
}

/// The host id of machine `machine` from what the file keeps: the file's
/// own, unless another machine made it; then one derived from both.
fn ours(kept: Kept, machine: Option<&str>, path: &Path) -> String {
    match (kept.machine.as_deref(), machine) {
        (Some(theirs), Some(mine)) if theirs != mine => {
            tracing::info!(
                "{}: the host id of another machine (a lock directory shared over a network or synced filesystem, or a cloned disk): using one of this machine's",
                path.display()
            );
            let name = format!("{} {mine}", kept.id);
            format!(
                "h-{}",
                uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).simple()
            )
        }
        _ => kept.id,
    }
}

/// What `path` keeps, `None` when there is no file.
fn read(path: &Path) -> Result<Option<Kept>, String> {
    let f = match open_regular_file(path, Create::No) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: cannot read the host id: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    f.take(MAX_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: cannot read the host id: {e}", path.display()))?;
    let text = std::str::from_utf8(&bytes).unwrap_or("");
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let id = lines.next().unwrap_or("");
    let machine = lines.next().map(|l| {
        l.strip_prefix("machine ")
            .filter(|m| m.len() == 16 && m.chars().all(|c| c.is_ascii_hexdigit()))
    });
    if bytes.len() as u64 > MAX_LEN
        || !plausible(id)
        || machine == Some(None)
        || lines.next().is_some()
    {
        return Err(format!(
            "{}: not a host id (remove it to have a new one made, or write one by hand)",
            path.display()
        ));
    }
    Ok(Some(Kept {
        id: id.to_owned(),
        machine: machine.flatten().map(str::to_owned),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_id_per_lock_directory_kept_across_starts() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = persisted(a.path()).unwrap();
        assert!(first.starts_with("h-") && first.len() == 34, "{first}");
        assert_eq!(persisted(a.path()).unwrap(), first, "kept");
        assert_ne!(persisted(b.path()).unwrap(), first, "another host");
        let left: Vec<_> = std::fs::read_dir(a.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left");
    }

    /// Issue 31: a lock directory on NFS or in synced dotfiles is shared by
    /// machines, and so was the host id: two hosts as one.
    #[test]
    fn a_lock_directory_shared_by_two_machines_gives_each_its_own_id() {
        let dir = tempfile::tempdir().unwrap();
        let (m1, m2) = ("0123456789abcdef", "fedcba9876543210");
        let first = persisted_on(dir.path(), Some(m1)).unwrap();
        let text = std::fs::read_to_string(path_in(dir.path())).unwrap();
        assert_eq!(text, format!("{first}\nmachine {m1}\n"));
        assert_eq!(persisted_on(dir.path(), Some(m1)).unwrap(), first, "kept");
        let second = persisted_on(dir.path(), Some(m2)).unwrap();
        assert_ne!(second, first, "the other machine's id");
        assert!(plausible(&second) && second.starts_with("h-"), "{second}");
        assert_eq!(
            persisted_on(dir.path(), Some(m2)).unwrap(),
            second,
            "stable"
        );
        assert_eq!(
            std::fs::read_to_string(path_in(dir.path())).unwrap(),
            text,
            "nothing written"
        );
        // A machine without a machine id, and an id written by hand: trusted.
        assert_eq!(persisted_on(dir.path(), None).unwrap(), first);
        std::fs::write(path_in(dir.path()), "laptop-7\n").unwrap();
        assert_eq!(persisted_on(dir.path(), Some(m2)).unwrap(), "laptop-7");
    }

    #[test]
    fn windows_starting_together_agree_on_one_id() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| persisted(dir.path()).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    }

    #[test]
    fn a_missing_lock_directory_is_made_and_an_unwritable_one_is_no_hostile_file() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("not-yet");
        assert!(
            persisted(&fresh).unwrap().starts_with("h-"),
            "spec mode makes no dir"
        );
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        let e = persisted(&file).unwrap_err();
        assert!(!is_hostile(&e), "{e}");
    }

    #[test]
    fn hostile_content_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(HOST_ID_FILE);
        for bad in [
            &b"../../etc/passwd"[..],
            b"",
            b"a\nb",
            b"h-1\nmachine ../../x\n",
            b"h-1\nmachine 0123456789abcdef\nmore\n",
            b"\xff\xfe",
            &[b'a'; 200],
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = persisted(dir.path()).unwrap_err();
            assert!(e.contains(HOST_ID_FILE) && is_hostile(&e), "{e}");
            assert_eq!(std::fs::read(&path).unwrap(), bad, "never replaced");
        }
        std::fs::write(&path, "laptop-7\n").unwrap();
        assert_eq!(
            persisted(dir.path()).unwrap(),
            "laptop-7",
            "one set by hand"
        );
        #[cfg(unix)]
        {
            std::fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
            assert!(persisted(dir.path()).is_err(), "a symlink is followed");
        }
    }
}
