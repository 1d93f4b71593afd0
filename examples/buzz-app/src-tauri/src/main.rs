//! A Tauri app shaped like Buzz's desktop (block/buzz-app): agents come
//! from a local store at launch and change at runtime; a Tauri-free process
//! manager (`buzz-example-agent-controller`) starts each agent's harness
//! through the plugin's runner seam, so the election decides which app
//! process runs it; the webview shows agent cards with "Run here" (a claim)
//! and signs nothing as the agent. One process, one `main` webview, one
//! instance id. `docs/buzz.md` maps each piece to Buzz's own files.
//!
//! Configuration (the e2e suite sets it):
//! * `BUZZ_DEMO_STORE`: the agent store (default: `agents.json` in the
//!   app's data directory);
//! * `BUZZ_DEMO_HARNESS`: the harness program (default: `nip-le-lab` on
//!   the `PATH`, run as `nip-le-lab stand-in-agent`, a stand-in for
//!   `buzz-acp`);
//! * `BUZZ_DEMO_FEED_DIR`: the stand-in relay (`mentions.jsonl`,
//!   `replies.jsonl`);
//! * `BUZZ_DEMO_LEASE_DIR`: the harnesses' instance leases;
//! * `BUZZ_DEMO_EVENTS`: where the harnesses log taking and freeing their
//!   lease (the e2e suite measures the gap between two harnesses);
//! * `BUZZ_DEMO_REFRESH_MS`, `BUZZ_DEMO_STALE_MS`, `BUZZ_DEMO_STAND_DOWN_MS`:
//!   timings; `BUZZ_LEADER_LOCK_DIR`, `NIP_LE_BACKEND` as the plugin reads
//!   them.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use agent_controller::store::{Store, StoredAgent};
use agent_controller::{Controller, HarnessSpec, BUSY_EXIT_CODE};
use buzz_example_agent_controller as agent_controller;
use serde::Serialize;
use tauri::{Manager, State};
use tauri_plugin_leader_election::{AgentTimings, LeaderElectionExt};

/// What the app needs to start a harness.
struct Runtime {
    store: Store,
    harness: PathBuf,
    feed: PathBuf,
    leases: PathBuf,
    data: PathBuf,
    /// `BUZZ_DEMO_EVENTS`: where the harnesses log their lease (tests).
    events: Option<OsString>,
}

impl Runtime {
    fn spec(&self, pubkey: &str) -> HarnessSpec {
        let feed = |f: &str| self.feed.join(f).into_os_string();
        let mut args: Vec<OsString> = [
            "stand-in-agent".into(),
            "--pubkey".into(),
            pubkey.into(),
            "--relay-url".into(),
            "wss://relay.buzz.example".into(),
            "--lease-dir".into(),
            self.leases.clone().into_os_string(),
            "--mentions".into(),
            feed("mentions.jsonl"),
            "--replies".into(),
            feed("replies.jsonl"),
            "--worker".into(),
            "--backlog".into(),
            "--lease-release-ms".into(),
            "2000".into(),
            "--busy-exit-code".into(),
            BUSY_EXIT_CODE.to_string().into(),
        ]
        .into();
        if let Some(e) = &self.events {
            args.extend(["--events".into(), e.clone()]);
        }
        HarnessSpec {
            program: self.harness.clone(),
            args,
            workspace: self.data.join("workspaces").join(pubkey),
            log_dir: self.data.join("logs"),
            env: std::env::var_os("HOME")
                .map(|h| ("HOME".into(), h))
                .into_iter()
                .collect(),
            grace: Duration::from_secs(5),
        }
    }
}

