//! A key's moves decided from answers alone: each test drives a chain by
//! hand, answering every call it returns, on a task whose etcd would fail
//! any call made, and counts the calls made (none).

use super::super::calls::{Answered, KeyAnswer, KeyCall, Next, Then};
use super::super::entry::Entry;
use super::*;

/// A task leading its host for `pk()` (with the lock file), whose etcd
/// is cut; the count of calls it makes.
fn by_hand(etcd: &MemoryEtcd, clock: &ManualClock) -> (Host, Arc<AtomicUsize>) {
    let gw = Arc::new(Cut::on(etcd));
    gw.cut.store(true, Ordering::SeqCst);
    let (cut, calls) = (Arc::clone(&gw.cut), Arc::clone(&gw.calls));
    let mut h = Host::on(
        etcd,
        clock,
        "a",
        "a-window",
        WhenUnreachable::FallBack,
        gw,
        cut,
    );
    let mut e = Entry::new();
    (e.leads, e.locked) = (true, true);
    h.task.entries.insert(pk(), e);
    (h, calls)
}

fn answered(answer: KeyAnswer) -> Answered {
    Answered { answer, cluster: 0 }
}

/// The call `next` asks for, and where its chain goes on.
fn call(next: Next) -> (KeyCall, Then) {
    match next {
        Next::Call(c, then) => (c, then),
        Next::End => panic!("the chain ended; a call was due"),
    }
}

fn kv_of(host: &str, lease: i64, revision: u64) -> Kv {
    Kv {
        key: leader_key(),
        value: format!(r#"{{"host_id":"{host}","instance_id":"{host}-window"}}"#).into_bytes(),
        mod_revision: revision,
        lease,
    }
}

/// Hands `answer` to the decision `then`.
fn next(h: &mut Host, then: Then, answer: KeyAnswer) -> Next {
    h.task.resume(pk(), then, answered(answer))
}

/// Acquires the free key by hand, checking each call asked for: a lease
/// (7), the key created on it (at revision 42), the work records read,
/// then a claim waiting for whoever took the key looked for, before the
/// writer hears of the gain.
fn acquire_by_hand(h: &mut Host) {
    let (c, then) = call(h.task.acquire(pk(), false));
    assert_eq!(c, KeyCall::Grant);
    let (c, then) = call(next(h, then, KeyAnswer::Lease(Ok((7, TTL)))));
    assert_eq!(c, KeyCall::Create { lease: 7 });
    let (c, then) = call(next(h, then, KeyAnswer::Txn(Ok(Txn::Done(42)))));
    assert_eq!(c, KeyCall::ReadWork);
    assert!(h.news.lock().unwrap().is_empty(), "told before its records");
    let (c, then) = call(next(h, then, KeyAnswer::Records(Ok(vec![]))));
    assert_eq!(c, KeyCall::ReadClaim);
    assert!(matches!(next(h, then, KeyAnswer::Kv(Ok(None))), Next::End));
}

#[test]
fn a_free_key_is_acquired_call_by_call_from_the_answers_alone() {
    let (clock, etcd) = rig();
    let (mut h, calls) = by_hand(&etcd, &clock);
    acquire_by_hand(&mut h);
    let held = h.task.entries[&pk()].held().expect("held");
    assert_eq!((held.lease, held.revision), (7, 42));
    let news = std::mem::take(&mut *h.news.lock().unwrap());
    let gain = news.last().expect("told of the gain");
    assert_eq!(gain.reason, Some(ChangeReason::Acquired));
    assert_eq!(
        (gain.permit.state, gain.permit.lease),
        (PermitState::Held, 7)
    );
    assert!(gain.work.is_some(), "the records come with the gain");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a decision called etcd");
}

#[test]
fn a_create_another_host_won_revokes_its_lease_and_holds_nothing() {
    let (clock, etcd) = rig();
    let (mut h, calls) = by_hand(&etcd, &clock);
    let (_, then) = call(h.task.acquire(pk(), false));
    let (_, then) = call(next(&mut h, then, KeyAnswer::Lease(Ok((7, TTL)))));
    let theirs = kv_of("b", 9, 40);
    let failed = KeyAnswer::Txn(Ok(Txn::Failed(Some(theirs))));
    let (c, then) = call(next(&mut h, then, failed));
    assert_eq!(c, KeyCall::Revoke(7));
    // Whatever the revoke answers, the writer hears of the holder.
    let lost = KeyAnswer::Done(Err(EtcdError::unreachable("lost")));
    assert!(matches!(next(&mut h, then, lost), Next::End));
    let e = &h.task.entries[&pk()];
    assert!(e.held().is_none());
    assert_eq!(e.holder.as_ref().map(|h| h.host_id.as_str()), Some("b"));
    let news = h.news.lock().unwrap();
    assert_eq!(
        news.last().map(|n| n.permit.state),
        Some(PermitState::NotHeld)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[test]
fn an_answer_of_the_wrong_kind_is_a_failed_call_not_a_panic() {
    let (clock, etcd) = rig();
    let (mut h, _) = by_hand(&etcd, &clock);
    let (_, then) = call(h.task.acquire(pk(), false));
    // A lease was due; a TTL came.
    assert!(matches!(
        next(&mut h, then, KeyAnswer::Ttl(Ok(TTL))),
        Next::End
    ));
    let e = &h.task.entries[&pk()];
    assert!(e.held().is_none());
    let error = e.last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("a ttl answer where a lease one was due"),
        "{error}"
    );
    assert!(e.retry_at.is_some(), "tried again later");
}

#[test]
fn a_renewal_etcd_says_expired_loses_the_key_without_reading_it() {
    let (clock, etcd) = rig();
    let (mut h, calls) = by_hand(&etcd, &clock);
    acquire_by_hand(&mut h);
    let held = h.task.entries[&pk()].held().expect("held");
    let renewed = Then::Renewed {
        held,
        sent: clock.nanos(),
    };
    let expired = KeyAnswer::Ttl(Ok(Duration::ZERO));
    assert!(
        matches!(next(&mut h, renewed, expired), Next::End),
        "read the key of an expired lease"
    );
    assert!(h.task.entries[&pk()].held().is_none());
    let news = h.news.lock().unwrap();
    let last = news.last().expect("told");
    assert_eq!(
        (last.reason, last.permit.state),
        (Some(ChangeReason::Lost), PermitState::NotHeld)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
