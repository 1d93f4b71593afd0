//! The work ledger through the elector's API: what a leader may take,
//! complete and give back, and what a new leader owes after each kind of
//! change (claim, release, takeover from a predecessor without a ledger), in
//! one process with two electors (flock excludes between open file
//! descriptions, so this is a real contest). Crashes and hangs are tested
//! with real processes in the CLI crate.

use std::time::{Duration, SystemTime};

use nip_le::{AgentPubkey, Config, Elector, InstanceId, Mode, QueuedEvent, TakeOutcome};

mod common;

use common::wait_until;

fn pk() -> AgentPubkey {
    AgentPubkey::parse(&"5".repeat(64)).unwrap()
}

fn config(dir: &std::path::Path) -> Config {
    let mut c = Config::new(dir);
    c.mode = Mode::Extended;
    c.refresh = Duration::from_secs(60);
    c.stale = Duration::from_secs(120);
    c.stand_down = Duration::from_secs(60);
    c
}

fn q(ids: &[&str]) -> Vec<QueuedEvent> {
    ids.iter()
        .map(|id| QueuedEvent {
            id: (*id).into(),
            published_ms: None,
        })
        .collect()
}

fn granted_epoch(t: TakeOutcome) -> u64 {
    match t {
        TakeOutcome::Granted { epoch: Some(e) } => e,
        other => panic!("not granted with an epoch: {other:?}"),
    }
}

/// Windows `a` (the leader, which took `taken` first) and `b`, joined in
/// `dir`, after `b` claimed and leads: their electors and work ledgers.
fn claimed_after(
    dir: &std::path::Path,
    taken: &[&str],
) -> (Elector, Elector, nip_le::Work, nip_le::Work) {
    let a = Elector::start(config(dir), InstanceId::new("a").unwrap()).unwrap();
    let b = Elector::start(config(dir), InstanceId::new("b").unwrap()).unwrap();
    a.join(&pk()).unwrap();
    b.join(&pk()).unwrap();
    let (wa, wb) = (a.work(&pk()).unwrap(), b.work(&pk()).unwrap());
    for id in taken {
        granted_epoch(wa.take(id).unwrap());
    }
    b.claim(&pk()).unwrap();
    assert!(wait_until(|| wb.may_act()), "b never led");
    (a, b, wa, wb)
}

