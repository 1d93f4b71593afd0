//! The runner seam in one process: two electors share a lock directory and
//! each runs the agent through a runner that takes an instance lease as
//! upstream's harness does (here an in-process lease: one agent at a time
//! per key, a stop that takes a while to free it). A claim, a release and
//! a leave give the lock up only once the agent has stopped, so the
//! successor's start finds the lease free; a busy lease is retried soon.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nip_le::agent::{
    AgentEvent, AgentExit, AgentRunner, AgentStart, AgentSupervisor, AgentTimings, StartError,
    StopOutcome,
};
use nip_le::{ClaimOutcome, Config, Elector, InstanceId};

mod common;

use common::*;

/// Refresh 200 ms, stale 1.5 s, stand-down 2 s: a step-down waits up to
/// 1 s for the agent.
fn timed(dir: &std::path::Path) -> Config {
    let mut c = extended(dir);
    c.refresh = Duration::from_millis(200);
    c.stale = Duration::from_millis(1_500);
    c.stand_down = Duration::from_secs(2);
    c.lock_wait = Duration::from_millis(20);
    c
}

/// One key's instance lease, shared by every runner of the test: the pid
/// of the agent that holds it.
#[derive(Clone, Default)]
struct Lease(Arc<Mutex<Option<u32>>>);

/// What a runner did, in order, with when.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(Instant, String)>>>);

impl Log {
    fn push(&self, what: String) {
        self.0.lock().unwrap().push((Instant::now(), what));
    }
    fn has(&self, what: &str) -> bool {
        self.0.lock().unwrap().iter().any(|(_, w)| w == what)
    }
    fn at(&self, what: &str) -> Option<Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(_, w)| w == what)
            .map(|(t, _)| *t)
    }
    fn count(&self, what: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, w)| w == what)
            .count()
    }
}

/// A runner whose agent holds `lease` while it runs and frees it only
/// `stop_takes` after the stop begins, like a harness shutting down.
struct LeaseRunner {
    name: &'static str,
    lease: Lease,
    log: Log,
    stop_takes: Duration,
    next_pid: Arc<AtomicU32>,
}

impl AgentRunner for LeaseRunner {
    fn start(&mut self, start: &AgentStart) -> Result<u32, StartError> {
        let mut lease = self.lease.0.lock().unwrap();
        if let Some(holder) = *lease {
            self.log.push(format!("{} busy", self.name));
            return Err(StartError::Busy(format!("held by {holder}")));
        }
        let pid = self.next_pid.fetch_add(1, Ordering::SeqCst);
        start.started(pid);
        *lease = Some(pid);
        self.log.push(format!("{} started", self.name));
        Ok(pid)
    }

    fn stop(&mut self, pid: u32) -> StopOutcome {
        self.log.push(format!("{} stopping", self.name));
        std::thread::sleep(self.stop_takes);
        let mut lease = self.lease.0.lock().unwrap();
        if *lease == Some(pid) {
            *lease = None;
        }
        self.log.push(format!("{} stopped", self.name));
        StopOutcome::default()
    }

    fn exited(&mut self, _pid: u32) -> AgentExit {
        AgentExit::default()
    }
}

struct Side {
    elector: Elector,
    sup: AgentSupervisor,
}

fn side(
    dir: &std::path::Path,
    name: &'static str,
    lease: &Lease,
    log: &Log,
    pids: &Arc<AtomicU32>,
) -> Side {
    let elector = Elector::start(timed(dir), InstanceId::new(name).unwrap()).unwrap();
    elector.join(&pk('1')).unwrap();
    let sup = supervise(&elector, '1', name, lease, log, pids, 300);
    Side { elector, sup }
}

/// `elector` runs key `k`'s agent through a [`LeaseRunner`] named `name`
/// whose stop takes `stop_ms`.
fn supervise(
    elector: &Elector,
    k: char,
    name: &'static str,
    lease: &Lease,
    log: &Log,
    pids: &Arc<AtomicU32>,
    stop_ms: u64,
) -> AgentSupervisor {
    let runner = LeaseRunner {
        name,
        lease: lease.clone(),
        log: log.clone(),
        stop_takes: Duration::from_millis(stop_ms),
        next_pid: Arc::clone(pids),
    };
    let timings = AgentTimings {
        busy_min: Duration::from_millis(5),
        busy_max: Duration::from_millis(20),
        ..AgentTimings::default()
    };
    AgentSupervisor::start(elector, &pk(k), runner, timings).unwrap()
}

