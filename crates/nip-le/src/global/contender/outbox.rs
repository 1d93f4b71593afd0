//! What this window owes etcd of the agent's work, as a machine (the
//! records themselves: [`super::work`]). Its inputs are the writer's takes
//! and settles, the passing of time and etcd's answers; its outputs are the
//! calls to make, one at a time ([`WorkOutbox::next`]), and what the task
//! learns from an answer ([`Learnt`]). It calls nothing and reads no
//! clock: the task's shell (`work.rs`) makes each call and hands the answer
//! back, the simulator the same.
//!
//! The rules: a take the writer grants is sent at once (fenced by our hold
//! when we hold or hand over); one etcd did not take waits, in order, for
//! the retry wait, and so do dones and give-backs; a take whose create
//! failed is read back (its create may have committed while the answer was
//! lost); the lease of our takes is renewed while any is open, and when it
//! expired every open take is written again; dones go on a retention
//! lease, a new one once half the retention passed.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::pubkey::AgentPubkey;

use super::super::etcd::{Result, Txn};

/// Most records kept while etcd refuses them (the oldest go first).
pub(crate) const MAX_UNSENT: usize = 10_000;

/// This window's records in etcd, and what it still owes.
#[derive(Debug, Default)]
pub(crate) struct WorkOutbox {
    /// The lease our take records are bound to, and when to renew it.
    pub(super) take_lease: Option<(i64, Instant)>,
    /// The lease done records are bound to, and when it was granted.
    pub(super) done_lease: Option<(i64, Instant)>,
    /// Our open takes in etcd: the revision of each record.
    pub(super) mine: BTreeMap<(AgentPubkey, String), u64>,
    /// Takes to send now, whatever the retry wait (just granted, or to be
    /// fenced anew).
    fresh: VecDeque<(AgentPubkey, String)>,
    /// Take records etcd has not taken yet (a failed call), oldest first.
    pub(super) untaken: VecDeque<(AgentPubkey, String)>,
    /// Done records etcd has not taken yet, oldest first.
    pub(super) unsent: VecDeque<(AgentPubkey, String)>,
    /// Give-backs etcd has not taken yet: our record and its revision.
    pub(super) ungiven: VecDeque<(AgentPubkey, String, u64)>,
    /// A take whose create failed, to be read back.
    check: Option<(AgentPubkey, String, i64)>,
    /// Don't send again before (after a failure).
    pub(super) retry_at: Option<Instant>,
}

/// The task's timings the rules need.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Times {
    pub ttl: Duration,
    pub retention: Duration,
    /// The wait after a failure.
    pub retry: Duration,
}

/// How a take is fenced: the leader key's revision we hold it at, and our
/// lease when we hold it (`None`: handing it over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fence {
    pub revision: u64,
    pub held_lease: Option<i64>,
}

/// Which calls a drain may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Only the takes just granted (and what their answers ask for).
    Fresh,
    /// Only the dones (shutting down: our takes go with their lease).
    Dones,
    /// Every record owed (takes, dones, give-backs), not the renewal.
    Sends,
    /// Everything due, the renewal of our takes' lease included.
    All,
}

/// A call on etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WorkCall {
    /// A lease for our take records (the TTL).
    GrantTakeLease,
    /// A lease for done records, this long.
    GrantDoneLease(Duration),
    /// Create our take record of `id` on `lease` if there is none, fenced
    /// by the leader key's revision when `fence` is given.
    Take {
        pk: AgentPubkey,
        id: String,
        fence: Option<Fence>,
        lease: i64,
    },
    /// Read our take record of `id` back.
    ReadTake {
        pk: AgentPubkey,
        id: String,
        lease: i64,
    },
    /// Put the done record of `id` on `lease`.
    Done {
        pk: AgentPubkey,
        id: String,
        lease: i64,
    },
    /// Delete our take record of `id` if still at `revision`.
    GiveBack {
        pk: AgentPubkey,
        id: String,
        revision: u64,
    },
    /// Renew our takes' lease.
    RenewTakes(i64),
}

