//! The ledger's state and its rules: the last word on each event, and
//! what the holder at an epoch owes (see [`super`]).

use std::collections::HashMap;
use std::time::Duration;

use super::{Op, MAX_EVENT_ID_LEN};

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

/// How many events a ledger remembers in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "StateCounts.ts"))]
#[serde(rename_all = "camelCase")]
pub struct StateCounts {
    /// Taken and not yet settled: in flight, or owed again once the taker
    /// is gone.
    pub taken: usize,
    /// Answered.
    pub done: usize,
    /// Given back: owed again, to whoever leads.
    pub given_back: usize,
}

/// What the ledger says of an event for the holder at an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody works on it now and it is not done: dispatch it.
    Owed,
    /// Taken at this very epoch (by us).
    TakenNow,
    /// Taken at an earlier epoch by a taker that still lives (its turn, or
    /// its reply's send, is still in flight): its `done` or `give_back`
    /// settles it; its death makes it owed.
    TakenElsewhere,
    /// Replied to already.
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    state: State,
    at_ms: u64,
    /// The taker's presence token, for a take that carries one.
    live: Option<String>,
    /// When the event was published, if its take said.
    pub_ms: Option<u64>,
}

impl Entry {
    /// When the event was published, or at the latest: its take said, or
    /// else the entry's own time (a sender's clock runs ahead of ours
    /// rarely; when it does, an event marked settled by it is owed again,
    /// a duplicate, never a silence).
    fn published_by(&self) -> u64 {
        self.pub_ms.unwrap_or(self.at_ms)
    }
}

/// The ledger's state: the last word on each event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    entries: HashMap<String, Entry>,
    /// The entries in each state, kept with them (a status reads it at
    /// every change: counting would walk every entry).
    counts: StateCounts,
    /// Lines read from the file since it was last written whole (each
    /// once: our own are counted when read back).
    lines: usize,
    /// Highest epoch any line names.
    max_epoch: u64,
    /// The holders that keep this ledger: the highest epoch of their
    /// `held` lines, and when.
    keepers: HashMap<String, (u64, u64)>,
    /// The highest `floor` line, as read (see [`Index::floor`]).
    floor: Option<Op>,
}

impl Index {
    /// Parses a ledger file's bytes, dropping entries older than
    /// `retention` before `now_ms`. Lines that are not ledger lines (a torn
    /// last line, garbage) are skipped, never fatal.
    pub fn parse(bytes: &[u8], now_ms: u64, retention: Duration) -> Self {
        let mut ix = Self::default();
        ix.extend(bytes);
        ix.expire(now_ms, retention);
        ix
    }

    /// Applies the whole lines of `bytes` (appended to what was applied
    /// before); returns how many bytes they span, up to and including the
    /// last newline (a line still being written waits for its newline).
    pub fn extend(&mut self, bytes: &[u8]) -> usize {
        self.extend_with(bytes, true)
    }

    /// [`Index::extend`] for lines not in the file yet (refused by the
    /// disk): counted when they are read back from it.
    pub fn extend_uncounted(&mut self, bytes: &[u8]) -> usize {
        self.extend_with(bytes, false)
    }

    fn extend_with(&mut self, bytes: &[u8], count: bool) -> usize {
        let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        for line in bytes[..whole].split(|&b| b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if count {
                self.lines += 1;
            }
            if let Some(op) = Op::parse(line) {
                self.apply(&op);
            }
        }
        whole
    }

