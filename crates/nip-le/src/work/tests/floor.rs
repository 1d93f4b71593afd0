//! The floor a writer without a ledger leaves, for every later holder.

use super::*;

#[test]
fn a_ledgerless_writers_floor_binds_every_later_holder() {
    // Queued at our first look, after a harness's record at T: published
    // before we led (a sender's clock 3 ms behind ours, say), and since.
    let q = queue(&[("before", T - 5), ("behind", T - 3), ("after", T + 5)]);
    let mut first = machine();
    over_harness(&mut first, 2, T, Some(&Index::default()), NOBODY);
    let ix = Index::default();
    assert_eq!(first.floor_line(&ix, "us", T), None, "no look yet");
    assert_eq!(first.owed(&q, true, (Some(&ix), 0), NOBODY), ["after"]);
    // The floor is what the look left out, in the senders' clocks (ours
    // may have stepped).
    let want = Op::Floor {
        epoch: 2,
        by: "us".into(),
        before_ms: T - 2,
        at_ms: T + 1,
    };
    assert_eq!(first.floor_line(&ix, "us", T + 1), Some(want.clone()));
    let ix = index(&[want]);
    assert_eq!(first.floor_line(&ix, "us", T + 2), None, "written once");
    // Queued later with a time before the floor: ours to answer, and in
    // the ledger once taken.
    let late = queue(&[("before", T - 5), ("late", T - 4), ("after", T + 5)]);
    assert_eq!(
        first.owed(&late, true, (Some(&ix), 0), NOBODY),
        ["late", "after"]
    );
    // The next holder's ledger covers us, not the harness: it owes what
    // the first look left out no more than we did (the simulator: 1,601 in
    // 3,000 seeds answered after a writer without a ledger, though
    // published before it was replaced; 366 with the floor line).
    let mut next = holding(3);
    assert_eq!(next.owed(&q, true, (Some(&ix), 0), NOBODY), ["after"]);
    assert_eq!(next.floor_line(&ix, "us", T), None, "no floor of its own");
    // Nothing queued before we led: no floor.
    let mut empty = machine();
    over_harness(&mut empty, 2, T, Some(&Index::default()), NOBODY);
    let _ = empty.owed(&queue(&[("after", T + 5)]), true, (Some(&ix), 0), NOBODY);
    assert_eq!(empty.floor_line(&Index::default(), "us", T), None);
}

#[test]
fn a_lock_holder_without_an_epoch_owes_what_a_ledger_keeper_left_and_grants_only_written() {
    // Our records carry no epoch (no presence: a full disk kept us from
    // creating it), and we took the lock from a holder that keeps this
    // ledger: it covers that holder, so the backlog is owed.
    let q = queue(&[("before", T - 5), ("after", T + 5)]);
    let ix = Index::default();
    let mut m = machine();
    m.replaced(None, Displaced::Token(Some("tok-old".into())));
    m.holds(true);
    assert_eq!(m.lead(T, true, None, true), Lead::OpenFailSafe);
    assert_eq!(
        m.owed(&q, true, (Some(&ix), 0), NOBODY),
        ["before", "after"]
    );
    // The one holder: a take the disk refused is not granted.
    let (out, _) = m.take_written("before", false);
    assert_eq!(out, TakeOutcome::Unavailable);
    // After a writer without a ledger, only what was published since we
    // led; and so for the fail-safe's leaders (the lock file cannot be
    // read or locked: whoever held is unknown), whose refused takes are
    // granted past the stale bound (the agent is never silenced).
    let mut m = machine();
    m.replaced(Some("harness".into()), Displaced::Token(None));
    m.holds(true);
    let _ = m.lead(T, true, None, true);
    assert_eq!(m.owed(&q, true, (Some(&ix), 0), NOBODY), ["after"]);
    let mut m = machine();
    let _ = m.lead(T, true, None, false);
    assert_eq!(m.owed(&q, true, (Some(&ix), 0), NOBODY), ["after"]);
    let (out, _) = m.take_written("after", false);
    assert_eq!(out, TakeOutcome::Granted { epoch: None });
}
