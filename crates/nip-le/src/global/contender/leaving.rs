//! Giving a key up: stepping back when we no longer lead our host, giving
//! a lease up without deleting a sibling's key, and giving everything up
//! at shutdown.

use crate::elector::ChangeReason;
use crate::pubkey::AgentPubkey;

use super::super::etcd::Kv;
use super::calls::{KeyCall, Next, Then};
use super::holder_of;
use super::task::{PermitState, Task};

impl Task {
    /// We no longer lead our host: stop acting at once; give the agent up
    /// when no sibling will continue it.
    pub(super) fn step_back(&mut self, pk: AgentPubkey, revoke: bool) {
        self.step_back_for(pk, revoke, None);
    }

    /// [`Task::step_back`], announcing `reason` (a step back the writer
    /// did not decide itself). A hand-over waiting for the writer's
    /// confirmation completes now: the writer stopped acting on the key
    /// when it stopped leading, and may never confirm for a key it left.
    pub(super) fn step_back_for(
        &mut self,
        pk: AgentPubkey,
        revoke: bool,
        reason: Option<ChangeReason>,
    ) {
        self.hand_over_confirmed(pk);
        let e = self.entries.get_mut(&pk).expect("caller inserted");
        e.grant(PermitState::NotHeld, 0);
        e.set_falling_back(false);
        if let Some(h) = e.take_held() {
            if revoke {
                self.give_up_lease(pk, h.lease);
            }
        }
        self.tell(pk, reason);
    }

    /// Revokes the lease we held the key with, unless the key names a
    /// sibling of ours now: siblings continue one lease, so one of two
    /// windows that both led the host (the NIP's fail-safe) would delete
    /// the key under the other (found by the simulator; the teeth's
    /// `revoke_sibling`). Unknown (etcd did not answer): the lease runs
    /// out on its own.
    pub(super) fn give_up_lease(&mut self, pk: AgentPubkey, lease: i64) {
        let read = Then::GiveUpRead { lease };
        self.run(pk, Next::Call(KeyCall::GetLeader, read));
    }

    /// Give a lease up, the key read (`None`: no answer).
    pub(super) fn give_up_read(&self, kv: Option<Option<Kv>>, lease: i64) -> Next {
        match kv {
            Some(Some(kv))
                if kv.lease == lease
                    && holder_of(&kv).instance_id != self.our_id
                    && !mutated!(RevokeSibling) =>
            {
                Next::End
            }
            Some(_) => Next::Call(KeyCall::Revoke(lease), Then::GiveUpRevoked),
            None => Next::End,
        }
    }

    /// Shutdown: every lease we still hold is revoked (the writer has
    /// stepped down everywhere already, handing to siblings where it
    /// could; those were told with `revoke: false`).
    pub(crate) fn give_up_all(&mut self) {
        self.give_up_work();
        self.shutting_down = true;
        // A hand-over the writer had no time to confirm: it has stopped
        // acting by now, so the claimant gets the key.
        let handing: Vec<AgentPubkey> = self
            .entries
            .iter()
            .filter(|(_, e)| e.handing_over())
            .map(|(pk, _)| *pk)
            .collect();
        for pk in handing {
            self.hand_over_confirmed(pk);
        }
        let held: Vec<(AgentPubkey, i64)> = self
            .entries
            .iter()
            .filter_map(|(pk, e)| Some((*pk, e.held()?.lease)))
            .collect();
        for (pk, lease) in held {
            self.give_up_lease(pk, lease);
        }
        let claims: Vec<(AgentPubkey, i64)> = self
            .entries
            .iter()
            .filter_map(|(pk, e)| Some((*pk, e.claim_lease?)))
            .collect();
        for (pk, lease) in claims {
            self.withdraw_claim(pk, lease);
        }
    }
}
