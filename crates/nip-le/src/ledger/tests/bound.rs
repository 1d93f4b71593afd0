//! Bounded without forgetting: a rewrite past its budget marks answered
//! events settled (a `floor` line) instead of dropping what it cannot
//! keep; a ledger it cannot shrink is not rewritten at every append, and
//! once too long takes no new take.

use super::*;

const MIN: u64 = 60_000;
/// When the first event of a test was published.
const T0: u64 = 10 * 3_600_000;
/// When the tests rewrite.
const NOW: u64 = T0 + 2 * 3_600_000;

/// Small limits, so that a few thousand answers pass the budget.
fn small() -> Limits {
    Limits {
        compact_at: 48 * 1024,
        budget: 32 * 1024,
        full_at: 96 * 1024,
        growth: 8 * 1024,
        settle_lag: SETTLE_LAG,
    }
}

fn take_pub(id: &str, epoch: u64, at: u64, pub_ms: Option<u64>) -> Op {
    Op::Take {
        id: id.into(),
        epoch,
        by: "w1".into(),
        at_ms: at,
        live: Some("tok-w1".into()),
        pub_ms,
    }
}

/// A ledger kept to [`small`] limits in a directory of its own.
fn small_ledger() -> (tempfile::TempDir, std::path::PathBuf, Ledger) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("k.work");
    let l = Ledger::load(path.clone(), 0, HOUR * 24).unwrap();
    (tmp, path, l.with_limits(small()))
}

/// `n` events published a second apart from `t0`, each taken (with its
/// publication time when `with_pub`) and answered at `at`.
fn answer_all(l: &mut Ledger, n: u64, t0: u64, at: u64, with_pub: bool) -> Vec<(String, u64)> {
    let mut events = Vec::new();
    for i in 0..n {
        let (id, p) = (format!("{i:064x}"), t0 + i * 1000);
        l.append_now(&take_pub(&id, 1, at, with_pub.then_some(p)))
            .unwrap();
        l.append(&done(&id, 1, at)).unwrap();
        events.push((id, p));
    }
    events
}

/// What the file says is owed of `events` to a successor at epoch 2.
fn owed_again(path: &std::path::Path, events: &[(String, u64)], now: u64) -> Vec<String> {
    let ix = Index::parse(&std::fs::read(path).unwrap(), now, HOUR * 24);
    let queue = events.iter().map(|(id, p)| (id.as_str(), Some(*p)));
    owed(queue, Some(&ix), 2, None, &|_| false)
}

#[test]
fn answers_past_the_budget_are_marked_settled_and_never_owed_again() {
    let (_tmp, path, mut l) = small_ledger();
    let events = answer_all(&mut l, 2_000, T0, NOW - 30 * MIN, true);
    l.refresh(NOW).unwrap();
    assert!(l.wants_compaction());
    let settle = SettleCap {
        cap: u64::MAX,
        by: "w1",
        epoch: 1,
    };
    l.compact(NOW, Some(settle)).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(
        len <= small().budget as u64,
        "{len} bytes after the rewrite"
    );
    let mark = l.index.floor().expect("a settled mark");
    assert!(mark > T0 && mark <= NOW - SETTLE_LAG.as_millis() as u64);
    assert!(
        l.index.len() < 2_000,
        "the oldest answers were marked, not kept"
    );
    assert_eq!(owed_again(&path, &events, NOW), Vec::<String>::new());
    // What is published after the mark is owed, as before.
    let new = vec![("new".to_owned(), NOW)];
    assert_eq!(owed_again(&path, &new, NOW), ["new"]);
}

#[test]
fn the_mark_stays_below_the_oldest_event_still_owed_and_the_lag() {
    let (_tmp, path, mut l) = small_ledger();
    let events = answer_all(&mut l, 2_000, T0, NOW - 30 * MIN, true);
    // The app still queues an event published among the answered ones and
    // not answered: the mark stays below it, whatever the budget says.
    let unanswered = T0 + 500 * 1000 + 1;
    let settle = SettleCap {
        cap: unanswered,
        by: "w1",
        epoch: 1,
    };
    l.compact(NOW, Some(settle)).unwrap();
    let mark = l.index.floor().unwrap();
    assert!(mark <= unanswered, "{mark} > {unanswered}");
    let late = vec![("late".to_owned(), unanswered)];
    assert_eq!(owed_again(&path, &late, NOW), ["late"]);
    // A turn given back is owed: the mark stays below it too.
    let given = T0 + 100 * 1000 + 1;
    l.append_now(&take_pub("given", 1, NOW, Some(given)))
        .unwrap();
    l.append(&give_back("given", 1, NOW)).unwrap();
    answer_all(&mut l, 2_000, T0 + 2_000_000, NOW - 30 * MIN, true);
    l.refresh(NOW).unwrap();
    l.compact(NOW, Some(settle)).unwrap();
    let back = vec![("given".to_owned(), given)];
    assert_eq!(owed_again(&path, &back, NOW), ["given"]);
    assert_eq!(owed_again(&path, &events, NOW), Vec::<String>::new());
    // The lag: answers published within it are kept, never marked.
    let (_tmp2, path2, mut recent) = small_ledger();
    let lag = SETTLE_LAG.as_millis() as u64;
    let events = answer_all(&mut recent, 2_000, NOW - lag + 1, NOW, true);
    let settle = SettleCap {
        cap: u64::MAX,
        by: "w1",
        epoch: 1,
    };
    recent.compact(NOW, Some(settle)).unwrap();
    assert_eq!(recent.index.floor(), None);
    assert_eq!(recent.index.len(), 2_000, "nothing answered forgotten");
    assert_eq!(owed_again(&path2, &events, NOW), Vec::<String>::new());
}