#[test]
fn only_the_leader_takes_and_completes_and_each_event_once() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Elector::start(config(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    let b = Elector::start(config(tmp.path()), InstanceId::new("b").unwrap()).unwrap();
    assert!(a.join(&pk()).unwrap() && !b.join(&pk()).unwrap());
    let (wa, wb) = (a.work(&pk()).unwrap(), b.work(&pk()).unwrap());
    assert!(wa.may_act() && !wb.may_act());
    granted_epoch(wa.take("e1").unwrap());
    assert_eq!(wa.take("e1").unwrap(), TakeOutcome::AlreadyTaken);
    assert_eq!(wb.take("e1").unwrap(), TakeOutcome::NotLeader);
    assert!(!wb.done("e1").unwrap(), "an observer completes nothing");
    assert!(wb.owed(&q(&["e1", "e2"])).unwrap().is_empty());
    assert_eq!(wa.owed(&q(&["e1", "e2"])).unwrap(), vec!["e2"]);
    assert!(wa.done("e1").unwrap());
    assert_eq!(wa.take("e1").unwrap(), TakeOutcome::Done);
    // Given back: owed again, and taken again.
    granted_epoch(wa.take("e2").unwrap());
    wa.give_back("e2").unwrap();
    assert_eq!(wa.owed(&q(&["e1", "e2"])).unwrap(), vec!["e2"]);
    granted_epoch(wa.take("e2").unwrap());
    // Hostile ids are refused before any I/O.
    for bad in ["", "a\nb"] {
        assert!(matches!(wa.take(bad), Err(nip_le::Error::EventId(_))));
    }
    assert!(wa.take(&"x".repeat(300)).is_err());
}

#[test]
fn a_claim_leaves_the_in_flight_turn_with_its_taker_until_it_gives_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Elector::start(config(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    let b = Elector::start(config(tmp.path()), InstanceId::new("b").unwrap()).unwrap();
    a.join(&pk()).unwrap();
    b.join(&pk()).unwrap();
    let (wa, wb) = (a.work(&pk()).unwrap(), b.work(&pk()).unwrap());
    let e1 = granted_epoch(wa.take("done-before").unwrap());
    wa.done("done-before").unwrap();
    granted_epoch(wa.take("in-flight").unwrap());
    // b claims; a stands down (directory watch) and hands the lock over.
    b.claim(&pk()).unwrap();
    assert!(wait_until(|| wb.may_act()), "b never led");
    assert!(!wa.may_act());
    // a takes nothing more; its turn is still in flight (its reply may be
    // on its way), so b does not owe it yet.
    assert_eq!(wa.take("new").unwrap(), TakeOutcome::NotLeader);
    let queue = q(&["done-before", "in-flight", "new"]);
    assert_eq!(wb.owed(&queue).unwrap(), vec!["new"]);
    assert_eq!(wb.take("in-flight").unwrap(), TakeOutcome::AlreadyTaken);
    // a's app cancels the turn (the change said `mustCancelTurn`): owed.
    wa.give_back("in-flight").unwrap();
    assert_eq!(wb.owed(&queue).unwrap(), vec!["in-flight", "new"]);
    let e2 = granted_epoch(wb.take("in-flight").unwrap());
    assert!(e2 > e1, "a new holder takes at a higher epoch");
    assert!(wb.done("in-flight").unwrap());
    assert_eq!(wb.owed(&queue).unwrap(), vec!["new"]);
}

#[test]
fn a_reply_sent_while_leadership_moved_is_recorded_and_never_owed_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (_a, _b, wa, wb) = claimed_after(tmp.path(), &["sending"]);
    // a's reply reached the relay after the claim: its done still counts.
    assert!(wa.done("sending").unwrap(), "the taker's done is accepted");
    assert!(!wa.done("never-taken").unwrap(), "nothing else is");
    wb.give_back("sending").unwrap(); // not b's to give back: nothing
    assert!(wb.owed(&q(&["sending"])).unwrap().is_empty());
    assert_eq!(wb.take("sending").unwrap(), TakeOutcome::Done);
}

#[test]
fn a_take_is_owed_at_once_when_its_taker_dies() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _b, wa, wb) = claimed_after(tmp.path(), &["e"]);
    assert!(wb.owed(&q(&["e"])).unwrap().is_empty(), "in flight with a");
    // a's process ends (here: its elector, and with it its presence).
    drop(wa);
    a.shutdown();
    assert!(wait_until(
        || wb.owed(&q(&["e"])).unwrap() == vec!["e".to_string()]
    ));
}

