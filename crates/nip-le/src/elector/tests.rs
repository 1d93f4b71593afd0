//! The facade's unit tests: where the writer does its I/O, fencing as
//! readers see it, panics in one key.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::machine::Write;
use super::store::{FileStore, LockStore, Updated};
use super::*;
use crate::record::LockContent;

/// A file store that notes the thread of every read and update.
struct Recording {
    inner: FileStore,
    threads: Arc<Mutex<Vec<String>>>,
}

impl Recording {
    fn note(&self) {
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        self.threads.lock().unwrap().push(name);
    }
}

impl LockStore for Recording {
    fn read(&self) -> Result<LockContent> {
        self.note();
        self.inner.read()
    }
    fn update(
        &mut self,
        decide: &mut dyn FnMut(&LockContent, crate::epoch::Mark) -> Write,
    ) -> Result<Updated> {
        self.note();
        self.inner.update(decide)
    }
}

#[test]
fn lock_file_io_happens_on_the_writer_thread_only() {
    for mode in [crate::Mode::Extended, crate::Mode::Spec] {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = Config::new(tmp.path());
        c.mode = mode;
        c.refresh = Duration::from_millis(50);
        c.stale = Duration::from_millis(500);
        c.lock_wait = Duration::from_millis(20);
        let threads = Arc::new(Mutex::new(Vec::new()));
        let (dir, t) = (tmp.path().to_owned(), Arc::clone(&threads));
        let stores: StoreFactory = Box::new(move |pk| {
            Box::new(Recording {
                inner: FileStore::new(&dir, lockfile::lock_path(&dir, pk), c.lock_wait, None),
                threads: Arc::clone(&t),
            }) as Box<dyn LockStore>
        });
        let e = Elector::start_with(
            c,
            InstanceId::new("me").unwrap(),
            stores,
            global_level::none(),
        )
        .unwrap();
        let k = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
        // Every call the API has, from this (the "main") thread.
        e.join(&k).unwrap();
        e.join_all(&[k]).unwrap();
        let _ = (e.is_leader(&k), e.status(), e.joined(), e.leader_flag(&k));
        e.claim(&k).unwrap();
        e.release(&k).unwrap();
        e.resume(&k).unwrap();
        e.stand_down(&k).unwrap();
        e.handle_control_frame(&k, r#"{"type":"claim_leadership","targetInstanceId":"me"}"#)
            .unwrap();
        e.refresh_now();
        std::thread::sleep(Duration::from_millis(120)); // a few ticks
        e.leave(&k).unwrap();
        e.shutdown();
        let seen = threads.lock().unwrap().clone();
        assert!(
            seen.len() >= 8,
            "[{mode:?}] the store was used: {}",
            seen.len()
        );
        assert!(
            seen.iter().all(|n| n == "nip-le-writer"),
            "[{mode:?}] lock file I/O off the writer thread: {seen:?}"
        );
    }
}

/// A file store whose updates fail while `failing` is set, as on a
/// disk that returns EIO: no write of ours can succeed.
struct Failing {
    inner: FileStore,
    failing: Arc<std::sync::atomic::AtomicBool>,
}

impl LockStore for Failing {
    fn read(&self) -> Result<LockContent> {
        self.inner.read()
    }
    fn update(
        &mut self,
        decide: &mut dyn FnMut(&LockContent, crate::epoch::Mark) -> Write,
    ) -> Result<Updated> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::io("lock", std::io::Error::other("injected EIO")));
        }
        self.inner.update(decide)
    }
}

/// File stores for `c` that fail while the flag returned is set.
fn failing_stores(c: &Config) -> (StoreFactory, Arc<std::sync::atomic::AtomicBool>) {
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (dir, f, wait) = (c.lock_dir.clone(), Arc::clone(&failing), c.lock_wait);
    let stores: StoreFactory = Box::new(move |pk| {
        Box::new(Failing {
            inner: FileStore::new(&dir, lockfile::lock_path(&dir, pk), wait, None),
            failing: Arc::clone(&f),
        }) as Box<dyn LockStore>
    });
    (stores, failing)
}

