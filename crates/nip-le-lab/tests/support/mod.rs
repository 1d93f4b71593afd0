//! Shared helpers for the multi-process tests: a scratch lock directory, the
//! `nip-le run` command with short timings from the same validated flags,
//! an independent foreign writer (Python, see `foreign_harness.py`), and
//! records written by hand.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use nip_le::AgentPubkey;
use nip_le_cli::drive::cluster::{Instance, RunOptions};

/// Test timings: short, and through the same `--*-ms` flags as production.
pub const REFRESH_MS: u64 = 200;
pub const STALE_MS: u64 = 1_000;
pub const STAND_DOWN_MS: u64 = 1_000;
/// Slack for scheduling on a loaded 2-core CI machine.
pub const MARGIN: Duration = Duration::from_millis(700);

pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

pub struct Scratch {
    pub tmp: tempfile::TempDir,
    pub lock_dir: PathBuf,
    pub pubkey: AgentPubkey,
}

impl Scratch {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let lock_dir = tmp.path().join("locks");
        let hex = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        Self {
            tmp,
            lock_dir,
            pubkey: AgentPubkey::parse(&hex).unwrap(),
        }
    }

    pub fn lock_path(&self) -> PathBuf {
        nip_le::lockfile::lock_path(&self.lock_dir, &self.pubkey)
    }

    pub fn opts(&self) -> RunOptions {
        RunOptions::new(
            env!("CARGO_BIN_EXE_nip-le-lab"),
            &self.lock_dir,
            self.pubkey,
        )
        .timings(REFRESH_MS, STALE_MS, STAND_DOWN_MS)
        // Claims travel as the desktop sends them, through the relay.
        .relay(self.tmp.path().join("relay.jsonl"))
    }

    /// Options with a mention feed (`mentions.jsonl`, starting with
    /// `first`) and its replies file (`replies.jsonl`) in the scratch dir.
    pub fn fed_opts(&self, first: &[u8]) -> (RunOptions, PathBuf, PathBuf) {
        let mentions = self.tmp.path().join("mentions.jsonl");
        let replies = self.tmp.path().join("replies.jsonl");
        std::fs::write(&mentions, first).unwrap();
        let mut opts = self.opts();
        opts.feed = Some((mentions.clone(), replies.clone()));
        (opts, mentions, replies)
    }

    pub fn spawn(&self, name: &str) -> Instance {
        self.spawn_with(name, self.opts())
    }

    pub fn spawn_with(&self, name: &str, opts: RunOptions) -> Instance {
        Instance::spawn(name, opts.command(None), Duration::from_secs(10))
            .expect("nip-le run starts")
    }

    /// The independent Python writer, with its own id.
    pub fn spawn_foreign(&self, name: &str, id: &str) -> Instance {
        self.spawn_foreign_with(name, id, &[])
    }

    /// The same, with more arguments (`--log-writes PATH`).
    pub fn spawn_foreign_with(&self, name: &str, id: &str, extra: &[&str]) -> Instance {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/foreign_harness.py");
        let mut c = Command::new("python3");
        c.arg(script)
            .arg("--lock-dir")
            .arg(&self.lock_dir)
            .arg("--pubkey")
            .arg(self.pubkey.as_str())
            .arg("--instance-id")
            .arg(id)
            .arg("--refresh-ms")
            .arg(REFRESH_MS.to_string())
            .arg("--stale-ms")
            .arg(STALE_MS.to_string())
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        Instance::spawn(name, c, Duration::from_secs(10)).expect("python3 foreign harness starts")
    }

    /// Writes raw bytes at the lock path (creating the directory).
    pub fn write_raw(&self, bytes: &[u8]) {
        std::fs::create_dir_all(&self.lock_dir).unwrap();
        std::fs::write(self.lock_path(), bytes).unwrap();
    }

    /// Writes a record in the harness's exact format.
    pub fn write_record(&self, id: &str, pid: u32, claimed_at: SystemTime) {
        self.write_raw(&nip_le::record::encode_record(id, pid, claimed_at, None));
    }

    /// Writes a record as the harness does: under the lock file's flock,
    /// so no reader that takes the flock sees it half written.
    pub fn write_record_locked(&self, id: &str, pid: u32, claimed_at: SystemTime) {
        std::fs::create_dir_all(&self.lock_dir).unwrap();
        let mut f = nip_le::lockfile::LockedFile::open_and_lock(&self.lock_path(), ms(2_000))
            .expect("the lock file's flock");
        f.write(&nip_le::record::encode_record(id, pid, claimed_at, None))
            .unwrap();
    }

    pub fn holder(&self) -> Option<String> {
        nip_le_cli::drive::cluster::lock_holder(&self.lock_path())
    }

    pub fn raw(&self) -> Vec<u8> {
        std::fs::read(self.lock_path()).unwrap_or_default()
    }
}