fn pair_of_runners() -> (tempfile::TempDir, Side, Side, Lease, Log) {
    let tmp = tempfile::tempdir().unwrap();
    let (lease, log, pids) = (
        Lease::default(),
        Log::default(),
        Arc::new(AtomicU32::new(1000)),
    );
    let a = side(tmp.path(), "a", &lease, &log, &pids);
    let b = side(tmp.path(), "b", &lease, &log, &pids);
    assert!(a.elector.is_leader(&pk('1')) && !b.elector.is_leader(&pk('1')));
    assert!(
        wait_until(|| log.has("a started")),
        "the leader's agent runs"
    );
    (tmp, a, b, lease, log)
}

fn holder(dir: &std::path::Path) -> Option<String> {
    let path = nip_le::lockfile::lock_path(dir, &pk('1'));
    nip_le::lockfile::read_unguarded(&path)
        .ok()?
        .record()
        .map(|r| r.instance_id.clone())
}

#[test]
fn a_claim_moves_the_lock_only_once_the_holders_agent_has_stopped() {
    let (tmp, a, b, _lease, log) = pair_of_runners();
    let claimed = Instant::now();
    assert!(matches!(
        b.elector.claim(&pk('1')).unwrap(),
        ClaimOutcome::Pending | ClaimOutcome::Claimed
    ));
    a.elector.refresh_now();
    // a stops acting at once, and its agent is stopped...
    assert!(wait_until(|| !a.elector.is_leader(&pk('1'))));
    assert!(wait_until(|| log.has("a stopping")));
    // ... while the lock stays a's until that stop is over.
    assert_eq!(holder(tmp.path()).as_deref(), Some("a"));
    assert!(!b.elector.is_leader(&pk('1')), "b led beside a's agent");
    assert!(wait_until(|| b.elector.is_leader(&pk('1'))), "b never led");
    assert!(wait_until(|| log.has("b started")));
    let stopped = log.at("a stopped").unwrap();
    assert!(log.at("b started").unwrap() >= stopped);
    assert_eq!(log.count("b busy"), 0, "b's start found the lease taken");
    // Within the stop and a moment: no waiting for a tick or a backoff.
    let gap = log.at("b started").unwrap() - stopped;
    assert!(gap < Duration::from_millis(150), "b started {gap:?} after");
    assert!(claimed.elapsed() < Duration::from_secs(2));
    assert_eq!(holder(tmp.path()).as_deref(), Some("b"));
    let reports = drain_reports(&mut a.sup.subscribe());
    assert!(
        reports.is_empty()
            || reports
                .iter()
                .all(|e| !matches!(e, AgentEvent::StartFailed { .. }))
    );
    drop((a, b));
}

#[test]
fn release_and_leave_wait_for_the_agent_and_answer_once_the_lock_moved() {
    let (tmp, a, b, _lease, log) = pair_of_runners();
    // release: answered once the agent has stopped and the lock is b's.
    let t = Instant::now();
    assert!(
        a.elector.release(&pk('1')).unwrap(),
        "a record of ours was released"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "answered before the stop"
    );
    assert!(log.has("a stopped"));
    assert_eq!(
        holder(tmp.path()).as_deref(),
        Some("b"),
        "handed to the live sibling"
    );
    assert!(wait_until(|| log.has("b started")));
    assert_eq!(log.count("b busy"), 0);
    // leave: the same, and the key is left.
    let t = Instant::now();
    b.elector.leave(&pk('1')).unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "answered before the stop"
    );
    assert!(log.has("b stopped"));
    assert!(b.elector.joined().is_empty());
    drop((a, b));
}

#[test]
fn a_busy_lease_is_retried_soon_until_it_is_free() {
    let tmp = tempfile::tempdir().unwrap();
    let (lease, log, pids) = (
        Lease::default(),
        Log::default(),
        Arc::new(AtomicU32::new(1)),
    );
    // Another process's agent holds the lease (a harness started by hand).
    *lease.0.lock().unwrap() = Some(42);
    let a = side(tmp.path(), "a", &lease, &log, &pids);
    assert!(wait_until(|| log.count("a busy") >= 3), "retried");
    assert!(!log.has("a started"));
    let freed = Instant::now();
    *lease.0.lock().unwrap() = None;
    assert!(wait_until(|| log.has("a started")));
    let gap = log.at("a started").unwrap() - freed;
    assert!(
        gap <= Duration::from_millis(60),
        "started {gap:?} after the lease was free"
    );
    let reports = drain_reports(&mut a.sup.subscribe());
    assert!(reports
        .iter()
        .any(|e| matches!(e, AgentEvent::StartFailed { busy: true, .. })));
    drop(a);
}

