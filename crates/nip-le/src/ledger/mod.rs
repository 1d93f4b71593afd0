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
//! {"op":"take","id":"<event id>","epoch":7,"by":"<election id>","at_ms":…}
//! {"op":"done","id":"<event id>","epoch":7,"at_ms":…}
//! {"op":"give_back","id":"<event id>","epoch":7,"at_ms":…}
//! {"op":"held","epoch":7,"by":"<election id>","at_ms":…}
//! ```
//!
//! A `held` line says that the holder `by` at `epoch` keeps this ledger:
//! a successor that finds a record without an epoch naming `by` (its agent
//! harness child's, see `elector::machine::same_id`) knows the ledger
//! covers it, not a writer that answered without one.
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
//! Bounded: entries older than the retention window are dropped when the
//! ledger is loaded, the file is rewritten (compacted) when it has grown to
//! twice the live entries, and a file over [`MAX_LEDGER_BYTES`] is not read.
//! A ledger that cannot be read (missing is fine: it is empty) never
//! silences the agent: the holder dispatches without it, as the NIP's
//! fail-safe would, and says so in a warning. It is then owed what was
//! published since it became leader (as after a predecessor that kept no
//! ledger), not the whole backlog again.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lockfile::{open_options, open_regular_file, Create};
use crate::pubkey::AgentPubkey;

/// How long a done or taken event is remembered by default.
pub const DEFAULT_RETENTION: Duration = crate::config::DEFAULT_WORK_RETENTION;
/// A ledger file larger than this is not read (the holder dispatches
/// without it).
pub const MAX_LEDGER_BYTES: u64 = 16 * 1024 * 1024;
/// Longest event id accepted (a Nostr event id is 64 hex characters).
pub const MAX_EVENT_ID_LEN: usize = 256;

/// `<dir>/<pubkey>.work`.
pub fn ledger_path(dir: &Path, pubkey: &AgentPubkey) -> PathBuf {
    dir.join(format!("{}.work", pubkey.as_str()))
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

/// One ledger line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// The holder at `epoch` dispatched the event.
    Take {
        /// The event id.
        id: String,
        /// The holder's fencing epoch.
        epoch: u64,
        /// The holder's election id (informational).
        #[serde(default)]
        by: String,
        /// When, unix ms.
        at_ms: u64,
    },
    /// The reply was sent.
    Done {
        /// The event id.
        id: String,
        /// The holder's fencing epoch.
        epoch: u64,
        /// When, unix ms.
        at_ms: u64,
    },
    /// Extension: the holder `by` at `epoch` keeps this ledger (written
    /// when it first leads at an epoch, and for the heir of a handoff).
    Held {
        /// The holder's fencing epoch.
        epoch: u64,
        /// The holder's election id.
        by: String,
        /// When, unix ms.
        at_ms: u64,
    },
    /// The turn was cancelled: the event is owed again.
    GiveBack {
        /// The event id.
        id: String,
        /// The holder's fencing epoch.
        epoch: u64,
        /// When, unix ms.
        at_ms: u64,
    },
}

impl Op {
    fn id(&self) -> &str {
        match self {
            Op::Take { id, .. } | Op::Done { id, .. } | Op::GiveBack { id, .. } => id,
            Op::Held { by, .. } => by,
        }
    }
    fn at_ms(&self) -> u64 {
        match self {
            Op::Take { at_ms, .. }
            | Op::Done { at_ms, .. }
            | Op::GiveBack { at_ms, .. }
            | Op::Held { at_ms, .. } => *at_ms,
        }
    }
    /// The line written for it.
    pub fn to_line(&self) -> Vec<u8> {
        let mut l = serde_json::to_vec(self).expect("strings and integers always serialise");
        l.push(b'\n');
        l
    }
}

/// What the ledger knows of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Taken by the holder at this epoch.
    Taken(u64),
    /// Replied to.
    Done,
    /// Given back (owed again).
    GivenBack,
}

/// What the ledger says of an event for the holder at an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody works on it now and it is not done: dispatch it.
    Owed,
    /// Taken at this very epoch (by us).
    TakenNow,
    /// Replied to already.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    state: State,
    at_ms: u64,
}

/// The ledger's state: the last word on each event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    entries: HashMap<String, Entry>,
    /// Lines read or appended since the file was last written whole.
    lines: usize,
    /// Highest epoch any line names.
    max_epoch: u64,
    /// The holders that keep this ledger: the highest epoch of their
    /// `held` lines, and when.
    keepers: HashMap<String, (u64, u64)>,
}

impl Index {
    /// Parses a ledger file's bytes, dropping entries older than
    /// `retention` before `now_ms`. Lines that are not ledger lines (a torn
    /// last line, garbage) are skipped, never fatal.
    pub fn parse(bytes: &[u8], now_ms: u64, retention: Duration) -> Self {
        let mut ix = Self::default();
        for line in bytes.split(|&b| b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if let Ok(op) = serde_json::from_slice::<Op>(line) {
                ix.apply(&op);
            }
        }
        ix.expire(now_ms, retention);
        ix
    }