/// Whether `f` holds within `within`.
fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + within;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// The next change within `within`, if any.
fn next_change(
    rx: &mut broadcast::Receiver<LeadershipChange>,
    within: Duration,
) -> Option<LeadershipChange> {
    let end = std::time::Instant::now() + within;
    while std::time::Instant::now() < end {
        if let Ok(c) = rx.try_recv() {
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[test]
fn fencing_and_unfencing_are_announced_and_agree_with_status() {
    let tmp = tempfile::tempdir().unwrap();
    // The validity (2.45 s after the last write) runs out half a
    // refresh before the next tick: only a wake-up at the deadline
    // itself announces the fencing in time.
    let mut c = Config::new(tmp.path());
    c.refresh = Duration::from_millis(1_000);
    c.stale = Duration::from_millis(2_500);
    c.lock_wait = Duration::from_millis(10);
    let (stores, failing) = failing_stores(&c);
    let e = Elector::start_with(
        c,
        InstanceId::new("me").unwrap(),
        stores,
        global_level::none(),
    )
    .unwrap();
    let k = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
    let mut rx = e.subscribe();
    assert!(e.join(&k).unwrap());
    let first = next_change(&mut rx, Duration::from_secs(1)).expect("join change");
    assert!(first.is_leader);
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let flag = e.leader_flag(&k).unwrap();
    assert!(
        wait_for(Duration::from_secs(4), || !flag.is_leader()),
        "never fenced"
    );
    let fenced_at = std::time::Instant::now();
    let fenced = next_change(&mut rx, Duration::from_secs(2)).expect("no fenced change");
    let lag = fenced_at.elapsed();
    assert!(
        lag < Duration::from_millis(300),
        "fencing announced {lag:?} after is_leader turned false (at a tick, not at the deadline)"
    );
    assert_eq!(
        (fenced.is_leader, fenced.reason, fenced.must_cancel_turn),
        (false, ChangeReason::Fenced, true),
        "{fenced:?}"
    );
    assert!(!e.is_leader(&k));
    assert!(!e.status()[0].is_leader, "status and is_leader disagree");
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    let back = next_change(&mut rx, Duration::from_secs(3)).expect("no unfenced change");
    assert_eq!(
        (back.is_leader, back.reason, back.must_cancel_turn),
        (true, ChangeReason::Unfenced, false),
        "{back:?}"
    );
    assert!(e.is_leader(&k) && e.status()[0].is_leader);
    // Nothing else: one change each way.
    assert!(next_change(&mut rx, Duration::from_millis(300)).is_none());
}

/// A store whose every look panics, as a bug would.
struct Panicking;

impl LockStore for Panicking {
    fn read(&self) -> Result<LockContent> {
        panic!("a bug in the store");
    }
    fn update(
        &mut self,
        _decide: &mut dyn FnMut(&LockContent, crate::epoch::Mark) -> Write,
    ) -> Result<Updated> {
        panic!("a bug in the store");
    }
}

#[test]
fn a_panic_in_one_key_costs_that_key_a_look_never_the_election_task() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Config::new(tmp.path());
    c.refresh = Duration::from_millis(50);
    c.stale = Duration::from_millis(300);
    c.lock_wait = Duration::from_millis(10);
    let bad = AgentPubkey::parse(&"bd".repeat(32)).unwrap();
    let good = AgentPubkey::parse(&"60".repeat(32)).unwrap();
    let dir = tmp.path().to_owned();
    let stores: StoreFactory = Box::new(move |pk| {
        if *pk == bad {
            Box::new(Panicking) as Box<dyn LockStore>
        } else {
            Box::new(FileStore::new(
                &dir,
                lockfile::lock_path(&dir, pk),
                c.lock_wait,
                None,
            ))
        }
    });
    let e = Elector::start_with(
        c,
        InstanceId::new("me").unwrap(),
        stores,
        global_level::none(),
    )
    .unwrap();
    e.join(&bad).unwrap();
    assert!(e.join(&good).unwrap(), "the healthy key leads");
    // Several ticks of the panicking key later, everything still answers.
    std::thread::sleep(Duration::from_millis(200));
    e.refresh_now();
    assert!(e.is_leader(&good));
    assert_eq!(e.claim(&good).unwrap(), ClaimOutcome::AlreadyLeader);
    let status = e.status();
    let bad_status = status.iter().find(|s| s.pubkey == bad).unwrap();
    assert!(
        bad_status
            .last_error
            .as_deref()
            .is_some_and(|m| m.contains("a bug in the store")),
        "{bad_status:?}"
    );
    e.leave(&good).unwrap();
    e.shutdown();
}

/// The global level as the writer tells it: every `host_leader`
/// call, (leads, locked).
struct Told(Arc<Mutex<Vec<(bool, bool)>>>);

impl global_level::GlobalLevel for Told {
    fn host_id(&self) -> &str {
        "h"
    }
    fn host_leader(&mut self, _: AgentPubkey, leads: bool, locked: bool, _: bool, _: u64) {
        self.0.lock().unwrap().push((leads, locked));
    }
    fn claim(&mut self, _: AgentPubkey) {}
    fn withdrawn(&mut self, _: AgentPubkey) {}
    fn took(&mut self, _: AgentPubkey, _: &str) {}
    fn settled(&mut self, _: AgentPubkey, _: &str, _: bool) {}
    fn shutdown(&mut self) {}
}

/// Issue 21, item 3: a host leader whose lock file cannot be written (a
/// full or failing disk) fences itself, and must stop leading for the
/// global level too: kept, its etcd lease keeps every other host from the
/// agent while it cannot act. With the host validity check in
/// `Key::tell_global` removed, the global level is never told.
#[test]
fn a_host_leader_that_fenced_itself_no_longer_leads_for_the_global_level() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Config::new(tmp.path());
    c.refresh = Duration::from_millis(50);
    c.stale = Duration::from_millis(500);
    c.lock_wait = Duration::from_millis(10);
    let (stores, failing) = failing_stores(&c);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let told = Arc::clone(&calls);
    let global_level: global_level::GlobalBuilder = Box::new(move |_, _| {
        Ok(Some(
            Box::new(Told(told)) as Box<dyn global_level::GlobalLevel>
        ))
    });
    let e = Elector::start_with(c, InstanceId::new("me").unwrap(), stores, global_level).unwrap();
    let k = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
    e.join(&k).unwrap();
    let last = || calls.lock().unwrap().last().copied();
    assert!(
        wait_for(Duration::from_secs(2), || last() == Some((true, true))),
        "leads its host: {:?}",
        calls.lock().unwrap()
    );
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        wait_for(Duration::from_secs(3), || last() == Some((false, false))),
        "a fenced host leader still leads for the global level: {:?}",
        calls.lock().unwrap()
    );
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(
        wait_for(Duration::from_secs(3), || last() == Some((true, true))),
        "leads again once it can write: {:?}",
        calls.lock().unwrap()
    );
    e.shutdown();
}

