//! Unit tests of the work rules, one per rule (the holes the rules closed
//! are named where they were found).

use std::sync::Arc;
use std::time::Duration;

use super::MAX_DONES_AGAIN;
use super::*;
use crate::elector::types::{QueuedEvent, TakeOutcome};
use crate::ledger::{Index, Op};

mod bound;
mod floor;
mod global_view;
mod in_hand;

const STALE: Duration = Duration::from_secs(10);
const T: u64 = 1_000_000;

fn machine() -> WorkMachine {
    WorkMachine::new(true, STALE)
}

fn index(ops: &[Op]) -> Index {
    let mut ix = Index::default();
    for op in ops {
        ix.apply(op);
    }
    ix
}

fn take_op(id: &str, epoch: u64, live: &str) -> Op {
    Op::Take {
        id: id.into(),
        epoch,
        by: "x".into(),
        at_ms: T,
        live: Some(live.into()),
        pub_ms: None,
    }
}

fn queue(ids: &[(&str, u64)]) -> Vec<QueuedEvent> {
    (ids.iter())
        .map(|(id, p)| QueuedEvent {
            id: (*id).into(),
            published_ms: Some(*p),
        })
        .collect()
}

/// A take of `id` at `at` by window `by` (presence token `tok-<by>`), the
/// ledger `ix` read and not full.
fn take_as(
    m: &mut WorkMachine,
    by: &str,
    id: &str,
    at: u64,
    ix: &Index,
    alive: &dyn Fn(&str) -> bool,
) -> TakeStep {
    let token = format!("tok-{by}");
    m.take(
        (id, None),
        true,
        at,
        (Some(ix), false),
        alive,
        by,
        Some(&token),
    )
}

const NOBODY: &dyn Fn(&str) -> bool = &|_| false;
const EVERYONE: &dyn Fn(&str) -> bool = &|_| true;

/// `m` holds at `epoch`, gained by a hand-over (not a takeover).
fn holding(epoch: u64) -> WorkMachine {
    let mut m = machine();
    assert_eq!(m.lead(T, true, Some(epoch), false), Lead::Open { epoch });
    assert!(m.opened(Some(&Index::default()), NOBODY, T).is_empty());
    m
}

/// `m` takes the lock over at `epoch`, at `at`, from the record of a
/// writer without an epoch ("harness"), and opens the ledger `ix`.
fn over_harness(
    m: &mut WorkMachine,
    epoch: u64,
    at: u64,
    ix: Option<&Index>,
    takes_part: &dyn Fn(&str) -> bool,
) {
    m.replaced(Some("harness".into()), Displaced::Token(None));
    let _ = m.lead(at, true, Some(epoch), true);
    let _ = m.opened(ix, takes_part, at);
}

fn take(m: &WorkMachine, id: &str, ix: Option<&Index>, alive: &dyn Fn(&str) -> bool) -> TakeStep {
    // On a copy: a grant without a line would put it in hand.
    m.clone().take(
        (id, None),
        true,
        T,
        (ix, false),
        alive,
        "us",
        Some("tok-us"),
    )
}

#[test]
fn a_take_is_granted_only_once_its_line_is_on_disk() {
    let mut m = holding(3);
    let ix = Index::default();
    let TakeStep::Record(lines) = take(&m, "a", Some(&ix), NOBODY) else {
        panic!("owed: a line to write");
    };
    assert_eq!(
        lines,
        [{
            let mut o = take_op("a", 3, "tok-us");
            if let Op::Take { by, .. } = &mut o {
                *by = "us".into();
            }
            o
        }]
    );
    assert_eq!(
        m.take_written("a", false),
        (TakeOutcome::Unavailable, Spell::Began)
    );
    assert_eq!(
        m.take_written("a", false),
        (TakeOutcome::Unavailable, Spell::Same)
    );
    let granted = TakeOutcome::Granted { epoch: Some(3) };
    assert_eq!(m.take_written("a", true), (granted, Spell::Ended));
    assert_eq!(m.take_written("a", true), (granted, Spell::Same));
}

