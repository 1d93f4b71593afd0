//! An agent left behind by a window that died. On Linux's native backend
//! the kernel kills it with its window; elsewhere (macOS, Windows, and
//! Linux's portable backend, which runs their code) it would keep acting
//! for a window that is gone. So the supervisor that starts an agent
//! writes a mark beside the lock file, `<pubkey>.agent`, naming its
//! window, the agent's pid and the process's start time; and before a
//! successor starts its own agent it stops the one the mark names, if a
//! process with that pid *and that start time* still runs (a recycled pid
//! has another start time, and is left alone), the mark is of this boot,
//! and (Linux) the process carries the mark's election id in its
//! environment. A mark naming pid 0 or 1, our own process or our parent is
//! ignored, and a process group is signalled only when the process leads
//! it.
//!
//! The mark is a file of its own rather than extension fields of the
//! record: a harness child that carries the window's id rewrites the
//! record with only the NIP's three fields (INTEROP.md), which would erase
//! it. It is hostile input like every file there: regular files only, no
//! symlinks, a capped read, and a mark that does not parse is ignored.
//!
//! A mark is never removed: once its agent ended it names no process (the
//! start time differs), and removing it raced the successor's write of its
//! own (a window whose agent had just ended read its mark, the successor
//! wrote its own, the first removed that), leaving the successor's agent
//! unnamed when its window was killed in turn.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::lockfile::{open_regular_file, read_prefix, replace_whole, Create};
use crate::pubkey::AgentPubkey;

/// Largest mark read.
const MAX_MARK_BYTES: usize = 1024;

/// Who runs an agent process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMark {
    /// The election id of the window that started it.
    pub instance_id: String,
    /// The agent's pid.
    pub pid: u32,
    /// Its start time ([`start_time`]), the guard against a recycled pid.
    pub start: u64,
    /// The boot it ran in (Linux counts start times from the boot).
    #[serde(default)]
    pub boot: Option<String>,
}

/// `<dir>/<pubkey>.agent`.
pub fn mark_path(dir: &Path, pubkey: &AgentPubkey) -> PathBuf {
    dir.join(format!("{pubkey}.agent"))
}

/// Writes the mark whole (beside it, then renamed over it).
pub fn write_mark(dir: &Path, pubkey: &AgentPubkey, mark: &AgentMark) -> std::io::Result<()> {
    let path = mark_path(dir, pubkey);
    // A name of our own: two writers never touch each other's.
    let rand = uuid::Uuid::new_v4().simple();
    let next = dir.join(format!(".{pubkey}.agent.{rand}.new"));
    let bytes = serde_json::to_vec(mark).map_err(std::io::Error::other)?;
    replace_whole(&next, &path, &bytes)
}

/// The mark on file, if one parses.
pub fn read_mark(dir: &Path, pubkey: &AgentPubkey) -> Option<AgentMark> {
    let f = open_regular_file(&mark_path(dir, pubkey), Create::No).ok()?;
    let mut buf = [0u8; MAX_MARK_BYTES];
    let n = read_prefix(&f, &mut buf).ok()?;
    if n == buf.len() {
        return None;
    }
    serde_json::from_slice(&buf[..n]).ok()
}

/// Stops the agent the mark names unless it is `ours` (the pid of our own
/// child) or gone: SIGTERM (Windows: `TerminateProcess`), then SIGKILL
/// after `grace`, waiting at most a second more. Returns its pid and
/// whether it needed SIGKILL, when there was one to stop.
pub fn stop_orphan(
    dir: &Path,
    pubkey: &AgentPubkey,
    ours: Option<u32>,
    grace: Duration,
) -> Option<(u32, bool)> {
    let m = read_mark(dir, pubkey)?;
    if Some(m.pid) == ours || !may_signal(&m) || !same_process(m.pid, m.start) {
        return None;
    }
    tracing::warn!(%pubkey, pid = m.pid, window = %m.instance_id, "stopping the agent a mark names: its window no longer leads");
    signal(m.pid, false);
    let killed = !wait_gone(m.pid, m.start, grace);
    if killed {
        signal(m.pid, true);
        wait_gone(m.pid, m.start, Duration::from_secs(1));
    }
    Some((m.pid, killed))
}

