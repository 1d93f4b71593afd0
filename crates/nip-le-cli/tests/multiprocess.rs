//! Real processes, real flocks, real signals: `nip-le run` instances sharing
//! one lock directory.

mod support;

use nip_le::ChangeReason;
use nip_le_cli::lines::Line;
use std::time::{Duration, Instant, SystemTime};

use nip_le_cli::lab::cluster::{wait_until, Instance};
use support::*;

/// The same options in spec mode.
fn spec(mut o: nip_le_cli::lab::cluster::RunOptions) -> nip_le_cli::lab::cluster::RunOptions {
    o.extra_args
        .extend(["--mode".to_owned(), "spec".to_owned()]);
    o
}

fn spawn_many(s: &Scratch, n: usize) -> Vec<Instance> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|i| scope.spawn(move || s.spawn(&format!("i{i}"))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Identity: the extended mode (the default).
fn extended(o: nip_le_cli::lab::cluster::RunOptions) -> nip_le_cli::lab::cluster::RunOptions {
    o
}

#[test]
fn sixteen_started_at_once_elect_exactly_one_leader_repeatedly() {
    sixteen_at_once(extended);
}

#[test]
fn spec_sixteen_started_at_once_elect_exactly_one_leader() {
    sixteen_at_once(spec);
}

fn sixteen_at_once(
    mode: fn(nip_le_cli::lab::cluster::RunOptions) -> nip_le_cli::lab::cluster::RunOptions,
) {
    for round in 0..3 {
        let s = Scratch::new();
        let opts = mode(s.opts());
        let insts: Vec<Instance> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..16)
                .map(|i| {
                    let (s, opts) = (&s, opts.clone());
                    scope.spawn(move || s.spawn_with(&format!("i{i}"), opts))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            wait_until(Duration::from_secs(10), || insts
                .iter()
                .all(|i| i.is_leader().is_some())),
            "round {round}: not every instance reported"
        );
        // Let a few refresh ticks pass: the answer must be stable.
        std::thread::sleep(ms(REFRESH_MS * 3));
        let l = leaders(&insts);
        assert_eq!(l.len(), 1, "round {round}: leaders {l:?}");
        assert_eq!(s.holder().as_deref(), Some(l[0].as_str()), "round {round}");
        // Nobody else ever reported leading, not even for a moment.
        let ever: Vec<_> = insts
            .iter()
            .filter(|i| ever_led_after(i, 0))
            .map(|i| i.name.clone())
            .collect();
        assert_eq!(ever.len(), 1, "round {round}: ever led {ever:?}");
    }
}

#[test]
fn sigkill_of_the_leader_fails_over_within_refresh() {
    sigkill_failover(extended);
}

#[test]
fn spec_sigkill_of_the_leader_fails_over_within_refresh() {
    sigkill_failover(spec);
}

fn sigkill_failover(
    mode: fn(nip_le_cli::lab::cluster::RunOptions) -> nip_le_cli::lab::cluster::RunOptions,
) {
    let s = Scratch::new();
    // A stale bound far above the refresh: only dead-pid (or presence-lock)
    // detection can explain a takeover within refresh + margin.
    let opts = mode(s.opts().timings(REFRESH_MS, 30_000, STAND_DOWN_MS));
    let mut insts: Vec<_> = (0..3)
        .map(|i| s.spawn_with(&format!("i{i}"), opts.clone()))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || leaders(&insts).len() == 1));
    let leader = insts
        .iter()
        .position(|i| i.is_leader() == Some(true))
        .unwrap();
    let cursors: Vec<_> = insts.iter().map(Instance::cursor).collect();
    let killed = Instant::now();
    insts[leader].kill_and_reap().unwrap();
    let survivor = wait_until(ms(REFRESH_MS) + MARGIN, || {
        insts
            .iter()
            .enumerate()
            .any(|(n, i)| n != leader && i.is_leader() == Some(true))
    });
    let took = killed.elapsed();
    assert!(
        survivor,
        "no survivor led within {:?}",
        ms(REFRESH_MS) + MARGIN
    );
    let new = insts
        .iter()
        .enumerate()
        .find(|(n, i)| *n != leader && i.is_leader() == Some(true))
        .unwrap();
    let r = new
        .1
        .wait_after(cursors[new.0], ms(0), |r| r.is_leader() == Some(true))
        .unwrap();
    assert_eq!(r.reason(), Some(ChangeReason::Failover));
    assert_eq!(s.holder().as_deref(), Some(new.1.instance_id.as_str()));
    eprintln!("failover after SIGKILL took {took:?}");
}

