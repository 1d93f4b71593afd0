//! The per-key state machine, pure: it reads no file, sleeps on nothing and
//! takes the time as an argument, so every timing rule is unit-tested with
//! an injected clock.
//!
//! One evaluation of a key (on join, on a refresh tick, or on a wake-up from
//! a file event or a holder's death) is four calls, and the writer does the
//! I/O between them:
//!
//! 1. [`KeyMachine::begin`]: expire the stand-down and our pending claim;
//!    decide whether a fresh local lead request aimed at someone else makes
//!    us stand down (once per request);
//! 2. [`KeyMachine::look`]: how to look at the lock: acquire under the
//!    store's exclusion, or only read (while standing down);
//! 3. [`KeyMachine::decide`], called by the store under its exclusion: take
//!    the lock, refresh it, or leave it alone (the NIP's acquire rules, plus
//!    the extended presence and monotonic-age rules);
//! 4. [`KeyMachine::conclude`]: the new view (leader or not, and why), the
//!    self-fencing validity, the holder to watch and the request to remove.
//!
//! Stepping down (release, stand-down, leave, shutdown) is one path with a
//! reason: [`KeyMachine::step_down`], then [`KeyMachine::decide_release`]
//! under the exclusion, then [`KeyMachine::released`].
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
use crate::host::{self, Origin};
use crate::liveness::Liveness;
use crate::presence::{PeerPresence, Sibling};
use crate::record::{encode_record, LockContent, LockRecord, RecordExt};

use super::types::ChangeReason;

/// The time, as the machine sees it: a monotonic instant for every interval
/// we measure ourselves, and the wall clock for `claimed_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Now {
    pub mono: Instant,
    pub wall: SystemTime,
}

/// The timings and the mode the rules follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// Extensions on: presence rules, monotonic hang detection, epochs,
    /// handoff and self-fencing.
    pub extended: bool,
    pub refresh: Duration,
    pub stale: Duration,
    pub stand_down: Duration,
}

impl Rules {
    /// How long a leader's view stays valid after its own last write. A
    /// little under the stale bound: observers replace a hung holder only
    /// after the bound, measured from when they saw its last write, so the
    /// leader fences itself before anyone may take over, whatever the coarse
    /// clock's granularity.
    pub(crate) fn validity(&self) -> Duration {
        let margin = Duration::from_millis(50).min((self.stale.saturating_sub(self.refresh)) / 2);
        self.stale.saturating_sub(margin)
    }
}

/// What started an evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// Our outstanding claim.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PendingClaim {
    until: Instant,
    /// The nonce of our local lead request, once written.
    nonce: Option<String>,
}

/// What the last look saw.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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

/// A step-down that `begin` decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepDown {
    pub reason: ChangeReason,
    /// The instance the lock should go to, when one asked for it.
    pub target: Option<String>,
    /// The local lead request this step-down serves, if any.
    pub nonce: Option<String>,
}

/// The outcome of [`KeyMachine::begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Begin {
    /// A fresh local lead request names another instance.
    pub other_wants_it: bool,
    /// Stand down for it first.
    pub step_down: Option<StepDown>,
}

/// How to look at the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Read-decide-write under the store's exclusion.
    Acquire {
        /// We may take a free or abandoned lock that is not ours (no other
        /// instance's lead request stands in the way).
        may_take_others: bool,
        /// We may rewrite our own record (a refresh). False for wake-ups.
        write_own: bool,
    },
    /// Only read (we are standing down).
    Read,
}

/// What the store did under its exclusion, for `decide`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// Leave the file as it is.
    Keep,
    /// Replace the content with these bytes.
    Put(Vec<u8>),
    /// Truncate to zero bytes (the NIP's release).
    Clear,
}

/// What a look found, for `conclude`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The content after the look, or why it could not be read.
    pub content: Result<LockContent, String>,
    /// Why we wrote our record, if we did.
    pub took: Option<TakeReason>,
    /// Whether the locked look succeeded (a failed one fell back to a read).
    pub locked: bool,
    /// The locked look failed because a peer held the store's exclusion
    /// for the whole lock wait: nobody else can have written meanwhile.
    pub busy: bool,
    /// The error of a failed locked look.
    pub error: Option<String>,
}

