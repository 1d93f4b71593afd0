//! The contender: one thread per elector that holds, renews, hands over and
//! watches the agents' etcd keys for the keys this instance leads on its
//! host (see the module docs of [`crate::global`]). A second thread reads
//! the watch stream and feeds the first; every etcd call is bounded by a
//! timeout, and the permit it gives a key cell ends on its own at the
//! lease's deadline whether or not this thread is running.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::elector::cache::{boot_nanos, global_state, KeyCell};
use crate::elector::upper::{Tell, UpperLevel, UpperNews};
use crate::elector::{ChangeReason, GlobalHolder, GlobalStatus};
use crate::pubkey::AgentPubkey;

use super::etcd::{Change, Etcd, Kv, Txn};
use super::gateway::Gateway;
use super::{EtcdConfig, WhenUnreachable};

mod moves;

/// The value of a leader or claim key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Value {
    host_id: String,
    instance_id: String,
}

/// The holder a key names; a value we cannot read names nobody we know.
pub(crate) fn holder_of(kv: &Kv) -> GlobalHolder {
    let v: Option<Value> = serde_json::from_slice(&kv.value).ok();
    GlobalHolder {
        host_id: v.as_ref().map_or_else(String::new, |v| v.host_id.clone()),
        instance_id: v.map_or_else(String::new, |v| v.instance_id),
        revision: kv.mod_revision,
    }
}

enum Inbox {
    Lead {
        pk: AgentPubkey,
        cell: Arc<KeyCell>,
        leads: bool,
        revoke: bool,
    },
    Claim(AgentPubkey, Arc<KeyCell>),
    /// The watch (re)started without a known revision: look again.
    Synced,
    Change(Change),
    Shutdown(mpsc::SyncSender<()>),
}

/// Our hold on a key.
#[derive(Debug, Clone, Copy)]
struct Held {
    lease: i64,
    /// The revision we last wrote the key at.
    revision: u64,
    renew_at: Instant,
    /// The permit's deadline ([`boot_nanos`]).
    until: u64,
}

struct Entry {
    cell: Arc<KeyCell>,
    /// We lead our host for this key.
    leads: bool,
    held: Option<Held>,
    holder: Option<GlobalHolder>,
    fallback: bool,
    /// A claim of ours, until it expires.
    claim_until: Option<Instant>,
    /// The lease our posted claim is bound to.
    claim_lease: Option<i64>,
    /// Don't call etcd for this key before (after a failure).
    retry_at: Option<Instant>,
    /// Look again even if we hold (after the watch lost track).
    verify: bool,
    /// The latest revision at which we know the leader key's state.
    seen: u64,
    /// The host of the last holder we saw (kept across deletions).
    last_holder_host: Option<String>,
    last_error: Option<String>,
}

struct Task {
    cfg: EtcdConfig,
    our_id: String,
    stand_down: Duration,
    gw: Arc<dyn Etcd>,
    tell: Tell,
    entries: HashMap<AgentPubkey, Entry>,
    /// The last time etcd answered anything.
    last_contact: Instant,
}

