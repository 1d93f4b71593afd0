//! `nip-le run`: one instance of one or more elections, reporting on stdout
//! as JSON lines ([`crate::lines::Line`]).
//!
//! Threads: stdin lines, signals, leadership changes and the mention feed
//! all feed one channel; the main thread alone writes stdout and owns the
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
use nip_le::{AgentPubkey, Elector, InstanceId};

use super::msg::Msg;
use super::replies::{Feed, Turns};
use super::{EtcdArgs, TimingArgs};
use crate::drive::feed::FeedFollower;
use crate::lines::{Leadership, Line, StatusLine, TurnOutcome};
use crate::unix_ms;

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
    /// Instance id [default: $BUZZ_INSTANCE_ELECTION_ID or a UUID v4].
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
    /// Simulate an agent turn of this many milliseconds per mention: read
    /// the feed from its beginning, queue every mention, and (while
    /// leading) work them one at a time through the work ledger; a loss of
    /// leadership cancels the turn in flight.
    #[arg(long, requires = "mentions")]
    turn_ms: Option<u64>,
    /// A file of NIP-AO control frames (JSON lines) standing in for the
    /// relay: followed from its end, each `claim_leadership` frame is
    /// handled as if the relay had delivered it, and the `claim` command
    /// appends the frame naming this instance, as Buzz's desktop sends it.
    /// Spec instances learn of a claim no other way.
    #[arg(long)]
    relay: Option<PathBuf>,
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    agent: super::agent::AgentArgs,
}

fn emit(line: &Line) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line.to_json());
    let _ = out.flush();
}

/// Runs the instance until SIGTERM/SIGINT.
pub fn run(a: RunArgs) -> Result<ExitCode, nip_le::Error> {
    // Validate everything before anything touches the filesystem.
    let keys = a
        .pubkey
        .iter()
        .map(|k| AgentPubkey::parse(k))
        .collect::<Result<Vec<_>, _>>()?;
    let pubkey = keys[0];
    let mut config = super::config_from(a.lock_dir, &a.timings, a.lock_wait_ms)?;
    config.etcd = a.etcd.config()?;
    config.validate()?;
    let agent_cmd = a.agent.command()?;
    let id = match a.instance_id {
        Some(s) => InstanceId::new(s)?,
        None => InstanceId::from_env()?,
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
    let leader_since = Arc::new(AtomicU64::new(u64::MAX));
    forward_changes(&elector, pubkey, Arc::clone(&leader_since), tx.clone());

    // The feed is followed from its end as of now, before the first
    // leadership report, so a mention appended after that report is seen.
    let feed_start = a
        .mentions
        .as_ref()
        .map(|m| std::fs::metadata(m).map(|m| m.len()).unwrap_or(0));
    emit(&Line::Started {
        instance_id: id.as_str().to_owned(),
        pid: std::process::id(),
        pubkey: pubkey.to_string(),
        pubkeys: keys.iter().map(|k| k.to_string()).collect(),
        mode: Some(elector.config().mode.as_str().to_owned()),
    });
    elector.join_all(&keys)?;
    read_stdin(tx.clone());
    if let Some(relay) = &a.relay {
        follow_relay(FeedFollower::from_end(relay), tx.clone());
    }
    if let (Some(m), Some(r)) = (a.mentions, a.replies) {
        let tx = tx.clone();
        match a.turn_ms {
            Some(ms) => {
                let turns = Turns {
                    mentions: m,
                    replies: r,
                    turn: Duration::from_millis(ms),
                    forget_after: elector.config().work_retention,
                    work: elector.work(&pubkey)?,
                    leader_since: Arc::clone(&leader_since),
                    id: id.clone(),
                };
                std::thread::spawn(move || turns.run(&tx));
            }
            None => {
                let feed = Feed {
                    mentions: m,
                    replies: r,
                    offset: feed_start.unwrap_or(0),
                    flag: elector.leader_flag(&pubkey)?,
                    leader_since: Arc::clone(&leader_since),
                    id: id.clone(),
                };
                std::thread::spawn(move || feed.follow(&tx));
            }
        }
    }
    let agent = agent_cmd
        .map(|c| super::agent::supervise(&elector, &pubkey, c, tx.clone()))
        .transpose()?;
    drop(tx);
    serve(elector, agent, pubkey, a.relay.as_deref(), rx);
    emit(&Line::Stopped);
    Ok(ExitCode::SUCCESS)
}

/// Forwards every change to the main thread, and tracks since when (unix
/// ms) this instance has led `first`; `u64::MAX` while it does not.
fn forward_changes(
    elector: &Elector,
    first: AgentPubkey,
    since: Arc<AtomicU64>,
    tx: mpsc::Sender<Msg>,
) {
    let mut changes = elector.subscribe();
    std::thread::spawn(move || {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            let c = match changes.blocking_recv() {
                Ok(c) => c,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => break,
            };
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

/// Stdin lines become commands. End of stdin is not a reason to exit;
/// `exit` stops as a signal does (Windows has no SIGTERM to send a
/// console-less process).
fn read_stdin(tx: mpsc::Sender<Msg>) {
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let msg = if line.trim() == "exit" {
                Msg::Signal
            } else {
                Msg::Line(line)
            };
            if tx.send(msg).is_err() {
                return;
            }
        }
    });
}

/// `--relay`: every frame appended to the relay file reaches every
/// instance, ours included, as the relay fans frames out.
fn follow_relay(mut relay: FeedFollower, tx: mpsc::Sender<Msg>) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(5));
        for v in relay.poll() {
            if tx.send(Msg::Relay(v.to_string())).is_err() {
                return;
            }
        }
    });
}