#[test]
fn verdicts_answer_without_a_line() {
    let m = holding(3);
    let ix = index(&[
        take_op("now", 3, "tok-us"),
        take_op("old", 2, "tok-old"),
        Op::Done {
            id: "done".into(),
            epoch: 1,
            at_ms: T,
            pub_ms: None,
        },
    ]);
    let answer = |id, alive| match take(&m, id, Some(&ix), alive) {
        TakeStep::Answer(out) => Some(out),
        TakeStep::Record(_) => None,
    };
    assert_eq!(answer("now", NOBODY), Some(TakeOutcome::AlreadyTaken));
    assert_eq!(answer("done", NOBODY), Some(TakeOutcome::Done));
    // A hand-over's predecessor: its take is in flight while it lives.
    assert_eq!(answer("old", EVERYONE), Some(TakeOutcome::AlreadyTaken));
    assert_eq!(answer("old", NOBODY), None, "its taker is gone: owed");
    let not = m.clone().take(
        ("a", None),
        false,
        T,
        (Some(&ix), false),
        NOBODY,
        "us",
        None,
    );
    assert_eq!(not, TakeStep::Answer(TakeOutcome::NotLeader));
}

#[test]
fn a_takeover_owes_the_displaced_holders_takes_and_no_one_elses() {
    // Found by the model check: a former holder handed over mid-turn, its
    // heir hung and was taken over; every live take was owed, so the
    // former holder's reply and ours both went out.
    let ix = index(&[take_op("handed", 2, "tok-a"), take_op("hung", 3, "tok-b")]);
    let mut m = machine();
    m.replaced(None, Displaced::Token(Some("tok-b".into())));
    assert_eq!(m.lead(T, true, Some(4), true), Lead::Open { epoch: 4 });
    let given = m.opened(Some(&ix), NOBODY, T);
    // The hung holder's takes are given back for it: owed to every later
    // holder too (the model check: the one that took over died before it
    // took them, and the next left them to the hung holder).
    assert_eq!(given, vec![Settle::GiveBack.op("hung", 3, T)]);
    assert!(matches!(
        take(&m, "hung", Some(&ix), EVERYONE),
        TakeStep::Record(_)
    ));
    let handed = take(&m, "handed", Some(&ix), EVERYONE);
    assert_eq!(handed, TakeStep::Answer(TakeOutcome::AlreadyTaken));
    let owed = m.owed(
        &queue(&[("handed", 1), ("hung", 1)]),
        true,
        (Some(&ix), 0),
        EVERYONE,
    );
    assert_eq!(owed, ["hung"]);

    // A record that could not be read: any live take may be the holder's.
    let mut m = machine();
    m.replaced(None, Displaced::Unknown);
    let _ = m.lead(T, true, Some(4), true);
    assert!(
        m.opened(Some(&ix), NOBODY, T).is_empty(),
        "nothing given back blind"
    );
    let owed = m.owed(
        &queue(&[("handed", 1), ("hung", 1)]),
        true,
        (Some(&ix), 0),
        EVERYONE,
    );
    assert_eq!(owed, ["handed", "hung"]);

    // A hand-over displaces nobody.
    let mut m = machine();
    m.replaced(None, Displaced::Token(Some("tok-b".into())));
    let _ = m.lead(T, true, Some(4), false);
    assert!(m.opened(Some(&ix), NOBODY, T).is_empty());
    let owed = m.owed(
        &queue(&[("handed", 1), ("hung", 1)]),
        true,
        (Some(&ix), 0),
        EVERYONE,
    );
    assert!(owed.is_empty());
}

#[test]
fn an_unreadable_ledger_or_no_epoch_waits_a_stale_bound_then_grants_unrecorded() {
    let stale_ms = STALE.as_millis() as u64;
    let m = holding(3);
    let at = |ms| {
        m.clone()
            .take(("a", None), true, ms, (None, false), NOBODY, "us", None)
    };
    assert_eq!(at(T), TakeStep::Answer(TakeOutcome::Unavailable));
    let granted = TakeOutcome::Granted { epoch: Some(3) };
    assert_eq!(at(T + stale_ms + 1), TakeStep::Answer(granted));
    // The fail-safe leader: no epoch, its ledger unreadable.
    let mut m = machine();
    assert_eq!(m.lead(T, true, None, false), Lead::OpenFailSafe);
    let at = |ms| {
        m.clone()
            .take(("a", None), true, ms, (None, false), NOBODY, "us", None)
    };
    assert_eq!(at(T), TakeStep::Answer(TakeOutcome::Unavailable));
    let unrecorded = TakeOutcome::Granted { epoch: None };
    assert_eq!(at(T + stale_ms + 1), TakeStep::Answer(unrecorded));
    // Spec mode keeps no ledger: granted at once, unrecorded.
    let mut m = WorkMachine::new(false, STALE);
    assert_eq!(m.lead(T, true, Some(3), false), Lead::Forget);
    let t = m
        .clone()
        .take(("a", None), true, T, (None, false), NOBODY, "us", None);
    assert_eq!(t, TakeStep::Answer(unrecorded));
}

