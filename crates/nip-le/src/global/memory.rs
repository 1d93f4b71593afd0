//! An in-memory etcd: revisions, transactions comparing a key's create or
//! mod revision, leases that expire on a clock (the real one, or the one a
//! test or the simulator injects) and delete their keys, and watches from
//! a revision. Enough of etcd's semantics to drive the contender in unit
//! tests and in the simulator without a server.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::etcd::{Change, Etcd, EtcdError, Kv, Result, Txn, Watch, WatchMessage};

#[derive(Debug, Default)]
struct Store {
    /// The cluster's id (a data loss makes a new cluster).
    cluster: u64,
    revision: u64,
    kvs: BTreeMap<String, Kv>,
    /// Lease id → (TTL, expiry). Ordered: leases that expire together go
    /// in one order on every run (the simulator replays seeds).
    leases: BTreeMap<i64, (Duration, Instant)>,
    next_lease: i64,
    history: Vec<Change>,
}

impl Store {
    /// Expired leases go, with their keys (one revision per lease).
    fn expire(&mut self, now: Instant) {
        let gone: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.drop_lease(id);
        }
    }

    fn drop_lease(&mut self, id: i64) {
        if self.leases.remove(&id).is_none() {
            return;
        }
        let keys: Vec<String> = self
            .kvs
            .values()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key.clone())
            .collect();
        if keys.is_empty() {
            return;
        }
        self.revision += 1;
        for k in keys {
            self.delete_at(&k);
        }
    }

    fn delete_at(&mut self, key: &str) {
        if self.kvs.remove(key).is_some() {
            self.history.push(Change {
                key: key.to_owned(),
                revision: self.revision,
                kv: None,
            });
        }
    }

    fn put_at(&mut self, key: &str, value: &[u8], lease: i64) -> Result<()> {
        if lease != 0 && !self.leases.contains_key(&lease) {
            return Err(EtcdError::refused(format!("lease {lease} not found")));
        }
        let kv = Kv {
            key: key.to_owned(),
            value: value.to_vec(),
            mod_revision: self.revision,
            lease,
        };
        self.kvs.insert(key.to_owned(), kv.clone());
        self.history.push(Change {
            key: key.to_owned(),
            revision: self.revision,
            kv: Some(kv),
        });
        Ok(())
    }
}

/// The clock leases expire on.
pub(crate) type Now = Arc<dyn Fn() -> Instant + Send + Sync>;

/// One in-memory etcd, shared by every client made of it.
#[derive(Clone)]
pub(crate) struct MemoryEtcd {
    store: Arc<(Mutex<Store>, Condvar)>,
    now: Now,
}

impl Default for MemoryEtcd {
    fn default() -> Self {
        Self::with_clock(Arc::new(Instant::now))
    }
}

impl std::fmt::Debug for MemoryEtcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryEtcd").finish_non_exhaustive()
    }
}

impl MemoryEtcd {
    /// An empty etcd whose leases expire on `now`.
    pub(crate) fn with_clock(now: Now) -> Self {
        Self {
            store: Arc::default(),
            now,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        let mut s = self.store.0.lock().unwrap_or_else(|e| e.into_inner());
        s.expire((self.now)());
        s
    }

    /// What a watch on every key under `prefix` from revision `next` would
    /// say now, without waiting (`None`: nothing new).
    pub(crate) fn changes_since(&self, prefix: &str, next: u64) -> Option<WatchMessage> {
        let s = self.lock();
        let changes: Vec<Change> = s
            .history
            .iter()
            .filter(|c| c.revision >= next && c.key.starts_with(prefix))
            .cloned()
            .collect();
        (!changes.is_empty()).then(|| WatchMessage {
            revision: s.revision,
            changes,
            ..WatchMessage::default()
        })
    }

    /// The store's revision now.
    pub(crate) fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// A restart that took `d`: nobody expired leases meanwhile, so every
    /// lease has `d` more (the simulator's etcd restarts).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn extend_leases(&self, d: Duration) {
        let mut s = self.lock();
        for (_, until) in s.leases.values_mut() {
            *until += d;
        }
    }

    /// Data loss (a member restored empty): every key, lease and revision
    /// gone; revisions start again from zero.
    pub(crate) fn lose_everything(&self) {
        let mut s = self.lock();
        let (next_lease, cluster) = (s.next_lease, s.cluster + 1);
        *s = Store {
            next_lease,
            cluster,
            ..Store::default()
        };
    }

    fn changed(&self) {
        self.store.1.notify_all();
    }
}

impl Etcd for MemoryEtcd {
    fn cluster_id(&self) -> u64 {
        self.lock().cluster + 1
    }

    fn get_at(&self, key: &str) -> Result<(Option<Kv>, u64)> {
        let s = self.lock();
        Ok((s.kvs.get(key).cloned(), s.revision))
    }

    fn create(&self, key: &str, value: &[u8], lease: i64) -> Result<Txn> {
        let mut s = self.lock();
        if let Some(kv) = s.kvs.get(key) {
            return Ok(Txn::Failed(Some(kv.clone())));
        }
        s.revision += 1;
        let r = s.put_at(key, value, lease).map(|()| Txn::Done(s.revision));
        drop(s);
        self.changed();
        r
    }

