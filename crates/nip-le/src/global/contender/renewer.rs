//! Renewals beside the task. The task's one thread renews the leases it
//! holds, and also reads and writes the agents' work records: reading many
//! records, or sending many, over a slow link can take longer than a TTL,
//! and a lease not renewed meanwhile would expire under a window that is
//! acting (another host takes the key; the agent moves for nothing).
//!
//! So the task lists what it holds ([`Leases`], before every call on the
//! work records and after every step), and a thread of its own, on a
//! connection of its own, renews whatever the task is late for: each
//! key's lease, checking that the key still names us on it, and the lease
//! of our open take records. A key's renewal reaches the writer as a
//! [`Renewed`], which only keeps the permit open now on that lease open
//! longer. The renewer decides nothing: it never takes, gives up or opens.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::elector::cache;
use crate::elector::global_level::{Renewed, TellRenewed};
use crate::pubkey::AgentPubkey;

use super::super::etcd::Etcd;
use super::super::EtcdConfig;
use super::holder_of;

/// What the task holds now, as it last listed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Listed {
    /// The keys we hold (not those being handed over).
    pub keys: BTreeMap<AgentPubkey, KeyLease>,
    /// The lease of our open take records, and when the task renews it.
    pub takes: Option<(i64, Instant)>,
    /// The highest store revision the task has seen: an answer below it
    /// comes from a store that lost data, and extends nothing.
    pub revision: u64,
    /// The cluster the task knows (0: none yet): another one extends
    /// nothing.
    pub cluster: u64,
}

/// A key's hold, as the renewer needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyLease {
    pub lease: i64,
    /// The revision we wrote the key at: the key must name us at it or
    /// later.
    pub revision: u64,
    /// The host leadership the hold belongs to.
    pub tenure: u64,
    /// When the task renews it next.
    pub due: Instant,
}

/// The task's list, shared with the renewer's thread (one writer: the
/// task).
#[derive(Debug, Default)]
pub(crate) struct Leases(Mutex<Listed>);

impl Leases {
    /// The task's new list.
    pub(crate) fn set(&self, listed: Listed) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = listed;
    }

    /// The list as it stands.
    pub(crate) fn get(&self) -> Listed {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Whether the renewer renews a lease now: the task was to renew it at
/// `due` and is a twelfth of a TTL late, and the renewer itself did not
/// renew it in the last third of a TTL (`ours`). The task keeps the lease
/// while it keeps time, so renewals are not sent twice.
pub(crate) fn late(due: Instant, ours: Option<Instant>, now: Instant, ttl: Duration) -> bool {
    now >= due + ttl / 12 && ours.is_none_or(|t| now >= t + ttl / 3)
}

/// How often the renewer looks at the list.
pub(crate) fn tick(ttl: Duration) -> Duration {
    (ttl / 24).clamp(Duration::from_millis(5), Duration::from_millis(500))
}

/// The renewer's thread: until `stop`, renews what the task is late for.
pub(crate) fn run(
    leases: &Leases,
    etcd: &dyn Etcd,
    who: (&EtcdConfig, &str),
    tell: &TellRenewed,
    stop: &AtomicBool,
) {
    let mut ours = Renewer::default();
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(tick(who.0.ttl));
        let listed = leases.get();
        for (pk, r) in ours.look(&listed, Instant::now(), &cache::boot_nanos, etcd, who) {
            tell(pk, r);
        }
    }
}

/// The renewer's own memory: when it last renewed each lease.
#[derive(Debug, Default)]
pub(crate) struct Renewer {
    renewed: HashMap<i64, Instant>,
}

impl Renewer {
    /// One look at what the task holds (`listed`) at `now`: renews
    /// whatever the task is late for (`boot` reads the clock permits are
    /// counted on, before each renewal); the renewals the writer is to
    /// hear of.
    pub(crate) fn look(
        &mut self,
        listed: &Listed,
        now: Instant,
        boot: &dyn Fn() -> u64,
        etcd: &dyn Etcd,
        (cfg, our_id): (&EtcdConfig, &str),
    ) -> Vec<(AgentPubkey, Renewed)> {
        self.renewed.retain(|l, _| {
            listed.keys.values().any(|k| k.lease == *l) || listed.takes.is_some_and(|t| t.0 == *l)
        });
        let mut told = Vec::new();
        for (pk, k) in &listed.keys {
            if !late(k.due, self.renewed.get(&k.lease).copied(), now, cfg.ttl) {
                continue;
            }
            self.renewed.insert(k.lease, now);
            if let Some(until) = renew_key(etcd, cfg, our_id, pk, k, listed, boot()) {
                tracing::debug!(pubkey = %pk, lease = k.lease, "renewed beside the busy task");
                let r = Renewed {
                    tenure: k.tenure,
                    lease: k.lease,
                    until,
                };
                told.push((*pk, r));
            }
        }
        if let Some((lease, due)) = listed.takes {
            if late(due, self.renewed.get(&lease).copied(), now, cfg.ttl) {
                self.renewed.insert(lease, now);
                let _ = etcd.keep_alive(lease);
            }
        }
        told
    }
}

/// Renews `k`'s lease; the permit's new deadline if the lease lives and
/// the key still names us on it, at the revision we wrote or later, in
/// the store the task knows.
fn renew_key(
    etcd: &dyn Etcd,
    cfg: &EtcdConfig,
    our_id: &str,
    pk: &AgentPubkey,
    k: &KeyLease,
    listed: &Listed,
    sent: u64,
) -> Option<u64> {
    let ttl = etcd.keep_alive(k.lease).ok()?.min(cfg.ttl);
    if ttl.is_zero() {
        return None;
    }
    let (kv, revision) = etcd.get_at(&cfg.leader_key(pk)).ok()?;
    let cluster = etcd.cluster_id();
    let same_store = revision >= listed.revision
        && (cluster == 0 || listed.cluster == 0 || cluster == listed.cluster);
    let kv = kv.filter(|_| same_store)?;
    let ours = kv.lease == k.lease
        && kv.mod_revision >= k.revision
        && holder_of(&kv).instance_id == our_id;
    ours.then(|| deadline(sent, ttl))
}

/// The permit's deadline for a lease renewed (or granted) by a request
/// sent at `sent` (a [`cache::boot_nanos`] instant) for `ttl`: etcd counts
/// the lease from when it received the request, and a tenth of the TTL is
/// the margin for clock rate.
pub(crate) fn deadline(sent: u64, ttl: Duration) -> u64 {
    let safe = if mutated!(NoFence) {
        ttl * 4
    } else {
        ttl - ttl / 10
    };
    sent.saturating_add(u64::try_from(safe.as_nanos()).unwrap_or(u64::MAX))
}
