//! An agent left behind by a window that died or hung. On Linux's native
//! backend the kernel kills it with its window, on Windows its Job Object
//! does; elsewhere (macOS, and Linux's portable backend, which runs its
//! code) it would keep acting for a window that no longer leads. So the
//! supervisor that starts an agent writes a mark beside the lock file,
//! `<pubkey>.agent`, naming its window, the agent's pid and the process's
//! start time, durably and before the agent can act
//! ([`super::AgentStart::started`]); and whoever leads the host after that
//! window stops what the mark names: before it starts its own agent, and
//! once per host leadership when it leads the host but may not act (the
//! agent's lease moved to another host, or a sibling leads above the
//! host).
//!
//! A mark is acted on only when
//! * the lock file names another window than the mark's (its window has
//!   lost the lead: a fail-safe read, when every window leads, acts on
//!   none);
//! * it is of this boot, names neither pid 0 or 1 nor us or our parent,
//!   and (Linux) the process carries the mark's instance id;
//! * the process with that pid *has that start time* (a recycled pid has
//!   another, and is left alone).
//!
//! The agent leads a session and a process group of its own, and the stop
//! reaches them: its group, and on Linux every process of its session or
//! group that started after it and carries the mark's instance id, even
//! when the agent itself is already gone (a worker it left behind). On
//! macOS, where no process table is read, a group whose leader is gone
//! is signalled only while no process holds the leader's pid (a pid is
//! never reused while its group exists).
//!
//! The mark is a file of its own rather than extension fields of the
//! record: a harness child that carries the window's instance id rewrites the
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

use crate::lockfile::{open_regular_file, read_prefix, replace_whole_synced, Create};
use crate::pubkey::AgentPubkey;

use super::tree;
pub use super::tree::start_time;

/// Largest mark read.
const MAX_MARK_BYTES: usize = 1024;

/// Who runs an agent process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMark {
    /// The instance id of the window that started it.
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

/// Writes the mark whole and durably (beside it, synced, renamed over it,
/// the rename synced). The temporary files earlier writers of this key's
/// mark left when they crashed before their rename go first (see
/// `lockfile::leftovers`).
pub fn write_mark(dir: &Path, pubkey: &AgentPubkey, mark: &AgentMark) -> std::io::Result<()> {
    use crate::lockfile::leftovers::{is_random_part, remove_leftovers, LEFTOVER_AGE};
    let path = mark_path(dir, pubkey);
    let prefix = format!(".{pubkey}.agent.");
    let left = |n: &str| {
        (n.strip_prefix(&prefix))
            .and_then(|r| r.strip_suffix(".new"))
            .is_some_and(is_random_part)
    };
    remove_leftovers(dir, &left, LEFTOVER_AGE, std::time::SystemTime::now());
    // A name of our own: two writers never touch each other's.
    let rand = uuid::Uuid::new_v4().simple();
    let next = dir.join(format!(".{pubkey}.agent.{rand}.new"));
    let bytes = serde_json::to_vec(mark).map_err(std::io::Error::other)?;
    replace_whole_synced(&next, &path, &bytes)
}

/// Names agent `pid`, just started by window `instance_id`, in the mark.
/// A mark that cannot be written is logged (the agent runs all the same).
pub(super) fn name_agent(dir: &Path, pubkey: &AgentPubkey, instance_id: &str, pid: u32) {
    let Some(start) = start_time(pid) else {
        return; // gone already: its exit is on the way
    };
    let mark = AgentMark {
        instance_id: instance_id.to_owned(),
        pid,
        start,
        boot: crate::host::here().boot.clone(),
    };
    if let Err(e) = write_mark(dir, pubkey, &mark) {
        tracing::warn!(%pubkey, "cannot write the agent mark: {e}");
    }
}

