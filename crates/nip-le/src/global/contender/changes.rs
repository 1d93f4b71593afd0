//! What the watch's changes do to a key: a leader key written (ours, a
//! claim of ours granted, or somebody else's), deleted (free: acquire it),
//! or a claim posted on a key we hold (stand down for it).

use crate::pubkey::AgentPubkey;

use super::super::etcd::{Change, Kv};
use super::calls::{ClaimFrom, KeyCall, Next, Then};
use super::holder_of;
use super::task::Task;

impl Task {
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
                    let acquire = self.acquire(pk, had);
                    self.run(pk, acquire);
                } else {
                    self.tell(pk, None);
                }
            }
            ("claim", Some(kv)) if self.entries[&pk].held().is_some() => self.hand_over(pk, &kv),
            _ => {}
        }
    }

    /// The leader key was written: a claim of ours granted is taken first
    /// (its lease renewed), then the change applies ([`Task::written`]).
    pub(super) fn leader_written(&mut self, pk: AgentPubkey, kv: &Kv) {
        if self.claim_grantable(pk, kv) {
            let (sent, lease) = (self.clock.boot_nanos(), kv.lease);
            let from = ClaimFrom::Watch;
            let kept = Then::ClaimKept {
                kv: kv.clone(),
                sent,
                from,
            };
            self.run(pk, Next::Call(KeyCall::KeepAlive(lease), kept));
            return;
        }
        self.written_not_taken(pk, kv);
    }

    /// A written leader key that we did not take as our granted claim: a
    /// claim lease it is bound to is no longer ours, and the change
    /// applies.
    pub(super) fn written_not_taken(&mut self, pk: AgentPubkey, kv: &Kv) {
        self.claim_lease_taken(pk, kv);
        self.written(pk, kv);
    }

    /// What a written leader key tells a key we hold or watch: a later
    /// write of ours moves our revision, anybody else's means we lost it.
    pub(super) fn written(&mut self, pk: AgentPubkey, kv: &Kv) {
        let h = holder_of(kv);
        let our_id = self.our_id.clone();
        let Some(e) = self.entries.get_mut(&pk) else {
            return;
        };
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

    /// The agent and the kind of key (`leader`, `claim`, `work/…`) of a
    /// key under our prefix.
    pub(super) fn parse_key<'a>(&self, key: &'a str) -> Option<(AgentPubkey, &'a str)> {
        let rest = key.strip_prefix(&self.cfg.prefix)?.strip_prefix('/')?;
        let (pk, kind) = rest.split_once('/')?;
        Some((AgentPubkey::parse(pk).ok()?, kind))
    }
}
