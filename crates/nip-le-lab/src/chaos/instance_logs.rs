//! Each instance's own log in a file of its own (cross-host runs), so a
//! duplicate that fails the run can show what its repliers' contenders
//! did with etcd around the reply: the lines a failing run prints.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Command;

/// What the instances log unless `NIP_LE_LOG` says otherwise: warnings, and
/// every call the etcd level makes for the work ledger.
pub const FILTER: &str = "warn,nip_le::global=debug";

/// The most lines an excerpt prints per replier.
const MAX_LINES: usize = 60;

/// A directory of instance logs, one file per instance id.
#[derive(Debug, Clone)]
pub struct InstanceLogs {
    dir: PathBuf,
}

impl InstanceLogs {
    /// Logs into `dir` (made if missing).
    pub fn new(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    /// Sends the stderr of the instance `id` that `cmd` starts to its file.
    pub fn attach(&self, cmd: &mut Command, id: &str) -> std::io::Result<()> {
        cmd.stderr(File::create(self.dir.join(format!("{id}.log")))?);
        if std::env::var_os("NIP_LE_LOG").is_none() {
            cmd.env("NIP_LE_LOG", FILTER);
        }
        Ok(())
    }

    /// The lines `id` logged from `from_ms` to `to_ms` (Unix ms), without
    /// their colours, at most 60 (the last ones).
    pub fn excerpt(&self, id: &str, from_ms: u64, to_ms: u64) -> Vec<String> {
        let Ok(f) = File::open(self.dir.join(format!("{id}.log"))) else {
            return Vec::new();
        };
        let (from, to) = (stamp(from_ms), stamp(to_ms));
        let mut lines: Vec<String> = BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .map(|l| strip_colours(&l))
            .filter(|l| {
                let at = l.get(..23).unwrap_or_default();
                from.as_str() <= at && at <= to.as_str()
            })
            .collect();
        let skip = lines.len().saturating_sub(MAX_LINES);
        lines.drain(..skip);
        lines
    }
}

/// Unix ms as the log's timestamps begin (`2026-12-06T23:32:21.064`).
fn stamp(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(String::new, |t| {
            t.format("%Y-%m-%dT%H:%M:%S%.3f").to_string()
        })
}

/// `line` without ANSI colour sequences.
fn strip_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_the_window_without_colours() {
        let dir = tempfile::tempdir().unwrap();
        let logs = InstanceLogs::new(dir.path().join("logs")).unwrap();
        let lines = [
            "\u{1b}[2m2026-12-06T23:32:20.999000Z\u{1b}[0m before",
            "\u{1b}[2m2026-12-06T23:32:21.064054Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m inside",
            "2026-12-06T23:32:22.500000Z after",
        ];
        std::fs::write(dir.path().join("logs/a.log"), lines.join("\n")).unwrap();
        // 2026-12-06T23:32:21.000Z and 23:32:22.000Z.
        let (from, to) = (1_796_599_941_000, 1_796_599_942_000);
        assert_eq!(stamp(from), "2026-12-06T23:32:21.000");
        assert_eq!(
            logs.excerpt("a", from, to),
            ["2026-12-06T23:32:21.064054Z  WARN inside"]
        );
        assert!(logs.excerpt("missing", from, to).is_empty());
    }
}
