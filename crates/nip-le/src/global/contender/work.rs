//! The agent's work ledger as etcd keeps it for every host, so that the
//! ledger follows the agent when another host gains it: a host's own
//! ledger file only knows what its windows did.
//!
//! `<prefix>/<pubkey>/work/<event id>` holds a record naming the window:
//!
//! * `take`: written when the writer grants a take, in one transaction
//!   fenced by our hold (`MOD(leader) == held.revision`) that creates the
//!   record only if there is none (a take sent late never overwrites a
//!   done: `a_take_recorded_late_never_overwrites_a_done`), bound to a lease
//!   of this window that is renewed while any take of ours is open. So a
//!   take record lives while its window runs (at most a TTL
//!   after it died): another host's holder leaves the event to it, as a
//!   host's ledger leaves an event to a live taker.
//! * `done`: the reply was sent. Written whoever leads by now (fence the
//!   take, not the done), bound to a retention lease (the work retention,
//!   a new lease once half of it passed): etcd forgets old records on its
//!   own, so the range stays bounded. A done etcd refuses is kept (up to
//!   [`super::outbox::MAX_UNSENT`]) and sent again, before any lease is
//!   given up.
//! * a give-back deletes our take record (only the one we wrote).
//!
//! A holder that gains the key reads the range once (before the writer
//! hears of the gain) and hands the writer what is done and what is taken;
//! while another window's take is open it reads again every TTL/3, so an
//! event whose taker died is owed within a TTL and a third. Records travel
//! through the task's inbox in the writer's order: a take or done told
//! before a hand-over is in etcd before the claimant can read the range.
//! The watch sees these keys too and ignores them.
//!
//! Which record goes when, and what an answer means, is the outbox's
//! (a machine: [`super::outbox`]); this file is its shell (the calls, the
//! records' format) and the reads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::pubkey::AgentPubkey;
use crate::work::{gives_up_on_records, RecordView, SharedWork};

use super::super::etcd::{Etcd, Kv, Result, Txn};
use super::super::{EtcdConfig, WorkRecord};
use super::calls::{KeyCall, Next, Then};
use super::entry::{Entry, Holding};
use super::outbox::{Answer, Fence, Learnt, ReadBack, Scope, Times, WorkCall};
use super::task::Task;

/// Most records read for one agent: more is treated as unreadable.
pub(crate) const MAX_RECORDS: usize = 100_000;
/// Largest record value read.
const MAX_RECORD_BYTES: usize = 1024;

/// One record's value.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    /// `take` or `done`.
    op: String,
    host_id: String,
    instance_id: String,
    at_ms: u64,
}

/// `<prefix>/<pubkey>/work/`.
fn work_prefix(cfg: &EtcdConfig, pk: &AgentPubkey) -> String {
    format!("{}/{pk}/work/", cfg.prefix)
}

/// The raw keys under `pk`'s work prefix, at most [`MAX_RECORDS`].
fn read_range(cfg: &EtcdConfig, gw: &dyn Etcd, pk: &AgentPubkey) -> Result<Vec<Kv>> {
    gw.range(&work_prefix(cfg, pk), MAX_RECORDS)
}

/// Every record of `pk` (see [`crate::global::work_records`]).
pub(crate) fn records(
    cfg: &EtcdConfig,
    gw: &dyn Etcd,
    pk: &AgentPubkey,
) -> Result<Vec<WorkRecord>> {
    let prefix = work_prefix(cfg, pk);
    let kvs = read_range(cfg, gw, pk)?;
    Ok(kvs
        .iter()
        .filter_map(|kv| {
            let (id, r) = parse(&prefix, kv)?;
            Some(WorkRecord {
                id: id.to_owned(),
                done: r.op == "done",
                host_id: r.host_id,
                instance_id: r.instance_id,
                at_ms: r.at_ms,
            })
        })
        .collect())
}

