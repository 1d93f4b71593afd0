//! Extension: the work ledger, so that each mention is answered exactly
//! once across leadership changes.
//!
//! Every window queues every event (the relay fans out to all); leadership
//! decides *who* dispatches, the ledger decides *what* is still owed. It is a
//! file beside the lock file, `<lock dir>/<pubkey>.work` (the harness only
//! ever opens `<pubkey>.lock`), of JSON lines appended by the current holder
//! alone, each stamped with the fencing epoch of the holder's record:
//!
//! ```text
//! {"op":"take","id":"<event id>","epoch":7,"by":"<instance id>","at_ms":…}
//! {"op":"done","id":"<event id>","epoch":7,"at_ms":…}
//! {"op":"give_back","id":"<event id>","epoch":7,"at_ms":…}
//! {"op":"held","epoch":7,"by":"<instance id>","at_ms":…}
//! {"op":"floor","epoch":7,"by":"<instance id>","before_ms":…,"at_ms":…}
//! ```
//!
//! A `held` line says that `by` keeps this ledger (written when a window
//! joins the key, at epoch 0, and when it first leads at an epoch):
//! a successor that finds a record without an epoch naming `by` (its agent
//! harness child's, see `elector::machine::same_id`) knows the ledger
//! covers it, not a writer that answered without one. A `floor` line says
//! that the holder `by` found such a writer before it: what was published
//! before `before_ms` and is not in the ledger may have been answered, so
//! no later holder owes it either.
//!
//! Rules ([`Index::verdict`]):
//! * an event is **done** once a `done` line names it;
//! * it is **taken** while a `take` at the holder's current epoch names it;
//! * anything else is **owed**: never taken, given back, or taken at an
//!   earlier epoch whose holder died, hung past the stale bound, stood down
//!   or handed over (every change of holder raises the epoch), and not done.
//!
//! So a new leader (by crash, hang, claim or handoff) dispatches what its
//! queue holds that the ledger does not show as done or taken now, and a
//! fenced or displaced leader can neither take nor complete: the check is
//! the leadership flag, an atomic load, before any I/O.
//!
//! One duplicate window remains: a reply sent, then the holder killed
//! before its `done` line. `done` is one `write(2)` of one line on a file
//! opened for appending, so the window is that single syscall.
//!
//! Bounded over any tenure: entries older than the retention window are
//! dropped when the ledger is loaded and every [`EXPIRE_EVERY`] while it is
//! kept; the file is rewritten (compacted) when it holds twice as many
//! lines as live entries or passes [`COMPACT_AT_BYTES`], and a rewrite keeps
//! at most [`SNAPSHOT_BUDGET`] bytes: past it, the oldest answered events
//! are forgotten first, as past the retention window. So the holder never
//! reaches [`MAX_LEDGER_BYTES`], past which a file is not read. A rewrite
//! and the appends of every process never overlap ([`hold`]): no line is
//! lost under a rename.
//! A ledger past that cap all the same (not written by us, or grown by
//! fragments of failed writes) is rewritten by the leader from its newest
//! lines ([`Ledger::recover`]) rather than left unread for good.
//! A ledger that cannot be read (missing is fine: it is empty) never
//! silences the agent: the holder dispatches without it, as the NIP's
//! fail-safe would, and says so in a warning. It is then owed what was
//! published since it became leader (as after a predecessor that kept no
//! ledger), not the whole backlog again.

use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod hold;
mod index;
mod op;
mod rules;
mod storage;
pub use hold::AppendHold;
pub use index::{Index, State, StateCounts, Verdict};
pub use op::Op;
pub use rules::{grants_without_ledger, owed};
#[cfg(feature = "sim")]
pub(crate) use storage::after_first_newline;
pub use storage::{FileLedger, LedgerError, LedgerStorage};

use crate::error::{Error, Result};
use crate::pubkey::AgentPubkey;