#[test]
fn at_shutdown_each_lock_moves_as_soon_as_its_own_agent_has_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let pids = Arc::new(AtomicU32::new(1));
    let (lease1, lease2, log) = (Lease::default(), Lease::default(), Log::default());
    let a = Elector::start(timed(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    let b = Elector::start(timed(tmp.path()), InstanceId::new("b").unwrap()).unwrap();
    for e in [&a, &b] {
        e.join_all(&[pk('1'), pk('2')]).unwrap();
    }
    // a's agent of key 1 stops in 50 ms, of key 2 in 700 ms.
    let sa = [
        supervise(&a, '1', "a1", &lease1, &log, &pids, 50),
        supervise(&a, '2', "a2", &lease2, &log, &pids, 700),
    ];
    let sb = [
        supervise(&b, '1', "b1", &lease1, &log, &pids, 50),
        supervise(&b, '2', "b2", &lease2, &log, &pids, 50),
    ];
    assert!(wait_until(|| log.has("a1 started") && log.has("a2 started")));
    let t = Instant::now();
    a.shutdown();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(650),
        "shut down before key 2's agent stopped: {took:?}"
    );
    assert!(wait_until(|| log.has("b1 started") && log.has("b2 started")));
    let (b1, b2) = (log.at("b1 started").unwrap(), log.at("b2 started").unwrap());
    assert!(
        b1 < log.at("a2 stopped").unwrap(),
        "key 1 waited for key 2's agent"
    );
    assert!(
        b1 - t < Duration::from_millis(400),
        "key 1 moved {:?} after",
        b1 - t
    );
    assert!(b2 >= log.at("a2 stopped").unwrap());
    assert_eq!(log.count("b1 busy") + log.count("b2 busy"), 0);
    drop((sa, sb, a, b));
}

fn drain_reports(
    rx: &mut tokio::sync::broadcast::Receiver<nip_le::agent::AgentReport>,
) -> Vec<AgentEvent> {
    let mut out = Vec::new();
    while let Ok(r) = rx.try_recv() {
        out.push(r.event);
    }
    out
}

/// The command runner's agent is named in the agent mark before its program
/// runs: the program reads the mark first thing and finds its own pid.
#[cfg(target_os = "linux")]
#[test]
fn the_command_runners_agent_is_named_before_its_program_runs() {
    use nip_le::agent::AgentCommand;
    let tmp = tempfile::tempdir().unwrap();
    let e = Elector::start(timed(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    e.join(&pk('1')).unwrap();
    let mark = nip_le::agent::orphan::mark_path(tmp.path(), &pk('1'));
    let seen = tmp.path().join("seen");
    let script = format!(
        "cat {} > {}.new; echo \" $$\" >> {}.new; mv {}.new {}; exec sleep 30",
        mark.display(),
        seen.display(),
        seen.display(),
        seen.display(),
        seen.display()
    );
    let sup =
        AgentSupervisor::command(&e, &pk('1'), AgentCommand::new("sh", ["-c", &script])).unwrap();
    let mut reports = sup.subscribe();
    assert!(wait_until(|| seen.exists()), "the agent never ran");
    let text = std::fs::read_to_string(&seen).unwrap();
    let (json, own) = text.rsplit_once(' ').unwrap();
    let own: u32 = own.trim().parse().unwrap();
    let named: nip_le::agent::orphan::AgentMark =
        serde_json::from_str(json.trim()).expect("the mark was there before the program ran");
    assert_eq!(named.pid, own, "the mark named another process");
    assert_eq!(named.instance_id, "a");
    let started = drain_reports(&mut reports)
        .into_iter()
        .find_map(|r| match r {
            AgentEvent::Started { pid } => Some(pid),
            _ => None,
        });
    assert_eq!(started, Some(own));
    drop(sup);
}