#[test]
fn live_unrelated_pid_with_a_stale_claim_is_taken_over() {
    let unrelated = Unrelated::start();
    for claimed_at in [
        SystemTime::now() - Duration::from_secs(3600), // abandoned, pid recycled
        SystemTime::now() + Duration::from_secs(3600), // far future: clock jumped back
    ] {
        let s = Scratch::new();
        s.write_record("ghost", unrelated.pid(), claimed_at);
        let a = s.spawn("a");
        // Extended mode confirms a wall-clock verdict on a live pid with its
        // own clock (the record must stay unchanged past the stale bound:
        // a live writer across a clock step would have rewritten it).
        let r = a
            .wait_after(0, ms(STALE_MS + REFRESH_MS) + MARGIN, |r| {
                r.is_leader() == Some(true)
            })
            .expect("the abandoned claim was never taken");
        assert_eq!(r.reason(), Some(ChangeReason::Failover));
        assert_eq!(s.holder().as_deref(), Some(a.instance_id.as_str()));
    }
}

#[test]
fn live_fresh_foreign_claim_is_not_taken() {
    let unrelated = Unrelated::start();
    let s = Scratch::new();
    s.write_record("foreign-leader", unrelated.pid(), SystemTime::now());
    let before = s.raw();
    let opts = s.opts().timings(REFRESH_MS, 30_000, STAND_DOWN_MS);
    let a = s.spawn_with("a", opts);
    let r = a
        .wait_for(Duration::from_secs(5), |r| {
            r.iter().find(|r| r.event() == "leadership").cloned()
        })
        .unwrap();
    assert_eq!(
        (r.is_leader(), r.reason()),
        (Some(false), Some(ChangeReason::Observer))
    );
    assert_eq!(
        r.leadership().unwrap().leader_instance_id.as_deref(),
        Some("foreign-leader")
    );
    std::thread::sleep(ms(REFRESH_MS * 5));
    assert!(!ever_led_after(&a, 0));
    assert_eq!(s.raw(), before, "a live fresh claim was rewritten");
}