    /// Applies one line. Later lines win, except that a `take` never
    /// overrides a `take` at a higher epoch (a stale holder's late line), a
    /// `done` is final, and a `give_back` only undoes a `take` of its own
    /// epoch.
    pub fn apply(&mut self, op: &Op) {
        self.lines += 1;
        let (id, at_ms) = (op.id(), op.at_ms());
        if id.len() > MAX_EVENT_ID_LEN {
            return;
        }
        let epoch = match op {
            Op::Take { epoch, .. }
            | Op::Done { epoch, .. }
            | Op::GiveBack { epoch, .. }
            | Op::Held { epoch, .. } => *epoch,
        };
        self.max_epoch = self.max_epoch.max(epoch);
        if let Op::Held { by, .. } = op {
            if by.len() <= MAX_EVENT_ID_LEN {
                let e = self.keepers.entry(by.clone()).or_insert((epoch, at_ms));
                *e = (*e).max((epoch, at_ms));
            }
            return;
        }
        let cur = self.entries.get(id).map(|e| e.state);
        let next = match (op, cur) {
            (_, Some(State::Done)) => None,
            (Op::Done { .. }, _) => Some(State::Done),
            (Op::Take { .. }, Some(State::Taken(e))) if e > epoch => None,
            (Op::Take { .. }, _) => Some(State::Taken(epoch)),
            (Op::GiveBack { .. }, Some(State::Taken(e))) if e == epoch => Some(State::GivenBack),
            (Op::GiveBack { .. } | Op::Held { .. }, _) => None,
        };
        if let Some(state) = next {
            self.entries.insert(id.to_owned(), Entry { state, at_ms });
        }
    }

    /// Drops entries last touched more than `retention` before `now_ms`.
    pub fn expire(&mut self, now_ms: u64, retention: Duration) {
        let horizon =
            now_ms.saturating_sub(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX));
        self.entries.retain(|_, e| e.at_ms >= horizon);
        self.keepers.retain(|_, (_, at_ms)| *at_ms >= horizon);
    }

    /// Whether the holder `by` keeps this ledger (a `held` line names it).
    pub fn kept_by(&self, by: &str) -> bool {
        self.keepers.contains_key(by)
    }

    /// Whether a `held` line names `by` at `epoch` or later.
    pub fn kept_at(&self, by: &str, epoch: u64) -> bool {
        self.keepers.get(by).is_some_and(|(e, _)| *e >= epoch)
    }

    /// The verdict on `id` for the holder at `epoch`.
    pub fn verdict(&self, id: &str, epoch: u64) -> Verdict {
        match self.entries.get(id).map(|e| e.state) {
            Some(State::Done) => Verdict::Done,
            Some(State::Taken(e)) if e == epoch => Verdict::TakenNow,
            _ => Verdict::Owed,
        }
    }

    /// The events taken at `epoch` and not done or given back, sorted.
    pub fn taken_at(&self, epoch: u64) -> Vec<String> {
        let mut ids: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.state == State::Taken(epoch))
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// The state of `id`, if the ledger knows it.
    pub fn state(&self, id: &str) -> Option<State> {
        self.entries.get(id).map(|e| e.state)
    }

    /// Highest epoch any line named.
    pub fn max_epoch(&self) -> u64 {
        self.max_epoch
    }

    /// Events remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no event is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the file holds at least twice as many lines as live
    /// entries (and enough to be worth rewriting).
    pub fn wants_compaction(&self) -> bool {
        self.lines > 1024 && self.lines > 2 * self.entries.len()
    }

    /// The lines of a compacted file: one per live entry.
    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut ids: Vec<&String> = self.entries.keys().collect();
        ids.sort();
        for id in ids {
            let e = self.entries[id];
            let op = match e.state {
                State::Taken(epoch) => Op::Take {
                    id: id.clone(),
                    epoch,
                    by: String::new(),
                    at_ms: e.at_ms,
                },
                State::Done => Op::Done {
                    id: id.clone(),
                    epoch: 0,
                    at_ms: e.at_ms,
                },
                // A given-back event is owed: nothing to remember.
                State::GivenBack => continue,
            };
            out.extend(op.to_line());
        }
        let mut keepers: Vec<(&String, &(u64, u64))> = self.keepers.iter().collect();
        keepers.sort();
        for (by, &(epoch, at_ms)) in keepers {
            let op = Op::Held {
                epoch,
                by: by.clone(),
                at_ms,
            };
            out.extend(op.to_line());
        }
        out
    }
}

