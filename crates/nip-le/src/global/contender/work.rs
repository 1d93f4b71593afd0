//! The agent's work ledger as etcd keeps it for every host, so that the
//! ledger follows the agent when another host gains it: a host's own
//! ledger file only knows what its windows did.
//!
//! `<prefix>/<pubkey>/work/<event id>` holds a record naming the window:
//!
//! * `take`: written when the writer grants a take, in one transaction
//!   fenced by our hold (`MOD(leader) == held.revision`) that creates the
//!   record only if there is none (a take sent late never overwrites a
//!   done, seed 25 of `--cluster hosts --strict-once`), bound to a lease
//!   of this window that is renewed while any take of ours is open. So a
//!   take record lives while its window runs (at most a TTL
//!   after it died): another host's holder leaves the event to it, as a
//!   host's ledger leaves an event to a live taker.
//! * `done`: the reply was sent. Written whoever leads by now (fence the
//!   take, not the done), bound to a retention lease (the work retention,
//!   a new lease once half of it passed): etcd forgets old records on its
//!   own, so the range stays bounded. A done etcd refuses is kept (up to
//!   [`MAX_UNSENT`]) and sent again, before any lease is given up.
//! * a give-back deletes our take record (only the one we wrote).
//!
//! A holder that gains the key reads the range once (before the writer
//! hears of the gain) and hands the writer what is done and what is taken;
//! while another window's take is open it reads again every TTL/3, so an
//! event whose taker died is owed within a TTL and a third. Records travel
//! through the task's inbox in the writer's order: a take or done told
//! before a hand-over is in etcd before the claimant can read the range.
//! The watch sees these keys too and ignores them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::pubkey::AgentPubkey;
use crate::work::{gives_up_on_records, RecordView, SharedWork};

use super::super::etcd::{Etcd, Kv, Result, Txn};
use super::super::{EtcdConfig, WorkRecord};
use super::task::Task;

/// Most done records kept while etcd refuses them (the oldest go first).
pub(crate) const MAX_UNSENT: usize = 10_000;
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

