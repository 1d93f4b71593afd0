//! The outbox's rules, with no etcd: each test plays etcd's answers.

use super::*;
use crate::global::etcd::{EtcdError, Kv};

const TTL: Duration = Duration::from_secs(3);

fn times() -> Times {
    Times {
        ttl: TTL,
        retention: Duration::from_secs(60),
        retry: Duration::from_millis(150),
    }
}

fn pk() -> AgentPubkey {
    AgentPubkey::parse(&"ab".repeat(32)).unwrap()
}

const HELD: Fence = Fence {
    revision: 10,
    held_lease: Some(7),
};

/// Answers the calls of `scope` with `answer` until none is left; returns
/// the calls made.
fn drain(
    o: &mut WorkOutbox,
    now: Instant,
    scope: Scope,
    mut answer: impl FnMut(&WorkCall) -> Answer,
) -> Vec<WorkCall> {
    let mut calls = Vec::new();
    while let Some(c) = o.next(now, &times(), scope, |_| Some(HELD)) {
        assert!(calls.len() < 100, "no end: {calls:?}");
        let a = answer(&c);
        calls.push(c.clone());
        o.answered(c, a, now, &times());
    }
    calls
}

fn ok(call: &WorkCall) -> Answer {
    match call {
        WorkCall::GrantTakeLease | WorkCall::GrantDoneLease(_) => Answer::Granted(Ok((42, TTL))),
        WorkCall::Take { .. } => Answer::Txn(Ok(Txn::Done(11)), false),
        WorkCall::ReadTake { .. } => Answer::Read(Ok(None)),
        WorkCall::Done { .. } => Answer::Put(Ok(())),
        WorkCall::GiveBack { .. } => Answer::Deleted(Ok(true)),
        WorkCall::RenewTakes(_) => Answer::Renewed(Ok(TTL)),
    }
}

fn down(call: &WorkCall) -> Answer {
    let e = || EtcdError::unreachable("down");
    match call {
        WorkCall::GrantTakeLease | WorkCall::GrantDoneLease(_) => Answer::Granted(Err(e())),
        WorkCall::Take { .. } => Answer::Txn(Err(e()), false),
        WorkCall::ReadTake { .. } => Answer::Read(Err(e())),
        WorkCall::Done { .. } => Answer::Put(Err(e())),
        WorkCall::GiveBack { .. } => Answer::Deleted(Err(e())),
        WorkCall::RenewTakes(_) => Answer::Renewed(Err(e())),
    }
}

#[test]
fn a_granted_take_is_sent_at_once_fenced_by_the_hold_on_a_lease_of_ours() {
    let mut o = WorkOutbox::default();
    let now = Instant::now();
    o.took(pk(), "e1".into());
    let calls = drain(&mut o, now, Scope::Fresh, ok);
    assert_eq!(
        calls,
        [
            WorkCall::GrantTakeLease,
            WorkCall::Take {
                pk: pk(),
                id: "e1".into(),
                fence: Some(HELD),
                lease: 42
            }
        ]
    );
    assert_eq!(o.mine.get(&(pk(), "e1".into())), Some(&11));
    assert!(o.sent(&pk()));
}

