//! The command runner's processes, per platform. An agent is started held
//! back: its process exists (so it can be named in the agent mark) but its
//! program has not run until [`Agent::release`]. Unix: a `sh` that waits
//! for a line on its stdin, then `exec`s the program (the pid and start
//! time stay the same), leading a session and a process group of its own.
//! Windows: created suspended, in a Job Object that ends it and everything
//! it starts when the job is terminated or when this process exits.
//!
//! The agent is reaped only by [`Agent::reap`], after its waiter reported
//! the exit without reaping it, so a signal we send can never reach a
//! recycled pid.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use super::agent_command::AgentCommand;
use crate::identity::ELECTION_ID_ENV;

/// The shell that holds an agent back until it is named, then becomes it.
#[cfg(unix)]
const HOLD: &str = r#"IFS= read -r _go || exit 125; exec "$0" "$@" </dev/null"#;

/// A running agent process.
pub(super) struct Agent {
    child: Child,
    #[cfg(windows)]
    job: job::Job,
}

impl Agent {
    /// Starts `cmd` held back (see the module) with `instance_id`;
    /// `exited(pid)` is called from a thread of its own once the process
    /// has exited (it is not reaped). `dies_with_us`: Linux's native
    /// backend, where the kernel kills the agent when the thread that
    /// started it dies.
    pub(super) fn spawn(
        cmd: &AgentCommand,
        instance_id: &str,
        dies_with_us: bool,
        exited: impl FnOnce(u32) + Send + 'static,
    ) -> std::io::Result<Self> {
        let program = resolve(&cmd.program, cmd.env_path().as_deref())?;
        let mut c = held_back(&program, &cmd.args);
        if cmd.env_clear {
            c.env_clear();
        }
        if let Some(dir) = &cmd.current_dir {
            c.current_dir(dir);
        }
        c.envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .env(ELECTION_ID_ENV, instance_id);
        // Its stdout must not mix with ours (the CLI's JSON lines): both of
        // its streams go to our stderr.
        c.stdout(stderr_copy()?);
        prepare(&mut c, dies_with_us);
        let mut child = c.spawn()?;
        #[cfg(windows)]
        let job = match job::Job::adopt(&child) {
            Ok(j) => j,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
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
        Ok(Self {
            child,
            #[cfg(windows)]
            job,
        })
    }

    /// Lets the program run (it was held back until named).
    pub(super) fn release(&mut self) -> std::io::Result<()> {
        #[cfg(unix)]
        {
            use std::io::Write;
            let mut go = self
                .child
                .stdin
                .take()
                .ok_or_else(|| std::io::Error::other("released twice"))?;
            go.write_all(b"go\n")
        }
        #[cfg(windows)]
        {
            self.job.resume(self.child.id())
        }
    }

    /// Its pid.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks it to stop: SIGTERM to its process group (Unix); Windows has
    /// no such request for a console-less process, so its job is ended at
    /// once.
    pub(super) fn terminate(&mut self) {
        #[cfg(unix)]
        signal_group(self.pid(), libc::SIGTERM);
        #[cfg(windows)]
        self.job.terminate();
    }

    /// Ends it now: SIGKILL to its process group (Unix), its job (Windows).
    pub(super) fn kill(&mut self) {
        #[cfg(unix)]
        signal_group(self.pid(), libc::SIGKILL);
        #[cfg(windows)]
        self.job.terminate();
    }

    /// Reaps it (it has exited) and returns how it ended. First whatever
    /// it left is killed: its process group (its pid, and so the group's
    /// id, is still ours until the reap) and, on Linux, every process of
    /// its session that carries `instance_id`; on Windows its job.
    pub(super) fn reap(mut self, instance_id: &str) -> std::io::Result<ExitStatus> {
        #[cfg(unix)]
        {
            let pid = self.pid();
            signal_group(pid, libc::SIGKILL);
            #[cfg(target_os = "linux")]
            for (p, _) in super::tree::leftovers(pid, 0, instance_id) {
                if p != pid {
                    if let Ok(p) = libc::pid_t::try_from(p) {
                        // SAFETY: a live member of our agent's session
                        // (checked just before), not reaped by us.
                        unsafe { libc::kill(p, libc::SIGKILL) };
                    }
                }
            }
        }
        #[cfg(windows)]
        self.job.terminate();
        let _ = instance_id;
        self.child.wait()
    }
}

/// `program`, as `PATH` (`path`, or ours) finds it, or an error that says
/// it is not there: the agent is started through a shell, which would only
/// exit with 127.
fn resolve(program: &OsStr, path: Option<&OsStr>) -> std::io::Result<PathBuf> {
    let p = Path::new(program);
    let not_found = || {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("agent program {} not found", p.display()),
        )
    };
    if p.components().count() > 1 || p.is_absolute() {
        return if p.is_file() {
            Ok(p.to_owned())
        } else {
            Err(not_found())
        };
    }
    if cfg!(windows) {
        // CreateProcess searches itself (and knows `.exe`).
        return Ok(p.to_owned());
    }
    let path = path
        .map(OsString::from)
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
        .ok_or_else(not_found)
}

