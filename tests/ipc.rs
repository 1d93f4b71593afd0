//! The plugin through IPC, on Tauri's mock runtime: commands invoked the way
//! a webview invokes them (ACL included), events observed as the app sees
//! them, and the exit hook releasing the locks.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use tauri::test::{mock_builder, mock_context, noop_assets, MockRuntime};
use tauri::utils::acl::ExecutionContext;
use tauri::{App, Listener, WebviewWindow};
use tauri_plugin_leader_election::{Builder, LeaderElectionExt, CHANGED_EVENT};

mod webview;

use webview::invoke_on;

const KEY: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

/// The commands a permission file grants (allow-foo-bar → foo_bar).
fn granted_by(file: &str) -> Vec<String> {
    let toml = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("permissions")
            .join(file),
    )
    .unwrap();
    let list = &toml[toml.find("permissions = [").expect("a permission list")..];
    list.split('"')
        .filter_map(|s| s.strip_prefix("allow-"))
        .map(|s| s.replace('-', "_"))
        .collect()
}

/// The commands `permissions/default.toml` grants.
fn granted_by_default() -> Vec<String> {
    granted_by("default.toml")
}

struct Window {
    app: App<MockRuntime>,
    webview: WebviewWindow<MockRuntime>,
    events: mpsc::Receiver<Value>,
}

fn window(dir: &std::path::Path, id: &str, agents: &[&str]) -> Window {
    window_granted(dir, id, agents, granted_by_default())
}

fn window_granted(dir: &std::path::Path, id: &str, agents: &[&str], grants: Vec<String>) -> Window {
    let mut ctx = mock_context(noop_assets());
    // The mock context has no capabilities: grant exactly what the
    // permission set grants, so a command missing from it fails here.
    for cmd in grants {
        ctx.runtime_authority_mut().__allow_command(
            format!("plugin:leader-election|{cmd}"),
            ExecutionContext::Local,
        );
    }
    let app = mock_builder()
        .plugin(
            Builder::new()
                .lock_dir(dir)
                .instance_id(id)
                .agents(agents.iter().copied())
                // Webviews may also act on these two; on nothing else.
                .allow_agents(["b".repeat(64), "c".repeat(64)])
                // Long timings: the tests drive refreshes by hand.
                .refresh(Duration::from_secs(60))
                .stale(Duration::from_secs(120))
                .stand_down(Duration::from_secs(60))
                .build(),
        )
        .build(ctx)
        .unwrap();
    let webview = tauri::WebviewWindowBuilder::new(&app, "main", Default::default())
        .build()
        .unwrap();
    let (tx, events) = mpsc::channel();
    app.listen_any(CHANGED_EVENT, move |e| {
        let _ = tx.send(serde_json::from_str(e.payload()).unwrap());
    });
    Window {
        app,
        webview,
        events,
    }
}

impl Window {
    fn invoke(&self, cmd: &str, args: Value) -> Result<Value, Value> {
        invoke_on(&self.webview, cmd, args)
    }

    /// The first event with this reason (the launch-time events may or may
    /// not arrive, depending on when the listener was registered).
    fn event_with_reason(&self, reason: &str) -> Value {
        loop {
            let e = self
                .events
                .recv_timeout(Duration::from_secs(5))
                .expect("a leadership event");
            if e["reason"] == reason {
                return e;
            }
        }
    }

    fn refresh(&self) {
        self.app.leader_election().refresh();
    }
}

#[test]
fn default_permissions_grant_every_command() {
    let mut granted = granted_by_default();
    granted.sort();
    let mut all = vec![
        "claim",
        "done",
        "give_back",
        "handle_control_frame",
        "instance_id",
        "is_leader",
        "join",
        "leave",
        "owed",
        "release",
        "status",
        "take",
    ];
    all.sort();
    assert_eq!(granted, all);
}

