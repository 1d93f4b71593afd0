//! The JSON lines `nip-le run` prints on stdout, one per event. The writer
//! (`nip-le run`) and every reader (the cluster driver, the tests, demo,
//! bench and chaos) share this one type, so a field can never be renamed on
//! one side only. Field names are snake_case; the `event` field names the
//! variant.

use nip_le::{ChangeReason, ClaimOutcome, ControlResult, HolderStatus, LockState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One line of `nip-le run`'s output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Line {
    /// First line: who this instance is.
    Started {
        /// Its instance id.
        instance_id: String,
        /// Its pid.
        pid: u32,
        /// The first key (stdin commands and the mention feed apply to it).
        pubkey: String,
        /// Every key joined.
        #[serde(default)]
        pubkeys: Vec<String>,
        /// `extended` or `spec`.
        #[serde(default)]
        mode: Option<String>,
    },
    /// After the first look at each key, and on every change of its view.
    Leadership(Leadership),
    /// A mention from the feed, and whether this instance replied to it.
    Mention {
        /// The mention's `id`, as it appeared in the feed.
        id: Value,
        /// Whether a reply line was appended.
        replied: bool,
        /// Why the reply could not be written, if it could not.
        #[serde(default)]
        error: Option<String>,
        /// When, unix ms.
        at_ms: u64,
    },
    /// `--turn-ms`: a turn began (the take was granted) or ended.
    Turn {
        /// The mention's id.
        id: Value,
        /// `started`, then `replied` or `cancelled` (leadership was lost
        /// mid-turn: the mention is owed to the next leader).
        outcome: TurnOutcome,
        /// The fencing epoch the mention was taken at, when one applies.
        #[serde(default)]
        epoch: Option<u64>,
        /// When, unix ms.
        at_ms: u64,
    },
    /// Answer to the `claim` command.
    Claim {
        /// What the claim did.
        outcome: ClaimOutcome,
    },
    /// Answer to the `release` command.
    Release {
        /// Whether a record of ours was released.
        released: bool,
    },
    /// Answer to the `stand_down` command.
    StandDown,
    /// Answer to the `resume` command.
    Resume {
        /// Leadership after resuming.
        is_leader: bool,
    },
    /// Answer to the `status` command.
    Status(Box<StatusLine>),
    /// Answer to a control frame on stdin: the `control_result` to send.
    ControlResult {
        /// `null` when there is nothing to send (yet).
        result: Option<ControlResult>,
    },
    /// A command failed.
    Error {
        /// What went wrong.
        message: String,
    },
    /// `--agent-cmd`: the supervised agent started, exited by itself (it
    /// is restarted after the backoff), was stopped by us, or could not
    /// start.
    Agent {
        /// The agent key.
        pubkey: String,
        /// When, unix ms.
        at_ms: u64,
        /// What happened (`what`: `started`, `exited`, `stopped`,
        /// `start_failed`), with the pid.
        #[serde(flatten)]
        agent: nip_le::agent::AgentEvent,
    },
    /// Last line, after a signal released every lock.
    Stopped,
}

/// Where a turn is: begun, or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcome {
    /// The ledger granted the take: the simulated agent works from now.
    Started,
    /// The reply was appended and recorded as done.
    Replied,
    /// Leadership was lost (or fenced) mid-turn: no reply, given back.
    Cancelled,
}

/// A change of this instance's view of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leadership {
    /// The agent key.
    pub pubkey: String,
    /// Whether this instance leads it now.
    pub is_leader: bool,
    /// Why the view changed.
    pub reason: ChangeReason,
    /// The holder the lock file names, if any.
    #[serde(default)]
    pub leader_instance_id: Option<String>,
    /// The holder's fencing epoch, when its record carries one.
    #[serde(default)]
    pub epoch: Option<u64>,
    /// When the view changed, unix ms.
    pub at_ms: u64,
    /// The level held after the change (`none`, `host`, `global`); with
    /// `--etcd`, `is_leader` is true at `global`, or at `host` while
    /// falling back.
    #[serde(default)]
    pub level: nip_le::Level,
    /// With `--etcd`: the holder of the agent's etcd key, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_holder: Option<nip_le::GlobalHolder>,
}

impl From<&nip_le::LeadershipChange> for Leadership {
    fn from(c: &nip_le::LeadershipChange) -> Self {
        Self {
            pubkey: c.pubkey.to_string(),
            is_leader: c.is_leader,
            reason: c.reason,
            leader_instance_id: c.leader_instance_id.clone(),
            epoch: c.epoch,
            at_ms: c.at_ms,
            level: c.level,
            global_holder: c.global_holder.clone(),
        }
    }
}

/// The `status` command's answer, for the first key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusLine {
    /// This instance's instance id.
    pub instance_id: String,
    /// Its pid.
    pub pid: u32,
    /// The first key.
    pub pubkey: Option<String>,
    /// Whether this instance leads it.
    pub is_leader: Option<bool>,
    /// What the lock file held at the last look.
    pub lock_state: Option<LockState>,
    /// The holder the file names.
    pub holder: Option<StatusHolder>,
    /// Whether this instance stands down.
    pub standing_down: Option<bool>,
    /// Whether a claim of this instance is pending.
    pub claim_pending: Option<bool>,
    /// The last refresh error.
    pub last_error: Option<String>,
    /// With `--etcd`: the last error met talking to etcd (TLS, auth,
    /// permissions), if the last call failed.
    #[serde(default)]
    pub global_error: Option<String>,
    /// Mentions seen on the feed.
    pub mentions_seen: u64,
    /// Replies written.
    pub replies_sent: u64,
    /// When, unix ms.
    pub at_ms: u64,
}

