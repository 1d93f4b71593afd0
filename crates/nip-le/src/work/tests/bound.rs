//! The work rules at the ledger's bound: what the app's queue lets a
//! rewrite mark settled, a take below that mark, a full ledger.

use super::*;

fn floor_at(before_ms: u64) -> Op {
    Op::Floor {
        epoch: 3,
        by: "w1".into(),
        before_ms,
        at_ms: before_ms,
    }
}

/// Nothing may be marked settled until the app says what it queues; then
/// the cap is the oldest event it queues that the ledger does not show
/// answered (nor below the mark already), those past the retention aside.
#[test]
fn the_settle_cap_is_the_oldest_unanswered_event_the_app_queues() {
    let mut m = holding(3);
    assert_eq!(m.settle_cap(), None, "the app has not said");
    let ix = index(&[
        Op::Done {
            id: "answered".into(),
            epoch: 3,
            at_ms: T,
            pub_ms: Some(T - 50),
        },
        floor_at(T - 100),
    ]);
    let q = queue(&[
        ("past-retention", T - 1_000),
        ("marked", T - 200),
        ("answered", T - 50),
        ("owed", T - 20),
        ("newer", T - 10),
    ]);
    let _ = m.owed(&q, true, (Some(&ix), T - 500), NOBODY);
    assert_eq!(m.settle_cap(), Some((T - 20, 3)));
    let all_answered = queue(&[("answered", T - 50)]);
    let _ = m.owed(&all_answered, true, (Some(&ix), T - 500), NOBODY);
    assert_eq!(m.settle_cap(), Some((u64::MAX, 3)));
    // A loss forgets it: the next lead asks the app again.
    let _ = m.lead(T, false, None, false);
    let _ = m.lead(T, true, Some(4), false);
    assert_eq!(m.settle_cap(), None);
}

/// A holder after a writer without a ledger marks nothing: its ledger
/// does not cover what that writer answered.
#[test]
fn no_cap_after_a_writer_without_a_ledger() {
    let mut m = machine();
    over_harness(&mut m, 4, T, Some(&Index::default()), NOBODY);
    let _ = m.owed(
        &queue(&[("a", T + 1)]),
        true,
        (Some(&Index::default()), 0),
        NOBODY,
    );
    assert_eq!(m.settle_cap(), None);
}

/// A take of an event published before the mark that the ledger does not
/// show is settled: `done`; one the ledger shows (given back, or a gone
/// taker's) is decided by the ledger; one of unknown time is taken.
#[test]
fn a_take_below_the_mark_is_done_unless_the_ledger_shows_it() {
    let m = holding(3);
    let ix = index(&[
        floor_at(T - 100),
        take_op("given", 2, "tok-gone"),
        Op::GiveBack {
            id: "given".into(),
            epoch: 2,
            at_ms: T,
        },
    ]);
    let take = |id: &str, p: Option<u64>| {
        (m.clone()).take(
            (id, p),
            true,
            T,
            (Some(&ix), false),
            NOBODY,
            "us",
            Some("tok-us"),
        )
    };
    assert_eq!(
        take("old", Some(T - 101)),
        TakeStep::Answer(TakeOutcome::Done)
    );
    assert!(matches!(take("given", Some(T - 101)), TakeStep::Record(_)));
    assert!(matches!(take("old", None), TakeStep::Record(_)));
    assert!(matches!(take("new", Some(T - 100)), TakeStep::Record(_)));
}

/// A full ledger still grants the take of the event that holds its mark
/// back (the oldest the app's queue holds unanswered): answered, it lets
/// the mark rise; refused, the ledger would stay full for good.
#[test]
fn a_full_ledger_grants_the_event_that_holds_its_mark_back() {
    let mut m = holding(3);
    let ix = Index::default();
    let q = queue(&[("oldest", T - 50), ("newer", T - 10)]);
    let _ = m.owed(&q, true, (Some(&ix), 0), NOBODY);
    let mut take = |id: &str, p: u64| {
        m.take(
            (id, Some(p)),
            true,
            T,
            (Some(&ix), true),
            NOBODY,
            "us",
            Some("tok-us"),
        )
    };
    assert!(matches!(take("oldest", T - 50), TakeStep::Record(_)));
    assert_eq!(
        take("newer", T - 10),
        TakeStep::Answer(TakeOutcome::LedgerFull)
    );
}

/// A full ledger takes no new take (its settles still go in); what is
/// answered or taken already is answered as before.
#[test]
fn a_full_ledger_refuses_new_takes_only() {
    let m = holding(3);
    let ix = index(&[take_op("mine", 3, "tok-us")]);
    let take = |id: &str| {
        (m.clone()).take(
            (id, None),
            true,
            T,
            (Some(&ix), true),
            NOBODY,
            "us",
            Some("tok-us"),
        )
    };
    assert_eq!(take("new"), TakeStep::Answer(TakeOutcome::LedgerFull));
    assert_eq!(take("mine"), TakeStep::Answer(TakeOutcome::AlreadyTaken));
    let mut s = m.clone();
    let settled = s.settle("mine", Some("tok-us"), true, Settle::Done, T, Some(&ix));
    assert!(matches!(settled, SettleStep::Record(_)));
}
