//! A supervised agent process through the plugin's Rust API, on Tauri's
//! mock runtime: it runs while the window leads its agent, is stopped when
//! the window releases, and its reports reach the app (and the webviews,
//! as `leader-election://agent`).
#![cfg(unix)]

use std::time::Duration;

use tauri::test::{mock_builder, mock_context, noop_assets};
use tauri_plugin_leader_election::{AgentCommand, AgentEvent, Builder, LeaderElectionExt};

fn next(
    rx: &mut tokio::sync::broadcast::Receiver<tauri_plugin_leader_election::AgentReport>,
) -> AgentEvent {
    let end = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match rx.try_recv() {
            Ok(r) => return r.event,
            Err(_) if std::time::Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("no agent report: {e:?}"),
        }
    }
}

#[test]
fn the_supervised_agent_runs_while_the_window_leads_across_a_leave_and_a_join_and_stops_when_it_releases(
) {
    let tmp = tempfile::tempdir().unwrap();
    let app = mock_builder()
        .plugin(Builder::new().lock_dir(tmp.path()).build())
        .build(mock_context(noop_assets()))
        .unwrap();
    let le = app.leader_election();
    let agent = "c".repeat(64);
    let mut rx = le.subscribe_agents();
    let mut cmd = AgentCommand::new("sleep", ["30"]);
    cmd.timings.grace = Duration::from_millis(200);
    le.supervise_agent(&agent, cmd).unwrap();
    assert!(le.is_leader(&agent).unwrap(), "the only window leads");
    let AgentEvent::Started { pid } = next(&mut rx) else {
        panic!("not started")
    };
    // The status lists it, with its pid while it runs.
    let supervised = le.status().supervised;
    assert_eq!(supervised.len(), 1);
    assert_eq!(
        (supervised[0].pubkey.as_str(), supervised[0].pid),
        (agent.as_str(), Some(pid))
    );
    // Leaving stops it; joining again (a webview may leave and join an
    // allowed agent) starts it again: the supervisor follows the key.
    le.leave(&agent).unwrap();
    assert_eq!(next(&mut rx), AgentEvent::Stopped { pid, killed: false });
    le.join(&agent).unwrap();
    let AgentEvent::Started { pid } = next(&mut rx) else {
        panic!("not started again after a new join")
    };
    le.release(&agent).unwrap();
    assert_eq!(next(&mut rx), AgentEvent::Stopped { pid, killed: false });
    let supervised = le.status().supervised;
    assert_eq!(supervised[0].pid, None, "stopped");
    assert_eq!(
        supervised[0].last.as_ref().map(|r| r.event.clone()),
        Some(AgentEvent::Stopped { pid, killed: false })
    );
    assert!(le.stop_agent(&agent).unwrap(), "still supervised, idle");
    assert!(le.status().supervised.is_empty(), "no longer supervised");
    assert!(!le.stop_agent(&agent).unwrap());
    // A bad command is a clear error, not a panic.
    let err = le
        .supervise_agent(&agent, AgentCommand::new("", Vec::<String>::new()))
        .unwrap_err();
    assert!(err.to_string().contains("agent command"), "{err}");
    le.shutdown();
}
