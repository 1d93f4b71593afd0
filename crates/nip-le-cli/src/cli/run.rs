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
use nip_le::{
    AgentPubkey, Elector, InstanceId, LeaderFlag, LeadershipChange, QueuedEvent, TakeOutcome, Work,
};
use serde_json::Value;

use super::{EtcdArgs, TimingArgs};
use crate::lab::feed::FeedFollower;
use crate::lines::{Leadership, Line, MentionLine, ReplyLine, StatusLine, TurnOutcome};
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
    /// `--turn-ms`: a line to print as is.
    Report(Line),
    /// `--relay`: a control frame the relay delivered.
    Relay(String),
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
    config.etcd = a.etcd.config();
    config.validate()?;
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
                    // A predecessor's turn ends within a turn of its
                    // cancel, and a hung one is judged within the stale
                    // bound.
                    settle: Duration::from_millis(ms) * 2 + elector.config().stale,
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
    drop(tx);
    serve(elector, pubkey, a.relay.as_deref(), rx);
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

/// Stdin lines become commands. End of stdin is not a reason to exit.
fn read_stdin(tx: mpsc::Sender<Msg>) {
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(Msg::Line(line)).is_err() {
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
fn serve(elector: Elector, pubkey: AgentPubkey, relay: Option<&Path>, rx: mpsc::Receiver<Msg>) {
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
                // Release, then let the change thread drain: it ends with
                // ChangesClosed once the elector is gone.
                if let Some(e) = elector.take() {
                    e.shutdown();
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
            eprintln!("nip-le: unknown command {other:?} (claim, release, stand_down, resume, status, or a JSON control frame)");
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
        mentions_seen: seen,
        replies_sent: replied,
        at_ms: unix_ms(),
    }))
}

/// The mention feed of the first key.
struct Feed {
    mentions: PathBuf,
    replies: PathBuf,
    offset: u64,
    flag: LeaderFlag,
    leader_since: Arc<AtomicU64>,
    id: InstanceId,
}

impl Feed {
    /// Follows the feed from `offset`; for each new complete line with an
    /// `"id"`, replies (one append write) iff we lead at that moment. A line
    /// that carries its publication time (`"at_ms"`) is answered only if we
    /// led since before it was published: an instance that was stopped, and
    /// resumed as the new leader, does not answer a backlog its predecessor
    /// answered.
    fn follow(&self, tx: &mpsc::Sender<Msg>) {
        let mut feed = FeedFollower::from_offset(&self.mentions, self.offset);
        loop {
            std::thread::sleep(Duration::from_millis(5));
            for v in feed.poll() {
                let Ok(m) = serde_json::from_value::<MentionLine>(v) else {
                    continue;
                };
                let leading = self.flag.is_leader()
                    && m.at_ms
                        .is_none_or(|t| self.leader_since.load(Ordering::SeqCst) <= t);
                let mid = m.id;
                let error = if leading {
                    append_reply(&self.replies, &mid, &self.id)
                        .err()
                        .map(|e| e.to_string())
                } else {
                    None
                };
                let msg = Msg::Mention {
                    id: mid,
                    replied: leading && error.is_none(),
                    error,
                };
                if tx.send(msg).is_err() {
                    return;
                }
            }
        }
    }
}

fn append_reply(replies: &Path, mention: &Value, id: &InstanceId) -> std::io::Result<()> {
    let reply = ReplyLine {
        mention: mention.clone(),
        instance_id: id.as_str().to_owned(),
        at_ms: unix_ms(),
    };
    let line = format!(
        "{}\n",
        serde_json::to_string(&reply).expect("strings and numbers")
    );
    let mut f = OpenOptions::new().create(true).append(true).open(replies)?;
    // One write(2) of a short line on an O_APPEND file: lines from several
    // instances never interleave.
    f.write_all(line.as_bytes())
}

/// Sends a `turn` line; false once the main loop is gone.
fn report_turn(
    tx: &mpsc::Sender<Msg>,
    id: &Value,
    outcome: TurnOutcome,
    epoch: Option<u64>,
) -> bool {
    let line = Line::Turn {
        id: id.clone(),
        outcome,
        epoch,
        at_ms: unix_ms(),
    };
    tx.send(Msg::Report(line)).is_ok()
}

/// `--turn-ms`: the mention feed worked as an agent would, one turn at a
/// time, through the work ledger.
struct Turns {
    mentions: PathBuf,
    replies: PathBuf,
    turn: Duration,
    /// How long a mention the ledger did not owe us when we began to lead
    /// waits to be owed after all (see [`Turns::run`]).
    settle: Duration,
    work: Work,
    leader_since: Arc<AtomicU64>,
    id: InstanceId,
}

