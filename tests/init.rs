//! `init()`, the plugin with every default, through IPC on Tauri's mock
//! runtime: it joins no agent at launch, so the webviews may act on the
//! agents the app's Rust side joins or allows later (after login), and on no
//! other. A file of its own: `init()` reads the lock directory from
//! `BUZZ_LEADER_LOCK_DIR`, which this process points at a temporary one.

use serde_json::json;
use tauri::test::{mock_builder, mock_context, noop_assets};
use tauri::utils::acl::ExecutionContext;
use tauri_plugin_leader_election::LeaderElectionExt;

mod webview;

use webview::invoke_on;

#[test]
fn init_lets_webviews_act_on_the_agents_the_app_joins_or_allows_and_no_other() {
    let tmp = tempfile::tempdir().unwrap();
    // The only test of this process: nothing else reads the environment.
    std::env::set_var("BUZZ_LEADER_LOCK_DIR", tmp.path());
    let mut ctx = mock_context(noop_assets());
    for cmd in [
        "join", "leave", "claim", "release", "take", "done", "owed", "status",
    ] {
        ctx.runtime_authority_mut().__allow_command(
            format!("plugin:leader-election|{cmd}"),
            ExecutionContext::Local,
        );
    }
    let app = mock_builder()
        .plugin(tauri_plugin_leader_election::init())
        .build(ctx)
        .unwrap();
    let w = tauri::WebviewWindowBuilder::new(&app, "main", Default::default())
        .build()
        .unwrap();
    let le = app.leader_election();
    let (joined, learned, stranger) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));

    // Nothing at launch: a webview may act on no agent.
    let e = invoke_on(&w, "join", json!({"pubkey": learned})).unwrap_err();
    assert_eq!(e["kind"], "not_allowed", "{e}");

    // An agent the app joins from Rust (after login): the webview works it.
    assert!(le.join(&joined).unwrap());
    assert_eq!(
        invoke_on(&w, "claim", json!({"pubkey": joined})).unwrap(),
        "already_leader"
    );
    let take = invoke_on(&w, "take", json!({"pubkey": joined, "eventId": "e1"})).unwrap();
    assert_eq!(take["outcome"], "granted", "{take}");
    assert_eq!(
        invoke_on(&w, "done", json!({"pubkey": joined, "eventId": "e1"})).unwrap(),
        true
    );

    // An agent the app allows: the webview joins it itself.
    le.allow_agent(&learned.to_uppercase()).unwrap();
    assert_eq!(
        invoke_on(&w, "join", json!({"pubkey": learned})).unwrap(),
        true
    );
    assert_eq!(
        invoke_on(
            &w,
            "owed",
            json!({"pubkey": learned, "queue": [{"id": "e2"}]})
        )
        .unwrap(),
        json!(["e2"])
    );

    // Any other stays denied, and touches no file.
    let e = invoke_on(&w, "join", json!({"pubkey": stranger})).unwrap_err();
    assert_eq!(e["kind"], "not_allowed", "{e}");
    assert!(!tmp.path().join(format!("{stranger}.lock")).exists());

    // Disallowed again: denied to the webview, still joined for the app.
    assert!(le.disallow_agent(&learned).unwrap());
    assert!(!le.disallow_agent(&learned).unwrap(), "once");
    let e = invoke_on(&w, "release", json!({"pubkey": learned})).unwrap_err();
    assert_eq!(e["kind"], "not_allowed", "{e}");
    assert!(le.is_leader(&learned).unwrap());

    // Bad keys are typed errors.
    assert_eq!(
        le.allow_agent("../etc").unwrap_err().kind(),
        tauri_plugin_leader_election::ErrorKind::InvalidPubkey
    );
    le.shutdown();
}