#[test]
fn a_settle_is_the_takers_at_its_epoch_or_the_leaders_done() {
    let m = holding(5);
    let ix = index(&[
        take_op("ours-old", 2, "tok-us"),
        take_op("theirs", 2, "tok-b"),
    ]);
    let settle = |id, token, leads, what| m.clone().settle(id, token, leads, what, T, Some(&ix));
    // Ours, at the epoch of the take (fence the take, not the done).
    let line = settle("ours-old", Some("tok-us"), false, Settle::Done);
    assert_eq!(line, SettleStep::Record(Settle::Done.op("ours-old", 2, T)));
    // Another window's take: not ours to end, unless we lead and replied.
    let refused = settle("theirs", Some("tok-us"), false, Settle::GiveBack);
    assert_eq!(refused, SettleStep::Answer(false));
    let led = settle("theirs", Some("tok-us"), true, Settle::Done);
    assert_eq!(led, SettleStep::Record(Settle::Done.op("theirs", 5, T)));
    let no = settle("theirs", Some("tok-us"), true, Settle::GiveBack);
    assert_eq!(no, SettleStep::Answer(false));
    // Not holding: through the refused-lines store, at the take's epoch.
    let mut m = holding(5);
    let _ = m.lead(T, false, None, false);
    let out = m.settle(
        "ours-old",
        Some("tok-us"),
        false,
        Settle::Done,
        T,
        Some(&ix),
    );
    assert_eq!(
        out,
        SettleStep::Outside {
            anyway: false,
            done_anyway: false
        }
    );
    let line = settle_line(&ix, "ours-old", Some("tok-us"), Settle::Done, T, false);
    assert_eq!(line, Some(Settle::Done.op("ours-old", 2, T)));
    assert_eq!(
        settle_line(&ix, "theirs", Some("tok-us"), Settle::Done, T, false),
        None
    );
    // Spec mode: accepted while leading.
    let mut m = WorkMachine::new(false, STALE);
    let spec = m.settle("x", None, true, Settle::Done, T, None);
    assert_eq!(spec, SettleStep::Answer(true));
}

#[test]
fn a_predecessor_without_a_ledger_leaves_only_what_was_published_since() {
    let q = queue(&[("before", T - 5), ("after", T + 5)]);
    // A writer without an epoch that no `held` line names, not in the
    // election now: the harness, or spec mode.
    let mut m = machine();
    over_harness(&mut m, 2, T, Some(&Index::default()), NOBODY);
    assert_eq!(
        m.owed(&q, true, (Some(&Index::default()), 0), NOBODY),
        ["after"]
    );
    // A window that keeps the ledger (its child wrote that record).
    let kept = index(&[Op::Held {
        epoch: 0,
        by: "harness".into(),
        at_ms: T,
    }]);
    let mut m = machine();
    over_harness(&mut m, 2, T, Some(&kept), NOBODY);
    assert_eq!(
        m.owed(&q, true, (Some(&kept), 0), NOBODY),
        ["before", "after"]
    );
    // One that takes part in the election now.
    let mut m = machine();
    over_harness(&mut m, 2, T, Some(&Index::default()), &|by| by == "harness");
    let all = m.owed(&q, true, (Some(&Index::default()), 0), NOBODY);
    assert_eq!(all, ["before", "after"]);
    // Our own ledger unreadable: only what was published since we led.
    assert_eq!(m.owed(&q, true, (None, 0), NOBODY), ["after"]);
    assert!(
        m.owed(&q, false, (None, 0), NOBODY).is_empty(),
        "not leading"
    );
}

