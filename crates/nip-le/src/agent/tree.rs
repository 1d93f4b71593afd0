//! Process identity and process trees, per platform: when a process
//! started (the guard against a recycled pid), and which processes an agent
//! left behind in its session or process group (it leads both), for stops
//! that reach the whole tree even once the agent itself is gone. Hostile
//! input like every file: `/proc` lines are parsed after the last `)` (a
//! command name may hold anything), reads are capped.

/// What `/proc/<pid>/stat` says of a process (Linux).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stat {
    /// Its state (`Z`: a zombie, gone in all but name).
    pub state: char,
    /// Its process group.
    pub pgrp: i64,
    /// Its session.
    pub session: i64,
    /// Its start time, in clock ticks since the boot.
    pub start: u64,
}

/// Parses a `/proc/<pid>/stat` line: the command name in parentheses may
/// hold spaces and parentheses, so the fields are counted after the last
/// `)` (state, ppid, pgrp, session, ..., the start time 22nd of the line).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(super) fn parse_stat(stat: &str) -> Option<Stat> {
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_ascii_whitespace().take(20).collect();
    let state = f.first()?.chars().next()?;
    Some(Stat {
        state,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// `/proc/<pid>/stat`, parsed.
#[cfg(target_os = "linux")]
pub(super) fn stat(pid: u32) -> Option<Stat> {
    use std::io::Read;
    let f = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut s = String::new();
    f.take(4096).read_to_string(&mut s).ok()?;
    parse_stat(&s)
}

/// When process `pid` started (an opaque number that differs for a
/// recycled pid), or `None` when it is gone (a zombie counts as gone).
#[cfg(target_os = "linux")]
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).filter(|s| s.state != 'Z').map(|s| s.start)
}

/// Linux: whether `pid`'s environment holds
/// `BUZZ_INSTANCE_ELECTION_ID=<id>` (read capped at 1 MiB), as every agent a
/// supervisor starts, and what it starts, does. Elsewhere the start time is
/// the guard.
#[cfg(target_os = "linux")]
pub(super) fn carries_id(pid: u32, id: &str) -> bool {
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
pub(super) fn carries_id(_pid: u32, _id: &str) -> bool {
    true
}

/// Linux: the live processes of the session or process group `leader`
/// led (the agent's, even after it exited), started no earlier than it
/// (`since`), and carrying instance id `id`: what an agent left behind.
/// Never our own process or our parent. With their start times.
#[cfg(target_os = "linux")]
pub(super) fn leftovers(leader: u32, since: u64, id: &str) -> Vec<(u32, u64)> {
    let me = std::process::id();
    // SAFETY: getppid cannot fail.
    let parent = u32::try_from(unsafe { libc::getppid() }).unwrap_or(0);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let leader = i64::from(leader);
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| *p > 1 && *p != me && *p != parent)
        .filter_map(|p| Some((p, stat(p)?)))
        .filter(|(_, s)| s.state != 'Z' && (s.pgrp == leader || s.session == leader))
        .filter(|(_, s)| s.start >= since)
        .filter(|(p, _)| carries_id(*p, id))
        .map(|(p, s)| (p, s.start))
        .collect()
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
pub(super) mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_parsed_after_the_last_parenthesis() {
        let line = "4242 (a (weird) name) S 1 4242 4243 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                pgrp: 4242,
                session: 4243,
                start: 987654
            })
        );
        let zombie =
            "4242 (x) Z 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(parse_stat(zombie).map(|s| s.state), Some('Z'));
        for bad in [
            "",
            "4242 (x",
            "4242 (x) S 1 2",
            "4242 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 x",
            "4242 (x) S 1 99999999999999999999999 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
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

    /// An "agent" that leads a session, carries instance id `id` and has
    /// started a worker; it exits once its stdin closes. Its pid and the
    /// worker's.
    #[cfg(target_os = "linux")]
    pub(in crate::agent) fn agent_with_worker(id: &str) -> (std::process::Child, u32, u32) {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new("sh");
        c.args(["-c", "sleep 30 & echo $!; read _"])
            .env(crate::identity::ELECTION_ID_ENV, id)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut agent = c.spawn().unwrap();
        let leader = agent.id();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(agent.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let worker: u32 = line.trim().parse().unwrap();
        (agent, leader, worker)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn what_an_agent_left_in_its_session_is_found_after_it_exited() {
        let (mut agent, leader, worker) = agent_with_worker("w-tree");
        let since = start_time(leader).unwrap();
        drop(agent.stdin.take());
        agent.wait().unwrap();
        assert_eq!(start_time(leader), None, "the agent itself is gone");
        let found = leftovers(leader, since, "w-tree");
        assert_eq!(
            found.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            vec![worker]
        );
        // Another window's instance id, or a start before the agent's: not ours.
        assert!(leftovers(leader, since, "w-other").is_empty());
        assert!(leftovers(leader, found[0].1 + 1, "w-tree").is_empty());
        unsafe { libc::kill(worker as i32, libc::SIGKILL) };
    }
}
