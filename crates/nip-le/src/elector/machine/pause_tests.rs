//! Pauses: a whole cluster paused together keeps its leader silently, and
//! an observer whose every round comes late still replaces a hung holder.

use super::tests::{evaluate, machine, other, Clock, ALIVE, STALE};
use super::*;

#[test]
fn a_refresh_of_our_record_exactly_as_we_left_it_is_unbroken_however_late() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = LockContent::Absent;
    assert!(!evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE).unbroken);
    // Paused for three stale bounds, with everyone else: the record stands.
    c.advance(STALE * 3);
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE);
    assert!(out.leader && out.unbroken, "{out:?}");
    // Someone else's record in between, then ours again: a new tenure.
    f = other(c.now().wall, None);
    if let LockContent::Record(r) = &mut f {
        r.instance_id = "me".into();
        r.pid = 42;
    }
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE);
    assert!(!out.unbroken, "not the record we wrote");
}

#[test]
fn a_pause_restarts_the_hang_timer_once_per_unchanged_record() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    let first = m.hang_deadline().unwrap();
    // Every round comes late (a starved observer of a hung holder): the
    // first pause gives the holder a fresh window, the others do not.
    c.advance(Duration::from_secs(4));
    m.step(Input::Paused, c.now());
    let second = m.hang_deadline().unwrap();
    assert!(second > first);
    for _ in 0..5 {
        c.advance(Duration::from_secs(1));
        m.step(Input::Paused, c.now());
        assert_eq!(m.hang_deadline(), Some(second), "once per record");
    }
    c.advance(second - c.now().mono);
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE);
    assert!(out.leader, "the hung holder is replaced");
    // A record that changed gets its own restart (a whole cluster paused
    // together: the holder refreshes after the pause).
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    m.step(Input::Paused, c.now());
    c.advance(Duration::from_secs(1));
    f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE);
    let d = m.hang_deadline().unwrap();
    c.advance(Duration::from_secs(30));
    m.step(Input::Paused, c.now());
    assert!(
        m.hang_deadline().unwrap() > d,
        "a new record, a new restart"
    );
}