#[test]
fn what_etcd_did_not_take_waits_in_order_and_a_hand_over_waits_for_it() {
    let mut o = WorkOutbox::default();
    let now = Instant::now();
    o.took(pk(), "e1".into());
    o.took(pk(), "e2".into());
    drain(&mut o, now, Scope::Fresh, down);
    assert!(!o.sent(&pk()), "a hand-over waits");
    assert_eq!(o.untaken.len(), 2);
    // Within the retry wait nothing goes, after it the oldest first.
    assert_eq!(drain(&mut o, now, Scope::All, ok), []);
    let later = now + times().retry;
    let calls = drain(&mut o, later, Scope::All, ok);
    let ids: Vec<&str> = calls
        .iter()
        .filter_map(|c| match c {
            WorkCall::Take { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["e1", "e2"]);
    assert!(o.sent(&pk()));
}

#[test]
fn a_take_whose_create_failed_is_read_back_and_kept_if_ours() {
    let mut o = WorkOutbox::default();
    let now = Instant::now();
    o.took(pk(), "e1".into());
    let calls = drain(&mut o, now, Scope::Fresh, |c| match c {
        WorkCall::Take { .. } => Answer::Txn(Ok(Txn::Failed(None)), false),
        WorkCall::ReadTake { .. } => Answer::Read(Ok(Some(ReadBack {
            ours: true,
            lease: 42,
            revision: 9,
        }))),
        c => ok(c),
    });
    assert!(matches!(calls.last(), Some(WorkCall::ReadTake { .. })));
    assert_eq!(o.mine.get(&(pk(), "e1".into())), Some(&9), "tracked");
}

#[test]
fn our_own_later_rewrite_of_the_key_fences_the_take_again() {
    let mut o = WorkOutbox::default();
    let now = Instant::now();
    o.took(pk(), "e1".into());
    let kv = Kv {
        key: "leader".into(),
        value: Vec::new(),
        mod_revision: 12,
        lease: 7,
    };
    let (mut learnt, mut takes) = (Vec::new(), 0);
    while let Some(c) = o.next(now, &times(), Scope::Fresh, |_| Some(HELD)) {
        let a = match &c {
            WorkCall::Take { .. } if takes == 0 => {
                takes += 1;
                Answer::Txn(Ok(Txn::Failed(Some(kv.clone()))), true)
            }
            c => ok(c),
        };
        learnt.extend(o.answered(c, a, now, &times()));
    }
    assert!(learnt.contains(&Learnt::Refence {
        pk: pk(),
        revision: 12
    }));
    assert!(o.mine.contains_key(&(pk(), "e1".into())), "sent again");
}

/// Two takes recorded, then the first done and the second given back.
fn one_done_one_given_back() -> (WorkOutbox, Instant) {
    let mut o = WorkOutbox::default();
    let now = Instant::now();
    o.took(pk(), "e1".into());
    o.took(pk(), "e2".into());
    drain(&mut o, now, Scope::Fresh, ok);
    o.settled(pk(), "e1".into(), true);
    o.settled(pk(), "e2".into(), false);
    (o, now)
}

#[test]
fn a_done_goes_on_a_retention_lease_and_a_give_back_deletes_our_record() {
    let (mut o, now) = one_done_one_given_back();
    let calls = drain(&mut o, now, Scope::Sends, ok);
    assert!(matches!(calls[0], WorkCall::GrantDoneLease(d) if d == Duration::from_secs(90)));
    assert!(matches!(&calls[1], WorkCall::Done { id, lease: 42, .. } if id == "e1"));
    assert!(matches!(&calls[2], WorkCall::GiveBack { id, revision: 11, .. } if id == "e2"));
    assert!(o.mine.is_empty() && o.sent(&pk()));
}

#[test]
fn an_expired_take_lease_writes_every_open_take_again() {
    let mut o = WorkOutbox::default();
    let now = Instant::now();
    o.took(pk(), "e1".into());
    drain(&mut o, now, Scope::Fresh, ok);
    let due = o.due().expect("the renewal is due some time");
    assert_eq!(due, now + TTL / 3);
    let calls = drain(&mut o, due, Scope::All, |c| match c {
        WorkCall::RenewTakes(_) => Answer::Renewed(Ok(Duration::ZERO)),
        c => ok(c),
    });
    assert_eq!(calls[0], WorkCall::RenewTakes(42));
    assert_eq!(calls[1], WorkCall::GrantTakeLease, "a new lease");
    assert!(matches!(&calls[2], WorkCall::Take { id, .. } if id == "e1"));
    assert!(o.mine.contains_key(&(pk(), "e1".into())));
}

#[test]
fn shutting_down_sends_the_dones_only_then_gives_the_take_lease_up() {
    let (mut o, now) = one_done_one_given_back();
    o.hurry();
    let calls = drain(&mut o, now, Scope::Dones, ok);
    assert!(calls
        .iter()
        .all(|c| matches!(c, WorkCall::GrantDoneLease(_) | WorkCall::Done { .. })));
    assert_eq!(o.give_up(), Some(42));
    assert!(o.sent(&pk()), "nothing else is owed");
}