/// The holder in a [`StatusLine`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusHolder {
    /// Its instance id.
    pub instance_id: String,
    /// Its pid.
    pub pid: u32,
    /// `claimed_at`, RFC 3339.
    pub claimed_at: Option<String>,
    /// Milliseconds since `claimed_at`.
    pub age_ms: Option<i64>,
    /// Its fencing epoch.
    pub epoch: Option<u64>,
    /// Whether it is this instance.
    pub is_us: bool,
}

impl From<HolderStatus> for StatusHolder {
    fn from(h: HolderStatus) -> Self {
        Self {
            instance_id: h.instance_id,
            pid: h.pid,
            claimed_at: h.claimed_at,
            age_ms: h.age_ms,
            epoch: h.epoch,
            is_us: h.is_us,
        }
    }
}

/// One line of the mention feed (`--mentions`): the simulated relay's
/// fan-out of events that mention the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MentionLine {
    /// The event id.
    pub id: Value,
    /// Its publication time, unix ms, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

/// One line of the replies file (`--replies`): an answer to a mention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyLine {
    /// The mention's id.
    pub mention: Value,
    /// Who answered.
    pub instance_id: String,
    /// When, unix ms.
    pub at_ms: u64,
}

impl ReplyLine {
    /// Every well-formed line of a replies file (a missing file has none).
    pub fn read_all(path: &std::path::Path) -> Vec<ReplyLine> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The mention id as text (ids are strings in every feed we write).
    pub fn mention_id(&self) -> String {
        match &self.mention {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
}

impl Line {
    /// The line as JSON text (no newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a line is strings, numbers and JSON values")
    }

    /// The `event` tag of this line.
    pub fn event(&self) -> &'static str {
        match self {
            Line::Started { .. } => "started",
            Line::Leadership(_) => "leadership",
            Line::Mention { .. } => "mention",
            Line::Turn { .. } => "turn",
            Line::Claim { .. } => "claim",
            Line::Release { .. } => "release",
            Line::StandDown => "stand_down",
            Line::Resume { .. } => "resume",
            Line::Status(_) => "status",
            Line::ControlResult { .. } => "control_result",
            Line::Error { .. } => "error",
            Line::Agent { .. } => "agent",
            Line::Stopped => "stopped",
        }
    }

    /// The leadership report, when this is one.
    pub fn leadership(&self) -> Option<&Leadership> {
        match self {
            Line::Leadership(l) => Some(l),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_lines_round_trip() {
        let l = Line::Agent {
            pubkey: "ab".repeat(32),
            at_ms: 7,
            agent: nip_le::agent::AgentEvent::Exited {
                pid: 42,
                code: None,
                signal: Some(9),
                busy: false,
            },
        };
        let text = l.to_json();
        assert!(
            text.starts_with(r#"{"event":"agent","#) && text.contains(r#""what":"exited""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), l);
    }

    #[test]
    fn lines_round_trip_with_the_event_tag_first() {
        let l = Line::Leadership(Leadership {
            pubkey: "ab".repeat(32),
            is_leader: true,
            reason: ChangeReason::HandedOver,
            leader_instance_id: Some("x".into()),
            epoch: Some(3),
            at_ms: 5,
            level: nip_le::Level::Global,
            global_holder: Some(nip_le::GlobalHolder {
                host_id: "h".into(),
                instance_id: "x".into(),
                revision: 7,
            }),
        });
        let json = l.to_json();
        assert!(
            json.starts_with(r#"{"event":"leadership","pubkey":"#),
            "{json}"
        );
        assert!(json.contains(r#""reason":"handed_over""#));
        assert_eq!(serde_json::from_str::<Line>(&json).unwrap(), l);
        assert_eq!(Line::StandDown.to_json(), r#"{"event":"stand_down"}"#);
        // The tag `event()` names is the one serde writes.
        for l in [Line::Stopped, Line::Release { released: true }, l] {
            let v: serde_json::Value = serde_json::from_str(&l.to_json()).unwrap();
            assert_eq!(v["event"], l.event());
        }
    }

    #[test]
    fn reads_lines_of_writers_that_omit_optional_fields() {
        // The independent Python writer of the interop tests prints fewer
        // fields.
        let l: Line = serde_json::from_str(
            r#"{"event":"leadership","pubkey":"k","is_leader":false,"reason":"lost","at_ms":1}"#,
        )
        .unwrap();
        assert_eq!(l.leadership().unwrap().leader_instance_id, None);
        let s: Line =
            serde_json::from_str(r#"{"event":"started","instance_id":"i","pid":1,"pubkey":"k"}"#)
                .unwrap();
        assert!(matches!(s, Line::Started { mode: None, .. }));
    }
}
