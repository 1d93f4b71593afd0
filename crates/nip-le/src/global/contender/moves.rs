//! The contender's moves to take and keep a key: settle a key after a
//! change of ours, renew, look, acquire, adopt, hold, lose (giving a key up
//! is `leaving`, the claims across hosts `claims`, the watch's changes
//! `changes`). Each move is a chain of decisions; a decision that needs
//! etcd returns the call as data ([`Next`]) and `calls` makes it.

use std::time::Duration;

use crate::elector::{ChangeReason, GlobalHolder};
use crate::pubkey::AgentPubkey;

use super::super::etcd::{Kv, Result, Txn};
use super::calls::{ClaimFrom, KeyCall, Next, Then};
use super::entry::{Entry, Held, Holding};
use super::holder_of;
use super::renewer::deadline;
use super::task::{PermitState, Task};

impl Task {
    /// Everything a key needs now, in one place and in this order (as
    /// client-go's `tryAcquireOrRenew`; the phases are `phase.rs`'s):
    ///
    /// 1. a claim of ours that expired is withdrawn;
    /// 2. idle, handing over, or waiting out a failed call: nothing is
    ///    asked of etcd (a hand-over waits for our writer's confirmation,
    ///    and taking the key back would undo the claim); go to 5;
    /// 3. held: renew when due, or at once when told to verify (a resync),
    ///    then look for a claim the watch could not bring;
    /// 4. not held (or verifying) and the watch cannot tell us: look, and
    ///    acquire a free key, adopt our host's, or post our claim;
    /// 5. etcd silent a whole TTL: fall back (or not, by the policy); an
    ///    answer again ends the fall-back.
    pub(super) fn settle(&mut self, pk: AgentPubkey) {
        let now = self.clock.now();
        let Some(e) = self.entries.get(&pk) else {
            return;
        };
        if e.claim_until.is_some_and(|t| t <= now) {
            self.claim_expired(pk);
        }
        let e = &self.entries[&pk];
        // Standing down for a claim: the key is the claimant's as soon as
        // our writer confirms; taking it back now would undo the claim.
        if !e.leads || e.handing_over() || e.retry_at.is_some_and(|t| t > now) {
            self.check_unreachable(pk);
            return;
        }
        let (held, verify) = (e.held(), e.verify);
        let look = verify || (held.is_none() && self.needs_look(e));
        if let Some(e) = self.entries.get_mut(&pk) {
            e.verify = false;
        }
        match held {
            Some(h) if verify || h.renew_at <= now => {
                self.renew(pk, h);
                if verify {
                    self.find_claim(pk);
                }
            }
            _ => {}
        }
        if look {
            self.look(pk);
        }
        self.check_unreachable(pk);
    }

    /// Whether a host leader that does not hold the key must ask etcd now:
    /// nothing known, our host's holder to continue, a claim to post, or
    /// no word from etcd for half a TTL (the watch is silent when nothing
    /// changes; this is how an unreachable etcd is noticed). Otherwise the
    /// watch tells us.
    pub(super) fn needs_look(&self, e: &Entry) -> bool {
        let foreign = e
            .holder
            .as_ref()
            .is_some_and(|h| !h.host_id.is_empty() && h.host_id != self.cfg.host_id);
        !foreign
            || e.verify
            || (e.claim_until.is_some() && e.claim_lease.is_none())
            || self.silence() >= self.cfg.ttl / 2
    }

    /// Renews our lease; a lease that etcd no longer knows means the key
    /// is gone.
    pub(super) fn renew(&mut self, pk: AgentPubkey, h: Held) {
        if !self.entries[&pk].locked && !mutated!(UnlockedKeepsLease) {
            // The NIP's fail-safe: the sibling holding our host's lock
            // continues the lease; we stop acting on it (found by the
            // simulator across hosts with disk faults; the teeth's
            // `unlocked_keeps_lease`).
            self.step_back_for(pk, false, Some(ChangeReason::Lost));
            return;
        }
        let sent = self.clock.boot_nanos();
        let renewed = Then::Renewed { held: h, sent };
        self.run(pk, Next::Call(KeyCall::KeepAlive(h.lease), renewed));
    }