/// Every record of `pk` (see [`crate::global::work_records`]).
pub(crate) fn records(
    cfg: &EtcdConfig,
    gw: &dyn Etcd,
    pk: &AgentPubkey,
) -> Result<Vec<WorkRecord>> {
    let prefix = work_prefix(cfg, pk);
    let kvs = gw.range(&prefix, MAX_RECORDS)?;
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

    fn record(&self, op: &str) -> Vec<u8> {
        serde_json::to_vec(&Record {
            op: op.to_owned(),
            host_id: self.cfg.host_id.clone(),
            instance_id: self.our_id.clone(),
            at_ms: self.clock.unix_ms(),
        })
        .unwrap_or_default()
    }

    /// The writer granted a take of `id`: recorded fenced by our hold, or,
    /// under the fall-back (we hold nothing), unfenced once etcd answers.
    /// A record etcd refuses is sent again, and a hand-over to another
    /// host waits for it (see [`Task::work_sent`]). A take under the
    /// fall-back (we hold nothing) is recorded unfenced once etcd answers
    /// again: the turn is real, and a host that gains the agent meanwhile
    /// must leave it to us (seeds 88 and 1500 of `--cluster hosts
    /// --strict-once`).
    pub(super) fn took(&mut self, pk: AgentPubkey, id: String) {
        // A hand-over under way still fences by the revision we held.
        let revision = self.entries.get(&pk).and_then(|e| {
            let h = e.held.or(e.handing.as_ref().map(|(h, _)| *h))?;
            Some(h.revision)
        });
        let Some(lease) = self.take_lease() else {
            return self.untaken(pk, id);
        };
        let key = format!("{}{id}", self.work_prefix(&pk));
        let value = self.record("take");
        let leader = self.cfg.leader_key(&pk);
        let created = match revision {
            Some(rev) => self.gw.create_if(&leader, rev, &key, &value, lease),
            None => self.gw.create(&key, &value, lease),
        };
        match created {
            Ok(Txn::Done(rev)) => {
                self.last_contact = self.clock.now();
                self.store_at(rev);
                self.work.mine.insert((pk, id), rev);
            }
            // The key names us on our lease at a later revision (our own
            // rewrite, not yet seen): fence by that one, once.
            Ok(Txn::Failed(Some(kv))) if revision.is_some_and(|r| kv.mod_revision > r) => {
                let held = self.entries.get_mut(&pk).and_then(|e| e.held.as_mut());
                let ours = super::holder_of(&kv).instance_id == self.our_id;
                if let Some(h) = held.filter(|h| ours && h.lease == kv.lease) {
                    h.revision = kv.mod_revision;
                    self.took(pk, id);
                }
            }
            // Moved under us (the watch tells the machine), or a record is
            // there: a done is never overwritten by a take sent late. Or
            // it is our own take, whose create committed while its answer
            // was lost: tracked as if answered, or its lease would not be
            // renewed (another host answers the event again once it
            // lapses) and a give-back would find no revision to delete.
            Ok(Txn::Failed(_)) => self.adopt_own_take(pk, id, &key, lease),
            Err(e) => {
                tracing::debug!(pubkey = %pk, "etcd: the take of {id} waits: {e}");
                self.untaken(pk, id);
            }
        }
    }

    /// Tracks the take record at `key` if it is ours, on `lease`.
    fn adopt_own_take(&mut self, pk: AgentPubkey, id: String, key: &str, lease: i64) {
        let Ok((Some(kv), _)) = self.gw.get_at(key) else {
            return;
        };
        let prefix = self.work_prefix(&pk);
        let ours = parse(&prefix, &kv).is_some_and(|(_, r)| {
            r.op == "take" && r.host_id == self.cfg.host_id && r.instance_id == self.our_id
        });
        if ours && kv.lease == lease {
            self.last_contact = self.clock.now();
            self.work.mine.insert((pk, id), kv.mod_revision);
        }
    }

    fn untaken(&mut self, pk: AgentPubkey, id: String) {
        keep(&mut self.work.untaken, (pk, id));
        self.retry_work();
    }

    /// Whether every record of `pk` we owe etcd is there (sent again now
    /// if not): a hand-over to another host waits until it is, or the
    /// claimant would answer again what we took or did.
    pub(super) fn work_sent(&mut self, pk: AgentPubkey) -> bool {
        self.work.retry_at = None;
        self.send_untaken();
        self.send_done();
        self.send_given();
        let pending = |q: &VecDeque<(AgentPubkey, String)>| q.iter().any(|(p, _)| *p == pk);
        let given = self.work.ungiven.iter().any(|(p, _, _)| *p == pk);
        !pending(&self.work.untaken) && !pending(&self.work.unsent) && !given
    }

    /// Sends the take records that failed before, while we still hold.
    fn send_untaken(&mut self) {
        let now = self.clock.now();
        if self.work.retry_at.is_some_and(|t| now < t) {
            return;
        }
        self.list_leases();
        let mut queue = std::mem::take(&mut self.work.untaken);
        while let Some((pk, id)) = queue.pop_front() {
            let before = self.work.untaken.len();
            self.took(pk, id);
            if self.work.untaken.len() > before {
                // Refused again: the rest wait, in order.
                self.work.untaken.extend(queue);
                return;
            }
        }
    }

    /// A take of ours ended: a done is recorded for every host, a give-back
    /// deletes our record.
    pub(super) fn settled(&mut self, pk: AgentPubkey, id: String, done: bool) {
        let rev = self.work.mine.remove(&(pk, id.clone()));
        self.work
            .untaken
            .retain(|(p, i)| (*p, i.as_str()) != (pk, id.as_str()));
        if done {
            keep(&mut self.work.unsent, (pk, id));
            self.work.retry_at = None;
            self.send_done();
        } else if let Some(rev) = rev {
            keep(&mut self.work.ungiven, (pk, id, rev));
            self.work.retry_at = None;
            self.send_given();
        }
    }

    /// Deletes the take records given back, oldest first, stopping at the
    /// first failure: a record left behind would keep every other host
    /// from the event while our window lives (its lease is renewed for
    /// our other takes).
    fn send_given(&mut self) {
        let now = self.clock.now();
        if self.work.retry_at.is_some_and(|t| now < t) {
            return;
        }
        self.list_leases();
        while let Some((pk, id, rev)) = self.work.ungiven.front().cloned() {
            let key = format!("{}{id}", self.work_prefix(&pk));
            match self.gw.delete_if(&key, rev) {
                Ok(_) => {
                    self.last_contact = self.clock.now();
                    self.work.ungiven.pop_front();
                }
                Err(e) => {
                    tracing::debug!(pubkey = %pk, "etcd: the give-back of {id} waits: {e}");
                    return self.retry_work();
                }
            }
        }
    }

    /// Sends the done records etcd has not taken yet, oldest first,
    /// stopping at the first refusal.
    fn send_done(&mut self) {
        let now = self.clock.now();
        if self.work.retry_at.is_some_and(|t| now < t) {
            return;
        }
        self.list_leases();
        while let Some((pk, id)) = self.work.unsent.front().cloned() {
            let Some(lease) = self.done_lease() else {
                return self.retry_work();
            };
            let key = format!("{}{id}", self.work_prefix(&pk));
            match self.gw.put(&key, &self.record("done"), lease) {
                Ok(()) => {
                    self.last_contact = self.clock.now();
                    self.work.unsent.pop_front();
                }
                Err(e) => {
                    tracing::debug!(pubkey = %pk, "etcd: the done of {id} waits: {e}");
                    // A lease etcd no longer knows: a new one next time.
                    self.work.done_lease = None;
                    return self.retry_work();
                }
            }
        }
    }

    fn retry_work(&mut self) {
        let wait = self.retry_delay();
        self.work.retry_at = Some(self.clock.now() + wait);
    }

    /// The lease of our take records, granted when first needed.
    fn take_lease(&mut self) -> Option<i64> {
        // One not renewed for a TTL (no take was open) is gone.
        let now = self.clock.now();
        let ttl = self.cfg.ttl;
        if let Some((id, _)) = (self.work.take_lease).filter(|(_, at)| now < *at + (ttl - ttl / 3))
        {
            return Some(id);
        }
        let (id, ttl) = self.gw.grant(self.cfg.ttl).ok()?;
        let ttl = self.bounded(ttl);
        self.work.take_lease = Some((id, self.clock.now() + ttl / 3));
        Some(id)
    }

    /// The lease of done records: one and a half retentions long, a new
    /// one once half the retention passed, so that every done lives at
    /// least the retention (as long as the host ledger keeps it).
    fn done_lease(&mut self) -> Option<i64> {
        let now = self.clock.now();
        let half = self.retention / 2;
        if let Some((id, _)) = self.work.done_lease.filter(|(_, at)| now < *at + half) {
            return Some(id);
        }
        // etcd counts TTLs in whole seconds: a retention under a second
        // would ask for none.
        let ttl = (self.retention + half).max(Duration::from_secs(2));
        let (id, _) = self.gw.grant(ttl).ok()?;
        self.work.done_lease = Some((id, now));
        Some(id)
    }

    /// Whatever the records need now: dones sent again, our take lease
    /// renewed while a take is open (a lease that expired takes its
    /// records with it; the open takes are written again, fenced anew).
    pub(super) fn keep_work(&mut self) {
        self.send_untaken();
        self.send_done();
        self.send_given();
        let now = self.clock.now();
        let Some((lease, renew_at)) = self.work.take_lease else {
            return;
        };
        if self.work.mine.is_empty() || now < renew_at {
            return;
        }
        match self.gw.keep_alive(lease) {
            Ok(ttl) if !ttl.is_zero() => {
                let ttl = self.bounded(ttl);
                self.work.take_lease = Some((lease, now + ttl / 3));
            }
            Ok(_) => {
                self.work.take_lease = None;
                let open: Vec<(AgentPubkey, String)> =
                    std::mem::take(&mut self.work.mine).into_keys().collect();
                for (pk, id) in open {
                    self.took(pk, id);
                }
            }
            Err(_) => {
                let wait = self.retry_delay();
                self.work.take_lease = Some((lease, now + wait));
            }
        }
    }

    /// When the records need us next.
    pub(super) fn work_due(&self) -> Option<Instant> {
        let waiting = !self.work.unsent.is_empty()
            || !self.work.untaken.is_empty()
            || !self.work.ungiven.is_empty();
        let unsent = waiting.then_some(self.work.retry_at).flatten();
        let renew = (!self.work.mine.is_empty())
            .then_some(self.work.take_lease.map(|(_, t)| t))
            .flatten();
        [unsent, renew].into_iter().flatten().min()
    }

    /// Reads what every host recorded of `pk`'s work (`None`: it could not
    /// be read). While another window's take is open, it is read again
    /// every TTL/3.
    /// A failed read is tried again soon, and the writer owes nothing
    /// meanwhile ([`crate::elector::upper::UpperNews::work_unread`]).
    pub(super) fn read_work(&mut self, pk: AgentPubkey) -> Option<Arc<SharedWork>> {
        let prefix = self.work_prefix(&pk);
        self.list_leases();
        let read = self.gw.range(&prefix, MAX_RECORDS);
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
        if e.held.is_none() || e.work_again_at.is_none_or(|t| now < t) {
            return;
        }
        let was_unread = self.entries[&pk].work_unread;
        if let Some(w) = self.read_work(pk) {
            self.entries.get_mut(&pk).expect("checked").work_news = Some(w);
            self.tell(pk, None);
        } else if was_unread && !self.entries[&pk].work_unread {
            // Given up on the records: a gain from a host unknown here.
            tracing::warn!(pubkey = %pk, "acting without the agent's work records: only what is published from now on is owed");
            let now_ms = self.clock.unix_ms();
            self.tell_with(pk, None, Some(now_ms), false);
        }
    }

    /// On shutdown: the dones go out first (a successor reads them), then
    /// our take records go with their lease.
    pub(super) fn give_up_work(&mut self) {
        self.work.retry_at = None;
        self.send_done();
        // The revoke takes every take record of ours with it: none is
        // written now (it would need a new lease, and outlive us).
        if let Some((lease, _)) = self.work.take_lease.take() {
            let _ = self.gw.revoke(lease);
        }
        self.work.mine.clear();
        self.work.untaken.clear();
        self.work.ungiven.clear();
    }
}

/// Queues a record etcd has yet to take, the oldest dropped past
/// [`MAX_UNSENT`].
fn keep<T>(queue: &mut VecDeque<T>, record: T) {
    if queue.len() >= MAX_UNSENT {
        queue.pop_front();
    }
    queue.push_back(record);
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
