//! What a window holds in hand: a take granted stays its own until it is
//! settled, whatever the ledger can show, and the hand is bounded.

use super::super::MAX_OPEN_TAKES;
use super::*;

/// A take of `id` by us at `at`, the ledger unreadable.
fn take_unread(m: &mut WorkMachine, id: &str, at: u64) -> TakeStep {
    m.take(
        (id, None),
        true,
        at,
        (None, false),
        NOBODY,
        "us",
        Some("tok-us"),
    )
}

#[test]
fn a_grant_stays_in_hand_until_settled_and_its_done_is_written_even_unrecorded() {
    let stale_ms = STALE.as_millis() as u64;
    let later = T + stale_ms + 1;
    let mut m = machine();
    let _ = m.lead(T, true, None, false);
    // The ledger unreadable: granted unrecorded, once.
    let first = take_unread(&mut m, "e", later);
    assert_eq!(
        first,
        TakeStep::Answer(TakeOutcome::Granted { epoch: None })
    );
    let second = take_unread(&mut m, "e", later);
    assert_eq!(second, TakeStep::Answer(TakeOutcome::AlreadyTaken));
    let q = queue(&[("e", T + 1)]);
    assert!(m.owed(&q, true, (None, 0), NOBODY).is_empty(), "in hand");
    // Its `done` goes in the ledger though no take line shows it.
    let out = m.settle("e", Some("tok-us"), true, Settle::Done, later, None);
    assert_eq!(
        out,
        SettleStep::Outside {
            anyway: true,
            done_anyway: true
        }
    );
    let ix = Index::default();
    let line = settle_line(&ix, "e", Some("tok-us"), Settle::Done, later, true);
    assert_eq!(line, Some(Settle::Done.op("e", 0, later)));
    assert_eq!(
        settle_line(&ix, "e", Some("tok-us"), Settle::GiveBack, later, true),
        None
    );
    // Settled: no longer in hand.
    let third = take_unread(&mut m, "e", later);
    assert_eq!(
        third,
        TakeStep::Answer(TakeOutcome::Granted { epoch: None })
    );
    // Bounded: past the bound a take is refused, and nothing in hand is
    // forgotten (a turn still running stays this window's alone).
    let take = take_unread;
    for i in 1..MAX_OPEN_TAKES {
        let x = format!("x{i}");
        let granted = TakeStep::Answer(TakeOutcome::Granted { epoch: None });
        assert_eq!(take(&mut m, &x, later), granted, "{x}");
    }
    assert_eq!(m.in_hand_len(), MAX_OPEN_TAKES);
    let over = TakeStep::Answer(TakeOutcome::TooManyOpen);
    assert_eq!(take(&mut m, "one-more", later), over);
    assert_eq!(
        take(&mut m, "e", later),
        TakeStep::Answer(TakeOutcome::AlreadyTaken)
    );
    // A settle makes room.
    let _ = m.settle("x1", None, true, Settle::Done, later, None);
    let granted = take(&mut m, "one-more", later);
    assert_eq!(
        granted,
        TakeStep::Answer(TakeOutcome::Granted { epoch: None })
    );
}

#[test]
fn a_recorded_take_the_ledger_no_longer_shows_as_ours_is_not_in_hand() {
    // The model check: we took `e` at epoch 3 and hung; the takeover gave
    // it back on our behalf (and a later holder may have taken it); we
    // woke fenced and lead again at 5: `e` is owed to us, not "in hand".
    let mut m = holding(3);
    let TakeStep::Record(lines) = m.take(
        ("e", None),
        true,
        T,
        (Some(&Index::default()), false),
        NOBODY,
        "us",
        None,
    ) else {
        panic!("owed: a line first");
    };
    let _ = m.take_written("e", true);
    let mut ix = index(&lines);
    let q = queue(&[("e", T + 1)]);
    assert!(
        m.owed(&q, true, (Some(&ix), 0), NOBODY).is_empty(),
        "in hand"
    );
    ix.apply(&Settle::GiveBack.op("e", 3, T));
    assert_eq!(
        m.owed(&q, true, (Some(&ix), 0), NOBODY),
        ["e"],
        "given back for us"
    );
    ix.apply(&take_op("e", 4, "tok-b"));
    assert_eq!(m.lead(T, false, None, false), Lead::Forget);
    assert_eq!(m.lead(T, true, Some(5), true), Lead::Open { epoch: 5 });
    let _ = m.opened(Some(&ix), NOBODY, T);
    assert_eq!(
        m.owed(&q, true, (Some(&ix), 0), NOBODY),
        ["e"],
        "its taker died"
    );
    assert!(matches!(
        take(&m, "e", Some(&ix), NOBODY),
        TakeStep::Record(_)
    ));
    // An unrecorded grant stays in hand whatever the ledger shows.
    let mut f = machine();
    let _ = f.lead(T, true, None, false);
    let later = T + STALE.as_millis() as u64 + 1;
    let _ = f.take(("g", None), true, later, (None, false), NOBODY, "us", None);
    let given = index(&[take_op("g", 1, "x"), Settle::GiveBack.op("g", 1, T)]);
    let q = queue(&[("g", later)]);
    assert!(f.owed(&q, true, (Some(&given), 0), NOBODY).is_empty());
}
