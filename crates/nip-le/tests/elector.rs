//! The elector's API in one process: two electors with distinct ids share a
//! lock directory (flock works between separate open file descriptions, so
//! this is a real contest), driven with `refresh_now` instead of waiting.

use std::time::Duration;

use nip_le::{ChangeReason, ClaimOutcome, ControlResult, Elector, Error, InstanceId, Mode};

mod common;

use common::*;

#[test]
fn first_joiner_leads_and_many_keys_are_independent() {
    let (_t, a, b) = pair();
    let mut ra = a.subscribe();
    assert!(a.join(&pk('1')).unwrap());
    assert!(!b.join(&pk('1')).unwrap());
    assert!(b.join(&pk('2')).unwrap());
    assert!(!a.join(&pk('2')).unwrap());
    assert!(a.is_leader(&pk('1')) && !a.is_leader(&pk('2')));
    assert!(!a.is_leader(&pk('3')), "unknown keys are never led");
    assert_eq!(
        drain(&mut ra),
        vec![
            (true, ChangeReason::Acquired),
            (false, ChangeReason::Observer)
        ]
    );
    // Joining twice is a no-op.
    assert!(a.join(&pk('1')).unwrap());
    assert_eq!(a.joined().len(), 2);
    let flag = b.leader_flag(&pk('2')).unwrap();
    assert!(flag.is_leader());
}

