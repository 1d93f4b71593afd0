//! The per-key state machine, pure: it reads no file, sleeps on nothing and
//! takes the time as an argument, so every timing rule is unit-tested with
//! an injected clock.
//!
//! Its one entry point is [`KeyMachine::step`] (input and time in, the
//! decision as data out; see [`step`] for the inputs of one evaluation).
//! It knows its host (`here`) from the writer, not from a global.
//!
//! Two deliberate refinements of the letter of the NIP, documented in the
//! README:
//! * an instance that is standing down (or has released) is never the
//!   leader in its own view, even though the emptied file would read as
//!   "leader": otherwise the step-down would keep prompting;
//! * while a fresh local lead request names another instance, we neither
//!   take a free lock that is not already ours nor fail-safe-lead on an
//!   emptied file: the intended target wins the released lock and nobody
//!   prompts twice meanwhile. Requests expire after the stand-down timeout,
//!   so this never wedges an election.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::control::LeadRequest;
use crate::election::{self, TakeReason, Takeable};
use crate::host::{Here, Origin};
use crate::liveness::Liveness;
use crate::presence::PeerPresence;
use crate::record::{encode_record_at, LockContent, LockRecord, RecordExt};

use super::types::ChangeReason;

pub(crate) mod announce;
#[cfg(test)]
mod claim_tests;
mod conclude;
mod drain;
mod exchange;
#[cfg(test)]
mod model;
#[cfg(test)]
mod pause_tests;
mod rules;
mod same_id;
#[cfg(test)]
mod same_id_tests;
mod step;

pub(crate) use drain::{Drain, StepDownPlan};
pub(crate) use exchange::{Begin, Conclusion, Look, Seen, StepDown, Validity, Write};
pub(crate) use rules::Rules;
pub(crate) use step::Input;

/// The time, as the machine sees it: a monotonic instant for every interval
/// we measure ourselves, and the wall clock for `claimed_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Now {
    pub mono: Instant,
    pub wall: SystemTime,
}

/// What started an evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Cause {
    /// The first look after joining: always reported.
    Join,
    /// A refresh (the NIP's tick, or a command that asks for one).
    Tick,
    /// A file event or a holder's death: never rewrites our own record
    /// (that would only cause more events).
    Wake,
}

/// Answers about other participants, asked while deciding. The writer
/// answers with real probes; tests with fixed answers.
pub(crate) trait Probes {
    /// Is the process with this pid running?
    fn pid(&self, pid: u32) -> Liveness;
    /// Does the participant with this presence token still hold its lock?
    fn presence(&self, token: &str) -> PeerPresence;
    /// Extension: does another participant with a presence take part in
    /// this key (one of them may be a holder whose child emptied the file)?
    fn others_present(&self) -> bool;
    /// Extension: the presence token of another participant of this key
    /// whose instance id is `id`, if one lives (a harness child writes its
    /// window's id with its own pid).
    fn present_as(&self, id: &str) -> Option<String>;
}

/// Our outstanding claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PendingClaim {
    until: Instant,
    /// The nonce of our local lead request, once written.
    nonce: Option<String>,
}

/// What the last look saw.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) enum Observed {
    /// No look yet.
    #[default]
    Nothing,
    /// The content of the lock file.
    Content(LockContent),
    /// The lock file could not be read.
    Unreadable(String),
}

impl Observed {
    pub(crate) fn record(&self) -> Option<&LockRecord> {
        match self {
            Observed::Content(c) => c.record(),
            _ => None,
        }
    }
}