    /// Applies one line. Later lines win, except that a `take` never
    /// overrides a `take` at a higher epoch (a stale holder's late line), a
    /// `done` is final, and a `give_back` only undoes a `take` of its own
    /// epoch.
    pub fn apply(&mut self, op: &Op) {
        let (id, at_ms) = (op.id(), op.at_ms());
        if id.len() > MAX_EVENT_ID_LEN {
            return;
        }
        let epoch = match op {
            Op::Take { epoch, .. }
            | Op::Done { epoch, .. }
            | Op::GiveBack { epoch, .. }
            | Op::Held { epoch, .. }
            | Op::Floor { epoch, .. } => *epoch,
        };
        self.max_epoch = self.max_epoch.max(epoch);
        if let Op::Floor { before_ms, .. } = op {
            // A floor is never later than its line (a hostile one near
            // `u64::MAX` would silence the agent).
            let newer = self.floor().is_none_or(|f| *before_ms > f);
            if *before_ms <= at_ms && newer {
                self.floor = Some(op.clone());
            }
            return;
        }
        if let Op::Held { by, .. } = op {
            if by.len() <= MAX_EVENT_ID_LEN {
                let e = self.keepers.entry(by.clone()).or_insert((epoch, at_ms));
                *e = (*e).max((epoch, at_ms));
            }
            return;
        }
        let cur = self.entries.get(id).map(|e| e.state);
        let live = match op {
            Op::Take { live, .. } => live.clone().filter(|t| t.len() <= MAX_EVENT_ID_LEN),
            _ => None,
        };
        // The publication time a take gave stays with the event's entry.
        let pub_ms = match op {
            Op::Take { pub_ms, .. } | Op::Done { pub_ms, .. } if pub_ms.is_some() => *pub_ms,
            _ => self.entries.get(id).and_then(|e| e.pub_ms),
        };
        let next = match (op, cur) {
            (_, Some(State::Done)) => None,
            (Op::Done { .. }, _) => Some(State::Done),
            (Op::Take { .. }, Some(State::Taken(e))) if e > epoch => None,
            (Op::Take { .. }, _) => Some(State::Taken(epoch)),
            (Op::GiveBack { .. }, Some(State::Taken(e))) if e == epoch => Some(State::GivenBack),
            (Op::GiveBack { .. } | Op::Held { .. } | Op::Floor { .. }, _) => None,
        };
        if let Some(state) = next {
            if let Some(old) = cur {
                tally(&mut self.counts, old, false);
            }
            tally(&mut self.counts, state, true);
            let e = Entry {
                state,
                at_ms,
                live,
                pub_ms,
            };
            self.entries.insert(id.to_owned(), e);
        }
    }

