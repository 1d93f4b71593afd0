//! The contender's moves on etcd: settle a key after a change of ours,
//! renew, look, acquire, adopt, hold, lose, step back, follow the watch
//! (the claims across hosts are `claims`).

use std::time::Duration;

use crate::elector::{ChangeReason, GlobalHolder};
use crate::pubkey::AgentPubkey;

use super::super::etcd::{Change, Kv, Txn};
use super::super::WhenUnreachable;
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
        let r = self.gw.keep_alive(h.lease);
        let Some(ttl) = self.noted(pk, r).map(|t| self.bounded(t)) else {
            return;
        };
        let e = self.entries.get_mut(&pk).expect("noted checked");
        if ttl.is_zero() {
            e.holding = Holding::Nothing;
            e.grant(PermitState::NotHeld, 0);
            tracing::warn!(pubkey = %pk, "etcd lease expired");
            self.tell(pk, Some(ChangeReason::Lost));
            return;
        }
        // A live lease proves nothing about the key: siblings of one host
        // continue one lease, so check that the key still names us, at the
        // revision we wrote it (or a later write of ours the watch brought).
        let key = self.cfg.leader_key(&pk);
        let r = self.gw.get_at(&key);
        let Some((kv, revision)) = self.noted(pk, r) else {
            return;
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
            return;
        };
        let e = self.entries.get_mut(&pk).expect("noted checked");
        // Valid all along, and the writer was told so: nothing to say.
        let was_valid = self.clock.boot_nanos() < h.until && e.told.state == PermitState::Held;
        let until = deadline(sent, ttl);
        e.grant(PermitState::Held, until);
        // A later write of ours that the watch has not brought (it was on
        // a member cut from the majority): the revision a hand-over must
        // compare is that one.
        e.holding = Holding::Key(Held {
            renew_at: self.clock.now() + ttl / 3,
            until,
            revision: written,
            ..h
        });
        if !was_valid {
            self.tell(pk, Some(ChangeReason::Unfenced));
        }
    }

    /// Looks at the key and takes it when it is free, ours or our host's.
    pub(super) fn look(&mut self, pk: AgentPubkey) {
        if self.entries.get(&pk).is_none_or(Entry::handing_over) {
            // Standing down: the key is the claimant's once our writer
            // confirms; continuing it now would undo the claim.
            return;
        }
        let key = self.cfg.leader_key(&pk);
        let r = self.gw.get_at(&key);
        let Some((kv, revision)) = self.noted(pk, r) else {
            return;
        };
        self.store_at(revision);
        let e = self.entries.get_mut(&pk).expect("noted checked");
        e.seen = e.seen.max(revision);
        let was = e.holder.clone();
        e.see(kv.as_ref().map(holder_of));
        match kv {
            None => self.acquire(pk, was.is_some()),
            Some(kv) => {
                let h = holder_of(&kv);
                let ours = h.instance_id == self.our_id;
                let held_now = e.held().is_some_and(|held| ours && held.lease == kv.lease);
                if held_now {
                    return;
                }
                if e.held().is_some() {
                    self.lost(pk);
                    return;
                }
                if self.claim_granted(pk, &kv) {
                    return;
                }
                self.claim_lease_taken(pk, &kv);
                let foreign_host = !h.host_id.is_empty() && h.host_id != self.cfg.host_id;
                if foreign_host && kv.lease != 0 && !mutated!(Steal) {
                    self.post_claim(pk);
                    if was != self.entries[&pk].holder {
                        self.tell(pk, None);
                    }
                    return;
                }
                // Our host's (a sibling crashed, stood down or handed the
                // host lock to us), ours from before, or a value nobody
                // can hold: continue it.
                self.adopt(pk, &kv);
            }
        }
    }

    pub(super) fn acquire(&mut self, pk: AgentPubkey, after_another: bool) {
        self.try_acquire(pk, after_another);
    }

    /// [`Task::acquire`]: `Some(true)` taken, `Some(false)` refused by
    /// etcd (a grant or the create failed), `None` not tried or someone
    /// else holds it.
    fn try_acquire(&mut self, pk: AgentPubkey, after_another: bool) -> Option<bool> {
        if !self.entries[&pk].locked && !mutated!(UnlockedAcquires) {
            // The NIP's fail-safe: a sibling may lead our host too and hold
            // the key, or take it next (found by the simulator across hosts
            // with disk faults; the teeth's `unlocked_acquires`).
            return None;
        }
        if !self.may_take() {
            // Right after etcd lost data: look again once old permits ran
            // out (`next_due` wakes us).
            let until = self.rewound_until;
            if let Some(e) = self.entries.get_mut(&pk) {
                e.retry_at = until;
            }
            return None;
        }
        let sent = self.clock.boot_nanos();
        let r = self.gw.grant(self.cfg.ttl);
        let Some((lease, ttl)) = self.noted(pk, r) else {
            return Some(false);
        };
        let ttl = self.bounded(ttl);
        let (key, value) = (self.cfg.leader_key(&pk), self.value());
        let r = self.gw.create(&key, &value, lease);
        match self.noted(pk, r) {
            Some(Txn::Done(revision)) => {
                let reason = if after_another {
                    ChangeReason::Failover
                } else {
                    ChangeReason::Acquired
                };
                self.hold(pk, lease, revision, ttl, sent, reason);
                Some(true)
            }
            Some(Txn::Failed(kv)) => {
                let _ = self.gw.revoke(lease);
                let e = self.entries.get_mut(&pk).expect("noted checked");
                e.see(kv.as_ref().map(holder_of));
                self.tell(pk, None);
                None
            }
            None => {
                let _ = self.gw.revoke(lease);
                Some(false)
            }
        }
    }

    /// Continues the lease `kv` is bound to, rewriting the key in our name
    /// only if nobody wrote it since we read it.
    pub(super) fn adopt(&mut self, pk: AgentPubkey, kv: &Kv) {
        if !self.entries[&pk].locked {
            // The NIP's fail-safe: the sibling that wrote the key may lead
            // our host too, and still act on it.
            return;
        }
        if !self.may_take() {
            // Right after etcd lost data: a lease restored from an old
            // snapshot may back a key while a forgotten one backs a permit
            // elsewhere (see `Task::rewound`).
            let until = self.rewound_until;
            if let Some(e) = self.entries.get_mut(&pk) {
                e.retry_at = until;
            }
            return;
        }
        let sent = self.clock.boot_nanos();
        let (lease, ttl) = if kv.lease == 0 {
            let r = self.gw.grant(self.cfg.ttl);
            match self.noted(pk, r) {
                Some(x) => x,
                None => return,
            }
        } else {
            let r = self.gw.keep_alive(kv.lease);
            match self.noted(pk, r) {
                // Expired: its deletion is on its way to the watch.
                Some(ttl) if ttl.is_zero() => return,
                Some(ttl) => (kv.lease, ttl),
                None => return,
            }
        };
        let ttl = self.bounded(ttl);
        let (key, value) = (self.cfg.leader_key(&pk), self.value());
        let r = self.gw.swap(&key, kv.mod_revision, &value, lease, None);
        match self.noted(pk, r) {
            Some(Txn::Done(revision)) => {
                self.hold(pk, lease, revision, ttl, sent, ChangeReason::HandedOver)
            }
            Some(Txn::Failed(kv)) => {
                let e = self.entries.get_mut(&pk).expect("noted checked");
                e.see(kv.as_ref().map(holder_of));
            }
            None => {}
        }
    }

    pub(super) fn hold(
        &mut self,
        pk: AgentPubkey,
        lease: i64,
        revision: u64,
        ttl: Duration,
        sent: u64,
        reason: ChangeReason,
    ) {
        self.store_at(revision);
        let host_id = self.cfg.host_id.clone();
        let our_id = self.our_id.clone();
        let e = self.entries.get_mut(&pk).expect("caller checked");
        // The last holder we know of; a key we found absent and never saw
        // held counts as ours (nobody else answered for it).
        let from_other_host = e.last_holder_host.as_ref().is_some_and(|h| *h != host_id);
        if !e.leads {
            // The host moved while we were asking: let the sibling have it.
            return;
        }
        let until = deadline(sent, ttl);
        e.holding = Holding::Key(Held {
            lease,
            revision,
            renew_at: self.clock.now() + ttl / 3,
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
        self.entries.get_mut(&pk).expect("checked").unread_since = None;
        let work = self.read_work(pk);
        self.entries.get_mut(&pk).expect("checked").work_news = work;
        // A claim waiting for whoever takes the key is honoured before the
        // writer hears of the gain (no act-then-stand-down). Only on a
        // lease of our own: a sibling whose lease we continue may be paused
        // with its permit still open, and a hand-over now would give the
        // key away under it (found by the simulator across hosts, when
        // its fault plan reached it; the teeth's `claim_on_siblings_lease`
        // lists it as guarded by nothing now).
        if matches!(reason, ChangeReason::Acquired | ChangeReason::Failover)
            || mutated!(ClaimOnSiblingsLease)
        {
            self.find_claim(pk);
            if self.entries[&pk].handing_over() {
                return;
            }
        }
        let now_ms = self.clock.unix_ms();
        self.tell_with(pk, Some(reason), from_other_host.then_some(now_ms), false);
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
        let key = self.cfg.leader_key(&pk);
        let r = self.gw.get(&key);
        match self.noted(pk, r) {
            Some(Some(kv))
                if kv.lease == lease
                    && holder_of(&kv).instance_id != self.our_id
                    && !mutated!(RevokeSibling) => {}
            Some(_) => {
                let r = self.gw.revoke(lease);
                self.noted(pk, r);
            }
            None => {}
        }
    }

    /// A change seen by the watch.
    pub(super) fn changed(&mut self, c: Change) {
        let Some((pk, kind)) = self.parse_key(&c.key) else {
            return;
        };
        if !self.entries.contains_key(&pk) {
            return;
        }
        // The watch may deliver a change older than what a call of ours
        // has seen since (a look that found the key deleted and created
        // it again): the latest revision wins.
        if kind == "leader" {
            let e = self.entries.get_mut(&pk).expect("checked");
            if c.revision < e.seen {
                return;
            }
            e.seen = c.revision;
        }
        match (kind, c.kv) {
            ("leader", Some(kv)) => self.leader_written(pk, &kv),
            ("leader", None) => {
                let e = self.entries.get_mut(&pk).expect("checked");
                let had = e.holder.take().is_some();
                e.retry_at = None;
                // A hand-over still waiting when our lease ran out is moot:
                // the key is free (a claim still posted is honoured again
                // by whoever takes it).
                let _ = e.take_hand_over();
                e.swap_at = None;
                if e.held().is_some() {
                    // Revoked or expired under us.
                    self.lost(pk);
                }
                if self.entries[&pk].leads {
                    self.acquire(pk, had);
                } else {
                    self.tell(pk, None);
                }
            }
            ("claim", Some(kv)) if self.entries[&pk].held().is_some() => self.hand_over(pk, &kv),
            _ => {}
        }
    }

    pub(super) fn leader_written(&mut self, pk: AgentPubkey, kv: &Kv) {
        if !self.claim_granted(pk, kv) {
            self.claim_lease_taken(pk, kv);
        }
        let h = holder_of(kv);
        let our_id = self.our_id.clone();
        let e = self.entries.get_mut(&pk).expect("checked");
        e.see(Some(h.clone()));
        match e.held_mut() {
            Some(held) if kv.mod_revision <= held.revision => {}
            Some(held) if h.instance_id == our_id && kv.lease == held.lease => {
                held.revision = kv.mod_revision;
            }
            Some(_) => self.lost(pk),
            None => self.tell(pk, None),
        }
    }

    pub(super) fn parse_key<'a>(&self, key: &'a str) -> Option<(AgentPubkey, &'a str)> {
        let rest = key.strip_prefix(&self.cfg.prefix)?.strip_prefix('/')?;
        let (pk, kind) = rest.split_once('/')?;
        Some((AgentPubkey::parse(pk).ok()?, kind))
    }

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