#[test]
fn malformed_empty_absent_fail_safe_then_are_repaired_by_the_next_acquire() {
    let unrelated = Unrelated::start();
    let cases: [(&str, Option<Vec<u8>>); 6] = [
        ("absent", None),
        ("empty", Some(vec![])),
        ("garbage", Some(b"{not json".to_vec())),
        (
            "truncated",
            Some(br#"{"instance_id":"x","pid":1,"claimed_at":"2026-0"#.to_vec()),
        ),
        (
            "wrong types",
            Some(br#"{"instance_id":1,"pid":"x","claimed_at":[]}"#.to_vec()),
        ),
        ("oversized", Some(vec![b' '; 1 << 20])),
    ];
    for (what, bytes) in cases {
        let s = Scratch::new();
        let Some(bytes) = bytes else {
            // Absent: no flock can be held on a missing file, so the first
            // acquire creates it (fail-safe and repair in one step).
            let a = s.spawn("a");
            let r = a
                .wait_for(Duration::from_secs(5), |r| {
                    r.iter().find(|r| r.event() == "leadership").cloned()
                })
                .unwrap();
            assert_eq!(
                (r.is_leader(), r.reason()),
                (Some(true), Some(ChangeReason::Acquired)),
                "{what}"
            );
            assert_eq!(
                s.holder().as_deref(),
                Some(a.instance_id.as_str()),
                "{what}"
            );
            continue;
        };
        // Start as an observer of a live fresh claim.
        s.write_record("foreign-leader", unrelated.pid(), SystemTime::now());
        let a = s.spawn_with("a", s.opts().timings(REFRESH_MS, 30_000, STAND_DOWN_MS));
        assert!(
            wait_until(Duration::from_secs(5), || a.is_leader() == Some(false)),
            "{what}"
        );
        // Hold the exclusive lock so a's acquire times out: what it reports
        // is the unguarded read side alone.
        let mut held =
            nip_le::lockfile::LockedFile::open_and_lock(&s.lock_path(), Duration::from_secs(1))
                .unwrap();
        held.write(&bytes).unwrap();
        let cursor = a.cursor();
        let r = a.wait_after(cursor, ms(REFRESH_MS) + MARGIN, |r| {
            r.event() == "leadership"
        });
        let r = r.unwrap_or_else(|| panic!("{what}: no fail-safe report"));
        assert_eq!(
            (r.is_leader(), r.reason()),
            (Some(true), Some(ChangeReason::FailSafe)),
            "{what}"
        );
        drop(held);
        // The next acquire repairs the file with a's record.
        assert!(
            wait_until(ms(REFRESH_MS) + MARGIN, || s.holder().as_deref()
                == Some(a.instance_id.as_str())),
            "{what}: not repaired"
        );
        assert_eq!(a.is_leader(), Some(true), "{what}");
    }
}

/// The file's inode (Unix); `None` elsewhere.
fn file_id(path: &std::path::Path) -> Option<u64> {
    #[cfg(unix)]
    return Some(std::os::unix::fs::MetadataExt::ino(
        &std::fs::metadata(path).unwrap(),
    ));
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

#[test]
fn release_never_stomps_a_successor() {
    let unrelated = Unrelated::start();
    let s = Scratch::new();
    let mut a = s.spawn("a");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    // Our own release: truncate in place, same inode (Unix: Windows has no
    // stable file id in std).
    let ino = file_id(&s.lock_path());
    let c = a.cursor();
    a.send("release").unwrap();
    let r = a
        .wait_after(c, Duration::from_secs(2), |r| r.event() == "release")
        .unwrap();
    assert_eq!(r.line, Line::Release { released: true });
    assert_eq!(s.raw(), b"");
    assert_eq!(file_id(&s.lock_path()), ino, "release replaced the file");
    // A successor takes over (written by someone else), then a releases again
    // and exits: the successor's claim must survive both.
    s.write_record("successor", unrelated.pid(), SystemTime::now());
    let successor = s.raw();
    let c = a.cursor();
    a.send("release").unwrap();
    let r = a
        .wait_after(c, Duration::from_secs(2), |r| r.event() == "release")
        .unwrap();
    assert_eq!(r.line, Line::Release { released: false });
    assert_eq!(s.raw(), successor);
    a.terminate().unwrap();
    assert!(a.wait_exit(Duration::from_secs(5)).unwrap().success());
    assert_eq!(a.reports().last().unwrap().event(), "stopped");
    assert_eq!(s.raw(), successor);
}

#[test]
fn graceful_exit_releases_and_a_sibling_takes_over() {
    let s = Scratch::new();
    let mut a = s.spawn("a");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let b = s.spawn("b");
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    a.terminate().unwrap();
    assert!(a.wait_exit(Duration::from_secs(5)).unwrap().success());
    let r = a.reports();
    let n = r.len();
    assert_eq!(r[n - 1].event(), "stopped");
    assert_eq!(
        (r[n - 2].is_leader(), r[n - 2].reason()),
        (Some(false), Some(ChangeReason::Released))
    );
    assert!(wait_until(ms(REFRESH_MS) + MARGIN, || b.is_leader() == Some(true)));
    assert_eq!(s.holder().as_deref(), Some(b.instance_id.as_str()));
}

#[test]
fn cooperative_claim_moves_leadership_to_the_target_only() {
    let s = Scratch::new();
    let insts = spawn_many(&s, 3);
    assert!(wait_until(Duration::from_secs(5), || leaders(&insts).len() == 1));
    let old = insts
        .iter()
        .position(|i| i.is_leader() == Some(true))
        .unwrap();
    let target = (old + 1) % 3;
    let bystander = (old + 2) % 3;
    let mut insts = insts;
    let cursors: Vec<_> = insts.iter().map(Instance::cursor).collect();
    insts[target].send("claim").unwrap();
    let bound = ms(STAND_DOWN_MS + REFRESH_MS * 2) + MARGIN;
    let won = insts[target].wait_after(cursors[target], bound, |r| r.is_leader() == Some(true));
    let won = won.expect("the target never led");
    assert_eq!(won.reason(), Some(ChangeReason::Claimed));
    let stood = insts[old]
        .wait_after(cursors[old], bound, |r| r.event() == "leadership")
        .unwrap();
    assert_eq!(
        (stood.is_leader(), stood.reason()),
        (Some(false), Some(ChangeReason::StoodDown))
    );
    assert_eq!(
        s.holder().as_deref(),
        Some(insts[target].instance_id.as_str())
    );
    // The old leader does not take it back when its stand-down expires, and
    // the bystander never led.
    std::thread::sleep(ms(STAND_DOWN_MS + REFRESH_MS * 2));
    assert_eq!(leaders(&insts), vec![insts[target].instance_id.clone()]);
    assert!(
        !ever_led_after(&insts[bystander], cursors[bystander]),
        "bystander: {:?}\nold: {:?}\ntarget: {:?}",
        insts[bystander].reports(),
        insts[old].reports(),
        insts[target].reports()
    );
    // The new leader exits gracefully: a sibling takes over on its next
    // tick, the old leader's finished stand-down does not delay it.
    let cursors: Vec<_> = insts.iter().map(Instance::cursor).collect();
    insts[target].terminate().unwrap();
    assert!(insts[target]
        .wait_exit(Duration::from_secs(5))
        .unwrap()
        .success());
    assert!(
        wait_until(ms(REFRESH_MS) + MARGIN, || [old, bystander]
            .iter()
            .any(|&i| ever_led_after(&insts[i], cursors[i]))),
        "nobody took over from the departed claimant within a refresh"
    );
}

#[test]
fn claim_whose_target_never_acquires_lets_the_old_leader_resume() {
    // The NIP's stand-down timeout (spec mode; the extended mode hands the
    // lock to the target at once, see the next test).
    let s = Scratch::new();
    let mut a = s.spawn_with("a", spec(s.opts()));
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let b = s.spawn_with("b", spec(s.opts()));
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let c = b.cursor();
    // The target hangs before it can acquire: stopped first, then its
    // claim reaches the holder over the relay. (Sending the claim from b
    // and stopping it after let b acquire first, 1 run in 20: the holder
    // stands down the moment the frame arrives.)
    stop_outside_flock(&b, &s.lock_path());
    let ca = a.cursor();
    let frame = format!(
        r#"{{"type":"claim_leadership","targetInstanceId":"{}"}}"#,
        b.instance_id
    );
    a.send(&frame).unwrap();
    let stood = a
        .wait_after(ca, ms(REFRESH_MS) + MARGIN, |r| r.event() == "leadership")
        .unwrap();
    assert_eq!(
        (stood.is_leader(), stood.reason()),
        (Some(false), Some(ChangeReason::StoodDown))
    );
    // The old leader resumes after the stand-down timeout, not before
    // (both instants as the instance reported them).
    let back = a.wait_after(ca, ms(STAND_DOWN_MS + REFRESH_MS * 2) + MARGIN, |r| {
        r.is_leader() == Some(true)
    });
    let back = back.expect("the old leader never resumed");
    let waited = back.at_ms().unwrap() - stood.at_ms().unwrap();
    assert!(
        waited >= STAND_DOWN_MS - REFRESH_MS,
        "resumed too early: {waited} ms after standing down"
    );
    assert_eq!(back.reason(), Some(ChangeReason::Acquired));
    assert_eq!(s.holder().as_deref(), Some(a.instance_id.as_str()));
    b.resume().unwrap();
    std::thread::sleep(ms(REFRESH_MS * 3));
    assert!(
        !ever_led_after(&b, c),
        "the stale claimant led after resuming"
    );
}

#[test]
fn extended_claim_target_that_hangs_after_the_handoff_is_replaced_after_the_stale_bound() {
    let s = Scratch::new();
    let a = s.spawn("a");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let mut b = s.spawn("b");
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let (ca, cb) = (a.cursor(), b.cursor());
    b.send("claim").unwrap();
    // Handed over directly: b leads within milliseconds, no tick needed.
    let won = b
        .wait_after(cb, MARGIN, |r| r.is_leader() == Some(true))
        .expect("b never led");
    assert_eq!(won.reason(), Some(ChangeReason::Claimed));
    assert_eq!(s.holder().as_deref(), Some(b.instance_id.as_str()));
    // b hangs: a takes the lock back once b's record has not changed for
    // the stale bound, and b, resumed, reports it lost within a refresh.
    let inside = stop_outside_flock(&b, &s.lock_path());
    eprintln!("stops inside the flock before one outside: {inside}");
    let hung_at = Instant::now();
    let back = a
        .wait_after(ca, ms(STALE_MS + REFRESH_MS) + MARGIN, |r| {
            r.is_leader() == Some(true)
        })
        .expect("a never took back the hung target's lock");
    assert_eq!(back.reason(), Some(ChangeReason::Failover));
    assert!(
        hung_at.elapsed() >= ms(STALE_MS) - ms(REFRESH_MS),
        "evicted a live target early"
    );
    let cb = b.cursor();
    b.resume().unwrap();
    let lost = b
        .wait_after(cb, ms(REFRESH_MS) + MARGIN, |r| r.event() == "leadership")
        .expect("b silent after SIGCONT");
    // Lost when b's first look after SIGCONT reads a's record; fenced when
    // the SIGSTOP landed inside a look that had read b's own record (its
    // validity ran out meanwhile). The portable backend's watch wakes b a
    // little later after the handover, so the stop lands there more often.
    // Either way b stops acting at once, and says so.
    assert_eq!(lost.is_leader(), Some(false));
    assert!(
        matches!(
            lost.reason(),
            Some(ChangeReason::Lost | ChangeReason::Fenced)
        ),
        "{:?}",
        lost.reason()
    );
}

#[test]
fn relay_control_frames_drive_the_cooperative_steal() {
    let s = Scratch::new();
    let mut a = s.spawn("a");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let mut b = s.spawn("b");
    let mut c = s.spawn("c");
    assert!(wait_until(Duration::from_secs(5), || b.is_leader()
        == Some(false)
        && c.is_leader() == Some(false)));
    let frame = format!(
        r#"{{"type":"claim_leadership","targetInstanceId":"{}"}}"#,
        b.instance_id
    );
    let cursors = [a.cursor(), b.cursor(), c.cursor()];
    // Every co-located instance receives the broadcast.
    for i in [&mut a, &mut b, &mut c] {
        i.send(&frame).unwrap();
    }
    let stood = a
        .wait_after(cursors[0], Duration::from_secs(2), |r| {
            r.event() == "leadership"
        })
        .unwrap();
    assert_eq!(stood.reason(), Some(ChangeReason::StoodDown));
    let won = b.wait_after(cursors[1], ms(REFRESH_MS * 2) + MARGIN, |r| {
        r.is_leader() == Some(true)
    });
    // The frame reaches every instance: when the old leader handles it
    // first, it hands the lock to the target before the target's own frame
    // arrives (handed_over); otherwise the target's claim completes (claimed).
    let reason = won.expect("target never led").reason();
    assert!(
        matches!(
            reason,
            Some(ChangeReason::Claimed | ChangeReason::HandedOver)
        ),
        "{reason:?}"
    );
    let result = b
        .wait_after(cursors[1], Duration::from_secs(2), |r| {
            r.event() == "control_result"
        })
        .expect("the target answered the frame");
    assert!(matches!(
        &result.line,
        Line::ControlResult { result }
            if result.as_ref().is_none_or(|r| *r == nip_le::ControlResult::claimed())
    ));
    std::thread::sleep(ms(REFRESH_MS * 2));
    assert!(!ever_led_after(&c, cursors[2]));
    // An unknown frame type is ignored.
    let cb = b.cursor();
    b.send(r#"{"type":"cancel_turn","channelId":"x"}"#).unwrap();
    let r = b
        .wait_after(cb, Duration::from_secs(2), |r| {
            r.event() == "control_result"
        })
        .unwrap();
    assert_eq!(r.line, Line::ControlResult { result: None });
    assert_eq!(b.is_leader(), Some(true));
}

#[test]
fn sigstopped_leader_past_the_stale_bound_is_replaced_and_reports_observer_after_sigcont() {
    sigstopped_leader(extended);
}

#[test]
fn spec_sigstopped_leader_past_the_stale_bound_is_replaced() {
    sigstopped_leader(spec);
}

fn sigstopped_leader(
    mode: fn(nip_le_cli::lab::cluster::RunOptions) -> nip_le_cli::lab::cluster::RunOptions,
) {
    let s = Scratch::new();
    let a = s.spawn_with("a", mode(s.opts()));
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let b = s.spawn_with("b", mode(s.opts()));
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let cb = b.cursor();
    stop_outside_flock(&a, &s.lock_path());
    let stopped = Instant::now();
    let took = b.wait_after(cb, ms(STALE_MS + REFRESH_MS) + MARGIN, |r| {
        r.is_leader() == Some(true)
    });
    let took = took.expect("b never replaced the hung leader");
    assert_eq!(took.reason(), Some(ChangeReason::Failover));
    assert!(
        stopped.elapsed() >= ms(STALE_MS) - ms(REFRESH_MS),
        "replaced a live leader early"
    );
    let ca = a.cursor();
    a.resume().unwrap();
    let r = a.wait_after(ca, ms(REFRESH_MS) + MARGIN, |r| r.event() == "leadership");
    let r = r.expect("a did not report after SIGCONT");
    assert_eq!(
        (r.is_leader(), r.reason()),
        (Some(false), Some(ChangeReason::Lost))
    );
    assert_eq!(s.holder().as_deref(), Some(b.instance_id.as_str()));
}

#[test]
fn mentions_are_answered_once_by_the_leader_only() {
    let s = Scratch::new();
    let (opts, mentions, replies) = s.fed_opts(b"{\"id\":\"before-start\"}\n");
    let insts: Vec<_> = (0..3)
        .map(|i| s.spawn_with(&format!("i{i}"), opts.clone()))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || leaders(&insts).len() == 1));
    let leader = leaders(&insts)[0].clone();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&mentions)
        .unwrap();
    for n in 0..10 {
        std::io::Write::write_all(&mut f, format!("{{\"id\":{n}}}\n").as_bytes()).unwrap();
    }
    assert!(wait_until(Duration::from_secs(5), || insts.iter().all(
        |i| i
            .reports()
            .iter()
            .filter(|r| r.event() == "mention")
            .count()
            == 10
    )));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&replies)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10, "{lines:?}");
    for (n, l) in lines.iter().enumerate() {
        assert_eq!(l["mention"], n);
        assert_eq!(l["instance_id"], leader.as_str());
    }
}

