//! The audit of issue 21 on the watch: where a stream resumes, how a
//! store behind it is met, and how failed or refused streams back off.

use crate::global::etcd::WatchMessage;

use super::*;

fn change(rev: u64) -> crate::global::etcd::Change {
    crate::global::etcd::Change {
        key: leader_key(),
        revision: rev,
        kv: None,
    }
}

/// Item 7: etcd answers a resumed watch with its `created` message, whose
/// header carries the store's current revision, before the events of the
/// catch-up; and it sends a catch-up in batches, each with that header.
/// The cursor once resumed from the header's revision: a stream that broke
/// in between skipped every event up to it.
#[test]
fn a_resumed_watch_resumes_after_the_last_event_it_delivered_not_at_the_header() {
    let mut cur = Cursor::default();
    let first = cur.message(WatchMessage {
        revision: 4,
        created: true,
        ..Default::default()
    });
    assert!(matches!(first[..], [Inbox::Synced]));
    assert_eq!(cur.start(), 5);
    // Reopened from 5 while etcd is at 10: the created message first.
    let created = cur.message(WatchMessage {
        revision: 10,
        created: true,
        ..Default::default()
    });
    assert!(created.is_empty(), "a resumed watch is no resync");
    assert_eq!(cur.start(), 5, "no event from 5 on was delivered yet");
    // The first batch of the catch-up.
    let batch = cur.message(WatchMessage {
        revision: 10,
        changes: vec![change(5), change(6)],
        ..Default::default()
    });
    assert_eq!(batch.len(), 2);
    assert_eq!(cur.start(), 7, "events 7 to 10 are still to come");
    // A progress notification: everything up to its header was sent.
    cur.message(WatchMessage {
        revision: 12,
        ..Default::default()
    });
    assert_eq!(cur.start(), 13);
}

/// Item 6: a watch reopened after etcd lost its data (a member restored
/// empty, or from an old snapshot) at a revision the store has not reached
/// again waits for it in silence. The cursor sees the store behind it,
/// follows it from where it is and has the task look again (a lagging
/// member looks the same to it; the task's linearizable calls tell).
#[test]
fn a_watch_reopened_on_a_store_behind_it_starts_over() {
    let mut cur = Cursor::default();
    cur.message(WatchMessage {
        revision: 40,
        created: true,
        ..Default::default()
    });
    assert_eq!(cur.start(), 41);
    let again = cur.message(WatchMessage {
        revision: 3,
        created: true,
        ..Default::default()
    });
    assert!(
        matches!(again[..], [Inbox::Synced]),
        "the store went back: {again:?}"
    );
    assert_eq!(cur.start(), 4);
}