/// A live process unrelated to the election (for recycled-pid cases). Killed
/// on drop.
pub struct Unrelated(pub Child);

impl Unrelated {
    pub fn start() -> Self {
        // The stand-in agent's worker: it only sleeps, on every platform.
        Self(
            Command::new(env!("CARGO_BIN_EXE_nip-le-lab"))
                .arg("stand-in-worker")
                .spawn()
                .unwrap(),
        )
    }
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Unrelated {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Names of the instances whose latest report says they lead.
pub fn leaders(insts: &[Instance]) -> Vec<String> {
    insts
        .iter()
        .filter(|i| !i.exited() && i.is_leader() == Some(true))
        .map(|i| i.instance_id.clone())
        .collect()
}

/// Whether any report after `cursor` of `inst` says it leads.
pub fn ever_led_after(inst: &Instance, cursor: usize) -> bool {
    inst.reports()
        .iter()
        .skip(cursor)
        .any(|r| r.event() == "leadership" && r.is_leader() == Some(true))
}

/// Whether the lock file's `flock` can be taken now (taken and released at
/// once).
pub fn flock_free(path: &Path) -> bool {
    nip_le::lockfile::LockedFile::open_and_lock(path, Duration::from_millis(1)).is_ok()
}

/// SIGSTOPs `inst` at a moment it holds no `flock` on the lock file at
/// `lock`: stopped, checked, and resumed to try again if it was caught
/// inside its read-decide-write. A process frozen while it holds the
/// `flock` cannot be replaced by anyone until it resumes (the NIP's writers
/// all wait for that lock; `docs/known-limits.md`, "A window frozen inside
/// its lock"); the lock-hold tests cover that case on purpose, so the tests
/// of a hung window must not meet it by chance. Returns how many stops
/// landed inside the lock before one did not.
pub fn stop_outside_flock(inst: &Instance, lock: &Path) -> u32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut inside = 0;
    loop {
        inst.pause().unwrap();
        // The signal is delivered when each thread next runs: only a
        // process whose every thread has stopped can take no lock after
        // the check.
        assert!(
            nip_le_cli::drive::cluster::wait_until(Duration::from_secs(5), || all_stopped(
                inst.pid
            )),
            "{} never stopped",
            inst.name
        );
        if flock_free(lock) {
            return inside;
        }
        inside += 1;
        inst.resume().unwrap();
        assert!(
            std::time::Instant::now() < deadline,
            "{} held the lock file's flock at each of {inside} stops",
            inst.name
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of `pid` is stopped (Linux: `T` in each
/// `/proc/<pid>/task/*/stat`; Windows: `NtSuspendProcess` returned after
/// suspending them; elsewhere a short wait stands in).
fn all_stopped(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.flatten().all(|t| {
            std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
            })
        })
    }
    #[cfg(all(unix, not(target_os = "linux")))]
    {
        let _ = pid;
        std::thread::sleep(Duration::from_millis(20));
        true
    }
    #[cfg(windows)]
    {
        let _ = pid;
        true
    }
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
pub fn dead(pid: u32) -> bool {
    !nip_le_cli::drive::process::alive(pid)
}

/// The pid of the agent `i` runs now: its last `started` with no end after.
pub fn running_agent(i: &Instance) -> Option<u32> {
    use nip_le::agent::AgentEvent;
    let mut pid = None;
    for r in i.reports() {
        if let nip_le_cli::lines::Line::Agent { agent, .. } = r.line {
            match agent {
                AgentEvent::Started { pid: p } => pid = Some(p),
                AgentEvent::Exited { pid: p, .. } | AgentEvent::Stopped { pid: p, .. }
                    if Some(p) == pid =>
                {
                    pid = None
                }
                _ => {}
            }
        }
    }
    pid
}

/// A real etcd on loopback, or `None` (with a message) when no etcd binary
/// is installed; a missing etcd fails the test when `NIP_LE_REQUIRE_ETCD` is
/// set (as `scripts/test.sh` does, after installing it).
pub fn etcd_or_skip() -> Option<nip_le_lab::etcd::Etcd> {
    if nip_le_lab::etcd::find_etcd().is_none() {
        assert!(
            std::env::var_os("NIP_LE_REQUIRE_ETCD").is_none(),
            "NIP_LE_REQUIRE_ETCD is set but no etcd binary was found"
        );
        eprintln!("no etcd binary (Debian's etcd-server): skipping the cross-host tests");
        return None;
    }
    Some(nip_le_lab::etcd::Etcd::start().expect("etcd starts"))
}
