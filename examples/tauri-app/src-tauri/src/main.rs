//! A Buzz-like window for trying tauri-plugin-leader-election by hand (and
//! for the end-to-end tests): a sidebar of agents with a crown on the ones
//! this window leads and a claim menu, a status panel, a mention feed shared
//! by every instance on the machine through a local file (only the leader
//! replies, gated in the frontend by `LeaderGate`), and a child process that
//! inherits this window's instance id.
//!
//! Environment (all optional):
//! * `BUZZ_DEMO_AGENTS`: comma-separated agent pubkeys (two fixed keys by default);
//! * `BUZZ_DEMO_FEED_DIR`: where `mentions.jsonl` and `replies.jsonl` live
//!   (default `<temp>/buzz-leader-election-demo`);
//! * `BUZZ_DEMO_REFRESH_MS`, `BUZZ_DEMO_STALE_MS`, `BUZZ_DEMO_STAND_DOWN_MS`: timings;
//! * `BUZZ_DEMO_TURN_MS`: how long a simulated agent turn takes (1500 ms);
//! * `BUZZ_LEADER_LOCK_DIR`: the lock directory (default `~/.buzz/leader-locks`);
//! * `BUZZ_DEMO_WINDOW_X`: the window's x position, to lay several side by side;
//! * `BUZZ_DEMO_SUPERVISED`: an agent pubkey whose mentions a supervised
//!   agent process answers instead of the window's turns: this executable
//!   run as `--stand-in-agent <pubkey> <feed dir>`, only while the window
//!   leads that agent (`Builder::supervise`), taking an instance lease as
//!   upstream's harness does.

#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::{json, Value};
use tauri::{AppHandle, Emitter, Manager, State};
use tauri_plugin_leader_election::{AgentCommand, LeaderElectionExt, ELECTION_ID_ENV};

const DEFAULT_AGENTS: [(&str, &str); 2] = [
    (
        "Scout",
        "5c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c0075c00",
    ),
    (
        "Scribe",
        "5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41be5c41",
    ),
];

#[derive(Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Agent {
    name: String,
    pubkey: String,
}

struct Demo {
    agents: Vec<Agent>,
    /// The agent a supervised process answers for (`BUZZ_DEMO_SUPERVISED`).
    supervised: Option<String>,
    feed_dir: PathBuf,
    stale_ms: u64,
    refresh_ms: u64,
    turn_ms: u64,
    counter: AtomicU64,
}

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn append_line(path: &Path, v: &Value) -> Result<(), String> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    // One write of a short line on an O_APPEND file: never interleaved.
    f.write_all(format!("{v}\n").as_bytes())
        .map_err(|e| e.to_string())
}

/// The last `max` JSON lines of a file (capped read).
fn tail_lines(path: &Path, max: usize) -> Vec<Value> {
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(1 << 20)));
        let _ = f.take(1 << 20).read_to_end(&mut buf);
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    lines[lines.len().saturating_sub(max)..].to_vec()
}

#[tauri::command]
fn demo_config(app: AppHandle, demo: State<'_, Demo>) -> Value {
    json!({
        "agents": demo.agents,
        "feedDir": demo.feed_dir,
        "staleMs": demo.stale_ms,
        "refreshMs": demo.refresh_ms,
        "turnMs": demo.turn_ms,
        "supervised": demo.supervised,
        "instanceId": app.leader_election().instance_id(),
        "pid": std::process::id(),
    })
}

#[tauri::command]
fn send_mention(
    app: AppHandle,
    demo: State<'_, Demo>,
    agent: String,
    text: String,
) -> Result<String, String> {
    let n = demo.counter.fetch_add(1, Ordering::Relaxed);
    let id = format!("{}-{}-{n}", unix_ms(), std::process::id());
    let from = app.leader_election().instance_id().to_owned();
    append_line(
        &demo.feed_dir.join("mentions.jsonl"),
        &json!({"id": id, "agent": agent, "text": text, "from": from, "atMs": unix_ms()}),
    )?;
    Ok(id)
}