/// Whether the mark may name a process we would signal at all: not pid 0
/// or 1, not us or our parent, of this boot, and (Linux) an agent process
/// given the mark's election id.
fn may_signal(m: &AgentMark) -> bool {
    if m.pid <= 1 || m.pid == std::process::id() || Some(m.pid) == parent_pid() {
        return false;
    }
    let here = crate::host::here().boot.as_deref();
    if here.is_some() && m.boot.as_deref() != here {
        return false;
    }
    carries_id(m.pid, &m.instance_id)
}

#[cfg(unix)]
fn parent_pid() -> Option<u32> {
    // SAFETY: getppid cannot fail.
    u32::try_from(unsafe { libc::getppid() }).ok()
}

#[cfg(not(unix))]
fn parent_pid() -> Option<u32> {
    None
}

/// Linux: whether `pid`'s environment holds
/// `BUZZ_INSTANCE_ELECTION_ID=<id>` (read capped at 1 MiB), as every agent a
/// supervisor starts does. Elsewhere the start time is the guard.
#[cfg(target_os = "linux")]
fn carries_id(pid: u32, id: &str) -> bool {
    use std::io::Read;
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let mut env = Vec::new();
    if f.take(1 << 20).read_to_end(&mut env).is_err() {
        return false;
    }
    let want = format!("{}={id}", crate::identity::ELECTION_ID_ENV);
    env.split(|b| *b == 0).any(|v| v == want.as_bytes())
}

#[cfg(not(target_os = "linux"))]
fn carries_id(_pid: u32, _id: &str) -> bool {
    true
}

/// Whether a process `pid` that started at `start` still runs.
fn same_process(pid: u32, start: u64) -> bool {
    start_time(pid) == Some(start)
}

fn wait_gone(pid: u32, start: u64, within: Duration) -> bool {
    let end = Instant::now() + within;
    loop {
        if !same_process(pid, start) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(unix)]
fn signal(pid: u32, kill: bool) {
    if let Ok(p) = libc::pid_t::try_from(pid) {
        if p > 0 {
            let sig = if kill { libc::SIGKILL } else { libc::SIGTERM };
            // SAFETY: kill(2) of a process whose start time, boot and id
            // were checked just before; its group only when it leads it
            // (as every agent a supervisor starts does).
            unsafe {
                if libc::getpgid(p) == p {
                    libc::kill(-p, sig);
                }
                libc::kill(p, sig);
            }
        }
    }
}

#[cfg(windows)]
fn signal(pid: u32, _kill: bool) {
    use windows_sys::Win32::Foundation::CloseHandle;
    use windows_sys::Win32::System::Threading::{OpenProcess, TerminateProcess, PROCESS_TERMINATE};
    // SAFETY: plain Win32 calls; the handle is closed before returning.
    unsafe {
        let h = OpenProcess(PROCESS_TERMINATE, 0, pid);
        if !h.is_null() {
            TerminateProcess(h, 1);
            CloseHandle(h);
        }
    }
}

/// When process `pid` started (an opaque number that differs for a
/// recycled pid), or `None` when it is gone (a zombie counts as gone).
#[cfg(target_os = "linux")]
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    start_of_stat(&stat)
}

/// The state and start time (field 22) of a `/proc/<pid>/stat` line: the
/// command name in parentheses may hold spaces and parentheses, so the
/// fields are counted after the last `)`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn start_of_stat(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace();
    // Field 3 is the state; field 22 the start time.
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// See the Linux variant: `proc_pidinfo`'s start time (µs since the epoch).
#[cfg(target_os = "macos")]
pub fn start_time(pid: u32) -> Option<u64> {
    let p = i32::try_from(pid).ok().filter(|p| *p > 0)?;
    let mut info: libc::proc_bsdinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_bsdinfo>() as i32;
    // SAFETY: proc_pidinfo writes at most `size` bytes into our struct.
    let n = unsafe {
        libc::proc_pidinfo(
            p,
            libc::PROC_PIDTBSDINFO,
            0,
            (&mut info as *mut libc::proc_bsdinfo).cast(),
            size,
        )
    };
    if n != size || info.pbi_status == libc::SZOMB {
        return None;
    }
    Some(info.pbi_start_tvsec.saturating_mul(1_000_000) + info.pbi_start_tvusec)
}

