//! A key's calls on etcd as data. A move on a key (renew it, look at it,
//! acquire, adopt, hand it over, give it up) is a chain of calls, each
//! decided from the answer to the one before. The decisions never call
//! etcd: each returns the next call with where the chain goes on from
//! ([`Next`]: a [`KeyCall`] and a [`Then`]), and [`Task::run`] is the one
//! place that makes the calls (in [`Task::ask_key`]) and hands each answer
//! back ([`Task::resume`]). The shell answers each call before it takes
//! any other input, so a chain sees etcd as if it had called it itself;
//! a unit test can instead feed the answers by hand and read what a
//! decision asks for. The work records have the same shape ([`super::outbox`]).

use std::time::Duration;

use crate::pubkey::AgentPubkey;

use super::super::etcd::{EtcdError, Kv, Result, Txn};
use super::entry::Held;
use super::task::Task;
use crate::elector::{ChangeReason, GlobalHolder};

/// A call on etcd that a move on a key asks for. The key it names follows
/// from the agent the chain runs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KeyCall {
    /// Renew a lease: ours, a sibling's we continue, or a granted claim's.
    KeepAlive(i64),
    /// Read the leader key with the store's revision.
    ReadLeader,
    /// Read the leader key alone.
    GetLeader,
    /// Read the claim key.
    ReadClaim,
    /// A new lease of the configured TTL.
    Grant,
    /// Create the leader key in our name on `lease`, if there is none.
    Create { lease: i64 },
    /// Rewrite the leader key in our name on `lease`, if nobody wrote it
    /// since `revision`.
    Adopt { revision: u64, lease: i64 },
    /// Rewrite the leader key for `claim`'s window on its lease, if nobody
    /// wrote it since `revision`, and delete the claim if it is still at
    /// its revision: one transaction.
    HandOver { revision: u64, claim: Kv },
    /// Post our claim on `lease`.
    PostClaim { lease: i64 },
    /// Revoke a lease (etcd deletes the keys bound to it).
    Revoke(i64),
    /// Read every work record of the agent.
    ReadWork,
}

/// etcd's answer to a [`KeyCall`], one variant per kind of answer.
#[derive(Debug)]
pub(super) enum KeyAnswer {
    /// To [`KeyCall::KeepAlive`]: the lease's TTL (zero: expired).
    Ttl(Result<Duration>),
    /// To [`KeyCall::ReadLeader`]: the key, and the store's revision.
    Read(Result<(Option<Kv>, u64)>),
    /// To [`KeyCall::GetLeader`] and [`KeyCall::ReadClaim`].
    Kv(Result<Option<Kv>>),
    /// To [`KeyCall::Grant`]: the lease and its TTL.
    Lease(Result<(i64, Duration)>),
    /// To the transactions ([`KeyCall::Create`], `Adopt`, `HandOver`).
    Txn(Result<Txn>),
    /// To [`KeyCall::PostClaim`] and [`KeyCall::Revoke`].
    Done(Result<()>),
    /// To [`KeyCall::ReadWork`].
    Records(Result<Vec<Kv>>),
}

/// An answer and the cluster id etcd gave with it: an answer from a new
/// cluster is not acted on ([`Task::noted`]).
#[derive(Debug)]
pub(super) struct Answered {
    pub answer: KeyAnswer,
    pub cluster: u64,
}

/// What a chain does next.
#[derive(Debug)]
pub(super) enum Next {
    /// Make this call, then go on from there.
    Call(KeyCall, Then),
    /// The chain is over.
    End,
}

