//! Interop with an independent writer that follows INTEROP.md's format
//! (`support/foreign_harness.py`, Python: none of our code on its side).
//! Each side must respect the other's live claims, releases and deaths.
// Unix only: the foreign writer is Python with `fcntl.flock`, which
// Windows' Python lacks, and a Windows build has no Python to run here.
#![cfg(unix)]

mod support;

use nip_le::ChangeReason;
use std::time::Duration;

use nip_le_cli::drive::cluster::wait_until;
use support::*;

fn settle() -> Duration {
    ms(REFRESH_MS * 3)
}

#[test]
fn ours_respects_a_live_foreign_claim_and_takes_over_after_its_release() {
    let s = Scratch::new();
    let mut f = s.spawn_foreign("foreign", "harness-1");
    assert!(wait_until(Duration::from_secs(5), || f.is_leader() == Some(true)));
    let a = s.spawn("ours");
    let r = a
        .wait_for(Duration::from_secs(5), |r| {
            r.iter().find(|r| r.event() == "leadership").cloned()
        })
        .unwrap();
    assert_eq!(
        (r.is_leader(), r.reason()),
        (Some(false), Some(ChangeReason::Observer))
    );
    // The foreign leader keeps refreshing: we never take it, for many ticks
    // and past the stale bound.
    std::thread::sleep(ms(STALE_MS * 2));
    assert!(!ever_led_after(&a, 0));
    // The harness rewrites by truncating first, so a read may catch the
    // file empty: read until a whole record is seen.
    let mut holder = None;
    assert!(
        wait_until(Duration::from_secs(1), || {
            holder = s.holder();
            holder.is_some()
        }),
        "no record readable"
    );
    assert_eq!(holder.as_deref(), Some("harness-1"));
    // Its graceful release (truncation) lets us take over on our next tick.
    f.terminate().unwrap();
    assert!(f.wait_exit(Duration::from_secs(5)).unwrap().success());
    assert!(wait_until(ms(REFRESH_MS) + MARGIN, || a.is_leader() == Some(true)));
    assert_eq!(s.holder().as_deref(), Some(a.instance_id.as_str()));
}

#[test]
fn foreign_respects_our_live_claim_and_takes_over_after_our_release() {
    let s = Scratch::new();
    let mut a = s.spawn("ours");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let f = s.spawn_foreign("foreign", "harness-1");
    // The foreign reader parses our record strictly and sees it is not the
    // leader; it stays so past the stale bound because we refresh.
    assert!(wait_until(Duration::from_secs(5), || f.is_leader() == Some(false)));
    std::thread::sleep(ms(STALE_MS * 2));
    assert!(
        !ever_led_after(&f, 0),
        "the foreign writer took our live claim"
    );
    assert_eq!(s.holder().as_deref(), Some(a.instance_id.as_str()));
    a.terminate().unwrap();
    assert!(a.wait_exit(Duration::from_secs(5)).unwrap().success());
    assert!(wait_until(ms(REFRESH_MS) + MARGIN, || f.is_leader() == Some(true)));
    assert_eq!(s.holder().as_deref(), Some("harness-1"));
}

#[test]
fn each_side_takes_over_after_the_other_dies() {
    // Foreign dies → ours takes over by dead pid.
    let s = Scratch::new();
    let mut f = s.spawn_foreign("foreign", "harness-1");
    assert!(wait_until(Duration::from_secs(5), || f.is_leader() == Some(true)));
    let a = s.spawn_with("ours", s.opts().timings(REFRESH_MS, 30_000, STAND_DOWN_MS));
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(false)));
    let c = a.cursor();
    f.kill_and_reap().unwrap();
    let r = a.wait_after(c, ms(REFRESH_MS) + MARGIN, |r| r.is_leader() == Some(true));
    assert_eq!(
        r.expect("no takeover after the foreign leader died")
            .reason(),
        Some(ChangeReason::Failover)
    );

    // Ours dies → foreign takes over by dead pid.
    let s = Scratch::new();
    let mut a = s.spawn("ours");
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let f = s.spawn_foreign("foreign", "harness-2");
    assert!(wait_until(Duration::from_secs(5), || f.is_leader() == Some(false)));
    a.kill_and_reap().unwrap();
    assert!(wait_until(ms(REFRESH_MS) + MARGIN, || f.is_leader() == Some(true)));
    assert_eq!(s.holder().as_deref(), Some("harness-2"));
}

#[test]
fn mixed_crowd_elects_exactly_one_leader() {
    let s = Scratch::new();
    let insts: Vec<_> = (0..6)
        .map(|i| {
            if i % 2 == 0 {
                s.spawn(&format!("ours{i}"))
            } else {
                s.spawn_foreign(&format!("foreign{i}"), &format!("harness-{i}"))
            }
        })
        .collect();
    assert!(wait_until(Duration::from_secs(5), || insts
        .iter()
        .all(|i| i.is_leader().is_some())));
    std::thread::sleep(settle());
    let l = leaders(&insts);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(s.holder(), Some(l[0].clone()));
}

#[test]
fn our_bytes_match_the_harness_format_exactly() {
    // Spec mode: exactly the three fields, in the harness's order and types.
    let s = Scratch::new();
    let mut opts = s.opts();
    opts.extra_args = vec!["--mode".into(), "spec".into()];
    let a = s.spawn_with("ours", opts);
    assert!(wait_until(Duration::from_secs(5), || a.is_leader() == Some(true)));
    let raw = String::from_utf8(s.raw()).unwrap();
    let prefix = format!(
        r#"{{"instance_id":"{}","pid":{},"claimed_at":""#,
        a.instance_id, a.pid
    );
    assert!(raw.starts_with(&prefix), "{raw}");
    let ts = raw[prefix.len()..]
        .strip_suffix("\"}")
        .expect("ends with the claimed_at string");
    // chrono's default RFC 3339, as the harness writes it.
    let t = chrono::DateTime::parse_from_rfc3339(ts).expect(ts);
    assert_eq!(t.with_timezone(&chrono::Utc).to_rfc3339(), ts);

    // Extended mode: the same three fields first, then only added fields.
    let s = Scratch::new();
    let b = s.spawn("ours-extended");
    assert!(wait_until(Duration::from_secs(5), || b.is_leader() == Some(true)));
    let raw = String::from_utf8(s.raw()).unwrap();
    let prefix = format!(
        r#"{{"instance_id":"{}","pid":{},"claimed_at":""#,
        b.instance_id, b.pid
    );
    assert!(raw.starts_with(&prefix), "{raw}");
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
    // serde_json's map is ordered by key; host and boot where the machine
    // has them (the portable backend, run by NIP_LE_BACKEND=portable, writes
    // no boot, as on Windows).
    let here = nip_le::host::here();
    let native = nip_le::config::backend_from_env().unwrap() == nip_le::Backend::Native;
    let mut expected = vec!["claimed_at", "epoch", "instance_id", "live", "pid"];
    if here.host.is_some() {
        expected.push("host");
    }
    if here.boot.is_some() && native {
        expected.push("boot");
    }
    expected.sort();
    assert_eq!(keys, expected, "{raw}");
    assert!(v["epoch"].is_u64() && v["live"].is_string());
}