/// The handle the writer keeps.
pub(crate) struct Contender {
    host_id: String,
    tx: mpsc::Sender<Inbox>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Contender {
    /// Starts the contender and its watch for `cfg` (validated), on etcd's
    /// JSON gateway.
    pub(crate) fn start(
        cfg: EtcdConfig,
        our_id: &str,
        stand_down: Duration,
        tell: Tell,
    ) -> std::io::Result<Self> {
        let timeout = (cfg.ttl / 4).min(Duration::from_secs(1));
        let calls = Arc::new(Gateway::new(&cfg.endpoints, timeout));
        let watches = Arc::new(Gateway::new(&cfg.endpoints, Duration::from_secs(1)));
        Self::start_on(cfg, our_id, stand_down, tell, calls, watches)
    }

    /// [`Contender::start`] on any etcd: `calls` for the task, `watches`
    /// for the watch thread.
    pub(crate) fn start_on(
        cfg: EtcdConfig,
        our_id: &str,
        stand_down: Duration,
        tell: Tell,
        calls: Arc<dyn Etcd>,
        watches: Arc<dyn Etcd>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let cfg_host = cfg.host_id.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let task = Task {
            gw: calls,
            our_id: our_id.to_owned(),
            stand_down,
            tell,
            entries: HashMap::new(),
            last_contact: Instant::now(),
            cfg: cfg.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("nip-le-etcd".into())
            .spawn(move || task.run(rx))?;
        let (wtx, wstop) = (tx.clone(), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("nip-le-etcd-watch".into())
            .spawn(move || watch(&cfg, &*watches, &wtx, &wstop))?;
        Ok(Self {
            host_id: cfg_host,
            tx,
            thread: Some(thread),
            stop,
        })
    }
}

/// Follows every key under the prefix, from where it left off; a gap it
/// cannot bridge (first start, compaction, an error) makes the task look
/// at every key again.
fn watch(cfg: &EtcdConfig, gw: &dyn Etcd, tx: &mpsc::Sender<Inbox>, stop: &AtomicBool) {
    let prefix = format!("{}/", cfg.prefix);
    let mut next = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut stream = match gw.watch(&prefix, true, next, Duration::from_secs(5)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("etcd watch: {e}");
                next = 0;
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        loop {
            match stream.next_message() {
                Ok(m) if m.ended => {
                    next = 0;
                    break;
                }
                Ok(m) => {
                    if m.created && next == 0 && tx.send(Inbox::Synced).is_err() {
                        return;
                    }
                    if m.created {
                        next = next.max(m.revision + 1);
                    }
                    for c in m.changes {
                        next = next.max(c.revision + 1);
                        if tx.send(Inbox::Change(c)).is_err() {
                            return;
                        }
                    }
                    next = next.max(m.revision + 1);
                }
                Err(e) => {
                    // A silent connection times out and is opened again
                    // from the next revision: nothing is missed.
                    tracing::trace!("etcd watch: {e}");
                    break;
                }
            }
            if stop.load(Ordering::Acquire) {
                return;
            }
        }
    }
}

impl UpperLevel for Contender {
    fn host_id(&self) -> &str {
        &self.host_id
    }

    fn host_leader(&mut self, pk: AgentPubkey, cell: &Arc<KeyCell>, leads: bool, revoke: bool) {
        let _ = self.tx.send(Inbox::Lead {
            pk,
            cell: Arc::clone(cell),
            leads,
            revoke,
        });
    }

    fn claim(&mut self, pk: AgentPubkey, cell: &Arc<KeyCell>) {
        let _ = self.tx.send(Inbox::Claim(pk, Arc::clone(cell)));
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        let (tx, rx) = mpsc::sync_channel(1);
        if self.tx.send(Inbox::Shutdown(tx)).is_ok() {
            let _ = rx.recv();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

impl Task {
    fn run(mut self, rx: mpsc::Receiver<Inbox>) {
        loop {
            let wait = self.next_due().saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Inbox::Shutdown(done)) => {
                    self.give_up_all();
                    let _ = done.send(());
                    return;
                }
                Ok(msg) => self.handle(msg),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            let keys: Vec<AgentPubkey> = self.entries.keys().copied().collect();
            for pk in keys {
                self.settle(pk);
            }
        }
    }

    /// When the loop must look again at the latest.
    fn next_due(&self) -> Instant {
        let now = Instant::now();
        let mut due = now + Duration::from_secs(1);
        for e in self.entries.values().filter(|e| e.leads) {
            let times = [
                e.held.map(|h| h.renew_at),
                e.retry_at,
                e.claim_until,
                (!e.fallback && e.held.is_none()).then(|| self.last_contact + self.cfg.ttl),
            ];
            for t in times.into_iter().flatten().filter(|t| *t > now) {
                due = due.min(t);
            }
        }
        due.max(now)
    }

    fn handle(&mut self, msg: Inbox) {
        match msg {
            Inbox::Lead {
                pk,
                cell,
                leads,
                revoke,
            } => {
                let e = self.entries.entry(pk).or_insert_with(|| Entry::new(cell));
                e.leads = leads;
                if !leads {
                    self.step_back(pk, revoke);
                } else if self.last_contact.elapsed() >= self.cfg.ttl {
                    // A window that did not lead its host asked etcd
                    // nothing: the silence that decides a fallback counts
                    // from now, when we need etcd.
                    self.last_contact = Instant::now();
                }
            }
            Inbox::Claim(pk, cell) => {
                let e = self.entries.entry(pk).or_insert_with(|| Entry::new(cell));
                e.claim_until = Some(Instant::now() + self.stand_down);
            }
            Inbox::Synced => {
                for e in self.entries.values_mut() {
                    e.verify = true;
                    e.retry_at = None;
                }
            }
            Inbox::Change(c) => {
                self.last_contact = Instant::now();
                self.changed(c)
            }
            Inbox::Shutdown(_) => unreachable!("handled by run"),
        }
    }

    fn status(&self, e: &Entry) -> GlobalStatus {
        GlobalStatus {
            host_id: self.cfg.host_id.clone(),
            holder: e.holder.clone(),
            fallback: e.fallback,
            last_error: e.last_error.clone(),
        }
    }

    fn tell(&self, pk: AgentPubkey, reason: Option<ChangeReason>) {
        self.tell_gain(pk, reason, false);
    }

    /// [`Task::tell`], saying whether a gain came from another host.
    fn tell_gain(&self, pk: AgentPubkey, reason: Option<ChangeReason>, from_other_host: bool) {
        if let Some(e) = self.entries.get(&pk) {
            (self.tell)(
                pk,
                UpperNews {
                    reason,
                    from_other_host,
                    status: self.status(e),
                    at_ms: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64),
                },
            );
        }
    }

    /// Records a call's outcome for `pk`: contact on success, a retry
    /// delay and the error on failure.
    fn noted<T>(&mut self, pk: AgentPubkey, r: Result<T, super::etcd::GatewayError>) -> Option<T> {
        let e = self.entries.get_mut(&pk)?;
        match r {
            Ok(v) => {
                self.last_contact = Instant::now();
                e.last_error = None;
                Some(v)
            }
            Err(err) => {
                tracing::debug!(pubkey = %pk, "etcd: {err}");
                e.last_error = Some(err.to_string());
                e.retry_at =
                    Some(Instant::now() + (self.cfg.ttl / 20).max(Duration::from_millis(50)));
                None
            }
        }
    }

    fn value(&self) -> Vec<u8> {
        serde_json::to_vec(&Value {
            host_id: self.cfg.host_id.clone(),
            instance_id: self.our_id.clone(),
        })
        .unwrap_or_default()
    }

    /// The permit's deadline for a lease renewed (or granted) by a request
    /// sent at `sent` (a [`boot_nanos`] instant) for `ttl`.
    fn deadline(sent: u64, ttl: Duration) -> u64 {
        let safe = ttl - ttl / 10;
        sent.saturating_add(u64::try_from(safe.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl Entry {
    /// Records the holder the key names now (`None`: deleted).
    fn see(&mut self, holder: Option<GlobalHolder>) {
        if let Some(h) = holder.as_ref().filter(|h| !h.host_id.is_empty()) {
            self.last_holder_host = Some(h.host_id.clone());
        }
        self.holder = holder;
    }

    fn new(cell: Arc<KeyCell>) -> Self {
        Self {
            cell,
            leads: false,
            held: None,
            holder: None,
            fallback: false,
            claim_until: None,
            claim_lease: None,
            retry_at: None,
            verify: false,
            seen: 0,
            last_holder_host: None,
            last_error: None,
        }
    }
}

#[cfg(test)]
mod tests;