/// One key's election state, owned by the writer. (Clone, Eq and Hash
/// for the model check: its states are sets of machines.)
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct KeyMachine {
    rules: Rules,
    our_id: Arc<str>,
    our_pid: u32,
    stand_down_until: Option<Instant>,
    /// The nonce of the request the current stand-down serves, if any.
    stood_down_for: Option<String>,
    pending: Option<PendingClaim>,
    /// Nonce of the last local request we stood down for.
    honoured: Option<String>,
    /// Whether the last look showed a record naming us.
    holds_lock: bool,
    /// Extension: the last record seen and since when (our monotonic clock)
    /// it has not changed, to tell a hung holder from a slept machine.
    seen: Option<(LockRecord, Instant)>,
    /// The record we last decided to write (to recognise it unchanged).
    written: Option<LockRecord>,
    /// The current look rewrote exactly `written` (see
    /// [`Conclusion::unbroken`]).
    rewrote_ours: bool,
    /// Extension: the `seen` instant whose hang was judged already (taken,
    /// or left alone by the other rules), so its deadline is not due again.
    hang_judged: Option<Instant>,
    /// Extension: the record whose hang timer a pause restarted already.
    pause_restarted: Option<LockRecord>,
    /// Extension: the record whose hang timer a peer's hold on the
    /// exclusion restarted, until a locked look finds the exclusion free.
    held_over: Option<LockRecord>,
    /// Extension: since when the lock file has been empty while a peer
    /// held its exclusion (a record being written; see `conclude`), and
    /// whether that hold outlasted the stale bound already (judged: no
    /// more wake-ups for it).
    held_empty: Option<(Instant, bool)>,
    /// Highest fencing epoch seen for this key.
    epoch: u64,
    observed: Observed,
    last_error: Option<String>,
    /// `holds_lock` when the current evaluation began.
    held_before: bool,
    /// The evaluation in progress (see [`step`]).
    evaluation: Option<step::Evaluation>,
    /// Our host and boot: a pid or a presence means something only there.
    here: Arc<Here>,
    /// Extension: what writers sharing an id left (see [`same_id`]).
    same_id: same_id::SameId,
}

impl KeyMachine {
    pub(crate) fn new(rules: Rules, our_id: Arc<str>, our_pid: u32, here: Arc<Here>) -> Self {
        Self {
            rules,
            our_id,
            our_pid,
            stand_down_until: None,
            stood_down_for: None,
            pending: None,
            honoured: None,
            holds_lock: false,
            seen: None,
            written: None,
            rewrote_ours: false,
            hang_judged: None,
            pause_restarted: None,
            held_over: None,
            held_empty: None,
            epoch: 0,
            observed: Observed::Nothing,
            last_error: None,
            held_before: false,
            evaluation: None,
            here,
            same_id: same_id::SameId::default(),
        }
    }

