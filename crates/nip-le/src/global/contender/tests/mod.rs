//! The contender against an in-memory etcd, no server: the machine driven
//! step by step on a manual clock (each test is deterministic), and the
//! thread shell once.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::super::etcd::{Etcd, EtcdError, Result as EtcdResult, Txn, Watch};
use super::task::Clock;
use super::watch::Cursor;
use super::*;
use crate::elector::cache::{global_state, Clocks, KeyCell, Published};
use crate::elector::global_level::{GlobalNews, PermitState};
use crate::elector::{ChangeReason, Level};
use crate::global::memory::MemoryEtcd;
use crate::global::WhenUnreachable;

const TTL: Duration = Duration::from_secs(2);
const MS: u64 = 1_000_000;

fn pk() -> AgentPubkey {
    AgentPubkey::parse(&"ab".repeat(32)).unwrap()
}

/// Virtual time, shared by etcd and every host.
#[derive(Clone)]
struct ManualClock {
    t: Arc<AtomicU64>,
    base: Instant,
}

impl ManualClock {
    fn new() -> Self {
        Self {
            t: Arc::new(AtomicU64::new(1_000 * MS)),
            base: Instant::now(),
        }
    }
    fn advance(&self, d: Duration) {
        self.t.fetch_add(d.as_nanos() as u64, Ordering::SeqCst);
    }
    fn nanos(&self) -> u64 {
        self.t.load(Ordering::SeqCst)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.nanos())
    }
    fn boot_nanos(&self) -> u64 {
        self.nanos()
    }
    fn unix_ms(&self) -> u64 {
        self.nanos() / MS
    }
}

impl Clocks for ManualClock {
    fn boot_nanos(&self) -> u64 {
        self.nanos()
    }
}

/// A manual clock and an etcd whose leases expire on it.
fn rig() -> (ManualClock, MemoryEtcd) {
    let clock = ManualClock::new();
    let c = clock.clone();
    let etcd = MemoryEtcd::with_clock(Arc::new(move || Clock::now(&c)));
    (clock, etcd)
}

/// An etcd a host can be cut off from.
#[derive(Default)]
struct Cut {
    etcd: MemoryEtcd,
    cut: Arc<AtomicBool>,
    /// While set, every call fails with it (etcd's answer, not an outage).
    refuse: Arc<Mutex<Option<EtcdError>>>,
    /// Calls made.
    calls: Arc<AtomicUsize>,
    /// Every watch opened: its key, and whether a prefix.
    watches: Mutex<Vec<String>>,
    /// How long a range read takes (a slow link, many records).
    range_delay: Arc<Mutex<Duration>>,
    /// While set, renewals go unanswered (the rest answers).
    lose_renewals: Arc<AtomicBool>,
}

impl Cut {
    fn on(etcd: &MemoryEtcd) -> Self {
        Self {
            etcd: etcd.clone(),
            ..Self::default()
        }
    }

    fn check(&self) -> EtcdResult<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.cut.load(Ordering::SeqCst) {
            return Err(EtcdError::unreachable("unreachable"));
        }
        match self.refuse.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Etcd for Cut {
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
        let delay = *self.range_delay.lock().unwrap();
        std::thread::sleep(delay);
        self.etcd.range(prefix, limit)
    }
    fn grant(&self, ttl: Duration) -> EtcdResult<(i64, Duration)> {
        self.check()?;
        self.etcd.grant(ttl)
    }
    fn keep_alive(&self, lease: i64) -> EtcdResult<Duration> {
        self.check()?;
        if self.lose_renewals.load(Ordering::SeqCst) {
            return Err(EtcdError::unreachable("the renewal's answer was lost"));
        }
        self.etcd.keep_alive(lease)
    }
    fn revoke(&self, lease: i64) -> EtcdResult<()> {
        self.check()?;
        self.etcd.revoke(lease)
    }
    fn watch(&self, k: &str, p: bool, s: u64, t: Duration) -> EtcdResult<Box<dyn Watch>> {
        self.watches.lock().unwrap().push(format!("{k} {p}"));
        self.check()?;
        self.etcd.watch(k, p, s, t)
    }
}