/// Where a chain goes on once its call is answered: each variant is one
/// decision of a move, with what it must remember across the call.
#[derive(Debug)]
pub(super) enum Then {
    /// Renew ([`Task::renew`]): the lease renewed or not; `sent` is when
    /// the keep-alive left (the permit counts from it).
    Renewed { held: Held, sent: u64 },
    /// Renew: does the key still name us, at our revision?
    RenewRead {
        held: Held,
        sent: u64,
        ttl: Duration,
    },
    /// Look ([`Task::look`]): what the key is now.
    Looked,
    /// Acquire: a lease for the key, or not.
    AcquireLease { after_another: bool, sent: u64 },
    /// Acquire: created, or somebody was first.
    Created {
        lease: i64,
        ttl: Duration,
        sent: u64,
        after_another: bool,
    },
    /// Acquire: the lease of a create somebody else beat is revoked; the
    /// writer hears of the holder.
    CreateBeaten { kv: Option<Kv> },
    /// A claim of ours granted: its lease renewed, or not (then `from`
    /// says how the move goes on).
    ClaimKept { kv: Kv, sent: u64, from: ClaimFrom },
    /// Post our claim: a lease for it, or not. `tell`: the holder seen
    /// changed, and the writer hears of it when the posting ends.
    ClaimLease { tell: bool },
    /// Post our claim: posted, or its lease goes.
    ClaimPosted { lease: i64, tell: bool },
    /// Post our claim: the lease of a claim not posted is revoked.
    ClaimDropped { tell: bool },
    /// Adopt our host's key: a new lease for a key bound to none.
    AdoptGranted { kv: Kv, sent: u64 },
    /// Adopt: the key's lease renewed (zero: expired, its deletion is on
    /// its way to the watch).
    AdoptKept { kv: Kv, sent: u64 },
    /// Adopt: rewritten in our name, or somebody wrote it first.
    Adopted {
        lease: i64,
        ttl: Duration,
        sent: u64,
    },
    /// Hold a key just gained: its work records read.
    HoldRead {
        reason: ChangeReason,
        from_other_host: bool,
        tail: Option<Kv>,
    },
    /// Hold: a claim waiting for whoever took the key, honoured before the
    /// writer hears of the gain.
    HoldClaim {
        reason: ChangeReason,
        from_other_host: bool,
        tail: Option<Kv>,
    },
    /// Read the work records again for a held key.
    Reread { was_unread: bool },
    /// A claim the watch could not bring ([`Task::find_claim`]).
    FoundClaim,
    /// Hand over: swapped to the claimant, or not.
    Swapped {
        held: Held,
        claim: Kv,
        falling_back: bool,
    },
    /// Hand over refused for a changed claim: the claim there now.
    NewerClaim { claim_revision: u64 },
    /// Give a lease up: does the key name a sibling of ours on it?
    GiveUpRead { lease: i64 },
    /// Give a lease up: revoked.
    GiveUpRevoked,
    /// Withdraw our claim: was it granted?
    WithdrawRead { lease: i64 },
    /// Nothing to learn from the answer.
    Ignored,
}

/// How a move goes on when a claim of ours that looked granted is not
/// (its lease could not be renewed).
#[derive(Debug)]
pub(super) enum ClaimFrom {
    /// A look found it: the look goes on with `was`, the holder seen
    /// before it.
    Look { was: Option<GlobalHolder> },
    /// The watch brought it: what the change says is applied after.
    Watch,
}

