//! The agent's work records in etcd (see `contender::work`): what one host
//! did reaches the host that gains the agent next.

use super::super::calls::KeyCall;
use super::*;

fn took(h: &mut Host, id: &str) {
    h.task.step(Some(Inbox::Took {
        pk: pk(),
        id: id.into(),
    }));
}

fn settled(h: &mut Host, id: &str, done: bool) {
    h.task.step(Some(Inbox::Settled {
        pk: pk(),
        id: id.into(),
        done,
    }));
}

fn names(set: &std::collections::BTreeSet<String>) -> Vec<&str> {
    set.iter().map(String::as_str).collect()
}

#[test]
fn the_host_that_gains_the_agent_knows_what_the_holder_did_and_what_its_windows_still_do() {
    let (clock, _etcd, mut a, mut b) = two_hosts(WhenUnreachable::FallBack);
    assert!(a.acts());
    took(&mut a, "m1");
    settled(&mut a, "m1", true);
    took(&mut a, "m2");
    took(&mut a, "m3");
    settled(&mut a, "m3", false);
    // a steps back (its window runs on): b takes the key at once and is
    // told m1 is done and m2 still in a's hands; m3 is owed again.
    a.lead(false, true);
    pump_all(&mut [&mut a, &mut b]);
    assert!(b.acts());
    let w = b.work.clone().expect("the gain carries the records");
    assert_eq!((names(&w.done), names(&w.taken)), (vec!["m1"], vec!["m2"]));
    // a's window goes: its open take goes with it, and b, which reads
    // again while another window's take is open, owes m2 within a TTL/3.
    a.task.give_up_all();
    clock.advance(TTL / 3);
    pump_all(&mut [&mut b]);
    let w = b.work.clone().unwrap();
    assert_eq!((names(&w.done), names(&w.taken)), (vec!["m1"], vec![]));
}

#[test]
fn a_hand_over_to_another_host_waits_until_etcd_has_the_holders_records() {
    let (clock, etcd, mut a, mut b) = two_hosts(WhenUnreachable::FallBack);
    // etcd refuses a's take and done records.
    a.cut.store(true, Ordering::SeqCst);
    took(&mut a, "m1");
    took(&mut a, "m2");
    settled(&mut a, "m2", true);
    a.cut.store(false, Ordering::SeqCst);
    assert!(etcd
        .range("/nip-le/", 100)
        .unwrap()
        .iter()
        .all(|kv| !kv.key.contains("/work/")));
    // b claims at once (a's retry is not due yet): a stands down, and the
    // key moves only once the records are in etcd.
    b.task.step(Some(Inbox::Claim(pk())));
    pump_all(&mut [&mut a, &mut b]);
    for _ in 0..5 {
        clock.advance(TTL / 20);
        pump_all(&mut [&mut a, &mut b]);
    }
    assert!(b.acts() && !a.acts());
    let w = b.work.clone().expect("the gain carries the records");
    assert_eq!((names(&w.done), names(&w.taken)), (vec!["m2"], vec!["m1"]));
}

#[test]
fn a_take_recorded_late_never_overwrites_a_done() {
    let (clock, _etcd, mut a, mut b) = two_hosts(WhenUnreachable::FallBack);
    // b did m1 (a done needs no hold), then a's take of m1 arrives late.
    settled(&mut b, "m1", true);
    took(&mut a, "m1");
    a.lead(false, true);
    clock.advance(TTL / 20);
    pump_all(&mut [&mut a, &mut b]);
    assert!(b.acts());
    let w = b.work.clone().unwrap();
    assert_eq!((names(&w.done), names(&w.taken)), (vec!["m1"], vec![]));
}

#[test]
fn a_holder_whose_records_cannot_be_read_owes_nothing_until_they_are() {
    let (clock, _etcd, mut a, _b) = two_hosts(WhenUnreachable::FallBack);
    // A gain whose range read fails says so; the next read (soon) clears it.
    let news = std::mem::take(&mut *a.news.lock().unwrap());
    assert!(news.iter().all(|n| !n.work_unread), "read at the gain");
    a.cut.store(true, Ordering::SeqCst);
    assert!(a.task.entries[&pk()].held().is_some());
    let read = a.task.ask_key(pk(), &KeyCall::ReadWork).answer.records();
    assert!(a.task.work_read(pk(), read).is_none());
    assert!(a.task.entries[&pk()].work_unread);
    a.cut.store(false, Ordering::SeqCst);
    clock.advance(TTL / 10);
    a.task.step(None);
    let news = std::mem::take(&mut *a.news.lock().unwrap());
    assert!(news.iter().any(|n| n.work.is_some() && !n.work_unread));
}
