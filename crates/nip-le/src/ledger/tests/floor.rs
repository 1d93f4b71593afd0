//! The `floor` line: what a writer without a ledger may have answered is
//! owed to no holder after the one that found it.

use super::*;

fn floor(before_ms: u64, at_ms: u64) -> Op {
    Op::Floor {
        epoch: 3,
        by: "w1".into(),
        before_ms,
        at_ms,
    }
}

#[test]
fn the_highest_floor_holds_and_a_hostile_one_is_skipped() {
    let mut ix = Index::default();
    ix.apply(&floor(500, 600));
    ix.apply(&floor(400, 700));
    assert_eq!(ix.floor(), Some(500), "the highest floor, not the last");
    ix.apply(&floor(u64::MAX, 900));
    assert_eq!(ix.floor(), Some(500), "a floor later than its line");
    assert!(ix.is_empty(), "a floor is not an event");
    // A floor in the future (a hostile line, or our clock stepped back)
    // is dropped on expiry; one past the retention is kept.
    let mut late = Index::default();
    late.apply(&floor(5_000, 5_000));
    late.expire(4_999, Duration::ZERO);
    assert_eq!(late.floor(), None);
    ix.expire(10 * 3_600_000, HOUR);
    assert_eq!(ix.floor(), Some(500), "outlives the retention");
}

#[test]
fn before_the_floor_only_what_the_ledger_shows_is_owed() {
    let mut ix = Index::default();
    for op in [
        floor(1_000, 1_000),
        take_by("gone", 1, "tok-gone"),
        done("answered", 1, 900),
    ] {
        ix.apply(&op);
    }
    let q = [
        ("never", Some(999)),
        ("gone", Some(10)),
        ("answered", Some(10)),
        ("unknown", None),
        ("since", Some(1_000)),
    ];
    assert_eq!(
        owed(q, Some(&ix), 2, None, &|_| false),
        ["gone", "unknown", "since"],
        "before the floor: what the ledger shows is judged by its verdict, the rest left out"
    );
    assert_eq!(
        owed(q, None, 2, None, &|_| false).len(),
        5,
        "no ledger, no floor"
    );
}

#[test]
fn a_floor_survives_compaction_and_counts_as_a_line() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("k.work");
    let mut l = Ledger::load(path.clone(), 0, HOUR).unwrap();
    l.append(&floor(50, 60)).unwrap();
    l.append(&floor(40, 70)).unwrap();
    l.compact(100, None).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 1, "one floor kept: {text}");
    let again = Ledger::load(path, 100, HOUR).unwrap();
    assert_eq!(again.index.floor(), Some(50));
}

#[test]
fn a_floor_line_is_synced() {
    let disk = Shared::default();
    let mut l = Ledger::open(Box::new(disk.clone()), 0, HOUR).unwrap();
    l.append_now(&take_by("a", 1, "7-aaaa")).unwrap();
    l.append(&floor(1, 2)).unwrap();
    let d = disk.0.lock().unwrap();
    assert_eq!(
        d.synced,
        d.bytes.len(),
        "lost, a later holder owes it all again"
    );
}