#[test]
fn inherited_election_id_is_honoured() {
    let s = Scratch::new();
    let mut cmd = s.opts().command(None);
    cmd.env(nip_le::identity::ELECTION_ID_ENV, "window-42");
    let a = Instance::spawn("a", cmd, Duration::from_secs(10)).unwrap();
    assert_eq!(a.instance_id, "window-42");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    assert_eq!(s.holder().as_deref(), Some("window-42"));
}

#[test]
fn bad_pubkey_or_option_exits_non_zero_and_writes_nothing() {
    let s = Scratch::new();
    let bad: &[&[&str]] = &[
        &["run", "--pubkey", "../../etc/passwd"],
        &["run", "--pubkey", ""],
        &["run", "--pubkey", &"g".repeat(64)],
        &["run", "--pubkey", &"a".repeat(63)],
        &[
            "run",
            "--pubkey",
            &"a".repeat(64),
            "--refresh-ms",
            "500",
            "--stale-ms",
            "500",
        ],
        &["run", "--pubkey", &"a".repeat(64), "--refresh-ms", "0"],
        &["run", "--pubkey", &"a".repeat(64), "--instance-id", ""],
        &["run", "--pubkey", &"a".repeat(64), "--mentions", "/tmp/x"],
    ];
    for args in bad {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nip-le"))
            .args(*args)
            .arg("--lock-dir")
            .arg(&s.lock_dir)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            out.stdout.is_empty(),
            "{args:?} printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.trim().is_empty(), "{args:?}: no error message");
        assert!(!s.lock_dir.exists(), "{args:?} created the lock dir");
    }
}