/// One host leader: its task, and the writer's part played here (apply
/// each permit, confirm when asked; the flag, never fenced).
struct Host {
    task: Task,
    news: Arc<Mutex<Vec<GlobalNews>>>,
    cell: KeyCell,
    cursor: Cursor,
    cut: Arc<AtomicBool>,
    clock: ManualClock,
    confirms: usize,
    etcd: MemoryEtcd,
    /// The last work records the writer was handed.
    work: Option<Arc<crate::elector::global_level::SharedWork>>,
}

impl Host {
    fn new(etcd: &MemoryEtcd, clock: &ManualClock, name: &str, policy: WhenUnreachable) -> Self {
        Self::window(etcd, clock, name, &format!("{name}-window"), policy)
    }

    /// A window `id` of host `name`.
    fn window(
        etcd: &MemoryEtcd,
        clock: &ManualClock,
        name: &str,
        id: &str,
        policy: WhenUnreachable,
    ) -> Self {
        let gw = Arc::new(Cut::on(etcd));
        let cut = Arc::clone(&gw.cut);
        Self::on(etcd, clock, name, id, policy, gw, cut)
    }

    /// A window `id` of host `name` that calls etcd through `gw` (whose
    /// watch `cut` silences).
    fn on(
        etcd: &MemoryEtcd,
        clock: &ManualClock,
        name: &str,
        id: &str,
        policy: WhenUnreachable,
        gw: Arc<dyn Etcd>,
        cut: Arc<AtomicBool>,
    ) -> Self {
        let mut cfg = EtcdConfig::new(vec!["http://memory:0".into()], name);
        cfg.ttl = TTL;
        cfg.when_unreachable = policy;
        let news = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&news);
        let task = Task::new(
            cfg,
            id,
            TTL,
            gw,
            Box::new(move |_, n| sink.lock().unwrap().push(n)),
            Box::new(clock.clone()),
        );
        let cell = KeyCell::new(false, Published::initial(pk()));
        cell.set_global(global_state::NOT_HELD, 0);
        Self {
            task,
            news,
            cell,
            cursor: Cursor::default(),
            cut,
            clock: clock.clone(),
            confirms: 0,
            etcd: etcd.clone(),
            work: None,
        }
    }

    fn lead(&mut self, leads: bool, revoke: bool) {
        self.cell.set_leader(leads);
        self.task.step(Some(Inbox::Lead {
            pk: pk(),
            leads,
            locked: true,
            revoke,
            tenure: 1,
        }));
        self.pump();
    }

    /// Runs the watch and the news until nothing is left.
    fn pump(&mut self) {
        for _ in 0..100 {
            let mut inputs = Vec::new();
            if !self.cut.load(Ordering::SeqCst) {
                let msg = if self.cursor.start() == 0 {
                    Some(super::super::etcd::WatchMessage {
                        revision: self.etcd.revision(),
                        created: true,
                        ..Default::default()
                    })
                } else {
                    self.etcd.changes_since("/nip-le/", self.cursor.start())
                };
                inputs.extend(msg.map(|m| self.cursor.message(m)).unwrap_or_default());
            }
            let news: Vec<GlobalNews> = std::mem::take(&mut *self.news.lock().unwrap());
            for n in &news {
                self.cell.set_global(n.permit.state.code(), n.permit.until);
                if n.work.is_some() {
                    self.work.clone_from(&n.work);
                }
                if n.confirm {
                    self.confirms += 1;
                    inputs.push(Inbox::Withdrawn(pk()));
                }
            }
            if inputs.is_empty() && news.is_empty() {
                self.task.step(None);
                if self.news.lock().unwrap().is_empty() {
                    return;
                }
            }
            for i in inputs {
                self.task.step(Some(i));
            }
        }
        panic!("the task never settles");
    }

    fn acts(&self) -> bool {
        self.cell.is_leader_on(&self.clock)
    }
}

