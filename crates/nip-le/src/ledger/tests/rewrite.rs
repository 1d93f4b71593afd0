//! Telling a rewritten ledger from one appended to.

use super::*;

/// A rewrite renamed over the ledger is noticed by a reader that read the
/// old file, even when the new one is longer than what it read: reading on
/// at its old offset would skip lines of the new file.
#[test]
fn a_longer_file_renamed_over_the_ledger_reads_as_rewritten() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("k.work");
    std::fs::write(&path, take("a", 1, 1).to_line()).unwrap();
    let mut reader = FileLedger::new(path.clone());
    let read = reader.read().unwrap().len() as u64;
    assert_eq!(reader.read_from(read).unwrap(), b"");
    let mut body = Vec::new();
    for i in 0..10 {
        body.extend(take(&format!("e{i}"), 2, 2).to_line());
    }
    FileLedger::new(path.clone()).replace(&body).unwrap();
    assert!(body.len() as u64 > read);
    assert!(matches!(
        reader.read_from(read),
        Err(LedgerError::Rewritten)
    ));
    // Read whole again, it reads on from there.
    assert_eq!(reader.read().unwrap(), body);
    let mut rewriter = FileLedger::new(path.clone());
    rewriter.read().unwrap();
    rewriter.replace(&body).unwrap();
    assert_eq!(rewriter.read_from(body.len() as u64).unwrap(), b"");
    rewriter.append(&take("z", 3, 3).to_line(), false).unwrap();
    assert_eq!(
        rewriter.read_from(body.len() as u64).unwrap(),
        take("z", 3, 3).to_line()
    );
}

/// A ledger too large to read is rewritten from its newest lines: what
/// they say holds (done stays done, a take stays taken), what only the
/// oldest lines said is forgotten, and the file is small and readable
/// again. Left as it was, every holder would dispatch without it for good.
#[test]
fn an_oversized_ledger_is_rewritten_from_its_newest_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("k.work");
    let now = 1_000_000;
    let mut body = Vec::new();
    let mut n = 0;
    while body.len() as u64 <= MAX_LEDGER_BYTES {
        body.extend(done(&format!("e{n}"), 1, now).to_line());
        n += 1;
    }
    body.extend(take("in-flight", 2, now).to_line());
    // A torn last line (a write the disk cut short) is not a line.
    body.extend(b"{\"op\":\"done\",\"id\":\"in-fl");
    std::fs::write(&path, &body).unwrap();
    let oversized = Ledger::load(path.clone(), now, DEFAULT_RETENTION).unwrap_err();
    assert_eq!(oversized, LedgerError::Oversized);

    let l = Ledger::recover(
        Box::new(FileLedger::new(path.clone())),
        now,
        DEFAULT_RETENTION,
    )
    .unwrap();
    let newest = format!("e{}", n - 1);
    assert_eq!(l.index.verdict(&newest, 2), Verdict::Done);
    assert_eq!(l.index.verdict("in-flight", 2), Verdict::TakenNow);
    assert_eq!(
        l.index.verdict("e0", 2),
        Verdict::Owed,
        "the oldest are forgotten"
    );
    assert!(std::fs::metadata(&path).unwrap().len() <= SNAPSHOT_BUDGET as u64);
    let again = Ledger::load(path, now, DEFAULT_RETENTION).unwrap();
    assert_eq!(again.index.verdict(&newest, 2), Verdict::Done);
    assert_eq!(again.index.verdict("in-flight", 2), Verdict::TakenNow);
}

/// A process killed in the middle of a rewrite (after its temporary file
/// is written, before the rename) leaves the ledger whole and that file
/// behind; the next owner removes it once it is older than a live
/// rewrite could be, and never while a rewrite holds the append hold.
#[cfg(target_os = "linux")]
#[test]
fn a_rewrite_killed_midway_leaves_a_file_the_next_owner_removes() {
    use std::os::unix::process::ExitStatusExt;
    const CHILD: &str = "NIP_LE_TEST_REWRITE_CRASH_DIR";
    const NAME: &str =
        "ledger::tests::rewrite::a_rewrite_killed_midway_leaves_a_file_the_next_owner_removes";
    if let Some(dir) = std::env::var_os(CHILD) {
        // The child: a ledger worth rewriting, rewritten; the process dies
        // at the sync of the temporary file.
        let path = std::path::Path::new(&dir).join("k.work");
        let mut l = Ledger::load(path, 0, HOUR).unwrap();
        for i in 0..10 {
            l.append_now(&take(&format!("e{i}"), 1, 1)).unwrap();
        }
        super::sync_fault::crash_at_fsync_under(std::path::Path::new(&dir));
        let _ = l.compact(0, None);
        std::process::exit(3);
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("k.work");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture"])
        .env(CHILD, tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{out:?}");
    let left = || -> Vec<std::path::PathBuf> {
        (std::fs::read_dir(tmp.path()).unwrap().flatten())
            .map(|e| e.path())
            .filter(|p| {
                (p.file_name().and_then(|n| n.to_str()))
                    .and_then(|n| n.strip_prefix("k.work."))
                    .is_some_and(|r| r.len() == 32)
            })
            .collect()
    };
    let leftover = left();
    assert_eq!(leftover.len(), 1, "the crashed rewrite left its file");
    let before = std::fs::read(&path).unwrap();
    assert_eq!(
        Index::parse(&before, 0, HOUR).len(),
        10,
        "the ledger is whole"
    );
    let mut owner = FileLedger::new(path.clone());
    // Young: a live rewrite could be writing it.
    assert_eq!(owner.remove_leftovers(), 0);
    let old = std::time::SystemTime::now() - 2 * crate::lockfile::leftovers::LEFTOVER_AGE;
    (std::fs::File::options()
        .write(true)
        .open(&leftover[0])
        .unwrap())
    .set_modified(old)
    .unwrap();
    // A rewrite under way (it holds the append hold exclusively) keeps it.
    let rewriting = AppendHold::take(&path, true, hold::HOLD_WAIT).unwrap();
    assert_eq!(owner.remove_leftovers(), 0);
    drop(rewriting);
    assert_eq!(owner.remove_leftovers(), 1);
    assert!(left().is_empty());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the ledger untouched"
    );
    assert!(hold::hold_path(&path).exists(), "the hold file stays");
}
