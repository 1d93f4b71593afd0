//! How a `nip-le run` window replies: the mention feed answered while it
//! leads, or (`--turn-ms`) worked as an agent would, one turn at a time,
//! through the work ledger.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use nip_le::{InstanceId, LeaderFlag, QueuedEvent, TakeOutcome, Work};
use serde_json::Value;

use super::msg::Msg;
use crate::drive::feed::FeedFollower;
use crate::lines::{Line, MentionLine, ReplyLine, TurnOutcome};
use crate::unix_ms;

/// The mention feed of the first key.
pub(super) struct Feed {
    pub(super) mentions: PathBuf,
    pub(super) replies: PathBuf,
    pub(super) offset: u64,
    pub(super) flag: LeaderFlag,
    pub(super) leader_since: Arc<AtomicU64>,
    pub(super) id: InstanceId,
}

impl Feed {
    /// Follows the feed from `offset`; for each new complete line with an
    /// `"id"`, replies (one append write) iff we lead at that moment. A line
    /// that carries its publication time (`"at_ms"`) is answered only if we
    /// led since before it was published: an instance that was stopped, and
    /// resumed as the new leader, does not answer a backlog its predecessor
    /// answered.
    pub(super) fn follow(&self, tx: &mpsc::Sender<Msg>) {
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
pub(super) struct Turns {
    pub(super) mentions: PathBuf,
    pub(super) replies: PathBuf,
    pub(super) turn: Duration,
    /// How long a mention the ledger did not owe us is asked about again
    /// (see [`Turns::run`]): the ledger's retention, past which it could
    /// not tell a done mention from a new one.
    pub(super) forget_after: Duration,
    pub(super) work: Work,
    pub(super) leader_since: Arc<AtomicU64>,
    pub(super) id: InstanceId,
}

/// How often mentions the ledger did not owe us are asked about again.
const RECHECK: Duration = Duration::from_millis(100);

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
    pub(super) fn run(&self, tx: &mpsc::Sender<Msg>) {
        let mut feed = FeedFollower::from_offset(&self.mentions, 0);
        let mut queue: std::collections::VecDeque<(Value, QueuedEvent)> = Default::default();
        // The queue is filtered through `owed` once per leadership period:
        // `filtered` drops whenever we do not lead (the engine's flag, which
        // can be ahead of `leader_since`, set by the change thread).
        let mut filtered_since = u64::MAX;
        let mut filtered = false;
        // What `owed` left out: a mention done, one still in flight with
        // the window we took over from (after a claim its turn ends, and
        // gives the mention back, a moment later), or one published before
        // we began to lead after a writer without a ledger. The last kind
        // becomes owed when we hold the lock at an epoch (the fail-safe's
        // leader once the disk takes writes again), and no change event
        // marks that: asked again every `RECHECK` until owed or forgotten.
        let mut parked: Vec<(Value, QueuedEvent, std::time::Instant)> = Vec::new();
        let mut rechecked = std::time::Instant::now();
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
                // A new period judges the whole queue, what an earlier one
                // parked included: the engine's first look is this call.
                let now = std::time::Instant::now();
                for (raw, e, _) in parked.drain(..).rev() {
                    queue.push_front((raw, e));
                }
                let events: Vec<QueuedEvent> = queue.iter().map(|(_, e)| e.clone()).collect();
                if let Ok(owed) = self.work.owed(&events) {
                    let (kept, left): (Vec<_>, Vec<_>) =
                        queue.drain(..).partition(|(_, e)| owed.contains(&e.id));
                    queue.extend(kept);
                    parked = left.into_iter().map(|(raw, e)| (raw, e, now)).collect();
                    rechecked = now;
                    (filtered, filtered_since) = (true, since);
                }
                continue;
            }
            if !parked.is_empty() && rechecked.elapsed() >= RECHECK {
                rechecked = std::time::Instant::now();
                parked.retain(|(_, _, at)| at.elapsed() < self.forget_after);
                let events: Vec<QueuedEvent> = parked.iter().map(|(_, e, _)| e.clone()).collect();
                if let Ok(owed) = self.work.owed(&events) {
                    let (back, left): (Vec<_>, Vec<_>) =
                        parked.drain(..).partition(|(_, e, _)| owed.contains(&e.id));
                    parked = left;
                    for (raw, e, _) in back.into_iter().rev() {
                        queue.push_front((raw, e));
                    }
                }
            }
            let Some((raw, e)) = queue.front().cloned() else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            let epoch = match self.work.take_event(&e) {
                Ok(TakeOutcome::Granted { epoch }) => epoch,
                // Ours already (a turn that did not end): work it.
                Ok(TakeOutcome::AlreadyTaken) => None,
                Ok(TakeOutcome::Done) => {
                    queue.pop_front();
                    continue;
                }
                // The disk refuses the take: ask again in a moment.
                Ok(TakeOutcome::Unavailable) => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                // Not ours to work now (and any outcome a later engine adds).
                Ok(_) | Err(_) => continue,
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