#[test]
fn commands_answer_through_ipc() {
    let tmp = tempfile::tempdir().unwrap();
    let w = window(tmp.path(), "window-1", &[KEY]);
    assert_eq!(w.invoke("instance_id", json!({})).unwrap(), "window-1");
    assert_eq!(w.invoke("is_leader", json!({"pubkey": KEY})).unwrap(), true);
    let status = w.invoke("status", json!({})).unwrap();
    assert_eq!(status["instanceId"], "window-1");
    assert_eq!(status["agents"][0]["pubkey"], KEY);
    assert_eq!(status["agents"][0]["isLeader"], true);
    assert_eq!(status["agents"][0]["lockState"], "record");
    assert_eq!(status["agents"][0]["holder"]["instanceId"], "window-1");
    assert_eq!(status["agents"][0]["holder"]["isUs"], true);
    // The record says where its holder runs; no agent process is
    // supervised here.
    assert!(
        status["agents"][0]["holder"]["host"].is_string(),
        "{status}"
    );
    assert_eq!(status["supervised"], json!([]));
    assert_eq!(
        w.invoke("claim", json!({"pubkey": KEY})).unwrap(),
        "already_leader"
    );
    // Upper-case keys are normalised.
    assert_eq!(
        w.invoke("is_leader", json!({"pubkey": KEY.to_uppercase()}))
            .unwrap(),
        true
    );
    // Join and leave at runtime.
    let other = "b".repeat(64);
    assert_eq!(w.invoke("join", json!({"pubkey": other})).unwrap(), true);
    assert_eq!(
        w.invoke("status", json!({})).unwrap()["agents"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        w.invoke("leave", json!({"pubkey": other})).unwrap(),
        Value::Null
    );
    // Not joined: not the leader, as the gate answers (no error).
    assert_eq!(
        w.invoke("is_leader", json!({"pubkey": other})).unwrap(),
        false
    );
    // Release empties the file and reports it.
    assert_eq!(w.invoke("release", json!({"pubkey": KEY})).unwrap(), true);
    assert_eq!(
        w.invoke("is_leader", json!({"pubkey": KEY})).unwrap(),
        false
    );
    assert_eq!(
        std::fs::read(tmp.path().join(format!("{KEY}.lock"))).unwrap(),
        b""
    );
}

#[test]
fn webviews_may_act_only_on_the_agents_the_app_lists() {
    let tmp = tempfile::tempdir().unwrap();
    let w = window(tmp.path(), "window-1", &[KEY]);
    let unlisted = "d".repeat(64);
    for (cmd, args) in [
        ("join", json!({"pubkey": unlisted})),
        ("leave", json!({"pubkey": unlisted})),
        ("claim", json!({"pubkey": unlisted})),
        ("release", json!({"pubkey": unlisted})),
        (
            "handle_control_frame",
            json!({"pubkey": unlisted, "frame": r#"{"type":"claim_leadership","targetInstanceId":"window-1"}"#}),
        ),
        ("take", json!({"pubkey": unlisted, "eventId": "e1"})),
        ("done", json!({"pubkey": unlisted, "eventId": "e1"})),
        ("give_back", json!({"pubkey": unlisted, "eventId": "e1"})),
        ("owed", json!({"pubkey": unlisted, "queue": []})),
    ] {
        let e = w.invoke(cmd, args).unwrap_err();
        assert_eq!(e["kind"], "not_allowed", "{cmd}: {e}");
    }
    // Upper case is the same key: still denied, and nothing was touched.
    let e = w
        .invoke("join", json!({"pubkey": unlisted.to_uppercase()}))
        .unwrap_err();
    assert_eq!(e["kind"], "not_allowed");
    assert!(!tmp.path().join(format!("{unlisted}.lock")).exists());
    // Listed agents work as before; the app's own Rust code is not limited.
    assert_eq!(
        w.invoke("join", json!({"pubkey": "b".repeat(64)})).unwrap(),
        true
    );
    assert!(w.app.leader_election().join(&unlisted).unwrap());
    // The status names no path of the user's.
    let status = w.invoke("status", json!({})).unwrap().to_string();
    assert!(
        !status.contains(tmp.path().to_str().unwrap()),
        "status exposes the lock dir: {status}"
    );
}

#[test]
fn errors_are_typed_never_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let w = window(tmp.path(), "window-1", &[KEY]);
    for bad in ["", "../../etc/passwd", "zz", &"g".repeat(64)] {
        let e = w.invoke("is_leader", json!({"pubkey": bad})).unwrap_err();
        assert_eq!(e["kind"], "invalid_pubkey", "{bad}");
        assert!(e["message"].as_str().unwrap().contains("pubkey"), "{e}");
        let e = w.invoke("join", json!({"pubkey": bad})).unwrap_err();
        assert_eq!(e["kind"], "invalid_pubkey", "{bad}");
    }
    let e = w
        .invoke(
            "handle_control_frame",
            json!({"pubkey": KEY, "frame": "{nope"}),
        )
        .unwrap_err();
    assert_eq!(e["kind"], "invalid_control_frame");
    let e = w
        .invoke("claim", json!({"pubkey": "c".repeat(64)}))
        .unwrap_err();
    assert_eq!(e["kind"], "not_joined");
    // A missing argument is Tauri's own error, still not a panic.
    assert!(w.invoke("is_leader", json!({})).is_err());
    // Nothing but our lock file, its epoch mark, the work ledgers'
    // directory (with our ledger alone: the leader's `held` line) and our
    // presence file in the lock dir: the hostile keys touched no file.
    for entry in std::fs::read_dir(tmp.path()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        // Our presence: the shared slot file (Linux) or a file of our own.
        let presence =
            name == "presence.live" || nip_le::presence::departed_token_of_name(&name).is_some();
        assert!(
            name == format!("{KEY}.lock")
                || name == format!("{KEY}.epoch")
                || name == "work"
                || presence,
            "unexpected file {name}"
        );
    }
    for entry in std::fs::read_dir(tmp.path().join("work")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            name == format!("{KEY}.work") || name == format!("{KEY}.work.hold"),
            "unexpected file work/{name}"
        );
    }
}

#[test]
fn events_follow_a_cooperative_claim_between_two_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let a = window(tmp.path(), "window-a", &[KEY]);
    let b = window(tmp.path(), "window-b", &[KEY]);
    assert_eq!(
        b.invoke("is_leader", json!({"pubkey": KEY})).unwrap(),
        false
    );
    // The views at launch were emitted during setup, possibly before any
    // listener: a frontend listens, then reads status() once.
    let b_status = b.invoke("status", json!({})).unwrap();
    assert_eq!(b_status["agents"][0]["holder"]["instanceId"], "window-a");

    // In extended mode a sees b's lead request at once (directory watch)
    // and may hand over before b's claim returns.
    let outcome = b.invoke("claim", json!({"pubkey": KEY})).unwrap();
    assert!(outcome == "pending" || outcome == "claimed", "{outcome}");
    a.refresh(); // a sees the local lead request and stands down
    let lost = a.event_with_reason("stood_down");
    assert_eq!(lost["pubkey"], KEY);
    assert_eq!(lost["isLeader"], false);
    assert_eq!(lost["reason"], "stood_down");
    assert_eq!(lost["mustCancelTurn"], true);
    assert!(lost["atMs"].as_u64().unwrap() > 0);
    assert!(lost.as_object().unwrap().contains_key("epoch"));
    b.refresh(); // b takes the released lock
    let won = b.event_with_reason("claimed");
    assert_eq!(
        (won["isLeader"].as_bool(), won["reason"].as_str()),
        (Some(true), Some("claimed"))
    );
    assert_eq!(won["mustCancelTurn"], false);
    assert_eq!(won["leaderInstanceId"], "window-b");
}

