//! The writer's part of the work ledger (see [`crate::ledger`]): the
//! ledger follows the epoch we hold the lock at, and every operation is
//! answered from it.

use crate::error::Error;
use crate::ledger::{self, Ledger, Op, Verdict};
use crate::presence::PeerPresence;

use super::super::machine::{Input, Probes};
use super::super::types::{QueuedEvent, TakeOutcome};
use super::context::{Ctx, FileProbes};
use super::key::{Key, WorkState};
use super::unwritten::{append, taken_by, Settle, Unwritten};
use super::{unix_ms, WorkOp, WorkReply};

impl Key {
    /// Keeps the leadership start and the work ledger in step with the
    /// view: the ledger is (re)loaded whenever we lead at a new epoch, and
    /// forgotten when we stop leading.
    pub(super) fn track_work(&mut self, ctx: &Ctx, leader: bool, takeover: bool) {
        if !leader {
            self.leader_since = None;
            self.global_since = None;
            self.ledgerless_since = None;
            self.drop_work();
            self.replaced_ledgerless = None;
            return;
        }
        self.leader_since
            .get_or_insert_with(|| unix_ms(ctx.world.now().wall));
        // The epoch we hold at, through a same-id child's record too: a
        // child's rewrite is not a change of holder and costs no ledger.
        let epoch = self.m.held_epoch().filter(|_| ctx.rules.profile.ledger);
        let Some(epoch) = epoch else {
            self.drop_work();
            let now_ms = unix_ms(ctx.world.now().wall);
            self.ledgerless_since.get_or_insert(now_ms);
            return;
        };
        self.ledgerless_since = None;
        if self.work.as_ref().is_some_and(|w| w.epoch == epoch) {
            return;
        }
        // The ledger of the epoch we held before (a lead regained at a new
        // epoch) may keep lines the disk refused: kept, not dropped (the
        // simulator: a give-back lost so, its event never answered).
        self.drop_work();
        let now_ms = unix_ms(ctx.world.now().wall);
        let storage = ctx.world.ledger(&self.pubkey);
        let mut ledger = match Ledger::open(storage, now_ms, ctx.config.work_retention) {
            Ok(l) => {
                self.note_ledger_epoch(ctx, &l);
                Some(self.unwritten.carried_into(l))
            }
            Err(e) => {
                tracing::warn!(pubkey = %self.pubkey, "dispatching without the work ledger: {e}");
                None
            }
        };
        // A predecessor's record without an epoch is a writer without a
        // ledger, unless it is the harness child of a window that keeps
        // one: a `held` line names it (see `ledger`), or it takes part in
        // this key with a presence now.
        let ledgerless_before = self.replaced_ledgerless.take().is_some_and(|by| {
            ledger.as_ref().is_none_or(|l| !l.index.kept_by(&by))
                && !ctx.token().is_some_and(|t| {
                    (ctx.world.live_siblings(&self.pubkey, t).iter()).any(|s| s.instance_id == by)
                })
        });
        if let Some(l) = ledger.as_mut() {
            held(l, &self.pubkey, epoch, &ctx.our_id, now_ms);
        }
        self.work = Some(WorkState {
            epoch,
            ledgerless_before,
            ledger,
            unreadable_since: now_ms,
            refusing: false,
            after_takeover: takeover,
        });
    }

    /// Opens the ledger of the epoch we hold again, if it could not be
    /// read so far.
    fn reopen_ledger(&mut self, ctx: &Ctx, now_ms: u64) {
        if self.work.as_ref().is_none_or(|w| w.ledger.is_some()) {
            return;
        }
        let storage = ctx.world.ledger(&self.pubkey);
        if let Ok(l) = Ledger::open(storage, now_ms, ctx.config.work_retention) {
            let mut l = self.unwritten.carried_into(l);
            if let Some(w) = self.work.as_mut() {
                held(&mut l, &self.pubkey, w.epoch, &ctx.our_id, now_ms);
                w.ledger = Some(l);
            }
            tracing::info!(pubkey = %self.pubkey, "the work ledger can be read again");
        }
    }