#[test]
fn what_is_queued_after_we_lead_is_owed_whatever_its_published_time() {
    // Our clock stepped ahead (or a sender's runs behind): a mention that
    // arrives after we led carries a time before it.
    let mut m = machine();
    over_harness(&mut m, 2, T, Some(&Index::default()), NOBODY);
    let ix = Index::default();
    let first = queue(&[("before", T - 5)]);
    assert!(m.owed(&first, true, (Some(&ix), 0), NOBODY).is_empty());
    let later = queue(&[("before", T - 5), ("late-clock", T - 3), ("after", T + 5)]);
    assert_eq!(
        m.owed(&later, true, (Some(&ix), 0), NOBODY),
        ["late-clock", "after"],
        "queued since the first look: owed (seed 48)"
    );
    // A gain from a host whose work is unknown since T + 4: what it
    // received before then it may have answered, queued here late or not.
    m.heard_global(None, false, Some(T + 4), false);
    let gain = queue(&[("late-clock", T - 3), ("there", T + 3), ("after", T + 5)]);
    assert_eq!(m.owed(&gain, true, (Some(&ix), 0), NOBODY), ["after"]);
    // Lost, and led again after a ledgerless writer: a new first look.
    let _ = m.lead(T + 10, false, None, false);
    over_harness(&mut m, 3, T + 10, Some(&ix), NOBODY);
    assert!(m.owed(&later, true, (Some(&ix), 0), NOBODY).is_empty());
}

#[test]
fn before_a_ledgerless_floor_our_windows_unanswered_takes_are_owed() {
    // Taken by a window now gone, given back, taken by one that lives,
    // and never taken: all published before we led.
    let ix = index(&[
        take_op("gone", 1, "tok-gone"),
        take_op("back", 1, "tok-back"),
        Op::GiveBack {
            id: "back".into(),
            epoch: 1,
            at_ms: T - 2,
        },
        take_op("live", 1, "tok-live"),
    ]);
    let lives = |t: &str| t == "tok-live";
    let q = queue(&[
        ("gone", T - 5),
        ("back", T - 5),
        ("live", T - 5),
        ("never", T - 5),
    ]);
    let mut m = machine();
    over_harness(&mut m, 2, T, Some(&ix), NOBODY);
    assert_eq!(
        m.owed(&q, true, (Some(&ix), 0), &lives),
        ["gone", "back"],
        "in our windows' hands and not answered (seed 2946)"
    );
    // Before another host's unknown start, that host may have answered
    // them: left out all the same.
    m.heard_global(None, false, Some(T - 1), false);
    assert!(m.owed(&q, true, (Some(&ix), 0), &lives).is_empty());
}

#[test]
fn leaving_gives_back_the_takes_of_our_epoch_and_of_our_token() {
    let m = holding(4);
    let ix = index(&[
        take_op("b", 4, "tok-us"),
        take_op("a", 4, "tok-us"),
        take_op("c", 3, "x"),
    ]);
    let ops = m.end_takes(Some(&ix), None, T);
    let want: Vec<Op> = ["a", "b"]
        .iter()
        .map(|id| Settle::GiveBack.op(id, 4, T))
        .collect();
    assert_eq!(ops, want);
    assert!(
        machine().end_takes(Some(&ix), None, T).is_empty(),
        "not holding"
    );
    // Ours at any epoch by our token: a fail-safe leader's at epoch 0.
    let ix = index(&[
        take_op("a", 0, "tok-us"),
        take_op("b", 2, "tok-us"),
        take_op("c", 3, "x"),
    ]);
    let ops = machine().end_takes(Some(&ix), Some("tok-us"), T);
    let want = vec![
        Settle::GiveBack.op("a", 0, T),
        Settle::GiveBack.op("b", 2, T),
    ];
    assert_eq!(ops, want, "not holding, our token's takes");
}

#[test]
fn hostile_ledger_values_are_kept_out_of_decisions() {
    let ix = index(&[take_op("a", u64::MAX - 1, "t")]);
    assert_eq!(epoch_floor(&ix), None, "no epoch would be left to issue");
    assert_eq!(epoch_floor(&index(&[take_op("a", 7, "t")])), Some(7));
    assert_eq!(epoch_floor(&Index::default()), None);
    let kept = index(&[Op::Held {
        epoch: 5,
        by: "us".into(),
        at_ms: T,
    }]);
    assert_eq!(held_line(&kept, 5, "us", T), None);
    assert!(held_line(&kept, 6, "us", T).is_some());
}