#[test]
fn unknown_key_calls_are_typed_errors() {
    let (_t, a, _b) = pair();
    assert!(matches!(a.claim(&pk('9')), Err(Error::NotJoined(_))));
    assert!(matches!(a.release(&pk('9')), Err(Error::NotJoined(_))));
    assert!(matches!(a.leave(&pk('9')), Err(Error::NotJoined(_))));
    assert!(matches!(a.leader_flag(&pk('9')), Err(Error::NotJoined(_))));
    a.join(&pk('1')).unwrap();
    assert!(matches!(
        a.handle_control_frame(&pk('1'), "not json"),
        Err(Error::ControlFrame(_))
    ));
    assert!(matches!(
        a.handle_control_frame(&pk('1'), r#"{"type":"claim_leadership"}"#),
        Err(Error::ControlFrame(_))
    ));
    assert_eq!(
        a.handle_control_frame(&pk('1'), r#"{"type":"something_new"}"#)
            .unwrap(),
        None
    );
}

#[test]
fn local_claim_hands_over_without_a_relay() {
    let (_t, a, b) = pair_with(extended);
    let k = pk('1');
    a.join(&k).unwrap();
    b.join(&k).unwrap();
    let (mut ra, mut rb) = (a.subscribe(), b.subscribe());
    assert!(matches!(
        b.claim(&k).unwrap(),
        ClaimOutcome::Pending | ClaimOutcome::Claimed
    ));
    // The holder learns of the request from the lock file's directory (its
    // watch, or its next look) and hands the lock straight to b.
    a.refresh_now();
    assert!(wait_until(|| b.is_leader(&k)), "the target never led");
    assert_eq!(drain(&mut ra), vec![(false, ChangeReason::StoodDown)]);
    // The flag is set a moment before the event is sent: wait for it.
    let mut told = Vec::new();
    assert!(wait_until(|| {
        told.extend(drain(&mut rb));
        told.last().map(|c| c.0) == Some(true)
    }));
    assert!(!a.is_leader(&k));
    assert_eq!(b.claim(&k).unwrap(), ClaimOutcome::AlreadyLeader);
    // The request was consumed: a does not stand down again after resuming.
    a.resume(&k).unwrap();
    assert!(!a.is_leader(&k));
    b.refresh_now();
    assert!(b.is_leader(&k));
}

#[test]
fn spec_claim_travels_only_as_a_relay_frame_and_touches_only_the_lock_file() {
    let (t, a, b) = pair();
    let k = pk('1');
    a.join(&k).unwrap();
    b.join(&k).unwrap();
    let (mut ra, mut rb) = (a.subscribe(), b.subscribe());
    assert_eq!(b.claim(&k).unwrap(), ClaimOutcome::Pending);
    assert!(b.status()[0].claim_pending);
    // No lead request on file: the holder knows nothing of the claim.
    a.refresh_now();
    assert!(a.is_leader(&k) && drain(&mut ra).is_empty());
    // The relay delivers the frame to both: the holder stands down and
    // releases, the target takes the lock.
    let frame = r#"{"type":"claim_leadership","targetInstanceId":"b"}"#;
    assert_eq!(a.handle_control_frame(&k, frame).unwrap(), None);
    assert_eq!(drain(&mut ra), vec![(false, ChangeReason::StoodDown)]);
    assert_eq!(
        b.handle_control_frame(&k, frame).unwrap(),
        Some(ControlResult::claimed())
    );
    assert_eq!(drain(&mut rb), vec![(true, ChangeReason::Claimed)]);
    assert!(b.is_leader(&k) && !a.is_leader(&k));
    b.release(&k).unwrap();
    a.resume(&k).unwrap();
    a.leave(&k).unwrap();
    b.leave(&k).unwrap();
    let names: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec![format!("{}.lock", k.as_str())],
        "spec mode wrote more than the lock file"
    );
}

#[test]
fn relay_frame_target_returns_the_control_result_once_it_holds_the_lock() {
    let (_t, a, b) = pair();
    let k = pk('1');
    a.join(&k).unwrap();
    b.join(&k).unwrap();
    let frame = r#"{"type":"claim_leadership","targetInstanceId":"b"}"#;
    // The leader processes the broadcast first: stands down and releases.
    assert_eq!(a.handle_control_frame(&k, frame).unwrap(), None);
    assert!(!a.is_leader(&k));
    // The target then holds the lock at once.
    assert_eq!(
        b.handle_control_frame(&k, frame).unwrap(),
        Some(ControlResult::claimed())
    );
    assert!(b.is_leader(&k));
    // An observer that is not the target ignores it.
    let c = Elector::start(config(_t.path()), InstanceId::new("c").unwrap()).unwrap();
    c.join(&k).unwrap();
    assert_eq!(c.handle_control_frame(&k, frame).unwrap(), None);
    assert!(!c.is_leader(&k) && b.is_leader(&k));
}

#[test]
fn release_steps_down_and_leave_and_shutdown_release() {
    let (t, a, b) = pair();
    let k = pk('1');
    a.join(&k).unwrap();
    b.join(&k).unwrap();
    let path = nip_le::lockfile::lock_path(t.path(), &k);
    let mut ra = a.subscribe();
    assert!(a.release(&k).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), b"");
    assert_eq!(drain(&mut ra), vec![(false, ChangeReason::Released)]);
    a.refresh_now(); // standing down: does not take it straight back
    assert!(!a.is_leader(&k));
    b.refresh_now();
    assert!(b.is_leader(&k));
    assert!(!a.release(&k).unwrap(), "released a successor's claim");
    // leave releases b's claim; shutdown is idempotent and ends the API.
    b.leave(&k).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"");
    a.resume(&k).unwrap();
    assert!(a.is_leader(&k));
    a.shutdown();
    a.shutdown();
    assert_eq!(std::fs::read(&path).unwrap(), b"");
    assert!(matches!(a.join(&pk('2')), Err(Error::ShutDown)));
    assert!(!a.is_leader(&k));
}

#[test]
fn invalid_config_is_rejected_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path());
    c.stale = c.refresh;
    assert!(matches!(
        Elector::start(c, InstanceId::random()),
        Err(Error::Config(_))
    ));
}

#[cfg(unix)]
#[test]
fn lock_dir_is_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("new/leader-locks");
    let a = Elector::start(config(&dir), InstanceId::random()).unwrap();
    a.join(&pk('1')).unwrap();
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let f = nip_le::lockfile::lock_path(&dir, &pk('1'));
    assert_eq!(
        std::fs::metadata(f).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[cfg(unix)]
#[test]
fn a_lock_dir_others_may_write_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shared");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = Elector::start(config(&dir), InstanceId::random()).unwrap_err();
    assert!(matches!(e, Error::UnsafeLockDir { .. }), "{e}");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    Elector::start(config(&dir), InstanceId::random()).unwrap();
}