    /// Forgets the ledger of the epoch we held, keeping the lines of ours
    /// the disk refused (see [`Key::unwritten`]).
    fn drop_work(&mut self) {
        if let Some(l) = self.work.take().and_then(|w| w.ledger) {
            self.unwritten.keep(l);
        }
    }

    /// What the disk refused of ours, taken out of a key we leave.
    pub(super) fn take_unwritten(&mut self) -> Unwritten {
        self.drop_work();
        std::mem::take(&mut self.unwritten)
    }

    /// Writes what the disk refused of ours before, if it takes it now.
    pub(super) fn retry_unwritten(&mut self, ctx: &Ctx) {
        retry(&mut self.unwritten, ctx, &self.pubkey);
    }

    /// Extension: we take part in this key's election and keep its ledger
    /// (a `held` line at epoch 0): a record without an epoch naming our id
    /// is our harness child's, and whoever replaces it knows that the
    /// ledger covers it, even if we never held the lock and are gone by
    /// then. The ledger's highest epoch raises our epoch floor before our
    /// first look (see [`Input::LedgerEpoch`]).
    pub(super) fn note_member(&mut self, ctx: &Ctx) {
        if !ctx.rules.profile.ledger {
            return;
        }
        let now_ms = unix_ms(ctx.world.now().wall);
        let op = Op::Held {
            epoch: 0,
            by: ctx.our_id.to_string(),
            at_ms: now_ms,
        };
        // Not worth a sync: a lost line only costs a fallback later.
        let written = match Ledger::open(
            ctx.world.ledger(&self.pubkey),
            now_ms,
            ctx.config.work_retention,
        ) {
            Ok(mut l) => {
                self.note_ledger_epoch(ctx, &l);
                l.append(&op)
            }
            Err(_) => ctx.world.ledger(&self.pubkey).append(&op.to_line(), false),
        };
        if let Err(e) = written {
            tracing::warn!(pubkey = %self.pubkey, "cannot note us in the work ledger: {e}");
        }
    }

    /// Every epoch `l` shows was issued: ours come above them.
    fn note_ledger_epoch(&mut self, ctx: &Ctx, l: &Ledger) {
        let e = l.index.max_epoch();
        // A hostile line near `u64::MAX` would leave no epoch to issue.
        if e > 0 && e < u64::MAX / 2 {
            self.m.step(Input::LedgerEpoch(e), ctx.world.now());
        }
    }

    /// Leaving the key (or shutting down) ends every turn this window took
    /// at its epoch: they are given back, owed again at once to whoever
    /// leads next, since no `done` or `giveBack` of ours can reach the
    /// ledger any more. A release that fails (a peer holds the `flock`)
    /// leaves our record, and a window that joins again under the same id
    /// continues at the same epoch, where those takes would still read as
    /// "taken now" (found by the simulator: the mention was never
    /// answered). A release or a stand-down keeps them in flight instead
    /// (see [`Key::step_down`]).
    /// Returns the events given back.
    pub(super) fn end_takes(&mut self, ctx: &Ctx) -> Vec<String> {
        self.retry_unwritten(ctx);
        let now_ms = unix_ms(ctx.world.now().wall);
        let Some(w) = self.work.as_mut() else {
            return Vec::new();
        };
        let Some(l) = w.ledger.as_mut() else {
            return Vec::new();
        };
        let ids = l.index.taken_at(w.epoch);
        for id in &ids {
            let op = Op::GiveBack {
                id: id.clone(),
                epoch: w.epoch,
                at_ms: now_ms,
            };
            if let Err(e) = l.append(&op) {
                tracing::warn!(pubkey = %self.pubkey, "cannot give a take back: {e}");
            }
        }
        ids
    }

