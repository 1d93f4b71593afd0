//! The ledgers' directory: made with the first write, ours alone, never
//! through a symlink.

use super::*;
use crate::pubkey::AgentPubkey;

fn pk() -> AgentPubkey {
    AgentPubkey::parse(&"ab".repeat(32)).unwrap()
}

/// The first write makes `work/` (`0700` on Unix); a read before it finds
/// an empty ledger and makes nothing.
#[test]
fn the_first_write_makes_the_work_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let path = ledger_path(tmp.path(), &pk());
    assert_eq!(path.parent().unwrap(), tmp.path().join(WORK_DIR));
    assert_eq!(FileLedger::new(path.clone()).read().unwrap(), b"");
    assert!(
        !tmp.path().join(WORK_DIR).exists(),
        "a read made the directory"
    );
    let line = take("a", 1, 1).to_line();
    FileLedger::new(path.clone()).append(&line, true).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), line);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tmp.path().join(WORK_DIR))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}

/// A symlink at `work` (someone else's directory, or a place to write our
/// lines into) is refused: nothing is written through it.
#[cfg(unix)]
#[test]
fn a_symlinked_work_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), tmp.path().join(WORK_DIR)).unwrap();
    let path = ledger_path(tmp.path(), &pk());
    let e = FileLedger::new(path).append(&take("a", 1, 1).to_line(), true);
    assert!(e.is_err(), "appended through a symlink");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}
