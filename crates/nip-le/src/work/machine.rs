//! [`WorkMachine`]: one key's work rules for this window, pure. Its state
//! is what the window knows of its work beyond the ledger file (the epoch
//! it holds at and how it came to hold it, what the global level reported,
//! since when it leads), its inputs the ledger's [`Index`] as last read (or
//! `None`: unreadable), the presence probe and the time; its answers are
//! decisions, and the lines to append. The writer's work shell opens,
//! reads and appends; it decides nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::elector::types::{QueuedEvent, TakeOutcome};
use crate::ledger::{self, Index, Op, Verdict};

mod global_view;

use super::first_look::FirstLook;
use super::in_hand::Hand;
use super::ledger_lines::{floor_line, record_take, taken_by};
use super::settle_cap::oldest_unsettled;
use super::steps::{Displaced, Lead, Settle, SettleStep, Spell, TakeStep};
use super::SharedWork;

/// The holder's part: while we hold the lock at an epoch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Held {
    epoch: u64,
    /// Since when (unix ms) we hold at it: a ledger unreadable since then
    /// is granted past only once that lasted (see
    /// [`ledger::grants_without_ledger`]).
    since_ms: u64,
    /// The predecessor kept no ledger we can read (its record had no
    /// epoch: spec mode or the harness): what was published before we led
    /// may be answered.
    ledgerless_before: bool,
    /// Whether the disk refused the last take.
    refusing: bool,
    /// We took the lock over from this holder (it died or hung): what it
    /// took is owed at once, even if it lives on (a hung holder that
    /// resumes is fenced and sends nothing). Every other taker's take stays
    /// in flight while it lives, as after a hand-over or a claim: its reply
    /// may be on its way (the model check: a former holder that handed
    /// over mid-turn, then its heir hung and was taken over; the mention
    /// was answered twice when every live take was owed).
    displaced: Option<Displaced>,
}

/// What the global level (etcd) reported for this key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct GlobalView {
    /// Done or taken on every host, while we hold the agent's etcd key.
    shared: Option<Arc<SharedWork>>,
    /// We hold the agent's etcd key but its records could not be read yet.
    unread: bool,
    /// Since when (unix ms) we act after taking the agent from another
    /// host whose work is unknown here (its records could not tell).
    since: Option<u64>,
}

/// One key's work rules for this window (see the module).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WorkMachine {
    /// The extension keeps a ledger; spec mode does not.
    keeps_ledger: bool,
    /// The stale bound.
    stale: Duration,
    /// Since when (unix ms) we lead, while we do.
    leader_since: Option<u64>,
    /// The queue the first time the app asked what is owed while we lead
    /// (see [`WorkMachine::owed`] and [`WorkMachine::floor_line`]).
    first_look: Option<FirstLook>,
    /// Since when (unix ms) we lead without holding the lock at an epoch
    /// (the NIP's fail-safe), with no ledger to record takes in.
    ledgerless_since: Option<u64>,
    /// The id of a writer without an epoch that our last take replaced
    /// (see `KeyMachine::ledgerless`).
    replaced_ledgerless: Option<String>,
    /// The holder our last take replaced.
    replaced: Option<Displaced>,
    /// Our record is in the lock file: leading without an epoch (no
    /// presence, so our records carry none), we are its one holder, not
    /// one of the fail-safe's leaders (see [`WorkMachine::holds`]).
    holds_lock: bool,
    held: Option<Held>,
    global: GlobalView,
    /// Takes this window was granted and has not settled yet (see
    /// [`WorkMachine::grant`]).
    in_hand: Hand,
    /// What the app's queue said at its last `owed` while we hold at an
    /// epoch: nothing published before this (unix ms) that it queues is
    /// owed but what the ledger shows (`u64::MAX`: nothing it queues is);
    /// `None` until it asks. What a rewrite may mark settled
    /// ([`WorkMachine::settle_cap`]).
    settled_below: Option<u64>,
}

