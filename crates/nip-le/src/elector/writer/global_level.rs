//! The writer's glue to the global level (etcd): it is told when we
//! start or stop leading our host and of claims, and its news is announced
//! and published here, by the one writer.

use super::super::global_level::{GlobalNews, Permit, Renewed};
use super::super::types::{ChangeReason, ClaimOutcome};
use super::context::Ctx;
use super::key::Key;

impl Key {
    /// Tells the global level (if any) when our host leadership changed.
    /// Stopping closes the permit at once (whatever news is on its way).
    /// A host leader that fenced itself (it cannot write its lock file)
    /// does not lead for the global level: holding the agent's etcd key
    /// while it cannot act would keep every other host from it. One that
    /// leads without the lock (the NIP's fail-safe) says so: it takes no
    /// key and continues none (a sibling may lead the host too), and acts
    /// only under the fall-back. Losing the lock closes the permit here,
    /// at once, not when the global level's answer arrives.
    pub(super) fn tell_global(&mut self, ctx: &mut Ctx, leads: bool, revoke: bool) {
        let Some(u) = ctx.global_level.as_mut() else {
            return;
        };
        let leads = leads && self.cell.host_valid_on(ctx.world.clocks());
        let locked = leads && self.m.holds_lock();
        let was = (self.told_global, self.told_locked);
        if was == (leads, locked) {
            return;
        }
        (self.told_global, self.told_locked) = (leads, locked);
        if leads && !was.0 {
            self.global_tenure += 1;
        } else if !leads || (was.1 && !locked) {
            self.set_permit(Permit::NOT_HELD);
        }
        u.host_leader(self.pubkey, leads, locked, revoke, self.global_tenure);
    }

    /// The global level's part of a claim: it is asked to claim too, and the
    /// claim is complete only once we act.
    pub(super) fn claim_global(&mut self, ctx: &mut Ctx, local: ClaimOutcome) -> ClaimOutcome {
        let Some(u) = ctx.global_level.as_mut() else {
            return local;
        };
        if self.cell.is_leader_on(ctx.world.clocks()) {
            return ClaimOutcome::AlreadyLeader;
        }
        u.claim(self.pubkey);
        ClaimOutcome::Pending
    }

    /// News from the global level: its permit is applied (only within the
    /// host leadership it was granted for), a change of what we may do is
    /// announced (with the level it leaves us at), a view change only
    /// published.
    pub(super) fn global_news(&mut self, ctx: &mut Ctx, news: GlobalNews) {
        let current = self.told_global && news.tenure == self.global_tenure;
        let permit = if current {
            news.permit.over(self.permit)
        } else {
            Permit::NOT_HELD
        };
        self.set_permit(permit);
        if news.confirm {
            // A hand-over to another host: once our agent has stopped.
            self.withdraw_after_agent(ctx);
        }
        self.global = Some(news.status);
        let gave_up = matches!(
            news.reason,
            Some(ChangeReason::Lost | ChangeReason::StoodDown | ChangeReason::Released)
        );
        // Our host's dones the records lack go out again (see
        // `SharedWork::lacks_done`).
        if let (Some(w), Some(l), Some(u)) = (&news.work, &self.ledger, ctx.global_level.as_mut()) {
            let half = u64::try_from(l.retention().as_millis() / 2).unwrap_or(u64::MAX);
            for id in w.lacks_done(&l.index, news.at_ms.saturating_sub(half)) {
                u.settled(self.pubkey, &id, true);
                self.global_open.remove(&id);
            }
        }
        (self.work).heard_global(news.work, news.work_unread, news.unknown_before_ms, gave_up);
        if let Some(reason) = news.reason {
            let acting = self.cell.is_leader_on(ctx.world.clocks());
            if let Some(a) = self.announcer.tell(acting, reason, true) {
                self.notify_at(ctx, a, news.at_ms);
            }
        }
        self.publish();
    }

    /// A renewal made beside the global level's task: it raises the
    /// deadline of the permit open now on the same lease within the same
    /// host leadership, and only while that permit is still valid (a
    /// lapsed one is reopened by the task, which says so). Nothing is
    /// announced: what we may do does not change.
    pub(super) fn renewed(&mut self, ctx: &Ctx, r: Renewed) {
        let now = ctx.world.clocks().boot_nanos();
        let raised = self.permit.renewed(&r, now);
        if self.told_global && r.tenure == self.global_tenure && raised != self.permit {
            self.set_permit(raised);
        }
    }

    /// Sets the global level's permit in the cell, and keeps it.
    fn set_permit(&mut self, p: Permit) {
        self.permit = p;
        self.cell.set_global(p.state.code(), p.until);
    }
}