/// How long a done or taken event is remembered by default.
pub const DEFAULT_RETENTION: Duration = crate::config::DEFAULT_WORK_RETENTION;
/// A ledger file larger than this is not read (the holder dispatches
/// without it).
pub const MAX_LEDGER_BYTES: u64 = 16 * 1024 * 1024;
/// A ledger this long is rewritten, however many of its lines are live
/// (once it grew [`REWRITE_GROWTH`] since the last rewrite).
pub const COMPACT_AT_BYTES: u64 = MAX_LEDGER_BYTES / 4 * 3;
/// The most a rewrite keeps: room for the appends until the next one.
pub const SNAPSHOT_BUDGET: usize = (MAX_LEDGER_BYTES / 2) as usize;
/// A ledger this long takes no new take ([`crate::TakeOutcome::LedgerFull`])
/// until a rewrite or the retention shrinks it: what is left below
/// [`MAX_LEDGER_BYTES`] is room for the settles of the takes in flight
/// (at most 1,024 per window, each a line).
pub const FULL_AT_BYTES: u64 = MAX_LEDGER_BYTES / 8 * 7;
/// How much a ledger past [`COMPACT_AT_BYTES`] must have grown since its
/// last rewrite before it is rewritten again: a rewrite that could not
/// shrink it (everything in it still needed) is not tried at every append.
pub const REWRITE_GROWTH: u64 = 1024 * 1024;
/// How far behind now a rewrite may mark answered events settled (see
/// [`Ledger::compact`]): an event the relay delivers later than this after
/// it was published, or whose sender's clock runs this far behind, may be
/// below the mark already.
pub const SETTLE_LAG: Duration = Duration::from_secs(600);

/// The sizes a ledger keeps to ([`Ledger::with_limits`]; the constants
/// above by default, smaller in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// [`COMPACT_AT_BYTES`].
    pub compact_at: u64,
    /// [`SNAPSHOT_BUDGET`].
    pub budget: usize,
    /// [`FULL_AT_BYTES`].
    pub full_at: u64,
    /// [`REWRITE_GROWTH`].
    pub growth: u64,
    /// [`SETTLE_LAG`].
    pub settle_lag: Duration,
}

impl Limits {
    /// Limits in the same proportions as the defaults around a rewrite
    /// budget of `budget` bytes (at least 1 KiB).
    pub fn scaled(budget: usize) -> Self {
        let budget = budget.max(1024);
        let b = budget as u64;
        Self {
            compact_at: b / 2 * 3,
            budget,
            full_at: b / 4 * 7,
            growth: (b / 8).max(1),
            settle_lag: SETTLE_LAG,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            compact_at: COMPACT_AT_BYTES,
            budget: SNAPSHOT_BUDGET,
            full_at: FULL_AT_BYTES,
            growth: REWRITE_GROWTH,
            settle_lag: SETTLE_LAG,
        }
    }
}

/// What lets a rewrite mark answered events settled instead of keeping
/// each (see [`Ledger::compact`]): nothing published before `cap` (unix
/// ms) is owed but what the ledger shows, by the word of the holder `by`
/// at `epoch`, who signs the mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettleCap<'a> {
    /// Below this, the mark may go.
    pub cap: u64,
    /// The holder's instance id.
    pub by: &'a str,
    /// The holder's epoch.
    pub epoch: u64,
}
/// How often a kept ledger drops what is past the retention window.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(60);
/// Longest event id accepted (a Nostr event id is 64 hex characters).
pub const MAX_EVENT_ID_LEN: usize = 256;

/// The subdirectory of the lock directory the ledgers live in: out of the
/// directory every window watches, so that a take or a `done` wakes no
/// window but through its own calls (each append in the lock directory
/// itself woke every window's directory watch on the portable backend:
/// 64 windows joining 8 agents started in about 1.7 times the time).
pub const WORK_DIR: &str = "work";

/// `<dir>/work/<pubkey>.work`.
pub fn ledger_path(dir: &Path, pubkey: &AgentPubkey) -> PathBuf {
    dir.join(WORK_DIR).join(format!("{}.work", pubkey.as_str()))
}

/// Checks an event id before it becomes part of a ledger line.
pub fn validate_event_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_EVENT_ID_LEN || id.chars().any(char::is_control) {
        return Err(Error::EventId(format!(
            "event ids are 1 to {MAX_EVENT_ID_LEN} bytes without control characters"
        )));
    }
    Ok(())
}

/// What ends a fragment a failed write may have left (see
/// [`Ledger::append_now`]): JSON cannot continue with `!`.
const TORN_END: &[u8] = b"!\n";

/// One agent's ledger, as its holder uses it.
#[derive(Debug)]
pub struct Ledger {
    storage: Box<dyn LedgerStorage>,
    /// The state as loaded and as appended since.
    pub index: Index,
    /// How many bytes of the storage `index` has applied (whole lines).
    read: u64,
    retention: Duration,
    /// Lines applied here that the storage did not take yet (ENOSPC, EIO,
    /// a read-only directory): written, in order, before anything else.
    pending: Vec<u8>,
    /// A write failed and may have left a fragment without its newline:
    /// the next write ends it first, so no line is glued onto it.
    torn: bool,
    /// When entries past the retention window were last dropped, unix ms.
    expired_at: u64,
    /// We hold the append hold exclusively (see [`Ledger::take_held`]).
    held_writes: bool,
    /// Why the last durable write is not durable (refused, or written and
    /// not synced), until a later one is: what the status shows.
    degraded: Option<String>,
    /// The sizes kept to.
    limits: Limits,
    /// How long the last rewrite left the file.
    rewritten: u64,
}

