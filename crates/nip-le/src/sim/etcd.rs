//! The simulated etcd every host of a run shares: the in-memory etcd of the
//! contender's unit tests on the run's virtual clock, and per host the
//! faults of its link: cut off (every call fails, the watch is silent),
//! flaky (a call fails by chance, and half of those failures happen after
//! etcd applied it: the answer was lost, as with a client timeout), or
//! hostile (every answer forged: TTLs and revisions near `u64::MAX`). And
//! etcd's own: a restart (out of reach meanwhile, leases kept), data loss
//! (every key, lease and revision gone). Calls take no virtual time: a
//! slow answer is one that times out (flaky), not one that arrives late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::global::etcd::{Etcd, EtcdError, Kv, Result, Txn, Watch, WatchMessage};
use crate::global::memory::MemoryEtcd;

use super::rng::Rng;

/// One host's link.
#[derive(Debug, Default, Clone, Copy)]
struct Link {
    cut_until: u64,
    flaky_until: u64,
    /// Chance a call fails while flaky.
    flaky: f64,
    hostile_until: u64,
}

/// The shared etcd and the links.
pub struct SimEtcd {
    etcd: MemoryEtcd,
    t: Arc<AtomicU64>,
    links: Mutex<Vec<Link>>,
    rng: Mutex<Rng>,
    /// Calls answered, failed, and applied but answered with an error.
    pub calls: AtomicU64,
    /// See [`SimEtcd::calls`].
    pub failed: AtomicU64,
    /// See [`SimEtcd::calls`].
    pub lost_answers: AtomicU64,
}