/// A record read back, as far as the rules need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadBack {
    /// The record is a take written by this window.
    pub ours: bool,
    pub lease: i64,
    pub revision: u64,
}

/// etcd's answer to a [`WorkCall`].
#[derive(Debug)]
pub(crate) enum Answer {
    Granted(Result<(i64, Duration)>),
    /// A take's transaction; on failure, the key it read back (the leader
    /// key when fenced) and whether it names us.
    Txn(Result<Txn>, bool),
    Read(Result<Option<ReadBack>>),
    Put(Result<()>),
    Deleted(Result<bool>),
    Renewed(Result<Duration>),
}

impl Answer {
    /// The failure, if the call failed.
    pub(crate) fn error(&self) -> Option<&super::super::etcd::EtcdError> {
        match self {
            Self::Granted(Err(e))
            | Self::Txn(Err(e), _)
            | Self::Read(Err(e))
            | Self::Put(Err(e))
            | Self::Deleted(Err(e))
            | Self::Renewed(Err(e)) => Some(e),
            _ => None,
        }
    }
}

/// What the task learns from an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Learnt {
    /// etcd answered.
    Contact,
    /// etcd's store is at least at this revision.
    StoreAt(u64),
    /// The leader key names us on our lease at this later revision (our
    /// own rewrite, not seen yet): fence by it.
    Refence { pk: AgentPubkey, revision: u64 },
}

impl WorkOutbox {
    /// The writer granted a take of `id`: sent at once.
    pub(crate) fn took(&mut self, pk: AgentPubkey, id: String) {
        self.fresh.push_back((pk, id));
    }

    /// A take of ours ended: a done is owed to every host, a give-back
    /// deletes our record (if we wrote it). Both go now, whatever the wait.
    pub(crate) fn settled(&mut self, pk: AgentPubkey, id: String, done: bool) {
        let rev = self.mine.remove(&(pk, id.clone()));
        let same = |(p, i): &(AgentPubkey, String)| (*p, i.as_str()) != (pk, id.as_str());
        self.untaken.retain(same);
        self.fresh.retain(same);
        if done {
            keep(&mut self.unsent, (pk, id));
            self.retry_at = None;
        } else if let Some(rev) = rev {
            keep(&mut self.ungiven, (pk, id, rev));
            self.retry_at = None;
        }
    }

    /// Whether every record of `pk` we owe etcd is there.
    pub(crate) fn sent(&self, pk: &AgentPubkey) -> bool {
        let pending = |q: &VecDeque<(AgentPubkey, String)>| q.iter().any(|(p, _)| p == pk);
        let given = self.ungiven.iter().any(|(p, _, _)| p == pk);
        !pending(&self.fresh) && !pending(&self.untaken) && !pending(&self.unsent) && !given
    }

    /// Sends again now, whatever the wait (a hand-over waits for it).
    pub(crate) fn hurry(&mut self) {
        self.retry_at = None;
    }

    /// On shutdown, after the dones went: the lease whose revoke takes our
    /// take records with it; nothing else is owed.
    pub(crate) fn give_up(&mut self) -> Option<i64> {
        self.mine.clear();
        self.fresh.clear();
        self.untaken.clear();
        self.ungiven.clear();
        self.check = None;
        self.take_lease.take().map(|(l, _)| l)
    }

    /// When the records need a call next (`None`: only an input will).
    pub(crate) fn due(&self) -> Option<Instant> {
        let waiting =
            !self.unsent.is_empty() || !self.untaken.is_empty() || !self.ungiven.is_empty();
        let unsent = waiting.then_some(self.retry_at).flatten();
        let renew = (!self.mine.is_empty())
            .then_some(self.take_lease.map(|(_, t)| t))
            .flatten();
        [unsent, renew].into_iter().flatten().min()
    }

