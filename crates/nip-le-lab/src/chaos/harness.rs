//! Harness children for `nip-le-lab chaos --children`: beside every extended
//! window runs the independent writer of INTEROP.md (the Python script the
//! interop tests use, written in another language on purpose) with the
//! window's instance id, as Buzz's desktop hands `BUZZ_INSTANCE_ELECTION_ID`
//! to the harness it spawns. The child rewrites the record with its own pid
//! every refresh and truncates the file when it exits gracefully.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nip_le_cli::drive::cluster::Instance;

/// The writer's source, carried in the binary so that `nip-le-lab chaos` runs
/// from anywhere.
const SCRIPT: &str = include_str!("../../tests/support/foreign_harness.py");

/// How to start a harness child.
#[derive(Debug, Clone)]
pub struct Harness {
    script: PathBuf,
    lock_dir: PathBuf,
    pubkey: String,
    refresh_ms: u64,
    stale_ms: u64,
}

impl Harness {
    /// Writes the script into `dir` and returns how to start children on
    /// `lock_dir` for `pubkey` with the cluster's timings.
    pub fn new(
        dir: &Path,
        lock_dir: &Path,
        pubkey: &str,
        refresh_ms: u64,
        stale_ms: u64,
    ) -> std::io::Result<Self> {
        let script = dir.join("harness.py");
        std::fs::write(&script, SCRIPT)?;
        Ok(Self {
            script,
            lock_dir: lock_dir.to_path_buf(),
            pubkey: pubkey.to_string(),
            refresh_ms,
            stale_ms,
        })
    }

    /// Starts a child carrying `instance_id` and waits for its `started`
    /// line; a machine without `python3` gets an error that says so.
    pub fn spawn(&self, name: String, instance_id: &str) -> std::io::Result<Instance> {
        let mut c = Command::new("python3");
        c.arg(&self.script)
            .arg("--lock-dir")
            .arg(&self.lock_dir)
            .arg("--pubkey")
            .arg(&self.pubkey)
            .arg("--instance-id")
            .arg(instance_id)
            .arg("--refresh-ms")
            .arg(self.refresh_ms.to_string())
            .arg("--stale-ms")
            .arg(self.stale_ms.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        Instance::spawn(name, c, Duration::from_secs(10)).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("a harness child (python3 {}): {e}", self.script.display()),
            )
        })
    }
}