/// Without a cap (the app never said what it still owes) nothing answered
/// goes: the rewrite cannot shrink the file, is not tried again until it
/// grew, and once it is too long it takes no new take.
#[test]
fn a_ledger_that_cannot_shrink_is_not_rewritten_at_every_append_and_fills() {
    let (_tmp, path, mut l) = small_ledger();
    let mut events = answer_all(&mut l, 1_000, T0, NOW - 30 * MIN, false);
    l.refresh(NOW).unwrap();
    l.compact(NOW, None).unwrap();
    assert_eq!(l.index.floor(), None);
    assert_eq!(owed_again(&path, &events, NOW), Vec::<String>::new());
    let rewritten = std::fs::metadata(&path).unwrap().len();
    assert!(rewritten > small().compact_at, "it could not shrink");
    assert!(!l.wants_compaction(), "tried again before it grew");
    // One more answer, of unknown publication time, read back.
    let answer = |l: &mut Ledger, events: &mut Vec<(String, u64)>| {
        let id = format!("more{}", events.len());
        assert!(
            events.len() < 100_000,
            "never rewritten again, or never full"
        );
        l.append_now(&take_pub(&id, 1, NOW, None)).unwrap();
        l.append(&done(&id, 1, NOW)).unwrap();
        l.refresh(NOW).unwrap();
        events.push((id, T0));
    };
    while !l.wants_compaction() {
        answer(&mut l, &mut events);
    }
    let grown = std::fs::metadata(&path).unwrap().len() - rewritten;
    assert!(grown >= small().growth, "rewritten after {grown} bytes");
    while !l.is_full() {
        answer(&mut l, &mut events);
        if l.wants_compaction() {
            l.compact(NOW, None).unwrap();
        }
    }
    assert!(std::fs::metadata(&path).unwrap().len() >= small().full_at);
    assert!(std::fs::metadata(&path).unwrap().len() < MAX_LEDGER_BYTES);
    assert_eq!(owed_again(&path, &events, NOW), Vec::<String>::new());
}

#[test]
fn one_long_tenure_keeps_the_ledger_readable_and_forgets_no_answer() {
    // One holder answers 200,000 mentions (64-hex ids, published over 5.5
    // hours) in one tenure, all within the retention window, keeping the
    // ledger as the writer does (refresh on takes, the upkeep every 1,000,
    // the app's queue holding nothing unanswered). The file used to pass
    // 16 MiB (unreadable for good), then to forget the oldest answers to
    // stay below it (owed again: 1,468 answered twice after such a tenure).
    let disk = Shared::default();
    let day = HOUR * 24;
    let mut l = Ledger::open(Box::new(disk.clone()), 0, day).unwrap();
    let id = |n: u64| format!("{n:064x}");
    let base = 100 * 3_600_000;
    let published = |n: u64| base + n * 100;
    let end = base + 7 * 3_600_000;
    let mut largest = 0;
    for n in 0..200_000u64 {
        let at = end - (200_000 - n) / 10;
        let take = Op::Take {
            id: id(n),
            epoch: 1,
            by: "w1".into(),
            at_ms: at,
            live: Some("tok-w1".into()),
            pub_ms: Some(published(n)),
        };
        l.append_now(&take).unwrap();
        l.append(&done(&id(n), 1, at)).unwrap();
        if n % 1_000 == 999 {
            l.refresh(at).unwrap();
            l.expire_if_due(at);
            if l.wants_compaction() {
                let cap = SettleCap {
                    cap: u64::MAX,
                    by: "w1",
                    epoch: 1,
                };
                l.compact(at, Some(cap)).unwrap();
            }
            largest = largest.max(disk.0.lock().unwrap().bytes.len());
        }
    }
    eprintln!("largest {largest} bytes");
    assert!(
        largest as u64 <= COMPACT_AT_BYTES + 1_000 * 200,
        "{largest}"
    );
    let bytes = disk.0.lock().unwrap().bytes.clone();
    assert!((bytes.len() as u64) < MAX_LEDGER_BYTES);
    // Five mentions published while the holder was frozen; a successor
    // loads the ledger and owes exactly those.
    let queue: Vec<(String, u64)> = (0..200_000u64)
        .map(|n| (id(n), published(n)))
        .chain((0..5).map(|k| (format!("new{k}"), end + 1_000 + k)))
        .collect();
    let next = Ledger::open(Box::new(disk), end + 10_000, day).unwrap();
    let q = queue.iter().map(|(id, p)| (id.as_str(), Some(*p)));
    let owed = owed(q, Some(&next.index), 2, None, &|_| false);
    assert_eq!(owed, ["new0", "new1", "new2", "new3", "new4"]);
}
