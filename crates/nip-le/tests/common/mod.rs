//! Helpers the engine's in-process tests share: configurations, pairs of
//! electors in one lock directory, waiting with a deadline.
#![allow(dead_code)]

use std::time::Duration;

use nip_le::{AgentPubkey, Backend, ChangeReason, Config, Elector, InstanceId, Mode};

/// Plain NIP behaviour (extended mode: [`extended`]).
pub fn config(dir: &std::path::Path) -> Config {
    let mut c = Config::new(dir);
    c.mode = Mode::Spec;
    // Long refresh: the tests tick by hand.
    c.refresh = Duration::from_secs(60);
    c.stale = Duration::from_secs(120);
    c.stand_down = Duration::from_secs(60);
    c
}

pub fn pk(c: char) -> AgentPubkey {
    AgentPubkey::parse(&c.to_string().repeat(64)).unwrap()
}

pub fn pair() -> (tempfile::TempDir, Elector, Elector) {
    pair_with(config)
}

pub type Cfg = fn(&std::path::Path) -> Config;

pub fn pair_with(cfg: Cfg) -> (tempfile::TempDir, Elector, Elector) {
    pair_of(cfg, cfg)
}

/// `a` with `cfg_a`, `b` with `cfg_b`, in one lock directory.
pub fn pair_of(cfg_a: Cfg, cfg_b: Cfg) -> (tempfile::TempDir, Elector, Elector) {
    let tmp = tempfile::tempdir().unwrap();
    let a = Elector::start(cfg_a(tmp.path()), InstanceId::new("a").unwrap()).unwrap();
    let b = Elector::start(cfg_b(tmp.path()), InstanceId::new("b").unwrap()).unwrap();
    (tmp, a, b)
}

/// Extended mode with long timings (the tests drive refreshes by hand or
/// rely on the directory watch).
pub fn extended(dir: &std::path::Path) -> Config {
    let mut c = config(dir);
    c.mode = Mode::Extended;
    c
}

/// [`extended`] on the portable backend: what macOS and Windows run.
pub fn portable(dir: &std::path::Path) -> Config {
    let mut c = extended(dir);
    c.backend = Backend::Portable;
    c
}

/// Extended mode with short timings, for tests that wait on real time:
/// refresh 50 ms, stale 300 ms, lock wait 10 ms.
pub fn fast_extended(dir: &std::path::Path) -> Config {
    let mut c = extended(dir);
    c.refresh = Duration::from_millis(50);
    c.stale = Duration::from_millis(300);
    c.lock_wait = Duration::from_millis(10);
    c
}

pub fn wait_until(mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

pub fn drain(
    rx: &mut tokio::sync::broadcast::Receiver<nip_le::LeadershipChange>,
) -> Vec<(bool, ChangeReason)> {
    let mut v = Vec::new();
    while let Ok(c) = rx.try_recv() {
        v.push((c.is_leader, c.reason));
    }
    v
}