    fn swap(
        &self,
        key: &str,
        mod_revision: u64,
        value: &[u8],
        lease: i64,
        also_delete: Option<(&str, u64)>,
    ) -> Result<Txn> {
        let mut s = self.lock();
        let current = s.kvs.get(key).cloned();
        let rev_of = |k: &str| s.kvs.get(k).map_or(0, |kv| kv.mod_revision);
        let other_moved = also_delete.is_some_and(|(k, rev)| rev_of(k) != rev);
        if current.as_ref().map_or(0, |kv| kv.mod_revision) != mod_revision || other_moved {
            return Ok(Txn::Failed(current));
        }
        s.revision += 1;
        s.put_at(key, value, lease)?;
        if let Some((k, _)) = also_delete {
            s.delete_at(k);
        }
        let rev = s.revision;
        drop(s);
        self.changed();
        Ok(Txn::Done(rev))
    }

    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<()> {
        let mut s = self.lock();
        s.revision += 1;
        s.put_at(key, value, lease)?;
        drop(s);
        self.changed();
        Ok(())
    }

    fn create_if(
        &self,
        guard: &str,
        guard_revision: u64,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Txn> {
        let mut s = self.lock();
        let current = s.kvs.get(guard).cloned();
        if current.as_ref().map_or(0, |kv| kv.mod_revision) != guard_revision
            || s.kvs.contains_key(key)
        {
            return Ok(Txn::Failed(current));
        }
        s.revision += 1;
        s.put_at(key, value, lease)?;
        let rev = s.revision;
        drop(s);
        self.changed();
        Ok(Txn::Done(rev))
    }

    fn delete_if(&self, key: &str, mod_revision: u64) -> Result<bool> {
        let mut s = self.lock();
        if s.kvs.get(key).map(|kv| kv.mod_revision) != Some(mod_revision) {
            return Ok(false);
        }
        s.revision += 1;
        s.delete_at(key);
        drop(s);
        self.changed();
        Ok(true)
    }

    fn range(&self, prefix: &str, limit: usize) -> Result<Vec<Kv>> {
        let s = self.lock();
        let kvs: Vec<Kv> = (s.kvs.range(prefix.to_owned()..))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, kv)| kv.clone())
            .take(limit.saturating_add(1))
            .collect();
        if kvs.len() > limit {
            return Err(EtcdError::refused(format!(
                "more than {limit} keys under {prefix}"
            )));
        }
        Ok(kvs)
    }

    fn grant(&self, ttl: Duration) -> Result<(i64, Duration)> {
        let mut s = self.lock();
        s.next_lease += 1;
        let id = s.next_lease;
        let until = (self.now)() + ttl;
        s.leases.insert(id, (ttl, until));
        Ok((id, ttl))
    }

    fn keep_alive(&self, lease: i64) -> Result<Duration> {
        let now = (self.now)();
        let mut s = self.lock();
        Ok(match s.leases.get_mut(&lease) {
            Some((ttl, until)) => {
                *until = now + *ttl;
                *ttl
            }
            None => Duration::ZERO,
        })
    }

    fn revoke(&self, lease: i64) -> Result<()> {
        let mut s = self.lock();
        s.drop_lease(lease);
        drop(s);
        self.changed();
        Ok(())
    }

    fn watch(
        &self,
        key: &str,
        prefix: bool,
        start: u64,
        read_timeout: Duration,
    ) -> Result<Box<dyn Watch>> {
        let revision = self.lock().revision;
        Ok(Box::new(MemoryWatch {
            etcd: self.clone(),
            key: key.to_owned(),
            prefix,
            next: if start == 0 { revision + 1 } else { start },
            created: false,
            read_timeout,
        }))
    }
}

/// A watch on a [`MemoryEtcd`].
struct MemoryWatch {
    etcd: MemoryEtcd,
    key: String,
    prefix: bool,
    next: u64,
    created: bool,
    read_timeout: Duration,
}

impl Watch for MemoryWatch {
    fn next_message(&mut self) -> Result<WatchMessage> {
        let end = (self.etcd.now)() + self.read_timeout;
        let mut s = self.etcd.lock();
        if !std::mem::replace(&mut self.created, true) {
            return Ok(WatchMessage {
                revision: s.revision,
                created: true,
                ..WatchMessage::default()
            });
        }
        loop {
            let changes: Vec<Change> = s
                .history
                .iter()
                .filter(|c| c.revision >= self.next)
                .filter(|c| {
                    if self.prefix {
                        c.key.starts_with(&self.key)
                    } else {
                        c.key == self.key
                    }
                })
                .cloned()
                .collect();
            if !changes.is_empty() {
                self.next = s.revision + 1;
                return Ok(WatchMessage {
                    revision: s.revision,
                    changes,
                    ..WatchMessage::default()
                });
            }
            let now = (self.etcd.now)();
            if now >= end {
                return Err(EtcdError::unreachable("watch: silent"));
            }
            // Leases expire with time alone: look again at least every
            // 20 ms.
            let wait = (end - now).min(Duration::from_millis(20));
            s = self
                .etcd
                .store
                .1
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            s.expire((self.etcd.now)());
        }
    }
}
