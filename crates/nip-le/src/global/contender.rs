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
use crate::elector::upper::{UpperLevel, UpperNews};
use crate::elector::{ChangeReason, GlobalHolder, GlobalStatus};
use crate::pubkey::AgentPubkey;

use super::gateway::{Change, Gateway, Kv, Txn};
use super::{EtcdConfig, WhenUnreachable};

/// How the contender tells the writer.
pub(crate) type Tell = Box<dyn Fn(AgentPubkey, UpperNews) + Send>;

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
    gw: Gateway,
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
    /// Starts the contender and its watch for `cfg` (validated).
    pub(crate) fn start(
        cfg: EtcdConfig,
        our_id: &str,
        stand_down: Duration,
        tell: Tell,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let cfg_host = cfg.host_id.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let timeout = (cfg.ttl / 4).min(Duration::from_secs(1));
        let task = Task {
            gw: Gateway::new(&cfg.endpoints, timeout),
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
            .spawn(move || watch(&cfg, &wtx, &wstop))?;
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
fn watch(cfg: &EtcdConfig, tx: &mpsc::Sender<Inbox>, stop: &AtomicBool) {
    let gw = Gateway::new(&cfg.endpoints, Duration::from_secs(1));
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
    fn noted<T>(
        &mut self,
        pk: AgentPubkey,
        r: Result<T, super::gateway::GatewayError>,
    ) -> Option<T> {
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

    /// Everything a key needs now: renew, look, acquire, adopt, claim,
    /// fall back.
    fn settle(&mut self, pk: AgentPubkey) {
        let now = Instant::now();
        let Some(e) = self.entries.get(&pk) else {
            return;
        };
        if e.claim_until.is_some_and(|t| t <= now) {
            self.claim_expired(pk);
        }
        let e = &self.entries[&pk];
        if !e.leads || e.retry_at.is_some_and(|t| t > now) {
            self.check_unreachable(pk);
            return;
        }
        let (held, verify) = (e.held, e.verify);
        let look = verify || (held.is_none() && self.needs_look(e));
        if let Some(e) = self.entries.get_mut(&pk) {
            e.verify = false;
        }
        match held {
            Some(h) if verify || h.renew_at <= now => self.renew(pk, h),
            _ => {}
        }
        if look {
            self.look(pk);
        }
        self.check_unreachable(pk);
    }

    /// Whether a host leader that does not hold the key must ask etcd now:
    /// nothing known, our host's holder to continue, a claim to post, or
    /// no word from etcd for half a TTL (the watch is silent when nothing
    /// changes; this is how an unreachable etcd is noticed). Otherwise the
    /// watch tells us.
    fn needs_look(&self, e: &Entry) -> bool {
        let foreign = e
            .holder
            .as_ref()
            .is_some_and(|h| !h.host_id.is_empty() && h.host_id != self.cfg.host_id);
        !foreign
            || e.verify
            || (e.claim_until.is_some() && e.claim_lease.is_none())
            || self.last_contact.elapsed() >= self.cfg.ttl / 2
    }

    /// Renews our lease; a lease that etcd no longer knows means the key
    /// is gone.
    fn renew(&mut self, pk: AgentPubkey, h: Held) {
        let sent = boot_nanos();
        let r = self.gw.keep_alive(h.lease);
        let Some(ttl) = self.noted(pk, r) else {
            return;
        };
        let e = self.entries.get_mut(&pk).expect("noted checked");
        if ttl.is_zero() {
            e.held = None;
            e.cell.set_global(global_state::NOT_HELD, 0);
            tracing::warn!(pubkey = %pk, "etcd lease expired");
            self.tell(pk, Some(ChangeReason::Lost));
            return;
        }
        let was_valid = boot_nanos() < h.until;
        let until = Self::deadline(sent, ttl);
        e.cell.set_global(global_state::HELD, until);
        e.held = Some(Held {
            renew_at: Instant::now() + ttl / 3,
            until,
            ..h
        });
        if !was_valid {
            self.tell(pk, Some(ChangeReason::Unfenced));
        }
    }

    /// Looks at the key and takes it when it is free, ours or our host's.
    fn look(&mut self, pk: AgentPubkey) {
        let key = self.cfg.leader_key(&pk);
        let r = self.gw.get_at(&key);
        let Some((kv, revision)) = self.noted(pk, r) else {
            return;
        };
        let e = self.entries.get_mut(&pk).expect("noted checked");
        e.seen = e.seen.max(revision);
        let was = e.holder.clone();
        e.see(kv.as_ref().map(holder_of));
        match kv {
            None => self.acquire(pk, was.is_some()),
            Some(kv) => {
                let h = holder_of(&kv);
                let ours = h.instance_id == self.our_id;
                let held_now = e.held.is_some_and(|held| ours && held.lease == kv.lease);
                if held_now {
                    return;
                }
                if e.held.is_some() {
                    self.lost(pk);
                    return;
                }
                if self.claim_granted(pk, &kv) {
                    return;
                }
                let foreign_host = !h.host_id.is_empty() && h.host_id != self.cfg.host_id;
                if foreign_host && kv.lease != 0 {
                    self.post_claim(pk);
                    if was != self.entries[&pk].holder {
                        self.tell(pk, None);
                    }
                    return;
                }
                // Our host's (a sibling crashed, stood down or handed the
                // host lock to us), ours from before, or a value nobody
                // can hold: continue it.
                self.adopt(pk, &kv);
            }
        }
    }

    fn acquire(&mut self, pk: AgentPubkey, after_another: bool) {
        let sent = boot_nanos();
        let r = self.gw.grant(self.cfg.ttl);
        let Some((lease, ttl)) = self.noted(pk, r) else {
            return;
        };
        let (key, value) = (self.cfg.leader_key(&pk), self.value());
        let r = self.gw.create(&key, &value, lease);
        match self.noted(pk, r) {
            Some(Txn::Done(revision)) => {
                let reason = if after_another {
                    ChangeReason::Failover
                } else {
                    ChangeReason::Acquired
                };
                self.hold(pk, lease, revision, ttl, sent, reason);
            }
            Some(Txn::Failed(kv)) => {
                let _ = self.gw.revoke(lease);
                let e = self.entries.get_mut(&pk).expect("noted checked");
                e.see(kv.as_ref().map(holder_of));
                self.tell(pk, None);
            }
            None => {
                let _ = self.gw.revoke(lease);
            }
        }
    }

    /// Continues the lease `kv` is bound to, rewriting the key in our name
    /// only if nobody wrote it since we read it.
    fn adopt(&mut self, pk: AgentPubkey, kv: &Kv) {
        let sent = boot_nanos();
        let (lease, ttl) = if kv.lease == 0 {
            let r = self.gw.grant(self.cfg.ttl);
            match self.noted(pk, r) {
                Some(x) => x,
                None => return,
            }
        } else {
            let r = self.gw.keep_alive(kv.lease);
            match self.noted(pk, r) {
                // Expired: its deletion is on its way to the watch.
                Some(ttl) if ttl.is_zero() => return,
                Some(ttl) => (kv.lease, ttl),
                None => return,
            }
        };
        let (key, value) = (self.cfg.leader_key(&pk), self.value());
        let r = self.gw.swap(&key, kv.mod_revision, &value, lease, None);
        match self.noted(pk, r) {
            Some(Txn::Done(revision)) => {
                self.hold(pk, lease, revision, ttl, sent, ChangeReason::HandedOver)
            }
            Some(Txn::Failed(kv)) => {
                let e = self.entries.get_mut(&pk).expect("noted checked");
                e.see(kv.as_ref().map(holder_of));
            }
            None => {}
        }
    }

    fn hold(
        &mut self,
        pk: AgentPubkey,
        lease: i64,
        revision: u64,
        ttl: Duration,
        sent: u64,
        reason: ChangeReason,
    ) {
        let host_id = self.cfg.host_id.clone();
        let our_id = self.our_id.clone();
        let e = self.entries.get_mut(&pk).expect("caller checked");
        // The last holder we know of; a key we found absent and never saw
        // held counts as ours (nobody else answered for it).
        let from_other_host = e.last_holder_host.as_ref().is_some_and(|h| *h != host_id);
        if !e.leads {
            // The host moved while we were asking: let the sibling have it.
            return;
        }
        let until = Self::deadline(sent, ttl);
        e.held = Some(Held {
            lease,
            revision,
            renew_at: Instant::now() + ttl / 3,
            until,
        });
        e.see(Some(GlobalHolder {
            host_id,
            instance_id: our_id,
            revision,
        }));
        e.fallback = false;
        e.claim_until = None;
        e.claim_lease = None;
        e.seen = e.seen.max(revision);
        e.cell.set_global(global_state::HELD, until);
        tracing::info!(pubkey = %pk, revision, ?reason, instance = %self.our_id, "holds the etcd lease");
        self.tell_gain(pk, Some(reason), from_other_host);
    }

    /// Someone else holds the key now. We look again only after a while:
    /// two windows of one host that both think they lead it (a fail-safe
    /// host leader) must not take the key from each other in a hot loop.
    fn lost(&mut self, pk: AgentPubkey) {
        let e = self.entries.get_mut(&pk).expect("caller checked");
        e.retry_at = Some(Instant::now() + self.cfg.ttl / 4);
        if e.held.take().is_some() {
            e.cell.set_global(global_state::NOT_HELD, 0);
            tracing::warn!(pubkey = %pk, instance = %self.our_id, "lost the etcd key");
            self.tell(pk, Some(ChangeReason::Lost));
        }
    }

    /// We no longer lead our host: stop acting at once; give the agent up
    /// when no sibling will continue it.
    fn step_back(&mut self, pk: AgentPubkey, revoke: bool) {
        let e = self.entries.get_mut(&pk).expect("caller inserted");
        e.cell.set_global(global_state::NOT_HELD, 0);
        e.fallback = false;
        if let Some(h) = e.held.take() {
            if revoke {
                let r = self.gw.revoke(h.lease);
                self.noted(pk, r);
            }
        }
        self.tell(pk, None);
    }

    /// Posts our claim when another host holds the key.
    fn post_claim(&mut self, pk: AgentPubkey) {
        let e = &self.entries[&pk];
        if e.claim_until.is_none() || e.claim_lease.is_some() {
            return;
        }
        let r = self.gw.grant(self.cfg.ttl);
        let Some((lease, _)) = self.noted(pk, r) else {
            return;
        };
        let (key, value) = (self.cfg.claim_key(&pk), self.value());
        let r = self.gw.put(&key, &value, lease);
        if self.noted(pk, r).is_some() {
            self.entries.get_mut(&pk).expect("noted").claim_lease = Some(lease);
            tracing::info!(pubkey = %pk, "posted a cross-host claim");
        } else {
            let _ = self.gw.revoke(lease);
        }
    }

    fn claim_expired(&mut self, pk: AgentPubkey) {
        let e = self.entries.get_mut(&pk).expect("caller checked");
        e.claim_until = None;
        if let Some(lease) = e.claim_lease.take() {
            // Revoking the claim's lease deletes the claim key with it.
            let _ = self.gw.revoke(lease);
        }
    }

    /// The holder stands down for a claim from another window: stop acting
    /// first, then rewrite the key for the claimant (bound to its lease)
    /// and drop the claim in one transaction.
    fn hand_over(&mut self, pk: AgentPubkey, claim: &Kv) {
        let claimant = holder_of(claim);
        let e = self.entries.get_mut(&pk).expect("caller checked");
        let Some(h) = e.held else {
            return;
        };
        if claimant.instance_id.is_empty()
            || claimant.instance_id == self.our_id
            || claim.lease == 0
        {
            return;
        }
        e.cell.set_global(global_state::NOT_HELD, 0);
        e.held = None;
        tracing::info!(pubkey = %pk, to = %claimant.instance_id, "standing down for a cross-host claim");
        self.tell(pk, Some(ChangeReason::StoodDown));
        let key = self.cfg.leader_key(&pk);
        let claim_key = self.cfg.claim_key(&pk);
        let r = self.gw.swap(
            &key,
            h.revision,
            &claim.value,
            claim.lease,
            Some(&claim_key),
        );
        if let Some(Txn::Done(_)) = self.noted(pk, r) {
            let _ = self.gw.revoke(h.lease);
        }
    }

    /// A change seen by the watch.
    fn changed(&mut self, c: Change) {
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
                if e.held.is_some() {
                    // Revoked or expired under us.
                    self.lost(pk);
                }
                if self.entries[&pk].leads {
                    self.acquire(pk, had);
                } else {
                    self.tell(pk, None);
                }
            }
            ("claim", Some(kv)) if self.entries[&pk].held.is_some() => self.hand_over(pk, &kv),
            _ => {}
        }
    }

    fn leader_written(&mut self, pk: AgentPubkey, kv: &Kv) {
        let h = holder_of(kv);
        let our_id = self.our_id.clone();
        let e = self.entries.get_mut(&pk).expect("checked");
        e.see(Some(h.clone()));
        match e.held {
            Some(held) if kv.mod_revision <= held.revision => {}
            Some(held) if h.instance_id == our_id && kv.lease == held.lease => {
                e.held = Some(Held {
                    revision: kv.mod_revision,
                    ..held
                });
            }
            Some(_) => self.lost(pk),
            None => {
                if !self.claim_granted(pk, kv) {
                    self.tell(pk, None);
                }
            }
        }
    }

    /// Whether `kv` is our claim granted (the holder rewrote the key for
    /// us, bound to our claim's lease); if so, we hold it now.
    fn claim_granted(&mut self, pk: AgentPubkey, kv: &Kv) -> bool {
        let e = &self.entries[&pk];
        let ours = holder_of(kv).instance_id == self.our_id;
        if !(ours && e.leads && e.held.is_none() && e.claim_lease == Some(kv.lease)) {
            return false;
        }
        let sent = boot_nanos();
        let r = self.gw.keep_alive(kv.lease);
        match self.noted(pk, r) {
            Some(ttl) if !ttl.is_zero() => {
                self.hold(
                    pk,
                    kv.lease,
                    kv.mod_revision,
                    ttl,
                    sent,
                    ChangeReason::Claimed,
                );
                true
            }
            _ => false,
        }
    }

    fn parse_key<'a>(&self, key: &'a str) -> Option<(AgentPubkey, &'a str)> {
        let rest = key.strip_prefix(&self.cfg.prefix)?.strip_prefix('/')?;
        let (pk, kind) = rest.split_once('/')?;
        Some((AgentPubkey::parse(pk).ok()?, kind))
    }

    /// Whether etcd has been silent for a whole TTL: no lease of ours can
    /// have survived that, and the policy decides whether the host leader
    /// acts anyway.
    fn check_unreachable(&mut self, pk: AgentPubkey) {
        let silent = self.last_contact.elapsed() >= self.cfg.ttl;
        let policy = self.cfg.when_unreachable;
        let e = self.entries.get_mut(&pk).expect("caller checked");
        if silent && e.held.is_some() {
            e.held = None;
            e.cell.set_global(global_state::NOT_HELD, 0);
        }
        let fall_back = silent && e.leads && policy == WhenUnreachable::FallBack;
        if fall_back && !e.fallback {
            e.fallback = true;
            e.cell.set_global(global_state::FALLBACK, 0);
            tracing::warn!(pubkey = %pk, "etcd unreachable for a whole TTL: acting for this host only");
            self.tell(pk, Some(ChangeReason::FailSafe));
        } else if !silent && e.fallback {
            e.fallback = false;
            if e.held.is_none() {
                e.cell.set_global(global_state::NOT_HELD, 0);
                self.tell(pk, Some(ChangeReason::Lost));
            }
        }
    }

    /// Shutdown: every lease we still hold is revoked (the writer has
    /// stepped down everywhere already, handing to siblings where it
    /// could; those were told with `revoke: false`).
    fn give_up_all(&mut self) {
        let held: Vec<(AgentPubkey, i64)> = self
            .entries
            .iter()
            .filter_map(|(pk, e)| Some((*pk, e.held?.lease)))
            .collect();
        for (pk, lease) in held {
            let e = self.entries.get_mut(&pk).expect("listed");
            e.cell.set_global(global_state::NOT_HELD, 0);
            let _ = self.gw.revoke(lease);
        }
        for e in self.entries.values() {
            if let Some(lease) = e.claim_lease {
                let _ = self.gw.revoke(lease);
            }
        }
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
