//! One id per app process: the plugin mints its own instance id and adopts
//! an inherited `BUZZ_INSTANCE_ELECTION_ID` only when the app opts in. A
//! file of its own: it sets that variable for the whole process.

use tauri::test::{mock_builder, mock_context, noop_assets};
use tauri_plugin_leader_election::{Builder, LeaderElectionExt};

fn app_with(builder: Builder) -> Result<tauri::App<tauri::test::MockRuntime>, String> {
    mock_builder()
        .plugin(builder.build())
        .build(mock_context(noop_assets()))
        .map_err(|e| e.to_string())
}

#[test]
fn an_inherited_instance_id_is_adopted_only_when_the_app_opts_in() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    // As in a Buzz built and started from a harness's shell: the harness's
    // window id is in the environment.
    std::env::set_var(
        "BUZZ_INSTANCE_ELECTION_ID",
        "the-window-that-runs-the-agent",
    );

    let minted = app_with(Builder::new().lock_dir(&dir)).unwrap();
    let id = minted.leader_election().instance_id().to_owned();
    assert_ne!(
        id, "the-window-that-runs-the-agent",
        "adopted without asking"
    );
    assert_eq!(id.len(), 36, "a UUID v4: {id}");
    let again = app_with(Builder::new().lock_dir(&dir)).unwrap();
    assert_ne!(
        again.leader_election().instance_id(),
        id,
        "one id per process"
    );

    let inherited = app_with(Builder::new().lock_dir(&dir).inherit_instance_id()).unwrap();
    assert_eq!(
        inherited.leader_election().instance_id(),
        "the-window-that-runs-the-agent"
    );
    // An explicit id wins over the opt-in.
    let explicit = app_with(
        Builder::new()
            .lock_dir(&dir)
            .inherit_instance_id()
            .instance_id("mine"),
    )
    .unwrap();
    assert_eq!(explicit.leader_election().instance_id(), "mine");

    // Opted in, an unusable inherited id fails the launch cleanly; without
    // the opt-in it is not even read.
    std::env::set_var("BUZZ_INSTANCE_ELECTION_ID", "bad\"id");
    let e = app_with(Builder::new().lock_dir(&dir).inherit_instance_id()).unwrap_err();
    assert!(e.contains("BUZZ_INSTANCE_ELECTION_ID"), "{e}");
    app_with(Builder::new().lock_dir(&dir)).unwrap();
}