    /// The next call within `scope` at `now`, if any; `fence` says how a
    /// take of an agent is fenced now.
    pub(crate) fn next(
        &self,
        now: Instant,
        t: &Times,
        scope: Scope,
        fence: impl Fn(&AgentPubkey) -> Option<Fence>,
    ) -> Option<WorkCall> {
        if let Some((pk, id, lease)) = &self.check {
            return Some(WorkCall::ReadTake {
                pk: *pk,
                id: id.clone(),
                lease: *lease,
            });
        }
        let take = |(pk, id): &(AgentPubkey, String)| match self.take_lease_at(now, t) {
            Some(lease) => WorkCall::Take {
                pk: *pk,
                id: id.clone(),
                fence: fence(pk),
                lease,
            },
            None => WorkCall::GrantTakeLease,
        };
        if scope != Scope::Dones {
            if let Some(f) = self.fresh.front() {
                return Some(take(f));
            }
        }
        if scope == Scope::Fresh {
            return None;
        }
        if self.retry_at.is_none_or(|r| now >= r) {
            if let Some(call) = self.owed(now, t, scope, take) {
                return Some(call);
            }
        }
        match self.take_lease {
            Some((lease, at)) if scope == Scope::All && !self.mine.is_empty() && now >= at => {
                Some(WorkCall::RenewTakes(lease))
            }
            _ => None,
        }
    }

    /// The next record owed that etcd did not take before, oldest first:
    /// takes, then dones, then give-backs.
    fn owed(
        &self,
        now: Instant,
        t: &Times,
        scope: Scope,
        take: impl Fn(&(AgentPubkey, String)) -> WorkCall,
    ) -> Option<WorkCall> {
        if scope != Scope::Dones {
            if let Some(u) = self.untaken.front() {
                return Some(take(u));
            }
        }
        if let Some((pk, id)) = self.unsent.front() {
            return Some(match self.done_lease_at(now, t) {
                Some(lease) => WorkCall::Done {
                    pk: *pk,
                    id: id.clone(),
                    lease,
                },
                // etcd counts TTLs in whole seconds: a retention under a
                // second would ask for none.
                None => WorkCall::GrantDoneLease(
                    (t.retention + t.retention / 2).max(Duration::from_secs(2)),
                ),
            });
        }
        if scope == Scope::Dones {
            return None;
        }
        let (pk, id, revision) = self.ungiven.front()?;
        Some(WorkCall::GiveBack {
            pk: *pk,
            id: id.clone(),
            revision: *revision,
        })
    }

