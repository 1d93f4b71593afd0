//! `nip-le status`: every `*.lock` file in a directory, classified. Hostile
//! entries (symlinks, directories, fifos, huge or malformed files, names that
//! are not pubkeys) are listed as such; nothing is followed or written.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Args;
use nip_le::election::{claim_age, takeable, ClaimAge, Takeable};
use nip_le::liveness::{probe, Liveness};
use nip_le::lockfile::{file_kind, read_unguarded};
use nip_le::record::{format_claimed_at, LockContent, MAX_RECORD_BYTES};
use nip_le::AgentPubkey;
use serde::Serialize;

use super::{EtcdArgs, TimingArgs};

/// Options of `nip-le status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Lock directory [default: $BUZZ_LEADER_LOCK_DIR or ~/.buzz/leader-locks].
    #[arg(long)]
    lock_dir: Option<PathBuf>,
    /// Print one JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Stale bound used for "takeable now", in milliseconds [default: 10000].
    #[arg(long)]
    stale_ms: Option<u64>,
    /// With `--etcd URL`: also show who holds each agent across hosts.
    #[command(flatten)]
    etcd: EtcdArgs,
}

/// One `*.lock` entry of the directory.
#[derive(Debug, Default, Serialize)]
pub struct LockEntry {
    /// Its file name.
    pub file: String,
    /// Whether the name is `<64 hex>.lock`.
    pub valid_pubkey: bool,
    /// `record`, `empty`, `malformed`, `oversized`, `unreadable`, or the
    /// kind of a non-file (`symlink`, `directory`, `fifo`, …).
    pub state: String,
    /// Why it is unreadable or malformed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The size of an oversized file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The holder the record names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The holder's pid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Whether that pid runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid_alive: Option<bool>,
    /// `claimed_at`, when it parsed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<String>,
    /// Milliseconds since `claimed_at` (negative: in the future).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<i64>,
    /// Whether any other instance could take it now by the NIP's rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeable: Option<bool>,
    /// With `--etcd`: the holder of the agent's etcd key (`null`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_holder: Option<Option<nip_le::GlobalHolder>>,
    /// With `--etcd`: why the etcd key could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_error: Option<String>,
}

/// Lists the directory.
pub fn status(a: StatusArgs) -> Result<ExitCode, nip_le::Error> {
    let timings = TimingArgs {
        stale_ms: a.stale_ms,
        // The stale bound must exceed the refresh: keep the default refresh
        // valid for a short stale bound.
        refresh_ms: a.stale_ms.map(|s| (s / 2).max(1)),
        ..TimingArgs::default()
    };
    let config = super::config_from(a.lock_dir, &timings, Some(1))?;
    let dir = &config.lock_dir;
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if a.json {
                println!("[]");
            } else {
                println!("no lock directory at {}", dir.display());
            }
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => {
            return Err(nip_le::Error::Io {
                path: dir.clone(),
                source: e,
            })
        }
    };
    if let Some(fs) = nip_le::host::network_fs(dir) {
        // On stderr, so `--json` output stays one JSON document.
        eprintln!(
            "warning: {} is on a network filesystem ({fs}): flock may not exclude across hosts",
            dir.display()
        );
    }
    let now = SystemTime::now();
    let mut rows: Vec<LockEntry> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
        .map(|e| describe(&e, now, config.stale))
        .collect();
    rows.sort_by(|a, b| a.file.cmp(&b.file));
    if let Some(etcd) = a.etcd.config()? {
        etcd.validate()
            .map_err(|e| nip_le::Error::Config(nip_le::config::ConfigError::Etcd(e)))?;
        for row in rows.iter_mut() {
            let Ok(pk) = AgentPubkey::parse(row.file.trim_end_matches(".lock")) else {
                continue;
            };
            match nip_le::global::read_holder(&etcd, &pk) {
                Ok(h) => row.global_holder = Some(h),
                Err(e) => row.global_error = Some(e),
            }
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&rows).expect("rows are strings and numbers")
        );
    } else {
        print_table(&rows);
    }
    Ok(ExitCode::SUCCESS)
}

fn describe(e: &std::fs::DirEntry, now: SystemTime, stale: Duration) -> LockEntry {
    let file = e.file_name().to_string_lossy().into_owned();
    let mut row = LockEntry {
        valid_pubkey: AgentPubkey::parse(file.trim_end_matches(".lock")).is_ok(),
        file,
        ..LockEntry::default()
    };
    let meta = match e.path().symlink_metadata() {
        Ok(m) => m,
        Err(err) => {
            row.state = "unreadable".into();
            row.error = Some(err.to_string());
            return row;
        }
    };
    if !meta.file_type().is_file() {
        row.state = file_kind(&meta.file_type()).into();
        row.takeable = Some(false);
        return row;
    }
    if meta.len() > MAX_RECORD_BYTES as u64 {
        row.state = "oversized".into();
        row.size = Some(meta.len());
        row.takeable = Some(true);
        return row;
    }
    let content = match read_unguarded(&e.path()) {
        Ok(c) => c,
        Err(err) => {
            row.state = "unreadable".into();
            row.error = Some(err.to_string());
            return row;
        }
    };
    row.state = content.kind().into();
    if let LockContent::Malformed(why) = &content {
        row.error = Some(why.clone());
    }
    if let Some(r) = content.record() {
        row.holder = Some(r.instance_id.clone());
        row.pid = Some(r.pid);
        row.pid_alive = Some(probe(r.pid) == Liveness::Alive);
        row.claimed_at = r.claimed_at.instant().map(format_claimed_at);
        row.age_ms = match claim_age(&r.claimed_at, now) {
            ClaimAge::Past(d) => Some(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            ClaimAge::Future(d) => Some(-i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            ClaimAge::Unparseable => None,
        };
    }
    // "Takeable now" from the point of view of any instance that is not the
    // holder.
    row.takeable = Some(matches!(
        takeable(&content, "\0not-an-instance", now, stale, probe),
        Takeable::Yes(_)
    ));
    row
}

fn print_table(rows: &[LockEntry]) {
    if rows.is_empty() {
        println!("no lock files");
        return;
    }
    println!(
        "{:<24} {:<10} {:<38} {:>8} {:<5} {:>9} {:<8}",
        "file", "state", "holder", "pid", "alive", "age", "takeable"
    );
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for r in rows {
        let short = if r.file.chars().count() > 24 {
            format!("{}…", r.file.chars().take(23).collect::<String>())
        } else {
            r.file.clone()
        };
        println!(
            "{:<24} {:<10} {:<38} {:>8} {:<5} {:>9} {:<8}",
            short,
            r.state,
            dash(r.holder.clone()),
            dash(r.pid.map(|p| p.to_string())),
            dash(r.pid_alive.map(|b| b.to_string())),
            dash(r.age_ms.map(|ms| format!("{:.1}s", ms as f64 / 1000.0))),
            dash(r.takeable.map(|b| b.to_string())),
        );
        // With --etcd: who acts for this agent across hosts.
        match (&r.global_holder, &r.global_error) {
            (Some(Some(h)), _) => println!(
                "  global: host {} instance {} (revision {})",
                h.host_id, h.instance_id, h.revision
            ),
            (Some(None), _) => println!("  global: nobody holds the etcd key"),
            (None, Some(e)) => println!("  global: etcd unreadable: {e}"),
            (None, None) => {}
        }
    }
}
