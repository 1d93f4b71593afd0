//! The engine's warnings reach the `log` facade when no tracing subscriber
//! is installed, as in an app that logs through tauri-plugin-log.

use std::sync::Mutex;

use nip_le::{AgentPubkey, Config, Elector, InstanceId, Mode};

/// Keeps every record at warning level and above.
struct Kept(Mutex<Vec<String>>);

impl log::Log for Kept {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{} {}", r.target(), r.args()));
        }
    }
    fn flush(&self) {}
}

static KEPT: Kept = Kept(Mutex::new(Vec::new()));

#[test]
fn an_engine_warning_reaches_the_log_facade() {
    log::set_logger(&KEPT).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let tmp = tempfile::tempdir().unwrap();
    let pk = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
    // A directory where the work ledger should be: the leader warns that
    // it dispatches without it.
    std::fs::create_dir_all(nip_le::ledger::ledger_path(tmp.path(), &pk)).unwrap();
    let mut c = Config::new(tmp.path());
    c.mode = Mode::Extended;
    let e = Elector::start(c, InstanceId::new("a").unwrap()).unwrap();
    assert!(e.join(&pk).unwrap());
    e.shutdown();
    let kept = KEPT.0.lock().unwrap();
    assert!(
        kept.iter()
            .any(|r| r.starts_with("nip_le") && r.contains("work ledger")),
        "{kept:?}"
    );
}