/// The mark on file, if one parses.
pub fn read_mark(dir: &Path, pubkey: &AgentPubkey) -> Option<AgentMark> {
    let f = open_regular_file(&mark_path(dir, pubkey), Create::No).ok()?;
    // Only a mark we wrote names a process for us to stop.
    if !crate::lockfile::written_by_us(&f.metadata().ok()?) {
        return None;
    }
    let mut buf = [0u8; MAX_MARK_BYTES];
    let n = read_prefix(&f, &mut buf).ok()?;
    if n == buf.len() {
        return None;
    }
    serde_json::from_slice(&buf[..n]).ok()
}

/// Stops the agent the mark names, and what it left in its session or
/// group, unless it is `ours` (the pid of our own agent), gone, or its
/// window still leads (see the module): SIGTERM (Windows:
/// `TerminateProcess`), then SIGKILL after `grace`, waiting at most a
/// second more. Returns the mark's pid and whether SIGKILL was needed,
/// when there was something to stop.
pub fn stop_orphan(
    dir: &Path,
    pubkey: &AgentPubkey,
    ours: Option<u32>,
    grace: Duration,
) -> Option<(u32, bool)> {
    let m = read_mark(dir, pubkey)?;
    if Some(m.pid) == ours || !may_signal(&m) || !window_lost_lead(dir, pubkey, &m) {
        return None;
    }
    let alive = tree::start_time(m.pid) == Some(m.start) && tree::carries_id(m.pid, &m.instance_id);
    let left = leftovers(&m);
    if !alive && left.is_empty() {
        return None;
    }
    tracing::warn!(%pubkey, pid = m.pid, window = %m.instance_id, leftovers = left.len(), "stopping the agent a mark names: its window no longer leads");
    let mut targets = left;
    if alive {
        targets.push((m.pid, m.start));
    }
    signal_all(&m, &targets, false);
    let killed = !wait_gone(&targets, grace);
    if killed {
        signal_all(&m, &targets, true);
        wait_gone(&targets, Duration::from_secs(1));
    }
    Some((m.pid, killed))
}

/// Whether the lock file names a window other than the mark's: the mark's
/// window no longer leads. A file that names nobody (absent, empty,
/// malformed, unreadable: the NIP's fail-safe, when every window leads)
/// acts on no mark.
fn window_lost_lead(dir: &Path, pubkey: &AgentPubkey, m: &AgentMark) -> bool {
    let path = crate::lockfile::lock_path(dir, pubkey);
    match crate::lockfile::read_unguarded(&path) {
        Ok(c) => c.record().is_some_and(|r| r.instance_id != m.instance_id),
        Err(_) => false,
    }
}

