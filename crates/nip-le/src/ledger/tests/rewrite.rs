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
