//! The contender's moves for claims across hosts: post one, withdraw it,
//! find one the watch could not bring, stand down for one (the writer
//! confirms first) and hand the key over, and take a granted one.

use crate::elector::ChangeReason;
use crate::pubkey::AgentPubkey;

use super::super::etcd::{Kv, Txn};
use super::entry::Holding;
use super::holder_of;
use super::task::{PermitState, Task};

impl Task {
    /// A claim the watch cannot bring: posted before we took the key, or
    /// while our watch had lost its place. Looked for when we take a key
    /// on a lease of our own and after every resync.
    pub(super) fn find_claim(&mut self, pk: AgentPubkey) {
        if self.entries.get(&pk).is_none_or(|e| e.held().is_none()) {
            return;
        }
        let r = self.gw.get(&self.cfg.claim_key(&pk));
        if let Some(Some(claim)) = self.noted(pk, r) {
            self.hand_over(pk, &claim);
        }
    }

    /// Posts our claim when another host holds the key.
    pub(super) fn post_claim(&mut self, pk: AgentPubkey) {
        let e = &self.entries[&pk];
        if e.claim_until.is_none() || e.claim_lease.is_some() {
            return;
        }
        let r = self.gw.grant(self.cfg.ttl);
        let Some((lease, _)) = self.noted(pk, r) else {
            return;
        };
        let (key, value) = (self.cfg.claim_key(&pk), self.value());
        let r = self.gw.put(&key, &value, lease);
        if self.noted(pk, r).is_some() {
            self.entries.get_mut(&pk).expect("noted").claim_lease = Some(lease);
            tracing::info!(pubkey = %pk, "posted a cross-host claim");
        } else {
            let _ = self.gw.revoke(lease);
        }
    }

    pub(super) fn claim_expired(&mut self, pk: AgentPubkey) {
        let e = self.entries.get_mut(&pk).expect("caller checked");
        e.claim_until = None;
        if let Some(lease) = e.claim_lease.take() {
            self.withdraw_claim(pk, lease);
        }
    }

    /// Revokes our claim's lease (which deletes the claim key with it),
    /// unless the holder granted the claim: the leader key is then bound to
    /// that lease, and whoever continues it (we, or a sibling that took our
    /// host's lock since) acts on it. Revoking it then would delete the key
    /// under a window that still acts (found by the simulator; the teeth's
    /// `revoke_claim`).
    pub(super) fn withdraw_claim(&mut self, pk: AgentPubkey, lease: i64) {
        let key = self.cfg.leader_key(&pk);
        match self.gw.get(&key) {
            Ok(Some(kv)) if kv.lease == lease && !mutated!(RevokeClaim) => {}
            Ok(_) => {
                let _ = self.gw.revoke(lease);
            }
            // Unknown: let the lease run out on its own (one TTL).
            Err(_) => {}
        }
    }

    /// The leader key is bound to the lease of our claim: the claim was
    /// granted, and the lease is no longer ours to withdraw.
    pub(super) fn claim_lease_taken(&mut self, pk: AgentPubkey, kv: &Kv) {
        if let Some(e) = self.entries.get_mut(&pk) {
            if e.claim_lease == Some(kv.lease) && !mutated!(RevokeClaim) {
                e.claim_lease = None;
            }
        }
    }

    /// The holder stands down for a claim from another window: stop acting
    /// first (the writer confirms it closed the permit), then rewrite the
    /// key for the claimant (bound to its lease) and drop the claim in one
    /// transaction ([`Task::hand_over_confirmed`]).
    pub(super) fn hand_over(&mut self, pk: AgentPubkey, claim: &Kv) {
        let claimant = holder_of(claim);
        let e = self.entries.get_mut(&pk).expect("caller checked");
        if e.held().is_none() {
            return;
        }
        // A claim from our own host is the host's file election's to serve
        // (the claimant takes the host lock and continues our lease).
        if claimant.instance_id.is_empty()
            || claimant.instance_id == self.our_id
            || (claimant.host_id == self.cfg.host_id && !mutated!(RevokeSibling))
            || claim.lease == 0
        {
            return;
        }
        e.grant(PermitState::NotHeld, 0);
        e.begin_hand_over(claim.clone());
        tracing::info!(pubkey = %pk, to = %claimant.instance_id, "standing down for a cross-host claim");
        if mutated!(EarlyHandover) {
            self.hand_over_confirmed(pk);
            self.tell_with(pk, Some(ChangeReason::StoodDown), None, false);
            return;
        }
        self.tell_with(pk, Some(ChangeReason::StoodDown), None, true);
    }