/// Item 8: a watch stream that etcd (or a proxy) closes at once was
/// reopened at once, in a hot loop. Failed streams now back off from
/// 50 ms to 2 s; one that delivered anything reopens at once.
#[test]
fn a_watch_stream_closed_at_once_is_reopened_with_a_growing_backoff() {
    use super::super::watch::{follow_with, Backoff};
    struct Closed;
    impl Watch for Closed {
        fn next_message(&mut self) -> EtcdResult<WatchMessage> {
            Err(EtcdError::unreachable("closed by etcd"))
        }
    }
    let gw = WatchOnly::new(|| Box::new(Closed));
    let stop = AtomicBool::new(false);
    let mut waits = Vec::new();
    follow_with(
        &gw,
        "/nip-le/ab/",
        &stop,
        |_| true,
        |stop, d| {
            waits.push(d);
            if waits.len() == 8 {
                stop.store(true, Ordering::SeqCst);
            }
        },
    );
    let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
    assert_eq!(ms, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
    assert_eq!(
        gw.opened.load(Ordering::SeqCst),
        9,
        "the first at once, then one per wait"
    );
    let mut b = Backoff::default();
    b.failed();
    b.failed();
    b.delivered();
    assert_eq!(b.failed(), Duration::from_millis(50), "reset by a delivery");
}

/// Review of item 8: a watch etcd refuses (`created` and `canceled` at
/// once: permission denied, a token it forgot) counted as a delivery, so
/// the backoff was reset and the watch reopened at once, for ever.
#[test]
fn a_watch_etcd_refuses_backs_off_like_a_failed_one() {
    use super::super::watch::follow_with;
    struct Refused;
    impl Watch for Refused {
        fn next_message(&mut self) -> EtcdResult<WatchMessage> {
            Ok(WatchMessage {
                created: true,
                ended: true,
                ..Default::default()
            })
        }
    }
    let stop = AtomicBool::new(false);
    let mut waits = Vec::new();
    follow_with(
        &WatchOnly::new(|| Box::new(Refused)),
        "/nip-le/ab/",
        &stop,
        |_| true,
        |stop, d| {
            waits.push(d.as_millis());
            if waits.len() == 4 {
                stop.store(true, Ordering::SeqCst);
            }
        },
    );
    assert_eq!(waits, [50, 100, 200, 400]);
}

/// An etcd that only opens watches, each a stream `open` makes, and
/// counts them (the watch loop calls nothing else).
struct WatchOnly {
    open: fn() -> Box<dyn Watch>,
    opened: std::sync::atomic::AtomicUsize,
}

impl WatchOnly {
    fn new(open: fn() -> Box<dyn Watch>) -> Self {
        Self {
            open,
            opened: Default::default(),
        }
    }
}

impl Etcd for WatchOnly {
    fn get_at(&self, _: &str) -> EtcdResult<(Option<Kv>, u64)> {
        unreachable!()
    }
    fn create(&self, _: &str, _: &[u8], _: i64) -> EtcdResult<Txn> {
        unreachable!()
    }
    fn swap(&self, _: &str, _: u64, _: &[u8], _: i64, _: Option<(&str, u64)>) -> EtcdResult<Txn> {
        unreachable!()
    }
    fn put(&self, _: &str, _: &[u8], _: i64) -> EtcdResult<()> {
        unreachable!()
    }
    fn create_if(&self, _: &str, _: u64, _: &str, _: &[u8], _: i64) -> EtcdResult<Txn> {
        unreachable!()
    }
    fn delete_if(&self, _: &str, _: u64) -> EtcdResult<bool> {
        unreachable!()
    }
    fn range(&self, _: &str, _: usize) -> EtcdResult<Vec<Kv>> {
        unreachable!()
    }
    fn grant(&self, _: Duration) -> EtcdResult<(i64, Duration)> {
        unreachable!()
    }
    fn keep_alive(&self, _: i64) -> EtcdResult<Duration> {
        unreachable!()
    }
    fn revoke(&self, _: i64) -> EtcdResult<()> {
        unreachable!()
    }
    fn watch(&self, _: &str, _: bool, _: u64, _: Duration) -> EtcdResult<Box<dyn Watch>> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        Ok((self.open)())
    }
}

/// Issue 31: every window's watch covered the whole prefix, so every work
/// record of every agent reached every window, through an unbounded
/// channel. A watch follows one agent's keys now, opened when the writer
/// first tells of the agent, and its inputs wait for room past a bound.
#[test]
fn a_watch_follows_only_the_agents_told_of_and_its_backlog_is_bounded() {
    let etcd = MemoryEtcd::default();
    let watches = Arc::new(Cut::on(&etcd));
    let (mut c, _cell) = shell_holding(Arc::new(etcd.clone()), watches.clone());
    c.host_leader(pk(), true, true, false, 1);
    let end = Instant::now() + Duration::from_secs(5);
    while watches.watches.lock().unwrap().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    c.shutdown();
    let seen = watches.watches.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no watch opened");
    let ours = format!("/nip-le/{}/ true", pk());
    assert!(seen.iter().all(|s| *s == ours), "{seen:?}");
    // The bound: a full backlog holds the watch until there is room, or
    // until the contender stops.
    let backlog = Arc::new(AtomicUsize::new(super::super::MAX_WATCH_BACKLOG));
    let stop = Arc::new(AtomicBool::new(false));
    let (b, s) = (Arc::clone(&backlog), Arc::clone(&stop));
    let waiting = std::thread::spawn(move || super::super::room(&b, &s));
    std::thread::sleep(Duration::from_millis(20));
    assert!(!waiting.is_finished(), "sent past the bound");
    backlog.fetch_sub(1, Ordering::SeqCst);
    assert!(waiting.join().unwrap());
    assert_eq!(
        backlog.load(Ordering::SeqCst),
        super::super::MAX_WATCH_BACKLOG
    );
    let (b, s) = (Arc::clone(&backlog), Arc::clone(&stop));
    let waiting = std::thread::spawn(move || super::super::room(&b, &s));
    stop.store(true, Ordering::SeqCst);
    assert!(
        !waiting.join().unwrap(),
        "a stopping contender's watch gives up"
    );
}