/// A `done` whose sync fails reaches its caller as an error (the line is
/// in the file all the same), and the status says the ledger is degraded
/// until a later line is synced.
#[cfg(target_os = "linux")]
#[test]
fn a_done_whose_sync_fails_is_an_error_and_the_status_says_the_ledger_is_degraded() {
    use crate::ledger::tests::sync_fault::fail_syncs_under;
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Config::new(tmp.path());
    c.mode = crate::Mode::Extended;
    let e = Elector::start(c, InstanceId::new("me").unwrap()).unwrap();
    let k = AgentPubkey::parse(&"cd".repeat(32)).unwrap();
    assert!(e.join(&k).unwrap());
    let w = e.work(&k).unwrap();
    assert!(w.take("m1").unwrap().granted());
    let degraded = || e.status().into_iter().find_map(|s| s.work_degraded);
    let failing = fail_syncs_under(&tmp.path().join(crate::ledger::WORK_DIR));
    let err = w.done("m1").unwrap_err();
    assert!(matches!(err, Error::NotDurable { .. }), "{err}");
    assert!(
        wait_for(Duration::from_secs(5), || degraded().is_some()),
        "the status never said the ledger is degraded"
    );
    let err = w.give_back("m1").map(|()| "given back");
    assert!(
        err.is_ok(),
        "a give-back after the done is refused, not failed"
    );
    drop(failing);
    assert!(w.take("m2").unwrap().granted());
    assert!(w.done("m2").unwrap());
    assert!(
        wait_for(Duration::from_secs(5), || degraded().is_none()),
        "a synced line did not end it: {:?}",
        degraded()
    );
    let file = std::fs::read_to_string(crate::ledger::ledger_path(tmp.path(), &k)).unwrap();
    assert!(file.contains(r#""op":"done","id":"m1""#), "{file}");
}
