//! Extension: the step-down that waits for our agent to stop before the
//! lock moves (the rule: `machine::drain`), as the writer carries it out.
//! We stop acting at once; the lock is given up once the agent is gone or
//! the bound has passed; the calls that asked for it (a release, a
//! stand-down, a leave) are answered then.

use super::super::machine::{Input, StepDownPlan};
use super::context::Ctx;
use super::deferred::{DrainReply, Finished};
use super::key::Key;

impl Key {
    /// The step-down path of a step-down we chose (another window's claim,
    /// a release, a stand-down, a leave). At once, unless we hold the lock
    /// and our agent runs: then we stop acting now and give the lock up in
    /// [`Key::finish_drain`]. Returns, when the step-down is done now,
    /// whether a record of ours was given up and `reply` to answer with it
    /// (once the caller is done: a leave first forgets the key); `None`
    /// while it waits (`reply` is answered then).
    pub(super) fn step_down_for(
        &mut self,
        ctx: &mut Ctx,
        plan: StepDownPlan,
        reply: Option<DrainReply>,
    ) -> Option<Finished> {
        if let Some(d) = &mut self.drain {
            // Stepping down already: the lock moves once, for the first.
            d.plan.departing |= plan.departing;
            self.drain_replies.extend(reply);
            return None;
        }
        // Stop acting before anything else, then look whether our agent
        // runs (see `agent_hold`: it then sees we no longer lead).
        self.cell.set_leader(false);
        let running = ctx.shared.agents.running_after_clearing(&self.pubkey);
        let now = ctx.world.now();
        match ctx
            .rules
            .drain(plan, self.m.holds_lock(), running, now.mono)
        {
            Ok(d) => {
                tracing::info!(pubkey = %self.pubkey, target = ?d.plan.target, "stopped acting; the lock moves once our agent has stopped");
                self.m.step(Input::StepDown, now);
                self.track_work(ctx, false, false);
                if let Some(a) = self.announcer.step_down(d.plan.reason, d.plan.always) {
                    self.notify_at(ctx, a, super::unix_ms(now.wall));
                }
                self.publish();
                self.drain = Some(d);
                self.drain_replies.extend(reply);
                None
            }
            Err(plan) => {
                let released = self.step_down(
                    ctx,
                    plan.reason,
                    plan.target.as_deref(),
                    plan.always,
                    plan.departing,
                );
                if plan.nonce.is_some() {
                    self.m.step(Input::Serve(plan.nonce), ctx.world.now());
                }
                Some(Finished {
                    departing: plan.departing,
                    replies: reply.into_iter().collect(),
                    released,
                })
            }
        }
    }

    /// Gives the lock up if the step-down waits no more (our agent is
    /// gone, the bound passed, or `now` says so: a shutdown). Returns,
    /// when it is over, whether the key is to be left, and the calls that
    /// waited with their answer (given once the key is left).
    pub(super) fn finish_drain(&mut self, ctx: &mut Ctx, now: bool) -> Option<Finished> {
        let running = ctx.shared.agents.running(&self.pubkey);
        let over = self
            .drain
            .as_ref()
            .is_some_and(|d| now || d.over(running, ctx.world.now().mono));
        if !over {
            return None;
        }
        let d = self.drain.take()?;
        if running {
            tracing::warn!(pubkey = %self.pubkey, "our agent is still stopping: the lock moves all the same");
        }
        let released = self.step_down(
            ctx,
            d.plan.reason,
            d.plan.target.as_deref(),
            false,
            d.plan.departing,
        );
        if d.plan.nonce.is_some() {
            self.m.step(Input::Serve(d.plan.nonce), ctx.world.now());
        }
        Some(Finished {
            departing: d.plan.departing,
            replies: std::mem::take(&mut self.drain_replies),
            released,
        })
    }

    /// Our own claim or `resume` while we wait for our agent: we keep the
    /// lock and lead on (the claim that made us step down stays unserved
    /// and expires). The calls that waited are answered: nothing was
    /// released.
    pub(super) fn cancel_drain(&mut self, ctx: &mut Ctx) {
        if self.drain.take().is_none() {
            return;
        }
        tracing::info!(pubkey = %self.pubkey, "the step-down was called off: we lead on");
        for r in self.drain_replies.drain(..) {
            r.answer(false);
        }
        self.m.step(Input::Resume, ctx.world.now());
    }

    /// Whether a step-down of ours waits for our agent.
    pub(super) fn draining(&self) -> bool {
        self.drain.is_some()
    }

    /// The global level hands the agent to another host once we confirm
    /// that we stopped acting ([`super::super::global_level::GlobalNews::confirm`]):
    /// confirmed now, or, while our agent runs, once it has stopped (at the
    /// drain bound at the latest), so the other host's agent never answers
    /// beside ours.
    pub(super) fn withdraw_after_agent(&mut self, ctx: &mut Ctx) {
        let running = ctx.shared.agents.running_after_clearing(&self.pubkey);
        if running && ctx.rules.profile.handoff {
            let until = ctx.world.now().mono + ctx.rules.drain_bound();
            tracing::info!(pubkey = %self.pubkey, "the agent goes to another host once ours has stopped");
            self.withdraw_at = Some(until);
            return;
        }
        self.withdraw_at = None;
        if let Some(u) = ctx.global_level.as_mut() {
            u.withdrawn(self.pubkey);
        }
    }

    /// Confirms a withdrawal that waited for our agent, if it waits no
    /// more (or `now`: a shutdown).
    pub(super) fn finish_withdrawal(&mut self, ctx: &mut Ctx, now: bool) {
        let Some(until) = self.withdraw_at else {
            return;
        };
        let running = ctx.shared.agents.running(&self.pubkey);
        if now || !running || ctx.world.now().mono >= until {
            self.withdraw_at = None;
            if let Some(u) = ctx.global_level.as_mut() {
                u.withdrawn(self.pubkey);
            }
        }
    }
}