#[test]
fn status_lists_hostile_files_without_crashing() {
    let unrelated = Unrelated::start();
    let s = Scratch::new();
    std::fs::create_dir_all(&s.lock_dir).unwrap();
    let d = &s.lock_dir;
    let k = |c: char| c.to_string().repeat(64);
    std::fs::write(
        d.join(format!("{}.lock", k('a'))),
        nip_le::record::encode_record("live", unrelated.pid(), SystemTime::now(), None),
    )
    .unwrap();
    std::fs::write(d.join(format!("{}.lock", k('b'))), b"").unwrap();
    std::fs::write(d.join(format!("{}.lock", k('c'))), b"{oops").unwrap();
    std::fs::write(d.join(format!("{}.lock", k('d'))), vec![b'x'; 100_000]).unwrap();
    // Unix: a Windows symlink needs a privilege a user rarely has.
    #[cfg(unix)]
    std::os::unix::fs::symlink("/etc/passwd", d.join(format!("{}.lock", k('e')))).unwrap();
    std::fs::create_dir(d.join(format!("{}.lock", k('f')))).unwrap();
    std::fs::write(d.join("not-a-key.lock"), b"").unwrap();
    std::fs::write(
        d.join(format!("{}.lock", k('1'))),
        nip_le::record::encode_record("dead", 0, SystemTime::now(), None),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nip-le"))
        .args(["status", "--json", "--lock-dir"])
        .arg(d)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let state = |c: &str| {
        rows.iter()
            .find(|r| r["file"].as_str().unwrap().starts_with(c))
            .unwrap()
            .clone()
    };
    let live = state(&k('a'));
    assert_eq!(
        (
            live["state"].as_str(),
            live["holder"].as_str(),
            live["pid_alive"].as_bool()
        ),
        (Some("record"), Some("live"), Some(true))
    );
    assert_eq!(live["takeable"], false);
    assert_eq!(state(&k('b'))["state"], "empty");
    assert_eq!(state(&k('c'))["state"], "malformed");
    assert_eq!(state(&k('d'))["state"], "oversized");
    #[cfg(unix)]
    assert_eq!(state(&k('e'))["state"], "symlink");
    assert_eq!(state(&k('f'))["state"], "directory");
    assert_eq!(state("not-a-key")["valid_pubkey"], false);
    let dead = state(&k('1'));
    assert_eq!(
        (dead["pid_alive"].as_bool(), dead["takeable"].as_bool()),
        (Some(false), Some(true))
    );
    // The table form works too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nip-le"))
        .args(["status", "--lock-dir"])
        .arg(d)
        .output()
        .unwrap();
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("oversized"), "{table}");
    #[cfg(unix)]
    assert!(table.contains("symlink"), "{table}");
}

