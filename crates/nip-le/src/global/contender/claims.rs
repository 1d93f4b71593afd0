//! The contender's moves for claims across hosts: post one, withdraw it,
//! find one the watch could not bring, stand down for one (the writer
//! confirms first) and hand the key over, and take a granted one. Like the
//! other moves, each is a chain of decisions whose calls `calls` makes.

use std::time::Duration;

use crate::elector::ChangeReason;
use crate::pubkey::AgentPubkey;

use super::super::etcd::{Kv, Result, Txn};
use super::calls::{ClaimFrom, KeyCall, Next, Then};
use super::entry::{Held, Holding};
use super::holder_of;
use super::task::{PermitState, Task};

impl Task {
    /// A claim the watch cannot bring: posted before we took the key, or
    /// while our watch had lost its place. Looked for after every resync
    /// (and by a hold on a lease of our own, `Task::hold_read`).
    pub(super) fn find_claim(&mut self, pk: AgentPubkey) {
        if self.entries.get(&pk).is_none_or(|e| e.held().is_none()) {
            return;
        }
        self.run(pk, Next::Call(KeyCall::ReadClaim, Then::FoundClaim));
    }

    /// Posts our claim when another host holds the key; `tell`: the writer
    /// hears of the holder when the posting ends.
    pub(super) fn post_claim(&mut self, pk: AgentPubkey, tell: bool) -> Next {
        let e = &self.entries[&pk];
        if e.claim_until.is_none() || e.claim_lease.is_some() {
            return self.tell_if(pk, tell);
        }
        Next::Call(KeyCall::Grant, Then::ClaimLease { tell })
    }

    /// Post our claim, the lease's answer.
    pub(super) fn claim_leased(
        &mut self,
        pk: AgentPubkey,
        lease: Option<(i64, Duration)>,
        tell: bool,
    ) -> Next {
        let Some((lease, _)) = lease else {
            return self.tell_if(pk, tell);
        };
        let posted = Then::ClaimPosted { lease, tell };
        Next::Call(KeyCall::PostClaim { lease }, posted)
    }

    /// Post our claim, the put's answer: posted, or its lease goes.
    pub(super) fn claim_posted(
        &mut self,
        pk: AgentPubkey,
        posted: bool,
        lease: i64,
        tell: bool,
    ) -> Next {
        if !posted {
            return Next::Call(KeyCall::Revoke(lease), Then::ClaimDropped { tell });
        }
        if let Some(e) = self.entries.get_mut(&pk) {
            e.claim_lease = Some(lease);
            tracing::info!(pubkey = %pk, "posted a cross-host claim");
        }
        self.tell_if(pk, tell)
    }

    /// Tells the writer what it may not know yet, if `tell`; ends a chain.
    pub(super) fn tell_if(&mut self, pk: AgentPubkey, tell: bool) -> Next {
        if tell {
            self.tell(pk, None);
        }
        Next::End
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
        let read = Then::WithdrawRead { lease };
        self.run(pk, Next::Call(KeyCall::GetLeader, read));
    }

