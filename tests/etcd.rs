//! The plugin's `etcd` feature on Tauri's mock runtime: two apps on two
//! simulated hosts (separate lock dirs and host ids) configured through
//! `Builder::etcd_config`, sharing a real etcd on loopback. Run by
//! `scripts/test.sh` with `--features etcd`; without an etcd binary it says
//! so and passes, unless `NIP_LE_REQUIRE_ETCD` is set.
#![cfg(feature = "etcd")]

use std::time::{Duration, Instant};

use nip_le_lab::etcd::{find_etcd, Etcd};
use tauri::test::{mock_builder, mock_context, noop_assets, MockRuntime};
use tauri::App;
// What an app names comes from the plugin alone.
use tauri_plugin_leader_election::{Builder, EtcdConfig, LeaderElectionExt, Level};

const KEY: &str = "e1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

fn app(dir: &std::path::Path, id: &str, etcd: EtcdConfig) -> App<MockRuntime> {
    mock_builder()
        .plugin(
            Builder::new()
                .lock_dir(dir)
                .instance_id(id)
                .agent(KEY)
                .refresh(Duration::from_millis(200))
                .stale(Duration::from_millis(1000))
                .stand_down(Duration::from_millis(1000))
                .etcd_config(etcd)
                .build(),
        )
        .build(mock_context(noop_assets()))
        .unwrap()
}

fn level(app: &App<MockRuntime>) -> Level {
    app.leader_election().status().agents[0].level
}

#[test]
fn two_hosts_one_acting_window_and_status_says_which_level() {
    if find_etcd().is_none() {
        assert!(
            std::env::var_os("NIP_LE_REQUIRE_ETCD").is_none(),
            "NIP_LE_REQUIRE_ETCD is set but no etcd binary was found"
        );
        eprintln!("no etcd binary: skipping");
        return;
    }
    let etcd = Etcd::start().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = |host: &str| EtcdConfig {
        ttl: Duration::from_secs(2),
        ..etcd.config(host)
    };
    let a = app(&tmp.path().join("a"), "a-1", cfg("a"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while level(&a) != Level::Global && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let b = app(&tmp.path().join("b"), "b-1", cfg("b"));
    let deadline = Instant::now() + Duration::from_secs(10);
    // b leads its host at once; it knows a holds the agent once its
    // contender has looked at etcd.
    while !(level(&b) == Level::Host && app_global(&b).holder.is_some())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Each leads its host; only a acts.
    assert_eq!((level(&a), level(&b)), (Level::Global, Level::Host));
    assert!(a.leader_election().is_leader(KEY).unwrap());
    assert!(!b.leader_election().is_leader(KEY).unwrap());
    let global = app_global(&b);
    assert_eq!(global.host_id, "b");
    let holder = global.holder.expect("b knows who holds the agent");
    assert_eq!(
        (holder.host_id.as_str(), holder.instance_id.as_str()),
        ("a", "a-1")
    );
    // The ledger follows the gate: b may not take work.
    let taken = b.leader_election().take(KEY, "ev-1").unwrap();
    assert!(!taken.granted());
    // a's exit hands the agent to b, across hosts.
    a.leader_election().shutdown();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !b.leader_election().is_leader(KEY).unwrap() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(level(&b), Level::Global);
    assert!(b.leader_election().take(KEY, "ev-1").unwrap().granted());
    b.leader_election().shutdown();
}

fn app_global(app: &App<MockRuntime>) -> nip_le::GlobalStatus {
    app.leader_election().status().agents[0]
        .global
        .clone()
        .expect("etcd is configured")
}

#[test]
fn a_bad_etcd_configuration_fails_setup_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let r = mock_builder()
        .plugin(
            Builder::new()
                .lock_dir(tmp.path())
                .etcd(["ftp://etcd:2379"])
                .build(),
        )
        .build(mock_context(noop_assets()));
    let msg = format!("{}", r.expect_err("setup must fail"));
    assert!(msg.contains("http://host:port"), "{msg}");
    // https without the CA of etcd's certificate says what is missing.
    let r = mock_builder()
        .plugin(
            Builder::new()
                .lock_dir(tmp.path())
                .etcd(["https://etcd:2379"])
                .build(),
        )
        .build(mock_context(noop_assets()));
    let msg = format!("{}", r.expect_err("setup must fail"));
    assert!(msg.contains("needs the CA"), "{msg}");
}