#[test]
fn a_release_hands_the_owed_work_to_the_heir() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Elector::start(config(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    let b = Elector::start(config(tmp.path()), InstanceId::new("b").unwrap()).unwrap();
    a.join(&pk()).unwrap();
    b.join(&pk()).unwrap();
    let (wa, wb) = (a.work(&pk()).unwrap(), b.work(&pk()).unwrap());
    granted_epoch(wa.take("x").unwrap());
    wa.give_back("x").unwrap(); // the app cancelled its turn before leaving
    granted_epoch(wa.take("y").unwrap());
    a.shutdown(); // graceful exit: the lock goes straight to b
    assert!(wait_until(|| wb.may_act()));
    assert_eq!(wb.owed(&q(&["x", "y"])).unwrap(), vec!["x", "y"]);
}

#[test]
fn after_a_predecessor_without_a_ledger_only_events_published_since_are_owed() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path()).unwrap();
    // A harness record (no epoch) of a dead process: the NIP's dead-pid rule
    // lets us take over, and the harness kept no ledger.
    // This test binary, listing its tests: a child that exits at once on
    // every platform.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--list")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dead = child.id();
    child.wait().unwrap();
    std::fs::write(
        nip_le::lockfile::lock_path(tmp.path(), &pk()),
        nip_le::record::encode_record("harness", dead, SystemTime::now(), None),
    )
    .unwrap();
    let before = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        - 1000;
    let a = Elector::start(config(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    assert!(a.join(&pk()).unwrap(), "took over the dead harness");
    let wa = a.work(&pk()).unwrap();
    let queue = vec![
        QueuedEvent {
            id: "old".into(),
            published_ms: Some(before),
        },
        QueuedEvent {
            id: "new".into(),
            published_ms: Some(before + 60_000),
        },
        QueuedEvent {
            id: "unknown-time".into(),
            published_ms: None,
        },
    ];
    // The harness may have answered "old": only the rest is owed.
    assert_eq!(wa.owed(&queue).unwrap(), vec!["new", "unknown-time"]);
}

#[test]
fn the_ledgers_epochs_are_never_issued_again_when_the_epoch_mark_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Elector::start(config(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    assert!(a.join(&pk()).unwrap());
    let e1 = granted_epoch(a.work(&pk()).unwrap().take("answered").unwrap());
    a.shutdown();
    // A cleanup (or a restored backup) loses the epoch mark; the lock
    // file is empty after the release.
    std::fs::remove_file(nip_le::epoch::epoch_path(tmp.path(), &pk())).unwrap();
    let b = Elector::start(config(tmp.path()), InstanceId::new("b").unwrap()).unwrap();
    assert!(b.join(&pk()).unwrap());
    let e2 = granted_epoch(b.work(&pk()).unwrap().take("new").unwrap());
    assert!(e2 > e1, "epoch {e2} issued again (the ledger holds {e1})");
}

#[test]
fn a_ledger_that_cannot_be_read_never_silences_the_leader() {
    for hostile in [&b"x"[..], b"not json at all\n\xff\xfe"] {
        let tmp = tempfile::tempdir().unwrap();
        let ledger = nip_le::ledger::ledger_path(tmp.path(), &pk());
        std::fs::create_dir(ledger.parent().unwrap()).unwrap();
        if hostile == b"x" {
            // Oversized (sparse) ledger.
            let f = std::fs::File::create(&ledger).unwrap();
            f.set_len(nip_le::ledger::MAX_LEDGER_BYTES + 1).unwrap();
        } else {
            std::fs::write(&ledger, hostile).unwrap();
        }
        let a = Elector::start(short(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
        assert!(a.join(&pk()).unwrap());
        let wa = a.work(&pk()).unwrap();
        if hostile == b"x" {
            // Too large to read: the leader rewrites it from its newest
            // whole lines (none here) and takes with it at once.
            let granted = wa.take("e").unwrap();
            assert!(
                matches!(granted, TakeOutcome::Granted { epoch: Some(_) }),
                "{granted:?}"
            );
            let size = std::fs::metadata(&ledger).unwrap().len();
            assert!(size < 4096, "the ledger is still {size} bytes");
        } else {
            // Readable: its malformed lines are skipped.
            assert!(wa.take("e").unwrap().granted());
        }
        assert!(wa.done("e").unwrap());
        assert_eq!(wa.owed(&q(&["f"])).unwrap(), vec!["f"]);
    }
    // A directory at the ledger's path.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(nip_le::ledger::ledger_path(tmp.path(), &pk())).unwrap();
    let before_join = std::time::Instant::now();
    let a = Elector::start(short(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    a.join(&pk()).unwrap();
    granted_after_the_stale_bound(&a.work(&pk()).unwrap(), "e", before_join);
}

/// [`config`] with a stale bound short enough to wait for.
fn short(dir: &std::path::Path) -> Config {
    let mut c = config(dir);
    c.refresh = Duration::from_millis(300);
    c.stale = Duration::from_millis(900);
    c.stand_down = Duration::from_millis(900);
    c
}

/// A ledger that cannot be read delays takes (a disk failing for a moment
/// must not cost a duplicate), then never silences the leader: granted
/// once the stale bound has passed, counted from before the join (the
/// writer saw the ledger at the join at the earliest), never before.
fn granted_after_the_stale_bound(w: &nip_le::Work, id: &str, before_join: std::time::Instant) {
    let stale = short(std::path::Path::new("/")).stale;
    let granted = wait_until(|| {
        let granted = w.take(id).unwrap().granted();
        assert!(
            !granted || before_join.elapsed() >= stale,
            "granted {:?} after the join, before the stale bound",
            before_join.elapsed()
        );
        granted
    });
    assert!(granted, "the leader dispatches past the stale bound");
}

#[test]
fn spec_mode_keeps_no_ledger_and_touches_no_other_file() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.mode = Mode::Spec;
    let a = Elector::start(c, InstanceId::new("a").unwrap()).unwrap();
    a.join(&pk()).unwrap();
    let wa = a.work(&pk()).unwrap();
    assert_eq!(wa.take("e").unwrap(), TakeOutcome::Granted { epoch: None });
    assert!(wa.done("e").unwrap());
    assert!(!nip_le::ledger::ledger_path(tmp.path(), &pk()).exists());
}

/// A leader that took `e1` and steps down (`step_down`) while a peer holds
/// the lock file's flock, so that its release cannot be written; `back`
/// makes it lead again, under the same id. Its take must be owed again, at
/// the same epoch.
fn a_take_survives_no_failed_release(
    step_down: impl FnOnce(&Elector),
    back: impl FnOnce(&Elector),
) {
    a_take_survives_no_failed_release_then(step_down, |_| {}, back)
}

/// The same, with `between` done after the step-down.
fn a_take_survives_no_failed_release_then(
    step_down: impl FnOnce(&Elector),
    between: impl FnOnce(&Elector),
    back: impl FnOnce(&Elector),
) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.lock_wait = Duration::from_millis(20);
    let a = Elector::start(c, InstanceId::new("a").unwrap()).unwrap();
    assert!(a.join(&pk()).unwrap());
    let epoch = granted_epoch(a.work(&pk()).unwrap().take("e1").unwrap());
    let path = nip_le::lockfile::lock_path(tmp.path(), &pk());
    let held = nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(1)).unwrap();
    step_down(&a);
    between(&a);
    drop(held);
    let record = nip_le::lockfile::read_unguarded(&path).unwrap();
    assert_eq!(
        record.record().map(|r| (r.instance_id.as_str(), r.epoch)),
        Some(("a", Some(epoch))),
        "the release could not be written"
    );
    back(&a);
    let w = a.work(&pk()).unwrap();
    assert!(wait_until(|| w.may_act()));
    assert_eq!(w.owed(&q(&["e1"])).unwrap(), vec!["e1".to_string()]);
    assert_eq!(
        granted_epoch(w.take("e1").unwrap()),
        epoch,
        "the same epoch"
    );
}

#[test]
fn leaving_ends_our_takes_even_when_the_release_cannot_be_written() {
    // Found by the simulator: a window left while a peer held the lock
    // file's flock, so its record stayed; joined again under the same id,
    // it regained the lock at the same epoch, where its old take still
    // read as "taken now": that mention was never answered.
    a_take_survives_no_failed_release(
        |a| a.leave(&pk()).unwrap(),
        |a| assert!(a.join(&pk()).unwrap()),
    );
}

#[test]
fn a_give_back_after_standing_down_counts_even_when_the_release_cannot_be_written() {
    // The same hole on a stand-down (a claim): the lock came back to us at
    // the same epoch. The take stays ours while we live (a reply may be on
    // its way); the app's give-back, which the change's `mustCancelTurn`
    // asks for, is accepted although we no longer lead.
    a_take_survives_no_failed_release_then(
        |a| a.stand_down(&pk()).unwrap(),
        |a| a.work(&pk()).unwrap().give_back("e1").unwrap(),
        |a| assert!(a.resume(&pk()).unwrap(), "the record was still ours"),
    );
}
