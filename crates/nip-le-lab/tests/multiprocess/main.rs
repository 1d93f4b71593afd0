//! Real processes, real flocks, real signals: `nip-le run` instances sharing
//! one lock directory.

#[path = "../support/mod.rs"]
mod support;

mod claims;
mod cli;

use nip_le::ChangeReason;
use nip_le_cli::lines::Line;
use std::time::{Duration, Instant, SystemTime};

use nip_le_cli::drive::cluster::{wait_until, Instance};
use support::*;

/// The same options in spec mode.
fn spec(mut o: nip_le_cli::drive::cluster::RunOptions) -> nip_le_cli::drive::cluster::RunOptions {
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
fn extended(o: nip_le_cli::drive::cluster::RunOptions) -> nip_le_cli::drive::cluster::RunOptions {
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
    mode: fn(nip_le_cli::drive::cluster::RunOptions) -> nip_le_cli::drive::cluster::RunOptions,
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
        // (Each with why it first led: a fail-safe lead beside the first
        // writer was how a loaded disk once broke this.)
        let ever: Vec<_> = insts
            .iter()
            .filter(|i| ever_led_after(i, 0))
            .map(|i| {
                let why = i
                    .reports()
                    .iter()
                    .find(|r| r.event() == "leadership" && r.is_leader() == Some(true))
                    .and_then(|r| r.reason());
                format!("{} ({why:?})", i.name)
            })
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
    mode: fn(nip_le_cli::drive::cluster::RunOptions) -> nip_le_cli::drive::cluster::RunOptions,
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
        // a live writer across a clock step would have rewritten it). What
        // this guards is that the claim is taken; how soon is the
        // simulator's and the bench's: the take makes two writes durable,
        // which a disk loaded by a build beside the suite delayed past
        // MARGIN once in a clean-clone run.
        let r = a
            .wait_after(0, ms(STALE_MS + REFRESH_MS) + MARGIN + ms(5_000), |r| {
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
fn sigstopped_leader_past_the_stale_bound_is_replaced_and_reports_observer_after_sigcont() {
    sigstopped_leader(extended);
}

#[test]
fn spec_sigstopped_leader_past_the_stale_bound_is_replaced() {
    sigstopped_leader(spec);
}

fn sigstopped_leader(
    mode: fn(nip_le_cli::drive::cluster::RunOptions) -> nip_le_cli::drive::cluster::RunOptions,
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