#[test]
fn old_leader_takes_over_at_once_when_the_claimant_leaves_right_after_winning() {
    let s = Scratch::new();
    // A long stand-down: only the end-of-handoff rule can explain a takeover
    // within a refresh.
    let opts = s.opts().timings(REFRESH_MS, STALE_MS, 5_000);
    let a = s.spawn_with("a", opts.clone());
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let mut b = s.spawn_with("b", opts);
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(false)));
    let cb = b.cursor();
    b.send("claim").unwrap();
    assert!(b
        .wait_after(cb, ms(REFRESH_MS * 2) + MARGIN, |r| r.reason()
            == Some(ChangeReason::Claimed))
        .is_some());
    let ca = a.cursor();
    b.terminate().unwrap();
    assert!(b.wait_exit(Duration::from_secs(5)).unwrap().success());
    let back = a.wait_after(ca, ms(REFRESH_MS) + MARGIN, |r| r.is_leader() == Some(true));
    assert!(
        back.is_some(),
        "the old leader waited out its stand-down: {:?}",
        a.reports()
    );
}

/// Unix: the hanging peer is Python's `fcntl.flock` and SIGSTOP.
#[cfg(unix)]
#[test]
fn a_peer_hanging_on_the_file_lock_never_blocks_commands_or_the_refresh() {
    let s = Scratch::new();
    let mut a = s.spawn("a");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    // A peer takes the exclusive lock on the lock file, then hangs (SIGSTOP).
    let script = format!(
        "import fcntl,os,signal\nfd=os.open({:?}, os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)\n",
        s.lock_path().to_str().unwrap()
    );
    let mut peer = std::process::Command::new("python3")
        .arg("-c")
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(peer.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "locked");
    // Every command still answers promptly: the lock wait is bounded.
    for cmd in ["claim", "release", "status", "resume"] {
        let c = a.cursor();
        let sent = Instant::now();
        a.send(cmd).unwrap();
        let r = a.wait_after(c, Duration::from_secs(2), |r| r.event() == cmd);
        assert!(
            r.is_some(),
            "{cmd} got no answer while a peer hangs on the lock"
        );
        assert!(
            sent.elapsed() < ms(REFRESH_MS) + MARGIN,
            "{cmd} took {:?}",
            sent.elapsed()
        );
    }
    let c = a.cursor();
    a.send("status").unwrap();
    let st = a
        .wait_after(c, Duration::from_secs(2), |r| r.event() == "status")
        .unwrap();
    let Line::Status(st) = st.line else {
        panic!("not a status line")
    };
    assert!(
        st.last_error
            .as_deref()
            .unwrap_or("")
            .contains("lock not obtained"),
        "{st:?}"
    );
    // The hung peer dies: its flock goes with it and a leads again.
    peer.kill().unwrap();
    peer.wait().unwrap();
    assert!(wait_until(ms(REFRESH_MS) + MARGIN, || a.is_leader() == Some(true)));
    assert_eq!(s.holder().as_deref(), Some(a.instance_id.as_str()));
}