/// Hosts `a` and `b`, both leading their host, `a` first: it holds the key.
fn two_hosts(policy: WhenUnreachable) -> (ManualClock, MemoryEtcd, Host, Host) {
    let (clock, etcd) = rig();
    let mut a = Host::new(&etcd, &clock, "a", policy);
    let mut b = Host::new(&etcd, &clock, "b", policy);
    a.lead(true, false);
    b.lead(true, false);
    pump_all(&mut [&mut a, &mut b]);
    (clock, etcd, a, b)
}

/// The agent's leader key under the default prefix.
fn leader_key() -> String {
    format!("/nip-le/{}/leader", pk())
}

/// `claimant` claims the key `holder` holds; the holder's task sees the
/// claim and stands down, asking its writer to confirm (not confirmed
/// here). Returns the holder's news.
fn claim_seen(etcd: &MemoryEtcd, holder: &mut Host, claimant: &mut Host) -> Vec<GlobalNews> {
    claimant.task.step(Some(Inbox::Claim(pk())));
    claimant.pump();
    let changes = etcd
        .changes_since("/nip-le/", holder.cursor.start())
        .unwrap();
    for i in holder.cursor.message(changes) {
        holder.task.step(Some(i));
    }
    let news = std::mem::take(&mut *holder.news.lock().unwrap());
    assert!(
        news.iter().any(|n| n.confirm),
        "the holder asks its writer to stop"
    );
    news
}

fn pump_all(hosts: &mut [&mut Host]) {
    for _ in 0..3 {
        for h in hosts.iter_mut() {
            h.pump();
        }
    }
}

#[test]
fn of_two_host_leaders_one_acts_and_the_other_takes_over_at_once_when_it_steps_back() {
    let (clock, _etcd, mut a, mut b) = two_hosts(WhenUnreachable::FallBack);
    assert!(a.acts() && !b.acts(), "the first host leader holds the key");
    for _ in 0..50 {
        clock.advance(TTL / 10);
        pump_all(&mut [&mut a, &mut b]);
        assert!(a.acts() && !b.acts(), "renewed, never displaced");
    }
    assert_eq!(a.cell.level_on(&clock), Level::Global);
    assert_eq!(b.cell.level_on(&clock), Level::Host);
    // A graceful step back revokes the lease: the other host's watch sees
    // the key go and takes it in the same instant.
    a.lead(false, true);
    pump_all(&mut [&mut a, &mut b]);
    assert!(!a.acts() && b.acts());
}

#[test]
fn a_cut_off_holder_stops_acting_before_its_lease_ends_and_only_then_another_host_takes_over() {
    let (clock, _etcd, mut a, mut b) = two_hosts(WhenUnreachable::StaySilent);
    assert!(a.acts());
    a.cut.store(true, Ordering::SeqCst);
    let (mut a_stopped, mut b_started) = (None, None);
    for step in 0..400u64 {
        clock.advance(Duration::from_millis(10));
        pump_all(&mut [&mut a, &mut b]);
        assert!(!(a.acts() && b.acts()), "two hosts act at {step}0 ms");
        if !a.acts() && a_stopped.is_none() {
            a_stopped = Some(step);
        }
        if b.acts() && b_started.is_none() {
            b_started = Some(step);
        }
    }
    let (a_stopped, b_started) = (
        a_stopped.expect("a fenced"),
        b_started.expect("b took over"),
    );
    // The fence: before the request that last renewed + 0.9 TTL; the
    // takeover: after the lease expired in etcd (a whole TTL).
    assert!(
        a_stopped * 10 <= 1800,
        "a acted {a_stopped}0 ms into the cut"
    );
    assert!(b_started > a_stopped);
    assert!(b_started * 10 <= 3 * TTL.as_millis() as u64);
}