    /// Renew, the lease's answer (`None`: no answer).
    pub(super) fn renewed(
        &mut self,
        pk: AgentPubkey,
        h: Held,
        sent: u64,
        ttl: Option<Duration>,
    ) -> Next {
        let Some(ttl) = ttl.map(|t| self.bounded(t)) else {
            return Next::End;
        };
        let Some(e) = self.entries.get_mut(&pk) else {
            return Next::End;
        };
        if ttl.is_zero() {
            e.holding = Holding::Nothing;
            e.grant(PermitState::NotHeld, 0);
            tracing::warn!(pubkey = %pk, "etcd lease expired");
            self.tell(pk, Some(ChangeReason::Lost));
            return Next::End;
        }
        // A live lease proves nothing about the key: siblings of one host
        // continue one lease, so check that the key still names us, at the
        // revision we wrote it (or a later write of ours the watch brought).
        let read = Then::RenewRead { held: h, sent, ttl };
        Next::Call(KeyCall::ReadLeader, read)
    }

    /// Renew, the key read back: still ours, the permit runs on from the
    /// keep-alive; another's, the key is lost.
    pub(super) fn renew_read(
        &mut self,
        pk: AgentPubkey,
        h: Held,
        (sent, ttl): (u64, Duration),
        read: Option<(Option<Kv>, u64)>,
    ) -> Next {
        let Some((kv, revision)) = read else {
            return Next::End;
        };
        self.store_at(revision);
        let ours = kv.as_ref().is_some_and(|kv| {
            kv.lease == h.lease
                && kv.mod_revision >= h.revision
                && holder_of(kv).instance_id == self.our_id
        });
        let written = kv.as_ref().filter(|_| ours).map(|kv| kv.mod_revision);
        let Some(written) = written else {
            if let Some(e) = self.entries.get_mut(&pk) {
                e.see(kv.as_ref().map(holder_of));
            }
            self.lost(pk);
            return Next::End;
        };
        let now = (self.clock.boot_nanos(), self.clock.now());
        let Some(e) = self.entries.get_mut(&pk) else {
            return Next::End;
        };
        // Valid all along, and the writer was told so: nothing to say.
        let was_valid = now.0 < h.until && e.told.state == PermitState::Held;
        let until = deadline(sent, ttl);
        e.grant(PermitState::Held, until);
        // A later write of ours that the watch has not brought (it was on
        // a member cut from the majority): the revision a hand-over must
        // compare is that one.
        e.holding = Holding::Key(Held {
            renew_at: now.1 + ttl / 3,
            until,
            revision: written,
            ..h
        });
        if !was_valid {
            self.tell(pk, Some(ChangeReason::Unfenced));
        }
        Next::End
    }

    /// Looks at the key and takes it when it is free, ours or our host's.
    pub(super) fn look(&mut self, pk: AgentPubkey) {
        if self.entries.get(&pk).is_none_or(Entry::handing_over) {
            // Standing down: the key is the claimant's once our writer
            // confirms; continuing it now would undo the claim.
            return;
        }
        self.run(pk, Next::Call(KeyCall::ReadLeader, Then::Looked));
    }

