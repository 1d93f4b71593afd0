//! `nip-le run`: one instance of one election, reporting on stdout.
//!
//! Threads: stdin lines, signals, leadership changes and the mention feed all
//! feed one channel; the main thread alone writes stdout and owns the
//! elector, so on SIGTERM/SIGINT it can release, print every change that
//! release caused, then `{"event":"stopped"}`, in that order.

use std::fs::OpenOptions;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use clap::Args;
use nip_le::cluster::unix_ms;
use nip_le::elector::LeaderFlag;
use nip_le::feed::FeedFollower;
use nip_le::{AgentPubkey, Config, Elector, InstanceId, LeadershipChange};
use serde_json::{json, Value};

/// Options of `nip-le run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Agent public key, 64 hex characters. Repeat it to join several
    /// elections in one process; stdin commands and the mention feed apply
    /// to the first.
    #[arg(long, required = true)]
    pubkey: Vec<String>,
    /// Lock directory [default: $BUZZ_LEADER_LOCK_DIR or ~/.buzz/leader-locks].
    #[arg(long)]
    lock_dir: Option<PathBuf>,
    /// Election id [default: $BUZZ_INSTANCE_ELECTION_ID or a UUID v4].
    #[arg(long)]
    instance_id: Option<String>,
    #[command(flatten)]
    timings: TimingArgs,
    /// Longest wait for the exclusive file lock in milliseconds [default: 250].
    #[arg(long)]
    lock_wait_ms: Option<u64>,
    /// Follow this file of JSON lines with an "id" (the relay's fan-out).
    #[arg(long, requires = "replies")]
    mentions: Option<PathBuf>,
    /// Append one reply line per mention here, when leading.
    #[arg(long, requires = "mentions")]
    replies: Option<PathBuf>,
}

/// The NIP timings as flags, shared by `run` and `demo`.
#[derive(Args, Debug)]
pub struct TimingArgs {
    /// Refresh interval in milliseconds [default: 5000].
    #[arg(long)]
    pub refresh_ms: Option<u64>,
    /// Stale bound for claimed_at in milliseconds [default: 10000].
    #[arg(long)]
    pub stale_ms: Option<u64>,
    /// Stand-down timeout in milliseconds [default: 10000].
    #[arg(long)]
    pub stand_down_ms: Option<u64>,
    /// `extended` (presence locks, directory watch, handoff, epoch,
    /// self-fencing) or `spec` (exactly the NIP) [default: extended].
    #[arg(long)]
    pub mode: Option<nip_le::Mode>,
}

/// Builds the validated config from the flags (shared with other commands).
pub fn config_from(
    lock_dir: Option<PathBuf>,
    refresh_ms: Option<u64>,
    stale_ms: Option<u64>,
    stand_down_ms: Option<u64>,
    lock_wait_ms: Option<u64>,
) -> Result<Config, nip_le::Error> {
    let mut c = match lock_dir {
        Some(d) => Config::new(
            std::path::absolute(&d).map_err(|e| nip_le::Error::Io { path: d, source: e })?,
        ),
        None => Config::default_from_env()?,
    };
    let ms = Duration::from_millis;
    if let Some(v) = refresh_ms {
        c.refresh = ms(v);
        // Keep the default lock wait valid for short test refreshes.
        c.lock_wait = c.lock_wait.min(c.refresh / 2);
    }
    if let Some(v) = stale_ms {
        c.stale = ms(v);
    }
    if let Some(v) = stand_down_ms {
        c.stand_down = ms(v);
    }
    if let Some(v) = lock_wait_ms {
        c.lock_wait = ms(v);
    }
    c.validate()?;
    Ok(c)
}

enum Msg {
    Line(String),
    Signal,
    Change(LeadershipChange),
    ChangesClosed,
    Mention {
        id: Value,
        replied: bool,
        error: Option<String>,
    },
}