#[test]
fn a_cross_host_claim_moves_the_key_only_after_the_holders_writer_closed_its_permit() {
    let (_clock, etcd, mut a, mut b) = two_hosts(WhenUnreachable::FallBack);
    assert!(a.acts());
    // The holder sees the claim and asks its writer to stop acting; it
    // does not move the key before the confirmation.
    let key = leader_key();
    let news = claim_seen(&etcd, &mut a, &mut b);
    let asked = news.iter().find(|n| n.confirm).expect("asked to confirm");
    assert_eq!(asked.permit.state, PermitState::NotHeld);
    assert_eq!(asked.reason, Some(ChangeReason::StoodDown));
    assert!(holder_of(&etcd.get(&key).unwrap().unwrap()).host_id == "a");
    a.cell
        .set_global(asked.permit.state.code(), asked.permit.until);
    a.task.step(Some(Inbox::Withdrawn(pk())));
    assert!(holder_of(&etcd.get(&key).unwrap().unwrap()).host_id == "b");
    pump_all(&mut [&mut a, &mut b]);
    assert!(!a.acts() && b.acts());
}

#[test]
fn a_live_holder_is_not_displaced_and_its_shutdown_hands_the_agent_on() {
    let (clock, etcd) = rig();
    let mut a = Host::new(&etcd, &clock, "a", WhenUnreachable::FallBack);
    a.lead(true, false);
    assert!(a.acts());
    let mut b = Host::new(&etcd, &clock, "b", WhenUnreachable::FallBack);
    b.lead(true, false);
    assert!(!b.acts(), "a live holder is not displaced");
    a.cell.set_leader(false);
    a.task.give_up_all();
    b.pump();
    assert!(b.acts(), "the revoked lease freed the key at once");
}

/// The thread shell on `calls` and `watches` (no renewer), its news
/// applied to a cell as the writer would, once it holds the free key.
fn shell_holding(calls: Arc<dyn Etcd>, watches: Arc<dyn Etcd>) -> (Contender, Arc<KeyCell>) {
    shell_holding_on(Clients {
        calls,
        watches,
        renewals: None,
    })
}

/// [`shell_holding`] on any clients; permits and renewals applied by the
/// writer's rules ([`Permit::over`], [`Permit::renewed`]).
fn shell_holding_on(clients: Clients) -> (Contender, Arc<KeyCell>) {
    use crate::elector::global_level::Permit;
    let cell = Arc::new(KeyCell::new(false, Published::initial(pk())));
    cell.set_global(global_state::NOT_HELD, 0);
    cell.set_leader(true);
    let mut cfg = EtcdConfig::new(vec!["http://memory:0".into()], "a");
    cfg.ttl = TTL;
    let permit = Arc::new(Mutex::new(Permit::NOT_HELD));
    let (apply, set) = (Arc::clone(&cell), Arc::clone(&permit));
    let tell: Tell = Box::new(move |_, n| {
        let mut p = set.lock().unwrap();
        *p = n.permit.over(*p);
        apply.set_global(p.state.code(), p.until);
    });
    let apply = Arc::clone(&cell);
    let renewed: TellRenewed = Arc::new(move |_, r| {
        let mut p = permit.lock().unwrap();
        *p = p.renewed(&r, crate::elector::cache::boot_nanos());
        apply.set_global(p.state.code(), p.until);
    });
    let mut c = Contender::start_on(
        cfg,
        "a-window",
        (TTL, crate::config::DEFAULT_WORK_RETENTION),
        (tell, renewed),
        clients,
        None,
    )
    .unwrap();
    c.host_leader(pk(), true, true, false, 1);
    let end = Instant::now() + Duration::from_secs(5);
    while !cell.is_leader() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(cell.is_leader(), "the shell's task took the free key");
    (c, cell)
}

/// The thread shell: the same contender on its own thread, its news
/// applied as the writer would.
#[test]
fn the_thread_shell_runs_the_task_and_stops() {
    let etcd = MemoryEtcd::default();
    let gw: Arc<dyn Etcd> = Arc::new(etcd.clone());
    let (mut c, _cell) = shell_holding(Arc::clone(&gw), gw);
    c.shutdown();
    assert!(etcd.get(&leader_key()).unwrap().is_none());
}

