//! The runner seam across hosts, on a real etcd: two hosts (separate lock
//! directories and host ids) run the agent through an in-process runner
//! whose stop takes a while. A claim from the other host hands the agent
//! over only once the holder's agent has stopped, so the two hosts' agents
//! never run at once. Skipped (with a message) without an etcd binary
//! unless `NIP_LE_REQUIRE_ETCD` is set.
#![cfg(unix)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nip_le::agent::{
    AgentExit, AgentRunner, AgentStart, AgentSupervisor, AgentTimings, StartError, StopOutcome,
};
use nip_le::global::EtcdConfig;
use nip_le::{Config, Elector, InstanceId, Mode};
use nip_le_cli::drive::cluster::{random_pubkey, wait_until};
use nip_le_lab::etcd::Etcd;

/// Which agents run now (host names), every overlap seen, and what
/// happened when.
#[derive(Default)]
struct Seen {
    now: Vec<&'static str>,
    overlaps: Vec<String>,
    log: Vec<(Instant, String)>,
}

#[derive(Clone, Default)]
struct Running(Arc<Mutex<Seen>>);

impl Running {
    fn log(&self, what: String) {
        self.0.lock().unwrap().log.push((Instant::now(), what));
    }
    fn at(&self, what: &str) -> Option<Instant> {
        let g = self.0.lock().unwrap();
        g.log.iter().find(|(_, w)| w == what).map(|(t, _)| *t)
    }
    fn overlaps(&self) -> Vec<String> {
        self.0.lock().unwrap().overlaps.clone()
    }
}

struct Slow {
    host: &'static str,
    running: Running,
}

impl AgentRunner for Slow {
    fn start(&mut self, start: &AgentStart) -> Result<u32, StartError> {
        let mut g = self.running.0.lock().unwrap();
        if !g.now.is_empty() {
            let seen = format!("{} started while {:?} ran", self.host, g.now);
            g.overlaps.push(seen);
        }
        g.now.push(self.host);
        drop(g);
        start.started(std::process::id());
        self.running.log(format!("{} started", self.host));
        Ok(4242)
    }
    fn stop(&mut self, _pid: u32) -> StopOutcome {
        self.running.log(format!("{} stopping", self.host));
        std::thread::sleep(Duration::from_millis(400));
        self.running
            .0
            .lock()
            .unwrap()
            .now
            .retain(|h| *h != self.host);
        self.running.log(format!("{} stopped", self.host));
        StopOutcome::default()
    }
    fn exited(&mut self, _pid: u32) -> AgentExit {
        AgentExit::default()
    }
}

fn config(dir: &std::path::Path, etcd: &Etcd, host: &str) -> Config {
    let mut c = Config::new(dir);
    c.mode = Mode::Extended;
    c.refresh = Duration::from_millis(200);
    c.stale = Duration::from_millis(1_500);
    c.stand_down = Duration::from_secs(2);
    c.lock_wait = Duration::from_millis(50);
    let mut e = EtcdConfig::new(vec![etcd.url()], host);
    e.ttl = Duration::from_secs(2);
    c.etcd = Some(e);
    c
}

#[test]
fn a_claim_from_another_host_moves_the_agent_once_the_holders_has_stopped() {
    let Some(etcd) = support::etcd_or_skip() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let pk = random_pubkey();
    let running = Running::default();
    let side = |host: &'static str| {
        let dir = tmp.path().join(host);
        let e = Elector::start(
            config(&dir, &etcd, host),
            InstanceId::new(format!("{host}-w")).unwrap(),
        )
        .unwrap();
        e.join(&pk).unwrap();
        let runner = Slow {
            host,
            running: running.clone(),
        };
        let sup = AgentSupervisor::start(&e, &pk, runner, AgentTimings::default()).unwrap();
        (e, sup)
    };
    let (a, _sa) = side("h1");
    assert!(
        wait_until(Duration::from_secs(10), || a.is_leader(&pk)),
        "h1 never acted"
    );
    let (b, _sb) = side("h2");
    assert!(wait_until(Duration::from_secs(5), || running
        .at("h1 started")
        .is_some()));
    assert!(!b.is_leader(&pk));
    b.claim(&pk).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || b.is_leader(&pk)),
        "the claim never completed"
    );
    assert!(wait_until(Duration::from_secs(5), || running
        .at("h2 started")
        .is_some()));
    let (stopped, started) = (running.at("h1 stopped"), running.at("h2 started"));
    assert!(
        stopped.is_some_and(|s| started.unwrap() >= s),
        "h2's agent started before h1's had stopped"
    );
    assert!(running.overlaps().is_empty(), "{:?}", running.overlaps());
    let gap = started.unwrap() - stopped.unwrap();
    assert!(gap < Duration::from_secs(1), "h2 started {gap:?} after");
}
