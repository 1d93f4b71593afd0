//! One joined key, as the writer drives it: each evaluation (a local lead
//! request, a look at the lock, the machine's conclusion carried out), the
//! one step-down path, claims, and what readers and subscribers learn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::control::LeadRequest;
use crate::error::{Error, Result};
use crate::ledger::{Ledger, StateCounts};
use crate::presence::Sibling;
use crate::pubkey::AgentPubkey;
use crate::record::{LockContent, LockRecord};
use crate::work::{Displaced, WorkMachine};

use super::super::cache::{KeyCell, Published};
use super::super::global_level::Permit;
use super::super::machine::announce::{Announcement, Announcer};
use super::super::machine::{
    Cause, Conclusion, Drain, Input, KeyMachine, Look, Observed, Seen, StepDownPlan, Validity,
};
use super::super::store::LockStore;
use super::super::types::{
    ChangeReason, ClaimOutcome, ElectionStatus, GlobalStatus, HolderStatus, LeadershipChange,
    LockState,
};
use super::context::{Ctx, FileProbes};
use super::{guarded, panic_message, unix_ms};

/// One joined key.
pub(super) struct Key {
    pub(super) pubkey: AgentPubkey,
    pub(super) m: KeyMachine,
    pub(super) cell: Arc<KeyCell>,
    pub(super) store: Box<dyn LockStore>,
    pub(super) next_tick: Instant,
    /// The holder to watch, decided by the last look and not carried out
    /// yet (`Some(None)`: watch no holder).
    pub(super) watch: Option<Option<String>>,
    /// Extension: the work rules of this key (take, settle, owed).
    pub(super) work: WorkMachine,
    /// Extension: the work ledger of the epoch we hold the lock at, while
    /// it can be read (it is opened again before every take and on every
    /// wake-up).
    pub(super) ledger: Option<Ledger>,
    /// Extension: lines of ours the disk refused (a `done` whose reply
    /// was sent, a give-back) in a ledger we no longer hold: written on
    /// every wake-up until the disk takes them, whatever our leadership,
    /// or a successor answers the event again.
    pub(super) unwritten: super::unwritten::Unwritten,
    /// What was announced last (see [`Announcer`]).
    pub(super) announcer: Announcer,
    /// Whether the global level was last told that we lead our host.
    pub(super) told_global: bool,
    /// ... and whether we held the lock file then.
    pub(super) told_locked: bool,
    /// The global level's permit as set in the cell now.
    pub(super) permit: Permit,
    /// Takes the global level heard of and not yet their end: given back
    /// to it when we leave the key, whatever our ledger says (one it
    /// cannot read, or a fail-safe take it never held), or their records
    /// would keep every other host from the events while we run.
    pub(super) global_open: std::collections::BTreeSet<String>,
    /// Our host leaderships of this key, counted (see
    /// [`super::super::global_level::GlobalLevel::host_leader`]).
    pub(super) global_tenure: u64,
    /// The global level's view, when one is configured.
    pub(super) global: Option<GlobalStatus>,
    /// Extension: a step-down of ours waiting for our agent to stop
    /// before the lock moves (see [`super::drain`]), and the calls it
    /// answers then.
    pub(super) drain: Option<Drain>,
    pub(super) drain_replies: Vec<super::deferred::DrainReply>,
    /// Extension: a hand-over to another host waiting for our agent to
    /// stop before we confirm it, until this instant at the latest.
    pub(super) withdraw_at: Option<Instant>,
    /// Extension: the ledger's counts as last published.
    pub(super) work_counts: Option<StateCounts>,
    /// Extension: why our ledger lines are not durable, as last published.
    pub(super) work_degraded: Option<String>,
}

impl Key {
    /// When this key needs the loop next (see [`Writer::next_tick`](super::Writer::next_tick)).
    pub(super) fn next_wake(&self, ctx: &Ctx, now: Instant) -> Instant {
        // The coarse clock may lag the loop's by a tick of its own.
        let fenced_at = self
            .announcer
            .reported()
            .then(|| self.cell.fences_in(ctx.world.clocks()))
            .flatten()
            .map(|d| now + d + Duration::from_millis(5));
        let drained_at = self.drain.as_ref().map(|d| d.until);
        [
            self.m.hang_deadline(),
            fenced_at,
            drained_at,
            self.withdraw_at,
        ]
        .into_iter()
        .flatten()
        .fold(self.next_tick, Instant::min)
    }