    /// Look, the key read: acquire it when free, take a claim of ours
    /// that was granted, post a claim on another host's, adopt our host's.
    pub(super) fn looked(&mut self, pk: AgentPubkey, read: Option<(Option<Kv>, u64)>) -> Next {
        let Some((kv, revision)) = read else {
            return Next::End;
        };
        self.store_at(revision);
        let Some(e) = self.entries.get_mut(&pk) else {
            return Next::End;
        };
        e.seen = e.seen.max(revision);
        let was = e.holder.clone();
        e.see(kv.as_ref().map(holder_of));
        let Some(kv) = kv else {
            return self.acquire(pk, was.is_some());
        };
        let ours = holder_of(&kv).instance_id == self.our_id;
        if e.held().is_some_and(|held| ours && held.lease == kv.lease) {
            return Next::End;
        }
        if e.held().is_some() {
            self.lost(pk);
            return Next::End;
        }
        if self.claim_grantable(pk, &kv) {
            let (sent, lease) = (self.clock.boot_nanos(), kv.lease);
            let from = ClaimFrom::Look { was };
            let kept = Then::ClaimKept { kv, sent, from };
            return Next::Call(KeyCall::KeepAlive(lease), kept);
        }
        self.look_on(pk, &kv, was)
    }

    /// Look, a key somebody holds that is not our granted claim: post our
    /// claim when another host holds it, adopt it otherwise.
    pub(super) fn look_on(&mut self, pk: AgentPubkey, kv: &Kv, was: Option<GlobalHolder>) -> Next {
        self.claim_lease_taken(pk, kv);
        let h = holder_of(kv);
        let foreign_host = !h.host_id.is_empty() && h.host_id != self.cfg.host_id;
        if foreign_host && kv.lease != 0 && !mutated!(Steal) {
            let tell = self.entries.get(&pk).is_some_and(|e| was != e.holder);
            return self.post_claim(pk, tell);
        }
        // Our host's (a sibling crashed, stood down or handed the host lock
        // to us), ours from before, or a value nobody can hold: continue
        // it.
        self.adopt(pk, kv)
    }

    /// Acquires a free key: a lease, then the key created on it unless
    /// somebody was first.
    pub(super) fn acquire(&mut self, pk: AgentPubkey, after_another: bool) -> Next {
        if !self.entries[&pk].locked && !mutated!(UnlockedAcquires) {
            // The NIP's fail-safe: a sibling may lead our host too and hold
            // the key, or take it next (found by the simulator across hosts
            // with disk faults; the teeth's `unlocked_acquires`).
            return Next::End;
        }
        if !self.may_take() {
            // Right after etcd lost data: look again once old permits ran
            // out (`next_due` wakes us).
            let until = self.rewound_until;
            if let Some(e) = self.entries.get_mut(&pk) {
                e.retry_at = until;
            }
            return Next::End;
        }
        let sent = self.clock.boot_nanos();
        let then = Then::AcquireLease {
            after_another,
            sent,
        };
        Next::Call(KeyCall::Grant, then)
    }

    /// Acquire, the lease's answer.
    pub(super) fn acquire_leased(
        &self,
        lease: Option<(i64, Duration)>,
        sent: u64,
        after_another: bool,
    ) -> Next {
        let Some((lease, ttl)) = lease else {
            return Next::End;
        };
        let ttl = self.bounded(ttl);
        let created = Then::Created {
            lease,
            ttl,
            sent,
            after_another,
        };
        Next::Call(KeyCall::Create { lease }, created)
    }

    /// Acquire, the create's answer: held, or its lease goes.
    pub(super) fn created(
        &mut self,
        pk: AgentPubkey,
        txn: Option<Txn>,
        (lease, ttl, sent): (i64, Duration, u64),
        after_another: bool,
    ) -> Next {
        match txn {
            Some(Txn::Done(revision)) => {
                let reason = if after_another {
                    ChangeReason::Failover
                } else {
                    ChangeReason::Acquired
                };
                self.hold(pk, (lease, revision, ttl, sent), reason, None)
            }
            Some(Txn::Failed(kv)) => Next::Call(KeyCall::Revoke(lease), Then::CreateBeaten { kv }),
            None => Next::Call(KeyCall::Revoke(lease), Then::Ignored),
        }
    }