impl KeyAnswer {
    /// What this answer is, for an answer of another kind than expected.
    fn kind(&self) -> &'static str {
        match self {
            Self::Ttl(_) => "ttl",
            Self::Read(_) => "read",
            Self::Kv(_) => "kv",
            Self::Lease(_) => "lease",
            Self::Txn(_) => "txn",
            Self::Done(_) => "done",
            Self::Records(_) => "records",
        }
    }

    fn mismatch<T>(&self, wanted: &str) -> Result<T> {
        Err(EtcdError::unreachable(format!(
            "a {} answer where a {wanted} one was due",
            self.kind()
        )))
    }

    /// The answer of a keep-alive.
    pub(super) fn ttl(self) -> Result<Duration> {
        match self {
            Self::Ttl(r) => r,
            other => other.mismatch("ttl"),
        }
    }

    /// The answer of a read with the store's revision.
    pub(super) fn read(self) -> Result<(Option<Kv>, u64)> {
        match self {
            Self::Read(r) => r,
            other => other.mismatch("read"),
        }
    }

    /// The answer of a plain read.
    pub(super) fn kv(self) -> Result<Option<Kv>> {
        match self {
            Self::Kv(r) => r,
            other => other.mismatch("kv"),
        }
    }

    /// The answer of a grant.
    pub(super) fn lease(self) -> Result<(i64, Duration)> {
        match self {
            Self::Lease(r) => r,
            other => other.mismatch("lease"),
        }
    }

    /// The answer of a transaction.
    pub(super) fn txn(self) -> Result<Txn> {
        match self {
            Self::Txn(r) => r,
            other => other.mismatch("txn"),
        }
    }

    /// The answer of a put or a revoke.
    pub(super) fn done(self) -> Result<()> {
        match self {
            Self::Done(r) => r,
            other => other.mismatch("done"),
        }
    }

    /// The answer of a range read.
    pub(super) fn records(self) -> Result<Vec<Kv>> {
        match self {
            Self::Records(r) => r,
            other => other.mismatch("records"),
        }
    }
}

impl Task {
    /// The shell of a key's moves: makes each call of the chain on etcd
    /// and hands the answer to the decision that asked for it, until the
    /// chain ends.
    pub(super) fn run(&mut self, pk: AgentPubkey, mut next: Next) {
        while let Next::Call(call, then) = next {
            let answered = self.ask_key(pk, &call);
            next = self.resume(pk, then, answered);
        }
    }

    /// Makes `call` for `pk` on etcd (the only place a key's moves reach
    /// it; the records' range is read as `work.rs` knows them).
    pub(super) fn ask_key(&self, pk: AgentPubkey, call: &KeyCall) -> Answered {
        let leader = || self.cfg.leader_key(&pk);
        let claim_key = || self.cfg.claim_key(&pk);
        let answer = match call {
            KeyCall::KeepAlive(lease) => KeyAnswer::Ttl(self.gw.keep_alive(*lease)),
            KeyCall::ReadLeader => KeyAnswer::Read(self.gw.get_at(&leader())),
            KeyCall::GetLeader => KeyAnswer::Kv(self.gw.get(&leader())),
            KeyCall::ReadClaim => KeyAnswer::Kv(self.gw.get(&claim_key())),
            KeyCall::Grant => KeyAnswer::Lease(self.gw.grant(self.cfg.ttl)),
            KeyCall::Create { lease } => {
                KeyAnswer::Txn(self.gw.create(&leader(), &self.value(), *lease))
            }
            KeyCall::Adopt { revision, lease } => {
                KeyAnswer::Txn(
                    self.gw
                        .swap(&leader(), *revision, &self.value(), *lease, None),
                )
            }
            KeyCall::HandOver { revision, claim } => KeyAnswer::Txn(self.gw.swap(
                &leader(),
                *revision,
                &claim.value,
                claim.lease,
                Some((&claim_key(), claim.mod_revision)),
            )),
            KeyCall::PostClaim { lease } => {
                KeyAnswer::Done(self.gw.put(&claim_key(), &self.value(), *lease))
            }
            KeyCall::Revoke(lease) => KeyAnswer::Done(self.gw.revoke(*lease)),
            KeyCall::ReadWork => {
                // A read that may take long: the renewer beside us keeps
                // what we hold alive meanwhile.
                self.list_leases();
                KeyAnswer::Records(self.read_records(&pk))
            }
        };
        Answered {
            answer,
            cluster: self.gw.cluster_id(),
        }
    }

