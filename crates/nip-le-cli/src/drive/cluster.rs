//! Driving a set of `nip-le run` processes: spawn them, read their JSON-line
//! reports, signal them, and wait (with deadlines) for conditions on what
//! they said. Used by `nip-le demo`, the multi-process tests and benchmarks,
//! so every one of them observes real processes through the same interface.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nip_le::AgentPubkey;

use crate::lines::{Leadership, Line};

/// Options shared by the instances of one cluster.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The `nip-le` executable.
    pub exe: PathBuf,
    /// Lock directory shared by the instances.
    pub lock_dir: PathBuf,
    /// The agent key they elect for.
    pub pubkey: AgentPubkey,
    /// `--refresh-ms`, when set.
    pub refresh_ms: Option<u64>,
    /// `--stale-ms`, when set.
    pub stale_ms: Option<u64>,
    /// `--stand-down-ms`, when set.
    pub stand_down_ms: Option<u64>,
    /// `--mentions FILE --replies FILE`, when set.
    pub feed: Option<(PathBuf, PathBuf)>,
    /// `--relay FILE` (the relay's fan-out of control frames), when set.
    pub relay: Option<PathBuf>,
    /// Extra arguments appended to `run`.
    pub extra_args: Vec<String>,
}

impl RunOptions {
    /// Options with the NIP's default timings.
    pub fn new(exe: impl Into<PathBuf>, lock_dir: impl Into<PathBuf>, pubkey: AgentPubkey) -> Self {
        Self {
            exe: exe.into(),
            lock_dir: lock_dir.into(),
            pubkey,
            refresh_ms: None,
            stale_ms: None,
            stand_down_ms: None,
            feed: None,
            relay: None,
            extra_args: Vec::new(),
        }
    }

    /// Instances follow `path` as the relay: a claim reaches every one of
    /// them as a `claim_leadership` frame, spec instances included.
    pub fn relay(mut self, path: impl Into<PathBuf>) -> Self {
        self.relay = Some(path.into());
        self
    }

    /// Sets refresh, stale and stand-down in milliseconds.
    pub fn timings(mut self, refresh_ms: u64, stale_ms: u64, stand_down_ms: u64) -> Self {
        self.refresh_ms = Some(refresh_ms);
        self.stale_ms = Some(stale_ms);
        self.stand_down_ms = Some(stand_down_ms);
        self
    }

    /// The `run` command line for one instance.
    pub fn command(&self, instance_id: Option<&str>) -> Command {
        let mut c = Command::new(&self.exe);
        c.arg("run")
            .arg("--pubkey")
            .arg(self.pubkey.as_str())
            .arg("--lock-dir")
            .arg(&self.lock_dir);
        for (flag, v) in [
            ("--refresh-ms", self.refresh_ms),
            ("--stale-ms", self.stale_ms),
            ("--stand-down-ms", self.stand_down_ms),
        ] {
            if let Some(v) = v {
                c.arg(flag).arg(v.to_string());
            }
        }
        if let Some((m, r)) = &self.feed {
            c.arg("--mentions").arg(m).arg("--replies").arg(r);
        }
        if let Some(r) = &self.relay {
            c.arg("--relay").arg(r);
        }
        if let Some(id) = instance_id {
            c.arg("--instance-id").arg(id);
        }
        c.args(&self.extra_args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        c
    }
}

/// One line an instance printed, with when we read it.
#[derive(Debug, Clone)]
pub struct Report {
    /// The line.
    pub line: Line,
    /// When the line was read.
    pub received: Instant,
}

impl Report {
    /// The leadership report, when this is one.
    pub fn leadership(&self) -> Option<&Leadership> {
        self.line.leadership()
    }
    /// The `event` tag of the line.
    pub fn event(&self) -> &'static str {
        self.line.event()
    }
    /// `reason` of a leadership report.
    pub fn reason(&self) -> Option<nip_le::ChangeReason> {
        self.leadership().map(|l| l.reason)
    }
    /// `is_leader` of a leadership report.
    pub fn is_leader(&self) -> Option<bool> {
        self.leadership().map(|l| l.is_leader)
    }
    /// `at_ms` of a leadership report.
    pub fn at_ms(&self) -> Option<u64> {
        self.leadership().map(|l| l.at_ms)
    }
}