fn emit(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

pub fn run(a: RunArgs) -> Result<ExitCode, nip_le::Error> {
    // Validate everything before anything touches the filesystem.
    let keys = a
        .pubkey
        .iter()
        .map(|k| AgentPubkey::parse(k))
        .collect::<Result<Vec<_>, _>>()?;
    let pubkey = keys[0];
    let mut config = config_from(
        a.lock_dir,
        a.timings.refresh_ms,
        a.timings.stale_ms,
        a.timings.stand_down_ms,
        a.lock_wait_ms,
    )?;
    config.mode = a.timings.mode.unwrap_or_default();
    let id = match a.instance_id {
        Some(s) => InstanceId::new(s)?,
        None => InstanceId::from_env_or_random(),
    };

    let (tx, rx) = mpsc::channel::<Msg>();
    {
        // SIGTERM/SIGINT (SIGHUP too) on Unix, Ctrl-C/close on Windows.
        let tx = tx.clone();
        ctrlc::set_handler(move || {
            let _ = tx.send(Msg::Signal);
        })
        .map_err(|e| nip_le::Error::Io {
            path: "<signal handler>".into(),
            source: std::io::Error::other(e),
        })?;
    }

    let elector = Elector::start(config, id.clone())?;
    let mut changes = elector.subscribe();
    // Since when (unix ms) this instance has led the first key; MAX when not.
    let leader_since = Arc::new(AtomicU64::new(u64::MAX));
    {
        let tx = tx.clone();
        let (since, first) = (Arc::clone(&leader_since), keys[0]);
        std::thread::spawn(move || {
            while let Ok(c) = changes.blocking_recv().or_else(|e| match e {
                tokio::sync::broadcast::error::RecvError::Lagged(_) => changes.blocking_recv(),
                closed => Err(closed),
            }) {
                if c.pubkey == first {
                    if !c.is_leader {
                        since.store(u64::MAX, Ordering::SeqCst);
                    } else if since.load(Ordering::SeqCst) == u64::MAX {
                        since.store(c.at_ms, Ordering::SeqCst);
                    }
                }
                if tx.send(Msg::Change(c)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Msg::ChangesClosed);
        });
    }

    // The feed is followed from its end as of now, before the first
    // leadership report, so a mention appended after that report is seen.
    let feed_start = a
        .mentions
        .as_ref()
        .map(|m| std::fs::metadata(m).map(|m| m.len()).unwrap_or(0));
    emit(
        json!({"event":"started","instance_id":id.as_str(),"pid":std::process::id(),"pubkey":pubkey.as_str(),
               "pubkeys":keys.iter().map(|k| k.as_str()).collect::<Vec<_>>(),"mode":elector.config().mode.as_str()}),
    );
    for k in &keys {
        elector.join(k)?;
    }

    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(Msg::Line(line)).is_err() {
                    return;
                }
            }
            // End of stdin is not a reason to exit.
        });
    }

    let mut seen = 0u64;
    let mut replied = 0u64;
    if let (Some(m), Some(r)) = (a.mentions, a.replies) {
        let flag = elector.leader_flag(&pubkey)?;
        let tx = tx.clone();
        let since = Arc::clone(&leader_since);
        let id = id.clone();
        let offset = feed_start.unwrap_or(0);
        std::thread::spawn(move || follow_mentions(&m, &r, offset, &flag, &since, &id, &tx));
    }
    drop(tx);

    let mut elector = Some(elector);
    for msg in rx {
        match msg {
            Msg::Change(c) => emit(json!({
                "event":"leadership","pubkey":c.pubkey.as_str(),"is_leader":c.is_leader,
                "reason":c.reason.as_str(),"leader_instance_id":c.leader_instance_id,"epoch":c.epoch,"at_ms":c.at_ms,
            })),
            Msg::Mention {
                id,
                replied: r,
                error,
            } => {
                seen += 1;
                replied += r as u64;
                emit(
                    json!({"event":"mention","id":id,"replied":r,"error":error,"at_ms":unix_ms()}),
                );
            }
            Msg::Line(line) => {
                if let Some(e) = elector.as_ref() {
                    command(e, &pubkey, line.trim(), seen, replied);
                }
            }
            Msg::Signal => {
                // Release, then let the change thread drain: it ends with
                // ChangesClosed once the elector is gone.
                if let Some(e) = elector.take() {
                    e.shutdown();
                }
            }
            Msg::ChangesClosed => break,
        }
    }
    emit(json!({"event":"stopped"}));
    Ok(ExitCode::SUCCESS)
}