/// One record under `prefix`: its event id and value, unless hostile.
fn parse<'a>(prefix: &str, kv: &'a Kv) -> Option<(&'a str, Record)> {
    let id = kv.key.strip_prefix(prefix)?;
    if crate::ledger::validate_event_id(id).is_err() || kv.value.len() > MAX_RECORD_BYTES {
        return None;
    }
    let r: Record = serde_json::from_slice(&kv.value).ok()?;
    matches!(r.op.as_str(), "take" | "done").then_some((id, r))
}

impl Task {
    /// `<prefix>/<pubkey>/work/`.
    fn work_prefix(&self, pk: &AgentPubkey) -> String {
        work_prefix(&self.cfg, pk)
    }

    /// Reads every work record of `pk` (for [`KeyCall::ReadWork`]).
    pub(super) fn read_records(&self, pk: &AgentPubkey) -> Result<Vec<Kv>> {
        read_range(&self.cfg, &*self.gw, pk)
    }

    fn record(&self, op: &str) -> Vec<u8> {
        serde_json::to_vec(&Record {
            op: op.to_owned(),
            host_id: self.cfg.host_id.clone(),
            instance_id: self.our_id.clone(),
            at_ms: self.clock.unix_ms(),
        })
        .unwrap_or_default()
    }

    /// The writer granted a take of `id`: recorded at once, fenced by our
    /// hold (or, under the fall-back, where we hold nothing, unfenced once
    /// etcd answers: the turn is real, and a host that gains the agent
    /// meanwhile must leave it to us: the simulator across hosts with every
    /// mention answered once,
    /// `three_hosts_on_one_etcd_never_have_two_holders_and_answer_once_across_200_seeds`).
    /// A record etcd refuses is sent again, and a
    /// hand-over to another host waits for it (see [`Task::work_sent`]).
    pub(super) fn took(&mut self, pk: AgentPubkey, id: String) {
        self.work.took(pk, id);
        self.send_work(Scope::Fresh);
    }

    /// A take of ours ended: a done is recorded for every host, a give-back
    /// deletes our record.
    pub(super) fn settled(&mut self, pk: AgentPubkey, id: String, done: bool) {
        self.work.settled(pk, id, done);
        self.send_work(Scope::Sends);
    }

    /// Whether every record of `pk` we owe etcd is there (sent again now
    /// if not): a hand-over to another host waits until it is, or the
    /// claimant would answer again what we took or did.
    pub(super) fn work_sent(&mut self, pk: AgentPubkey) -> bool {
        self.work.hurry();
        self.send_work(Scope::Sends);
        self.work.sent(&pk)
    }

    /// Whatever the records need now: what etcd did not take sent again,
    /// our takes' lease renewed while a take is open.
    pub(super) fn keep_work(&mut self) {
        self.send_work(Scope::All);
    }

    /// When the records need us next.
    pub(super) fn work_due(&self) -> Option<Instant> {
        self.work.due()
    }

    /// On shutdown: the dones go out first (a successor reads them), then
    /// our take records go with their lease (none is written now: it would
    /// need a new lease, and outlive us).
    pub(super) fn give_up_work(&mut self) {
        self.work.hurry();
        self.send_work(Scope::Dones);
        if let Some(lease) = self.work.give_up() {
            let _ = self.gw.revoke(lease);
        }
    }

    /// The shell of [`WorkOutbox`](super::outbox::WorkOutbox): makes its calls within `scope`, one at
    /// a time, and applies what each answer teaches the task.
    fn send_work(&mut self, scope: Scope) {
        self.list_leases();
        let t = Times {
            ttl: self.cfg.ttl,
            retention: self.retention,
            retry: self.retry_delay(),
        };
        loop {
            let entries = &self.entries;
            let now = self.clock.now();
            let Some(call) = self.work.next(now, &t, scope, |pk| fence(entries, pk)) else {
                return;
            };
            let answer = self.ask(&call);
            let now = self.clock.now();
            for learnt in self.work.answered(call, answer, now, &t) {
                match learnt {
                    Learnt::Contact => self.last_contact = now,
                    Learnt::StoreAt(rev) => self.store_at(rev),
                    Learnt::Refence { pk, revision } => {
                        if let Some(h) = self.entries.get_mut(&pk).and_then(Entry::held_mut) {
                            h.revision = revision;
                        }
                    }
                }
            }
        }
    }

