//! Issue 31: a refusal is never an outage. Three hosts whose every call
//! etcd answers with no (a wrong password, a role without access, its
//! NOSPACE alarm, a refusal we do not know) never act at once: only
//! silence may start the fall-back. The same three hosts cut off from etcd
//! do fall back, one leader each: the count can fail.

use super::*;

/// Three host leaders on one etcd, each behind its own [`Cut`] sharing
/// one refusal; the first holds the key before anything fails.
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
            let gw = Arc::new(Cut {
                refuse: Arc::clone(&error),
                ..Cut::on(&etcd)
            });
            calls.push(Arc::clone(&gw.calls));
            let id = format!("{name}-window");
            // The watch is the pump's, which `cut` silences.
            let cut = Arc::new(AtomicBool::new(false));
            hosts.push(Host::on(&etcd, &clock, name, &id, policy, gw, cut));
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
                assert!(!h.task.entries[&pk()].falling_back(), "{e}: fell back");
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