#[test]
fn relay_frame_returns_the_control_result_to_send() {
    let tmp = tempfile::tempdir().unwrap();
    let a = window(tmp.path(), "window-a", &[KEY]);
    let b = window(tmp.path(), "window-b", &[KEY]);
    let frame = json!({"type": "claim_leadership", "targetInstanceId": "window-b"});
    // As a string (what the relay decrypts to) for the leader …
    assert_eq!(
        a.invoke(
            "handle_control_frame",
            json!({"pubkey": KEY, "frame": frame.to_string()})
        )
        .unwrap(),
        Value::Null
    );
    // … and the target gets the result to send back.
    assert_eq!(
        b.invoke(
            "handle_control_frame",
            json!({"pubkey": KEY, "frame": frame.to_string()})
        )
        .unwrap(),
        json!({"type": "claim_leadership", "status": "claimed"})
    );
    assert_eq!(b.invoke("is_leader", json!({"pubkey": KEY})).unwrap(), true);
    assert_eq!(
        a.invoke("is_leader", json!({"pubkey": KEY})).unwrap(),
        false
    );
    // Unknown frame types are ignored.
    assert_eq!(
        a.invoke(
            "handle_control_frame",
            json!({"pubkey": KEY, "frame": r#"{"type":"cancel_turn"}"#})
        )
        .unwrap(),
        Value::Null
    );
}

#[test]
fn bad_builder_config_fails_setup_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let r = mock_builder()
        .plugin(
            Builder::new()
                .lock_dir(tmp.path())
                .agent("../../etc/passwd")
                .build(),
        )
        .build(mock_context(noop_assets()));
    let msg = format!("{}", r.expect_err("setup must fail"));
    assert!(msg.contains("pubkey"), "{msg}");
    let r = mock_builder()
        .plugin(
            Builder::new()
                .lock_dir(tmp.path())
                .refresh(Duration::from_secs(5))
                .stale(Duration::from_secs(5))
                .build(),
        )
        .build(mock_context(noop_assets()));
    assert!(format!("{}", r.expect_err("setup must fail")).contains("stale"));
    let r = Builder::new()
        .lock_dir(tmp.path())
        .work_retention(Duration::ZERO)
        .config();
    assert!(format!("{}", r.expect_err("zero retention")).contains("work_retention"));
    let c = Builder::new()
        .lock_dir(tmp.path())
        .work_retention(Duration::from_secs(60))
        .config()
        .unwrap();
    assert_eq!(c.work_retention, Duration::from_secs(60));
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "a failed setup wrote files"
    );
}