/// The command that starts `program` held back (see the module).
#[cfg(unix)]
fn held_back(program: &Path, args: &[OsString]) -> Command {
    let mut c = Command::new("/bin/sh");
    c.arg("-c").arg(HOLD).arg(program).args(args);
    c.stdin(Stdio::piped());
    c
}

#[cfg(windows)]
fn held_back(program: &Path, args: &[OsString]) -> Command {
    let mut c = Command::new(program);
    c.args(args).stdin(Stdio::null());
    c
}

/// A copy of our stderr for the agent's stdout.
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

/// Unix: the agent leads a session and a process group of its own (so a
/// stop reaches what it starts, and a terminal's Ctrl-C or Ctrl-Z meant for
/// the app does not reach it), and on Linux with `dies_with_us` the kernel
/// kills it when the thread that started it (the supervisor's, alive as
/// long as the app) dies.
#[cfg(unix)]
fn prepare(c: &mut Command, dies_with_us: bool) {
    use std::os::unix::process::CommandExt;
    #[cfg(target_os = "linux")]
    // SAFETY: getpid before the fork; in the child only async-signal-safe
    // calls (setsid, prctl, getppid, raise).
    let parent = unsafe { libc::getpid() };
    #[cfg(not(target_os = "linux"))]
    let _ = dies_with_us;
    // SAFETY: see above; the closure touches no lock and allocates nothing.
    unsafe {
        c.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            if dies_with_us {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The app died between the fork and the prctl.
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
            }
            Ok(())
        });
    }
}

/// Windows: suspended until named, and no console window for a console
/// program started by a GUI app.
#[cfg(windows)]
fn prepare(c: &mut Command, _dies_with_us: bool) {
    use std::os::windows::process::CommandExt;
    const CREATE_SUSPENDED: u32 = 0x0000_0004;
    const CREATE_NO_WINDOW: u32 = 0x0800_0000;
    c.creation_flags(CREATE_SUSPENDED | CREATE_NO_WINDOW);
}

