//! Hostile filesystem conditions with real processes: a full disk, a
//! read-only lock directory, a lock file owned by someone else. Each must end
//! in the documented fail-safe, never a panic and never a write elsewhere.
//! These need root (to mount a tiny tmpfs and to run as `nobody`), as CI has.
#![cfg(target_os = "linux")]

mod support;

use nip_le::ChangeReason;
use nip_le_cli::lines::{Line, ReplyLine};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use nip_le_cli::drive::cluster::{wait_until, Instance};
use support::*;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `nip-le run` as the unprivileged user `nobody`. `setpriv` execs the
/// program itself (no intermediate process), so killing the child kills it.
fn spawn_as_nobody(s: &Scratch, lock_dir: &std::path::Path) -> Instance {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_nip-le-lab"))
        .args(["run", "--pubkey", s.pubkey.as_str(), "--lock-dir"])
        .arg(lock_dir)
        .args([
            "--refresh-ms",
            &REFRESH_MS.to_string(),
            "--stale-ms",
            &STALE_MS.to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    Instance::spawn("nobody", c, Duration::from_secs(10)).expect("nip-le runs as nobody")
}

/// A lock directory that root owns and others may only traverse, holding a
/// live root-owned claim whose file has `file_mode`.
fn root_owned_lock(file_mode: u32) -> (Scratch, Unrelated) {
    let unrelated = Unrelated::start();
    let s = Scratch::new();
    std::fs::create_dir_all(&s.lock_dir).unwrap();
    for d in [s.tmp.path(), s.lock_dir.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    s.write_record("root-leader", unrelated.pid(), std::time::SystemTime::now());
    std::fs::set_permissions(s.lock_path(), std::fs::Permissions::from_mode(file_mode)).unwrap();
    (s, unrelated)
}

/// Unmounts the tiny tmpfs on drop.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Mounts a 16 KiB tmpfs on the lock directory (mode 0700: a tmpfs is
/// world-writable by default, and such a lock directory is refused) and
/// fills it: returns the guard and the filler, whose removal gives the
/// space back.
fn full_lock_dir(s: &Scratch) -> (Unmount, std::path::PathBuf) {
    std::fs::create_dir_all(&s.lock_dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs"])
        .arg(&s.lock_dir)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount tmpfs");
    let guard = Unmount(s.lock_dir.clone());
    let filler = s.lock_dir.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 64 * 1024]);
    (guard, filler)
}

#[test]
fn full_disk_fails_safe_and_recovers_when_space_returns() {
    if !is_root() {
        eprintln!("skipped: needs root to mount a tmpfs");
        return;
    }
    let s = Scratch::new();
    let (_guard, filler) = full_lock_dir(&s);
    let a = s.spawn("a");
    let r = a
        .wait_for(Duration::from_secs(5), |r| {
            r.iter().find(|r| r.event() == "leadership").cloned()
        })
        .expect("a leadership report despite the full disk");
    assert_eq!(
        r.is_leader(),
        Some(true),
        "fail-safe: leads when nothing can be written"
    );
    // Space comes back: the next refresh writes a proper record.
    std::fs::remove_file(&filler).unwrap();
    assert!(
        wait_until(ms(REFRESH_MS) + MARGIN, || s.holder().as_deref()
            == Some(a.instance_id.as_str())),
        "no record once space returned"
    );
}

/// A window that leads by the fail-safe is owed only what was published
/// since it led (whoever held may keep no ledger); once the disk takes
/// writes and it holds the lock at an epoch, the backlog is owed, and no
/// change event says so (it led before and leads after). `nip-le run`, the
/// reference app, must keep asking: it once dropped what was left out after
/// a settle time, and the backlog was never answered.
#[test]
fn a_fail_safe_leader_answers_the_backlog_once_it_holds_the_lock() {
    if !is_root() {
        eprintln!("skipped: needs root to mount a tmpfs");
        return;
    }
    let s = Scratch::new();
    let (_guard, filler) = full_lock_dir(&s);
    // The backlog, published a moment before the window starts.
    let at = nip_le_cli::unix_ms() - 1_000;
    let backlog: Vec<String> = (0..3).map(|i| format!("backlog{i}")).collect();
    let first: String = backlog
        .iter()
        .map(|id| format!("{{\"id\":\"{id}\",\"at_ms\":{at}}}\n"))
        .collect();
    let (mut opts, _mentions, replies) = s.fed_opts(first.as_bytes());
    opts.extra_args = vec!["--turn-ms".into(), "20".into()];
    let a = s.spawn_with("a", opts);
    let r = a
        .wait_for(Duration::from_secs(5), |r| {
            r.iter().find(|r| r.event() == "leadership").cloned()
        })
        .expect("a leadership report despite the full disk");
    assert_eq!(
        (r.is_leader(), r.reason()),
        (Some(true), Some(ChangeReason::FailSafe))
    );
    assert!(wait_until(Duration::from_secs(5), || a
        .reports()
        .iter()
        .filter(|r| r.event() == "mention")
        .count()
        == backlog.len()));
    // The disk stays full for twice the stale bound (past what the old
    // settle time was), and nothing of the backlog is owed meanwhile.
    std::thread::sleep(ms(STALE_MS * 2));
    assert!(ReplyLine::read_all(&replies).is_empty());
    std::fs::remove_file(&filler).unwrap();
    let answered = |id: &String| {
        ReplyLine::read_all(&replies)
            .iter()
            .filter(|r| r.mention_id() == *id)
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(5), || backlog
            .iter()
            .all(|id| answered(id) >= 1)),
        "the backlog was not answered once the window held the lock: {:?}",
        ReplyLine::read_all(&replies)
    );
    std::thread::sleep(ms(REFRESH_MS * 2));
    for id in &backlog {
        assert_eq!(answered(id), 1, "{id}");
    }
}

#[test]
fn read_only_lock_dir_still_reads_and_never_writes() {
    if !is_root() {
        eprintln!("skipped: needs root to run as nobody");
        return;
    }
    let (s, _unrelated) = root_owned_lock(0o644);
    let before = s.raw();
    let a = spawn_as_nobody(&s, &s.lock_dir);
    let r = a
        .wait_for(Duration::from_secs(5), |r| {
            r.iter().find(|r| r.event() == "leadership").cloned()
        })
        .unwrap();
    // It can read the record: it observes, as the read side says.
    assert_eq!(
        (r.is_leader(), r.reason()),
        (Some(false), Some(ChangeReason::Observer))
    );
    std::thread::sleep(ms(REFRESH_MS * 3));
    assert_eq!(s.raw(), before);
    let names: Vec<_> = std::fs::read_dir(&s.lock_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        1,
        "wrote into a read-only directory: {names:?}"
    );
}

#[test]
fn lock_file_of_another_owner_that_we_cannot_read_fails_safe() {
    if !is_root() {
        eprintln!("skipped: needs root to run as nobody");
        return;
    }
    let (s, _unrelated) = root_owned_lock(0o600);
    let before = s.raw();
    let mut a = spawn_as_nobody(&s, &s.lock_dir);
    let r = a
        .wait_for(Duration::from_secs(5), |r| {
            r.iter().find(|r| r.event() == "leadership").cloned()
        })
        .unwrap();
    // Unreadable: the NIP's fail-safe says lead; the file is untouched.
    assert_eq!(
        (r.is_leader(), r.reason()),
        (Some(true), Some(ChangeReason::FailSafe))
    );
    let c = a.cursor();
    a.send("status").unwrap();
    let st = a
        .wait_after(c, Duration::from_secs(2), |r| r.event() == "status")
        .unwrap();
    let Line::Status(st) = st.line else {
        panic!("not a status line")
    };
    assert_eq!(st.lock_state, Some(nip_le::LockState::Unreadable));
    assert!(
        st.last_error
            .as_deref()
            .unwrap_or("")
            .contains("ermission denied"),
        "{st:?}"
    );
    assert_eq!(s.raw(), before);
}
