//! `nip-le status`: every `*.lock` file in a directory, classified, with
//! what else the directory says of each agent: the holder's epoch and host,
//! its work ledger (taken, done, given back) and its supervised agent
//! process. Hostile entries (symlinks, directories, fifos, huge or
//! malformed files, names that are not pubkeys) are listed as such; nothing
//! is followed or written. `--watch` prints it again every second.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Args;
use nip_le::agent::orphan::read_mark;
use nip_le::election::{claim_age, takeable, ClaimAge, Takeable};
use nip_le::ledger::{ledger_path, Ledger, StateCounts};
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
    /// Print it again every second until interrupted (with `--json`: one
    /// JSON array per line).
    #[arg(long)]
    watch: bool,
    /// With `--etcd URL`: also show who holds each agent across hosts.
    #[command(flatten)]
    etcd: EtcdArgs,
}

/// The agent process a window supervises for this agent, as its mark names
/// it.
#[derive(Debug, Default, Serialize)]
pub struct AgentSummary {
    /// The instance id of the window that started it.
    pub instance_id: String,
    /// Its pid.
    pub pid: u32,
    /// Whether that pid runs.
    pub alive: bool,
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
    /// The holder's fencing epoch (extended mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The host the holder's record was written on (extended mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The agent's work ledger, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<StateCounts>,
    /// Why the ledger could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_error: Option<String>,
    /// The agent process a window supervises, when a mark names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSummary>,
    /// With `--etcd`: the holder of the agent's etcd key (`null`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_holder: Option<Option<nip_le::GlobalHolder>>,
    /// With `--etcd`: why the etcd key could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_error: Option<String>,
}