#[cfg(unix)]
fn signal_group(pid: u32, sig: i32) {
    if let Ok(p) = libc::pid_t::try_from(pid) {
        if p > 1 {
            // SAFETY: kill with a negative pid signals the process group
            // our agent leads; it is not reaped yet, so the id is ours.
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
/// open: the runner owns the `Child` until it reaps it, after this.
#[cfg(windows)]
fn wait_exit(_pid: u32, handle: WaitHandle) {
    use windows_sys::Win32::System::Threading::{WaitForSingleObject, INFINITE};
    // SAFETY: the handle belongs to a Child the runner keeps open until
    // this wait has returned.
    unsafe { WaitForSingleObject(handle.raw as _, INFINITE) };
}

/// Windows: the Job Object an agent and its tree live in.
#[cfg(windows)]
mod job {
    use std::process::Child;

    use windows_sys::Win32::Foundation::{CloseHandle, HANDLE, INVALID_HANDLE_VALUE};
    use windows_sys::Win32::System::Diagnostics::ToolHelp::{
        CreateToolhelp32Snapshot, Thread32First, Thread32Next, TH32CS_SNAPTHREAD, THREADENTRY32,
    };
    use windows_sys::Win32::System::JobObjects::{
        AssignProcessToJobObject, CreateJobObjectW, JobObjectExtendedLimitInformation,
        SetInformationJobObject, TerminateJobObject, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
        JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    };
    use windows_sys::Win32::System::Threading::{OpenThread, ResumeThread, THREAD_SUSPEND_RESUME};

    /// A job whose processes all end when it is terminated or when its
    /// last handle (ours, held as long as the agent runs, and closed by
    /// the kernel when this process dies) is closed.
    pub(super) struct Job(HANDLE);

    // SAFETY: a job handle may be used and closed from any thread.
    unsafe impl Send for Job {}

    impl Job {
        /// A new kill-on-close job holding `child` (created suspended, so it
        /// started nothing outside the job yet).
        pub(super) fn adopt(child: &Child) -> std::io::Result<Self> {
            use std::os::windows::io::AsRawHandle;
            // SAFETY: plain Win32 calls on handles we own; the structure is
            // zeroed, then the one limit we want is set.
            unsafe {
                let h = CreateJobObjectW(std::ptr::null(), std::ptr::null());
                if h.is_null() {
                    return Err(std::io::Error::last_os_error());
                }
                let job = Job(h);
                let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = std::mem::zeroed();
                info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
                let size = std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32;
                if SetInformationJobObject(
                    job.0,
                    JobObjectExtendedLimitInformation,
                    (&info as *const JOBOBJECT_EXTENDED_LIMIT_INFORMATION).cast(),
                    size,
                ) == 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if AssignProcessToJobObject(job.0, child.as_raw_handle() as HANDLE) == 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(job)
            }
        }

        /// Resumes the threads of `pid` (its one thread, created
        /// suspended: std keeps no handle to it).
        pub(super) fn resume(&self, pid: u32) -> std::io::Result<()> {
            // SAFETY: a thread snapshot we close; threads we open, resume
            // and close; the entry's size is set as the API asks.
            unsafe {
                let snap = CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0);
                if snap == INVALID_HANDLE_VALUE {
                    return Err(std::io::Error::last_os_error());
                }
                let mut entry: THREADENTRY32 = std::mem::zeroed();
                entry.dwSize = std::mem::size_of::<THREADENTRY32>() as u32;
                let mut resumed = 0;
                let mut more = Thread32First(snap, &mut entry) != 0;
                while more {
                    if entry.th32OwnerProcessID == pid {
                        let t = OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID);
                        if !t.is_null() {
                            if ResumeThread(t) != u32::MAX {
                                resumed += 1;
                            }
                            CloseHandle(t);
                        }
                    }
                    more = Thread32Next(snap, &mut entry) != 0;
                }
                CloseHandle(snap);
                if resumed == 0 {
                    return Err(std::io::Error::other("no thread of the agent to resume"));
                }
                Ok(())
            }
        }

        /// Ends every process of the job.
        pub(super) fn terminate(&self) {
            // SAFETY: our own job handle.
            unsafe { TerminateJobObject(self.0, 1) };
        }
    }

    impl Drop for Job {
        fn drop(&mut self) {
            // SAFETY: our own handle, closed once. Kill-on-close ends what
            // is left in the job.
            unsafe { CloseHandle(self.0) };
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_held_back_agent_runs_only_once_released_and_keeps_its_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let ran = tmp.path().join("ran");
        let script = format!("echo $$ > {}; exec sleep 30", ran.display());
        let cmd = AgentCommand::new("sh", ["-c", &script]);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut a = Agent::spawn(&cmd, "w", false, move |pid| {
            let _ = tx.send(pid);
        })
        .unwrap();
        // Its process exists (it can be named), its program has not run.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!ran.exists(), "the program ran before it was released");
        a.release().unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while !std::fs::read_to_string(&ran).is_ok_and(|s| s.ends_with('\n')) {
            assert!(Instant::now() < end, "the program never ran");
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid: u32 = std::fs::read_to_string(&ran)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(pid, a.pid(), "the program is the process that was named");
        a.kill();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), pid);
        a.reap("w").unwrap();
    }

    #[test]
    fn a_held_back_agent_whose_app_goes_away_never_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let ran = tmp.path().join("ran");
        let script = format!("touch {}", ran.display());
        let cmd = AgentCommand::new("sh", ["-c", &script]);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut a = Agent::spawn(&cmd, "w", false, move |pid| {
            let _ = tx.send(pid);
        })
        .unwrap();
        // The go line never comes: the end of its input stops it.
        drop(a.child.stdin.take());
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let status = a.reap("w").unwrap();
        assert_eq!(status.code(), Some(125));
        assert!(!ran.exists());
    }

    #[test]
    fn a_missing_program_is_a_clear_error() {
        let cmd = AgentCommand::new("/no/such/agent", Vec::<String>::new());
        let e = Agent::spawn(&cmd, "w", false, |_| {})
            .err()
            .expect("refused");
        assert!(e.to_string().contains("not found"), "{e}");
        let cmd = AgentCommand::new("no-such-agent-program-here", Vec::<String>::new());
        assert!(Agent::spawn(&cmd, "w", false, |_| {}).is_err());
    }
}