/// The epoch a fail-safe leader judges the ledger at: no take is its own
/// at it, so every take of a live taker is in flight (its own included)
/// and every other is owed. Its takes are written at epoch 0, below every
/// holder's.
const FAIL_SAFE_EPOCH: u64 = u64::MAX;
/// The epoch a fail-safe leader's take lines carry.
const FAIL_SAFE_TAKE_EPOCH: u64 = 0;

impl WorkMachine {
    /// A key just joined.
    pub(crate) fn new(keeps_ledger: bool, stale: Duration) -> Self {
        Self {
            keeps_ledger,
            stale,
            leader_since: None,
            first_look: None,
            ledgerless_since: None,
            replaced_ledgerless: None,
            replaced: None,
            holds_lock: false,
            held: None,
            global: GlobalView::default(),
            in_hand: Hand::default(),
            settled_below: None,
        }
    }

    /// How far a rewrite of the ledger of our epoch may mark answered
    /// events settled (see [`ledger::Ledger::compact`]): below the oldest
    /// unanswered event the app's queue held at its last `owed`, while we
    /// hold at an epoch with a ledger that covers our predecessors. `None`:
    /// the app has not said (nothing answered may go).
    pub(crate) fn settle_cap(&self) -> Option<(u64, u64)> {
        let h = self.held.as_ref().filter(|h| !h.ledgerless_before)?;
        Some((self.settled_below?, h.epoch))
    }

    /// The epoch we hold the lock at, with a ledger, if we do.
    pub(crate) fn epoch(&self) -> Option<u64> {
        self.held.as_ref().map(|h| h.epoch)
    }

    /// How many grants are in hand (see [`WorkMachine::grant`]).
    #[cfg(test)]
    pub(crate) fn in_hand_len(&self) -> usize {
        self.in_hand.len()
    }

    /// We lead by the NIP's fail-safe (no lock at an epoch) and keep a
    /// ledger.
    pub(crate) fn fail_safe(&self) -> bool {
        self.keeps_ledger && self.held.is_none() && self.ledgerless_since.is_some()
    }

    /// Our take replaced a record: `ledgerless`, the id of its writer if
    /// it had no epoch; `holder`, who it named.
    pub(crate) fn replaced(&mut self, ledgerless: Option<String>, holder: Displaced) {
        self.replaced_ledgerless = ledgerless;
        self.replaced = Some(holder);
    }

    /// Before [`WorkMachine::lead`]: whether our record is in the lock
    /// file. Leading so without an epoch, a take is granted only once its
    /// line is written, as a holder's (no other window leads meanwhile);
    /// and after a holder that kept this ledger, the backlog is owed (the
    /// disk-full chaos: a window that could not create its presence lock
    /// led as the fail-safe does, and what was queued before it led was
    /// never answered).
    pub(crate) fn holds(&mut self, holds: bool) {
        self.holds_lock = holds;
    }

    /// After each conclusion of the key machine: whether we lead, the epoch
    /// we hold the lock at (a same-id child's rewrite is not a change of
    /// holder), and whether we took it over.
    pub(crate) fn lead(
        &mut self,
        now_ms: u64,
        leader: bool,
        epoch: Option<u64>,
        takeover: bool,
    ) -> Lead {
        if !leader {
            *self = Self {
                global: std::mem::take(&mut self.global),
                in_hand: std::mem::take(&mut self.in_hand),
                ..Self::new(self.keeps_ledger, self.stale)
            };
            self.global.since = None;
            return Lead::Forget;
        }
        self.leader_since.get_or_insert(now_ms);
        let Some(epoch) = epoch.filter(|_| self.keeps_ledger) else {
            let was_held = self.held.take().is_some();
            let first = self.ledgerless_since.is_none();
            self.ledgerless_since.get_or_insert(now_ms);
            return match (self.keeps_ledger, first || was_held) {
                (true, true) => Lead::OpenFailSafe,
                (true, false) => Lead::Keep,
                (false, _) => Lead::Forget,
            };
        };
        self.ledgerless_since = None;
        if self.held.as_ref().is_some_and(|h| h.epoch == epoch) {
            return Lead::Keep;
        }
        self.held = Some(Held {
            epoch,
            since_ms: now_ms,
            ledgerless_before: false,
            refusing: false,
            displaced: (self.replaced.take())
                .map(|d| if takeover { Some(d) } else { None })
                .unwrap_or(takeover.then_some(Displaced::Unknown)),
        });
        Lead::Open { epoch }
    }