    pub(crate) fn holds_lock(&self) -> bool {
        self.holds_lock
    }
    /// The epoch of the record we hold, while we hold one with an epoch
    /// (through a same-id child's rewrite too).
    pub(crate) fn held_epoch(&self) -> Option<u64> {
        if mutated!(ChildLedger) {
            return self
                .observed
                .record()
                .and_then(|r| r.epoch)
                .filter(|_| self.holds_lock);
        }
        self.same_id.held_epoch.filter(|_| self.holds_lock)
    }
    pub(crate) fn observed(&self) -> &Observed {
        &self.observed
    }
    pub(crate) fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }
    pub(crate) fn our_id(&self) -> &str {
        &self.our_id
    }
    /// Until when we stand down, if we do.
    pub(crate) fn stand_down_until(&self) -> Option<Instant> {
        self.stand_down_until
    }
    /// Until when our claim waits for the holder, if it does.
    pub(crate) fn pending_until(&self) -> Option<Instant> {
        self.pending.as_ref().map(|p| p.until)
    }

    /// Phase 1. `request` is the local lead request on file, if any.
    fn begin(&mut self, now: Now, request: Option<&LeadRequest>) -> Begin {
        self.held_before = self.holds_lock;
        if self.stand_down_until.is_some_and(|u| now.mono >= u) {
            self.stand_down_until = None;
        }
        if self.pending.as_ref().is_some_and(|p| now.mono >= p.until) {
            self.pending = None;
        }
        let request = request.filter(|r| r.is_fresh(now.wall, self.rules.stand_down));
        let other = request.filter(|r| r.target_instance_id != *self.our_id);
        let step_down = match other {
            // The holder stands down once per request.
            Some(r) if self.holds_lock && self.honoured.as_deref() != Some(r.nonce.as_str()) => {
                self.honoured = Some(r.nonce.clone());
                Some(StepDown {
                    reason: ChangeReason::StoodDown,
                    target: Some(r.target_instance_id.clone()),
                    nonce: Some(r.nonce.clone()),
                })
            }
            _ => None,
        };
        Begin {
            other_wants_it: other.is_some(),
            step_down,
        }
    }

    /// Phase 2. The stand-down exists so that we do not re-grab the lock
    /// before someone else takes it. Once the request we stood down for is
    /// gone (its target took the lock and removed it, or it expired), the
    /// handoff is over and the acquire rules protect any new claim: end the
    /// stand-down, so we can take over from a departed successor without
    /// waiting out the timeout.
    fn look(
        &mut self,
        now: Now,
        cause: Cause,
        request: Option<&LeadRequest>,
        begin: &Begin,
    ) -> Look {
        let request = request.filter(|r| r.is_fresh(now.wall, self.rules.stand_down));
        if self
            .stood_down_for
            .as_ref()
            .is_some_and(|n| request.map(|r| &r.nonce) != Some(n))
        {
            self.stand_down_until = None;
            self.stood_down_for = None;
        }
        if self.stand_down_until.is_some() {
            return Look::Read;
        }
        Look::Acquire {
            may_take_others: !begin.other_wants_it || self.holds_lock,
            // A look prompted by an event writes only to take the lock, or
            // to confirm one just handed to us (that write restarts every
            // observer's hang timer, and our own validity, together).
            write_own: cause != Cause::Wake || !self.holds_lock,
        }
    }

    /// Phase 3, under the store's exclusion: what to write, and why.
    fn decide(
        &mut self,
        content: &LockContent,
        now: Now,
        look: Look,
        token: Option<&str>,
        probes: &dyn Probes,
    ) -> (Write, Option<TakeReason>) {
        let Look::Acquire {
            may_take_others,
            write_own,
        } = look
        else {
            return (Write::Keep, None);
        };
        self.hold_ended(content, now.mono);
        let record_epoch = content.record().and_then(|r| r.epoch);
        match self.verdict(content, now, may_take_others, write_own, probes) {
            Some(reason) => {
                let ext = match (self.rules.profile.epochs, token) {
                    (true, Some(live)) => {
                        // A record naming us keeps its epoch, and so does
                        // our child's while no later epoch was issued (we
                        // hold at ours); one our child took from someone
                        // else is a change of holder.
                        let kept = match reason {
                            TakeReason::Ours => record_epoch.or(self
                                .same_id
                                .held_epoch
                                .filter(|e| self.same_id.floor.is_some_and(|f| f.epoch <= *e))),
                            _ => None,
                        };
                        let epoch = if mutated!(ChildEpoch) && reason == TakeReason::Ours {
                            record_epoch.unwrap_or(self.epoch)
                        } else {
                            kept.unwrap_or_else(|| self.next_epoch(content))
                        };
                        Some(RecordExt { epoch, live })
                    }
                    _ => None,
                };
                let bytes = encode_record_at(&self.our_id, self.our_pid, now.wall, ext, &self.here);
                match LockContent::parse(&bytes) {
                    LockContent::Record(r) => {
                        self.rewrote_ours = reason == TakeReason::Ours
                            && self.holds_lock
                            && self.written.as_ref() == content.record();
                        self.written = Some(r.clone());
                        (Write::Put(bytes, r), Some(reason))
                    }
                    // Our own record always parses; if it did not, writing
                    // it would only confuse every reader.
                    _ => (Write::Keep, None),
                }
            }
            None => (Write::Keep, None),
        }
    }

    /// Whether [`KeyMachine::decide`] would write on `content`: the writer
    /// asks this on an unguarded read to skip the exclusion when it would
    /// only read.
    fn would_write(
        &mut self,
        content: &LockContent,
        now: Now,
        look: Look,
        probes: &dyn Probes,
    ) -> bool {
        match look {
            Look::Acquire {
                may_take_others,
                write_own,
            } => self
                .verdict(content, now, may_take_others, write_own, probes)
                .is_some(),
            Look::Read => false,
        }
    }

    /// Why we would write our record on `content`, if we would.
    fn verdict(
        &mut self,
        content: &LockContent,
        now: Now,
        may_take_others: bool,
        write_own: bool,
        probes: &dyn Probes,
    ) -> Option<TakeReason> {
        if let Some(e) = content.record().and_then(|r| r.epoch) {
            self.epoch = self.epoch.max(e);
        }
        // Extension: a file our harness child emptied is ours still, and
        // its record is written back at once (see [`same_id`]).
        if self.ours_vacated(content) && !mutated!(TakeBack) {
            return Some(TakeReason::Ours);
        }
        match self.judge(content, now, probes) {
            Takeable::Yes(TakeReason::Ours) => (write_own
                || (!mutated!(ChildRewrite) && self.childs_record(content)))
            .then_some(TakeReason::Ours),
            Takeable::Yes(reason) => may_take_others.then_some(reason),
            Takeable::No => None,
        }
    }

    /// Whether `content` may be overwritten with our record, by the rules of
    /// our mode. In extended mode this also tracks how long the record has
    /// stayed unchanged on our monotonic clock.
    fn judge(&mut self, content: &LockContent, now: Now, probes: &dyn Probes) -> Takeable {
        if !self.rules.profile.presence {
            return election::takeable(content, &self.our_id, now.wall, self.rules.stale, |p| {
                probes.pid(p)
            });
        }
        if self.vacated_by_holder(content, now.mono, probes) {
            // Only under the exclusion does the epoch mark tell a child's
            // truncation from the holder's release: look there first.
            return match self.same_id.floor {
                None => Takeable::Yes(TakeReason::Free),
                Some(_) => Takeable::No,
            };
        }
        let unchanged = self.unchanged_for(content, now.mono);
        if unchanged > self.rules.stale {
            self.hang_judged = self.seen.as_ref().map(|(_, since)| *since);
        }
        // A pid (and a presence) means something only on the host and boot
        // that wrote it (see `crate::host`).
        let origin = content
            .record()
            .map_or(Origin::HereOrUnknown, |r| r.origin(&self.here));
        let verdict = election::takeable_extended(
            content,
            &self.our_id,
            now.wall,
            self.rules.stale,
            unchanged,
            |p| match origin {
                Origin::OtherBoot => Liveness::Dead,
                Origin::OtherHost => Liveness::Alive,
                Origin::HereOrUnknown => probes.pid(p),
            },
            |t| match origin {
                Origin::OtherBoot => PeerPresence::Gone,
                Origin::OtherHost => PeerPresence::Unknown,
                Origin::HereOrUnknown => probes.presence(t),
            },
        );
        // A record judged takeable (its holder died, left or hung) needs no
        // look at its hang deadline any more: if taking it failed (ENOSPC,
        // EIO, a read-only directory), the tick retries. Without this the
        // past deadline woke the writer again at once, forever.
        if matches!(verdict, Takeable::Yes(r) if r != TakeReason::Ours) {
            self.hang_judged = self.seen.as_ref().map(|(_, since)| *since);
        }
        verdict
    }

    /// How long (our monotonic clock) the record in `content` has stayed
    /// exactly as it is now.
    fn unchanged_for(&mut self, content: &LockContent, now: Instant) -> Duration {
        match content.record() {
            Some(r) => match &self.seen {
                Some((prev, since)) if prev == r => now.saturating_duration_since(*since),
                _ => {
                    self.seen = Some((r.clone(), now));
                    Duration::ZERO
                }
            },
            None => {
                self.seen = None;
                Duration::ZERO
            }
        }
    }

    /// Extension: when the holder's record, unchanged since we saw it
    /// written, will have outlived the stale bound: the writer looks again
    /// at that moment, not at its next tick, so a hung holder is judged on
    /// time. Likewise when an empty file's hold (a record being written)
    /// will have lasted the stale bound. `None` unless we watch another
    /// live participant's record or such a hold.
    pub(crate) fn hang_deadline(&self) -> Option<Instant> {
        if !self.rules.profile.monotonic_hang || self.holds_lock || mutated!(Hang) {
            return None;
        }
        if self.same_id.vacated {
            return self.vacated_deadline();
        }
        match self.held_empty {
            Some((since, false)) => {
                return Some(since + self.rules.stale + Duration::from_millis(1))
            }
            Some((_, true)) => return None,
            None => {}
        }
        let (r, since) = self.seen.as_ref()?;
        (r.instance_id != *self.our_id && r.live.is_some() && !self.record_judged())
            .then(|| *since + self.rules.stale + Duration::from_millis(1))
    }

    /// Whether the record seen last was judged already (taken, or found
    /// takeable: gone, dead or hung), so neither its hang deadline nor its
    /// holder's death is worth a wake-up.
    fn record_judged(&self) -> bool {
        self.seen
            .as_ref()
            .is_some_and(|(_, since)| self.hang_judged == Some(*since))
    }

    /// Whether `content` is exactly the record we wrote last.
    fn wrote_last(&self, content: &Result<LockContent, String>) -> bool {
        match (content, &self.written) {
            (Ok(LockContent::Record(r)), Some(w)) => r == w,
            _ => false,
        }
    }

    /// Extension: the time the holder's record stayed unchanged proves
    /// nothing against it, so it gets a fresh stale window from `now`: we
    /// were paused ourselves (SIGSTOP, a frozen VM, a cgroup freeze, and the
    /// holder may have been paused with us), or a peer held the store's
    /// exclusion when we tried (the holder could not have written either).
    /// A holder that stays silent is still replaced, one window later.
    fn restart_hang_timer(&mut self, now: Instant) {
        if let Some((_, since)) = self.seen.as_mut() {
            *since = now;
        }
        // The same proof is missing against the holder whose child may
        // empty the file: its window to take the file back starts again too
        // (the simulator: a window starved past the holder's window found
        // the file the holder's child had just emptied and took it beside
        // the live holder).
        if !mutated!(PauseKeepsVacatedDeadline) {
            self.restart_vacated_wait(now);
        }
    }

    /// Extension: a peer held the store's exclusion for the whole lock
    /// wait. The holder could not write either, so the hang timer starts
    /// again, and again when a locked look finds the exclusion free (see
    /// [`KeyMachine::hold_ended`]).
    fn exclusion_held(&mut self, now: Instant) {
        self.held_over = self.seen.as_ref().map(|(r, _)| r.clone());
        self.restart_hang_timer(now);
    }

    /// Extension, under the store's exclusion: the hold that restarted the
    /// hang timer of this record ended at some moment since, unknown to us,
    /// and the holder could write only after it. Its window starts now:
    /// an observer whose deadline fell just after the hold ended took the
    /// lock before the holder's next try (Windows under Wine: a peer's
    /// three-window hold moved leadership at its end). A holder that stays
    /// silent is still replaced, one window later.
    fn hold_ended(&mut self, content: &LockContent, now: Instant) {
        let Some(held) = self.held_over.take() else {
            return;
        };
        let unchanged = self.seen.as_ref().is_some_and(|(r, _)| *r == held);
        if unchanged && content.record() == Some(&held) && !mutated!(TakeAsHoldEnds) {
            self.restart_hang_timer(now);
        }
    }

    /// Extension: a pause restarts the hang timer of the record seen, but
    /// only once for as long as that record stays unchanged: an observer
    /// whose every round comes late (an overloaded machine, VM steal, a
    /// CPU quota) would otherwise restart it forever and never replace a
    /// hung holder. A whole cluster paused together still keeps its
    /// leader: its first refresh after the pause changes the record.
    fn pause_noticed(&mut self, now: Instant) {
        let Some((r, _)) = self.seen.as_ref() else {
            return;
        };
        if self.pause_restarted.as_ref() != Some(r) || mutated!(PauseEveryRound) {
            self.pause_restarted = Some(r.clone());
            self.restart_hang_timer(now);
        }
    }

    /// The store's high-water mark of issued epochs (extension): a new
    /// holder's epoch is above it even when the record that carried the
    /// last one was emptied or overwritten by a writer without epochs.
    fn raise_epoch_floor(&mut self, floor: u64) {
        self.epoch = self.epoch.max(floor);
    }

    /// The epoch for a new holder: one above every epoch seen for this key.
    fn next_epoch(&mut self, content: &LockContent) -> u64 {
        let seen = content
            .record()
            .and_then(|r| r.epoch)
            .unwrap_or(0)
            .max(self.epoch);
        self.epoch = seen.saturating_add(1);
        self.epoch
    }
}

#[cfg(test)]
mod tests;