    /// Writes the lines the disk refused before, and rewrites a ledger
    /// that has grown to twice its live entries.
    pub(super) fn compact_ledger(&mut self, ctx: &Ctx) {
        self.reopen_ledger(ctx, unix_ms(ctx.world.now().wall));
        self.retry_unwritten(ctx);
        let Some(l) = self.work.as_mut().and_then(|w| w.ledger.as_mut()) else {
            return;
        };
        if l.has_pending() && l.flush().is_ok() {
            tracing::info!(pubkey = %self.pubkey, "the work ledger's refused lines are written now");
        }
        let now_ms = unix_ms(ctx.world.now().wall);
        l.expire_if_due(now_ms);
        if l.wants_compaction() {
            // What others appended since (a former holder's late `done`)
            // goes into the rewrite, not under it: the rewrite reads it
            // under the append hold.
            if let Err(e) = l.compact(now_ms) {
                tracing::warn!(pubkey = %self.pubkey, "cannot compact the work ledger: {e}");
            }
        }
    }

    /// One work-ledger operation. `take` and `owed` first check that we
    /// lead (and are not fenced): a displaced or fenced leader takes
    /// nothing. A `done` or `giveBack` of the window that took the event is
    /// accepted whatever its leadership is by now: its reply may have been
    /// on its way while leadership moved (fence the take, not the done).
    ///
    /// The level above the host (if any) hears of every take granted and
    /// every take settled, after the answer: it records them for every host.
    pub(super) fn work(&mut self, ctx: &mut Ctx, op: WorkOp, reply: WorkReply) {
        let above = self.work_here(ctx, op, reply);
        if let (Some((id, what)), Some(u)) = (above, ctx.upper.as_mut()) {
            match what {
                None => u.took(self.pubkey, &id),
                Some(done) => u.settled(self.pubkey, &id, done),
            }
        }
    }

    /// [`Key::work`] on the host: the answer, and what the level above
    /// must hear (an event and `None` for a take, `Some(done)` for its end).
    fn work_here(
        &mut self,
        ctx: &Ctx,
        op: WorkOp,
        reply: WorkReply,
    ) -> Option<(String, Option<bool>)> {
        let leads = self.cell.is_leader_on(ctx.world.clocks());
        let now_ms = unix_ms(ctx.world.now().wall);
        // A former holder's `done` may have landed since we loaded: what
        // is owed, and whether a take is granted, depend on it (a `done`
        // or `give_back` of ours needs only what we applied ourselves).
        let reads = matches!(op, WorkOp::Take(_) | WorkOp::Owed(_));
        if reads {
            self.reopen_ledger(ctx, now_ms);
        }
        if let Some(l) = self
            .work
            .as_mut()
            .and_then(|w| w.ledger.as_mut())
            .filter(|_| reads)
        {
            if let Err(e) = l.refresh(now_ms) {
                tracing::warn!(pubkey = %self.pubkey, "cannot read the work ledger again: {e}");
            }
        }
        let pubkey = self.pubkey;
        let probes = FileProbes::new(ctx, &pubkey, false);
        let takeover = self.work.as_ref().is_some_and(|w| w.after_takeover);
        let lives = |t: &str| !takeover && probes.presence(t) == PeerPresence::Alive;
        match (op, reply) {
            (WorkOp::Take(id), WorkReply::Take(r)) => {
                let out = self.take(ctx, &id, leads, now_ms, &lives);
                let granted = matches!(out, TakeOutcome::Granted { .. });
                let _ = r.send(Ok(out));
                granted.then_some((id, None))
            }
            // The level above hears of every end, whatever this host's
            // ledger made of it: a reply sent is done for every host, and a
            // take record of ours must not outlive its turn.
            (WorkOp::Done(id), WorkReply::Flag(r)) => {
                let ok = self.settle(ctx, &id, leads, now_ms, Settle::Done);
                let _ = r.send(Ok(ok));
                Some((id, Some(true)))
            }
            (WorkOp::GiveBack(id), WorkReply::Flag(r)) => {
                let ok = self.settle(ctx, &id, leads, now_ms, Settle::GiveBack);
                let _ = r.send(Ok(ok));
                Some((id, Some(false)))
            }
            (WorkOp::Owed(queue), WorkReply::Owed(r)) => {
                let owed = if leads && !self.work_unread {
                    self.owed(&queue, &lives)
                } else {
                    Vec::new()
                };
                let _ = r.send(Ok(owed));
                None
            }
            (_, reply) => {
                reply.fail(Error::ShutDown);
                None
            }
        }
    }