/// Lists the directory, once or (`--watch`) every second.
pub fn status(a: StatusArgs) -> Result<ExitCode, nip_le::Error> {
    loop {
        if a.watch && !a.json {
            // Clear the terminal and go home, as `watch` does.
            print!("\x1b[2J\x1b[H");
        }
        let code = status_once(&a)?;
        if !a.watch {
            return Ok(code);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn status_once(a: &StatusArgs) -> Result<ExitCode, nip_le::Error> {
    let timings = TimingArgs {
        stale_ms: a.stale_ms,
        // The stale bound must exceed the refresh: keep the default refresh
        // valid for a short stale bound.
        refresh_ms: a.stale_ms.map(|s| (s / 2).max(1)),
        ..TimingArgs::default()
    };
    let config = super::config_from(a.lock_dir.clone(), &timings, Some(1))?;
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
    let mut rows = rows(dir, entries, config.stale, config.work_retention);
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

/// One row per `*.lock` entry of `dir`, sorted by name.
fn rows(
    dir: &std::path::Path,
    entries: std::fs::ReadDir,
    stale: Duration,
    retention: Duration,
) -> Vec<LockEntry> {
    let now = SystemTime::now();
    let mut rows: Vec<LockEntry> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
        .map(|e| describe(&e, now, stale))
        .collect();
    rows.sort_by(|a, b| a.file.cmp(&b.file));
    for row in rows.iter_mut() {
        if let Ok(pk) = AgentPubkey::parse(row.file.trim_end_matches(".lock")) {
            beside(row, dir, &pk, retention);
        }
    }
    rows
}

/// What the files beside the lock file say: the ledger, counted, and the
/// supervised agent's mark.
fn beside(row: &mut LockEntry, dir: &std::path::Path, pk: &AgentPubkey, retention: Duration) {
    let path = ledger_path(dir, pk);
    if path.symlink_metadata().is_ok() {
        match Ledger::load(path, crate::unix_ms(), retention) {
            Ok(l) => row.ledger = Some(l.index.counts()),
            Err(e) => row.ledger_error = Some(e.to_string()),
        }
    }
    if let Some(m) = read_mark(dir, pk) {
        row.agent = Some(AgentSummary {
            alive: probe(m.pid) == Liveness::Alive,
            instance_id: m.instance_id,
            pid: m.pid,
        });
    }
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
        row.epoch = r.epoch;
        row.host = r.host.clone();
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
        if r.epoch.is_some() || r.host.is_some() {
            println!(
                "  holder: epoch {} host {}",
                dash(r.epoch.map(|e| e.to_string())),
                dash(r.host.clone())
            );
        }
        match (&r.ledger, &r.ledger_error) {
            (Some(l), _) => println!(
                "  work: {} in flight, {} done, {} given back",
                l.taken, l.done, l.given_back
            ),
            (None, Some(e)) => println!("  work: ledger unreadable: {e}"),
            (None, None) => {}
        }
        if let Some(g) = &r.agent {
            println!(
                "  agent process: pid {} ({}) started by {}",
                g.pid,
                if g.alive { "running" } else { "gone" },
                g.instance_id
            );
        }
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use nip_le::agent::orphan::{start_time, write_mark, AgentMark};
    use nip_le::ledger::Op;
    use nip_le::record::{encode_record, RecordExt};

    use super::*;

    fn rows_of(dir: &std::path::Path) -> Vec<LockEntry> {
        let hour = Duration::from_secs(3600);
        rows(dir, std::fs::read_dir(dir).unwrap(), hour, hour)
    }

    #[test]
    fn beside_each_lock_its_holder_ledger_and_agent_process() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let pk = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
        let ext = RecordExt {
            epoch: 7,
            live: "1-0123456789abcdef",
        };
        let record = encode_record("w1", std::process::id(), SystemTime::now(), Some(ext));
        std::fs::write(nip_le::lockfile::lock_path(dir, &pk), record).unwrap();
        let at_ms = crate::unix_ms();
        let take = |id: &str| Op::Take {
            id: id.into(),
            epoch: 7,
            by: "w1".into(),
            at_ms,
            live: None,
            pub_ms: None,
        };
        std::fs::create_dir(dir.join(nip_le::ledger::WORK_DIR)).unwrap();
        let mut ledger = std::fs::File::create(ledger_path(dir, &pk)).unwrap();
        for op in [
            take("a"),
            take("b"),
            take("c"),
            Op::Done {
                id: "b".into(),
                epoch: 7,
                at_ms,
                pub_ms: None,
            },
            Op::GiveBack {
                id: "c".into(),
                epoch: 7,
                at_ms,
            },
        ] {
            ledger.write_all(&op.to_line()).unwrap();
        }
        let me = std::process::id();
        let mark = AgentMark {
            instance_id: "w1".into(),
            pid: me,
            start: start_time(me).unwrap_or(0),
            boot: None,
        };
        write_mark(dir, &pk, &mark).unwrap();
        let rows = rows_of(dir);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.holder.as_deref(), r.epoch), (Some("w1"), Some(7)));
        let l = r.ledger.as_ref().expect("the ledger is counted");
        assert_eq!((l.taken, l.done, l.given_back), (1, 1, 1));
        let a = r.agent.as_ref().expect("the agent mark is read");
        assert_eq!((a.instance_id.as_str(), a.pid, a.alive), ("w1", me, true));
    }

    #[test]
    fn a_hostile_ledger_is_reported_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let pk = AgentPubkey::parse(&"cd".repeat(32)).unwrap();
        std::fs::write(nip_le::lockfile::lock_path(dir, &pk), b"").unwrap();
        std::fs::create_dir(dir.join(nip_le::ledger::WORK_DIR)).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", ledger_path(dir, &pk)).unwrap();
        #[cfg(not(unix))]
        std::fs::create_dir(ledger_path(dir, &pk)).unwrap();
        let rows = rows_of(dir);
        assert!(rows[0].ledger.is_none(), "{:?}", rows[0].ledger);
        assert!(rows[0].ledger_error.is_some());
        assert!(rows[0].agent.is_none());
    }
}