#[test]
fn a_leader_that_regains_the_lock_after_a_stop_first_says_it_was_fenced() {
    // a is stopped past its validity, b takes over and dies, a resumes and
    // takes the dead holder's lock at once. Others led in between, so the
    // regained lead is a new tenure: `fenced`, then the gain, never one
    // unbroken lead (a window that trusted it would answer, from its
    // backlog, mentions the others answered while it was stopped).
    let s = Scratch::new();
    let mut insts: Vec<Instance> = (0..2).map(|i| s.spawn(&format!("i{i}"))).collect();
    assert!(wait_until(Duration::from_secs(5), || leaders(&insts).len()
        == 1
        && insts.iter().all(|i| i.is_leader().is_some())));
    let a = insts
        .iter()
        .position(|i| i.is_leader() == Some(true))
        .unwrap();
    let b = 1 - a;
    let ca = insts[a].cursor();
    let cb = insts[b].cursor();
    stop_outside_flock(&insts[a], &s.lock_path());
    assert!(
        wait_until(Duration::from_secs(5), || ever_led_after(&insts[b], cb)),
        "b never replaced the stopped leader"
    );
    insts[b].kill_and_reap().unwrap();
    insts[a].resume().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || insts[a].is_leader()
            == Some(true)
            && ever_led_after(&insts[a], ca)),
        "a reported no new lead after the stop: it took the dead holder's lock \
         silently (its lead looked unbroken), or not at all"
    );
    let views: Vec<(bool, Option<ChangeReason>)> = insts[a]
        .reports()
        .iter()
        .skip(ca)
        .filter_map(|r| Some((r.is_leader()?, r.reason())))
        .collect();
    assert_eq!(
        views.first().map(|v| v.0),
        Some(false),
        "a's lead looked unbroken across the stop: {views:?}"
    );
    assert_eq!(
        views.first().and_then(|v| v.1),
        Some(ChangeReason::Fenced),
        "{views:?}"
    );
}