/// How the self-fencing deadline changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Validity {
    /// Unchanged.
    Keep,
    /// Never fenced (spec mode, or a fail-safe leader holding no lock).
    Always,
    /// Valid for [`Rules::validity`] from the moment of our write.
    Renew,
    /// Fenced until our next write: we hold a record we did not write
    /// ourselves (handed to us) and could not confirm it.
    Fenced,
}

/// The outcome of an evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conclusion {
    pub leader: bool,
    pub reason: ChangeReason,
    /// Report even if `leader` did not change (first look, completed claim).
    pub always: bool,
    pub validity: Validity,
    /// Extension: the presence token of the holder to watch for its death.
    pub watch: Option<String>,
    /// Our local lead request to remove, now that it is done.
    pub remove_request: Option<String>,
}

/// One key's election state, owned by the writer.
#[derive(Debug)]
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
    /// Extension: the `seen` instant whose hang was judged already (taken,
    /// or left alone by the other rules), so its deadline is not due again.
    hang_judged: Option<Instant>,
    /// Highest fencing epoch seen for this key.
    epoch: u64,
    observed: Observed,
    last_error: Option<String>,
    /// `holds_lock` when the current evaluation began.
    held_before: bool,
}

impl KeyMachine {
    pub(crate) fn new(rules: Rules, our_id: Arc<str>, our_pid: u32) -> Self {
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
            hang_judged: None,
            epoch: 0,
            observed: Observed::Nothing,
            last_error: None,
            held_before: false,
        }
    }

    pub(crate) fn holds_lock(&self) -> bool {
        self.holds_lock
    }
    pub(crate) fn observed(&self) -> &Observed {
        &self.observed
    }
    /// Records an error for the status, until the next look replaces it.
    pub(crate) fn note_error(&mut self, e: String) {
        self.last_error = Some(e);
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
    pub(crate) fn begin(&mut self, now: Now, request: Option<&LeadRequest>) -> Begin {
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
    pub(crate) fn look(
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
    pub(crate) fn decide(
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
        let record_epoch = content.record().and_then(|r| r.epoch);
        match self.verdict(content, now, may_take_others, write_own, probes) {
            Some(reason) => {
                let ext = match (self.rules.extended, token) {
                    (true, Some(live)) => {
                        let epoch = if reason == TakeReason::Ours {
                            record_epoch.unwrap_or(self.epoch)
                        } else {
                            self.next_epoch(content)
                        };
                        Some(RecordExt { epoch, live })
                    }
                    _ => None,
                };
                let bytes = encode_record(&self.our_id, self.our_pid, now.wall, ext);
                self.written = LockContent::parse(&bytes).record().cloned();
                (Write::Put(bytes), Some(reason))
            }
            None => (Write::Keep, None),
        }
    }

    /// Whether [`KeyMachine::decide`] would write on `content`: the writer
    /// asks this on an unguarded read to skip the exclusion when it would
    /// only read.
    pub(crate) fn would_write(
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
        match self.judge(content, now, probes) {
            Takeable::Yes(TakeReason::Ours) => write_own.then_some(TakeReason::Ours),
            Takeable::Yes(reason) => may_take_others.then_some(reason),
            Takeable::No => None,
        }
    }

    /// Whether `content` may be overwritten with our record, by the rules of
    /// our mode. In extended mode this also tracks how long the record has
    /// stayed unchanged on our monotonic clock.
    fn judge(&mut self, content: &LockContent, now: Now, probes: &dyn Probes) -> Takeable {
        if !self.rules.extended {
            return election::takeable(content, &self.our_id, now.wall, self.rules.stale, |p| {
                probes.pid(p)
            });
        }
        let unchanged = self.unchanged_for(content, now.mono);
        if unchanged > self.rules.stale {
            self.hang_judged = self.seen.as_ref().map(|(_, since)| *since);
        }
        // A pid (and a presence) means something only on the host and boot
        // that wrote it (see `crate::host`).
        let origin = content
            .record()
            .map_or(Origin::HereOrUnknown, |r| host::origin(r, host::here()));
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
    /// time. `None` unless we watch another live participant's record.
    pub(crate) fn hang_deadline(&self) -> Option<Instant> {
        if !self.rules.extended || self.holds_lock {
            return None;
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
    pub(crate) fn restart_hang_timer(&mut self, now: Instant) {
        if let Some((_, since)) = self.seen.as_mut() {
            *since = now;
        }
    }

    /// The store's high-water mark of issued epochs (extension): a new
    /// holder's epoch is above it even when the record that carried the
    /// last one was emptied or overwritten by a writer without epochs.
    pub(crate) fn raise_epoch_floor(&mut self, floor: u64) {
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

    /// Phase 4: the new view from what the look saw.
    pub(crate) fn conclude(
        &mut self,
        cause: Cause,
        begin: &Begin,
        look: Look,
        seen: Seen,
    ) -> Conclusion {
        let Seen {
            content,
            took,
            locked,
            busy,
            error,
        } = seen;
        match look {
            Look::Acquire { .. } => self.last_error = error,
            Look::Read => {
                // Another holder, or a holder that handed the lock to us:
                // the handoff is over either way.
                if matches!(&content, Ok(LockContent::Record(_))) {
                    self.stand_down_until = None;
                    self.stood_down_for = None;
                }
            }
        }
        self.holds_lock =
            matches!(&content, Ok(LockContent::Record(r)) if r.instance_id == *self.our_id);
        let validity = if !self.rules.extended {
            Validity::Always
        } else if !self.holds_lock {
            // Leading without holding the lock can only be the NIP's
            // fail-safe (absent, unreadable or malformed file): a MUST that
            // self-fencing never overrides. Fencing applies to holders.
            Validity::Always
        } else if locked && took.is_some() {
            // Validity counts from our own last write: observers time a hang
            // from the last change they saw, which is never earlier than
            // that write, so we are fenced before any of them may take over.
            // A read that finds our record unchanged proves nothing to them.
            Validity::Renew
        } else if busy && self.held_before && self.wrote_last(&content) {
            // A peer hangs holding the store's exclusion, and the record is
            // still exactly the one we wrote: nobody can have written since
            // (every writer needs the exclusion), and observers that try
            // give us a fresh stale window ([`KeyMachine::restart_hang_timer`]). Going
            // silent would be the one thing the NIP ranks below a
            // duplicate, so we keep leading (README, "a peer hanging on the
            // file lock").
            Validity::Renew
        } else if !self.held_before {
            // A record naming us that we did not write (a handoff) and
            // could not confirm (the exclusive lock timed out): nobody has
            // seen a write of ours, so nothing bounds it yet.
            Validity::Fenced
        } else {
            Validity::Keep
        };
        // A holder already judged gone or hung is not watched: its death
        // can tell us nothing more, and a watch of a process that is gone
        // fires at once (a take that failed would look again, forever).
        let judged = self.record_judged();
        let watch = match &content {
            Ok(c) if self.rules.extended && !judged => c
                .record()
                .filter(|r| r.instance_id != *self.our_id)
                .filter(|r| host::origin(r, host::here()) == Origin::HereOrUnknown)
                .and_then(|r| r.live.clone()),
            _ => None,
        };
        // While another instance's claim is pending and we do not hold the
        // lock, an emptied file means a handoff in progress, not "no
        // coordination": the fail-safe does not make us a leader then.
        let leader = self.stand_down_until.is_none()
            && (self.holds_lock || !begin.other_wants_it)
            && election::reads_as_leader(content.as_ref(), &self.our_id);
        self.observed = match content {
            Ok(c) => Observed::Content(c),
            Err(e) => Observed::Unreadable(e),
        };
        let claim_done = self.holds_lock && self.pending.is_some();
        let remove_request = if claim_done {
            self.pending.take().and_then(|p| p.nonce)
        } else {
            None
        };
        let reason = if claim_done {
            ChangeReason::Claimed
        } else if leader {
            match took {
                Some(r) if r.is_takeover() => ChangeReason::Failover,
                // A record naming us that we did not write: handed to us.
                Some(TakeReason::Ours) if !self.held_before && cause != Cause::Join => {
                    ChangeReason::HandedOver
                }
                Some(_) => ChangeReason::Acquired,
                None if self.holds_lock && !self.held_before => ChangeReason::HandedOver,
                None if self.holds_lock => ChangeReason::Acquired,
                None => ChangeReason::FailSafe,
            }
        } else if cause == Cause::Join {
            ChangeReason::Observer
        } else {
            ChangeReason::Lost
        };
        Conclusion {
            leader,
            reason,
            always: cause == Cause::Join || claim_done,
            validity,
            watch,
            remove_request,
        }
    }

    /// Starts the one step-down path: stop leading now (the writer clears
    /// the flag before it touches the file, so no moment exists where a
    /// successor and we both lead) and suppress acquiring until the
    /// stand-down timeout.
    pub(crate) fn step_down(&mut self, now: Now) {
        self.stand_down_until = Some(now.mono + self.rules.stand_down);
        self.stood_down_for = None;
        self.pending = None;
    }

    /// Records which local lead request the current stand-down serves.
    pub(crate) fn serve_request(&mut self, nonce: Option<String>) {
        self.stood_down_for = nonce;
    }

    /// Under the store's exclusion: give the lock up iff the file names us.
    /// Extension: to `heir` (a live sibling) with the next epoch, so the
    /// file is never empty while a sibling lives; otherwise truncate as the
    /// NIP says. Returns what to write and whether a record of ours was
    /// given up.
    pub(crate) fn decide_release(
        &mut self,
        content: &LockContent,
        now: Now,
        heir: Option<&Sibling>,
    ) -> (Write, bool) {
        let ours = content
            .record()
            .is_some_and(|r| r.instance_id == *self.our_id);
        if !ours {
            return (Write::Keep, false);
        }
        match heir {
            Some(h) => {
                let epoch = self.next_epoch(content);
                let bytes = encode_record(
                    &h.instance_id,
                    h.pid,
                    now.wall,
                    Some(RecordExt {
                        epoch,
                        live: &h.token,
                    }),
                );
                (Write::Put(bytes), true)
            }
            None => (Write::Clear, true),
        }
    }

    /// Ends the step-down path with what the store holds now.
    pub(crate) fn released(&mut self, result: Result<LockContent, String>) {
        self.holds_lock = false;
        match result {
            Ok(c) => self.observed = Observed::Content(c),
            Err(e) => self.last_error = Some(e),
        }
    }

    /// The user's claim, first step: it ends any stand-down of ours.
    pub(crate) fn claim_started(&mut self) {
        self.stand_down_until = None;
    }

    /// The user's claim: from now on, acquiring completes it (reported as
    /// [`ChangeReason::Claimed`]) until the stand-down timeout.
    pub(crate) fn claim_pending_from(&mut self, now: Now, nonce: Option<String>) {
        let until = match &self.pending {
            Some(p) if p.nonce.is_none() => p.until,
            _ => now.mono + self.rules.stand_down,
        };
        self.pending = Some(PendingClaim { until, nonce });
    }

    /// `resume()`: ends a stand-down.
    pub(crate) fn resume(&mut self) {
        self.stand_down_until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ClaimedAt;

    const STALE: Duration = Duration::from_secs(10);

    fn rules(extended: bool) -> Rules {
        Rules {
            extended,
            refresh: Duration::from_secs(5),
            stale: STALE,
            stand_down: Duration::from_secs(10),
        }
    }

    struct Fixed(Liveness, PeerPresence);
    impl Probes for Fixed {
        fn pid(&self, _: u32) -> Liveness {
            self.0
        }
        fn presence(&self, _: &str) -> PeerPresence {
            self.1
        }
    }
    const ALIVE: Fixed = Fixed(Liveness::Alive, PeerPresence::Alive);

    /// A clock the tests move by hand.
    struct Clock {
        base: Instant,
        wall0: SystemTime,
        at: Duration,
    }
    impl Clock {
        fn new() -> Self {
            Self {
                base: Instant::now(),
                wall0: SystemTime::now(),
                at: Duration::ZERO,
            }
        }
        fn now(&self) -> Now {
            Now {
                mono: self.base + self.at,
                wall: self.wall0 + self.at,
            }
        }
        fn advance(&mut self, d: Duration) {
            self.at += d;
        }
    }

    fn machine(extended: bool, id: &str) -> KeyMachine {
        KeyMachine::new(rules(extended), Arc::from(id), 42)
    }

    fn other(wall: SystemTime, live: Option<&str>) -> LockContent {
        LockContent::Record(LockRecord {
            instance_id: "other".into(),
            pid: 7,
            claimed_at: ClaimedAt::At(wall),
            epoch: live.map(|_| 3),
            live: live.map(str::to_owned),
            host: None,
            boot: None,
        })
    }

    /// One whole evaluation against an in-memory file, as the writer runs
    /// it (without a step-down).
    fn evaluate(
        m: &mut KeyMachine,
        file: &mut LockContent,
        now: Now,
        cause: Cause,
        request: Option<&LeadRequest>,
        probes: &dyn Probes,
    ) -> Conclusion {
        let begin = m.begin(now, request);
        assert!(begin.step_down.is_none(), "this helper does not step down");
        let look = m.look(now, cause, request, &begin);
        let (write, took) = m.decide(file, now, look, Some("42-0123456789abcdef"), probes);
        match write {
            Write::Put(b) => *file = LockContent::parse(&b),
            Write::Clear => *file = LockContent::Empty,
            Write::Keep => {}
        }
        let seen = Seen {
            content: Ok(file.clone()),
            took,
            locked: look != Look::Read,
            busy: false,
            error: None,
        };
        m.conclude(cause, &begin, look, seen)
    }

    #[test]
    fn free_lock_is_acquired_and_reported_on_join() {
        let c = Clock::new();
        let mut m = machine(false, "me");
        let mut f = LockContent::Absent;
        let out = evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        assert!(out.leader && out.always);
        assert_eq!(out.reason, ChangeReason::Acquired);
        assert_eq!(out.validity, Validity::Always, "spec mode never fences");
        assert_eq!(f.record().unwrap().instance_id, "me");
        assert_eq!(
            f.record().unwrap().epoch,
            None,
            "spec records: NIP fields only"
        );
    }

    #[test]
    fn live_holder_makes_an_observer_and_a_dead_one_a_failover() {
        let c = Clock::new();
        let mut m = machine(false, "me");
        let mut f = other(c.now().wall, None);
        let out = evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        assert_eq!((out.leader, out.reason), (false, ChangeReason::Observer));
        let dead = Fixed(Liveness::Dead, PeerPresence::Unknown);
        let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &dead);
        assert_eq!((out.leader, out.reason), (true, ChangeReason::Failover));
    }

    #[test]
    fn extended_hang_is_judged_by_our_monotonic_clock_only() {
        let mut c = Clock::new();
        let mut m = machine(true, "me");
        // An hour-old claimed_at (the machine slept) from a live holder.
        let mut f = other(
            c.now().wall - Duration::from_secs(3600),
            Some("7-0123456789abcdef"),
        );
        let out = evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        assert!(!out.leader, "a slept but live holder is not evicted");
        assert_eq!(out.watch.as_deref(), Some("7-0123456789abcdef"));
        c.advance(STALE - Duration::from_millis(1));
        assert!(!evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE).leader);
        c.advance(Duration::from_millis(2));
        let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE);
        assert_eq!((out.leader, out.reason), (true, ChangeReason::Failover));
        assert_eq!(out.validity, Validity::Renew);
        assert_eq!(f.record().unwrap().epoch, Some(4), "one above the holder's");
    }

    /// A locked look that timed out because a peer held the exclusion.
    fn busy_look(m: &mut KeyMachine, file: &LockContent, now: Now) -> Conclusion {
        let begin = m.begin(now, None);
        let look = m.look(now, Cause::Tick, None, &begin);
        let seen = Seen {
            content: Ok(file.clone()),
            took: None,
            locked: false,
            busy: true,
            error: Some("exclusive lock not obtained".into()),
        };
        m.conclude(Cause::Tick, &begin, look, seen)
    }

    #[test]
    fn a_holder_whose_record_stands_renews_while_a_peer_holds_the_exclusion() {
        let mut c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = LockContent::Absent;
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        c.advance(STALE);
        let out = busy_look(&mut m, &f, c.now());
        assert!(out.leader);
        assert_eq!(out.validity, Validity::Renew, "nobody can have written");
        // Our record with another claimed_at is not the one we wrote: a
        // timed-out look proves nothing then.
        let mut changed = f.record().unwrap().clone();
        changed.claimed_at = ClaimedAt::At(c.now().wall);
        let out = busy_look(&mut m, &LockContent::Record(changed), c.now());
        assert_eq!(out.validity, Validity::Keep);
    }

    #[test]
    fn an_observer_that_finds_the_exclusion_held_gives_the_holder_a_fresh_window() {
        let mut c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        let first = m.hang_deadline().unwrap();
        c.advance(STALE - Duration::from_millis(100));
        busy_look(&mut m, &f, c.now());
        m.restart_hang_timer(c.now().mono);
        assert_eq!(
            m.hang_deadline().unwrap(),
            first + STALE - Duration::from_millis(100)
        );
        c.advance(Duration::from_millis(200));
        assert!(
            !evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE).leader,
            "judged hung for time it could not have written in"
        );
    }

    #[test]
    fn a_takeover_that_could_not_be_written_leaves_no_hang_deadline_behind() {
        // Found by the simulator: the holder died while the directory was
        // full; our takeover failed, and the past hang deadline woke the
        // writer again at once, forever.
        let mut c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        c.advance(STALE * 2);
        let gone = Fixed(Liveness::Dead, PeerPresence::Gone);
        let begin = m.begin(c.now(), None);
        let look = m.look(c.now(), Cause::Wake, None, &begin);
        let (w, took) = m.decide(&f, c.now(), look, Some("42-0123456789abcdef"), &gone);
        assert!(
            matches!(w, Write::Put(_)) && took.is_some(),
            "it would take over"
        );
        let seen = Seen {
            content: Ok(f.clone()),
            took: None,
            locked: false,
            busy: false,
            error: Some("ENOSPC".into()),
        };
        let out = m.conclude(Cause::Wake, &begin, look, seen);
        assert!(!out.leader);
        assert_eq!(
            m.hang_deadline(),
            None,
            "the tick retries, not a past deadline"
        );
        assert_eq!(out.watch, None, "a gone holder is not watched again");
    }

    #[test]
    fn a_changed_record_restarts_the_hang_timer() {
        let mut c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        c.advance(STALE / 2 + Duration::from_secs(1));
        f = other(c.now().wall, Some("7-0123456789abcdef")); // a refresh
        assert!(!evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE).leader);
        c.advance(STALE / 2 + Duration::from_secs(1));
        assert!(
            !evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE).leader,
            "only {:?} since the last change",
            STALE / 2 + Duration::from_secs(1)
        );
    }

    #[test]
    fn wake_ups_never_rewrite_our_own_record() {
        let mut c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = LockContent::Absent;
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        let before = f.clone();
        c.advance(Duration::from_secs(1));
        let out = evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE);
        assert_eq!(f, before);
        assert_eq!(out.validity, Validity::Keep);
        let out = evaluate(&mut m, &mut f, c.now(), Cause::Tick, None, &ALIVE);
        assert_ne!(f, before, "a tick refreshes claimed_at");
        assert_eq!(out.validity, Validity::Renew);
    }

    #[test]
    fn holder_stands_down_once_per_request_and_bystanders_do_not_take_the_free_lock() {
        let c = Clock::new();
        let mut holder = machine(true, "me");
        let mut f = LockContent::Absent;
        evaluate(&mut holder, &mut f, c.now(), Cause::Join, None, &ALIVE);
        let req = LeadRequest::new("target");
        let b = holder.begin(c.now(), Some(&req));
        let sd = b.step_down.clone().expect("the holder stands down");
        assert_eq!(
            (sd.reason, sd.target.as_deref()),
            (ChangeReason::StoodDown, Some("target"))
        );
        holder.step_down(c.now());
        holder.serve_request(sd.nonce);
        let (w, released) = holder.decide_release(&f, c.now(), None);
        assert!(released && w == Write::Clear);
        holder.released(Ok(LockContent::Empty));
        f = LockContent::Empty;
        assert_eq!(
            holder.look(c.now(), Cause::Tick, Some(&req), &b),
            Look::Read
        );
        // The same request never makes it stand down twice.
        assert!(holder.begin(c.now(), Some(&req)).step_down.is_none());
        // A bystander neither takes the released lock nor fail-safe-leads.
        let mut by = machine(true, "bystander");
        let out = evaluate(&mut by, &mut f, c.now(), Cause::Tick, Some(&req), &ALIVE);
        assert!(!out.leader);
        assert_eq!(f, LockContent::Empty);
        // The target takes it and completes its claim.
        let mut t = machine(true, "target");
        t.claim_pending_from(c.now(), Some(req.nonce.clone()));
        let out = evaluate(&mut t, &mut f, c.now(), Cause::Tick, Some(&req), &ALIVE);
        assert_eq!((out.leader, out.reason), (true, ChangeReason::Claimed));
        assert_eq!(out.remove_request.as_deref(), Some(req.nonce.as_str()));
    }

    #[test]
    fn stand_down_and_pending_claims_expire_on_the_injected_clock() {
        let mut c = Clock::new();
        let mut m = machine(false, "me");
        m.step_down(c.now());
        m.claim_pending_from(c.now(), None);
        let until = c.now().mono + Duration::from_secs(10);
        assert_eq!(m.stand_down_until(), Some(until));
        assert_eq!(m.pending_until(), Some(until));
        c.advance(Duration::from_secs(10) - Duration::from_millis(1));
        m.begin(c.now(), None);
        assert_eq!(m.stand_down_until(), Some(until), "not yet");
        c.advance(Duration::from_millis(1));
        m.begin(c.now(), None);
        assert_eq!((m.stand_down_until(), m.pending_until()), (None, None));
    }

    #[test]
    fn stale_requests_are_ignored() {
        let mut c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = LockContent::Absent;
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        let req = LeadRequest::new("target");
        c.advance(Duration::from_secs(11));
        // The request was made at the real now; our clock is 11 s later.
        let b = m.begin(c.now(), Some(&req));
        assert!(b.step_down.is_none() && !b.other_wants_it);
    }

    #[test]
    fn release_hands_over_to_a_live_heir_with_the_next_epoch() {
        let c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = LockContent::Absent;
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        let e = f.record().unwrap().epoch.unwrap();
        let heir = Sibling {
            token: "9-0123456789abcdef".into(),
            instance_id: "heir".into(),
            pid: 9,
        };
        m.step_down(c.now());
        let (w, released) = m.decide_release(&f, c.now(), Some(&heir));
        assert!(released);
        let Write::Put(b) = w else { panic!("{w:?}") };
        let r = LockContent::parse(&b).record().cloned().unwrap();
        assert_eq!(
            (r.instance_id.as_str(), r.epoch, r.live.as_deref()),
            ("heir", Some(e + 1), Some("9-0123456789abcdef"))
        );
        // Never a successor's record.
        let theirs = other(c.now().wall, None);
        assert_eq!(
            m.decide_release(&theirs, c.now(), None),
            (Write::Keep, false)
        );
    }

    #[test]
    fn a_handed_over_record_we_could_not_confirm_is_fenced() {
        let c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        // The holder handed the lock to us; our confirming write timed out
        // and the fallback read shows our record.
        let ours = LockContent::parse(&encode_record(
            "me",
            42,
            c.now().wall,
            Some(RecordExt {
                epoch: 4,
                live: "42-0123456789abcdef",
            }),
        ));
        let begin = m.begin(c.now(), None);
        let look = m.look(c.now(), Cause::Wake, None, &begin);
        let seen = Seen {
            content: Ok(ours),
            took: None,
            locked: false,
            busy: false,
            error: Some("exclusive lock not obtained".into()),
        };
        let out = m.conclude(Cause::Wake, &begin, look, seen);
        assert!(out.leader);
        assert_eq!(out.validity, Validity::Fenced);
    }

    #[test]
    fn unreadable_file_fails_safe_to_leader_without_fencing() {
        let c = Clock::new();
        let mut m = machine(true, "me");
        let begin = m.begin(c.now(), None);
        let look = m.look(c.now(), Cause::Join, None, &begin);
        let seen = Seen {
            content: Err("permission denied".into()),
            took: None,
            locked: false,
            busy: false,
            error: Some("permission denied".into()),
        };
        let out = m.conclude(Cause::Join, &begin, look, seen);
        assert_eq!((out.leader, out.reason), (true, ChangeReason::FailSafe));
        assert_eq!(out.validity, Validity::Always);
        assert_eq!(m.last_error(), Some("permission denied"));
    }

    #[test]
    fn a_record_handed_to_us_is_confirmed_by_a_write_on_the_next_look() {
        let mut c = Clock::new();
        let mut m = machine(true, "me");
        let mut f = other(c.now().wall, Some("7-0123456789abcdef"));
        evaluate(&mut m, &mut f, c.now(), Cause::Join, None, &ALIVE);
        // The holder wrote our record (a handoff); a wake-up looks.
        f = LockContent::parse(&encode_record(
            "me",
            42,
            c.now().wall,
            Some(RecordExt {
                epoch: 4,
                live: "42-0123456789abcdef",
            }),
        ));
        let before = f.clone();
        c.advance(Duration::from_millis(5));
        let out = evaluate(&mut m, &mut f, c.now(), Cause::Wake, None, &ALIVE);
        assert_eq!((out.leader, out.reason), (true, ChangeReason::HandedOver));
        assert_ne!(f, before, "confirmed by our own write");
        assert_eq!(out.validity, Validity::Renew);
        assert_eq!(
            f.record().unwrap().epoch,
            Some(4),
            "the handed-over epoch stays"
        );
    }
}