    fn take(
        &mut self,
        ctx: &Ctx,
        id: &str,
        leads: bool,
        now_ms: u64,
        lives: &dyn Fn(&str) -> bool,
    ) -> TakeOutcome {
        if !leads {
            return TakeOutcome::NotLeader;
        }
        // What another host did (or a window of any host still does).
        if self.work_unread {
            return TakeOutcome::Unavailable;
        }
        if let Some(shared) = &self.shared_work {
            if shared.done.contains(id) {
                return TakeOutcome::Done;
            }
            if shared.taken.contains(id) {
                return TakeOutcome::AlreadyTaken;
            }
        }
        let Some(w) = self.work.as_mut() else {
            // Spec mode: no ledger applies. A fail-safe leader (the lock
            // file cannot be read, nor, most likely, the ledger beside it)
            // acts unrecorded once that has lasted, as with an unreadable
            // ledger.
            let since = self.ledgerless_since.unwrap_or(0);
            let waits = ctx.rules.profile.ledger
                && !ledger::grants_without_ledger(since, now_ms, ctx.rules.stale);
            return if waits {
                TakeOutcome::Unavailable
            } else {
                TakeOutcome::Granted { epoch: None }
            };
        };
        let epoch = w.epoch;
        let Some(l) = w.ledger.as_mut() else {
            let bound = ctx.rules.stale;
            return if ledger::grants_without_ledger(w.unreadable_since, now_ms, bound) {
                TakeOutcome::Granted { epoch: Some(epoch) }
            } else {
                TakeOutcome::Unavailable
            };
        };
        match l.index.verdict_with(id, epoch, lives) {
            Verdict::Done => TakeOutcome::Done,
            Verdict::TakenNow | Verdict::TakenElsewhere => TakeOutcome::AlreadyTaken,
            Verdict::Owed => {
                let op = Op::Take {
                    id: id.to_owned(),
                    epoch,
                    by: ctx.our_id.to_string(),
                    at_ms: now_ms,
                    live: ctx.token_for(&self.pubkey).map(str::to_owned),
                };
                let refused = l.append_now(&op).err();
                // Said once per spell of refusals, not at every retry.
                match (refused, std::mem::replace(&mut w.refusing, false)) {
                    (None, was) => {
                        if was {
                            tracing::info!(pubkey = %self.pubkey, "takes are written again");
                        }
                        TakeOutcome::Granted { epoch: Some(epoch) }
                    }
                    (Some(e), was) => {
                        if !was {
                            tracing::warn!(pubkey = %self.pubkey, "a take the disk refused is not granted (asked again until it takes it): {e}");
                        }
                        w.refusing = true;
                        TakeOutcome::Unavailable
                    }
                }
            }
        }
    }

