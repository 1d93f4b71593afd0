//! Agent harness children that share their window's instance id, as a
//! window hands `BUZZ_INSTANCE_ELECTION_ID` to the harness it spawns
//! (INTEROP.md): the independent Python writer (`support/foreign_harness.py`)
//! started with the window's instance id rewrites the record every refresh with its
//! own pid and none of our fields, and truncates the file when it exits.
//! Real processes, real `flock`s, real signals: none of that moves
//! leadership or changes the epoch, and the window's record is back
//! within a wake-up.
#![cfg(unix)]

mod support;

use std::time::Duration;

use nip_le::record::LockContent;
use nip_le_cli::drive::cluster::{wait_until, Instance};
use support::*;

/// The record in the lock file, once one is readable whole.
fn record(s: &Scratch) -> Option<nip_le::record::LockRecord> {
    match LockContent::parse(&s.raw()) {
        LockContent::Record(r) => Some(r),
        _ => None,
    }
}

#[test]
fn a_harness_child_with_the_windows_id_never_moves_leadership_nor_its_epoch() {
    let s = Scratch::new();
    let window = Instance::spawn(
        "window",
        s.opts().command(Some("window-1")),
        Duration::from_secs(10),
    )
    .expect("nip-le run starts");
    assert!(wait_until(Duration::from_secs(5), || window.is_leader() == Some(true)));
    let observer = s.spawn("observer");
    assert!(wait_until(Duration::from_secs(5), || observer.is_leader()
        == Some(false)));
    let ours = |r: &nip_le::record::LockRecord| r.pid == window.pid && r.live.is_some();
    assert!(wait_until(Duration::from_secs(2), || record(&s)
        .is_some_and(|r| ours(&r))));
    let epoch = record(&s).and_then(|r| r.epoch).expect("an epoch");
    for (round, sig) in [libc::SIGTERM, libc::SIGKILL, libc::SIGTERM]
        .into_iter()
        .enumerate()
    {
        let log = s.tmp.path().join(format!("child{round}.writes"));
        let log_arg = log.to_str().unwrap();
        let mut child = s.spawn_foreign_with(
            &format!("child{round}"),
            "window-1",
            &["--log-writes", log_arg],
        );
        let writes = || std::fs::read_to_string(&log).map_or(0, |l| l.lines().count());
        // The child acquires every refresh (its pid, none of our fields),
        // and the window writes its own record back each time.
        for n in 1..=3 {
            assert!(
                wait_until(ms(REFRESH_MS * 3) + MARGIN, || writes() >= n),
                "round {round}: the child rewrote the record"
            );
            assert!(
                wait_until(ms(REFRESH_MS) + MARGIN, || record(&s)
                    .is_some_and(|r| ours(&r))),
                "round {round}: the window's record is back within a wake-up"
            );
        }
        child.signal(sig).unwrap();
        child
            .wait_exit(Duration::from_secs(5))
            .expect("the child exits");
        assert!(
            wait_until(ms(REFRESH_MS) + MARGIN, || record(&s)
                .is_some_and(|r| ours(&r))),
            "round {round}: after the child's exit the window's record is back"
        );
        assert_eq!(
            record(&s).and_then(|r| r.epoch),
            Some(epoch),
            "round {round}"
        );
    }
    // Past the stale bound: still nobody else.
    std::thread::sleep(ms(STALE_MS));
    let views = window.views();
    assert_eq!(views.len(), 1, "the window's view never changed: {views:?}");
    assert!(!ever_led_after(&observer, 0), "the observer never led");
    assert!(views.iter().all(|v| v.epoch == Some(epoch)));
}

/// An inherited id the harness would write unescaped (`"`, `\`) or that is
/// not an id at all: refused at start with a clear error, nothing written.
#[test]
fn an_inherited_id_the_harness_cannot_carry_is_refused_at_start() {
    let s = Scratch::new();
    for bad in ["win\"1", "win\\1", "  "] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nip-le-lab"))
            .args(["run", "--pubkey", s.pubkey.as_str(), "--lock-dir"])
            .arg(&s.lock_dir)
            .env(nip_le::ELECTION_ID_ENV, bad)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?} was accepted");
        assert!(
            err.contains("BUZZ_INSTANCE_ELECTION_ID is set but unusable"),
            "{err}"
        );
        assert!(!s.lock_path().exists(), "{bad:?}: nothing is written");
    }
}
