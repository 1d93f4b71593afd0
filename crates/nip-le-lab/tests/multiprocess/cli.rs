//! The command line itself: an inherited instance id, bad input that
//! writes nothing, and `status` over hostile files.

use super::*;

#[test]
fn inherited_instance_id_is_honoured() {
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
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nip-le-lab"))
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nip-le-lab"))
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nip-le-lab"))
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

/// A report read by a reader that stops early (`nip-le sim … | head`)
/// ends quietly, as other Unix tools do, not with a panic on the closed
/// pipe.
#[cfg(unix)]
#[test]
fn a_report_piped_into_a_reader_that_stops_early_ends_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_nip-le-lab"))
        .args(["sim", "--seeds", "300", "--verbose"])
        .env("NIP_LE_LOG", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty(), "a first line");
    // The reader is gone: the next write finds the pipe closed.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