/// See the Linux variant: `GetProcessTimes`' creation time, for a process
/// that has not exited.
#[cfg(windows)]
pub fn start_time(pid: u32) -> Option<u64> {
    use windows_sys::Win32::Foundation::{CloseHandle, FILETIME, STILL_ACTIVE};
    use windows_sys::Win32::System::Threading::{
        GetExitCodeProcess, GetProcessTimes, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
    };
    let zero = || FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    // SAFETY: plain Win32 calls on a handle we open and close here.
    unsafe {
        let h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid);
        if h.is_null() {
            return None;
        }
        let (mut created, mut a, mut b, mut c) = (zero(), zero(), zero(), zero());
        let mut code = 0u32;
        let ok = GetProcessTimes(h, &mut created, &mut a, &mut b, &mut c) != 0
            && GetExitCodeProcess(h, &mut code) != 0
            && code == STILL_ACTIVE as u32;
        CloseHandle(h);
        ok.then(|| (u64::from(created.dwHighDateTime) << 32) | u64::from(created.dwLowDateTime))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pk() -> AgentPubkey {
        AgentPubkey::parse(&"d".repeat(64)).unwrap()
    }

    #[test]
    fn stat_lines_are_parsed_after_the_last_parenthesis() {
        let line = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(start_of_stat(line), Some(987654));
        let zombie =
            "4242 (x) Z 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(start_of_stat(zombie), None);
        for bad in [
            "",
            "4242 (x",
            "4242 (x) S 1 2",
            "4242 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 x",
        ] {
            assert_eq!(start_of_stat(bad), None, "{bad:?}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn our_start_time_is_stable_and_a_dead_pid_has_none() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert_eq!(start_time(me), start_time(me));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(start_time(pid), None);
    }

    #[cfg(unix)]
    #[test]
    fn marks_are_hostile_input_and_name_only_a_process_with_that_start() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert_eq!(read_mark(dir, &pk()), None);
        for bad in [&b"{garbage"[..], &[b'x'; 2048][..], b"{\"pid\":1}"] {
            std::fs::write(mark_path(dir, &pk()), bad).unwrap();
            assert_eq!(read_mark(dir, &pk()), None);
        }
        std::fs::remove_file(mark_path(dir, &pk())).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", mark_path(dir, &pk())).unwrap();
        assert_eq!(read_mark(dir, &pk()), None, "never followed");
        std::fs::remove_file(mark_path(dir, &pk())).unwrap();
        // A live process with another start time (a recycled pid) is left
        // alone; so is our own child.
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .env(crate::identity::ELECTION_ID_ENV, "w")
            .spawn()
            .unwrap();
        let pid = sleeper.id();
        let start = start_time(pid).unwrap();
        let boot = crate::host::here().boot.clone();
        let mark = |start| AgentMark {
            instance_id: "w".into(),
            pid,
            start,
            boot: boot.clone(),
        };
        // Not an agent of that window (Linux), another boot, pid 1, us: all
        // left alone.
        for m in [
            AgentMark {
                instance_id: "other".into(),
                ..mark(start)
            },
            AgentMark {
                boot: Some("another boot".into()),
                ..mark(start)
            },
            AgentMark {
                pid: 1,
                start: start_time(1).unwrap_or(0),
                ..mark(start)
            },
            AgentMark {
                pid: std::process::id(),
                start: start_time(std::process::id()).unwrap(),
                ..mark(start)
            },
        ] {
            write_mark(dir, &pk(), &m).unwrap();
            assert_eq!(
                stop_orphan(dir, &pk(), None, Duration::from_millis(50)),
                None,
                "{m:?}"
            );
        }
        assert!(sleeper.try_wait().unwrap().is_none());
        write_mark(dir, &pk(), &mark(start + 1)).unwrap();
        assert_eq!(
            stop_orphan(dir, &pk(), None, Duration::from_millis(100)),
            None
        );
        write_mark(dir, &pk(), &mark(start)).unwrap();
        assert_eq!(read_mark(dir, &pk()), Some(mark(start)));
        assert_eq!(
            stop_orphan(dir, &pk(), Some(pid), Duration::from_millis(100)),
            None
        );
        assert!(sleeper.try_wait().unwrap().is_none(), "left alone");
        // The orphan itself is stopped (SIGTERM is enough for sleep).
        let stopper = std::thread::spawn({
            let dir = dir.to_owned();
            move || stop_orphan(&dir, &pk(), None, Duration::from_secs(2))
        });
        sleeper.wait().unwrap();
        assert_eq!(stopper.join().unwrap(), Some((pid, false)));
        // The mark outlives its agent, and names nobody now.
        assert_eq!(read_mark(dir, &pk()), Some(mark(start)));
        assert_eq!(
            stop_orphan(dir, &pk(), None, Duration::from_millis(50)),
            None
        );
    }
}