/// Starts (through the election) the agents the store names and the app
/// does not run yet, and stops those it no longer names.
fn sync_agents(app: &tauri::AppHandle, rt: &Runtime, running: &mut BTreeSet<String>) {
    let wanted: BTreeSet<String> = match rt.store.launch_ids() {
        Ok(ids) => ids.into_iter().collect(),
        Err(e) => {
            eprintln!("agent store: {e}");
            return;
        }
    };
    let le = app.leader_election();
    for pk in wanted.difference(running).cloned().collect::<Vec<_>>() {
        let controller = Controller::new(rt.spec(&pk));
        match le.run_agent(&pk, controller, AgentTimings::default()) {
            Ok(()) => drop(running.insert(pk)),
            Err(e) => eprintln!("agent {pk}: {e}"),
        }
    }
    for pk in running.difference(&wanted).cloned().collect::<Vec<_>>() {
        // Stopped first: the lock moves only once the harness is gone.
        let _ = le.stop_agent(&pk);
        let _ = le.leave(&pk);
        running.remove(&pk);
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Card {
    pubkey: String,
    name: String,
}

/// The agent cards: the store's agents.
#[tauri::command]
fn agents(rt: State<'_, Runtime>) -> Result<Vec<Card>, String> {
    Ok(rt
        .store
        .restore()?
        .into_iter()
        .map(|a| Card {
            pubkey: a.pubkey.to_ascii_lowercase(),
            name: a.name,
        })
        .collect())
}

/// Creates (or imports) an agent: every app process runs it within a
/// second, through the election.
#[tauri::command]
fn add_agent(rt: State<'_, Runtime>, pubkey: String, name: String) -> Result<(), String> {
    nip_le_pubkey_check(&pubkey)?;
    rt.store.add(StoredAgent { pubkey, name })
}

/// Deletes an agent: every app process stops its harness and leaves it.
#[tauri::command]
fn remove_agent(rt: State<'_, Runtime>, pubkey: String) -> Result<bool, String> {
    rt.store.remove(&pubkey)
}

/// Quits the app gracefully (the harness is stopped before the lock moves).
#[tauri::command]
fn quit(app: tauri::AppHandle) {
    app.exit(0);
}

fn nip_le_pubkey_check(pubkey: &str) -> Result<(), String> {
    let ok = pubkey.len() == 64 && pubkey.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then_some(())
        .ok_or_else(|| format!("not an agent key: {pubkey:?}"))
}

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

/// The harness program: `BUZZ_DEMO_HARNESS`, or `nip-le-lab` on the `PATH`
/// (absolute either way: its environment is cleared).
fn harness_program() -> PathBuf {
    if let Some(p) = std::env::var_os("BUZZ_DEMO_HARNESS") {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("nip-le-lab"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nip-le-lab"))
}

fn main() {
    let mut le = tauri_plugin_leader_election::Builder::new();
    if let Some(d) = env_ms("BUZZ_DEMO_REFRESH_MS") {
        le = le.refresh(d);
    }
    if let Some(d) = env_ms("BUZZ_DEMO_STALE_MS") {
        le = le.stale(d);
    }
    if let Some(d) = env_ms("BUZZ_DEMO_STAND_DOWN_MS") {
        le = le.stand_down(d);
    }
    tauri::Builder::default()
        .plugin(le.build())
        .invoke_handler(tauri::generate_handler![
            agents,
            add_agent,
            remove_agent,
            quit
        ])
        .setup(|app| {
            let data = app.path().app_data_dir()?;
            let store = match std::env::var_os("BUZZ_DEMO_STORE") {
                Some(p) => Store::new(p),
                None => Store::new(data.join("agents.json")),
            };
            let feed = std::env::var_os("BUZZ_DEMO_FEED_DIR")
                .map_or_else(|| data.join("feed"), PathBuf::from);
            let leases = std::env::var_os("BUZZ_DEMO_LEASE_DIR")
                .map_or_else(|| data.join("leases"), PathBuf::from);
            app.manage(Runtime {
                store,
                harness: harness_program(),
                feed,
                leases,
                data,
                events: std::env::var_os("BUZZ_DEMO_EVENTS"),
            });
            // What the harnesses do, in the app's log.
            let mut reports = app.leader_election().subscribe_agents();
            std::thread::spawn(move || {
                while let Ok(r) = reports.blocking_recv() {
                    eprintln!(
                        "agent {}: {:?} at {}",
                        &r.pubkey.as_str()[..8],
                        r.event,
                        r.at_ms
                    );
                }
            });
            let mut changes = app.leader_election().subscribe();
            std::thread::spawn(move || {
                while let Ok(c) = changes.blocking_recv() {
                    eprintln!(
                        "lead {}: {} {:?} at {}",
                        &c.pubkey.as_str()[..8],
                        c.is_leader,
                        c.reason,
                        c.at_ms
                    );
                }
            });
            // The store at launch, then every second (an agent created or
            // deleted in any app process of the user).
            let handle = app.handle().clone();
            std::thread::spawn(move || {
                let mut running = BTreeSet::new();
                loop {
                    let rt = handle.state::<Runtime>();
                    sync_agents(&handle, &rt, &mut running);
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
            Ok(())
        })
        .run(tauri::generate_context!())
        .expect("error while running the Buzz-shaped example");
}