/// Called by the frontend at the end of an agent turn it took through the
/// work ledger: the "agent reply" of the simulation. The last check, the
/// reply and `done` happen here, where the reply is sent, one after the
/// other: the webview learns of a change of leader through an event that can
/// lag under load, the engine's flag cannot, and a change between the reply
/// and `done` would make the next leader answer again. Returns whether the
/// reply was sent (`false`: this window no longer leads; the turn is
/// cancelled and the mention given back).
#[tauri::command]
async fn reply(app: AppHandle, mention: String, agent: String) -> Result<bool, String> {
    tauri::async_runtime::spawn_blocking(move || {
        let le = app.leader_election();
        let work = le.work(&agent).map_err(|e| e.to_string())?;
        if !work.may_act() {
            let _ = work.give_back(&mention);
            return Ok(false);
        }
        let demo = app.state::<Demo>();
        append_line(
            &demo.feed_dir.join("replies.jsonl"),
            &json!({"mention": mention, "agent": agent, "instanceId": le.instance_id(), "atMs": unix_ms()}),
        )?;
        work.done(&mention).map_err(|e| e.to_string())?;
        Ok(true)
    })
    .await
    .map_err(|e| e.to_string())?
}

#[tauri::command]
fn feed_snapshot(demo: State<'_, Demo>) -> Value {
    json!({
        "mentions": tail_lines(&demo.feed_dir.join("mentions.jsonl"), 50),
        "replies": tail_lines(&demo.feed_dir.join("replies.jsonl"), 500),
    })
}

/// Spawns this executable as an "agent process" with the window's election
/// id in `BUZZ_INSTANCE_ELECTION_ID`; it reports what it sees.
#[tauri::command]
async fn spawn_child(app: AppHandle, pubkey: String) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let id = app.leader_election().instance_id().to_owned();
    tauri::async_runtime::spawn_blocking(move || {
        let out = std::process::Command::new(exe)
            .arg("--agent-child")
            .arg(&pubkey)
            .env(ELECTION_ID_ENV, id)
            .output()
            .map_err(|e| e.to_string())?;
        serde_json::from_slice::<Value>(&out.stdout)
            .map_err(|e| format!("child said {:?}: {e}", String::from_utf8_lossy(&out.stdout)))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Child mode: act as the window (same instance id) and report the read
/// side's answer. It only reads: a child that joined and then shut down
/// would release the window's lock, since it *is* the same instance.
fn child(pubkey: &str) -> i32 {
    let report = (|| -> Result<Value, String> {
        let is_leader =
            tauri_plugin_leader_election::read_side(pubkey).map_err(|e| e.to_string())?;
        let inherited = std::env::var(ELECTION_ID_ENV).ok();
        Ok(json!({
            "pid": std::process::id(),
            "instanceId": inherited.clone().unwrap_or_default(),
            "inherited": inherited.is_some(),
            "isLeader": is_leader,
        }))
    })();
    match report {
        Ok(v) => {
            println!("{v}");
            0
        }
        Err(e) => {
            eprintln!("agent child: {e}");
            2
        }
    }
}

/// Follows the shared mention file from its current end and emits each new
/// complete line to this window's webview (the relay's fan-out).
fn follow_feed(app: AppHandle, path: PathBuf) {
    let mut offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let mut partial = Vec::new();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let Ok(mut f) = std::fs::File::open(&path) else {
            continue;
        };
        if f.seek(SeekFrom::Start(offset)).is_err() {
            continue;
        }
        let mut buf = Vec::new();
        let Ok(n) = f.take(1 << 20).read_to_end(&mut buf) else {
            continue;
        };
        offset += n as u64;
        partial.extend_from_slice(&buf);
        while let Some(nl) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=nl).collect();
            if let Ok(mention) = serde_json::from_slice::<Value>(&line) {
                let _ = app.emit("demo://mention", mention);
            }
        }
    }
}