impl SimEtcd {
    /// An empty etcd for `hosts` hosts, on the virtual clock `t` (ns).
    pub fn new(hosts: usize, t: Arc<AtomicU64>, rng: Rng) -> Arc<Self> {
        let base = Instant::now();
        let clock = Arc::clone(&t);
        Arc::new(Self {
            etcd: MemoryEtcd::with_clock(Arc::new(move || {
                base + Duration::from_nanos(clock.load(Ordering::Relaxed))
            })),
            t,
            links: Mutex::new(vec![Link::default(); hosts]),
            rng: Mutex::new(rng),
            calls: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            lost_answers: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.t.load(Ordering::Relaxed)
    }

    fn link(&self, host: usize) -> Link {
        self.links.lock().unwrap_or_else(|e| e.into_inner())[host]
    }

    /// Host `host` cannot reach etcd until `until`.
    pub fn cut(&self, host: usize, until: u64) {
        let mut l = self.links.lock().unwrap_or_else(|e| e.into_inner());
        l[host].cut_until = l[host].cut_until.max(until);
    }

    /// Host `host`'s calls fail with chance `p` until `until`.
    pub fn flaky(&self, host: usize, until: u64, p: f64) {
        let mut l = self.links.lock().unwrap_or_else(|e| e.into_inner());
        l[host].flaky_until = l[host].flaky_until.max(until);
        l[host].flaky = p;
    }

    /// Host `host`'s answers are forged until `until`.
    pub fn hostile(&self, host: usize, until: u64) {
        let mut l = self.links.lock().unwrap_or_else(|e| e.into_inner());
        l[host].hostile_until = l[host].hostile_until.max(until);
    }

    /// Etcd restarts for `d` from now: out of everyone's reach, and no
    /// lease expires meanwhile.
    pub fn restart(&self, d: u64) {
        let until = self.now() + d;
        let hosts = self.links.lock().unwrap_or_else(|e| e.into_inner()).len();
        for h in 0..hosts {
            self.cut(h, until);
        }
        self.etcd.extend_leases(Duration::from_nanos(d));
    }

    /// Etcd loses everything (revisions start again).
    pub fn lose_everything(&self) {
        self.etcd.lose_everything();
    }

    /// Whether host `host`'s answers are forged now.
    fn forged(&self, host: usize) -> bool {
        self.link(host).hostile_until > self.now()
    }

    /// Whether host `host` reaches etcd now.
    pub fn reachable(&self, host: usize) -> bool {
        self.link(host).cut_until <= self.now()
    }

    /// What a watch of host `host` on `prefix` from `next` sees now (0: a
    /// watch created now).
    pub fn watch_message(&self, host: usize, prefix: &str, next: u64) -> Option<WatchMessage> {
        if !self.reachable(host) {
            return None;
        }
        let revision = self.etcd.revision();
        // A watch ahead of the store: etcd lost data, which takes a
        // restart, which breaks every stream; the one reopened from `next`
        // is answered by its created message (etcd then waits in silence
        // for the store to reach `next`).
        if next == 0 || revision.saturating_add(1) < next {
            return Some(WatchMessage {
                revision,
                created: true,
                ..WatchMessage::default()
            });
        }
        self.etcd.changes_since(prefix, next)
    }

    /// Every change from revision `from`, as trace lines.
    pub fn describe_since(&self, from: u64) -> Vec<String> {
        let Some(m) = self.etcd.changes_since("", from) else {
            return Vec::new();
        };
        m.changes
            .iter()
            .map(|c| match &c.kv {
                Some(kv) => format!(
                    "etcd rev {}: put {} = {} (lease {})",
                    c.revision,
                    c.key.rsplit('/').next().unwrap_or(""),
                    String::from_utf8_lossy(&kv.value),
                    kv.lease
                ),
                None => format!(
                    "etcd rev {}: delete {}",
                    c.revision,
                    c.key.rsplit('/').next().unwrap_or("")
                ),
            })
            .collect()
    }

    /// The store's revision (expiring leases on the way).
    pub fn revision(&self) -> u64 {
        self.etcd.revision()
    }

    /// The client of host `host`.
    pub fn client(self: &Arc<Self>, host: usize) -> Arc<dyn Etcd> {
        Arc::new(Client {
            etcd: Arc::clone(self),
            host,
        })
    }

    /// Runs a call of host `host` through its link.
    fn call<T>(&self, host: usize, f: impl FnOnce(&MemoryEtcd) -> Result<T>) -> Result<T> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let link = self.link(host);
        let t = self.now();
        if link.cut_until > t {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(EtcdError::unreachable("simulated: etcd unreachable"));
        }
        if link.flaky_until > t {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            if rng.chance(link.flaky) {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if rng.chance(0.5) {
                    drop(rng);
                    self.lost_answers.fetch_add(1, Ordering::Relaxed);
                    let _ = f(&self.etcd);
                    return Err(EtcdError::unreachable("simulated: the answer was lost"));
                }
                return Err(EtcdError::unreachable("simulated: the request was lost"));
            }
        }
        f(&self.etcd)
    }
}

/// The TTL a hostile answer claims (etcd's JSON carries it as an int64 of
/// seconds).
const FORGED_TTL: Duration = Duration::from_secs(i64::MAX as u64);

/// A host's client.
struct Client {
    etcd: Arc<SimEtcd>,
    host: usize,
}

impl Etcd for Client {
    fn cluster_id(&self) -> u64 {
        self.etcd.etcd.cluster_id()
    }
    fn get_at(&self, key: &str) -> Result<(Option<Kv>, u64)> {
        let r = self.etcd.call(self.host, |e| e.get_at(key));
        if self.etcd.forged(self.host) {
            return r.map(|(kv, _)| {
                let kv = kv.map(|kv| Kv {
                    mod_revision: u64::MAX - 1,
                    ..kv
                });
                (kv, u64::MAX - 1)
            });
        }
        r
    }
    fn create(&self, key: &str, value: &[u8], lease: i64) -> Result<Txn> {
        self.etcd.call(self.host, |e| e.create(key, value, lease))
    }
    fn swap(
        &self,
        key: &str,
        mod_revision: u64,
        value: &[u8],
        lease: i64,
        also_delete: Option<(&str, u64)>,
    ) -> Result<Txn> {
        self.etcd.call(self.host, |e| {
            e.swap(key, mod_revision, value, lease, also_delete)
        })
    }
    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<()> {
        self.etcd.call(self.host, |e| e.put(key, value, lease))
    }
    fn create_if(
        &self,
        guard: &str,
        guard_revision: u64,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Txn> {
        self.etcd.call(self.host, |e| {
            e.create_if(guard, guard_revision, key, value, lease)
        })
    }
    fn delete_if(&self, key: &str, mod_revision: u64) -> Result<bool> {
        self.etcd
            .call(self.host, |e| e.delete_if(key, mod_revision))
    }
    fn range(&self, prefix: &str, limit: usize) -> Result<Vec<Kv>> {
        self.etcd.call(self.host, |e| e.range(prefix, limit))
    }
    fn grant(&self, ttl: Duration) -> Result<(i64, Duration)> {
        let r = self.etcd.call(self.host, |e| e.grant(ttl));
        match r {
            Ok((id, _)) if self.etcd.forged(self.host) => Ok((id, FORGED_TTL)),
            r => r,
        }
    }
    fn keep_alive(&self, lease: i64) -> Result<Duration> {
        let r = self.etcd.call(self.host, |e| e.keep_alive(lease));
        match r {
            Ok(_) if self.etcd.forged(self.host) => Ok(FORGED_TTL),
            r => r,
        }
    }
    fn revoke(&self, lease: i64) -> Result<()> {
        self.etcd.call(self.host, |e| e.revoke(lease))
    }
    fn watch(&self, _: &str, _: bool, _: u64, _: Duration) -> Result<Box<dyn Watch>> {
        // The simulator feeds each contender's watch cursor itself
        // ([`SimEtcd::watch_message`]).
        Err(EtcdError::unreachable("simulated: no watch stream"))
    }
}