    /// The writer no longer acts on our permit: the key goes to the
    /// claimant we stood down for.
    /// Our records of the agent's work go first: until etcd has them, the
    /// hand-over waits (tried again soon; our lease runs out meanwhile if
    /// etcd stays out of reach, and the claimant gets the key then).
    pub(super) fn hand_over_confirmed(&mut self, pk: AgentPubkey) {
        if self.entries.get(&pk).is_none_or(|e| !e.handing_over()) {
            return;
        }
        // Shutting down: the records go as far as they can, the key goes.
        let sent = self.work_sent(pk) || self.shutting_down;
        let retry = self.clock.now() + self.retry_delay();
        let e = self.entries.get_mut(&pk).expect("checked");
        if !sent {
            e.swap_at = Some(retry);
            return;
        }
        e.swap_at = None;
        let Some((h, claim, falling_back)) = e.take_hand_over() else {
            return;
        };
        let key = self.cfg.leader_key(&pk);
        let claim_key = self.cfg.claim_key(&pk);
        let r = self.gw.swap(
            &key,
            h.revision,
            &claim.value,
            claim.lease,
            Some((&claim_key, claim.mod_revision)),
        );
        match self.noted(pk, r) {
            // Our old lease, unless the claimant's key is bound to it now
            // (we had continued a lease of the claimant's host).
            Some(Txn::Done(_)) if h.lease != claim.lease || mutated!(RevokeSibling) => {
                self.give_up_lease(pk, h.lease)
            }
            Some(Txn::Done(_)) => {}
            // The key is still ours as we left it: the claim changed (a
            // newer one replaced it, or it was withdrawn). We still hold
            // (our writer stays stopped until a renewal opens the permit
            // again) and honour whatever claim is there now.
            Some(Txn::Failed(Some(kv))) if kv.lease == h.lease && kv.mod_revision == h.revision => {
                let Some(e) = self.entries.get_mut(&pk) else {
                    return;
                };
                // We stepped back from our host while the swap waited (for
                // our work records): the lease is a sibling's to continue,
                // as a step-back leaves it, not ours to hold without leading
                // (found by the phase check, H3: held and renewed by nobody
                // who acts, the claim unanswered until the lease ran out).
                // Shutting down, it is held once more to be revoked.
                if !e.leads && !self.shutting_down && !mutated!(HeldAfterStepBack) {
                    return;
                }
                e.holding = Holding::Key(h);
                // Held again, the host no longer acts alone: its writer
                // waits for a renewal to open the permit (it had kept the
                // fall-back's open beside our hold).
                if falling_back && !mutated!(FallbackPermitHeldAgain) {
                    e.grant(PermitState::NotHeld, 0);
                }
                // Only a claim other than the one that just failed: the
                // same one again (a forged revision) would loop forever
                // (found by the simulator with forged answers:
                // `forged_ttls_and_revisions_never_make_two_holders_across_200_seeds`).
                let r = self.gw.get(&self.cfg.claim_key(&pk));
                if let Some(Some(newer)) = self.noted(pk, r) {
                    if newer.mod_revision != claim.mod_revision {
                        self.hand_over(pk, &newer);
                    }
                }
            }
            // No answer (it may have been applied): still standing down,
            // tried again (the compare tells). Dropping the hand-over here
            // left a key naming us that we did not hold, which the next
            // look continued as a sibling's (found by the simulator across
            // hosts; the teeth's `drop_unanswered_hand_over`).
            None if mutated!(DropUnansweredHandOver) => {}
            None => {
                if let Some(e) = self.entries.get_mut(&pk) {
                    e.holding = Holding::HandingOver {
                        held: h,
                        claim,
                        falling_back,
                    };
                    e.swap_at = Some(retry);
                }
            }
            _ => {}
        }
    }

    /// Whether `kv` is our claim granted (the holder rewrote the key for
    /// us, bound to our claim's lease); if so, we hold it now.
    pub(super) fn claim_granted(&mut self, pk: AgentPubkey, kv: &Kv) -> bool {
        let e = &self.entries[&pk];
        let ours = holder_of(kv).instance_id == self.our_id;
        // Granted to a fail-safe host leader (no lock file): the sibling
        // that holds the lock continues it (found by the simulator across
        // hosts; the teeth's `granted_unlocked`).
        let locked = e.locked || mutated!(GrantedUnlocked);
        if !(ours && e.leads && locked && e.held().is_none() && e.claim_lease == Some(kv.lease)) {
            return false;
        }
        if !self.may_take() {
            // Right after etcd lost data (see `Task::rewound`).
            return false;
        }
        let sent = self.clock.boot_nanos();
        let r = self.gw.keep_alive(kv.lease);
        match self.noted(pk, r).map(|t| self.bounded(t)) {
            Some(ttl) if !ttl.is_zero() => {
                self.hold(
                    pk,
                    kv.lease,
                    kv.mod_revision,
                    ttl,
                    sent,
                    ChangeReason::Claimed,
                );
                true
            }
            _ => false,
        }
    }
}
