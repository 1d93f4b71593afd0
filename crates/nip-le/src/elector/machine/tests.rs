//! The key machine's unit tests, on an injected clock and an in-memory file.

use super::super::profile::Profile;
use super::step::Decision;
use super::*;
use crate::presence::Sibling;
use crate::record::ClaimedAt;

pub(super) const STALE: Duration = Duration::from_secs(10);

pub(super) fn rules(extended: bool) -> Rules {
    Rules {
        profile: Profile::of(if extended {
            crate::config::Mode::Extended
        } else {
            crate::config::Mode::Spec
        }),
        refresh: Duration::from_secs(5),
        stale: STALE,
        stand_down: Duration::from_secs(10),
        reply_flight: crate::config::DEFAULT_REPLY_FLIGHT,
    }
}

pub(super) struct Fixed(pub(super) Liveness, pub(super) PeerPresence);
impl Probes for Fixed {
    fn pid(&self, _: u32) -> Liveness {
        self.0
    }
    fn presence(&self, _: &str) -> PeerPresence {
        self.1
    }
    fn others_present(&self) -> bool {
        self.1 == PeerPresence::Alive
    }
    fn present_as(&self, _: &str) -> Option<String> {
        (self.1 == PeerPresence::Alive).then(|| "4242-0123456789abcdef".to_owned())
    }
}
pub(super) const ALIVE: Fixed = Fixed(Liveness::Alive, PeerPresence::Alive);

/// A clock the tests move by hand.
pub(super) struct Clock {
    base: Instant,
    wall0: SystemTime,
    at: Duration,
}
impl Clock {
    pub(super) fn new() -> Self {
        Self {
            base: Instant::now(),
            wall0: SystemTime::now(),
            at: Duration::ZERO,
        }
    }
    pub(super) fn now(&self) -> Now {
        Now {
            mono: self.base + self.at,
            wall: self.wall0 + self.at,
        }
    }
    pub(super) fn advance(&mut self, d: Duration) {
        self.at += d;
    }
}

pub(super) fn machine(extended: bool, id: &str) -> KeyMachine {
    let here = Here {
        host: Some("test-host".into()),
        boot: Some("test-boot".into()),
    };
    KeyMachine::new(rules(extended), Arc::from(id), 42, Arc::new(here))
}

pub(super) const TOKEN: &str = "42-0123456789abcdef";

/// Begins an evaluation through the machine's one entry point; returns
/// the look (this helper does not step down).
pub(super) fn begin_look(
    m: &mut KeyMachine,
    now: Now,
    cause: Cause,
    request: Option<&LeadRequest>,
) -> Look {
    let begun = m.step(
        Input::Evaluate {
            cause,
            request,
            claimant_gone: false,
        },
        now,
    );
    assert!(
        begun.step_down().is_none(),
        "this helper does not step down"
    );
    m.step(Input::Look, now).look()
}

/// Ends it with what the look saw.
pub(super) fn conclude_with(m: &mut KeyMachine, now: Now, seen: Seen) -> Conclusion {
    m.step(Input::Seen(seen), now)
        .conclusion()
        .expect("an evaluation was in progress")
}

pub(super) fn other(wall: SystemTime, live: Option<&str>) -> LockContent {
    LockContent::Record(LockRecord {
        instance_id: "other".into(),
        pid: 7,
        claimed_at: ClaimedAt::At(wall),
        epoch: live.map(|_| 3),
        live: live.map(str::to_owned),
        host: None,
        boot: None,
    })
}

/// One whole evaluation against an in-memory file, as the writer runs
/// it (without a step-down).
pub(super) fn evaluate(
    m: &mut KeyMachine,
    file: &mut LockContent,
    now: Now,
    cause: Cause,
    request: Option<&LeadRequest>,
    probes: &dyn Probes,
) -> Conclusion {
    let mut mark = crate::epoch::Mark::default();
    evaluate_marked(m, file, &mut mark, now, cause, request, probes).0
}

/// The same with the store's epoch mark, as the store keeps it (read when
/// the file carries no epoch); also says why we wrote, if we did.
pub(super) fn evaluate_marked(
    m: &mut KeyMachine,
    file: &mut LockContent,
    mark: &mut crate::epoch::Mark,
    now: Now,
    cause: Cause,
    request: Option<&LeadRequest>,
    probes: &dyn Probes,
) -> (Conclusion, Option<TakeReason>) {
    let look = begin_look(m, now, cause, request);
    let floor = match file.record().and_then(|r| r.epoch) {
        Some(_) => crate::epoch::Mark::default(),
        None => *mark,
    };
    let locked = Input::Locked {
        content: file,
        floor,
        token: Some(TOKEN),
        probes,
    };
    let (write, took) = m.step(locked, now).write();
    match write {
        Write::Put(b, r) => {
            assert_eq!(LockContent::parse(&b), LockContent::Record(r.clone()));
            *mark = mark.raised(r.epoch.unwrap_or(0));
            *file = LockContent::parse(&b)
        }
        Write::Clear(e) => {
            if let Some(e) = e {
                *mark = mark.released_at(e);
            }
            *file = LockContent::Empty
        }
        Write::Keep => {}
    }
    let seen = Seen {
        content: Ok(file.clone()),
        took,
        locked: look != Look::Read,
        busy: false,
        error: None,
    };
    (conclude_with(m, now, seen), took)
}