/// `--stand-in-agent <pubkey> <feed dir>`: a stand-in for upstream's agent
/// harness. It takes an exclusive, non-blocking lock on its instance lease
/// (`<feed dir>/leases/<pubkey>.lease`) and exits 1 while another process
/// holds it; then it answers every mention for `pubkey` published after it
/// started, until it is terminated (SIGTERM ends it at once).
fn stand_in_agent(pubkey: &str, feed_dir: &Path) -> i32 {
    let leases = feed_dir.join("leases");
    let lease = std::fs::create_dir_all(&leases).and_then(|()| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(leases.join(format!("{pubkey}.lease")))
    });
    let Ok(lease) = lease else { return 2 };
    if fs4::FileExt::try_lock(&lease).is_err() {
        eprintln!("another agent process is already active for {pubkey}");
        return 1;
    }
    let id = std::env::var(ELECTION_ID_ENV).unwrap_or_default();
    let mentions = feed_dir.join("mentions.jsonl");
    let mut offset = std::fs::metadata(&mentions).map_or(0, |m| m.len());
    let mut partial = Vec::new();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let Ok(mut f) = std::fs::File::open(&mentions) else {
            continue;
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            continue;
        }
        offset += buf.len() as u64;
        partial.extend_from_slice(&buf);
        while let Some(nl) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=nl).collect();
            let Ok(m) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            if m["agent"].as_str() != Some(pubkey) {
                continue;
            }
            let _ = append_line(
                &feed_dir.join("replies.jsonl"),
                &json!({"mention": m["id"], "agent": pubkey, "instanceId": id, "agentPid": std::process::id(), "atMs": unix_ms()}),
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--agent-child") {
        std::process::exit(child(args.get(2).map(String::as_str).unwrap_or("")));
    }
    if let ("--stand-in-agent", Some(pk), Some(dir)) = (
        args.get(1).map(String::as_str).unwrap_or(""),
        args.get(2),
        args.get(3),
    ) {
        std::process::exit(stand_in_agent(pk, Path::new(dir)));
    }

    let agents: Vec<Agent> = match std::env::var("BUZZ_DEMO_AGENTS") {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .enumerate()
            .map(|(i, pk)| Agent {
                name: format!("Agent {}", i + 1),
                pubkey: pk.trim().to_lowercase(),
            })
            .collect(),
        _ => DEFAULT_AGENTS
            .iter()
            .map(|(n, pk)| Agent {
                name: (*n).into(),
                pubkey: (*pk).into(),
            })
            .collect(),
    };
    let feed_dir = std::env::var_os("BUZZ_DEMO_FEED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("buzz-leader-election-demo"));
    std::fs::create_dir_all(&feed_dir).expect("cannot create the demo feed directory");

    let mut plugin = tauri_plugin_leader_election::Builder::new()
        .agents(agents.iter().map(|a| a.pubkey.clone()));
    let supervised = std::env::var("BUZZ_DEMO_SUPERVISED")
        .ok()
        .map(|pk| pk.trim().to_lowercase())
        .filter(|pk| !pk.is_empty());
    if let Some(pk) = &supervised {
        let exe = std::env::current_exe().expect("the example's own executable");
        let mut cmd = AgentCommand::new(
            exe,
            [
                "--stand-in-agent".into(),
                pk.clone(),
                feed_dir.display().to_string(),
            ],
        );
        cmd.timings.grace = Duration::from_secs(1);
        cmd.timings.backoff_min = Duration::from_millis(50);
        cmd.timings.backoff_max = Duration::from_secs(1);
        plugin = plugin.supervise(pk.clone(), cmd);
    }
    let mut refresh_ms = 5_000;
    let mut stale_ms = 10_000;
    if let Some(d) = env_ms("BUZZ_DEMO_REFRESH_MS") {
        plugin = plugin.refresh(d);
        refresh_ms = d.as_millis() as u64;
    }
    if let Some(d) = env_ms("BUZZ_DEMO_STALE_MS") {
        plugin = plugin.stale(d);
        stale_ms = d.as_millis() as u64;
    }
    if let Some(d) = env_ms("BUZZ_DEMO_STAND_DOWN_MS") {
        plugin = plugin.stand_down(d);
    }

    let mentions = feed_dir.join("mentions.jsonl");
    tauri::Builder::default()
        .plugin(plugin.build())
        .manage(Demo {
            agents,
            supervised,
            feed_dir,
            stale_ms,
            refresh_ms,
            turn_ms: env_ms("BUZZ_DEMO_TURN_MS").map_or(1500, |d| d.as_millis() as u64),
            counter: AtomicU64::new(0),
        })
        .invoke_handler(tauri::generate_handler![
            demo_config,
            send_mention,
            reply,
            feed_snapshot,
            spawn_child
        ])
        .setup(move |app| {
            let id = app.leader_election().instance_id().to_owned();
            if let Some(w) = app.get_webview_window("main") {
                let short: String = id.chars().take(8).collect();
                let _ = w.set_title(&format!("Buzz — window {short}"));
                if let Some(x) = std::env::var("BUZZ_DEMO_WINDOW_X")
                    .ok()
                    .and_then(|x| x.parse::<i32>().ok())
                {
                    let _ = w.set_position(tauri::PhysicalPosition::new(x, 0));
                }
            }
            let handle = app.handle().clone();
            std::thread::spawn(move || follow_feed(handle, mentions));
            Ok(())
        })
        .run(tauri::generate_context!())
        .expect("error while running the demo");
}
