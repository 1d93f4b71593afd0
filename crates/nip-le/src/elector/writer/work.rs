//! The writer's work shell (see [`crate::ledger`] for the file,
//! [`crate::work`] for the rules): the ledger of the epoch we hold the lock
//! at is opened, read again and appended to here, as the rules decide.

use crate::error::Error;
use crate::ledger::{self, Ledger, Op, SettleCap};
use crate::presence::PeerPresence;
use crate::work::{epoch_floor, held_line, Lead, Settle, SettleStep, Spell, TakeStep};

use super::super::machine::{Input, Probes};
use super::super::types::TakeOutcome;
use super::context::{Ctx, FileProbes};
use super::key::Key;
use super::unwritten::{append, Unwritten};
use super::{unix_ms, WorkOp, WorkReply};

impl Key {
    /// Keeps the work rules and the ledger of our epoch in step with the
    /// view: the ledger is (re)loaded whenever we lead at a new epoch, and
    /// forgotten when we stop leading.
    pub(super) fn track_work(&mut self, ctx: &Ctx, leader: bool, takeover: bool) {
        let now_ms = unix_ms(ctx.world.now().wall);
        // The epoch we hold at, through a same-id child's record too: a
        // child's rewrite is not a change of holder and costs no ledger.
        let epoch = self.m.held_epoch();
        self.work.holds(self.m.holds_lock());
        match self.work.lead(now_ms, leader, epoch, takeover) {
            Lead::Keep => {}
            Lead::Forget if mutated!(LossDropsLines) => self.ledger = None,
            Lead::Forget => self.drop_ledger(),
            Lead::OpenFailSafe => {
                self.drop_ledger();
                let storage = ctx.world.ledger(&self.pubkey);
                if let Ok(l) = Ledger::open(storage, now_ms, ctx.config.work_retention) {
                    self.ledger = Some(self.unwritten.carried_into(l));
                }
            }
            Lead::Open { epoch } => {
                // The ledger of the epoch we held before (a lead regained
                // at a new epoch) may keep lines the disk refused: kept,
                // not dropped (the simulator: a give-back lost so, its
                // event never answered).
                if mutated!(RegainDropsLines) {
                    self.ledger = None;
                } else {
                    self.drop_ledger();
                }
                let ledger = match open_to_lead(ctx, &self.pubkey, now_ms) {
                    Ok(l) => {
                        self.note_ledger_epoch(ctx, &l);
                        Some(self.unwritten.carried_into(l))
                    }
                    Err(e) => {
                        tracing::warn!(pubkey = %self.pubkey, "dispatching without the work ledger: {e}");
                        None
                    }
                };
                let siblings = ctx
                    .token()
                    .map(|t| ctx.world.live_siblings(&self.pubkey, t))
                    .unwrap_or_default();
                let takes_part = |by: &str| siblings.iter().any(|s| s.instance_id == by);
                let index = ledger.as_ref().map(|l| &l.index);
                let given = self.work.opened(index, &takes_part, now_ms);
                self.ledger = ledger;
                if let Some(l) = self.ledger.as_mut() {
                    for op in given {
                        let _ = append(l, &self.pubkey, op);
                    }
                    held(l, &self.pubkey, epoch, &ctx.our_id, now_ms);
                }
            }
        }
    }

    /// Opens the ledger of the epoch we hold again, if it could not be
    /// read so far.
    fn reopen_ledger(&mut self, ctx: &Ctx, now_ms: u64) {
        let epoch = self.work.epoch();
        if self.ledger.is_some() || (epoch.is_none() && !self.work.fail_safe()) {
            return;
        }
        let opened = match epoch {
            Some(_) => open_to_lead(ctx, &self.pubkey, now_ms),
            None => Ledger::open(
                ctx.world.ledger(&self.pubkey),
                now_ms,
                ctx.config.work_retention,
            ),
        };
        if let Ok(l) = opened {
            let mut l = self.unwritten.carried_into(l);
            if let Some(epoch) = epoch {
                held(&mut l, &self.pubkey, epoch, &ctx.our_id, now_ms);
            }
            // Unread when our first look left out what a writer without a
            // ledger may have answered: its floor goes in now.
            if let Some(op) = self.work.floor_line(&l.index, &ctx.our_id, now_ms) {
                let _ = append(&mut l, &self.pubkey, op);
            }
            self.ledger = Some(l);
            tracing::info!(pubkey = %self.pubkey, "the work ledger can be read again");
        }
    }