impl Ledger {
    /// Loads the ledger file at `path` (a missing file is an empty ledger).
    pub fn load(
        path: PathBuf,
        now_ms: u64,
        retention: Duration,
    ) -> std::result::Result<Self, LedgerError> {
        Self::open(Box::new(FileLedger::new(path)), now_ms, retention)
    }

    /// The same ledger, kept to `limits`.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Loads the ledger kept in `storage`.
    pub fn open(
        mut storage: Box<dyn LedgerStorage>,
        now_ms: u64,
        retention: Duration,
    ) -> std::result::Result<Self, LedgerError> {
        let bytes = storage.read()?;
        let mut index = Index::default();
        let read = index.extend(&bytes) as u64;
        index.expire(now_ms, retention);
        let limits = storage.limits();
        Ok(Self {
            index,
            storage,
            read,
            retention,
            pending: Vec::new(),
            torn: false,
            expired_at: now_ms,
            held_writes: false,
            degraded: None,
            limits,
            rewritten: 0,
        })
    }

    /// Rewrites a ledger too large to read ([`LedgerError::Oversized`])
    /// from its newest lines and opens it: left as it is, every holder
    /// would dispatch without it for good. What the older lines said is
    /// forgotten, as past the retention window: an event answered or taken
    /// there is owed again to an app that still queues it (a duplicate,
    /// never a silence). Under the append hold; for a holder to call.
    pub fn recover(
        mut storage: Box<dyn LedgerStorage>,
        now_ms: u64,
        retention: Duration,
    ) -> std::result::Result<Self, LedgerError> {
        let failed = |e: Error| LedgerError::Unreadable(e.to_string());
        let hold = storage.hold_appends().map_err(failed)?;
        let tail = storage.read_tail(SNAPSHOT_BUDGET as u64)?;
        let mut index = Index::default();
        index.extend(&tail);
        index.expire(now_ms, retention);
        index.forget_oldest_to(SNAPSHOT_BUDGET);
        let body = index.snapshot();
        storage.replace(&body).map_err(failed)?;
        drop(hold);
        index.compacted();
        Ok(Self {
            index,
            storage,
            read: body.len() as u64,
            retention,
            pending: Vec::new(),
            torn: false,
            expired_at: now_ms,
            held_writes: false,
            degraded: None,
            limits: Limits::default(),
            rewritten: 0,
        })
    }

    /// Applies what others appended since we read (a former holder's
    /// `done` or `give_back`, which may land after a successor loaded the
    /// ledger); reads it whole again if it was rewritten meanwhile. Our own
    /// appends are read back too: applying a line twice changes nothing.
    pub fn refresh(&mut self, now_ms: u64) -> std::result::Result<(), LedgerError> {
        // Ours first: the file then holds everything this index applied.
        let _ = self.flush();
        self.read_new(now_ms)
    }

