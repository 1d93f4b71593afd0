//! Issue 31: a refusal is never an outage. Three hosts whose every call
//! etcd answers with no (a wrong password, a role without access, its
//! NOSPACE alarm, a refusal we do not know) never act at once: only
//! silence may start the fall-back. The same three hosts cut off from etcd
//! do fall back, one leader each: the count can fail.

use std::sync::atomic::AtomicUsize;

use super::*;

/// An etcd whose every call fails with `error` while it is set.
struct Refusing {
    etcd: MemoryEtcd,
    error: Arc<Mutex<Option<EtcdError>>>,
    calls: Arc<AtomicUsize>,
}

impl Refusing {
    fn check(&self) -> EtcdResult<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.error.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Etcd for Refusing {
    fn get_at(&self, key: &str) -> EtcdResult<(Option<Kv>, u64)> {
        self.check()?;
        self.etcd.get_at(key)
    }
    fn create(&self, key: &str, value: &[u8], lease: i64) -> EtcdResult<Txn> {
        self.check()?;
        self.etcd.create(key, value, lease)
    }
    fn swap(
        &self,
        k: &str,
        rev: u64,
        v: &[u8],
        lease: i64,
        also: Option<(&str, u64)>,
    ) -> EtcdResult<Txn> {
        self.check()?;
        self.etcd.swap(k, rev, v, lease, also)
    }
    fn put(&self, key: &str, value: &[u8], lease: i64) -> EtcdResult<()> {
        self.check()?;
        self.etcd.put(key, value, lease)
    }
    fn cluster_id(&self) -> u64 {
        self.etcd.cluster_id()
    }
    fn create_if(&self, g: &str, rev: u64, k: &str, v: &[u8], lease: i64) -> EtcdResult<Txn> {
        self.check()?;
        self.etcd.create_if(g, rev, k, v, lease)
    }
    fn delete_if(&self, key: &str, rev: u64) -> EtcdResult<bool> {
        self.check()?;
        self.etcd.delete_if(key, rev)
    }
    fn range(&self, prefix: &str, limit: usize) -> EtcdResult<Vec<Kv>> {
        self.check()?;
        self.etcd.range(prefix, limit)
    }
    fn grant(&self, ttl: Duration) -> EtcdResult<(i64, Duration)> {
        self.check()?;
        self.etcd.grant(ttl)
    }
    fn keep_alive(&self, lease: i64) -> EtcdResult<Duration> {
        self.check()?;
        self.etcd.keep_alive(lease)
    }
    fn revoke(&self, lease: i64) -> EtcdResult<()> {
        self.check()?;
        self.etcd.revoke(lease)
    }
    fn watch(&self, k: &str, p: bool, s: u64, t: Duration) -> EtcdResult<Box<dyn Watch>> {
        self.check()?;
        self.etcd.watch(k, p, s, t)
    }
}

/// Three host leaders on one etcd, each behind its own [`Refusing`]
/// sharing `error`; the first holds the key before anything fails.
struct Three {
    clock: ManualClock,
    hosts: Vec<Host>,
    error: Arc<Mutex<Option<EtcdError>>>,
    calls: Vec<Arc<AtomicUsize>>,
}

impl Three {
    fn new(policy: WhenUnreachable) -> Self {
        let (clock, etcd) = rig();
        let error = Arc::new(Mutex::new(None));
        let mut hosts = Vec::new();
        let mut calls = Vec::new();
        for name in ["a", "b", "c"] {
            let n = Arc::new(AtomicUsize::new(0));
            let gw = Arc::new(Refusing {
                etcd: etcd.clone(),
                error: Arc::clone(&error),
                calls: Arc::clone(&n),
            });
            let cut = Arc::new(AtomicBool::new(false));
            let id = format!("{name}-window");
            hosts.push(Host::on(&etcd, &clock, name, &id, policy, gw, cut));
            calls.push(n);
        }
        for h in &mut hosts {
            h.lead(true, false);
        }
        let mut t = Self {
            clock,
            hosts,
            error,
            calls,
        };
        t.pump();
        t
    }

    fn pump(&mut self) {
        for _ in 0..3 {
            for h in &mut self.hosts {
                h.pump();
            }
        }
    }

    fn acting(&self) -> usize {
        self.hosts.iter().filter(|h| h.acts()).count()
    }

    /// From now on every call fails with `e` (the hosts' watches go
    /// silent too: a refused or lost watch delivers nothing).
    fn fail_with(&mut self, e: EtcdError) {
        *self.error.lock().unwrap() = Some(e);
        for h in &mut self.hosts {
            h.cut.store(true, Ordering::SeqCst);
        }
    }

    /// Runs `ms` of 10 ms steps: the most hosts acting at once.
    fn run(&mut self, ms: u64) -> usize {
        let mut most = 0;
        for _ in 0..ms / 10 {
            self.clock.advance(Duration::from_millis(10));
            self.pump();
            most = most.max(self.acting());
        }
        most
    }
}

fn refusals() -> Vec<EtcdError> {
    [
        "etcdserver: authentication failed, invalid user ID or password",
        "etcdserver: permission denied",
        "etcdserver: user name is empty",
        "etcdserver: mvcc: database space exceeded",
        "etcdserver: a refusal no version of etcd sends yet",
    ]
    .into_iter()
    .map(EtcdError::refused)
    .collect()
}

#[test]
fn three_hosts_that_etcd_refuses_never_act_at_once_and_say_why() {
    for policy in [WhenUnreachable::FallBack, WhenUnreachable::StaySilent] {
        for e in refusals() {
            let mut t = Three::new(policy);
            assert_eq!(t.acting(), 1, "one holder before the refusals");
            t.fail_with(e.clone());
            let most = t.run(5 * TTL.as_millis() as u64);
            assert!(most <= 1, "{policy:?}, {e}: {most} hosts acted at once");
            assert_eq!(
                t.acting(),
                0,
                "{policy:?}, {e}: the holder's permit ran out"
            );
            for h in &t.hosts {
                let last = h.task.entries[&pk()].last_error.clone().unwrap_or_default();
                assert_eq!(last, e.message, "the status says why");
                assert!(!h.task.entries[&pk()].fallback, "{e}: fell back");
            }
            // Retried with backoff: a call per refusal, the waits doubling
            // from a twentieth of the TTL to 10 s, not one every 100 ms.
            let before: Vec<usize> = t.calls.iter().map(|c| c.load(Ordering::SeqCst)).collect();
            t.run(20_000);
            for (c, b) in t.calls.iter().zip(before) {
                let made = c.load(Ordering::SeqCst) - b;
                assert!(made <= 20, "{e}: {made} calls in 20 s");
            }
            // etcd says yes again: one host acts.
            *t.error.lock().unwrap() = None;
            for h in &mut t.hosts {
                h.cut.store(false, Ordering::SeqCst);
            }
            t.run(12_000);
            assert_eq!(
                t.acting(),
                1,
                "{policy:?}, {e}: nobody acts once etcd says yes"
            );
        }
    }
}

#[test]
fn three_hosts_cut_off_from_etcd_fall_back_one_leader_each() {
    let mut t = Three::new(WhenUnreachable::FallBack);
    t.fail_with(EtcdError::unreachable("tcp connect error"));
    let most = t.run(5 * TTL.as_millis() as u64);
    assert_eq!(most, 3, "the fall-back: each host acts for itself");
    assert!(t
        .hosts
        .iter()
        .all(|h| h.cell.level_on(&t.clock) == Level::Host));
}
