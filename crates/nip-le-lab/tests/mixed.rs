//! Mixed modes in one lock directory: extended instances (presence locks,
//! watch, handoff, epoch) beside spec-only instances and the independent
//! foreign writer. Every NIP rule must still hold; extensions only add.

mod support;

use nip_le::ChangeReason;
use std::time::Duration;

use nip_le_cli::drive::cluster::{wait_until, Instance, RunOptions};
use support::*;

fn spec(mut o: RunOptions) -> RunOptions {
    o.extra_args
        .extend(["--mode".to_owned(), "spec".to_owned()]);
    o
}

fn first_lead_after(
    i: &Instance,
    cursor: usize,
    bound: Duration,
) -> Option<nip_le_cli::drive::cluster::Report> {
    i.wait_after(cursor, bound, |r| r.is_leader() == Some(true))
}

/// Unix: the foreign writer is Python with `fcntl.flock`.
#[cfg(unix)]
#[test]
fn mixed_crowd_with_spec_and_foreign_writers_elects_exactly_one_leader() {
    let s = Scratch::new();
    let mut insts = Vec::new();
    for i in 0..3 {
        insts.push(s.spawn(&format!("ext{i}")));
        insts.push(s.spawn_with(&format!("spec{i}"), spec(s.opts())));
    }
    insts.push(s.spawn_foreign("foreign", "harness-1"));
    assert!(wait_until(Duration::from_secs(5), || insts
        .iter()
        .all(|i| i.is_leader().is_some())));
    std::thread::sleep(ms(REFRESH_MS * 4));
    let l = leaders(&insts);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(s.holder(), Some(l[0].clone()));
}

#[test]
fn spec_survivor_takes_over_from_a_dead_extended_leader() {
    let s = Scratch::new();
    let mut a = s.spawn_with("ext", s.opts().timings(REFRESH_MS, 30_000, STAND_DOWN_MS));
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let b = s.spawn_with(
        "spec",
        spec(s.opts().timings(REFRESH_MS, 30_000, STAND_DOWN_MS)),
    );
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let c = b.cursor();
    a.kill_and_reap().unwrap();
    let r =
        first_lead_after(&b, c, ms(REFRESH_MS) + MARGIN).expect("no takeover by the dead-pid rule");
    assert_eq!(r.reason(), Some(ChangeReason::Failover));
}

#[test]
fn extended_survivor_takes_over_from_a_dead_spec_leader_by_the_nip_rules() {
    let s = Scratch::new();
    let mut a = s.spawn_with(
        "spec",
        spec(s.opts().timings(REFRESH_MS, 30_000, STAND_DOWN_MS)),
    );
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let b = s.spawn_with("ext", s.opts().timings(REFRESH_MS, 30_000, STAND_DOWN_MS));
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let c = b.cursor();
    a.kill_and_reap().unwrap();
    let r = first_lead_after(&b, c, ms(REFRESH_MS) + MARGIN)
        .expect("no takeover of a tokenless record");
    assert_eq!(r.reason(), Some(ChangeReason::Failover));
}

#[test]
fn extended_leader_without_an_extended_sibling_releases_by_truncation() {
    let s = Scratch::new();
    let mut a = s.spawn("ext");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let b = s.spawn_with("spec", spec(s.opts()));
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let c = b.cursor();
    a.terminate().unwrap();
    assert!(a.wait_exit(Duration::from_secs(5)).unwrap().success());
    // No presence to hand to: the NIP's truncation, then the spec tick.
    let r = first_lead_after(&b, c, ms(REFRESH_MS) + MARGIN).expect("the spec sibling never led");
    assert_eq!(r.reason(), Some(ChangeReason::Acquired));
    assert_eq!(s.holder().as_deref(), Some(b.instance_id.as_str()));
}

#[test]
fn claims_cross_modes_in_both_directions() {
    let bound = ms(STAND_DOWN_MS + REFRESH_MS * 2) + MARGIN;
    // A spec instance claims from an extended leader.
    let s = Scratch::new();
    let a = s.spawn("ext");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let mut b = s.spawn_with("spec", spec(s.opts()));
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let c = b.cursor();
    b.send("claim").unwrap();
    assert_eq!(
        first_lead_after(&b, c, bound)
            .expect("spec claimant never led")
            .reason(),
        Some(ChangeReason::Claimed)
    );
    std::thread::sleep(ms(REFRESH_MS * 2));
    assert_eq!(leaders(&[a, b]).len(), 1);

    // An extended instance claims from a spec leader.
    let s = Scratch::new();
    let a = s.spawn_with("spec", spec(s.opts()));
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let mut b = s.spawn("ext");
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let c = b.cursor();
    b.send("claim").unwrap();
    assert_eq!(
        first_lead_after(&b, c, bound)
            .expect("extended claimant never led")
            .reason(),
        Some(ChangeReason::Claimed)
    );
    std::thread::sleep(ms(REFRESH_MS * 2));
    assert_eq!(leaders(&[a, b]).len(), 1);
}

#[test]
fn foreign_write_is_seen_at_once_by_extended_instances() {
    let unrelated = Unrelated::start();
    let s = Scratch::new();
    // Slow ticks: only the directory watch can explain a fast reaction.
    let slow = s.opts().timings(5_000, 10_000, 10_000);
    s.write_record(
        "foreign-leader",
        unrelated.pid(),
        std::time::SystemTime::now(),
    );
    let a = s.spawn_with("ext", slow.clone());
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(false)));
    let c = a.cursor();
    // The foreign holder releases (truncates): a takes the lock at once.
    s.write_raw(b"");
    let r = first_lead_after(&a, c, Duration::from_secs(2))
        .expect("the release was not seen before the tick");
    assert_eq!(r.reason(), Some(ChangeReason::Acquired));
    // And a foreign takeover of a's claim (a live foreign record after a
    // crash-and-restart, written under the flock as the harness writes) is
    // reflected at once. (Written without the flock, the truncation can be
    // seen alone: a then rewrites its own record over the half-written
    // takeover, as it should for a file it holds.)
    let c = a.cursor();
    s.write_record_locked(
        "foreign-leader",
        unrelated.pid(),
        std::time::SystemTime::now(),
    );
    let r = a
        .wait_after(c, Duration::from_secs(2), |r| r.event() == "leadership")
        .expect("the foreign write was not seen before the tick");
    assert_eq!(
        (r.is_leader(), r.reason()),
        (Some(false), Some(ChangeReason::Lost))
    );
}
