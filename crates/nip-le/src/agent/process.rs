//! Spawning, signalling and reaping the agent, per platform. The child is
//! reaped only by [`Agent::reap`], after its waiter reported the exit
//! without reaping it, so a signal we send can never reach a recycled pid.

use std::process::{Child, Command, ExitStatus, Stdio};

use super::AgentCommand;
use crate::identity::ELECTION_ID_ENV;

/// A running agent process.
pub(super) struct Agent {
    child: Child,
}

impl Agent {
    /// Starts `cmd` with `election_id`; `exited(pid)` is called from a
    /// thread of its own once the process has exited (it is not reaped).
    /// `dies_with_us`: Linux's native backend, where the kernel kills the
    /// child when the supervisor's thread dies.
    pub(super) fn spawn(
        cmd: &AgentCommand,
        election_id: &str,
        dies_with_us: bool,
        exited: impl FnOnce(u32) + Send + 'static,
    ) -> std::io::Result<Self> {
        let mut c = Command::new(&cmd.program);
        c.args(&cmd.args)
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .env(ELECTION_ID_ENV, election_id)
            .stdin(Stdio::null());
        // Its stdout must not mix with ours (the CLI's JSON lines): both of
        // its streams go to our stderr.
        c.stdout(stderr_copy()?);
        prepare(&mut c, dies_with_us);
        let mut child = c.spawn()?;
        let pid = child.id();
        let waiter = wait_handle(&child);
        let watched = std::thread::Builder::new()
            .name("nip-le-agent-wait".into())
            .spawn(move || {
                wait_exit(pid, waiter);
                exited(pid);
            });
        if let Err(e) = watched {
            // Unwatched, it would run unsupervised: end it.
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(Self { child })
    }

    /// Its pid.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks it to stop: SIGTERM to its process group (Unix); Windows has
    /// no such request for a console-less child, so it is ended at once.
    pub(super) fn terminate(&mut self) {
        #[cfg(unix)]
        signal_group(self.pid(), libc::SIGTERM);
        #[cfg(not(unix))]
        let _ = self.child.kill();
    }

    /// Ends it now: SIGKILL to its process group (Unix), `TerminateProcess`
    /// (Windows).
    pub(super) fn kill(&mut self) {
        #[cfg(unix)]
        signal_group(self.pid(), libc::SIGKILL);
        #[cfg(not(unix))]
        let _ = self.child.kill();
    }

    /// Reaps it (it has exited) and returns how it ended. First, on Unix,
    /// whatever it left running in its process group is killed (its pid,
    /// and so the group's id, is still ours until the reap).
    pub(super) fn reap(mut self) -> std::io::Result<ExitStatus> {
        #[cfg(unix)]
        signal_group(self.pid(), libc::SIGKILL);
        self.child.wait()
    }
}

/// A copy of our stderr for the child's stdout.
fn stderr_copy() -> std::io::Result<Stdio> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        Ok(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
    }
    #[cfg(windows)]
    {
        use std::os::windows::io::AsHandle;
        Ok(Stdio::from(
            std::io::stderr().as_handle().try_clone_to_owned()?,
        ))
    }
}

/// The signal and exit code of `status`, for reports.
pub(super) fn ended(status: &ExitStatus) -> (Option<i32>, Option<i32>) {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        (status.code(), status.signal())
    }
    #[cfg(not(unix))]
    (status.code(), None)
}

/// Unix: the child leads a process group of its own (so a stop reaches
/// what it spawned), and on Linux with `dies_with_us` the kernel kills it
/// when the thread that spawned it (the supervisor's, alive as long as the
/// window) dies.
#[cfg(unix)]
fn prepare(c: &mut Command, dies_with_us: bool) {
    use std::os::unix::process::CommandExt;
    #[cfg(target_os = "linux")]
    // SAFETY: getpid before the fork; in the child only async-signal-safe
    // calls (setpgid, prctl, getppid, raise).
    let parent = unsafe { libc::getpid() };
    #[cfg(not(target_os = "linux"))]
    let _ = dies_with_us;
    // SAFETY: see above; the closure touches no lock and allocates nothing.
    unsafe {
        c.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            if dies_with_us {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The window died between the fork and the prctl.
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
            }
            Ok(())
        });
    }
}

/// Windows: no console window for a console program started by a GUI app.
#[cfg(windows)]
fn prepare(c: &mut Command, _dies_with_us: bool) {
    use std::os::windows::process::CommandExt;
    const CREATE_NO_WINDOW: u32 = 0x0800_0000;
    c.creation_flags(CREATE_NO_WINDOW);
}

#[cfg(unix)]
fn signal_group(pid: u32, sig: i32) {
    if let Ok(p) = libc::pid_t::try_from(pid) {
        if p > 0 {
            // SAFETY: kill with a negative pid signals the process group
            // our child leads; it is not reaped yet, so the id is ours.
            unsafe { libc::kill(-p, sig) };
        }
    }
}

/// What the waiter blocks on: the pid (Unix), the process handle
/// (Windows).
struct WaitHandle {
    #[cfg(windows)]
    raw: isize,
}

fn wait_handle(child: &Child) -> WaitHandle {
    #[cfg(windows)]
    {
        use std::os::windows::io::AsRawHandle;
        WaitHandle {
            raw: child.as_raw_handle() as isize,
        }
    }
    #[cfg(not(windows))]
    {
        let _ = child;
        WaitHandle {}
    }
}

/// Blocks until `pid` has exited, without reaping it.
#[cfg(unix)]
fn wait_exit(pid: u32, _: WaitHandle) {
    let id = libc::id_t::from(pid);
    loop {
        // SAFETY: waitid writes into the siginfo we own.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Blocks until the process behind `handle` has exited. The handle stays
/// open: the supervisor owns the `Child` until it reaps it, after this.
#[cfg(windows)]
fn wait_exit(_pid: u32, handle: WaitHandle) {
    use windows_sys::Win32::System::Threading::{WaitForSingleObject, INFINITE};
    // SAFETY: the handle belongs to a Child the supervisor keeps open until
    // this wait has returned.
    unsafe { WaitForSingleObject(handle.raw as _, INFINITE) };
}