fn command(e: &Elector, pk: &AgentPubkey, line: &str, seen: u64, replied: u64) {
    let reply = match line {
        "" => return,
        "claim" => e.claim(pk).map(|o| json!({"event":"claim","outcome":o})),
        "release" => e
            .release(pk)
            .map(|r| json!({"event":"release","released":r})),
        "stand_down" => e.stand_down(pk).map(|()| json!({"event":"stand_down"})),
        "resume" => e
            .resume(pk)
            .map(|l| json!({"event":"resume","is_leader":l})),
        "status" => Ok(status_line(e, seen, replied)),
        frame if frame.starts_with('{') => e
            .handle_control_frame(pk, frame)
            .map(|r| json!({"event":"control_result","result":r})),
        other => {
            eprintln!("nip-le: unknown command {other:?} (claim, release, stand_down, resume, status, or a JSON control frame)");
            return;
        }
    };
    match reply {
        Ok(v) => emit(v),
        Err(err) => emit(json!({"event":"error","message":err.to_string()})),
    }
}

fn status_line(e: &Elector, seen: u64, replied: u64) -> Value {
    let s = e.status().into_iter().next();
    json!({
        "event":"status",
        "instance_id":e.instance_id().as_str(),
        "pid":std::process::id(),
        "pubkey":s.as_ref().map(|s| s.pubkey.as_str().to_owned()),
        "is_leader":s.as_ref().map(|s| s.is_leader),
        "lock_state":s.as_ref().map(|s| s.lock_state),
        "holder":s.as_ref().and_then(|s| s.holder.clone()),
        "standing_down":s.as_ref().map(|s| s.standing_down),
        "claim_pending":s.as_ref().map(|s| s.claim_pending),
        "last_error":s.as_ref().and_then(|s| s.last_error.clone()),
        "mentions_seen":seen,
        "replies_sent":replied,
        "at_ms":unix_ms(),
    })
}

/// Follows `mentions` from its current end; for each new complete line with
/// an `"id"`, replies (one append write) iff we lead at that moment. A line
/// that carries its publication time (`"at_ms"`) is answered only if we led
/// since before it was published: an instance that was stopped, and resumed
/// as the new leader, does not answer a backlog its predecessor answered.
fn follow_mentions(
    mentions: &Path,
    replies: &Path,
    offset: u64,
    flag: &LeaderFlag,
    leader_since: &AtomicU64,
    id: &InstanceId,
    tx: &mpsc::Sender<Msg>,
) {
    let mut feed = FeedFollower::from_offset(mentions, offset);
    loop {
        std::thread::sleep(Duration::from_millis(5));
        for v in feed.poll() {
            let Some(mid) = v.get("id").cloned() else {
                continue;
            };
            let published = v.get("at_ms").and_then(Value::as_u64);
            let leading = flag.is_leader()
                && published.is_none_or(|t| leader_since.load(Ordering::SeqCst) <= t);
            let error = if leading {
                append_reply(replies, &mid, id).err().map(|e| e.to_string())
            } else {
                None
            };
            if tx
                .send(Msg::Mention {
                    id: mid,
                    replied: leading && error.is_none(),
                    error,
                })
                .is_err()
            {
                return;
            }
        }
    }
}

fn append_reply(replies: &Path, mention: &Value, id: &InstanceId) -> std::io::Result<()> {
    let line = format!(
        "{}\n",
        json!({"mention":mention,"instance_id":id.as_str(),"at_ms":unix_ms()})
    );
    let mut f = OpenOptions::new().create(true).append(true).open(replies)?;
    // One write(2) of a short line on an O_APPEND file: lines from several
    // instances never interleave.
    f.write_all(line.as_bytes())
}
