//! The public vocabulary of the elector: what changed and why, what a claim
//! did, and a status snapshot. These same types cross IPC in the plugin
//! (camelCase JSON; TypeScript types from ts-rs behind the `ts` feature), so
//! there is one set of names from the engine to the webview.

use serde::{Deserialize, Serialize};

use crate::ledger::StateCounts;
use crate::pubkey::AgentPubkey;

/// Why this instance's view of a key's leadership changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "ChangeReason.ts"))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChangeReason {
    /// We took a free lock (absent, empty/released, or malformed).
    Acquired,
    /// We took over the record of a dead, stale or hung holder.
    Failover,
    /// The user's claim (or a `claim_leadership` frame naming us) completed:
    /// send the `control_result` if the claim came from the relay.
    Claimed,
    /// We lead only because the lock file cannot be read as a record and we
    /// could not write it (the NIP's fail-safe rule).
    FailSafe,
    /// First view after joining: another instance holds a live record.
    Observer,
    /// Another instance holds the lock now.
    Lost,
    /// We stood down for another instance's claim. Hard-steal: cancel the
    /// in-flight turn now.
    StoodDown,
    /// We released the lock (explicitly, on leave or on shutdown).
    Released,
    /// Extension: the previous leader handed the lock straight to us
    /// (graceful exit, or its stand-down for a claim that named us).
    HandedOver,
    /// Extension: we hold the lock but have gone longer than the stale
    /// bound (our monotonic clock) without a successful write, so an
    /// observer may already have judged us hung and taken over: we act on
    /// nothing until a write of ours succeeds again. Cancel the in-flight
    /// turn now.
    Fenced,
    /// Extension: a write of ours succeeded after we had fenced ourselves
    /// (or confirmed a record handed to us): we act again.
    Unfenced,
}

impl ChangeReason {
    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeReason::Acquired => "acquired",
            ChangeReason::Failover => "failover",
            ChangeReason::Claimed => "claimed",
            ChangeReason::FailSafe => "fail_safe",
            ChangeReason::Observer => "observer",
            ChangeReason::Lost => "lost",
            ChangeReason::StoodDown => "stood_down",
            ChangeReason::Released => "released",
            ChangeReason::HandedOver => "handed_over",
            ChangeReason::Fenced => "fenced",
            ChangeReason::Unfenced => "unfenced",
        }
    }

    /// Whether the window must abort its in-flight agent turn (NIP-LE
    /// hard-steal, via NIP-AO `cancel_turn`): every way of ceasing to act
    /// as leader, so that a turn never finishes after another window may
    /// have begun it again. A change carries this only when we did act
    /// before it.
    pub fn must_cancel_turn(self) -> bool {
        matches!(
            self,
            ChangeReason::StoodDown | ChangeReason::Fenced | ChangeReason::Released
        ) || (self == ChangeReason::Lost && !mutated!(Lost))
    }
}

/// One change of this instance's view of one key: the payload of the
/// plugin's `leader-election://changed` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "ts",
    derive(ts_rs::TS),
    ts(export_to = "LeadershipChange.ts")
)]
#[serde(rename_all = "camelCase")]
pub struct LeadershipChange {
    /// The agent key (64 lower-case hex).
    #[cfg_attr(feature = "ts", ts(type = "string"))]
    pub pubkey: AgentPubkey,
    /// Whether we are the prompter now.
    pub is_leader: bool,
    /// The holder named by the lock file, when it names one.
    pub leader_instance_id: Option<String>,
    /// Why.
    pub reason: ChangeReason,
    /// True when this window must abort its in-flight agent turn now
    /// (hard-steal: NIP-AO `cancel_turn`): we acted as leader until this
    /// change and the reason ends this window's leadership. Carried so that
    /// no reader has to know the rule.
    pub must_cancel_turn: bool,
    /// Extension: the holder's fencing epoch, when its record carries one.
    /// It grows with every change of holder: tag work started as leader with
    /// it and check it before acting on the work's result.
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub epoch: Option<u64>,
    /// Wall-clock time of the change, unix milliseconds.
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub at_ms: u64,
    /// Which level of leadership this window holds after the change.
    pub level: Level,
    /// Cross-host (etcd): the global holder as last seen, when etcd is
    /// configured and a holder is known.
    pub global_holder: Option<GlobalHolder>,
}

/// Which level of leadership a window holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "Level.ts"))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Level {
    /// An observer.
    #[default]
    None,
    /// Leads its host's file election (the NIP's lock). Without etcd this
    /// is the whole of leadership; with etcd the window acts on it only
    /// when etcd cannot be reached and the configuration says to fall back.
    Host,
    /// Leads its host and holds the agent's etcd lease: the one window
    /// that acts for the agent across every host.
    Global,
}

impl Level {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Host => "host",
            Level::Global => "global",
        }
    }
}

/// Cross-host: who holds an agent's etcd key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "GlobalHolder.ts"))]
#[serde(rename_all = "camelCase")]
pub struct GlobalHolder {
    /// The holder's host id.
    pub host_id: String,
    /// The holder's instance id.
    pub instance_id: String,
    /// The etcd revision the key was last written at: the cross-host
    /// fencing epoch (it grows with every change of holder).
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub revision: u64,
}

/// Cross-host: this window's view of the etcd level for one agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "GlobalStatus.ts"))]
#[serde(rename_all = "camelCase")]
pub struct GlobalStatus {
    /// Our host id.
    pub host_id: String,
    /// The holder of the agent's etcd key, when one is known.
    pub holder: Option<GlobalHolder>,
    /// Whether we act without the lease because etcd cannot be reached
    /// (the "fall back to host-local leadership" policy).
    pub fallback: bool,
    /// The last error met talking to etcd, if the last call failed.
    pub last_error: Option<String>,
}