    /// [`Ledger::refresh`] without writing ours first.
    fn read_new(&mut self, now_ms: u64) -> std::result::Result<(), LedgerError> {
        match self.storage.read_from(self.read) {
            Ok(bytes) => {
                self.read += self.index.extend(&bytes) as u64;
                Ok(())
            }
            Err(LedgerError::Rewritten) => {
                let bytes = self.storage.read()?;
                let mut index = Index::default();
                self.read = index.extend(&bytes) as u64;
                index.expire(now_ms, self.retention);
                // What is still waiting for the storage stays applied (and
                // is counted once it is read back from the file).
                index.extend_uncounted(&self.pending);
                self.index = index;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Applies one line and appends it (a `done`, a give-back, a `held`
    /// line; takes go through [`Ledger::append_now`]). A line the storage
    /// refuses (ENOSPC, EIO) is still applied here and kept to be written,
    /// in order, with the next append or [`Ledger::flush`]; the error says
    /// that it is not on disk yet.
    pub fn append(&mut self, op: &Op) -> Result<()> {
        self.index.apply(op);
        let durable = self.durable(op);
        self.pending.extend(op.to_line());
        self.write_pending(durable)
    }

    /// Whether appending `op` waits for the disk (`fdatasync`). A `done`
    /// or give-back does: lost to a power cut, its event would be answered
    /// again or never. A take does not: a power cut ends every taker, and
    /// a dead taker's take is owed again whether or not its line survived
    /// (the simulator with power losses: 0 of 300 seeds fail with takes
    /// unsynced, 59 with dones unsynced). A `held` line does too: lost, a
    /// successor takes its window's harness child for a writer without a
    /// ledger and owes only what is published after it (the simulator
    /// with power losses: a power cut took the line of a window that had
    /// just joined, its child held the lock, and a mention given back
    /// before was never answered; the teeth's `held_not_synced`). So does
    /// a `floor` line: lost, a later holder
    /// owes again what a writer without a ledger may have answered.
    /// Refused lines that go out with it are synced.
    fn durable(&self, op: &Op) -> bool {
        (matches!(op, Op::Done { .. } | Op::GiveBack { .. }) && !mutated!(DoneNotSynced))
            || (matches!(op, Op::Held { .. } | Op::Floor { .. }) && !mutated!(HeldNotSynced))
            || (!self.pending.is_empty() && !mutated!(HeldFlushUnsynced))
    }

    /// Appends one line and applies it only once the storage took it (with
    /// the lines it refused before, first): a take must be in the file
    /// before its turn starts, or a successor would grant it again. A
    /// refused line is neither applied nor kept.
    pub fn append_now(&mut self, op: &Op) -> Result<()> {
        let durable = self.durable(op);
        let written = self.write_out(&op.to_line(), durable);
        if matches!(written, Ok(()) | Err(Error::NotDurable { .. })) {
            self.index.apply(op);
        }
        written
    }

    /// A take decided on what every process appended, and appended, under
    /// the append hold held exclusively: two windows that lead at once
    /// (the NIP's fail-safe, a holder that has not seen its successor yet)
    /// never both find an event owed and both take it. `decide` gets the
    /// index read up to the file's end and returns the lines to append, in
    /// one write; none: nothing appended. Lines the storage refuses are
    /// neither applied nor kept (see [`Ledger::append_now`]).
    pub fn take_held(
        &mut self,
        now_ms: u64,
        decide: &mut dyn FnMut(&Index) -> Vec<Op>,
    ) -> Result<Vec<Op>> {
        // Ours before the hold: our own append would wait for it.
        let _ = self.flush();
        let hold = self.storage.hold_appends()?;
        self.read_new(now_ms)
            .map_err(|e| Error::io("work ledger", std::io::Error::other(e.to_string())))?;
        let ops = decide(&self.index);
        if ops.is_empty() {
            return Ok(ops);
        }
        let bytes: Vec<u8> = ops.iter().flat_map(Op::to_line).collect();
        let durable = ops.iter().any(|op| self.durable(op));
        self.held_writes = true;
        let written = self.write_out(&bytes, durable);
        self.held_writes = false;
        drop(hold);
        match written {
            // In the file, where every process reads it: a take is granted
            // (its own line needs no sync: a power cut ends its taker), and
            // the lines that went with it unsynced are what the status
            // says ([`Ledger::degraded`]).
            Ok(()) | Err(Error::NotDurable { .. }) => {
                if let Err(e) = written {
                    tracing::warn!("{e}");
                }
            }
            Err(e) => return Err(e),
        }
        for op in &ops {
            self.index.apply(op);
        }
        Ok(ops)
    }

    /// How long entries are kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Writes the lines the storage refused before, if it takes them now.
    pub fn flush(&mut self) -> Result<()> {
        self.write_pending(true)
    }

    fn write_pending(&mut self, durable: bool) -> Result<()> {
        self.write_out(&[], durable)
    }

    /// One append of the refused lines, then `extra`: once it succeeds,
    /// nothing is pending and the file ends with a whole line.
    fn write_out(&mut self, extra: &[u8], durable: bool) -> Result<()> {
        if self.pending.is_empty() && extra.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(self.pending.len() + extra.len() + 1);
        if self.torn {
            // A fragment a failed write left is ended by a character no
            // line ends with: one skipped line, never glued onto ours, and
            // never completed into the line it began (a take reported
            // `Unavailable` must not land after all). A blank or stray
            // line is skipped.
            bytes.extend(TORN_END);
        }
        bytes.extend(&self.pending);
        bytes.extend(extra);
        let appended = if self.held_writes {
            self.storage.append_held(&bytes, durable)
        } else {
            self.storage.append(&bytes, durable)
        };
        match appended {
            Ok(()) => {
                self.pending.clear();
                self.torn = false;
                if durable {
                    self.degraded = None;
                }
                Ok(())
            }
            // Written whole: every process reads the lines, so they are
            // neither pending nor torn; only their durability is in doubt
            // (a sync that failed once may never report the lost pages
            // again), which the caller and the status say.
            Err(Error::NotDurable { why }) => {
                self.pending.clear();
                self.torn = false;
                self.degraded = Some(why.clone());
                Err(Error::NotDurable { why })
            }
            Err(e) => {
                self.torn = true;
                self.degraded = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Why a line of ours is not durable yet (refused by the disk, or
    /// written and not synced), until a later synced write succeeds.
    pub fn degraded(&self) -> Option<&str> {
        self.degraded.as_deref()
    }

    /// Takes over the lines an earlier ledger of the same storage could not
    /// write yet: they are applied here and written first, with ours.
    pub fn carry(&mut self, older: Ledger) {
        if older.pending.is_empty() {
            return;
        }
        self.index.extend_uncounted(&older.pending);
        let mine = std::mem::replace(&mut self.pending, older.pending);
        self.pending.extend(mine);
        self.torn |= older.torn;
    }

    /// Whether lines applied here are still waiting for the storage.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether the ledger should be rewritten: twice as many lines as live
    /// entries, or [`COMPACT_AT_BYTES`] long and grown by
    /// [`REWRITE_GROWTH`] since the last rewrite (one that could not shrink
    /// it is not tried again at every append).
    pub fn wants_compaction(&self) -> bool {
        let grown = self.read >= self.rewritten.saturating_add(self.limits.growth);
        self.index.wants_compaction() || (self.read >= self.limits.compact_at && grown)
    }

    /// Whether the ledger is too long to take a new take
    /// ([`FULL_AT_BYTES`]): what it holds is still needed (takes in
    /// flight, answers no mark may settle yet) and a rewrite cannot
    /// shrink it. Settles are still written.
    pub fn is_full(&self) -> bool {
        self.read >= self.limits.full_at
    }

    /// Drops what is past the retention window, at most every
    /// [`EXPIRE_EVERY`] (it walks every entry): a holder that keeps the
    /// ledger for days forgets as a fresh load would.
    pub fn expire_if_due(&mut self, now_ms: u64) {
        let every = u64::try_from(EXPIRE_EVERY.as_millis()).unwrap_or(u64::MAX);
        if now_ms.saturating_sub(self.expired_at) >= every || now_ms < self.expired_at {
            self.index.expire(now_ms, self.retention);
            self.expired_at = now_ms;
        }
    }

    /// Rewrites the ledger with only the live entries: none past the
    /// retention window, and past [`SNAPSHOT_BUDGET`] no answered event
    /// published before a settled mark (its `floor` line), which goes no
    /// higher than `settle`'s cap and [`SETTLE_LAG`] before now. Without
    /// `settle` (the holder does not know what is owed) nothing answered
    /// goes: the ledger stays long, and once [`Ledger::is_full`] takes are
    /// refused, never an answer forgotten. Under the append hold, from the
    /// last read to the rename: a line another process appends meanwhile
    /// waits, then goes into the new file.
    pub fn compact(&mut self, now_ms: u64, settle: Option<SettleCap>) -> Result<()> {
        // Ours before the hold: our own append would wait for it.
        let _ = self.flush();
        let _hold = self.storage.hold_appends()?;
        self.read_new(now_ms)
            .map_err(|e| Error::io("work ledger", std::io::Error::other(e.to_string())))?;
        self.index.expire(now_ms, self.retention);
        self.expired_at = now_ms;
        let lag = u64::try_from(self.limits.settle_lag.as_millis()).unwrap_or(u64::MAX);
        let budget = self.limits.budget;
        if let Some(s) = settle.filter(|_| !mutated!(ForgetAnswered)) {
            let cap = s.cap.min(now_ms.saturating_sub(lag));
            if let Some(mark) = self.index.settle_to(budget, cap, (s.by, s.epoch, now_ms)) {
                tracing::info!(
                    mark,
                    "the work ledger marks what was published before the mark settled"
                );
            }
        } else if mutated!(ForgetAnswered) {
            self.index.forget_oldest_to(budget);
        }
        let body = self.index.snapshot();
        if body.len() > budget {
            tracing::warn!(
                bytes = body.len(),
                "the work ledger cannot shrink to its budget yet: nothing in it may go"
            );
        }
        self.storage.replace(&body)?;
        self.index.compacted();
        self.read = body.len() as u64;
        self.rewritten = self.read;
        // The snapshot holds every line applied here.
        self.pending.clear();
        self.torn = false;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
