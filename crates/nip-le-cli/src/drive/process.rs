//! Killing, pausing and resuming a process by pid, as the lab's faults do:
//! signals on Unix; on Windows `TerminateProcess`, and ntdll's
//! `NtSuspendProcess`/`NtResumeProcess` (every thread of the process
//! stopped and started again, as SIGSTOP/SIGCONT do). A graceful stop has
//! no Windows counterpart for a console-less process: the lab sends
//! `nip-le run` its `exit` line instead (`Instance::terminate`).

use std::io;

/// Whether `pid` is a running process (Linux: a zombie nobody reaped yet
/// counts as gone).
pub fn alive(pid: u32) -> bool {
    imp::alive(pid)
}

/// Kills `pid` at once (SIGKILL, `TerminateProcess`).
pub fn kill(pid: u32) -> io::Result<()> {
    imp::kill(pid)
}

/// Stops every thread of `pid` until [`resume`] (SIGSTOP,
/// `NtSuspendProcess`).
pub fn pause(pid: u32) -> io::Result<()> {
    imp::pause(pid)
}

/// Lets a paused `pid` run again (SIGCONT, `NtResumeProcess`).
pub fn resume(pid: u32) -> io::Result<()> {
    imp::resume(pid)
}

#[cfg(unix)]
mod imp {
    use std::io;

    fn signal(pid: u32, sig: i32) -> io::Result<()> {
        let pid = i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: kill(2) with integer arguments.
        if unsafe { libc::kill(pid, sig) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    #[cfg(target_os = "linux")]
    pub(super) fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn alive(pid: u32) -> bool {
        match signal(pid, 0) {
            Ok(()) => true,
            Err(e) => e.raw_os_error() == Some(libc::EPERM),
        }
    }

    pub(super) fn kill(pid: u32) -> io::Result<()> {
        signal(pid, libc::SIGKILL)
    }

    pub(super) fn pause(pid: u32) -> io::Result<()> {
        signal(pid, libc::SIGSTOP)
    }

    pub(super) fn resume(pid: u32) -> io::Result<()> {
        signal(pid, libc::SIGCONT)
    }
}

#[cfg(windows)]
mod imp {
    use std::io;

    use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
    use windows_sys::Win32::System::Threading::{
        OpenProcess, TerminateProcess, PROCESS_SUSPEND_RESUME, PROCESS_TERMINATE,
    };

    #[link(name = "ntdll")]
    extern "system" {
        fn NtSuspendProcess(process: HANDLE) -> i32;
        fn NtResumeProcess(process: HANDLE) -> i32;
    }

    /// Runs `f` on a handle of `pid` opened with `access`, then closes it.
    fn with_process(pid: u32, access: u32, f: impl FnOnce(HANDLE) -> bool) -> io::Result<()> {
        // SAFETY: OpenProcess returns a new handle or null.
        let h = unsafe { OpenProcess(access, 0, pid) };
        if h.is_null() {
            return Err(io::Error::last_os_error());
        }
        let ok = f(h);
        let err = io::Error::last_os_error();
        // SAFETY: `h` is ours, closed once.
        unsafe { CloseHandle(h) };
        if ok {
            Ok(())
        } else {
            Err(err)
        }
    }

    pub(super) fn alive(pid: u32) -> bool {
        use windows_sys::Win32::Foundation::WAIT_TIMEOUT;
        use windows_sys::Win32::System::Threading::{WaitForSingleObject, PROCESS_SYNCHRONIZE};
        // SAFETY: a valid handle with SYNCHRONIZE; a zero timeout only polls.
        with_process(pid, PROCESS_SYNCHRONIZE, |h| unsafe {
            WaitForSingleObject(h, 0) == WAIT_TIMEOUT
        })
        .is_ok()
    }

    pub(super) fn kill(pid: u32) -> io::Result<()> {
        // SAFETY: a valid process handle with PROCESS_TERMINATE.
        with_process(pid, PROCESS_TERMINATE, |h| unsafe {
            TerminateProcess(h, 1) != 0
        })
    }

    pub(super) fn pause(pid: u32) -> io::Result<()> {
        // SAFETY: a valid process handle with PROCESS_SUSPEND_RESUME.
        with_process(pid, PROCESS_SUSPEND_RESUME, |h| unsafe {
            NtSuspendProcess(h) >= 0
        })
    }

    pub(super) fn resume(pid: u32) -> io::Result<()> {
        // SAFETY: a valid process handle with PROCESS_SUSPEND_RESUME.
        with_process(pid, PROCESS_SUSPEND_RESUME, |h| unsafe {
            NtResumeProcess(h) >= 0
        })
    }
}