/// What the user's claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "ClaimOutcome.ts"))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// We already held the lock.
    AlreadyLeader,
    /// We hold the lock now.
    Claimed,
    /// The holder has been asked to stand down; a [`ChangeReason::Claimed`]
    /// change follows when the lock is ours (or the request expires after
    /// the stand-down timeout).
    Pending,
}

/// What the lock file held at the last look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "LockState.ts"))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LockState {
    /// A record (see [`ElectionStatus::holder`]).
    Record,
    /// No file (or no look yet).
    Absent,
    /// Zero bytes: released, or caught mid-rewrite.
    Empty,
    /// Not a record we can read.
    Malformed,
    /// Larger than any record; never read further.
    Oversized,
    /// The file could not be opened or read (permissions, a symlink, a
    /// directory at the path, an unusable lock directory).
    Unreadable,
}

impl LockState {
    /// The snake_case name, for tables and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            LockState::Record => "record",
            LockState::Absent => "absent",
            LockState::Empty => "empty",
            LockState::Malformed => "malformed",
            LockState::Oversized => "oversized",
            LockState::Unreadable => "unreadable",
        }
    }
}

/// The holder named by a lock record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "HolderStatus.ts"))]
#[serde(rename_all = "camelCase")]
pub struct HolderStatus {
    /// The holder's instance id.
    pub instance_id: String,
    /// The holder's pid.
    pub pid: u32,
    /// `claimed_at` as RFC 3339, when it parsed.
    pub claimed_at: Option<String>,
    /// Milliseconds since `claimed_at` when the status was read (negative
    /// when in the future).
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub age_ms: Option<i64>,
    /// Extension: the record's fencing epoch, when it carries one.
    #[cfg_attr(feature = "ts", ts(type = "number | null"))]
    pub epoch: Option<u64>,
    /// Extension: the host the record was written on, when it says.
    pub host: Option<String>,
    /// Whether the holder is this instance.
    pub is_us: bool,
}

/// A snapshot of one key's election, for UIs and `status` commands. Reading
/// it never touches a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "ElectionStatus.ts"))]
#[serde(rename_all = "camelCase")]
pub struct ElectionStatus {
    /// The agent key.
    #[cfg_attr(feature = "ts", ts(type = "string"))]
    pub pubkey: AgentPubkey,
    /// The cached answer, exactly what `is_leader` says.
    pub is_leader: bool,
    /// What the file held at the last look.
    pub lock_state: LockState,
    /// The holder, when the file names one.
    pub holder: Option<HolderStatus>,
    /// Whether we are standing down (acquire suppressed).
    pub standing_down: bool,
    /// Whether a claim of ours is waiting for the holder to stand down.
    pub claim_pending: bool,
    /// The last error met while refreshing, if the last refresh failed.
    pub last_error: Option<String>,
    /// Which level of leadership we hold (as `is_leader` says it now).
    pub level: Level,
    /// Cross-host (etcd): the global view, when etcd is configured.
    pub global: Option<GlobalStatus>,
    /// Extension: the events the work ledger remembers in each state, while
    /// this window keeps the ledger (it leads, in extended mode); `null`
    /// otherwise.
    pub work: Option<StateCounts>,
    /// Extension: why a line this window wrote to the work ledger (a
    /// `done`, a give-back, a line written with a take) is not durable yet:
    /// the disk refused it (kept, and written as soon as it takes one) or
    /// did not sync it; `null` once a later line is synced.
    pub work_degraded: Option<String>,
}

/// What a take granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "TakeOutcome.ts"))]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TakeOutcome {
    /// Dispatch it: the turn is ours. `epoch` is the fencing epoch it was
    /// taken at (`null` when no ledger applies: spec mode, a fail-safe
    /// leader, or a ledger that cannot be read).
    Granted {
        /// The holder's epoch at the take.
        #[cfg_attr(feature = "ts", ts(type = "number | null"))]
        epoch: Option<u64>,
    },
    /// Replied to already: drop it from the queue.
    Done,
    /// Taken already at this epoch (a second take of the same event).
    AlreadyTaken,
    /// This window does not lead (or has fenced itself): do not dispatch.
    NotLeader,
    /// The work ledger cannot record the take now (the disk refuses writes:
    /// full, failing, read-only): do not dispatch; keep the event queued and
    /// ask again in a moment. A take that is not on disk could be granted
    /// again by a successor, or by this window after a crash.
    Unavailable,
    /// This window holds as many takes of this agent as it may without
    /// settling them (1,024; a page of the plugin 256): do not dispatch;
    /// settle (`done`, `give_back`) the turns in flight first. A flood of
    /// takes never settled cannot grow the ledger past its bound.
    TooManyOpen,
    /// The work ledger is as long as it may grow and nothing in it may go
    /// yet (takes in flight, answers it cannot mark settled: the app has
    /// not asked `owed` with its queue, or the oldest unanswered event it
    /// queues holds the mark back): do not dispatch; ask again later.
    /// Nothing answered is forgotten to make room.
    LedgerFull,
}

impl TakeOutcome {
    /// Whether the caller may dispatch the event.
    pub fn granted(&self) -> bool {
        matches!(self, TakeOutcome::Granted { .. })
    }
}

/// A queued event: what the app passes to `owed`, one per mention.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "QueuedEvent.ts"))]
#[serde(rename_all = "camelCase")]
pub struct QueuedEvent {
    /// The event id.
    pub id: String,
    /// When it was published (the event's `created_at`), unix ms, if
    /// known. Used only after a predecessor that kept no ledger.
    #[serde(default)]
    #[cfg_attr(feature = "ts", ts(type = "number | null", optional))]
    pub published_ms: Option<u64>,
}