    /// Forgets the ledger of the epoch we held, keeping the lines of ours
    /// the disk refused (see [`Key::unwritten`]).
    fn drop_ledger(&mut self) {
        if let Some(l) = self.ledger.take() {
            self.unwritten.keep(l);
        }
    }

    /// What the disk refused of ours, taken out of a key we leave.
    pub(super) fn take_unwritten(&mut self) -> Unwritten {
        self.drop_ledger();
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
        // A window that starts to take part removes what crashed rewrites
        // of this ledger left.
        ctx.world.ledger(&self.pubkey).remove_leftovers();
        let op = Op::Held {
            epoch: 0,
            by: ctx.our_id.to_string(),
            at_ms: now_ms,
        };
        // Synced (see `Ledger::durable`).
        let written = match Ledger::open(
            ctx.world.ledger(&self.pubkey),
            now_ms,
            ctx.config.work_retention,
        ) {
            Ok(mut l) => {
                self.note_ledger_epoch(ctx, &l);
                l.append(&op)
            }
            Err(_) => ctx.world.ledger(&self.pubkey).append(&op.to_line(), true),
        };
        if let Err(e) = written {
            tracing::warn!(pubkey = %self.pubkey, "cannot note us in the work ledger: {e}");
        }
    }

    /// Every epoch `l` shows was issued: ours come above them.
    fn note_ledger_epoch(&mut self, ctx: &Ctx, l: &Ledger) {
        if let Some(e) = epoch_floor(&l.index) {
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
        if self.ledger.is_none() {
            // An observer's, or a fail-safe leader's that could not be read
            // so far: takes of ours may still be in it.
            self.ledger = opener(ctx, &self.pubkey, now_ms)().ok();
        }
        let Some(l) = self.ledger.as_mut() else {
            return Vec::new();
        };
        let ops = self.work.end_takes(Some(&l.index), ctx.token(), now_ms);
        let mut ids = Vec::with_capacity(ops.len());
        for op in ops {
            if let Err(e) = l.append(&op) {
                tracing::warn!(pubkey = %self.pubkey, "cannot give a take back: {e}");
            }
            if let Op::GiveBack { id, .. } = op {
                ids.push(id);
            }
        }
        ids
    }

    /// Writes the lines the disk refused before, and rewrites a ledger
    /// that has grown to twice its live entries.
    pub(super) fn compact_ledger(&mut self, ctx: &Ctx) {
        self.reopen_ledger(ctx, unix_ms(ctx.world.now().wall));
        self.retry_unwritten(ctx);
        let Some(l) = self.ledger.as_mut() else {
            self.count_work();
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
            let by = ctx.our_id.to_string();
            let settle = (self.work.settle_cap()).map(|(cap, epoch)| SettleCap {
                cap,
                by: &by,
                epoch,
            });
            if let Err(e) = l.compact(now_ms, settle) {
                tracing::warn!(pubkey = %self.pubkey, "cannot compact the work ledger: {e}");
            }
        }
        self.count_work();
    }

    /// Publishes the ledger's counts for the status when they changed, or
    /// that we keep no ledger now.
    fn count_work(&mut self) {
        let counts = self.ledger.as_ref().map(|l| l.index.counts());
        let degraded = (self.ledger.as_ref())
            .and_then(|l| l.degraded().map(str::to_owned))
            .or_else(|| self.unwritten.degraded());
        if counts != self.work_counts || degraded != self.work_degraded {
            self.work_counts = counts;
            self.work_degraded = degraded;
            self.publish();
        }
    }

    /// One work-ledger operation, decided by the work rules
    /// ([`crate::work::WorkMachine`]) and carried out here.
    ///
    /// The global level (if any) hears of every take granted and
    /// every take settled, after the answer: it records them for every host.
    pub(super) fn work(&mut self, ctx: &mut Ctx, op: WorkOp, reply: WorkReply) {
        let global = self.work_here(ctx, op, reply);
        if let (Some((id, what)), Some(u)) = (global, ctx.global_level.as_mut()) {
            match what {
                None => {
                    u.took(self.pubkey, &id);
                    self.global_open.insert(id);
                }
                Some(done) => {
                    u.settled(self.pubkey, &id, done);
                    self.global_open.remove(&id);
                }
            }
        }
    }

    /// [`Key::work`] on the host: the answer, and what the global level
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
        // (A take reads it under the append hold.)
        if matches!(op, WorkOp::Take(..) | WorkOp::Owed(_)) {
            self.reopen_ledger(ctx, now_ms);
        }
        if matches!(op, WorkOp::Owed(_)) {
            if let Some(l) = self.ledger.as_mut() {
                let read = if mutated!(NoTail) {
                    Ok(())
                } else {
                    l.refresh(now_ms)
                };
                if let Err(e) = read {
                    tracing::warn!(pubkey = %self.pubkey, "cannot read the work ledger again: {e}");
                }
            }
        }
        let pubkey = self.pubkey;
        let probes = FileProbes::new(ctx, &pubkey, false);
        let alive = |t: &str| !mutated!(NoInFlight) && probes.presence(t) == PeerPresence::Alive;
        match (op, reply) {
            (WorkOp::Take(id, published), WorkReply::Take(r)) => {
                let out = self.take(ctx, (&id, published), leads, now_ms, &alive);
                let granted = matches!(out, TakeOutcome::Granted { .. });
                let _ = r.send(Ok(out));
                granted.then_some((id, None))
            }
            // The global level hears of every end, whatever this host's
            // ledger made of it: a reply sent is done for every host, and a
            // take record of ours must not outlive its turn.
            (WorkOp::Done(id), WorkReply::Flag(r)) => {
                let _ = r.send(self.settle(ctx, &id, leads, now_ms, Settle::Done));
                Some((id, Some(true)))
            }
            (WorkOp::GiveBack(id), WorkReply::Flag(r)) => {
                let _ = r.send(self.settle(ctx, &id, leads, now_ms, Settle::GiveBack));
                Some((id, Some(false)))
            }
            (WorkOp::Owed(queue), WorkReply::Owed(r)) => {
                let index = self.ledger.as_ref().map(|l| &l.index);
                let retention = u64::try_from(ctx.config.work_retention.as_millis());
                let horizon = now_ms.saturating_sub(retention.unwrap_or(u64::MAX));
                let owed = self.work.owed(&queue, leads, (index, horizon), &alive);
                let _ = r.send(Ok(owed));
                if let Some(l) = self.ledger.as_mut() {
                    if let Some(op) = self.work.floor_line(&l.index, &ctx.our_id, now_ms) {
                        let _ = append(l, &self.pubkey, op);
                    }
                }
                None
            }
            (_, reply) => {
                reply.fail(Error::ShutDown);
                None
            }
        }
    }

