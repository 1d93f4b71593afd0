//! etcd's silence: after a whole TTL of it no lease of ours can have
//! survived, and the policy decides whether our host leader acts alone
//! (the fall-back) until etcd answers again.

use std::time::Duration;

use super::super::WhenUnreachable;
use super::entry::Holding;
use super::task::{PermitState, Task};
use crate::elector::ChangeReason;
use crate::pubkey::AgentPubkey;

impl Task {
    /// Whether etcd has been silent for a whole TTL: no lease of ours can
    /// have survived that, and the policy decides whether the host leader
    /// acts anyway.
    pub(super) fn check_unreachable(&mut self, pk: AgentPubkey) {
        let ttl = self.cfg.ttl;
        let policy = self.cfg.when_unreachable;
        // Only silence counts: an etcd that answers no (a wrong password, a
        // role without access, its NOSPACE alarm) is there, and acting
        // alone on it would make one leader per host of a misconfiguration
        // (`Task::noted` keeps its answers from the silence).
        let silent = self.silence() >= ttl && !self.refused;
        let e = self.entries.get_mut(&pk).expect("caller checked");
        // Whether we held the key when etcd went quiet: if not, another
        // host did (or nobody), and what it answered is in no ledger of
        // ours.
        let held = e.held().is_some() || e.permit.state == PermitState::Held;
        if silent && e.held().is_some() {
            e.holding = Holding::Nothing;
            e.grant(PermitState::NotHeld, 0);
        }
        let fall_back =
            silent && e.leads && (policy == WhenUnreachable::FallBack || mutated!(FallbackAlways));
        if fall_back && !e.falling_back() {
            e.set_falling_back(true);
            e.grant(PermitState::FallBack, 0);
            tracing::warn!(pubkey = %pk, "etcd unreachable for a whole TTL: acting for this host only");
            // Another host held the key (or nobody): what it answered is in
            // no ledger of ours, so not the whole backlog is owed (every
            // host would answer it again), but what was published since a
            // TTL before etcd went quiet, when the holder may have been cut
            // off with it unanswered (real-process chaos across hosts, about
            // 1 run in 5: a mention published just before etcd paused was
            // never answered when only what was published after the
            // fall-back was owed).
            let unknown_before = (!held).then(|| self.quiet_since_ms(ttl));
            self.tell_with(pk, Some(ChangeReason::FailSafe), unknown_before, false);
        } else if !silent && e.falling_back() {
            e.set_falling_back(false);
            if e.held().is_none() {
                e.grant(PermitState::NotHeld, 0);
                self.tell(pk, Some(ChangeReason::Lost));
            }
        }
    }

    /// Unix ms a `ttl` before our last answer from etcd: what a holder cut
    /// off since may have left unanswered was published after it.
    fn quiet_since_ms(&self, ttl: Duration) -> u64 {
        let quiet = self
            .clock
            .now()
            .saturating_duration_since(self.last_contact)
            + ttl;
        let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
        self.clock.unix_ms().saturating_sub(quiet_ms)
    }
}