#[test]
fn a_take_ends_with_the_page_that_took_it() {
    let tmp = tempfile::tempdir().unwrap();
    let w = window(tmp.path(), "window-1", &[KEY]);
    let queue = json!({"pubkey": KEY, "queue": [{"id": "e1"}, {"id": "e2"}]});
    let take = |id: &str| w.invoke("take", json!({"pubkey": KEY, "eventId": id}));
    assert_eq!(take("e1").unwrap()["outcome"], "granted");
    assert_eq!(take("e2").unwrap()["outcome"], "granted");
    assert!(
        w.invoke("done", json!({"pubkey": KEY, "eventId": "e2"}))
            .unwrap()
            == true
    );
    assert_eq!(w.invoke("owed", queue.clone()).unwrap(), json!([]));
    // The page reloads mid-turn (the plugin does this on page load and
    // on a closed window): its unfinished take is given back, owed now.
    assert_eq!(w.app.leader_election().page_gone("main"), 1);
    assert_eq!(w.invoke("owed", queue.clone()).unwrap(), json!(["e1"]));
    assert_eq!(w.app.leader_election().page_gone("main"), 0, "once");
    // The status counts the ledger the leader keeps (within a second).
    let counts = json!({"taken": 0, "done": 1, "givenBack": 1});
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let work = w.invoke("status", json!({})).unwrap()["agents"][0]["work"].clone();
        if work == counts {
            break;
        }
        assert!(std::time::Instant::now() < end, "status says {work}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn exit_releases_every_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let other = "d".repeat(64);
    let w = window(tmp.path(), "window-1", &[KEY, &other]);
    let lock = |k: &str| tmp.path().join(format!("{k}.lock"));
    assert!(!std::fs::read(lock(KEY)).unwrap().is_empty());
    let webview = w.webview.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        webview.close().unwrap();
    });
    let app = w.app;
    app.run(|_, _| {});
    assert_eq!(std::fs::read(lock(KEY)).unwrap(), b"");
    assert_eq!(std::fs::read(lock(&other)).unwrap(), b"");
}

