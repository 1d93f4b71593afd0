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
use serde_json::{json, Value};

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
}

pub fn status(a: StatusArgs) -> Result<ExitCode, nip_le::Error> {
    let config = crate::run::config_from(a.lock_dir, None, a.stale_ms, None, None)?;
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
    let now = SystemTime::now();
    let mut rows: Vec<Value> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
        .map(|e| describe(&e, now, config.stale))
        .collect();
    rows.sort_by(|a, b| a["file"].as_str().cmp(&b["file"].as_str()));
    if a.json {
        println!("{}", Value::Array(rows));
    } else {
        print_table(&rows);
    }
    Ok(ExitCode::SUCCESS)
}

fn describe(e: &std::fs::DirEntry, now: SystemTime, stale: Duration) -> Value {
    let name = e.file_name().to_string_lossy().into_owned();
    let stem = name.trim_end_matches(".lock");
    let pubkey_ok = AgentPubkey::parse(stem).is_ok();
    let mut row = json!({"file": name, "valid_pubkey": pubkey_ok});
    let meta = match e.path().symlink_metadata() {
        Ok(m) => m,
        Err(err) => {
            row["state"] = "unreadable".into();
            row["error"] = err.to_string().into();
            return row;
        }
    };
    if !meta.file_type().is_file() {
        row["state"] = file_kind(&meta.file_type()).into();
        row["takeable"] = false.into();
        return row;
    }
    if meta.len() > MAX_RECORD_BYTES as u64 {
        row["state"] = "oversized".into();
        row["size"] = meta.len().into();
        row["takeable"] = true.into();
        return row;
    }
    let content = match read_unguarded(&e.path()) {
        Ok(c) => c,
        Err(err) => {
            row["state"] = "unreadable".into();
            row["error"] = err.to_string().into();
            return row;
        }
    };
    row["state"] = content.kind().into();
    if let LockContent::Malformed(why) = &content {
        row["error"] = why.clone().into();
    }
    if let Some(r) = content.record() {
        row["holder"] = r.instance_id.clone().into();
        row["pid"] = r.pid.into();
        row["pid_alive"] = (probe(r.pid) == Liveness::Alive).into();
        row["claimed_at"] = r.claimed_at.instant().map(format_claimed_at).into();
        row["age_ms"] = match claim_age(&r.claimed_at, now) {
            ClaimAge::Past(d) => (d.as_millis() as i64).into(),
            ClaimAge::Future(d) => (-(d.as_millis() as i64)).into(),
            ClaimAge::Unparseable => Value::Null,
        };
    }
    // "Takeable now" from the point of view of any instance that is not the
    // holder.
    row["takeable"] = matches!(
        takeable(&content, "\0not-an-instance", now, stale, probe),
        Takeable::Yes(_)
    )
    .into();
    row
}

fn print_table(rows: &[Value]) {
    if rows.is_empty() {
        println!("no lock files");
        return;
    }
    println!(
        "{:<24} {:<10} {:<38} {:>8} {:<5} {:>9} {:<8}",
        "file", "state", "holder", "pid", "alive", "age", "takeable"
    );
    for r in rows {
        let s = |k: &str| match &r[k] {
            Value::Null => "-".to_owned(),
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let file = s("file");
        let short = if file.chars().count() > 24 {
            format!("{}…", file.chars().take(23).collect::<String>())
        } else {
            file
        };
        let age = match r["age_ms"].as_i64() {
            Some(ms) => format!("{:.1}s", ms as f64 / 1000.0),
            None => "-".into(),
        };
        println!(
            "{:<24} {:<10} {:<38} {:>8} {:<5} {:>9} {:<8}",
            short,
            s("state"),
            s("holder"),
            s("pid"),
            s("pid_alive"),
            age,
            s("takeable")
        );
    }
}