    /// The ledger of the epoch we hold was opened (`index`; `None`: it
    /// cannot be read). A predecessor's record without an epoch is a
    /// writer without a ledger, unless it is the harness child of a window
    /// that keeps one: a `held` line names it, or it takes part in this
    /// key with a presence now (`takes_part`).
    ///
    /// Returns the lines to append: after a takeover, the displaced
    /// holder's takes given back on its behalf (it is fenced: it sends
    /// nothing more), so that they read as owed to every later holder too,
    /// not only to us (the model check: the holder that took over died
    /// before it took them again, and the next one left them to the hung
    /// holder for as long as it lived).
    pub(crate) fn opened(
        &mut self,
        index: Option<&Index>,
        takes_part: &dyn Fn(&str) -> bool,
        now_ms: u64,
    ) -> Vec<Op> {
        let before = self.replaced_ledgerless.take().is_some_and(|by| {
            mutated!(LedgerlessChild)
                || (index.is_none_or(|ix| !ix.kept_by(&by)) && !takes_part(&by))
        });
        let Some(h) = self.held.as_mut() else {
            return Vec::new();
        };
        h.ledgerless_before = before;
        match (&h.displaced, index) {
            (Some(Displaced::Token(Some(t))), Some(ix)) => (ix.taken_with(t).into_iter())
                .map(|(id, epoch)| Settle::GiveBack.op(&id, epoch, now_ms))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The `floor` line our ledger needs after [`WorkMachine::owed`], if
    /// it lacks it: we hold after a writer without a ledger, and our first
    /// look left out what was queued then and published before we led;
    /// so must every holder after us, whose ledger covers us but not that
    /// writer (the simulator's count of mentions answered after such a
    /// writer though published before it was replaced: 1,601 in 3,000
    /// seeds with the floor ours alone, 366 with the line).
    pub(crate) fn floor_line(&self, index: &Index, by: &str, now_ms: u64) -> Option<Op> {
        let h = self.held.as_ref().filter(|h| h.ledgerless_before)?;
        let floor = self
            .first_look
            .as_ref()?
            .floor()
            .filter(|_| !mutated!(NoFloorLine))?;
        floor_line(index, h.epoch, by, floor, now_ms)
    }

    /// Whether a take whose taker has this presence token is in flight,
    /// given the presence probe: while its taker lives, unless it is the
    /// holder we took over from.
    fn lives<'a>(&'a self, alive: &'a dyn Fn(&str) -> bool) -> impl Fn(&str) -> bool + 'a {
        let displaced = self.held.as_ref().and_then(|h| h.displaced.as_ref());
        move |t| {
            let ours = match displaced {
                None => false,
                Some(Displaced::Unknown) => true,
                Some(Displaced::Token(d)) => d.as_deref() == Some(t),
            };
            !ours && alive(t)
        }
    }

    /// A take granted (recorded or not): in hand until it is settled (see
    /// [`Hand`]).
    fn grant(&mut self, id: &str, epoch: Option<u64>, recorded_at: Option<u64>) -> TakeOutcome {
        self.in_hand.grant(id, recorded_at);
        TakeOutcome::Granted { epoch }
    }

    /// Whether an event published at `published` is what holds the
    /// settled mark back: no later than the oldest unanswered event of the
    /// app's last queue. A full ledger still grants its take (answered, it
    /// lets the mark rise and the next rewrite shrink the file; refused,
    /// the ledger would stay full for as long as it stays queued: the
    /// simulator at a 2 KiB budget, a mention given back while the ledger
    /// was full, refused to every leader after).
    fn holds_mark_back(&self, published: Option<u64>) -> bool {
        !mutated!(FullWedge)
            && matches!((published, self.settled_below), (Some(p), Some(b)) if p <= b)
    }

    /// A take of `id`, published at `published` (unix ms) if the app said.
    /// `leads`: we act now; `index`: the ledger as just read again
    /// (`None`: unreadable); `full`: it is as long as it may grow
    /// ([`ledger::Ledger::is_full`]); `by` and `live`: our instance id and
    /// presence token, for the line.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn take(
        &mut self,
        (id, published): (&str, Option<u64>),
        leads: bool,
        now_ms: u64,
        (index, full): (Option<&Index>, bool),
        alive: &dyn Fn(&str) -> bool,
        by: &str,
        live: Option<&str>,
    ) -> TakeStep {
        use TakeStep::Answer;
        if !leads {
            return Answer(TakeOutcome::NotLeader);
        }
        if self.in_hand.holds(id, index) {
            return Answer(TakeOutcome::AlreadyTaken);
        }
        if !self.in_hand.has_room(index) {
            return Answer(TakeOutcome::TooManyOpen);
        }
        // Published before the ledger's settled mark and not in it: settled
        // (answered, or another's to answer), as `owed` says.
        let settled = |ix: &Index| {
            ix.state(id).is_none() && matches!((published, ix.floor()), (Some(p), Some(f)) if p < f)
        };
        if index.is_some_and(settled) {
            return Answer(TakeOutcome::Done);
        }
        // What another host did (or a window of any host still does).
        if self.global.unread {
            return Answer(TakeOutcome::Unavailable);
        }
        if let Some(shared) = &self.global.shared {
            if shared.done.contains(id) {
                return Answer(TakeOutcome::Done);
            }
            if shared.taken.contains(id) {
                return Answer(TakeOutcome::AlreadyTaken);
            }
        }
        let Some(h) = &self.held else {
            // Spec mode: no ledger applies.
            if !self.keeps_ledger {
                return Answer(self.grant(id, None, None));
            }
            // A fail-safe leader (the lock file cannot be read or locked)
            // acts once that has lasted a stale bound; its takes go in the
            // ledger at epoch 0 while the ledger can be read, so that the
            // other windows that lead by the fail-safe at the same time
            // (every observer of a holder frozen inside its `flock`), and
            // the holder once it is back, leave them to it (the simulator,
            // once mentions carried real times: two fail-safe leaders
            // answered the same mention in 20 of 300 seeds).
            let since = self.ledgerless_since.unwrap_or(0);
            if !ledger::grants_without_ledger(since, now_ms, self.stale) && !mutated!(FailsafeTake)
            {
                return Answer(TakeOutcome::Unavailable);
            }
            let Some(ix) = index.filter(|_| !mutated!(FailsafeTake)) else {
                return Answer(self.grant(id, None, None));
            };
            return match ix.verdict_with(id, FAIL_SAFE_EPOCH, &self.lives(alive)) {
                Verdict::Done => Answer(TakeOutcome::Done),
                Verdict::TakenNow | Verdict::TakenElsewhere => Answer(TakeOutcome::AlreadyTaken),
                Verdict::Owed if full && !self.holds_mark_back(published) => {
                    Answer(TakeOutcome::LedgerFull)
                }
                Verdict::Owed => {
                    let take = (id, published, FAIL_SAFE_TAKE_EPOCH);
                    record_take(ix, take, by, now_ms, live)
                }
            };
        };
        let Some(ix) = index else {
            let epoch = Some(h.epoch);
            return Answer(
                if ledger::grants_without_ledger(h.since_ms, now_ms, self.stale) {
                    self.grant(id, epoch, None)
                } else {
                    TakeOutcome::Unavailable
                },
            );
        };
        match ix.verdict_with(id, h.epoch, &self.lives(alive)) {
            Verdict::Done => Answer(TakeOutcome::Done),
            Verdict::TakenNow | Verdict::TakenElsewhere => Answer(TakeOutcome::AlreadyTaken),
            Verdict::Owed if full && !self.holds_mark_back(published) => {
                Answer(TakeOutcome::LedgerFull)
            }
            Verdict::Owed => record_take(ix, (id, published, h.epoch), by, now_ms, live),
        }
    }

    /// The take line of [`TakeStep::Record`] for `id` was written
    /// (`written`) or refused: a take that is not on disk is not granted (a
    /// successor, or we after a crash, would grant it again), unless we
    /// lead by the fail-safe (not holding the lock), past the stale bound
    /// already: then it is granted unrecorded.
    pub(crate) fn take_written(&mut self, id: &str, written: bool) -> (TakeOutcome, Spell) {
        let Some(h) = self.held.as_mut() else {
            let out = match (written, self.holds_lock) {
                (false, true) => TakeOutcome::Unavailable,
                _ => self.grant(id, None, written.then_some(FAIL_SAFE_TAKE_EPOCH)),
            };
            return (out, Spell::Same);
        };
        let spell = match (std::mem::replace(&mut h.refusing, !written), written) {
            (true, true) => Spell::Ended,
            (false, false) => Spell::Began,
            _ => Spell::Same,
        };
        let epoch = Some(h.epoch);
        let out = if written {
            self.grant(id, epoch, epoch)
        } else {
            TakeOutcome::Unavailable
        };
        (out, spell)
    }

    /// A `done` or a `giveBack` of `id` from this window, whose presence
    /// token is `token`. Accepted from the window that took the event (its
    /// token is on the take), at the take's epoch, whatever its
    /// leadership (fence the take, not the done: its reply may have been
    /// on its way while leadership moved); and, for a `done`, from the
    /// leader (an event it was handed some other way).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn settle(
        &mut self,
        id: &str,
        token: Option<&str>,
        leads: bool,
        what: Settle,
        now_ms: u64,
        index: Option<&Index>,
    ) -> SettleStep {
        // Granted to us, recorded or not: a reply of ours is done for
        // everyone, whether or not the ledger shows our take (a fail-safe
        // leader's take granted unrecorded while the disk refused writes:
        // the simulator, its `done` dropped, a later holder answered it
        // again).
        let ours = self.in_hand.settle(id);
        if mutated!(DoneFenced) && !leads {
            return SettleStep::Answer(false);
        }
        if !self.keeps_ledger || (mutated!(FailsafeDone) && self.held.is_none() && leads) {
            // Spec mode: no ledger applies.
            return SettleStep::Answer(leads);
        }
        let (Some(h), Some(ix)) = (&self.held, index) else {
            // Not the holder any more (a fail-safe leader included: a take
            // of ours at an epoch we held still needs its end), or our
            // ledger cannot be read.
            return SettleStep::Outside {
                anyway: leads && self.held.is_none(),
                done_anyway: ours && what == Settle::Done,
            };
        };
        let epoch = match (taken_by(ix, id, token), what) {
            (Some(epoch), _) => epoch,
            // A take at our epoch without a token (our presence did not
            // list the key then): ours, only the holder takes at it.
            (None, _) if ix.taker(id) == Some((h.epoch, None)) => h.epoch,
            (None, Settle::Done) if leads || ours => h.epoch,
            _ => return SettleStep::Answer(false),
        };
        SettleStep::Record(what.op(id, epoch, now_ms))
    }