#[test]
fn reads_answer_at_once_while_a_claim_waits_on_a_peers_file_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let w = window(tmp.path(), "window-1", &[KEY]);
    // A peer hangs holding the lock file's flock: every write waits for
    // the lock wait, on the engine's writer.
    let _held = nip_le::lockfile::LockedFile::open_and_lock(
        &tmp.path().join(format!("{KEY}.lock")),
        Duration::from_secs(1),
    )
    .unwrap();
    let busy = {
        let webview = w.webview.clone();
        std::thread::spawn(move || {
            let t = std::time::Instant::now();
            let mut claims = 0;
            while t.elapsed() < Duration::from_millis(1500) {
                let _ = invoke_on(&webview, "claim", json!({"pubkey": KEY}));
                let _ = invoke_on(&webview, "release", json!({"pubkey": KEY}));
                claims += 1;
            }
            claims
        })
    };
    let start = std::time::Instant::now();
    let mut worst = Duration::ZERO;
    while start.elapsed() < Duration::from_millis(1200) {
        let t = std::time::Instant::now();
        w.invoke("status", json!({})).unwrap();
        w.invoke("is_leader", json!({"pubkey": KEY})).unwrap();
        worst = worst.max(t.elapsed());
    }
    assert!(busy.join().unwrap() > 0);
    // The writer waits up to the lock wait (250 ms) per write: a read that
    // waited for it would take that long.
    assert!(
        worst < Duration::from_millis(100),
        "status/is_leader waited {worst:?} behind a claim"
    );
}

#[test]
fn a_page_settles_only_what_a_page_of_its_process_took() {
    let tmp = tempfile::tempdir().unwrap();
    let w = window(tmp.path(), "window-1", &[KEY]);
    let queue = json!({"pubkey": KEY, "queue": [{"id": "e1"}, {"id": "e2"}]});
    let call =
        |cmd: &str, key: &str, id: &str| w.invoke(cmd, json!({"pubkey": key, "eventId": id}));
    // Never taken here: neither done nor given back, and still owed.
    for cmd in ["done", "give_back"] {
        let e = call(cmd, KEY, "e1").unwrap_err();
        assert_eq!(e["kind"], "not_taken", "{cmd}: {e}");
    }
    assert_eq!(
        w.invoke("owed", queue.clone()).unwrap(),
        json!(["e1", "e2"])
    );
    // Taken here: settled once, by any spelling of the key.
    assert_eq!(call("take", KEY, "e1").unwrap()["outcome"], "granted");
    assert_eq!(call("done", &KEY.to_uppercase(), "e1").unwrap(), true);
    assert_eq!(call("done", KEY, "e1").unwrap_err()["kind"], "not_taken");
    assert_eq!(call("take", KEY, "e2").unwrap()["outcome"], "granted");
    assert_eq!(call("give_back", KEY, "e2").unwrap(), Value::Null);
    assert_eq!(
        call("give_back", KEY, "e2").unwrap_err()["kind"],
        "not_taken"
    );
    assert_eq!(w.invoke("owed", queue).unwrap(), json!(["e2"]));
    // The Rust API is the app's own: it may settle any event.
    assert!(w.app.leader_election().done(KEY, "e2").unwrap());
}

#[test]
fn the_read_only_set_grants_the_snapshot_reads_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let grants = granted_by("read-only.toml");
    let mut sorted = grants.clone();
    sorted.sort();
    assert_eq!(sorted, ["instance_id", "is_leader", "status"]);
    let w = window_granted(tmp.path(), "window-1", &[KEY], grants);
    assert_eq!(w.invoke("is_leader", json!({"pubkey": KEY})).unwrap(), true);
    assert_eq!(w.invoke("instance_id", json!({})).unwrap(), "window-1");
    assert!(w.invoke("status", json!({})).is_ok());
    for (cmd, args) in [
        ("take", json!({"pubkey": KEY, "eventId": "e1"})),
        ("done", json!({"pubkey": KEY, "eventId": "e1"})),
        ("claim", json!({"pubkey": KEY})),
        ("release", json!({"pubkey": KEY})),
    ] {
        let e = w.invoke(cmd, args).unwrap_err();
        assert!(e.to_string().contains("not allowed"), "{cmd}: {e}");
    }
    // The leader's own `held` lines only: the page took and settled nothing.
    let ledger = std::fs::read_to_string(tmp.path().join(format!("work/{KEY}.work"))).unwrap();
    assert!(
        ledger.lines().all(|l| l.contains(r#""op":"held""#)),
        "a read-only page wrote to the ledger: {ledger}"
    );
}