/// `--relay`: sends the claim as the desktop does, one appended line.
fn send_claim_frame(relay: &Path, id: &InstanceId) -> std::io::Result<()> {
    let frame = serde_json::json!({
        "type": nip_le::control::CLAIM_LEADERSHIP,
        "targetInstanceId": id.as_str(),
    });
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(relay)?
        .write_all(format!("{frame}\n").as_bytes())
}

/// The main loop: the one writer of stdout.
fn serve(
    elector: Elector,
    mut agent: Option<super::agent::Supervised>,
    pubkey: AgentPubkey,
    relay: Option<&Path>,
    rx: mpsc::Receiver<Msg>,
) {
    let (mut seen, mut replied) = (0u64, 0u64);
    let mut elector = Some(elector);
    for msg in rx {
        match msg {
            Msg::Change(c) => emit(&Line::Leadership(Leadership::from(&c))),
            Msg::Mention {
                id,
                replied: r,
                error,
            } => {
                seen += 1;
                replied += u64::from(r);
                emit(&Line::Mention {
                    id,
                    replied: r,
                    error,
                    at_ms: unix_ms(),
                });
            }
            Msg::Report(line) => {
                match &line {
                    Line::Mention { .. } => seen += 1,
                    Line::Turn {
                        outcome: TurnOutcome::Replied,
                        ..
                    } => replied += 1,
                    _ => {}
                }
                emit(&line);
            }
            Msg::Line(line) => {
                if let Some(e) = elector.as_ref() {
                    let line = line.trim();
                    let out = command(e, &pubkey, line, seen, replied);
                    // The frame goes out before the claim's answer is
                    // printed: whoever reads the answer may rely on the
                    // relay having it.
                    if let (Some(relay), "claim") = (relay, line) {
                        if let Err(err) = send_claim_frame(relay, e.instance_id()) {
                            emit(&Line::Error {
                                message: format!("relay {}: {err}", relay.display()),
                            });
                        }
                    }
                    if let Some(out) = out {
                        emit(&out);
                    }
                }
            }
            Msg::Relay(frame) => match elector
                .as_ref()
                .map(|e| e.handle_control_frame(&pubkey, &frame))
            {
                Some(Ok(Some(result))) => emit(&Line::ControlResult {
                    result: Some(result),
                }),
                Some(Err(err)) => emit(&Line::Error {
                    message: format!("relay frame: {err}"),
                }),
                _ => {}
            },
            Msg::Signal => {
                // Release: each lock moves once its agent has stopped (the
                // election waits for it), so the successor's finds the
                // instance lease free; then the supervisor ends, and the
                // change thread drains: it ends with ChangesClosed once the
                // elector is gone.
                if let Some(e) = elector.take() {
                    e.shutdown();
                }
                if let Some(a) = agent.take() {
                    a.stop();
                }
            }
            Msg::ChangesClosed => break,
        }
    }
}

/// One stdin command; `None` for an empty or unknown line.
fn command(e: &Elector, pk: &AgentPubkey, line: &str, seen: u64, replied: u64) -> Option<Line> {
    let reply = match line {
        "" => return None,
        "claim" => e.claim(pk).map(|outcome| Line::Claim { outcome }),
        "release" => e.release(pk).map(|released| Line::Release { released }),
        "stand_down" => e.stand_down(pk).map(|()| Line::StandDown),
        "resume" => e.resume(pk).map(|is_leader| Line::Resume { is_leader }),
        "status" => Ok(status_line(e, seen, replied)),
        frame if frame.starts_with('{') => e
            .handle_control_frame(pk, frame)
            .map(|result| Line::ControlResult { result }),
        other => {
            eprintln!("nip-le: unknown command {other:?} (claim, release, stand_down, resume, status, exit, or a JSON control frame)");
            return None;
        }
    };
    Some(reply.unwrap_or_else(|err| Line::Error {
        message: err.to_string(),
    }))
}

fn status_line(e: &Elector, seen: u64, replied: u64) -> Line {
    let s = e.status().into_iter().next();
    Line::Status(Box::new(StatusLine {
        instance_id: e.instance_id().as_str().to_owned(),
        pid: std::process::id(),
        pubkey: s.as_ref().map(|s| s.pubkey.to_string()),
        is_leader: s.as_ref().map(|s| s.is_leader),
        lock_state: s.as_ref().map(|s| s.lock_state),
        holder: s.as_ref().and_then(|s| s.holder.clone()).map(Into::into),
        standing_down: s.as_ref().map(|s| s.standing_down),
        claim_pending: s.as_ref().map(|s| s.claim_pending),
        last_error: s.as_ref().and_then(|s| s.last_error.clone()),
        global_error: s
            .as_ref()
            .and_then(|s| s.global.as_ref()?.last_error.clone()),
        mentions_seen: seen,
        replies_sent: replied,
        at_ms: unix_ms(),
    }))
}