    /// A take: the rules' answer, or their line written first, decided
    /// and written under the ledger's append hold.
    fn take(
        &mut self,
        ctx: &Ctx,
        event: (&str, Option<u64>),
        leads: bool,
        now_ms: u64,
        alive: &dyn Fn(&str) -> bool,
    ) -> TakeOutcome {
        let id = event.0;
        let live = ctx.token_for(&self.pubkey);
        let by = ctx.our_id.to_string();
        let (work, ledger) = (&mut self.work, &mut self.ledger);
        let Some(l) = ledger.as_mut() else {
            return match work.take(event, leads, now_ms, (None, false), alive, &by, live) {
                TakeStep::Answer(out) => out,
                TakeStep::Record(_) => TakeOutcome::Unavailable,
            };
        };
        let full = l.is_full() && !mutated!(ForgetAnswered);
        let (mut answer, mut decided) = (None, false);
        let taken = l.take_held(now_ms, &mut |ix| {
            decided = true;
            match work.take(event, leads, now_ms, (Some(ix), full), alive, &by, live) {
                TakeStep::Answer(out) => {
                    answer = Some(out);
                    Vec::new()
                }
                TakeStep::Record(lines) => lines,
            }
        });
        if let Some(out) = answer {
            return out;
        }
        if !decided {
            // The hold or the read failed: asked again in a moment.
            if let Err(e) = taken {
                tracing::debug!(pubkey = %self.pubkey, "a take waits for the work ledger: {e}");
            }
            return TakeOutcome::Unavailable;
        }
        let refused = taken.err().filter(|_| !mutated!(TakeUnsynced));
        let (out, spell) = self.work.take_written(id, refused.is_none());
        // Said once per spell of refusals, not at every retry.
        match (spell, refused) {
            (Spell::Ended, _) => tracing::info!(pubkey = %self.pubkey, "takes are written again"),
            (Spell::Began, Some(e)) => {
                tracing::warn!(pubkey = %self.pubkey, "a take the disk refused is not granted (asked again until it takes it): {e}");
            }
            _ => {}
        }
        out
    }