/// The text of a mention id (ids are strings in every feed we write).
fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Turns {
    /// Every instance queues every mention, from the feed's beginning (as a
    /// client fetches recent events when it connects). While leading: on
    /// becoming leader, drop from the queue what the ledger says is not
    /// owed; then take the first queued mention, work it for the turn, and
    /// reply, unless leadership was lost meanwhile.
    fn run(&self, tx: &mpsc::Sender<Msg>) {
        let mut feed = FeedFollower::from_offset(&self.mentions, 0);
        let mut queue: std::collections::VecDeque<(Value, QueuedEvent)> = Default::default();
        // The queue is filtered through `owed` once per leadership period:
        // `filtered` drops whenever we do not lead (the engine's flag, which
        // can be ahead of `leader_since`, set by the change thread).
        let mut filtered_since = u64::MAX;
        let mut filtered = false;
        // What `owed` left out when we began to lead: a mention done, or
        // one still in flight with the window we took over from (after a
        // claim its turn ends, and gives the mention back, a moment later).
        // Asked again until `settle` has passed, then dropped.
        let mut parked: Vec<(Value, QueuedEvent)> = Vec::new();
        let mut parked_until = std::time::Instant::now();
        loop {
            for v in feed.poll() {
                let Ok(m) = serde_json::from_value::<MentionLine>(v) else {
                    continue;
                };
                let e = QueuedEvent {
                    id: id_text(&m.id),
                    published_ms: m.at_ms,
                };
                let line = Line::Mention {
                    id: m.id.clone(),
                    replied: false,
                    error: None,
                    at_ms: unix_ms(),
                };
                if tx.send(Msg::Report(line)).is_err() {
                    return;
                }
                queue.push_back((m.id, e));
            }
            if !self.work.may_act() {
                filtered = false;
            }
            if !self.work.may_act() || (queue.is_empty() && parked.is_empty()) {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            let since = self.leader_since.load(Ordering::SeqCst);
            if !filtered || since != filtered_since {
                let events: Vec<QueuedEvent> = queue.iter().map(|(_, e)| e.clone()).collect();
                if let Ok(owed) = self.work.owed(&events) {
                    let (kept, left): (Vec<_>, Vec<_>) =
                        queue.drain(..).partition(|(_, e)| owed.contains(&e.id));
                    queue.extend(kept);
                    parked = left;
                    parked_until = std::time::Instant::now() + self.settle;
                    (filtered, filtered_since) = (true, since);
                }
                continue;
            }
            if !parked.is_empty() {
                if std::time::Instant::now() >= parked_until {
                    parked.clear();
                } else {
                    let events: Vec<QueuedEvent> = parked.iter().map(|(_, e)| e.clone()).collect();
                    if let Ok(owed) = self.work.owed(&events) {
                        let (back, left): (Vec<_>, Vec<_>) =
                            parked.drain(..).partition(|(_, e)| owed.contains(&e.id));
                        parked = left;
                        for m in back.into_iter().rev() {
                            queue.push_front(m);
                        }
                    }
                }
            }
            let Some((raw, e)) = queue.front().cloned() else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            let epoch = match self.work.take(&e.id) {
                Ok(TakeOutcome::Granted { epoch }) => epoch,
                // Ours already (a turn that did not end): work it.
                Ok(TakeOutcome::AlreadyTaken) => None,
                Ok(TakeOutcome::Done) => {
                    queue.pop_front();
                    continue;
                }
                Ok(TakeOutcome::NotLeader) | Err(_) => continue,
                // The disk refuses the take: ask again in a moment.
                Ok(TakeOutcome::Unavailable) => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if !report_turn(tx, &raw, TurnOutcome::Started, epoch) {
                return;
            }
            let outcome = self.turn(&raw, &e.id);
            if outcome == TurnOutcome::Replied {
                queue.pop_front();
            }
            if !report_turn(tx, &raw, outcome, epoch) {
                return;
            }
        }
    }

    /// One turn: the simulated agent works for `turn`, checking the fence
    /// every millisecond; then, still leading, the reply (one write) and at
    /// once `done`. A loss of leadership gives the mention back.
    fn turn(&self, raw: &Value, id: &str) -> TurnOutcome {
        let end = std::time::Instant::now() + self.turn;
        loop {
            if !self.work.may_act() {
                let _ = self.work.give_back(id);
                return TurnOutcome::Cancelled;
            }
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(1)));
        }
        if append_reply(&self.replies, raw, &self.id).is_err() {
            let _ = self.work.give_back(id);
            return TurnOutcome::Cancelled;
        }
        let _ = self.work.done(id);
        TurnOutcome::Replied
    }
}
