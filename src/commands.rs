//! Thin IPC commands over [`LeaderElection`]. In Tauri v2 a command that is
//! not `async` runs on the main thread, so:
//! * `is_leader`, `status` and `instance_id` are synchronous and provably
//!   non-blocking: they read the engine's published snapshot (atomic loads,
//!   no lock held across I/O, no file touched);
//! * every command that changes something is `async` and waits for the
//!   engine's writer on the blocking pool, never on the main thread.

use tauri::{command, AppHandle, Runtime, Webview};

use crate::error::{Error, Result};
use crate::models::Status;
use crate::{
    ClaimOutcome, ControlResult, LeaderElection, LeaderElectionExt, QueuedEvent, TakeOutcome,
};

/// Runs `f` for the agent `pubkey` on the blocking pool, once the app's
/// allow-list says a webview may act on that agent: every command that
/// names an agent and changes something goes through here.
async fn blocking<R: Runtime, T: Send + 'static>(
    app: &AppHandle<R>,
    pubkey: String,
    f: impl FnOnce(LeaderElection, String) -> Result<T> + Send + 'static,
) -> Result<T> {
    let le = app.leader_election().clone();
    le.check_webview_may_act(&pubkey)?;
    tauri::async_runtime::spawn_blocking(move || f(le, pubkey))
        .await
        .map_err(|e| Error::Task(e.to_string()))?
}

#[command]
pub(crate) fn is_leader<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<bool> {
    app.leader_election().is_leader(&pubkey)
}

#[command]
pub(crate) fn instance_id<R: Runtime>(app: AppHandle<R>) -> String {
    app.leader_election().instance_id().to_owned()
}

#[command]
pub(crate) fn status<R: Runtime>(app: AppHandle<R>) -> Status {
    app.leader_election().status()
}

#[command]
pub(crate) async fn join<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<bool> {
    blocking(&app, pubkey, move |le, pubkey| le.join(&pubkey)).await
}

#[command]
pub(crate) async fn leave<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<()> {
    blocking(&app, pubkey, move |le, pubkey| le.leave(&pubkey)).await
}

#[command]
pub(crate) async fn claim<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<ClaimOutcome> {
    blocking(&app, pubkey, move |le, pubkey| le.claim(&pubkey)).await
}

#[command]
pub(crate) async fn release<R: Runtime>(app: AppHandle<R>, pubkey: String) -> Result<bool> {
    blocking(&app, pubkey, move |le, pubkey| le.release(&pubkey)).await
}

#[command]
pub(crate) async fn handle_control_frame<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    frame: String,
) -> Result<Option<ControlResult>> {
    blocking(&app, pubkey, move |le, pubkey| {
        le.handle_control_frame(&pubkey, &frame)
    })
    .await
}

#[command]
pub(crate) async fn take<R: Runtime>(
    app: AppHandle<R>,
    webview: Webview<R>,
    pubkey: String,
    event_id: String,
    published_ms: Option<u64>,
) -> Result<TakeOutcome> {
    let label = webview.label().to_owned();
    blocking(&app, pubkey, move |le, pubkey| {
        if !le.page_has_room(&label, &pubkey)? {
            return Ok(TakeOutcome::TooManyOpen);
        }
        let event = QueuedEvent {
            id: event_id.clone(),
            published_ms,
        };
        let outcome = le.take_event(&pubkey, &event)?;
        if matches!(outcome, TakeOutcome::Granted { .. }) {
            le.page_took(&label, &pubkey, &event_id)?;
        }
        Ok(outcome)
    })
    .await
}

#[command]
pub(crate) async fn done<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    event_id: String,
) -> Result<bool> {
    blocking(&app, pubkey, move |le, pubkey| {
        le.page_settles(&pubkey, &event_id, || le.done(&pubkey, &event_id))
    })
    .await
}

#[command]
pub(crate) async fn give_back<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    event_id: String,
) -> Result<()> {
    blocking(&app, pubkey, move |le, pubkey| {
        le.page_settles(&pubkey, &event_id, || le.give_back(&pubkey, &event_id))
    })
    .await
}

#[command]
pub(crate) async fn owed<R: Runtime>(
    app: AppHandle<R>,
    pubkey: String,
    queue: Vec<QueuedEvent>,
) -> Result<Vec<String>> {
    blocking(&app, pubkey, move |le, pubkey| le.owed(&pubkey, &queue)).await
}

#[cfg(test)]
mod tests {
    /// The commands that may run on the main thread: each only reads the
    /// engine's published snapshot.
    const SNAPSHOT_READS: &[&str] = &["is_leader", "instance_id", "status"];

    /// Every other command is `async` and waits for the writer on the
    /// blocking pool, so no command does (or waits for) file I/O on the main
    /// thread. A new synchronous command fails this test.
    #[test]
    fn only_snapshot_reads_run_on_the_main_thread() {
        let src = include_str!("commands.rs");
        let src = &src[..src.find("#[cfg(test)]").unwrap()];
        let mut names = Vec::new();
        for item in src.split("#[command]").skip(1) {
            let sig = item.trim_start();
            let name = sig
                .split("fn ")
                .nth(1)
                .and_then(|r| r.split('<').next())
                .unwrap();
            let body = &sig[..sig.find("\n}\n").unwrap()];
            if sig.starts_with("pub(crate) async fn") {
                assert!(
                    body.contains("blocking(&app"),
                    "{name} is async but does not use the blocking pool"
                );
            } else {
                assert!(
                    SNAPSHOT_READS.contains(&name),
                    "{name} is synchronous: it would run on the main thread"
                );
            }
            names.push(name);
        }
        // Every registered command was looked at.
        let lib = include_str!("lib.rs");
        for registered in lib.split("commands::").skip(1) {
            let name = registered
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .next()
                .unwrap();
            assert!(
                names.contains(&name),
                "{name} is registered but not in commands.rs"
            );
        }
        assert!(names.len() >= 12, "{names:?}");
    }
}