    /// Hands `answered` to the decision `then` names.
    pub(super) fn resume(&mut self, pk: AgentPubkey, then: Then, answered: Answered) -> Next {
        let Answered { answer, cluster } = answered;
        match then {
            Then::Renewed { held, sent } => {
                let r = answer.ttl();
                let ttl = self.noted(pk, cluster, r);
                self.renewed(pk, held, sent, ttl)
            }
            Then::RenewRead { held, sent, ttl } => {
                let r = answer.read();
                let read = self.noted(pk, cluster, r);
                self.renew_read(pk, held, (sent, ttl), read)
            }
            Then::Looked => {
                let r = answer.read();
                let read = self.noted(pk, cluster, r);
                self.looked(pk, read)
            }
            Then::AcquireLease {
                after_another,
                sent,
            } => {
                let r = answer.lease();
                let lease = self.noted(pk, cluster, r);
                self.acquire_leased(lease, sent, after_another)
            }
            Then::Created {
                lease,
                ttl,
                sent,
                after_another,
            } => {
                let r = answer.txn();
                let txn = self.noted(pk, cluster, r);
                self.created(pk, txn, (lease, ttl, sent), after_another)
            }
            Then::CreateBeaten { kv } => self.create_beaten(pk, kv),
            Then::ClaimKept { kv, sent, from } => {
                let r = answer.ttl();
                let ttl = self.noted(pk, cluster, r);
                self.claim_kept(pk, ttl, kv, sent, from)
            }
            Then::ClaimLease { tell } => {
                let r = answer.lease();
                let lease = self.noted(pk, cluster, r);
                self.claim_leased(pk, lease, tell)
            }
            Then::ClaimPosted { lease, tell } => {
                let r = answer.done();
                let posted = self.noted(pk, cluster, r).is_some();
                self.claim_posted(pk, posted, lease, tell)
            }
            Then::ClaimDropped { tell } => self.tell_if(pk, tell),
            Then::AdoptGranted { kv, sent } => {
                let r = answer.lease();
                let lease = self.noted(pk, cluster, r);
                self.adopt_leased(lease, &kv, sent)
            }
            Then::AdoptKept { kv, sent } => {
                let r = answer.ttl();
                let lease = match self.noted(pk, cluster, r) {
                    // Expired: its deletion is on its way to the watch.
                    Some(ttl) if ttl.is_zero() => None,
                    ttl => ttl.map(|ttl| (kv.lease, ttl)),
                };
                self.adopt_leased(lease, &kv, sent)
            }
            Then::Adopted { lease, ttl, sent } => {
                let r = answer.txn();
                let txn = self.noted(pk, cluster, r);
                self.adopted(pk, txn, (lease, ttl, sent))
            }
            Then::HoldRead {
                reason,
                from_other_host,
                tail,
            } => self.hold_read(pk, answer.records(), (reason, from_other_host), tail),
            Then::HoldClaim {
                reason,
                from_other_host,
                tail,
            } => {
                let r = answer.kv();
                let claim = self.noted(pk, cluster, r);
                self.hold_claim(pk, claim, (reason, from_other_host), tail)
            }
            Then::Reread { was_unread } => self.reread(pk, answer.records(), was_unread),
            Then::FoundClaim => {
                let r = answer.kv();
                if let Some(Some(claim)) = self.noted(pk, cluster, r) {
                    self.hand_over(pk, &claim);
                }
                Next::End
            }
            Then::Swapped {
                held,
                claim,
                falling_back,
            } => {
                let r = answer.txn();
                let txn = self.noted(pk, cluster, r);
                self.swapped(pk, txn, held, claim, falling_back)
            }
            Then::NewerClaim { claim_revision } => {
                let r = answer.kv();
                if let Some(Some(newer)) = self.noted(pk, cluster, r) {
                    if newer.mod_revision != claim_revision {
                        self.hand_over(pk, &newer);
                    }
                }
                Next::End
            }
            Then::GiveUpRead { lease } => {
                let r = answer.kv();
                let kv = self.noted(pk, cluster, r);
                self.give_up_read(kv, lease)
            }
            Then::GiveUpRevoked => {
                let r = answer.done();
                self.noted(pk, cluster, r);
                Next::End
            }
            Then::WithdrawRead { lease } => Self::withdraw_read(answer.kv(), lease),
            Then::Ignored => Next::End,
        }
    }
}