    /// Acquire, somebody was first: the writer hears who.
    pub(super) fn create_beaten(&mut self, pk: AgentPubkey, kv: Option<Kv>) -> Next {
        if let Some(e) = self.entries.get_mut(&pk) {
            e.see(kv.as_ref().map(holder_of));
            self.tell(pk, None);
        }
        Next::End
    }

    /// Continues the lease `kv` is bound to, rewriting the key in our name
    /// only if nobody wrote it since we read it.
    pub(super) fn adopt(&mut self, pk: AgentPubkey, kv: &Kv) -> Next {
        if !self.entries[&pk].locked {
            // The NIP's fail-safe: the sibling that wrote the key may lead
            // our host too, and still act on it.
            return Next::End;
        }
        if !self.may_take() {
            // Right after etcd lost data: a lease restored from an old
            // snapshot may back a key while a forgotten one backs a permit
            // elsewhere (see `Task::rewound`).
            let until = self.rewound_until;
            if let Some(e) = self.entries.get_mut(&pk) {
                e.retry_at = until;
            }
            return Next::End;
        }
        let (sent, kv) = (self.clock.boot_nanos(), kv.clone());
        if kv.lease == 0 {
            Next::Call(KeyCall::Grant, Then::AdoptGranted { kv, sent })
        } else {
            let lease = kv.lease;
            Next::Call(KeyCall::KeepAlive(lease), Then::AdoptKept { kv, sent })
        }
    }

    /// Adopt, the lease to continue (`None`: none).
    pub(super) fn adopt_leased(&self, lease: Option<(i64, Duration)>, kv: &Kv, sent: u64) -> Next {
        let Some((lease, ttl)) = lease else {
            return Next::End;
        };
        let ttl = self.bounded(ttl);
        let swap = KeyCall::Adopt {
            revision: kv.mod_revision,
            lease,
        };
        Next::Call(swap, Then::Adopted { lease, ttl, sent })
    }

    /// Adopt, the rewrite's answer.
    pub(super) fn adopted(
        &mut self,
        pk: AgentPubkey,
        txn: Option<Txn>,
        (lease, ttl, sent): (i64, Duration, u64),
    ) -> Next {
        match txn {
            Some(Txn::Done(revision)) => self.hold(
                pk,
                (lease, revision, ttl, sent),
                ChangeReason::HandedOver,
                None,
            ),
            Some(Txn::Failed(kv)) => {
                if let Some(e) = self.entries.get_mut(&pk) {
                    e.see(kv.as_ref().map(holder_of));
                }
                Next::End
            }
            None => Next::End,
        }
    }

    /// We hold the key on `lease` at `revision`, renewed with `ttl` at
    /// `sent`: the permit opens, then the agent's work records are read
    /// for the writer. `tail`: a change the watch brought, applied when
    /// the hold ends (see [`Task::leader_written`]).
    pub(super) fn hold(
        &mut self,
        pk: AgentPubkey,
        (lease, revision, ttl, sent): (i64, u64, Duration, u64),
        reason: ChangeReason,
        tail: Option<Kv>,
    ) -> Next {
        self.store_at(revision);
        let host_id = self.cfg.host_id.clone();
        let our_id = self.our_id.clone();
        let now = self.clock.now();
        let Some(e) = self.entries.get_mut(&pk) else {
            return Next::End;
        };
        // The last holder we know of; a key we found absent and never saw
        // held counts as ours (nobody else answered for it).
        let from_other_host = e.last_holder_host.as_ref().is_some_and(|h| *h != host_id);
        if !e.leads {
            // The host moved while we were asking: let the sibling have it.
            return self.end_hold(pk, tail);
        }
        let until = deadline(sent, ttl);
        e.holding = Holding::Key(Held {
            lease,
            revision,
            renew_at: now + ttl / 3,
            until,
        });
        e.see(Some(GlobalHolder {
            host_id,
            instance_id: our_id,
            revision,
        }));
        e.claim_until = None;
        e.claim_lease = None;
        e.seen = e.seen.max(revision);
        e.grant(PermitState::Held, until);
        tracing::info!(pubkey = %pk, revision, ?reason, instance = %self.our_id, "holds the etcd lease");
        // What every host recorded of the agent's work comes with the gain,
        // or with the stand-down for a claim found now: a hand-over that
        // then fails reopens the permit on this snapshot, never on none.
        e.unread_since = None;
        let read = Then::HoldRead {
            reason,
            from_other_host,
            tail,
        };
        Next::Call(KeyCall::ReadWork, read)
    }

