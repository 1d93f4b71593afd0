//! The Buzz-shaped example's process manager, Tauri-free like Buzz's own
//! `crates/agent-controller`: it starts an agent harness per agent with a
//! cleared environment and an explicit list of variables, a per-start key,
//! the agent's workspace as its working directory, a log file per start,
//! in a session of its own; it stops the whole session. It implements the
//! engine's runner seam ([`AgentRunner`]), so the election decides which
//! app process runs each agent's harness.
//!
//! The harness is started held back: a guardian waits for a line on its
//! stdin, then becomes the harness (`exec`: the pid and the session stay),
//! so the engine can name the agent in its mark before the harness can
//! answer. Buzz's guardian is a re-exec of the app itself; here it is
//! `/bin/sh`, which starts in a millisecond where a re-exec of a Tauri app
//! costs its whole startup (about 70 ms for a debug build of this example)
//! on every hand-over.
//!
//! One more module: [`store`], the agents the app runs (kept on disk,
//! changed at runtime).

pub mod store;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nip_le::agent::{AgentExit, AgentRunner, AgentStart, StartError, StopOutcome};

/// The harness's exit code when another harness holds its instance lease.
pub const BUSY_EXIT_CODE: i32 = 75;

/// The guardian: waits for the go line (end of input: the app died before
/// naming the harness, which then never starts), then becomes the harness.
#[cfg(unix)]
const GUARDIAN: &str = r#"IFS= read -r _go || exit 125; exec "$0" "$@" </dev/null"#;

/// How to start an agent's harness.
#[derive(Debug, Clone)]
pub struct HarnessSpec {
    /// The harness program (absolute: the environment is cleared).
    pub program: PathBuf,
    /// Its arguments for this agent.
    pub args: Vec<OsString>,
    /// The agent's workspace: the harness's working directory.
    pub workspace: PathBuf,
    /// Where each start's log goes.
    pub log_dir: PathBuf,
    /// Variables the harness gets (nothing else is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// How long a harness has after SIGTERM before SIGKILL.
    pub grace: Duration,
}

/// One agent's harness, started and stopped for the election.
pub struct Controller {
    spec: HarnessSpec,
    running: Arc<Mutex<HashMap<u32, Child>>>,
    starts: u64,
}

impl Controller {
    /// A controller for `spec`.
    pub fn new(spec: HarnessSpec) -> Self {
        Self {
            spec,
            running: Arc::default(),
            starts: 0,
        }
    }

    /// The command that starts the harness held back (Windows: at once;
    /// the agent mark is written right after).
    fn guarded(&self) -> Command {
        #[cfg(unix)]
        {
            let mut c = Command::new("/bin/sh");
            c.arg("-c")
                .arg(GUARDIAN)
                .arg(&self.spec.program)
                .args(&self.spec.args);
            c
        }
        #[cfg(not(unix))]
        {
            let mut c = Command::new(&self.spec.program);
            c.args(&self.spec.args);
            c
        }
    }

    /// The child `pid`, taken out once it has exited (polled).
    fn wait_gone(&self, pid: u32, within: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + within;
        loop {
            let status = {
                let mut running = self.running.lock().unwrap();
                running.get_mut(&pid)?.try_wait().ok().flatten()
            };
            if let Some(s) = status {
                return Some(s);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Ends what the harness left in its session (its process group: it
    /// leads both).
    fn kill_session(pid: u32, sig: i32) {
        #[cfg(unix)]
        if let Ok(p) = i32::try_from(pid) {
            if p > 1 {
                // SAFETY: the group our harness leads; its leader is our
                // child, not reaped yet (or its group outlives it).
                unsafe { libc::kill(-p, sig) };
            }
        }
        #[cfg(not(unix))]
        let _ = (pid, sig);
    }
}

impl AgentRunner for Controller {
    fn start(&mut self, start: &AgentStart) -> Result<u32, StartError> {
        self.starts += 1;
        std::fs::create_dir_all(&self.spec.log_dir)
            .and_then(|()| std::fs::create_dir_all(&self.spec.workspace))
            .map_err(|e| StartError::Failed(format!("workspace or log directory: {e}")))?;
        let log_path = self
            .spec
            .log_dir
            .join(format!("{}-{}.log", start.pubkey(), self.starts));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| StartError::Failed(format!("log {}: {e}", log_path.display())))?;
        let err = log
            .try_clone()
            .map_err(|e| StartError::Failed(e.to_string()))?;
        let mut c = self.guarded();
        c.env_clear()
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            // A value of this start only (Buzz hands its harness the agent's
            // key, read from the credential store at every start).
            .env("BUZZ_DEMO_START_KEY", uuid_like())
            .env("BUZZ_INSTANCE_ELECTION_ID", start.instance_id())
            .current_dir(&self.spec.workspace)
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(err);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: setsid is async-signal-safe.
            unsafe {
                c.pre_exec(|| {
                    if libc::setsid() < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = c
            .spawn()
            .map_err(|e| StartError::Failed(format!("cannot start the guardian: {e}")))?;
        let pid = child.id();
        // Named before it can answer; then let it run.
        start.started(pid);
        let go = child
            .stdin
            .take()
            .map(|mut s| s.write_all(b"go\n"))
            .unwrap_or_else(|| Err(std::io::Error::other("no stdin")));
        self.running.lock().unwrap().insert(pid, child);
        if let Err(e) = go {
            self.stop(pid);
            return Err(StartError::Failed(format!("cannot start the harness: {e}")));
        }
        // Exits are reported to the supervisor from a thread of ours.
        let (running, exits) = (Arc::clone(&self.running), start.exits());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(20));
            let mut running = running.lock().unwrap();
            let Some(child) = running.get_mut(&pid) else {
                return; // stopped by us
            };
            if let Ok(Some(_)) | Err(_) = child.try_wait() {
                drop(running);
                exits.exited(pid);
                return;
            }
        });
        Ok(pid)
    }

    fn stop(&mut self, pid: u32) -> StopOutcome {
        #[cfg(unix)]
        Self::kill_session(pid, libc::SIGTERM);
        #[cfg(not(unix))]
        if let Some(c) = self.running.lock().unwrap().get_mut(&pid) {
            let _ = c.kill();
        }
        let killed = self.wait_gone(pid, self.spec.grace).is_none();
        if killed {
            #[cfg(unix)]
            Self::kill_session(pid, libc::SIGKILL);
            if let Some(c) = self.running.lock().unwrap().get_mut(&pid) {
                let _ = c.kill();
            }
            self.wait_gone(pid, Duration::from_secs(5));
        }
        #[cfg(unix)]
        Self::kill_session(pid, libc::SIGKILL);
        self.running.lock().unwrap().remove(&pid);
        StopOutcome { killed }
    }

    fn exited(&mut self, pid: u32) -> AgentExit {
        let child = self.running.lock().unwrap().remove(&pid);
        #[cfg(unix)]
        Self::kill_session(pid, libc::SIGKILL);
        let status = child.and_then(|mut c| c.wait().ok());
        let code = status.and_then(|s| s.code());
        #[cfg(unix)]
        let signal = {
            use std::os::unix::process::ExitStatusExt;
            status.and_then(|s| s.signal())
        };
        #[cfg(not(unix))]
        let signal = None;
        AgentExit {
            code,
            signal,
            busy: code == Some(BUSY_EXIT_CODE),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let pids: Vec<u32> = self.running.lock().unwrap().keys().copied().collect();
        for pid in pids {
            self.stop(pid);
        }
    }
}

/// A random hex key.
fn uuid_like() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}