    /// Withdraw our claim, the leader key read. Unknown: the lease runs
    /// out on its own (one TTL).
    pub(super) fn withdraw_read(kv: Result<Option<Kv>>, lease: i64) -> Next {
        match kv {
            Ok(Some(kv)) if kv.lease == lease && !mutated!(RevokeClaim) => Next::End,
            Ok(_) => Next::Call(KeyCall::Revoke(lease), Then::Ignored),
            Err(_) => Next::End,
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
        let Some(e) = self.entries.get_mut(&pk) else {
            return;
        };
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
            // The defect put back: the key goes before the writer stopped.
            // (A chain run inside a decision: only this mutation does it.)
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
        let Some((held, claim, falling_back)) = e.take_hand_over() else {
            return;
        };
        let swap = KeyCall::HandOver {
            revision: held.revision,
            claim: claim.clone(),
        };
        let then = Then::Swapped {
            held,
            claim,
            falling_back,
        };
        self.run(pk, Next::Call(swap, then));
    }

    /// Hand over, the swap's answer.
    pub(super) fn swapped(
        &mut self,
        pk: AgentPubkey,
        txn: Option<Txn>,
        h: Held,
        claim: Kv,
        falling_back: bool,
    ) -> Next {
        match txn {
            // Our old lease, unless the claimant's key is bound to it now
            // (we had continued a lease of the claimant's host).
            Some(Txn::Done(_)) if h.lease != claim.lease || mutated!(RevokeSibling) => {
                let read = Then::GiveUpRead { lease: h.lease };
                Next::Call(KeyCall::GetLeader, read)
            }
            Some(Txn::Done(_)) => Next::End,
            // The key is still ours as we left it: the claim changed (a
            // newer one replaced it, or it was withdrawn). We still hold
            // (our writer stays stopped until a renewal opens the permit
            // again) and honour whatever claim is there now.
            Some(Txn::Failed(Some(kv))) if kv.lease == h.lease && kv.mod_revision == h.revision => {
                let Some(e) = self.entries.get_mut(&pk) else {
                    return Next::End;
                };
                // We stepped back from our host while the swap waited (for
                // our work records): the lease is a sibling's to continue,
                // as a step-back leaves it, not ours to hold without leading
                // (found by the phase check, H3: held and renewed by nobody
                // who acts, the claim unanswered until the lease ran out).
                // Shutting down, it is held once more to be revoked.
                if !e.leads && !self.shutting_down && !mutated!(HeldAfterStepBack) {
                    return Next::End;
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
                let newer = Then::NewerClaim {
                    claim_revision: claim.mod_revision,
                };
                Next::Call(KeyCall::ReadClaim, newer)
            }
            // No answer (it may have been applied): still standing down,
            // tried again (the compare tells). Dropping the hand-over here
            // left a key naming us that we did not hold, which the next
            // look continued as a sibling's (found by the simulator across
            // hosts; the teeth's `drop_unanswered_hand_over`).
            None if mutated!(DropUnansweredHandOver) => Next::End,
            None => {
                let retry = self.clock.now() + self.retry_delay();
                if let Some(e) = self.entries.get_mut(&pk) {
                    e.holding = Holding::HandingOver {
                        held: h,
                        claim,
                        falling_back,
                    };
                    e.swap_at = Some(retry);
                }
                Next::End
            }
            _ => Next::End,
        }
    }

    /// Whether `kv` is our claim granted (the holder rewrote the key for
    /// us, bound to our claim's lease) and we may take it: then we renew
    /// its lease and hold the key ([`Task::claim_kept`]).
    pub(super) fn claim_grantable(&self, pk: AgentPubkey, kv: &Kv) -> bool {
        let Some(e) = self.entries.get(&pk) else {
            return false;
        };
        let ours = holder_of(kv).instance_id == self.our_id;
        // Granted to a fail-safe host leader (no lock file): the sibling
        // that holds the lock continues it (found by the simulator across
        // hosts; the teeth's `granted_unlocked`).
        let locked = e.locked || mutated!(GrantedUnlocked);
        let granted =
            ours && e.leads && locked && e.held().is_none() && e.claim_lease == Some(kv.lease);
        // Not right after etcd lost data (see `Task::rewound`).
        granted && self.may_take()
    }

    /// Take a granted claim, its lease renewed (`None`: no answer): we
    /// hold the key, or the move that found it goes on.
    pub(super) fn claim_kept(
        &mut self,
        pk: AgentPubkey,
        ttl: Option<Duration>,
        kv: Kv,
        sent: u64,
        from: ClaimFrom,
    ) -> Next {
        match ttl.map(|t| self.bounded(t)) {
            Some(ttl) if !ttl.is_zero() => {
                let tail = matches!(from, ClaimFrom::Watch).then(|| kv.clone());
                let held = (kv.lease, kv.mod_revision, ttl, sent);
                self.hold(pk, held, ChangeReason::Claimed, tail)
            }
            _ => match from {
                ClaimFrom::Look { was } => self.look_on(pk, &kv, was),
                ClaimFrom::Watch => {
                    self.written_not_taken(pk, &kv);
                    Next::End
                }
            },
        }
    }
}
