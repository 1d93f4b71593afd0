//! The contender against an in-memory etcd: the etcd client behind its
//! trait, no server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::elector::cache::Published;
use crate::elector::upper::UpperLevel;
use crate::elector::Level;
use crate::global::memory::MemoryEtcd;

fn pk() -> AgentPubkey {
    AgentPubkey::parse(&"ab".repeat(32)).unwrap()
}

/// A host leader (the writer's part: the flag, never fenced) with its
/// contender on `etcd`.
fn host(etcd: &MemoryEtcd, host: &str) -> (Contender, Arc<KeyCell>) {
    let mut cfg = EtcdConfig::new(vec!["http://memory:0".into()], host);
    cfg.ttl = Duration::from_secs(2);
    let etcd: Arc<dyn Etcd> = Arc::new(etcd.clone());
    let c = Contender::start_on(
        cfg,
        &format!("{host}-window"),
        Duration::from_secs(2),
        Box::new(|_, _| {}),
        Arc::clone(&etcd),
        etcd,
    )
    .unwrap();
    let cell = Arc::new(KeyCell::new(false, Published::initial(pk())));
    cell.set_global(global_state::NOT_HELD, 0);
    cell.set_leader(true);
    (c, cell)
}

fn wait_until(within: Duration, f: impl Fn() -> bool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

#[test]
fn of_two_host_leaders_one_acts_and_the_other_takes_over_when_it_steps_back() {
    let etcd = MemoryEtcd::default();
    let (mut a, ca) = host(&etcd, "a");
    let (mut b, cb) = host(&etcd, "b");
    a.host_leader(pk(), &ca, true, false);
    b.host_leader(pk(), &cb, true, false);
    assert!(
        wait_until(Duration::from_secs(2), || ca.is_leader() || cb.is_leader()),
        "nobody acts"
    );
    // Exactly one, and it stays so (both contenders have looked by now).
    let end = Instant::now() + Duration::from_millis(300);
    while Instant::now() < end {
        assert!(ca.is_leader() != cb.is_leader(), "two hosts act, or none");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (mut holder, hc, mut other, oc) = if ca.is_leader() {
        (a, ca, b, cb)
    } else {
        (b, cb, a, ca)
    };
    assert_eq!(hc.level(), Level::Global);
    assert_eq!(oc.level(), Level::Host, "the other leads only its host");
    // A graceful step back revokes the lease: the other host's watch sees
    // the key go and takes it, well within the TTL.
    let start = Instant::now();
    hc.set_leader(false);
    holder.host_leader(pk(), &hc, false, true);
    assert!(wait_until(Duration::from_secs(2), || oc.is_leader()));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(!hc.is_leader());
    holder.shutdown();
    other.shutdown();
}

#[test]
fn a_live_holder_is_not_displaced_and_its_shutdown_hands_the_agent_on() {
    let etcd = MemoryEtcd::default();
    let (mut a, ca) = host(&etcd, "a");
    a.host_leader(pk(), &ca, true, false);
    assert!(wait_until(Duration::from_secs(2), || ca.is_leader()));
    let lease = etcd
        .get(&format!("/nip-le/{}/leader", pk()))
        .unwrap()
        .expect("the key is held")
        .lease;
    assert!(lease != 0);
    let (mut b, cb) = host(&etcd, "b");
    b.host_leader(pk(), &cb, true, false);
    assert!(!cb.is_leader(), "a live holder is not displaced");
    a.shutdown();
    assert!(!ca.is_leader(), "gave up on shutdown");
    assert!(wait_until(Duration::from_secs(3), || cb.is_leader()));
    b.shutdown();
}
