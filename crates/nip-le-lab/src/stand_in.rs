//! `nip-le-lab stand-in-agent`: stands in for upstream's agent harness
//! (`buzz-acp`) in the supervised-agent tests. Like it, it takes an
//! exclusive, non-blocking `flock` on its instance lease,
//! `<lease dir>/<pubkey>__<sha256(relay url)>.lock` (directory 0700, file
//! 0600), for its whole life, and refuses to start while another process
//! holds it. While it runs it answers every mention published after it
//! started: one reply line each, naming its pid and the instance id it was
//! given. Optionally it starts a worker that stays in its process group and
//! session (as a harness's tool processes do), and, like a harness shutting
//! down, frees its lease only a while after SIGTERM.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use nip_le::AgentPubkey;
use sha2::{Digest, Sha256};

use nip_le_cli::drive::feed::FeedFollower;
use nip_le_cli::unix_ms;

/// Options of `nip-le-lab stand-in-agent`.
#[derive(Args, Debug)]
pub struct StandInArgs {
    /// The agent's public key.
    #[arg(long)]
    pubkey: String,
    /// The relay it serves (part of the lease's name).
    #[arg(long)]
    relay_url: String,
    /// Where the leases live (upstream:
    /// `<data_local_dir>/buzz/buzz-acp-runtime-leases`).
    #[arg(long)]
    lease_dir: PathBuf,
    /// The mention feed (JSON lines with an "id"), followed from its end.
    #[arg(long)]
    mentions: PathBuf,
    /// Where replies are appended.
    #[arg(long)]
    replies: PathBuf,
    /// Start a worker process that stays in our session (a tool process
    /// of the harness): a stop must reach it too.
    #[arg(long)]
    worker: bool,
    /// After SIGTERM, keep the lease for a random time up to this many
    /// milliseconds before exiting (a harness that shuts down).
    #[arg(long, default_value_t = 0)]
    lease_release_ms: u64,
    /// The exit code when the lease is held by another process.
    #[arg(long, default_value_t = 1)]
    busy_exit_code: u8,
    /// Also answer, at start, every mention of the feed that no reply
    /// names yet (a harness that catches up on its agent's thread), not
    /// only those published while it runs.
    #[arg(long)]
    backlog: bool,
    /// Append a JSON line here when the lease is taken and when it is
    /// freed (`{"agent","pid","what":"leased"|"released","at_ms"}`), for
    /// measuring the gap between one harness and the next.
    #[arg(long)]
    events: Option<PathBuf>,
}

/// Appends one lease event (best effort: a measurement, not the agent's job).
fn lease_event(events: Option<&Path>, pubkey: &AgentPubkey, what: &str) {
    let Some(path) = events else { return };
    let line = serde_json::json!({
        "agent": pubkey.as_str(),
        "pid": std::process::id(),
        "what": what,
        "at_ms": unix_ms(),
    });
    let _ = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
}

/// Options of `nip-le-lab stand-in-worker`.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The lease directory of the stand-in that started it (in its
    /// command line, so a test can find what it left).
    #[arg(long)]
    of: Option<PathBuf>,
}

/// A worker of the stand-in: does nothing until it is signalled.
pub fn worker(_: WorkerArgs) -> ExitCode {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The lease file of `pubkey` on `relay` (the URL trimmed of blanks and a
/// trailing slash, then hashed).
pub fn lease_path(dir: &Path, pubkey: &AgentPubkey, relay: &str) -> PathBuf {
    let url = relay.trim().trim_end_matches('/');
    let hash = Sha256::digest(url.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{pubkey}__{hex}.lock"))
}

/// The mentions of `pubkey` that `replies` answers already.
fn replied(replies: &Path, pubkey: &AgentPubkey) -> std::collections::HashSet<String> {
    let text = std::fs::read_to_string(replies).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v.get("agent")
                .and_then(|a| a.as_str())
                .is_none_or(|a| a == pubkey.as_str())
        })
        .filter_map(|v| v.get("mention")?.as_str().map(str::to_owned))
        .collect()
}

/// Runs until SIGTERM/SIGINT; exit `--busy-exit-code` when the lease is held.
pub fn stand_in(a: StandInArgs) -> Result<ExitCode, nip_le::Error> {
    let pubkey = AgentPubkey::parse(&a.pubkey)?;
    let io = |p: &Path| {
        let p = p.to_owned();
        move |e| nip_le::Error::Io { path: p, source: e }
    };
    std::fs::create_dir_all(&a.lease_dir).map_err(io(&a.lease_dir))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&a.lease_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io(&a.lease_dir))?;
    }
    let path = lease_path(&a.lease_dir, &pubkey, &a.relay_url);
    let mut open = OpenOptions::new();
    open.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    let lease = open.open(&path).map_err(io(&path))?;
    match fs4::FileExt::try_lock(&lease) {
        Ok(()) => {}
        Err(fs4::TryLockError::WouldBlock) => {
            eprintln!(
                "another buzz-acp process is already active for agent {pubkey} on {}",
                a.relay_url
            );
            return Ok(ExitCode::from(a.busy_exit_code));
        }
        Err(fs4::TryLockError::Error(e)) => return Err(io(&path)(e)),
    }
    lease_event(a.events.as_deref(), &pubkey, "leased");
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).map_err(|e| {
            nip_le::Error::Io {
                path: "<signal handler>".into(),
                source: std::io::Error::other(e),
            }
        })?;
    }
    let instance_id = std::env::var(nip_le::ELECTION_ID_ENV).unwrap_or_default();
    let mut worker = if a.worker {
        let exe = std::env::current_exe().map_err(io(Path::new("<current exe>")))?;
        let child = std::process::Command::new(exe)
            .arg("stand-in-worker")
            .arg("--of")
            .arg(&a.lease_dir)
            .stdin(std::process::Stdio::null())
            .spawn()
            .map_err(io(Path::new("<worker>")))?;
        Some(child)
    } else {
        None
    };
    let (mut feed, mut answered) = if a.backlog {
        (
            FeedFollower::from_offset(&a.mentions, 0),
            replied(&a.replies, &pubkey),
        )
    } else {
        (FeedFollower::from_end(&a.mentions), Default::default())
    };
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
        for v in feed.poll() {
            let Some(id) = v.get("id") else { continue };
            // A feed of several agents: ours only.
            if v.get("agent")
                .and_then(|a| a.as_str())
                .is_some_and(|a| a != pubkey.as_str())
            {
                continue;
            }
            let Some(key) = id.as_str().map(str::to_owned) else {
                continue;
            };
            if !answered.insert(key) {
                continue;
            }
            let reply = serde_json::json!({
                "mention": id,
                "agent": pubkey.as_str(),
                "instance_id": instance_id,
                "agent_pid": std::process::id(),
                "at_ms": unix_ms(),
            });
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&a.replies)
                .and_then(|mut f| f.write_all(format!("{reply}\n").as_bytes()))
                .map_err(io(&a.replies))?;
        }
    }
    if a.lease_release_ms > 0 {
        // Shutting down, lease still held.
        let n = uuid::Uuid::new_v4().as_u128() as u64 % (a.lease_release_ms + 1);
        std::thread::sleep(Duration::from_millis(n));
    }
    lease_event(a.events.as_deref(), &pubkey, "released");
    drop(lease);
    // The worker is left to whoever stops our session (as a harness that
    // exits leaves its tool processes to its supervisor); reap it if it
    // is gone already.
    if let Some(w) = worker.as_mut() {
        let _ = w.try_wait();
    }
    Ok(ExitCode::SUCCESS)
}