    /// etcd's `answer` to `call`, at `now`: what the task learns.
    pub(crate) fn answered(
        &mut self,
        call: WorkCall,
        answer: Answer,
        now: Instant,
        t: &Times,
    ) -> Vec<Learnt> {
        let retry = now + t.retry;
        match (call, answer) {
            (WorkCall::GrantTakeLease, Answer::Granted(r)) => match r {
                Ok((id, ttl)) => self.take_lease = Some((id, now + ttl.min(t.ttl) / 3)),
                Err(_) => {
                    // The take waiting for it waits with the others.
                    if let Some(f) = self.fresh.pop_front() {
                        keep(&mut self.untaken, f);
                    }
                    self.retry_at = Some(retry);
                }
            },
            (WorkCall::GrantDoneLease(_), Answer::Granted(r)) => match r {
                Ok((id, _)) => self.done_lease = Some((id, now)),
                Err(_) => self.retry_at = Some(retry),
            },
            (
                WorkCall::Take {
                    pk,
                    id,
                    fence,
                    lease,
                },
                Answer::Txn(r, names_us),
            ) => {
                let was_fresh = self.take_from(&pk, &id);
                match r {
                    Ok(Txn::Done(rev)) => {
                        self.mine.insert((pk, id), rev);
                        return vec![Learnt::Contact, Learnt::StoreAt(rev)];
                    }
                    Ok(Txn::Failed(Some(kv)))
                        if fence.is_some_and(|f| kv.mod_revision > f.revision) =>
                    {
                        let held = fence.and_then(|f| f.held_lease);
                        if names_us && held == Some(kv.lease) {
                            self.fresh.push_front((pk, id));
                            return vec![Learnt::Refence {
                                pk,
                                revision: kv.mod_revision,
                            }];
                        }
                    }
                    // Moved under us (the watch tells the task), or a
                    // record is there (a done is never overwritten by a
                    // take sent late), or it is our own take whose create
                    // committed while its answer was lost: read it back.
                    Ok(Txn::Failed(_)) => self.check = Some((pk, id, lease)),
                    // Waits, in order: a fresh take after those already
                    // waiting, a waiting one first again.
                    Err(_) if was_fresh => {
                        keep(&mut self.untaken, (pk, id));
                        self.retry_at = Some(retry);
                    }
                    Err(_) => {
                        self.untaken.push_front((pk, id));
                        self.untaken.truncate(MAX_UNSENT);
                        self.retry_at = Some(retry);
                    }
                }
            }
            (WorkCall::ReadTake { pk, id, lease }, Answer::Read(r)) => {
                self.check = None;
                if let Ok(Some(b)) = r {
                    if b.ours && b.lease == lease {
                        self.mine.insert((pk, id), b.revision);
                        return vec![Learnt::Contact];
                    }
                }
            }
            (WorkCall::Done { .. }, Answer::Put(r)) => match r {
                Ok(()) => {
                    self.unsent.pop_front();
                    return vec![Learnt::Contact];
                }
                Err(_) => {
                    // A lease etcd no longer knows: a new one next time.
                    self.done_lease = None;
                    self.retry_at = Some(retry);
                }
            },
            (WorkCall::GiveBack { .. }, Answer::Deleted(r)) => match r {
                Ok(_) => {
                    self.ungiven.pop_front();
                    return vec![Learnt::Contact];
                }
                Err(_) => self.retry_at = Some(retry),
            },
            (WorkCall::RenewTakes(lease), Answer::Renewed(r)) => match r {
                Ok(ttl) if !ttl.is_zero() => {
                    self.take_lease = Some((lease, now + ttl.min(t.ttl) / 3));
                }
                Ok(_) => {
                    // Expired with its records: the open takes are written
                    // again, fenced anew.
                    self.take_lease = None;
                    let open = std::mem::take(&mut self.mine);
                    self.fresh.extend(open.into_keys());
                }
                Err(_) => self.take_lease = Some((lease, now + t.retry)),
            },
            (call, answer) => {
                tracing::error!(
                    ?call,
                    ?answer,
                    "etcd work records: an answer to another call"
                );
            }
        }
        Vec::new()
    }

    /// The take of `id` leaves the queue it was sent from; whether that
    /// was the fresh one.
    fn take_from(&mut self, pk: &AgentPubkey, id: &str) -> bool {
        let is = |(p, i): &(AgentPubkey, String)| p == pk && i == id;
        if self.fresh.front().is_some_and(is) {
            self.fresh.pop_front();
            return true;
        }
        if self.untaken.front().is_some_and(is) {
            self.untaken.pop_front();
        }
        false
    }

    /// Our takes' lease, if one that is still alive is known: one not
    /// renewed for a TTL (no take was open) is gone.
    fn take_lease_at(&self, now: Instant, t: &Times) -> Option<i64> {
        let (id, at) = self.take_lease?;
        (now < at + (t.ttl - t.ttl / 3)).then_some(id)
    }

    /// The done records' lease, if it is younger than half the retention:
    /// every done then lives at least the retention (as long as the host
    /// ledger keeps it).
    fn done_lease_at(&self, now: Instant, t: &Times) -> Option<i64> {
        let (id, at) = self.done_lease?;
        (now < at + t.retention / 2).then_some(id)
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

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