    /// Makes `call` on etcd.
    fn ask(&self, call: &WorkCall) -> Answer {
        let key = |pk: &AgentPubkey, id: &str| format!("{}{id}", self.work_prefix(pk));
        let answer = match call {
            WorkCall::GrantTakeLease => Answer::Granted(self.gw.grant(self.cfg.ttl)),
            WorkCall::GrantDoneLease(ttl) => Answer::Granted(self.gw.grant(*ttl)),
            WorkCall::Take {
                pk,
                id,
                fence,
                lease,
            } => {
                let (key, value) = (key(pk, id), self.record("take"));
                let r = match fence {
                    Some(f) => {
                        let leader = self.cfg.leader_key(pk);
                        self.gw.create_if(&leader, f.revision, &key, &value, *lease)
                    }
                    None => self.gw.create(&key, &value, *lease),
                };
                let names_us = matches!(&r, Ok(Txn::Failed(Some(kv)))
                    if super::holder_of(kv).instance_id == self.our_id);
                Answer::Txn(r, names_us)
            }
            WorkCall::ReadTake { pk, id, .. } => {
                let prefix = self.work_prefix(pk);
                Answer::Read(self.gw.get_at(&key(pk, id)).map(|(kv, _)| {
                    kv.map(|kv| ReadBack {
                        ours: parse(&prefix, &kv).is_some_and(|(_, r)| {
                            r.op == "take"
                                && r.host_id == self.cfg.host_id
                                && r.instance_id == self.our_id
                        }),
                        lease: kv.lease,
                        revision: kv.mod_revision,
                    })
                }))
            }
            WorkCall::Done { pk, id, lease } => {
                Answer::Put(self.gw.put(&key(pk, id), &self.record("done"), *lease))
            }
            WorkCall::GiveBack { pk, id, revision } => {
                Answer::Deleted(self.gw.delete_if(&key(pk, id), *revision))
            }
            WorkCall::RenewTakes(lease) => Answer::Renewed(self.gw.keep_alive(*lease)),
        };
        match answer.error() {
            Some(e) => tracing::debug!("etcd: {call:?} waits: {e}"),
            None => tracing::debug!("etcd: {call:?} answered"),
        }
        answer
    }

    /// What every host recorded of `pk`'s work, from a read of the records
    /// (`None`: it failed). While another window's take is open, they are
    /// read again every TTL/3.
    /// A failed read is tried again soon, and the writer owes nothing
    /// meanwhile ([`crate::elector::global_level::GlobalNews::work_unread`]).
    pub(super) fn work_read(
        &mut self,
        pk: AgentPubkey,
        read: Result<Vec<Kv>>,
    ) -> Option<Arc<SharedWork>> {
        let prefix = self.work_prefix(&pk);
        let now = self.clock.now();
        let retry = now + self.retry_delay();
        let e = self.entries.get_mut(&pk)?;
        let kvs = match read {
            Ok(kvs) => kvs,
            Err(err) => {
                if e.unread_since.is_none() {
                    tracing::warn!(pubkey = %pk, "etcd: the agent's work records cannot be read: {err}");
                }
                let since = *e.unread_since.get_or_insert(now);
                // Unread for a whole TTL (too many records, a hostile one
                // too large to page): we act as after a holder whose ledger
                // we cannot read, owing only what is published from now on,
                // and read again now and then.
                let long = gives_up_on_records(now.saturating_duration_since(since), self.cfg.ttl);
                e.work_unread = !long;
                e.work_again_at = Some(if long { now + self.cfg.ttl / 3 } else { retry });
                return None;
            }
        };
        let (work, others_open) = shared_work(&prefix, &kvs, &self.our_id);
        e.work_unread = false;
        e.unread_since = None;
        e.work_again_at = others_open.then(|| now + self.cfg.ttl / 3);
        self.last_contact = now;
        Some(Arc::new(work))
    }