/// Of a queue of `(event id, published unix ms)`, in order, the events the
/// holder at `epoch` owes: those `index` does not show as done or taken at
/// `epoch` (every event, without a ledger); and, when `published_since` is
/// set (the predecessor kept no ledger we can read: spec mode, the harness,
/// another host, or ours is unreadable), only those published since then
/// (or of unknown time): older ones it may have answered.
pub fn owed<'a>(
    queue: impl IntoIterator<Item = (&'a str, Option<u64>)>,
    index: Option<&Index>,
    epoch: u64,
    published_since: Option<u64>,
) -> Vec<String> {
    queue
        .into_iter()
        .filter(|(_, p)| match (published_since, p) {
            (Some(since), Some(p)) => *p >= since,
            _ => true,
        })
        .filter(|(id, _)| index.is_none_or(|ix| ix.verdict(id, epoch) == Verdict::Owed))
        .map(|(id, _)| id.to_owned())
        .collect()
}

/// Why a ledger could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// Larger than [`MAX_LEDGER_BYTES`]; not read.
    #[error("the work ledger is larger than {MAX_LEDGER_BYTES} bytes")]
    Oversized,
    /// An I/O error, or something other than a regular file at the path.
    #[error("the work ledger cannot be read: {0}")]
    Unreadable(String),
}

/// Where a ledger's bytes live. [`FileLedger`] is the file beside the
/// lock file; the simulator plugs in its own, with faults.
pub trait LedgerStorage: Send + std::fmt::Debug {
    /// The whole ledger (a missing one is empty), capped at
    /// [`MAX_LEDGER_BYTES`].
    fn read(&mut self) -> std::result::Result<Vec<u8>, LedgerError>;
    /// Appends one line (one write on a descriptor opened for appending).
    fn append(&mut self, line: &[u8]) -> Result<()>;
    /// Replaces the whole ledger with `body` (compaction).
    fn replace(&mut self, body: &[u8]) -> Result<()>;
}

/// The ledger file `<lock dir>/<pubkey>.work`.
#[derive(Debug)]
pub struct FileLedger {
    path: PathBuf,
    append: Option<File>,
}

impl FileLedger {
    /// The ledger file at `path` (opened lazily).
    pub fn new(path: PathBuf) -> Self {
        Self { path, append: None }
    }
}

impl LedgerStorage for FileLedger {
    fn read(&mut self) -> std::result::Result<Vec<u8>, LedgerError> {
        match open_regular_file(&self.path, Create::No) {
            Ok(f) => read_capped(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(LedgerError::Unreadable(e.to_string())),
        }
    }

    fn append(&mut self, line: &[u8]) -> Result<()> {
        if self.append.is_none() {
            let mut o = open_options(Create::IfMissing);
            o.append(true);
            let f = o.open(&self.path).map_err(|e| Error::io(&self.path, e))?;
            if !f
                .metadata()
                .map_err(|e| Error::io(&self.path, e))?
                .is_file()
            {
                return Err(Error::io(
                    &self.path,
                    std::io::Error::other("not a regular file"),
                ));
            }
            self.append = Some(f);
        }
        let f = self.append.as_mut().expect("opened above");
        f.write_all(line).map_err(|e| Error::io(&self.path, e))
    }

    /// A new file renamed over the old one; appends continue on the new one.
    fn replace(&mut self, body: &[u8]) -> Result<()> {
        let tmp = self
            .path
            .with_extension(format!("work.{}", uuid::Uuid::new_v4().simple()));
        let written = open_regular_file(&tmp, Create::New)
            .and_then(|mut f| f.write_all(body))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io(&self.path, e));
        }
        self.append = None;
        Ok(())
    }
}

/// One agent's ledger, as its holder uses it.
#[derive(Debug)]
pub struct Ledger {
    storage: Box<dyn LedgerStorage>,
    /// The state as loaded and as appended since.
    pub index: Index,
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

    /// Loads the ledger kept in `storage`.
    pub fn open(
        mut storage: Box<dyn LedgerStorage>,
        now_ms: u64,
        retention: Duration,
    ) -> std::result::Result<Self, LedgerError> {
        let bytes = storage.read()?;
        Ok(Self {
            index: Index::parse(&bytes, now_ms, retention),
            storage,
        })
    }

    /// Appends one line and applies it.
    pub fn append(&mut self, op: &Op) -> Result<()> {
        self.storage.append(&op.to_line())?;
        self.index.apply(op);
        Ok(())
    }

    /// Rewrites the ledger with only the live entries.
    pub fn compact(&mut self) -> Result<()> {
        let body = self.index.snapshot();
        self.storage.replace(&body)?;
        self.index.lines = self.index.entries.len() + self.index.keepers.len();
        Ok(())
    }
}

fn read_capped(f: File) -> std::result::Result<Vec<u8>, LedgerError> {
    use std::io::Read;
    let len = f
        .metadata()
        .map_err(|e| LedgerError::Unreadable(e.to_string()))?
        .len();
    if len > MAX_LEDGER_BYTES {
        return Err(LedgerError::Oversized);
    }
    let mut buf = Vec::with_capacity(len as usize);
    f.take(MAX_LEDGER_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| LedgerError::Unreadable(e.to_string()))?;
    if buf.len() as u64 > MAX_LEDGER_BYTES {
        return Err(LedgerError::Oversized);
    }
    Ok(buf)
}

#[cfg(test)]
mod tests;