    /// A `done` or a `giveBack`. Accepted from the window that took the
    /// event (its presence token is on the take), at the take's epoch,
    /// whatever its leadership; and, for a `done`, from the leader (an
    /// event it was handed some other way). `true` when recorded (or kept
    /// while the disk refuses it), or when no ledger applies.
    fn settle(&mut self, ctx: &Ctx, id: &str, leads: bool, now_ms: u64, what: Settle) -> bool {
        let token = ctx.token();
        if !ctx.rules.profile.ledger {
            // Spec mode: no ledger applies.
            return leads;
        }
        self.reopen_ledger(ctx, now_ms);
        let held = self
            .work
            .as_mut()
            .and_then(|w| Some((w.epoch, w.ledger.as_mut()?)));
        let Some((held_epoch, l)) = held else {
            // Not the holder any more (a fail-safe leader included: a take
            // of ours at an epoch we held still needs its end), or our
            // ledger cannot be read.
            let mut open = opener(ctx, &self.pubkey, now_ms);
            let line = (what, id, now_ms);
            let recorded = (self.unwritten).settle(&mut open, token, &self.pubkey, line);
            // A fail-safe leader's own dispatch needs no line.
            return recorded || (leads && self.work.is_none());
        };
        let epoch = match (taken_by(&l.index, id, token), what) {
            (Some(epoch), _) => epoch,
            // A take at our epoch without a token (our presence did not
            // list the key then): ours, only the holder takes at it.
            (None, _) if l.index.taker(id) == Some((held_epoch, None)) => held_epoch,
            (None, Settle::Done) if leads => held_epoch,
            _ => return false,
        };
        append(l, &self.pubkey, what.op(id, epoch, now_ms));
        true
    }

    /// The queued events we must dispatch now, in order (the rule:
    /// [`ledger::owed`]).
    pub(super) fn owed(&self, queue: &[QueuedEvent], lives: &dyn Fn(&str) -> bool) -> Vec<String> {
        let since = self
            .leader_since
            .unwrap_or(0)
            .max(self.global_since.unwrap_or(0));
        // What the level above recorded for every host is not owed.
        let shared = self.shared_work.as_deref();
        let elsewhere =
            |id: &str| shared.is_some_and(|w| w.done.contains(id) || w.taken.contains(id));
        let events = queue
            .iter()
            .filter(|e| !elsewhere(&e.id))
            .map(|e| (e.id.as_str(), e.published_ms));
        match self.work.as_ref() {
            Some(w) => {
                // Without a ledger that covers the predecessor, events
                // published before we led may have been answered by it.
                let fallback =
                    w.ledgerless_before || w.ledger.is_none() || self.global_since.is_some();
                let index = w.ledger.as_ref().map(|l| &l.index);
                ledger::owed(events, index, w.epoch, fallback.then_some(since), lives)
            }
            None => ledger::owed(events, None, 0, Some(since), lives),
        }
    }
}

/// Opens `pubkey`'s ledger, for lines written outside the epoch we hold.
fn opener<'a>(
    ctx: &'a Ctx,
    pubkey: &'a crate::pubkey::AgentPubkey,
    now_ms: u64,
) -> impl FnMut() -> Result<Ledger, ledger::LedgerError> + 'a {
    move || Ledger::open(ctx.world.ledger(pubkey), now_ms, ctx.config.work_retention)
}

/// Writes what the disk refused of ours in `pubkey`'s ledger before, if it
/// takes it now (also for keys we left, see [`super::Writer`]).
pub(super) fn retry(u: &mut Unwritten, ctx: &Ctx, pubkey: &crate::pubkey::AgentPubkey) {
    if u.is_empty() {
        return;
    }
    let mut open = opener(ctx, pubkey, unix_ms(ctx.world.now().wall));
    u.retry(&mut open, ctx.token(), pubkey);
}

/// Appends the `held` line of `by` at `epoch`, unless the ledger has it.
fn held(l: &mut Ledger, pubkey: &crate::pubkey::AgentPubkey, epoch: u64, by: &str, now_ms: u64) {
    if l.index.kept_at(by, epoch) {
        return;
    }
    let op = Op::Held {
        epoch,
        by: by.to_owned(),
        at_ms: now_ms,
    };
    if let Err(e) = l.append(&op) {
        tracing::warn!(%pubkey, "cannot note the holder in the work ledger: {e}");
    }
}