/// Whether the mark may name a process we would signal at all: not pid 0
/// or 1, not us, our parent or a process of our own group (an agent runs in
/// its own session), of this boot.
fn may_signal(m: &AgentMark) -> bool {
    if m.pid <= 1
        || m.pid == std::process::id()
        || Some(m.pid) == parent_pid()
        || in_our_group(m.pid)
    {
        return false;
    }
    let here = crate::host::here().boot.as_deref();
    !(here.is_some() && m.boot.as_deref() != here)
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

/// Whether `pid` is in our process group (or is its leader).
#[cfg(unix)]
fn in_our_group(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: getpgrp and getpgid only read.
    unsafe { p == libc::getpgrp() || libc::getpgid(p) == libc::getpgrp() }
}

#[cfg(not(unix))]
fn in_our_group(_: u32) -> bool {
    false
}

/// What the mark's agent left in its session or group (Linux: read from
/// `/proc`; elsewhere the group is signalled as a whole, see
/// [`signal_all`]).
fn leftovers(m: &AgentMark) -> Vec<(u32, u64)> {
    #[cfg(target_os = "linux")]
    {
        tree::leftovers(m.pid, m.start, &m.instance_id)
            .into_iter()
            .filter(|(p, _)| *p != m.pid)
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = m;
        Vec::new()
    }
}

fn wait_gone(targets: &[(u32, u64)], within: Duration) -> bool {
    let end = Instant::now() + within;
    loop {
        if targets
            .iter()
            .all(|(p, s)| tree::start_time(*p) != Some(*s))
        {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Signals each target that still runs (its own start time), the mark's
/// group as well: on Linux while a process of the group was found, on
/// other Unixes while the leader runs, or when no process holds the
/// leader's pid any more (then only the agent's group can hold that id).
#[cfg(unix)]
fn signal_all(m: &AgentMark, targets: &[(u32, u64)], kill: bool) {
    let sig = if kill { libc::SIGKILL } else { libc::SIGTERM };
    let Ok(leader) = libc::pid_t::try_from(m.pid) else {
        return;
    };
    let leader_alive = tree::start_time(m.pid) == Some(m.start);
    let pid_free = tree::start_time(m.pid).is_none();
    let group_ours = if cfg!(target_os = "linux") {
        !targets.is_empty() && (leader_alive || pid_free)
    } else {
        leader_alive || pid_free
    };
    // SAFETY: kill(2) of processes whose start time (and, on Linux, id and
    // session) were checked just before; the group only as said above, and
    // never our own group or a process in it: no mark stops us.
    unsafe {
        if group_ours && leader > 1 && leader != libc::getpgrp() {
            libc::kill(-leader, sig);
        }
        for (p, s) in targets {
            if tree::start_time(*p) == Some(*s) && !in_our_group(*p) {
                if let Ok(p) = libc::pid_t::try_from(*p) {
                    if p > 1 {
                        libc::kill(p, sig);
                    }
                }
            }
        }
    }
}

#[cfg(windows)]
fn signal_all(_m: &AgentMark, targets: &[(u32, u64)], _kill: bool) {
    use windows_sys::Win32::Foundation::CloseHandle;
    use windows_sys::Win32::System::Threading::{OpenProcess, TerminateProcess, PROCESS_TERMINATE};
    for (pid, start) in targets {
        if tree::start_time(*pid) != Some(*start) {
            continue;
        }
        // SAFETY: plain Win32 calls; the handle is closed before returning.
        unsafe {
            let h = OpenProcess(PROCESS_TERMINATE, 0, *pid);
            if !h.is_null() {
                TerminateProcess(h, 1);
                CloseHandle(h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(not(unix), allow(dead_code))]
    fn pk() -> AgentPubkey {
        AgentPubkey::parse(&"d".repeat(64)).unwrap()
    }

    /// A mark's temporary file a crashed writer left (older than a live
    /// write could be) goes when the next mark of the key is written; a
    /// young one, another key's, and the mark itself stay.
    #[test]
    fn a_marks_leftover_goes_with_the_next_mark_of_its_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let other = AgentPubkey::parse(&"e".repeat(64)).unwrap();
        let name = |k: &AgentPubkey| format!(".{k}.agent.{}.new", uuid::Uuid::new_v4().simple());
        let (old, young, others) = (
            dir.join(name(&pk())),
            dir.join(name(&pk())),
            dir.join(name(&other)),
        );
        let long_ago = std::time::SystemTime::now() - 2 * crate::lockfile::leftovers::LEFTOVER_AGE;
        for (p, at) in [
            (&old, long_ago),
            (&young, std::time::SystemTime::now()),
            (&others, long_ago),
        ] {
            std::fs::File::create(p).unwrap().set_modified(at).unwrap();
        }
        let mark = AgentMark {
            instance_id: "w".into(),
            pid: 7,
            start: 1,
            boot: None,
        };
        write_mark(dir, &pk(), &mark).unwrap();
        assert!(!old.exists(), "the crashed writer's file stays");
        assert!(young.exists() && others.exists());
        assert!(mark_path(dir, &pk()).exists());
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
        use std::os::unix::process::CommandExt;
        let sleep_in = |group: i32| {
            std::process::Command::new("sleep")
                .arg("30")
                .env(crate::identity::ELECTION_ID_ENV, "w")
                .process_group(group)
                .spawn()
                .unwrap()
        };
        // An agent runs in a group of its own.
        let mut sleeper = sleep_in(0);
        let pid = sleeper.id();
        let start = start_time(pid).unwrap();
        let boot = crate::host::here().boot.clone();
        let mark = |start| AgentMark {
            instance_id: "w".into(),
            pid,
            start,
            boot: boot.clone(),
        };
        let lock = crate::lockfile::lock_path(dir, &pk());
        let holder = |id: &str| {
            let r = crate::record::encode_record(id, 4242, std::time::SystemTime::now(), None);
            std::fs::write(&lock, r).unwrap();
        };
        // The mark's window still leads, or nobody is named (the NIP's
        // fail-safe, when every window leads): left alone.
        write_mark(dir, &pk(), &mark(start)).unwrap();
        for named in [Some("w"), None] {
            match named {
                Some(id) => holder(id),
                None => std::fs::write(&lock, b"").unwrap(),
            }
            assert_eq!(
                stop_orphan(dir, &pk(), None, Duration::from_millis(50)),
                None,
                "{named:?}"
            );
        }
        // From here on a successor holds the lock.
        holder("successor");
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
        // A process of our own group, even one that carries the window's
        // id and has the mark's start, is never signalled.
        let mut sibling = sleep_in(unsafe { libc::getpgrp() });
        let sib = AgentMark {
            pid: sibling.id(),
            start: start_time(sibling.id()).unwrap(),
            ..mark(start)
        };
        write_mark(dir, &pk(), &sib).unwrap();
        assert_eq!(
            stop_orphan(dir, &pk(), None, Duration::from_millis(100)),
            None
        );
        assert!(
            sibling.try_wait().unwrap().is_none(),
            "our group: left alone"
        );
        let _ = sibling.kill();
        let _ = sibling.wait();
        // A mark someone else wrote names nobody (root can show it).
        write_mark(dir, &pk(), &mark(start)).unwrap();
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(mark_path(dir, &pk()), Some(65534), None).unwrap();
            assert_eq!(read_mark(dir, &pk()), None, "not ours");
            assert_eq!(
                stop_orphan(dir, &pk(), None, Duration::from_millis(100)),
                None
            );
            assert!(sleeper.try_wait().unwrap().is_none(), "left alone");
            write_mark(dir, &pk(), &mark(start)).unwrap();
        }
        // The orphan itself is stopped (SIGTERM is enough for sleep).
        let stopper = std::thread::spawn({
            let dir = dir.to_owned();
            move || stop_orphan(&dir, &pk(), None, Duration::from_secs(2))
        });
        sleeper.wait().unwrap();
        assert_eq!(stopper.join().unwrap(), Some((pid, false)));
        assert!(sleeper.try_wait().unwrap().is_some(), "stopped");
        // The mark outlives its agent, and names nobody now.
        assert_eq!(read_mark(dir, &pk()), Some(mark(start)));
        assert_eq!(
            stop_orphan(dir, &pk(), None, Duration::from_millis(50)),
            None
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_worker_the_agent_left_in_its_session_is_stopped_once_the_agent_is_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut agent, leader, worker) = super::tree::tests::agent_with_worker("w2");
        name_agent(dir, &pk(), "w2", leader);
        assert_eq!(read_mark(dir, &pk()).map(|m| m.pid), Some(leader));
        drop(agent.stdin.take());
        agent.wait().unwrap();
        assert!(
            start_time(worker).is_some(),
            "the worker outlived its agent"
        );
        let lock = crate::lockfile::lock_path(dir, &pk());
        let r = crate::record::encode_record("successor", 4242, std::time::SystemTime::now(), None);
        std::fs::write(&lock, r).unwrap();
        assert_eq!(
            stop_orphan(dir, &pk(), None, Duration::from_secs(2)),
            Some((leader, false))
        );
        assert_eq!(start_time(worker), None, "the worker was stopped");
        assert_eq!(
            stop_orphan(dir, &pk(), None, Duration::from_millis(50)),
            None
        );
    }
}