    /// Reads the records again for every held key whose time came, and
    /// tells the writer.
    pub(super) fn reread_work(&mut self, pk: AgentPubkey) {
        let now = self.clock.now();
        let Some(e) = self.entries.get(&pk) else {
            return;
        };
        if e.held().is_none() || e.work_again_at.is_none_or(|t| now < t) {
            return;
        }
        let was_unread = e.work_unread;
        self.run(
            pk,
            Next::Call(KeyCall::ReadWork, Then::Reread { was_unread }),
        );
    }

    /// Read again, the records' answer.
    pub(super) fn reread(
        &mut self,
        pk: AgentPubkey,
        read: Result<Vec<Kv>>,
        was_unread: bool,
    ) -> Next {
        if let Some(w) = self.work_read(pk, read) {
            if let Some(e) = self.entries.get_mut(&pk) {
                e.work_news = Some(w);
            }
            self.tell(pk, None);
        } else if was_unread && self.entries.get(&pk).is_some_and(|e| !e.work_unread) {
            // Given up on the records: a gain from a host unknown here.
            tracing::warn!(pubkey = %pk, "acting without the agent's work records: only what is published from now on is owed");
            let now_ms = self.clock.unix_ms();
            self.tell_with(pk, None, Some(now_ms), false);
        }
        Next::End
    }
}

/// How a take of `pk` is fenced now: by the revision we hold the key at,
/// or, while handing it over, the one we held it at.
fn fence(entries: &BTreeMap<AgentPubkey, Entry>, pk: &AgentPubkey) -> Option<Fence> {
    let e = entries.get(pk)?;
    match &e.holding {
        Holding::Key(h) => Some(Fence {
            revision: h.revision,
            held_lease: Some(h.lease),
        }),
        Holding::HandingOver { held: h, .. } => Some(Fence {
            revision: h.revision,
            held_lease: None,
        }),
        Holding::Nothing | Holding::FallingBack => None,
    }
}

/// The records under `prefix` (hostile content is skipped), as the rule
/// [`SharedWork::from_records`] reads them for `our_id`.
fn shared_work(prefix: &str, kvs: &[Kv], our_id: &str) -> (SharedWork, bool) {
    let parsed: Vec<(&str, Record)> = kvs.iter().filter_map(|kv| parse(prefix, kv)).collect();
    let views = parsed.iter().map(|(id, r)| RecordView {
        id,
        done: r.op == "done",
        instance_id: &r.instance_id,
    });
    SharedWork::from_records(views, our_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &[u8]) -> Kv {
        Kv {
            key: key.into(),
            value: value.to_vec(),
            mod_revision: 1,
            lease: 0,
        }
    }

    #[test]
    fn records_are_hostile_input() {
        let p = "/nip-le/x/work/";
        let rec = |op: &str, by: &str| {
            format!(r#"{{"op":"{op}","host_id":"h","instance_id":"{by}","at_ms":1}}"#)
        };
        let kvs = [
            kv("/nip-le/x/work/a", rec("done", "w").as_bytes()),
            kv("/nip-le/x/work/b", rec("take", "us").as_bytes()),
            kv("/nip-le/x/work/c", b"{garbage"),
            kv("/nip-le/x/work/d\n", rec("done", "w").as_bytes()),
            kv("/nip-le/x/work/", rec("done", "w").as_bytes()),
            kv("/nip-le/x/work/e", rec("answered", "w").as_bytes()),
            kv("/nip-le/x/work/f", &[b' '; 2000]),
            kv("/elsewhere/g", rec("done", "w").as_bytes()),
        ];
        let (w, others) = shared_work(p, &kvs, "us");
        assert_eq!(w.done.iter().collect::<Vec<_>>(), ["a"]);
        assert!(w.taken.is_empty() && !others, "only our own take is open");
        let (w, others) = shared_work(p, &kvs, "someone else");
        assert_eq!(w.taken.iter().collect::<Vec<_>>(), ["b"]);
        assert!(others);
    }
}