/// Found by the simulator across hosts (the guard of the teeth's
/// `revoke_claim`, scripts/teeth.sh): a
/// claimant that stops leading its host before its claim is granted; the
/// holder rewrites the key for it, bound to the claim's lease; its sibling
/// continues that lease. When the claim then expired, the claimant revoked
/// its claim's lease, deleting the key under the sibling that still acted
/// on it, and another host took the key: two holders.
#[test]
fn a_granted_claims_lease_is_never_revoked_by_its_poster_once_it_backs_the_key() {
    let (clock, etcd) = rig();
    let policy = WhenUnreachable::FallBack;
    let mut b = Host::new(&etcd, &clock, "b", policy);
    let mut a1 = Host::window(&etcd, &clock, "a", "aw1", policy);
    let mut a0 = Host::window(&etcd, &clock, "a", "aw0", policy);
    let mut c = Host::new(&etcd, &clock, "c", policy);
    b.lead(true, false);
    a1.lead(true, false);
    c.lead(true, false);
    pump_all(&mut [&mut b, &mut a1, &mut c]);
    assert!(b.acts());
    // aw1 claims across hosts, then its sibling aw0 takes host a's lock.
    a1.task.step(Some(Inbox::Claim(pk())));
    a1.pump();
    a1.lead(false, false);
    a0.lead(true, false);
    pump_all(&mut [&mut b, &mut a1, &mut a0, &mut c]);
    let key = leader_key();
    let holder = holder_of(&etcd.get(&key).unwrap().expect("held"));
    assert_eq!(holder.host_id, "a", "the claim moved the key to host a");
    assert!(a0.acts() && !b.acts());
    // Long past aw1's claim: the key stays, and only aw0 acts.
    for _ in 0..40 {
        clock.advance(TTL / 4);
        pump_all(&mut [&mut b, &mut a1, &mut a0, &mut c]);
        let acting = [a0.acts(), a1.acts(), b.acts(), c.acts()];
        assert_eq!(acting.iter().filter(|x| **x).count(), 1, "{acting:?}");
        assert!(a0.acts(), "{acting:?}");
    }
    // The key was never deleted under aw0 (here aw0 took it back at once;
    // in the simulator another host was faster).
    let history = etcd.changes_since("/nip-le/", 1).unwrap().changes;
    let deleted: Vec<u64> = history
        .iter()
        .filter(|c| c.key == key && c.kv.is_none())
        .map(|c| c.revision)
        .collect();
    assert_eq!(deleted, Vec::<u64>::new(), "the key was deleted");
}

/// Found by the simulator across hosts (the guard of the teeth's
/// `revoke_sibling`, scripts/teeth.sh): two
/// windows of one host that both believe they lead it (the NIP's
/// fail-safe) both continue the same lease; the one that steps back gave
/// the agent up by revoking that lease, deleting the key under its
/// sibling, which still acted on it while another host took the key.
#[test]
fn stepping_back_never_revokes_a_lease_a_sibling_now_holds_the_key_with() {
    let (clock, etcd) = rig();
    let policy = WhenUnreachable::FallBack;
    let mut a0 = Host::window(&etcd, &clock, "a", "aw0", policy);
    let mut a1 = Host::window(&etcd, &clock, "a", "aw1", policy);
    a0.lead(true, false);
    assert!(a0.acts());
    // aw1 leads host a too (fail-safe) and continues the lease; aw0's
    // watch has not brought that rewrite yet.
    a1.lead(true, false);
    let key = leader_key();
    let kv = etcd.get(&key).unwrap().expect("held");
    assert_eq!(
        holder_of(&kv).instance_id,
        "aw1",
        "the sibling continued it"
    );
    // aw0 steps back and gives the agent up, before its watch says.
    a0.lead(false, true);
    pump_all(&mut [&mut a0, &mut a1]);
    let history = etcd.changes_since("/nip-le/", 1).unwrap().changes;
    assert!(
        history.iter().all(|c| c.kv.is_some()),
        "the key was deleted under aw1"
    );
    assert!(a1.acts() && !a0.acts());
}

mod calls;
mod fail_safe;
mod hardening;
mod refusals;
mod renewals;
mod silence;
mod watching;
mod work;