#[test]
fn free_lock_is_acquired_and_reported_on_join() {
    let c = Clock::new();
    let mut m = machine(false, "me");
    let mut f = LockContent::Absent;
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    assert!(out.leader && out.always);
    assert_eq!(out.reason, ChangeReason::Acquired);
    assert_eq!(out.validity, Validity::Always, "spec mode never fences");
    assert_eq!(f.record().unwrap().instance_id, "me");
    assert_eq!(
        f.record().unwrap().epoch,
        None,
        "spec records: NIP fields only"
    );
}

#[test]
fn live_holder_makes_an_observer_and_a_dead_one_a_failover() {
    let c = Clock::new();
    let mut m = machine(false, "me");
    let mut f = other(c.now().wall, None);
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    assert_eq!((out.leader, out.reason), (false, ChangeReason::Observer));
    let dead = Fixed(Liveness::Dead, PeerPresence::Unknown);
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &dead);
    assert_eq!((out.leader, out.reason), (true, ChangeReason::Failover));
}

#[test]
fn extended_hang_is_judged_by_our_monotonic_clock_only() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    // An hour-old claimed_at (the machine slept) from a live holder.
    let mut f = other(
        c.now().wall - Duration::from_secs(3600),
        Some("7-0123456789abcdef"),
    );
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    assert!(!out.leader, "a slept but live holder is not evicted");
    assert_eq!(out.watch.as_deref(), Some("7-0123456789abcdef"));
    c.advance(STALE - Duration::from_millis(1));
    assert!(!evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE).leader);
    c.advance(Duration::from_millis(2));
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE);
    assert_eq!((out.leader, out.reason), (true, ChangeReason::Failover));
    assert_eq!(out.validity, Validity::Renew);
    assert_eq!(f.record().unwrap().epoch, Some(4), "one above the holder's");
}

/// A locked look that failed (not because a peer held the exclusion).
fn failed_look(content: Result<LockContent, String>, error: &str) -> Seen {
    Seen {
        content,
        took: None,
        locked: false,
        busy: false,
        error: Some(error.into()),
    }
}

/// A locked look that timed out because a peer held the exclusion.
pub(super) fn busy_look(m: &mut KeyMachine, file: &LockContent, now: Now) -> Conclusion {
    begin_look(m, now, Cause::Tick, None);
    let seen = Seen {
        content: Ok(file.clone()),
        took: None,
        locked: false,
        busy: true,
        error: Some("exclusive lock not obtained".into()),
    };
    conclude_with(m, now, seen)
}

#[test]
fn a_holder_whose_record_stands_is_not_renewed_while_a_peer_holds_the_exclusion() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = LockContent::Absent;
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    c.advance(STALE);
    let out = busy_look(&mut m, &f, c.now());
    assert!(out.leader);
    assert_eq!(
        out.validity,
        Validity::Keep,
        "an observer that never tried to lock times us from our last write"
    );
    // Our record with another claimed_at is not the one we wrote: a
    // timed-out look proves nothing then.
    let mut changed = f.record().unwrap().clone();
    changed.claimed_at = ClaimedAt::At(c.now().wall);
    let out = busy_look(&mut m, &LockContent::Record(changed), c.now());
    assert_eq!(out.validity, Validity::Keep);
}

#[test]
fn an_empty_file_whose_exclusion_a_peer_holds_is_being_written_until_the_stale_bound() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let empty = LockContent::Empty;
    assert!(
        !busy_look(&mut m, &empty, c.now()).leader,
        "led beside the first writer"
    );
    let due = c.now().mono + STALE + Duration::from_millis(1);
    assert_eq!(m.hang_deadline(), Some(due));
    c.advance(STALE - Duration::from_millis(100));
    assert!(!busy_look(&mut m, &empty, c.now()).leader);
    c.advance(Duration::from_millis(200));
    assert!(
        busy_look(&mut m, &empty, c.now()).leader,
        "a writer hung on an empty file silences the agent"
    );
    assert_eq!(
        m.hang_deadline(),
        None,
        "judged: the writer would wake at once, forever"
    );
    // Spec mode: the NIP's fail-safe at once.
    let mut spec = machine(false, "me");
    assert!(busy_look(&mut spec, &empty, c.now()).leader);
}