    /// The give-backs that end every turn of ours when we leave the key:
    /// no `done` or `giveBack` of ours can reach the ledger any more (see
    /// the writer's `end_takes`). Those at the epoch we hold, and those
    /// that carry our presence `token` at any epoch (a fail-safe leader's
    /// at epoch 0 included: the simulator, a window that left while it led
    /// by the fail-safe kept its take in flight for as long as it lived,
    /// and the mention was never answered).
    pub(crate) fn end_takes(
        &self,
        index: Option<&Index>,
        token: Option<&str>,
        now_ms: u64,
    ) -> Vec<Op> {
        let Some(ix) = index else {
            return Vec::new();
        };
        let mut takes: BTreeMap<String, u64> =
            (token.into_iter()).flat_map(|t| ix.taken_with(t)).collect();
        if let Some(h) = &self.held {
            takes.extend(ix.taken_at(h.epoch).into_iter().map(|id| (id, h.epoch)));
        }
        (takes.into_iter())
            .map(|(id, epoch)| Settle::GiveBack.op(&id, epoch, now_ms))
            .collect()
    }

    /// The queued events we must dispatch now, in order: none unless we
    /// act and the global level could tell what every host did; then what
    /// the global level does not show done or taken, and what the ledger
    /// shows owed (see [`ledger::owed`]). Without a ledger that covers the
    /// predecessor, only what was published since we led (it may have
    /// answered the rest), or queued after the first time we were asked
    /// while leading: a `created_at` is its sender's clock, and ours may
    /// have stepped (the simulator, the teeth's `late_by_published`: after
    /// a wall-clock step of +5.9 s, the mentions published in those seconds
    /// were owed to no holder). The global level's unknown start stays a published time:
    /// the other host received what we queue since, and may have acted on
    /// it (across hosts, 1,000 seeds: owing it made 6% more answers on two
    /// hosts).
    ///
    /// It also notes how far the ledger may mark answered events settled:
    /// below the oldest event of `queue`, published since `horizon_ms` (the
    /// retention's start: older ones the ledger forgets anyway), that it
    /// does not show answered (see [`WorkMachine::settle_cap`]).
    pub(crate) fn owed(
        &mut self,
        queue: &[QueuedEvent],
        leads: bool,
        (index, horizon_ms): (Option<&Index>, u64),
        alive: &dyn Fn(&str) -> bool,
    ) -> Vec<String> {
        if !leads {
            return Vec::new();
        }
        if let (Some(ix), Some(_)) = (index, &self.held) {
            let shared = self.global.shared.as_deref();
            self.settled_below = Some(oldest_unsettled(queue, ix, shared, horizon_ms));
        }
        let led = self.leader_since.unwrap_or(0);
        let after_ledgerless = self.held.as_ref().is_some_and(|h| h.ledgerless_before);
        (self.first_look).get_or_insert_with(|| FirstLook::new(queue, led, after_ledgerless));
        let first_look = self.first_look.as_ref();
        if self.global.unread {
            return Vec::new();
        }
        let since = led.max(self.global.since.unwrap_or(0));
        let shared = self.global.shared.as_deref();
        let elsewhere = |id: &str| {
            self.in_hand.holds(id, index)
                || shared.is_some_and(|w| w.done.contains(id) || w.taken.contains(id))
        };
        // As if published since we led (of unknown time), unless before
        // the global level's unknown start: what was queued since our first
        // look, and what our ledger shows taken by a taker now gone, or
        // given back (it was in our windows' hands and they did not answer
        // it: the simulator, the teeth's `taken_left_to_floor`: a holder
        // took mentions and was killed, a harness child's record came
        // between, and the next holder owed only what was published since
        // it led).
        let global_since = self.global.since.unwrap_or(0);
        let ours = |id: &str| {
            !mutated!(TakenLeftToFloor) && index.is_some_and(|ix| ix.state(id).is_some())
        };
        let late = |id: &str| !mutated!(LateByPublished) && first_look.is_some_and(|l| l.late(id));
        let events = (queue.iter())
            .filter(|e| !elsewhere(&e.id))
            .map(|e| match e.published_ms {
                Some(p) if (global_since..since).contains(&p) && (ours(&e.id) || late(&e.id)) => {
                    (e.id.as_str(), None)
                }
                p => (e.id.as_str(), p),
            });
        let lives = self.lives(alive);
        match &self.held {
            Some(h) => {
                // Our ledger covers our host's earlier leaders, unless it
                // cannot (then only what was published since we led); the
                // global level's unknown start applies either way (a start
                // no earlier than we led skipped what another host left
                // unanswered before our host's leader changed: real-process
                // chaos across hosts).
                let ours_unknown = h.ledgerless_before || index.is_none();
                let from = match (ours_unknown, self.global.since) {
                    (true, _) => Some(since),
                    (false, global) => global,
                };
                ledger::owed(events, index, h.epoch, from, &lives)
            }
            // The fail-safe: what the ledger shows taken or done is not
            // owed (see `take`), and of the rest only what was published
            // since we led (whoever held may not keep a ledger), unless we
            // hold the lock after a holder that kept this ledger.
            None => {
                let after_keeper = self.holds_lock && self.replaced_ledgerless.is_none();
                let from = if after_keeper {
                    self.global.since
                } else {
                    Some(since)
                };
                ledger::owed(events, index, FAIL_SAFE_EPOCH, from, &lives)
            }
        }
    }
}