    /// Hold, the records read. A claim waiting for whoever takes the key is
    /// honoured before the writer hears of the gain (no
    /// act-then-stand-down). Only on a lease of our own: a sibling whose
    /// lease we continue may be paused with its permit still open, and a
    /// hand-over now would give the key away under it (found by the
    /// simulator across hosts, when its fault plan reached it; the teeth's
    /// `claim_on_siblings_lease` lists it as guarded by nothing now).
    pub(super) fn hold_read(
        &mut self,
        pk: AgentPubkey,
        read: Result<Vec<Kv>>,
        (reason, from_other_host): (ChangeReason, bool),
        tail: Option<Kv>,
    ) -> Next {
        let work = self.work_read(pk, read);
        let Some(e) = self.entries.get_mut(&pk) else {
            return Next::End;
        };
        e.work_news = work;
        let find_claim = matches!(reason, ChangeReason::Acquired | ChangeReason::Failover)
            || mutated!(ClaimOnSiblingsLease);
        if find_claim && e.held().is_some() {
            let claim = Then::HoldClaim {
                reason,
                from_other_host,
                tail,
            };
            return Next::Call(KeyCall::ReadClaim, claim);
        }
        self.hold_told(pk, (reason, from_other_host), tail)
    }

    /// Hold, the claim key read: a claim stands us down at once.
    pub(super) fn hold_claim(
        &mut self,
        pk: AgentPubkey,
        claim: Option<Option<Kv>>,
        (reason, from_other_host): (ChangeReason, bool),
        tail: Option<Kv>,
    ) -> Next {
        if let Some(Some(claim)) = claim {
            self.hand_over(pk, &claim);
        }
        if self.entries.get(&pk).is_some_and(Entry::handing_over) {
            return self.end_hold(pk, tail);
        }
        self.hold_told(pk, (reason, from_other_host), tail)
    }

    /// Hold, the writer hears of the gain (whether it came from another
    /// host: what was published before now it may have answered).
    fn hold_told(
        &mut self,
        pk: AgentPubkey,
        (reason, from_other_host): (ChangeReason, bool),
        tail: Option<Kv>,
    ) -> Next {
        let now_ms = self.clock.unix_ms();
        self.tell_with(pk, Some(reason), from_other_host.then_some(now_ms), false);
        self.end_hold(pk, tail)
    }

    /// The end of a hold: the change the watch brought, if it started it.
    fn end_hold(&mut self, pk: AgentPubkey, tail: Option<Kv>) -> Next {
        if let Some(kv) = tail {
            self.written(pk, &kv);
        }
        Next::End
    }

    /// Someone else holds the key now. We look again only after a while:
    /// two windows of one host that both think they lead it (a fail-safe
    /// host leader) must not take the key from each other in a hot loop.
    pub(super) fn lost(&mut self, pk: AgentPubkey) {
        let e = self.entries.get_mut(&pk).expect("caller checked");
        e.retry_at = Some(self.clock.now() + self.cfg.ttl / 4);
        if e.take_held().is_some() {
            e.grant(PermitState::NotHeld, 0);
            tracing::warn!(pubkey = %pk, instance = %self.our_id, "lost the etcd key");
            self.tell(pk, Some(ChangeReason::Lost));
        }
    }
}