#[test]
fn fail_safe_leaders_record_their_takes_and_leave_each_others() {
    // Found once the simulator's mentions carried real times: every
    // observer of a holder frozen inside its `flock` leads by the
    // fail-safe, and each answered the same mention (20 of 300 seeds).
    let stale_ms = STALE.as_millis() as u64;
    let later = T + stale_ms + 1;
    let mut a = machine();
    assert_eq!(a.lead(T, true, None, false), Lead::OpenFailSafe);
    assert_eq!(a.lead(T, true, None, false), Lead::Keep, "opened once");
    assert!(a.fail_safe());
    let mut ix = Index::default();
    let TakeStep::Record(lines) = take_as(&mut a, "a", "e", later, &ix, NOBODY) else {
        panic!("owed, past the stale bound: a line at epoch 0");
    };
    let [op] = &lines[..] else {
        panic!("one line: {lines:?}")
    };
    assert!(matches!(op, Op::Take { epoch: 0, .. }));
    assert_eq!(
        a.take_written("e", true).0,
        TakeOutcome::Granted { epoch: None }
    );
    ix.apply(op);
    // Another fail-safe leader, and a holder at an epoch: in flight.
    let mut b = machine();
    let _ = b.lead(T, true, None, false);
    let seen = take_as(&mut b, "b", "e", later, &ix, EVERYONE);
    assert_eq!(seen, TakeStep::Answer(TakeOutcome::AlreadyTaken));
    let q = queue(&[("e", T + 1)]);
    assert!(b.owed(&q, true, (Some(&ix), 0), EVERYONE).is_empty());
    let h = holding(7);
    assert_eq!(
        take(&h, "e", Some(&ix), EVERYONE),
        TakeStep::Answer(TakeOutcome::AlreadyTaken)
    );
    // Its taker gone: owed to either.
    assert_eq!(b.owed(&q, true, (Some(&ix), 0), NOBODY), ["e"]);
    // And the taker's own second ask: in hand.
    let again = take_as(&mut a, "a", "e", later, &ix, NOBODY);
    assert_eq!(again, TakeStep::Answer(TakeOutcome::AlreadyTaken));
}

#[test]
fn a_fail_safe_take_of_a_gone_takers_event_supersedes_its_higher_epoch() {
    // The simulator, a day at a million mentions (seed 1, 29,080 s): a
    // holder at epoch 1201 took `e` and was killed; two windows led by the
    // fail-safe once the disk took writes again; each found `e` owed (its
    // taker gone) and wrote its take at epoch 0, which the index ignores
    // below a take at 1201: neither saw the other's take, nor its own (so
    // not in hand), and both answered `e`.
    let later = T + STALE.as_millis() as u64 + 1;
    let mut ix = index(&[take_op("e", 1201, "tok-gone")]);
    let alive_a = |t: &str| t == "tok-a";
    let mut a = machine();
    let _ = a.lead(T, true, None, false);
    let TakeStep::Record(lines) = take_as(&mut a, "a", "e", later, &ix, &alive_a) else {
        panic!("owed: its taker is gone");
    };
    for op in &lines {
        ix.apply(op);
    }
    let _ = a.take_written("e", true);
    assert_eq!(ix.taker("e"), Some((0, Some("tok-a"))), "{lines:?}");
    let again = take_as(&mut a, "a", "e", later, &ix, &alive_a);
    assert_eq!(
        again,
        TakeStep::Answer(TakeOutcome::AlreadyTaken),
        "in hand"
    );
    let mut b = machine();
    let _ = b.lead(T, true, None, false);
    let seen = take_as(&mut b, "b", "e", later, &ix, &alive_a);
    assert_eq!(seen, TakeStep::Answer(TakeOutcome::AlreadyTaken));
    // A holder below a gone taker's epoch (not fenced yet) alike.
    let mut ix = index(&[take_op("f", 9, "tok-gone")]);
    let mut h = holding(7);
    let TakeStep::Record(lines) = take_as(&mut h, "h", "f", T, &ix, NOBODY) else {
        panic!("owed: its taker is gone");
    };
    for op in &lines {
        ix.apply(op);
    }
    assert_eq!(ix.taker("f"), Some((7, Some("tok-h"))), "{lines:?}");
}