// ---- extended mode ----------------------------------------------------------

#[test]
fn extended_leader_fences_while_a_peer_hangs_on_the_file_lock_and_stops_once_it_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let c = fast_extended(tmp.path());
    let stale = c.stale;
    let a = Elector::start(c, InstanceId::new("a").unwrap()).unwrap();
    let k = pk('1');
    assert!(a.join(&k).unwrap());
    let flag = a.leader_flag(&k).unwrap();
    let mut ra = a.subscribe();
    // A peer hangs holding the file lock for several stale bounds. Nobody
    // can write, but that renews nothing: an observer that never tried to
    // lock would time us from our last write. We fence at its deadline
    // (within the stale bound) and say so; our first write after the hold
    // unfences us, with no other change.
    let path = nip_le::lockfile::lock_path(tmp.path(), &k);
    let held = nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(1)).unwrap();
    let start = std::time::Instant::now();
    assert!(wait_until(|| !flag.is_leader()), "never fenced while held");
    assert!(start.elapsed() <= stale + Duration::from_millis(100));
    std::thread::sleep(stale * 2);
    assert!(!flag.is_leader(), "unfenced while nobody could write");
    drop(held);
    assert!(
        wait_until(|| flag.is_leader()),
        "not unfenced after the hold"
    );
    let told: Vec<(bool, ChangeReason)> = drain(&mut ra);
    assert_eq!(
        told,
        vec![
            (false, ChangeReason::Fenced),
            (true, ChangeReason::Unfenced)
        ]
    );
    // The peer takes the lock again and writes a record of its own while it
    // holds it: we see it without the lock, and stop at once.
    let mut held =
        nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(1)).unwrap();
    held.write(&nip_le::record::encode_record(
        "peer",
        std::process::id(),
        std::time::SystemTime::now(),
        None,
    ))
    .unwrap();
    assert!(
        wait_until(|| !flag.is_leader()),
        "still leading over a peer's record"
    );
    let c = ra.blocking_recv().unwrap();
    assert_eq!(
        (c.is_leader, c.reason, c.must_cancel_turn),
        (false, ChangeReason::Lost, true)
    );
    drop(held);
}

#[test]
fn extended_does_not_evict_a_live_holder_for_an_old_claimed_at_but_spec_does() {
    // A live holder (its presence lock is held) whose claimed_at is an hour
    // old: the machine slept. Extended instances leave it alone; the NIP's
    // wall-clock rule takes it.
    let tmp = tempfile::tempdir().unwrap();
    let k = pk('1');
    let mut sleeper =
        nip_le::presence::Presence::create(tmp.path(), "sleeper", nip_le::Backend::Native).unwrap();
    sleeper.set_keys([k]).unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let record = nip_le::record::encode_record(
        "sleeper",
        std::process::id(),
        old,
        Some(nip_le::record::RecordExt {
            epoch: 3,
            live: sleeper.token(),
        }),
    );
    let path = nip_le::lockfile::lock_path(tmp.path(), &k);
    std::fs::write(&path, &record).unwrap();
    let ext = Elector::start(extended(tmp.path()), InstanceId::new("ext").unwrap()).unwrap();
    assert!(!ext.join(&k).unwrap());
    ext.refresh_now();
    assert!(!ext.is_leader(&k));
    assert_eq!(std::fs::read(&path).unwrap(), record);
    let spec = Elector::start(config(tmp.path()), InstanceId::new("spec").unwrap()).unwrap();
    assert!(spec.join(&k).unwrap(), "the NIP's stale rule takes it");
    // Once the sleeper is really gone, extended instances take over at once.
    spec.leave(&k).unwrap();
    // Written as a writer does (in place, under the flock): never empty.
    nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(1))
        .unwrap()
        .write(&record)
        .unwrap();
    // ext may have taken the lock in the moment the spec instance left it
    // empty; it observes the sleeper again first.
    assert!(
        wait_until(|| !ext.is_leader(&k)),
        "ext ignored the live sleeper"
    );
    drop(sleeper);
    // The holder-death waiter wakes ext; no refresh call needed.
    assert!(
        wait_until(|| ext.is_leader(&k)),
        "no takeover after the holder left"
    );
    let now = nip_le::lockfile::read_unguarded(&path)
        .unwrap()
        .record()
        .cloned()
        .unwrap();
    // One above the sleeper's (or above ext's own, if ext took the lock in
    // the moment the spec instance left it empty).
    assert_eq!(now.instance_id, "ext");
    assert!(now.epoch.is_some_and(|e| e > 3), "{:?}", now.epoch);
}