#[test]
fn an_observer_that_finds_the_exclusion_held_gives_the_holder_a_fresh_window() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    let first = m.hang_deadline().unwrap();
    c.advance(STALE - Duration::from_millis(100));
    busy_look(&mut m, &f, c.now());
    m.step(Input::RestartHangTimer, c.now());
    assert_eq!(
        m.hang_deadline().unwrap(),
        first + STALE - Duration::from_millis(100)
    );
    c.advance(Duration::from_millis(200));
    assert!(
        !evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE).leader,
        "judged hung for time it could not have written in"
    );
}

#[test]
fn an_observer_whose_deadline_falls_as_a_hold_ends_gives_the_holder_a_window_after_it() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    c.advance(STALE + Duration::from_millis(10));
    busy_look(&mut m, &f, c.now());
    m.step(Input::RestartHangTimer, c.now());
    // The hold ends unseen; our next deadline finds the exclusion free
    // before the holder's next try.
    c.advance(STALE + Duration::from_millis(10));
    assert!(
        !evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE).leader,
        "took the lock the moment a peer's hold ended"
    );
    assert_eq!(
        m.hang_deadline(),
        Some(c.now().mono + STALE + Duration::from_millis(1))
    );
    // A holder that stays silent after the hold is still replaced.
    c.advance(STALE + Duration::from_millis(10));
    assert!(evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE).leader);
}

#[test]
fn a_takeover_that_could_not_be_written_leaves_no_hang_deadline_behind() {
    // Found by the simulator: the holder died while the directory was
    // full; our takeover failed, and the past hang deadline woke the
    // writer again at once, forever.
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    c.advance(STALE * 2);
    let gone = Fixed(Liveness::Dead, PeerPresence::Gone);
    begin_look(&mut m, c.now(), Cause::Wake, None);
    let locked = Input::Locked {
        content: &f,
        floor: crate::epoch::Mark::default(),
        token: Some(TOKEN),
        probes: &gone,
    };
    let (w, took) = m.step(locked, c.now()).write();
    assert!(
        matches!(w, Write::Put(..)) && took.is_some(),
        "it would take over"
    );
    let seen = failed_look(Ok(f.clone()), "ENOSPC");
    let out = conclude_with(&mut m, c.now(), seen);
    assert!(!out.leader);
    assert_eq!(
        m.hang_deadline(),
        None,
        "the tick retries, not a past deadline"
    );
    assert_eq!(out.watch, None, "a gone holder is not watched again");
}

#[test]
fn an_unreadable_file_leaves_no_hang_deadline_behind() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    assert!(m.hang_deadline().is_some());
    c.advance(STALE * 2);
    begin_look(&mut m, c.now(), Cause::Wake, None);
    let seen = failed_look(Err("EIO".into()), "EIO");
    let out = conclude_with(&mut m, c.now(), seen);
    assert_eq!((out.leader, out.reason), (true, ChangeReason::FailSafe));
    assert_eq!(m.hang_deadline(), None, "no past deadline to wake for");
}

#[test]
fn a_changed_record_restarts_the_hang_timer() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    c.advance(STALE / 2 + Duration::from_secs(1));
    f = other(c.now().wall, Some("7-0123456789abcdef")); // a refresh
    assert!(!evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE).leader);
    c.advance(STALE / 2 + Duration::from_secs(1));
    assert!(
        !evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE).leader,
        "only {:?} since the last change",
        STALE / 2 + Duration::from_secs(1)
    );
}

#[test]
fn wake_ups_never_rewrite_our_own_record() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = LockContent::Absent;
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    let before = f.clone();
    c.advance(Duration::from_secs(1));
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE);
    assert_eq!(f, before);
    assert_eq!(out.validity, Validity::Keep);
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE);
    assert_ne!(f, before, "a tick refreshes claimed_at");
    assert_eq!(out.validity, Validity::Renew);
}

#[test]
fn release_hands_over_to_a_live_heir_with_the_next_epoch() {
    let c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = LockContent::Absent;
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    let e = f.record().unwrap().epoch.unwrap();
    let heir = Sibling {
        token: "9-0123456789abcdef".into(),
        instance_id: "heir".into(),
        pid: 9,
    };
    m.step_down(c.now());
    let (w, released) = m.decide_release(&f, c.now(), Some(&heir));
    assert!(released);
    let Write::Put(b, _) = w else { panic!("{w:?}") };
    let r = LockContent::parse(&b).record().cloned().unwrap();
    assert_eq!(
        (r.instance_id.as_str(), r.epoch, r.live.as_deref()),
        ("heir", Some(e + 1), Some("9-0123456789abcdef"))
    );
    // Never a successor's record.
    let theirs = other(c.now().wall, None);
    assert_eq!(
        m.decide_release(&theirs, c.now(), None),
        (Write::Keep, false)
    );
}