    /// One evaluation (see [`Key::evaluate_once`]). A panic in it (a bug,
    /// or content no check foresaw) costs this key this look, never the
    /// election task: the other keys, the commands and the next tick go on,
    /// and the key's status says what happened. (An app built with
    /// `panic = "abort"` aborts instead, as it would anywhere.)
    pub(super) fn evaluate(&mut self, ctx: &mut Ctx, cause: Cause) {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.evaluate_once(ctx, cause)
        }));
        if let Err(panic) = run {
            let what = panic_message(&panic);
            tracing::error!(pubkey = %self.pubkey, "evaluation panicked: {what}");
            let e = format!("internal error while evaluating: {what}");
            self.m.step(Input::Error(e), ctx.world.now());
            self.publish();
        }
    }

    /// One evaluation: honour a local lead request, look at the lock, and
    /// carry out what the machine concludes.
    fn evaluate_once(&mut self, ctx: &mut Ctx, cause: Cause) {
        // Stepping down while our agent stops: nothing to look at until
        // the lock moves (`Writer::finish_drains`).
        if self.draining() {
            return;
        }
        let now = ctx.world.now();
        // Spec mode touches nothing but the lock file: claims reach the
        // holder as relay frames only.
        let request = ctx
            .rules
            .profile
            .lead_requests
            .then(|| ctx.world.read_request(&self.pubkey))
            .flatten();
        let request = request.as_ref();
        let claimant_gone =
            request.is_some_and(|r| ctx.world.probe_pid(r.pid) == crate::liveness::Liveness::Dead);
        let begun = self.m.step(
            Input::Evaluate {
                cause,
                request,
                claimant_gone,
            },
            now,
        );
        if let Some(sd) = begun.step_down() {
            tracing::info!(pubkey = %self.pubkey, target = ?sd.target, "standing down for a local claim");
            let plan = StepDownPlan {
                reason: sd.reason,
                target: sd.target,
                always: false,
                departing: false,
                nonce: sd.nonce,
            };
            if self.step_down_for(ctx, plan, None).is_none() {
                // Our agent stops first: the lock moves after.
                return;
            }
        }
        let look = self.m.step(Input::Look, ctx.world.now()).look();
        let (seen, locked_at) = self.look(ctx, look, cause);
        let (wrote, busy) = (seen.took.is_some(), seen.busy);
        let Some(c) = self.m.step(Input::Seen(seen), ctx.world.now()).conclusion() else {
            return;
        };
        tracing::debug!(pubkey = %self.pubkey, id = %ctx.our_id, ?cause, ?c, "evaluated");
        self.apply(ctx, c, locked_at);
        if busy && ctx.rules.profile.monotonic_hang {
            self.while_a_peer_holds_the_lock(ctx);
            return;
        }
        // Ticks keep their own cadence (`Writer::refresh_due`): a command's
        // look does not move the next tick, or a claimant would always wait
        // a whole interval after its claim. In extended mode an observer's
        // look (prompted by the holder's refresh) is as good as a tick, and
        // so is a write of our record: the tick waits another interval, so
        // that at rest an observer wakes once per refresh of the holder,
        // like a spec instance.
        if (ctx.rules.profile.read_first || mutated!(SpecTicks)) && (wrote || !self.m.holds_lock())
        {
            self.next_tick = ctx.world.now().mono + ctx.rules.refresh;
        }
    }

    /// Extension: a peer hangs holding the lock file's `flock`. The holder
    /// tries again soon (its write must land as soon as the hold ends, before
    /// anyone judges it hung); an observer gives the holder a fresh stale
    /// window, since it could not have written either.
    fn while_a_peer_holds_the_lock(&mut self, ctx: &Ctx) {
        let now = ctx.world.now().mono;
        if self.m.holds_lock() {
            let retry = ctx.rules.busy_retry(ctx.config.lock_wait);
            self.next_tick = self.next_tick.min(now + retry);
        } else {
            self.m.step(Input::RestartHangTimer, ctx.world.now());
        }
    }

    /// Looks at the lock as `look` says. Returns what was seen and, when we
    /// wrote, the monotonic instant taken under the exclusion before the
    /// write (our validity counts from there).
    fn look(&mut self, ctx: &mut Ctx, look: Look, cause: Cause) -> (Seen, Option<u64>) {
        if look == Look::Read {
            let seen = Seen {
                content: guarded(|| self.store.read()).map_err(|e| e.to_string()),
                took: None,
                locked: false,
                busy: false,
                error: None,
            };
            return (seen, None);
        }
        let trust_watch = cause != Cause::Tick;
        // Extension: read first. The exclusion is needed only to write; when
        // the read shows a record we would leave alone (a live holder, or
        // ours on a wake-up), the locked look would decide the same.
        if ctx.rules.profile.read_first && (cause == Cause::Wake || !self.m.holds_lock()) {
            if let Ok(content) = guarded(|| self.store.read()) {
                let probes = FileProbes::new(ctx, &self.pubkey, trust_watch);
                let peek = Input::Peek {
                    content: &content,
                    probes: &probes,
                };
                if !self.m.step(peek, ctx.world.now()).would_write() {
                    let seen = Seen {
                        content: Ok(content),
                        took: None,
                        locked: false,
                        busy: false,
                        error: self.m.last_error().map(str::to_owned),
                    };
                    return (seen, None);
                }
            }
        }
        // A record of ours names our presence, which must list this key
        // before anyone can read the record.
        ctx.flush_presence();
        let token = ctx.token_for(&self.pubkey).map(str::to_owned);
        let probes = FileProbes::new(ctx, &self.pubkey, trust_watch);
        let (mut took, mut locked_at, mut before) = (None, None, None);
        let (m, store) = (&mut self.m, &mut self.store);
        let result = guarded(|| {
            store.update(&mut |content, floor| {
                locked_at = Some(ctx.world.clocks().boot_nanos());
                let locked = Input::Locked {
                    content,
                    floor,
                    token: token.as_deref(),
                    probes: &probes,
                };
                let (w, t) = m.step(locked, ctx.world.now()).write();
                if t.is_some() {
                    before = Some((m.ledgerless(content), displaced(content)));
                }
                took = t;
                w
            })
        });
        if let Some((ledgerless, holder)) = before {
            self.work.replaced(ledgerless, holder);
        }
        match result {
            Ok(u) => (
                Seen {
                    content: Ok(u.content),
                    took,
                    locked: true,
                    busy: false,
                    error: None,
                },
                locked_at,
            ),
            Err(e) => {
                tracing::debug!(pubkey = %self.pubkey, "acquire failed: {e}");
                let seen = Seen {
                    content: guarded(|| self.store.read()).map_err(|e| e.to_string()),
                    took: None,
                    locked: false,
                    busy: matches!(e, Error::LockTimeout { .. }),
                    error: Some(e.to_string()),
                };
                (seen, None)
            }
        }
    }

    /// Carries out a conclusion: the validity, the new view (and its change
    /// event) and the status, so readers and subscribers learn it at once;
    /// then the request removal. The watches follow after the answer
    /// (`Writer::after_answer`).
    fn apply(&mut self, ctx: &mut Ctx, c: Conclusion, locked_at: Option<u64>) {
        // Our own record, exactly as we left it, refreshed: nobody else
        // led, so a lapse of our validity while we (and everyone) were
        // paused is no break to announce, and the turn in flight goes on.
        let acting_before = self.cell.is_leader_on(ctx.world.clocks()) || c.unbroken;
        match c.validity {
            Validity::Keep => {}
            Validity::Always => self.cell.never_fence(),
            Validity::Fenced => self.cell.fence(),
            Validity::Renew => self.cell.renew_from(
                locked_at.unwrap_or_else(|| ctx.world.clocks().boot_nanos()),
                ctx.rules.validity(),
            ),
        }
        let held = self.cell.set_leader(c.leader);
        self.tell_global(ctx, c.leader, false);
        // What readers see from now on: the flag, self-fencing included.
        let acting = self.cell.is_leader_on(ctx.world.clocks());
        let told =
            self.announcer
                .conclude(c.leader, acting_before, acting, held, c.reason, c.always);
        for a in told {
            self.notify(ctx, a);
        }
        // The ledger's I/O after the event: no command reaches the ledger
        // before this conclusion is carried out whole (one writer).
        self.track_work(ctx, c.leader, c.took_over);
        self.publish();
        self.watch = Some(c.watch);
        if let Some(nonce) = &c.remove_request {
            ctx.world.remove_request(&self.pubkey, nonce);
        }
    }

    /// The one step-down path (release, stand-down, leave, shutdown): stop
    /// acting as leader *before* the file changes, so that no moment exists
    /// where a successor and we both lead; then give the lock up iff the
    /// file names us (extension: straight to a live sibling, `target` when
    /// it has a presence) and report. Returns whether a record of ours was
    /// given up. `departing`: we leave the key (or shut down), so the
    /// takes of this window can no longer be settled and are given back;
    /// otherwise they stay in flight with us (a reply may be on its way)
    /// until the app's `done` or `giveBack`, or our death.
    pub(super) fn step_down(
        &mut self,
        ctx: &mut Ctx,
        reason: ChangeReason,
        target: Option<&str>,
        always: bool,
        departing: bool,
    ) -> bool {
        self.m.step(Input::StepDown, ctx.world.now());
        self.cell.set_leader(false);
        // The change happened now, whatever the writes below take.
        let stopped_at = unix_ms(ctx.world.now().wall);
        if departing || mutated!(StandDownGivesBack) {
            let mut ended = std::mem::take(&mut self.global_open);
            ended.extend(self.end_takes(ctx));
            for id in ended {
                if let Some(u) = ctx.global_level.as_mut() {
                    u.settled(self.pubkey, &id, false);
                }
            }
        }
        self.track_work(ctx, false, false);
        let heir = self.heir(ctx, target);
        let mut released = false;
        let (m, store, world) = (&mut self.m, &mut self.store, &ctx.world);
        let result = guarded(|| {
            store.update(&mut |content, floor| {
                let release = Input::Release {
                    content,
                    floor,
                    heir: heir.as_ref(),
                };
                let (w, r) = m.step(release, world.now()).release();
                released = r;
                w
            })
        });
        let result = result.map(|u| u.content).map_err(|e| {
            tracing::warn!(pubkey = %self.pubkey, "release failed: {e}");
            released = false;
            e.to_string()
        });
        if released {
            match &heir {
                Some(h) => {
                    tracing::info!(pubkey = %self.pubkey, heir = %h.instance_id, "handed the lock over")
                }
                None => tracing::info!(pubkey = %self.pubkey, "released the lock"),
            }
        }
        self.m.step(Input::Released(result), ctx.world.now());
        // A sibling of this host that took the lock from us continues the
        // global level's hold; otherwise it is given up at once.
        self.tell_global(ctx, false, !(released && heir.is_some()));
        if let Some(a) = self.announcer.step_down(reason, always) {
            self.notify_at(ctx, a, stopped_at);
        }
        self.publish();
        released
    }

    /// Extension: the live sibling to hand the lock to (`target` when it
    /// has a presence, else any other participant).
    pub(super) fn heir(&self, ctx: &Ctx, target: Option<&str>) -> Option<Sibling> {
        if !ctx.rules.profile.handoff {
            return None;
        }
        let token = ctx.token()?;
        let siblings = ctx.world.live_siblings(&self.pubkey, token);
        match target {
            Some(t) => siblings.into_iter().find(|s| s.instance_id == t),
            None => siblings.into_iter().find(|s| s.instance_id != *ctx.our_id),
        }
    }

    /// The user's claim. Extension: co-located instances learn it through
    /// the local lead request, without a relay; the holder stands down on
    /// its next look and we take the lock on ours. In spec mode only the
    /// relay frame carries it. Never evicts a live leader.
    pub(super) fn claim(&mut self, ctx: &mut Ctx) -> Result<ClaimOutcome> {
        self.m.step(Input::ClaimStarted, ctx.world.now());
        if self.m.holds_lock() {
            self.evaluate(ctx, Cause::Tick);
            if self.m.holds_lock() {
                return Ok(ClaimOutcome::AlreadyLeader);
            }
        }
        // The lock may be free already (the holder stood down first).
        self.m.step(Input::ClaimPending(None), ctx.world.now());
        self.evaluate(ctx, Cause::Tick);
        if self.m.holds_lock() {
            return Ok(ClaimOutcome::Claimed);
        }
        if !ctx.rules.profile.lead_requests {
            // The plain NIP: the holder learns of the claim from the relay's
            // `claim_leadership` frame, and we take the lock it releases on
            // a later look, until the stand-down timeout.
            return Ok(ClaimOutcome::Pending);
        }
        let now = ctx.world.now();
        let nonce = ctx.world.random();
        let req = LeadRequest::at(&ctx.our_id, now.wall, nonce, ctx.world.pid());
        ctx.world.write_request(&self.pubkey, &req)?;
        self.m.step(Input::ClaimPending(Some(req.nonce)), now);
        self.evaluate(ctx, Cause::Tick);
        Ok(if self.m.holds_lock() {
            ClaimOutcome::Claimed
        } else {
            ClaimOutcome::Pending
        })
    }

    /// Extension: a key we announced as led whose validity ran out without
    /// a successful write is announced as fenced at once, so the app's gate
    /// closes when `is_leader` turns false, not at our next tick.
    pub(super) fn announce_fencing(&mut self, ctx: &mut Ctx) {
        // A step-down waiting for our agent tells the global level when the
        // lock moves (to a sibling, the etcd key stays with the host).
        if self.draining() {
            return;
        }
        // Fenced: the global level hears that we no longer lead the host
        // (and gives the agent up), unfenced again: that we do.
        self.tell_global(ctx, self.cell.is_set_leader(), true);
        let acting = self.cell.is_leader_on(ctx.world.clocks());
        if let Some(a) = self.announcer.lapse(acting) {
            tracing::warn!(pubkey = %self.pubkey, "no successful write within the stale bound: fenced");
            self.notify(ctx, a);
            self.publish();
        }
    }

    /// Publishes an announcement the machine decided on, now.
    fn notify(&mut self, ctx: &Ctx, a: Announcement) {
        self.notify_at(ctx, a, unix_ms(ctx.world.now().wall));
    }

    /// [`Key::notify`] for a change that happened at `at_ms`.
    pub(super) fn notify_at(&mut self, ctx: &Ctx, a: Announcement, at_ms: u64) {
        let record = self.m.observed().record();
        let change = LeadershipChange {
            pubkey: self.pubkey,
            is_leader: a.is_leader,
            leader_instance_id: record.map(|r| r.instance_id.clone()),
            reason: a.reason,
            must_cancel_turn: a.must_cancel_turn,
            epoch: record.and_then(|r| r.epoch),
            at_ms,
            level: self.cell.level_on(ctx.world.clocks()),
            global_holder: self.global.as_ref().and_then(|g| g.holder.clone()),
        };
        tracing::debug!(?change, "leadership change");
        let _ = ctx.shared.events.send(change);
    }

    /// Publishes the status snapshot readers see.
    pub(super) fn publish(&self) {
        let (lock_state, record) = match self.m.observed() {
            Observed::Nothing => (LockState::Absent, None),
            Observed::Unreadable(_) => (LockState::Unreadable, None),
            Observed::Content(c) => (lock_state(c), c.record()),
        };
        let our_id = self.m.our_id();
        self.cell.publish(Published {
            status: ElectionStatus {
                pubkey: self.pubkey,
                is_leader: false,
                lock_state,
                holder: record.map(|r| holder_status(r, our_id)),
                standing_down: false,
                claim_pending: false,
                last_error: self.m.last_error().map(str::to_owned),
                level: super::super::types::Level::None,
                global: self.global.clone(),
                work: self.work_counts,
                work_degraded: self.work_degraded.clone(),
            },
            claimed_at: record.and_then(|r| r.claimed_at.instant()),
            standing_down_until: self.m.stand_down_until(),
            claim_pending_until: self.m.pending_until(),
        });
    }
}

fn lock_state(c: &LockContent) -> LockState {
    match c {
        LockContent::Absent => LockState::Absent,
        LockContent::Empty => LockState::Empty,
        LockContent::Oversized => LockState::Oversized,
        LockContent::Malformed(_) => LockState::Malformed,
        LockContent::Record(_) => LockState::Record,
    }
}

fn holder_status(r: &LockRecord, our_id: &str) -> HolderStatus {
    HolderStatus {
        instance_id: r.instance_id.clone(),
        pid: r.pid,
        claimed_at: r.claimed_at.instant().map(crate::record::format_claimed_at),
        age_ms: None,
        epoch: r.epoch,
        host: r.host.clone(),
        is_us: r.instance_id == our_id,
    }
}

/// The holder a take of ours replaces, as `content` names it (see
/// [`Displaced`]).
fn displaced(content: &LockContent) -> Displaced {
    match content.record() {
        Some(r) => Displaced::Token(r.live.clone().filter(|t| crate::presence::valid_token(t))),
        None => Displaced::Unknown,
    }
}