#[test]
fn unusable_lock_dir_fails_safe_to_leader_instead_of_refusing_to_run() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("locks");
    std::fs::write(&not_a_dir, b"a file where the directory should be").unwrap();
    for mode in [Mode::Spec, Mode::Extended] {
        let mut c = config(&not_a_dir);
        c.mode = mode;
        let e = Elector::start(c, InstanceId::new("a").unwrap()).unwrap();
        assert!(
            e.join(&pk('1')).unwrap(),
            "[{mode:?}] the NIP's fail-safe: lead"
        );
        let st = &e.status()[0];
        assert!(st.last_error.is_some(), "[{mode:?}] the reason is reported");
        assert_eq!(
            std::fs::read(&not_a_dir).unwrap(),
            b"a file where the directory should be"
        );
    }
}

#[test]
fn any_loss_of_leadership_mid_turn_cancels_the_turn() {
    for cfg in [config, extended] {
        let tmp = tempfile::tempdir().unwrap();
        let a = Elector::start(cfg(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
        let k = pk('1');
        assert!(a.join(&k).unwrap());
        let mut ra = a.subscribe();
        // The harness takes the key (a live pid, a fresh claimed_at): we
        // have lost it, and the turn we were running must stop.
        let harness = nip_le::record::encode_record(
            "harness",
            std::process::id(),
            std::time::SystemTime::now(),
            None,
        );
        let path = nip_le::lockfile::lock_path(tmp.path(), &k);
        nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(1))
            .unwrap()
            .write(&harness)
            .unwrap();
        a.refresh_now();
        let c = ra.blocking_recv().unwrap();
        assert_eq!(
            (c.is_leader, c.reason, c.must_cancel_turn),
            (false, ChangeReason::Lost, true),
            "{c:?}"
        );
    }
}

#[test]
fn fencing_epochs_never_go_backwards_across_a_truncating_release_or_a_harness_write() {
    let tmp = tempfile::tempdir().unwrap();
    let k = pk('1');
    let path = nip_le::lockfile::lock_path(tmp.path(), &k);
    let epoch = || {
        nip_le::lockfile::read_unguarded(&path)
            .unwrap()
            .record()
            .and_then(|r| r.epoch)
    };
    let mut last = 0;
    for round in 0..3 {
        // A holder that nobody else knows of: it releases by truncating
        // (no live sibling), so the next holder sees an empty file.
        let a = Elector::start(extended(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
        assert!(a.join(&k).unwrap());
        let e = epoch().expect("an extended record carries an epoch");
        assert!(e > last, "round {round}: epoch {e} after {last}");
        last = e;
        a.shutdown();
        assert!(nip_le::lockfile::read_unguarded(&path)
            .unwrap()
            .record()
            .is_none());
        // The harness leads for a while: a record without an epoch, then
        // its release.
        std::fs::write(
            &path,
            nip_le::record::encode_record("harness", 1, std::time::SystemTime::now(), None),
        )
        .unwrap();
        std::fs::write(&path, b"").unwrap();
    }
}

#[test]
fn no_takeover_of_a_live_harness_on_a_wall_clock_step_in_either_direction() {
    for step_secs in [3_600i64, -3_600] {
        let tmp = tempfile::tempdir().unwrap();
        let c = fast_extended(tmp.path());
        let k = pk('1');
        let path = nip_le::lockfile::lock_path(tmp.path(), &k);
        std::fs::create_dir_all(tmp.path()).unwrap();
        // The harness (a live pid, no presence) refreshes every 100 ms, its
        // stamps an hour off ours: one of the two clocks stepped.
        let stamp = move || {
            let d = Duration::from_secs(step_secs.unsigned_abs());
            let now = std::time::SystemTime::now();
            let t = if step_secs > 0 { now + d } else { now - d };
            nip_le::record::encode_record("harness", std::process::id(), t, None)
        };
        std::fs::write(&path, stamp()).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(1))
                        .unwrap()
                        .write(&stamp())
                        .unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        let a = Elector::start(c, InstanceId::new("a").unwrap()).unwrap();
        assert!(!a.join(&k).unwrap());
        let end = std::time::Instant::now() + Duration::from_millis(1_000);
        while std::time::Instant::now() < end {
            assert!(!a.is_leader(&k), "[{step_secs:+}] took over a live harness");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The harness stops refreshing (hung, or its pid recycled): its
        // record is taken once it has stayed unchanged past the bound.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert!(
            wait_until(|| a.is_leader(&k)),
            "[{step_secs:+}] never took an abandoned record"
        );
    }
}

/// A record as an extended instance on `host`, in boot `boot`, writes it.
fn record_from(host: &str, boot: &str, pid: u32) -> Vec<u8> {
    format!(
        r#"{{"instance_id":"elsewhere","pid":{pid},"claimed_at":"{}","epoch":5,"live":"1-0123456789abcdef","host":"{host}","boot":"{boot}"}}"#,
        nip_le::record::format_claimed_at(std::time::SystemTime::now())
    )
    .into_bytes()
}

#[test]
fn a_record_from_an_earlier_boot_of_this_host_is_dead_at_once() {
    let here = nip_le::host::here();
    let (Some(host), Some(_)) = (&here.host, &here.boot) else {
        eprintln!("no boot id on this platform: nothing to test");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let k = pk('1');
    let path = nip_le::lockfile::lock_path(tmp.path(), &k);
    std::fs::create_dir_all(tmp.path()).unwrap();
    // Fresh, and its pid (ours) is alive: before the reboot, that pid was
    // someone else.
    std::fs::write(
        &path,
        record_from(host, "an-earlier-boot", std::process::id()),
    )
    .unwrap();
    let a = Elector::start(extended(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    let mut ra = a.subscribe();
    assert!(
        a.join(&k).unwrap(),
        "a recycled pid kept a dead holder alive"
    );
    assert_eq!(ra.blocking_recv().unwrap().reason, ChangeReason::Failover);
}

#[test]
fn a_record_from_another_host_is_never_judged_by_its_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let c = fast_extended(tmp.path());
    let k = pk('1');
    let path = nip_le::lockfile::lock_path(tmp.path(), &k);
    std::fs::create_dir_all(tmp.path()).unwrap();
    // A pid that is dead here (a child we reaped) is alive on its host,
    // whose holder keeps refreshing over the shared directory.
    // This test binary, listing its tests: a child that exits at once on
    // every platform.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--list")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let write = move || {
        nip_le::lockfile::LockedFile::open_and_lock(&path, Duration::from_secs(1))
            .unwrap()
            .write(&record_from("another-host", "its-boot", pid))
            .unwrap();
    };
    write();
    let a = Elector::start(c, InstanceId::new("a").unwrap()).unwrap();
    assert!(!a.join(&k).unwrap(), "judged another host's pid as dead");
    let end = std::time::Instant::now() + Duration::from_millis(900);
    while std::time::Instant::now() < end {
        write();
        assert!(!a.is_leader(&k), "took over a live holder of another host");
        std::thread::sleep(Duration::from_millis(50));
    }
    // It stops refreshing: taken once unchanged past the bound, by our clock.
    assert!(
        wait_until(|| a.is_leader(&k)),
        "never took an abandoned record"
    );
}