    /// Drops entries last touched more than `retention` before `now_ms`.
    pub fn expire(&mut self, now_ms: u64, retention: Duration) {
        let horizon =
            now_ms.saturating_sub(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX));
        let counts = &mut self.counts;
        self.entries.retain(|_, e| {
            let keep = e.at_ms >= horizon;
            if !keep {
                tally(counts, e.state, false);
            }
            keep
        });
        self.keepers.retain(|_, (_, at_ms)| *at_ms >= horizon);
        // The floor outlives the retention (what it skips was published
        // before it, and stays possibly answered); one in the future is a
        // hostile line or a clock stepped back: dropped, as if unwritten.
        if self.floor().is_some_and(|f| f > now_ms) {
            self.floor = None;
        }
    }

    /// What was published before this (unix ms) and is not in the ledger
    /// may have been answered by a writer that kept no ledger, which a
    /// holder replaced (its `floor` line): owed to no holder.
    pub fn floor(&self) -> Option<u64> {
        match &self.floor {
            Some(Op::Floor { before_ms, .. }) => Some(*before_ms),
            _ => None,
        }
    }

    /// Whether the holder `by` keeps this ledger (a `held` line names it).
    pub fn kept_by(&self, by: &str) -> bool {
        self.keepers.contains_key(by)
    }

    /// Whether a `held` line names `by` at `epoch` or later.
    pub fn kept_at(&self, by: &str, epoch: u64) -> bool {
        self.keepers.get(by).is_some_and(|(e, _)| *e >= epoch)
    }

    /// The verdict on `id` for the holder at `epoch`, as if no taker of an
    /// earlier epoch lived.
    pub fn verdict(&self, id: &str, epoch: u64) -> Verdict {
        self.verdict_with(id, epoch, &|_| false)
    }

    /// The verdict on `id` for the holder at `epoch`; `lives` says whether
    /// the taker with a presence token still takes part in the election.
    pub fn verdict_with(&self, id: &str, epoch: u64, lives: &dyn Fn(&str) -> bool) -> Verdict {
        let Some(e) = self.entries.get(id) else {
            return Verdict::Owed;
        };
        match e.state {
            State::Done => Verdict::Done,
            State::Taken(t) if t == epoch => Verdict::TakenNow,
            State::Taken(_) if e.live.as_deref().is_some_and(lives) => Verdict::TakenElsewhere,
            _ => Verdict::Owed,
        }
    }

    /// Who took `id`, while it is taken: the epoch and the taker's
    /// presence token.
    pub fn taker(&self, id: &str) -> Option<(u64, Option<&str>)> {
        let e = self.entries.get(id)?;
        match e.state {
            State::Taken(epoch) => Some((epoch, e.live.as_deref())),
            _ => None,
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

    /// The events taken (and not done or given back) by the taker whose
    /// presence token is `token`, with the epoch of each take, sorted.
    pub fn taken_with(&self, token: &str) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = (self.entries.iter())
            .filter_map(|(id, e)| match e.state {
                State::Taken(epoch) if e.live.as_deref() == Some(token) => {
                    Some((id.clone(), epoch))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    /// The events done, with when their `done` was written (unix ms).
    pub fn dones(&self) -> impl Iterator<Item = (&str, u64)> {
        (self.entries.iter())
            .filter(|(_, e)| e.state == State::Done)
            .map(|(id, e)| (id.as_str(), e.at_ms))
    }

    /// The state of `id`, if the ledger knows it.
    pub fn state(&self, id: &str) -> Option<State> {
        self.entries.get(id).map(|e| e.state)
    }

    /// Highest epoch any line named.
    pub fn max_epoch(&self) -> u64 {
        self.max_epoch
    }

    /// How many remembered events are in each state (for a status view).
    pub fn counts(&self) -> StateCounts {
        self.counts
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

    /// After the file was rewritten with [`Index::snapshot`].
    pub(super) fn compacted(&mut self) {
        self.lines = self.entries.len() + self.keepers.len() + usize::from(self.floor.is_some());
    }

    /// The size of [`Index::snapshot`], in bytes.
    pub(super) fn snapshot_len(&self) -> usize {
        let floor = self.floor();
        let entries: usize = (self.entries.iter())
            .map(|(id, e)| entry_len(id, e, floor))
            .sum();
        let rest: usize = (self.keepers.iter())
            .map(|(by, &(epoch, at_ms))| held_op(by, epoch, at_ms).to_line().len())
            .sum();
        entries + rest + self.floor.as_ref().map_or(0, |f| f.to_line().len())
    }

    /// Makes the snapshot fit in `budget` bytes without forgetting an
    /// answer: the answered events published (see `Entry::published_by`)
    /// before a mark no higher than `cap` are dropped, the oldest first,
    /// and the mark becomes the ledger's floor, which says that what was
    /// published before it and is not in the ledger is owed to no holder.
    /// Takes are never dropped (in flight, or owed while they are shown);
    /// `cap` is the caller's promise that nothing published before it is
    /// owed but what the ledger shows (see `WorkMachine::settled_below`).
    /// Returns the mark, when one was raised; `by`, `epoch` and `now_ms`
    /// sign its `floor` line.
    pub(super) fn settle_to(
        &mut self,
        budget: usize,
        cap: u64,
        (by, epoch, now_ms): (&str, u64, u64),
    ) -> Option<u64> {
        let mut total = self.snapshot_len();
        if total <= budget {
            return None;
        }
        // A given-back event is owed by its absence from the snapshot: the
        // mark stays below it (when its take said when it was published).
        let cap = (self.entries.values())
            .filter(|e| e.state == State::GivenBack)
            .filter_map(|e| e.pub_ms)
            .fold(cap, u64::min);
        // Room for the `floor` line that replaces the one there is.
        let floor = |before_ms: u64| Op::Floor {
            epoch,
            by: by.to_owned(),
            before_ms,
            at_ms: now_ms.max(before_ms),
        };
        let budget = budget.saturating_sub(floor(cap.min(now_ms)).to_line().len());
        let mut dones: Vec<(u64, usize, &String)> = (self.entries.iter())
            .filter(|(_, e)| e.state == State::Done && e.published_by() < cap)
            .map(|(id, e)| (e.published_by(), entry_len(id, e, None), id))
            .collect();
        dones.sort_unstable();
        let mut mark = None;
        let mut gone = Vec::new();
        for (published, size, id) in dones {
            if total <= budget {
                break;
            }
            total -= size;
            gone.push(id.clone());
            mark = Some(published + 1);
        }
        for id in &gone {
            if let Some(e) = self.entries.remove(id) {
                tally(&mut self.counts, e.state, false);
            }
        }
        let mark = mark.filter(|m| self.floor().is_none_or(|f| *m > f))?;
        self.apply(&floor(mark));
        Some(mark)
    }

    /// Forgets the oldest settled entries (done, given back) until the
    /// snapshot fits in `budget` bytes; takes are kept (in flight). Returns
    /// how many were forgotten. Only for a ledger too large to read
    /// ([`super::Ledger::recover`]), whose older lines are lost already.
    pub(super) fn forget_oldest_to(&mut self, budget: usize) -> usize {
        let mut sizes: Vec<(u64, usize, &String, bool)> = self
            .entries
            .iter()
            .map(|(id, e)| {
                (
                    e.at_ms,
                    entry_len(id, e, self.floor()),
                    id,
                    matches!(e.state, State::Taken(_)),
                )
            })
            .collect();
        let mut total: usize = sizes.iter().map(|s| s.1).sum();
        if total <= budget {
            return 0;
        }
        sizes.sort_unstable();
        let mut gone = Vec::new();
        for (_, size, id, taken) in sizes {
            if total <= budget {
                break;
            }
            if !taken {
                total -= size;
                gone.push(id.clone());
            }
        }
        for id in &gone {
            if let Some(e) = self.entries.remove(id) {
                tally(&mut self.counts, e.state, false);
            }
        }
        gone.len()
    }

    /// The lines of a compacted file: one per live entry (see
    /// [`entry_ops`]).
    pub(super) fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut ids: Vec<&String> = self.entries.keys().collect();
        ids.sort();
        for id in ids {
            for op in entry_ops(id, &self.entries[id], self.floor()) {
                out.extend(op.to_line());
            }
        }
        let mut keepers: Vec<(&String, &(u64, u64))> = self.keepers.iter().collect();
        keepers.sort();
        for (by, &(epoch, at_ms)) in keepers {
            out.extend(held_op(by, epoch, at_ms).to_line());
        }
        if let Some(f) = &self.floor {
            out.extend(f.to_line());
        }
        out
    }
}

/// One entry more (`up`) or fewer in `state`.
fn tally(c: &mut StateCounts, state: State, up: bool) {
    let n = match state {
        State::Taken(_) => &mut c.taken,
        State::Done => &mut c.done,
        State::GivenBack => &mut c.given_back,
    };
    *n = if up { *n + 1 } else { n.saturating_sub(1) };
}

/// The lines a compacted file keeps for an entry. A given-back event is
/// owed by its absence, unless the ledger's `floor` may be above its
/// publication time: then its take and give-back (at epoch 0) are kept,
/// or the floor would settle it.
fn entry_ops(id: &str, e: &Entry, floor: Option<u64>) -> Vec<Op> {
    let (id, at_ms, pub_ms) = (id.to_owned(), e.at_ms, e.pub_ms);
    match e.state {
        State::Taken(epoch) => vec![Op::Take {
            id,
            epoch,
            by: String::new(),
            at_ms,
            live: e.live.clone(),
            pub_ms,
        }],
        State::Done => vec![Op::Done {
            id,
            epoch: 0,
            at_ms,
            pub_ms,
        }],
        State::GivenBack if floor.is_some_and(|f| pub_ms.is_none_or(|p| p < f)) => {
            let take = Op::Take {
                id: id.clone(),
                epoch: 0,
                by: String::new(),
                at_ms,
                live: None,
                pub_ms,
            };
            vec![
                take,
                Op::GiveBack {
                    id,
                    epoch: 0,
                    at_ms,
                },
            ]
        }
        State::GivenBack => Vec::new(),
    }
}

/// The length of [`entry_ops`]' lines.
fn entry_len(id: &str, e: &Entry, floor: Option<u64>) -> usize {
    (entry_ops(id, e, floor).iter())
        .map(|op| op.to_line().len())
        .sum()
}

/// The `held` line of a keeper.
fn held_op(by: &str, epoch: u64, at_ms: u64) -> Op {
    Op::Held {
        epoch,
        by: by.to_owned(),
        at_ms,
    }
}

#[cfg(test)]
impl Index {
    /// The counts, counted again from the entries (for tests of the kept
    /// ones).
    pub(super) fn recount(&self) -> StateCounts {
        let mut c = StateCounts::default();
        for e in self.entries.values() {
            tally(&mut c, e.state, true);
        }
        c
    }
}
