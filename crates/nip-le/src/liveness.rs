//! Is the pid in a record still a running process?
//!
//! Unix: `kill(pid, 0)`; only `ESRCH` means dead (`EPERM` is another user's
//! live process). A zombie answers as alive, exactly like the harness. A pid
//! of 0 or above `i32::MAX` would address a process group, so it is never
//! probed and counts as dead (no real leader has it). Windows uses the
//! process API (see [`probe`]).

/// The answer of a liveness probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The process exists (or we may not signal it, which proves it exists).
    Alive,
    /// No such process.
    Dead,
}

/// Probes `pid` without affecting it.
#[cfg(unix)]
pub fn probe(pid: u32) -> Liveness {
    let Ok(raw) = i32::try_from(pid) else {
        return Liveness::Dead;
    };
    if raw <= 0 {
        return Liveness::Dead;
    }
    // SAFETY: signal 0 performs only the existence and permission checks.
    let rc = unsafe { libc::kill(raw, 0) };
    if rc == 0 {
        return Liveness::Alive;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ESRCH) => Liveness::Dead,
        _ => Liveness::Alive,
    }
}

/// Windows: open the process for a limited query. `ERROR_INVALID_PARAMETER`
/// means no such process; a handle whose exit code is not `STILL_ACTIVE`
/// belongs to a process that has exited (kept alive only by open handles).
/// Any other failure (e.g. access denied) proves the process exists.
#[cfg(windows)]
pub fn probe(pid: u32) -> Liveness {
    use windows_sys::Win32::Foundation::{
        CloseHandle, GetLastError, ERROR_INVALID_PARAMETER, STILL_ACTIVE,
    };
    use windows_sys::Win32::System::Threading::{
        GetExitCodeProcess, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
    };
    if pid == 0 {
        return Liveness::Dead;
    }
    // SAFETY: plain Win32 calls; the handle is closed before returning.
    unsafe {
        let h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid);
        if h.is_null() {
            return if GetLastError() == ERROR_INVALID_PARAMETER {
                Liveness::Dead
            } else {
                Liveness::Alive
            };
        }
        let mut code: u32 = 0;
        let ok = GetExitCodeProcess(h, &mut code);
        CloseHandle(h);
        if ok != 0 && code != STILL_ACTIVE as u32 {
            Liveness::Dead
        } else {
            Liveness::Alive
        }
    }
}

/// Without a probe for this platform we never call a pid dead; the
/// `claimed_at` staleness rule still recovers abandoned claims.
#[cfg(not(any(unix, windows)))]
pub fn probe(pid: u32) -> Liveness {
    let _ = pid;
    Liveness::Alive
}

/// This process's id.
pub fn current_pid() -> u32 {
    std::process::id()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_reaped_child_is_dead() {
        assert_eq!(probe(current_pid()), Liveness::Alive);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(probe(pid), Liveness::Dead);
    }

    #[test]
    fn process_group_addresses_are_never_probed() {
        assert_eq!(probe(0), Liveness::Dead);
        assert_eq!(probe(u32::MAX), Liveness::Dead);
        assert_eq!(probe(i32::MAX as u32 + 1), Liveness::Dead);
    }

    #[test]
    fn another_users_process_is_alive() {
        // pid 1 exists on every Unix; as a non-root user kill() gives EPERM,
        // as root it succeeds — both must read as alive.
        assert_eq!(probe(1), Liveness::Alive);
    }
}