    /// A `done` or a `giveBack` (the rule: [`crate::work::WorkMachine::settle`]).
    /// `true` when recorded, or when no ledger applies; `false` when
    /// refused; [`Error::NotDurable`] when applied but not durable yet
    /// (kept while the disk refuses it, or written and not synced).
    fn settle(
        &mut self,
        ctx: &Ctx,
        id: &str,
        leads: bool,
        now_ms: u64,
        what: Settle,
    ) -> Result<bool, Error> {
        let token = ctx.token();
        if ctx.rules.profile.ledger {
            self.reopen_ledger(ctx, now_ms);
        }
        let index = self.ledger.as_ref().map(|l| &l.index);
        match self.work.settle(id, token, leads, what, now_ms, index) {
            SettleStep::Answer(ok) => Ok(ok),
            SettleStep::Record(op) => match self.ledger.as_mut() {
                Some(l) => append(l, &self.pubkey, op).map(|()| true),
                None => Ok(true),
            },
            SettleStep::Outside {
                anyway,
                done_anyway,
            } => {
                let mut open = opener(ctx, &self.pubkey, now_ms);
                let line = (what, id, now_ms, done_anyway);
                let recorded = (self.unwritten).settle(&mut open, token, &self.pubkey, line);
                recorded.map(|r| r || anyway)
            }
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
    let now_ms = unix_ms(ctx.world.now().wall);
    let mut open = opener(ctx, pubkey, now_ms);
    u.retry(&mut open, ctx.token(), pubkey, now_ms);
}

/// Appends the `held` line of `by` at `epoch`, unless the ledger has it.
fn held(l: &mut Ledger, pubkey: &crate::pubkey::AgentPubkey, epoch: u64, by: &str, now_ms: u64) {
    let Some(op) = held_line(&l.index, epoch, by, now_ms) else {
        return;
    };
    if let Err(e) = l.append(&op) {
        tracing::warn!(%pubkey, "cannot note the holder in the work ledger: {e}");
    }
}

/// Opens the ledger to lead with at an epoch: one too large to read is
/// rewritten from its newest lines first ([`Ledger::recover`]), or every
/// later holder would dispatch without it too.
fn open_to_lead(
    ctx: &Ctx,
    pubkey: &crate::pubkey::AgentPubkey,
    now_ms: u64,
) -> Result<Ledger, ledger::LedgerError> {
    let retention = ctx.config.work_retention;
    match Ledger::open(ctx.world.ledger(pubkey), now_ms, retention) {
        Err(ledger::LedgerError::Oversized) => {
            tracing::warn!(%pubkey, "the work ledger is too large to read: rewritten from its newest lines");
            Ledger::recover(ctx.world.ledger(pubkey), now_ms, retention)
        }
        opened => opened,
    }
}