#[test]
fn a_handed_over_record_we_could_not_confirm_is_fenced() {
    let c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    // The holder handed the lock to us; our confirming write timed out
    // and the fallback read shows our record.
    let ours = LockContent::parse(&crate::record::encode_record(
        "me",
        42,
        c.now().wall,
        Some(RecordExt {
            epoch: 4,
            live: "42-0123456789abcdef",
        }),
    ));
    begin_look(&mut m, c.now(), Cause::Wake, None);
    let seen = failed_look(Ok(ours), "exclusive lock not obtained");
    let out = conclude_with(&mut m, c.now(), seen);
    assert!(out.leader);
    assert_eq!(out.validity, Validity::Fenced);
}

#[test]
fn unreadable_file_fails_safe_to_leader_without_fencing() {
    let c = Clock::new();
    let mut m = machine(true, "me");
    begin_look(&mut m, c.now(), Cause::Join, None);
    let seen = failed_look(Err("permission denied".into()), "permission denied");
    let out = conclude_with(&mut m, c.now(), seen);
    assert_eq!((out.leader, out.reason), (true, ChangeReason::FailSafe));
    assert_eq!(out.validity, Validity::Always);
    assert_eq!(m.last_error(), Some("permission denied"));
}

#[test]
fn a_record_handed_to_us_is_confirmed_by_a_write_on_the_next_look() {
    let mut c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
    evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    // The holder wrote our record (a handoff); a wake-up looks.
    f = LockContent::parse(&crate::record::encode_record(
        "me",
        42,
        c.now().wall,
        Some(RecordExt {
            epoch: 4,
            live: "42-0123456789abcdef",
        }),
    ));
    let before = f.clone();
    c.advance(Duration::from_millis(5));
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE);
    assert_eq!((out.leader, out.reason), (true, ChangeReason::HandedOver));
    assert_ne!(f, before, "confirmed by our own write");
    assert_eq!(out.validity, Validity::Renew);
    assert_eq!(
        f.record().unwrap().epoch,
        Some(4),
        "the handed-over epoch stays"
    );
}

#[test]
fn a_round_late_by_more_than_half_the_margin_is_a_pause_in_extended_mode_only() {
    // Late: after the wake-up the round asked for.
    let r = rules(true);
    let margin = (r.stale - r.refresh) / 2;
    assert!(!r.paused(margin));
    assert!(r.paused(margin + Duration::from_millis(1)));
    assert!(!rules(false).paused(Duration::from_secs(3600)));
    assert_eq!(r.tick_slack(), Duration::from_millis(10));
    assert_eq!(
        r.busy_retry(Duration::from_millis(250)),
        Duration::from_millis(300)
    );
}

/// A locked look at `f` with live probes.
fn locked(f: &LockContent) -> Input<'_> {
    Input::Locked {
        content: f,
        floor: crate::epoch::Mark::default(),
        token: Some(TOKEN),
        probes: &ALIVE,
    }
}

#[test]
fn an_input_out_of_its_order_decides_nothing_and_writes_nothing() {
    let c = Clock::new();
    let mut m = machine(true, "me");
    let f = LockContent::Absent;
    assert_eq!(m.step(Input::Look, c.now()), Decision::Nothing);
    assert_eq!(m.step(locked(&f), c.now()).write(), (Write::Keep, None));
    let seen = failed_look(Ok(f.clone()), "none");
    assert_eq!(m.step(Input::Seen(seen), c.now()).conclusion(), None);
    // Begun but not looked: still nothing to write.
    m.step(
        Input::Evaluate {
            cause: Cause::Tick,
            request: None,
            claimant_gone: false,
        },
        c.now(),
    );
    assert_eq!(m.step(locked(&f), c.now()).write(), (Write::Keep, None));
    assert!(!m.holds_lock());
}

#[test]
fn the_host_a_record_names_is_judged_against_the_machines_own_not_a_global() {
    // A record from another boot of our host: its pid means nothing, so a
    // dead-looking holder there is taken at once, as the writer's `here`
    // says (not the test process's real host).
    let c = Clock::new();
    let mut m = machine(true, "me");
    let mut f = LockContent::Record(LockRecord {
        instance_id: "other".into(),
        pid: 7,
        claimed_at: ClaimedAt::At(c.now().wall),
        epoch: Some(3),
        live: Some("7-0123456789abcdef".into()),
        host: Some("test-host".into()),
        boot: Some("an-earlier-boot".into()),
    });
    let out = evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
    assert!(out.leader, "a record of an earlier boot is taken over");
    assert_eq!(f.record().unwrap().host.as_deref(), Some("test-host"));
    assert_eq!(f.record().unwrap().boot.as_deref(), Some("test-boot"));
}