#[test]
fn a_hung_holder_is_replaced_at_the_stale_bound_though_a_killed_window_claimed_it() {
    let s = Scratch::new();
    // A long stand-down: a claim that still counted after its claimant
    // died would hold the takeover back until it expired.
    let opts = s.opts().timings(REFRESH_MS, STALE_MS, 5_000);
    let a = s.spawn_with("a", opts.clone());
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let mut b = s.spawn_with("b", opts.clone());
    let c = s.spawn_with("c", opts);
    assert!(wait_until(Duration::from_secs(5), || {
        b.is_leader() == Some(false) && c.is_leader() == Some(false)
    }));
    let cc = c.cursor();
    stop_outside_flock(&a, &s.lock_path());
    let hung_at = Instant::now();
    b.send("claim").unwrap();
    let request = nip_le::control::lead_request_path(&s.lock_dir, &s.pubkey);
    assert!(wait_until(Duration::from_secs(2), || request.exists()));
    b.kill_and_reap().unwrap();
    let took = c
        .wait_after(cc, ms(STALE_MS + REFRESH_MS) + MARGIN, |r| {
            r.is_leader() == Some(true)
        })
        .unwrap_or_else(|| panic!("c waited for the dead claimant's claim: {:?}", c.reports()));
    assert_eq!(took.reason(), Some(ChangeReason::Failover));
    assert!(hung_at.elapsed() < ms(5_000), "not the claim's expiry");
    a.resume().unwrap();
}