#[derive(Debug, Default)]
struct Shared {
    reports: Vec<Report>,
    eof: bool,
}

/// A running `nip-le run` process. Dropping it SIGKILLs and reaps it.
#[derive(Debug)]
pub struct Instance {
    /// A label for narration.
    pub name: String,
    /// Its instance id (from its `started` line).
    pub instance_id: String,
    /// Its pid.
    pub pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    shared: Arc<Mutex<Shared>>,
    reader: Option<JoinHandle<()>>,
    reaped: bool,
}

/// Polls `f` every 2 ms until it holds or `deadline` passes; returns whether
/// it held.
pub fn wait_until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl Instance {
    /// Spawns `cmd` (see [`RunOptions::command`]) and waits up to `deadline`
    /// for its `started` line.
    pub fn spawn(
        name: impl Into<String>,
        cmd: Command,
        deadline: Duration,
    ) -> std::io::Result<Self> {
        let mut inst = Self::spawn_detached(name, cmd)?;
        let started = inst.wait_for(deadline, |r| {
            r.iter().find_map(|r| match &r.line {
                Line::Started { instance_id, .. } => Some(instance_id.clone()),
                _ => None,
            })
        });
        match started {
            Some(id) => {
                inst.instance_id = id;
                Ok(inst)
            }
            None => Err(std::io::Error::other(format!(
                "{}: no started line within {deadline:?}",
                inst.name
            ))),
        }
    }

    /// Spawns `cmd` without waiting for anything (its `instance_id` stays
    /// empty; read it from its reports), so many can start together.
    pub fn spawn_detached(name: impl Into<String>, mut cmd: Command) -> std::io::Result<Self> {
        let mut child = cmd.spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("the command's stdout is not piped"))?;
        let stdin = child.stdin.take();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let sh = Arc::clone(&shared);
        let reader = std::thread::spawn(move || {
            for text in BufReader::new(stdout).lines() {
                let Ok(text) = text else { break };
                match serde_json::from_str::<Line>(&text) {
                    Ok(line) => lock(&sh).reports.push(Report {
                        line,
                        received: Instant::now(),
                    }),
                    Err(e) => eprintln!("unreadable report line {text:?}: {e}"),
                }
            }
            lock(&sh).eof = true;
        });
        Ok(Self {
            name: name.into(),
            instance_id: String::new(),
            pid: child.id(),
            child,
            stdin,
            shared,
            reader: Some(reader),
            reaped: false,
        })
    }

    /// The latest leadership report's `is_leader` for one key (processes
    /// may join several).
    pub fn is_leader_of(&self, pubkey: &str) -> Option<bool> {
        self.latest_view(|l| l.pubkey == pubkey)
    }

    fn latest_view(&self, matches: impl Fn(&Leadership) -> bool) -> Option<bool> {
        lock(&self.shared)
            .reports
            .iter()
            .rev()
            .filter_map(Report::leadership)
            .find(|l| matches(l))
            .map(|l| l.is_leader)
    }

    /// `at_ms` of the first report after `cursor` that says it leads.
    pub fn first_lead_after(&self, cursor: usize) -> Option<u64> {
        lock(&self.shared)
            .reports
            .iter()
            .skip(cursor)
            .filter_map(Report::leadership)
            .find(|l| l.is_leader)
            .map(|l| l.at_ms)
    }

    /// Waits until `f` over all reports so far returns `Some`.
    pub fn wait_for<T>(
        &self,
        deadline: Duration,
        mut f: impl FnMut(&[Report]) -> Option<T>,
    ) -> Option<T> {
        let mut out = None;
        wait_until(deadline, || {
            out = f(&lock(&self.shared).reports);
            out.is_some()
        });
        out
    }

    /// Every report so far.
    pub fn reports(&self) -> Vec<Report> {
        lock(&self.shared).reports.clone()
    }

    /// Every leadership report so far.
    pub fn views(&self) -> Vec<Leadership> {
        lock(&self.shared)
            .reports
            .iter()
            .filter_map(Report::leadership)
            .cloned()
            .collect()
    }

    /// The latest leadership report's `is_leader`, if any.
    pub fn is_leader(&self) -> Option<bool> {
        self.latest_view(|_| true)
    }

    /// Number of reports so far (a cursor for [`Instance::wait_after`]).
    pub fn cursor(&self) -> usize {
        lock(&self.shared).reports.len()
    }

    /// Waits for a report after `cursor` that satisfies `pred`.
    pub fn wait_after(
        &self,
        cursor: usize,
        deadline: Duration,
        pred: impl Fn(&Report) -> bool,
    ) -> Option<Report> {
        self.wait_for(deadline, |r| {
            r.iter().skip(cursor).find(|r| pred(r)).cloned()
        })
    }

    /// Whether its stdout has closed.
    pub fn exited(&self) -> bool {
        lock(&self.shared).eof
    }

    /// Writes one line to its stdin.
    pub fn send(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::other("stdin closed"))?;
        stdin.write_all(format!("{line}\n").as_bytes())?;
        stdin.flush()
    }

    /// Closes its stdin (end of input is not a reason for it to exit).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends a signal.
    #[cfg(unix)]
    pub fn signal(&self, sig: i32) -> std::io::Result<()> {
        // SAFETY: plain kill(2) on our own child's pid.
        if unsafe { libc::kill(self.pid as i32, sig) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Stops it gracefully: SIGTERM on Unix; on Windows, which has no
    /// signal for a console-less process, its `exit` line.
    pub fn terminate(&mut self) -> std::io::Result<()> {
        #[cfg(unix)]
        return self.signal(libc::SIGTERM);
        #[cfg(not(unix))]
        self.send("exit")
    }

    /// Stops every thread of it until [`Instance::resume`] (SIGSTOP,
    /// `NtSuspendProcess`).
    pub fn pause(&self) -> std::io::Result<()> {
        super::process::pause(self.pid)
    }

    /// Lets it run again after [`Instance::pause`].
    pub fn resume(&self) -> std::io::Result<()> {
        super::process::resume(self.pid)
    }

    /// SIGKILL and reap at once, so the pid reads as dead (a zombie would
    /// read as alive, as in the harness).
    pub fn kill_and_reap(&mut self) -> std::io::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        self.reaped = true;
        Ok(())
    }

    /// Waits (up to `deadline`) for the process to exit and reaps it.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + deadline;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.reaped = true;
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return Some(st);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A random agent key, for scratch elections (demo, benchmarks, tests).
pub fn random_pubkey() -> AgentPubkey {
    let hex = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    AgentPubkey::parse(&hex).expect("two simple UUIDs are 64 hex characters")
}

pub use crate::unix_ms;

/// Waits (up to `deadline`) for an instance other than `except` (and not
/// exited) to report leading after its cursor; returns the earliest such
/// report as (index, `at_ms`).
pub fn first_new_leader(
    insts: &[Instance],
    cursors: &[usize],
    except: Option<usize>,
    deadline: Duration,
) -> Option<(usize, u64)> {
    let mut out = None;
    wait_until(deadline, || {
        out = (0..insts.len())
            .filter(|&i| Some(i) != except && !insts[i].exited())
            .filter_map(|i| insts[i].first_lead_after(cursors[i]).map(|at| (i, at)))
            .min_by_key(|&(_, at)| at);
        out.is_some()
    });
    out
}

/// The holder named by the lock file at `path`, if it holds a record.
pub fn lock_holder(path: &Path) -> Option<String> {
    nip_le::lockfile::read_unguarded(path)
        .ok()
        .and_then(|c| c.record().map(|r| r.instance_id.clone()))
}

/// A poisoned lock (a reader thread panicked) still holds the reports.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
